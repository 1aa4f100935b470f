// File: src/engine/pull.cpp
//
// Pulls: Member::PopOne (one deliverable message off the lane), Next, NextBatch,
// and the Consumer handle.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq {

// ---------------------------------------------------------------------------------
// Member and Consumer

namespace {

absl::Status Deleted(const ConsumerState& c) {
  return absl::CancelledError("consumer '" + c.config.name + "' of stream '" + c.config.stream +
                              "' was deleted");
}

// Why a pull of member `m` got no max_ack_pending slot: the engine closed
// (Cancelled) or the deadline passed (DeadlineExceeded).
absl::Status NoSlot(const ConsumerState& c, const Lane& lane, std::uint32_t m,
                    ConsumerState::Slot slot) {
  if (slot == ConsumerState::Slot::kClosed) {
    if (c.deleted.load(std::memory_order_acquire)) return Deleted(c);
    const std::size_t left = lane.ring.size_approx();
    if (left == 0) {
      return absl::CancelledError("engine closed: consumer '" + c.config.name +
                                  "' member " + std::to_string(m) + " is drained");
    }
    return absl::CancelledError("engine closed: consumer '" + c.config.name +
                                "' is at max_ack_pending " + std::to_string(c.max_ack_pending) +
                                "; member " + std::to_string(m) +
                                " gets no more messages (" + std::to_string(left) +
                                " left queued)");
  }
  return absl::DeadlineExceededError(
      "consumer '" + c.config.name + "' has max_ack_pending " +
      std::to_string(c.max_ack_pending) + " deliveries unacknowledged; member " +
      std::to_string(m) + " got no message before the timeout");
}

// A consumer never receives what its stream has discarded (limits, max_age); an
// event that aged out while queued is discarded here. True when `d` was discarded:
// it is skipped, and its queue timeout and pending entry go with it.
bool SkipIfDiscarded(ConsumerState& c, std::uint32_t m, const engine_internal::Delivery& d,
                     std::int64_t now) {
  const Handle& h = d.h;
  StreamState& stream = *h->stream;
  if (stream.log != nullptr) {
    // A file stream's index entry is retired by the stream (TrimFront); this copy
    // of the message is only skipped.
    if (!stream.Discarded(*h) && !stream.Expired(*h, now)) return false;
  } else {
    if (h->state.load(std::memory_order_acquire) == engine_internal::kLive &&
        stream.Expired(*h, now)) {
      stream.Retire(*h, engine_internal::kDiscarded);
    }
    if (h->state.load(std::memory_order_acquire) != engine_internal::kDiscarded) return false;
  }
  c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
  c.group->OnDone(m, Outcome::kDropped, 0);
  if (!d.shadow && c.config.lifecycle != nullptr) engine_internal::ForgetDiscarded(c, h->seq);
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
      c.wheel->Cancel(it->second.timer);
      c.pending.erase(it);
    }
  }
  return true;
}

// The queue timeout of a first delivery: given up when it passed (reject), or moved
// behind what is queued now, once (delay). True when `d` is not to be delivered now
// (dead-lettered, already dead-lettered by the timer, or pushed back on `lane`).
bool ApplyQueueTimeout(ConsumerState& c, Lane& lane, std::uint32_t m,
                       engine_internal::Delivery& d, std::int64_t now) {
  if (d.attempt != 1 || d.shadow || !c.has_waiting.load(std::memory_order_acquire)) return false;
  const Handle& h = d.h;
  std::unique_lock lock(c.pending_mu);
  auto it = c.waiting.find(h->seq);
  if (it == c.waiting.end()) return false;
  ConsumerState::Waiting& w = it->second;
  if (w.state == ConsumerState::kQueued && now >= w.expiry_ns) {
    c.wheel->Cancel(w.timer);
    if (c.config.timeout_action == TimeoutAction::kReject) {
      c.waiting.erase(it);
      lock.unlock();
      c.counts.expired.fetch_add(1, std::memory_order_relaxed);
      c.group->OnDone(m, Outcome::kDropped, 0);
      engine_internal::DeadLetter(c, h, 0, "expired", "queue timeout");
      return true;
    }
    w.state = ConsumerState::kDelayed;
    c.counts.delayed.fetch_add(1, std::memory_order_relaxed);
  }
  if (w.state == ConsumerState::kExpired) {  // dead-lettered when it expired
    c.waiting.erase(it);
    lock.unlock();
    c.group->OnDone(m, Outcome::kDropped, 0);
    return true;
  }
  if (w.state == ConsumerState::kDelayed && lane.ring.size_approx() > 0) {
    w.state = ConsumerState::kRequeued;
    lock.unlock();
    if (lane.ring.try_push(std::move(d))) return true;
    lock.lock();
    it = c.waiting.find(h->seq);
  }
  if (it != c.waiting.end()) {
    c.wheel->Cancel(it->second.timer);
    c.waiting.erase(it);
  }
  return false;
}

