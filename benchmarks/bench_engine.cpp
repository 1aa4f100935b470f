// bench_engine: the engine's scheduling layer (sched/: Batcher, QosScheduler) and,
// below the marked section, end-to-end engine benchmarks.
//
//   build/release/benchmarks/bench_engine --benchmark_min_time=0.2
//
// BM_BatcherDecide/<config>: ns per Decide over a repeating pattern of queue depths
// (0..max_batch+3) and a clock moving 50 µs per call, so every rule is taken.
// BM_QosPick/<config>: one Pop and one Push per iteration on a scheduler holding
// 1024 items spread over 3 tiers x N tenants (steady state: no allocation), keys
// drawn by xorshift; BM_QosPick/priority_queue is a naive peer in the same run: a
// std::priority_queue ordered by tier, then arrival (strict priority, no shares,
// no tenants).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "inferq/sched/batcher.hpp"
#include "inferq/sched/qos_scheduler.hpp"

namespace {

// ---------------------------------------------------------------------------------
// sched/: Batcher

void BM_BatcherDecide(benchmark::State& state, inferq::BatchPolicy policy) {
  auto b = inferq::Batcher::Create(policy);
  if (!b.ok()) {
    state.SkipWithError(std::string(b.status().message()).c_str());
    return;
  }
  inferq::Batcher& batcher = **b;
  if (policy.adaptive) batcher.ObserveRtt(absl::ToInt64Nanoseconds(policy.baseline_rtt) * 2);
  const std::size_t cycle = policy.max_batch + 4;
  std::size_t queued = 0;
  std::int64_t now = 1'000'000'000, oldest = now;
  std::uint64_t taken = 0;
  for (auto _ : state) {
    const inferq::BatchDecision d = batcher.Decide(queued, oldest, now);
    taken += d.take;
    benchmark::DoNotOptimize(d);
    now += 50'000;
    if (++queued == cycle) {
      queued = 0;
      oldest = now;
    }
  }
  benchmark::DoNotOptimize(taken);
  state.SetItemsProcessed(state.iterations());
}

inferq::BatchPolicy Fixed8() {
  inferq::BatchPolicy p;
  p.max_batch = 8;
  p.max_queue_delay = absl::Milliseconds(2);
  return p;
}
inferq::BatchPolicy Adaptive8() {
  inferq::BatchPolicy p = Fixed8();
  p.adaptive = true;
  p.baseline_rtt = absl::Milliseconds(10);
  return p;
}
inferq::BatchPolicy AdaptivePreferred64() {
  inferq::BatchPolicy p = Adaptive8();
  p.max_batch = 64;
  p.preferred_batch_sizes = {8, 16, 32, 64};
  return p;
}

BENCHMARK_CAPTURE(BM_BatcherDecide, fixed_max8, Fixed8());
BENCHMARK_CAPTURE(BM_BatcherDecide, adaptive_max8, Adaptive8());
BENCHMARK_CAPTURE(BM_BatcherDecide, adaptive_max64_preferred4, AdaptivePreferred64());

// ---------------------------------------------------------------------------------
// sched/: QosScheduler

constexpr int kQueued = 1024;

struct Keys {
  std::vector<std::string> names;
  std::vector<inferq::QosKey> keys;  // 3 tiers x tenants
};

Keys MakeKeys(int tenants) {
  Keys k;
  k.names.reserve(static_cast<std::size_t>(tenants));
  for (int t = 0; t < tenants; ++t) k.names.push_back("tenant-" + std::to_string(t));
  for (inferq::Qos q : {inferq::Qos::kGold, inferq::Qos::kSilver, inferq::Qos::kBronze}) {
    for (int t = 0; t < tenants; ++t) k.keys.push_back({q, k.names[static_cast<std::size_t>(t)], t % 4, 1});
  }
  return k;
}

std::uint64_t XorShift(std::uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

void BM_QosPick(benchmark::State& state, int tenants, bool preemption) {
  const Keys k = MakeKeys(tenants);
  inferq::QosConfig c;
  c.capacity = 2 * kQueued;
  c.preemption = preemption;
  auto s = inferq::QosScheduler<std::uint32_t>::Create(c);
  if (!s.ok()) {
    state.SkipWithError(std::string(s.status().message()).c_str());
    return;
  }
  auto& sched = **s;
  std::optional<std::uint32_t> evicted;
  std::uint64_t rng = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < kQueued; ++i) {
    sched.Push(static_cast<std::uint32_t>(i), k.keys[XorShift(rng) % k.keys.size()], evicted);
  }
  for (auto _ : state) {
    std::optional<std::uint32_t> v = sched.Pop();
    benchmark::DoNotOptimize(v);
    sched.Push(std::move(*v), k.keys[XorShift(rng) % k.keys.size()], evicted);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_CAPTURE(BM_QosPick, tiers3_tenants1, 1, false);
BENCHMARK_CAPTURE(BM_QosPick, tiers3_tenants16, 16, false);
BENCHMARK_CAPTURE(BM_QosPick, tiers3_tenants256, 256, false);
BENCHMARK_CAPTURE(BM_QosPick, tiers3_tenants16_preemption, 16, true);

// The naive peer: strict tier priority, FIFO by arrival within a tier.
void BM_QosPickPriorityQueue(benchmark::State& state) {
  struct Item {
    std::uint8_t tier;
    std::uint64_t seq;
    std::uint32_t value;
    bool operator<(const Item& o) const {  // "lower priority than"
      return tier != o.tier ? tier > o.tier : seq > o.seq;
    }
  };
  std::vector<Item> storage;
  storage.reserve(2 * kQueued);
  std::priority_queue<Item> q(std::less<Item>(), std::move(storage));
  std::uint64_t rng = 0x9E3779B97F4A7C15ULL, seq = 0;
  for (int i = 0; i < kQueued; ++i) {
    q.push({static_cast<std::uint8_t>(XorShift(rng) % 3), seq++, static_cast<std::uint32_t>(i)});
  }
  for (auto _ : state) {
    Item top = q.top();
    q.pop();
    benchmark::DoNotOptimize(top);
    q.push({static_cast<std::uint8_t>(XorShift(rng) % 3), seq++, top.value});
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_QosPickPriorityQueue)->Name("BM_QosPick/priority_queue");

// ---------------------------------------------------------------------------------
// End-to-end engine benchmarks (publish -> schedule -> deliver -> ack) go here.

}  // namespace

BENCHMARK_MAIN();
