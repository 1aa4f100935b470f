/// @file inferq/sched/flow_control.hpp
///
/// DualChannelController: flow control from two backpressure channels and a reward.
/// With EngineOptions::flow_control, producers read the throttle and weight scale on
/// every PublishAck the engine returns (Publish, TryPublish, TryPublishBatch,
/// PublishAsync; an error carries none); schedulers scale weights by the weight scale.
///
/// @code{.unparsed}
///   bp           = clamp(memory_used_bytes / memory_budget_bytes - 1, 0, 1)
///                  how far memory is over its budget (0 at or under the budget,
///                  1 at twice the budget or more)
///   rt           = clamp(latency / latency_sla - 1, 0, 1)
///                  how far the observed latency is over its SLA (same scale)
///   throttle     = min(1, 0.6·bp + 0.4·rt)     0 = full speed, 1 = stop
///   weight_scale = 1 + 0.3·reward              reward in [-1, 1]: scale in [0.7, 1.3]
/// @endcode
///
/// The inputs are the latest values set (no smoothing here: smooth the latency
/// before, e.g. with an EWMA, if samples are noisy). Before any update every input
/// is 0: throttle 0, weight scale 1.
///
/// Usage:
/// @code
///   auto ctl = std::make_unique<inferq::DualChannelController>(
///       inferq::FlowControlConfig{.memory_budget_bytes = 8ull << 30,
///                                 .latency_sla = absl::Milliseconds(200)});
///   ctl->Update(arena_bytes_in_use, p95_latency_ns);     // a monitor thread
///   absl::Status s = ctl->SetReward(score);              // InvalidArgument off [-1, 1]
///   if (rng.Uniform() < ctl->Throttle()) return kThrottled;   // any producer thread
/// @endcode
///
/// Thread safety: every method may be called from any thread at once. Each input is
/// one atomic; a reader computes its results from the values it loads (relaxed:
/// the inputs are independent numbers that publish no other data), so Snapshot is
/// consistent in itself, and Throttle reflects, per channel, some value set no
/// earlier than the last update that happened before the read.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace inferq {

/// The budgets of a DualChannelController.
struct FlowControlConfig {
  /// Memory the lanes may use before backpressure starts, bytes; > 0.
  std::uint64_t memory_budget_bytes = 0;
  /// Latency above which backpressure starts; > 0 and finite, at most 2^63-1 ns.
  absl::Duration latency_sla = absl::ZeroDuration();
};

/// One consistent reading of the controller.
struct FlowSnapshot {
  std::uint64_t memory_used_bytes = 0;  ///< the memory channel's input
  std::int64_t latency_ns = 0;          ///< the response-time channel's input
  double reward = 0;                    ///< the reward, [-1, 1]
  double memory_pressure = 0;   ///< bp, [0, 1]
  double latency_pressure = 0;  ///< rt, [0, 1]
  double throttle = 0;          ///< [0, 1]
  double weight_scale = 1;      ///< [0.7, 1.3]
};

/// Flow control from a memory and a response-time channel, and a reward (see the
/// file comment).
class DualChannelController {
 public:
  /// InvalidArgument naming the field and value for a zero budget or a latency_sla
  /// that is not positive, finite and within int64 ns.
  static absl::Status Validate(const FlowControlConfig& c) {
    if (c.memory_budget_bytes == 0) {
      return absl::InvalidArgumentError(
          "FlowControlConfig.memory_budget_bytes = 0 must be > 0");
    }
    if (c.latency_sla <= absl::ZeroDuration() || c.latency_sla == absl::InfiniteDuration() ||
        c.latency_sla > absl::Nanoseconds(INT64_MAX)) {
      return absl::InvalidArgumentError("FlowControlConfig.latency_sla = " +
                                        absl::FormatDuration(c.latency_sla) +
                                        " must be > 0 and finite");
    }
    return absl::OkStatus();
  }

