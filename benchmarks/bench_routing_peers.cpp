// Part of bench_routing: subject fan-out through the inferq Engine against ZeroMQ and
// NNG in-process pub/sub, in one binary and one run (see BENCHMARKS.md for the
// recorded figures). bench_routing.cpp's main calls RegisterPubSubBenchmarks().
//
// The same work for every implementation:
//   1 publisher thread, 4 subscriber threads; subscriber i takes subject `bench.s<i>`;
//   the publisher cycles bench.s0 .. bench.s3, bench.none, so 1 event in 5 goes to a
//   subject nobody subscribes to. 64-byte payload: per-subject sequence number (from
//   1), steady-clock send time, subject index. Every delivery is checked: the subject
//   (and the index in the payload) must be the subscriber's own, the sequence must
//   increase strictly (else dup_or_reordered). lost = expected - delivered.
//
//   BM_PubSub/<impl>/<config>         2,000,000 events as fast as the publisher can
//                                     go (1,600,000 to subscribers); items_per_second
//                                     = delivered / (first publish -> last delivery);
//                                     p50_us / p99_us = publish -> receive under load.
//   BM_PubSubLatency/<impl>/<config>  300,000 events paced at 100,000 events/s on an
//                                     absolute schedule (clock_nanosleep TIMER_ABSTIME
//                                     with a 1 ns timer slack, so 2 cores are not spent
//                                     spinning); p50_us / p99_us one-way publish ->
//                                     receive from the timestamp in the payload;
//                                     send_lag_p99_us = how late the publisher was on
//                                     its schedule (the latency figures do not include
//                                     it: they are measured from the actual send).
//
// Implementations:
//   inferq  Engine; consumers with filter_subject bench.s<i>, members = 1. Streams
//           capture bench.none too (one stream `bench.>`, or one stream per subject
//           including a BENCH_NONE stream), so the unsubscribed subject is stored and
//           dropped by retention, never a NotFound. Retention kInterest (ack none: a
//           message is done once queued; explicit: once acked) or kLimits with
//           max_msgs = 65,536 (far more than the 4 x 1,024 lane slots, so no queued
//           message is ever discarded). Pull: NextBatch(256, zero queue delay), i.e.
//           whatever is queued up to 256, or Next. Lanes of 1,024 slots (the
//           default; Config::lane_capacity, 65,536 measured no different).
//   zmq     libzmq PUB/SUB over inproc://, SNDHWM = RCVHWM = 0 (unlimited: no drops,
//           and no backpressure either: the publisher may run ahead). One frame:
//           subject, NUL, payload; subscriptions are "bench.s<i>\0" (prefix match).
//   nng     NNG pub0/sub0 over inproc://, pub SENDBUF and sub RECVBUF = 8192 (the
//           maximum). NNG pub/sub is best effort by design: when a subscriber
//           falls behind, a full queue drops messages; what it delivers is measured.
//           Same frame layout; NNG filters at the subscriber, so every subscriber
//           receives and discards the other 4 subjects.
//   floor   the least a pub/sub engine on inferq's rings must do (FloorImpl says
//           what it leaves out): inferq's event build, a route by string compare,
//           one record, a push on the subscriber's MpmcRing<_, BudgetedWait>.
//
// Counters (per run): delivered, lost, dup_or_reordered, wrong_subject, publish_errors;
// items_per_second (delivered); published_per_second (events / first publish -> last
// publish returned: a publisher without backpressure runs ahead of its subscribers);
// cpu_ns_per_event = process CPU (every thread, the libraries' own included) / events
// published; p50_us, p99_us, max_us (log-linear histogram, within 3.1 %).
//
// Allocators: libinferq links mimalloc as a shared library, which replaces malloc for
// the whole process, so libzmq and libnng allocate from mimalloc here too.
//
// Start: ZeroMQ and NNG subscriptions take effect asynchronously, so before timing the
// publisher sends warm-up events (sequence 0, ignored by the checks) every 1 ms until
// every subscriber has seen one; inferq runs the same handshake. End: a subscriber
// stops when it has every expected event, or when a receive times out (100 ms) after
// the publisher finished; the tail wait is not in the measured time.
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>
#include <zmq.h>

#include "absl/time/time.h"
#include "bench_util.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace pubsub_peers {

