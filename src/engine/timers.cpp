// File: src/engine/timers.cpp
//
// The timer run (Engine::RunTimers): each consumer's timer wheel (ack_wait
// expiries, delayed naks, queue timeouts), stalled members, call timeouts, flow
// control and lifecycle timeouts.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"
#include "absl/time/time.h"

namespace inferq {

namespace {

// The due timers of consumer `c`, all from its one wheel: deliveries whose ack wait
// expired (a failure of their member: redelivered or, after max_deliver,
// dead-lettered), delayed redeliveries, and queue timeouts that passed while the
// event waited in a lane. The wheel is advanced under pending_mu; what that decides
// is done after the lock is released (redelivery and dead letters take other locks).
// The consumer whose timers this thread runs now (Engine::RunTimers), if any.
thread_local const ConsumerState* t_timer_run = nullptr;

void RunConsumerTimers(ConsumerState& c, std::int64_t now) {
  if (!c.has_timers.load(std::memory_order_acquire)) return;
  using engine_internal::ConsumerTimer;
  struct Expired {
    engine_internal::Delivery d;
    std::uint32_t member;
    bool give_up;
  };
  std::vector<Expired> expired;
  std::vector<engine_internal::Delivery> delayed;
  std::vector<Handle> timed_out;
  {
    std::lock_guard lock(c.pending_mu);
    c.wheel->Advance(now, [&](ConsumerTimer&& t, std::int64_t due) {
      switch (t.kind) {
        case ConsumerTimer::kRedeliver: {
          if (c.tracked) {
            // Still waiting for this attempt (an ack of an older delivery may have won).
            auto it = c.pending.find(t.seq);
            if (it == c.pending.end() || it->second.attempt != t.attempt ||
                it->second.member != kNoMember) {
              return;
            }
            it->second.timer = TimerId{};  // fired
          }
          delayed.push_back({std::move(t.h), t.attempt, false});
          return;
        }
        case ConsumerTimer::kAckWait: {
          auto it = c.pending.find(t.seq);
          // Settling and a new delivery's ArmAckWait cancel the timer; this check is
          // for the invariant, not for a timer left behind. InProgress does not
          // cancel it: it moves deadline_ns, handled below.
          if (it == c.pending.end() || it->second.attempt != t.attempt ||
              it->second.armed_ns != due) {
            return;
          }
          // InProgress moved it (ExtendAckWait) to a deadline still ahead: wait for
          // that. A moved deadline that has passed too expires in this run (a timer
          // set from here would fire only in a later Advance).
          if (it->second.deadline_ns > now) {
            it->second.armed_ns = it->second.deadline_ns;
            it->second.timer = c.Schedule(it->second.deadline_ns, std::move(t));
            return;
          }
          const std::uint32_t member = it->second.member;
          // (A durable consumer counts the deliveries before a restart too.)
          const std::uint32_t deliveries = t.attempt + c.PriorDeliveries(t.seq);
          if (c.LastAttempt(deliveries)) {
            // Given up: the attempt it carries is the dead letter's delivery count.
            expired.push_back({{it->second.h, deliveries, false}, member, true});
            c.pending.erase(it);
            c.ForgetPrior(t.seq);
            return;
          }
          expired.push_back({{it->second.h, t.attempt + 1, false}, member, false});
          // Queued again for the next attempt; an ack of the expired delivery still wins.
          it->second.member = kNoMember;
          it->second.attempt = t.attempt + 1;
          it->second.deadline_ns = INT64_MAX;
          it->second.timer = TimerId{};  // fired
          return;
        }
        case ConsumerTimer::kQueueExpiry: {
          auto it = c.waiting.find(t.seq);
          if (it == c.waiting.end() || it->second.state != ConsumerState::kQueued ||
              it->second.expiry_ns != due) {
            return;
          }
          if (it->second.h->stream->Discarded(*it->second.h)) {
            c.waiting.erase(it);  // the stream dropped it: skipped when pulled, not expired
            return;
          }
          if (c.config.timeout_action == TimeoutAction::kReject) {
            it->second.state = ConsumerState::kExpired;  // skipped when pulled
            timed_out.push_back(it->second.h);
          } else {
            it->second.state = ConsumerState::kDelayed;
            c.counts.delayed.fetch_add(1, std::memory_order_relaxed);
          }
          return;
        }
      }
    });
    // Cleared under the lock that every Schedule holds: a timer scheduled after this
    // sets it again.
    c.has_timers.store(!c.wheel->empty(), std::memory_order_release);
  }
  for (Expired& e : expired) {
    c.counts.ack_timeouts.fetch_add(1, std::memory_order_relaxed);
    c.Unsettle();
    c.group->OnDone(e.member, Outcome::kFailure, 0);
    if (e.give_up) {
      engine_internal::DeadLetter(c, e.d.h, e.d.attempt, "max_deliver", "ack_wait expired");
    } else {
      engine_internal::Redeliver(c, std::move(e.d), e.member);
    }
  }
  for (engine_internal::Delivery& d : delayed) {
    engine_internal::Redeliver(c, std::move(d), kNoMember);
  }
  // Queue timeouts fire in deadline order; dead letters go out in stream order.
  std::sort(timed_out.begin(), timed_out.end(),
            [](const Handle& a, const Handle& b) { return a->seq < b->seq; });
  for (const Handle& h : timed_out) {
    c.counts.expired.fetch_add(1, std::memory_order_relaxed);
    engine_internal::DeadLetter(c, h, 0, "expired", "queue timeout");
  }
}

}  // namespace

namespace engine_internal {

void AwaitTimerRun(ConsumerState& c) {
  if (t_timer_run == &c) return;  // this thread's run of c: it ends after the caller
  std::lock_guard wait(c.timer_run_mu);
}

}  // namespace engine_internal

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
  // Streams with max_age (streams are never removed: the pointers stay valid);
  // reused between runs as `consumers` is.
  std::vector<engine_internal::StreamState*>& aging = impl_->timer_streams;
  aging.clear();
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load(std::memory_order_acquire)) return;
    for (auto& c : impl_->consumers) consumers.push_back(c.get());
    for (auto& s : impl_->streams) {
      // max_age_ns, not config.max_age: UpdateStream changes it under the stream's
      // mutex, not config_mu.
      // A file work queue's acks are taken out of its index here too when it is not
      // written.
      if (s->max_age_ns.load(std::memory_order_relaxed) > 0 ||
          s->has_removed_pending.load(std::memory_order_relaxed)) {
        aging.push_back(s.get());
      }
    }
  }
  // 0. max_age: messages older than it go, whether or not the stream is written.
  // try_lock: a publisher blocked on a full lane holds the stream's mutex, and the
  // timer never waits for it (the next run trims what this one skipped).
  for (engine_internal::StreamState* s : aging) {
    std::unique_lock lock(s->mu, std::try_to_lock);
    if (!lock.owns_lock() || s->deleted) continue;
    s->DrainRemoved();
    s->TrimFront(impl_->clock->NowNanos());
    if (s->log != nullptr) s->RetireLog();
  }
  if (impl_->has_calls.load(std::memory_order_acquire)) {
    for (Event& e : impl_->ExpireCalls()) (void)Publish(std::move(e), PublishMode::kInternal);
  }
  if (impl_->flow != nullptr) impl_->UpdateFlowControl(consumers);
  if (impl_->lifecycle != nullptr) (void)impl_->lifecycle->RunTimeouts();
  for (ConsumerState* c : consumers) {
    // Held for the consumer's whole run; a DeleteConsumer after the check below waits
    // for it (AwaitTimerRun), one before it is seen here.
    std::lock_guard run(c->timer_run_mu);
    if (c->deleted.load(std::memory_order_acquire)) continue;  // deleted since the snapshot
    t_timer_run = c;
    struct Clear {
      ~Clear() { t_timer_run = nullptr; }
    } clear;
    const std::int64_t now = impl_->clock->NowNanos();
    if (c->Cursor()) {
      const std::int64_t next = engine_internal::RunCursorTimers(*c, now);
      if (next != INT64_MAX) impl_->WakeTimer(next);
      continue;
    }
    // 1. Due timers (ack waits, delayed naks, queue timeouts), parked deliveries.
    RunConsumerTimers(*c, now);
    engine_internal::RetryParked(*c);
    // 2. Work moved off stalled members.
    if (c->tracked) impl_->MoveOffStalledMembers(*c, now);
  }
  impl_->WakeForNextTimer(consumers);
}

