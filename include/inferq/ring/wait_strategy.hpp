// File: inferq/ring/wait_strategy.hpp
//
// How a blocking ring operation waits for room or for an item. A strategy is a type
// with three constants; the ring's blocking calls (push, pop, push_for, pop_for) try
// the operation, then pause-spin `kSpins` times, yield `kYields` times, and then, if
// `kSleeps`, sleep on the ring's event count until woken (see
// internal/event_count.hpp), or else keep yielding.
//
//   SpinWait    never yields or sleeps: lowest hand-off latency, burns a core per
//               waiter. Only for threads pinned to cores of their own.
//   YieldWait   spins briefly, then yields forever: no syscall to wake, but an idle
//               waiter still uses CPU when others want it.
//   HybridWait  spins ~2 µs, yields a little, then sleeps (the default). Waking a
//               sleeper costs a futex syscall and ~20 µs; under load waiters rarely
//               reach the sleep, and idle ones use no CPU.
//
// Only a strategy that sleeps makes the ring's push and pop pay for notifications (a
// fence and a read of the sleeper count per operation); rings with SpinWait or
// YieldWait skip them at compile time.
//
// Usage:
//   inferq::MpmcRing<Job, inferq::SpinWait> ring(1024);
//
// Thread safety: constants only.
#pragma once

#include <climits>

namespace inferq {

struct SpinWait {
  static constexpr int kSpins = INT_MAX;
  static constexpr int kYields = 0;
  static constexpr bool kSleeps = false;
};

struct YieldWait {
  static constexpr int kSpins = 64;
  static constexpr int kYields = INT_MAX;
  static constexpr bool kSleeps = false;
};

struct HybridWait {
  static constexpr int kSpins = 256;
  static constexpr int kYields = 16;
  static constexpr bool kSleeps = true;
};

}  // namespace inferq
