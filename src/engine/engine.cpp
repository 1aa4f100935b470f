#include "inferq/engine/engine.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <new>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <tuple>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "handle_queue.hpp"
#include "lane_queue.hpp"
#include "route_index.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/memory/fixed_pool.hpp"
#include "inferq/memory/numa_arena.hpp"
#include "inferq/memory/topology.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/routing/subject_index.hpp"
#include "inferq/sched/duplicate_window.hpp"
#include "inferq/sched/timer_wheel.hpp"

namespace inferq {
namespace engine_internal {

// The pools of one NUMA node for the engine's shared blocks (the Event every
// delivery shares, and one record per stream), by size class.
struct NodePools {
  explicit NodePools(NumaArena* arena)
      : small(128, {.blocks_per_chunk = 1024, .arena = arena}),
        medium(512, {.blocks_per_chunk = 512, .arena = arena}),
        large(2048, {.blocks_per_chunk = 128, .arena = arena}) {}
  FixedPool* For(std::size_t bytes) {
    if (bytes <= small.block_size()) return &small;
    if (bytes <= medium.block_size()) return &medium;
    if (bytes <= large.block_size()) return &large;
    return nullptr;
  }
  FixedPool small, medium, large;
};

// Allocator for std::allocate_shared: the control block and object come from the
// node's pools (operator new above 2 KiB). A copy lives in the control block, so a
// block returns to the pool of the node it came from, whichever thread frees it.
template <class T>
struct PoolAllocator {
  using value_type = T;
  NodePools* pools;
  explicit PoolAllocator(NodePools* p) : pools(p) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& o) : pools(o.pools) {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    FixedPool* pool = pools->For(n * sizeof(T));
    return static_cast<T*>(pool != nullptr ? pool->Allocate() : ::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    FixedPool* pool = pools->For(n * sizeof(T));
    if (pool != nullptr) {
      pool->Deallocate(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const PoolAllocator<U>& o) const { return pools == o.pools; }
};

// Lifecycle of a stored message in its stream.
enum MsgState : std::uint8_t {
  kLive = 0,       // kept by the stream
  kDiscarded = 1,  // removed by a limit or max_age: queued deliveries are skipped
  kDone = 2,       // interest retention: every interested consumer acked it
};

struct StoredMessage {
  std::shared_ptr<const Event> event;
  // The event with its payload converted to codec c (ConsumerConfig::accept_codecs),
  // for the consumers that do not accept event->codec; null where no consumer needs
  // c. Made once per publish and target codec, shared by every stream and consumer.
  std::array<std::shared_ptr<const Event>, kPayloadCodecs> converted{};
  StreamState* stream = nullptr;
  std::uint64_t seq = 0;
  std::int64_t publish_ns = 0;
  std::uint64_t bytes = 0;
  // Interest retention: explicit-ack deliveries not yet acked.
  std::atomic<std::uint32_t> pending_acks{0};
  std::atomic<std::uint8_t> state{kLive};
};

using Handle = std::shared_ptr<StoredMessage>;

// One queued delivery: the shared message plus what is particular to this copy.
struct Delivery {
  Handle h;
  std::uint32_t attempt = 1;  // 1 = first delivery to this consumer
  bool shadow = false;        // a mirrored copy (WeightedShadowPolicy)
};

struct Lane {
  Lane(std::size_t capacity, int node_index) : ring(capacity), node(node_index) {}
  Lane(std::unique_ptr<QosScheduler<Delivery>> qos, LaneQueue<Delivery>::OnEvict on_evict,
       int node_index)
      : ring(std::move(qos), [](const Delivery& d) { return QosKey::Of(*d.h->event); },
             std::move(on_evict)),
        node(node_index) {}
  // A lock-free ring, or a QoS scheduler (ConsumerConfig::qos); named for the former.
  LaneQueue<Delivery> ring;
  int node;  // index into the engine's topology nodes; -1 = the publisher's node
  alignas(kCacheLineSize) std::atomic<std::uint64_t> delivered{0};
  std::atomic<std::int64_t> last_pop_ns{0};  // engine clock; for stall detection
  // Recent publish -> deliver delay, ns: EWMA with alpha 1/8, written by pullers
  // (a lost update between two pullers only loses one sample); flow control reads it.
  std::atomic<std::int64_t> delay_ewma_ns{0};
  Histogram deliver_latency_ns;  // written by this lane's puller(s) only
};

// Deadline `ns` from `now`, saturating at INT64_MAX.
inline std::int64_t SatAdd(std::int64_t now, std::int64_t ns) {
  return ns > INT64_MAX - now ? INT64_MAX : now + ns;
}

// A message of a tracked consumer (ack_wait > 0) not yet acked: either out with
// `member` (delivery `attempt`), or queued again for delivery `attempt` (member ==
// kNoMember) after an expiry or a nak.
struct Pending {
  Handle h;
  std::uint32_t member = 0;
  std::uint32_t attempt = 1;
  std::int64_t deadline_ns = 0;
};

// A timer of a consumer: an ack_wait expiry of delivery `attempt` of message `seq`
// (tracked consumers), or a delayed redelivery (Nak with a delay) of `d`.
struct Timer {
  std::int64_t due_ns = 0;
  std::uint64_t seq = 0;
  std::uint32_t attempt = 0;
  std::optional<Delivery> redeliver;  // set: a delayed redelivery
};
struct TimerLater {
  bool operator()(const Timer& a, const Timer& b) const { return a.due_ns > b.due_ns; }
};

struct ConsumerState {
  ConsumerConfig config;
  // ConsumerConfig::accept_codecs: bit c set = accepts PayloadCodec c (all bits for
  // an empty list), and the codec an event in another codec is converted to.
  std::uint32_t accept_mask = ~std::uint32_t{0};
  PayloadCodec convert_to = PayloadCodec::kNone;
  bool Accepts(PayloadCodec c) const {
    return (accept_mask >> static_cast<unsigned>(c) & 1u) != 0;
  }
  std::optional<SubjectPattern> filter;  // nullopt: every event of the stream
  StreamState* stream = nullptr;
  const Clock* clock = nullptr;
  std::vector<std::unique_ptr<Lane>> lanes;
  // MemberGroup::Select runs one call at a time: select_mu. Publish takes it inside
  // the stream's mutex; redelivery takes it alone, never the stream's mutex, because
  // a publisher blocked on a full lane holds that one (and the member that would
  // drain the lane may be the one redelivering).
  std::mutex select_mu;
  std::shared_ptr<SelectionPolicy> policy;
  std::unique_ptr<MemberGroup> group;
  bool tracked = false;                     // explicit acks with ack_wait or backoff
  std::int64_t ack_wait_ns = 0;
  std::vector<std::int64_t> backoff_ns;     // empty: ack_wait_ns for every delivery
  std::int64_t max_deliver = -1;
  std::int64_t max_ack_pending = -1;
  // Publishes a dead letter without waiting (set by the Engine).
  std::function<absl::Status(Event)> publish_dead_letter;
  // Asks the timer thread to run by `due_ns` (engine clock); set by the Engine.
  std::function<void(std::int64_t)> wake_timer;
  // Publishes deferred dead letters (Engine::FlushOutbox) when *outbox_pending.
  std::function<void()> flush_outbox;
  const std::atomic<bool>* outbox_pending = nullptr;
  // Told of every message this consumer gives up, before its dead letter goes out
  // (Engine::Call completes the caller's future); may be empty.
  std::function<void(const Event&, std::uint32_t attempt, std::string_view reason)> on_dead_letter;

  // The ack wait of delivery `attempt` (1-based): ack_wait, or the backoff list.
  std::int64_t AckWaitFor(std::uint32_t attempt) const {
    if (backoff_ns.empty()) return ack_wait_ns;
    return backoff_ns[std::min<std::size_t>(attempt, backoff_ns.size()) - 1];
  }
  // True when a failure of delivery `attempt` ends the message (max_deliver).
  bool LastAttempt(std::uint32_t attempt) const {
    return max_deliver > 0 && static_cast<std::int64_t>(attempt) >= max_deliver;
  }

  // Deliveries awaiting an ack (tracked consumers), keyed by stream sequence, and
  // timers (ack_wait deadlines and delayed redeliveries) in a min-heap by due time;
  // timers whose delivery was settled or restarted are skipped when they come due.
  std::mutex pending_mu;
  absl::flat_hash_map<std::uint64_t, Pending> pending;       // guarded by pending_mu
  std::vector<Timer> timers;                                 // heap; pending_mu
  std::deque<Delivery> parked;  // redeliveries every lane refused (full); pending_mu
  std::atomic<bool> has_parked{false};  // parked is not empty (read without the lock)
  std::atomic<bool> has_timers{false};  // timers is not empty (read without the lock)

  void AddTimer(Timer t) {  // requires pending_mu
    timers.push_back(std::move(t));
    std::push_heap(timers.begin(), timers.end(), TimerLater{});
    has_timers.store(true, std::memory_order_relaxed);
    // Settled deliveries and restarted timers leave entries behind until they come
    // due (with a long ack_wait, much later): drop them once they outnumber the
    // live ones, so the heap stays within a constant factor of `pending`
    // (amortized O(1) per timer).
    if (tracked && timers.size() > 4 * (pending.size() + 256)) {
      std::erase_if(timers, [&](const Timer& x) { return !Live(x); });
      std::make_heap(timers.begin(), timers.end(), TimerLater{});
    }
  }
  // Whether timer `t` still stands for something (requires pending_mu).
  bool Live(const Timer& t) const {
    if (t.redeliver && !tracked) return true;  // untracked delayed naks have no entry
    auto it = pending.find(t.seq);
    if (it == pending.end() || it->second.attempt != t.attempt) return false;
    return t.redeliver ? it->second.member == kNoMember : it->second.deadline_ns == t.due_ns;
  }

  // Queue timeouts (ConsumerConfig::queue_timeout, Event::ttl / deadline) of first
  // deliveries still in a lane, by stream sequence; the wheel fires them when they
  // pass. A popped delivery cancels its timer. Guarded by pending_mu.
  enum WaitState : std::uint8_t { kQueued, kExpired, kDelayed, kRequeued };
  struct Waiting {
    Handle h;
    std::int64_t expiry_ns = 0;
    TimerId timer{};
    WaitState state = kQueued;
  };
  std::int64_t queue_timeout_ns = 0;
  bool enforce_event_ttl = true;  // false for Engine::Call's functions (their own timer)
  absl::flat_hash_map<std::uint64_t, Waiting> waiting;
  std::unique_ptr<TimerWheel<std::uint64_t>> wheel;
  std::atomic<bool> has_waiting{false};

  // The queue expiry (engine ns) of an event published at `publish_ns` whose own
  // limit is `event_limit_ns` (ttl / deadline; INT64_MAX = none); INT64_MAX = none.
  std::int64_t ExpiryFor(std::int64_t publish_ns, std::int64_t event_limit_ns) const {
    std::int64_t limit = queue_timeout_ns > 0 ? queue_timeout_ns : INT64_MAX;
    if (enforce_event_ttl) limit = std::min(limit, event_limit_ns);
    return limit == INT64_MAX ? INT64_MAX : SatAdd(publish_ns, limit);
  }

  // max_ack_pending: pullers wait on slot_cv while `unsettled` is at the limit.
  std::mutex slot_mu;
  std::condition_variable slot_cv;
  std::atomic<bool> closing{false};

  alignas(kCacheLineSize) std::atomic<std::uint64_t> acked{0};
  std::atomic<std::uint64_t> skipped{0};
  std::atomic<std::uint64_t> redelivered{0}, ack_timeouts{0}, naks{0}, moved{0},
      late_acks{0}, mirrored{0}, shadow_acked{0}, terminated{0}, dead_letters{0},
      dead_letters_lost{0}, dropped{0}, overflow_rejected{0}, parked_total{0}, expired{0},
      delayed{0}, evicted{0};
  // Member::NextBatch(timeout): one batcher per member (ConsumerConfig::batch).
  std::vector<std::unique_ptr<Batcher>> batchers;
  // Explicit-ack deliveries handed out and not yet settled (ack, nak, expiry).
  std::atomic<std::int64_t> unsettled{0};
  Histogram ack_latency_ns;

  // Messages handed out by this consumer's members and not yet destroyed; kept in
  // debug builds only (~Engine checks that none outlives the engine).
  std::atomic<std::int64_t> live_messages{0};

  enum class Slot { kTaken, kTimeout, kClosed };
  // Takes one max_ack_pending slot, waiting until `deadline_ns` (steady) for one.
  // kClosed once the engine is closing and no slot is free (Close: a closed engine
  // hands out no more than the limit, and does not wait for acks).
  Slot ReserveSlot(std::int64_t deadline_ns) {
    std::int64_t cur = unsettled.load(std::memory_order_relaxed);
    for (;;) {
      while (cur < max_ack_pending) {
        if (unsettled.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel)) {
          return Slot::kTaken;
        }
      }
      std::unique_lock lock(slot_mu);
      cur = unsettled.load(std::memory_order_acquire);
      if (cur < max_ack_pending) continue;
      if (closing.load(std::memory_order_acquire)) return Slot::kClosed;
      if (deadline_ns <= SteadyClock::Now()) return Slot::kTimeout;
      if (deadline_ns == kNoDeadline) {
        slot_cv.wait(lock);
      } else {
        slot_cv.wait_for(lock, std::chrono::nanoseconds(deadline_ns - SteadyClock::Now()));
      }
      cur = unsettled.load(std::memory_order_acquire);
    }
  }
  // A delivery was settled (or a reserved slot not used).
  void Unsettle() {
    unsettled.fetch_sub(1, std::memory_order_acq_rel);
    if (max_ack_pending > 0) {
      std::lock_guard lock(slot_mu);  // no lost wake-up between check and wait
      slot_cv.notify_all();
    }
  }
};

struct StreamState {
  StreamConfig config;
  std::vector<SubjectPattern> patterns;
  const Clock* clock = nullptr;

  std::mutex mu;
  HandleQueue<Handle> messages;             // guarded by mu; ascending seq
  std::uint64_t next_seq = 1;               // guarded by mu
  std::vector<ConsumerState*> consumers;    // guarded by mu
  // Consumers with a non-empty accept_codecs (Publish's conversion pre-pass runs only
  // for streams that have one). Written under mu; relaxed reads outside it.
  std::atomic<std::uint32_t> codec_restricted{0};

  // Read by Stats() without mu; written under mu or by acks.
  std::atomic<std::int64_t> live_msgs{0};
  std::atomic<std::int64_t> live_bytes{0};
  std::atomic<std::uint64_t> last_seq{0};
  std::atomic<std::uint64_t> stored{0};
  std::atomic<std::uint64_t> discarded{0};
  std::atomic<std::uint64_t> rejected{0};
  std::atomic<std::uint64_t> acked_out{0};
  std::atomic<std::uint64_t> duplicates{0};
  std::atomic<std::uint64_t> dedup_evicted{0};  // DuplicateWindow::evicted(), copied under mu
  std::unique_ptr<DuplicateWindow> dedup;   // guarded by mu; nullptr = off
  // Publishes waiting in a blocking push on a full lane while they hold mu. TryPublish
  // reads it to refuse instead of waiting for mu (it never waits for a lane).
  std::atomic<std::uint32_t> blocked_publishers{0};

  // Locks mu for a publish that must not wait: spins (yielding) while a publisher
  // holds mu for its short critical section; false, with mu not held, when the
  // holder is blocked on a full lane.
  bool LockUnlessBlocked(std::unique_lock<std::mutex>& lock) {
    while (!lock.try_lock()) {
      // acquire: pairs with the increment the blocked publisher makes before waiting.
      if (blocked_publishers.load(std::memory_order_acquire) > 0) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Moves a live message to `to` (kDiscarded or kDone) exactly once; the winner
  // takes it out of the live counts.
  bool Retire(StoredMessage& m, MsgState to) {
    std::uint8_t expected = kLive;
    if (!m.state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) return false;
    live_msgs.fetch_sub(1, std::memory_order_relaxed);
    live_bytes.fetch_sub(static_cast<std::int64_t>(m.bytes), std::memory_order_relaxed);
    (to == kDiscarded ? discarded : acked_out).fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  bool Expired(const StoredMessage& m, std::int64_t now_ns) const {
    return config.max_age > absl::ZeroDuration() &&
           now_ns - m.publish_ns > absl::ToInt64Nanoseconds(config.max_age);
  }

  // Drops retired messages and enforces max_age at the front. Requires mu.
  void TrimFront(std::int64_t now_ns) {
    while (!messages.empty()) {
      StoredMessage& m = *messages.front();
      if (m.state.load(std::memory_order_acquire) == kLive) {
        if (!Expired(m, now_ns)) break;
        Retire(m, kDiscarded);
      }
      messages.pop_front();
    }
  }

  // Interest retention retires messages out of order (acks), and TrimFront only
  // drops them from the front: one old unacked message would pin every later,
  // already acked one. When retired entries outnumber live ones, drop them all:
  // amortized O(1) per publish, and memory stays within twice the live messages.
  // Requires mu.
  void CompactIfSparse() {
    const auto live = static_cast<std::size_t>(
        std::max<std::int64_t>(0, live_msgs.load(std::memory_order_relaxed)));
    if (messages.size() < 64 || messages.size() <= 2 * live) return;
    messages.erase_if([](const Handle& h) {
      return h->state.load(std::memory_order_acquire) != kLive;
    });
  }

  // Discard-old: removes the oldest live messages until `bytes_needed` more bytes and
  // one more message fit. Requires mu.
  void MakeRoom(std::uint64_t bytes_needed) {
    auto over = [&] {
      const std::int64_t n = live_msgs.load(std::memory_order_relaxed);
      const std::int64_t b = live_bytes.load(std::memory_order_relaxed);
      return (config.max_msgs > 0 && n + 1 > config.max_msgs) ||
             (config.max_bytes > 0 &&
              b + static_cast<std::int64_t>(bytes_needed) > config.max_bytes);
    };
    while (over() && !messages.empty()) {
      Retire(*messages.front(), kDiscarded);
      messages.pop_front();
    }
  }
};

// Queues `d` again for consumer `c` on a member chosen by its policy, not on
// `exclude` when another lane takes it. Never blocks: a full lane is skipped and,
// when every lane is full, the delivery is parked until the next timer run.
void Redeliver(ConsumerState& c, Delivery d, std::uint32_t exclude) {
  if (d.h->state.load(std::memory_order_acquire) == kDiscarded) {
    c.skipped.fetch_add(1, std::memory_order_relaxed);
    if (c.tracked && !d.shadow) {  // its pending entry (and the event it holds) goes too
      std::lock_guard lock(c.pending_mu);
      if (auto it = c.pending.find(d.h->seq);
          it != c.pending.end() && it->second.attempt == d.attempt && it->second.member == kNoMember) {
        c.pending.erase(it);
      }
    }
    return;
  }
  const auto n = static_cast<std::uint32_t>(c.lanes.size());
  std::uint32_t target;
  {
    std::lock_guard lock(c.select_mu);
    target = c.group->Select(*c.policy, *d.h->event).member;
  }
  // Preference: the policy's pick or the next members after it that are neither
  // `exclude` nor ejected; then `exclude` if it is not ejected; then any lane.
  std::vector<bool> ejected(n);
  for (std::uint32_t m = 0; m < n; ++m) ejected[m] = c.group->Health(m) == MemberHealth::kEjected;
  for (int pass = 0; pass < 3; ++pass) {
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t m = (target + k) % n;
      const bool ok = pass == 0 ? (m != exclude && !ejected[m]) : pass == 1 ? !ejected[m] : true;
      if (!ok) continue;
      c.group->OnQueued(m);
      const bool redelivery = d.attempt > 1;  // else a first delivery that was parked
      if (c.lanes[m]->ring.try_push(std::move(d))) {
        if (redelivery) c.redelivered.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      c.group->OnDone(m, Outcome::kDropped, 0);
    }
  }
  if (c.lanes.front()->ring.closed()) return;  // the engine is closing: nobody will pull
  std::lock_guard lock(c.pending_mu);
  c.parked.push_back(std::move(d));
  c.parked_total.fetch_add(1, std::memory_order_relaxed);
  c.has_parked.store(true, std::memory_order_release);
}

// Moves `d` off stalled member `from` to another member that is not ejected and has
// room (the policy's pick first). False, with `d` untouched, when none has.
bool TryMove(ConsumerState& c, Delivery& d, std::uint32_t from) {
  const auto n = static_cast<std::uint32_t>(c.lanes.size());
  std::uint32_t target;
  {
    std::lock_guard lock(c.select_mu);
    target = c.group->Select(*c.policy, *d.h->event).member;
  }
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t m = (target + k) % n;
    if (m == from || c.group->Health(m) == MemberHealth::kEjected) continue;
    c.group->OnQueued(m);
    if (c.lanes[m]->ring.try_push(std::move(d))) return true;
    c.group->OnDone(m, Outcome::kDropped, 0);
  }
  return false;
}

// Retries parked redeliveries: by the timer, and by a member right after a pull has
// made room (a consumer without ack_wait has no timer).
void RetryParked(ConsumerState& c) {
  if (!c.has_parked.load(std::memory_order_acquire)) return;  // (a std::deque allocates)
  std::deque<Delivery> parked;
  {
    std::lock_guard lock(c.pending_mu);
    parked.swap(c.parked);
    c.has_parked.store(false, std::memory_order_release);
  }
  for (Delivery& d : parked) Redeliver(c, std::move(d), kNoMember);
}

// Message `h` is done for consumer `c` without an ack (dead-lettered, or dropped by
// drop-oldest): under interest retention the stream stops waiting for this consumer.
void SettleWithoutAck(ConsumerState& c, StoredMessage& h) {
  StreamState* stream = h.stream;
  if (c.config.ack == AckPolicy::kExplicit &&
      stream->config.retention == RetentionPolicy::kInterest &&
      h.pending_acks.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    stream->Retire(h, kDone);
  }
}

// Gives message `h` up after delivery `attempt`: a copy goes to the consumer's
// dead-letter subject with the reason headers (kDeadLetterReasonHeader, ...).
void DeadLetter(ConsumerState& c, const Handle& h, std::uint32_t attempt,
                std::string_view reason, std::string_view description) {
  c.dead_letters.fetch_add(1, std::memory_order_relaxed);
  SettleWithoutAck(c, *h);
  if (c.on_dead_letter) c.on_dead_letter(*h->event, attempt, reason);
  if (c.config.dead_letter_subject.empty() || !c.publish_dead_letter) {
    c.dead_letters_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event e = *h->event;  // shares the payload Buffer
  e.headers.Set(std::string(kOriginalSubjectHeader), std::move(e.subject));
  e.subject = c.config.dead_letter_subject;
  e.headers.Set(std::string(kDeadLetterReasonHeader), std::string(reason));
  if (!description.empty()) {
    e.headers.Set(std::string(kDeadLetterDescriptionHeader), std::string(description));
  }
  e.headers.Set(std::string(kDeliveryCountHeader), std::to_string(attempt));
  e.headers.Set(std::string(kStreamHeader), c.config.stream);
  e.headers.Set(std::string(kConsumerHeader), c.config.name);
  e.headers.Set(std::string(kStreamSeqHeader), std::to_string(h->seq));
  // A dead letter is a new message: the original's expiry no longer applies (it
  // would expire again in the dead-letter consumer's lane); it is kept as information.
  if (e.ttl > absl::ZeroDuration()) {
    e.headers.Set(std::string(kOriginalTtlHeader), std::to_string(absl::ToInt64Nanoseconds(e.ttl)));
    e.ttl = absl::ZeroDuration();
  }
  if (e.deadline != absl::InfiniteFuture()) {
    e.headers.Set(std::string(kOriginalDeadlineHeader),
                  absl::FormatTime(absl::RFC3339_full, e.deadline, absl::UTCTimeZone()));
    e.deadline = absl::InfiniteFuture();
  }
  e.attempt = attempt;
  if (!c.publish_dead_letter(std::move(e)).ok()) {
    c.dead_letters_lost.fetch_add(1, std::memory_order_relaxed);
  }
}

// A delivery queued on lane `m` was dropped to make room (OverflowPolicy::kDropOldest).
void DropQueued(ConsumerState& c, std::uint32_t m, Delivery& d, bool evicted = false) {
  c.group->OnDone(m, Outcome::kDropped, 0);
  (evicted ? c.evicted : c.dropped).fetch_add(1, std::memory_order_relaxed);
  if (d.shadow) return;
  if (d.attempt == 1 && c.has_waiting.load(std::memory_order_acquire)) {
    std::lock_guard lock(c.pending_mu);
    if (auto it = c.waiting.find(d.h->seq); it != c.waiting.end()) {
      const bool dead_lettered = it->second.state == ConsumerState::kExpired;
      c.wheel->Cancel(it->second.timer);
      c.waiting.erase(it);
      if (dead_lettered) return;  // already settled when it expired
    }
  }
  if (c.tracked && d.attempt > 1) {
    std::lock_guard lock(c.pending_mu);
    auto it = c.pending.find(d.h->seq);
    if (it == c.pending.end() || it->second.attempt != d.attempt) return;  // settled already
    c.pending.erase(it);
  }
  SettleWithoutAck(c, *d.h);
}

// A registered function (Engine::RegisterFunction): calls wait in `backlog` (ids, in
// arrival order) until its queue takes them (Engine::Call never waits); one thread at
// a time flushes it (Engine::FlushCalls).
struct FunctionState {
  std::string id;
  std::mutex mu;
  std::deque<std::uint64_t> backlog;  // guarded by mu
  std::atomic<bool> has_backlog{false};
  std::atomic<bool> flushing{false};  // a thread is in FlushCallsOnce
  std::atomic<std::uint64_t> flush_requests{0};
};

}  // namespace engine_internal

using engine_internal::ConsumerState;
using engine_internal::Handle;
using engine_internal::Lane;
using engine_internal::StoredMessage;
using engine_internal::StreamState;

// ---------------------------------------------------------------------------------
// Message

Message::Message() noexcept = default;
Message::Message(Message&& o) noexcept
    : msg_(std::move(o.msg_)),
      consumer_(o.consumer_),
      deliver_ns_(o.deliver_ns_),
      member_(o.member_),
      attempt_(o.attempt_),
      shadow_(o.shadow_),
      acked_(o.acked_.load(std::memory_order_relaxed)) {}
Message& Message::operator=(Message&& o) noexcept {
  if (this == &o) return *this;
  Release();
  msg_ = std::move(o.msg_);
  consumer_ = o.consumer_;
  deliver_ns_ = o.deliver_ns_;
  member_ = o.member_;
  attempt_ = o.attempt_;
  shadow_ = o.shadow_;
  acked_.store(o.acked_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return *this;
}
Message::~Message() { Release(); }

void Message::Release() noexcept {
  if (msg_ == nullptr) return;
#ifndef NDEBUG
  consumer_->live_messages.fetch_sub(1, std::memory_order_relaxed);
#endif
  msg_.reset();
}

const Event& Message::event() const {
  const Event& e = *msg_->event;
  if (consumer_ == nullptr || consumer_->Accepts(e.codec)) return e;
  // Converted at publish; null only for an empty payload (never converted).
  const std::shared_ptr<const Event>& converted =
      msg_->converted[static_cast<std::size_t>(consumer_->convert_to)];
  return converted != nullptr ? *converted : e;
}
std::uint64_t Message::stream_seq() const { return msg_ ? msg_->seq : 0; }
std::int64_t Message::publish_time_ns() const { return msg_ ? msg_->publish_ns : 0; }

absl::Status Message::Ack() { return Settle(Settlement::kAck, 0, {}); }

absl::Status Message::Nak(absl::Duration delay) {
  if (delay < absl::ZeroDuration() || delay > kMaxDuration) {
    return absl::InvalidArgumentError("Nak delay " + absl::FormatDuration(delay) +
                                      " is invalid (zero for at once, or up to 365 days)");
  }
  return Settle(Settlement::kNak, absl::ToInt64Nanoseconds(delay), {});
}

absl::Status Message::Term(std::string_view description) {
  return Settle(Settlement::kTerm, 0, description);
}

absl::Status Message::InProgress() {
  if (msg_ == nullptr) return absl::FailedPreconditionError("cannot mark an empty Message in progress");
  ConsumerState& c = *consumer_;
  if (c.config.ack == AckPolicy::kNone) {
    return absl::FailedPreconditionError("consumer '" + c.config.name + "' of stream '" +
                                         c.config.stream + "' has ack policy none");
  }
  if (acked_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) + " of stream '" +
                                         c.config.stream + "' was already settled by consumer '" +
                                         c.config.name + "'");
  }
  if (!c.tracked || shadow_) return absl::OkStatus();
  const std::int64_t deadline =
      engine_internal::SatAdd(c.clock->NowNanos(), c.AckWaitFor(attempt_));
  std::lock_guard lock(c.pending_mu);
  auto it = c.pending.find(msg_->seq);
  if (it == c.pending.end() || it->second.attempt != attempt_) return absl::OkStatus();  // already redelivered
  if (it->second.deadline_ns == deadline) return absl::OkStatus();  // that timer is set already
  it->second.deadline_ns = deadline;
  c.AddTimer({deadline, msg_->seq, attempt_, std::nullopt});
  return absl::OkStatus();
}

absl::Status Message::Settle(Settlement how, std::int64_t delay_ns, std::string_view description) {
  const char* verb = how == Settlement::kAck ? "ack" : how == Settlement::kNak ? "nak" : "term";
  if (msg_ == nullptr) {
    return absl::FailedPreconditionError(std::string("cannot ") + verb + " an empty Message");
  }
  ConsumerState& c = *consumer_;
  const ConsumerConfig& cfg = c.config;
  if (cfg.ack == AckPolicy::kNone) {
    return absl::FailedPreconditionError("consumer '" + cfg.name + "' of stream '" +
                                         cfg.stream + "' has ack policy none");
  }
  if (how != Settlement::kAck && shadow_) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) +
                                         " is a shadow copy for consumer '" + cfg.name +
                                         "'; shadow copies are acked, not " + verb + "'ed");
  }
  // One settle wins, whichever threads race (acq_rel: the winner's effects on the
  // message are ordered after any earlier settle attempt's reads).
  if (acked_.exchange(true, std::memory_order_acq_rel)) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) +
                                         " of stream '" + cfg.stream +
                                         "' was already settled (ack, nak or term) by consumer '" +
                                         cfg.name + "'");
  }
  const std::int64_t now = c.clock->NowNanos();
  const std::int64_t latency = std::max<std::int64_t>(0, now - deliver_ns_);
  if (shadow_) {
    c.group->OnDone(member_, Outcome::kSuccess, latency);
    c.shadow_acked.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (how == Settlement::kNak) c.naks.fetch_add(1, std::memory_order_relaxed);
  if (how == Settlement::kTerm) c.terminated.fetch_add(1, std::memory_order_relaxed);
  if (c.tracked) {
    std::unique_lock lock(c.pending_mu);
    auto it = c.pending.find(msg_->seq);
    if (it == c.pending.end()) {
      // Settled by another delivery of the same message: the first ack won, and
      // this delivery's work was already accounted for when it timed out.
      c.late_acks.fetch_add(how == Settlement::kAck ? 1 : 0, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (it->second.attempt != attempt_) {
      // An older delivery that timed out answers while a newer one is queued or
      // out: the first ack wins. A queued copy is skipped when pulled; one that is
      // out is dropped from its member's load and its later ack is a no-op. A nak or
      // term of the old delivery changes nothing: the newer one decides.
      if (how != Settlement::kAck) return absl::OkStatus();
      if (it->second.member != kNoMember) {
        c.group->OnDone(it->second.member, Outcome::kDropped, 0);
        c.Unsettle();
      }
      c.pending.erase(it);
    } else {
      c.Unsettle();
      if (how != Settlement::kAck) {
        if (how == Settlement::kTerm || c.LastAttempt(attempt_)) {
          c.pending.erase(it);
          lock.unlock();
          c.group->OnDone(member_, how == Settlement::kTerm ? Outcome::kDropped : Outcome::kFailure,
                          latency);
          engine_internal::DeadLetter(c, msg_, attempt_,
                                      how == Settlement::kTerm ? "term" : "max_deliver",
                                      how == Settlement::kTerm ? description : "nak");
          return absl::OkStatus();
        }
        // Queued again for the next attempt; an ack of this delivery still wins.
        it->second.member = kNoMember;
        it->second.attempt = attempt_ + 1;
        it->second.deadline_ns = INT64_MAX;
        engine_internal::Delivery next{msg_, attempt_ + 1, false};
        if (delay_ns > 0) {
          const std::int64_t due = engine_internal::SatAdd(now, delay_ns);
          c.AddTimer({due, msg_->seq, attempt_ + 1, std::move(next)});
          lock.unlock();
          c.group->OnDone(member_, Outcome::kFailure, latency);
          if (c.wake_timer) c.wake_timer(due);
          return absl::OkStatus();
        }
        lock.unlock();
        c.group->OnDone(member_, Outcome::kFailure, latency);
        engine_internal::Redeliver(c, std::move(next), member_);
        return absl::OkStatus();
      }
      c.pending.erase(it);
      c.group->OnDone(member_, Outcome::kSuccess, latency);
    }
  } else {
    c.Unsettle();
    if (how != Settlement::kAck) {
      c.group->OnDone(member_, how == Settlement::kTerm ? Outcome::kDropped : Outcome::kFailure,
                      latency);
      if (how == Settlement::kTerm || c.LastAttempt(attempt_)) {
        engine_internal::DeadLetter(c, msg_, attempt_,
                                    how == Settlement::kTerm ? "term" : "max_deliver",
                                      how == Settlement::kTerm ? description : "nak");
        return absl::OkStatus();
      }
      engine_internal::Delivery next{msg_, attempt_ + 1, false};
      if (delay_ns > 0) {
        const std::int64_t due = engine_internal::SatAdd(now, delay_ns);
        {
          std::lock_guard lock(c.pending_mu);
          c.AddTimer({due, msg_->seq, attempt_ + 1, std::move(next)});
        }
        if (c.wake_timer) c.wake_timer(due);
        return absl::OkStatus();
      }
      engine_internal::Redeliver(c, std::move(next), member_);
      return absl::OkStatus();
    }
    c.group->OnDone(member_, Outcome::kSuccess, latency);
  }
  c.acked.fetch_add(1, std::memory_order_relaxed);
  c.ack_latency_ns.Record(static_cast<std::uint64_t>(latency));
  if (c.config.batch.adaptive) c.batchers[member_]->ObserveRtt(latency);
  StreamState* stream = msg_->stream;
  if (stream->config.retention == RetentionPolicy::kInterest &&
      msg_->pending_acks.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    stream->Retire(*msg_, engine_internal::kDone);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------
// Member and Consumer

absl::Status Member::PopOne(std::int64_t deadline_ns, Message& out) {
  ConsumerState& c = *consumer_;
  Lane& lane = *c.lanes[index_];
  // max_ack_pending: take a slot before pulling, so that no more than the limit is
  // ever out; it is given back when the pull ends without a countable delivery.
  const bool limited = c.max_ack_pending > 0 && c.config.ack == AckPolicy::kExplicit;
  if (const ConsumerState::Slot slot = limited ? c.ReserveSlot(deadline_ns)
                                               : ConsumerState::Slot::kTaken;
      slot != ConsumerState::Slot::kTaken) {
    if (slot == ConsumerState::Slot::kClosed) {
      const std::size_t left = lane.ring.size_approx();
      if (left == 0) {
        return absl::CancelledError("engine closed: consumer '" + consumer_->config.name +
                                    "' member " + std::to_string(index_) + " is drained");
      }
      return absl::CancelledError("engine closed: consumer '" + c.config.name +
                                  "' is at max_ack_pending " + std::to_string(c.max_ack_pending) +
                                  "; member " + std::to_string(index_) +
                                  " gets no more messages (" + std::to_string(left) +
                                  " left queued)");
    }
    return absl::DeadlineExceededError(
        "consumer '" + c.config.name + "' has max_ack_pending " +
        std::to_string(c.max_ack_pending) + " deliveries unacknowledged; member " +
        std::to_string(index_) + " got no message before the timeout");
  }
  struct SlotGuard {
    ConsumerState* c;
    bool held;
    ~SlotGuard() {
      if (held) c->Unsettle();
    }
  } slot{&c, limited};
  engine_internal::Delivery d;
  for (;;) {
    if (!lane.ring.pop_until(d, deadline_ns)) {
      if (lane.ring.closed() && lane.ring.size_approx() == 0) {
        return absl::CancelledError("engine closed: consumer '" + consumer_->config.name +
                                    "' member " + std::to_string(index_) + " is drained");
      }
      return absl::DeadlineExceededError("no message for consumer '" +
                                         consumer_->config.name + "' member " +
                                         std::to_string(index_) + " before the timeout");
    }
    if (c.has_parked.load(std::memory_order_acquire)) engine_internal::RetryParked(c);
    if (c.outbox_pending != nullptr && c.outbox_pending->load(std::memory_order_acquire)) {
      c.flush_outbox();  // this pull made room: deferred dead letters may go now
    }
    Handle& h = d.h;
    StreamState& stream = *h->stream;
    const std::int64_t now = c.clock->NowNanos();
    // A consumer never receives what its stream has discarded (limits, max_age);
    // an event that aged out while queued is discarded here.
    if (h->state.load(std::memory_order_acquire) == engine_internal::kLive &&
        stream.Expired(*h, now)) {
      stream.Retire(*h, engine_internal::kDiscarded);
    }
    if (h->state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
      c.skipped.fetch_add(1, std::memory_order_relaxed);
      c.group->OnDone(index_, Outcome::kDropped, 0);
      if (d.attempt == 1 && !d.shadow && c.has_waiting.load(std::memory_order_acquire)) {
        std::lock_guard lock(c.pending_mu);  // its queue timeout goes with it
        if (auto it = c.waiting.find(h->seq); it != c.waiting.end()) {
          c.wheel->Cancel(it->second.timer);
          c.waiting.erase(it);
        }
      }
      if (c.tracked && !d.shadow) {
        std::lock_guard lock(c.pending_mu);
        if (auto it = c.pending.find(h->seq); it != c.pending.end() && it->second.attempt == d.attempt) {
          c.pending.erase(it);
        }
      }
      continue;
    }
    if (d.attempt == 1 && !d.shadow && c.has_waiting.load(std::memory_order_acquire)) {
      // Queue timeout: given up when it passed (reject), or moved behind what is
      // queued now, once (delay).
      std::unique_lock lock(c.pending_mu);
      auto it = c.waiting.find(h->seq);
      if (it != c.waiting.end()) {
        ConsumerState::Waiting& w = it->second;
        if (w.state == ConsumerState::kQueued && now >= w.expiry_ns) {
          c.wheel->Cancel(w.timer);
          if (c.config.timeout_action == TimeoutAction::kReject) {
            c.waiting.erase(it);
            lock.unlock();
            c.expired.fetch_add(1, std::memory_order_relaxed);
            c.group->OnDone(index_, Outcome::kDropped, 0);
            engine_internal::DeadLetter(c, h, 0, "expired", "queue timeout");
            continue;
          }
          w.state = ConsumerState::kDelayed;
          c.delayed.fetch_add(1, std::memory_order_relaxed);
        }
        if (w.state == ConsumerState::kExpired) {  // dead-lettered when it expired
          c.waiting.erase(it);
          lock.unlock();
          c.group->OnDone(index_, Outcome::kDropped, 0);
          continue;
        }
        if (w.state == ConsumerState::kDelayed && lane.ring.size_approx() > 0) {
          w.state = ConsumerState::kRequeued;
          lock.unlock();
          if (lane.ring.try_push(std::move(d))) continue;
          lock.lock();
          it = c.waiting.find(h->seq);
        }
        if (it != c.waiting.end()) {
          c.wheel->Cancel(it->second.timer);
          c.waiting.erase(it);
        }
      }
    }
    if (c.tracked && !d.shadow) {
      std::lock_guard lock(c.pending_mu);
      const std::int64_t deadline = engine_internal::SatAdd(now, c.AckWaitFor(d.attempt));
      if (d.attempt == 1) {
        c.pending.insert_or_assign(h->seq, engine_internal::Pending{h, index_, 1, deadline});
      } else {
        // A redelivery: deliver it only if the message still waits for this attempt
        // (an ack of an older delivery may have settled it meanwhile).
        auto it = c.pending.find(h->seq);
        if (it == c.pending.end() || it->second.attempt != d.attempt ||
            it->second.member != kNoMember) {
          c.skipped.fetch_add(1, std::memory_order_relaxed);
          c.group->OnDone(index_, Outcome::kDropped, 0);
          continue;
        }
        it->second.member = index_;
        it->second.deadline_ns = deadline;
      }
      c.AddTimer({deadline, h->seq, d.attempt, std::nullopt});
    }
    lane.delivered.fetch_add(1, std::memory_order_relaxed);
    const std::int64_t delay = std::max<std::int64_t>(0, now - h->publish_ns);
    lane.deliver_latency_ns.Record(static_cast<std::uint64_t>(delay));
    const std::int64_t ewma = lane.delay_ewma_ns.load(std::memory_order_relaxed);
    lane.delay_ewma_ns.store(ewma == 0 ? delay : ewma + (delay - ewma) / 8,
                             std::memory_order_relaxed);
    if (c.config.ack == AckPolicy::kNone) {
      c.group->OnDone(index_, Outcome::kSuccess, 0);
    } else if (!d.shadow) {
      if (slot.held) {
        slot.held = false;  // the reserved slot is this delivery's
      } else {
        c.unsettled.fetch_add(1, std::memory_order_relaxed);
      }
    }
    out.Release();
#ifndef NDEBUG
    c.live_messages.fetch_add(1, std::memory_order_relaxed);
#endif
    out.msg_ = std::move(h);
    out.consumer_ = consumer_;
    out.deliver_ns_ = now;
    out.member_ = index_;
    out.attempt_ = d.attempt;
    out.shadow_ = d.shadow;
    out.acked_.store(false, std::memory_order_relaxed);
    return absl::OkStatus();
  }
}

absl::StatusOr<Message> Member::Next(absl::Duration timeout) {
  Message m;
  if (absl::Status s = PopOne(DeadlineAfter(timeout), m); !s.ok()) return s;
  return m;
}

absl::StatusOr<std::vector<Message>> Member::NextBatch(std::size_t max_batch,
                                                       absl::Duration max_queue_delay,
                                                       absl::Duration timeout) {
  if (max_batch == 0) {
    return absl::InvalidArgumentError("NextBatch max_batch 0 is invalid; it must be > 0");
  }
  if (max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NextBatch max_queue_delay " +
                                      absl::FormatDuration(max_queue_delay) +
                                      " is negative");
  }
  std::vector<Message> batch;
  batch.reserve(std::min<std::size_t>(max_batch, 256));
  Message first;
  if (absl::Status s = PopOne(DeadlineAfter(timeout), first); !s.ok()) return s;
  // The batch closes max_queue_delay after its oldest event was published. Convert
  // that point from the engine clock to a steady-clock deadline for waiting.
  // ToInt64Nanoseconds saturates (an infinite delay gives INT64_MAX), so this
  // subtracts first and saturates the sum.
  const std::int64_t age_ns = std::max<std::int64_t>(
      0, consumer_->clock->NowNanos() - first.publish_time_ns());
  const std::int64_t delay_ns = absl::ToInt64Nanoseconds(max_queue_delay);
  const std::int64_t remaining_ns = delay_ns > age_ns ? delay_ns - age_ns : 0;
  const std::int64_t now = SteadyClock::Now();
  const std::int64_t deadline = remaining_ns >= kNoDeadline - now
                                    ? kNoDeadline
                                    : now + remaining_ns;
  batch.push_back(std::move(first));
  while (batch.size() < max_batch) {
    Message m;
    if (!PopOne(deadline, m).ok()) break;
    batch.push_back(std::move(m));
  }
  return batch;
}

absl::StatusOr<std::vector<Message>> Member::NextBatch(absl::Duration timeout) {
  ConsumerState& c = *consumer_;
  Batcher& batcher = *c.batchers[index_];
  Lane& lane = *c.lanes[index_];
  std::vector<Message> batch;
  batch.reserve(std::min<std::size_t>(c.config.batch.max_batch, 256));
  Message first;
  if (absl::Status s = PopOne(DeadlineAfter(timeout), first); !s.ok()) return s;
  const std::int64_t oldest = first.publish_time_ns();
  batch.push_back(std::move(first));
  bool waited_out = false;
  for (;;) {
    const std::int64_t now = c.clock->NowNanos();
    const BatchDecision d = batcher.Decide(batch.size() + lane.ring.size_approx(), oldest, now);
    if (d.take > 0 || waited_out) {
      while (batch.size() < d.take) {
        Message m;
        if (!PopOne(SteadyClock::Now(), m).ok()) break;  // others took them: go with what is here
        batch.push_back(std::move(m));
      }
      return batch;
    }
    // Wait for one more message, at most until the batch's delay runs out (the
    // wait is on the engine clock, converted to a steady-clock deadline).
    const std::int64_t wait_ns = d.wait_until_ns == INT64_MAX ? INT64_MAX : d.wait_until_ns - now;
    const std::int64_t steady = SteadyClock::Now();
    const std::int64_t deadline = wait_ns >= kNoDeadline - steady ? kNoDeadline : steady + wait_ns;
    Message m;
    if (!PopOne(deadline, m).ok()) {  // the delay ran out (or the engine closed)
      waited_out = true;
      continue;
    }
    batch.push_back(std::move(m));
  }
}

absl::Status Member::ReportLoad(const MemberLoadReport& report) {
  return consumer_->group->ReportLoad(index_, report);
}

std::size_t Member::queued() const { return consumer_->lanes[index_]->ring.size_approx(); }

absl::StatusOr<Member> Consumer::member(std::uint32_t i) const {
  if (i >= state_->lanes.size()) {
    return absl::OutOfRangeError("consumer '" + state_->config.name + "' has " +
                                 std::to_string(state_->lanes.size()) + " members; index " +
                                 std::to_string(i) + " is out of range");
  }
  return Member(state_, i);
}
std::uint32_t Consumer::members() const {
  return static_cast<std::uint32_t>(state_->lanes.size());
}
const std::string& Consumer::name() const { return state_->config.name; }
const std::string& Consumer::stream() const { return state_->config.stream; }

// ---------------------------------------------------------------------------------
// Engine

struct Engine::Impl {
  const Clock* clock;
  // Every stream's subject patterns: Match gives the capturing streams in creation
  // order, each once. Publish never waits for AddStream (Left-Right, route_index.hpp);
  // AddStream changes it under config_mu.
  engine_internal::RouteIndex<StreamState*> routes;
  std::atomic<bool> closed{false};

  // Memory by NUMA node. Declared before the streams and consumers so that it is
  // destroyed after them (their records and lanes hold blocks of these pools).
  Topology topology;
  std::vector<std::string> node_binding;                    // per node, for Stats
  std::vector<std::unique_ptr<engine_internal::NodePools>> node_pools;

  engine_internal::NodePools& PoolsFor(int node) {
    if (node < 0 || static_cast<std::size_t>(node) >= node_pools.size()) {
      node = node_pools.size() == 1 ? 0 : topology.CurrentNode();
    }
    return *node_pools[static_cast<std::size_t>(node)];
  }

  std::mutex config_mu;  // serializes AddStream / AddConsumer / Close
  std::vector<std::unique_ptr<StreamState>> streams;         // guarded by config_mu
  absl::flat_hash_map<std::string, StreamState*> stream_by_name;  // guarded by config_mu
  std::vector<std::unique_ptr<ConsumerState>> consumers;     // guarded by config_mu

  std::atomic<std::uint64_t> published{0}, unrouted{0}, rejected{0}, invalid{0};
  // Payload conversion (EngineOptions::codecs); compress_dictionary points into
  // codecs.dictionaries (nullptr = none).
  EngineCodecOptions codecs;
  const ZstdDictionary* compress_dictionary = nullptr;
  std::atomic<std::uint64_t> codec_conversions{0};

  // `event` with its payload in codec `target` for consumer `consumer` (named in the
  // error). FailedPrecondition when the payload's dictionary is missing, else
  // InvalidArgument (see Engine::Publish).
  absl::StatusOr<std::shared_ptr<const Event>> Convert(const Event& event, PayloadCodec target,
                                                       const ConsumerState& consumer) {
    absl::StatusOr<CodedPayload> p = TranscodePayload(
        event, target,
        {.zstd_level = codecs.zstd_level,
         .dictionary = compress_dictionary,
         .dictionaries = codecs.dictionaries.get(),
         .max_payload_bytes = codecs.max_payload_bytes});
    if (!p.ok()) {
      const auto name = [](PayloadCodec c) { return c == PayloadCodec::kNone ? "none" : "zstd"; };
      std::string msg = "consumer '" + consumer.config.name + "' of stream '" +
                        consumer.config.stream + "' needs the payload of subject " +
                        QuoteValue(event.subject) + " as " + name(target) + ", but converting it from " +
                        name(event.codec) +
                        (event.dictionary_id != 0
                             ? " (dictionary " + std::to_string(event.dictionary_id) + ")"
                             : std::string()) +
                        " failed: " + std::string(p.status().message());
      return p.status().code() == absl::StatusCode::kNotFound
                 ? absl::FailedPreconditionError(std::move(msg))
                 : absl::InvalidArgumentError(std::move(msg));
    }
    auto out = std::make_shared<Event>(event);
    out->payload = std::move(p->bytes);
    out->codec = p->codec;
    out->dictionary_id = p->dictionary_id;
    codec_conversions.fetch_add(1, std::memory_order_relaxed);
    return std::shared_ptr<const Event>(std::move(out));
  }
  std::unique_ptr<DualChannelController> flow;  // EngineOptions::flow_control; may be null
  // Dead letters whose stream's mutex was taken (Publish kInternal never waits).
  std::mutex outbox_mu;
  std::deque<std::pair<StreamState*, Event>> outbox;  // guarded by outbox_mu
  std::atomic<bool> has_outbox{false};
  Lifecycle* lifecycle = nullptr;

  // Timers (ack_wait, stalled members): a background thread unless manual_timers.
  bool manual_timers = false;
  std::mutex timer_mu;
  std::condition_variable timer_cv;
  bool timer_stop = false;                       // guarded by timer_mu
  std::int64_t timer_interval_ns = 100'000'000;  // guarded by timer_mu
  // An earlier run some timer asked for (steady ns). Lowered without the lock (a
  // publish with a queue timeout must not take a global lock); a lowering notifies
  // under timer_mu, so the thread cannot miss it between its check and its wait.
  std::atomic<std::int64_t> timer_wake_steady_ns{INT64_MAX};
  std::thread timer;                             // started under config_mu
  std::mutex run_timers_mu;                      // one RunTimers at a time
  std::vector<ConsumerState*> timer_consumers;   // RunTimers' scratch; run_timers_mu
  std::atomic<std::size_t> consumer_count{0};    // consumers.size(), readable without config_mu
  // Per lane, what the timer saw last: (delivered count, since when unchanged while
  // items were queued). Guarded by run_timers_mu.
  absl::flat_hash_map<const Lane*, std::pair<std::uint64_t, std::int64_t>> stall_marks;

  // Starts the timer thread (once): it runs `run` every timer_interval_ns, or
  // earlier when WakeTimer asks. Requires config_mu (or the constructor).
  void StartTimer(std::function<void()> run) {
    if (manual_timers || timer.joinable()) return;
    timer = std::thread([this, run = std::move(run)] {
      std::unique_lock tl(timer_mu);
      std::int64_t next_run = SteadyClock::Now() + timer_interval_ns;
      while (!timer_stop) {
        const std::int64_t until =
            std::min(next_run, timer_wake_steady_ns.load(std::memory_order_relaxed));
        const std::int64_t now = SteadyClock::Now();
        if (now < until) {
          timer_cv.wait_for(tl, std::chrono::nanoseconds(until - now));
          continue;  // woken early (a nearer wake-up, or stop): look again
        }
        timer_wake_steady_ns.store(INT64_MAX, std::memory_order_relaxed);
        tl.unlock();
        run();
        tl.lock();
        next_run = SteadyClock::Now() + timer_interval_ns;
      }
    });
  }

  // Asks the timer thread to run by `due_ns` (engine clock). No-op with manual timers.
  void WakeTimer(std::int64_t due_ns) {
    if (manual_timers) return;
    const std::int64_t delta = std::max<std::int64_t>(0, due_ns - clock->NowNanos());
    const std::int64_t now = SteadyClock::Now();
    const std::int64_t at = delta > INT64_MAX - now ? INT64_MAX : now + delta;
    std::int64_t cur = timer_wake_steady_ns.load(std::memory_order_relaxed);
    do {
      if (at >= cur) return;
    } while (!timer_wake_steady_ns.compare_exchange_weak(cur, at, std::memory_order_relaxed));
    {
      std::lock_guard lock(timer_mu);
    }
    timer_cv.notify_all();
  }

  // Engine::Call: open calls by id, their timeouts, and the functions' workers.
  struct CallState {
    std::promise<absl::StatusOr<Buffer>> promise;
    std::string fn;
    Buffer payload;
    absl::Duration timeout;
    std::uint32_t attempts = 0;   // tries started
    bool running = false;         // a worker is in the handler
    absl::Status last_error;      // of the last failed try
    TimerId timer{};              // its timeout in call_wheel
  };
  std::mutex calls_mu;
  absl::flat_hash_map<std::uint64_t, CallState> calls;        // guarded by calls_mu
  std::uint64_t next_call = 1;                                 // guarded by calls_mu
  std::unique_ptr<TimerWheel<std::uint64_t>> call_wheel;       // guarded by calls_mu
  std::atomic<bool> has_calls{false};
  using Function = engine_internal::FunctionState;
  std::vector<std::unique_ptr<Function>> functions;            // guarded by config_mu
  // The functions' worker threads; Close leaves them to finish their handler, and
  // ~Engine joins them.
  std::vector<std::thread> function_workers;                   // guarded by config_mu
  absl::flat_hash_map<std::string, Function*> function_by_id;  // guarded by config_mu
  Function* FindFunction(std::string_view id) {  // requires config_mu; O(1) (Call uses it)
    auto it = function_by_id.find(absl::string_view(id.data(), id.size()));
    return it == function_by_id.end() ? nullptr : it->second;
  }

  // Completes call `id` with `result` if it is still open; false when it was not.
  bool CompleteCall(std::uint64_t id, absl::StatusOr<Buffer> result) {
    std::lock_guard lock(calls_mu);
    auto it = calls.find(id);
    if (it == calls.end()) return false;
    it->second.promise.set_value(std::move(result));
    call_wheel->Cancel(it->second.timer);
    calls.erase(it);
    return true;
  }

  // Requires config_mu. O(1): one stream per tenant or model is a normal layout.
  StreamState* FindStream(std::string_view name) {
    auto it = stream_by_name.find(absl::string_view(name.data(), name.size()));
    return it == stream_by_name.end() ? nullptr : it->second;
  }
};

namespace {

// One arena per real NUMA node for the whole process: mimalloc 2.0.9 cannot take an
// arena back and holds at most 64, so engines share them. nullptr when none can be
// made (built without mimalloc); `why` then says so.
NumaArena* ProcessArena(const Topology& topology, int node_index, std::string* why) {
  static std::mutex mu;
  static std::vector<std::pair<int, std::unique_ptr<NumaArena>>> arenas;
  const int os_index = topology.nodes()[static_cast<std::size_t>(node_index)].index;
  std::lock_guard lock(mu);
  for (auto& [idx, arena] : arenas) {
    if (idx == os_index) {
      *why = arena->Stats().binding;
      return arena.get();
    }
  }
  // Address space only (MAP_NORESERVE): pages are used as the pools grow. When it is
  // used up, the pools take chunks from operator new (FixedPoolStats says so).
  absl::StatusOr<std::unique_ptr<NumaArena>> arena =
      NumaArena::Create(topology, node_index, std::size_t{16} << 30);
  if (!arena.ok()) {
    *why = "no arena (" + std::string(arena.status().message()) + "): operator new";
    return nullptr;
  }
  *why = (*arena)->Stats().binding;
  arenas.emplace_back(os_index, *std::move(arena));
  return arenas.back().second.get();
}

}  // namespace

namespace {

// What Engine::Create refuses (see engine.hpp).
absl::Status ValidateOptions(const EngineOptions& options) {
  const EngineCodecOptions& c = options.codecs;
  if (c.zstd_level < 1 || c.zstd_level > 22) {
    return absl::InvalidArgumentError("EngineOptions::codecs.zstd_level " +
                                      std::to_string(c.zstd_level) + " is outside 1..22");
  }
  if (c.max_payload_bytes == 0) {
    return absl::InvalidArgumentError("EngineOptions::codecs.max_payload_bytes is 0");
  }
  if (c.compress_dictionary_id != 0 &&
      (c.dictionaries == nullptr || c.dictionaries->Find(c.compress_dictionary_id) == nullptr)) {
    return absl::InvalidArgumentError("EngineOptions::codecs.compress_dictionary_id " +
                                      std::to_string(c.compress_dictionary_id) +
                                      " is not in codecs.dictionaries");
  }
  if (options.flow_control) {
    if (absl::Status s = DualChannelController::Validate(*options.flow_control); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  // Checked first: a refusal leaves nothing started.
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::unique_ptr<Engine>(new Engine(std::move(options)));
}

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->codecs = options.codecs;
  if (options.codecs.compress_dictionary_id != 0) {  // found: Create checked it
    impl_->compress_dictionary =
        options.codecs.dictionaries->Find(options.codecs.compress_dictionary_id);
  }
  impl_->clock = options.clock ? options.clock : SteadyClock::Default();
  impl_->manual_timers = options.manual_timers;
  impl_->call_wheel = std::make_unique<TimerWheel<std::uint64_t>>(impl_->clock->NowNanos());
  if (options.flow_control) {
    // Cannot throw: Create checked the config.
    impl_->flow = std::make_unique<DualChannelController>(*options.flow_control);
  }
  impl_->lifecycle = options.lifecycle;
  if (impl_->flow != nullptr || impl_->lifecycle != nullptr) {
    impl_->StartTimer([this] { RunTimers(); });
  }
  if (options.topology != nullptr) {
    impl_->topology = *options.topology;
  } else if (absl::StatusOr<Topology> t = Topology::Detect(); t.ok()) {
    impl_->topology = *std::move(t);
  } else {
    impl_->topology = *Topology::Synthetic("numa:1 pu:1");  // hwloc failed: one node
  }
  for (std::size_t i = 0; i < impl_->topology.node_count(); ++i) {
    std::string why = "synthetic topology: operator new";
    NumaArena* arena = impl_->topology.synthetic()
                           ? nullptr
                           : ProcessArena(impl_->topology, static_cast<int>(i), &why);
    impl_->node_binding.push_back(why);
    impl_->node_pools.push_back(std::make_unique<engine_internal::NodePools>(arena));
  }
}

Engine::~Engine() {
  Close();
  // Function workers finish the handler they are in (Close does not wait for them).
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(impl_->config_mu);
    workers.swap(impl_->function_workers);
  }
  for (std::thread& w : workers) {
    if (w.get_id() == std::this_thread::get_id()) {
      w.detach();  // destroyed from inside its own handler: nothing else can wait for it
    } else {
      w.join();
    }
  }
#ifndef NDEBUG
  // A Message still alive would free its handle into pools destroyed below.
  for (const auto& c : impl_->consumers) {
    const std::int64_t live = c->live_messages.load(std::memory_order_acquire);
    if (live == 0) continue;
    std::fprintf(stderr,
                 "inferq: Engine destroyed while %lld Message(s) of consumer '%s' of stream "
                 "'%s' are alive; destroy every Message before its Engine "
                 "(inferq/engine/engine.hpp: the Engine must outlive them)\n",
                 static_cast<long long>(live), c->config.name.c_str(), c->config.stream.c_str());
    std::abort();
  }
#endif
}

absl::Status Engine::AddStream(const StreamConfig& config) {
  if (absl::Status s = StreamConfig::Validate(config); !s.ok()) return s;
  auto state = std::make_unique<StreamState>();
  for (const std::string& subject : config.subjects) {
    // Cannot fail: Validate parsed every pattern.
    state->patterns.push_back(*SubjectPattern::Parse(subject));
  }
  state->config = config;
  state->clock = impl_->clock;
  if (config.duplicate_window > absl::ZeroDuration()) {
    state->dedup = std::make_unique<DuplicateWindow>(config.duplicate_window,
                                                     config.duplicate_window_max_entries);
  }

  std::lock_guard lock(impl_->config_mu);
  if (impl_->closed.load()) return absl::CancelledError("engine is closed");
  if (impl_->FindStream(config.name) != nullptr) {
    return absl::AlreadyExistsError("stream '" + config.name + "' already exists");
  }
  StreamState* raw = state.get();
  impl_->stream_by_name.emplace(config.name, raw);
  impl_->streams.push_back(std::move(state));
  // A publisher that finds the stream in the index sees it fully built (the index's
  // switch is seq_cst, after this thread built it).
  impl_->routes.Change([raw](SubjectIndex<StreamState*>& index) {
    for (const SubjectPattern& p : raw->patterns) {
      // Cannot fail: the patterns parsed above, and (pattern, stream) pairs repeat
      // only when a stream lists a pattern twice, which changes nothing.
      (void)index.Insert(p.text(), raw);
    }
    return 0;
  });
  return absl::OkStatus();
}

absl::StatusOr<Consumer> Engine::AddConsumer(const ConsumerConfig& config) {
  if (absl::Status s = ConsumerConfig::Validate(config); !s.ok()) return s;
  for (std::size_t i = 0; i < config.member_nodes.size(); ++i) {
    const int n = config.member_nodes[i];
    if (n < 0 || static_cast<std::size_t>(n) >= impl_->topology.node_count()) {
      return absl::InvalidArgumentError(
          "consumer '" + config.name + "': member_nodes[" + std::to_string(i) + "] = " +
          std::to_string(n) + " is not a node of this machine (0.." +
          std::to_string(impl_->topology.node_count() - 1) + ")");
    }
  }
  // Lanes hold capacity rounded up to a power of two (Validate bounded the total).
  const std::size_t slots = std::bit_ceil(config.lane_capacity) * config.members;
  auto state = std::make_unique<ConsumerState>();
  if (!config.filter_subject.empty()) {
    // Cannot fail: Validate parsed it.
    state->filter = *SubjectPattern::Parse(config.filter_subject);
  }
  state->config = config;
  state->clock = impl_->clock;
  state->policy = config.selection ? config.selection : std::make_shared<RoundRobinPolicy>();
  state->config.selection = nullptr;  // the consumer's policy is state->policy
  {
    absl::StatusOr<std::unique_ptr<MemberGroup>> g =
        MemberGroup::Create(config.members, config.group, impl_->clock);
    if (!g.ok()) return g.status();
    state->group = *std::move(g);
  }
  state->ack_wait_ns = absl::ToInt64Nanoseconds(config.ack_wait);
  for (absl::Duration b : config.backoff) state->backoff_ns.push_back(absl::ToInt64Nanoseconds(b));
  state->tracked = (state->ack_wait_ns > 0 || !state->backoff_ns.empty()) &&
                   config.ack == AckPolicy::kExplicit;
  for (std::uint32_t i = 0; i < config.members; ++i) {
    state->batchers.push_back(*Batcher::Create(config.batch));
  }
  state->queue_timeout_ns = absl::ToInt64Nanoseconds(config.queue_timeout);
  state->wheel = std::make_unique<TimerWheel<std::uint64_t>>(impl_->clock->NowNanos());
  state->max_deliver = config.max_deliver;
  if (!config.accept_codecs.empty()) {
    state->accept_mask = 0;
    for (PayloadCodec c : config.accept_codecs) state->accept_mask |= 1u << static_cast<unsigned>(c);
    state->convert_to = config.accept_codecs.front();
  }
  state->max_ack_pending = config.max_ack_pending;
  state->publish_dead_letter = [this](Event e) -> absl::Status {
    return Publish(std::move(e), PublishMode::kInternal).status();
  };
  state->wake_timer = [impl = impl_.get()](std::int64_t due_ns) { impl->WakeTimer(due_ns); };
  state->flush_outbox = [this] { FlushOutbox(); };
  state->outbox_pending = &impl_->has_outbox;

  StreamState* stream = nullptr;
  ConsumerState* raw = nullptr;
  {
    // Check and reserve the name under config_mu only: never wait for a stream's
    // mutex while holding it (a publisher blocked on a full lane holds that mutex,
    // and Close() needs config_mu to release it).
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    stream = impl_->FindStream(config.stream);
    if (stream == nullptr) {
      return absl::NotFoundError("consumer '" + config.name + "': stream " +
                                 QuoteValue(config.stream) + " does not exist");
    }
    if (state->filter &&
        std::none_of(stream->patterns.begin(), stream->patterns.end(),
                     [&](const SubjectPattern& p) { return p.Overlaps(*state->filter); })) {
      std::string subjects;
      for (const SubjectPattern& p : stream->patterns) {
        subjects += (subjects.empty() ? "" : ", ") + QuoteValue(p.text());
      }
      return absl::InvalidArgumentError("consumer '" + config.name + "': filter_subject " +
                                        QuoteValue(config.filter_subject) +
                                        " matches no subject of stream '" + config.stream +
                                        "' (subjects " + subjects + ")");
    }
    for (const auto& c : impl_->consumers) {
      if (c->stream == stream && c->config.name == config.name) {
        return absl::AlreadyExistsError("consumer '" + config.name + "' of stream '" +
                                        config.stream + "' already exists");
      }
      if (config.selection != nullptr && c->policy == config.selection) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "': its selection policy object is already used by "
            "consumer '" + c->config.name + "' of stream '" + c->config.stream +
            "' (policies keep per-group state: give each consumer its own)");
      }
    }
    try {
      for (std::uint32_t i = 0; i < config.members; ++i) {
        const int node = config.member_nodes.empty() ? -1 : config.member_nodes[i];
        if (!config.qos) {
          state->lanes.push_back(std::make_unique<Lane>(config.lane_capacity, node));
          continue;
        }
        QosConfig qc = *config.qos;
        qc.capacity = static_cast<std::uint32_t>(config.lane_capacity);
        ConsumerState* cs = state.get();
        state->lanes.push_back(std::make_unique<Lane>(
            *QosScheduler<engine_internal::Delivery>::Create(qc),
            [cs, i](engine_internal::Delivery& d) { engine_internal::DropQueued(*cs, i, d, true); },
            node));
      }
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("consumer '" + config.name +
                                          "': out of memory allocating " +
                                          std::to_string(slots) + " lane slots");
    }
    state->stream = stream;
    raw = state.get();
    impl_->consumers.push_back(std::move(state));
    impl_->consumer_count.store(impl_->consumers.size(), std::memory_order_relaxed);
    // Every consumer may need timers: queue timeouts and event ttl apply to all,
    // delayed naks to explicit-ack ones.
    if (!impl_->manual_timers) {
      // ack_wait expiries need a run every quarter ack wait; delayed naks ask for
      // their own wake-up (WakeTimer), so untracked consumers need no short interval.
      const std::int64_t interval =
          raw->tracked ? std::clamp<std::int64_t>(raw->AckWaitFor(1) / 4, 1'000'000, 100'000'000)
                       : 100'000'000;
      {
        std::lock_guard tl(impl_->timer_mu);
        impl_->timer_interval_ns = std::min(impl_->timer_interval_ns, interval);
      }
      impl_->timer_cv.notify_all();
      impl_->StartTimer([this] { RunTimers(); });
    }
  }
  {
    // RunTimers' scratch list of consumers grows here, not on the timer thread (a
    // timer run in steady state allocates nothing). Not under config_mu: RunTimers
    // takes run_timers_mu first.
    std::lock_guard run_lock(impl_->run_timers_mu);
    impl_->timer_consumers.reserve(impl_->consumer_count.load(std::memory_order_relaxed));
  }
  // Now the publishers of the stream start queueing for it. This waits for a
  // publisher blocked on a full lane of another consumer; Close() releases it.
  std::lock_guard stream_lock(stream->mu);
  stream->consumers.push_back(raw);
  if (!config.accept_codecs.empty()) {
    stream->codec_restricted.fetch_add(1, std::memory_order_relaxed);
  }
  return Consumer(raw);
}

absl::StatusOr<PublishAck> Engine::Publish(Event event) {
  return Publish(std::move(event), PublishMode::kWait);
}

absl::StatusOr<PublishAck> Engine::TryPublish(Event event) {
  return Publish(std::move(event), PublishMode::kTry);
}

absl::StatusOr<PublishAck> Engine::Publish(Event event, PublishMode mode, StreamState* only) {
  if (impl_->closed.load(std::memory_order_acquire)) {
    return absl::CancelledError("engine is closed");
  }
  // EngineStats counts the application's publishes only, not the engine's own dead
  // letters (counted per consumer).
  const bool counted = mode != PublishMode::kInternal;
  const auto count = [counted](std::atomic<std::uint64_t>& counter) {
    if (counted) counter.fetch_add(1, std::memory_order_relaxed);
  };
  // TryPublish and a call waiting for room never wait. A call's refusal for want of
  // room is not counted as a rejection: the call waits and tries again (FlushCalls).
  const bool no_wait = mode == PublishMode::kTry || mode == PublishMode::kCall;
  const bool count_refusals = mode != PublishMode::kCall;
  if (absl::Status s = ValidateSubject(event.subject); !s.ok()) {
    count(impl_->invalid);
    return s;
  }
  if (event.msg_id.size() > kMaxMsgIdBytes) {
    count(impl_->invalid);
    return absl::InvalidArgumentError("event msg_id of " + std::to_string(event.msg_id.size()) +
                                      " bytes is longer than the limit of " +
                                      std::to_string(kMaxMsgIdBytes) + " bytes");
  }
  if (event.ttl < absl::ZeroDuration() || event.ttl > kMaxDuration) {
    count(impl_->invalid);
    return absl::InvalidArgumentError("event ttl " + absl::FormatDuration(event.ttl) +
                                      " is invalid (zero for none, or up to 365 days)");
  }
  if (static_cast<std::uint8_t>(event.qos) > static_cast<std::uint8_t>(Qos::kBronze)) {
    count(impl_->invalid);
    return absl::InvalidArgumentError("event qos " +
                                      std::to_string(static_cast<int>(event.qos)) +
                                      " is not a tier (0 gold, 1 silver, 2 bronze)");
  }
  if (event.codec != PayloadCodec::kNone && event.codec != PayloadCodec::kZstd) {
    count(impl_->invalid);
    return absl::InvalidArgumentError("event payload codec " +
                                      std::to_string(static_cast<int>(event.codec)) +
                                      " is not one of none (0), zstd (1)");
  }
  if (event.codec == PayloadCodec::kNone && event.dictionary_id != 0) {
    count(impl_->invalid);
    return absl::InvalidArgumentError("event payload has codec none but dictionary_id " +
                                      std::to_string(event.dictionary_id) + " (must be 0)");
  }
  // The event's own queue limit (ttl, deadline), ns from publish; INT64_MAX = none.
  std::int64_t event_limit_ns = INT64_MAX;
  if (event.ttl > absl::ZeroDuration()) event_limit_ns = absl::ToInt64Nanoseconds(event.ttl);
  if (event.deadline != absl::InfiniteFuture()) {
    event_limit_ns = std::min(
        event_limit_ns,
        std::max<std::int64_t>(0, absl::ToInt64Nanoseconds(event.deadline - absl::Now())));
  }
  absl::InlinedVector<StreamState*, 4> capturing;
  impl_->routes.Match(event.subject, &capturing);
  if (only != nullptr) {
    const bool captures = std::find(capturing.begin(), capturing.end(), only) != capturing.end();
    capturing.clear();
    if (captures) capturing.push_back(only);
  }
  if (capturing.empty()) {
    count(impl_->unrouted);
    return absl::NotFoundError("no stream captures subject " + QuoteValue(event.subject));
  }
  // The payload converted for consumers that do not accept event.codec
  // (ConsumerConfig::accept_codecs): once per target codec, shared by every stream and
  // consumer. Made here, before anything is stored and outside the streams' mutexes
  // (held only to read each stream's consumers), so that a payload that cannot be
  // converted changes nothing. Internal publishes (dead letters) never wait for a
  // stream's mutex: theirs are made below, under it.
  std::array<std::shared_ptr<const Event>, kPayloadCodecs> converted{};
  if (!event.payload.empty() && mode != PublishMode::kInternal) {
    for (StreamState* stream : capturing) {
      // relaxed: a consumer added concurrently is handled under the mutex below.
      if (stream->codec_restricted.load(std::memory_order_relaxed) == 0) continue;
      std::array<const ConsumerState*, kPayloadCodecs> needs{};  // first consumer per codec
      {
        std::unique_lock lock(stream->mu, std::defer_lock);
        if (no_wait) {
          // Held by a blocked publisher: the stream refuses below.
          if (!stream->LockUnlessBlocked(lock)) continue;
        } else {
          lock.lock();
        }
        for (const ConsumerState* c : stream->consumers) {
          const auto i = static_cast<std::size_t>(c->convert_to);
          if (c->Accepts(event.codec) || needs[i] != nullptr || converted[i] != nullptr) continue;
          if (c->filter && !c->filter->Matches(event.subject)) continue;
          if (!c->config.predicate.is_trivial() && !c->config.predicate.Matches(event)) continue;
          needs[i] = c;
        }
      }
      for (std::size_t i = 0; i < kPayloadCodecs; ++i) {
        if (needs[i] == nullptr) continue;
        absl::StatusOr<std::shared_ptr<const Event>> r =
            impl_->Convert(event, static_cast<PayloadCodec>(i), *needs[i]);
        if (!r.ok()) {
          count(impl_->invalid);
          return r.status();
        }
        converted[i] = *std::move(r);
      }
    }
  }
  PublishAck ack;
  std::uint32_t deferred = 0;  // internal publishes left for FlushOutbox
  absl::Status first_refusal;
  std::uint32_t undelivered = 0;  // queueing failed because the engine closed
  const std::uint64_t bytes = event.StoredSize();
  // One Event shared by every stream and every delivery, made when the first stream
  // stores it, from the pools of the node of the first lane that will drain it.
  std::shared_ptr<const Event> shared;

  for (StreamState* stream : capturing) {
    const StreamConfig& cfg = stream->config;

    std::unique_lock lock(stream->mu, std::defer_lock);
    if (mode == PublishMode::kWait) {
      lock.lock();
    } else if (no_wait) {
      if (!stream->LockUnlessBlocked(lock)) {
        if (count_refusals) stream->rejected.fetch_add(1, std::memory_order_relaxed);
        ++ack.streams_rejected;
        if (first_refusal.ok()) {
          first_refusal = absl::ResourceExhaustedError(
              "stream '" + cfg.name + "': a Publish is blocked on a full lane (overflow block) "
              "and holds the stream; TryPublish does not wait");
        }
        continue;
      }
    } else if (!lock.try_lock()) {
      // A dead letter never waits for a stream's mutex: its holder may be a
      // publisher blocked on a full lane that only the member publishing this dead
      // letter (or the timer thread) would drain. It is published into this stream
      // later (FlushOutbox: after the next publish, pull or timer run).
      {
        std::lock_guard outbox_lock(impl_->outbox_mu);
        impl_->outbox.emplace_back(stream, shared ? Event(*shared) : Event(event));
        impl_->has_outbox.store(true, std::memory_order_release);
      }
      ++deferred;
      continue;
    }
    const std::int64_t now = impl_->clock->NowNanos();
    stream->TrimFront(now);
    stream->CompactIfSparse();
    const Event& incoming = shared ? *shared : event;
    // Dead letters keep the original msg_id (for correlation) but are not subject to
    // the duplicate window: two consumers' dead letters of one message, or a dead
    // letter in the stream of its original, are all kept.
    if (stream->dedup != nullptr && !incoming.msg_id.empty() && mode != PublishMode::kInternal) {
      stream->dedup->Expire(now);
      if (std::optional<std::uint64_t> original = stream->dedup->Find(incoming.msg_id, now)) {
        lock.unlock();
        stream->duplicates.fetch_add(1, std::memory_order_relaxed);
        if (ack.streams_stored == 0 && ack.streams_duplicate == 0) ack.seq = *original;
        ack.duplicate = true;
        ++ack.streams_duplicate;
        continue;
      }
    }

    absl::Status refusal;
    if (cfg.max_msg_size > 0 && bytes > static_cast<std::uint64_t>(cfg.max_msg_size)) {
      refusal = absl::InvalidArgumentError(
          "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
          " bytes exceeds max_msg_size " + std::to_string(cfg.max_msg_size));
    } else if (cfg.discard == DiscardPolicy::kNew) {
      const std::int64_t n = stream->live_msgs.load(std::memory_order_relaxed);
      const std::int64_t b = stream->live_bytes.load(std::memory_order_relaxed);
      if (cfg.max_msgs > 0 && n + 1 > cfg.max_msgs) {
        refusal = absl::ResourceExhaustedError("stream '" + cfg.name + "' is full: max_msgs " +
                                               std::to_string(cfg.max_msgs) +
                                               " reached (discard new)");
      } else if (cfg.max_bytes > 0 && b + static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
        refusal = absl::ResourceExhaustedError(
            "stream '" + cfg.name + "' is full: " + std::to_string(b) + " + " +
            std::to_string(bytes) + " bytes would exceed max_bytes " +
            std::to_string(cfg.max_bytes) + " (discard new)");
      }
    } else if (cfg.max_bytes > 0 && static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
      refusal = absl::ResourceExhaustedError(
          "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
          " bytes is larger than max_bytes " + std::to_string(cfg.max_bytes));
    }
    if (!refusal.ok()) {
      lock.unlock();
      stream->rejected.fetch_add(1, std::memory_order_relaxed);
      ++ack.streams_rejected;
      if (first_refusal.ok()) first_refusal = std::move(refusal);
      continue;
    }
    // The consumers that take this event, and which member of each (the consumer's
    // selection policy, under this stream's mutex), plus shadow copies.
    struct Target {
      ConsumerState* consumer;
      std::uint32_t member;
      bool shadow;
    };
    absl::InlinedVector<Target, 8> targets;
    std::uint32_t explicit_acks = 0;
    const Event& ev = shared ? *shared : event;
    for (ConsumerState* c : stream->consumers) {
      if (c->filter && !c->filter->Matches(ev.subject)) continue;
      if (!c->config.predicate.is_trivial() && !c->config.predicate.Matches(ev)) continue;
      Selection sel;
      {
        std::lock_guard select_lock(c->select_mu);
        sel = c->group->Select(*c->policy, ev);
      }
      targets.push_back({c, sel.member, false});
      if (sel.mirror != kNoMember) targets.push_back({c, sel.mirror, true});
      if (c->config.ack == AckPolicy::kExplicit) ++explicit_acks;
    }
    // Full lanes: kReject (and kBlock for a publish that must not wait) refuse the
    // publish for this stream before anything changes. Internal publishes (dead
    // letters) never wait and never refuse: a full lane parks them below.
    if (mode != PublishMode::kInternal) {
      for (const Target& t : targets) {
        const OverflowPolicy overflow = t.consumer->config.overflow;
        const bool refuses = overflow == OverflowPolicy::kReject ||
                             (overflow == OverflowPolicy::kBlock && no_wait);
        Lane& lane = *t.consumer->lanes[t.member];
        if (!refuses || lane.ring.WouldAccept(QosKey::Of(ev))) continue;
        if (count_refusals) t.consumer->overflow_rejected.fetch_add(1, std::memory_order_relaxed);
        refusal = absl::ResourceExhaustedError(
            "stream '" + cfg.name + "': lane of consumer '" + t.consumer->config.name +
            "' member " + std::to_string(t.member) + " is full (" +
            std::to_string(lane.ring.size_approx()) + " queued" +
            (lane.ring.scheduled() ? " or its tier at max_items" : "") + "; overflow " +
            (overflow == OverflowPolicy::kReject ? "reject" : "block, and TryPublish does not wait") +
            ")");
        break;
      }
      if (!refusal.ok()) {
        lock.unlock();
        if (count_refusals) stream->rejected.fetch_add(1, std::memory_order_relaxed);
        ++ack.streams_rejected;
        if (first_refusal.ok()) first_refusal = std::move(refusal);
        continue;
      }
    }
    // Conversions the pass above did not make: a consumer added since, or a dead
    // letter. A failure refuses the event for this stream only, before it changes.
    if (!ev.payload.empty()) {
      absl::Status conversion;
      for (const Target& t : targets) {
        const auto i = static_cast<std::size_t>(t.consumer->convert_to);
        if (t.consumer->Accepts(ev.codec) || converted[i] != nullptr) continue;
        absl::StatusOr<std::shared_ptr<const Event>> r =
            impl_->Convert(ev, t.consumer->convert_to, *t.consumer);
        if (!r.ok()) {
          conversion = r.status();
          break;
        }
        converted[i] = *std::move(r);
      }
      if (!conversion.ok()) {
        lock.unlock();
        stream->rejected.fetch_add(1, std::memory_order_relaxed);
        ++ack.streams_rejected;
        if (first_refusal.ok()) first_refusal = std::move(conversion);
        continue;
      }
    }
    engine_internal::NodePools& pools = impl_->PoolsFor(
        targets.empty() ? -1 : targets.front().consumer->lanes[targets.front().member]->node);
    // Everything that can fail for want of memory happens before the stream changes
    // (before discard-old makes room), so a failure changes nothing.
    std::shared_ptr<StoredMessage> stored;
    try {
      if (!shared) {
        shared = std::allocate_shared<const Event>(
            engine_internal::PoolAllocator<const Event>(&pools), std::move(event));
      }
      stored = std::allocate_shared<StoredMessage>(
          engine_internal::PoolAllocator<StoredMessage>(&pools));
      stream->messages.ReserveOne();
    } catch (const std::bad_alloc&) {
      lock.unlock();
      stream->rejected.fetch_add(1, std::memory_order_relaxed);
      ++ack.streams_rejected;
      if (first_refusal.ok()) {
        first_refusal = absl::ResourceExhaustedError("stream '" + cfg.name +
                                                     "': out of memory storing a message of " +
                                                     std::to_string(bytes) + " bytes");
      }
      continue;
    }
    if (cfg.discard == DiscardPolicy::kOld) stream->MakeRoom(bytes);
    stored->event = shared;
    stored->converted = converted;  // copies of shared_ptrs: no allocation
    stored->stream = stream;
    stored->seq = stream->next_seq++;
    stored->publish_ns = now;
    stored->bytes = bytes;
    stored->pending_acks.store(explicit_acks, std::memory_order_relaxed);

    stream->live_msgs.fetch_add(1, std::memory_order_relaxed);
    stream->live_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    stream->stored.fetch_add(1, std::memory_order_relaxed);
    stream->last_seq.store(stored->seq, std::memory_order_relaxed);
    if (stream->dedup != nullptr && !shared->msg_id.empty() && mode != PublishMode::kInternal) {
      stream->dedup->Insert(shared->msg_id, stored->seq, now);
      stream->dedup_evicted.store(stream->dedup->evicted(), std::memory_order_relaxed);
    }
    if (cfg.retention == RetentionPolicy::kInterest && explicit_acks == 0) {
      // Nobody will ack it: under interest retention it is done once queued.
      stream->Retire(*stored, engine_internal::kDone);
    } else {
      stream->messages.push_back(stored);
    }
    // Queue while holding the stream's mutex, so every member sees the stream's
    // order. A full lane blocks here: that is the backpressure on publishers.
    std::uint32_t undelivered_acks = 0;
    for (const Target& t : targets) {
      ConsumerState* consumer = t.consumer;
      // Counted before the push, so that a fast pull and ack never see it negative.
      consumer->group->OnQueued(t.member);
      auto& ring = consumer->lanes[t.member]->ring;
      engine_internal::Delivery d{stored, 1, t.shadow};
      // A queue timeout is registered before the push, so that a fast pull finds it.
      std::int64_t expiry = INT64_MAX;
      if (!t.shadow) expiry = consumer->ExpiryFor(now, event_limit_ns);
      if (expiry != INT64_MAX) {
        {
          std::lock_guard wl(consumer->pending_mu);
          const TimerId id = consumer->wheel->Schedule(expiry, stored->seq);
          consumer->waiting.insert_or_assign(
              stored->seq, ConsumerState::Waiting{stored, expiry, id, ConsumerState::kQueued});
          consumer->has_waiting.store(true, std::memory_order_release);
        }
        impl_->WakeTimer(expiry);
      }
      bool queued;
      if (consumer->config.overflow == OverflowPolicy::kBlock && mode == PublishMode::kWait) {
        queued = ring.try_push(std::move(d));  // on failure d is untouched
        if (!queued && !ring.closed()) {
          // Backpressure: wait for the member, holding mu (every member sees the
          // stream's order). release: a TryPublish that fails to take mu sees this.
          stream->blocked_publishers.fetch_add(1, std::memory_order_release);
          queued = ring.push(std::move(d));
          stream->blocked_publishers.fetch_sub(1, std::memory_order_release);
        }
      } else {
        queued = ring.try_push(std::move(d));
        while (!queued && consumer->config.overflow == OverflowPolicy::kDropOldest &&
               !ring.closed()) {
          engine_internal::Delivery oldest;
          if (ring.try_pop(oldest)) engine_internal::DropQueued(*consumer, t.member, oldest);
          queued = ring.try_push(std::move(d));
        }
        if (!queued && !ring.closed()) {
          // Full although checked above (a redelivery took the room), or an internal
          // publish: park it; the next pull or timer run queues it.
          consumer->group->OnDone(t.member, Outcome::kDropped, 0);
          if (t.shadow) continue;
          std::lock_guard park_lock(consumer->pending_mu);
          consumer->parked.push_back(std::move(d));
          consumer->parked_total.fetch_add(1, std::memory_order_relaxed);
          consumer->has_parked.store(true, std::memory_order_release);
          ++ack.deliveries;
          continue;
        }
      }
      if (queued) {
        ++ack.deliveries;
        if (t.shadow) consumer->mirrored.fetch_add(1, std::memory_order_relaxed);
      } else {  // closed while waiting: that consumer will never ack it
        consumer->group->OnDone(t.member, Outcome::kDropped, 0);
        if (t.shadow) continue;
        ++undelivered;
        if (consumer->config.ack == AckPolicy::kExplicit) ++undelivered_acks;
        if (expiry != INT64_MAX) {
          std::lock_guard wl(consumer->pending_mu);
          if (auto it = consumer->waiting.find(stored->seq); it != consumer->waiting.end()) {
            consumer->wheel->Cancel(it->second.timer);
            consumer->waiting.erase(it);
          }
        }
      }
    }
    if (undelivered_acks > 0 && cfg.retention == RetentionPolicy::kInterest &&
        stored->pending_acks.fetch_sub(undelivered_acks, std::memory_order_acq_rel) ==
            undelivered_acks) {
      stream->Retire(*stored, engine_internal::kDone);
    }
    lock.unlock();

    if (ack.streams_stored == 0 && ack.streams_duplicate == 0) ack.seq = stored->seq;
    ++ack.streams_stored;
  }

  if (mode != PublishMode::kInternal && impl_->has_outbox.load(std::memory_order_acquire)) {
    FlushOutbox();  // no stream mutex is held here
  }
  if (ack.streams_stored == 0 && ack.streams_duplicate == 0 && deferred == 0) {
    if (count_refusals) count(impl_->rejected);
    return first_refusal;
  }
  if (ack.streams_stored > 0) count(impl_->published);  // not a duplicate everywhere
  if (undelivered > 0) {  // stored (and counted), but not queued for every consumer
    return absl::CancelledError("engine closed during publish: stored as sequence " +
                                std::to_string(ack.seq) + " but not queued for " +
                                std::to_string(undelivered) + " consumer(s)");
  }
  if (impl_->flow != nullptr) {
    ack.throttle = impl_->flow->Throttle();
    ack.weight_scale = impl_->flow->WeightScale();
  }
  return ack;
}

void Engine::FlushOutbox() {
  std::deque<std::pair<StreamState*, Event>> items;
  {
    std::lock_guard lock(impl_->outbox_mu);
    items.swap(impl_->outbox);
    impl_->has_outbox.store(false, std::memory_order_release);
  }
  for (auto& [stream, e] : items) (void)Publish(std::move(e), PublishMode::kInternal, stream);
}

absl::Status Engine::SetReward(double reward) {
  if (impl_->flow == nullptr) {
    return absl::FailedPreconditionError("SetReward: the engine has no flow control "
                                         "(EngineOptions::flow_control)");
  }
  return impl_->flow->SetReward(reward);
}

namespace {

std::uint64_t CallIdOf(const Event& e) {
  std::optional<std::string_view> v = e.headers.Get(kCallIdHeader);
  std::uint64_t id = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), id).ec != std::errc()) return 0;
  return id;
}

}  // namespace