// Ack tracking of a delivery handed to member `m` (tracked consumers): its pending
// entry and ack_wait timer. False when a redelivery is no longer wanted (an ack of an
// older delivery settled the message meanwhile): it is skipped.
bool TrackDelivery(ConsumerState& c, std::uint32_t m, const engine_internal::Delivery& d,
                   std::int64_t now) {
  if (!c.tracked || d.shadow) return true;
  const Handle& h = d.h;
  std::unique_lock lock(c.pending_mu);
  if (c.retired) {
    // Popped before DeleteConsumer drained the lane, tracked after its sweep: a
    // first delivery lets go of the stream here (a redelivery's pending entry was
    // swept), and the pull goes on to find the lane closed.
    lock.unlock();
    if (d.attempt == 1) engine_internal::ReleaseInterest(c, *h);
    return false;
  }
  const std::int64_t deadline = engine_internal::SatAdd(now, c.AckWaitFor(d.attempt));
  engine_internal::Pending* p;
  if (d.attempt == 1) {
    auto [it, inserted] = c.pending.try_emplace(h->seq, engine_internal::Pending{h, m, 1, 0});
    if (!inserted) {  // (not expected: a first delivery is pulled once)
      c.wheel->Cancel(it->second.timer);
      it->second = engine_internal::Pending{h, m, 1, 0};
    }
    p = &it->second;
  } else {
    auto it = c.pending.find(h->seq);
    if (it == c.pending.end() || it->second.attempt != d.attempt ||
        it->second.member != kNoMember) {
      c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
      c.group->OnDone(m, Outcome::kDropped, 0);
      return false;
    }
    it->second.member = m;
    p = &it->second;
  }
  c.ArmAckWait(h->seq, *p, deadline);
  return true;
}

// A batch's deliveries from one lane (Member::GatherBatch): their publish ->
// deliver latencies go to the lane's histogram together (Histogram::RecordMany),
// when the batch ends or before it waits.
struct DeliveryRun {
  Lane* lane = nullptr;
  absl::InlinedVector<std::uint64_t, 64> delays;
  void Flush() {
    if (lane != nullptr) lane->deliver_latency_ns.RecordMany(delays);
    delays.clear();
  }
};
// The GatherBatch running on this thread (nullptr: none).
thread_local DeliveryRun* t_delivery_run = nullptr;

// The lane's delivery counters: count (the histogram's), publish -> deliver
// latency, and its EWMA (alpha 1/8) for flow control.
void RecordDelivery(Lane& lane, std::int64_t now, std::int64_t publish_ns) {
  const std::int64_t delay = std::max<std::int64_t>(0, engine_internal::SatSub(now, publish_ns));
  if (DeliveryRun* run = t_delivery_run; run != nullptr && run->lane == &lane) {
    run->delays.push_back(static_cast<std::uint64_t>(delay));
  } else {
    lane.deliver_latency_ns.Record(static_cast<std::uint64_t>(delay));
  }
  const std::int64_t ewma = lane.delay_ewma_ns.load(std::memory_order_relaxed);
  lane.delay_ewma_ns.store(ewma == 0 ? delay : ewma + (delay - ewma) / 8,
                           std::memory_order_relaxed);
}

}  // namespace

