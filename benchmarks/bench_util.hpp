// Helpers shared by the benchmark binaries.
#pragma once

#include <sys/resource.h>
#include <time.h>

#include <cstdint>

#include "inferq/base/clock.hpp"

namespace inferq_bench {

// CLOCK_MONOTONIC in ns (std::chrono::steady_clock on Linux), the clock that
// clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...) paces against.
inline std::int64_t NowNs() { return inferq::SteadyClock::Now(); }

// Sleeps until `due_ns` of NowNs()'s clock (an absolute deadline, so a paced loop
// does not drift) and returns NowNs() after waking; returns at once when due.
inline std::int64_t SleepUntilNs(std::int64_t due_ns) {
  std::int64_t now = NowNs();
  if (now < due_ns) {
    timespec ts{static_cast<time_t>(due_ns / 1'000'000'000),
                static_cast<long>(due_ns % 1'000'000'000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
    now = NowNs();
  }
  return now;
}

// User + system CPU time of the whole process, in seconds.
inline double ProcessCpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace inferq_bench
