/// @file inferq/routing/subject_index.hpp
///
/// SubjectIndex<V>: subscriptions (subject pattern, value) and the question "which
/// values have a pattern matching this subject", for 10^6
/// subscriptions and more. Patterns and subjects follow the NATS grammar of
/// inferq/routing/subject.hpp.
///
/// Usage:
/// @code
///   inferq::SubjectIndex<Consumer*> index;               // default: 4096 cached subjects
///   absl::Status s = index.Insert("infer.*.request", &c1);   // InvalidArgument, AlreadyExists
///   s = index.Insert("infer.>", &c2);
///   std::vector<Consumer*> out;
///   index.Match("infer.llama.request", &out);            // out = {&c1, &c2}
///   s = index.Remove("infer.>", &c2);                    // NotFound when absent
/// @endcode
///
/// How it works: a trie of tokens with separate `*` and `>` edges
/// (internal/subject_trie.hpp: every node in one open-addressing table keyed by
/// (parent, interned token) with its data inline, so a level of a match is one probe;
/// `>` patterns are kept on the node before the `>`), and a bounded cache of match
/// results keyed by the subject (internal/match_cache.hpp: set-associative, a lock per
/// set, CLOCK eviction). Every successful Insert and Remove bumps a generation
/// counter; cached results of an older generation are never returned.
///
/// Costs (benchmarks/bench_routing.cpp): a cache hit is a hash of the subject, a shared
/// lock and a copy of the values; a miss is one table probe per token and frontier
/// node, and is bound by memory latency when the subjects touch a trie larger than the
/// CPU caches. About 150 bytes per subscription at 10^6 subscriptions, values included.
///
/// Thread safety: any number of threads may call the const methods (Match, size,
/// Stats, generation) at once; the cache is internally synchronized for that.
/// Insert and Remove need exclusive access: no other call on the same index may run
/// during them. An engine that changes subscriptions while matching builds a new
/// index and swaps it in (e.g. behind a std::atomic<std::shared_ptr>).
///
/// Requirements on V: small, copyable, equality-comparable and hashable with
/// absl::Hash (pointers, integers, enums).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "inferq/base/error.hpp"
#include "inferq/routing/internal/match_cache.hpp"
#include "inferq/routing/internal/subject_trie.hpp"
#include "inferq/routing/subject.hpp"

namespace inferq {

/// The match cache of a SubjectIndex.
struct SubjectIndexOptions {
  /// Bound on cached subjects; 0 = no cache (for high-churn subject spaces, where
  /// nearly every subject is new). The cache holds the largest count of the form
  /// 2^k × min(8, cache_entries) not above it (4096 -> 4096, 5000 -> 4096, 5 -> 5).
  /// The empty cache takes about 100 bytes per entry (its sets, see
  /// internal/match_cache.hpp), filled entries also their subject and values.
  /// At most 2^20; the constructor throws std::invalid_argument above that.
  std::size_t cache_entries = 4096;
  /// Results with more values than this are not cached (they are long to copy anyway,
  /// and this bounds the cache's heap, see internal/match_cache.hpp).
  std::size_t cache_max_values = 256;
  /// Subjects longer than this (bytes) are not cached.
  std::size_t cache_max_subject_bytes = 256;
};

/// A SubjectIndex's counters and sizes (SubjectIndex::Stats).
struct SubjectIndexStats {
  std::uint64_t subscriptions = 0;  ///< (pattern, value) pairs: size()
  std::uint64_t nodes = 0;          ///< trie nodes, the root included
  /// Estimate of the heap the index holds, in bytes: trie nodes, edge and token hash
  /// tables and value maps at their capacity, value lists, and the cache (its sets,
  /// cached subjects and results). malloc's per-block overhead is not counted.
  std::uint64_t memory_bytes = 0;
  std::uint64_t cache_hits = 0;     ///< Match calls answered from the cache
  std::uint64_t cache_misses = 0;   ///< Match calls that walked the trie (0 with no cache)
  std::uint64_t cache_entries = 0;  ///< cached subjects valid for the current generation
  std::uint64_t generation = 0;     ///< starts at 1; +1 per successful Insert or Remove
  // Extras.
  std::uint64_t values = 0;          ///< distinct values
  std::uint64_t cache_capacity = 0;  ///< subjects the cache can hold (0: no cache)
};

namespace routing_internal {
/// The value in an error message: integers, enums and pointers are printed, anything
/// else is "this value".
template <class V>
std::string DescribeValue(const V& v) {
  if constexpr (std::is_same_v<V, bool>) {
    return v ? "value true" : "value false";
  } else if constexpr (std::is_integral_v<V>) {
    return "value " + std::to_string(v);
  } else if constexpr (std::is_enum_v<V>) {
    return "value " + std::to_string(static_cast<std::underlying_type_t<V>>(v));
  } else if constexpr (std::is_pointer_v<V>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(v)));
    return std::string("value ") + buf;
  } else if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    return "value " + QuoteValue(std::string_view(v));
  } else {
    return "this value";
  }
}
}  // namespace routing_internal

