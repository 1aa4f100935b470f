// File: src/engine/node_pools.hpp (not API)
//
// NodePools: the fixed-size pools of one NUMA node that each stream's record of an
// event comes from (the first stream's record holds the Event every delivery shares);
// PoolAllocator puts a std::allocate_shared object and its control block in them.
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

// The pools of one NUMA node for the engine's shared blocks: one record per stream
// that stores an event (the first stream's record holding the event), with its
// control block. One size class: every record is the same size (publish.cpp asserts
// that it fits kRecordBlock).
inline constexpr std::size_t kRecordBlock = 576;
struct NodePools {
  explicit NodePools(NumaArena* arena) : records(kRecordBlock, {.blocks_per_chunk = 512, .arena = arena}) {}
  FixedPool* For(std::size_t bytes) { return bytes <= records.block_size() ? &records : nullptr; }
  FixedPool records;
};

// Allocator for std::allocate_shared: the control block and object come from the
// node's pools (operator new above kRecordBlock). A copy lives in the control block, so a
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
