/// @file inferq/engine/message.hpp
///
/// What a consumer's member thread holds (pull, then settle each message): Consumer, the
/// handle Engine::AddConsumer returns; Member, the puller of one lane (Next,
/// NextBatch); Message, one delivery, settled with Ack / Nak / Term / InProgress; and
/// the headers the engine sets on the dead letters it publishes.
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::Consumer> c = engine->AddConsumer({...});
///   absl::StatusOr<inferq::Member> m = c->member(0);
///   absl::StatusOr<inferq::Message> msg = m->Next(absl::Seconds(1));
///   if (msg.ok()) { Use(msg->event()); msg->Ack(); }
/// @endcode
///
/// Thread safety: Consumer and Member are cheap handles into the Engine, which must
/// outlive them and every Message. Any number of threads may call Next on one Member
/// (one thread at a time keeps per-member order). A Message's settle methods may be
/// called from any thread, two at once included (see Message).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/event/event.hpp"
#include "inferq/routing/selection.hpp"

namespace inferq {

namespace engine_internal {
struct StoredMessage;
struct CursorEntry;
struct ConsumerState;
class Tracer;
struct AckRun;
struct CursorRun;
}  // namespace engine_internal

class Message;
/// Acks each Message of `messages`, in order, as Message::Ack does. What the acks of
/// one consumer member in a row share is done once for them: one reading of the
/// engine clock (their ack latencies end there), one update of the member's health
/// and latency estimates, one release of their max_ack_pending slots and one change
/// of the consumer's counts. OK when every one was acked. Otherwise each one that
/// could be acked was, and the status is the first failure's (the code and message
/// Message::Ack gives it: FailedPrecondition for an empty Message, a second settle, a
/// consumer with ack policy none or deleted, ...) with " (message i of the batch; k
/// of its n acks failed)" added (i from 0). OK for an empty span.
absl::Status AckBatch(std::span<Message> messages);

/// Headers of a dead letter: the engine publishes a copy of the event (same payload,
/// attributes and headers) to the consumer's dead_letter_subject with these added.
/// A function call refused by FunctionOptions::admit or ended by its timeout
/// (Engine::Call) is dead-lettered by the engine itself, to "fn.<fn_id>.dead", with
/// the reason, description, delivery count (the tries made), original subject,
/// kOriginalTtlHeader (the call's timeout) and kCallIdHeader, and no stream, consumer
/// or sequence header; a call whose max_deliver tries failed is its consumer's dead
/// letter, as above.
inline constexpr std::string_view kDeadLetterReasonHeader = "Inferq-Dead-Letter-Reason";
///<  values: "max_deliver" (delivery max_deliver failed: nak or ack_wait expiry, or
///<          the deliveries made before a restart reached it), "term" (Message::Term,
///<          and a delivery the consumer's lifecycle terminates), "expired" (ttl /
///<          queue timeout, action reject; a call's timeout), "refused" (a call
///<          FunctionOptions::admit refused)

/// The description of the reason: "nak", "ack_wait expired" or "delivered N times
/// before a restart" (max_deliver); the text given to Message::Term (the header is
/// absent when it was empty), or "lifecycle: <error>" for a delivery the consumer's
/// lifecycle terminates (the lifecycle's error enqueueing it, or "expired (<its
/// reason>)"); "queue timeout" (expired); for a call "call timeout while queued",
/// "call timeout while running" or "call timeout during admission" (expired), or the
/// admission error's message (refused).
inline constexpr std::string_view kDeadLetterDescriptionHeader = "Inferq-Dead-Letter-Description";
inline constexpr std::string_view kDeliveryCountHeader = "Inferq-Delivery-Count";  ///< decimal
inline constexpr std::string_view kStreamHeader = "Inferq-Stream";      ///< the stream's name
inline constexpr std::string_view kConsumerHeader = "Inferq-Consumer";  ///< the consumer's name
inline constexpr std::string_view kStreamSeqHeader = "Inferq-Stream-Seq";        ///< decimal
inline constexpr std::string_view kOriginalSubjectHeader = "Inferq-Original-Subject";  ///< the event's subject
/// A dead letter is a new message: the original's ttl and deadline, which no longer
/// apply to it (it must reach its consumer however late that consumer pulls), are
/// kept as information in these headers (absent when the original had none), and the
/// dead letter's own ttl is zero and its deadline absl::InfiniteFuture(). Its
/// Event::attempt is the delivery count; when the engine traces, its trace is the
/// dead_letter span's context (engine/trace.hpp); a call's own dead letter has msg_id
/// "call-<call id>". Every other attribute (created, msg_id, ...) is kept as it was.
inline constexpr std::string_view kOriginalTtlHeader = "Inferq-Original-Ttl";  ///< decimal ns
/// RFC 3339 in UTC with fractional seconds (absl::RFC3339_full).
inline constexpr std::string_view kOriginalDeadlineHeader = "Inferq-Original-Deadline";
/// Set by Engine::Call on the call event (decimal call id).
inline constexpr std::string_view kCallIdHeader = "Inferq-Call-Id";

/// One delivery of one stored event to one consumer member. Move-only. The settle
/// methods (Ack, Nak, Term, InProgress) may be called from any thread, also two at
/// once on the same Message: exactly one settle succeeds, the others get
/// FailedPrecondition. Moving or destroying a Message while another thread uses it is
/// a data race, as for any object. The Engine must outlive every Message it handed
/// out: a debug build (no NDEBUG) aborts in ~Engine, naming the consumer, when one is
/// still alive.
class Message {
 public:
  Message() noexcept;
  /// Moves the delivery; the moved-from Message is left empty(). The assignment
  /// first gives up the delivery this one held, without settling it.
  ///@{
  Message(Message&&) noexcept;
  Message& operator=(Message&&) noexcept;
  ///@}
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message();

