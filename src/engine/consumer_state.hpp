// File: src/engine/consumer_state.hpp (not API)
//
// What a consumer holds: the stored message every delivery shares (StoredMessage),
// one queued delivery (Delivery), a member's lane (Lane), the deliveries awaiting an
// ack (Pending), its timers (ConsumerTimer: ack waits, delayed redeliveries and queue
// timeouts, all on one TimerWheel), and ConsumerState itself: configuration,
// selection, ack tracking, queue timeouts, max_ack_pending slots and counters.
//
// Thread safety: each field says what guards it (pending_mu, select_mu, slot_mu, or
// an atomic).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "inferq/base/cache_line.hpp"
#include "inferq/base/clock.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/base/owned_stats.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/qos_scheduler.hpp"
#include "inferq/sched/timer_wheel.hpp"
#include "inferq/state/stream_log.hpp"
#include "lane_queue.hpp"
#include "tracer.hpp"

namespace inferq {
namespace engine_internal {

struct StreamState;
struct CursorState;  // cursor.hpp

// What a consumer needs from the engine that owns it, and nothing more: the dead
// letter builder (dead_letter.cpp) publishes through it, settlement asks it for a
// timer run, a pull lets it flush deferred dead letters. Engine::Impl implements it;
// nothing of a consumer reaches Publish any other way.
class ConsumerHost {
 public:
  // Publishes dead letter `e` without waiting (PublishMode::kInternal): a stream
  // whose mutex is taken gets it later, from the outbox. Not OK when no stream
  // captures it or the engine is closed (the caller counts it lost).
  virtual absl::Status PublishDeadLetter(Event e) = 0;
  // Asks for a timer run by `due_ns` (engine clock); no-op with manual timers.
  virtual void WakeTimer(std::int64_t due_ns) = 0;
  // Publishes the dead letters deferred to the outbox, if any: one atomic load, on
  // the pull path, when there are none. Called by a member after its pull made room.
  void FlushOutboxIfPending() {
    if (has_outbox.load(std::memory_order_acquire)) FlushOutbox();
  }
  // The outbox is not empty: set by the host when it defers a dead letter, cleared
  // when FlushOutbox takes them all.
  std::atomic<bool> has_outbox{false};

