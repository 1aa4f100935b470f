// File: src/engine/cursor.hpp (not API)
//
// Cursor consumers: the engine-core redesign's consumer, wired into the engine for
// the configurations it covers so far (CursorEligible). A memory stream that has
// one keeps a log of its stored messages in sequence order (StreamCursors: a
// MessageLog of CursorEntry, each holding the message's record and the mask of the
// cursor consumers whose filter matched at publish), appended once per publish
// however many cursor consumers take it. A cursor consumer does not queue
// deliveries on lanes: its members claim sequences from its GroupCursor, an ack sets
// a bit, and what leaves the window (naks, InProgress, ack_wait expiries) waits in
// the cursor's overflow map. The records, retention, dead letters and counters are
// the engine's as for lane consumers, so the two kinds answer the same (the
// differential test runs both).
//
// Where a record is: a message that only cursor consumers of one memory stream take,
// on a stream that keeps no index of its own (interest retention without limits),
// is held in its log entry itself (ClaimInPlace, PushInPlace: CursorEntry::rec), not
// allocated with a reference count; it goes with the last count in `remaining`: its
// consumers' and its Messages'. Any other record is allocated as a lane consumer's
// is, and the entry holds a reference.
//
// Covered (CursorEligible): memory streams; one member; explicit acks; ack_wait
// without a backoff list; max_deliver; dead-letter subjects; filters; overflow
// block; deliver policy new, or all / by start sequence on a stream that holds
// nothing from there; an event's own ttl or deadline, given up by the timer
// (CursorState::limits) or at the pull. Not yet (those consumers queue on lanes as
// before): several members, ack policy none, max_ack_pending, backoff, QoS tiers,
// lifecycles, accept_codecs, queue timeouts, timeout_action delay, replay original,
// predicates, file streams.
//
// Switched on per engine by INFERQ_CURSOR_CONSUMERS=1 in the environment while the
// redesign is under way (read once by Engine::Create).
//
// Thread safety: StreamCursors is appended to under the stream's mutex (one writer);
// `end` is its release point for readers. CursorState's members are as GroupCursor
// says; each member's Reader is its puller's, `timer_reader` the timer run's
// (run_timers_mu).
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <utility>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "consumer_state.hpp"
#include "inferq/base/owned_stats.hpp"
#include "group_cursor.hpp"
#include "inferq/ring/event_count.hpp"
#include "message_log.hpp"

