// File: src/engine/delivery.hpp (not API)
//
// The functions that put a delivery on a consumer's lanes (delivery.cpp: PlaceOnLane,
// for a first delivery, a redelivery and a move; Redeliver, TryMove, RetryParked on it;
// DropQueued) and that end a message for a
// consumer without an ack (settle.cpp: SettleWithoutAck; dead_letter.cpp:
// DeadLetter).
//
// Thread safety: each takes the consumer's locks it needs (select_mu, pending_mu);
// none takes a stream's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"

#include "consumer_state.hpp"

namespace inferq {
namespace engine_internal {

// Where PlaceOnLane may put a delivery. A first delivery goes to the member that
// Publish selected under the stream's mutex (so that every member sees the stream's
// order); a redelivery or a move starts at the member the consumer's selection policy
// picks now and goes round the members after it, in passes:
enum class Placement : std::uint8_t {
  kFirst,       // on `member` only, with the consumer's overflow policy (below)
  kRedelivery,  // not `member` and not ejected; then `member` if not ejected; then any
  kMove,        // not `member` and not ejected, nothing else
};
// The publisher's side of a first delivery: whether it may wait for room
// (OverflowPolicy::kBlock), and the stream's count of publishers waiting so, which
// TryPublish reads (StreamState::blocked_publishers).
struct FirstDeliveryWait {
  bool wait = false;
  std::atomic<std::uint32_t>* blocked_publishers = nullptr;
};
// The wake-ups that Engine::TryPublishBatch holds back until its last event: each
// lane a first delivery was pushed to quietly (LaneQueue::try_push_quiet), with how
// many. Lanes live as long as the engine (a deleted consumer's state is kept), so
// the pointers outlive the batch.
class DeferredWakes {
 public:
  DeferredWakes() = default;
  DeferredWakes(const DeferredWakes&) = delete;
  DeferredWakes& operator=(const DeferredWakes&) = delete;
  ~DeferredWakes() { Flush(); }
  void Add(LaneQueue<Delivery>& lane) {
    for (auto& [l, n] : lanes_) {
      if (l == &lane) {
        ++n;
        return;
      }
    }
    lanes_.emplace_back(&lane, 1);
  }
  void Flush() {
    for (auto& [l, n] : lanes_) l->wake_pullers(n);
    lanes_.clear();
  }

