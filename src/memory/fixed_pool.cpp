#include "inferq/memory/fixed_pool.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "inferq/memory/numa_arena.hpp"

namespace inferq {
namespace memory_internal {

struct ThreadCache;
struct PoolCore;

// The fast path (pool_fast_path.hpp): this thread's caches by pool slot.
thread_local constinit CacheSlot tls_cache_slots[kCacheSlots] = {};
std::atomic<std::size_t> next_slot{0};  // FixedPool::slot_ of the next pool

struct PoolCore {
  std::size_t slot = 0;  // the FixedPool's slot_
  std::size_t block_size = 0;
  std::size_t per_chunk = 0;
  std::size_t batch = 0;
  NumaArena* arena = nullptr;
  std::atomic<bool> dead{false};  // the FixedPool was destroyed

  std::mutex mu;
  FreeNode* global = nullptr;             // guarded by mu
  std::vector<std::pair<void*, bool>> chunks;  // (chunk, from the arena); guarded by mu
  std::uint64_t chunks_outside_arena = 0;        // guarded by mu
  std::vector<ThreadCache*> caches;       // live thread caches; guarded by mu
  std::uint64_t retired_allocs = 0, retired_frees = 0, retired_hits = 0,
                retired_misses = 0;       // of caches that were flushed; guarded by mu

  ~PoolCore() {
    for (auto [c, from_arena] : chunks) {
      if (from_arena) {
        NumaArena::Free(c);
      } else {
        ::operator delete(c, std::align_val_t{kChunkAlign});
      }
    }
  }

  static constexpr std::size_t kChunkAlign = 64;

  // Carves a chunk into the global list. Requires mu. Throws std::bad_alloc.
  void Grow() {
    const std::size_t bytes = block_size * per_chunk;
    chunks.reserve(chunks.size() + 1);  // may throw before anything changes
    void* mem = arena != nullptr ? arena->Allocate(bytes, kChunkAlign) : nullptr;
    const bool from_arena = mem != nullptr;
    if (!from_arena) {
      // No arena, or its region is used up: the general heap (not bound to the
      // node), counted in chunks_outside_arena. Throws std::bad_alloc.
      mem = ::operator new(bytes, std::align_val_t{kChunkAlign});
      if (arena != nullptr) ++chunks_outside_arena;
    }
    chunks.emplace_back(mem, from_arena);
    auto* base = static_cast<unsigned char*>(mem);
    for (std::size_t i = per_chunk; i-- > 0;) {
      auto* n = reinterpret_cast<FreeNode*>(base + i * block_size);
      n->next = global;
      global = n;
    }
  }
};

// Per thread and pool. Counters are written by the owning thread only (plain
// load + store, no read-modify-write) and read by Stats() under the pool's mutex.
struct ThreadCache : CacheHead {
  std::shared_ptr<PoolCore> core;

  // Moves `n` blocks (or all) to the pool. Requires core->mu.
  void GiveBack(std::size_t n) {
    while (head != nullptr && n-- > 0) {
      FreeNode* next = head->next;
      head->next = core->global;
      core->global = head;
      head = next;
      --count;
    }
  }

  // Flushes everything and unregisters. Takes core->mu.
  void Retire() {
    std::lock_guard lock(core->mu);
    GiveBack(count);
    core->retired_allocs += hits.load(std::memory_order_relaxed) +
                            misses.load(std::memory_order_relaxed);
    core->retired_frees += frees.load(std::memory_order_relaxed);
    core->retired_hits += hits.load(std::memory_order_relaxed);
    core->retired_misses += misses.load(std::memory_order_relaxed);
    std::erase(core->caches, this);
  }
};

// All caches of one thread. Destroyed at thread exit: flushes them (the "per-thread
// cache flush at thread exit").
struct ThreadCaches {
  std::vector<std::unique_ptr<ThreadCache>> caches;
  PoolCore* last_core = nullptr;
  ThreadCache* last = nullptr;

  ~ThreadCaches();

  ThreadCache* Find(PoolCore* core);

