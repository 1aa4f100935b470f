// File: inferq/adapters/prometheus/metrics_server.hpp
//
// MetricsServer: an HTTP endpoint that Prometheus scrapes (prometheus-cpp's pull
// Exposer, on civetweb), serving the text exposition format of the collectors added
// to it (EngineCollector, StateStoreCollector, or any prometheus::Collectable).
//
// Usage:
//   auto server = inferq::prometheus::MetricsServer::Start({}).value();  // 127.0.0.1, a free port
//   server->Add(std::make_shared<inferq::prometheus::EngineCollector>(*engine));
//   std::cout << server->url();  // http://127.0.0.1:41237/metrics
//
// It listens on loopback unless told otherwise (MetricsServerOptions::address). It
// also serves prometheus-cpp's own exposer_* families (scrapes, bytes, latency).
//
// Thread safety: Add may be called from any thread; scrapes run on the server's own
// threads and call the collectors' Collect concurrently. The destructor stops
// listening and waits for scrapes in progress: destroy the server before whatever
// its collectors read.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace prometheus {
class Exposer;
}

namespace inferq::prometheus {

struct MetricsServerOptions {
  // The IPv4 address to listen on: loopback by default, "0.0.0.0" for every
  // interface.
  std::string address = "127.0.0.1";
  int port = 0;                   // 0..65535; 0: a free port, which port() tells
  std::string path = "/metrics";  // starts with '/'
  int threads = 2;                // 1..64 threads answering scrapes
};

class MetricsServer {
 public:
  // Listens at once. InvalidArgument naming the value for a port outside 0..65535,
  // an address that is not a dotted IPv4 address, a path not starting with '/' or
  // holding a space or control character, or threads outside 1..64; Unavailable
  // when the address and port cannot be bound (in use, or not this host's).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(MetricsServerOptions options);

  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Serves `collectable`'s families from now on; the server keeps it alive.
  void Add(std::shared_ptr<::prometheus::Collectable> collectable);

  int port() const { return port_; }
  // "http://<address>:<port><path>".
  std::string url() const;

 private:
  MetricsServer() = default;
  MetricsServerOptions options_;
  int port_ = 0;
  std::unique_ptr<::prometheus::Exposer> exposer_;
  std::mutex mu_;
  std::vector<std::shared_ptr<::prometheus::Collectable>> collectables_;  // guarded by mu_
};

// The text exposition format (version 0.0.4) of `collectable`'s families: what a
// MetricsServer serves for it.
std::string ExpositionText(const ::prometheus::Collectable& collectable);

}  // namespace inferq::prometheus