absl::Status Member::PopOne(std::int64_t deadline_ns, Message& out, std::int64_t now_ns, bool describe,
                            std::size_t* quiet_pops, engine_internal::CursorRun* run) {
  ConsumerState& c = *consumer_;
  if (c.deleted.load(std::memory_order_acquire)) [[unlikely]] {
    if (c.cursor != nullptr) engine_internal::DropMemberReader(c, index_);
    return Deleted(c);
  }
  if (c.AckLogFailed()) return c.AckLogFailure();
  if (c.cursor != nullptr) {
    if (run != nullptr) return PopCursor<true>(deadline_ns, out, now_ns, describe, run);
    return PopCursor<false>(deadline_ns, out, now_ns, describe, nullptr);
  }
  Lane& lane = *c.lanes[index_];
  // max_ack_pending: take a slot before pulling, so that no more than the limit is
  // ever out; it is given back when the pull ends without a countable delivery.
  const bool limited = c.max_ack_pending > 0 && c.config.ack == AckPolicy::kExplicit;
  if (const ConsumerState::Slot slot = limited ? c.ReserveSlot(deadline_ns)
                                               : ConsumerState::Slot::kTaken;
      slot != ConsumerState::Slot::kTaken) {
    if (!describe) {
      return absl::Status(
          slot == ConsumerState::Slot::kClosed ? absl::StatusCode::kCancelled : absl::StatusCode::kDeadlineExceeded,
          "");
    }
    return NoSlot(c, lane, index_, slot);
  }
  struct SlotGuard {
    ConsumerState* c;
    bool held;
    ~SlotGuard() {
      if (held) c->Unsettle();
    }
  } slot{&c, limited};
  // Parked deliveries (and a backlog whose chunk could not be read: the stream's
  // mutex was held) go to the lanes before this pull waits on an empty one, so that
  // a pull makes progress without the timer (EngineOptions::manual_timers).
  if (c.has_parked.load(std::memory_order_acquire) && lane.ring.size_approx() == 0) {
    engine_internal::RetryParked(c);
  }
  engine_internal::Delivery d;
  for (;;) {
    const bool popped = quiet_pops != nullptr && deadline_ns == 0
                            ? lane.ring.try_pop_quiet(d) && (++*quiet_pops, true)
                            : lane.ring.pop_until(d, deadline_ns);
    if (!popped) {
      if (c.deleted.load(std::memory_order_acquire)) return Deleted(c);
      if (c.AckLogFailed()) return c.AckLogFailure();  // it closed the lanes
      if (lane.ring.closed() && lane.ring.size_approx() == 0) {
        if (c.deleted.load(std::memory_order_acquire)) return Deleted(c);
        return absl::CancelledError("engine closed: consumer '" + consumer_->config.name +
                                    "' member " + std::to_string(index_) + " is drained");
      }
      // A batch's end is no error: no message to build (it cost a batch of a
      // 1 x 4 fan-out about 870 instructions).
      if (!describe) return absl::Status(absl::StatusCode::kDeadlineExceeded, "");
      return absl::DeadlineExceededError("no message for consumer '" +
                                         consumer_->config.name + "' member " +
                                         std::to_string(index_) + " before the timeout");
    }
    // The ack log failed while this pull waited: the delivery is dropped (its message
    // is not acked; a restart brings it again), and the pull reports the failure.
    if (c.AckLogFailed()) return c.AckLogFailure();
    if (c.has_parked.load(std::memory_order_acquire)) engine_internal::RetryParked(c);
    if (c.host != nullptr) {  // this pull made room: deferred dead letters may go now
      c.host->FlushOutboxIfPending();
    }
    // The caller's reading stands for an item that was there at once; one that came
    // after a wait gets its own.
    const std::int64_t now = now_ns >= 0 ? now_ns : c.clock->NowNanos();
    if (SkipIfDiscarded(c, index_, d, now)) continue;
    if (ApplyQueueTimeout(c, lane, index_, d, now)) continue;
    if (!TrackDelivery(c, index_, d, now)) continue;
    Handle& h = d.h;
    RecordDelivery(lane, now, h->publish_ns);
    if (c.config.ack == AckPolicy::kNone) {
      c.group->OnDone(index_, Outcome::kSuccess, 0, now);
    } else if (!d.shadow) {
      if (slot.held) {
        slot.held = false;  // the reserved slot is this delivery's
      } else {
        c.CountOut();
      }
    }
    out.Deliver(std::move(h), consumer_, index_, d.attempt, now, d.shadow);
    if (c.ack_log != nullptr && !d.shadow) {
      if (c.has_prior.load(std::memory_order_acquire)) {
        std::lock_guard lock(c.pending_mu);
        out.prior_ = c.PriorDeliveries(out.msg_->seq);
      }
      // Best effort: a failed write fails the log and the consumer (FailAckLog): this
      // delivery's ack then reports it, and the next pull returns it.
      (void)c.Record("D " + std::to_string(out.msg_->seq) + " " +
                     std::to_string(out.attempt_ + out.prior_));
    }
    if (!c.tracked && !d.shadow && c.config.ack == AckPolicy::kExplicit &&
        out.attempt_ + out.prior_ > 1) {
      c.redelivered_out.fetch_add(1, std::memory_order_relaxed);
    }
    if (c.config.lifecycle != nullptr && !d.shadow && !ThroughLifecycle(out)) continue;
    if (c.tracer != nullptr) [[unlikely]] TraceDelivery(out, now);
    return absl::OkStatus();
  }
}

