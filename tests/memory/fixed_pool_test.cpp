#include "inferq/memory/fixed_pool.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/memory/numa_arena.hpp"
#include "inferq/memory/topology.hpp"
#include "inferq/ring/mpmc_ring.hpp"

using inferq::FixedPool;

TEST_CASE("pool: block size rounding and bad sizes") {
  CHECK(FixedPool(1).block_size() == 16);
  CHECK(FixedPool(256).block_size() == 256);
  CHECK(FixedPool(257).block_size() == 272);
  CHECK_THROWS_AS(FixedPool(0), std::invalid_argument);
  CHECK_THROWS_WITH(FixedPool((1 << 20) + 1), "FixedPool block_size 1048577 is outside 1..1048576");
  CHECK_THROWS_AS(FixedPool(64, {.blocks_per_chunk = 0}), std::invalid_argument);
}

TEST_CASE("pool: blocks are distinct, aligned, writable and reused") {
  FixedPool pool(64, {.blocks_per_chunk = 16, .thread_cache_blocks = 4});
  std::set<void*> seen;
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) {
    void* p = pool.Allocate();
    REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 16 == 0);
    std::memset(p, i, 64);
    REQUIRE(seen.insert(p).second);
    blocks.push_back(p);
  }
  auto s = pool.Stats();
  CHECK(s.chunks == 3);  // 40 blocks from chunks of 16
  CHECK(s.blocks_total == 48);
  CHECK(s.blocks_in_use == 40);
  CHECK(s.allocations == 40);
  CHECK(s.cache_misses == 10);  // one refill of 4 per 4 allocations
  CHECK(s.cache_hits == 30);
  for (void* p : blocks) pool.Deallocate(p);
  void* again = pool.Allocate();
  CHECK(seen.count(again) == 1);  // reused, no new chunk
  pool.Deallocate(again);
  s = pool.Stats();
  CHECK(s.chunks == 3);
  CHECK(s.blocks_in_use == 0);
  CHECK(s.frees == 41);
  CHECK(s.numa_node == -1);
}

TEST_CASE("pool: blocks freed by another thread go back into circulation") {
  FixedPool pool(256, {.blocks_per_chunk = 64, .thread_cache_blocks = 8});
  inferq::MpmcRing<void*> handoff(1024);
  constexpr int kBlocks = 20'000;
  std::thread consumer([&] {
    void* p;
    while (handoff.pop(p)) {
      std::memset(p, 0xab, 256);
      pool.Deallocate(p);  // cross-thread free
    }
  });
  for (int i = 0; i < kBlocks; ++i) {
    void* p = pool.Allocate();
    std::memset(p, 0x11, 256);
    handoff.push(p);
  }
  handoff.close();
  consumer.join();  // the consumer's cache is flushed at its exit
  const auto s = pool.Stats();
  CHECK(s.allocations == kBlocks);
  CHECK(s.frees == kBlocks);
  CHECK(s.blocks_in_use == 0);
  // Blocks came back: far fewer chunks than blocks handed over.
  CHECK(s.blocks_total < kBlocks / 4);
}

TEST_CASE("pool: a thread's cache is flushed when it exits") {
  FixedPool pool(64, {.blocks_per_chunk = 32, .thread_cache_blocks = 16});
  std::thread t([&] {
    void* p = pool.Allocate();  // refills 16 into this thread's cache
    pool.Deallocate(p);
  });
  t.join();
  // After the exit all 32 blocks of the one chunk are in the pool: this thread can
  // take 32 without a second chunk.
  std::vector<void*> blocks;
  for (int i = 0; i < 32; ++i) blocks.push_back(pool.Allocate());
  CHECK(pool.Stats().chunks == 1);
  for (void* p : blocks) pool.Deallocate(p);
}

