/// @file inferq/sched/duplicate_window.hpp
///
/// DuplicateWindow: the message ids a stream accepted within its duplicate window,
/// with the stream sequence each was stored under (JetStream's
/// `Nats-Msg-Id` deduplication). A publish whose msg_id is found is acknowledged as
/// a duplicate with the original sequence and not stored again.
///
/// Semantics (as JetStream's): the window is fixed from the first acceptance. An id
/// accepted at t is a duplicate for every publish with now < t + window, and a
/// duplicate does not extend that; from t + window on the id is new again and a
/// publish with it is stored under its new sequence. Ids are compared as exact bytes
/// (case-sensitive, no trimming, any byte allowed, the empty id included: whether a
/// message without an id is deduplicated is the caller's decision). The window's
/// length (the engine's default is 2 minutes) is the caller's.
///
/// Usage:
/// @code
///   inferq::DuplicateWindow dedup(absl::Minutes(2));
///   if (auto seq = dedup.Find(msg_id, now_ns)) return PubAck{*seq, /*duplicate=*/true};
///   const std::uint64_t seq = Store(event);
///   dedup.Insert(std::string(msg_id), seq, now_ns);
///   dedup.Expire(now_ns);                          // now and then, or let Insert do it
/// @endcode
///
/// Cost: Find O(1); Insert O(1) amortised plus the expired entries it removes;
/// Expire O(expired), amortised. Entries sit in acceptance order in a deque that owns
/// the ids, and an absl::flat_hash_map keyed by views of those ids finds them (one
/// copy of each id). A caller that looks an id up and then inserts it hashes it once
/// (Hashed, then Find and Insert of the HashedId); each entry keeps its hash for its
/// removal. Memory: one entry per id accepted within the last window (about
/// sizeof(std::string) + 72 bytes plus the id's bytes beyond the SSO buffer), at most
/// `max_entries` of them: a new id beyond that forgets the oldest before its window
/// ends (counted by evicted()). When expiry leaves the hash table less than a quarter
/// full it is shrunk, so the memory of a burst of ids goes back to the allocator once
/// they expire, not only when the window is destroyed.
///
/// Times are ns of the caller's clock; a now_ns earlier than one already seen is
/// taken as the latest seen.
///
/// Thread safety: none (the engine calls it under the stream's mutex); const methods
/// may run concurrently with each other only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace inferq {

/// The message ids accepted within a duplicate window, with their stream sequences
/// (see the file comment).
class DuplicateWindow {
 public:
  /// InvalidArgument naming the value for a window that is not positive and finite
  /// or does not fit int64 nanoseconds (about 292 years).
  static absl::Status Validate(absl::Duration window) {
    if (window <= absl::ZeroDuration() || window == absl::InfiniteDuration() ||
        window > absl::Nanoseconds(INT64_MAX)) {
      return absl::InvalidArgumentError("duplicate window " + absl::FormatDuration(window) +
                                        " must be > 0 and at most 2^63-1 ns");
    }
    return absl::OkStatus();
  }

  /// Largest max_entries.
  static constexpr std::size_t kMaxEntries = std::size_t{1} << 26;

  /// Throws std::invalid_argument with Validate's message, or naming max_entries
  /// outside 1..kMaxEntries.
  explicit DuplicateWindow(absl::Duration window, std::size_t max_entries = kMaxEntries) {
    if (absl::Status s = Validate(window); !s.ok()) {
      throw std::invalid_argument(std::string(s.message()));
    }
    if (max_entries < 1 || max_entries > kMaxEntries) {
      throw std::invalid_argument("duplicate window max_entries " + std::to_string(max_entries) +
                                  " is outside 1.." + std::to_string(kMaxEntries));
    }
    window_ns_ = absl::ToInt64Nanoseconds(window);
    max_entries_ = max_entries;
  }

  DuplicateWindow(const DuplicateWindow&) = delete;
  DuplicateWindow& operator=(const DuplicateWindow&) = delete;

