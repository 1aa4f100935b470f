/// @file inferq/memory/numa_arena.hpp
///
/// NumaArena: a region of memory bound to one NUMA node and handed to mimalloc as an
/// exclusive arena (mi_manage_os_memory_ex with the node id), with one mimalloc heap
/// per thread in that arena (mi_heap_new_in_arena), so that what a thread allocates
/// through the arena lives on the arena's node. FixedPool takes its chunks from one.
///
/// mimalloc 2.0.9 (Debian 12) needs the region to start on a 32 MiB boundary (else
/// the first allocation crashes) and cannot take an arena back, so an arena lives
/// until the process ends: create one per node at startup, not per request.
///
/// libinferq links Debian's libmimalloc, which also replaces malloc/free for the whole
/// process; configure with -DINFERQ_WITH_MIMALLOC=OFF to keep the host's allocator,
/// and Create then returns Unimplemented.
///
/// On a machine with one node (or a synthetic topology) the region is not bound —
/// there is nothing to bind to — and Stats() says so; allocation works the same.
///
/// Usage:
/// @code
///   auto topo = inferq::Topology::Detect();
///   auto arena = inferq::NumaArena::Create(*topo, /*node=*/0, 64 << 20);
///   void* p = (*arena)->Allocate(4096);     // nullptr when the arena is exhausted
///   inferq::NumaArena::Free(p);              // from any thread
/// @endcode
///
/// Thread safety: Allocate and Free from any thread (each thread allocates from its
/// own heap); Stats from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "inferq/memory/topology.hpp"

namespace inferq {

/// What a NumaArena reserved and whether it is bound to its node (NumaArena::Stats).
struct NumaArenaStats {
  int node = 0;                   ///< OS index of the node
  std::uint64_t bytes_reserved = 0;  ///< size of the region (a multiple of 32 MiB)
  bool bound = false;             ///< memory policy bound to the node (mbind)
  std::string binding;            ///< why or why not, e.g. "one node: not bound"
};

/// A region of memory for one NUMA node (bound to it where the machine has several)
/// that mimalloc allocates from (see the file comment).
class NumaArena {
 public:
  /// Reserves `bytes` (rounded up to a multiple of 32 MiB) for node `node_index` (an
  /// index into topology.nodes()). InvalidArgument for a node out of range or a size
  /// of 0 or over 1 TiB; ResourceExhausted when the address space cannot be
  /// reserved; Internal when mimalloc refuses the region; Unimplemented when built
  /// without mimalloc.
  static absl::StatusOr<std::unique_ptr<NumaArena>> Create(const Topology& topology,
                                                           int node_index, std::size_t bytes);
  ~NumaArena();  ///< the region stays with mimalloc until the process ends (see above)
  NumaArena(const NumaArena&) = delete;
  NumaArena& operator=(const NumaArena&) = delete;

  /// `bytes` aligned to `alignment` (a power of two up to 4096) from the calling
  /// thread's heap in this arena; nullptr when the arena has no room left.
  void* Allocate(std::size_t bytes, std::size_t alignment = 16);
  /// Frees memory from Allocate (from any thread).
  static void Free(void* p);

  /// OS index of the arena's node (NumaArenaStats::node).
  int node() const { return stats_.node; }
  /// What the arena reserved and how it is bound; fixed once Create returned.
  NumaArenaStats Stats() const { return stats_; }

 private:
  NumaArena() = default;
  [[maybe_unused]] int arena_id_ = 0;  ///< unused without mimalloc
  NumaArenaStats stats_;
};

}  // namespace inferq