 protected:
  virtual void FlushOutbox() = 0;
  ~ConsumerHost() = default;
};

// Lifecycle of a stored message in its stream.
enum MsgState : std::uint8_t {
  kLive = 0,       // kept by the stream
  kDiscarded = 1,  // removed by a limit or max_age: queued deliveries are skipped
  kDone = 2,       // interest retention: every interested consumer acked it
};

// An event with its payload converted to each codec c, null where none is needed.
using ConvertedEvents = std::array<std::shared_ptr<const Event>, kPayloadCodecs>;

// Moves `from` into `to`, a default-constructed Event, field by field, leaving a
// string or vector of `from` that is empty alone. Event's own move moves all eight
// strings, and a short string's move copies its characters with a call to memcpy, also
// when there are none: about 28 instructions each, where most of an event's strings
// are empty. `from` is left valid (its moved fields empty, the others as they were).
// Event's fields in Event's order: a field added to Event and not here (and to
// TakeEvent) changes Event's size, which the static_assert below catches, on any
// standard library and target.
struct TakeEventFields {
  std::string subject;
  Uuid task_id;
  std::string semantic_tag;
  std::string tenant;
  Qos qos;
  std::int32_t priority;
  TraceContext trace;
  std::string model;
  std::string model_version;
  std::uint32_t schema_id;
  std::uint32_t schema_version;
  std::string msg_id;
  std::string seq_id;
  std::uint64_t seq_no;
  absl::Time created;
  absl::Time deadline;
  absl::Duration ttl;
  std::uint32_t attempt;
  std::vector<std::int64_t> shape;
  DType dtype;
  Headers headers;
  Buffer payload;
  PayloadCodec codec;
  std::uint32_t dictionary_id;
};

inline void TakeEvent(Event& to, Event& from) {
  static_assert(sizeof(Event) == sizeof(TakeEventFields), "Event changed: update TakeEvent and TakeEventFields");
  auto take = [](auto& dst, auto& src) {
    if (!src.empty()) dst = std::move(src);
  };
  take(to.subject, from.subject);
  to.task_id = from.task_id;
  take(to.semantic_tag, from.semantic_tag);
  take(to.tenant, from.tenant);
  to.qos = from.qos;
  to.priority = from.priority;
  to.trace = from.trace;
  take(to.model, from.model);
  take(to.model_version, from.model_version);
  to.schema_id = from.schema_id;
  to.schema_version = from.schema_version;
  take(to.msg_id, from.msg_id);
  take(to.seq_id, from.seq_id);
  to.seq_no = from.seq_no;
  to.created = from.created;
  to.deadline = from.deadline;
  to.ttl = from.ttl;
  to.attempt = from.attempt;
  take(to.shape, from.shape);
  to.dtype = from.dtype;
  take(to.headers, from.headers);
  to.payload = std::move(from.payload);
  to.codec = from.codec;
  to.dictionary_id = from.dictionary_id;
}

struct StoredMessage {
  StoredMessage() = default;
  // The record of the first stream that stores an event holds it (`own`), taken
  // field by field (TakeEvent).
  // flatten: the Event's move is inlined here (out of line it cost 16 more per publish).
  [[gnu::flatten]] explicit StoredMessage(Event&& e) {
    TakeEvent(own, e);
    event = &own;
  }
  // flatten: the Event's destruction is inlined here too (the record's disposal is
  // on every message's path).
  [[gnu::flatten]] ~StoredMessage() {}
  StoredMessage(const StoredMessage&) = delete;
  StoredMessage& operator=(const StoredMessage&) = delete;
  // The event, read by every delivery of it: `own`, or for the record of a later
  // stream that stored the same publish, the first stream's record's `own`, which
  // `primary` keeps. One block per publish holds the record and its event: no second
  // allocation, no second reference count, and a delivery reaches the event in the
  // block it already reads (a step towards the log slot that holds the event).
  const Event* event = nullptr;
  Event own;
  std::shared_ptr<StoredMessage> primary;
  // The event with its payload converted to codec c (ConsumerConfig::accept_codecs),
  // for the consumers that do not accept event->codec; null where no consumer needs
  // c. Made once per publish and target codec, shared by every stream and consumer.
  ConvertedEvents converted{};
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
  // Deliveries pulled: deliver_latency_ns.count(), which counts each once (a second
  // counter would cost every pull another write).
  std::uint64_t delivered() const { return deliver_latency_ns.count(); }
  alignas(kCacheLineSize) std::atomic<std::int64_t> last_pop_ns{0};  // engine clock; for stall detection
  // Recent publish -> deliver delay, ns: EWMA with alpha 1/8, written by pullers
  // (a lost update between two pullers only loses one sample); flow control reads it.
  std::atomic<std::int64_t> delay_ewma_ns{0};
  // Written by this lane's puller(s); the thread that pulls it first owns it and
  // records without a locked instruction (base/owned_stats.hpp).
  OwnedHistogram deliver_latency_ns;
  // Batches returned by either NextBatch form, by their size: [k] counts sizes in
  // [2^k, 2^(k+1)), the last bucket everything above (ConsumerStats::batches_by_size).
  std::array<std::atomic<std::uint64_t>, kBatchSizeBuckets> batch_sizes{};
  std::atomic<std::uint64_t> batched_messages{0};  // the sum of those sizes
  void CountBatch(std::size_t size) {  // size >= 1: NextBatch never returns an empty batch
    const auto k = std::min<std::size_t>(static_cast<std::size_t>(std::bit_width(size)) - 1,
                                         kBatchSizeBuckets - 1);
    batch_sizes[k].fetch_add(1, std::memory_order_relaxed);
    batched_messages.fetch_add(size, std::memory_order_relaxed);
  }
};

// The id of stream message `seq` in a consumer's lifecycle (ConsumerConfig::lifecycle):
// "<stream>/<incarnation>/<seq>" (ConsumerState::lifecycle_prefix).
inline std::string LifecycleId(const ConsumerState& c, std::uint64_t seq);
// A lifecycle expiry reason from a dead letter's reason and description: 1 to 256
// printable ASCII characters (others become '?').
inline std::string LifecycleReason(std::string_view reason, std::string_view description) {
  std::string r(reason);
  if (!description.empty()) r += ": " + std::string(description);
  if (r.size() > 256) r.resize(256);
  for (char& ch : r) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  if (r.empty()) r = "dead letter";
  return r;
}

// Deadline `ns` from `now`, saturating at INT64_MAX.
// A clock may read below zero (Clock: any fixed origin), so neither side is assumed
// non-negative (found by the adversarial helper: INT64_MAX - now overflowed).
inline std::int64_t SatAdd(std::int64_t now, std::int64_t ns) {
  std::int64_t sum;
  if (!__builtin_add_overflow(now, ns, &sum)) return sum;
  return ns > 0 ? INT64_MAX : INT64_MIN;
}

// a - b, saturating at INT64_MIN and INT64_MAX (times from a host's clock, or a
// Duration converted by absl::ToInt64Nanoseconds, may be anywhere in int64).
inline std::int64_t SatSub(std::int64_t a, std::int64_t b) {
  std::int64_t d;
  if (!__builtin_sub_overflow(a, b, &d)) return d;
  return b < 0 ? INT64_MAX : INT64_MIN;
}

// A message of a tracked consumer (ack_wait > 0) not yet acked: either out with
// `member` (delivery `attempt`, its ack wait running until `deadline_ns`), or queued
// again for delivery `attempt` (member == kNoMember) after an expiry or a nak.
// `timer` is its one timer on the consumer's wheel: the ack wait while it is out, a
// delayed redelivery after a nak with a delay, none while it is queued. Whoever
// settles, restarts or erases the entry cancels it.
struct Pending {
  Handle h;
  std::uint32_t member = 0;
  std::uint32_t attempt = 1;
  std::int64_t deadline_ns = 0;
  // The deadline `timer` is set for: <= deadline_ns. InProgress moves deadline_ns
  // only (ExtendAckWait); the timer, when it fires early, sets itself again for
  // deadline_ns (timers.cpp).
  std::int64_t armed_ns = 0;
  TimerId timer{};
};

// What a consumer's timer wheel holds, for the message of stream sequence `seq`:
// - kQueueExpiry: the queue timeout or TTL of its first delivery, still in a lane
//   (ConsumerState::waiting);
// - kAckWait: the ack wait of delivery `attempt` (tracked consumers, Pending);
// - kRedeliver: a delayed redelivery (Nak with a delay) as delivery `attempt`, of `h`.
struct ConsumerTimer {
  enum Kind : std::uint8_t { kQueueExpiry, kAckWait, kRedeliver };
  Kind kind = kQueueExpiry;
  std::uint32_t attempt = 0;
  std::uint64_t seq = 0;
  Handle h;  // kRedeliver only: an untracked consumer keeps no Pending entry
};

struct ConsumerState {
  ConsumerConfig config;
  // A cursor consumer (cursor.hpp): its members claim from this cursor, and its lanes
  // only keep their counters. Set by AddConsumer under the stream's mutex, after the
  // consumer is listed in the engine: a thread that finds it there (the timer run,
  // Stats, Close, DeleteConsumer) reads `cursor` only once has_cursor is true
  // (acquire; AttachCursor's store is release). Publishers (through the stream's
  // consumers, under its mutex) and its members (after AddConsumer) read it directly.
  std::unique_ptr<CursorState> cursor;
  std::atomic<bool> has_cursor{false};
  // seq_cst, as the store: Close (closed, then this) and AddConsumer (this, then
  // closed) each see the other's store.
  bool Cursor() const { return has_cursor.load(std::memory_order_seq_cst); }
  ~ConsumerState();
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
  // The engine that owns this consumer (set by AddConsumer before the consumer is
  // reachable); dead letters and timer wake-ups go through it.
  ConsumerHost* host = nullptr;
  // The engine's tracer (EngineOptions::trace), null when tracing is off. Set with
  // `host`.
  Tracer* tracer = nullptr;
  // Told of every message this consumer gives up, before its dead letter goes out
  // (Engine::Call completes the caller's future); false: the message has ended
  // otherwise already (a call that timed out or was cancelled meanwhile), and no dead
  // letter goes out. May be empty.
  std::function<bool(const Event&, std::uint32_t attempt, std::string_view reason)> on_dead_letter;

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
  // every timer of the consumer on one wheel (Varghese & Lauck; O(1) schedule and
  // cancel): ack waits and delayed redeliveries, cancelled when their delivery is
  // settled or restarted, and the queue timeouts of `waiting`.
  std::mutex pending_mu;
  absl::flat_hash_map<std::uint64_t, Pending> pending;       // guarded by pending_mu
  std::unique_ptr<TimerWheel<ConsumerTimer>> wheel;          // guarded by pending_mu
  std::deque<Delivery> parked;  // redeliveries every lane refused (full); pending_mu
  std::atomic<bool> has_parked{false};  // parked is not empty (read without the lock)
  // kByStartSequence: sequences up to this one are not for it (publishes included,
  // when start_seq lies beyond the stream's last message). Set before it is added.
  std::uint64_t start_after = 0;
  // The stored messages it started with are not all queued yet (RetryParked).
  std::atomic<bool> catching_up{false};
  // ReplayPolicy::kOriginal: the engine clock when the consumer was added, and the
  // publish time of the first stored message it starts with (set under retry_mu by
  // the first RetryParked; INT64_MIN until then).
  std::int64_t replay_start_ns = 0;
  std::int64_t replay_first_publish_ns = INT64_MIN;
  std::mutex retry_mu;  // held by the one thread catching up in RetryParked (try_lock only)
  // While catching up: RetryParked has taken the front of `parked` and not yet
  // queued it (or put it back). A publish parks behind it then too, though `parked`
  // may be empty: queued at once, it would overtake it. Guarded by pending_mu.
  bool catchup_in_hand = false;

