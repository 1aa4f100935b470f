/// @file inferq/base/histogram.hpp
///
/// Log-linear histograms of non-negative integers (latencies in ns or µs, sizes in
/// bytes). Values below 64 are kept exactly; above, each power of two is split into
/// 32 linear sub-buckets, so a reported percentile is at most 1/32 (3.1 %) above the
/// true value — the bucketing of HdrHistogram (Gil Tene) with 5 significant bits.
/// 1,920 buckets cover the whole uint64 range.
///
/// Usage:
/// @code
///   inferq::Histogram h;                       // concurrent recorder
///   h.Record(1'250);                           // e.g. ns
///   inferq::HistogramSnapshot s = h.Snapshot();
///   std::uint64_t p99 = s.Percentile(0.99);
/// @endcode
///
/// Thread safety: Histogram::Record and Histogram::Snapshot may run on any threads at
/// once (relaxed atomic counters; a snapshot taken during recording may miss the
/// records in flight, never tears a counter). HistogramSnapshot is a plain value.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace inferq {

namespace histogram_internal {
inline constexpr std::size_t kExactBelow = 64;  ///< values 0..63 get a bucket each
inline constexpr unsigned kSubBits = 5;         ///< 32 sub-buckets per power of two
inline constexpr std::size_t kBuckets = kExactBelow + (64 - 6) * (1u << kSubBits);

constexpr std::size_t BucketOf(std::uint64_t v) {
  if (v < kExactBelow) return static_cast<std::size_t>(v);
  const unsigned msb = static_cast<unsigned>(std::bit_width(v)) - 1;  // >= 6
  const unsigned shift = msb - kSubBits;
  return kExactBelow + (msb - 6) * (1u << kSubBits) +
         static_cast<std::size_t>((v >> shift) & ((1u << kSubBits) - 1));
}

/// Largest value that falls into bucket `b`.
constexpr std::uint64_t BucketUpper(std::size_t b) {
  if (b < kExactBelow) return b;
  const std::size_t k = b - kExactBelow;
  const unsigned msb = 6 + static_cast<unsigned>(k >> kSubBits);
  const std::uint64_t sub = k & ((1u << kSubBits) - 1);
  const unsigned shift = msb - kSubBits;
  const std::uint64_t lower = ((std::uint64_t{1} << kSubBits) + sub) << shift;
  return lower + ((std::uint64_t{1} << shift) - 1);
}

static_assert(BucketOf(63) == 63 && BucketOf(64) == 64 && BucketUpper(64) == 65);
static_assert(BucketOf(std::numeric_limits<std::uint64_t>::max()) == kBuckets - 1);
static_assert(BucketUpper(kBuckets - 1) == std::numeric_limits<std::uint64_t>::max());
}  // namespace histogram_internal

/// A point-in-time copy of a Histogram; also usable on its own as a single-threaded
/// histogram.
class HistogramSnapshot {
 public:
  HistogramSnapshot() : counts_(histogram_internal::kBuckets, 0) {}

  /// Records the value `v` `times` times (nothing for 0).
  void Record(std::uint64_t v, std::uint64_t times = 1) {
    if (times == 0) return;
    counts_[histogram_internal::BucketOf(v)] += times;
    count_ += times;
    sum_ += v * times;
    min_ = std::min(min_, v);
    max_ = std::max(max_, v);
  }

  /// Adds every record of `other` to this snapshot.
  void Merge(const HistogramSnapshot& other) {
    for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += other.counts_[i];
    count_ += other.count_;
    sum_ += other.sum_;
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
  }

