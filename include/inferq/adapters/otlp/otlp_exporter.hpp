/// @file inferq/adapters/otlp/otlp_exporter.hpp
///
/// OtlpHttpExporter: a TraceSink (engine/trace.hpp) that sends the engine's spans to
/// an OpenTelemetry collector over OTLP/HTTP with the JSON encoding (libcurl), in
/// batches, from its own thread. Spans follow OpenTelemetry's messaging semantic
/// conventions (1.27 and later): messaging.system "inferq", messaging.operation.type,
/// messaging.operation.name, messaging.destination.name,
/// messaging.consumer.group.name, messaging.message.id, messaging.message.body.size,
/// messaging.batch.message_count and error.type, plus inferq.stream,
/// inferq.stream_seq, inferq.member and inferq.delivery_count.
///
/// Usage:
/// @code
///   auto exporter = inferq::otlp::OtlpHttpExporter::Create(
///       {.endpoint = "http://127.0.0.1:4318/v1/traces", .service_name = "my-server"}).value();
///   inferq::EngineOptions o;
///   o.trace = {.sink = exporter, .sample_ratio = 0.05};
///   auto engine = inferq::Engine::Create(std::move(o)).value();
///   ...
///   exporter->ForceFlush(absl::Seconds(5));  // before exiting, or let it go:
///                                            // destruction sends what is queued
/// @endcode
///
/// The batching follows OpenTelemetry's BatchSpanProcessor: a bounded queue
/// (max_queue_spans; a span that finds it full is dropped and counted, Export never
/// waits), sent every schedule_delay or as soon as max_batch_spans are queued. The
/// request is the OTLP/HTTP JSON mapping (opentelemetry-proto, "JSON Protobuf
/// Encoding"): trace and span ids as lowercase hex, 64-bit integers and times as
/// decimal strings, enums as numbers. A response 429, 502, 503 or 504, or a failed
/// connection, is retried (the specification's retryable cases) up to max_attempts
/// with a doubling backoff; any other non-2xx, and a URL or reply curl cannot use,
/// fails the batch. A 2xx whose body reports partialSuccess.rejectedSpans counts those
/// as failed (only the first 64 KiB of a body are read; it is parsed without
/// recursion). Strings that are not valid UTF-8 (subjects and msg_ids are bytes) are
/// sent with U+FFFD in place of each bad byte.
///
/// Thread safety: Export may be called from any number of threads at once (the
/// engine's); ForceFlush, Shutdown and stats from any thread. Destroy it after the
/// engine whose sink it is, or after that engine stopped tracing (the engine holds a
/// shared_ptr, so it stays alive as long as the engine does).
#pragma once

#include <semaphore.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/engine/trace.hpp"
#include "inferq/ring/mpmc_ring.hpp"

/// The OTLP trace exporter, CMake target inferq::otlp: OtlpHttpExporter.
namespace inferq::otlp {

/// Where and how an OtlpHttpExporter sends spans; checked by OtlpHttpExporter::Create.
struct OtlpExporterOptions {
  /// Where to POST: "http://" or "https://" and a host (OTLP/HTTP's default port is
  /// 4318, path /v1/traces).
  std::string endpoint = "http://127.0.0.1:4318/v1/traces";
  std::string service_name = "inferq";  ///< the resource's service.name
  /// Extra request headers (an authorization token, ...): names of [A-Za-z0-9-],
  /// values without CR or LF.
  std::vector<std::pair<std::string, std::string>> headers{};
  std::size_t max_queue_spans = 2048;  ///< 2..2^24, rounded up to a power of two
  std::size_t max_batch_spans = 512;   ///< 1..max_queue_spans, spans per request
  absl::Duration schedule_delay = absl::Seconds(5);   ///< 1ms..24h: longest a span waits
  absl::Duration export_timeout = absl::Seconds(10);  ///< 1ms..1h: one request's limit
  int max_attempts = 5;                               ///< 1..20 tries per batch
  absl::Duration retry_backoff = absl::Milliseconds(100);  ///< 0..1m, doubled per retry
  /// 0..1h: how long Shutdown (and the destructor) goes on sending what is queued;
  /// what is still unsent then counts as failed.
  absl::Duration shutdown_timeout = absl::Seconds(5);
};

/// An OtlpHttpExporter's counters (OtlpHttpExporter::stats).
struct OtlpExporterStats {
  std::uint64_t exported = 0;  ///< spans the collector accepted
  std::uint64_t dropped = 0;   ///< spans Export found no room for (or after Shutdown)
  std::uint64_t failed = 0;    ///< spans of batches that failed, or rejected by the collector
  std::uint64_t requests = 0;  ///< HTTP requests made, retries included
  std::uint64_t retries = 0;   ///< failed requests that were tried again
  std::string last_error{};    ///< the last failure, naming the endpoint; empty if none
};

/// A TraceSink that sends the engine's spans to an OpenTelemetry collector over
/// OTLP/HTTP JSON (see the file comment).
class OtlpHttpExporter final : public TraceSink {
 public:
  /// Starts the sending thread. InvalidArgument naming the field and value for an
  /// endpoint that is not an http:// or https:// URL with a host (libcurl's URL
  /// parser decides; a space or control character is refused too), an empty
  /// service_name, a header name outside [A-Za-z0-9-] or one the exporter sets
  /// (Content-Length, Content-Type, Host, Transfer-Encoding, Expect, Connection, TE,
  /// Upgrade), a header value with CR or LF, or a count or duration outside the
  /// ranges above; ResourceExhausted when libcurl cannot make a URL handle to check
  /// the endpoint with (curl_url() fails); Internal when curl_global_init fails.
  static absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> Create(OtlpExporterOptions options);

