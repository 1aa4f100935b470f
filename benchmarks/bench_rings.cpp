// bench_rings: MpmcRing against the well-known queues of Debian 12, in one binary and
// one run (see BENCHMARKS.md for the recorded figures and ratios).
//
//   BM_Throughput/<impl>/<P>x<C>  P producers, C consumers, 8-byte items, capacity 1024
//                                 (the unbounded moodycamel queues are preallocated to
//                                 1024 and use try_enqueue, so they are bounded too);
//                                 items_per_second = items delivered.
//   BM_RoundTrip/<impl>           ping-pong of one item through two queues; time per
//                                 iteration = one round trip.
//   BM_Paced/<impl>               one producer at 50,000 items/s, 4 consumers, 2 s;
//                                 cpu_s_per_item = process CPU / items, p50_us and
//                                 p99_us = enqueue -> dequeue latency: the cost of waiting.
//   BM_Alloc/<impl>/<same|cross>  256-byte blocks: FixedPool vs mimalloc vs glibc;
//                                 same = allocate 64 then free them on one thread;
//                                 cross = allocate on one thread, free on another.
//
// Waiting: each peer is used the way its documentation suggests. Queues with blocking
// operations use them (MpmcRing push/pop, tbb::concurrent_bounded_queue push/pop,
// BlockingConcurrentQueue wait_dequeue, the mutex deque); queues with only try_
// operations are driven by a loop that spins 64 times with a pause, then yields
// (AtomicQueueB2's own push/pop spin the same way).
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <atomic_queue/atomic_queue.h>
#include <benchmark/benchmark.h>
#include <boost/lockfree/queue.hpp>
#include <concurrentqueue/blockingconcurrentqueue.h>
#include <concurrentqueue/concurrentqueue.h>
#include <oneapi/tbb/concurrent_queue.h>
#include <xenium/vyukov_bounded_queue.hpp>

#include <mimalloc.h>

#include "bench_util.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/memory/fixed_pool.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/ring/spsc_ring.hpp"

namespace {

constexpr std::size_t kCapacity = 1024;
constexpr std::uint64_t kItemsPerRun = 1 << 20;

// Spin-then-yield retry for queues that only have try_ operations.
template <class F>
void Retry(F&& attempt) {
  for (int i = 0;; ++i) {
    if (attempt()) return;
    if (i < 64) {
      inferq::ring_internal::CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

// ---- adapters: push(v) and pop() that wait -------------------------------------

template <class Wait = inferq::HybridWait>
struct RingAdapter {
  explicit RingAdapter(std::size_t c) : q(c) {}
  void push(std::uint64_t v) { q.push(v); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    q.pop(v);
    return v;
  }
  inferq::MpmcRing<std::uint64_t, Wait> q;
};

struct AtomicQueueAdapter {
  explicit AtomicQueueAdapter(std::size_t c) : q(static_cast<unsigned>(c)) {}
  void push(std::uint64_t v) { q.push(v); }
  std::uint64_t pop() { return q.pop(); }
  atomic_queue::AtomicQueueB2<std::uint64_t> q;
};

struct XeniumAdapter {
  explicit XeniumAdapter(std::size_t c) : q(c) {}
  void push(std::uint64_t v) { Retry([&] { return q.try_push(v); }); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    Retry([&] { return q.try_pop(v); });
    return v;
  }
  xenium::vyukov_bounded_queue<std::uint64_t> q;
};

struct MoodycamelAdapter {
  explicit MoodycamelAdapter(std::size_t c) : q(c) {}
  void push(std::uint64_t v) { Retry([&] { return q.try_enqueue(v); }); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    Retry([&] { return q.try_dequeue(v); });
    return v;
  }
  moodycamel::ConcurrentQueue<std::uint64_t> q;
};

struct MoodycamelBlockingAdapter {
  explicit MoodycamelBlockingAdapter(std::size_t c) : q(c) {}
  void push(std::uint64_t v) { Retry([&] { return q.try_enqueue(v); }); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    q.wait_dequeue(v);
    return v;
  }
  moodycamel::BlockingConcurrentQueue<std::uint64_t> q;
};

struct BoostAdapter {
  explicit BoostAdapter(std::size_t c) : q(c) {}
  void push(std::uint64_t v) { Retry([&] { return q.bounded_push(v); }); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    Retry([&] { return q.pop(v); });
    return v;
  }
  boost::lockfree::queue<std::uint64_t> q;
};

struct TbbAdapter {
  explicit TbbAdapter(std::size_t c) { q.set_capacity(static_cast<std::ptrdiff_t>(c)); }
  void push(std::uint64_t v) { q.push(v); }
  std::uint64_t pop() {
    std::uint64_t v = 0;
    q.pop(v);
    return v;
  }
  tbb::concurrent_bounded_queue<std::uint64_t> q;
};

// Bounded blocking queue: std::mutex + two condition variables + std::deque.
struct MutexDeque {
  explicit MutexDeque(std::size_t c) : capacity(c) {}
  void push(std::uint64_t v) {
    std::unique_lock lock(mu);
    not_full.wait(lock, [&] { return q.size() < capacity; });
    q.push_back(v);
    lock.unlock();
    not_empty.notify_one();
  }
  std::uint64_t pop() {
    std::unique_lock lock(mu);
    not_empty.wait(lock, [&] { return !q.empty(); });
    const std::uint64_t v = q.front();
    q.pop_front();
    lock.unlock();
    not_full.notify_one();
    return v;
  }
  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::deque<std::uint64_t> q;
  std::size_t capacity;
};

// ---- benchmarks ------------------------------------------------------------------

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
    if (sum.load() != static_cast<std::uint64_t>(producers) * per_producer * (per_producer + 1) / 2) {
      state.SkipWithError("checksum mismatch: items lost or duplicated");
    }
  }
  benchmark::DoNotOptimize(checksum);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kItemsPerRun));
}