constexpr int kSubscribers = 4;
constexpr int kSubjects = kSubscribers + 1;  // + bench.none, which nobody takes
constexpr std::int64_t kThroughputEvents = 2'000'000;
constexpr std::int64_t kLatencyEvents = 300'000;
constexpr std::int64_t kLatencyPeriodNs = 10'000;  // 100,000 events/s
constexpr int kRecvTimeoutMs = 100;
constexpr std::int64_t kWarmupLimitNs = 10'000'000'000;  // a subscriber that never
                                                          // connects aborts the run

// Subject names; for ZeroMQ and NNG the frame starts with the name and a NUL, and the
// subscription includes the NUL, so that prefix matching is exact.
constexpr std::array<std::string_view, kSubjects> kSubjectNames = {
    "bench.s0", "bench.s1", "bench.s2", "bench.s3", "bench.none"};

// The 64-byte payload every implementation carries.
struct Payload {
  std::uint64_t seq = 0;      // per subject, from 1; 0 = warm-up
  std::int64_t send_ns = 0;   // CLOCK_MONOTONIC just before the publish call
  std::uint32_t subject = 0;  // index into kSubjectNames
  std::uint8_t fill[44] = {};
};
static_assert(sizeof(Payload) == 64);

using inferq_bench::NowNs;
using inferq_bench::ProcessCpuSeconds;
using inferq_bench::SleepUntilNs;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "bench_routing_peers: %s\n", what.c_str());
  std::abort();
}

// Frame for ZeroMQ and NNG: subject, NUL, payload. Returns its length.
std::size_t EncodeFrame(int subject, const Payload& p, char* out) {
  const std::string_view name = kSubjectNames[static_cast<std::size_t>(subject)];
  std::memcpy(out, name.data(), name.size());
  out[name.size()] = '\0';
  std::memcpy(out + name.size() + 1, &p, sizeof p);
  return name.size() + 1 + sizeof p;
}
constexpr std::size_t kMaxFrame = 16 + sizeof(Payload);

// Splits a frame into subject and payload bytes (an empty subject if malformed).
void DecodeFrame(const void* data, std::size_t len, std::string_view* subject,
                 std::span<const std::byte>* payload) {
  const char* c = static_cast<const char*>(data);
  const void* nul = std::memchr(c, '\0', len);
  if (nul == nullptr) {
    *subject = {};
    *payload = {};
    return;
  }
  const std::size_t n = static_cast<std::size_t>(static_cast<const char*>(nul) - c);
  *subject = {c, n};
  *payload = {reinterpret_cast<const std::byte*>(c + n + 1), len - n - 1};
}

// ---- implementations ---------------------------------------------------------------
//
// Each has: a Config; a constructor (streams / context / publisher socket); Publish(),
// called by the publisher thread only; and a Subscriber(impl, i), made on subscriber
// thread i, whose Receive(f, timeout_ms) waits up to timeout_ms, hands each event to
// f(subject, payload bytes) and returns how many it handed (0 = timed out).

struct InferqImpl {
  enum class Streams { kOne, kPerSubject };
  struct Config {
    Streams streams = Streams::kOne;
    inferq::RetentionPolicy retention = inferq::RetentionPolicy::kInterest;
    inferq::AckPolicy ack = inferq::AckPolicy::kNone;
    std::size_t pull_batch = 256;  // 1 = Member::Next
    std::size_t lane_capacity = 1024;  // the engine's default
  };
  static constexpr std::int64_t kLimitsMaxMsgs = 65'536;

  explicit InferqImpl(const Config& c) : config(c) {
    auto add_stream = [&](std::string name, std::string subject) {
      inferq::StreamConfig s{.name = std::move(name), .subjects = {std::move(subject)}};
      s.retention = c.retention;
      if (c.retention == inferq::RetentionPolicy::kLimits) s.max_msgs = kLimitsMaxMsgs;
      if (absl::Status st = engine->AddStream(s); !st.ok()) Die(std::string(st.message()));
    };
    if (c.streams == Streams::kOne) {
      add_stream("BENCH", "bench.>");
    } else {
      for (int s = 0; s < kSubjects; ++s) {
        add_stream("BENCH_" + std::to_string(s), std::string(kSubjectNames[s]));
      }
    }
    for (int i = 0; i < kSubscribers; ++i) {
      absl::StatusOr<inferq::Consumer> consumer = engine->AddConsumer(
          {.stream = c.streams == Streams::kOne ? "BENCH" : "BENCH_" + std::to_string(i),
           .name = "sub" + std::to_string(i),
           .filter_subject = std::string(kSubjectNames[i]),
           .members = 1,
           .lane_capacity = c.lane_capacity,
           .ack = c.ack});
      if (!consumer.ok()) Die(std::string(consumer.status().message()));
      consumers.push_back(*consumer);
    }
  }

