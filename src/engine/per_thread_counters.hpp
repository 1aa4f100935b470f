// File: src/engine/per_thread_counters.hpp
//
// PerThreadCounters<N>: N statistics counters on a hot path that many threads add
// to, with no atomic read-modify-write and no shared cache line: each thread adds to
// its own block, a read sums the blocks. For counts taken on every publish (the route
// cache's hits), where a `lock xadd` on a shared counter would cost more than what
// it counts.
//
// Invariants:
//  1. A block has one writer, the thread that registered it (owner), which adds with
//     a relaxed load and store; readers load relaxed. A single writer makes the
//     load-then-store exact, and a reader sees each counter whole (atomic loads).
//  2. Blocks live as long as the PerThreadCounters: a thread that exits leaves its
//     block and its counts. At most one block per thread that ever added.
//  3. A thread finds its block through a small thread-local table keyed by the
//     object's id, unique in the process (never reused), so an entry left by a
//     destroyed object never matches a new one.
//
// Thread safety: Add from any threads at once; Sum from any thread (it takes the
// registry's mutex, which Add takes only the first time a thread adds, or when its
// table entry was replaced).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "inferq/base/cache_line.hpp"

namespace inferq::engine_internal {

template <std::size_t N>
class PerThreadCounters {
 public:
  PerThreadCounters() : id_(NextId()) {}
  PerThreadCounters(const PerThreadCounters&) = delete;
  PerThreadCounters& operator=(const PerThreadCounters&) = delete;

  void Add(std::size_t i, std::uint64_t n = 1) {
    std::atomic<std::uint64_t>& v = Mine()->values[i];
    // relaxed: invariant 1 (one writer); a statistic publishes nothing else.
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }

  std::array<std::uint64_t, N> Sum() const {
    std::array<std::uint64_t, N> out{};
    std::lock_guard lock(mu_);
    for (const auto& b : blocks_) {
      for (std::size_t i = 0; i < N; ++i) out[i] += b->values[i].load(std::memory_order_relaxed);
    }
    return out;
  }

 private:
  struct alignas(kCacheLineSize) Block {
    std::array<std::atomic<std::uint64_t>, N> values{};
    std::thread::id owner;
  };
  struct Entry {
    std::uint64_t id = 0;  // 0: empty (ids start at 1)
    Block* block = nullptr;
  };
  static constexpr std::size_t kEntries = 4;
  struct Table {
    std::array<Entry, kEntries> entries{};
    std::size_t next = 0;  // the entry a registration replaces
  };

  static std::uint64_t NextId() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  Block* Mine() {
    thread_local Table table;
    for (const Entry& e : table.entries) {
      if (e.id == id_) return e.block;
    }
    Block* b = Register();
    table.entries[table.next++ % kEntries] = {id_, b};
    return b;
  }

  // This thread's block: the one it registered before (its table entry was
  // replaced), or a new one.
  Block* Register() {
    const std::thread::id self = std::this_thread::get_id();
    std::lock_guard lock(mu_);
    for (const auto& b : blocks_) {
      if (b->owner == self) return b.get();
    }
    blocks_.push_back(std::make_unique<Block>());
    blocks_.back()->owner = self;
    return blocks_.back().get();
  }

  const std::uint64_t id_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Block>> blocks_;  // guarded by mu_
};

}  // namespace inferq::engine_internal
