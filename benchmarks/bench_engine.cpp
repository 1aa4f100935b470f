// bench_engine: the engine's scheduling layer (sched/: Batcher, QosScheduler) and,
// in the last section, end-to-end publish -> batch -> ack through the Engine against
// two work queues (a mutex + condition variable deque, tbb::concurrent_bounded_queue).
//
//   build/release/benchmarks/bench_engine --benchmark_min_time=0.5 \
//     --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
//     --benchmark_format=json --benchmark_out=bench_engine.json
//   benchmarks/report_engine.py bench_engine.json
//
// BM_BatcherDecide/<config>: ns per Decide over a repeating pattern of queue depths
// (0..max_batch+3) and a clock moving 50 µs per call, so every rule is taken.
// BM_QosPick/<config>: one Pop and one Push per iteration on a scheduler holding
// 1024 items spread over 3 tiers x N tenants (steady state: no allocation), keys
// drawn by xorshift; BM_QosPick/priority_queue is a naive peer in the same run: a
// std::priority_queue ordered by tier, then arrival (strict priority, no shares,
// no tenants).
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <queue>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <tbb/concurrent_queue.h>

#include "absl/time/time.h"
#include "bench_util.hpp"
#include "engine/group_cursor.hpp"
#include "engine/message_log.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"
#include "inferq/routing/predicate.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/ring/wait_strategy.hpp"
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
// End-to-end: publish -> batch -> ack, inferq against two work queues.
//
// The same work for every implementation: 1 publisher thread, M member (worker)
// threads; 64-byte payload (sequence number from 1, CLOCK_MONOTONIC just before the
// publish call, fill). Each member takes what is queued, up to 32 at a time, reads
// each payload, acks it (inferq), then stamps the clock and records publish -> ack
// latency in its own histogram (log-linear, within 3.1 %). Every run checks that each
// event came back exactly once by count and by the sum of the sequence numbers.
//
//   BM_EndToEnd/<impl>/members:M       300,000 events as fast as the publisher goes;
//                                      items_per_second = events / (first publish ->
//                                      last ack); p50_ns / p99_ns publish -> ack: at
//                                      saturation this is mostly queueing (lanes of
//                                      1,024 per member stay full).
//   BM_EndToEndPaced/<impl>/members:M  20,000 events at 20,000 events/s on an absolute
//                                      schedule (clock_nanosleep TIMER_ABSTIME, 1 ns
//                                      timer slack); p50_ns / p99_ns are the latency
//                                      figures; cpu_ns_per_event is what it costs.
//
// Before the timed part the publisher sends 64 warm-up events per member (sequence 0)
// and waits until they are all back, so pools and lanes are touched once.
//
// Implementations (members M; capacity M x 1,024 items for every queue):
//   inferq       Engine: one stream (`e2e.>`, retention kInterest), one consumer with
//                M members, lane_capacity 1,024, OverflowPolicy::kBlock, explicit ack,
//                round robin; members pull with Member::NextBatch(2 ms) under
//                ConsumerConfig::batch {max_batch 32, max_queue_delay 0}: whatever is
//                queued, up to 32. Each message is acked (Message::Ack).
//   inferq_qos   the same with ConsumerConfig::qos = QosConfig{} (default tier
//                shares; scheduled lanes take a mutex): events cycle gold / silver /
//                bronze and 4 tenants.
//   inferq_ack_none  the same as inferq with AckPolicy::kNone (members:1 only): a
//                delivery is done when it is pulled, nothing is acked or tracked.
//   mutex_deque  the obvious work queue: std::deque under a std::mutex, two
//                condition variables (not empty / not full, bounded to the same
//                capacity), notify_one per push; a worker takes up to 32 items per
//                lock.
//   tbb_bounded  tbb::concurrent_bounded_queue (set_capacity): the worker blocks in
//                pop() for the first item and try_pop()s up to 31 more.
//   floor        (members:1 only) the least an engine with explicit acks must do
//                here: inferq's event build, a route by string compare, a sequence
//                from an atomic, one record, a push on the lanes' ring, an ack as a
//                store (FloorImpl says what it leaves out).
//   log          the engine-core redesign's data path wired by hand, without the
//                engine around it (LogImpl): a MessageLog of compact slots, members
//                claiming ranges of a GroupCursor, acks as bits (one CAS per word of
//                a batch), ack_wait 30 s with the timer's samples, the log trimmed
//                behind the group's lowest held sequence. What the redesign can reach
//                before the engine's routing, limits and stats are put back on it.
// The peers move a struct {std::string subject; std::shared_ptr<const Payload>}
// (one make_shared per event, as inferq allocates one payload Buffer and one Event
// per event); they do not number, store or route events, keep no per-delivery
// state, take no acks and cannot redeliver. inferq does all of that: the figures
// are what that bookkeeping costs against a bare work queue.
//
// Counters: items_per_second (events acked / s); p50_ns, p99_ns, max_ns (publish ->
// ack); cpu_ns_per_event (process CPU, every thread, / events); mean_batch (events
// per pull); lost and bad_checksum (both 0 in a correct run). With 2 vCPUs, 16
// members (plus the publisher) oversubscribe the machine; that is part of the
// measurement, not hidden.