  // A consumer of a file stream is durable: its ack log (a StreamLog in
  // <stream directory>/consumers/<name>) records where it started ("S <floor>": it
  // takes the stream's messages after sequence floor), each delivery ("D <seq>
  // <attempt>") and each ack or term ("A <seq>"). Adding it again replays the log:
  // every stored message after the floor that it matches and that was not acked is
  // queued again, its attempt counting on from the deliveries recorded.
  std::unique_ptr<StreamLog> ack_log;
  struct Resume {
    bool started = false;  // an "S" record was found: the consumer existed
    std::uint64_t floor = 0;
    absl::flat_hash_map<std::uint64_t, std::uint32_t> delivered;  // seq -> attempts
    absl::flat_hash_set<std::uint64_t> acked;
  };
  Resume resume;  // filled by Open, read by QueueStoredMessages (under the stream's mu)

  // kFile: the stored messages a consumer starts with are read from the stream's log
  // a chunk at a time, as its lanes take them (FillFromBacklog), not all when it is
  // added: a consumer that starts at the front of a 4 GB stream holds one chunk of
  // events in memory, not 4 GB. While the backlog is open, a publish for the
  // consumer queues nothing either (EnqueueTargets): the message is in the log, and
  // the backlog reaches it in sequence order; the backlog closes when it has read up
  // to the stream's next sequence. Guarded by the stream's mu.
  struct Backlog {
    std::uint64_t next_seq = 0;  // the next sequence to look at
    // The stream's next sequence when the consumer was added. Below it the start
    // policy chooses (start_ns, only, resume); from it on, every message is taken.
    std::uint64_t end_seq = 0;
    std::int64_t start_ns = INT64_MIN;  // kByStartTime: publish times below are skipped
    // kLast, kLastPerSubject: below end_seq, only these sequences.
    std::optional<absl::flat_hash_set<std::uint64_t>> only;
    // A restart (resume.started): below end_seq, what was acked before is skipped,
    // and what was delivered before counts on (prior_deliveries).
    Resume resume;
  };
  Backlog backlog;
  // The backlog is open: set and cleared under the stream's mu (publishers read it
  // there); RetryParked reads it without (acquire: pairs with the release stores).
  std::atomic<bool> reading_backlog{false};
  // Backlog::next_seq, for ConsumerStats::num_pending (read without the stream's mu).
  std::atomic<std::uint64_t> backlog_next_seq{0};
  // Messages delivered max_deliver times before the restart: QueueStoredMessages
  // (under the stream's mu) sets them aside; AddConsumer dead-letters them after it.
  std::vector<std::pair<Handle, std::uint32_t>> given_up_at_start;
  // Deliveries made before the restart, per sequence, added to Message::attempt();
  // pending_mu. has_prior: not empty (read without the lock).
  absl::flat_hash_map<std::uint64_t, std::uint32_t> prior_deliveries;
  std::atomic<bool> has_prior{false};
  // An untracked consumer's deliveries out with Message::attempt() > 1 (after a nak,
  // or delivered before a restart) and not yet settled: its
  // ConsumerStats::num_redelivered (a tracked one counts its pending entries).
  // Raised by the pull that hands one out, lowered by its settle; relaxed: a count.
  std::atomic<std::int64_t> redelivered_out{0};
  // "<stream>/<incarnation>/" (StreamState::incarnation): the ids of its messages in
  // its lifecycle (LifecycleId). Set when the consumer is added; constant after.
  std::string lifecycle_prefix;
  // Deliveries of `seq` before the restart (0 when none). Requires pending_mu.
  std::uint32_t PriorDeliveries(std::uint64_t seq) const {
    if (!has_prior.load(std::memory_order_acquire)) return 0;
    auto it = prior_deliveries.find(seq);
    return it == prior_deliveries.end() ? 0 : it->second;
  }
  // Drops `seq`'s count of deliveries before the restart once the message is settled
  // for good (acked, terminated, dead-lettered), so the map shrinks back to empty.
  // Requires pending_mu.
  void ForgetPrior(std::uint64_t seq) {
    if (!has_prior.load(std::memory_order_relaxed)) return;
    prior_deliveries.erase(seq);
    if (prior_deliveries.empty()) has_prior.store(false, std::memory_order_release);
  }
  // Appends a record to the ack log: its tx_id, or the log's error (the consumer is
  // then failed: FailAckLog).
  absl::StatusOr<std::uint64_t> Record(std::string_view text) {
    std::lock_guard lock(record_mu);
    if (records_closed) {
      return absl::FailedPreconditionError("consumer '" + config.name + "' of stream '" +
                                           config.stream + "' was deleted");
    }
    absl::StatusOr<StreamLog::Entry> e = ack_log->Append(text);
    if (!e.ok()) {
      FailAckLog(e.status());
      return e.status();
    }
    return e->tx;
  }
  // A failed ack log (StreamLog's failed state: a write or fdatasync error) fails the
  // consumer: its pulls return AckLogFailure() instead of delivering messages whose
  // acks could not be recorded (they would come back after every ack_wait, and again
  // after a restart). What is queued stays queued; nothing is settled. The first
  // error is kept. Any thread; ack_log_failed is read without the lock.
  // Its lanes are closed, so that a pull waiting on one wakes and reports it.
  void FailAckLog(const absl::Status& st) {
    Fail("its ack log failed (" + std::string(st.message()) + ")");
  }
  // The same for another reason `why` a durable consumer cannot go on (a stored
  // message it must deliver cannot be read back from the stream's log).
  void Fail(std::string why) {
    {
      std::lock_guard lock(failure_mu);
      if (ack_log_failed.load(std::memory_order_relaxed)) return;
      failure_why = std::move(why);
      ack_log_failed.store(true, std::memory_order_release);
    }
    for (auto& lane : lanes) lane->ring.close();
  }
  // True once the consumer failed (Fail, FailAckLog), also when its ack log failed by
  // its own background fdatasync (kInterval), which no Record saw: marks the
  // consumer failed then. Cheap: an atomic load, and
  // StreamLog::failed() (another) for a durable consumer.
  bool AckLogFailed() {
    // acquire: pairs with FailAckLog's release (the error it stored is visible).
    if (ack_log_failed.load(std::memory_order_acquire)) return true;
    if (ack_log == nullptr || !ack_log->failed()) return false;
    FailAckLog(ack_log->failure());
    return true;
  }
  absl::Status AckLogFailure() const {
    std::lock_guard lock(failure_mu);
    return absl::FailedPreconditionError(
        "consumer '" + config.name + "' of stream '" + config.stream +
        "' delivers no more: " + failure_why + "; what it did not ack is kept and comes again once the engine is restarted");
  }
  std::atomic<bool> ack_log_failed{false};
  mutable std::mutex failure_mu;
  std::string failure_why;  // failure_mu; the first failure, as Fail's `why`
  // The wheel is not empty (read without the lock; set under pending_mu by whoever
  // schedules, cleared by the timer run that empties it).
  std::atomic<bool> has_timers{false};

