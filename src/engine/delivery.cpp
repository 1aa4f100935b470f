// File: src/engine/delivery.cpp
//
// Lanes: placing a delivery on a lane of its consumer (PlaceOnLane: a first delivery
// on the member Publish selected, with the consumer's overflow policy; a redelivery,
// a parked delivery and a move off a stalled member, without waiting), and a queued
// delivery dropped to make room (DropQueued).
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
namespace engine_internal {

namespace {

// A first delivery on the member Publish selected, with the consumer's overflow policy.
bool PlaceFirst(ConsumerState& c, Delivery& d, std::uint32_t m, FirstDeliveryWait first) {
  auto& ring = c.lanes[m]->ring;
  if (DeferredWakes* wakes = t_deferred_wakes; wakes != nullptr) {
    if (ring.try_push_quiet(std::move(d))) {  // on failure d is untouched
      wakes->Add(ring);
      return true;
    }
    // About to wait for room (PublishBatch): never for a puller this publisher has
    // not woken.
    if (first.wait) wakes->Flush();
  } else if (ring.try_push(std::move(d))) {
    return true;  // on failure d is untouched
  }
  switch (c.config.overflow) {
    case OverflowPolicy::kBlock: {
      if (!first.wait || ring.closed()) return false;
      // Backpressure: wait for the member, holding the stream's mutex (every member
      // sees the stream's order). release: a TryPublish that fails to take the mutex
      // sees this.
      first.blocked_publishers->fetch_add(1, std::memory_order_release);
      const bool queued = ring.push(std::move(d));
      first.blocked_publishers->fetch_sub(1, std::memory_order_release);
      return queued;
    }
    case OverflowPolicy::kDropOldest:
      while (!ring.closed()) {
        Delivery oldest;
        if (ring.try_pop(oldest)) DropQueued(c, m, oldest);
        if (ring.try_push(std::move(d))) return true;
      }
      return false;
    case OverflowPolicy::kReject:
      return false;
  }
  return false;
}

}  // namespace

std::uint32_t PlaceOnLane(ConsumerState& c, Delivery& d, std::uint32_t member, Placement how,
                          FirstDeliveryWait first) {
  if (how == Placement::kFirst) {
    c.group->OnQueued(member);  // before the push, so that a fast pull never sees it negative
    if (PlaceFirst(c, d, member, first)) return member;
    c.group->OnDone(member, Outcome::kDropped, 0);
    return kNoMember;
  }
  const std::uint32_t avoid = member;
  const auto n = static_cast<std::uint32_t>(c.lanes.size());
  std::uint32_t target;
  {
    std::lock_guard lock(c.select_mu);
    // The failed member is avoided in the policy's pick too, so that a stateful
    // policy (affinity) moves the key and the rest of its sequence follows.
    target = c.group->Select(*c.policy, *d.h->event, c.group->clock().NowNanos(), avoid).member;
  }
  absl::InlinedVector<bool, 16> ejected(n);
  for (std::uint32_t m = 0; m < n; ++m) ejected[m] = c.group->Health(m) == MemberHealth::kEjected;
  const int passes = how == Placement::kRedelivery ? 3 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t m = (target + k) % n;
      const bool ok = pass == 0 ? (m != avoid && !ejected[m]) : pass == 1 ? !ejected[m] : true;
      if (!ok) continue;
      // A message never lands on a shadow member (its result is not the answer).
      if (!d.shadow && !c.policy->ServesPrimary(m)) continue;
      c.group->OnQueued(m);  // before the push, as above
      if (c.lanes[m]->ring.try_push(std::move(d))) return m;
      c.group->OnDone(m, Outcome::kDropped, 0);
    }
  }
  return kNoMember;
}