  /// The event; shared (not copied) with every other delivery of it. When the
  /// consumer does not accept the event's payload codec (ConsumerConfig::accept_codecs)
  /// it is the event converted at publish to the consumer's first accepted codec,
  /// shared with every other consumer that needs that codec. Precondition: !empty().
  const Event& event() const;
  /// The sequence the stream stored the event under. Precondition: !empty().
  std::uint64_t stream_seq() const;
  /// Engine clock (ns) when the event was stored.
  std::int64_t publish_time_ns() const;
  /// True for a default-constructed or moved-from Message.
  bool empty() const { return msg_ == nullptr; }
  /// True once a settle (Ack, Nak, Term) of this delivery succeeded.
  bool acked() const { return acked_.load(std::memory_order_acquire); }

  /// Which delivery of this message to its consumer this is: 1 for the first, more
  /// after redeliveries (Event::attempt is the publisher's and is not changed).
  /// On a file stream (a durable consumer) the count goes on across restarts: the
  /// deliveries made before are recorded in the consumer's ack log.
  std::uint32_t attempt() const { return attempt_ + prior_; }
  /// True for a mirrored copy (WeightedShadowPolicy): its ack does not count for the
  /// message, only for the member's health.
  bool shadow() const { return shadow_; }
  /// This delivery's trace context: the event's trace-id and flags with the span id
  /// of this delivery's "deliver" span (engine/trace.hpp) when the engine traces and
  /// the event is sampled; otherwise the event's trace as stored. A member makes its
  /// own spans children of it, and sets it as the trace of what it publishes in
  /// reply (Event::trace), so the trace follows the work. Precondition: !empty().
  TraceContext trace() const;