  bool Publish(int subject, const Payload& p) {
    inferq::Event e;
    e.subject = kSubjectNames[static_cast<std::size_t>(subject)];
    e.payload = inferq::Buffer::Copy(std::as_bytes(std::span(&p, 1)));
    return engine->Publish(std::move(e)).ok();
  }

  class Subscriber {
   public:
    Subscriber(InferqImpl& impl, int i)
        : member_(*impl.consumers[static_cast<std::size_t>(i)].member(0)),
          ack_(impl.config.ack == inferq::AckPolicy::kExplicit),
          batch_(impl.config.pull_batch) {}

    template <class F>
    std::size_t Receive(F&& f, int timeout_ms) {
      if (batch_ <= 1) {
        absl::StatusOr<inferq::Message> m = member_.Next(absl::Milliseconds(timeout_ms));
        if (!m.ok()) return 0;  // DeadlineExceeded
        Deliver(*m, f);
        return 1;
      }
      absl::StatusOr<std::vector<inferq::Message>> batch =
          member_.NextBatch(batch_, absl::ZeroDuration(), absl::Milliseconds(timeout_ms));
      if (!batch.ok()) return 0;
      for (inferq::Message& m : *batch) Deliver(m, f);
      return batch->size();
    }

   private:
    template <class F>
    void Deliver(inferq::Message& m, F& f) {
      const inferq::Event& e = m.event();
      f(std::string_view(e.subject), e.payload.span());
      if (ack_) {
        if (absl::Status s = m.Ack(); !s.ok()) Die(std::string(s.message()));
      }
    }
    inferq::Member member_;
    bool ack_;
    std::size_t batch_;
  };

  Config config;
  std::unique_ptr<inferq::Engine> engine = inferq::Engine::Create().value();
  std::vector<inferq::Consumer> consumers;
};

// The floor of the fan-out path on this machine (issue 15, target 2): the least a
// pub/sub engine built on inferq's rings must do. The publisher builds the same event
// as InferqImpl (subject string, 64-byte Buffer), finds the subscriber by comparing
// the subject with the four subscribed ones, takes a sequence number from an atomic,
// allocates one record and pushes it (blocking, BudgetedWait) on that subscriber's
// MpmcRing of 1,024 slots; bench.none goes nowhere. A subscriber pops what is queued,
// up to 256. No stream, no limits, no retention, no predicates, no pending state:
// what a real engine adds costs on top.
// Waits without an active phase: a waiter sleeps at once, as ZeroMQ's do.
struct BlockWait : inferq::HybridWait {
  static constexpr int kMaxActive = 0;
};

template <class Wait>
struct FloorImpl {
  struct Config {};
  struct Record {
    std::string subject;
    inferq::Buffer payload;
    std::uint64_t seq = 0;
  };
  using Handle = std::shared_ptr<Record>;
  using Ring = inferq::MpmcRing<Handle, Wait>;

  explicit FloorImpl(const Config&) {
    for (int i = 0; i < kSubscribers; ++i) rings.push_back(std::make_unique<Ring>(1024));
  }

  bool Publish(int subject, const Payload& p) {
    std::string name(kSubjectNames[static_cast<std::size_t>(subject)]);
    inferq::Buffer payload = inferq::Buffer::Copy(std::as_bytes(std::span(&p, 1)));
    const std::uint64_t seq = next_seq.fetch_add(1, std::memory_order_relaxed);
    for (int i = 0; i < kSubscribers; ++i) {  // route
      if (name != kSubjectNames[static_cast<std::size_t>(i)]) continue;
      Handle r = std::make_shared<Record>();
      r->subject = std::move(name);
      r->payload = std::move(payload);
      r->seq = seq;
      return rings[static_cast<std::size_t>(i)]->push(std::move(r));
    }
    return true;  // bench.none: stored nowhere, as retention drops it
  }

  class Subscriber {
   public:
    Subscriber(FloorImpl& impl, int i) : ring_(*impl.rings[static_cast<std::size_t>(i)]) {}