  // Schedules `t` at `due_ns` (engine clock). Requires pending_mu.
  TimerId Schedule(std::int64_t due_ns, ConsumerTimer t) {
    const TimerId id = wheel->Schedule(due_ns, std::move(t));
    has_timers.store(true, std::memory_order_release);
    return id;
  }
  // Restarts the ack wait of pending entry `p` at `deadline_ns` for its delivery,
  // cancelling the timer it had. Requires pending_mu.
  void ArmAckWait(std::uint64_t seq, Pending& p, std::int64_t deadline_ns) {
    wheel->Cancel(p.timer);
    p.deadline_ns = deadline_ns;
    p.armed_ns = deadline_ns;
    p.timer = Schedule(deadline_ns, {ConsumerTimer::kAckWait, p.attempt, seq, nullptr});
  }
  // Moves the ack wait of `p`'s running delivery to `deadline_ns` (InProgress). A
  // later deadline only moves deadline_ns: the timer set for the earlier one finds
  // it moved when it fires and sets itself again, so a member that reports progress
  // on every step of a long job costs a hash lookup, not a cancel and a schedule
  // per report (the lazy timer of Netty's IdleStateHandler and of TCP keepalive).
  // An earlier one re-arms. Requires pending_mu.
  void ExtendAckWait(std::uint64_t seq, Pending& p, std::int64_t deadline_ns) {
    if (p.timer != TimerId{} && deadline_ns >= p.armed_ns) {
      p.deadline_ns = deadline_ns;
      return;
    }
    ArmAckWait(seq, p, deadline_ns);
  }