namespace e2e {

constexpr std::size_t kMaxBatch = 32;
constexpr std::size_t kLaneCapacity = 1024;
constexpr std::int64_t kThroughputEvents = 300'000;
constexpr std::int64_t kPacedEvents = 20'000;
constexpr std::int64_t kPacedPeriodNs = 50'000;  // 20,000 events/s
constexpr std::int64_t kWarmupPerMember = 64;

struct Payload {
  std::uint64_t seq = 0;     // from 1; 0 = warm-up
  std::int64_t send_ns = 0;  // CLOCK_MONOTONIC just before the publish call
  std::uint8_t fill[48] = {};
};
static_assert(sizeof(Payload) == 64);

using inferq_bench::NowNs;
using inferq_bench::ProcessCpuSeconds;
using inferq_bench::SleepUntilNs;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_engine: %s\n", what.c_str());
  std::abort();
}

const std::array<std::string, 4> kTenants = {"tenant-0", "tenant-1", "tenant-2", "tenant-3"};

// What each member thread saw; touched by its own thread only.
struct Tally {
  std::uint64_t events = 0;  // timed events (seq > 0)
  std::uint64_t seq_sum = 0;
  std::uint64_t pulls = 0;   // batches that held a timed event
  std::int64_t last_ns = 0;
  inferq::HistogramSnapshot latency_ns;
};

// Adds stream `sc` and consumer `cc` to `engine` and returns the consumer's members.
std::vector<inferq::Member> AddWorkers(inferq::Engine& engine, const inferq::StreamConfig& sc,
                                       const inferq::ConsumerConfig& cc) {
  if (absl::Status st = engine.AddStream(sc); !st.ok()) Die(std::string(st.message()));
  absl::StatusOr<inferq::Consumer> c = engine.AddConsumer(cc);
  if (!c.ok()) Die(std::string(c.status().message()));
  std::vector<inferq::Member> members;
  for (std::uint32_t i = 0; i < cc.members; ++i) {
    absl::StatusOr<inferq::Member> m = c->member(i);
    if (!m.ok()) Die(std::string(m.status().message()));
    members.push_back(*m);
  }
  return members;
}

// ---- implementations -----------------------------------------------------------------
// Each has a constructor (members, total events incl. warm-up, qos); Publish(payload,
// i) on the publisher thread; Finish() after the last publish; and Pull(member, f),
// on member thread `member`, which hands each item of one batch to f(payload) after
// acking it and returns false once the member should stop.

struct InferqImpl {
  InferqImpl(int members, std::int64_t total, bool qos,
             inferq::AckPolicy ack = inferq::AckPolicy::kExplicit)
      : total_(total), ack_(ack) {
    inferq::StreamConfig sc{.name = "E2E", .subjects = {"e2e.>"}};
    sc.retention = inferq::RetentionPolicy::kInterest;
    inferq::ConsumerConfig cc{.stream = "E2E", .name = "workers"};
    cc.members = static_cast<std::uint32_t>(members);
    cc.lane_capacity = kLaneCapacity;
    cc.ack = ack;
    cc.batch.max_batch = kMaxBatch;
    cc.batch.max_queue_delay = absl::ZeroDuration();
    if (qos) cc.qos = inferq::QosConfig{};
    members_ = AddWorkers(*engine_, sc, cc);
    qos_ = qos;
  }

  void Publish(const Payload& p, std::int64_t i) {
    inferq::Event e;
    e.subject = "e2e.work";
    if (qos_) {
      e.qos = static_cast<inferq::Qos>(i % 3);
      e.tenant = kTenants[static_cast<std::size_t>(i % 4)];
    }
    e.payload = inferq::Buffer::Copy(std::as_bytes(std::span(&p, 1)));
    absl::StatusOr<inferq::PublishAck> a = engine_->Publish(std::move(e));
    if (!a.ok()) Die(std::string(a.status().message()));
  }
  void Finish() {}

  template <class F>
  bool Pull(int member, F&& f) {
    if (acked_.load(std::memory_order_relaxed) >= total_) return false;
    absl::StatusOr<std::vector<inferq::Message>> batch =
        members_[static_cast<std::size_t>(member)].NextBatch(absl::Milliseconds(2));
    if (!batch.ok()) {
      if (batch.status().code() != absl::StatusCode::kDeadlineExceeded) {
        Die(std::string(batch.status().message()));
      }
      return true;
    }
    for (inferq::Message& m : *batch) {
      Payload p;
      const std::span<const std::byte> bytes = m.event().payload.span();
      if (bytes.size() != sizeof p) Die("payload size");
      std::memcpy(&p, bytes.data(), sizeof p);
      if (ack_ == inferq::AckPolicy::kExplicit) {
        if (absl::Status s = m.Ack(); !s.ok()) Die(std::string(s.message()));
      }
      f(p);
    }
    acked_.fetch_add(static_cast<std::int64_t>(batch->size()), std::memory_order_relaxed);
    return true;
  }

  std::unique_ptr<inferq::Engine> engine_ = inferq::Engine::Create().value();
  std::vector<inferq::Member> members_;
  std::int64_t total_;
  inferq::AckPolicy ack_;
  bool qos_ = false;
  alignas(64) std::atomic<std::int64_t> acked_{0};
};

// The same with AckPolicy::kNone: a delivery is done when it is pulled.
struct InferqAckNoneImpl : InferqImpl {
  InferqAckNoneImpl(int members, std::int64_t total, bool qos)
      : InferqImpl(members, total, qos, inferq::AckPolicy::kNone) {}
};

