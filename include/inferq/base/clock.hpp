/// @file inferq/base/clock.hpp
///
/// A monotonic clock in nanoseconds behind a small interface, so that components that
/// stamp or age events (stream max_age, latency statistics) can run on simulated time
/// in tests.
///
/// Usage:
/// @code
///   inferq::ManualClock clock;          // starts at 0 ns
///   clock.Advance(absl::Milliseconds(5));
///   std::int64_t t = clock.NowNanos();  // 5'000'000
/// @endcode
///
/// Thread safety: every method of both clocks may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

#include "absl/time/time.h"

namespace inferq {

/// Source of monotonic time. NowNanos() never decreases for a given clock.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Nanoseconds since an arbitrary, fixed origin.
  virtual std::int64_t NowNanos() const = 0;
};

/// std::chrono::steady_clock (CLOCK_MONOTONIC on Linux).
class SteadyClock final : public Clock {
 public:
  std::int64_t NowNanos() const override { return Now(); }
  /// The same reading without a virtual call, for hot paths that know the clock.
  static std::int64_t Now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  /// A process-wide instance; lives for the whole program and is never destroyed, so
  /// engine threads still running while std::exit destroys statics can read it.
  static SteadyClock* Default() {
    static SteadyClock* const clock = new SteadyClock();
    return clock;
  }
};

/// Deadlines for waiting, in ns of SteadyClock (CLOCK_MONOTONIC on Linux).
inline constexpr std::int64_t kNoDeadline = INT64_MAX;  ///< wait forever

/// The deadline `timeout` from now. Saturating: a timeout too long for int64
/// nanoseconds (hours::max(), ...) gives kNoDeadline; zero or negative gives 0, a
/// deadline already passed ("just try"), without reading the clock (a pull with a
/// zero timeout is a hot path). Converted through double so that no duration_cast
/// can overflow; below 2^53 ns (104 days) the conversion is exact.
template <class Rep, class Period>
std::int64_t DeadlineAfter(std::chrono::duration<Rep, Period> timeout);

/// A clock that moves only when told to. For tests.
class ManualClock final : public Clock {
 public:
  /// A clock reading `start_ns` nanoseconds until it is advanced.
  explicit ManualClock(std::int64_t start_ns = 0) : now_ns_(start_ns) {}
  std::int64_t NowNanos() const override {
    return now_ns_.load(std::memory_order_acquire);
  }
  /// Moves the clock forward by `d` (a negative `d` is ignored: the clock is monotonic).
  void Advance(absl::Duration d) {
    const std::int64_t ns = absl::ToInt64Nanoseconds(d);
    if (ns > 0) now_ns_.fetch_add(ns, std::memory_order_acq_rel);
  }

 private:
  std::atomic<std::int64_t> now_ns_;
};

template <class Rep, class Period>
std::int64_t DeadlineAfter(std::chrono::duration<Rep, Period> timeout) {
  const double ns = std::chrono::duration<double, std::nano>(timeout).count();
  if (!(ns > 0)) return 0;  // also NaN
  const std::int64_t now = SteadyClock::Now();
  if (ns >= static_cast<double>(kNoDeadline - now)) return kNoDeadline;
  return now + static_cast<std::int64_t>(ns);
}

/// The same for an absl::Duration (absl::InfiniteDuration() gives kNoDeadline).
inline std::int64_t DeadlineAfter(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return kNoDeadline;
  if (timeout <= absl::ZeroDuration()) return 0;
  return DeadlineAfter(absl::ToChronoNanoseconds(timeout));
}

}  // namespace inferq