  // Queue timeouts (ConsumerConfig::queue_timeout, Event::ttl / deadline) of first
  // deliveries still in a lane, by stream sequence; the wheel fires them when they
  // pass (kQueueExpiry). A popped delivery cancels its timer. Guarded by pending_mu.
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
  // Pullers inside ReserveSlot's wait (counted under slot_mu); Unsettle notifies
  // slot_cv only when it reads one or more.
  std::atomic<std::uint32_t> slot_waiters{0};
  std::atomic<bool> closing{false};
  // Engine::DeleteConsumer ran (set before its lanes close; never cleared).
  std::atomic<bool> deleted{false};
  // DeleteConsumer swept what the consumer held (guarded by pending_mu): a delivery
  // that would be parked, scheduled or tracked after that lets go of the stream
  // instead (ReleaseInterest), since nothing would ever sweep it again.
  bool retired = false;
  // Held by the timer thread while it runs this consumer's timers (Engine::RunTimers):
  // what a run takes off the wheel or out of `parked` is in its hands until the run
  // ends, and DeleteConsumer waits for that end (AwaitTimerRun), so that what
  // the deleted consumer held has let go of the stream when it returns.
  std::mutex timer_run_mu;
  // Ack log records are written under record_mu; DeleteConsumer sets records_closed
  // before it removes the log's directory, so that no record (nor a new segment)
  // of a deleted consumer lands where a later consumer of the name keeps its log.
  std::mutex record_mu;
  bool records_closed = false;  // guarded by record_mu