  /// Acknowledges the delivery. FailedPrecondition for an empty Message, a consumer
  /// with AckPolicy::kNone, a second settle (Ack, Nak or Term) of the same Message,
  /// whichever threads race, or a consumer deleted since (Engine::DeleteConsumer:
  /// "cannot ack message N: consumer 'c' of stream 'S' was deleted"). A late settle of a delivery whose ack_wait
  /// expired is OK: its Ack settles the message unless another delivery's ack did
  /// first (then it is a no-op); its Nak or Term changes nothing, the newer delivery
  /// decides. Settles still work after Engine::Close (an Ack frees its
  /// max_ack_pending slot, so what is queued drains).
  absl::Status Ack();
  /// Ack that returns once the ack is durable (JetStream's double ack, AckSync): on a
  /// file stream, recorded in the consumer's ack log under the stream's sync policy
  /// (fdatasync'ed with kEveryCommit and kGroupCommit); on a memory stream as Ack.
  /// A plain Ack of a file stream's message is written to the OS before it returns
  /// (it survives a crash of the process, not a power loss). Errors as Ack, and the
  /// ack log's write or fdatasync error (the ack is then not durable: after a
  /// restart the message may come again).
  absl::Status AckSync();
  /// Negative acknowledgement: the delivery failed (counted against the member's
  /// health) and the message is redelivered to a member chosen by the policy, at once
  /// or after `delay` (JetStream's NakWithDelay; timers run as for ack_wait). When this
  /// was delivery max_deliver, the message goes to the dead-letter subject instead.
  /// FailedPrecondition as for Ack, and for a shadow copy; InvalidArgument for a
  /// negative or infinite delay, or one over 365 days (nothing changes).
  absl::Status Nak(absl::Duration delay = absl::ZeroDuration());
  /// Terminates the message: it is never redelivered and goes to the dead-letter
  /// subject with reason "term" and `description`. Does not count against the
  /// member's health. FailedPrecondition as for Nak.
  absl::Status Term(std::string_view description = {});
  /// Work in progress: restarts the ack-wait timer of this delivery (JetStream's
  /// AckProgress; deadline = now + its ack wait: ack_wait, or its backoff entry), so a
  /// long task is not redelivered while its member is alive. FailedPrecondition as for
  /// Ack (an empty Message, AckPolicy::kNone, a delivery already settled, a consumer
  /// deleted since). OK with nothing done when there is no timer to restart: the
  /// consumer has neither ack_wait nor backoff, the Message is a shadow copy, or this
  /// delivery's ack wait already expired (the message was queued again, given up, or
  /// settled by another delivery).
  absl::Status InProgress();

 private:
  friend class Member;
  friend class Engine;
  friend absl::Status AckBatch(std::span<Message> messages);
  enum class Settlement { kAck, kNak, kTerm };
  /// A settle by the member (Ack, AckSync, Nak, Term): through the lifecycle, and
  /// traced (the deliver and settle spans) when the engine traces.
  absl::Status Settle(Settlement how, std::int64_t delay_ns, std::string_view description);
  /// through_lifecycle false: the consumer's lifecycle (ConsumerConfig::lifecycle)
  /// has decided already (Member's delivery step), so Ack does not Complete it and
  /// Nak does not Requeue it.
  absl::Status Settle(Settlement how, std::int64_t delay_ns, std::string_view description,
                      bool through_lifecycle);
  /// AckSync's second half: waits for the ack log's (and a file work queue's) sync.
  absl::Status SyncAck();
  /// Settle's part for a delivery of a cursor consumer (engine/cursor.cpp), after the
  /// settle won and was counted; `now` and `latency` as Settle read them; `run`: the
  /// AckBatch's run this ack defers its shared parts to (nullptr: none).
  absl::Status SettleCursor(Settlement how, std::int64_t delay_ns, std::string_view description,
                            std::int64_t now, std::int64_t latency, engine_internal::AckRun* run);
  /// Forgets the message's record in the consumer's lifecycle, if it has one (its
  /// ack is final: no delivery of it can come again).
  void ForgetLifecycleRecord();
  /// EngineOptions::trace: the deliver span (when `settled`, sampled) and the settle's
  /// own span (sampled, or `st` an error) of a settle that began at `start`.
  void TraceSettle(engine_internal::Tracer& tracer, Settlement how, std::int64_t start, bool sampled,
                   bool settled, const absl::Status& st, std::string_view description);
  /// FailedPrecondition: "cannot <verb> message N: consumer 'c' of stream 'S' was deleted".
  absl::Status Deleted(std::string_view verb) const;
  std::shared_ptr<engine_internal::StoredMessage> msg_;
  engine_internal::ConsumerState* consumer_ = nullptr;
  std::int64_t deliver_ns_ = 0;
  std::uint32_t member_ = 0;
  std::uint32_t attempt_ = 0;
  std::uint32_t prior_ = 0;     ///< deliveries before a restart (durable consumers)
  std::uint64_t ack_tx_ = 0;    ///< the ack's record in the consumer's ack log (AckSync)
  std::uint64_t out_tx_ = 0;    ///< a file work queue's record of the removal (AckSync)
  bool shadow_ = false;
  /// A cursor consumer's delivery of an entry that holds its record, acked: the
  /// consumer's count in the entry (CursorEntry::remaining) goes with this Message's
  /// own at Release, one subtraction for both.
  bool cursor_done_owed_ = false;
  /// A cursor consumer's delivery: the pin on its stream's log segment
  /// (MessageLog::Ref::Detach) and the log entry it keeps readable; null otherwise.
  void* cursor_pin_ = nullptr;
  engine_internal::CursorEntry* cursor_entry_ = nullptr;
  /// The "deliver" span's id (all zero: not traced) and the size of the NextBatch
  /// batch this came in (0: Next), for its span.
  std::array<std::uint8_t, 8> span_id_{};
  std::uint32_t batch_ = 0;
  /// Set by the one settle that wins (an exchange), so that two threads settling the
  /// same delivery cannot both succeed.
  std::atomic<bool> acked_{false};
  /// Gives up this delivery's handle (its reference to the engine's pools).
  void Release() noexcept;
  /// A pull's delivery: gives up what this Message held (Release), then makes it
  /// delivery `attempt` of `msg` to member `member` of `consumer` at `now` (engine
  /// clock, ns), unsettled, untraced, not in a batch, with no ack-log records.
  void Deliver(std::shared_ptr<engine_internal::StoredMessage> msg, engine_internal::ConsumerState* consumer,
               std::uint32_t member, std::uint32_t attempt, std::int64_t now, bool shadow);
};

/// A member of a consumer group: the puller of one lane.
class Member {
 public:
  /// Waits up to `timeout` (absl::InfiniteDuration() = forever; zero = just try) for
  /// the next message. DeadlineExceeded on timeout (never with an infinite timeout);
  /// Cancelled once the engine is closed and the lane is drained, or at once after
  /// Close while the consumer is at max_ack_pending. FailedPrecondition for a durable
  /// consumer (of a file stream) whose ack log failed, at once and for a pull that
  /// was waiting, before any of these: it delivers no more in this engine (what it
  /// did not ack comes again after a restart).
  absl::StatusOr<Message> Next(absl::Duration timeout);

