/// @file inferq/routing/internal/match_cache.hpp  (not API: used by subject_index.hpp)
///
/// MatchCache<V>: the bounded cache of SubjectIndex<V>::Match results, keyed by the
/// subject. Set-associative: 2^k sets of up to kWays (8) ways; the low bits of the
/// subject's 64-bit hash pick the set, the whole hash (the way's tag, eight tags to a
/// cache line) and then the subject text pick the way. Eight ways rather than four:
/// 1024 hot subjects in a 4096-entry cache of 4-way sets missed 3% of the time, as a
/// few sets got more than four of them (bench_routing, BM_Match/.../hit). Each set has
/// its own std::shared_mutex (a lock TSan sees, unlike the uninstrumented absl::Mutex
/// of Debian's Abseil) and starts on its own cache line, so threads matching
/// different subjects rarely touch the same lock.
///
/// Invariants:
///  1. A way holds a result of generation g when its `generation` is g. Generation 0
///     marks a way never filled (an index's generations start at 1). A lookup with
///     generation g ignores ways of any other generation, so bumping the generation
///     invalidates every entry at once, and stale ways are the first to be refilled.
///  2. A way's tag, `generation`, `subject` and `values` change only under the set's
///     exclusive lock; lookups read them under the shared lock. A fill clears
///     `generation` first and sets it last, so a fill interrupted by an exception
///     (bad_alloc) leaves a way no lookup accepts.
///  3. `referenced` is the CLOCK bit (second chance): a hit sets it under the shared
///     lock, where other readers may set it too, hence an atomic; relaxed is enough,
///     the bit is a hint that orders nothing. A fill with no stale way sweeps the
///     set's hand, clearing set bits, and evicts the first way found clear.
///  4. A fill reuses the way's string and vector capacity: once the ways have grown,
///     a miss that replaces an entry allocates nothing.
///  5. An entry holds at most `max_values` values and a subject of at most
///     `max_subject_bytes` bytes (larger results are not cached), so the cache's heap
///     is bounded by capacity × (max_subject_bytes + max_values × sizeof(V)).
///
/// Thread safety: Lookup, Store and the statistics may run on any number of threads.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "inferq/base/cache_line.hpp"

namespace inferq::routing_internal {

template <class V>
class MatchCache {
 public:
  static constexpr std::size_t kWays = 8;

  /// Holds at most `max_entries` (> 0) subjects: the largest count of the form
  /// 2^k × min(kWays, max_entries) not above it.
  MatchCache(std::size_t max_entries, std::size_t max_values, std::size_t max_subject_bytes)
      : ways_(max_entries < kWays ? max_entries : kWays),
        sets_count_(std::bit_floor(max_entries / ways_)),
        mask_(sets_count_ - 1),
        max_values_(max_values),
        max_subject_bytes_(max_subject_bytes),
        sets_(std::make_unique<Set[]>(sets_count_)) {}

  std::size_t capacity() const { return sets_count_ * ways_; }

  /// On a hit for (subject, generation): appends the cached values to *out, sets *n to
  /// their count and returns true. Allocates only when *out must grow.
  template <class Out>
  bool Lookup(std::string_view subject, std::uint64_t hash, std::uint64_t generation,
              Out* out, std::size_t* n) {
    Set& set = sets_[hash & mask_];
    std::shared_lock lock(set.mu);
    for (std::size_t i = 0; i < ways_; ++i) {
      if (set.tags[i] != hash) continue;
      Way& w = set.ways[i];
      if (w.generation == generation && w.subject == subject) {
        out->insert(out->end(), w.values.begin(), w.values.end());
        if (!w.referenced.load(std::memory_order_relaxed)) {
          w.referenced.store(true, std::memory_order_relaxed);
        }
        set.hits.fetch_add(1, std::memory_order_relaxed);
        *n = w.values.size();
        return true;
      }
    }
    set.misses.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  /// Caches values[0, n) as the result for (subject, generation), unless it is too
  /// large (invariant 5) or another thread cached it first.
  void Store(std::string_view subject, std::uint64_t hash, std::uint64_t generation,
             const V* values, std::size_t n) {
    if (n > max_values_ || subject.size() > max_subject_bytes_) return;
    Set& set = sets_[hash & mask_];
    std::unique_lock lock(set.mu);
    std::size_t victim = kWays;
    for (std::size_t i = 0; i < ways_; ++i) {
      const Way& w = set.ways[i];
      if (w.generation == generation) {
        if (set.tags[i] == hash && w.subject == subject) return;
      } else if (victim == kWays) {
        victim = i;
      }
    }
    while (victim == kWays) {  // ends within two sweeps: each step clears a bit
      const std::size_t i = set.hand;
      set.hand = set.hand + 1 == ways_ ? 0 : set.hand + 1;
      if (!set.ways[i].referenced.exchange(false, std::memory_order_relaxed)) victim = i;
    }
    Way& w = set.ways[victim];
    w.generation = 0;
    w.subject.assign(subject);
    w.values.assign(values, values + n);
    w.referenced.store(false, std::memory_order_relaxed);
    set.tags[victim] = hash;
    w.generation = generation;
  }

  std::uint64_t hits() const { return Sum(&Set::hits); }
  std::uint64_t misses() const { return Sum(&Set::misses); }

  /// Ways holding a result of `generation`.
  std::size_t Entries(std::uint64_t generation) const {
    std::size_t n = 0;
    for (std::size_t s = 0; s < sets_count_; ++s) {
      std::shared_lock lock(sets_[s].mu);
      for (std::size_t i = 0; i < ways_; ++i) n += sets_[s].ways[i].generation == generation;
    }
    return n;
  }

  /// Heap bytes: the sets, plus the subjects beyond the small-string buffer and the
  /// value vectors at their capacity.
  std::size_t MemoryBytes() const {
    const std::size_t small_string = std::string().capacity();
    std::size_t bytes = sets_count_ * sizeof(Set);
    for (std::size_t s = 0; s < sets_count_; ++s) {
      std::shared_lock lock(sets_[s].mu);
      for (std::size_t i = 0; i < ways_; ++i) {
        const Way& w = sets_[s].ways[i];
        if (w.subject.capacity() > small_string) bytes += w.subject.capacity() + 1;
        bytes += w.values.capacity() * sizeof(V);
      }
    }
    return bytes;
  }

 private:
  struct Way {
    std::uint64_t generation = 0;  ///< 0: never filled
    std::atomic<bool> referenced{false};
    std::string subject;
    std::vector<V> values;
  };
  struct alignas(kCacheLineSize) Set {
    mutable std::shared_mutex mu;  // written by every lookup: a line of its own
    std::size_t hand = 0;          // CLOCK hand, under the exclusive lock
    std::atomic<std::uint64_t> hits{0};
    std::atomic<std::uint64_t> misses{0};
    alignas(kCacheLineSize) std::uint64_t tags[kWays] = {};  // hash of each way's subject
    Way ways[kWays];
  };
  static_assert(sizeof(std::uint64_t) * kWays == kCacheLineSize, "the tags fill one line");

  std::uint64_t Sum(std::atomic<std::uint64_t> Set::*counter) const {
    std::uint64_t n = 0;
    for (std::size_t s = 0; s < sets_count_; ++s) {
      n += (sets_[s].*counter).load(std::memory_order_relaxed);
    }
    return n;
  }

  const std::size_t ways_;
  const std::size_t sets_count_;
  const std::size_t mask_;
  const std::size_t max_values_;
  const std::size_t max_subject_bytes_;
  std::unique_ptr<Set[]> sets_;
};

}  // namespace inferq::routing_internal
