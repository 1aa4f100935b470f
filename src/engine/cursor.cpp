// File: src/engine/cursor.cpp
//
// Cursor consumers (cursor.hpp): attaching one, the publisher's side (room, the log
// append, wake-ups), the puller's (Member::PopCursor), the settles
// (Message::SettleCursor, InProgress's part), the timer run's, and deletion.
#include "cursor.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <bit>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "delivery.hpp"
#include "engine_impl.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace inferq {
namespace engine_internal {

ConsumerState::~ConsumerState() = default;
StreamState::~StreamState() = default;

namespace {

absl::Status Deleted(const ConsumerState& c) {
  return absl::CancelledError("consumer '" + c.config.name + "' of stream '" + c.config.stream +
                              "' was deleted");
}

// The lane's delivery counters, as a lane consumer's pull keeps them: the count (the
// histogram's), publish -> deliver latency, and its EWMA (alpha 1/8).
[[gnu::always_inline]] inline void RecordCursorDelivery(Lane& lane, std::int64_t now, std::int64_t publish_ns) {
  const std::int64_t delay = std::max<std::int64_t>(0, SatSub(now, publish_ns));
  lane.deliver_latency_ns.Record(static_cast<std::uint64_t>(delay));
  const std::int64_t ewma = lane.delay_ewma_ns.load(std::memory_order_relaxed);
  lane.delay_ewma_ns.store(ewma == 0 ? delay : ewma + (delay - ewma) / 8, std::memory_order_relaxed);
}

// Messages for `k` published and not claimed yet by its members.
std::uint64_t Unclaimed(const CursorState& k) { return k.Waiting(); }

// The lowest sequence at or above `from` that an overflow map of `stream`'s cursor
// consumers (listed or draining) holds; UINT64_MAX when none. Requires stream.mu.
std::uint64_t NextHeld(const StreamState& stream, std::uint64_t from) {
  std::uint64_t next = std::numeric_limits<std::uint64_t>::max();
  for (const ConsumerState* c : stream.consumers) {
    if (const CursorState* k = c->cursor.get(); k != nullptr) next = std::min(next, k->cursor.NextHeld(from));
  }
  for (const CursorState* k : stream.cursors->draining) next = std::min(next, k->cursor.NextHeld(from));
  return next;
}

// Below `settled` every cursor's window is settled, and what is not done is held in
// an overflow map (a straggler spilled by a full window, a nak'd message, a deleted
// consumer's claims): TrimBefore stops at the lowest of those, and this unlinks the
// segments after it that hold none, so that one message held unacked keeps its own
// segment and not the whole log after it (found while fixing a deletion race: one
// delivery dropped unsettled without ack_wait kept every later message, 1.2 GB after
// 2 M events where lanes kept 12 MB). Requires stream.mu.
void TrimHoles(StreamState& stream, std::uint64_t settled) {
  StreamCursors& s = *stream.cursors;
  const std::uint64_t slots = s.log.segment_slots();
  const std::uint64_t first = s.log.first() / slots;  // what TrimBefore has not passed
  const std::uint64_t stop = settled / slots;         // segments wholly below `settled`
  auto held_in = [&](std::uint64_t i) { return NextHeld(stream, i * slots) < (i + 1) * slots; };
  // Kept before: gone by now, or looked at again.
  std::erase_if(s.kept_segments, [&](std::uint64_t i) {
    return i < first || (!held_in(i) && s.log.UnlinkSegment(i));
  });
  std::uint64_t i = std::max(s.holes_next, first);
  while (i < stop) {
    // Every segment up to the next held sequence's goes; that one stays.
    const std::uint64_t held = NextHeld(stream, i * slots);
    const std::uint64_t upto = held == std::numeric_limits<std::uint64_t>::max() ? stop : std::min(stop, held / slots);
    for (; i < upto; ++i) {
      if (!s.log.UnlinkSegment(i)) s.kept_segments.push_back(i);  // (not expected: all published)
    }
    if (i < stop) s.kept_segments.push_back(i++);
  }
  s.holes_next = std::max(s.holes_next, stop);
}

// Trims the stream's cursor log behind every cursor consumer's lowest held sequence
// (a deleted one's too while its members let go of what they claimed: draining),
// after moving each consumer's cursor over the entries at its front that are not for
// it (a consumer that does not pull would hold the log for other consumers'
// messages); past a message held in an overflow map, the segments that hold none
// (TrimHoles). Requires stream.mu.
void TrimCursorLog(StreamState& stream) {
  StreamCursors& s = *stream.cursors;
  const std::uint64_t end = s.end.load(std::memory_order_relaxed);
  std::uint64_t lowest = end;   // below it: every cursor is done with every sequence
  std::uint64_t settled = end;  // below it: every listed cursor's window is settled
  bool dead_unread = false;
  for (const ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k == nullptr) continue;
    for (std::uint64_t next = k->cursor.next(); next < end; next = k->cursor.next()) {
      CursorLog::Ref ref;
      if (s.trim_reader->Read(next, ref) != LogRead::kReady || (ref->mask & k->bit) != 0) break;
      const GroupCursor::Range r = k->cursor.Claim(1, next + 1);
      if (r.empty() || r.first != next) break;  // a member claimed it meanwhile
      (void)k->cursor.Ack(next);
    }
    lowest = std::min(lowest, k->cursor.lowest_held());
    settled = std::min(settled, k->cursor.window_low());
    dead_unread = dead_unread || k->cursor.dead_unread();
  }
  std::erase_if(s.draining, [&](const CursorState* k) {
    if (k->cursor.held() == 0 && !k->cursor.dead_unread()) return true;
    lowest = std::min(lowest, k->cursor.lowest_held());
    dead_unread = dead_unread || k->cursor.dead_unread();
    return false;
  });
  // A dead letter that left an overflow map (TakeDue, TimeOut) may be below `lowest`,
  // its entry not read yet: the next publish tries again.
  if (dead_unread) return;
  s.log.TrimBefore(lowest);
  if (lowest < settled) TrimHoles(stream, settled);
  s.since_trim = 0;
}

}  // namespace