struct PeerItem {
  std::string subject;
  std::shared_ptr<const Payload> payload;  // nullptr: stop (tbb_bounded)
};

PeerItem MakeItem(const Payload& p) { return {"e2e.work", std::make_shared<const Payload>(p)}; }

struct MutexDequeImpl {
  MutexDequeImpl(int members, std::int64_t, bool)
      : capacity_(static_cast<std::size_t>(members) * kLaneCapacity) {}

  void Publish(const Payload& p, std::int64_t) {
    PeerItem item = MakeItem(p);
    std::unique_lock l(mu_);
    not_full_.wait(l, [&] { return q_.size() < capacity_; });
    q_.push_back(std::move(item));
    l.unlock();
    not_empty_.notify_one();
  }
  void Finish() {
    {
      std::lock_guard l(mu_);
      closed_ = true;
    }
    not_empty_.notify_all();
  }

  template <class F>
  bool Pull(int, F&& f) {
    std::array<PeerItem, kMaxBatch> batch;
    std::size_t n = 0;
    {
      std::unique_lock l(mu_);
      not_empty_.wait(l, [&] { return !q_.empty() || closed_; });
      if (q_.empty()) return false;  // closed and drained
      n = std::min(kMaxBatch, q_.size());
      for (std::size_t i = 0; i < n; ++i) {
        batch[i] = std::move(q_.front());
        q_.pop_front();
      }
    }
    not_full_.notify_one();
    for (std::size_t i = 0; i < n; ++i) {
      const Payload p = *batch[i].payload;
      batch[i] = {};
      f(p);
    }
    return true;
  }

  std::size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<PeerItem> q_;
  bool closed_ = false;
};

struct TbbBoundedImpl {
  TbbBoundedImpl(int members, std::int64_t, bool) : members_(members) {
    q_.set_capacity(static_cast<std::ptrdiff_t>(members) * static_cast<std::ptrdiff_t>(kLaneCapacity));
  }

  void Publish(const Payload& p, std::int64_t) { q_.push(MakeItem(p)); }
  // One stop item per worker; a worker stops after the first it sees.
  void Finish() {
    for (int i = 0; i < members_; ++i) q_.push(PeerItem{});
  }

  template <class F>
  bool Pull(int, F&& f) {
    std::array<PeerItem, kMaxBatch> batch;
    q_.pop(batch[0]);
    std::size_t n = 1;
    bool stop = batch[0].payload == nullptr;
    while (!stop && n < kMaxBatch && q_.try_pop(batch[n])) {
      stop = batch[n].payload == nullptr;
      ++n;
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (batch[i].payload == nullptr) continue;
      const Payload p = *batch[i].payload;
      batch[i] = {};
      f(p);
    }
    return !stop;
  }

  int members_;
  tbb::concurrent_bounded_queue<PeerItem> q_;
};

// The floor of the explicit-ack path on this machine (issue 15, target 1): the
// least any engine that numbers events and lets a member ack each one must do, built
// from inferq's own parts. The publisher builds the same event as InferqImpl (a
// subject string and a 64-byte Buffer), routes it by comparing the subject with the
// one it routed last, takes a sequence number from an atomic, allocates one record
// (subject, payload, sequence, the state word an ack sets) and pushes it on an
// MpmcRing<_, BudgetedWait> of 1,024 (the lanes' ring and wait). A member pops what
// is queued, up to 32, reads the payload and acks by a release store to the record's
// state. It keeps no pending table, arms no ack-wait timer, checks no limit or
// duplicate window and can never redeliver: a real engine does all of that on top,
// so its events/s is above what any engine with inferq's promises reaches here.
struct FloorImpl {
  struct Record {
    std::string subject;
    inferq::Buffer payload;
    std::uint64_t seq = 0;
    std::atomic<std::uint8_t> state{0};  // 0 delivered, 1 acked
  };
  using Handle = std::shared_ptr<Record>;

  FloorImpl(int members, std::int64_t total, bool)
      : ring_(static_cast<std::size_t>(members) * kLaneCapacity), total_(total) {}

  void Publish(const Payload& p, std::int64_t) {
    std::string subject = "e2e.work";
    inferq::Buffer payload = inferq::Buffer::Copy(std::as_bytes(std::span(&p, 1)));
    if (subject != routed_) Die("floor: unrouted subject " + subject);  // route
    Handle r = std::make_shared<Record>();
    r->subject = std::move(subject);
    r->payload = std::move(payload);
    r->seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
    if (!ring_.push(std::move(r))) Die("floor: ring closed");
  }
  void Finish() {}

  template <class F>
  bool Pull(int, F&& f) {
    if (acked_.load(std::memory_order_relaxed) >= total_) return false;
    std::array<Handle, kMaxBatch> batch;
    if (!ring_.pop_until(batch[0], NowNs() + 2'000'000)) return true;
    const std::size_t n = 1 + ring_.try_pop_bulk(std::span(batch).subspan(1));
    for (std::size_t i = 0; i < n; ++i) {
      Payload p;
      const std::span<const std::byte> bytes = batch[i]->payload.span();
      if (bytes.size() != sizeof p) Die("payload size");
      std::memcpy(&p, bytes.data(), sizeof p);
      batch[i]->state.store(1, std::memory_order_release);  // the ack
      batch[i].reset();
      f(p);
    }
    acked_.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
    return true;
  }

