#include "inferq/memory/numa_arena.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#if INFERQ_HAVE_MIMALLOC
#include <mimalloc.h>
#endif

#include "absl/status/status.h"

namespace inferq {

#if INFERQ_HAVE_MIMALLOC
namespace {

constexpr std::size_t kArenaAlign = std::size_t{32} << 20;  // mimalloc 2.0.9 arena block

// One mimalloc heap per (thread, arena), deleted at thread exit; blocks still in use
// then migrate to the thread's default heap and can be freed as usual.
// Trivially destructible: still readable after ~ThreadHeaps ran at thread exit.
thread_local bool tls_heaps_gone = false;

struct ThreadHeaps {
  std::vector<std::pair<int, mi_heap_t*>> heaps;
  ~ThreadHeaps() {
    tls_heaps_gone = true;
    for (auto& [id, heap] : heaps) mi_heap_delete(heap);
  }
  mi_heap_t* For(int arena_id) {
    for (auto& [id, heap] : heaps) {
      if (id == arena_id) return heap;
    }
    mi_heap_t* heap = mi_heap_new_in_arena(arena_id);
    if (heap != nullptr) heaps.emplace_back(arena_id, heap);
    return heap;
  }
};
thread_local ThreadHeaps tls_heaps;

}  // namespace

absl::StatusOr<std::unique_ptr<NumaArena>> NumaArena::Create(const Topology& topology,
                                                             int node_index, std::size_t bytes) {
  if (node_index < 0 || static_cast<std::size_t>(node_index) >= topology.node_count()) {
    return absl::InvalidArgumentError("NUMA node index " + std::to_string(node_index) +
                                      " is outside 0.." +
                                      std::to_string(topology.node_count() - 1));
  }
  if (bytes == 0 || bytes > (std::size_t{1} << 40)) {
    return absl::InvalidArgumentError("arena size " + std::to_string(bytes) +
                                      " is outside 1..2^40 bytes");
  }
  const std::size_t size = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  // Reserve size + one alignment unit, then trim to a 32 MiB aligned region.
  void* raw = mmap(nullptr, size + kArenaAlign, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError("cannot reserve " + std::to_string(size) +
                                        " bytes for a NUMA arena: " + std::strerror(errno));
  }
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (base + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  if (start > base) munmap(raw, start - base);
  const std::uintptr_t end = start + size;
  const std::uintptr_t raw_end = base + size + kArenaAlign;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);

  auto arena = std::unique_ptr<NumaArena>(new NumaArena());
  const NumaNode& node = topology.nodes()[static_cast<std::size_t>(node_index)];
  arena->stats_.node = node.index;
  arena->stats_.bytes_reserved = size;
  if (topology.synthetic()) {
    arena->stats_.binding = "synthetic topology: not bound";
  } else if (topology.node_count() == 1) {
    arena->stats_.binding = "one node: not bound";
  } else {
    // MPOL_BIND (2) to this node only; pages are placed there when first touched.
    std::vector<unsigned long> mask(static_cast<std::size_t>(node.index) / (8 * sizeof(long)) + 1, 0);
    mask[static_cast<std::size_t>(node.index) / (8 * sizeof(long))] |=
        1ul << (static_cast<unsigned>(node.index) % (8 * sizeof(long)));
    const long rc = syscall(SYS_mbind, reinterpret_cast<void*>(start), size, 2, mask.data(),
                            mask.size() * 8 * sizeof(long) + 1, 0);
    arena->stats_.bound = rc == 0;
    arena->stats_.binding = rc == 0 ? "bound to node " + std::to_string(node.index)
                                    : std::string("mbind failed: ") + std::strerror(errno);
  }
  if (!mi_manage_os_memory_ex(reinterpret_cast<void*>(start), size, /*is_committed=*/true,
                              /*is_large=*/false, /*is_zero=*/true, node.index,
                              /*exclusive=*/true, &arena->arena_id_)) {
    munmap(reinterpret_cast<void*>(start), size);
    return absl::InternalError("mimalloc refused a " + std::to_string(size) +
                               "-byte arena for node " + std::to_string(node.index));
  }
  return arena;
}

NumaArena::~NumaArena() = default;

void* NumaArena::Allocate(std::size_t bytes, std::size_t alignment) {
  if (tls_heaps_gone) {
    // The thread is exiting and its heaps are gone (an allocation from another
    // thread_local's destructor): serve it from mimalloc's default heap, not bound
    // to the node, rather than touch a deleted heap.
    return mi_malloc_aligned(bytes, alignment < 16 ? 16 : alignment);
  }
  mi_heap_t* heap = tls_heaps.For(arena_id_);
  if (heap == nullptr) return nullptr;
  return alignment <= 16 ? mi_heap_malloc(heap, bytes)
                         : mi_heap_malloc_aligned(heap, bytes, alignment);
}

void NumaArena::Free(void* p) { mi_free(p); }

#else  // built with INFERQ_WITH_MIMALLOC=OFF

absl::StatusOr<std::unique_ptr<NumaArena>> NumaArena::Create(const Topology&, int, std::size_t) {
  return absl::UnimplementedError(
      "NumaArena needs mimalloc: inferq was built with INFERQ_WITH_MIMALLOC=OFF");
}
NumaArena::~NumaArena() = default;
void* NumaArena::Allocate(std::size_t, std::size_t) { return nullptr; }
void NumaArena::Free(void*) {}

#endif

}  // namespace inferq