std::vector<Event> Engine::Impl::ExpireCalls() {
  // Calls whose timeout passed (queued or running): the caller gets DeadlineExceeded
  // and the call goes to its function's dead-letter subject.
  std::vector<Event> dead;
  std::lock_guard lock(calls_mu);
  call_wheel->Advance(clock->NowNanos(), [&](std::uint64_t id, std::int64_t) {
    auto it = calls.find(id);
    if (it == calls.end()) return;
    CallState& call = it->second;
    const char* where = call.running ? "running" : "queued";
    call.promise.set_value(absl::DeadlineExceededError(
        "call " + std::to_string(id) + " to function '" + call.fn + "' timed out after " +
        absl::FormatDuration(call.timeout) + " (" + where + ", " +
        std::to_string(call.attempts) + (call.attempts == 1 ? " try)" : " tries)")));
    Event e = CallDeadLetter(id, call, "expired", std::string("call timeout while ") + where);
    dead.push_back(std::move(e));
    calls.erase(it);
  });
  has_calls.store(!calls.empty(), std::memory_order_release);
  return dead;
}

void Engine::Impl::UpdateFlowControl(const std::vector<ConsumerState*>& consumers) {
  std::uint64_t bytes = 0;
  std::int64_t delay = 0;
  {
    std::lock_guard lock(config_mu);
    for (const auto& st : streams) {
      bytes += static_cast<std::uint64_t>(std::max<std::int64_t>(0, st->LiveBytes()));
    }
  }
  for (ConsumerState* c : consumers) {
    for (const auto& lane : c->lanes) {
      // A lane with nothing queued has no delay now, whatever its last samples.
      const std::size_t queued =
          c->Cursor() ? engine_internal::CursorPending(*c) : lane->ring.size_approx();
      if (queued == 0) continue;
      delay = std::max(delay, lane->delay_ewma_ns.load(std::memory_order_relaxed));
    }
  }
  flow->Update(bytes, delay);
}