    template <class F>
    std::size_t Receive(F&& f, int timeout_ms) {
      if (!ring_.pop_until(batch_[0], inferq_bench::NowNs() + timeout_ms * 1'000'000LL)) return 0;
      const std::size_t n = 1 + ring_.try_pop_bulk(std::span(batch_).subspan(1));
      for (std::size_t i = 0; i < n; ++i) {
        f(std::string_view(batch_[i]->subject), batch_[i]->payload.span());
        batch_[i].reset();
      }
      return n;
    }

   private:
    Ring& ring_;
    std::array<Handle, 256> batch_;
  };

  std::vector<std::unique_ptr<Ring>> rings;
  std::atomic<std::uint64_t> next_seq{1};
};

std::string UniqueInprocUrl(const char* lib) {
  static std::atomic<int> n{0};
  return std::string("inproc://bench-routing-peers-") + lib + "-" + std::to_string(n++);
}

struct ZmqImpl {
  struct Config {
    int hwm = 0;  // SNDHWM and RCVHWM; 0 = unlimited
  };

  explicit ZmqImpl(const Config& c) : config(c), url(UniqueInprocUrl("zmq")) {
    ctx = zmq_ctx_new();
    pub = zmq_socket(ctx, ZMQ_PUB);
    const int linger = 0;
    if (pub == nullptr || zmq_setsockopt(pub, ZMQ_SNDHWM, &c.hwm, sizeof c.hwm) != 0 ||
        zmq_setsockopt(pub, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_bind(pub, url.c_str()) != 0) {
      Die(std::string("zmq publisher: ") + zmq_strerror(zmq_errno()));
    }
  }
  ~ZmqImpl() {
    zmq_close(pub);
    zmq_ctx_term(ctx);  // every subscriber closed its socket before its thread ended
  }

  bool Publish(int subject, const Payload& p) {
    char frame[kMaxFrame];
    const std::size_t len = EncodeFrame(subject, p, frame);
    return zmq_send(pub, frame, len, 0) == static_cast<int>(len);
  }

  class Subscriber {
   public:
    Subscriber(ZmqImpl& impl, int i) : sock_(zmq_socket(impl.ctx, ZMQ_SUB)) {
      const int linger = 0;
      const int timeout = kRecvTimeoutMs;
      const std::string topic = std::string(kSubjectNames[static_cast<std::size_t>(i)]) + '\0';
      if (sock_ == nullptr ||
          zmq_setsockopt(sock_, ZMQ_RCVHWM, &impl.config.hwm, sizeof impl.config.hwm) != 0 ||
          zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
          zmq_setsockopt(sock_, ZMQ_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
          zmq_setsockopt(sock_, ZMQ_SUBSCRIBE, topic.data(), topic.size()) != 0 ||
          zmq_connect(sock_, impl.url.c_str()) != 0) {
        Die(std::string("zmq subscriber: ") + zmq_strerror(zmq_errno()));
      }
    }
    ~Subscriber() { zmq_close(sock_); }
    Subscriber(const Subscriber&) = delete;
    Subscriber& operator=(const Subscriber&) = delete;

    template <class F>
    std::size_t Receive(F&& f, int /*timeout_ms: set as ZMQ_RCVTIMEO*/) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, sock_, 0) < 0) {  // EAGAIN: timed out
        zmq_msg_close(&msg);
        return 0;
      }
      std::string_view subject;
      std::span<const std::byte> payload;
      DecodeFrame(zmq_msg_data(&msg), zmq_msg_size(&msg), &subject, &payload);
      f(subject, payload);
      zmq_msg_close(&msg);
      return 1;
    }

   private:
    void* sock_;
  };

  Config config;
  std::string url;
  void* ctx = nullptr;
  void* pub = nullptr;
};

struct NngImpl {
  struct Config {
    int buffer = 8192;  // pub NNG_OPT_SENDBUF and sub NNG_OPT_RECVBUF (max 8192)
  };

  static void Check(int rv, const char* what) {
    if (rv != 0) Die(std::string("nng ") + what + ": " + nng_strerror(rv));
  }