void Member::TraceDelivery(Message& m, std::int64_t now) {
  ConsumerState& c = *consumer_;
  const Event& ev = *m.msg_->event;
  m.span_id_ = c.tracer->DeliverSpanId(ev.trace);
  // queue_wait: the store to the first delivery to this consumer (engine/trace.hpp).
  if (engine_internal::IsZero(m.span_id_) || m.attempt() != 1) return;
  Span s;
  s.stage = SpanStage::kQueueWait;
  s.context = ev.trace;
  s.context.span_id = c.tracer->NewSpanId();
  s.parent_span_id = ev.trace.span_id;
  s.destination = engine_internal::SpanText(ev.subject);
  s.stream = c.config.stream;
  s.consumer = c.config.name;
  s.member = index_;
  s.stream_seq = m.msg_->seq;
  s.delivery_count = 1;
  s.message_id = engine_internal::SpanText(ev.msg_id);
  s.body_size = ev.payload.size();
  c.tracer->Emit(std::move(s), m.msg_->publish_ns, now);
}

bool Member::ThroughLifecycle(Message& m) {
  ConsumerState& c = *consumer_;
  Lifecycle& lc = *c.config.lifecycle;
  const std::string id = engine_internal::LifecycleId(c, m.stream_seq());
  const std::string& model = m.event().model;
  // Put back for 50 ms (a model warming up, a commit that failed): it stays Pending.
  auto later = [&] {
    (void)m.Settle(Message::Settlement::kNak, 50'000'000, {}, /*through_lifecycle=*/false);
    return false;
  };
  auto terminate = [&](const std::string& why) {
    (void)m.Settle(Message::Settlement::kTerm, 0, "lifecycle: " + why, /*through_lifecycle=*/false);
    return false;
  };
  // Each pass moves the record one step or decides; another thread's transition of
  // the same record in between (a racing redelivery) makes it look again.
  for (int pass = 0; pass < 4; ++pass) {
    absl::StatusOr<MessageInfo> info = lc.GetMessage(id);
    if (!info.ok()) {  // a first delivery: Pending first, in its own transaction
      absl::Status st = lc.Enqueue(id, model);
      if (st.ok() || st.code() == absl::StatusCode::kAlreadyExists) continue;
      if (st.code() == absl::StatusCode::kInvalidArgument ||
          st.code() == absl::StatusCode::kNotFound ||
          st.code() == absl::StatusCode::kFailedPrecondition) {
        return terminate(std::string(st.message()));  // no model, unknown or evicted
      }
      return later();
    }
    switch (info->state) {
      case MessageState::kPending: {
        if (lc.StartProcessing(id).ok()) return true;
        absl::StatusOr<ModelInfo> mi = lc.GetModel(info->model);
        if (mi.ok() && mi->state == ModelState::kInference) continue;  // the record moved
        return later();  // warming up (or the commit failed)
      }
      case MessageState::kProcessing:
        return true;  // a redelivery (ack_wait expired, or a restart)
      case MessageState::kCompleted:
        // Its ack was lost (a crash between Complete and the ack record).
        (void)m.Settle(Message::Settlement::kAck, 0, {}, /*through_lifecycle=*/false);
        return false;
      case MessageState::kExpired:
        return terminate("expired (" + info->reason + ")");
    }
  }
  return later();
}