  /// A message id and its hash, for a caller that looks an id up and then inserts
  /// it: the hash is computed once (Hashed), not per call. The view must stay valid
  /// for the call it is passed to only.
  struct HashedId {
    std::string_view id;   ///< the message id (not owned)
    std::size_t hash = 0;  ///< absl::Hash<std::string_view> of `id`
  };
  /// `msg_id` with its hash (absl::Hash of the bytes).
  static HashedId Hashed(std::string_view msg_id) {
    return {msg_id, absl::Hash<std::string_view>{}(msg_id)};
  }

  /// The sequence msg_id was accepted with, if it was accepted within the window
  /// ending at now_ns; expired entries are not found even before Expire removes them.
  std::optional<std::uint64_t> Find(std::string_view msg_id, std::int64_t now_ns) const {
    return Find(Hashed(msg_id), now_ns);
  }
  /// Find, for an id hashed already (`msg_id.hash` must be Hashed(msg_id.id).hash).
  std::optional<std::uint64_t> Find(const HashedId& msg_id, std::int64_t now_ns) const {
    auto it = ids_.find(msg_id);
    if (it == ids_.end() || std::max(now_ns, now_ns_) >= it->second.expires_ns) {
      return std::nullopt;
    }
    return it->second.seq;
  }

  /// Records msg_id as accepted at now_ns under stream sequence `seq`, after
  /// removing the expired entries (and, at max_entries, the oldest entry). False,
  /// with nothing changed (the window is not extended), when msg_id is already in
  /// the window.
  bool Insert(std::string msg_id, std::uint64_t seq, std::int64_t now_ns) {
    const std::size_t hash = Hashed(msg_id).hash;
    return InsertOwned(std::move(msg_id), hash, seq, now_ns);
  }
  /// Insert, for an id hashed already (as Find's); the window copies its bytes.
  bool Insert(const HashedId& msg_id, std::uint64_t seq, std::int64_t now_ns) {
    return InsertOwned(std::string(msg_id.id), msg_id.hash, seq, now_ns);
  }

  /// Removes every entry whose window ended at or before now_ns; returns how many.
  std::size_t Expire(std::int64_t now_ns) {
    now_ns_ = std::max(now_ns_, now_ns);
    std::size_t removed = 0;
    // Acceptance times never decrease, so the deque is in expiry order.
    while (!order_.empty() && order_.front().expires_ns <= now_ns_) {
      ids_.erase(KeyOf(order_.front()));
      order_.pop_front();
      ++removed;
    }
    // absl::flat_hash_map never shrinks by itself. Shrinking to fit when under a
    // quarter full costs O(size) after at least 3/4 of the capacity was erased:
    // amortised O(1) per removed entry.
    if (removed > 0 && ids_.capacity() > 64 && ids_.size() < ids_.capacity() / 4) {
      ids_.rehash(0);
      if (order_.empty()) order_.shrink_to_fit();
    }
    return removed;
  }

  /// Calls f(msg_id, seq, accepted_ns) for each id still inside its window at
  /// now_ns, in acceptance order (a snapshot to restore with Insert: the engine's
  /// purges file). accepted_ns is the window's start (for a window end that
  /// saturated at INT64_MAX, INT64_MAX - window).
  template <class F>
  void ForEach(std::int64_t now_ns, F&& f) const {
    const std::int64_t now = std::max(now_ns, now_ns_);
    for (const Record& r : order_) {
      if (r.expires_ns <= now) continue;
      f(std::string_view(r.msg_id), r.seq, r.expires_ns - window_ns_);
    }
  }

  /// Calls f(msg_id, seq, accepted_ns) as ForEach does, for the ids accepted under a
  /// sequence in [from_seq, below_seq) only: a file stream saves the ids of the
  /// messages whose log segment it retires. O(log size + ids called for), when the
  /// ids were inserted in ascending sequence order (as a stream inserts them); else
  /// every entry is looked at.
  template <class F>
  void ForEachInRange(std::uint64_t from_seq, std::uint64_t below_seq, std::int64_t now_ns,
                      F&& f) const {
    const std::int64_t now = std::max(now_ns, now_ns_);
    std::size_t lo = 0;
    if (ascending_) {
      std::size_t hi = order_.size();
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (order_[mid].seq < from_seq) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
    }
    for (std::size_t i = lo; i < order_.size(); ++i) {
      const Record& r = order_[i];
      if (r.seq >= below_seq) {
        if (ascending_) break;
        continue;
      }
      if (r.seq < from_seq || r.expires_ns <= now) continue;
      f(std::string_view(r.msg_id), r.seq, r.expires_ns - window_ns_);
    }
  }