  inferq::MpmcRing<Handle, inferq::BudgetedWait> ring_;
  const std::string routed_ = "e2e.work";
  std::int64_t total_;
  std::atomic<std::uint64_t> next_seq_{1};
  alignas(64) std::atomic<std::int64_t> acked_{0};
};

// The redesign's data path (see "log" above). The publisher builds the same event
// parts as FloorImpl (a subject string routed by compare, a 64-byte Buffer), claims a
// sequence of the log and publishes a compact slot into it (an interned subject id
// and the Buffer: no record allocation, no shared_ptr), then wakes a sleeping member
// (an EventCount: no syscall while none sleeps). It waits while the group holds
// kLaneCapacity x members sequences unsettled (the lanes' bound). A member claims up
// to 32 published sequences with one CAS, reads each slot, acks the batch with one
// CAS per word of the AckWindow, and trims the log behind the group's lowest held
// sequence. Nothing is redelivered in a run (ack_wait 30 s); Tick and Expire run once
// per pull, on the member, as the engine's timer would.
struct LogImpl {
  struct Slot {
    std::uint32_t subject_id = 0;
    inferq::Buffer payload;
  };
  using Log = inferq::engine_internal::MessageLog<Slot>;
  using Cursor = inferq::engine_internal::GroupCursor;

  LogImpl(int members, std::int64_t total, bool)
      : capacity_(static_cast<std::uint64_t>(members) * kLaneCapacity),
        log_(10, 1),
        group_({.window_word_bits = static_cast<unsigned>(std::bit_width(capacity_ / 32) - 1),
                .start = 1,
                .ack_wait_ns = 30'000'000'000}),
        total_(total) {
    for (int m = 0; m < members; ++m) readers_.push_back(std::make_unique<Log::Reader>(log_));
  }

  void Publish(const Payload& p, std::int64_t) {
    std::string subject = "e2e.work";
    inferq::Buffer payload = inferq::Buffer::Copy(std::as_bytes(std::span(&p, 1)));
    if (subject != routed_) Die("log: unrouted subject " + subject);  // route
    const std::uint64_t seq = log_.Claim(1);
    auto room = [&] { return seq < group_.floor() + capacity_; };
    if (!room()) {
      inferq::ring_internal::WaitUntil<inferq::BudgetedWait>(
          space_, inferq::kNoDeadline, room, [] { return false; }, [] { return false; });
    }
    if (!log_.Publish(seq, Slot{1, std::move(payload)})) Die("log: publish failed");
    // seq_cst: the change a sleeping member's re-check reads (event_count.hpp, inv. 2).
    published_.store(seq + 1, std::memory_order_seq_cst);
    data_.NotifyOne();
  }
  void Finish() {}

  template <class F>
  bool Pull(int m, F&& f) {
    if (acked_.load(std::memory_order_relaxed) >= total_) return false;
    Cursor::Range r;
    auto claim = [&] {
      r = group_.Claim(kMaxBatch, published_.load(std::memory_order_seq_cst));
      return !r.empty();
    };
    if (!claim() &&
        !inferq::ring_internal::WaitUntil<inferq::BudgetedWait>(
            data_, NowNs() + 2'000'000, claim, [] { return false; },
            [&] { return published_.load(std::memory_order_relaxed) > group_.next(); })) {
      return true;
    }
    Log::Reader& reader = *readers_[static_cast<std::size_t>(m)];
    for (std::uint64_t s = r.first; s < r.end; ++s) {
      Log::Ref ref;
      if (reader.Read(s, ref) != inferq::engine_internal::LogRead::kReady) Die("log: a claimed slot is not there");
      Payload p;
      const std::span<const std::byte> bytes = ref->payload.span();
      if (bytes.size() != sizeof p) Die("payload size");
      std::memcpy(&p, bytes.data(), sizeof p);
      f(p);
    }
    // The acks: one CAS per word of the window the batch covers.
    for (std::uint64_t s = r.first; s < r.end;) {
      const std::uint64_t base = s & ~std::uint64_t{31};
      const std::uint64_t end = std::min(r.end, base + 32);
      const std::uint64_t mask = ((end - base == 32 ? 0 : std::uint64_t{1} << (end - base)) - 1) &
                                 ~((std::uint64_t{1} << (s - base)) - 1);
      if (group_.AckWord(base, static_cast<std::uint32_t>(mask)) != end - s) Die("log: an ack was refused");
      s = end;
    }
    space_.NotifyOne();  // the publisher may wait for room
    {
      std::unique_lock lock(timer_mu_, std::try_to_lock);  // the timer's: one thread at a time
      if (lock.owns_lock()) {
        group_.Tick([] { return NowNs(); });  // the clock read after the cursor
        group_.Expire(NowNs());
      }
    }
    log_.TrimBefore(group_.lowest_held());
    acked_.fetch_add(static_cast<std::int64_t>(r.size()), std::memory_order_relaxed);
    return true;
  }

  const std::uint64_t capacity_;
  Log log_;
  Cursor group_;
  std::vector<std::unique_ptr<Log::Reader>> readers_;
  const std::string routed_ = "e2e.work";
  std::int64_t total_;
  std::mutex timer_mu_;
  alignas(64) std::atomic<std::uint64_t> published_{1};
  alignas(64) inferq::ring_internal::EventCount data_;
  alignas(64) inferq::ring_internal::EventCount space_;
  alignas(64) std::atomic<std::int64_t> acked_{0};
};

// ---- the run ---------------------------------------------------------------------------

struct RunResult {
  std::uint64_t events = 0;
  std::uint64_t delivered = 0;
  std::uint64_t pulls = 0;
  bool checksum_ok = true;
  double wall_s = 0;  // first timed publish -> last ack
  double cpu_s = 0;
  inferq::HistogramSnapshot latency_ns;
  inferq::HistogramSnapshot send_lag_ns;

  void Add(const RunResult& o) {
    events += o.events;
    delivered += o.delivered;
    pulls += o.pulls;
    checksum_ok = checksum_ok && o.checksum_ok;
    wall_s += o.wall_s;
    cpu_s += o.cpu_s;
    latency_ns.Merge(o.latency_ns);
    send_lag_ns.Merge(o.send_lag_ns);
  }
};

template <class Impl>
RunResult Run(int members, bool qos, std::int64_t events, std::int64_t period_ns) {
  const std::int64_t warmup = kWarmupPerMember * members;
  Impl impl(members, warmup + events, qos);
  std::atomic<std::int64_t> warm_back{0};
  std::vector<Tally> tallies(static_cast<std::size_t>(members));

  std::vector<std::thread> workers;
  for (int w = 0; w < members; ++w) {
    workers.emplace_back([&, w] {
      pthread_setname_np(pthread_self(), ("member" + std::to_string(w)).c_str());
      Tally& t = tallies[static_cast<std::size_t>(w)];
      bool timed = false;
      auto on_item = [&](const Payload& p) {
        const std::int64_t now = NowNs();
        if (p.seq == 0) {
          warm_back.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        timed = true;
        ++t.events;
        t.seq_sum += p.seq;
        t.last_ns = now;
        t.latency_ns.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, now - p.send_ns)));
      };
      for (;;) {
        timed = false;
        if (!impl.Pull(w, on_item)) break;
        if (timed) ++t.pulls;
      }
    });
  }