absl::StatusOr<Message> Member::Next(absl::Duration timeout) {
  Message m;
  if (absl::Status s = PopOne(DeadlineAfter(timeout), m); !s.ok()) return s;
  return m;
}

template <class Slots, class Commit, class Drop>
absl::StatusOr<std::size_t> Member::GatherBatch(std::size_t max_batch, absl::Duration max_queue_delay,
                                                absl::Duration timeout, Slots&& slots, Commit&& commit,
                                                Drop&& drop) {
  if (max_batch == 0) {
    return absl::InvalidArgumentError("NextBatch max_batch 0 is invalid; it must be > 0");
  }
  if (max_queue_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NextBatch max_queue_delay " +
                                      absl::FormatDuration(max_queue_delay) +
                                      " is negative");
  }
  // A cursor consumer's batch claims once for its free slots (CursorRun); what it
  // claimed and could not deliver is let go of when it ends, also by an exception.
  engine_internal::CursorRun cursor_run;
  engine_internal::CursorRun* const crun = consumer_->cursor != nullptr ? &cursor_run : nullptr;
  struct EndRun {
    engine_internal::ConsumerState* c;
    engine_internal::CursorRun* run;
    ~EndRun() {
      if (run != nullptr) engine_internal::EndCursorRun(*c, *run);
    }
  } end_run{consumer_, crun};
  cursor_run.want = max_batch;
  Message& first = slots(0);
  if (absl::Status s = PopOne(DeadlineAfter(timeout), first, -1, true, nullptr, crun); !s.ok()) {
    drop();
    return s;
  }
  const std::int64_t first_publish_ns = first.publish_time_ns();
  commit(0);
  // The batch closes max_queue_delay after its oldest event was published. Convert
  // that point from the engine clock to a steady-clock deadline for waiting.
  // ToInt64Nanoseconds saturates (an infinite delay gives INT64_MAX), so this
  // subtracts first and saturates the sum.
  const std::int64_t engine_now = consumer_->clock->NowNanos();
  const std::int64_t age_ns =
      std::max<std::int64_t>(0, engine_internal::SatSub(engine_now, first_publish_ns));
  const std::int64_t delay_ns = absl::ToInt64Nanoseconds(max_queue_delay);
  const std::int64_t remaining_ns = delay_ns > age_ns ? delay_ns - age_ns : 0;
  const std::int64_t now = SteadyClock::Now();
  const std::int64_t deadline = remaining_ns >= kNoDeadline - now
                                    ? kNoDeadline
                                    : now + remaining_ns;
  Lane& lane = *consumer_->lanes[index_];
  // What this batch popped without waking a publisher blocked on the full lane: it
  // wakes them once, at the end or before it waits (never waits on them asleep).
  // The latencies of what it takes without waiting are recorded then too
  // (DeliveryRun); a pull that waits records its own at once.
  std::size_t quiet = 0;
  DeliveryRun run{&lane, {}};
  struct Scope {  // also when a pull throws (a lifecycle's store)
    DeliveryRun* prev;
    DeliveryRun* run;
    ~Scope() {
      run->Flush();
      t_delivery_run = prev;
    }
  } scope{t_delivery_run, &run};
  auto pop_now = [&](Message& m) {  // deadline 0: never waits
    t_delivery_run = &run;
    const bool got = PopOne(0, m, engine_now, /*describe=*/false, &quiet, crun).ok();
    t_delivery_run = scope.prev;
    return got;
  };
  auto wake_pushers = [&] {
    lane.ring.wake_pushers(quiet);
    quiet = 0;
    run.Flush();
  };
  std::size_t n = 1;
  while (n < max_batch) {
    Message& m = slots(n);
    cursor_run.want = max_batch - n;
    // What is queued already is delivered at this batch's reading of the clock; one
    // that comes after a wait gets its own (PopOne's now_ns).
    if (pop_now(m)) {
      commit(n++);
      continue;
    }
    if (remaining_ns > 0) {
      wake_pushers();
      if (PopOne(deadline, m, -1, /*describe=*/false, nullptr, crun).ok()) {
        commit(n++);
        continue;
      }
    }
    drop();
    break;
  }
  wake_pushers();
  lane.CountBatch(n);
  return n;
}