template <class Q>
void BM_RoundTrip(benchmark::State& state) {
  Q ping(kCapacity), pong(kCapacity);
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

using inferq_bench::NowNs;
using inferq_bench::ProcessCpuSeconds;
using inferq_bench::SleepUntilNs;

// One producer at 50,000 items/s for 2 s, 4 consumers; items are enqueue timestamps.
template <class Q>
void BM_Paced(benchmark::State& state) {
  constexpr int kConsumers = 4;
  constexpr std::int64_t kPeriodNs = 20'000;  // 50,000 items/s
  constexpr std::int64_t kItems = 100'000;    // 2 s
  double cpu_total = 0;
  inferq::HistogramSnapshot latency;
  std::int64_t items = 0;
  for (auto _ : state) {
    Q q(kCapacity);
    inferq::Histogram hist;
    std::vector<std::thread> consumers;
    const double cpu0 = ProcessCpuSeconds();
    for (int c = 0; c < kConsumers; ++c) {
      consumers.emplace_back([&] {
        for (;;) {
          const std::uint64_t ts = q.pop();
          if (ts == 0) return;  // poison
          hist.Record(static_cast<std::uint64_t>(NowNs() - static_cast<std::int64_t>(ts)));
        }
      });
    }
    std::thread producer([&] {
      prctl(PR_SET_TIMERSLACK, 1UL);  // wake on time, not up to 50 µs late
      const std::int64_t start = NowNs();
      for (std::int64_t i = 0; i < kItems; ++i) {
        SleepUntilNs(start + i * kPeriodNs);
        q.push(static_cast<std::uint64_t>(NowNs()));
      }
      for (int c = 0; c < kConsumers; ++c) q.push(0);
    });
    producer.join();
    for (auto& t : consumers) t.join();
    cpu_total += ProcessCpuSeconds() - cpu0;
    latency.Merge(hist.Snapshot());
    items += kItems;
  }
  state.counters["cpu_s_per_item"] = cpu_total / static_cast<double>(items);
  state.counters["p50_us"] = static_cast<double>(latency.Percentile(0.50)) / 1000.0;
  state.counters["p99_us"] = static_cast<double>(latency.Percentile(0.99)) / 1000.0;
}

// ---- allocators: 256-byte blocks ------------------------------------------------
// glibc is called by its own entry points (__libc_malloc/__libc_free) because this
// binary links libmimalloc, which replaces malloc/free in the process.
extern "C" void* __libc_malloc(std::size_t);
extern "C" void __libc_free(void*);

constexpr std::size_t kBlock = 256;
constexpr int kAllocBatch = 64;  // live blocks per round, as a lane holds some

struct GlibcAlloc {
  void* Allocate() { return __libc_malloc(kBlock); }
  void Free(void* p) { __libc_free(p); }
};
struct MimallocAlloc {
  void* Allocate() { return mi_malloc(kBlock); }
  void Free(void* p) { mi_free(p); }
};
struct PoolAlloc {
  inferq::FixedPool pool{kBlock};
  void* Allocate() { return pool.Allocate(); }
  void Free(void* p) { pool.Deallocate(p); }
};

// Same thread: allocate 64 blocks, touch them, free them.
template <class A>
void BM_AllocSame(benchmark::State& state) {
  A a;
  void* blocks[kAllocBatch];
  for (auto _ : state) {
    for (auto& b : blocks) {
      b = a.Allocate();
      *static_cast<char*>(b) = 1;
    }
    for (auto& b : blocks) a.Free(b);
  }
  state.SetItemsProcessed(state.iterations() * kAllocBatch);  // alloc+free pairs
}

// Cross thread: one thread allocates and hands blocks over an SpscRing, the other
// frees them (the pattern of publish on one thread, ack on another).
template <class A>
void BM_AllocCross(benchmark::State& state) {
  A a;
  constexpr std::int64_t kPerRun = 1 << 18;
  for (auto _ : state) {
    inferq::SpscRing<void*, inferq::YieldWait> handoff(1024);
    std::thread freer([&] {
      void* p;
      while (handoff.pop(p)) a.Free(p);
    });
    for (std::int64_t i = 0; i < kPerRun; ++i) {
      void* p = a.Allocate();
      *static_cast<char*>(p) = 1;
      handoff.push(p);
    }
    handoff.close();
    freer.join();
  }
  state.SetItemsProcessed(state.iterations() * kPerRun);
}

void ThreadArgs(benchmark::internal::Benchmark* b) {
  b->Args({1, 1})->Args({2, 2})->Args({4, 4})->ArgNames({"P", "C"});
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

}  // namespace

#define INFERQ_RING_BENCHMARKS(Adapter, name)                                              \
  BENCHMARK_TEMPLATE(BM_Throughput, Adapter)->Name("BM_Throughput/" name)->Apply(ThreadArgs); \
  BENCHMARK_TEMPLATE(BM_RoundTrip, Adapter)->Name("BM_RoundTrip/" name)->UseRealTime();     \
  BENCHMARK_TEMPLATE(BM_Paced, Adapter)                                                     \
      ->Name("BM_Paced/" name)                                                              \
      ->UseRealTime()                                                                       \
      ->Iterations(1)                                                                       \
      ->Unit(benchmark::kMillisecond)

INFERQ_RING_BENCHMARKS(RingAdapter<>, "MpmcRing");
INFERQ_RING_BENCHMARKS(RingAdapter<inferq::YieldWait>, "MpmcRing_yield");
INFERQ_RING_BENCHMARKS(AtomicQueueAdapter, "AtomicQueueB2");
INFERQ_RING_BENCHMARKS(XeniumAdapter, "xenium_vyukov");
INFERQ_RING_BENCHMARKS(MoodycamelAdapter, "moodycamel");
INFERQ_RING_BENCHMARKS(MoodycamelBlockingAdapter, "moodycamel_blocking");
INFERQ_RING_BENCHMARKS(BoostAdapter, "boost_lockfree");
INFERQ_RING_BENCHMARKS(TbbAdapter, "tbb_bounded");
INFERQ_RING_BENCHMARKS(MutexDeque, "MutexDeque");

BENCHMARK_TEMPLATE(BM_AllocSame, PoolAlloc)->Name("BM_Alloc/FixedPool/same");
BENCHMARK_TEMPLATE(BM_AllocSame, MimallocAlloc)->Name("BM_Alloc/mimalloc/same");
BENCHMARK_TEMPLATE(BM_AllocSame, GlibcAlloc)->Name("BM_Alloc/glibc/same");
BENCHMARK_TEMPLATE(BM_AllocCross, PoolAlloc)->Name("BM_Alloc/FixedPool/cross")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AllocCross, MimallocAlloc)->Name("BM_Alloc/mimalloc/cross")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_AllocCross, GlibcAlloc)->Name("BM_Alloc/glibc/cross")->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