  /// Nearest-rank percentile for q in [0, 1]: the smallest recorded bucket whose
  /// cumulative count reaches ceil(q * count), reported as the bucket's upper bound
  /// clamped to [min(), max()], so Percentile(1.0) == max(): the exact largest value
  /// when every record came through this snapshot's Record (or Merge of such), but
  /// for a Histogram::Snapshot (and what merged one) max() is widened to the upper
  /// bound of the largest value's bucket, up to 3.1 % above that value. 0 when empty.
  std::uint64_t Percentile(double q) const {
    if (count_ == 0) return 0;
    q = std::clamp(q, 0.0, 1.0);
    auto rank = static_cast<std::uint64_t>(q * static_cast<double>(count_));
    if (static_cast<double>(rank) < q * static_cast<double>(count_)) ++rank;  // ceil
    rank = std::max<std::uint64_t>(rank, 1);
    std::uint64_t seen = 0;
    for (std::size_t b = 0; b < counts_.size(); ++b) {
      seen += counts_[b];
      if (seen >= rank) {
        return std::clamp(histogram_internal::BucketUpper(b), min_, max_);
      }
    }
    return max_;
  }

  /// Records in the buckets whose largest value is at most `v`: exactly the records
  /// <= v when v is a bucket's upper bound (every v below 64 is; above, one in each
  /// run of 2^(msb-5) values). Otherwise the bucket that straddles v is left out, and
  /// with it records up to 1/32 (3.1 %) of v below v: the count is a lower bound.
  /// Prometheus histogram buckets ("le") are read off with it.
  std::uint64_t CountAtMost(std::uint64_t v) const {
    std::uint64_t n = 0;
    for (std::size_t b = 0; b < counts_.size() && histogram_internal::BucketUpper(b) <= v; ++b) {
      n += counts_[b];
    }
    return n;
  }
  /// Number of values recorded.
  std::uint64_t count() const { return count_; }
  /// Sum of the values recorded (modulo 2^64).
  std::uint64_t sum() const { return sum_; }
  /// Smallest value recorded; 0 when empty. Histogram::Snapshot widens it to the
  /// lower bound of the smallest value's bucket (up to 3.1 % below the value).
  std::uint64_t min() const { return count_ == 0 ? 0 : min_; }
  /// Largest value recorded; 0 when empty. Histogram::Snapshot widens it to the
  /// upper bound of the largest value's bucket (up to 3.1 % above the value).
  std::uint64_t max() const { return max_; }
  /// sum() / count(); 0 when empty.
  double mean() const {
    return count_ == 0 ? 0.0 : static_cast<double>(sum_) / static_cast<double>(count_);
  }

 private:
  friend class Histogram;
  std::vector<std::uint64_t> counts_;
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  std::uint64_t min_ = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t max_ = 0;
};

/// Concurrent recorder. 15 KiB of counters; give each writer thread its own when
/// writers are many, and merge snapshots.
class Histogram {
 public:
  Histogram() = default;
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  /// Records the value `v`: two relaxed atomic adds (its bucket and the sum), never a
  /// lock. The number of values is the buckets' total (count()), not a third counter:
  /// Record runs on every delivery and ack of the engine, count() on a snapshot.
  void Record(std::uint64_t v) {
    // relaxed: counters are statistics; no other memory is published through them.
    counts_[histogram_internal::BucketOf(v)].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
    Widen(v, v);
  }