// Queues `d` again for consumer `c` on a member chosen by its policy, not on
// `exclude` when another lane takes it. Never blocks: a full lane is skipped and,
// when every lane is full, the delivery is parked until the next timer run.
void Redeliver(ConsumerState& c, Delivery d, std::uint32_t exclude) {
  if (d.h->stream->Discarded(*d.h)) {
    c.counts.skipped.fetch_add(1, std::memory_order_relaxed);
    if (!d.shadow && c.config.lifecycle != nullptr) ForgetDiscarded(c, d.h->seq);
    if (c.tracked && !d.shadow) {  // its pending entry (and the event it holds) goes too
      std::lock_guard lock(c.pending_mu);
      if (auto it = c.pending.find(d.h->seq);
          it != c.pending.end() && it->second.attempt == d.attempt && it->second.member == kNoMember) {
        c.wheel->Cancel(it->second.timer);
        c.pending.erase(it);
      }
    }
    return;
  }
  const bool redelivery = d.attempt > 1;  // else a first delivery that was parked
  if (PlaceOnLane(c, d, exclude, Placement::kRedelivery) != kNoMember) {
    if (redelivery) c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (c.lanes.front()->ring.closed()) {
    // The engine is closing (nobody will pull), or the consumer was deleted: its
    // delivery in transit lets go of the stream here (LetGoDeleted).
    if (c.deleted.load(std::memory_order_acquire)) LetGoDeleted(c, d);
    return;
  }
  std::unique_lock lock(c.pending_mu);
  if (!c.retired) {
    c.parked.push_back(std::move(d));
    c.counts.parked.fetch_add(1, std::memory_order_relaxed);
    c.has_parked.store(true, std::memory_order_release);
    return;
  }
  LetGoDeleted(c, d, lock);
}

bool ForgetWaiting(ConsumerState& c, std::uint64_t seq) {
  auto it = c.waiting.find(seq);
  if (it == c.waiting.end()) return false;
  const bool given_up = it->second.state == ConsumerState::kExpired;
  if (!given_up) c.wheel->Cancel(it->second.timer);
  c.waiting.erase(it);
  return given_up;
}

void LetGoDeleted(ConsumerState& c, const Delivery& d, std::unique_lock<std::mutex>& pending_lock) {
  if (d.shadow) return;
  if (c.tracked && d.attempt > 1) return;  // its pending entry: DeleteConsumer's sweep
  // Given up by its queue timeout (dead-lettered then): it let go of the stream. Else
  // the timeout goes with it: left on the wheel, it would dead-letter the message, and
  // let go of it, a second time (DeleteConsumer's sweep, which would drop the entry,
  // may not have run yet: found by a stress of deletions under load, up to 171 of 600
  // messages lost).
  if (d.attempt == 1 && ForgetWaiting(c, d.h->seq)) return;
  pending_lock.unlock();
  ReleaseInterest(c, *d.h);
}

void LetGoDeleted(ConsumerState& c, const Delivery& d) {
  std::unique_lock lock(c.pending_mu);
  LetGoDeleted(c, d, lock);
}

// Moves `d` off stalled member `from` to another member that is not ejected and has
// room (the policy's pick first). False, with `d` untouched, when none has.
bool TryMove(ConsumerState& c, Delivery& d, std::uint32_t from) {
  return PlaceOnLane(c, d, from, Placement::kMove) != kNoMember;
}

namespace {

// A chunk of a backlog: at most this many messages, or this many stored bytes
// (Event::StoredSize) past the first, are read from the log at a time; one
// RetryParked reads at most kBacklogEmptyChunks chunks that park nothing (all
// filtered out, or a stretch skipped) before it leaves the rest to the timer and the
// next pull, so that neither AddConsumer, a pull nor the timer chases a publisher.
constexpr std::size_t kBacklogChunkMsgs = 256;
constexpr std::uint64_t kBacklogChunkBytes = 1 << 20;
// Index entries looked at per hold of the stream's mutex: a backlog whose start
// policy skips most of the stream (a restart with scattered acks, kLastPerSubject)
// lets go of it between stretches.
constexpr std::size_t kBacklogScan = 65536;
constexpr int kBacklogEmptyChunks = 8;

enum class Fill {
  kFilled,  // a chunk is parked (it may be empty: all filtered out)
  kBusy,    // the stream's mutex was held (not `wait`): nothing read
  kClosed,  // the backlog is closed (read to the end, or the consumer failed or went)
};

// Reads the next chunk of consumer `c`'s backlog (ConsumerState::Backlog) into
// `parked`, in sequence order. The index entries are chosen and copied under the
// stream's mutex, and read back from the log (LoadFromLog) after letting go of it;
// the filter and the predicate are applied to what was read. A message whose segment
// was retired since it was chosen is skipped (the stream let it go); one that cannot
// be read back fails the consumer (ConsumerState::Fail): never a silent gap. The
// backlog closes, under the stream's mutex, when it has read to the stream's next
// sequence. `wait`: wait for the stream's mutex (AddConsumer); otherwise kBusy when
// it is held (a publisher blocked on a full lane holds it, and neither a pull nor
// the timer waits for that). Called by the one thread in RetryParked's catch-up.
Fill FillFromBacklog(ConsumerState& c, bool wait) {
  StreamState& s = *c.stream;
  struct Picked {
    IndexEntry e;
    std::uint32_t prior;  // deliveries before a restart
  };
  std::vector<Picked> picked;
  std::uint64_t end_seq = 0;
  {
    std::unique_lock lock(s.mu, std::defer_lock);
    if (wait) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return Fill::kBusy;
    }
    ConsumerState::Backlog& b = c.backlog;
    if (!c.reading_backlog.load(std::memory_order_relaxed)) return Fill::kClosed;
    end_seq = b.end_seq;
    if (s.deleted || c.deleted.load(std::memory_order_acquire)) {
      c.reading_backlog.store(false, std::memory_order_release);
      b = {};
      return Fill::kClosed;
    }
    picked.reserve(kBacklogChunkMsgs);
    std::uint64_t bytes = 0;
    std::size_t pos = s.IndexPosition(b.next_seq);
    const std::size_t scan_end = std::min(s.index.size(), pos + kBacklogScan);
    for (; pos < scan_end && picked.size() < kBacklogChunkMsgs && bytes < kBacklogChunkBytes;
         ++pos) {
      const IndexEntry& e = s.index.at(pos);
      b.next_seq = e.seq + 1;
      if (e.removed != 0) continue;  // purged, or over max_msgs_per_subject
      std::uint32_t prior = 0;
      if (e.seq < b.end_seq) {  // stored before the consumer was added
        if (b.resume.started) {
          if (b.resume.acked.contains(e.seq)) continue;
          if (auto it = b.resume.delivered.find(e.seq); it != b.resume.delivered.end()) {
            // Its last delivery came before the restart: dead-lettered when added.
            if (c.LastAttempt(it->second)) continue;
            prior = it->second;
          }
        } else if (b.only.has_value() ? !b.only->contains(e.seq) : e.publish_ns < b.start_ns) {
          continue;
        }
      }
      picked.push_back(Picked{e, prior});
      bytes += e.bytes;
    }
    c.backlog_next_seq.store(b.next_seq, std::memory_order_relaxed);
    if (picked.empty()) {
      if (pos < s.index.size()) return Fill::kFilled;  // a stretch skipped: go on
      // Read to the end: from now on publishes queue for it themselves (EnqueueTargets
      // reads the flag under the mutex held here).
      c.reading_backlog.store(false, std::memory_order_release);
      b = {};
      return Fill::kClosed;
    }
  }
  std::vector<Delivery> loaded;
  loaded.reserve(picked.size());
  std::vector<std::pair<std::uint64_t, std::uint32_t>> priors;
  for (const Picked& p : picked) {
    absl::StatusOr<Handle> h = s.LoadFromLog(p.e);
    if (!h.ok()) {
      // Its segment retired meanwhile: the stream let it go. A segment gone while the
      // stream still holds the message (a file removed under it) is damage.
      if (h.status().code() == absl::StatusCode::kNotFound && s.DiscardedSeq(p.e.seq)) continue;
      if (c.deleted.load(std::memory_order_acquire)) return Fill::kClosed;
      c.Fail("stored message " + std::to_string(p.e.seq) + " cannot be read back (" +
             std::string(h.status().message()) + ")");
      // A failed consumer takes no publishes (EnqueueTargets), so the flag need not
      // be cleared under the stream's mutex.
      c.reading_backlog.store(false, std::memory_order_release);
      return Fill::kClosed;
    }
    const Event& ev = *(*h)->event;
    if (c.filter && !c.filter->Matches(ev.subject)) continue;
    if (!c.config.predicate.is_trivial() && !c.config.predicate.Matches(ev)) continue;
    if (p.prior != 0) priors.emplace_back(p.e.seq, p.prior);
    loaded.push_back(Delivery{*std::move(h), 1, false});
  }
  // A message published after the consumer was added was queued for it from its
  // publish on: its queue timeout (queue_timeout, the event's ttl and deadline) runs
  // from then, as EnqueueTargets registers it for a publish it queues at once.
  const bool timed = c.queue_timeout_ns > 0 || c.enforce_event_ttl;
  const std::int64_t now = c.clock->NowNanos();
  std::int64_t wake_ns = INT64_MAX;
  {
    std::lock_guard lock(c.pending_mu);
    if (c.retired) return Fill::kClosed;  // deleted: its sweep is done, nothing takes these
    for (const auto& [seq, prior] : priors) c.prior_deliveries[seq] = prior;
    if (!priors.empty()) {
      c.has_prior.store(true, std::memory_order_release);
      // Delivered before the restart: each is queued again as a redelivery.
      c.counts.redelivered.fetch_add(priors.size(), std::memory_order_relaxed);
    }
    for (Delivery& d : loaded) {
      if (timed && d.h->seq >= end_seq) {
        const Event& ev = *d.h->event;
        std::int64_t limit_ns = INT64_MAX;
        if (ev.ttl > absl::ZeroDuration()) limit_ns = absl::ToInt64Nanoseconds(ev.ttl);
        std::int64_t expiry = c.ExpiryFor(d.h->publish_ns, limit_ns);
        if (c.enforce_event_ttl && ev.deadline != absl::InfiniteFuture()) {
          expiry = std::min(expiry, SatAdd(now, absl::ToInt64Nanoseconds(ev.deadline - absl::Now())));
        }
        if (expiry != INT64_MAX) {
          const TimerId id =
              c.Schedule(expiry, {ConsumerTimer::kQueueExpiry, 1, d.h->seq, nullptr});
          c.waiting.insert_or_assign(
              d.h->seq, ConsumerState::Waiting{d.h, expiry, id, ConsumerState::kQueued});
          c.has_waiting.store(true, std::memory_order_release);
          wake_ns = std::min(wake_ns, expiry);
        }
      }
      c.parked.push_back(std::move(d));
    }
  }
  if (wake_ns != INT64_MAX && c.host != nullptr) c.host->WakeTimer(wake_ns);
  return Fill::kFilled;
}

}  // namespace