 private:
  absl::InlinedVector<std::pair<LaneQueue<Delivery>*, std::size_t>, 4> lanes_;
};
// The calling thread's open batch (TryPublishBatch and PublishBatch set it for their
// duration), or nullptr: a first delivery is then pushed quietly and its lane
// recorded here. A publisher holding back a wake-up never waits for the puller it
// did not wake: a placement that must wait for room flushes them first (PlaceFirst),
// and PublishBatch flushes them before it waits for another stream's mutex.
inline thread_local DeferredWakes* t_deferred_wakes = nullptr;

// Places `d` on a lane of consumer `c`, counting it queued on that member
// (MemberGroup::OnQueued). Only a first delivery on a kBlock consumer with
// `first.wait` waits for room (holding whatever the caller holds: the stream's mutex
// is the backpressure); on kDropOldest it drops the oldest queued deliveries of that
// lane until `d` fits (DropQueued); every other placement skips a full lane. Returns
// the member, or kNoMember with `d` untouched when every lane `how` allows was full
// or closed.
std::uint32_t PlaceOnLane(ConsumerState& c, Delivery& d, std::uint32_t member, Placement how,
                          FirstDeliveryWait first = {});

// Queues `d` again for consumer `c` on a member chosen by its policy, not on
// `exclude` when another lane takes it. Never blocks: a full lane is skipped and,
// when every lane is full, the delivery is parked until the next timer run.
void Redeliver(ConsumerState& c, Delivery d, std::uint32_t exclude);
// Delivery `d`, in the hands of a thread, of consumer `c` that was deleted: no lane
// will take it, and DeleteConsumer's sweep did not see it (it was neither queued,
// parked, scheduled nor tracked then), so it lets go of the stream here (interest
// retention stops waiting for `c`), unless it is a tracked consumer's redelivery,
// whose pending entry the sweep lets go of, or a first delivery whose queue timeout
// gave it up (dead-lettered then; its waiting entry stays marked kExpired after the
// sweep for this). The first form takes pending_mu; the second is called with it
// held in `pending_lock`, and may release it. Found as a parked first delivery of a
// tracked consumer, taken by RetryParked while DeleteConsumer swept: never let go.
// A first delivery of `seq` that consumer `c` will not deliver (dropped, or met a
// closed lane or a deleted consumer): its queue-timeout entry (ConsumerState::waiting)
// goes, with its timer. True when that timeout had passed already and given the
// message up (dead-lettered it, letting go of it for `c`): the caller must not let go
// a second time. Requires c.pending_mu.
bool ForgetWaiting(ConsumerState& c, std::uint64_t seq);
void LetGoDeleted(ConsumerState& c, const Delivery& d);
void LetGoDeleted(ConsumerState& c, const Delivery& d, std::unique_lock<std::mutex>& pending_lock);
// Waits until a run of the timers (Engine::RunTimers) that has consumer `c` in hand
// ends (ConsumerState::timer_run_mu): DeleteConsumer and DeleteStream, after their
// sweep. Returns at once on the timer's own thread inside that run (a tracer or
// callback that deletes the consumer whose timers run).
void AwaitTimerRun(ConsumerState& c);
// Moves `d` off stalled member `from` to another member that is not ejected and has
// room (the policy's pick first). False, with `d` untouched, when none has.
bool TryMove(ConsumerState& c, Delivery& d, std::uint32_t from);
// Retries parked redeliveries: by the timer, and by a member right after a pull has
// made room (a consumer without ack_wait has no timer). While the consumer catches
// up, queues the stored messages it started with in order, reading a file stream's
// from its backlog (ConsumerState::Backlog) as `parked` runs empty. `wait`: wait for
// the stream's mutex to read the backlog (AddConsumer); otherwise a held mutex
// leaves the rest to the next timer run, which it asks for.
void RetryParked(ConsumerState& c, bool wait = false);

// A delivery queued on lane `m` was dropped to make room (OverflowPolicy::kDropOldest).
void DropQueued(ConsumerState& c, std::uint32_t m, Delivery& d, bool evicted = false);

// AckBatch's acks of one consumer member in a row: Message::Settle (and SettleCursor)
// leave what they share here (the clock's reading, the member's health update, the
// max_ack_pending slots, the ack latency histogram) and Flush does it once for all
// of them.
struct AckRun {
  ConsumerState* consumer = nullptr;
  std::uint32_t member = 0;
  std::int64_t now = 0;  // the engine clock, read once for the run
  absl::InlinedVector<std::int64_t, 32> latencies;  // of the acks made, ns
  // For ConsumerState::ack_latency_ns (and so the acked count): every ack that
  // settled its message, also one of an older delivery, which `latencies` leaves out.
  absl::InlinedVector<std::uint64_t, 32> recorded;
  std::int64_t unsettled = 0;  // max_ack_pending slots to give back
  void Flush() {
    if (consumer == nullptr) return;
    consumer->group->OnDoneMany(member, latencies, now);
    if (unsettled > 0) consumer->Unsettle(unsettled);
    consumer->ack_latency_ns.RecordMany(recorded);
    latencies.clear();
    recorded.clear();
    unsettled = 0;
    consumer = nullptr;
  }
};

// Message `h` is done for consumer `c` without an ack (dead-lettered, or dropped by
// drop-oldest): under interest retention the stream stops waiting for this consumer.
void SettleWithoutAck(ConsumerState& c, StoredMessage& h);
// An explicit-ack consumer is done with `h` (its ack, or SettleWithoutAck): interest
// and work-queue retention stop waiting for it; a file work queue records the
// removal (the removed log's tx, for AckSync; 0 when nothing was recorded).
absl::StatusOr<std::uint64_t> RetireOnSettle(ConsumerState& c, StoredMessage& h);
// Engine::DeleteConsumer: deleted consumer `c` no longer counts for message `h`.
// Interest retention removes it when no other consumer is waited for; a work queue
// keeps it for the next consumer. No-op for limits retention and ack policy none.
void ReleaseInterest(ConsumerState& c, StoredMessage& h);

// Gives message `h` up after delivery `attempt`: a copy goes to the consumer's
// dead-letter subject with the reason headers (kDeadLetterReasonHeader, ...).
// `via`: the span id of the delivery whose settle gave it up (all zero: none, or
// not sampled), the parent of the dead_letter span when the engine traces.
// `settle`: false when the message's interest was let go of already (a deleted cursor
// consumer's sweep: CursorMayRelease).
void DeadLetter(ConsumerState& c, const Handle& h, std::uint32_t attempt,
                std::string_view reason, std::string_view description, const SpanId& via = {},
                bool settle = true);

// The records of a consumer's lifecycle that no delivery can need (lifecycle_ids.cpp),
// each expired first when live:
//  - RetireLifecycleRecords, as consumer `c` of `stream` is added (before
//    QueueStoredMessages takes c.resume): those of an earlier life of the stream or
//    of ids without one; of this life, those whose message a file stream no longer
//    stores, and the finished ones whose ack its ack log holds;
//  - ForgetConsumerRecords, as `c` is deleted: all of its records;
//  - ForgetDiscarded, as a delivery of message `seq` that the stream removed (limits,
//    max_age, a purge) is skipped: its record.
// No-ops for a consumer without a lifecycle (RetireLifecycleRecords needs one).
void RetireLifecycleRecords(StreamState& stream, ConsumerState& c);
void ForgetConsumerRecords(ConsumerState& c);
void ForgetDiscarded(ConsumerState& c, std::uint64_t seq);

}  // namespace engine_internal
}  // namespace inferq