absl::StatusOr<std::vector<Message>> Member::NextBatch(std::size_t max_batch,
                                                       absl::Duration max_queue_delay,
                                                       absl::Duration timeout) {
  std::vector<Message> batch;
  if (max_batch > 0) batch.reserve(std::min<std::size_t>(max_batch, 256));
  absl::StatusOr<std::size_t> n = GatherBatch(
      max_batch, max_queue_delay, timeout,
      [&](std::size_t) -> Message& { return batch.emplace_back(); }, [](std::size_t) {},
      [&] { batch.pop_back(); });
  if (!n.ok()) return n.status();
  for (Message& m : batch) m.batch_ = static_cast<std::uint32_t>(batch.size());
  return batch;
}

absl::StatusOr<std::size_t> Member::NextBatch(std::span<Message> out, absl::Duration max_queue_delay,
                                              absl::Duration timeout) {
  if (out.empty()) {
    return absl::InvalidArgumentError("NextBatch into an empty span: it must hold at least one Message");
  }
  // A pull fills its Message before the consumer's lifecycle may settle it instead
  // of handing it out (PopOne): with a lifecycle, each pull goes into `scratch` and
  // only a delivery handed out into `out`, so a slot after the count (or every slot,
  // on an error) keeps what the caller left there (found by the adversarial review).
  // Without one, a pull that fails leaves its Message untouched: straight into `out`.
  absl::StatusOr<std::size_t> n;
  if (consumer_->config.lifecycle == nullptr) {
    n = GatherBatch(
        out.size(), max_queue_delay, timeout, [&](std::size_t i) -> Message& { return out[i]; },
        [](std::size_t) {}, [] {});
  } else {
    Message scratch;
    n = GatherBatch(
        out.size(), max_queue_delay, timeout, [&](std::size_t) -> Message& { return scratch; },
        [&](std::size_t i) { out[i] = std::move(scratch); }, [&] { scratch = Message(); });
  }
  if (!n.ok()) return n.status();
  for (std::size_t i = 0; i < *n; ++i) out[i].batch_ = static_cast<std::uint32_t>(*n);
  return n;
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
    const BatchDecision d = batcher.Decide(batch.size() + queued(), oldest, now);
    if (d.take > 0 || waited_out) {
      std::size_t quiet = 0;  // as in GatherBatch: one wake-up of blocked publishers
      while (batch.size() < d.take) {
        Message m;
        // Deadline 0: only what is queued now (others took the rest: go with what is
        // here), delivered at this batch's `now`.
        if (!PopOne(0, m, now, /*describe=*/false, &quiet).ok()) break;
        batch.push_back(std::move(m));
      }
      lane.ring.wake_pushers(quiet);
      lane.CountBatch(batch.size());
      for (Message& m : batch) m.batch_ = static_cast<std::uint32_t>(batch.size());
      return batch;
    }
    // Wait for one more message, at most until the batch's delay runs out (the
    // wait is on the engine clock, converted to a steady-clock deadline).
    const std::int64_t wait_ns = d.wait_until_ns == INT64_MAX ? INT64_MAX : engine_internal::SatSub(d.wait_until_ns, now);
    const std::int64_t steady = SteadyClock::Now();
    const std::int64_t deadline = wait_ns >= kNoDeadline - steady ? kNoDeadline : steady + wait_ns;
    Message m;
    if (!PopOne(deadline, m, -1, /*describe=*/false).ok()) {  // the delay ran out (or the engine closed)
      waited_out = true;
      continue;
    }
    batch.push_back(std::move(m));
  }
}

absl::Status Member::ReportLoad(const MemberLoadReport& report) {
  return consumer_->group->ReportLoad(index_, report);
}

std::size_t Member::queued() const {
  if (consumer_->cursor != nullptr) return engine_internal::CursorPending(*consumer_);
  return consumer_->lanes[index_]->ring.size_approx();
}

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

}  // namespace inferq
