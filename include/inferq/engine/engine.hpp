// File: inferq/engine/engine.hpp
//
// Engine: streams, consumers and delivery inside one process (DESIGN.md §3.8).
//
// A *stream* captures every published event whose subject matches one of its subject
// patterns, numbers it (sequence from 1) and keeps it under its limits. A *consumer*
// of a stream is a group of *members*; each member has a lane (an MpmcRing of event
// handles) and pulls from it with Next / NextBatch. Every captured event that matches
// a consumer's filter and predicate goes to one member of that consumer, chosen by
// its selection policy (plus a shadow copy with WeightedShadowPolicy), so N consumers
// of a stream each see the stream once, split over their members.
// The payload is never copied: all deliveries share one Event.
//
// Usage:
//   inferq::Engine engine;
//   engine.AddStream({.name = "REQUESTS", .subjects = {"infer.*.request"}});
//   auto replicas = engine.AddConsumer(
//       {.stream = "REQUESTS", .name = "replicas", .members = 4});
//   inferq::Event e;  e.subject = "infer.llama.request";
//   absl::StatusOr<inferq::PublishAck> ack = engine.Publish(std::move(e));
//   // on replica thread i:
//   auto batch = replicas->member(i)->NextBatch(8, absl::Milliseconds(2));
//   for (inferq::Message& m : *batch) { ...; m.Ack(); }
//
// Semantics in this version (later issues deepen them, see DESIGN.md):
//  - Retention kLimits keeps messages until a limit removes the oldest; kInterest
//    also removes a message once every explicit-ack consumer that received it has
//    acked it (a message no consumer matches is not kept at all).
//  - Limits: max_msgs, max_bytes (Event::StoredSize), max_age, max_msg_size. With
//    discard kOld the oldest messages make room (and are skipped if still queued in a
//    lane: a consumer never receives a message its stream has discarded); with kNew
//    the publish is rejected for that stream.
//  - max_age is applied when the stream is written and when a member pulls an
//    event; on an idle stream an aged-out event leaves at the next write. (Queue
//    timeouts, below, do fire on a timer.)
//  - A consumer receives the events published after it was added (JetStream's
//    DeliverPolicy "new"); per stream, every member sees events in sequence order.
//  - Memory: the Event shared by all deliveries and each stream's record of it come
//    from FixedPools of the NUMA node of the first lane that will drain the event
//    (ConsumerConfig::member_nodes; else the publisher's node), with chunks from a
//    NumaArena bound to that node. Payload Buffers come from process-wide pools. In
//    steady state publish -> deliver -> ack allocates nothing from the general heap
//    (a test counts operator new), given subjects and strings short enough for the
//    small-string buffer and no header map growth.
//  - A full lane applies the consumer's OverflowPolicy: block (Publish waits until
//    the member pulls: backpressure; TryPublish refuses instead), reject, or
//    drop-oldest.
//  - Selection: each consumer has a SelectionPolicy (routing/selection.hpp; round
//    robin by default) and a MemberGroup that tracks each member's outstanding work
//    (queued + delivered, not yet acked), ack latency and health. Policies run under
//    the stream's mutex. WeightedShadowPolicy's mirrored copies go to shadow members;
//    their acks count for the member's health only, never for the message.
//  - Redelivery (ack_wait > 0): a delivery not acked within ack_wait, or nak'ed, is
//    a failure of its member and goes to a member chosen by the policy (not the same
//    one when another is eligible). A member that has work queued but pulled nothing
//    for ack_wait is stalled: its queued work is moved to other members, each item a
//    failure. Timers run on a
//    background thread (EngineOptions::manual_timers = false) or when RunTimers is
//    called. The first ack of any delivery of a message settles it (an old member's
//    late ack included; a copy still queued is then skipped); delivery is at least
//    once. Redelivery never takes the stream's mutex, so a nak or a timer run never
//    waits for a publisher blocked on a full lane.
//  - Giving up (JetStream semantics): backoff lists the ack wait per delivery;
//    max_deliver bounds the deliveries of one message; Term ends one at once. A
//    message given up goes to the consumer's dead_letter_subject with headers naming
//    the reason and delivery count (kDeadLetterReasonHeader ...). max_ack_pending
//    bounds the deliveries out, unacknowledged, per consumer.
//  - Scheduling: ConsumerConfig::batch forms NextBatch(timeout) batches (Triton's
//    dynamic batcher, adaptive window); ConsumerConfig::qos makes each lane a QoS
//    scheduler (tiers, DRR between tenants); queue_timeout / Event::ttl / deadline
//    expire queued events on a timer wheel (reject -> dead letter, or delay);
//    StreamConfig::duplicate_window drops re-published msg_ids; flow control's
//    throttle rides on every PublishAck.
//  - Function-in-flight: RegisterFunction serves a handler on engine threads;
//    Call returns a future completed by the reply, the error, or the timeout.
//  - Payload codecs (DESIGN.md §3.3): an event is stored as published (Event::codec,
//    dictionary_id). A consumer declares the codecs it accepts
//    (ConsumerConfig::accept_codecs; default: any, so it gets the payload as
//    stored). When a consumer does not accept the stored codec, Message::event()
//    gives it the event with its payload converted to its first accepted codec
//    (EngineOptions::codecs: zstd level, dictionaries). Publish converts once per
//    target codec, not once per consumer: one converted Event is shared by every
//    stream and consumer that needs that codec (EngineStats::codec_conversions counts
//    them). Conversion runs on the publishing thread before the event is stored,
//    outside the streams' mutexes (held only to read their consumers), only for
//    streams with a consumer that declares accept_codecs, and for the consumers
//    whose filter and predicate
//    match the event (both evaluated on the event as stored: a JSON content
//    predicate does not match a compressed payload). An empty payload is never
//    converted (it is the same in every codec). Limits count the payload as stored.
//
// Errors (absl::Status): InvalidArgument for bad names, subjects, patterns and
// configuration values (the message names the value); AlreadyExists for a duplicate
// stream or consumer; NotFound for an unknown stream or a subject no stream captures;
// ResourceExhausted when every capturing stream rejected a publish by its limits or
// a full lane (overflow reject, TryPublish); InvalidArgument or FailedPrecondition
// when a consumer needs the payload in another codec and it cannot be converted
// (see Engine::Publish); DeadlineExceeded when Next found
// nothing in time (or max_ack_pending left no slot); FailedPrecondition for a
// second settle of one delivery; Cancelled after Close().
//
// Thread safety: every method may be called from any thread at once. Publish takes
// the mutex of each capturing stream (never a global lock) and reads the streams'
// subject index without waiting for AddStream (a Left-Right pair of indexes: memory
// linear in the streams' patterns). Consumer, Member and Message refer into the Engine, which
// must outlive them. A Member should be drained by one thread at a time for per-
// member order, but any number of threads may call Next on it safely.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/base/clock.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/fixed_pool.hpp"
#include "inferq/memory/topology.hpp"
#include "inferq/routing/predicate.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/flow_control.hpp"
#include "inferq/sched/qos_scheduler.hpp"