  RunResult r;
  std::int64_t start_ns = 0;
  double cpu0 = 0;
  std::thread publisher([&] {
    pthread_setname_np(pthread_self(), "publisher");
    prctl(PR_SET_TIMERSLACK, 1UL);
    for (std::int64_t i = 0; i < warmup; ++i) impl.Publish(Payload{}, i);
    while (warm_back.load(std::memory_order_relaxed) < warmup) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    cpu0 = ProcessCpuSeconds();
    start_ns = NowNs();
    for (std::int64_t i = 0; i < events; ++i) {
      if (period_ns > 0) {
        const std::int64_t due = start_ns + i * period_ns;
        const std::int64_t now = SleepUntilNs(due);
        r.send_lag_ns.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, now - due)));
      }
      Payload p;
      p.seq = static_cast<std::uint64_t>(i + 1);
      p.send_ns = NowNs();
      impl.Publish(p, i);
    }
    impl.Finish();
  });
  publisher.join();
  for (auto& t : workers) t.join();
  r.cpu_s = ProcessCpuSeconds() - cpu0;

  std::int64_t last_ns = start_ns;
  std::uint64_t seq_sum = 0;
  for (const Tally& t : tallies) {
    r.delivered += t.events;
    r.pulls += t.pulls;
    seq_sum += t.seq_sum;
    r.latency_ns.Merge(t.latency_ns);
    last_ns = std::max(last_ns, t.last_ns);
  }
  const auto n = static_cast<std::uint64_t>(events);
  r.events = n;
  r.checksum_ok = r.delivered == n && seq_sum == n * (n + 1) / 2;
  r.wall_s = static_cast<double>(last_ns - start_ns) / 1e9;
  return r;
}

template <class Impl>
void BM_EndToEnd(benchmark::State& state, int members, bool qos, bool paced) {
  RunResult total;
  for (auto _ : state) {
    RunResult r = Run<Impl>(members, qos, paced ? kPacedEvents : kThroughputEvents,
                            paced ? kPacedPeriodNs : 0);
    state.SetIterationTime(r.wall_s);
    total.Add(r);
  }
  const double runs = static_cast<double>(state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(total.delivered));  // per manual time
  state.counters["lost"] = static_cast<double>(total.events - std::min(total.events, total.delivered)) / runs;
  state.counters["bad_checksum"] = total.checksum_ok ? 0 : 1;
  state.counters["p50_ns"] = static_cast<double>(total.latency_ns.Percentile(0.50));
  state.counters["p99_ns"] = static_cast<double>(total.latency_ns.Percentile(0.99));
  state.counters["max_ns"] = static_cast<double>(total.latency_ns.max());
  state.counters["cpu_ns_per_event"] = total.cpu_s * 1e9 / static_cast<double>(total.events);
  state.counters["mean_batch"] =
      total.pulls == 0 ? 0 : static_cast<double>(total.delivered) / static_cast<double>(total.pulls);
  if (paced) {
    state.counters["send_lag_p99_ns"] = static_cast<double>(total.send_lag_ns.Percentile(0.99));
  }
}