std::uint64_t CursorLogBytes(const StreamCursors& s) {
  return static_cast<std::uint64_t>(s.log.segments_allocated()) * s.log.segment_bytes();
}

bool CursorEligible(const StreamState& stream, const ConsumerState& c) {
  const ConsumerConfig& cfg = c.config;
  if (stream.is_file() || stream.log != nullptr) return false;
  if (cfg.members != 1 || cfg.ack != AckPolicy::kExplicit) return false;
  if (c.max_ack_pending > 0 || !c.backoff_ns.empty() || cfg.qos.has_value()) return false;
  if (cfg.lifecycle != nullptr || !cfg.accept_codecs.empty()) return false;
  if (cfg.queue_timeout > absl::ZeroDuration() || cfg.replay != ReplayPolicy::kInstant) return false;
  if (!cfg.predicate.is_trivial() || cfg.overflow != OverflowPolicy::kBlock) return false;
  if (cfg.timeout_action != TimeoutAction::kReject) return false;  // an expired event is delayed
  if (stream.cursors != nullptr && std::popcount(stream.cursors->used_bits) >= 64) return false;
  switch (cfg.deliver) {
    case DeliverPolicy::kNew:
      return true;
    case DeliverPolicy::kByStartSequence:
      return cfg.start_seq >= stream.next_seq;
    default:
      // What it starts with must be nothing: a stream that holds no live message (or
      // keeps none at hand, whose messages no new consumer gets: interest retention).
      return !stream.keeps_index || stream.LiveMsgs() == 0;
  }
}

void AttachCursor(StreamState& stream, ConsumerState& c) {
  if (stream.cursors == nullptr) {
    stream.cursors = std::make_shared<StreamCursors>(stream.next_seq);
    stream.cursors_made.store(stream.cursors.get(), std::memory_order_release);
  }
  StreamCursors& s = *stream.cursors;
  const std::uint64_t bit = std::uint64_t{1} << std::countr_one(s.used_bits);
  s.used_bits |= bit;
  const std::uint64_t capacity = static_cast<std::uint64_t>(c.lanes[0]->ring.capacity()) * c.config.members;
  // The window holds at least what the lanes held: W = 32 * 2^bits >= capacity.
  unsigned bits = 0;
  while ((std::uint64_t{32} << bits) < capacity && bits < 20) ++bits;
  GroupCursor::Options o;
  o.window_word_bits = bits;
  if (c.config.deliver == DeliverPolicy::kByStartSequence) c.start_after = c.config.start_seq - 1;
  o.start = std::max(stream.next_seq, c.start_after + 1);
  o.ack_wait_ns = c.tracked ? c.ack_wait_ns : 0;
  o.max_deliver = c.max_deliver > 0 ? static_cast<std::uint32_t>(std::min<std::int64_t>(c.max_deliver, UINT32_MAX)) : 0;
  o.members = c.config.members;
  c.cursor = std::make_unique<CursorState>(o, stream.cursors, bit, c.config.members, capacity);
  c.has_cursor.store(true, std::memory_order_seq_cst);  // ConsumerState::Cursor
}

absl::Status CursorRefuse(StreamState& stream, std::uint64_t targets, bool count, bool* busy) {
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k == nullptr || (targets & k->bit) == 0) continue;
    if (Unclaimed(*k) < k->capacity || k->closed.load(std::memory_order_acquire)) continue;
    if (count) c->counts.overflow_rejected.fetch_add(1, std::memory_order_relaxed);
    *busy = true;
    // The words a full lane's refusal has: what the publisher sees is the same.
    return absl::ResourceExhaustedError("stream '" + stream.config.name + "': lane of consumer '" +
                                        c->config.name + "' member 0 is full (" +
                                        std::to_string(Unclaimed(*k)) +
                                        " queued; overflow block, and TryPublish does not wait)");
  }
  return absl::OkStatus();
}

void CursorWaitRoom(StreamState& stream, std::uint64_t* targets, bool internal, std::uint64_t* closed) {
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k == nullptr || (*targets & k->bit) == 0) continue;
    auto gone = [&] { return k->closed.load(std::memory_order_acquire); };
    auto room = [&] { return Unclaimed(*k) < k->capacity || gone(); };
    if (!room()) {
      // What this publisher's run wrote and has not released must be claimable while
      // it waits for a claim.
      if (CursorRelease* r = t_cursor_release; r != nullptr && r->stream == &stream) FlushCursorRelease(*r);
      if (internal) {
        // A dead letter never waits: it goes past the capacity, counted as a lane
        // consumer counts one it parks off its full lane.
        c->counts.parked.fetch_add(1, std::memory_order_relaxed);
      } else {
        // The stream's mutex stays held: that is the backpressure (as a full lane's).
        stream.blocked_publishers.fetch_add(1, std::memory_order_acq_rel);
        WaitUntil<HybridWait>(k->room, kNoDeadline, room, [] { return false; }, [] { return false; });
        stream.blocked_publishers.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
    if (gone()) {  // closed before or while waiting: it takes nothing more
      *targets &= ~k->bit;
      *closed |= k->bit;
    }
  }
}