absl::Status Engine::RegisterFunction(std::string_view fn_id, FunctionHandler handler,
                                      FunctionOptions options) {
  const std::string id(fn_id);
  if (id.empty() || id.size() > 48) {
    return absl::InvalidArgumentError("function id " + QuoteValue(id) +
                                      " must have 1 to 48 characters");
  }
  if (absl::Status s = ValidateName("function", id); !s.ok()) return s;
  if (!handler) {
    return absl::InvalidArgumentError("function '" + id + "' has an empty handler");
  }
  if (options.workers == 0 || options.workers > 256) {
    return absl::InvalidArgumentError("function '" + id + "': workers " +
                                      std::to_string(options.workers) + " is outside 1..256");
  }
  if (options.queue_capacity == 0 || options.queue_capacity > (std::size_t{1} << 20)) {
    return absl::InvalidArgumentError("function '" + id + "': queue_capacity " +
                                      std::to_string(options.queue_capacity) +
                                      " is outside 1..1048576");
  }
  if (options.max_deliver < 1 || options.max_deliver > 100) {
    return absl::InvalidArgumentError("function '" + id + "': max_deliver " +
                                      std::to_string(options.max_deliver) +
                                      " is outside 1..100");
  }
  // Everything that can fail is checked before anything is added: a refused
  // registration leaves no streams behind.
  const std::size_t slots = std::bit_ceil(options.queue_capacity) * options.workers;
  if (slots > ConsumerConfig::kMaxLaneSlots) {
    return absl::InvalidArgumentError(
        "function '" + id + "': workers " + std::to_string(options.workers) +
        " x queue_capacity " + std::to_string(options.queue_capacity) + " = " +
        std::to_string(slots) + " queue slots (after rounding up to powers of two) exceed " +
        std::to_string(ConsumerConfig::kMaxLaneSlots));
  }
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    if (impl_->FindFunction(id) != nullptr) {
      return absl::AlreadyExistsError("function '" + id + "' is already registered");
    }
    for (const std::string& name : {"FN_" + id, "FN_" + id + "_DLQ"}) {
      if (impl_->FindStream(name) != nullptr) {
        return absl::AlreadyExistsError("function '" + id + "': stream '" + name +
                                        "' already exists");
      }
    }
  }
  const std::string stream = "FN_" + id;
  const std::string subject = "fn." + id;
  if (absl::Status s = AddStream({.name = stream, .subjects = {subject},
                                  .retention = RetentionPolicy::kInterest});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AddStream({.name = stream + "_DLQ", .subjects = {subject + ".dead"},
                                  .max_msgs = 10'000});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Consumer> consumer =
      AddConsumer({.stream = stream,
                   .name = "handler",
                   .members = options.workers,
                   .lane_capacity = options.queue_capacity,
                   .max_deliver = options.max_deliver,
                   .dead_letter_subject = subject + ".dead"});
  if (!consumer.ok()) return consumer.status();
  ConsumerState* state = consumer->state_;
  // The call's own timer enforces its timeout, queued or running: the consumer does
  // not also expire it by the event's ttl.
  state->enforce_event_ttl = false;
  Impl* impl = impl_.get();
  state->on_dead_letter = [impl, id](const Event& e, std::uint32_t attempt, std::string_view reason) {
    const std::uint64_t call = CallIdOf(e);
    absl::Status error;
    {
      std::lock_guard lock(impl->calls_mu);
      auto it = impl->calls.find(call);
      if (it == impl->calls.end()) return;
      const absl::Status& last = it->second.last_error;
      const std::string why = "function '" + id + "' failed after " + std::to_string(attempt) +
                              (attempt == 1 ? " try" : " tries") + " (" + std::string(reason) + ")";
      error = last.ok() ? absl::InternalError(why)
                        : absl::Status(last.code(), why + ": " + std::string(last.message()));
    }
    impl->CompleteCall(call, error);
  };
  std::lock_guard lock(impl_->config_mu);
  impl_->functions.push_back(std::make_unique<Impl::Function>());
  Impl::Function* fn = impl_->functions.back().get();
  fn->id = id;
  impl_->function_by_id.emplace(id, fn);
  for (std::uint32_t i = 0; i < options.workers; ++i) {
    impl_->function_workers.emplace_back([this, impl, fn, member = *consumer->member(i),
                                          handler]() mutable {
      for (;;) {
        absl::StatusOr<Message> m = member.Next(absl::InfiniteDuration());
        if (!m.ok()) {
          if (m.status().code() == absl::StatusCode::kCancelled) return;
          continue;
        }
        // This pull made room in the queue: calls waiting for it may go now.
        if (fn->has_backlog.load(std::memory_order_acquire)) FlushCalls(*fn);
        const std::uint64_t call = CallIdOf(m->event());
        {
          std::lock_guard calls_lock(impl->calls_mu);
          auto it = impl->calls.find(call);
          if (it == impl->calls.end()) {  // timed out (or not a call): nothing to do
            (void)m->Ack();
            continue;
          }
          it->second.running = true;
          ++it->second.attempts;
        }
        absl::StatusOr<Buffer> reply;
        try {
          reply = handler(m->event());
        } catch (const std::exception& e) {
          reply = absl::InternalError(std::string("handler threw: ") + e.what());
        } catch (...) {
          reply = absl::InternalError("handler threw a non-standard exception");
        }
        if (reply.ok()) {
          (void)m->Ack();  // first: a caller that sees the reply sees the call settled
          impl->CompleteCall(call, std::move(reply));
          continue;
        }
        bool open;
        {
          std::lock_guard calls_lock(impl->calls_mu);
          auto it = impl->calls.find(call);
          open = it != impl->calls.end();
          if (open) {
            it->second.running = false;
            it->second.last_error = reply.status();
          }
        }
        if (!open) {  // timed out (already dead-lettered) or cancelled: no more tries
          (void)m->Ack();
          continue;
        }
        (void)m->Nak();  // redelivered, or after max_deliver dead-lettered (on_dead_letter)
      }
    });
  }
  return absl::OkStatus();
}

std::future<absl::StatusOr<Buffer>> Engine::Call(std::string_view fn_id, Buffer payload,
                                                 absl::Duration timeout) {
  std::promise<absl::StatusOr<Buffer>> promise;
  std::future<absl::StatusOr<Buffer>> future = promise.get_future();
  const std::string fn(fn_id);
  if (timeout <= absl::ZeroDuration() || timeout > kMaxDuration) {
    promise.set_value(absl::InvalidArgumentError("call to function " + QuoteValue(fn) +
                                                 ": timeout " + absl::FormatDuration(timeout) +
                                                 " is invalid (> 0 and up to 365 days)"));
    return future;
  }
  Impl::Function* function;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) {
      promise.set_value(absl::CancelledError("engine is closed"));
      return future;
    }
    function = impl_->FindFunction(fn);
    if (function == nullptr) {
      promise.set_value(absl::NotFoundError("function " + QuoteValue(fn) + " is not registered"));
      return future;
    }
  }
  const std::int64_t deadline =
      engine_internal::SatAdd(impl_->clock->NowNanos(), absl::ToInt64Nanoseconds(timeout));
  std::uint64_t id;
  {
    std::lock_guard lock(impl_->calls_mu);
    id = impl_->next_call++;
    Impl::CallState& call = impl_->calls[id];
    call.promise = std::move(promise);
    call.fn = fn;
    call.payload = payload;
    call.timeout = timeout;
    call.timer = impl_->call_wheel->Schedule(deadline, id);
    impl_->has_calls.store(true, std::memory_order_release);
  }
  impl_->WakeTimer(deadline);
  // Behind the calls already waiting for room, then published if there is room now.
  {
    std::lock_guard lock(function->mu);
    function->backlog.push_back(id);
    function->has_backlog.store(true, std::memory_order_release);
  }
  FlushCalls(*function);
  return future;
}