template <class Impl>
void Register(const std::string& impl, int members, bool qos) {
  for (const bool paced : {false, true}) {
    const std::string name = std::string(paced ? "BM_EndToEndPaced/" : "BM_EndToEnd/") + impl +
                             "/members:" + std::to_string(members);
    benchmark::RegisterBenchmark(name.c_str(),
                                 [members, qos, paced](benchmark::State& s) {
                                   BM_EndToEnd<Impl>(s, members, qos, paced);
                                 })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

const int kRegistered = [] {
  for (const int m : {1, 4, 16}) {
    Register<InferqImpl>("inferq", m, false);
    Register<MutexDequeImpl>("mutex_deque", m, false);
    Register<TbbBoundedImpl>("tbb_bounded", m, false);
  }
  Register<InferqImpl>("inferq_qos", 4, true);
  Register<InferqAckNoneImpl>("inferq_ack_none", 1, false);
  Register<FloorImpl>("floor", 1, false);
  for (const int m : {1, 4, 16}) Register<LogImpl>("log", m, false);
  return 0;
}();

}  // namespace e2e

// ---------------------------------------------------------------------------------
// Idle: M member threads blocked in a pull with nothing published (issue 15, speed
// target 4: 16 members use under 1 % of one core in total over 5 s).
//
//   BM_Idle/<impl>/members:M  M threads each block in their implementation's pull
//                             (inferq: Member::Next(60 s) on one consumer of M
//                             members of one stream; the peers: their blocking pop);
//                             after a 0.5 s settling period (thread start-up, the
//                             active part of each wait), the process's CPU time
//                             (getrusage(RUSAGE_SELF) user + sys, every thread incl.
//                             the engine's own) is read over 5 s of wall time.
//                             cpu_pct_one_core = CPU s / wall s x 100;
//                             context_switches_per_s = voluntary + involuntary, per s
//                             (each wake-up of a sleeping thread is at least one).
//                             Nothing may be delivered: a message aborts the run.

namespace idle {

constexpr std::int64_t kSettleNs = 500'000'000;
constexpr std::int64_t kMeasureNs = 5'000'000'000;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_engine BM_Idle: %s\n", what.c_str());
  std::abort();
}

struct InferqIdle {
  explicit InferqIdle(int members) {
    inferq::ConsumerConfig cc{.stream = "IDLE", .name = "workers"};
    cc.members = static_cast<std::uint32_t>(members);
    members_ = e2e::AddWorkers(*engine_, {.name = "IDLE", .subjects = {"idle.>"}}, cc);
  }
  // Pulls until the engine closes.
  void Wait(int member) {
    for (;;) {
      absl::StatusOr<inferq::Message> m =
          members_[static_cast<std::size_t>(member)].Next(absl::Seconds(60));
      if (m.ok()) Die("an idle member received a message");
      if (m.status().code() == absl::StatusCode::kCancelled) return;
      if (m.status().code() != absl::StatusCode::kDeadlineExceeded) {
        Die(std::string(m.status().message()));
      }
    }
  }
  void Stop() { engine_->Close(); }

  std::unique_ptr<inferq::Engine> engine_ = inferq::Engine::Create({}).value();
  std::vector<inferq::Member> members_;
};

// The end-to-end peers, blocked in their Pull until Finish().
template <class Impl>
struct PeerIdle {
  explicit PeerIdle(int members) : impl_(members, 0, false) {}
  void Wait(int member) {
    while (impl_.Pull(member, [](const e2e::Payload&) { Die("an idle worker got an item"); })) {
    }
  }
  void Stop() { impl_.Finish(); }
  Impl impl_;
};

struct Usage {
  double cpu_s;
  long switches;
};

Usage Now() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return {static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
              static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
          ru.ru_nvcsw + ru.ru_nivcsw};
}

template <class Impl>
void BM_Idle(benchmark::State& state, int members) {
  double cpu_s = 0, wall_s = 0;
  long switches = 0;
  for (auto _ : state) {
    Impl impl(members);
    std::vector<std::thread> threads;
    for (int m = 0; m < members; ++m) {
      threads.emplace_back([&impl, m] {
        pthread_setname_np(pthread_self(), ("idle" + std::to_string(m)).c_str());
        impl.Wait(m);
      });
    }
    e2e::SleepUntilNs(e2e::NowNs() + kSettleNs);
    const Usage u0 = Now();
    const std::int64_t t0 = e2e::NowNs();
    e2e::SleepUntilNs(t0 + kMeasureNs);
    const Usage u1 = Now();
    const std::int64_t t1 = e2e::NowNs();
    impl.Stop();
    for (std::thread& t : threads) t.join();
    cpu_s += u1.cpu_s - u0.cpu_s;
    switches += u1.switches - u0.switches;
    const double wall = static_cast<double>(t1 - t0) / 1e9;
    wall_s += wall;
    state.SetIterationTime(wall);
  }
  state.counters["cpu_pct_one_core"] = wall_s > 0 ? 100.0 * cpu_s / wall_s : 0;
  state.counters["cpu_ms"] = cpu_s * 1e3;
  state.counters["context_switches_per_s"] = wall_s > 0 ? static_cast<double>(switches) / wall_s : 0;
}

template <class Impl>
void RegisterIdle(const std::string& impl, int members) {
  benchmark::RegisterBenchmark(("BM_Idle/" + impl + "/members:" + std::to_string(members)).c_str(),
                               [members](benchmark::State& s) { BM_Idle<Impl>(s, members); })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

const int kRegistered = [] {
  RegisterIdle<InferqIdle>("inferq", 16);
  RegisterIdle<PeerIdle<e2e::MutexDequeImpl>>("mutex_deque", 16);
  RegisterIdle<PeerIdle<e2e::TbbBoundedImpl>>("tbb_bounded", 16);
  return 0;
}();

}  // namespace idle

