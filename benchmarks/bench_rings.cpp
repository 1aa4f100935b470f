// bench_rings: MpmcRing against a bounded mutex + condition-variable deque, the
// baseline every lock-free queue has to beat. Peers from Debian packages
// (atomic_queue, moodycamel, xenium, Boost.Lockfree, oneTBB) join this binary with
// the rings issue.
//
//   BM_Throughput/<impl>/<P>x<C>: P producers and C consumers move 8-byte items
//   through a ring of 1024 slots; items_per_second counts items delivered.
//   BM_RoundTrip/<impl>: two threads ping-pong one item through two rings; the
//   reported time per iteration is one round trip.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "inferq/ring/mpmc_ring.hpp"

namespace {

constexpr std::size_t kCapacity = 1024;
constexpr std::uint64_t kItemsPerRun = 1 << 20;

// Bounded blocking queue: std::mutex + two condition variables + std::deque.
class MutexQueue {
 public:
  explicit MutexQueue(std::size_t capacity) : capacity_(capacity) {}
  void push(std::uint64_t v) {
    std::unique_lock lock(mu_);
    not_full_.wait(lock, [&] { return q_.size() < capacity_; });
    q_.push_back(v);
    lock.unlock();
    not_empty_.notify_one();
  }
  std::uint64_t pop() {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return !q_.empty(); });
    const std::uint64_t v = q_.front();
    q_.pop_front();
    lock.unlock();
    not_full_.notify_one();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<std::uint64_t> q_;
  std::size_t capacity_;
};

struct RingAdapter {
  explicit RingAdapter(std::size_t capacity) : ring(capacity) {}
  void push(std::uint64_t v) { ring.push(v); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    ring.pop(v);
    return v;
  }
  inferq::MpmcRing<std::uint64_t> ring;
};

template <class Q>
void BM_Throughput(benchmark::State& state) {
  const int producers = static_cast<int>(state.range(0));
  const int consumers = static_cast<int>(state.range(1));
  std::uint64_t checksum = 0;
  for (auto _ : state) {
    Q q(kCapacity);
    std::atomic<std::uint64_t> sum{0};
    std::vector<std::thread> threads;
    const std::uint64_t per_producer = kItemsPerRun / static_cast<std::uint64_t>(producers);
    const std::uint64_t per_consumer = kItemsPerRun / static_cast<std::uint64_t>(consumers);
    for (int c = 0; c < consumers; ++c) {
      threads.emplace_back([&] {
        std::uint64_t local = 0;
        for (std::uint64_t i = 0; i < per_consumer; ++i) local += q.pop();
        sum.fetch_add(local);
      });
    }
    for (int p = 0; p < producers; ++p) {
      threads.emplace_back([&] {
        for (std::uint64_t i = 1; i <= per_producer; ++i) q.push(i);
      });
    }
    for (auto& t : threads) t.join();
    checksum += sum.load();
  }
  benchmark::DoNotOptimize(checksum);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kItemsPerRun));
}

template <class Q>
void BM_RoundTrip(benchmark::State& state) {
  Q ping(kCapacity), pong(kCapacity);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    for (;;) {
      const std::uint64_t v = ping.pop();
      if (v == 0) return;
      pong.push(v);
    }
  });
  std::uint64_t v = 1;
  for (auto _ : state) {
    ping.push(v);
    v = pong.pop() + 1;
  }
  ping.push(0);
  echo.join();
  benchmark::DoNotOptimize(v);
}

void ThreadArgs(benchmark::internal::Benchmark* b) {
  b->Args({1, 1})->Args({2, 2})->Args({4, 4})->ArgNames({"P", "C"});
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_Throughput, RingAdapter)->Name("BM_Throughput/MpmcRing")->Apply(ThreadArgs);
BENCHMARK_TEMPLATE(BM_Throughput, MutexQueue)->Name("BM_Throughput/MutexDeque")->Apply(ThreadArgs);
BENCHMARK_TEMPLATE(BM_RoundTrip, RingAdapter)->Name("BM_RoundTrip/MpmcRing")->UseRealTime();
BENCHMARK_TEMPLATE(BM_RoundTrip, MutexQueue)->Name("BM_RoundTrip/MutexDeque")->UseRealTime();

BENCHMARK_MAIN();