  explicit NngImpl(const Config& c) : config(c), url(UniqueInprocUrl("nng")) {
    Check(nng_pub0_open(&pub), "pub0_open");
    Check(nng_socket_set_int(pub, NNG_OPT_SENDBUF, c.buffer), "pub SENDBUF");
    Check(nng_listen(pub, url.c_str(), nullptr, 0), "listen");
  }
  ~NngImpl() { nng_close(pub); }

  bool Publish(int subject, const Payload& p) {
    char frame[kMaxFrame];
    const std::size_t len = EncodeFrame(subject, p, frame);
    nng_msg* msg = nullptr;
    if (nng_msg_alloc(&msg, len) != 0) return false;
    std::memcpy(nng_msg_body(msg), frame, len);
    if (nng_sendmsg(pub, msg, 0) != 0) {
      nng_msg_free(msg);
      return false;
    }
    return true;
  }

  class Subscriber {
   public:
    Subscriber(NngImpl& impl, int i) {
      const std::string topic = std::string(kSubjectNames[static_cast<std::size_t>(i)]) + '\0';
      Check(nng_sub0_open(&sock_), "sub0_open");
      Check(nng_socket_set_int(sock_, NNG_OPT_RECVBUF, impl.config.buffer), "sub RECVBUF");
      Check(nng_socket_set_ms(sock_, NNG_OPT_RECVTIMEO, kRecvTimeoutMs), "sub RECVTIMEO");
      Check(nng_socket_set(sock_, NNG_OPT_SUB_SUBSCRIBE, topic.data(), topic.size()),
            "subscribe");
      Check(nng_dial(sock_, impl.url.c_str(), nullptr, 0), "dial");
    }
    ~Subscriber() { nng_close(sock_); }
    Subscriber(const Subscriber&) = delete;
    Subscriber& operator=(const Subscriber&) = delete;

    template <class F>
    std::size_t Receive(F&& f, int /*timeout_ms: set as NNG_OPT_RECVTIMEO*/) {
      nng_msg* msg = nullptr;
      if (nng_recvmsg(sock_, &msg, 0) != 0) return 0;  // NNG_ETIMEDOUT
      std::string_view subject;
      std::span<const std::byte> payload;
      DecodeFrame(nng_msg_body(msg), nng_msg_len(msg), &subject, &payload);
      f(subject, payload);
      nng_msg_free(msg);
      return 1;
    }

   private:
    nng_socket sock_ = NNG_SOCKET_INITIALIZER;
  };

  Config config;
  std::string url;
  nng_socket pub = NNG_SOCKET_INITIALIZER;
};

// ---- the run, shared by every implementation ------------------------------------------

// What one subscriber saw. Touched by its own thread only.
struct Tally {
  std::uint64_t delivered = 0;         // new, in-order events of the right subject
  std::uint64_t dup_or_reordered = 0;  // sequence not above the last one
  std::uint64_t wrong_subject = 0;     // another subscriber's subject, or malformed
  std::uint64_t last_seq = 0;
  std::int64_t last_delivery_ns = 0;
  inferq::HistogramSnapshot latency_ns;  // single-threaded recorder

  void Check(int me, std::string_view subject, const Payload& p, std::int64_t now) {
    last_delivery_ns = now;
    if (subject != kSubjectNames[static_cast<std::size_t>(me)] ||
        p.subject != static_cast<std::uint32_t>(me)) {
      ++wrong_subject;
      return;
    }
    if (p.seq <= last_seq) {
      ++dup_or_reordered;
      return;
    }
    last_seq = p.seq;
    ++delivered;
    latency_ns.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, now - p.send_ns)));
  }
};

struct RunResult {
  std::uint64_t published = 0;
  std::uint64_t publish_errors = 0;
  std::uint64_t expected = 0;  // events for subscribers
  std::uint64_t delivered = 0;
  std::uint64_t dup_or_reordered = 0;
  std::uint64_t wrong_subject = 0;
  double wall_s = 0;     // first publish -> last delivery
  double publish_s = 0;  // first publish -> last publish returned
  double cpu_s = 0;      // process CPU (all threads, the libraries' own included)
  inferq::HistogramSnapshot latency_ns;
  inferq::HistogramSnapshot send_lag_ns;  // paced runs: actual send - scheduled time

  void Add(const RunResult& o) {
    published += o.published;
    publish_errors += o.publish_errors;
    expected += o.expected;
    delivered += o.delivered;
    dup_or_reordered += o.dup_or_reordered;
    wrong_subject += o.wrong_subject;
    wall_s += o.wall_s;
    publish_s += o.publish_s;
    cpu_s += o.cpu_s;
    latency_ns.Merge(o.latency_ns);
    send_lag_ns.Merge(o.send_lag_ns);
  }
};