namespace inferq::engine_internal {

// The consumers in a mask of them. Most messages are for one consumer: a single bit
// is counted without std::popcount, which Debian's baseline x86-64 (no POPCNT) makes
// a call into libgcc of about 20 instructions.
inline std::uint32_t ConsumerCount(std::uint64_t mask) {
  if ((mask & (mask - 1)) == 0) return mask != 0 ? 1 : 0;
  return static_cast<std::uint32_t>(std::popcount(mask));
}

// One stored message in a stream's cursor log.
struct CursorEntry {
  CursorEntry(Handle record, std::uint64_t consumers, std::int64_t limit)
      : h(std::move(record)),
        mask(consumers),
        limit_ns(limit),
        remaining(ConsumerCount(consumers)) {}
  // The record held in this entry itself (in_place): made from `event` before the
  // stream stores it (ClaimInPlace), its consumers and limit set by PushInPlace
  // before any reader can see the entry (StreamCursors::end).
  struct InPlace {};
  CursorEntry(InPlace, Event&& event) : in_place(true) {
    rec.emplace(std::move(event));
    h = Handle(Handle(), &*rec);  // no owner: `remaining` keeps the record
  }
  // The stream's record of the message (none when no cursor consumer takes it), let
  // go once every consumer of `mask` is done with it (CursorDone): the record then
  // lives as long as the stream and the Messages keep it, as a lane's delivery would.
  // For an entry that holds its record (in_place), `h` owns nothing: the record is
  // `rec`, destroyed by the CursorDone that takes `remaining` to 0, and every reader
  // that is not a consumer's owner of it counts itself in `remaining` while it reads
  // (EntryHold; a Message of it, until Message::Release).
  Handle h;
  // bit CursorState::bit set: that cursor consumer takes it. Written before the
  // entry is readable (the stream's `end`, release), constant after.
  std::uint64_t mask = 0;
  // The event's own queue limit (ttl, deadline), engine clock; INT64_MAX: none.
  // Written as `mask` is.
  std::int64_t limit_ns = INT64_MAX;
  std::atomic<std::uint32_t> remaining{0};  // consumers of `mask` not done with it, + holds
  // Entries with a limit: bit CursorState::bit set by whoever took the first delivery
  // for that consumer, its puller or the timer's expiry (the one whose fetch_or set
  // it wins; the other passes over it).
  std::atomic<std::uint64_t> taken{0};
  // Bit CursorState::bit set once a deleted consumer let go of the message's interest
  // (ReleaseInterest): DeleteConsumer's sweep and the delivery's Message may both try.
  std::atomic<std::uint64_t> released{0};
  const bool in_place = false;
  std::optional<StoredMessage> rec;  // in_place: the record, until `remaining` reaches 0
};

// Cursor consumer done with entry `e` (its message acked, given up, skipped or let
// go), or a hold given back: the last one lets go of the record. Its caller pins the
// entry (a Ref, or a Message's pin). acq_rel: every reader's reads of the record come
// before the reset.
// (`counts`: several at once, as a Message's own and its ack's.)
void LetGoRecord(CursorEntry& e);  // CursorDone's last: h and rec reset (out of line)
inline void CursorDone(CursorEntry& e, std::uint32_t counts = 1) {
  if (e.remaining.fetch_sub(counts, std::memory_order_acq_rel) == counts) LetGoRecord(e);
}

// The record of `e` for a reader that does not own the delivery it reads for, and
// may race the CursorDone of the one that does (a redelivery's puller against an
// older delivery's ack, the timer, DeleteConsumer's sweep): it counts itself in
// `remaining` while it copies, and gets null when the count was 0 (the record let
// go). For an entry that holds its record (in_place) the count stays until the hold
// is given back (its destructor, or a Message's Release after Keep()). Owners (a
// first delivery's claimer, the timer with an expiry it took) read `h` directly, or
// take an owner's hold (Owner) when the record must outlive their own CursorDone.
class EntryHold {
 public:
  // The hold of the consumer's owner of `e`, whose own count keeps `remaining` above
  // 0: an add, no check (relaxed: the owner's count orders nothing here).
  struct Owner {};
  EntryHold(CursorEntry& e, Owner) : h_(e.h) {
    if (e.in_place) {
      e.remaining.fetch_add(1, std::memory_order_relaxed);
      e_ = &e;
    }
  }
  explicit EntryHold(CursorEntry& e) {
    // Never from 0: once the count reached 0 (the record let go, or going) it stays
    // there, so no reader can see a count another reader's add lifted from 0 and read
    // a record being destroyed (found by the adversarial review; weak_ptr::lock's
    // rule).
    std::uint32_t n = e.remaining.load(std::memory_order_acquire);
    do {
      if (n == 0) return;  // let go already: leave it
    } while (!e.remaining.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel, std::memory_order_acquire));
    h_ = e.h;
    if (e.in_place) {
      e_ = &e;
    } else {
      CursorDone(e);  // `h_` owns the record
    }
  }
  EntryHold(const EntryHold&) = delete;
  EntryHold& operator=(const EntryHold&) = delete;
  [[gnu::always_inline]] ~EntryHold() {
    if (e_ != nullptr) CursorDone(*e_);
  }
  const Handle& get() const { return h_; }
  // The hold passes to a Message (given back by its Release).
  Handle Keep() {
    e_ = nullptr;
    return std::move(h_);
  }

 private:
  Handle h_;
  CursorEntry* e_ = nullptr;
};

using CursorLog = MessageLog<CursorEntry>;

// A stream's log for its cursor consumers (StreamState::cursors).
struct CursorState;

struct StreamCursors {
  explicit StreamCursors(std::uint64_t first_seq)
      : log(10, first_seq), end(first_seq), trim_reader(std::make_unique<MessageLog<CursorEntry>::Reader>(log)) {}
  CursorLog log;
  // The first sequence not in the log yet: stored with release after its entry is
  // published (one writer: the stream's mutex), loaded with acquire by pullers.
  std::atomic<std::uint64_t> end;
  std::uint64_t used_bits = 0;  // CursorState::bit of each attached consumer; stream mu
  // Publishes since the log was last trimmed (stream mu).
  std::uint32_t since_trim = 0;
  // The trim's reader (stream mu), made with the log.
  std::unique_ptr<MessageLog<CursorEntry>::Reader> trim_reader;
  // Deleted consumers whose overflow maps still hold sequences (DeleteConsumer's
  // sweep moved there what their members claimed before it: GroupCursor::SpillBelow).
  // A member lets go of such a sequence through its entry (LetGoClaimed, CursorLetGo),
  // so the trim keeps those entries as it keeps a listed consumer's (found by the
  // adversarial helper: a trim that passed the deleted consumer's claims left their
  // messages in an interest stream for ever). Dropped once its map is empty. The
  // consumers outlive the engine's streams (Impl::deleted_consumers). stream mu.
  std::vector<CursorState*> draining;
  // The trim's holes (TrimCursorLog): segments below every window but above a
  // message held in an overflow map are unlinked, but for those holding a held
  // sequence, kept here to be looked at again; holes_next is the segment index below
  // which every segment was looked at once. stream mu.
  std::vector<std::uint64_t> kept_segments;
  std::uint64_t holes_next = 0;
};