// Retries parked redeliveries: by the timer, and by a member right after a pull has
// made room (a consumer without ack_wait has no timer).
// While a consumer catches up (catching_up: the stored messages it started with,
// ConsumerConfig::deliver), one thread at a time takes them from the front, in
// order, and stops at the first that finds no room (it goes back to the front);
// a file stream's come from its backlog a chunk at a time (FillFromBacklog) when
// `parked` runs empty. catching_up stays set until the last is queued, so a publish
// in the meantime parks behind them (EnqueueTargets) instead of overtaking them.
// Otherwise each parked redelivery is retried on its own (one that finds no room
// parks again). `wait`: see FillFromBacklog.
void RetryParked(ConsumerState& c, bool wait) {
  if (!c.has_parked.load(std::memory_order_acquire)) return;  // (a std::deque allocates)
  if (!c.catching_up.load(std::memory_order_acquire)) {
    std::deque<Delivery> parked;
    {
      std::lock_guard lock(c.pending_mu);
      parked.swap(c.parked);
      c.has_parked.store(false, std::memory_order_release);
    }
    for (Delivery& d : parked) Redeliver(c, std::move(d), kNoMember);
    return;
  }
  std::unique_lock retry(c.retry_mu, std::try_to_lock);
  if (!retry.owns_lock()) return;  // another thread is at it
  const bool paced = c.config.replay == ReplayPolicy::kOriginal;
  int empty_chunks = 0;
  for (;;) {
    Delivery d;
    std::int64_t due_ns = INT64_MIN;
    bool fill = false;
    {
      std::lock_guard lock(c.pending_mu);
      c.catchup_in_hand = false;  // the one taken before is queued (or skipped)
      if (c.parked.empty()) {
        if (c.reading_backlog.load(std::memory_order_acquire)) {
          fill = true;
        } else {
          c.has_parked.store(false, std::memory_order_release);
          c.catching_up.store(false, std::memory_order_release);
          return;
        }
      } else if (paced) {
        // Its original distance from the first one, from when the consumer started.
        const std::int64_t publish_ns = c.parked.front().h->publish_ns;
        if (c.replay_first_publish_ns == INT64_MIN) c.replay_first_publish_ns = publish_ns;
        due_ns = SatAdd(c.replay_start_ns,
                        std::max<std::int64_t>(0, SatSub(publish_ns, c.replay_first_publish_ns)));
      }
    }
    if (fill) {
      if (c.lanes.front()->ring.closed()) return;  // closing, deleted or failed
      if (empty_chunks == kBacklogEmptyChunks) {
        if (c.host != nullptr) c.host->WakeTimer(c.clock->NowNanos());  // it goes on there
        return;
      }
      if (FillFromBacklog(c, wait) == Fill::kBusy) {
        // The timer's run goes on with it soon.
        if (c.host != nullptr) c.host->WakeTimer(SatAdd(c.clock->NowNanos(), 1'000'000));
        return;
      }
      ++empty_chunks;  // (reset below once a chunk parked something)
      continue;
    }
    if (paced && c.clock->NowNanos() < due_ns) {
      c.host->WakeTimer(due_ns);  // the timer's RetryParked goes on then
      return;
    }
    empty_chunks = 0;
    {
      std::lock_guard lock(c.pending_mu);
      if (c.parked.empty()) continue;  // (only this thread takes from it: cannot happen)
      d = std::move(c.parked.front());
      c.parked.pop_front();
      c.catchup_in_hand = true;
    }
    if (d.h->stream->Discarded(*d.h)) {
      Redeliver(c, std::move(d), kNoMember);  // counts it skipped, drops its pending entry
      continue;
    }
    const bool redelivery = d.attempt > 1;
    if (PlaceOnLane(c, d, kNoMember, Placement::kRedelivery) != kNoMember) {
      if (redelivery) c.counts.redelivered.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::unique_lock lock(c.pending_mu);
    c.catchup_in_hand = false;
    if (c.lanes.front()->ring.closed()) {  // the engine is closing: nobody will pull
      if (c.deleted.load(std::memory_order_acquire)) LetGoDeleted(c, d, lock);
      return;
    }
    c.parked.push_front(std::move(d));
    return;
  }
}

// A delivery queued on lane `m` was dropped to make room (OverflowPolicy::kDropOldest).
void DropQueued(ConsumerState& c, std::uint32_t m, Delivery& d, bool evicted) {
  c.group->OnDone(m, Outcome::kDropped, 0);
  auto& count = evicted ? c.counts.evicted : c.counts.dropped;
  if (d.shadow) {
    count.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (d.attempt == 1 && c.has_waiting.load(std::memory_order_acquire)) {
    std::lock_guard lock(c.pending_mu);
    // Already settled, and counted as expired, when its queue timeout passed: it ends
    // once, so it is not counted as dropped (or evicted) too.
    if (ForgetWaiting(c, d.h->seq)) return;
  }
  count.fetch_add(1, std::memory_order_relaxed);
  if (c.tracked && d.attempt > 1) {
    std::lock_guard lock(c.pending_mu);
    auto it = c.pending.find(d.h->seq);
    if (it == c.pending.end() || it->second.attempt != d.attempt) return;  // settled already
    c.wheel->Cancel(it->second.timer);
    c.pending.erase(it);
  }
  SettleWithoutAck(c, *d.h);
}

}  // namespace engine_internal



}  // namespace inferq