  /// Forgets every id accepted under a sequence above `seq` (the engine's recovery,
  /// when the messages of those sequences were lost with a log's tail). O(size).
  void ForgetAbove(std::uint64_t seq) {
    // The values first, while the map's views still point into order_'s ids.
    std::vector<Value> values;
    std::vector<bool> keep;
    values.reserve(order_.size());
    keep.reserve(order_.size());
    for (const Record& r : order_) {
      const Value& v = ids_.at(KeyOf(r));
      keep.push_back(v.seq <= seq);
      if (keep.back()) values.push_back(v);
    }
    ids_.clear();
    std::deque<Record> kept;
    for (std::size_t i = 0; i < order_.size(); ++i) {
      if (keep[i]) kept.push_back(std::move(order_[i]));
    }
    order_ = std::move(kept);
    for (std::size_t i = 0; i < order_.size(); ++i) ids_.emplace(KeyOf(order_[i]), values[i]);
  }

  /// Ids forgotten before their window ended because max_entries was reached.
  std::uint64_t evicted() const { return evicted_; }
  /// The most entries held at once (the constructor's max_entries).
  std::size_t max_entries() const { return max_entries_; }

  /// Entries held, including expired ones not yet removed by Expire or Insert.
  std::size_t size() const { return order_.size(); }
  /// True when size() is 0.
  bool empty() const { return order_.empty(); }
  /// The window's length, ns.
  std::int64_t window_ns() const { return window_ns_; }

 private:
  struct Record {
    std::string msg_id;
    std::uint64_t seq;  ///< as in the map's Value (for ForEachInRange's search)
    std::int64_t expires_ns;
    std::size_t hash;   ///< Hashed(msg_id).hash, for the map
  };
  struct Value {
    std::uint64_t seq;
    std::int64_t expires_ns;  ///< acceptance + window, saturated
  };
  // The map's key is a HashedId whose view points into order_'s id: it hashes as its
  // stored hash and compares by the id's bytes.
  struct KeyHash {
    std::size_t operator()(const HashedId& k) const { return k.hash; }
  };
  struct KeyEq {
    bool operator()(const HashedId& a, const HashedId& b) const { return a.id == b.id; }
  };
  static HashedId KeyOf(const Record& r) { return {std::string_view(r.msg_id), r.hash}; }

  bool InsertOwned(std::string&& msg_id, std::size_t hash, std::uint64_t seq, std::int64_t now_ns) {
    Expire(now_ns);
    if (order_.size() >= max_entries_) {
      // Full: the oldest goes, unless the id is already in (then nothing changes).
      if (ids_.contains(HashedId{msg_id, hash})) return false;
      ids_.erase(KeyOf(order_.front()));
      order_.pop_front();
      ++evicted_;
    }
    const std::int64_t expires =
        now_ns_ > INT64_MAX - window_ns_ ? INT64_MAX : now_ns_ + window_ns_;
    order_.push_back(Record{std::move(msg_id), seq, expires, hash});
    // The view is taken once the id sits in the deque: deque elements never move
    // when the deque grows or shrinks at its ends. One probe both checks and inserts.
    if (!ids_.try_emplace(KeyOf(order_.back()), Value{seq, expires}).second) {
      order_.pop_back();  // in the window already: nothing changes
      return false;
    }
    if (order_.size() > 1 && seq <= order_[order_.size() - 2].seq) ascending_ = false;
    return true;
  }

  std::int64_t window_ns_ = 0;
  std::size_t max_entries_ = kMaxEntries;
  std::uint64_t evicted_ = 0;
  std::int64_t now_ns_ = INT64_MIN;  ///< latest now_ns seen by Insert or Expire
  std::deque<Record> order_;         ///< acceptance order; owns the ids
  bool ascending_ = true;            ///< every Insert's seq above the one before
  absl::flat_hash_map<HashedId, Value, KeyHash, KeyEq> ids_;  ///< views into order_
};

}  // namespace inferq
