// File: src/engine/lane_queue.hpp (not API)
//
// LaneQueue<T>: what a consumer member's lane holds. Without QoS it is the lock-free
// MpmcRing (FIFO); with ConsumerConfig::qos it is a QosScheduler (tiers with assured
// shares, DRR between tenants) behind the lane's own mutex. Both sides offer the
// ring's interface, so the engine's delivery code does not care which it has. A
// member thread waits actively for items only within the process's budget of active
// waiters and while that pays off (AdaptiveSpin): the ring side as BudgetedWait does
// (inferq/ring/wait_strategy.hpp), the scheduler side with the same two rations.
//
// Thread safety: every method may be called from any thread (the ring is MPMC; the
// scheduler side locks `mu_`). `on_evict` runs after the lock is released.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "inferq/base/clock.hpp"
#include "inferq/ring/mpmc_ring.hpp"
#include "inferq/ring/wait_strategy.hpp"
#include "inferq/sched/qos_scheduler.hpp"

namespace inferq::engine_internal {

template <class T>
class LaneQueue {
 public:
  // `key_of(item)` classifies an item for the scheduler.
  using KeyOf = std::function<QosKey(const T&)>;
  // Receives an item a higher-priority push evicted (QosConfig::preemption).
  using OnEvict = std::function<void(T&)>;

  explicit LaneQueue(std::size_t capacity) : ring_(std::in_place, capacity) {}
  LaneQueue(std::unique_ptr<QosScheduler<T>> qos, KeyOf key_of, OnEvict on_evict)
      : qos_(std::move(qos)), key_of_(std::move(key_of)), on_evict_(std::move(on_evict)) {}

  bool scheduled() const { return qos_ != nullptr; }

  // Non-blocking. False when full (and nothing lower-priority can be evicted) or
  // closed; on false `v` is untouched.
  bool try_push(T&& v) {
    if (ring_) return ring_->try_push(std::move(v));
    std::optional<T> evicted;
    bool wake;
    {
      std::lock_guard lock(mu_);
      if (closed_) return false;
      if (!PushLocked(std::move(v), evicted)) return false;
      wake = sleepers_ > 0;
    }
    if (wake) not_empty_.notify_one();  // no futex call when no puller sleeps
    if (evicted) on_evict_(*evicted);
    return true;
  }

  // As try_push, but the ring side wakes no sleeping puller: the caller owes
  // wake_pullers() after its burst (MpmcRing::try_push_quiet). The scheduler side
  // wakes as try_push does (its wake-up is a condition variable's, under mu_).
  bool try_push_quiet(T&& v) {
    if (ring_) return ring_->try_push_quiet(std::move(v));
    return try_push(std::move(v));
  }
  // Wakes up to `n` pullers asleep on the ring side (after n try_push_quiet).
  void wake_pullers(std::size_t n) {
    if (ring_) ring_->wake_consumers(n);
  }

  // As try_pop, but the ring side wakes no blocked pusher: the caller owes
  // wake_pushers() once its batch is taken, and before it waits for anything
  // (MpmcRing::try_pop_quiet). The scheduler side wakes as try_pop does.
  bool try_pop_quiet(T& out) {
    if (ring_) return ring_->try_pop_quiet(out);
    return try_pop(out);
  }
  // Wakes up to `n` pushers blocked on the ring side (after n try_pop_quiet).
  void wake_pushers(std::size_t n) {
    if (ring_) ring_->wake_producers(n);
  }