  ThreadCache* Create(const std::shared_ptr<PoolCore>& core) {
    // Drop the caches of pools destroyed since: their memory goes with them.
    for (auto it = caches.begin(); it != caches.end();) {
      if ((*it)->core->dead.load(std::memory_order_acquire)) {
        (*it)->Retire();
        if (last == it->get()) last_core = nullptr, last = nullptr;
        Forget(it->get());
        it = caches.erase(it);
      } else {
        ++it;
      }
    }
    auto cache = std::make_unique<ThreadCache>();
    cache->core = core;
    cache->limit = 2 * core->batch;
    {
      std::lock_guard lock(core->mu);
      core->caches.push_back(cache.get());
    }
    caches.push_back(std::move(cache));
    last_core = core.get();
    last = caches.back().get();
    Remember(last_core, last);
    return last;
  }
  static void Remember(PoolCore* core, ThreadCache* cache);
  static void Forget(ThreadCache* cache);
};

// Trivially destructible, so still readable while (and after) other thread_local
// objects are destroyed: a free during that time goes straight to the pool.
thread_local bool tls_caches_gone = false;
thread_local ThreadCaches tls_caches;

void ThreadCaches::Remember(PoolCore* core, ThreadCache* cache) {
  tls_cache_slots[core->slot] = {core, cache};
}

void ThreadCaches::Forget(ThreadCache* cache) {
  CacheSlot& s = tls_cache_slots[cache->core->slot];
  if (s.cache == cache) s = {};
}

ThreadCache* ThreadCaches::Find(PoolCore* core) {
  if (core == last_core) {
    Remember(core, last);
    return last;
  }
  for (auto& c : caches) {
    if (c->core.get() == core) {
      last_core = core;
      last = c.get();
      Remember(core, last);
      return last;
    }
  }
  return nullptr;
}

// The calling thread's cache for `core`, creating it; nullptr while the thread exits.
ThreadCache* CacheFor(const std::shared_ptr<PoolCore>& core) {
  if (const CacheSlot& s = tls_cache_slots[core->slot]; s.core == core.get()) {
    return static_cast<ThreadCache*>(s.cache);
  }
  if (tls_caches_gone) return nullptr;
  ThreadCache* c = tls_caches.Find(core.get());
  return c != nullptr ? c : tls_caches.Create(core);
}

ThreadCaches::~ThreadCaches() {
  tls_caches_gone = true;
  for (CacheSlot& s : tls_cache_slots) s = {};
  for (auto& c : caches) c->Retire();
  caches.clear();
}

}  // namespace memory_internal

using memory_internal::FreeNode;
using memory_internal::PoolCore;
using memory_internal::ThreadCache;

FixedPool::FixedPool(std::size_t block_size) : FixedPool(block_size, Options{}) {}

FixedPool::FixedPool(std::size_t block_size, Options options) {
  if (block_size == 0 || block_size > (std::size_t{1} << 20)) {
    throw std::invalid_argument("FixedPool block_size " + std::to_string(block_size) +
                                " is outside 1..1048576");
  }
  if (options.blocks_per_chunk == 0 || options.thread_cache_blocks == 0) {
    throw std::invalid_argument("FixedPool blocks_per_chunk " +
                                std::to_string(options.blocks_per_chunk) +
                                " and thread_cache_blocks " +
                                std::to_string(options.thread_cache_blocks) +
                                " must both be > 0");
  }
  core_ = std::make_shared<PoolCore>();
  core_->block_size = (block_size + 15) & ~std::size_t{15};
  core_->per_chunk = options.blocks_per_chunk;
  core_->batch = options.thread_cache_blocks;
  core_->arena = options.arena;
  core_raw_ = core_.get();
  // relaxed: the number only spreads pools over the slots; it orders nothing.
  slot_ = memory_internal::next_slot.fetch_add(1, std::memory_order_relaxed) % memory_internal::kCacheSlots;
  core_->slot = slot_;
}

FixedPool::~FixedPool() {
  core_->dead.store(true, std::memory_order_release);
  // Flush this thread's cache now; other threads flush at exit or when they next
  // create a cache.
  if (!memory_internal::tls_caches_gone) {
    auto& tls = memory_internal::tls_caches;
    if (ThreadCache* c = tls.Find(core_.get())) {
      c->Retire();
      memory_internal::ThreadCaches::Forget(c);
      std::erase_if(tls.caches, [&](const auto& p) { return p.get() == c; });
      tls.last_core = nullptr;
      tls.last = nullptr;
    }
  }
}

void* FixedPool::AllocateSlow() {
  PoolCore* core = core_.get();
  ThreadCache* c = memory_internal::CacheFor(core_);
  if (c == nullptr) {  // thread is exiting: no cache
    std::lock_guard lock(core->mu);
    if (core->global == nullptr) core->Grow();  // throws before anything is counted
    FreeNode* n = core->global;
    core->global = n->next;
    ++core->retired_allocs;
    ++core->retired_misses;
    return n;
  }
  if (c->head == nullptr) {
    std::lock_guard lock(core->mu);
    for (std::size_t i = 0; i < core->batch; ++i) {
      if (core->global == nullptr) {
        try {
          core->Grow();
        } catch (const std::bad_alloc&) {
          if (c->head == nullptr) throw;  // nothing at all: counted as no allocation
          break;                          // a partial batch will do
        }
      }
      FreeNode* n = core->global;
      core->global = n->next;
      n->next = c->head;
      c->head = n;
      ++c->count;
    }
    memory_internal::CacheHead::Bump(c->misses);
  } else {
    memory_internal::CacheHead::Bump(c->hits);
  }
  FreeNode* n = c->head;
  c->head = n->next;
  --c->count;
  return n;
}

void FixedPool::DeallocateSlow(void* block) noexcept {
  if (block == nullptr) return;
  PoolCore* core = core_.get();
  auto* n = static_cast<FreeNode*>(block);
  ThreadCache* c = nullptr;
  try {
    c = memory_internal::CacheFor(core_);
  } catch (...) {  // no memory for a cache: c stays nullptr
  }
  if (c == nullptr) {  // thread exiting, or no cache: straight to the pool
    std::lock_guard lock(core->mu);
    n->next = core->global;
    core->global = n;
    ++core->retired_frees;
    return;
  }
  memory_internal::CacheHead::Bump(c->frees);
  n->next = c->head;
  c->head = n;
  if (++c->count > 2 * core->batch) {
    std::lock_guard lock(core->mu);
    c->GiveBack(core->batch);
  }
}

std::size_t FixedPool::block_size() const { return core_->block_size; }

namespace memory_internal {

FixedPool* BufferPoolFor(std::size_t bytes) {
  // Never destroyed: Buffers may outlive every other static object.
  static FixedPool* const pools[] = {new FixedPool(64), new FixedPool(256),
                                     new FixedPool(1024, {.blocks_per_chunk = 256}),
                                     new FixedPool(4096, {.blocks_per_chunk = 64})};
  for (FixedPool* p : pools) {
    if (bytes <= p->block_size()) return p;
  }
  return nullptr;
}
void* PoolAllocate(FixedPool* pool) { return pool->Allocate(); }
void PoolDeallocate(FixedPool* pool, void* p) noexcept { pool->Deallocate(p); }

}  // namespace memory_internal

FixedPoolStats FixedPool::Stats() const {
  FixedPoolStats s;
  std::lock_guard lock(core_->mu);
  s.block_size = core_->block_size;
  s.chunks = core_->chunks.size();
  s.blocks_total = s.chunks * core_->per_chunk;
  s.bytes_reserved = s.blocks_total * core_->block_size;
  s.allocations = core_->retired_allocs;
  s.frees = core_->retired_frees;
  s.cache_hits = core_->retired_hits;
  s.cache_misses = core_->retired_misses;
  for (const ThreadCache* c : core_->caches) {
    s.allocations += c->hits.load(std::memory_order_relaxed) +
                     c->misses.load(std::memory_order_relaxed);
    s.frees += c->frees.load(std::memory_order_relaxed);
    s.cache_hits += c->hits.load(std::memory_order_relaxed);
    s.cache_misses += c->misses.load(std::memory_order_relaxed);
  }
  s.blocks_in_use = s.allocations >= s.frees ? s.allocations - s.frees : 0;
  s.numa_node = core_->arena != nullptr ? core_->arena->node() : -1;
  s.chunks_outside_arena = core_->chunks_outside_arena;
  return s;
}

}  // namespace inferq