void Engine::FlushCalls(engine_internal::FunctionState& fn) {
  // One flusher at a time keeps the arrival order. A thread that finds another
  // flushing leaves the work to it, but first counts a request: the flusher, once
  // done, flushes again when a request came meanwhile (a worker's pull may have made
  // room after the flusher found the queue full). All seq_cst: the request counted
  // before the claim attempt, the flag cleared before the requests are read.
  fn.flush_requests.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    bool idle = false;
    if (!fn.flushing.compare_exchange_strong(idle, true, std::memory_order_seq_cst)) return;
    const std::uint64_t seen = fn.flush_requests.load(std::memory_order_seq_cst);
    FlushCallsOnce(fn);
    fn.flushing.store(false, std::memory_order_seq_cst);
    if (fn.flush_requests.load(std::memory_order_seq_cst) == seen) return;
  }
}

void Engine::FlushCallsOnce(engine_internal::FunctionState& fn) {
  for (;;) {
    std::uint64_t id;
    {
      std::lock_guard lock(fn.mu);
      if (fn.backlog.empty()) {
        fn.has_backlog.store(false, std::memory_order_release);
        return;
      }
      id = fn.backlog.front();  // only this thread pops
    }
    Event e;
    bool open;
    {
      std::lock_guard lock(impl_->calls_mu);
      auto it = impl_->calls.find(id);
      open = it != impl_->calls.end();
      if (open) {
        e.subject = "fn." + fn.id;
        e.msg_id = "call-" + std::to_string(id);
        e.ttl = it->second.timeout;
        e.headers.Set(std::string(kCallIdHeader), std::to_string(id));
        e.payload = it->second.payload;  // shares the Buffer
      }
    }
    absl::Status failed;
    if (open) {
      absl::StatusOr<PublishAck> ack = Publish(std::move(e), PublishMode::kCall);
      // Full (the function's queue, or its stream held by a blocked Publish): it
      // stays first; the next pull of a worker or the next timer run retries.
      if (ack.status().code() == absl::StatusCode::kResourceExhausted &&
          !impl_->closed.load(std::memory_order_acquire)) {
        return;
      }
      failed = ack.status();
    }
    {
      std::lock_guard lock(fn.mu);
      fn.backlog.pop_front();
    }
    if (!failed.ok()) impl_->CompleteCall(id, failed);
  }
}