  // The consumer's counts (ConsumerStats copies them with ForEachCount), on their
  // own cache lines: every thread that settles or delivers writes them.
  alignas(kCacheLineSize) ConsumerCounts<std::atomic<std::uint64_t>> counts;
  // Member::NextBatch(timeout): one batcher per member (ConsumerConfig::batch).
  std::vector<std::unique_ptr<Batcher>> batchers;
  // Explicit-ack deliveries handed out and not yet settled (ack, nak, expiry):
  // Unsettled(). With max_ack_pending, in `unsettled`, the slots ReserveSlot takes;
  // without, a statistic only, in `unsettled_out` (no locked instruction for its owner).
  std::atomic<std::int64_t> unsettled{0};
  OwnedCounter unsettled_out;
  // A delivery handed out without a reserved slot (CountOut), and the count read.
  void CountOut() {
    if (max_ack_pending > 0) {
      unsettled.fetch_add(1, std::memory_order_relaxed);
    } else {
      unsettled_out.Add(1);
    }
  }
  std::int64_t Unsettled() const { return unsettled.load(std::memory_order_relaxed) + unsettled_out.Load(); }
  // Delivery-to-ack times, one per ack that settled its message: its count() is
  // ConsumerStats::acked (counts.acked stays 0), so an ack updates one statistic.
  // The first thread to ack owns it and records without a locked instruction.
  OwnedHistogram ack_latency_ns;

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
      // Counted as a waiter before it reads the count (seq_cst, with Unsettle's
      // decrement and load: of the two, at least one sees the other's write), and
      // until it lets go of slot_mu for good.
      slot_waiters.fetch_add(1, std::memory_order_seq_cst);
      const Slot s = WaitForSlot(lock, deadline_ns);
      slot_waiters.fetch_sub(1, std::memory_order_relaxed);
      if (s != Slot::kTaken) return s;
      cur = unsettled.load(std::memory_order_acquire);
    }
  }
  // `n` deliveries were settled (or reserved slots not used). Wakes waiting pullers
  // only when there are any (slot_waiters): a settle with nobody waiting takes no
  // lock.
  void Unsettle(std::int64_t n = 1) {
    if (max_ack_pending <= 0) {
      unsettled_out.Add(-n);
      return;
    }
    unsettled.fetch_sub(n, std::memory_order_seq_cst);
    if (max_ack_pending > 0 && slot_waiters.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lock(slot_mu);  // no lost wake-up between check and wait
      slot_cv.notify_all();
    }
  }
  // ReserveSlot's wait under slot_mu: kTaken when a slot may be free (the caller
  // tries again), kClosed or kTimeout as ReserveSlot says.
  Slot WaitForSlot(std::unique_lock<std::mutex>& lock, std::int64_t deadline_ns) {
    if (unsettled.load(std::memory_order_seq_cst) < max_ack_pending) return Slot::kTaken;
    if (closing.load(std::memory_order_acquire)) return Slot::kClosed;
    if (deadline_ns <= SteadyClock::Now()) return Slot::kTimeout;
    if (deadline_ns == kNoDeadline) {
      slot_cv.wait(lock);
    } else {
      slot_cv.wait_for(lock, std::chrono::nanoseconds(deadline_ns - SteadyClock::Now()));
    }
    return Slot::kTaken;
  }
};

inline std::string LifecycleId(const ConsumerState& c, std::uint64_t seq) {
  return c.lifecycle_prefix + std::to_string(seq);
}

}  // namespace engine_internal
}  // namespace inferq
