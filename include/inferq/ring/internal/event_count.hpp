/// @file inferq/ring/internal/event_count.hpp  (not API: used by the ring headers)
///
/// An event count: lets a thread sleep until "something changed" without a lock and
/// without a syscall on the notifier's side while nobody sleeps. The waiter announces
/// itself in `sleepers_`, re-checks its condition, then sleeps on `epoch_`; a notifier
/// that has just changed the state bumps `epoch_` and wakes the sleepers only when it
/// sees one. (Dmitry Vyukov's eventcount; folly::EventCount is the same idea.)
///
/// On Linux the sleep is a futex on `epoch_` — the same primitive std::atomic::wait
/// uses there — called directly so that a wait can have a deadline
/// (FUTEX_WAIT_BITSET on CLOCK_MONOTONIC). Elsewhere untimed waits use
/// std::atomic::wait and timed ones poll with short sleeps.
///
/// Protocol (the invariants the ring relies on):
///  1. Waiter: PrepareWait() (sleepers_ += 1 with a seq_cst read-modify-write, then a
///     seq_cst fence, then reads the epoch key), then re-checks its condition; if
///     still false Wait(key, deadline), else CancelWait().
///  2. Notifier: makes its change with a seq_cst read-modify-write (or store) of the
///     word the waiter's re-check reads — the ring's head_ or tail_ — and then calls
///     NotifyOne/Many/All, which read sleepers_ (and active_) with seq_cst loads. No
///     fence: on x86 the ring's CAS on head_/tail_ is a locked instruction whatever
///     its order and a seq_cst load is a plain load, so a push or pop with nobody
///     asleep pays nothing for the protocol but one load of a line that changes only
///     when a waiter falls asleep or wakes (sleepers_ and epoch_ share it; active_,
///     which waiters write on every wait, has a line of its own).
///  3. Why no wake-up is lost: all four operations of 1 and 2 are in the single total
///     order S of seq_cst operations. If the notifier's load of sleepers_ does not see
///     the waiter's increment, the load precedes the increment in S, so the
///     notifier's change precedes the waiter's fence in S, and the waiter's re-check
///     (after that fence) reads the change or a later value ([atomics.order]/4.3):
///     it does not sleep. Otherwise the notifier sees sleepers_ > 0 and bumps epoch_,
///     so the futex wait returns at once (value changed) or is woken.
///  4. A notifier of one change (NotifyOne) skips the wake-up while a waiter is
///     active (spinning or yielding, not asleep): that waiter takes the change, or
///     passes it on. Every waiter, when it leaves the active phase and when it
///     returns from WaitUntil, leaves active_ first (a seq_cst read-modify-write and
///     fence) and then checks whether anyone sleeps and more is available; if so it
///     calls NotifyOne.
///     The same pairing as in 3 makes that safe: either the notifier sees the waiter
///     gone from active_ (and wakes a sleeper itself), or the leaving waiter sees the
///     change (and wakes one). So while anything is available, some waiter is awake
///     or about to be, and a push with an active consumer costs no futex call (the
///     rule Go's scheduler applies to its spinning threads).
///  7. At most one wake-up is on its way at a time: NotifyOne sets kWakePending in
///     sleepers_ (a CAS, only while the count is nonzero and the bit clear) before
///     it bumps the epoch and calls FUTEX_WAKE. A NotifyOne that finds the bit set
///     makes no syscall: a sleeper woken but not yet running would otherwise be
///     woken again on every push until the scheduler runs it (0.8 futex calls per
///     delivery in a 1 x 4 fan-out). Every sleeper clears the bit as it leaves
///     (Wait's return, CancelWait: one CAS that also takes one off the count) and in
///     PrepareWait, after it has read its key and before its re-check. Why no
///     wake-up is lost: the bit was set while the count was nonzero. If a counted
///     sleeper was in its futex wait, the FUTEX_WAKE that follows wakes one, which
///     leaves; a counted sleeper that was not yet in it either read its key before
///     the epoch's bump (its futex wait returns at once, and it leaves) or after it
///     (it then sees the bit in PrepareWait and clears it). So some sleeper clears
///     the bit after it was set, and then re-checks the condition (the loop of
///     WaitUntil), or passes a wake-up on if more is available (pass_on). A notifier
///     that skipped made its change before its seq_cst load saw the bit, and the
///     clear is a seq_cst read-modify-write followed by a fence, so that re-check
///     sees the change (the pairing of invariant 3). NotifyMany and NotifyAll wake
///     regardless of the bit. (A first version cleared the bit only on leaving: a
///     sleeper whose key postdated the marked wake-up re-checked, found the slot
///     taken by an active waiter, and slept with the bit still set, so every later
///     notify skipped it; a second one cleared it just before the futex call, with
///     no re-check after it, and lost a push made in between.) The price: a notifier
///     preempted between setting the bit and its FUTEX_WAKE delays the wake-up that
///     others skipped until it runs again (a whole side of the ring waits on one
///     thread's scheduling, as it waits on the woken thread's anyway).

