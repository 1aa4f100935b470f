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
void RecordCursorDelivery(Lane& lane, std::int64_t now, std::int64_t publish_ns) {
  const std::int64_t delay = std::max<std::int64_t>(0, SatSub(now, publish_ns));
  lane.deliver_latency_ns.Record(static_cast<std::uint64_t>(delay));
  const std::int64_t ewma = lane.delay_ewma_ns.load(std::memory_order_relaxed);
  lane.delay_ewma_ns.store(ewma == 0 ? delay : ewma + (delay - ewma) / 8, std::memory_order_relaxed);
}

// Sequences published and not claimed yet by `k`'s members (some may be for other
// consumers of the stream: skipped when claimed).
std::uint64_t Unclaimed(const CursorState& k) {
  const std::uint64_t end = k.stream->end.load(std::memory_order_acquire);
  const std::uint64_t next = k.cursor.next();
  return end > next ? end - next : 0;
}

// Trims the stream's cursor log behind every cursor consumer's lowest held sequence.
// Requires stream.mu.
void TrimCursorLog(StreamState& stream) {
  StreamCursors& s = *stream.cursors;
  std::uint64_t lowest = s.end.load(std::memory_order_relaxed);
  for (const ConsumerState* c : stream.consumers) {
    if (c->cursor != nullptr) lowest = std::min(lowest, c->cursor->cursor.lowest_held());
  }
  s.log.TrimBefore(lowest);
  s.since_trim = 0;
}

}  // namespace

bool CursorEligible(const StreamState& stream, const ConsumerState& c) {
  const ConsumerConfig& cfg = c.config;
  if (stream.is_file() || stream.log != nullptr) return false;
  if (cfg.members != 1 || cfg.ack != AckPolicy::kExplicit) return false;
  if (c.max_ack_pending > 0 || !c.backoff_ns.empty() || cfg.qos.has_value()) return false;
  if (cfg.lifecycle != nullptr || !cfg.accept_codecs.empty()) return false;
  if (cfg.queue_timeout > absl::ZeroDuration() || cfg.replay != ReplayPolicy::kInstant) return false;
  if (!cfg.predicate.is_trivial() || cfg.overflow != OverflowPolicy::kBlock) return false;
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
  if (stream.cursors == nullptr) stream.cursors = std::make_unique<StreamCursors>(stream.next_seq);
  StreamCursors& s = *stream.cursors;
  const std::uint64_t bit = std::uint64_t{1} << std::countr_one(s.used_bits);
  s.used_bits |= bit;
  const std::uint64_t capacity = static_cast<std::uint64_t>(c.lanes[0]->ring.capacity()) * c.config.members;
  // The window holds at least what the lanes held: W = 32 * 2^bits >= capacity.
  unsigned bits = 0;
  while ((std::uint64_t{32} << bits) < capacity && bits < 20) ++bits;
  GroupCursor::Options o;
  o.window_word_bits = bits;
  o.start = std::max(stream.next_seq, c.start_after + 1);
  o.ack_wait_ns = c.tracked ? c.ack_wait_ns : 0;
  o.max_deliver = c.max_deliver > 0 ? static_cast<std::uint32_t>(std::min<std::int64_t>(c.max_deliver, UINT32_MAX)) : 0;
  o.members = c.config.members;
  c.cursor = std::make_unique<CursorState>(o, s, bit, c.config.members, capacity);
}

absl::Status CursorRoom(StreamState& stream, std::uint64_t targets, bool wait, bool internal, bool* busy) {
  if (internal) return absl::OkStatus();
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k == nullptr || (targets & k->bit) == 0) continue;
    auto room = [&] { return Unclaimed(*k) < k->capacity || k->closed.load(std::memory_order_acquire); };
    if (room()) continue;
    if (!wait) {
      c->counts.overflow_rejected.fetch_add(1, std::memory_order_relaxed);
      *busy = true;
      return absl::ResourceExhaustedError(
          "stream '" + stream.config.name + "': consumer '" + c->config.name + "' has " +
          std::to_string(Unclaimed(*k)) + " messages not yet pulled (lane_capacity x members = " +
          std::to_string(k->capacity) + "; overflow block, and TryPublish does not wait)");
    }
    // The stream's mutex stays held: that is the backpressure (as a full lane's).
    stream.blocked_publishers.fetch_add(1, std::memory_order_acq_rel);
    WaitUntil<HybridWait>(
        k->room, kNoDeadline, room, [] { return false; }, [] { return false; });
    stream.blocked_publishers.fetch_sub(1, std::memory_order_acq_rel);
  }
  return absl::OkStatus();
}

