/// @file inferq/ring/wait_strategy.hpp
///
/// How a blocking ring operation waits for room or for an item. The ring's blocking
/// calls (push, pop, push_for, pop_for) try the operation, then wait actively —
/// `kSpins` pause-spins, then yields — for up to `kActiveNs` (while at most
/// `kMaxActive` threads wait actively on the same ring side and, with `kProcessBudget`,
/// while the process-wide budget of active waiters has room), and then, if `kSleeps`,
/// sleep on the ring's event count until woken (internal/event_count.hpp); a strategy
/// that does not sleep keeps yielding.
///
/// @code{.unparsed}
///   SpinWait    spins and never sleeps: lowest hand-off latency, burns a core per
///               waiter. Only for threads pinned to cores of their own.
///   YieldWait   spins briefly, then yields forever: no wake-up syscalls, but an idle
///               waiter still uses CPU whenever others want it.
///   HybridWait  (default) waits actively for 15 µs, then sleeps. Under load a waiter
///               is served within the active window and never sleeps; an idle one
///               costs 15 µs of CPU and then nothing. Waking a sleeper costs a futex
///               syscall (~20 µs of latency on the 2-vCPU machines measured), and a
///               producer makes that call only when no consumer waits actively
///               (internal/event_count.hpp, invariant 4). While nobody sleeps, a
///               push or pop pays one load of a line that rarely changes for the
///               possibility (invariant 2): no fence, no read-modify-write.
///   BudgetedWait  HybridWait whose active phase is rationed: a waiter spins only
///               while it holds a token of the process-wide ActiveWaiterBudget (below;
///               at most half the CPUs' worth of threads spin at a time, over all
///               rings), and only while spinning pays off on this ring: after an
///               active phase that ended without an item, the next 1, 3, 7, ... 63
///               waits sleep at once (internal/event_count.hpp, invariants 5 and 6).
///               For consumers that share the cores with their producers and do work
///               between items, as the engine's lanes do. A ring of threads that only
///               move items wants HybridWait: there the spinning is the hand-off
///               (BENCHMARKS.md: bench_rings 2x2 and 4x4 fell 2-8x under a
///               budget).
/// @endcode
///
/// The constants were chosen by measurement (BENCHMARKS.md: bench_rings, variants of
/// the active window and of the number of active waiters): 5, 15 and 50 µs gave the
/// same throughput; 5 µs let the round trip fall into sleeps (6.6 µs instead of
/// 0.63), 50 µs made a consumer of a 50,000 items/s stream spin between items.
///
/// Usage:
/// @code
///   inferq::MpmcRing<Job, inferq::SpinWait> ring(1024);
///   inferq::MpmcRing<Job, inferq::BudgetedWait> lane(1024);
/// @endcode
///
/// Thread safety: the strategies are constants; ActiveWaiterBudget is thread-safe.
#pragma once

#include <atomic>
#include <climits>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#include "inferq/base/cache_line.hpp"