namespace inferq {

class Lifecycle;

namespace engine_internal {
struct StoredMessage;
struct ConsumerState;
struct Lane;
struct StreamState;
struct FunctionState;
}  // namespace engine_internal

enum class DiscardPolicy { kOld, kNew };
enum class RetentionPolicy { kLimits, kInterest };
enum class AckPolicy { kExplicit, kNone };
// What Publish does when the lane chosen for a consumer is full (DESIGN.md §3.6).
//  kBlock       wait until the member pulls (backpressure on the publisher);
//               TryPublish refuses instead (ResourceExhausted, nothing stored).
//  kReject      refuse the publish for that stream: ResourceExhausted naming the
//               consumer and member; nothing is stored in that stream.
//  kDropOldest  drop the oldest delivery queued on that lane to make room (counted in
//               ConsumerStats::dropped; the dropped delivery is settled, not redelivered).
enum class OverflowPolicy { kBlock, kReject, kDropOldest };

// What a consumer does with an event whose queue timeout passed before a member took
// it (Triton's timeout_action): kReject gives it up (dead letter, reason "expired");
// kDelay keeps it, behind what was queued when it expired (it is moved to the back
// of its lane once).
enum class TimeoutAction { kReject, kDelay };

// Longest Event::msg_id Publish accepts, in bytes (InvalidArgument above it): ids are
// kept in duplicate windows, so their size is bounded.
inline constexpr std::size_t kMaxMsgIdBytes = 1024;

// Headers of a dead letter: the engine publishes a copy of the event (same payload,
// attributes and headers) to the consumer's dead_letter_subject with these added.
inline constexpr std::string_view kDeadLetterReasonHeader = "Inferq-Dead-Letter-Reason";
//   values: "max_deliver" (delivery max_deliver failed: nak or ack_wait expiry),
//           "term" (Message::Term), "expired" (ttl / queue timeout, action reject)
// Set with every reason: "nak" or "ack_wait expired" (max_deliver), the text given
// to Message::Term (absent when it was empty), "queue timeout" (expired), or for a
// call "call timeout while queued" / "call timeout while running".
inline constexpr std::string_view kDeadLetterDescriptionHeader = "Inferq-Dead-Letter-Description";
inline constexpr std::string_view kDeliveryCountHeader = "Inferq-Delivery-Count";  // decimal
inline constexpr std::string_view kStreamHeader = "Inferq-Stream";
inline constexpr std::string_view kConsumerHeader = "Inferq-Consumer";
inline constexpr std::string_view kStreamSeqHeader = "Inferq-Stream-Seq";        // decimal
inline constexpr std::string_view kOriginalSubjectHeader = "Inferq-Original-Subject";
// A dead letter is a new message: the original's ttl and deadline, which no longer
// apply to it (it must reach its consumer however late that consumer pulls), are
// kept as information in these headers (absent when the original had none), and the
// dead letter's own ttl is zero and its deadline absl::InfiniteFuture(). Every other
// attribute (created, msg_id, trace, ...) is kept as it was.
inline constexpr std::string_view kOriginalTtlHeader = "Inferq-Original-Ttl";  // decimal ns
// RFC 3339 in UTC with fractional seconds (absl::RFC3339_full).
inline constexpr std::string_view kOriginalDeadlineHeader = "Inferq-Original-Deadline";
// Set by Engine::Call on the call event (decimal call id).
inline constexpr std::string_view kCallIdHeader = "Inferq-Call-Id";

// A function served on engine threads (Engine::RegisterFunction). Gets the call
// event (payload, headers, ttl = the call's timeout) and returns the reply payload or
// an error; an error (or an exception, taken as kInternal) fails this try. Runs on
// one of the function's worker threads; may block. Close() does not wait for a
// running handler, ~Engine does: what a handler uses must outlive the Engine.
using FunctionHandler = std::function<absl::StatusOr<Buffer>(const Event& call)>;

struct FunctionOptions {
  std::uint32_t workers = 1;          // threads running the handler, 1..256
  std::size_t queue_capacity = 1024;  // calls queued per worker, 1..2^20
  std::int64_t max_deliver = 1;       // tries per call (a failed try is retried), 1..100
};

struct StreamConfig {
  std::string name{};                 // 1..64 of [A-Za-z0-9_-], unique in the engine
  std::vector<std::string> subjects{};  // subject patterns; at least one
  std::int64_t max_msgs = -1;         // messages kept; -1 = no limit, else > 0
  std::int64_t max_bytes = -1;        // bytes kept (Event::StoredSize); -1 or > 0
  absl::Duration max_age = absl::ZeroDuration();  // zero = no limit; never negative
  std::int64_t max_msg_size = -1;     // bytes per message; -1 or > 0
  DiscardPolicy discard = DiscardPolicy::kOld;
  RetentionPolicy retention = RetentionPolicy::kLimits;
  // Duplicate window (JetStream's): a publish whose Event::msg_id (exact bytes) this
  // stream accepted less than this long ago is acknowledged with the original
  // sequence and PublishAck::duplicate, and not stored again. The window runs from
  // the first acceptance; duplicates do not extend it. Zero = off; at most 365 days.
  // Events with an empty msg_id are never duplicates.
  absl::Duration duplicate_window = absl::Minutes(2);
  // Most ids the duplicate window holds, 1..2^26. When a new id would exceed it, the
  // oldest id is forgotten before its window ends (a later publish with it is stored
  // again) and StreamStats::duplicate_window_evicted counts it. The default holds
  // 2,000 distinct ids a second over the default 2-minute window; at about 100 bytes
  // an id (short ids; a longer id adds its length) that is 24 MiB per stream.
  std::size_t duplicate_window_max_entries = 240'000;
};

struct ConsumerConfig {
  std::string stream{};               // an existing stream
  std::string name{};                 // 1..64 of [A-Za-z0-9_-], unique in its stream
  // Pattern; empty = every event of the stream. Must overlap one of the stream's
  // subjects (SubjectPattern::Overlaps): a filter no captured subject can match is
  // refused.
  std::string filter_subject{};
  // Further condition on the event (headers, semantic tag, JSON content, JSON Schema;
  // routing/predicate.hpp); default = none. Evaluated by the publishing thread
  // under the stream's mutex; a payload that is not JSON does not match.
  Predicate predicate{};
  std::uint32_t members = 1;          // lanes in the group, 1..4096
  std::size_t lane_capacity = 1024;   // items per lane, 1..2^24 (rounded up to 2^k, min 2)
  AckPolicy ack = AckPolicy::kExplicit;
  // NUMA node (index into Topology::nodes()) of the thread that drains each member's
  // lane: events queued for it are allocated from that node's pools. Empty = unknown
  // (the publishing thread's node); else exactly `members` entries.
  std::vector<int> member_nodes{};
  // Which member serves each event. nullptr = RoundRobinPolicy. One policy object
  // per consumer: AddConsumer rejects a policy already used by another consumer.
  std::shared_ptr<SelectionPolicy> selection{};
  // Outlier ejection and load-metric settings of the member group.
  GroupOptions group{};
  // Redeliver a delivery not acked within this time (explicit ack only); zero =
  // never; at most 365 days.
  absl::Duration ack_wait = absl::ZeroDuration();
  // JetStream's BackOff: the ack wait of delivery k (1-based) is
  // backoff[min(k, size) - 1], so redeliveries can wait longer each time; replaces
  // ack_wait when not empty. Each entry > 0 and at most 365 days; at most 64 entries.
  std::vector<absl::Duration> backoff{};
  // Deliveries of one message (first + redeliveries) before it is given up: when
  // delivery max_deliver fails (nak or ack_wait expiry) the message goes to the
  // dead-letter subject instead of being redelivered. -1 = no limit, else >= 1.
  // Counted per message: a nak of one message never counts against its neighbours.
  std::int64_t max_deliver = -1;
  // Deliveries handed out and not yet settled, over all members; a pull waits while
  // the consumer is at this limit (JetStream's MaxAckPending). -1 = no limit, else
  // >= 1. Explicit ack only.
  std::int64_t max_ack_pending = -1;
  // Literal subject that dead letters are published to (see kDeadLetterReasonHeader);
  // empty = dead letters are counted (ConsumerStats::dead_letters) and dropped. A
  // dead letter is published without waiting: a full lane of its consumer keeps it
  // parked until that lane has room.
  std::string dead_letter_subject{};
  OverflowPolicy overflow = OverflowPolicy::kBlock;
  // Longest an event may wait in a lane for its first delivery (Triton's
  // default_timeout_microseconds); zero = no default. An event's ttl or deadline
  // can only lower it, never raise it (with no default they apply as given).
  // Enforced by a timer wheel when it passes, not only when the event is pulled.
  // At most 365 days.
  absl::Duration queue_timeout = absl::ZeroDuration();
  TimeoutAction timeout_action = TimeoutAction::kReject;
  // QoS tiers in each member's lane (sched/qos_scheduler.hpp): which queued event a
  // pull gets next is decided by the tier's assured share, the tiers' weights and
  // DRR between tenants (Event::qos, tenant, priority) instead of arrival order.
  // nullopt = a FIFO lock-free ring. The lane holds lane_capacity events (the
  // config's `capacity` is replaced by it); a scheduled lane takes a mutex.
  std::optional<QosConfig> qos{};
  // Payload codecs this consumer accepts, in order of preference (DESIGN.md §3.3:
  // "ask for raw, accept compressed"). Empty = any: every event is delivered with its
  // payload as stored. Otherwise an event whose Event::codec is not in the list is
  // delivered converted to accept_codecs[0]: to kNone by decompressing (the stored
  // dictionary must be in EngineOptions::codecs.dictionaries), to kZstd by
  // compressing (EngineOptions::codecs: level and dictionary). A consumer that
  // accepts kZstd accepts it with any dictionary (it decompresses with its own set).
  // Each entry a PayloadCodec, none repeated.
  std::vector<PayloadCodec> accept_codecs{};
  // How Member::NextBatch(timeout) forms batches (sched/batcher.hpp): max_batch,
  // max_queue_delay, preferred sizes, adaptive window. With `adaptive`, the observed
  // round-trip time is each acked message's deliver -> ack time.
  BatchPolicy batch{};
};

struct PublishAck {
  std::uint64_t seq = 0;              // sequence in the first stream that stored it
  std::uint32_t streams_stored = 0;   // streams that stored the event
  std::uint32_t streams_rejected = 0; // capturing streams whose limits rejected it
  std::uint32_t deliveries = 0;       // lanes the event was queued on
  // The event's msg_id was accepted within a capturing stream's duplicate window:
  // that stream (streams_duplicate counts them) did not store it again. Another
  // capturing stream may have stored it (streams_stored). `seq` is the original
  // sequence when the first capturing stream found the duplicate.
  bool duplicate = false;
  std::uint32_t streams_duplicate = 0;  // capturing streams that found it a duplicate
  // EngineOptions::flow_control: min(1, 0.6·bp + 0.4·rt), 0 = full speed, 1 = stop
  // (a producer slows down by this fraction), and 1 + 0.3·reward (Engine::SetReward),
  // a factor for the producer's own weights. 0 and 1 without flow control.
  double throttle = 0;
  double weight_scale = 1;
};

// One delivery of one stored event to one consumer member. Move-only. The settle
// methods (Ack, Nak, Term, InProgress) may be called from any thread, also two at
// once on the same Message: exactly one settle succeeds, the others get
// FailedPrecondition. Moving or destroying a Message while another thread uses it is
// a data race, as for any object. The Engine must outlive every Message it handed
// out: a debug build (no NDEBUG) aborts in ~Engine, naming the consumer, when one is
// still alive.
class Message {
 public:
  Message() noexcept;
  Message(Message&&) noexcept;
  Message& operator=(Message&&) noexcept;
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message();

