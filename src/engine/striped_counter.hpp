// File: src/engine/striped_counter.hpp
//
// StripedCounter: a statistics counter that many threads add to at once without
// sharing a cache line (most of the time): each thread adds to one of 16 padded
// slots, picked once per thread; a read sums the slots. The sum is exact once the
// adders are done; a read racing them may miss adds in flight.
//
// Thread safety: Add and Sum may be called from any threads at once.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "inferq/base/cache_line.hpp"

namespace inferq::engine_internal {

class StripedCounter {
 public:
  void Add(std::uint64_t n = 1) {
    // relaxed: a statistic; nothing else is published through it.
    slots_[Slot()].value.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t Sum() const {
    std::uint64_t sum = 0;
    for (const PaddedSlot& s : slots_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr std::size_t kSlots = 16;
  struct alignas(kCacheLineSize) PaddedSlot {
    std::atomic<std::uint64_t> value{0};
  };
  static_assert(sizeof(PaddedSlot) == kCacheLineSize);
  // Threads take slots round robin, in the order they first add to any counter.
  static std::size_t Slot() {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t slot = next.fetch_add(1, std::memory_order_relaxed) % kSlots;
    return slot;
  }
  std::array<PaddedSlot, kSlots> slots_{};
};

}  // namespace inferq::engine_internal