  /// Record for a histogram that has one writer thread: every Record, RecordMany
  /// and RecordSingleWriter of it comes from that thread (Snapshot and count() from
  /// any). Relaxed loads and stores instead of atomic adds, so no locked
  /// instruction; a read-modify-write of another thread racing it could be lost,
  /// which the precondition rules out. For a per-thread part of a statistic that
  /// many threads may write (the engine's member histograms).
  [[gnu::always_inline]] void RecordSingleWriter(std::uint64_t v) {
    // relaxed: as Record; exact because nobody else writes (the precondition).
    std::atomic<std::uint64_t>& bucket = counts_[histogram_internal::BucketOf(v)];
    bucket.store(bucket.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    sum_.store(sum_.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    if (v < min_.load(std::memory_order_relaxed)) min_.store(v, std::memory_order_relaxed);
    if (v > max_.load(std::memory_order_relaxed)) max_.store(v, std::memory_order_relaxed);
  }

  /// Records every value of `values`, as Record does each, with fewer atomic adds:
  /// values that fall in one bucket are added to it at once (up to 8 buckets per
  /// call are gathered; a value of a ninth goes to its bucket alone), and the count,
  /// the sum, min and max once per call. For a batch of deliveries or acks, whose
  /// values are close. Never a lock.
  void RecordMany(std::span<const std::uint64_t> values) {
    if (values.empty()) return;
    std::array<std::pair<std::size_t, std::uint64_t>, 8> gathered;
    std::size_t buckets = 0;
    std::uint64_t sum = 0;
    std::uint64_t lo = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t hi = 0;
    for (const std::uint64_t v : values) {
      sum += v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      const std::size_t b = histogram_internal::BucketOf(v);
      std::size_t i = 0;
      while (i < buckets && gathered[i].first != b) ++i;
      if (i < buckets) {
        ++gathered[i].second;
      } else if (buckets < gathered.size()) {
        gathered[buckets++] = {b, 1};
      } else {
        counts_[b].fetch_add(1, std::memory_order_relaxed);  // relaxed: as Record
      }
    }
    for (std::size_t i = 0; i < buckets; ++i) {
      counts_[gathered[i].first].fetch_add(gathered[i].second, std::memory_order_relaxed);
    }
    sum_.fetch_add(sum, std::memory_order_relaxed);
    Widen(lo, hi);
  }

  /// A copy of the counters. Its min() and max() are widened to the bounds of the
  /// outermost non-empty buckets, so that min() <= every counted value <= max() even
  /// when the snapshot races a Record.
  HistogramSnapshot Snapshot() const {
    HistogramSnapshot s;
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      s.counts_[i] = counts_[i].load(std::memory_order_relaxed);
      n += s.counts_[i];
    }
    // The bucket counts are the truth; the other fields are updated after them, so a
    // snapshot racing a Record may see a bucket count whose min/max update has not
    // landed yet. Widen min/max to the bounds of the outermost non-empty buckets so
    // that min <= every counted value <= max always holds.
    s.count_ = n;
    s.sum_ = sum_.load(std::memory_order_relaxed);
    s.min_ = min_.load(std::memory_order_relaxed);
    s.max_ = max_.load(std::memory_order_relaxed);
    if (n > 0) {
      std::size_t lo = 0;
      while (s.counts_[lo] == 0) ++lo;
      std::size_t hi = s.counts_.size() - 1;
      while (s.counts_[hi] == 0) --hi;
      const std::uint64_t lo_bound = lo == 0 ? 0 : histogram_internal::BucketUpper(lo - 1) + 1;
      s.min_ = std::min(s.min_, lo_bound);
      s.max_ = std::max(s.max_, histogram_internal::BucketUpper(hi));
    }
    return s;
  }

  /// Number of values recorded so far: the total of the buckets' relaxed reads (1,920
  /// loads; for a figure read now and then, not per event). Each value is counted
  /// once, whichever thread recorded it; one recorded while this runs may be left out.
  std::uint64_t count() const {
    std::uint64_t n = 0;
    for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
    return n;
  }

 private:
  // min_ down to lo and max_ up to hi (relaxed, as the counters).
  void Widen(std::uint64_t lo, std::uint64_t hi) {
    std::uint64_t cur = min_.load(std::memory_order_relaxed);
    while (lo < cur && !min_.compare_exchange_weak(cur, lo, std::memory_order_relaxed)) {
    }
    cur = max_.load(std::memory_order_relaxed);
    while (hi > cur && !max_.compare_exchange_weak(cur, hi, std::memory_order_relaxed)) {
    }
  }

  std::array<std::atomic<std::uint64_t>, histogram_internal::kBuckets> counts_{};
  std::atomic<std::uint64_t> sum_{0};
  std::atomic<std::uint64_t> min_{std::numeric_limits<std::uint64_t>::max()};
  std::atomic<std::uint64_t> max_{0};
};

}  // namespace inferq