namespace {

// The part of a publish that makes entry `seq` readable for `targets` and wakes them.
// Requires stream.mu.
[[gnu::always_inline]] inline void ReleaseEntry(StreamState& stream, std::uint64_t seq, std::uint64_t targets,
                                                std::int64_t limit) {
  StreamCursors& s = *stream.cursors;
  // A PublishBatch run releases its entries once, at its end (FlushCursorRelease).
  CursorRelease* deferred = t_cursor_release;
  if (deferred != nullptr && deferred->stream != &stream) deferred = nullptr;
  if (deferred != nullptr) {
    deferred->end = seq + 1;
    deferred->notify |= targets;
  } else {
    // release: a puller that acquires `end` reads the published entry.
    s.end.store(seq + 1, std::memory_order_seq_cst);  // seq_cst: EventCount inv. 2
  }
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k == nullptr || (targets & k->bit) == 0) continue;
    // One writer (the stream's mutex): a load and a store, not a locked instruction.
    k->pushed.store(k->pushed.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    if (limit != INT64_MAX && c->enforce_event_ttl) {
      {
        std::lock_guard lock(k->limits_mu);
        k->limits.emplace(limit, seq);
      }
      k->has_limits.store(true, std::memory_order_release);
      if (c->host != nullptr) c->host->WakeTimer(limit);
    }
    if (deferred == nullptr) k->data.NotifyOne();
  }
  if (++s.since_trim >= 256) TrimCursorLog(stream);
}

// One writer (the stream's mutex), an entry for every message stored since the log
// was made: the log's sequence is the stream's.
void CheckSequence(const StreamState& stream, std::uint64_t log_seq, std::uint64_t seq) {
  if (log_seq == seq) [[likely]] return;
  std::fprintf(stderr, "inferq: stream '%s': cursor log sequence %llu is not the message's %llu\n",
               stream.config.name.c_str(), static_cast<unsigned long long>(log_seq),
               static_cast<unsigned long long>(seq));
  std::abort();
}

}  // namespace

void PushToCursors(StreamState& stream, const Handle& h, std::uint64_t targets, std::int64_t now,
                   std::int64_t limit_ns) {
  StreamCursors& s = *stream.cursors;
  const std::uint64_t seq = s.log.ClaimExclusive(1);  // the stream's mutex: the only claimer
  CheckSequence(stream, seq, h->seq);
  const std::int64_t limit = limit_ns == INT64_MAX ? INT64_MAX : SatAdd(now, limit_ns);
  (void)s.log.Publish(seq, targets != 0 ? h : Handle(), targets, limit);  // no taker: no reference
  ReleaseEntry(stream, seq, targets, limit);
}