  /// Throws std::invalid_argument with Validate's message.
  explicit DualChannelController(const FlowControlConfig& config) : config_(config) {
    if (absl::Status s = Validate(config); !s.ok()) {
      throw std::invalid_argument(std::string(s.message()));
    }
    budget_ = static_cast<double>(config.memory_budget_bytes);
    sla_ns_ = static_cast<double>(absl::ToInt64Nanoseconds(config.latency_sla));
  }

  DualChannelController(const DualChannelController&) = delete;
  DualChannelController& operator=(const DualChannelController&) = delete;

  /// The memory channel: bytes in use now.
  void SetMemoryUsed(std::uint64_t bytes) { memory_used_.store(bytes, std::memory_order_relaxed); }
  /// The response-time channel: the observed latency, ns (negative counts as 0).
  void SetLatency(std::int64_t latency_ns) { latency_ns_.store(latency_ns, std::memory_order_relaxed); }
  /// Both channels.
  void Update(std::uint64_t memory_used_bytes, std::int64_t latency_ns) {
    SetMemoryUsed(memory_used_bytes);
    SetLatency(latency_ns);
  }
  /// InvalidArgument naming the value, with nothing changed, for a reward outside
  /// [-1, 1] or NaN.
  absl::Status SetReward(double reward) {
    if (!(reward >= -1.0 && reward <= 1.0)) {  // also NaN
      char text[32];
      std::snprintf(text, sizeof text, "%g", reward);
      return absl::InvalidArgumentError("reward " + std::string(text) + " is outside [-1, 1]");
    }
    reward_.store(reward, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  /// min(1, 0.6·bp + 0.4·rt): 0 = full speed, 1 = stop.
  double Throttle() const {
    return ThrottleOf(MemoryPressure(memory_used_.load(std::memory_order_relaxed)),
                      LatencyPressure(latency_ns_.load(std::memory_order_relaxed)));
  }
  /// 1 + 0.3·reward.
  double WeightScale() const { return 1.0 + 0.3 * reward_.load(std::memory_order_relaxed); }

  /// The inputs and what they give, from one load of each input.
  FlowSnapshot Snapshot() const {
    FlowSnapshot s;
    s.memory_used_bytes = memory_used_.load(std::memory_order_relaxed);
    s.latency_ns = latency_ns_.load(std::memory_order_relaxed);
    s.reward = reward_.load(std::memory_order_relaxed);
    s.memory_pressure = MemoryPressure(s.memory_used_bytes);
    s.latency_pressure = LatencyPressure(s.latency_ns);
    s.throttle = ThrottleOf(s.memory_pressure, s.latency_pressure);
    s.weight_scale = 1.0 + 0.3 * s.reward;
    return s;
  }

  /// The configuration it was made with.
  const FlowControlConfig& config() const { return config_; }

  /// bp for `bytes` in use: clamp(bytes / budget - 1, 0, 1).
  double MemoryPressure(std::uint64_t bytes) const {
    return std::clamp(static_cast<double>(bytes) / budget_ - 1.0, 0.0, 1.0);
  }
  /// rt for an observed latency: clamp(latency / sla - 1, 0, 1).
  double LatencyPressure(std::int64_t latency_ns) const {
    return std::clamp(static_cast<double>(latency_ns) / sla_ns_ - 1.0, 0.0, 1.0);
  }
  /// The throttle for pressures `bp` and `rt`: min(1, 0.6·bp + 0.4·rt).
  static double ThrottleOf(double bp, double rt) { return std::min(1.0, 0.6 * bp + 0.4 * rt); }

 private:
  static_assert(std::atomic<double>::is_always_lock_free, "the reward is read on hot paths");

  FlowControlConfig config_;
  double budget_ = 1;  ///< memory_budget_bytes as double
  double sla_ns_ = 1;  ///< latency_sla in ns as double
  std::atomic<std::uint64_t> memory_used_{0};
  std::atomic<std::int64_t> latency_ns_{0};
  std::atomic<double> reward_{0.0};
};

}  // namespace inferq