void Engine::Close() {
  {
    std::lock_guard lock(impl_->config_mu);
    impl_->closed.store(true, std::memory_order_release);
    for (auto& c : impl_->consumers) {
      for (auto& lane : c->lanes) lane->ring.close();
      {
        std::lock_guard slot_lock(c->slot_mu);
        c->closing.store(true, std::memory_order_release);
      }
      c->slot_cv.notify_all();
    }
  }
  {
    std::lock_guard tl(impl_->timer_mu);
    impl_->timer_stop = true;
  }
  impl_->timer_cv.notify_all();
  if (impl_->timer.joinable() && impl_->timer.get_id() != std::this_thread::get_id()) {
    impl_->timer.join();
  }
  // Every call still open fails now. Function workers are not joined here: one may
  // be in a handler that blocks; it finds its call gone when the handler returns,
  // drains its closed lane and ends (~Engine joins it).
  absl::flat_hash_map<std::uint64_t, Impl::CallState> open;
  {
    std::lock_guard lock(impl_->calls_mu);
    open.swap(impl_->calls);
  }
  for (auto& [id, call] : open) {
    call.promise.set_value(absl::CancelledError("engine closed before call " + std::to_string(id) +
                                                " to function '" + call.fn + "' completed"));
  }
}

void Engine::RunTimers() {
  if (impl_->has_outbox.load(std::memory_order_acquire)) FlushOutbox();
  {
    // Calls waiting for room in their function's queue (its workers also retry).
    std::vector<Impl::Function*> waiting;
    {
      std::lock_guard lock(impl_->config_mu);
      for (auto& f : impl_->functions) {
        if (f->has_backlog.load(std::memory_order_acquire)) waiting.push_back(f.get());
      }
    }
    for (Impl::Function* f : waiting) FlushCalls(*f);
  }
  std::lock_guard run_lock(impl_->run_timers_mu);
  // Reused between runs: a run with nothing due allocates nothing.
  std::vector<ConsumerState*>& consumers = impl_->timer_consumers;
  consumers.clear();
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load(std::memory_order_acquire)) return;
    for (auto& c : impl_->consumers) consumers.push_back(c.get());
  }
  // Calls whose timeout passed (queued or running): the caller gets DeadlineExceeded
  // and the call goes to its function's dead-letter subject.
  if (impl_->has_calls.load(std::memory_order_acquire)) {
    std::vector<Event> dead;
    {
      std::lock_guard lock(impl_->calls_mu);
      impl_->call_wheel->Advance(impl_->clock->NowNanos(), [&](std::uint64_t id, std::int64_t) {
        auto it = impl_->calls.find(id);
        if (it == impl_->calls.end()) return;
        Impl::CallState& call = it->second;
        const char* where = call.running ? "running" : "queued";
        call.promise.set_value(absl::DeadlineExceededError(
            "call " + std::to_string(id) + " to function '" + call.fn + "' timed out after " +
            absl::FormatDuration(call.timeout) + " (" + where + ", " +
            std::to_string(call.attempts) + (call.attempts == 1 ? " try)" : " tries)")));
        Event e;
        e.subject = "fn." + call.fn + ".dead";
        e.msg_id = "call-" + std::to_string(id);
        e.payload = std::move(call.payload);
        e.attempt = call.attempts;
        e.headers.Set(std::string(kCallIdHeader), std::to_string(id));
        e.headers.Set(std::string(kDeadLetterReasonHeader), "expired");
        e.headers.Set(std::string(kDeadLetterDescriptionHeader),
                      std::string("call timeout while ") + where);
        e.headers.Set(std::string(kDeliveryCountHeader), std::to_string(call.attempts));
        e.headers.Set(std::string(kOriginalSubjectHeader), "fn." + call.fn);
        e.headers.Set(std::string(kOriginalTtlHeader),
                      std::to_string(absl::ToInt64Nanoseconds(call.timeout)));
        dead.push_back(std::move(e));
        impl_->calls.erase(it);
      });
      impl_->has_calls.store(!impl_->calls.empty(), std::memory_order_release);
    }
    for (Event& e : dead) (void)Publish(std::move(e), PublishMode::kInternal);
  }
  if (impl_->flow != nullptr) {
    std::uint64_t bytes = 0;
    std::int64_t delay = 0;
    {
      std::lock_guard lock(impl_->config_mu);
      for (const auto& st : impl_->streams) {
        bytes += static_cast<std::uint64_t>(std::max<std::int64_t>(0, st->live_bytes.load()));
      }
    }
    for (ConsumerState* c : consumers) {
      for (const auto& lane : c->lanes) {
        // A lane with nothing queued has no delay now, whatever its last samples.
        if (lane->ring.size_approx() == 0) continue;
        delay = std::max(delay, lane->delay_ewma_ns.load(std::memory_order_relaxed));
      }
    }
    impl_->flow->Update(bytes, delay);
  }
  if (impl_->lifecycle != nullptr) (void)impl_->lifecycle->RunTimeouts();
  for (ConsumerState* c : consumers) {
    const std::int64_t now = impl_->clock->NowNanos();
    // 1. Due timers: deliveries whose ack wait expired (a failure of their member,
    //    redelivered or, after max_deliver, dead-lettered) and delayed redeliveries.
    struct Expired {
      engine_internal::Delivery d;
      std::uint32_t member;
      bool give_up;
    };
    std::vector<Expired> expired;
    std::vector<engine_internal::Delivery> delayed;
    if (c->has_timers.load(std::memory_order_relaxed)) {
      std::lock_guard lock(c->pending_mu);
      while (!c->timers.empty() && c->timers.front().due_ns <= now) {
        std::pop_heap(c->timers.begin(), c->timers.end(), engine_internal::TimerLater{});
        engine_internal::Timer t = std::move(c->timers.back());
        c->timers.pop_back();
        if (t.redeliver) {
          if (c->tracked) {
            // Still waiting for this attempt (an ack of an older delivery may have won).
            auto it = c->pending.find(t.seq);
            if (it == c->pending.end() || it->second.attempt != t.attempt ||
                it->second.member != kNoMember) {
              continue;
            }
          }
          delayed.push_back(std::move(*t.redeliver));
          continue;
        }
        auto it = c->pending.find(t.seq);
        // Settled, or its timer was restarted (InProgress: a later timer holds it).
        if (it == c->pending.end() || it->second.attempt != t.attempt ||
            it->second.deadline_ns != t.due_ns) {
          continue;
        }
        const std::uint32_t member = it->second.member;
        if (c->LastAttempt(t.attempt)) {
          expired.push_back({{it->second.h, t.attempt, false}, member, true});
          c->pending.erase(it);
          continue;
        }
        expired.push_back({{it->second.h, t.attempt + 1, false}, member, false});
        // Queued again for the next attempt; an ack of the expired delivery still wins.
        it->second.member = kNoMember;
        it->second.attempt = t.attempt + 1;
        it->second.deadline_ns = INT64_MAX;
      }
      c->has_timers.store(!c->timers.empty(), std::memory_order_relaxed);
    }
    for (Expired& e : expired) {
      c->ack_timeouts.fetch_add(1, std::memory_order_relaxed);
      c->Unsettle();
      c->group->OnDone(e.member, Outcome::kFailure, 0);
      if (e.give_up) {
        engine_internal::DeadLetter(*c, e.d.h, e.d.attempt, "max_deliver", "ack_wait expired");
      } else {
        engine_internal::Redeliver(*c, std::move(e.d), e.member);
      }
    }
    for (engine_internal::Delivery& d : delayed) {
      engine_internal::Redeliver(*c, std::move(d), kNoMember);
    }
    // Queue timeouts that passed while the event waited in a lane.
    if (c->has_waiting.load(std::memory_order_acquire)) {
      std::vector<Handle> timed_out;
      {
        std::lock_guard lock(c->pending_mu);
        c->wheel->Advance(now, [&](std::uint64_t seq, std::int64_t due) {
          auto it = c->waiting.find(seq);
          if (it == c->waiting.end() || it->second.state != ConsumerState::kQueued ||
              it->second.expiry_ns != due) {
            return;
          }
          if (it->second.h->state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
            c->waiting.erase(it);  // the stream dropped it: skipped when pulled, not expired
            return;
          }
          if (c->config.timeout_action == TimeoutAction::kReject) {
            it->second.state = ConsumerState::kExpired;  // skipped when pulled
            timed_out.push_back(it->second.h);
          } else {
            it->second.state = ConsumerState::kDelayed;
            c->delayed.fetch_add(1, std::memory_order_relaxed);
          }
        });
      }
      // The wheel fires a slot's timers in no particular order: dead letters go out
      // in stream order.
      std::sort(timed_out.begin(), timed_out.end(),
                [](const Handle& a, const Handle& b) { return a->seq < b->seq; });
      for (const Handle& h : timed_out) {
        c->expired.fetch_add(1, std::memory_order_relaxed);
        engine_internal::DeadLetter(*c, h, 0, "expired", "queue timeout");
      }
    }
    engine_internal::RetryParked(*c);

    // 2. Lanes whose member pulled nothing for ack_wait while work waited (stalled:
    //    each moved item is a failure). An ejected member that still pulls keeps its
    //    queue (in panic mode it is even given work).
    if (!c->tracked) continue;
    for (std::uint32_t m = 0; m < c->lanes.size(); ++m) {
      Lane& lane = *c->lanes[m];
      const std::uint64_t delivered = lane.delivered.load(std::memory_order_relaxed);
      auto& [mark_delivered, mark_ns] = impl_->stall_marks[&lane];
      bool stalled = false;
      // A consumer at max_ack_pending refuses its members new pulls: not a stall.
      const bool held_back = c->max_ack_pending > 0 &&
                             c->unsettled.load(std::memory_order_relaxed) >= c->max_ack_pending;
      if (lane.ring.size_approx() == 0 || delivered != mark_delivered || mark_ns == 0 ||
          held_back) {
        mark_delivered = delivered;
        mark_ns = lane.ring.size_approx() == 0 ? 0 : now;
      } else {
        stalled = now - mark_ns >= c->AckWaitFor(1);
      }
      if (!stalled || c->lanes.size() == 1) continue;  // one member: nowhere to move
      // At most what is queued now, and only while another member has room: what
      // cannot move stays (the loop must not push work back onto the lane it pops).
      engine_internal::Delivery d;
      for (std::size_t left = lane.ring.size_approx(); left > 0 && lane.ring.try_pop(d); --left) {
        if (d.shadow) {
          c->group->OnDone(m, Outcome::kDropped, 0);
          continue;
        }
        if (engine_internal::TryMove(*c, d, m)) {
          c->moved.fetch_add(1, std::memory_order_relaxed);
          c->group->OnDone(m, Outcome::kFailure, 0);
          continue;
        }
        // Nobody has room: back onto its lane (or parked if that filled meanwhile).
        if (!lane.ring.try_push(std::move(d))) {
          c->group->OnDone(m, Outcome::kDropped, 0);
          engine_internal::Redeliver(*c, std::move(d), m);
        }
        break;
      }
      mark_ns = 0;
    }
  }
  // The timer thread cleared its wake-up before this run: ask for the earliest
  // timer still pending (an ack wait, a delayed nak, a queue or call timeout), so
  // that one is not left to the next interval run (up to 100 ms late).
  std::int64_t next_due = INT64_MAX;
  for (ConsumerState* c : consumers) {
    std::lock_guard lock(c->pending_mu);
    if (!c->timers.empty()) next_due = std::min(next_due, c->timers.front().due_ns);
    if (!c->wheel->empty()) next_due = std::min(next_due, c->wheel->NextDeadline().value_or(INT64_MAX));
  }
  {
    std::lock_guard lock(impl_->calls_mu);
    if (!impl_->call_wheel->empty()) {
      next_due = std::min(next_due, impl_->call_wheel->NextDeadline().value_or(INT64_MAX));
    }
  }
  if (next_due != INT64_MAX) impl_->WakeTimer(next_due);
}