namespace inferq {

/// Spins and never sleeps: lowest hand-off latency, a core per waiter (see the file
/// comment).
struct SpinWait {
  static constexpr int kSpins = INT_MAX;         ///< pause-spins before yielding
  static constexpr long kActiveNs = 0;           ///< active window (ns); unused: never sleeps
  static constexpr int kMaxActive = INT_MAX;     ///< threads waiting actively per ring side
  static constexpr bool kProcessBudget = false;  ///< ActiveWaiterBudget rations the active phase
  static constexpr bool kSleeps = false;         ///< sleeps after the active window
};

/// Spins briefly, then yields forever: no wake-up syscalls (see the file comment).
struct YieldWait {
  static constexpr int kSpins = 64;              ///< pause-spins before yielding
  static constexpr long kActiveNs = 0;           ///< active window (ns); unused: never sleeps
  static constexpr int kMaxActive = INT_MAX;     ///< threads waiting actively per ring side
  static constexpr bool kProcessBudget = false;  ///< ActiveWaiterBudget rations the active phase
  static constexpr bool kSleeps = false;         ///< sleeps after the active window
};

/// The default: waits actively for 15 µs, then sleeps (see the file comment).
struct HybridWait {
  static constexpr int kSpins = 64;              ///< pause-spins before yielding
  static constexpr long kActiveNs = 15'000;      ///< active window (ns): 15 µs
  static constexpr int kMaxActive = INT_MAX;     ///< threads waiting actively per ring side
  static constexpr bool kProcessBudget = false;  ///< ActiveWaiterBudget rations the active phase
  static constexpr bool kSleeps = true;          ///< sleeps after the active window
};

/// HybridWait's constants, with the active phase rationed (kProcessBudget).
struct BudgetedWait : HybridWait {
  static constexpr bool kProcessBudget = true;  ///< ActiveWaiterBudget rations the active phase
};

/// The process-wide budget of active waiters (BudgetedWait). A thread that spins or
/// yields for an item helps only while a core is free for it: on a machine with fewer
/// cores than runnable threads, every extra spinner takes the core a producer needs,
/// and the producer's hand-off waits behind it. So a BudgetedWait waits actively only
/// while fewer than `Limit()` threads of the whole process do: half the CPUs this
/// process may run on (after Go's scheduler, which limits its spinning threads to half
/// the busy Ps: runtime/proc.go, findRunnable); 0 on one CPU, where a spinner only
/// delays the thread it waits for. The others sleep at once and are woken per item.
/// Why waiters outside the budget lose no wake-up: internal/event_count.hpp,
/// invariant 5. relaxed: the count orders nothing, and a waiter that misreads it
/// spins or sleeps once more or less.
///
/// Thread safety: every method may be called from any thread.
class ActiveWaiterBudget {
 public:
  /// The process's budget, with DefaultLimit() (read at the first call).
  static ActiveWaiterBudget& Process() {
    static ActiveWaiterBudget budget(DefaultLimit());
    return budget;
  }
  /// `limit` < 0 is taken as 0.
  explicit ActiveWaiterBudget(int limit) : limit_(limit < 0 ? 0 : limit) {}

  /// Takes a token when fewer than Limit() are taken; false otherwise.
  bool TryAcquire() {
    int n = active_.load(std::memory_order_relaxed);
    while (n < limit_) {
      if (active_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  /// Gives back a token TryAcquire took.
  void Release() { active_.fetch_sub(1, std::memory_order_relaxed); }
  /// Most tokens taken at once.
  int Limit() const { return limit_; }
  /// Tokens taken now (a relaxed read).
  int Active() const { return active_.load(std::memory_order_relaxed); }

  /// Half the CPUs in this thread's affinity mask (at the first call), rounded down.
  static int DefaultLimit() {
    int cpus = 0;
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
#endif
    if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
    return cpus / 2;
  }

 private:
  alignas(kCacheLineSize) std::atomic<int> active_{0};
  int limit_;
};

/// The adaptive skip of a BudgetedWait, one per ring side (and per QoS lane): whether a
/// waiter should wait actively now, and what its active phase got. After an active
/// phase that ended without its item, the next 1, 3, 7, ... kMaxSkips waits sleep at
/// once; an active phase that got its item resets the count. Waiting actively pays
/// off only while items come faster than the active window (15 µs): on a paced stream
/// the waiter then stops spinning, on a busy one it keeps the hand-off free of futex
/// calls. Adaptive spinning before blocking, as in the HotSpot JVM's monitors and
/// glibc's PTHREAD_MUTEX_ADAPTIVE_NP. relaxed: a hint; racy updates only make a
/// waiter spin or sleep once more or less (internal/event_count.hpp, invariant 6).
///
/// Thread safety: every method may be called from any thread.
class AdaptiveSpin {
 public:
  static constexpr int kMaxSkips = 63;  ///< most waits in a row that sleep at once

  /// True when this wait should wait actively; false (counting one skip) while
  /// skips are owed.
  bool ShouldSpin() {
    const int skip = skips_.load(std::memory_order_relaxed);
    if (skip == 0) return true;
    skips_.store(skip - 1, std::memory_order_relaxed);
    return false;
  }
  /// `paid`: the active phase got its item (false: its window ended without one).
  void Record(bool paid) {
    if (paid) {
      if (misses_.load(std::memory_order_relaxed) != 0) misses_.store(0, std::memory_order_relaxed);
      return;
    }
    int m = 2 * misses_.load(std::memory_order_relaxed) + 1;
    if (m > kMaxSkips) m = kMaxSkips;
    misses_.store(m, std::memory_order_relaxed);
    skips_.store(m, std::memory_order_relaxed);
  }

 private:
  std::atomic<int> misses_{0};
  std::atomic<int> skips_{0};
};

}  // namespace inferq