  // The event; shared (not copied) with every other delivery of it. When the
  // consumer does not accept the event's payload codec (ConsumerConfig::accept_codecs)
  // it is the event converted at publish to the consumer's first accepted codec,
  // shared with every other consumer that needs that codec. Precondition: !empty().
  const Event& event() const;
  std::uint64_t stream_seq() const;
  // Engine clock (ns) when the event was stored.
  std::int64_t publish_time_ns() const;
  bool empty() const { return msg_ == nullptr; }
  // True once a settle (Ack, Nak, Term) of this delivery succeeded.
  bool acked() const { return acked_.load(std::memory_order_acquire); }

  // Which delivery of this message to its consumer this is: 1 for the first, more
  // after redeliveries (Event::attempt is the publisher's and is not changed).
  std::uint32_t attempt() const { return attempt_; }
  // True for a mirrored copy (WeightedShadowPolicy): its ack does not count for the
  // message, only for the member's health.
  bool shadow() const { return shadow_; }

  // Acknowledges the delivery. FailedPrecondition for an empty Message, a consumer
  // with AckPolicy::kNone, or a second Ack or Nak of the same delivery.
  absl::Status Ack();
  // Negative acknowledgement: the delivery failed (counted against the member's
  // health) and the message is redelivered to a member chosen by the policy, at once
  // or after `delay` (JetStream's NakWithDelay; timers run as for ack_wait). When this
  // was delivery max_deliver, the message goes to the dead-letter subject instead.
  // FailedPrecondition as for Ack, and for a shadow copy; InvalidArgument for a
  // negative or infinite delay, or one over 365 days (nothing changes).
  absl::Status Nak(absl::Duration delay = absl::ZeroDuration());
  // Terminates the message: it is never redelivered and goes to the dead-letter
  // subject with reason "term" and `description`. Does not count against the
  // member's health. FailedPrecondition as for Nak.
  absl::Status Term(std::string_view description = {});
  // Work in progress: restarts the ack_wait timer of this delivery (JetStream's
  // AckProgress), so a long task is not redelivered while its member is alive.
  // FailedPrecondition as for Ack; OK and nothing to do without ack_wait.
  absl::Status InProgress();