  ~OtlpHttpExporter() override;  ///< Shutdown()
  OtlpHttpExporter(const OtlpHttpExporter&) = delete;
  OtlpHttpExporter& operator=(const OtlpHttpExporter&) = delete;

  /// Queues `span`; never waits. Drops it (stats().dropped) when the queue is full or
  /// after Shutdown.
  void Export(Span&& span) noexcept override;

  /// Sends every span queued before the call and waits until they are sent or
  /// given up, at most `timeout` (a year or more, InfiniteDuration included: no
  /// limit). OK when all were exported; DeadlineExceeded when the time ran out;
  /// Unavailable, with the last error, when a batch failed meanwhile.
  absl::Status ForceFlush(absl::Duration timeout);

  /// Sends what is queued for at most shutdown_timeout (a request in flight is cut
  /// short at it; a retry's backoff ends at once), counts what is left as failed, and
  /// stops the thread. Later Exports drop. Idempotent.
  void Shutdown();

  /// A snapshot of the counters.
  OtlpExporterStats stats() const;

  /// The request body for `spans`: one ExportTraceServiceRequest in the OTLP JSON
  /// encoding, with resource attribute service.name = `service_name` and the
  /// instrumentation scope "inferq" with the library's version.
  static std::string EncodeJson(std::span<const Span> spans, std::string_view service_name);

 private:
  explicit OtlpHttpExporter(OtlpExporterOptions options);
  void Run();
  /// Waits for a post to wake_ or until `deadline_ns` (steady ns), whichever is first.
  void WaitForWake(std::int64_t deadline_ns);
  /// Sends `batch` with retries; true when the collector took it.
  bool Send(const std::vector<Span>& batch);

  const OtlpExporterOptions options_;
  MpmcRing<Span> queue_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> queued_{0}, dropped_{0};
  std::atomic<bool> wake_requested_{false};  ///< Export posted `wake_`; the sender has not looked since
  /// Wakes the sender: a full batch, a flush, or stopping. A POSIX semaphore and not
  /// a condition variable: a post is never lost to a sender between its look at the
  /// queue and its wait, and it needs no lock, so Export never waits.
  sem_t wake_;
  mutable std::mutex mu_;
  std::condition_variable done_;  ///< flushers: `processed_` moved
  std::condition_variable stop_;  ///< a retry's backoff: Shutdown began
  /// Shutdown's end for sending (steady ns); INT64_MAX before Shutdown. Read by the
  /// request's progress callback, which aborts a request in flight past it.
  std::atomic<std::int64_t> deadline_ns_{INT64_MAX};
  std::uint64_t processed_ = 0;   ///< spans taken off the queue and sent or given up; guarded by mu_
  std::uint64_t exported_ = 0, failed_ = 0, requests_ = 0, retries_ = 0;  ///< guarded by mu_
  std::string last_error_;        ///< guarded by mu_
  std::thread thread_;
  std::once_flag shutdown_once_;
};

}  // namespace inferq::otlp
