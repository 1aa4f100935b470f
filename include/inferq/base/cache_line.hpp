/// @file inferq/base/cache_line.hpp
///
/// The library's own cache-line constant. GCC 12 warns (-Winterference-size) when
/// std::hardware_destructive_interference_size is used in a header, because its value
/// may differ between translation units compiled with different -mtune flags; a
/// constant of our own keeps the layout of every type identical across the ABI.
///
/// Usage:
/// @code
///   struct alignas(inferq::kCacheLineSize) Counter { std::atomic<std::uint64_t> n; };
/// @endcode
///
/// Thread safety: constants only.
#pragma once

#include <cstddef>

namespace inferq {

/// 64 bytes: the line size of every x86-64 and of most AArch64 cores. Apple M-series
/// and some POWER cores use 128-byte lines; there two neighbours may still share a
/// line, which costs speed but never correctness.
inline constexpr std::size_t kCacheLineSize = 64;

}  // namespace inferq