 private:
  friend class Member;
  friend class Engine;
  enum class Settlement { kAck, kNak, kTerm };
  absl::Status Settle(Settlement how, std::int64_t delay_ns, std::string_view description);
  std::shared_ptr<engine_internal::StoredMessage> msg_;
  engine_internal::ConsumerState* consumer_ = nullptr;
  std::int64_t deliver_ns_ = 0;
  std::uint32_t member_ = 0;
  std::uint32_t attempt_ = 0;
  bool shadow_ = false;
  // Set by the one settle that wins (an exchange), so that two threads settling the
  // same delivery cannot both succeed.
  std::atomic<bool> acked_{false};
  // Gives up this delivery's handle (its reference to the engine's pools).
  void Release() noexcept;
};

// A member of a consumer group: the puller of one lane.
class Member {
 public:
  // Waits up to `timeout` (absl::InfiniteDuration() = forever; zero = just try) for
  // the next message. DeadlineExceeded on timeout (never with an infinite timeout);
  // Cancelled once the engine is closed and the lane is drained, or at once after
  // Close while the consumer is at max_ack_pending.
  absl::StatusOr<Message> Next(absl::Duration timeout);

  // Waits up to `timeout` for a first message, then gathers more until the batch
  // holds `max_batch` (returns at once) or `max_queue_delay` has passed since the
  // first message of the batch was published (Triton's max_queue_delay: the oldest
  // request waits at most that long for company), whichever is first.
  // InvalidArgument for max_batch == 0 or a negative max_queue_delay; otherwise the
  // errors of Next for the first message. Never returns an empty batch.
  absl::StatusOr<std::vector<Message>> NextBatch(std::size_t max_batch,
                                                 absl::Duration max_queue_delay,
                                                 absl::Duration timeout = absl::InfiniteDuration());