  /// Waits up to `timeout` for a first message, then gathers more until the batch
  /// holds `max_batch` (returns at once) or `max_queue_delay` has passed since the
  /// first message of the batch was published (Triton's max_queue_delay: the oldest
  /// request waits at most that long for company), whichever is first.
  /// InvalidArgument for max_batch == 0 or a negative max_queue_delay; otherwise the
  /// errors of Next for the first message. Never returns an empty batch.
  absl::StatusOr<std::vector<Message>> NextBatch(std::size_t max_batch,
                                                 absl::Duration max_queue_delay,
                                                 absl::Duration timeout = absl::InfiniteDuration());

  /// NextBatch(out.size(), max_queue_delay, timeout) into the caller's memory: the
  /// batch goes to out[0], out[1], ... and the count is returned (at least 1); no
  /// vector is made, and the messages of one batch share one reading of the clock
  /// for those that were queued already. A Message in `out` that is overwritten is
  /// given up as by its move assignment (not settled); those after the count are left
  /// as they were. Errors as the other form (InvalidArgument for an empty `out`).
  /// @code
  ///   std::array<inferq::Message, 32> batch;
  ///   absl::StatusOr<std::size_t> n = member.NextBatch(batch, absl::Milliseconds(2));
  ///   if (n.ok()) { ...; inferq::AckBatch(std::span(batch).first(*n)); }
  /// @endcode
  absl::StatusOr<std::size_t> NextBatch(std::span<Message> out, absl::Duration max_queue_delay,
                                        absl::Duration timeout = absl::InfiniteDuration());

  /// Forms a batch under the consumer's BatchPolicy (Triton's dynamic batcher with
  /// the adaptive window, sched/batcher.hpp): waits up to `timeout` for a first
  /// message; then returns at once when the queue holds the window's worth or a
  /// preferred size, else waits until the oldest message has waited the window's
  /// delay and returns what is there. Events that queued while the member was busy
  /// all join the next batch (up to the window). Errors as Next for the first
  /// message; never returns an empty batch.
  absl::StatusOr<std::vector<Message>> NextBatch(absl::Duration timeout);