// What a cursor consumer holds (ConsumerState::cursor).
struct CursorState {
  CursorState(const GroupCursor::Options& o, std::shared_ptr<StreamCursors> s, std::uint64_t b,
              std::uint32_t members, std::uint64_t cap)
      : owner(std::move(s)), cursor(o), stream(owner.get()), bit(b), capacity(cap), timer_reader(owner->log) {
    for (std::uint32_t i = 0; i < members; ++i) readers.push_back(std::make_unique<MemberReader>(owner->log));
  }
  // The log outlives its readers (declared first: destroyed last), also when the
  // stream was deleted before this consumer goes.
  std::shared_ptr<StreamCursors> owner;
  GroupCursor cursor;
  StreamCursors* stream;
  std::uint64_t bit;
  // Publishers wait (overflow block) while this many sequences are published and not
  // claimed: members x lane_capacity.
  std::uint64_t capacity;
  // One per member, kept by the thread that pulls the member first: a Reader is for
  // one thread at a time, and any number of threads may pull one member (another
  // thread reads through a Reader of its own for the pull; found by the adversarial
  // review: two threads' pins of one Reader raced, and one segment was never let go).
  struct MemberReader {
    explicit MemberReader(CursorLog& log) : reader(log) {}
    ThreadOwner owner;
    CursorLog::Reader reader;
  };
  std::vector<std::unique_ptr<MemberReader>> readers;
  CursorLog::Reader timer_reader;                           // the timer run's
  EventCount data;  // pullers wait for a publish (or a due redelivery)
  EventCount room;  // publishers wait for a claim (overflow block)
  std::atomic<bool> closed{false};  // Close or DeleteConsumer: pullers drain, then stop
  // Entries for this consumer appended (the publisher's, under the stream's mutex: one
  // writer) and claimed by its members: their difference is what waits for it, what
  // a lane would hold.
  // Serializes GroupCursor's timer-side calls (Tick, Expire, Spill): the timer run's,
  // and a puller's Spill when the window is full.
  std::mutex timer_mu;
  // Passed (a read-modify-write) by a nak between its move of the message to the
  // map and its look at `deleted`, and by DeleteConsumer's sweep between `deleted` and
  // its look at the cursor's state (Message::SettleCursor, ReleaseCursorInterest). A
  // claim needs no pass: Claim and the sweep's ClaimRest order themselves (PopCursor).
  std::atomic<std::uint64_t> gate{0};
  std::atomic<std::uint64_t> pushed{0};
  std::atomic<std::uint64_t> taken{0};
  std::uint64_t Waiting() const {
    const std::uint64_t t = taken.load(std::memory_order_acquire);
    const std::uint64_t p = pushed.load(std::memory_order_acquire);
    return p > t ? p - t : 0;
  }
  // An entry with a queue limit (CursorEntry::limit_ns) was appended for it: the
  // timer looks for expired ones (RunCursorTimers).
  std::atomic<bool> has_limits{false};
  // Entries with a limit, by limit: (limit_ns, seq), earliest first. Pushed by
  // publishers (under the stream's mutex), popped by the timer run.
  std::mutex limits_mu;
  std::priority_queue<std::pair<std::int64_t, std::uint64_t>, std::vector<std::pair<std::int64_t, std::uint64_t>>,
                      std::greater<>>
      limits;  // guarded by limits_mu
  // Entries of `limits` a member took before the timer popped them (Stats: their
  // queue-timeout timers are cancelled, as a lane consumer's are at the pull).
  std::atomic<std::int64_t> limits_taken{0};
};