// ---------------------------------------------------------------------------------
// Tool calls (the agent_router example's path): a call checked against its tool's
// JSON Schema, run on a worker thread, its reply returned. inferq: StartCall on a
// registered function (admission = the schema check, two workers, least loaded);
// std_async: std::async(std::launch::async, check + tool) per call, the plain way;
// direct: the same work inline on the caller's thread (the work's own cost). N calls
// are kept in flight (inflight:N): started together, then all waited for.
namespace toolcall {

// ChaDri.change_drink of the BFCL data (examples/data), as BfclToJsonSchema gives it.
constexpr char kSchema[] =
    R"({"type":"object","required":["new_preferences"],"properties":{"drink_id":{"type":"string"},)"
    R"("new_preferences":{"type":"object","properties":{"size":{"type":"string","enum":["small",)"
    R"("medium","large"]},"temperature":{"type":"string","enum":["cold","warm","hot"]},)"
    R"("sweetness_level":{"type":"string","enum":["none","light","regular","extra"]},)"
    R"("milk_type":{"type":"string","enum":["regular","soy","almond","coconut"]},)"
    R"("special_instructions":{"type":"string"}}}}})";
constexpr char kArgs[] =
    R"({"drink_id":"latte","new_preferences":{"size":"large","milk_type":"coconut",)"
    R"("sweetness_level":"extra","temperature":"hot","special_instructions":"boiling hot"}})";
constexpr char kSubject[] = "agent.tool.ChaDri.change_drink";

const inferq::Predicate& Schema() {
  static const inferq::Predicate p = *inferq::Predicate::JsonSchema(kSchema);
  return p;
}

// The tool: a reply naming it and echoing the arguments.
inferq::Buffer Tool(const inferq::Event& call) {
  return inferq::Buffer::FromString(R"({"tool":"ChaDri.change_drink","ok":true,"arguments":)" +
                                    std::string(call.payload.view()) + "}");
}

inferq::Event Call() {
  inferq::Event e;
  e.subject = kSubject;
  e.payload = inferq::Buffer::FromString(kArgs);
  e.ttl = absl::Seconds(30);
  return e;
}

void Report(benchmark::State& state, std::vector<double>& latencies_us, std::int64_t calls) {
  state.SetItemsProcessed(calls);
  std::sort(latencies_us.begin(), latencies_us.end());
  if (latencies_us.empty()) return;
  state.counters["p50_us"] = latencies_us[latencies_us.size() / 2];
  state.counters["p99_us"] = latencies_us[latencies_us.size() * 99 / 100];
}

void BM_ToolCallInferq(benchmark::State& state) {
  const int inflight = static_cast<int>(state.range(0));
  auto engine = inferq::Engine::Create().value();
  inferq::FunctionOptions fo;
  fo.workers = 2;
  fo.subjects = {kSubject};
  fo.admit = [](const inferq::Event& e) { return Schema().Check(e); };
  if (!engine->RegisterFunction("ChaDri", [](const inferq::Event& e) -> absl::StatusOr<inferq::Buffer> {
        return Tool(e);
      }, fo).ok()) {
    state.SkipWithError("RegisterFunction failed");
    return;
  }
  std::vector<double> lat;
  std::int64_t calls = 0;
  std::vector<inferq::PendingCall> pending(static_cast<std::size_t>(inflight));
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& p : pending) p = engine->StartCall("ChaDri", Call());
    for (auto& p : pending) {
      absl::StatusOr<inferq::Buffer> r = p.reply.get();
      if (!r.ok()) state.SkipWithError("call failed");
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    calls += inflight;
  }
  Report(state, lat, calls);
}

void BM_ToolCallAsync(benchmark::State& state) {
  const int inflight = static_cast<int>(state.range(0));
  std::vector<double> lat;
  std::int64_t calls = 0;
  std::vector<std::future<absl::StatusOr<inferq::Buffer>>> pending(static_cast<std::size_t>(inflight));
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& p : pending) {
      p = std::async(std::launch::async, []() -> absl::StatusOr<inferq::Buffer> {
        const inferq::Event e = Call();
        if (absl::Status s = Schema().Check(e); !s.ok()) return s;
        return Tool(e);
      });
    }
    for (auto& p : pending) {
      absl::StatusOr<inferq::Buffer> r = p.get();
      if (!r.ok()) state.SkipWithError("call failed");
      lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    calls += inflight;
  }
  Report(state, lat, calls);
}

void BM_ToolCallDirect(benchmark::State& state) {
  std::vector<double> lat;
  std::int64_t calls = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const inferq::Event e = Call();
    if (!Schema().Check(e).ok()) state.SkipWithError("call failed");
    benchmark::DoNotOptimize(Tool(e));
    lat.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    ++calls;
  }
  Report(state, lat, calls);
}

BENCHMARK(BM_ToolCallInferq)->Name("BM_ToolCall/inferq")->ArgName("inflight")->Arg(1)->Arg(16)->UseRealTime();
BENCHMARK(BM_ToolCallAsync)->Name("BM_ToolCall/std_async")->ArgName("inflight")->Arg(1)->Arg(16)->UseRealTime();
BENCHMARK(BM_ToolCallDirect)->Name("BM_ToolCall/direct")->UseRealTime();

}  // namespace toolcall