// Publishes `events` (subjects in turn), as fast as possible when period_ns == 0, else
// one every period_ns on an absolute schedule, and collects what the subscribers saw.
template <class Impl>
RunResult RunPubSub(const typename Impl::Config& config, std::int64_t events,
                    std::int64_t period_ns) {
  Impl impl(config);
  // Event k goes to subject k % kSubjects, so subscriber i expects this many.
  auto expected_for = [events](int i) {
    return static_cast<std::uint64_t>((events - i + kSubjects - 1) / kSubjects);
  };
  std::array<Tally, kSubscribers> tallies;
  std::atomic<int> ready{0};
  std::atomic<bool> published_all{false};

  std::vector<std::thread> subscribers;
  for (int i = 0; i < kSubscribers; ++i) {
    subscribers.emplace_back([&, i] {
      pthread_setname_np(pthread_self(), ("subscriber" + std::to_string(i)).c_str());
      typename Impl::Subscriber sub(impl, i);
      Tally& t = tallies[static_cast<std::size_t>(i)];
      bool is_ready = false;
      auto on_event = [&](std::string_view subject, std::span<const std::byte> bytes) {
        const std::int64_t now = NowNs();
        Payload p;
        if (bytes.size() != sizeof p) {
          ++t.wrong_subject;
          return;
        }
        std::memcpy(&p, bytes.data(), sizeof p);
        if (p.seq == 0) {  // warm-up
          if (!is_ready) {
            is_ready = true;
            ready.fetch_add(1, std::memory_order_release);
          }
          return;
        }
        t.Check(i, subject, p, now);
      };
      for (;;) {
        const std::size_t n = sub.Receive(on_event, kRecvTimeoutMs);
        if (t.delivered >= expected_for(i)) break;
        if (n == 0 && published_all.load(std::memory_order_acquire)) break;
      }
    });
  }

  RunResult r;
  std::int64_t start_ns = 0;
  std::int64_t publish_end_ns = 0;
  double cpu0 = 0;
  std::thread publisher([&] {
    pthread_setname_np(pthread_self(), "publisher");  // names for perf --sort comm
    prctl(PR_SET_TIMERSLACK, 1UL);  // wake on time, not up to 50 µs late
    const std::int64_t warmup_start = NowNs();
    while (ready.load(std::memory_order_acquire) < kSubscribers) {
      for (int s = 0; s < kSubscribers; ++s) {
        Payload p;
        p.subject = static_cast<std::uint32_t>(s);
        impl.Publish(s, p);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (NowNs() - warmup_start > kWarmupLimitNs) Die("a subscriber never connected");
    }
    std::array<std::uint64_t, kSubjects> seq{};
    cpu0 = ProcessCpuSeconds();
    start_ns = NowNs();
    for (std::int64_t i = 0; i < events; ++i) {
      const int s = static_cast<int>(i % kSubjects);
      if (period_ns > 0) {
        const std::int64_t due = start_ns + i * period_ns;
        const std::int64_t now = SleepUntilNs(due);
        r.send_lag_ns.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, now - due)));
      }
      Payload p;
      p.seq = ++seq[static_cast<std::size_t>(s)];
      p.subject = static_cast<std::uint32_t>(s);
      p.send_ns = NowNs();
      if (!impl.Publish(s, p)) ++r.publish_errors;
    }
    publish_end_ns = NowNs();
    published_all.store(true, std::memory_order_release);
  });
  publisher.join();
  for (auto& t : subscribers) t.join();
  r.cpu_s = ProcessCpuSeconds() - cpu0;

  std::int64_t last_delivery_ns = publish_end_ns;
  for (const Tally& t : tallies) {
    r.delivered += t.delivered;
    r.dup_or_reordered += t.dup_or_reordered;
    r.wrong_subject += t.wrong_subject;
    r.latency_ns.Merge(t.latency_ns);
    if (t.delivered > 0) last_delivery_ns = std::max(last_delivery_ns, t.last_delivery_ns);
  }
  r.published = static_cast<std::uint64_t>(events);
  for (int i = 0; i < kSubscribers; ++i) r.expected += expected_for(i);
  r.wall_s = static_cast<double>(last_delivery_ns - start_ns) / 1e9;
  r.publish_s = static_cast<double>(publish_end_ns - start_ns) / 1e9;
  return r;
}