TEST_CASE("pool: many threads allocate and free concurrently") {
  FixedPool pool(128);
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      for (int round = 0; round < 50; ++round) {
        for (int i = 0; i < 200; ++i) {
          void* p = pool.Allocate();
          std::memset(p, t + 1, 128);
          mine.push_back(p);
        }
        for (void* p : mine) {
          if (static_cast<unsigned char*>(p)[127] != t + 1) ++corrupt;
          pool.Deallocate(p);
        }
        mine.clear();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(corrupt == 0);
  const auto s = pool.Stats();
  CHECK(s.allocations == 4 * 50 * 200);
  CHECK(s.blocks_in_use == 0);
}

TEST_CASE("pool: destroyed while another thread still caches its blocks") {
  std::atomic<bool> go{false}, done{false};
  auto pool = std::make_unique<FixedPool>(64);
  std::thread other([&] {
    pool->Deallocate(pool->Allocate());  // leaves blocks in this thread's cache
    done = true;
    while (!go.load()) std::this_thread::yield();
    FixedPool next(64);  // a new pool: the dead one's cache is dropped here
    next.Deallocate(next.Allocate());
  });
  while (!done.load()) std::this_thread::yield();
  pool.reset();
  go = true;
  other.join();  // ASan reports it if the dead pool's memory is touched
  SUCCEED("no use after free");
}

TEST_CASE("pool: chunks from a NUMA arena") {
  auto topo = inferq::Topology::Detect();
  REQUIRE(topo.ok());
  auto arena = inferq::NumaArena::Create(*topo, 0, 32 << 20);
  if (arena.status().code() == absl::StatusCode::kUnimplemented) return;  // no mimalloc
  REQUIRE(arena.ok());
  FixedPool pool(256, {.blocks_per_chunk = 128, .arena = arena->get()});
  std::vector<void*> blocks;
  for (int i = 0; i < 300; ++i) {
    void* p = pool.Allocate();
    std::memset(p, 7, 256);
    blocks.push_back(p);
  }
  for (void* p : blocks) pool.Deallocate(p);
  const auto s = pool.Stats();
  CHECK(s.chunks == 3);
  CHECK(s.numa_node == topo->nodes()[0].index);
}

// ---- regressions from a second adversarial run ----

namespace {
// Allocates from `pool` in its destructor, which runs at thread exit after the pool
// and arena machinery's own thread_locals (constructed later) are gone.
struct AllocAtExit {
  FixedPool* pool = nullptr;
  ~AllocAtExit() {
    if (pool != nullptr) pool->Deallocate(pool->Allocate());
  }
};
thread_local AllocAtExit alloc_at_exit;
}  // namespace

TEST_CASE("pool: allocating from a thread_local destructor at thread exit is safe") {
  auto topo = inferq::Topology::Detect();
  REQUIRE(topo.ok());
  auto arena = inferq::NumaArena::Create(*topo, 0, 32 << 20);
  if (arena.status().code() == absl::StatusCode::kUnimplemented) return;  // no mimalloc
  REQUIRE(arena.ok());
  // Tiny chunks, so that the allocation at exit must grow the pool from the arena.
  FixedPool pool(64, {.blocks_per_chunk = 1, .thread_cache_blocks = 1, .arena = arena->get()});
  std::thread t([&] {
    alloc_at_exit.pool = &pool;          // constructed first, destroyed last
    pool.Deallocate(pool.Allocate());    // creates the cache and the arena heap
  });
  t.join();  // was: heap-use-after-free of the thread's arena heaps (ASan)
  CHECK(pool.Stats().allocations == 2);
  CHECK(pool.Stats().blocks_in_use == 0);
}

TEST_CASE("pool: a full arena spills chunks to operator new, counted") {
  auto topo = inferq::Topology::Detect();
  REQUIRE(topo.ok());
  auto arena = inferq::NumaArena::Create(*topo, 0, 32 << 20);
  if (arena.status().code() == absl::StatusCode::kUnimplemented) return;
  REQUIRE(arena.ok());
  // 8 MiB chunks from a 32 MiB arena: the fifth cannot fit.
  FixedPool pool(1 << 20, {.blocks_per_chunk = 8, .thread_cache_blocks = 8, .arena = arena->get()});
  std::vector<void*> blocks;
  for (int i = 0; i < 48; ++i) blocks.push_back(pool.Allocate());
  const auto s = pool.Stats();
  CHECK(s.chunks == 6);
  CHECK(s.chunks_outside_arena >= 2);
  CHECK(s.allocations == 48);  // every one succeeded and was counted once
  for (void* p : blocks) pool.Deallocate(p);
}

TEST_CASE("pool: pools that share a thread's cache slot keep their blocks apart") {
  // 33 pools over 16 cache slots: most slots serve two or three pools, and each
  // round touches every pool, so every slot changes hands all the time.
  constexpr int kPools = 33;
  constexpr int kPerPool = 40;
  std::vector<std::unique_ptr<FixedPool>> pools;
  for (int i = 0; i < kPools; ++i) {
    pools.push_back(std::make_unique<FixedPool>(
        48, FixedPool::Options{.blocks_per_chunk = 64, .thread_cache_blocks = 8}));
  }
  std::map<void*, int> owner;  // every block handed out, and the pool that gave it
  auto round = [&] {
    std::vector<std::vector<void*>> held(kPools);
    for (int k = 0; k < kPerPool; ++k) {
      for (int i = 0; i < kPools; ++i) {
        void* b = pools[static_cast<std::size_t>(i)]->Allocate();
        std::memset(b, i, 48);
        held[static_cast<std::size_t>(i)].push_back(b);
        // A block is only ever handed out by the pool it belongs to.
        const auto [it, fresh] = owner.emplace(b, i);
        if (!fresh) CHECK(it->second == i);
      }
    }
    // Freed from another thread, in reverse pool order: the blocks travel through
    // that thread's caches (other slots' contents) back to their pools.
    std::thread([&] {
      for (int i = kPools; i-- > 0;) {
        for (void* b : held[static_cast<std::size_t>(i)]) {
          CHECK(*static_cast<unsigned char*>(b) == static_cast<unsigned char>(i));
          pools[static_cast<std::size_t>(i)]->Deallocate(b);
        }
      }
    }).join();
  };
  for (int r = 0; r < 3; ++r) round();
  REQUIRE(owner.size() >= static_cast<std::size_t>(kPools * kPerPool));
  for (int i = 0; i < kPools; ++i) {
    const inferq::FixedPoolStats s = pools[static_cast<std::size_t>(i)]->Stats();
    CHECK(s.allocations == 3 * kPerPool);
    CHECK(s.frees == 3 * kPerPool);
    CHECK(s.blocks_in_use == 0);
  }
}