/// Subscriptions (subject pattern, value) and the values whose patterns match a
/// subject (see the file comment).
template <class V>
class SubjectIndex {
 public:
  /// Throws std::invalid_argument when options.cache_entries is above 2^20.
  explicit SubjectIndex(SubjectIndexOptions options = {}) : options_(options) {
    if (options.cache_entries > (std::size_t{1} << 20)) {
      throw std::invalid_argument("SubjectIndex cache_entries must be at most 2^20, got " +
                                  std::to_string(options.cache_entries));
    }
    if (options.cache_entries > 0) {
      cache_ = std::make_unique<routing_internal::MatchCache<V>>(
          options.cache_entries, options.cache_max_values, options.cache_max_subject_bytes);
    }
  }

  /// Movable (e.g. into a std::shared_ptr to swap it in); a moved-from index may only
  /// be destroyed or assigned to.
  ///@{
  SubjectIndex(SubjectIndex&&) = default;
  SubjectIndex& operator=(SubjectIndex&&) = default;
  ///@}

  /// Subscribes `value` to `pattern`. Errors: InvalidArgument with
  /// SubjectPattern::Parse's message (naming the pattern and the token position) for
  /// a bad pattern; AlreadyExists when this exact (pattern, value) pair is present
  /// ("subject pattern 'a.*' already has value 7"); ResourceExhausted past 2^31 - 1
  /// distinct values or 2^32 - 1 trie nodes. On success bumps the generation, which
  /// invalidates every cached result. Needs exclusive access.
  absl::Status Insert(std::string_view pattern, V value) {
    if (absl::StatusOr<SubjectPattern> p = SubjectPattern::Parse(pattern); !p.ok()) {
      return p.status();
    }
    auto [it, is_new] = values_.try_emplace(value, ValueEntry{});
    if (is_new) {
      const std::uint32_t slot = trie_.AcquireSlot();
      if (slot == routing_internal::SubjectTrie::kNone) {
        values_.erase(it);
        return absl::ResourceExhaustedError(
            "subject index holds 2^31 - 1 distinct values; cannot add " +
            routing_internal::DescribeValue(value));
      }
      if (slot == slot_values_.size()) {
        slot_values_.push_back(value);
      } else {
        slot_values_[slot] = value;
      }
      it->second.slot = slot;
    }
    switch (trie_.Add(pattern, it->second.slot)) {
      case routing_internal::SubjectTrie::AddResult::kAdded:
        break;
      case routing_internal::SubjectTrie::AddResult::kAlreadyPresent:
        return absl::AlreadyExistsError("subject pattern " + QuoteValue(pattern) +
                                        " already has " +
                                        routing_internal::DescribeValue(value));
      case routing_internal::SubjectTrie::AddResult::kFull:
        if (is_new) {
          trie_.ReleaseSlot(it->second.slot);
          values_.erase(it);
        }
        return absl::ResourceExhaustedError("subject index is full; cannot add pattern " +
                                            QuoteValue(pattern));
    }
    ++it->second.patterns;
    ++size_;
    ++generation_;
    return absl::OkStatus();
  }