CursorEntry* ClaimInPlace(StreamState& stream, Event&& event) {
  CursorLog& log = stream.cursors->log;
  std::uint64_t seq = 0;
  try {
    seq = log.ClaimExclusive(1);  // the stream's mutex: the only claimer
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  CheckSequence(stream, seq, stream.next_seq);
  CursorEntry* e = log.Emplace(seq, CursorEntry::InPlace{}, std::move(event));
  if (e == nullptr) {
    // Not expected: the log keeps what its cursors have not passed, and none has
    // passed a sequence not yet stored.
    std::fprintf(stderr, "inferq: stream '%s': cursor log sequence %llu gone before it was stored\n",
                 stream.config.name.c_str(), static_cast<unsigned long long>(seq));
    std::abort();
  }
  return e;
}

void PushInPlace(StreamState& stream, CursorEntry& e, std::uint64_t seq, std::uint64_t targets,
                 std::int64_t now, std::int64_t limit_ns) {
  const std::int64_t limit = limit_ns == INT64_MAX ? INT64_MAX : SatAdd(now, limit_ns);
  e.mask = targets;
  e.limit_ns = limit;
  if (targets == 0) {  // every consumer it was for closed while the publish waited
    e.h.reset();
    e.rec.reset();
  } else {
    // relaxed: `end`'s store in ReleaseEntry publishes it.
    e.remaining.store(ConsumerCount(targets), std::memory_order_relaxed);
  }
  ReleaseEntry(stream, seq, targets, limit);
}

std::int64_t RunCursorTimers(ConsumerState& c, std::int64_t now) {
  CursorState& k = *c.cursor;
  GroupCursor& g = k.cursor;
  std::vector<GroupCursor::Redelivery> timed_out, dead;
  if (g.options().ack_wait_ns > 0) {
    std::lock_guard lock(k.timer_mu);  // Tick, Expire and Spill share the samples
    g.Tick([&] { return c.clock->NowNanos(); });
    g.Expire(now);
  }
  const std::uint64_t behind = k.stream->end.load(std::memory_order_acquire);
  g.TimeOut(now, timed_out, dead, behind);
  // Queued again for redelivery, unless the stream removed the message meanwhile
  // (then it is skipped: the engine's redelivery skips it too).
  auto requeue = [&](std::uint64_t seq) {
    CursorLog::Ref ref;
    if (k.timer_reader.Read(seq, ref) == LogRead::kReady) {
      const EntryHold rec(*ref);
      if (rec.get() != nullptr && rec.get()->state.load(std::memory_order_acquire) == kDiscarded) {
        if (g.Drop(seq)) CursorDone(*ref);
        c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
  };
  for (const GroupCursor::Redelivery& r : timed_out) {
    c.counts.ack_timeouts.fetch_add(1, std::memory_order_relaxed);
    c.Unsettle();
    c.group->OnDone(0, Outcome::kFailure, 0);
    requeue(r.seq);
  }
  std::sort(dead.begin(), dead.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  for (const GroupCursor::Redelivery& r : dead) {
    c.counts.ack_timeouts.fetch_add(1, std::memory_order_relaxed);
    c.Unsettle();
    c.group->OnDone(0, Outcome::kFailure, 0);
    CursorLog::Ref ref;
    const LogRead read = k.timer_reader.Read(r.seq, ref);
    g.DeadRead(1);  // pinned now (NextHeld kept it until here)
    if (read == LogRead::kReady) {
      DeadLetter(c, ref->h, r.attempt, "max_deliver", "ack_wait expired", {}, CursorMayRelease(c, *ref));
      CursorDone(*ref);
    }
  }
  // Events whose own queue limit (ttl, deadline) passed before any member pulled them:
  // given up now, as a lane consumer's timer gives them up (in stream order). The
  // member that claims one later passes over it (CursorEntry::taken).
  std::int64_t next_limit = INT64_MAX;
  if (k.has_limits.load(std::memory_order_acquire)) {
    std::vector<std::uint64_t> expired;
    {
      std::lock_guard lock(k.limits_mu);
      while (!k.limits.empty() && k.limits.top().first <= now) {
        expired.push_back(k.limits.top().second);
        k.limits.pop();
      }
      if (!k.limits.empty()) next_limit = k.limits.top().first;
    }
    std::sort(expired.begin(), expired.end());
    for (std::uint64_t seq : expired) {
      CursorLog::Ref ref;
      if (k.timer_reader.Read(seq, ref) != LogRead::kReady) continue;
      // Removed by the stream: not expired, skipped when a member claims it (as a lane's
      // queued copy is). Reading the record is safe: the entry is this consumer's to
      // end until the bit below is set.
      if ((ref->taken.load(std::memory_order_acquire) & k.bit) != 0) {  // a member took it
        k.limits_taken.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      const EntryHold hold(*ref);  // a DeleteConsumer's sweep may end it meanwhile
      const Handle& rec = hold.get();
      if (rec == nullptr || rec->state.load(std::memory_order_acquire) == kDiscarded) continue;
      if ((ref->taken.fetch_or(k.bit, std::memory_order_acq_rel) & k.bit) != 0) {  // a member took it
        k.limits_taken.fetch_sub(1, std::memory_order_relaxed);
        continue;
      }
      c.counts.expired.fetch_add(1, std::memory_order_relaxed);
      // A DeleteConsumer's sweep that saw a member's claim of it on its way (IsOut)
      // may have let go of it already: the first to set `released` does.
      DeadLetter(c, rec, 0, "expired", "queue timeout", {}, FirstToRelease(*ref, k.bit));
      CursorDone(*ref);
    }
  }
  std::vector<std::uint64_t> due;
  g.CountDue(now, due, behind);  // delayed naks that came due
  for (std::uint64_t seq : due) requeue(seq);
  if (!timed_out.empty() || !due.empty()) k.data.NotifyAll();
  const std::int64_t next = g.next_due();
  return std::min(next == GroupCursor::kNever ? INT64_MAX : next, next_limit);
}

void CloseCursor(ConsumerState& c) {
  CursorState& k = *c.cursor;
  k.closed.store(true, std::memory_order_seq_cst);
  k.data.NotifyAll();
  k.room.NotifyAll();
}

void ReleaseCursorInterest(ConsumerState& c) {
  CursorState& k = *c.cursor;
  GroupCursor& g = k.cursor;
  CursorLog::Reader reader(k.stream->log);
  const std::uint64_t end = k.stream->end.load(std::memory_order_acquire);
  // Pairs with a nak's pass of `gate` (Message::SettleCursor): either this sweep sees
  // the message back in the map, or the nak sees `deleted`.
  k.gate.fetch_add(1, std::memory_order_acq_rel);
  // `deleted` (set before this sweep) before the states read below: pairs with
  // CursorMayRelease's seq_cst load after a settle's state change.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // What no member claimed yet is the sweep's from here on: also what lies past the
  // window (dead letters go past the consumer's capacity), which Drop cannot settle
  // (found by the adversarial helper: up to 229 messages of an interest stream kept
  // for the deleted consumer).
  const std::uint64_t unclaimed = g.ClaimRest(end);
  for (std::uint64_t s = std::min(g.lowest_held(), unclaimed); s < end; ++s) {
    CursorLog::Ref ref;
    if (reader.Read(s, ref) != LogRead::kReady || (ref->mask & k.bit) == 0) continue;
    if (s >= unclaimed) {
      // Given up by the timer's expiry (the first to set the bit takes it), else let go.
      if (ref->limit_ns != INT64_MAX && (ref->taken.fetch_or(k.bit, std::memory_order_acq_rel) & k.bit) != 0) {
        continue;
      }
      CursorLetGo(c, *ref);
      continue;
    }
    if (g.IsDone(s)) continue;
    // A delivery out with a member (or claimed by one and on its way): its member may
    // be reading the entry now, so the entry stays until the member settles or drops
    // it (Message::Settle, Message::Release: CursorLetGo). A tracked consumer's lets
    // go of the stream now (as a lane consumer's pending deliveries do), an
    // untracked one's then.
    if (g.IsOut(s)) {
      if (c.tracked && FirstToRelease(*ref, k.bit)) {
        if (const EntryHold rec(*ref); rec.get() != nullptr) ReleaseInterest(c, *rec.get());
      }
      continue;
    }
    // Claimed and neither out nor done: a member's delivery nak'd, or whose ack wait
    // ran out, waiting in the map to be delivered again. (`taken` says nothing here: a
    // member's first claim sets it too. An entry the timer's expiry gave up is done, or
    // out with the member that passes over it: found by the adversarial helper, a nak'd
    // message with a ttl was never let go.)
    if (!g.Drop(s)) continue;
    CursorLetGo(c, *ref);
  }
  if (c.tracked) {
    // Every delivery out let go of the stream above, and what waited was dropped: what
    // the map still holds (deliveries out, superseded redeliveries) needs nothing more
    // (found by the adversarial review: kept there, a delivery dropped unsettled before
    // the deletion held its log segment for ever). A member's later settle or drop of
    // one ends nothing; a claim not delivered yet needs no entry to be let go of.
    g.ForgetHeld();
    return;
  }
  // An untracked consumer's claims and deliveries out are let go of by their members
  // (LetGoClaimed, Message::Settle, Message::Release). What members claimed before this
  // sweep and still hold unsettled moves to the overflow map, which keeps its entries
  // in the log until they let go of it (StreamCursors::draining). (A delivery dropped
  // unsettled before the deletion stays there, as its message stays in the stream: a
  // lane consumer's keeps it too.)
  {
    std::lock_guard lock(k.timer_mu);  // Spill's (the timer's samples)
    g.SpillBelow(unclaimed, c.clock->NowNanos());
  }
  if (g.held() > 0) k.stream->draining.push_back(&k);
}

void ReleaseCursorReaders(ConsumerState& c) { c.cursor->timer_reader.Drop(); }

void DropMemberReader(ConsumerState& c, std::uint32_t member) {
  CursorState::MemberReader& mine = *c.cursor->readers[member];
  if (mine.owner.IsMine()) mine.reader.Drop();
}

void CursorLetGo(ConsumerState& c, CursorEntry& e) {
  if (FirstToRelease(e, c.cursor->bit)) ReleaseInterest(c, *e.h);
  CursorDone(e);
}

void CursorLetGo(ConsumerState& c, CursorEntry& e, std::uint64_t seq) {
  // Only the call that ends the sequence in the cursor is done with the entry: a stale
  // delivery of a message settled since (or swept) changes nothing.
  if (c.cursor->cursor.Drop(seq)) CursorLetGo(c, e);
}

bool GivenUpByTimer(ConsumerState& c, CursorEntry& e) {
  if (e.limit_ns == INT64_MAX || !c.enforce_event_ttl) return false;
  CursorState& k = *c.cursor;
  if ((e.taken.fetch_or(k.bit, std::memory_order_acq_rel) & k.bit) != 0) return true;
  k.limits_taken.fetch_add(1, std::memory_order_relaxed);  // its expiry is no timer's now
  return false;
}

namespace {

// A sequence this consumer's member claimed and will not deliver, the consumer being
// deleted: let go of here unless the timer's expiry gave it up (PopCursor, EndCursorRun).
void LetGoClaimed(ConsumerState& c, CursorLog::Reader& reader, std::uint64_t seq) {
  // Read (pinned) before the claim ends: until then the deletion's sweep holds it in
  // the map, which keeps the entry in the log (StreamCursors::draining).
  CursorLog::Ref ref;
  const bool read = reader.Read(seq, ref) == LogRead::kReady;
  if (!c.cursor->cursor.Drop(seq)) return;
  if (read && (ref->mask & c.cursor->bit) != 0 && !GivenUpByTimer(c, *ref)) CursorLetGo(c, *ref);
}

}  // namespace

void FlushCursorRelease(CursorRelease& r) {
  if (r.end == 0) return;
  StreamState& stream = *r.stream;
  // release: a puller that acquires `end` reads the published entries.
  stream.cursors->end.store(r.end, std::memory_order_seq_cst);  // seq_cst: EventCount inv. 2
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k != nullptr && (r.notify & k->bit) != 0) k->data.NotifyOne();
  }
  r.end = 0;
  r.notify = 0;
}

void TakeRoom(CursorState& k, CursorRun& run) {
  if (run.first_deliveries == 0) return;
  // seq_cst, then the wake-up: a publisher may wait for this room (event_count.hpp
  // inv. 2). One publisher at most waits per stream (it holds the stream's mutex).
  k.taken.fetch_add(run.first_deliveries, std::memory_order_seq_cst);
  run.first_deliveries = 0;
  k.room.NotifyOne();
}

void EndCursorRun(ConsumerState& c, CursorRun& run) {
  CursorState& k = *c.cursor;
  TakeRoom(k, run);
  if (run.empty()) return;
  // Only a deletion between the batch's pulls leaves sequences here (a pull takes
  // what the run holds before anything else, and fails only once the consumer is
  // deleted). A claim that was not deleted then stays with this member, as a
  // delivery dropped unsettled does.
  if (!c.deleted.load(std::memory_order_acquire)) return;
  CursorLog::Reader reader(k.owner->log);  // this thread's, for the rest of the run
  for (; run.next < run.end; ++run.next) LetGoClaimed(c, reader, run.next);
}

void LetGoRecord(CursorEntry& e) {
  e.h.reset();
  e.rec.reset();
}

void CursorUnpin(ConsumerState& c, CursorEntry& e, void* pin, bool owed) {
  // The Message's count (PopCursor), and the consumer's its ack left here, before the pin.
  if (e.in_place) CursorDone(e, owed ? 2 : 1);
  c.cursor->stream->log.Unpin(pin);
}

bool CursorMayRelease(ConsumerState& c, CursorEntry& e) {
  if (!c.deleted.load(std::memory_order_seq_cst)) [[likely]] return true;
  return FirstToRelease(e, c.cursor->bit);
}

std::uint64_t CursorTimers(ConsumerState& c, std::int64_t now) {
  CursorState& k = *c.cursor;
  const std::int64_t out = c.tracked ? std::max<std::int64_t>(0, c.Unsettled()) : 0;
  std::int64_t limits;
  {
    std::lock_guard lock(k.limits_mu);
    limits = static_cast<std::int64_t>(k.limits.size());
  }
  limits = std::max<std::int64_t>(0, limits - k.limits_taken.load(std::memory_order_relaxed));
  return static_cast<std::uint64_t>(out + limits) + k.cursor.Delayed(now);
}

std::uint64_t CursorPending(const ConsumerState& c) {
  const CursorState& k = *c.cursor;
  return Unclaimed(k) + k.cursor.Queued();
}

std::uint64_t CursorUnread(const CursorState& k) {
  const std::uint64_t end = k.stream->end.load(std::memory_order_acquire);
  const std::uint64_t next = k.cursor.next();
  return end > next ? end - next : 0;
}

}  // namespace engine_internal

// ---------------------------------------------------------------------------------
// The puller and the settles

template <bool kRun>
absl::Status Member::PopCursor(std::int64_t deadline_ns, Message& out, std::int64_t now_ns, bool describe,
                               engine_internal::CursorRun* run) {
  using engine_internal::CursorLog;
  using engine_internal::GroupCursor;
  ConsumerState& c = *consumer_;
  engine_internal::CursorState& k = *c.cursor;
  GroupCursor& g = k.cursor;
  engine_internal::CursorState::MemberReader& mine = *k.readers[index_];
  std::optional<CursorLog::Reader> own;  // a thread that is not the member reader's owner
  CursorLog::Reader& reader = mine.owner.IsMine() ? mine.reader : own.emplace(k.owner->log);
  std::vector<GroupCursor::Redelivery> due, dead;
  std::uint64_t seq = 0;
  std::uint32_t attempt = 0;
  bool counted = true;
  bool superseded = false;
  // With a batch, a claim takes up to run->want sequences; the first is this pull's,
  // the rest the run's.
  const std::uint64_t want = kRun ? run->want : 1;
  // One try: a redelivery that is due, else the next sequence.
  auto take = [&] {
    if (g.held() > 0) {
      due.clear();
      g.TakeDue(c.clock->NowNanos(), due, dead, 1, /*waiting_only=*/true, index_);
      if (!due.empty()) {
        seq = due[0].seq;
        attempt = due[0].attempt;
        counted = due[0].counted;
        superseded = due[0].superseded;
        return true;
      }
    }
    const std::uint64_t end = k.stream->end.load(std::memory_order_acquire);
    GroupCursor::Range r = g.Claim(want, end);
    if (r.empty() && g.next() < end && g.next() >= g.floor() + g.window_capacity()) {
      // The window is full behind a message held out (a straggler, or one dropped
      // unsettled): it moves to the overflow map, keeping its ack deadline, and the
      // claims go on (a lane consumer is not held back by one message either).
      std::unique_lock lock(k.timer_mu, std::try_to_lock);
      if (lock.owns_lock()) {
        g.Spill(c.clock->NowNanos());
        r = g.Claim(want, end);
      }
    }
    if (r.empty()) return false;
    seq = r.first;
    if constexpr (kRun) {
      run->next = r.first + 1;
      run->end = r.end;
    }
    attempt = 1;
    counted = true;
    superseded = false;
    return true;
  };
  // Anything to claim (for this consumer or not: a claim passes over the others') or
  // waiting in the map to be delivered again. Not a delivery out with a member that
  // the full window moved to the map: dropped unsettled without ack_wait it never
  // comes again, and a drained member of a closed engine must not wait for it (found
  // by the adversarial review: after Close such a member's pulls ran out their
  // timeouts for ever, never Cancelled).
  auto available = [&] { return engine_internal::CursorUnread(k) > 0 || (g.held() > 0 && g.Queued() > 0); };
  // The dead letters the tries handed out (TimeOut and Nak give up first). Each entry
  // is read (pinned) before the trim may pass it (GroupCursor::DeadRead). Also when
  // the wait then runs out: they left the map, and nothing else would give them up.
  auto give_up = [&] {
    for (const GroupCursor::Redelivery& d : dead) {
      CursorLog::Ref ref;
      const bool read = reader.Read(d.seq, ref) == engine_internal::LogRead::kReady;
      g.DeadRead(1);
      if (read) {
        engine_internal::DeadLetter(c, ref->h, d.attempt, "max_deliver", "nak", {},
                                    engine_internal::CursorMayRelease(c, *ref));
        engine_internal::CursorDone(*ref);
      }
    }
    dead.clear();
  };
  for (;;) {
    if (c.deleted.load(std::memory_order_acquire)) return engine_internal::Deleted(c);
    // What the batch claimed before comes first (its claim checked `deleted` then).
    bool claimed_before = false;
    if (kRun && !run->empty()) {
      seq = run->next++;
      attempt = 1;
      counted = true;
      superseded = false;
      claimed_before = true;
    } else if (!take()) {
      // Nothing claimed is left in the batch's run: the room it took goes back before
      // this waits (a publisher blocked for it must not wait for the end of the batch).
      if (kRun && run->first_deliveries > 0) engine_internal::TakeRoom(k, *run);
      const bool got = WaitUntil<BudgetedWait>(
          k.data, deadline_ns, take,
          [&] { return k.closed.load(std::memory_order_acquire) && !available(); }, available);
      if (!got) {
        give_up();  // what a try handed out past max_deliver before the wait ran out
        if (c.deleted.load(std::memory_order_acquire)) return engine_internal::Deleted(c);
        if (k.closed.load(std::memory_order_acquire) && !available()) {
          return absl::CancelledError("engine closed: consumer '" + c.config.name + "' member " +
                                      std::to_string(index_) + " is drained");
        }
        if (!describe) return absl::Status(absl::StatusCode::kDeadlineExceeded, "");
        return absl::DeadlineExceededError("no message for consumer '" + c.config.name + "' member " +
                                           std::to_string(index_) + " before the timeout");
      }
    }
    give_up();
    if (attempt == 1 && !claimed_before) {
      // A claim and DeleteConsumer's sweep (ReleaseCursorInterest) are ordered by
      // their read-modify-writes of the cursor (Claim, ClaimRest): a claim before the
      // sweep's is one it sees and leaves to this member (moved to the overflow map,
      // which keeps its entry: SpillBelow), and one after it takes only what was
      // published since, which is not this consumer's (it is no longer listed). So
      // no further read-modify-write here: a claim that meets the deletion lets go
      // of its message now, one that does not delivers it, and its Message lets go
      // (Message::Settle, Message::Release). What a batch claimed and has not
      // delivered when it meets the deletion later is EndCursorRun's to let go of.
      if (c.deleted.load(std::memory_order_acquire)) [[unlikely]] {
        engine_internal::LetGoClaimed(c, reader, seq);
        return engine_internal::Deleted(c);
      }
    }
    if (superseded) {  // an older delivery's ack settled it after it was queued again
      (void)g.Drop(seq);
      c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    CursorLog::Ref ref;
    if (reader.Read(seq, ref) != engine_internal::LogRead::kReady) {
      (void)g.Drop(seq);  // (not expected: the log keeps what a cursor holds)
      continue;
    }
    if ((ref->mask & k.bit) == 0) {  // another consumer's (or before this one's start)
      (void)g.Ack(seq);
      continue;
    }
    if (attempt == 1) {
      if constexpr (kRun) {
        ++run->first_deliveries;  // counted by TakeRoom, before the batch waits or ends
      } else {
        // seq_cst, then the wake-up: a publisher may wait for this room
        // (event_count.hpp inv. 2).
        k.taken.fetch_add(1, std::memory_order_seq_cst);
        k.room.NotifyOne();
      }
    }
    if (attempt == 1 && ref->limit_ns != INT64_MAX && c.enforce_event_ttl) {
      if ((ref->taken.fetch_or(k.bit, std::memory_order_acq_rel) & k.bit) != 0) {
        (void)g.Ack(seq);  // the timer gave it up before this claim (and may have let go of h)
        continue;
      }
      k.limits_taken.fetch_add(1, std::memory_order_relaxed);  // its expiry is no timer's now
    }
    if (attempt == 1 && g.options().ack_wait_ns > 0 && g.Settled(seq) && !g.IsOut(seq)) [[unlikely]] {
      // The timer's ack_wait expiry took this claim before its delivery: the thread
      // stalled longer than ack_wait between the claim and here (a batch claims its
      // sequences before it delivers them). It comes again as a redelivery; counted
      // here as a delivery that timed out, as the expiry counted it. (Found by the
      // adversarial review: a batch's claimed messages went out twice, attempt 1
      // after the expiry and attempt 2.) Only an expiry moves a claim that is out
      // with its member and not delivered yet (a spill keeps it out: IsOut).
      c.group->OnQueued(index_);
      c.CountOut();
      continue;
    }
    if (!counted) c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
    // A first delivery's claimer owns it (nothing else can be done with it); a
    // redelivery may race an older delivery's ack.
    // An entry that holds its record: the Message counts itself in `remaining` until
    // its Release (the hold passes to it, Keep); a pull that passes over the entry
    // gives it back here.
    engine_internal::EntryHold hold = attempt == 1 ? engine_internal::EntryHold(*ref, engine_internal::EntryHold::Owner{})
                                                   : engine_internal::EntryHold(*ref);
    const Handle& h = hold.get();
    if (h == nullptr) {  // settled meanwhile (an older delivery's ack): nothing left to deliver
      (void)g.Drop(seq);
      continue;
    }
    StoredMessage& rec = *h;
    // One reading of the clock for this delivery: its max_age check, its queue limit
    // and its times (a batch's reading for a first delivery that was queued already).
    const std::int64_t now = now_ns >= 0 && attempt == 1 ? now_ns : c.clock->NowNanos();
    if (rec.state.load(std::memory_order_acquire) == engine_internal::kLive && rec.stream->Expired(rec, now)) {
      rec.stream->Retire(rec, engine_internal::kDiscarded);  // aged out (max_age) while it waited
    }
    if (rec.state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
      if (g.Drop(seq)) {  // the stream removed it: skipped
        engine_internal::CursorDone(*ref);
        c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    if (c.host != nullptr) c.host->FlushOutboxIfPending();
    if (attempt == 1 && ref->limit_ns <= now && c.enforce_event_ttl) {
      // Its own queue limit passed while it waited: given up, not delivered. A
      // DeleteConsumer's sweep that saw this claim (IsOut) may have let go of it
      // already (found by the adversarial helper: one message too few in the stream).
      (void)g.Ack(seq);
      c.counts.expired.fetch_add(1, std::memory_order_relaxed);
      engine_internal::DeadLetter(c, h, 0, "expired", "queue timeout", {},
                                  engine_internal::FirstToRelease(*ref, k.bit));
      engine_internal::CursorDone(*ref);
      continue;
    }
    Lane& lane = *c.lanes[index_];
    engine_internal::RecordCursorDelivery(lane, now, h->publish_ns);
    c.group->OnQueued(index_);  // the member's load, which its settle takes back (OnDone)
    c.CountOut();
    if (g.options().ack_wait_ns > 0) {
      if (attempt == 1) g.NoteClaim(index_, seq + 1, now);
      if (c.host != nullptr) c.host->WakeTimer(engine_internal::SatAdd(now, g.options().ack_wait_ns));
    }
    out.Deliver(hold.Keep(), consumer_, index_, attempt, now, /*shadow=*/false);  // Message::Release gives it back
    out.cursor_entry_ = ref.operator->();
    out.cursor_pin_ = ref.Detach();  // the Message keeps the entry readable
    if (c.tracer != nullptr) [[unlikely]] TraceDelivery(out, now);
    return absl::OkStatus();
  }
}

template absl::Status Member::PopCursor<true>(std::int64_t, Message&, std::int64_t, bool,
                                              engine_internal::CursorRun*);
template absl::Status Member::PopCursor<false>(std::int64_t, Message&, std::int64_t, bool,
                                               engine_internal::CursorRun*);

absl::Status Message::SettleCursor(Settlement how, std::int64_t delay_ns, std::string_view description,
                                   std::int64_t now, std::int64_t latency, engine_internal::AckRun* run) {
  using engine_internal::GroupCursor;
  ConsumerState& c = *consumer_;
  GroupCursor& g = c.cursor->cursor;
  const std::uint64_t seq = msg_->seq;
  using Found = GroupCursor::Found;
  switch (how) {
    case Settlement::kAck: {
      const GroupCursor::Acked a = g.AckDelivery(seq, attempt_);
      if (!a.settled) {
        c.counts.late_acks.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      }
      // This delivery's work ends here only when it was the one out. A delivery whose
      // ack wait expired was counted done then (a failure, CursorTimers); a newer one
      // out with another member ends unfinished, as a lane consumer counts it (found
      // by the adversarial review: a late ack counted its member's work done twice).
      // Inside an AckBatch (`run`), the slot given back, the member's health update
      // and the latency go to the run, which makes them once for its acks.
      if (run == nullptr) {
        if (a.was_out) c.Unsettle();
        if (a.mine) {
          c.group->OnDone(member_, Outcome::kSuccess, latency, now);
        } else if (a.other_member != GroupCursor::kUnknownMember) {
          c.group->OnDone(a.other_member, Outcome::kDropped, 0);
        }
        c.ack_latency_ns.Record(static_cast<std::uint64_t>(latency));
      } else {
        if (a.was_out) ++run->unsettled;
        if (a.mine) {
          run->latencies.push_back(latency);
        } else if (a.other_member != GroupCursor::kUnknownMember) {
          c.group->OnDone(a.other_member, Outcome::kDropped, 0);
        }
        run->recorded.push_back(static_cast<std::uint64_t>(latency));
      }
      if (c.config.batch.adaptive) c.batchers[member_]->ObserveRtt(latency);
      if (engine_internal::CursorMayRelease(c, *cursor_entry_)) (void)engine_internal::RetireOnSettle(c, *msg_);
      // The consumer is done with the entry. When this Message holds the record too (an
      // entry that holds it), its Release gives back both counts with one subtraction.
      if (cursor_entry_->in_place && cursor_pin_ != nullptr) {
        cursor_done_owed_ = true;
      } else {
        engine_internal::CursorDone(*cursor_entry_);
      }
      return absl::OkStatus();
    }
    case Settlement::kNak: {
      if (c.LastAttempt(attempt_)) {
        if (g.Finish(seq, attempt_) != Found::kCurrent) return absl::OkStatus();
        c.Unsettle();
        c.group->OnDone(member_, Outcome::kFailure, latency);
        engine_internal::DeadLetter(c, msg_, attempt_, "max_deliver", "nak", span_id_,
                                    engine_internal::CursorMayRelease(c, *cursor_entry_));
        engine_internal::CursorDone(*cursor_entry_);
        return absl::OkStatus();
      }
      const std::int64_t due = delay_ns > 0 ? engine_internal::SatAdd(now, delay_ns) : now;
      // Queued again behind what is published now, as a lane consumer queues it.
      const std::uint64_t behind = c.cursor->stream->end.load(std::memory_order_acquire);
      if (g.Nak(seq, attempt_, due, /*counted=*/delay_ns == 0, behind) != Found::kCurrent) {
        return absl::OkStatus();
      }
      c.Unsettle();
      c.group->OnDone(member_, Outcome::kFailure, latency, now);
      // DeleteConsumer's sweep may have left this delivery to its member (out when it
      // looked): queued again now, nobody would take it. Both pass `gate` with a
      // read-modify-write, so the later sees what the earlier did: the sweep the nak
      // (and drops it), or this thread the deletion (and lets go here).
      c.cursor->gate.fetch_add(1, std::memory_order_acq_rel);
      if (c.deleted.load(std::memory_order_relaxed)) {
        engine_internal::CursorLetGo(c, *cursor_entry_, seq);
        return absl::OkStatus();
      }
      if (delay_ns == 0) {
        if (msg_->state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
          // Removed by the stream: skipped, as a redelivery of it is.
          if (g.Drop(seq)) engine_internal::CursorDone(*cursor_entry_);
          c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
          return absl::OkStatus();
        }
        c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
        c.cursor->data.NotifyOne();
      } else if (c.host != nullptr) {
        c.host->WakeTimer(due);
      }
      return absl::OkStatus();
    }
    case Settlement::kTerm: {
      if (g.Finish(seq, attempt_) != Found::kCurrent) return absl::OkStatus();
      c.Unsettle();
      c.group->OnDone(member_, Outcome::kDropped, latency);
      engine_internal::DeadLetter(c, msg_, attempt_, "term", description, span_id_,
                                  engine_internal::CursorMayRelease(c, *cursor_entry_));
      engine_internal::CursorDone(*cursor_entry_);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace inferq
