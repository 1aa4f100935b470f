// File: src/engine/node_pools.hpp (not API)
//
// NodePools: the fixed-size pools of one NUMA node that the Event shared by every
// delivery and each stream's record of it come from; PoolAllocator puts a
// std::allocate_shared object and its control block in them.
//
// Thread safety: FixedPool's (any thread allocates and frees).
#pragma once

#include <cstddef>
#include <memory>
#include <new>

#include "inferq/memory/fixed_pool.hpp"
#include "inferq/memory/numa_arena.hpp"

namespace inferq {
namespace engine_internal {

// The pools of one NUMA node for the engine's shared blocks (the Event every
// delivery shares, and one record per stream), by size class.
struct NodePools {
  explicit NodePools(NumaArena* arena)
      : small(128, {.blocks_per_chunk = 1024, .arena = arena}),
        medium(512, {.blocks_per_chunk = 512, .arena = arena}),
        large(2048, {.blocks_per_chunk = 128, .arena = arena}) {}
  FixedPool* For(std::size_t bytes) {
    if (bytes <= small.block_size()) return &small;
    if (bytes <= medium.block_size()) return &medium;
    if (bytes <= large.block_size()) return &large;
    return nullptr;
  }
  FixedPool small, medium, large;
};

// Allocator for std::allocate_shared: the control block and object come from the
// node's pools (operator new above 2 KiB). A copy lives in the control block, so a
// block returns to the pool of the node it came from, whichever thread frees it.
template <class T>
struct PoolAllocator {
  using value_type = T;
  NodePools* pools;
  explicit PoolAllocator(NodePools* p) : pools(p) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& o) : pools(o.pools) {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    FixedPool* pool = pools->For(n * sizeof(T));
    return static_cast<T*>(pool != nullptr ? pool->Allocate() : ::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    FixedPool* pool = pools->For(n * sizeof(T));
    if (pool != nullptr) {
      pool->Deallocate(p);
    } else {
      ::operator delete(p);
    }
  }
  template <class U>
  bool operator==(const PoolAllocator<U>& o) const { return pools == o.pools; }
};

}  // namespace engine_internal
}  // namespace inferq