// StreamStats::log_bytes of `s`: its log's segments allocated, in bytes.
std::uint64_t CursorLogBytes(const StreamCursors& s);
// Whether consumer `c` (its config checked, not yet listed) can be a cursor
// consumer of `stream`. Requires stream.mu.
bool CursorEligible(const StreamState& stream, const ConsumerState& c);
// Makes `c` a cursor consumer of `stream`, starting at the stream's next sequence
// (or start_seq when later). Requires stream.mu.
void AttachCursor(StreamState& stream, ConsumerState& c);
// The cursor consumers of `stream` whose filters `mask` (the stream's filter mask for
// the event's subject) matches, as a mask of CursorState::bit; explicit-ack ones are
// counted in *explicit_acks. Requires stream.mu.
std::uint64_t CursorTargets(const StreamState& stream, std::uint64_t mask, std::uint32_t* explicit_acks);
// Before anything is stored, for a publish that may not wait (TryPublish, a call):
// ResourceExhausted naming the consumer, with *busy set, when a cursor consumer of
// `targets` holds lane_capacity x members messages not yet pulled; `count`: counted
// in ConsumerCounts::overflow_rejected. Requires stream.mu.
absl::Status CursorRefuse(StreamState& stream, std::uint64_t targets, bool count, bool* busy);
// Once the message is stored (it has its sequence, as a lane consumer's blocked
// publisher has), before its entry goes in: waits while a cursor consumer of
// `targets` is full, holding the stream's mutex (the backpressure); an internal
// publish (a dead letter) never waits. A consumer closed before or while waiting
// (Close, DeleteConsumer) is taken out of *targets, its bit in *closed. Requires
// stream.mu.
void CursorWaitRoom(StreamState& stream, std::uint64_t* targets, bool internal, std::uint64_t* closed);
// Appends the stored message `h` for cursor consumers `targets` (0: none; every
// message stored while the stream has the log gets its entry, so that the log's
// sequences are the stream's) and wakes their pullers. Requires stream.mu.
// `limit_ns`: the event's own queue limit, ns after `now` (INT64_MAX: none).
void PushToCursors(StreamState& stream, const Handle& h, std::uint64_t targets, std::int64_t now,
                   std::int64_t limit_ns);
// For a publish whose record only cursor consumers take (and the stream keeps no
// index of its own): claims the stream's next log sequence (next_seq, before Append
// stores it) and makes its entry holding the record of `event` (moved from), not yet
// readable. Then, once the stream stored it, PushInPlace must follow under the same
// hold of the mutex. nullptr (nothing claimed, `event` untouched) when the log could
// not allocate. Requires stream.mu.
CursorEntry* ClaimInPlace(StreamState& stream, Event&& event);
// PushToCursors for ClaimInPlace's entry `e` of sequence `seq`: after it, the
// entry's record belongs to its consumers, and the publisher reads it no more (an
// ack may destroy it at once). Requires stream.mu.
void PushInPlace(StreamState& stream, CursorEntry& e, std::uint64_t seq, std::uint64_t targets,
                 std::int64_t now, std::int64_t limit_ns);