void PushToCursors(StreamState& stream, const Handle& h, std::uint64_t targets) {
  StreamCursors& s = *stream.cursors;
  const std::uint64_t seq = s.log.Claim(1);
  // One writer (the stream's mutex), an entry for every message stored since the log
  // was made: the log's sequence is the stream's.
  if (seq != h->seq) {
    std::fprintf(stderr, "inferq: stream '%s': cursor log sequence %llu is not the message's %llu\n",
                 stream.config.name.c_str(), static_cast<unsigned long long>(seq),
                 static_cast<unsigned long long>(h->seq));
    std::abort();
  }
  (void)s.log.Publish(seq, targets != 0 ? h : Handle(), targets);  // no reference: no taker
  // release: a puller that acquires `end` reads the published entry.
  s.end.store(seq + 1, std::memory_order_seq_cst);  // seq_cst: EventCount inv. 2
  for (ConsumerState* c : stream.consumers) {
    CursorState* k = c->cursor.get();
    if (k != nullptr && (targets & k->bit) != 0) k->data.NotifyOne();
  }
  if (++s.since_trim >= 256) TrimCursorLog(stream);
}

std::int64_t RunCursorTimers(ConsumerState& c, std::int64_t now) {
  CursorState& k = *c.cursor;
  GroupCursor& g = k.cursor;
  std::vector<GroupCursor::Redelivery> timed_out, dead;
  if (g.options().ack_wait_ns > 0) {
    g.Tick([&] { return c.clock->NowNanos(); });
    g.Expire(now);
  }
  g.TimeOut(now, timed_out, dead);
  // Queued again for redelivery, unless the stream removed the message meanwhile
  // (then it is skipped: the engine's redelivery skips it too).
  auto requeue = [&](std::uint64_t seq) {
    CursorLog::Ref ref;
    if (k.timer_reader.Read(seq, ref) == LogRead::kReady &&
        ref->h->state.load(std::memory_order_acquire) == kDiscarded) {
      (void)g.Drop(seq);
      c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
  };
  for (const GroupCursor::Redelivery& r : timed_out) {
    c.counts.ack_timeouts.fetch_add(1, std::memory_order_relaxed);
    c.Unsettle();
    requeue(r.seq);
  }
  std::sort(dead.begin(), dead.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  for (const GroupCursor::Redelivery& r : dead) {
    c.counts.ack_timeouts.fetch_add(1, std::memory_order_relaxed);
    c.Unsettle();
    CursorLog::Ref ref;
    if (k.timer_reader.Read(r.seq, ref) == LogRead::kReady) {
      DeadLetter(c, ref->h, r.attempt, "max_deliver", "ack_wait expired");
    }
  }
  std::vector<std::uint64_t> due;
  g.CountDue(now, due);  // delayed naks that came due
  for (std::uint64_t seq : due) requeue(seq);
  if (!timed_out.empty() || !due.empty()) k.data.NotifyAll();
  const std::int64_t next = g.next_due();
  return next == GroupCursor::kNever ? INT64_MAX : next;
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
  for (std::uint64_t s = g.lowest_held(); s < end; ++s) {
    CursorLog::Ref ref;
    if (reader.Read(s, ref) != LogRead::kReady || (ref->mask & k.bit) == 0) continue;
    if (g.IsDone(s)) continue;
    (void)g.Drop(s);
    ReleaseInterest(c, *ref->h);
  }
}

std::uint64_t CursorPending(const ConsumerState& c) {
  const CursorState& k = *c.cursor;
  return Unclaimed(k) + k.cursor.held();
}

}  // namespace engine_internal

// ---------------------------------------------------------------------------------
// The puller and the settles

absl::Status Member::PopCursor(std::int64_t deadline_ns, Message& out, std::int64_t now_ns, bool describe) {
  using engine_internal::CursorLog;
  using engine_internal::GroupCursor;
  ConsumerState& c = *consumer_;
  engine_internal::CursorState& k = *c.cursor;
  GroupCursor& g = k.cursor;
  CursorLog::Reader& reader = *k.readers[index_];
  std::vector<GroupCursor::Redelivery> due, dead;
  std::uint64_t seq = 0;
  std::uint32_t attempt = 0;
  bool counted = true;
  bool superseded = false;
  // One try: a redelivery that is due, else the next sequence.
  auto take = [&] {
    if (g.held() > 0) {
      due.clear();
      g.TakeDue(c.clock->NowNanos(), due, dead, 1);
      if (!due.empty()) {
        seq = due[0].seq;
        attempt = due[0].attempt;
        counted = due[0].counted;
        superseded = due[0].superseded;
        return true;
      }
    }
    const GroupCursor::Range r = g.Claim(1, k.stream->end.load(std::memory_order_acquire));
    if (r.empty()) return false;
    seq = r.first;
    attempt = 1;
    counted = true;
    superseded = false;
    k.room.NotifyOne();  // a publisher may wait for the claim (overflow block)
    return true;
  };
  auto available = [&] { return engine_internal::CursorPending(c) > 0; };
  for (;;) {
    if (c.deleted.load(std::memory_order_acquire)) return engine_internal::Deleted(c);
    if (!take()) {
      const bool got = WaitUntil<BudgetedWait>(
          k.data, deadline_ns, take,
          [&] { return k.closed.load(std::memory_order_acquire) && !available(); }, available);
      if (!got) {
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
    for (const GroupCursor::Redelivery& d : dead) {  // (TimeOut and Nak give up first)
      CursorLog::Ref ref;
      if (k.timer_reader.Read(d.seq, ref) == engine_internal::LogRead::kReady) {
        engine_internal::DeadLetter(c, ref->h, d.attempt, "max_deliver", "nak");
      }
    }
    dead.clear();
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
    if (!counted) c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
    Handle h = ref->h;
    ref.reset();
    if (h->state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
      (void)g.Drop(seq);  // the stream removed it (a limit, a purge): skipped
      c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (c.host != nullptr) c.host->FlushOutboxIfPending();
    const std::int64_t now = now_ns >= 0 && attempt == 1 ? now_ns : c.clock->NowNanos();
    Lane& lane = *c.lanes[index_];
    engine_internal::RecordCursorDelivery(lane, now, h->publish_ns);
    c.unsettled.fetch_add(1, std::memory_order_relaxed);
    if (g.options().ack_wait_ns > 0) {
      if (attempt == 1) g.NoteClaim(index_, seq + 1, now);
      if (c.host != nullptr) c.host->WakeTimer(engine_internal::SatAdd(now, g.options().ack_wait_ns));
    }
    out.Release();
#ifndef NDEBUG
    c.live_messages.fetch_add(1, std::memory_order_relaxed);
#endif
    out.msg_ = std::move(h);
    out.consumer_ = consumer_;
    out.deliver_ns_ = now;
    out.member_ = index_;
    out.attempt_ = attempt;
    out.prior_ = 0;
    out.ack_tx_ = 0;
    out.out_tx_ = 0;
    out.shadow_ = false;
    out.acked_.store(false, std::memory_order_relaxed);
    out.span_id_ = {};
    out.batch_ = 0;
    if (c.tracer != nullptr) [[unlikely]] TraceDelivery(out, now);
    return absl::OkStatus();
  }
}

absl::Status Message::SettleCursor(Settlement how, std::int64_t delay_ns, std::string_view description,
                                   std::int64_t now, std::int64_t latency) {
  using engine_internal::GroupCursor;
  ConsumerState& c = *consumer_;
  GroupCursor& g = c.cursor->cursor;
  const std::uint64_t seq = msg_->seq;
  using Found = GroupCursor::Found;
  switch (how) {
    case Settlement::kAck: {
      const GroupCursor::Acked a = g.AckDelivery(seq);
      if (!a.settled) {
        c.counts.late_acks.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      }
      if (a.was_out) c.Unsettle();
      c.ack_latency_ns.Record(static_cast<std::uint64_t>(latency));
      (void)engine_internal::RetireOnSettle(c, *msg_);
      return absl::OkStatus();
    }
    case Settlement::kNak: {
      if (c.LastAttempt(attempt_)) {
        if (g.Finish(seq, attempt_) != Found::kCurrent) return absl::OkStatus();
        c.Unsettle();
        engine_internal::DeadLetter(c, msg_, attempt_, "max_deliver", "nak", span_id_);
        return absl::OkStatus();
      }
      const std::int64_t due = delay_ns > 0 ? engine_internal::SatAdd(now, delay_ns) : now;
      if (g.Nak(seq, attempt_, due, /*counted=*/delay_ns == 0) != Found::kCurrent) return absl::OkStatus();
      c.Unsettle();
      if (delay_ns == 0) {
        if (msg_->state.load(std::memory_order_acquire) == engine_internal::kDiscarded) {
          (void)g.Drop(seq);  // removed by the stream: skipped, as a redelivery of it is
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
      engine_internal::DeadLetter(c, msg_, attempt_, "term", description, span_id_);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace inferq