  // Blocks while full. False only when closed.
  bool push(T&& v) {
    if (ring_) return ring_->push(std::move(v));
    std::optional<T> evicted;
    bool wake;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        if (closed_) return false;
        if (PushLocked(std::move(v), evicted)) break;
        ++full_waiters_;
        not_full_.wait(lock);
        --full_waiters_;
      }
      wake = sleepers_ > 0;
    }
    if (wake) not_empty_.notify_one();
    if (evicted) on_evict_(*evicted);
    return true;
  }

  bool try_pop(T& out) {
    if (ring_) return ring_->try_pop(out);
    bool wake;
    {
      std::lock_guard lock(mu_);
      if (!PopLocked(out)) return false;
      wake = full_waiters_ > 0;
    }
    if (wake) not_full_.notify_one();
    return true;
  }

  // Waits until an item arrives or `deadline_ns` (SteadyClock) passes; false on
  // timeout, or when closed and empty. Like the ring's BudgetedWait, it first waits
  // actively (kActiveNs, yielding; within the process's ActiveWaiterBudget) and only
  // then sleeps on the condition variable:
  // a publisher then rarely pays a futex wake for a puller that is about to look.
  bool pop_until(T& out, std::int64_t deadline_ns) {
    if (ring_) return ring_->pop_until(out, deadline_ns);
    if (ActiveWaiterBudget& budget = ActiveWaiterBudget::Process();
        spin_.ShouldSpin() && budget.TryAcquire()) {
      const std::int64_t start = SteadyClock::Now();
      const std::int64_t active_until = std::min(deadline_ns, start + kActiveNs);
      while (size_.load(std::memory_order_relaxed) == 0 && SteadyClock::Now() < active_until &&
             !closed_flag_.load(std::memory_order_relaxed)) {
        std::this_thread::yield();
      }
      budget.Release();
      // Only a window that ran out is a miss; a deadline or close ends waiting anyway.
      if (size_.load(std::memory_order_relaxed) != 0) {
        spin_.Record(true);
      } else if (active_until == start + kActiveNs && !closed_flag_.load(std::memory_order_relaxed)) {
        spin_.Record(false);
      }
    }
    bool wake;
    {
      std::unique_lock lock(mu_);
      for (;;) {
        if (PopLocked(out)) break;
        if (closed_) return false;
        const std::int64_t now = SteadyClock::Now();
        if (now >= deadline_ns) return false;
        ++sleepers_;
        if (deadline_ns == kNoDeadline) {
          not_empty_.wait(lock);
        } else {
          not_empty_.wait_for(lock, std::chrono::nanoseconds(deadline_ns - now));
        }
        --sleepers_;
      }
      wake = full_waiters_ > 0;
    }
    if (wake) not_full_.notify_one();
    return true;
  }

  // Whether a push of an item with `key` would find room now (the ring: below
  // capacity; the scheduler: below capacity and the tier's max_items, or a lower
  // priority to evict). A hint: others may push or pop meanwhile.
  bool WouldAccept(const QosKey& key) {
    if (ring_) return ring_->size_approx() < ring_->capacity();
    std::lock_guard lock(mu_);
    return !closed_ && qos_->WouldAccept(key);
  }

  void close() {
    if (ring_) {
      ring_->close();
      return;
    }
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      closed_flag_.store(true, std::memory_order_relaxed);
    }
    not_empty_.notify_all();
    not_full_.notify_all();
  }
  bool closed() const {
    if (ring_) return ring_->closed();
    std::lock_guard lock(mu_);
    return closed_;
  }
  std::size_t size_approx() const {
    return ring_ ? ring_->size_approx() : size_.load(std::memory_order_relaxed);
  }
  std::size_t capacity() const { return ring_ ? ring_->capacity() : qos_->capacity(); }

  // The scheduler's statistics (requires scheduled()).
  QosStats QosStatsSnapshot() const {
    std::lock_guard lock(mu_);
    return qos_->Stats();
  }

 private:
  bool PushLocked(T&& v, std::optional<T>& evicted) {
    const QosPushResult r = qos_->Push(std::move(v), key_of_(v), evicted);
    if (r != QosPushResult::kAccepted && r != QosPushResult::kAcceptedEvicted) return false;
    size_.store(qos_->size(), std::memory_order_relaxed);
    return true;
  }
  bool PopLocked(T& out) {
    std::optional<T> item = qos_->Pop();
    if (!item) return false;
    out = std::move(*item);
    size_.store(qos_->size(), std::memory_order_relaxed);
    return true;
  }

  std::optional<MpmcRing<T, BudgetedWait>> ring_;
  std::unique_ptr<QosScheduler<T>> qos_;
  KeyOf key_of_;
  OnEvict on_evict_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  // The same active window, and the same adaptive skip, as BudgetedWait.
  static constexpr std::int64_t kActiveNs = BudgetedWait::kActiveNs;
  AdaptiveSpin spin_;
  bool closed_ = false;             // guarded by mu_
  std::atomic<bool> closed_flag_{false};  // closed_, readable without mu_
  std::uint32_t sleepers_ = 0;      // pullers blocked on not_empty_; guarded by mu_
  std::uint32_t full_waiters_ = 0;  // pushers blocked on not_full_; guarded by mu_
  std::atomic<std::size_t> size_{0};
};

}  // namespace inferq::engine_internal