// The timer run's part for a cursor consumer: ack_wait expiries (counted, redelivered
// or given up), delayed naks that came due, the log trimmed; wakes pullers when
// something is due. The earliest time it needs a run again (INT64_MAX: none).
std::int64_t RunCursorTimers(ConsumerState& c, std::int64_t now);
// Close and DeleteConsumer: pullers drain and then stop.
void CloseCursor(ConsumerState& c);
// DeleteConsumer: under interest retention, the stream stops waiting for this
// consumer's unsettled messages. After CloseCursor, with the stream's mutex held.
void ReleaseCursorInterest(ConsumerState& c);
// A deleted consumer's readers let go of the segment each keeps pinned: the timer's
// (DeleteConsumer and DeleteStream, once no run of its timers can be under way:
// AwaitTimerRun), and member `member`'s when its owner thread pulls after the deletion
// (PopOne). Else each would keep a segment for the engine's life (found by the
// adversarial review).
void ReleaseCursorReaders(ConsumerState& c);
void DropMemberReader(ConsumerState& c, std::uint32_t member);
// Stats: messages published and not claimed yet (approximate), and held in the map.
std::uint64_t CursorPending(const ConsumerState& c);
// Sequences of the log its cursor has not claimed yet, whoever's they are.
std::uint64_t CursorUnread(const CursorState& k);
// Stats: the timers a lane consumer would hold: an ack wait per delivery out
// (tracked consumers), a timer per delayed nak not yet due.
std::uint64_t CursorTimers(ConsumerState& c, std::int64_t now);
// A deleted consumer lets go of entry `e`'s message for interest retention, once
// (CursorEntry::released), and is done with it (CursorDone). For a delivery out with a
// member: its Message's settle or release after the deletion.
void CursorLetGo(ConsumerState& c, CursorEntry& e);
// The same for a delivery of `seq` whose Message a member settles or drops after the
// deletion: only when it still ends the sequence in the cursor (GroupCursor::Drop).
void CursorLetGo(ConsumerState& c, CursorEntry& e, std::uint64_t seq);
// After a settle, a dead letter or the timer changed the cursor's state for entry
// `e`: whether this thread lets go of the message's interest (an ack's or a dead
// letter's). Once the consumer is deleted, its sweep may have let go of a tracked
// delivery that was out then (CursorEntry::released): the first to set the bit does.
// The state change (a seq_cst CAS on the window, or the map under its mutex) comes
// before the seq_cst load of `deleted` here, and the sweep's fence after `deleted` is
// set before it reads the state: either this load sees the deletion, or the sweep
// sees the change (and leaves the message).
bool CursorMayRelease(ConsumerState& c, CursorEntry& e);
// For the cold paths that give a message up (an expiry by the timer or at the pull):
// whether this call is the first to let go of the message's interest for the cursor
// consumer of `bit` (sets CursorEntry::released). Unlike CursorMayRelease, always a
// read-modify-write, deleted or not.
inline bool FirstToRelease(CursorEntry& e, std::uint64_t bit) {
  return (e.released.fetch_or(bit, std::memory_order_acq_rel) & bit) == 0;
}
// A member's first claim of entry `e` that meets the consumer's deletion: true when
// the timer's expiry gave the entry up before (it let go of it and is done with it),
// so the claim must do neither again; else the claim takes it (CursorEntry::taken) and
// lets go of it.
bool GivenUpByTimer(ConsumerState& c, CursorEntry& e);
// Message::Release: its pin on entry `e` given back, and for an entry that holds its
// record the Message's count in `remaining` before it (the record may go with it).
// `owed`: the Message's ack left the consumer's count to this (Message::cursor_done_owed_).
void CursorUnpin(ConsumerState& c, CursorEntry& e, void* pin, bool owed);

// A batch's claim on a cursor consumer (Member::GatherBatch, Member::PopCursor): one
// Claim of up to `want` sequences for the batch's free slots, delivered one per pull
// before anything else is taken, so that the claim and the room given back to
// blocked publishers (CursorState::taken) are paid once per batch, not once per
// message. The batch's pulls have one thread.
struct CursorRun {
  std::uint64_t want = 1;  // the batch's free slots: the most the next claim takes
  std::uint64_t next = 0;  // [next, end): claimed for the batch, not yet delivered
  std::uint64_t end = 0;
  // First deliveries not yet counted in CursorState::taken (TakeRoom counts them).
  std::uint64_t first_deliveries = 0;
  bool empty() const { return next >= end; }
};
// A PublishBatch run's log entries of one stream, written and not yet released to
// its cursor consumers: ReleaseEntry leaves the store of the stream's `end` (a
// sequentially consistent store: a locked instruction) and the consumers' wake-ups
// here, and FlushCursorRelease makes them once for the run. The run holds the
// stream's mutex from its first entry to the flush, which comes before the mutex is
// let go (a later publisher's `end` must not be overwritten) and before the
// publisher waits for room (a consumer cannot claim what is not released).
struct CursorRelease {
  StreamState* stream = nullptr;  // the run's stream (its mutex held); nullptr: none
  std::uint64_t end = 0;          // the `end` to store (0: nothing pending)
  std::uint64_t notify = 0;       // the cursor consumers (CursorState::bit) to wake
};
// The calling thread's open run (PublishBatch sets it while it holds a stream's
// mutex), or nullptr.
inline thread_local CursorRelease* t_cursor_release = nullptr;
// Releases what `r` holds: stores the stream's `end`, wakes its consumers. Requires
// the stream's mutex.
void FlushCursorRelease(CursorRelease& r);

// Counts `run`'s first deliveries in k.taken and wakes a publisher waiting for room:
// before the batch waits, and when it ends.
void TakeRoom(CursorState& k, CursorRun& run);
// The batch of `run` ends: TakeRoom, and what it claimed and did not deliver (the
// consumer was deleted between its pulls) is let go of, as a single claim that
// meets the deletion is (PopCursor).
void EndCursorRun(ConsumerState& c, CursorRun& run);

}  // namespace inferq::engine_internal