void Engine::Impl::MoveOffStalledMembers(ConsumerState& c, std::int64_t now) {
  // Lanes whose member pulled nothing for ack_wait while work waited (stalled: each
  // moved item is a failure). An ejected member that still pulls keeps its queue (in
  // panic mode it is even given work).
  for (std::uint32_t m = 0; m < c.lanes.size(); ++m) {
    Lane& lane = *c.lanes[m];
    auto& [mark_delivered, mark_ns] = stall_marks[&lane];
    bool stalled = false;
    if (lane.ring.size_approx() == 0) {  // nothing waits: no stall, and no mark to keep
      mark_ns = 0;
      continue;
    }
    // Read only for a lane with work waiting: delivered() totals a histogram's buckets.
    const std::uint64_t delivered = lane.delivered();
    // A consumer at max_ack_pending refuses its members new pulls: not a stall.
    const bool held_back = c.max_ack_pending > 0 &&
                           c.unsettled.load(std::memory_order_relaxed) >= c.max_ack_pending;
    if (delivered != mark_delivered || mark_ns == 0 || held_back) {
      mark_delivered = delivered;
      mark_ns = now;
    } else {
      stalled = engine_internal::SatSub(now, mark_ns) >= c.AckWaitFor(1);
    }
    if (!stalled || c.lanes.size() == 1) continue;  // one member: nowhere to move
    // At most what is queued now, and only while another member has room: what
    // cannot move stays (the loop must not push work back onto the lane it pops).
    engine_internal::Delivery d;
    for (std::size_t left = lane.ring.size_approx(); left > 0 && lane.ring.try_pop(d); --left) {
      if (d.shadow) {
        c.group->OnDone(m, Outcome::kDropped, 0);
        continue;
      }
      if (engine_internal::TryMove(c, d, m)) {
        c.counts.moved.fetch_add(1, std::memory_order_relaxed);
        c.group->OnDone(m, Outcome::kFailure, 0);
        continue;
      }
      // Nobody has room: back onto its lane (or parked if that filled meanwhile).
      if (!lane.ring.try_push(std::move(d))) {
        c.group->OnDone(m, Outcome::kDropped, 0);
        engine_internal::Redeliver(c, std::move(d), m);
      }
      break;
    }
    mark_ns = 0;
  }
}

void Engine::Impl::WakeForNextTimer(const std::vector<ConsumerState*>& consumers) {
  // The timer thread cleared its wake-up before this run: ask for the earliest timer
  // still pending (an ack wait, a delayed nak, a queue or call timeout), so that one
  // is not left to the next interval run (up to 100 ms late).
  std::int64_t next_due = INT64_MAX;
  for (ConsumerState* c : consumers) {
    std::lock_guard lock(c->pending_mu);
    if (!c->wheel->empty()) next_due = std::min(next_due, c->wheel->NextDeadline().value_or(INT64_MAX));
  }
  {
    std::lock_guard lock(calls_mu);
    if (!call_wheel->empty()) {
      next_due = std::min(next_due, call_wheel->NextDeadline().value_or(INT64_MAX));
    }
  }
  if (next_due != INT64_MAX) WakeTimer(next_due);
}

}  // namespace inferq