  // Forms a batch under the consumer's BatchPolicy (Triton's dynamic batcher with
  // the adaptive window, sched/batcher.hpp): waits up to `timeout` for a first
  // message; then returns at once when the queue holds the window's worth or a
  // preferred size, else waits until the oldest message has waited the window's
  // delay and returns what is there. Events that queued while the member was busy
  // all join the next batch (up to the window). Errors as Next for the first
  // message; never returns an empty batch.
  absl::StatusOr<std::vector<Message>> NextBatch(absl::Duration timeout);

  // This member's own load, for TopologyScorePolicy (MemberGroup::ReportLoad):
  // InvalidArgument for a negative or non-finite value, or cpu above 1.
  absl::Status ReportLoad(const MemberLoadReport& report);

  std::uint32_t index() const { return index_; }
  // Events queued on this member's lane (approximate while others operate on it).
  std::size_t queued() const;

 private:
  friend class Consumer;
  Member(engine_internal::ConsumerState* c, std::uint32_t i) : consumer_(c), index_(i) {}
  // Pops until a deliverable message or the deadline (steady ns). Returns OK, or
  // DeadlineExceeded / Cancelled.
  // `now_ns`: a reading of the engine clock the caller took for this pull (a batch
  // reads it once); -1 = read it here.
  absl::Status PopOne(std::int64_t deadline_ns, Message& out, std::int64_t now_ns = -1);
  engine_internal::ConsumerState* consumer_;
  std::uint32_t index_;
};

// Handle to a consumer owned by the Engine.
class Consumer {
 public:
  // Member i of the group. OutOfRange (naming i and the group size) when
  // i >= members().
  absl::StatusOr<Member> member(std::uint32_t i) const;
  std::uint32_t members() const;
  const std::string& name() const;
  const std::string& stream() const;