  /// Unsubscribes `value` from `pattern`. Errors: InvalidArgument (Parse's message)
  /// for a bad pattern; NotFound when the (pattern, value) pair is absent
  /// ("subject pattern 'a.*' has no value 7"). On success bumps the generation. A
  /// value removed from all its patterns and inserted again counts as new for the
  /// order of Match. Needs exclusive access.
  absl::Status Remove(std::string_view pattern, V value) {
    if (absl::StatusOr<SubjectPattern> p = SubjectPattern::Parse(pattern); !p.ok()) {
      return p.status();
    }
    const auto it = values_.find(value);
    if (it == values_.end() || !trie_.Erase(pattern, it->second.slot)) {
      return absl::NotFoundError("subject pattern " + QuoteValue(pattern) + " has no " +
                                 routing_internal::DescribeValue(value));
    }
    if (--it->second.patterns == 0) {
      trie_.ReleaseSlot(it->second.slot);
      values_.erase(it);
    }
    --size_;
    ++generation_;
    return absl::OkStatus();
  }

  /// Appends to *out every value with at least one pattern matching the literal
  /// subject `subject`, each value once even if several of its patterns match, in the
  /// order the values were first inserted (a value's place is set when it goes from
  /// no pattern to one). Returns the number appended. An invalid subject (empty, an
  /// empty token, white space, a `*` or `>` token) matches nothing: returns 0.
  /// A cache hit makes no allocation when *out has the capacity; a miss may allocate
  /// (more than 16 tokens or candidates, and filling the cache the first times).
  std::size_t Match(std::string_view subject, std::vector<V>* out) const {
    return MatchInto(subject, out);
  }
  /// As Match into a std::vector.
  template <std::size_t N>
  std::size_t Match(std::string_view subject, absl::InlinedVector<V, N>* out) const {
    return MatchInto(subject, out);
  }

  /// (pattern, value) pairs.
  std::size_t size() const { return size_; }

  /// Starts at 1; +1 per successful Insert or Remove.
  std::uint64_t generation() const { return generation_; }

  /// Counters and sizes (see SubjectIndexStats). Walks the cache's sets: O(cache
  /// capacity + tokens + value lists); for monitoring, not for every message.
  SubjectIndexStats Stats() const {
    SubjectIndexStats s;
    s.subscriptions = size_;
    s.nodes = trie_.node_count();
    s.values = values_.size();
    s.generation = generation_;
    s.memory_bytes = trie_.MemoryBytes() + routing_internal::HashTableBytes(values_) +
                     slot_values_.capacity() * sizeof(V);
    if (cache_) {
      s.memory_bytes += cache_->MemoryBytes();
      s.cache_hits = cache_->hits();
      s.cache_misses = cache_->misses();
      s.cache_entries = cache_->Entries(generation_);
      s.cache_capacity = cache_->capacity();
    }
    return s;
  }

  /// The match cache's counters of Stats() (cache_hits, cache_misses) without its walk
  /// of the ways: O(cache capacity / 8), no lock. 0 with no cache.
  ///@{
  std::uint64_t cache_hits() const { return cache_ ? cache_->hits() : 0; }
  std::uint64_t cache_misses() const { return cache_ ? cache_->misses() : 0; }
  ///@}

  /// The options the index was made with.
  const SubjectIndexOptions& options() const { return options_; }

 private:
  struct ValueEntry {
    std::uint32_t slot = 0;
    std::uint32_t patterns = 0;  ///< patterns this value is subscribed to
  };

  template <class Out>
  std::size_t MatchInto(std::string_view subject, Out* out) const {
    std::uint64_t hash = 0;
    if (cache_) {
      // Debian's Abseil has its own absl::string_view, the type its hash takes.
      hash = absl::Hash<absl::string_view>{}(absl::string_view(subject.data(), subject.size()));
      std::size_t n = 0;
      if (cache_->Lookup(subject, hash, generation_, out, &n)) return n;
    }
    routing_internal::SlotBuffer slots;
    if (!trie_.Collect(subject, &slots)) return 0;
    const std::size_t before = out->size();
    for (const std::uint32_t s : slots) out->push_back(slot_values_[s]);
    if (cache_) cache_->Store(subject, hash, generation_, out->data() + before, slots.size());
    return slots.size();
  }

  SubjectIndexOptions options_;
  routing_internal::SubjectTrie trie_;
  absl::flat_hash_map<V, ValueEntry> values_;
  std::vector<V> slot_values_;  ///< by slot
  std::size_t size_ = 0;
  std::uint64_t generation_ = 1;
  std::unique_ptr<routing_internal::MatchCache<V>> cache_;  ///< null: no cache
};

}  // namespace inferq
