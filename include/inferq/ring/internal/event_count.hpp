// File: inferq/ring/internal/event_count.hpp  (not API: used by the ring headers)
//
// An event count: lets a thread sleep until "something changed" without a lock and
// without a syscall on the notifier's side while nobody sleeps. The waiter announces
// itself in `sleepers_`, re-checks its condition, then sleeps on `epoch_`; a notifier
// that has just changed the state bumps `epoch_` and wakes the sleepers only when it
// sees one. (Dmitry Vyukov's eventcount; folly::EventCount is the same idea.)
//
// On Linux the sleep is a futex on `epoch_` — the same primitive std::atomic::wait
// uses there — called directly so that a wait can have a deadline
// (FUTEX_WAIT_BITSET on CLOCK_MONOTONIC). Elsewhere untimed waits use
// std::atomic::wait and timed ones poll with short sleeps.
//
// Protocol (the invariants the ring relies on):
//  1. Waiter: PrepareWait() (sleepers_ += 1, seq_cst fence, read epoch key), then
//     re-check the condition; if still false Wait(key, deadline), else CancelWait().
//  2. Notifier: make the change visible (a release store), then NotifyAll(), which
//     starts with a seq_cst fence and reads sleepers_.
//  3. The two seq_cst fences are totally ordered: if the waiter's comes first, the
//     notifier sees sleepers_ > 0 and bumps epoch_, so the futex wait returns at once
//     (value changed) or is woken; if the notifier's comes first, the waiter's
//     re-check sees the change. Either way no wake-up is lost.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include "inferq/base/cache_line.hpp"

namespace inferq::ring_internal {

// Deadline meaning "wait forever".
inline constexpr std::int64_t kNoDeadline = INT64_MAX;

// Nanoseconds on the clock deadlines are expressed in (CLOCK_MONOTONIC, which is
// what std::chrono::steady_clock reads on Linux).
inline std::int64_t MonotonicNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class EventCount {
 public:
  // Step 1 of the protocol. Returns the key to pass to Wait.
  std::uint32_t PrepareWait() {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    // seq_cst fence: orders our announcement before the caller's re-check (the
    // store-load pair of invariant 3).
    StoreLoadFence();
    return epoch_.load(std::memory_order_acquire);
  }

  // The re-check found the condition true: withdraw the announcement.
  void CancelWait() { sleepers_.fetch_sub(1, std::memory_order_relaxed); }

  // Sleeps until epoch_ != key, a spurious wake-up, or `deadline_ns` (monotonic)
  // passes, then withdraws the announcement. The caller re-checks its condition.
  void Wait(std::uint32_t key, std::int64_t deadline_ns) {
#if defined(__linux__)
    if (deadline_ns == kNoDeadline) {
      syscall(SYS_futex, Word(), FUTEX_WAIT_BITSET_PRIVATE, key, nullptr, nullptr,
              FUTEX_BITSET_MATCH_ANY);
    } else {
      timespec ts;
      ts.tv_sec = static_cast<time_t>(deadline_ns / 1'000'000'000);
      ts.tv_nsec = static_cast<long>(deadline_ns % 1'000'000'000);
      // Absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT_BITSET without
      // FUTEX_CLOCK_REALTIME); returns at once with ETIMEDOUT when it has passed.
      syscall(SYS_futex, Word(), FUTEX_WAIT_BITSET_PRIVATE, key, &ts, nullptr,
              FUTEX_BITSET_MATCH_ANY);
    }
#else
    if (deadline_ns == kNoDeadline) {
      epoch_.wait(key, std::memory_order_acquire);
    } else if (epoch_.load(std::memory_order_acquire) == key &&
               MonotonicNowNs() < deadline_ns) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
#endif
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

  // Step 2 of the protocol: call after the state change is visible.
  void NotifyAll() {
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer does not model fences. Under it the notifier reads sleepers_
    // with a seq_cst read-modify-write instead: the waiter's increment and this RMW
    // are then ordered in sleepers_'s modification order, and if the RMW comes first
    // the waiter's increment synchronizes with it and its re-check sees the change.
    // Same guarantee, but every notifier writes the shared line, so it is kept for
    // the sanitizer build only.
    if (sleepers_.fetch_add(0, std::memory_order_seq_cst) == 0) return;
#else
    // seq_cst fence: orders the caller's state change before our read of sleepers_
    // (the other half of invariant 3).
    StoreLoadFence();
    if (sleepers_.load(std::memory_order_relaxed) == 0) return;
#endif
    epoch_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
    syscall(SYS_futex, Word(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    epoch_.notify_all();
#endif
  }

 private:
  static void StoreLoadFence() {
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }
#if defined(__linux__)
  // std::atomic<std::uint32_t> is a standard-layout wrapper of one uint32_t (asserted
  // below); the futex syscall needs the address of that word.
  std::uint32_t* Word() { return reinterpret_cast<std::uint32_t*>(&epoch_); }
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
#endif
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> sleepers_{0};
};

// Waits as `Strategy` says (see inferq/ring/wait_strategy.hpp): spin, then yield,
// then sleep on `ec` (or keep yielding). `ready()` tries the operation and returns
// true when it succeeded; `give_up()` returns true when waiting is pointless (the
// ring was closed). Returns true when ready() succeeded, false on give_up or when
// the monotonic deadline passed.
template <class Strategy, class Ready, class GiveUp>
bool WaitUntil(EventCount& ec, std::int64_t deadline_ns, Ready&& ready, GiveUp&& give_up) {
  auto expired = [&] {
    return deadline_ns != kNoDeadline && MonotonicNowNs() >= deadline_ns;
  };
  for (int i = 0; i < Strategy::kSpins; ++i) {
    if (ready()) return true;
    if (give_up()) return false;
    if ((i & 63) == 63 && expired()) return false;
    CpuRelax();
  }
  for (int i = 0; i < Strategy::kYields; ++i) {
    if (ready()) return true;
    if (give_up()) return false;
    if (expired()) return false;
    std::this_thread::yield();
  }
  if constexpr (!Strategy::kSleeps) {
    for (;;) {
      if (ready()) return true;
      if (give_up() || expired()) return false;
      std::this_thread::yield();
    }
  } else {
    for (;;) {
      const std::uint32_t key = ec.PrepareWait();
      if (ready()) {
        ec.CancelWait();
        return true;
      }
      if (give_up() || expired()) {
        ec.CancelWait();
        return false;
      }
      ec.Wait(key, deadline_ns);
    }
  }
}

}  // namespace inferq::ring_internal
