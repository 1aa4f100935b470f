/// @file inferq/memory/internal/pool_fast_path.hpp  (not API: used by fixed_pool.hpp)
///
/// The part of a FixedPool thread cache that the inline fast paths of Allocate and
/// Deallocate touch, and the thread-local table of this thread's caches. `constinit` tells the compiler the thread_locals need no dynamic
/// initialization, so reading them is one %fs-relative load, without the call to a
/// TLS wrapper that a thread_local with a constructor or destructor costs.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace inferq::memory_internal {

struct PoolCore;

struct FreeNode {
  FreeNode* next;
};

struct CacheHead {
  FreeNode* head = nullptr;  ///< free blocks of this thread for one pool
  std::size_t count = 0;
  std::size_t limit = 0;     ///< above it a free goes to the slow path (returns a batch)
  /// Written by the owning thread only (load + store, no read-modify-write), read by
  /// Stats() under the pool's mutex.
  std::atomic<std::uint64_t> frees{0}, hits{0}, misses{0};

  static void Bump(std::atomic<std::uint64_t>& c) {
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
};

/// A thread's caches by pool slot (FixedPool's slot_: its creation number modulo
/// kCacheSlots): the fast paths find the cache of a pool in one load and one compare.
/// Direct-mapped, because a publish alternates between several pools (the event, the
/// stream's record, the payload): one "last pool used" entry missed on every one of
/// them. Two pools of one slot share it and take the slow path in turn. An entry
/// points only at a core whose cache this thread holds (which keeps the core alive),
/// so a stale entry never matches a new pool at a reused address.
inline constexpr std::size_t kCacheSlots = 16;
struct CacheSlot {
  PoolCore* core = nullptr;
  CacheHead* cache = nullptr;
};
extern thread_local constinit CacheSlot tls_cache_slots[kCacheSlots];

}  // namespace inferq::memory_internal