 private:
  friend class Engine;
  explicit Consumer(engine_internal::ConsumerState* c) : state_(c) {}
  engine_internal::ConsumerState* state_;
};

// Latency percentiles (nearest rank) of a histogram, in the histogram's unit.
struct LatencySummary {
  std::uint64_t count = 0;
  std::uint64_t p50 = 0;
  std::uint64_t p95 = 0;
  std::uint64_t p99 = 0;
  std::uint64_t max = 0;
  static LatencySummary Of(const HistogramSnapshot& h) {
    return {h.count(), h.Percentile(0.50), h.Percentile(0.95), h.Percentile(0.99), h.max()};
  }
};

struct StreamStats {
  std::string name;
  std::uint64_t messages = 0;    // kept now
  std::uint64_t bytes = 0;       // kept now
  std::uint64_t last_seq = 0;    // last sequence assigned (0: none yet)
  std::uint64_t stored = 0;      // events accepted since creation
  std::uint64_t discarded = 0;   // removed by max_msgs / max_bytes / max_age
  std::uint64_t rejected = 0;    // publishes refused (discard new, max_msg_size)
  std::uint64_t acked_out = 0;   // removed because every interested consumer acked
  std::uint64_t duplicates = 0;  // publishes found in the duplicate window (not stored)
  // Ids forgotten before their window ended (StreamConfig::duplicate_window_max_entries).
  std::uint64_t duplicate_window_evicted = 0;
};

struct MemberStats {
  std::uint32_t index = 0;
  std::uint64_t delivered = 0;
  std::size_t queued = 0;
};

struct ConsumerStats {
  std::string stream;
  std::string name;
  std::uint64_t delivered = 0;    // handed to members by Next / NextBatch
  std::uint64_t acked = 0;
  std::uint64_t ack_pending = 0;  // deliveries out, not yet acked, nak'ed or expired
  std::uint64_t skipped = 0;      // queued but discarded by the stream before delivery
  std::uint64_t redelivered = 0;  // deliveries after an ack_wait expiry, nak or move
  std::uint64_t ack_timeouts = 0; // deliveries not acked within ack_wait
  std::uint64_t naks = 0;
  std::uint64_t moved = 0;        // queued items moved off a stalled member
  std::uint64_t late_acks = 0;    // acks after another delivery of the message won (no-ops)
  std::uint64_t mirrored = 0;     // shadow copies queued (WeightedShadowPolicy)
  std::uint64_t shadow_acked = 0;
  std::uint64_t terminated = 0;   // Term calls
  std::uint64_t dead_letters = 0; // messages given up (max_deliver, term, expired)
  std::uint64_t dead_letters_lost = 0;  // of those: no dead_letter_subject, or no stream captured it
  std::uint64_t dropped = 0;      // queued deliveries dropped by OverflowPolicy::kDropOldest
  std::uint64_t overflow_rejected = 0;  // publishes refused for a full lane (kReject, TryPublish)
  std::uint64_t parked = 0;       // deliveries that found every lane full and waited off-lane
  std::uint64_t expired = 0;      // events given up by their queue timeout (kReject)
  std::uint64_t delayed = 0;      // events whose queue timeout passed under kDelay
  std::uint64_t evicted = 0;      // queued events evicted by a higher priority (QoS preemption)
  std::uint64_t timers = 0;       // ack-wait and delayed-nak timers held (live and stale)
  // NextBatch(timeout) batches by size (log2 buckets, BatcherStats), all members.
  std::array<std::uint64_t, kBatchSizeBuckets> batches_by_size{};
  std::uint64_t batches = 0;
  // Scheduled lanes (ConsumerConfig::qos), summed over members: per tier served,
  // floor picks, evictions, refusals.
  std::array<QosTierStats, kQosTiers> qos_tiers{};
  std::string policy;             // SelectionPolicy::name()
  GroupSnapshot group;            // health, load and selection counts per member
  std::vector<MemberStats> members;
  HistogramSnapshot deliver_latency_ns;  // publish -> handed to a member
  HistogramSnapshot ack_latency_ns;      // handed to a member -> acked
  LatencySummary deliver_latency() const { return LatencySummary::Of(deliver_latency_ns); }
};

// Memory of one NUMA node: where its pools get chunks, and the pools (128, 512 and
// 2048-byte blocks: stream records, events, large events).
struct NodeMemoryStats {
  int node = 0;               // OS index
  std::string arena;          // e.g. "one node: not bound", "bound to node 1"
  std::vector<FixedPoolStats> pools;
};

struct EngineStats {
  // The application's publishes (Publish, TryPublish, Call); the engine's own dead
  // letters are counted per consumer (ConsumerStats::dead_letters,
  // dead_letters_lost), and duplicates per stream (StreamStats::duplicates).
  std::uint64_t published = 0;   // stored by at least one stream (not only duplicates)
  std::uint64_t unrouted = 0;    // no stream captured the subject (NotFound)
  std::uint64_t rejected = 0;    // every capturing stream refused (and none found a duplicate)
  std::uint64_t invalid = 0;     // an invalid subject, attribute or payload
  // Payloads converted for consumers (ConsumerConfig::accept_codecs): one per publish
  // and target codec, however many consumers and streams share the result.
  std::uint64_t codec_conversions = 0;
  std::vector<StreamStats> streams;
  std::vector<ConsumerStats> consumers;
  std::vector<NodeMemoryStats> memory;  // one per NUMA node
  std::optional<FlowSnapshot> flow;      // EngineOptions::flow_control's state
  // nullptr when absent. The pointer lives as long as this EngineStats; calling these
  // on a temporary (engine.Stats().stream(...)) does not compile, so that no pointer
  // into a destroyed snapshot can be kept.
  const StreamStats* stream(std::string_view name) const&;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&;
  const StreamStats* stream(std::string_view name) const&& = delete;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&& = delete;
};

// How the engine converts payloads for consumers (ConsumerConfig::accept_codecs).
struct EngineCodecOptions {
  // zstd level, 1..22, of conversions to kZstd without a dictionary.
  int zstd_level = 3;
  // Dictionaries that payloads published with Event::dictionary_id != 0 are
  // decompressed with (nullptr = none: such a payload cannot be converted).
  std::shared_ptr<const ZstdDictionaries> dictionaries{};
  // Conversions to kZstd compress with this dictionary of `dictionaries` (at the
  // dictionary's level); 0 = none.
  std::uint32_t compress_dictionary_id = 0;
  // Largest payload, in bytes after decompression, a conversion produces (a guard
  // against decompression bombs).
  std::size_t max_payload_bytes = std::size_t{256} << 20;
};

struct EngineOptions {
  // Clock for publish timestamps, max_age and latency statistics; nullptr = the
  // steady clock. Waiting (Next timeouts) always uses real time.
  const Clock* clock = nullptr;
  // The machine's NUMA layout; nullptr = Topology::Detect(). A synthetic topology
  // (tests) gets one set of pools per pretend node, from operator new.
  const Topology* topology = nullptr;
  // True: no background timer thread; ack_wait expiries and stalled members are
  // handled only when RunTimers() is called (tests with a ManualClock).
  bool manual_timers = false;
  // Dual-channel flow control (sched/flow_control.hpp, DESIGN.md §3.6): the memory
  // channel is the bytes all streams keep, the response-time channel the highest
  // recent publish -> deliver delay of any lane (an EWMA, alpha 1/8, per lane). The
  // timer updates them; every PublishAck carries the throttle and weight scale.
  // nullopt = off (throttle 0, weight scale 1). InvalidArgument-level values make
  // the constructor throw std::invalid_argument.
  std::optional<FlowControlConfig> flow_control{};
  // When set, the engine's timer also calls lifecycle->RunTimeouts() (warmup and
  // inference timeouts of engine/lifecycle.hpp). Must outlive the Engine.
  Lifecycle* lifecycle = nullptr;
  // Payload conversion for consumers' accept_codecs. The constructor throws
  // std::invalid_argument (naming the value) for a zstd_level outside 1..22, a
  // max_payload_bytes of 0, or a compress_dictionary_id not in `dictionaries`.
  EngineCodecOptions codecs{};
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();  // Close()s, then frees everything
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // InvalidArgument for a bad name, no subjects, a bad pattern, or a bad limit;
  // AlreadyExists for a taken name; Cancelled after Close().
  absl::Status AddStream(const StreamConfig& config);

