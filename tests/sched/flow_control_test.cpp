#include "inferq/sched/flow_control.hpp"

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using inferq::DualChannelController;
using inferq::FlowControlConfig;

namespace {
// budget 1000 bytes, SLA 100 ms.
const FlowControlConfig kConfig{.memory_budget_bytes = 1000, .latency_sla = absl::Milliseconds(100)};
constexpr std::int64_t kMs = 1'000'000;
}  // namespace

TEST_CASE("the configuration is validated, naming the value") {
  CHECK(DualChannelController::Validate(kConfig).ok());
  absl::Status s = DualChannelController::Validate({.memory_budget_bytes = 0,
                                                    .latency_sla = absl::Seconds(1)});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "FlowControlConfig.memory_budget_bytes = 0 must be > 0");
  s = DualChannelController::Validate({.memory_budget_bytes = 1, .latency_sla = -absl::Milliseconds(5)});
  CHECK(s.message() == "FlowControlConfig.latency_sla = -5ms must be > 0 and finite");
  CHECK(!DualChannelController::Validate({.memory_budget_bytes = 1,
                                          .latency_sla = absl::InfiniteDuration()}).ok());
  CHECK_THROWS_AS(DualChannelController(FlowControlConfig{}), std::invalid_argument);
}

TEST_CASE("throttle and weight scale follow the formulas") {
  DualChannelController c(kConfig);
  CHECK(c.Throttle() == 0.0);
  CHECK(c.WeightScale() == 1.0);

  c.Update(1500, 120 * kMs);  // 1.5 x budget, 1.2 x SLA
  inferq::FlowSnapshot s = c.Snapshot();
  CHECK(s.memory_pressure == 0.5);
  CHECK(s.latency_pressure == Approx(0.2).epsilon(1e-12));
  CHECK(s.throttle == Approx(0.38).epsilon(1e-12));  // 0.6 * 0.5 + 0.4 * 0.2
  CHECK(c.Throttle() == s.throttle);
  CHECK(s.memory_used_bytes == 1500);
  CHECK(s.latency_ns == 120 * kMs);

  c.Update(1250, 150 * kMs);  // bp 0.25, rt 0.5: 0.15 + 0.2
  CHECK(c.Throttle() == Approx(0.35).epsilon(1e-12));

  REQUIRE(c.SetReward(1.0).ok());
  CHECK(c.WeightScale() == Approx(1.3).epsilon(1e-12));
  REQUIRE(c.SetReward(-1.0).ok());
  CHECK(c.WeightScale() == Approx(0.7).epsilon(1e-12));
  REQUIRE(c.SetReward(0.5).ok());
  CHECK(c.WeightScale() == 1.15);
  CHECK(c.Snapshot().reward == 0.5);
}

TEST_CASE("pressure is 0 up to the limit and clamps at twice it") {
  DualChannelController c(kConfig);
  c.Update(1000, 100 * kMs);  // exactly at budget and SLA
  CHECK(c.Throttle() == 0.0);
  c.Update(999, -5);  // under, and a negative latency
  CHECK(c.Throttle() == 0.0);
  c.Update(1001, 100 * kMs);
  CHECK(c.Snapshot().memory_pressure == Approx(0.001).epsilon(1e-9));
  c.Update(2000, 100 * kMs);  // memory alone, fully over: 0.6
  CHECK(c.Throttle() == 0.6);
  c.Update(0, 200 * kMs);  // latency alone, fully over: 0.4
  CHECK(c.Throttle() == 0.4);
  c.Update(1'000'000, 10'000 * kMs);  // both far over: clamped, throttle 1
  CHECK(c.Snapshot().memory_pressure == 1.0);
  CHECK(c.Snapshot().latency_pressure == 1.0);
  CHECK(c.Throttle() == 1.0);
  c.Update(std::numeric_limits<std::uint64_t>::max(), std::numeric_limits<std::int64_t>::max());
  CHECK(c.Throttle() == 1.0);
  c.SetMemoryUsed(1000);
  CHECK(c.Throttle() == 0.4);
  c.SetLatency(0);
  CHECK(c.Throttle() == 0.0);
}

TEST_CASE("a reward outside [-1, 1] or NaN is refused with nothing changed") {
  DualChannelController c(kConfig);
  REQUIRE(c.SetReward(0.25).ok());
  absl::Status s = c.SetReward(1.5);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "reward 1.5 is outside [-1, 1]");
  CHECK(c.SetReward(-1.0000001).code() == absl::StatusCode::kInvalidArgument);
  CHECK(c.SetReward(std::nan("")).message() == "reward nan is outside [-1, 1]");
  CHECK(!c.SetReward(std::numeric_limits<double>::infinity()).ok());
  CHECK(c.Snapshot().reward == 0.25);
  CHECK(c.WeightScale() == 1.075);
}

TEST_CASE("concurrent updates and reads see only values that were set") {
  DualChannelController c(kConfig);
  // Writers alternate between two states; every read must be one of the throttles
  // the combinations of channel values give: {0, 0.6} x {0, 0.4}.
  std::atomic<bool> stop{false};
  std::atomic<int> readers_ready{0};  // the writers start once both readers have read
  auto wait_for_readers = [&] {
    while (readers_ready.load() < 2) std::this_thread::yield();
  };
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    wait_for_readers();
    for (int i = 0; i < 20'000; ++i) c.SetMemoryUsed(i % 2 ? 2000 : 500);
  });
  threads.emplace_back([&] {
    wait_for_readers();
    for (int i = 0; i < 20'000; ++i) {
      c.SetLatency(i % 2 ? 300 * kMs : 10 * kMs);
      (void)c.SetReward(i % 2 ? 1.0 : -1.0);
    }
  });
  std::atomic<int> bad{0};
  std::atomic<long> reads{0};
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      bool first = true;
      while (!stop.load(std::memory_order_relaxed)) {
        const double t = c.Throttle();
        const inferq::FlowSnapshot s = c.Snapshot();
        const bool t_ok = t == 0.0 || t == 0.6 || t == 0.4 || t == 1.0;
        const bool s_ok = s.throttle == DualChannelController::ThrottleOf(s.memory_pressure,
                                                                          s.latency_pressure) &&
                          (s.weight_scale == 1.0 + 0.3 * s.reward) &&
                          (s.reward == 0.0 || s.reward == 1.0 || s.reward == -1.0);
        if (!t_ok || !s_ok) bad.fetch_add(1, std::memory_order_relaxed);
        reads.fetch_add(1, std::memory_order_relaxed);
        if (first) readers_ready.fetch_add(1);
        first = false;
      }
    });
  }
  threads[0].join();
  threads[1].join();
  stop.store(true);
  for (std::size_t i = 2; i < threads.size(); ++i) threads[i].join();
  CHECK(bad.load() == 0);
  CHECK(reads.load() > 0);
  // The last values written (i = 19'999, odd): memory 2000, latency 300 ms, reward 1.
  CHECK(c.Snapshot().memory_used_bytes == 2000);
  CHECK(c.Throttle() == 1.0);
  CHECK(c.WeightScale() == 1.3);
}