/// An earlier version put a seq_cst fence on the notifier's side too (and offered
/// Linux membarrier(2) to make it cheap); with the ring's own seq_cst CAS it is not
/// needed, and it was the hybrid wait's main cost under load (BENCHMARKS.md,
/// bench_rings: the profile of BM_Throughput).
/// Under ThreadSanitizer, which models no fences, both sides use seq_cst
/// read-modify-writes of sleepers_ instead (ordered in its modification order: the
/// later one synchronizes with the earlier).
#pragma once

#include <atomic>
#include <bit>
#include <stdexcept>
#include <string>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

#include "inferq/base/cache_line.hpp"
#include "inferq/base/clock.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace inferq::ring_internal {

/// Deadlines are in ns of inferq::SteadyClock; inferq::kNoDeadline waits forever.
inline std::int64_t MonotonicNowNs() { return SteadyClock::Now(); }

/// Ring capacity: `requested` rounded up to a power of two, at least `min`. Throws
/// std::invalid_argument naming `ring` for 0 or more than 2^40.
inline std::size_t RingCapacity(const char* ring, std::size_t requested, std::size_t min) {
  if (requested == 0) {
    throw std::invalid_argument(std::string(ring) + " capacity must be > 0, got 0");
  }
  if (requested > (std::size_t{1} << 40)) {
    throw std::invalid_argument(std::string(ring) + " capacity " + std::to_string(requested) +
                                " is larger than 2^40");
  }
  return std::bit_ceil(requested < min ? min : requested);
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
  /// Step 1 of the protocol. Returns the key to pass to Wait.
  std::uint32_t PrepareWait() {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
#if !defined(__SANITIZE_THREAD__)
    // Invariant 3: orders the increment before the re-check's loads, which need
    // not be seq_cst themselves (the ring's try_ calls use acquire).
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    const std::uint32_t key = epoch_.load(std::memory_order_acquire);
    // Invariant 7: after the key, before the re-check, clear a wake-up marked on its
    // way: it may have been absorbed (its futex call found nobody asleep).
    if (sleepers_.load(std::memory_order_relaxed) & kWakePending) {
      sleepers_.fetch_and(kCountMask, std::memory_order_seq_cst);
#if !defined(__SANITIZE_THREAD__)
      std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    }
    return key;
  }

  /// Invariants 2 and 3, notifier side (after a seq_cst change of the ring).
  bool HasSleepers() { return (LoadSleepers() & kCountMask) != 0; }

  /// Invariants 2, 3, 4 and 7, notifier side: a sleeper exists, no wake-up is on its
  /// way to one, and no waiter is active; then marks a wake-up on its way. True when
  /// the caller must wake one (NotifyOne does).
  bool ClaimWake() {
    std::uint32_t v = LoadSleepers();
    for (;;) {
      if ((v & kCountMask) == 0 || (v & kWakePending) != 0) return false;
#if defined(__SANITIZE_THREAD__)
      if (active_.fetch_add(0, std::memory_order_seq_cst) != 0) return false;
#else
      if (active_.load(std::memory_order_seq_cst) != 0) return false;
#endif
      if (sleepers_.compare_exchange_weak(v, v | kWakePending, std::memory_order_seq_cst)) return true;
    }
  }

  /// Active (spinning/yielding) waiters: at most `max` at a time. relaxed: the count
  /// only gates wake-ups through ClaimWake, whose safety rests on LeaveActive
  /// (invariant 4); a notifier that misses a new active waiter only wakes a sleeper
  /// it did not have to.
  bool TryBecomeActive(int max) {
    int n = active_.load(std::memory_order_relaxed);
    while (n < max) {
      if (active_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  /// Invariant 4: the caller checks for more afterwards (and calls NotifyOne).
  void LeaveActive() {
    active_.fetch_sub(1, std::memory_order_seq_cst);
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_seq_cst);  // as in PrepareWait
#endif
  }

  /// Invariant 6: the adaptive skip of strategies with kProcessBudget.
  AdaptiveSpin& spin() { return spin_; }

  /// The re-check found the condition true: withdraw the announcement (and any
  /// wake-up on its way, invariant 7). The caller then passes a wake-up on if more
  /// is available (WaitUntil's pass_on).
  void CancelWait() { Leave(); }

  /// Sleeps until epoch_ != key, a spurious wake-up, or `deadline_ns` (monotonic)
  /// passes, then withdraws the announcement. The caller re-checks its condition.
  void Wait(std::uint32_t key, std::int64_t deadline_ns) {
#if defined(__linux__)
    if (deadline_ns == inferq::kNoDeadline) {
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
    if (deadline_ns == inferq::kNoDeadline) {
      epoch_.wait(key, std::memory_order_acquire);
    } else if (epoch_.load(std::memory_order_acquire) == key &&
               MonotonicNowNs() < deadline_ns) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
#endif
    Leave();
  }

  /// Step 2 of the protocol: call after the state change is visible.
  /// Wakes one sleeper: for one new item or one free slot, one waiter is enough, and
  /// waking all of them (a thundering herd) burns CPU on every push. A waiter that was
  /// woken but leaves without taking anything (deadline) passes the wake on.
  void NotifyOne() {
    // The path of every push and pop while nobody sleeps: one load, inlined; the
    // rest out of line (it ends in a system call anyway).
    if ((LoadSleepers() & kCountMask) == 0) return;
    WakeOneSlow();
  }

  /// Wakes up to `n` sleepers: a bulk operation made n items or n slots available.
  void NotifyMany(std::size_t n) {
    if (n <= 1) {
      if (n == 1) NotifyOne();
      return;
    }
    if (!HasSleepers()) return;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
    const int count = n > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(n);
    syscall(SYS_futex, Word(), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
#else
    epoch_.notify_all();
#endif
  }

  /// Wakes every sleeper (close()).
  void NotifyAll() {
    if (!HasSleepers()) return;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
    syscall(SYS_futex, Word(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    epoch_.notify_all();
#endif
  }

 private:
#if defined(__linux__)
  /// std::atomic<std::uint32_t> is a standard-layout wrapper of one uint32_t (asserted
  /// below); the futex syscall needs the address of that word.
  std::uint32_t* Word() { return reinterpret_cast<std::uint32_t*>(&epoch_); }
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
#endif
  /// sleepers_: the count of announced sleepers (low 31 bits) and kWakePending.
  static constexpr std::uint32_t kWakePending = std::uint32_t{1} << 31;
  static constexpr std::uint32_t kCountMask = kWakePending - 1;

  std::uint32_t LoadSleepers() {
#if defined(__SANITIZE_THREAD__)
    return sleepers_.fetch_add(0, std::memory_order_seq_cst);
#else
    return sleepers_.load(std::memory_order_seq_cst);
#endif
  }

  /// A sleeper leaves (after Wait, or CancelWait): one fewer, and no wake-up is on
  /// its way any more (invariant 7). seq_cst, then a fence as in PrepareWait: the
  /// caller's re-check (or pass_on) reads the ring after it.
  void Leave() {
    std::uint32_t v = sleepers_.load(std::memory_order_relaxed);
    while (!sleepers_.compare_exchange_weak(v, (v - 1) & kCountMask, std::memory_order_seq_cst)) {
    }
#if !defined(__SANITIZE_THREAD__)
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }

  /// NotifyOne past its first load: claims the wake-up (invariant 7) and makes it.
  [[gnu::noinline]] void WakeOneSlow() {
    if (!ClaimWake()) return;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
    syscall(SYS_futex, Word(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#else
    epoch_.notify_one();
#endif
  }

  /// Read by every notify: changes only when a waiter falls asleep or wakes.
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> sleepers_{0};
  /// Written by every waiter on entry and exit; read by a notify only while someone
  /// sleeps (invariant 2).
  alignas(kCacheLineSize) std::atomic<int> active_{0};
  /// Invariant 6, on the waiters' line too.
  AdaptiveSpin spin_;
};

// Invariants 5 and 6 (strategies with kProcessBudget, inferq/ring/wait_strategy.hpp):
//  5. The process-wide budget of active waiters (ActiveWaiterBudget) only decides
//     whether a waiter enters the active phase. A waiter outside it is not in its
//     event count's active_, so a notifier wakes it as it would wake any sleeper
//     (invariant 4 unchanged).
//  6. So does the adaptive skip (AdaptiveSpin, EventCount::spin()): after an active phase on
//     this event count that ended without its item, the next 1, 3, 7, ... up to 63
//     waits sleep at once; one that gets its item while active resets the count.
//     Waiting actively pays off only when items come faster than the active window
//     (15 µs): on a paced stream the waiter then stops spinning, on a busy one it
//     keeps the hand-off free of futex calls. (Adaptive spinning before blocking, as
//     in the HotSpot JVM's monitors and glibc's PTHREAD_MUTEX_ADAPTIVE_NP.)

/// Up to kPreSpins tries of `ready` (a weak try: internal/../mpmc_ring.hpp's TryPop)
/// with a pause between them, before a waiter announces itself anywhere: a hand-off
/// that is a few hundred cycles away costs no read-modify-write of the event count's
/// lines. True when a try succeeded. Safe for wake-ups: a waiter that has not
/// announced itself is neither counted as active (invariant 4: a notifier that does
/// not see it wakes a sleeper it need not have) nor as a sleeper.
inline constexpr int kPreSpins = 32;
template <class Ready>
bool PreSpin(Ready&& ready) {
  for (int i = 0; i < kPreSpins; ++i) {
    CpuRelax();
    if (ready()) return true;
  }
  return false;
}

/// Waits as `Strategy` says (see inferq/ring/wait_strategy.hpp): spin, then yield,
/// then sleep on `ec` (or keep yielding). `ready()` tries the operation and returns
/// true when it succeeded; it may be a weak try that fails while the other side is
/// in flight (MpmcRing's TryPop), for the tries made while waiting actively.
/// `ready_exact()` is the try whose failure means the condition is false: it is the
/// re-check before sleeping (invariant 3) and the last try before returning false.
/// `give_up()` returns true when waiting is pointless (the ring was closed);
/// `more()` returns true when another waiter could succeed now (an item or a free
/// slot is left: invariant 4). Returns true when a try succeeded, false on give_up
/// or when the monotonic deadline passed.
template <class Strategy, class Ready, class ReadyExact, class GiveUp, class More>
bool WaitUntil(EventCount& ec, std::int64_t deadline_ns, Ready&& ready, ReadyExact&& ready_exact,
               GiveUp&& give_up, More&& more) {
  auto expired = [&] {
    return deadline_ns != inferq::kNoDeadline && MonotonicNowNs() >= deadline_ns;
  };
  // Invariant 4: whoever leaves may owe the next waiter a wake-up. Only a sleeper
  // can be owed one, so sleepers_ (a line that rarely changes) is read before
  // more(), which reads the ring's contended head_ and tail_. Reading it first is
  // safe by the argument of invariant 3: a waiter that falls asleep after this read
  // (its increment later in S) re-checks the ring after its fence and sees what
  // more() would have seen.
  auto pass_on = [&](bool result) {
    if constexpr (Strategy::kSleeps) {
      if (ec.HasSleepers() && more()) ec.NotifyOne();
    }
    return result;
  };
  // Active phase: spin with pause, then yield, for at most Strategy::kActiveNs, and
  // only while fewer than Strategy::kMaxActive threads wait actively on this event
  // count: one busy waiter is enough to catch the next item at once; the others sleep
  // and are woken one per item.
  // Invariant 5: with Strategy::kProcessBudget, only within the process's budget.
  bool budgeted = false;
  if constexpr (Strategy::kProcessBudget) {
    budgeted = ec.spin().ShouldSpin() && inferq::ActiveWaiterBudget::Process().TryAcquire();
  }
  const bool active =
      (!Strategy::kProcessBudget || budgeted) && ec.TryBecomeActive(Strategy::kMaxActive);
  if (budgeted && !active) inferq::ActiveWaiterBudget::Process().Release();
  if (active) {
    const std::int64_t start = MonotonicNowNs();
    bool done = false, result = false;
    int spins = 0;
    while (!done) {
      if (ready()) {
        done = result = true;
        if constexpr (Strategy::kProcessBudget) ec.spin().Record(true);
      } else if (give_up()) {
        done = true;
      } else if (spins < Strategy::kSpins) {
        ++spins;
        CpuRelax();
        if ((spins & 63) == 0 && expired()) done = true;
      } else {
        const std::int64_t now = MonotonicNowNs();
        if (deadline_ns != inferq::kNoDeadline && now >= deadline_ns) {
          done = true;
        } else if (Strategy::kSleeps && now - start >= Strategy::kActiveNs) {
          if constexpr (Strategy::kProcessBudget) ec.spin().Record(false);
          break;
        } else {
          std::this_thread::yield();
        }
      }
    }
    // Giving up (deadline, close): the exact try decides, not a weak one that met a
    // thread in flight.
    if (done && !result) result = ready_exact();
    ec.LeaveActive();
    if (budgeted) inferq::ActiveWaiterBudget::Process().Release();
    if (done) return pass_on(result);
  }
  if constexpr (!Strategy::kSleeps) {
    for (;;) {
      if (ready()) return true;
      if (give_up() || expired()) return ready_exact();
      std::this_thread::yield();
    }
  } else {
    for (;;) {
      const std::uint32_t key = ec.PrepareWait();
      if (ready_exact()) {
        ec.CancelWait();
        return pass_on(true);
      }
      if (give_up() || expired()) {
        ec.CancelWait();
        // We may have been the one woken for an item we now leave behind: pass the
        // wake on (a spurious wake-up costs less than a sleeper that misses one).
        return pass_on(false);
      }
      ec.Wait(key, deadline_ns);
    }
  }
}

/// WaitUntil with one try for both uses (`ready` is exact).
template <class Strategy, class Ready, class GiveUp, class More>
bool WaitUntil(EventCount& ec, std::int64_t deadline_ns, Ready&& ready, GiveUp&& give_up,
               More&& more) {
  return WaitUntil<Strategy>(ec, deadline_ns, ready, ready, give_up, more);
}

}  // namespace inferq::ring_internal
