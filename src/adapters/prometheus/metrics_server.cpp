// MetricsServer: prometheus-cpp's pull Exposer (civetweb) behind absl::Status.
#include "inferq/adapters/prometheus/metrics_server.hpp"

#include <arpa/inet.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "prometheus/exposer.h"
#include "prometheus/text_serializer.h"

namespace inferq::prometheus {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(MetricsServerOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError("MetricsServerOptions.port " + std::to_string(options.port) +
                                      " is outside 0..65535");
  }
  in_addr addr{};
  if (::inet_pton(AF_INET, options.address.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError("MetricsServerOptions.address '" + options.address +
                                      "' is not a dotted IPv4 address (such as 127.0.0.1 or 0.0.0.0)");
  }
  bool path_ok = !options.path.empty() && options.path[0] == '/';
  for (char c : options.path) path_ok = path_ok && static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
  if (!path_ok) {
    return absl::InvalidArgumentError("MetricsServerOptions.path '" + options.path +
                                      "' must start with '/' and hold no space or control character");
  }
  if (options.threads < 1 || options.threads > 64) {
    return absl::InvalidArgumentError("MetricsServerOptions.threads " + std::to_string(options.threads) +
                                      " is outside 1..64");
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->options_ = std::move(options);
  const MetricsServerOptions& o = server->options_;
  const std::string listen = o.address + ":" + std::to_string(o.port);
  try {
    // civetweb's options: its default request timeout is none; a scrape that stalls
    // must not hold a thread for ever.
    server->exposer_ = std::make_unique<::prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", std::to_string(o.threads), "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError("metrics server cannot listen on " + listen + ": " + e.what());
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError("metrics server on " + listen + " reports no listening port");
  }
  server->port_ = ports[0];
  return server;
}

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops civetweb (joins its threads) before the collectables go
}

void MetricsServer::Add(std::shared_ptr<::prometheus::Collectable> collectable) {
  std::lock_guard lock(mu_);
  exposer_->RegisterCollectable(collectable, options_.path);
  collectables_.push_back(std::move(collectable));
}

std::string MetricsServer::url() const {
  return "http://" + options_.address + ":" + std::to_string(port_) + options_.path;
}

std::string ExpositionText(const ::prometheus::Collectable& collectable) {
  return ::prometheus::TextSerializer().Serialize(collectable.Collect());
}

}  // namespace inferq::prometheus