void Report(benchmark::State& state, const RunResult& total, bool paced) {
  const double runs = static_cast<double>(state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(total.delivered));  // per manual time
  state.counters["delivered"] = static_cast<double>(total.delivered) / runs;
  state.counters["lost"] = static_cast<double>(total.expected - std::min(total.expected, total.delivered)) / runs;
  state.counters["dup_or_reordered"] = static_cast<double>(total.dup_or_reordered) / runs;
  state.counters["wrong_subject"] = static_cast<double>(total.wrong_subject) / runs;
  state.counters["publish_errors"] = static_cast<double>(total.publish_errors) / runs;
  state.counters["published_per_second"] = static_cast<double>(total.published) / total.publish_s;
  state.counters["cpu_ns_per_event"] = total.cpu_s * 1e9 / static_cast<double>(total.published);
  state.counters["p50_us"] = static_cast<double>(total.latency_ns.Percentile(0.50)) / 1e3;
  state.counters["p99_us"] = static_cast<double>(total.latency_ns.Percentile(0.99)) / 1e3;
  state.counters["max_us"] = static_cast<double>(total.latency_ns.max()) / 1e3;
  if (paced) {
    state.counters["send_lag_p50_us"] = static_cast<double>(total.send_lag_ns.Percentile(0.50)) / 1e3;
    state.counters["send_lag_p99_us"] = static_cast<double>(total.send_lag_ns.Percentile(0.99)) / 1e3;
  }
}

template <class Impl>
void BM_PubSub(benchmark::State& state, const typename Impl::Config& config) {
  RunResult total;
  for (auto _ : state) {
    RunResult r = RunPubSub<Impl>(config, kThroughputEvents, 0);
    state.SetIterationTime(r.wall_s);
    total.Add(r);
  }
  Report(state, total, /*paced=*/false);
}

template <class Impl>
void BM_PubSubLatency(benchmark::State& state, const typename Impl::Config& config) {
  RunResult total;
  for (auto _ : state) {
    RunResult r = RunPubSub<Impl>(config, kLatencyEvents, kLatencyPeriodNs);
    state.SetIterationTime(r.wall_s);
    total.Add(r);
  }
  Report(state, total, /*paced=*/true);
}

template <class Impl>
void Register(const std::string& impl_and_config, const typename Impl::Config& config) {
  benchmark::RegisterBenchmark(("BM_PubSub/" + impl_and_config).c_str(),
                               [config](benchmark::State& s) { BM_PubSub<Impl>(s, config); })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark(("BM_PubSubLatency/" + impl_and_config).c_str(),
                               [config](benchmark::State& s) { BM_PubSubLatency<Impl>(s, config); })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

int RegisterPubSubBenchmarks() {
  using inferq::AckPolicy;
  using inferq::RetentionPolicy;
  using Streams = InferqImpl::Streams;
  Register<InferqImpl>("inferq/stream:one/ret:interest/ack:none/pull:batch",
                       {.streams = Streams::kOne});
  Register<InferqImpl>("inferq/stream:per_subject/ret:interest/ack:none/pull:batch",
                       {.streams = Streams::kPerSubject});
  Register<InferqImpl>("inferq/stream:one/ret:limits/ack:none/pull:batch",
                       {.streams = Streams::kOne, .retention = RetentionPolicy::kLimits});
  Register<InferqImpl>("inferq/stream:one/ret:interest/ack:none/pull:next",
                       {.streams = Streams::kOne, .pull_batch = 1});
  Register<InferqImpl>("inferq/stream:one/ret:interest/ack:explicit/pull:batch",
                       {.streams = Streams::kOne, .ack = AckPolicy::kExplicit});
  Register<ZmqImpl>("zmq/hwm:unlimited", {.hwm = 0});
  Register<NngImpl>("nng/buf:8192", {.buffer = 8192});
  Register<FloorImpl<inferq::BudgetedWait>>("floor/wait:budgeted", {});
  Register<FloorImpl<inferq::HybridWait>>("floor/wait:hybrid", {});
  Register<FloorImpl<BlockWait>>("floor/wait:block", {});
  return 0;
}


}  // namespace pubsub_peers