  /// This member's own load, for TopologyScorePolicy (MemberGroup::ReportLoad):
  /// InvalidArgument for a negative or non-finite value, or cpu above 1.
  absl::Status ReportLoad(const MemberLoadReport& report);

  /// The member's index in its consumer group, from 0.
  std::uint32_t index() const { return index_; }
  /// Events queued on this member's lane (approximate while others operate on it).
  std::size_t queued() const;

 private:
  friend class Consumer;
  Member(engine_internal::ConsumerState* c, std::uint32_t i) : consumer_(c), index_(i) {}
  /// Pops until a deliverable message or the deadline (steady ns). Returns OK, or
  /// DeadlineExceeded / Cancelled.
  /// `now_ns`: a reading of the engine clock the caller took for this pull (a batch
  /// reads it once); -1 = read it here.
  /// `describe`: false for a pull that fills a batch, whose end is no error: its
  /// DeadlineExceeded (and Cancelled) then come without a message (no string built).
  /// `quiet_pops`: for a try (deadline_ns 0) in a batch, the pop wakes no publisher
  /// blocked on the full lane and counts itself here instead; the batch wakes them
  /// once (LaneQueue::wake_pushers) when it ends and before it waits.
  /// `run`: a batch's claim on a cursor consumer (GatherBatch): the pull delivers
  /// what the batch claimed before it claims again, and claims up to `run->want`
  /// sequences at once; nullptr: one at a time.
  /// PopOne for a cursor consumer (engine/cursor.cpp): what `run` holds, else a due
  /// redelivery, else the next sequence its cursor claims, waiting for one until
  /// `deadline_ns`.
  /// Compiled (engine/cursor.cpp) once for a batch's pulls (kRun: `run` is not null)
  /// and once for single pulls, which then pay nothing for the run.
  template <bool kRun>
  absl::Status PopCursor(std::int64_t deadline_ns, Message& out, std::int64_t now_ns, bool describe,
                         engine_internal::CursorRun* run);
  absl::Status PopOne(std::int64_t deadline_ns, Message& out, std::int64_t now_ns = -1, bool describe = true,
                      std::size_t* quiet_pops = nullptr, engine_internal::CursorRun* run = nullptr);
  /// Both NextBatch(max_batch, max_queue_delay, timeout) forms (pull.cpp): pulls
  /// into slots(i) for i = 0, 1, ... until the batch is full or closed; commit(i)
  /// after a pull into slots(i) succeeded, drop() when it failed. The count, or the
  /// first pull's error.
  template <class Slots, class Commit, class Drop>
  absl::StatusOr<std::size_t> GatherBatch(std::size_t max_batch, absl::Duration max_queue_delay,
                                          absl::Duration timeout, Slots&& slots, Commit&& commit,
                                          Drop&& drop);
  /// ConsumerConfig::lifecycle's delivery step for `m`, just popped: true to hand it
  /// out (now Processing); false when it was settled instead (put back while its
  /// model warms up, terminated, or acked because its lifecycle says Completed).
  bool ThroughLifecycle(Message& m);
  /// EngineOptions::trace: gives `m` (just delivered at `now`) its deliver span id
  /// and reports its queue_wait span (a first delivery of a sampled event).
  void TraceDelivery(Message& m, std::int64_t now);
  engine_internal::ConsumerState* consumer_;
  std::uint32_t index_;
};

/// Handle to a consumer owned by the Engine.
class Consumer {
 public:
  /// Member i of the group. OutOfRange (naming i and the group size) when
  /// i >= members().
  absl::StatusOr<Member> member(std::uint32_t i) const;
  /// Number of members (ConsumerConfig::members).
  std::uint32_t members() const;
  /// The consumer's name.
  const std::string& name() const;
  /// The name of its stream.
  const std::string& stream() const;

 private:
  friend class Engine;
  explicit Consumer(engine_internal::ConsumerState* c) : state_(c) {}
  engine_internal::ConsumerState* state_;
};

}  // namespace inferq
