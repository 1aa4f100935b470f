// Helpers shared by the benchmark binaries.
#pragma once

#include <sys/resource.h>

#include <cstdint>

#include "inferq/base/clock.hpp"

namespace inferq_bench {

// CLOCK_MONOTONIC in ns (std::chrono::steady_clock on Linux), the clock that
// clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...) paces against.
inline std::int64_t NowNs() { return inferq::SteadyClock::Now(); }

// User + system CPU time of the whole process, in seconds.
inline double ProcessCpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace inferq_bench
