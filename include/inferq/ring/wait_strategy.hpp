// File: inferq/ring/wait_strategy.hpp
//
// How a blocking ring operation waits for room or for an item. The ring's blocking
// calls (push, pop, push_for, pop_for) try the operation, then wait actively —
// `kSpins` pause-spins, then yields — for up to `kActiveNs` (while at most
// `kMaxActive` threads wait actively on the same ring side), and then, if `kSleeps`,
// sleep on the ring's event count until woken (internal/event_count.hpp); a strategy
// that does not sleep keeps yielding.
//
//   SpinWait    spins and never sleeps: lowest hand-off latency, burns a core per
//               waiter. Only for threads pinned to cores of their own.
//   YieldWait   spins briefly, then yields forever: no wake-up syscalls, but an idle
//               waiter still uses CPU whenever others want it.
//   HybridWait  (default) waits actively for 15 µs, then sleeps. Under load a waiter
//               is served within the active window and never sleeps; an idle one
//               costs 15 µs of CPU and then nothing. Waking a sleeper costs a futex
//               syscall (~20 µs of latency on the 2-vCPU machines measured), and a
//               producer makes that call only when no consumer waits actively
//               (internal/event_count.hpp, invariant 4). While nobody sleeps, a
//               push or pop pays one load of a line that rarely changes for the
//               possibility (invariant 2): no fence, no read-modify-write.
//
// The constants were chosen by measurement (BENCHMARKS.md: bench_rings, variants of
// the active window and of the number of active waiters): 5, 15 and 50 µs gave the
// same throughput; 5 µs let the round trip fall into sleeps (6.6 µs instead of
// 0.63), 50 µs made a consumer of a 50,000 items/s stream spin between items.
// Usage:
//   inferq::MpmcRing<Job, inferq::SpinWait> ring(1024);
//
// Thread safety: constants only.
#pragma once

#include <climits>

namespace inferq {

struct SpinWait {
  static constexpr int kSpins = INT_MAX;
  static constexpr long kActiveNs = 0;
  static constexpr int kMaxActive = INT_MAX;
  static constexpr bool kSleeps = false;
};

struct YieldWait {
  static constexpr int kSpins = 64;
  static constexpr long kActiveNs = 0;
  static constexpr int kMaxActive = INT_MAX;
  static constexpr bool kSleeps = false;
};

struct HybridWait {
  static constexpr int kSpins = 64;
  static constexpr long kActiveNs = 15'000;
  static constexpr int kMaxActive = INT_MAX;
  static constexpr bool kSleeps = true;
};

}  // namespace inferq
