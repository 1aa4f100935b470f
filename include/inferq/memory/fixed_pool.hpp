/// @file inferq/memory/fixed_pool.hpp
///
/// FixedPool: fixed-size blocks with per-thread caches and cross-thread free, for
/// event records and payload buffers. A thread allocates from its own cache (a few
/// instructions, no atomic operation) and refills it from the pool in batches; a
/// block may be freed by any thread, into that thread's cache, which returns a batch
/// to the pool when it holds too many (the scheme of tcmalloc's thread caches).
/// Chunks of blocks come from a NumaArena when one is given (memory of one NUMA
/// node; when its region is used up, from operator new, counted in
/// chunks_outside_arena), else from operator new.
///
/// Usage:
/// @code
///   inferq::FixedPool pool(256);                  // 256-byte blocks
///   void* p = pool.Allocate();                    // std::bad_alloc when out of memory
///   pool.Deallocate(p);                           // from any thread
///   inferq::FixedPoolStats s = pool.Stats();
/// @endcode
///
/// Thread safety: Allocate, Deallocate and Stats from any number of threads. A
/// thread's cache is flushed back to the pool when the thread exits. Destroying the
/// pool while blocks are still allocated is a precondition violation; destroying it
/// while other threads still cache free blocks is fine (their memory is released when
/// the last of those threads exits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "inferq/memory/internal/pool_fast_path.hpp"

namespace inferq {

class NumaArena;

/// A FixedPool's counters (FixedPool::Stats). Counts are since the pool was made.
struct FixedPoolStats {
  std::size_t block_size = 0;       ///< bytes per block (after rounding up)
  std::uint64_t chunks = 0;         ///< chunks carved so far
  std::uint64_t blocks_total = 0;   ///< blocks in those chunks
  std::uint64_t bytes_reserved = 0; ///< chunk bytes
  std::uint64_t allocations = 0;    ///< Allocate calls
  std::uint64_t frees = 0;          ///< Deallocate calls
  std::uint64_t blocks_in_use = 0;  ///< allocations - frees
  std::uint64_t cache_hits = 0;     ///< Allocate served by the thread's cache
  std::uint64_t cache_misses = 0;   ///< Allocate that refilled the cache from the pool
  int numa_node = -1;               ///< node of the arena, -1 without one
  std::uint64_t chunks_outside_arena = 0;  ///< chunks from operator new: arena was full
};



/// A pool of fixed-size blocks with per-thread caches (see the file comment).
class FixedPool {
 public:
  /// How the pool grows and how much a thread's cache holds; every count must be > 0.
  struct Options {
    std::size_t blocks_per_chunk = 1024;   ///< blocks carved at once when the pool is empty
    std::size_t thread_cache_blocks = 64;  ///< batch moved between a cache and the pool
    NumaArena* arena = nullptr;            ///< chunk memory; nullptr = operator new
  };

  /// `block_size` in bytes, rounded up to a multiple of 16 (blocks are 16-byte
  /// aligned). Throws std::invalid_argument for 0, more than 1 MiB, or options of 0.
  explicit FixedPool(std::size_t block_size);
  /// The same with `options`; std::invalid_argument also for a count of 0 in them.
  FixedPool(std::size_t block_size, Options options);
  ~FixedPool();
  FixedPool(const FixedPool&) = delete;
  FixedPool& operator=(const FixedPool&) = delete;

  /// A block of block_size() bytes. Throws std::bad_alloc when no chunk can be had.
  /// Inline fast path: the calling thread's cache of this pool, if it has a block.
  void* Allocate() {
    using namespace memory_internal;
    if (const CacheSlot& s = tls_cache_slots[slot_]; s.core == core_raw_) {
      CacheHead* c = s.cache;
      if (FreeNode* n = c->head) {
        c->head = n->next;
        --c->count;
        CacheHead::Bump(c->hits);
        return n;
      }
    }
    return AllocateSlow();
  }

  /// Returns a block obtained from this pool's Allocate, from any thread.
  void Deallocate(void* block) noexcept {
    using namespace memory_internal;
    if (const CacheSlot& s = tls_cache_slots[slot_]; block != nullptr && s.core == core_raw_) {
      CacheHead* c = s.cache;
      if (c->count < c->limit) {
        auto* n = static_cast<FreeNode*>(block);
        n->next = c->head;
        c->head = n;
        ++c->count;
        CacheHead::Bump(c->frees);
        return;
      }
    }
    DeallocateSlow(block);
  }

  /// Bytes per block: the constructor's block_size rounded up to a multiple of 16.
  std::size_t block_size() const;
  /// A snapshot of the counters, the threads' caches included; takes the pool's mutex.
  FixedPoolStats Stats() const;

 private:
  void* AllocateSlow();
  void DeallocateSlow(void* block) noexcept;
  std::shared_ptr<memory_internal::PoolCore> core_;
  memory_internal::PoolCore* core_raw_ = nullptr;  ///< core_.get(), for the fast paths
  std::size_t slot_ = 0;  ///< index into memory_internal::tls_cache_slots
};

}  // namespace inferq