EngineStats Engine::Stats() const {
  EngineStats out;
  out.published = impl_->published.load(std::memory_order_relaxed);
  out.unrouted = impl_->unrouted.load(std::memory_order_relaxed);
  out.rejected = impl_->rejected.load(std::memory_order_relaxed);
  out.invalid = impl_->invalid.load(std::memory_order_relaxed);
  out.codec_conversions = impl_->codec_conversions.load(std::memory_order_relaxed);
  std::lock_guard lock(impl_->config_mu);
  for (const auto& s : impl_->streams) {
    StreamStats st;
    st.name = s->config.name;
    st.messages = static_cast<std::uint64_t>(std::max<std::int64_t>(0, s->live_msgs.load()));
    st.bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, s->live_bytes.load()));
    st.last_seq = s->last_seq.load();
    st.stored = s->stored.load();
    st.discarded = s->discarded.load();
    st.rejected = s->rejected.load();
    st.acked_out = s->acked_out.load();
    st.duplicates = s->duplicates.load();
    st.duplicate_window_evicted = s->dedup_evicted.load(std::memory_order_relaxed);
    out.streams.push_back(std::move(st));
  }
  for (const auto& c : impl_->consumers) {
    ConsumerStats cs;
    cs.stream = c->config.stream;
    cs.name = c->config.name;
    for (std::uint32_t i = 0; i < c->lanes.size(); ++i) {
      const Lane& lane = *c->lanes[i];
      MemberStats ms;
      ms.index = i;
      ms.delivered = lane.delivered.load(std::memory_order_relaxed);
      ms.queued = lane.ring.size_approx();
      cs.delivered += ms.delivered;
      cs.deliver_latency_ns.Merge(lane.deliver_latency_ns.Snapshot());
      cs.members.push_back(ms);
    }
    cs.acked = c->acked.load(std::memory_order_relaxed);
    cs.ack_pending = static_cast<std::uint64_t>(
        std::max<std::int64_t>(0, c->unsettled.load(std::memory_order_relaxed)));
    cs.skipped = c->skipped.load(std::memory_order_relaxed);
    cs.redelivered = c->redelivered.load(std::memory_order_relaxed);
    cs.ack_timeouts = c->ack_timeouts.load(std::memory_order_relaxed);
    cs.naks = c->naks.load(std::memory_order_relaxed);
    cs.moved = c->moved.load(std::memory_order_relaxed);
    cs.late_acks = c->late_acks.load(std::memory_order_relaxed);
    cs.mirrored = c->mirrored.load(std::memory_order_relaxed);
    cs.shadow_acked = c->shadow_acked.load(std::memory_order_relaxed);
    cs.terminated = c->terminated.load(std::memory_order_relaxed);
    cs.dead_letters = c->dead_letters.load(std::memory_order_relaxed);
    cs.dead_letters_lost = c->dead_letters_lost.load(std::memory_order_relaxed);
    cs.dropped = c->dropped.load(std::memory_order_relaxed);
    cs.overflow_rejected = c->overflow_rejected.load(std::memory_order_relaxed);
    cs.parked = c->parked_total.load(std::memory_order_relaxed);
    cs.expired = c->expired.load(std::memory_order_relaxed);
    cs.evicted = c->evicted.load(std::memory_order_relaxed);
    {
      std::lock_guard lock(c->pending_mu);
      cs.timers = c->timers.size();
    }
    for (std::uint32_t i = 0; i < c->lanes.size(); ++i) {
      const BatcherStats b = c->batchers[i]->Stats();
      for (std::size_t k = 0; k < kBatchSizeBuckets; ++k) {
        cs.batches_by_size[k] += b.batches_by_size[k];
        cs.batches += b.batches_by_size[k];
      }
      if (c->lanes[i]->ring.scheduled()) {
        const QosStats q = c->lanes[i]->ring.QosStatsSnapshot();
        for (std::size_t t = 0; t < kQosTiers; ++t) {
          cs.qos_tiers[t].queued += q.tiers[t].queued;
          cs.qos_tiers[t].served += q.tiers[t].served;
          cs.qos_tiers[t].served_cost += q.tiers[t].served_cost;
          cs.qos_tiers[t].floor_picks += q.tiers[t].floor_picks;
          cs.qos_tiers[t].evicted += q.tiers[t].evicted;
          cs.qos_tiers[t].refused += q.tiers[t].refused;
        }
      }
    }
    cs.delayed = c->delayed.load(std::memory_order_relaxed);
    cs.policy = std::string(c->policy->name());
    cs.group = c->group->Stats();
    cs.ack_latency_ns = c->ack_latency_ns.Snapshot();
    out.consumers.push_back(std::move(cs));
  }
  for (std::size_t i = 0; i < impl_->node_pools.size(); ++i) {
    NodeMemoryStats m;
    m.node = impl_->topology.nodes()[i].index;
    m.arena = impl_->node_binding[i];
    const engine_internal::NodePools& p = *impl_->node_pools[i];
    m.pools = {p.small.Stats(), p.medium.Stats(), p.large.Stats()};
    out.memory.push_back(std::move(m));
  }
  if (impl_->flow != nullptr) out.flow = impl_->flow->Snapshot();
  return out;
}

const StreamStats* EngineStats::stream(std::string_view name) const& {
  for (const auto& s : streams) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const ConsumerStats* EngineStats::consumer(std::string_view stream,
                                           std::string_view name) const& {
  for (const auto& c : consumers) {
    if (c.stream == stream && c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace inferq
