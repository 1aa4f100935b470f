/// @file inferq/adapters/prometheus/engine_collector.hpp
///
/// EngineCollector: the engine's statistics (Engine::Stats) as Prometheus metric
/// families, read when Prometheus scrapes, so that exporting costs the hot path
/// nothing (no counter of the engine is touched twice). StateStoreCollector does the
/// same for a StateStore. Serve them with MetricsServer (metrics_server.hpp), or add
/// them to any prometheus-cpp Exposer.
///
/// Usage:
/// @code
///   auto server = inferq::prometheus::MetricsServer::Start({.port = 9464}).value();
///   server->Add(std::make_shared<inferq::prometheus::EngineCollector>(*engine));
///   // curl http://127.0.0.1:9464/metrics
/// @endcode
///
/// Names follow Prometheus' conventions (https://prometheus.io/docs/practices/naming/):
/// the prefix inferq_, counters end in _total, durations are in seconds (_seconds),
/// sizes in bytes (_bytes); labels stream, consumer, member, tier, node, reason.
/// Every family, with its unit and meaning, is listed in docs/guide/observability.md
/// ("Every metric").
///
/// Histograms: the engine's log-linear histograms (inferq/base/histogram.hpp) are
/// exported as Prometheus histograms with fixed buckets (kLatencyBuckets, in seconds).
/// A bucket counts the records whose log-linear bucket lies wholly at or below its
/// bound (HistogramSnapshot::CountAtMost): a record within 3.1 % below a bound may be
/// counted in the next one.
///
/// Thread safety: Collect may run on any number of threads at once (each takes its
/// own Engine::Stats snapshot). The Engine (StateStore) must outlive every Collect:
/// stop the MetricsServer, or remove the collector, before destroying it.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "inferq/engine/engine.hpp"
#include "inferq/engine/stats.hpp"
#include "inferq/sched/token_probe.hpp"
#include "inferq/state/state_store.hpp"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

/// The Prometheus exposition, CMake target inferq::prometheus: the collectors
/// (engine_collector.hpp) and MetricsServer (metrics_server.hpp).
namespace inferq::prometheus {

/// Upper bounds (seconds) of the latency histograms' buckets, +Inf aside: 1 µs to
/// 10 s in steps of 1, 2.5 and 5.
inline constexpr std::array<double, 22> kLatencyBuckets{
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
    5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,   0.25,  0.5,  1.0,  2.5,  5.0,  10.0};

/// An Engine's statistics as Prometheus metric families (see the file comment).
class EngineCollector final : public ::prometheus::Collectable {
 public:
  /// Reads `engine`, which must outlive every Collect.
  explicit EngineCollector(const Engine& engine) : engine_(engine) {}

  /// One Engine::Stats() snapshot as metric families (Families of it).
  std::vector<::prometheus::MetricFamily> Collect() const override;

  /// The families of snapshot `stats`. Families without a series (no consumer, no
  /// flow control) are left out.
  static std::vector<::prometheus::MetricFamily> Families(const EngineStats& stats);

 private:
  const Engine& engine_;
};

/// A TokenProbe's figures (inferq/sched/token_probe.hpp): families inferq_token_*,
/// with label probe="<name>" when a name is given.
class TokenProbeCollector final : public ::prometheus::Collectable {
 public:
  /// Reads `probe`, which must outlive every Collect; `name` is the probe label.
  explicit TokenProbeCollector(const TokenProbe& probe, std::string name = "")
      : probe_(probe), name_(std::move(name)) {}
  /// One TokenProbe::Stats() snapshot as metric families (Families of it).
  std::vector<::prometheus::MetricFamily> Collect() const override;
  /// The families of snapshot `stats`, labelled probe=`name` when it is not empty.
  static std::vector<::prometheus::MetricFamily> Families(const TokenProbeStats& stats, const std::string& name);

 private:
  const TokenProbe& probe_;
  std::string name_;
};

/// A StateStore's statistics as Prometheus metric families (inferq_state_*).
class StateStoreCollector final : public ::prometheus::Collectable {
 public:
  /// Reads `store`, which must outlive every Collect.
  explicit StateStoreCollector(const StateStore& store) : store_(store) {}
  /// One StateStore::Stats() snapshot as metric families (Families of it).
  std::vector<::prometheus::MetricFamily> Collect() const override;
  /// The families of snapshot `stats`.
  static std::vector<::prometheus::MetricFamily> Families(const StateStoreStats& stats);

 private:
  const StateStore& store_;
};

}  // namespace inferq::prometheus