  // InvalidArgument for a bad name, filter, member count, lane capacity, group
  // options, an accept_codecs entry that is not a PayloadCodec or is repeated, a
  // negative or infinite ack_wait, a filter_subject that no subject of the stream
  // can match, a setting that needs explicit acks (ack_wait, backoff, max_deliver,
  // max_ack_pending, dead_letter_subject) with AckPolicy::kNone (the message names
  // the field), or a selection policy already used by
  // another consumer or built for another group size; NotFound
  // for an unknown stream; AlreadyExists for a taken name; Cancelled after Close().
  absl::StatusOr<Consumer> AddConsumer(const ConsumerConfig& config);

  // Stores `event` in every stream that captures its subject and queues it for each
  // of their matching consumers. InvalidArgument for an invalid subject, ttl or qos,
  // a msg_id longer than kMaxMsgIdBytes,
  // an Event::codec that is not a PayloadCodec, or codec kNone with a dictionary_id;
  // NotFound when no stream captures it; ResourceExhausted (or InvalidArgument for
  // max_msg_size) when every capturing stream refused it, with the first refusal's
  // reason; Cancelled after Close(). Partial refusals are counted in the ack.
  // Payload conversion (ConsumerConfig::accept_codecs) is done before anything is
  // stored; when it fails nothing is stored and Publish returns FailedPrecondition
  // if the payload's dictionary is not in EngineOptions::codecs.dictionaries (the
  // message names the id), else InvalidArgument (a corrupt or truncated zstd
  // payload, a frame naming another dictionary than dictionary_id, a payload over
  // codecs.max_payload_bytes), naming the consumer and the codecs. Two exceptions
  // convert under the stream's mutex instead, and a failure there makes that stream
  // alone refuse the event (counted in PublishAck::streams_rejected, like a limit):
  // a consumer added while the publish runs, and dead letters (which never wait for
  // a stream's mutex). The conversion is made before the duplicate window is
  // checked, so a duplicate that needs one is converted (and counted) in vain.
  absl::StatusOr<PublishAck> Publish(Event event);

