// File: inferq/base/clock.hpp
//
// A monotonic clock in nanoseconds behind a small interface, so that components that
// stamp or age events (stream max_age, latency statistics) can run on simulated time
// in tests.
//
// Usage:
//   inferq::ManualClock clock;          // starts at 0 ns
//   clock.Advance(absl::Milliseconds(5));
//   std::int64_t t = clock.NowNanos();  // 5'000'000
//
// Thread safety: every method of both clocks may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace inferq {

// Source of monotonic time. NowNanos() never decreases for a given clock.
class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds since an arbitrary, fixed origin.
  virtual std::int64_t NowNanos() const = 0;
};

// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux).
class SteadyClock final : public Clock {
 public:
  std::int64_t NowNanos() const override { return Now(); }
  // The same reading without a virtual call, for hot paths that know the clock.
  static std::int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance; lives for the whole program.
  static SteadyClock* Default() {
    static SteadyClock clock;
    return &clock;
  }
};

// A clock that moves only when told to. For tests.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(std::int64_t start_ns = 0) : now_ns_(start_ns) {}
  std::int64_t NowNanos() const override {
    return now_ns_.load(std::memory_order_acquire);
  }
  // Moves the clock forward by `d` (a negative `d` is ignored: the clock is monotonic).
  void Advance(absl::Duration d) {
    const std::int64_t ns = absl::ToInt64Nanoseconds(d);
    if (ns > 0) now_ns_.fetch_add(ns, std::memory_order_acq_rel);
  }

 private:
  std::atomic<std::int64_t> now_ns_;
};

}  // namespace inferq