// ---- Tracing: what the trace hooks cost ---------------------------------------------
//
//   BM_TracedCycle/<mode>  one thread publishes an event (64-byte payload), pulls it
//                          (Member::Next) and acks it, over and over: the whole
//                          publish -> deliver -> ack path without other threads, so
//                          that a few ns of difference show. The stream has interest
//                          retention: an acked event is removed, so pools recycle
//                          their blocks (steady state, no page faults).
//                          items_per_second = cycles/s.
// Modes (EngineOptions::trace):
//   off        no sink: the hooks are one branch each (publish, pull, settle);
//   ratio_0    a sink, sample_ratio 0: each publish still draws a trace-id and a
//              span id and decides, but makes no span;
//   ratio_0.01 a sink, 1 % sampled;
//   ratio_1    a sink, every event: 4 spans per cycle (publish, queue_wait, deliver,
//              ack). The sink only counts them (NullSink): the engine's cost alone,
//              not an exporter's.
namespace tracing {

class NullSink final : public inferq::TraceSink {
 public:
  void Export(inferq::Span&& span) noexcept override {
    benchmark::DoNotOptimize(span);
    spans.fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<std::uint64_t> spans{0};
};

void BM_TracedCycle(benchmark::State& state, bool traced, double ratio) {
  inferq::EngineOptions o;
  auto sink = std::make_shared<NullSink>();
  if (traced) o.trace = {.sink = sink, .sample_ratio = ratio, .id_seed = 1};
  auto engine = inferq::Engine::Create(std::move(o));
  if (!engine.ok()) e2e::Die(std::string(engine.status().message()));
  std::vector<inferq::Member> members =
      e2e::AddWorkers(**engine, {.name = "T", .subjects = {"t.>"}, .retention = inferq::RetentionPolicy::kInterest},
                      {.stream = "T", .name = "w"});
  inferq::Member& m = members[0];
  const inferq::Buffer payload = inferq::Buffer::FromString(std::string(64, 'x'));
  std::int64_t cycles = 0;
  for (auto _ : state) {
    inferq::Event e;
    e.subject = "t.work";
    e.payload = payload;
    if (!(*engine)->Publish(std::move(e)).ok()) e2e::Die("publish failed");
    absl::StatusOr<inferq::Message> got = m.Next(absl::ZeroDuration());
    if (!got.ok() || !got->Ack().ok()) e2e::Die("pull or ack failed");
    ++cycles;
  }
  state.SetItemsProcessed(cycles);
  state.counters["spans_per_cycle"] =
      cycles > 0 ? static_cast<double>(sink->spans.load()) / static_cast<double>(cycles) : 0;
}

BENCHMARK_CAPTURE(BM_TracedCycle, off, false, 0.0)->Name("BM_TracedCycle/off");
BENCHMARK_CAPTURE(BM_TracedCycle, ratio_0, true, 0.0)->Name("BM_TracedCycle/ratio_0");
BENCHMARK_CAPTURE(BM_TracedCycle, ratio_001, true, 0.01)->Name("BM_TracedCycle/ratio_0.01");
BENCHMARK_CAPTURE(BM_TracedCycle, ratio_1, true, 1.0)->Name("BM_TracedCycle/ratio_1");

}  // namespace tracing

// ---- Routing on many subjects: the per-thread route cache ----
// One thread publishes on `subjects` distinct reply subjects in turn
// ("infer.reply.<n>"), as a replica publishes the tokens of the sequences in its
// batch. The stream keeps the last 1,024 (limits retention, discard old), so the run
// is the publish path alone. route_hit_rate is the share routed from the thread's
// cache (EngineStats::route_cache_hits); the rest searched the shared subject index.
void BM_PublishSubjects(benchmark::State& state) {
  auto engine = inferq::Engine::Create();
  if (!engine.ok()) e2e::Die(std::string(engine.status().message()));
  if (!(*engine)->AddStream({.name = "R", .subjects = {"infer.reply.*"}, .max_msgs = 1024}).ok()) {
    e2e::Die("AddStream failed");
  }
  std::vector<std::string> subjects;
  for (std::int64_t i = 0; i < state.range(0); ++i) subjects.push_back("infer.reply." + std::to_string(100000 + i));
  const inferq::Buffer payload = inferq::Buffer::FromString(std::string(64, 'x'));
  std::size_t next = 0;
  for (auto _ : state) {
    inferq::Event e;
    e.subject = subjects[next];
    e.payload = payload;
    if (++next == subjects.size()) next = 0;
    if (!(*engine)->Publish(std::move(e)).ok()) e2e::Die("publish failed");
  }
  state.SetItemsProcessed(state.iterations());
  const inferq::EngineStats st = (*engine)->Stats();
  const double routed = static_cast<double>(st.route_cache_hits + st.route_cache_misses);
  state.counters["route_hit_rate"] = routed > 0 ? static_cast<double>(st.route_cache_hits) / routed : 0;
}
BENCHMARK(BM_PublishSubjects)->ArgName("subjects")->Arg(1)->Arg(8)->Arg(32)->Arg(256);

}  // namespace

BENCHMARK_MAIN();
