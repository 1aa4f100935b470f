// File: src/adapters/otlp/otlp_exporter.cpp
//
// OtlpHttpExporter: the queue, the sending thread, the OTLP JSON encoding
// (RapidJSON's Writer) and the HTTP POST with retries (libcurl's easy interface).
#include "inferq/adapters/otlp/otlp_exporter.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <utility>

#include "inferq/base/clock.hpp"
#include "inferq/version.hpp"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferq::otlp {
namespace {

template <std::size_t N>
std::string Hex(const std::array<std::uint8_t, N>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * N, '0');
  for (std::size_t i = 0; i < N; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xF];
  }
  return out;
}

template <std::size_t N>
bool AllZero(const std::array<std::uint8_t, N>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

// The length of the valid UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one.
std::size_t Utf8SequenceAt(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // UTF-16 surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// JSON strings must be Unicode: subjects, msg_ids and error messages are bytes, so a
// byte that does not start a valid UTF-8 sequence is written as U+FFFD (the
// replacement character), as OpenTelemetry's SDKs do, and the rest goes as it is.
void Str(JsonWriter& w, std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t n = Utf8SequenceAt(s, i);
    if (n == 0) break;
    i += n;
  }
  if (i == s.size()) {
    w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
    return;
  }
  std::string clean;
  clean.reserve(s.size() + 8);
  for (i = 0; i < s.size();) {
    const std::size_t n = Utf8SequenceAt(s, i);
    if (n == 0) {
      clean += "\xEF\xBF\xBD";
      ++i;
    } else {
      clean.append(s.data() + i, n);
      i += n;
    }
  }
  w.String(clean.data(), static_cast<rapidjson::SizeType>(clean.size()));
}

void StringAttribute(JsonWriter& w, std::string_view key, std::string_view value) {
  w.StartObject();
  Str(w, "key");
  Str(w, key);
  Str(w, "value");
  w.StartObject();
  Str(w, "stringValue");
  Str(w, value);
  w.EndObject();
  w.EndObject();
}

// OTLP JSON: int64 values are decimal strings.
void IntAttribute(JsonWriter& w, std::string_view key, std::uint64_t value) {
  w.StartObject();
  Str(w, "key");
  Str(w, key);
  Str(w, "value");
  w.StartObject();
  Str(w, "intValue");
  Str(w, std::to_string(value));
  w.EndObject();
  w.EndObject();
}

void EncodeSpan(JsonWriter& w, const Span& s) {
  const std::string_view op = StageName(s.stage);
  w.StartObject();
  Str(w, "traceId");
  Str(w, Hex(s.context.trace_id));
  Str(w, "spanId");
  Str(w, Hex(s.context.span_id));
  if (!AllZero(s.parent_span_id)) {
    Str(w, "parentSpanId");
    Str(w, Hex(s.parent_span_id));
  }
  Str(w, "flags");
  w.Uint(s.context.flags);
  Str(w, "name");
  // The conventions' span name: "{messaging.operation.name} {destination}".
  Str(w, s.destination.empty() ? std::string(op) : std::string(op) + " " + s.destination);
  Str(w, "kind");
  w.Uint(static_cast<unsigned>(KindOf(s.stage)));
  Str(w, "startTimeUnixNano");
  Str(w, std::to_string(s.start_unix_ns));
  Str(w, "endTimeUnixNano");
  Str(w, std::to_string(s.end_unix_ns));
  Str(w, "attributes");
  w.StartArray();
  StringAttribute(w, "messaging.system", "inferq");
  StringAttribute(w, "messaging.operation.type", OperationType(s.stage));
  StringAttribute(w, "messaging.operation.name", op);
  if (!s.destination.empty()) StringAttribute(w, "messaging.destination.name", s.destination);
  if (!s.consumer.empty()) StringAttribute(w, "messaging.consumer.group.name", s.consumer);
  if (!s.message_id.empty()) StringAttribute(w, "messaging.message.id", s.message_id);
  IntAttribute(w, "messaging.message.body.size", s.body_size);
  if (s.batch_message_count > 0) {
    IntAttribute(w, "messaging.batch.message_count", s.batch_message_count);
  }
  if (!s.stream.empty()) StringAttribute(w, "inferq.stream", s.stream);
  if (s.stream_seq > 0) IntAttribute(w, "inferq.stream_seq", s.stream_seq);
  if (!s.consumer.empty()) IntAttribute(w, "inferq.member", s.member);
  if (s.delivery_count > 0) IntAttribute(w, "inferq.delivery_count", s.delivery_count);
  if (!s.error_type.empty()) StringAttribute(w, "error.type", s.error_type);
  w.EndArray();
  if (!s.error_type.empty()) {
    Str(w, "status");
    w.StartObject();
    Str(w, "code");
    w.Uint(2);  // STATUS_CODE_ERROR
    if (!s.error_message.empty()) {
      Str(w, "message");
      Str(w, s.error_message);
    }
    w.EndObject();
  }
  w.EndObject();
}

// Headers the request's framing and body type depend on: the exporter sets them.
bool ReservedHeader(std::string_view name) {
  static constexpr std::string_view kReserved[] = {"content-length", "transfer-encoding", "host", "content-type",
                                                   "expect", "connection", "te", "upgrade"};
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(std::begin(kReserved), std::end(kReserved), lower) != std::end(kReserved);
}

bool ValidHeaderName(std::string_view name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

absl::Status Validate(const OtlpExporterOptions& o) {
  auto bad = [](std::string field, std::string value, std::string why) {
    return absl::InvalidArgumentError("OtlpExporterOptions::" + field + " " + value + " " + why);
  };
  const std::string_view ep = o.endpoint;
  const std::string quoted = "'" + o.endpoint.substr(0, 256) + (o.endpoint.size() > 256 ? "...'" : "'");
  if (ep.substr(0, 7) != "http://" && ep.substr(0, 8) != "https://") {
    return bad("endpoint", quoted, "does not start with http:// or https://");
  }
  if (std::any_of(ep.begin(), ep.end(), [](char c) { return static_cast<unsigned char>(c) <= ' ' || c == 0x7F; })) {
    return bad("endpoint", quoted, "holds a space or control character");
  }
  // libcurl's own URL parser (RFC 3986 as curl reads it): a host, and a port in 1..65535.
  {
    std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> url(curl_url(), &curl_url_cleanup);
    if (url == nullptr) return absl::ResourceExhaustedError("curl_url failed");
    const CURLUcode rc = curl_url_set(url.get(), CURLUPART_URL, o.endpoint.c_str(), 0);
    if (rc != CURLUE_OK) return bad("endpoint", quoted, std::string("is not a URL: ") + curl_url_strerror(rc));
    char* host = nullptr;
    const CURLUcode hrc = curl_url_get(url.get(), CURLUPART_HOST, &host, 0);
    const bool has_host = hrc == CURLUE_OK && host != nullptr && host[0] != '\0';
    curl_free(host);
    if (!has_host) return bad("endpoint", quoted, "has no host");
  }
  if (o.service_name.empty()) return bad("service_name", "''", "is empty");
  for (const auto& [name, value] : o.headers) {
    if (!ValidHeaderName(name)) return bad("headers", "name '" + name + "'", "is not a header name");
    if (ReservedHeader(name)) {
      return bad("headers", "name '" + name + "'", "is set by the exporter (framing or content type)");
    }
    if (value.find_first_of("\r\n") != std::string::npos) {
      return bad("headers", "value of '" + name + "'", "holds CR or LF");
    }
  }
  if (o.max_queue_spans < 2 || o.max_queue_spans > (std::size_t{1} << 24)) {
    return bad("max_queue_spans", std::to_string(o.max_queue_spans), "is outside 2..2^24");
  }
  if (o.max_batch_spans < 1 || o.max_batch_spans > o.max_queue_spans) {
    return bad("max_batch_spans", std::to_string(o.max_batch_spans),
               "is outside 1..max_queue_spans (" + std::to_string(o.max_queue_spans) + ")");
  }
  // At least 1 ms: a sub-nanosecond delay was 0 ns to the sender, which then spun.
  if (o.schedule_delay < absl::Milliseconds(1) || o.schedule_delay > absl::Hours(24)) {
    return bad("schedule_delay", absl::FormatDuration(o.schedule_delay), "is outside 1ms..24h");
  }
  if (o.export_timeout < absl::Milliseconds(1) || o.export_timeout > absl::Hours(1)) {
    return bad("export_timeout", absl::FormatDuration(o.export_timeout), "is outside 1ms..1h");
  }
  if (o.shutdown_timeout < absl::ZeroDuration() || o.shutdown_timeout > absl::Hours(1)) {
    return bad("shutdown_timeout", absl::FormatDuration(o.shutdown_timeout), "is outside 0..1h");
  }
  if (o.max_attempts < 1 || o.max_attempts > 20) {
    return bad("max_attempts", std::to_string(o.max_attempts), "is outside 1..20");
  }
  if (o.retry_backoff < absl::ZeroDuration() || o.retry_backoff > absl::Minutes(1)) {
    return bad("retry_backoff", absl::FormatDuration(o.retry_backoff), "is outside 0..1m");
  }
  return absl::OkStatus();
}

// What is kept of a response body: enough for a partialSuccess or an error
// message; the rest is read and dropped (a collector cannot make the exporter grow).
constexpr std::size_t kMaxResponseBytes = 64 * 1024;

std::size_t Collect(char* data, std::size_t size, std::size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  const std::size_t bytes = size * n;
  if (body->size() < kMaxResponseBytes) body->append(data, std::min(bytes, kMaxResponseBytes - body->size()));
  return bytes;
}

// CURLOPT_XFERINFOFUNCTION: non-zero (abort) once Shutdown's deadline has passed.
int PastDeadline(void* deadline, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return SteadyClock::Now() >= static_cast<const std::atomic<std::int64_t>*>(deadline)->load(std::memory_order_acquire)
             ? 1
             : 0;
}

// partialSuccess.rejectedSpans (an int64, in JSON a number or a decimal string): the
// count, or 0 for anything else (negative, fractional, not a number).
std::uint64_t RejectedSpans(const rapidjson::Value& v) {
  if (v.IsUint64()) return v.GetUint64();
  if (!v.IsString()) return 0;
  const std::string_view text(v.GetString(), v.GetStringLength());
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  return ec == std::errc() && end == text.data() + text.size() ? n : 0;
}

// A failure worth another try (the OTLP specification's retryable cases): no
// connection, a timeout, a connection lost before the answer. A URL curl cannot use
// or a reply that is not HTTP is not.
bool RetryableCurlError(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// The curl handle of the sending thread, set up once (the connection is kept).
struct Http {
  CURL* curl = nullptr;
  curl_slist* headers = nullptr;
  std::string response;
  char error[CURL_ERROR_SIZE] = {};
  ~Http() {
    if (curl != nullptr) curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
  }
};

}  // namespace

std::string OtlpHttpExporter::EncodeJson(std::span<const Span> spans, std::string_view service_name) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartObject();
  Str(w, "resourceSpans");
  w.StartArray();
  w.StartObject();
  Str(w, "resource");
  w.StartObject();
  Str(w, "attributes");
  w.StartArray();
  StringAttribute(w, "service.name", service_name);
  w.EndArray();
  w.EndObject();
  Str(w, "scopeSpans");
  w.StartArray();
  w.StartObject();
  Str(w, "scope");
  w.StartObject();
  Str(w, "name");
  Str(w, "inferq");
  Str(w, "version");
  Str(w, INFERQ_VERSION_STRING);
  w.EndObject();
  Str(w, "spans");
  w.StartArray();
  for (const Span& s : spans) EncodeSpan(w, s);
  w.EndArray();
  w.EndObject();
  w.EndArray();
  w.EndObject();
  w.EndArray();
  w.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

absl::StatusOr<std::shared_ptr<OtlpHttpExporter>> OtlpHttpExporter::Create(OtlpExporterOptions options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  static const CURLcode global = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (global != CURLE_OK) {
    return absl::InternalError(std::string("curl_global_init failed: ") + curl_easy_strerror(global));
  }
  std::shared_ptr<OtlpHttpExporter> e(new OtlpHttpExporter(std::move(options)));
  e->thread_ = std::thread([raw = e.get()] { raw->Run(); });
  return e;
}

OtlpHttpExporter::OtlpHttpExporter(OtlpExporterOptions options)
    : options_(std::move(options)), queue_(std::bit_ceil(options_.max_queue_spans)) {
  ::sem_init(&wake_, /*pshared=*/0, 0);  // cannot fail: not shared, initial value 0
}

OtlpHttpExporter::~OtlpHttpExporter() {
  Shutdown();
  ::sem_destroy(&wake_);
}

void OtlpHttpExporter::Export(Span&& span) noexcept {
  if (stopping_.load(std::memory_order_acquire) || !queue_.try_push(std::move(span))) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  queued_.fetch_add(1, std::memory_order_acq_rel);
  // A full batch wakes the sender at once; else it wakes at schedule_delay. One post
  // per look of the sender (wake_requested_), not one per span while it has not run
  // yet: each would be a futex call on the publishing thread.
  if (queue_.size_approx() >= options_.max_batch_spans &&
      !wake_requested_.exchange(true, std::memory_order_acq_rel)) {
    ::sem_post(&wake_);
  }
}

absl::Status OtlpHttpExporter::ForceFlush(absl::Duration timeout) {
  std::unique_lock lock(mu_);
  const std::uint64_t target = queued_.load(std::memory_order_acquire);
  const std::uint64_t failed_before = failed_;
  ::sem_post(&wake_);
  const auto done = [&] { return processed_ >= target; };
  bool finished;
  if (timeout >= absl::Hours(24 * 365)) {  // forever (chrono's wait_for would overflow)
    done_.wait(lock, done);
    finished = true;
  } else {
    finished = done_.wait_for(lock, absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())), done);
  }
  if (!finished) {
    return absl::DeadlineExceededError("OTLP exporter: " + std::to_string(target - processed_) +
                                       " span(s) not sent to " + options_.endpoint + " within " +
                                       absl::FormatDuration(timeout));
  }
  if (failed_ != failed_before) {
    return absl::UnavailableError("OTLP exporter: " + std::to_string(failed_ - failed_before) +
                                  " span(s) not exported: " + last_error_);
  }
  return absl::OkStatus();
}

void OtlpHttpExporter::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      std::lock_guard lock(mu_);
      deadline_ns_.store(SteadyClock::Now() + absl::ToInt64Nanoseconds(options_.shutdown_timeout),
                         std::memory_order_release);
      stopping_.store(true, std::memory_order_release);
    }
    queue_.close();  // later pushes fail; the sender drains what is left
    ::sem_post(&wake_);
    stop_.notify_all();
    if (thread_.joinable()) thread_.join();
  });
}

OtlpExporterStats OtlpHttpExporter::stats() const {
  std::lock_guard lock(mu_);
  OtlpExporterStats s;
  s.exported = exported_;
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.failed = failed_;
  s.requests = requests_;
  s.retries = retries_;
  s.last_error = last_error_;
  return s;
}

void OtlpHttpExporter::WaitForWake(std::int64_t deadline_ns) {
  // sem_clockwait takes an absolute CLOCK_MONOTONIC time, the clock of SteadyClock.
  const timespec at{static_cast<time_t>(deadline_ns / 1'000'000'000),
                    static_cast<long>(deadline_ns % 1'000'000'000)};
  while (::sem_clockwait(&wake_, CLOCK_MONOTONIC, &at) != 0 && errno == EINTR) {
  }
}

void OtlpHttpExporter::Run() {
  std::vector<Span> batch;
  batch.reserve(options_.max_batch_spans);
  const std::int64_t delay_ns = absl::ToInt64Nanoseconds(options_.schedule_delay);
  for (;;) {
    // The next full batch posts again. Cleared before the look at the queue below: an
    // Export that found it set pushed before this exchange (which acquires its
    // release), so the look sees its span; a later one posts. A post left over from a
    // batch already drained only sends early what is queued then.
    wake_requested_.exchange(false, std::memory_order_acq_rel);
    if (!stopping_.load(std::memory_order_acquire) && queue_.size_approx() < options_.max_batch_spans) {
      WaitForWake(SteadyClock::Now() + delay_ns);
    }
    const bool stopping = stopping_.load(std::memory_order_acquire);
    // Everything queued now, a batch at a time. Once stopping, pop() waits for a push
    // that claimed its slot before close() and returns false when all is drained.
    for (;;) {
      batch.clear();
      Span s;
      while (batch.size() < options_.max_batch_spans && (stopping ? queue_.pop(s) : queue_.try_pop(s))) {
        batch.push_back(std::move(s));
      }
      if (batch.empty()) break;
      (void)Send(batch);
      {
        std::lock_guard lock(mu_);
        processed_ += batch.size();
      }
      done_.notify_all();
    }
    if (stopping) return;
  }
}

bool OtlpHttpExporter::Send(const std::vector<Span>& batch) {
  // Only the exporter's own thread sends: its handle (and kept connection) is that
  // thread's.
  thread_local Http http;
  const std::uint64_t n = batch.size();
  const std::string what = "OTLP export of " + std::to_string(n) + " span(s) to " + options_.endpoint;
  auto give_up = [&](const std::string& why) {
    std::lock_guard lock(mu_);
    failed_ += n;
    last_error_ = what + " failed" + why;
    return false;
  };
  // After Shutdown, what is left is sent until shutdown_timeout has passed, then
  // counted as failed unsent.
  auto left_ns = [&] {
    const std::int64_t deadline = deadline_ns_.load(std::memory_order_acquire);
    return deadline == INT64_MAX ? INT64_MAX : deadline - SteadyClock::Now();
  };
  if (left_ns() <= 0) return give_up(": shutdown_timeout " + absl::FormatDuration(options_.shutdown_timeout) + " passed");
  if (http.curl == nullptr) {
    http.curl = curl_easy_init();
    if (http.curl == nullptr) return give_up(": curl_easy_init failed");
    http.headers = curl_slist_append(http.headers, "Content-Type: application/json");
    http.headers = curl_slist_append(http.headers, "Expect:");  // no 100-continue round trip
    for (const auto& [name, value] : options_.headers) {
      http.headers = curl_slist_append(http.headers, (name + ": " + value).c_str());
    }
    curl_easy_setopt(http.curl, CURLOPT_URL, options_.endpoint.c_str());
    curl_easy_setopt(http.curl, CURLOPT_HTTPHEADER, http.headers);
    curl_easy_setopt(http.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(http.curl, CURLOPT_WRITEFUNCTION, &Collect);
    curl_easy_setopt(http.curl, CURLOPT_WRITEDATA, &http.response);
    curl_easy_setopt(http.curl, CURLOPT_ERRORBUFFER, http.error);
    // Called about once a second, or more often, while a request runs: a request in
    // flight when Shutdown's deadline passes is aborted (CURLE_ABORTED_BY_CALLBACK).
    curl_easy_setopt(http.curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(http.curl, CURLOPT_XFERINFOFUNCTION, &PastDeadline);
    curl_easy_setopt(http.curl, CURLOPT_XFERINFODATA, &deadline_ns_);
  }
  const std::string body = EncodeJson(batch, options_.service_name);
  curl_easy_setopt(http.curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(http.curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  absl::Duration backoff = options_.retry_backoff;
  for (int attempt = 1;; ++attempt) {
    const std::int64_t left = left_ns();
    if (left <= 0) {
      return give_up(" after " + std::to_string(attempt - 1) + " attempt(s): shutdown_timeout " +
                     absl::FormatDuration(options_.shutdown_timeout) + " passed");
    }
    // One request's limit: export_timeout, or less once Shutdown's deadline is nearer.
    const std::int64_t limit_ms =
        std::max<std::int64_t>(1, std::min(absl::ToInt64Milliseconds(options_.export_timeout), left / 1'000'000));
    curl_easy_setopt(http.curl, CURLOPT_TIMEOUT_MS, static_cast<long>(limit_ms));
    http.response.clear();
    http.error[0] = '\0';
    const CURLcode rc = curl_easy_perform(http.curl);
    long code = 0;
    curl_easy_getinfo(http.curl, CURLINFO_RESPONSE_CODE, &code);
    {
      std::lock_guard lock(mu_);
      ++requests_;
    }
    std::string why;
    bool retryable = false;
    if (code >= 200 && code < 300) {
      // Accepted (a body cut short after a 2xx status is accepted too: sending it
      // again would duplicate it). partialSuccess.rejectedSpans: spans the collector
      // refused all the same.
      std::uint64_t rejected = 0;
      std::string message;
      rapidjson::Document doc;
      // Iterative: a hostile body nests as deep as it likes without using the stack.
      if (rc == CURLE_OK && !http.response.empty() &&
          !doc.Parse<rapidjson::kParseIterativeFlag>(http.response.c_str()).HasParseError() && doc.IsObject() &&
          doc.HasMember("partialSuccess") && doc["partialSuccess"].IsObject()) {
        const auto& ps = doc["partialSuccess"];
        if (ps.HasMember("rejectedSpans")) rejected = RejectedSpans(ps["rejectedSpans"]);
        if (ps.HasMember("errorMessage") && ps["errorMessage"].IsString()) {
          message = std::string(ps["errorMessage"].GetString(), std::min<std::size_t>(ps["errorMessage"].GetStringLength(), 1024));
        }
      }
      rejected = std::min(rejected, n);
      std::lock_guard lock(mu_);
      exported_ += n - rejected;
      failed_ += rejected;
      if (rejected > 0) {
        last_error_ = what + ": the collector rejected " + std::to_string(rejected) + ": " + message;
      }
      return rejected == 0;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      why = "shutdown_timeout " + absl::FormatDuration(options_.shutdown_timeout) + " passed during the request";
    } else if (rc != CURLE_OK) {
      retryable = RetryableCurlError(rc);
      why = std::string(http.error[0] != '\0' ? http.error : curl_easy_strerror(rc)) + " (curl error " +
            std::to_string(static_cast<int>(rc)) + ")";
    } else {
      retryable = code == 429 || code == 502 || code == 503 || code == 504;
      why = "HTTP " + std::to_string(code) + ": " + http.response.substr(0, 200);
    }
    if (!retryable || attempt >= options_.max_attempts) {
      return give_up(" after " + std::to_string(attempt) + " attempt(s): " + why);
    }
    {
      std::unique_lock lock(mu_);
      ++retries_;
      // The backoff, cut short by Shutdown (whose deadline then bounds the retries).
      stop_.wait_for(lock, absl::ToChronoNanoseconds(backoff), [&] { return stopping_.load(std::memory_order_relaxed); });
    }
    backoff *= 2;
  }
}

}  // namespace inferq::otlp
