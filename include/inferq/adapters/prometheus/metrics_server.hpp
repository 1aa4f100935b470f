/// @file inferq/adapters/prometheus/metrics_server.hpp
///
/// MetricsServer: an HTTP endpoint that Prometheus scrapes, serving the text
/// exposition format (0.0.4) of the collectors added to it (EngineCollector,
/// StateStoreCollector, or any prometheus::Collectable).
///
/// Usage:
/// @code
///   auto server = inferq::prometheus::MetricsServer::Start({}).value();  // 127.0.0.1, a free port
///   server->Add(std::make_shared<inferq::prometheus::EngineCollector>(*engine));
///   std::cout << server->url();  // http://127.0.0.1:41237/metrics
/// @endcode
///
/// It listens on loopback unless told otherwise (MetricsServerOptions::address). It
/// also serves its own exposer_* families, as prometheus-cpp's Exposer names them:
/// exposer_scrapes_total, exposer_transferred_bytes_total (exposition bytes sent) and
/// the summary exposer_request_latencies (µs to collect and serialise a scrape).
///
/// Connections. One I/O thread accepts connections and reads and writes them without
/// blocking (poll(2)); `threads` worker threads only collect and serialise. A
/// connection takes a worker only once its whole request head has come, so a client
/// that trickles its head (a slow loris) or stops reading its response never holds a
/// worker, and a scrape is answered while such clients are connected. The limits:
///   - The request head (request line and headers, at most 8 KiB: 431 beyond) must
///     have come within `header_timeout` of the accept: 408 and the connection is
///     closed otherwise. The deadline is for the whole head, not per byte.
///   - A response must have been taken by the client within `response_timeout` of
///     being ready, or the connection is closed.
///   - At most `max_connections` connections are open. When all are, a new one takes
///     the place of the one that has waited longest for its request head (408 and
///     closed); when every open one has sent its head, new ones wait in the kernel's
///     listen backlog until a response is done. So more slow clients than
///     max_connections, connecting faster than a scraper, can still keep it out.
///
/// Requests: GET and HEAD of `path` (a query string is ignored), HTTP/1.0 and 1.1;
/// 404 for another path, 405 for another method, 400 for a malformed request line.
/// Every response closes its connection (Connection: close; no keep-alive) and is not
/// compressed (no gzip).
///
/// Thread safety: Add may be called from any thread; scrapes run on the server's own
/// threads and call the collectors' Collect concurrently (at most `threads` at once).
/// The destructor stops listening, closes every connection and waits for scrapes in
/// progress: destroy the server before whatever its collectors read.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"

namespace inferq::prometheus {

/// Where a MetricsServer listens, and its threads, timeouts and connection limit.
struct MetricsServerOptions {
  /// The IPv4 address to listen on: loopback by default, "0.0.0.0" for every
  /// interface.
  std::string address = "127.0.0.1";
  int port = 0;                   ///< 0..65535; 0: a free port, which port() tells
  std::string path = "/metrics";  ///< starts with '/'
  int threads = 2;                ///< 1..64 threads collecting and serialising scrapes
  /// From the accept to the end of the request head: 408 and closed after it.
  /// (0, 60 s]. A scraper sends its head at once; 5 s is well under Prometheus'
  /// default scrape timeout (10 s).
  absl::Duration header_timeout = absl::Seconds(5);
  /// From a response being ready to the client having taken all of it; closed after
  /// it. (0, 10 min].
  absl::Duration response_timeout = absl::Seconds(10);
  /// Connections open at once, 1..4096 (see Connections above).
  int max_connections = 64;
};

/// An HTTP endpoint that Prometheus scrapes (see the file comment).
class MetricsServer {
 public:
  /// Listens at once. InvalidArgument naming the value for a port outside 0..65535,
  /// an address that is not a dotted IPv4 address, a path not starting with '/' or
  /// holding a space or control character, threads outside 1..64, a header_timeout
  /// or response_timeout outside its range, or max_connections outside 1..4096;
  /// Unavailable when the address and port cannot be bound (in use, or not this
  /// host's).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(MetricsServerOptions options);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// Serves `collectable`'s families from now on; the server keeps it alive.
  void Add(std::shared_ptr<::prometheus::Collectable> collectable);

  /// The port it listens on (the one the system chose when MetricsServerOptions::port was 0).
  int port() const;
  /// "http://<address>:<port><path>".
  std::string url() const;

 private:
  class Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The text exposition format (version 0.0.4) of `collectable`'s families: what a
/// MetricsServer serves for it.
std::string ExpositionText(const ::prometheus::Collectable& collectable);

}  // namespace inferq::prometheus
