/// @file inferq/sched/internal/format.hpp
///
/// Helpers of the sched layer (not API): number formatting for error messages and
/// a 128-bit integer type.
///
/// Thread safety: pure functions.
#pragma once

#include <cstdio>
#include <string>

namespace inferq::sched_internal {

/// `v` as printf's %g writes it ("0.2", "1e+06"): short and round-trippable enough
/// for an error message.
inline std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// 128-bit products for exact share comparisons (GCC and Clang; __extension__ keeps
/// -Wpedantic quiet).
__extension__ typedef unsigned __int128 u128;

}  // namespace inferq::sched_internal