  // Publish that never waits: a full lane of a consumer with OverflowPolicy::kBlock
  // refuses the publish for that stream as kReject does (ResourceExhausted naming the
  // consumer and member; nothing stored there), and so does a stream whose mutex a
  // Publish blocked on a full lane holds (ResourceExhausted: "a Publish is blocked
  // on a full lane"). It may spin (yielding) while another publisher holds a
  // stream's mutex for its short critical section, never for a lane to drain.
  // Otherwise as Publish.
  absl::StatusOr<PublishAck> TryPublish(Event event);

  // Function-in-flight (DESIGN.md §3.8). RegisterFunction serves `fn_id` on
  // `options.workers` engine threads: it adds stream "FN_<fn_id>" (subject
  // "fn.<fn_id>"), its consumer "handler" (max_deliver from the options, dead letters
  // to "fn.<fn_id>.dead"), and stream "FN_<fn_id>_DLQ" on that subject (the last
  // 10,000 dead letters). fn_id: 1..48 of [A-Za-z0-9_-]. InvalidArgument for a bad
  // id or option (naming it); AlreadyExists when registered; Cancelled after Close().
  absl::Status RegisterFunction(std::string_view fn_id, FunctionHandler handler,
                                FunctionOptions options = {});
  // Calls `fn_id` with `payload`: publishes the call event (subject "fn.<fn_id>",
  // ttl = `timeout`, header kCallIdHeader) and returns a future of the reply
  // payload. The future gets: the handler's reply; or, when every try failed, the
  // last try's error (its code, the message prefixed with the function and tries);
  // or DeadlineExceeded when `timeout` passed first (queued or running; a reply
  // that comes later is dropped). Failures and timeouts also land in the
  // function's dead-letter subject (kDeadLetterReasonHeader "max_deliver" or
  // "expired"). InvalidArgument for a timeout not in (0, 365 days]; NotFound for an
  // unknown function; Cancelled when the engine closes first. The timeout runs on
  // the engine clock and its timers (RunTimers with manual_timers).
  // Call never waits: a call that finds its function's queue full (every worker's
  // queue_capacity taken) waits off the caller's thread, in arrival order, for
  // room, at most until its timeout; then its future ends DeadlineExceeded
  // ("queued", 0 tries) and the handler never sees it.
  std::future<absl::StatusOr<Buffer>> Call(std::string_view fn_id, Buffer payload,
                                           absl::Duration timeout);

  // Closes every lane: blocked publishers and pullers wake; pulls drain what is
  // queued and then return Cancelled; later publishes return Cancelled. A pull of a
  // consumer at max_ack_pending returns Cancelled at once (a closed engine hands out
  // no more than its limit, and waiting for acks that may never come would keep
  // workers from ending), naming how many events are still queued; once acks bring
  // the consumer under its limit, pulls drain those as well. Open calls
  // (Engine::Call) end Cancelled before Close returns. Close does not wait for
  // function handlers still running: their late results are dropped, and ~Engine
  // waits for them to return (a handler must not block forever). Idempotent.
  void Close();

  // Runs due timers now: redelivers deliveries whose ack_wait expired, moves work
  // off stalled members. The background thread calls it every
  // min(ack_wait) / 4 (1 ms .. 100 ms); with manual_timers, tests call it.
  void RunTimers();

  EngineStats Stats() const;

  // The reward channel of flow control, in [-1, 1] (sched/flow_control.hpp).
  // InvalidArgument outside it or NaN, and FailedPrecondition without
  // EngineOptions::flow_control; nothing changes then.
  absl::Status SetReward(double reward);

 private:
  struct Impl;
  // kWait: Publish; kTry: TryPublish; kCall: a call's event (FlushCalls: as kTry,
  // but a refusal for want of room is not counted, the call waits); kInternal: dead
  // letters (never waits, never refuses for a full lane: parks the delivery).
  enum class PublishMode { kWait, kTry, kCall, kInternal };
  // `only`: publish into that stream alone (a deferred dead letter, FlushOutbox).
  absl::StatusOr<PublishAck> Publish(Event&& event, PublishMode mode,
                                     engine_internal::StreamState* only = nullptr);
  // Publishes the dead letters that found their stream's mutex taken.
  void FlushOutbox();
  // Publishes the calls of a function that wait for room in its queue, in order,
  // until one finds it full (Engine::Call never waits).
  void FlushCalls(engine_internal::FunctionState& fn);
  void FlushCallsOnce(engine_internal::FunctionState& fn);  // by the one flusher
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq
