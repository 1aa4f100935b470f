/// @file inferq/sched/batcher.hpp
///
/// Batcher: when a consumer member should take a batch off its queue, and how many
/// items. It follows the dynamic batcher of NVIDIA Triton Inference
/// Server (max batch size, preferred batch sizes, max queue delay;
/// https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/model_configuration.html#dynamic-batcher)
/// and can shrink or grow its window from the observed round-trip time of the
/// batches it dispatched (the adaptive window below). One Batcher per consumer member.
///
/// Usage:
/// @code
///   inferq::BatchPolicy p{.max_batch = 8, .max_queue_delay = absl::Milliseconds(2)};
///   auto batcher = inferq::Batcher::Create(p);          // StatusOr<unique_ptr<Batcher>>
///   inferq::BatchDecision d = (*batcher)->Decide(queued, oldest_enqueue_ns, now_ns);
///   if (d.take > 0) { /* pop d.take items and run them as one batch */ }
///   else            { /* sleep until d.wait_until_ns or until more items arrive */ }
///   (*batcher)->ObserveRtt(batch_rtt_ns);                // when a batch completes
/// @endcode
///
/// Decision rules (Decide), with `window` and `window_delay` as below:
///   1. queued == 0: take 0, wait_until = INT64_MAX (wait for an arrival).
///   2. queued >= window: take the largest preferred size <= window, or window when
///      no preferred size is <= window (or none are configured).
///   3. else, some preferred size <= queued: take the largest such, now.
///   4. else, now >= oldest_enqueue + window_delay: take all `queued` (< window).
///   5. else: take 0, wait_until = oldest_enqueue + window_delay.
///
/// So what queued up while the member was busy leaves as one batch: five items that
/// waited past the delay leave as a batch of 5, never as 1 followed by 4.
///
/// Adaptive window, when `adaptive` is set:
/// @code{.unparsed}
///   observed  = EMA of ObserveRtt samples, alpha = 0.2, the first sample initialises
///               it; in integer ns: observed' = (sample + 4 * observed + 2) / 5
///               (rounded to the nearest ns, halves up).
///   ratio     = clamp(baseline_rtt / observed, 0.3, 1.5); 1 before the first sample.
///   window    = clamp(round(ratio * max_batch * 0.8), 1, max_batch)   (round half away
///               from zero, std::llround).
///   window_delay = max(min_window_us, ratio * max_queue_delay * 0.8), and 0 when
///               max_queue_delay is 0 (a batcher that never waits keeps never waiting).
/// @endcode
/// The same ratio scales the size and the time window: a slower backend (observed RTT
/// above the baseline) gets smaller, sooner batches; a faster one larger, later ones.
/// The 128 µs floor applies to the time window only, so window_delay may exceed
/// max_queue_delay (by the 1.2 of ratio 1.5 x 0.8, or up to the floor when
/// max_queue_delay is below it): with `adaptive`, max_queue_delay is the reference
/// delay the ratio scales, not a hard cap. Without `adaptive`: window = max_batch,
/// window_delay = max_queue_delay, and min_window_us is not used.
///
/// Thread safety: Decide must be called by one thread at a time (the member's
/// thread; it is const but counts into the stats). ObserveRtt may be called from any
/// thread at the same time as Decide: the EMA is one atomic int64 updated by CAS, so
/// concurrent samples are all applied, in some order. Stats, window, window_delay_ns
/// and observed_rtt_ns may be called from any thread; counters are read one by one
/// (relaxed), so a snapshot taken during Decide may be one decision apart between
/// fields.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace inferq {

/// How a Batcher forms batches (see the file comment); checked by Validate.
struct BatchPolicy {
  /// Largest batch, items: 1..65536.
  std::uint32_t max_batch = 1;
  /// How long the oldest queued item may wait for a fuller batch: 0 (never wait) up
  /// to 1 hour.
  absl::Duration max_queue_delay = absl::ZeroDuration();
  /// Batch sizes the model runs best at, items: each in 1..max_batch, strictly
  /// ascending. Empty: any size is fine.
  std::vector<std::uint32_t> preferred_batch_sizes{};
  /// Scale window and delay by baseline_rtt / observed RTT (see the file comment).
  bool adaptive = false;
  /// The round-trip time of a batch at nominal load: > 0 and <= 1 hour when
  /// adaptive, otherwise unused.
  absl::Duration baseline_rtt = absl::ZeroDuration();
  /// Floor of the adaptive time window, µs: 1..3,600,000,000.
  std::int64_t min_window_us = 128;

  /// InvalidArgument naming the field and its value when one is out of range.
  static absl::Status Validate(const BatchPolicy& p);
};

/// What Decide says: take > 0 means pop `take` items now as one batch (then
/// wait_until_ns == now_ns); take == 0 means wait until wait_until_ns (INT64_MAX:
/// until an item arrives) or until more items arrive, whichever is first, and ask
/// again.
struct BatchDecision {
  std::uint32_t take = 0;                  ///< items to pop now as one batch (0: wait)
  std::int64_t wait_until_ns = INT64_MAX;  ///< when to ask again, on Decide's clock
};

inline constexpr std::size_t kBatchSizeBuckets = 17;  ///< log2 buckets of 1..65536

/// A Batcher's counters (Batcher::Stats).
struct BatcherStats {
  std::uint64_t decisions = 0;          ///< Decide calls
  std::uint64_t waits = 0;              ///< decisions with take == 0 (queue not empty)
  std::uint64_t full_batches = 0;       ///< rule 2: queued >= window
  std::uint64_t preferred_batches = 0;  ///< rule 3: a preferred size was reachable
  std::uint64_t timeout_batches = 0;    ///< rule 4: the oldest item waited window_delay
  std::uint64_t items_dispatched = 0;   ///< sum of take
  /// batches_by_size[k]: batches with take in [2^k, 2^(k+1)).
  std::array<std::uint64_t, kBatchSizeBuckets> batches_by_size{};
  std::uint64_t rtt_samples = 0;          ///< samples folded into the EMA
  std::uint64_t rtt_samples_ignored = 0;  ///< samples <= 0 or above 1 hour
};

/// When a consumer member should take a batch off its queue, and how many items (see
/// the file comment).
class Batcher {
 public:
  /// InvalidArgument as BatchPolicy::Validate.
  static absl::StatusOr<std::unique_ptr<Batcher>> Create(BatchPolicy policy) {
    if (absl::Status s = BatchPolicy::Validate(policy); !s.ok()) return s;
    return std::unique_ptr<Batcher>(new Batcher(std::move(policy)));
  }
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// The policy it was created with.
  const BatchPolicy& policy() const { return policy_; }

  /// The decision for `queued` items whose oldest was enqueued at
  /// `oldest_enqueue_ns`, at `now_ns` (ns of one monotonic clock; the oldest time
  /// is unused when queued == 0). Rules in the file comment. One thread at a time.
  BatchDecision Decide(std::size_t queued, std::int64_t oldest_enqueue_ns,
                       std::int64_t now_ns) const {
    Bump(decisions_);
    if (queued == 0) return {0, INT64_MAX};
    const Window w = CurrentWindow();
    std::uint32_t take = 0;
    if (queued >= w.size) {
      take = LargestPreferredAtMost(w.size);
      if (take == 0) take = w.size;
      Bump(full_batches_);
    } else if (std::uint32_t p = LargestPreferredAtMost(static_cast<std::uint32_t>(queued));
               p > 0) {
      take = p;
      Bump(preferred_batches_);
    } else {
      // Saturating: oldest + delay never wraps (delay <= ~1.2 hours).
      const std::int64_t due = oldest_enqueue_ns > INT64_MAX - w.delay_ns
                                   ? INT64_MAX
                                   : oldest_enqueue_ns + w.delay_ns;
      if (now_ns < due) {
        Bump(waits_);
        return {0, due};
      }
      take = static_cast<std::uint32_t>(queued);  // queued < window <= 65536
      Bump(timeout_batches_);
    }
    Bump(items_dispatched_, take);
    Bump(batches_by_size_[std::bit_width(take) - 1]);
    return {take, now_ns};
  }

  /// Folds the round-trip time of a completed batch, ns, into the EMA. A sample
  /// <= 0 or above 1 hour is ignored and counted (rtt_samples_ignored). Any thread.
  void ObserveRtt(std::int64_t rtt_ns) {
    if (rtt_ns <= 0 || rtt_ns > kMaxRttNs) {
      rtt_samples_ignored_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // Relaxed is enough: the EMA is a lone value, no other data is published with
    // it, and the CAS makes every sample count exactly once.
    std::int64_t cur = observed_rtt_ns_.load(std::memory_order_relaxed);
    std::int64_t next;
    do {
      next = cur == 0 ? rtt_ns : (rtt_ns + 4 * cur + 2) / 5;
    } while (!observed_rtt_ns_.compare_exchange_weak(cur, next, std::memory_order_relaxed));
    rtt_samples_.fetch_add(1, std::memory_order_relaxed);
  }

  /// The current size window, items (1..max_batch).
  std::uint32_t window() const { return CurrentWindow().size; }
  /// The current time window, ns.
  std::int64_t window_delay_ns() const { return CurrentWindow().delay_ns; }
  /// The smoothed round-trip time, ns; 0 before the first sample.
  std::int64_t observed_rtt_ns() const {
    return observed_rtt_ns_.load(std::memory_order_relaxed);
  }

  /// A snapshot of the counters, read one by one (see the file comment). Any thread.
  BatcherStats Stats() const {
    BatcherStats s;
    auto get = [](const std::atomic<std::uint64_t>& c) {
      return c.load(std::memory_order_relaxed);
    };
    s.decisions = get(decisions_);
    s.waits = get(waits_);
    s.full_batches = get(full_batches_);
    s.preferred_batches = get(preferred_batches_);
    s.timeout_batches = get(timeout_batches_);
    s.items_dispatched = get(items_dispatched_);
    for (std::size_t k = 0; k < kBatchSizeBuckets; ++k) s.batches_by_size[k] = get(batches_by_size_[k]);
    s.rtt_samples = get(rtt_samples_);
    s.rtt_samples_ignored = get(rtt_samples_ignored_);
    return s;
  }

 private:
  static constexpr std::int64_t kMaxRttNs = 3'600'000'000'000;  ///< 1 hour

  struct Window {
    std::uint32_t size;
    std::int64_t delay_ns;
  };

  explicit Batcher(BatchPolicy policy)
      : policy_(std::move(policy)),
        max_delay_ns_(absl::ToInt64Nanoseconds(policy_.max_queue_delay)),
        baseline_ns_(static_cast<double>(absl::ToInt64Nanoseconds(policy_.baseline_rtt))),
        min_window_ns_(policy_.min_window_us * 1000) {}

  Window CurrentWindow() const {
    if (!policy_.adaptive) return {policy_.max_batch, max_delay_ns_};
    const std::int64_t observed = observed_rtt_ns_.load(std::memory_order_relaxed);
    const double ratio =
        observed == 0 ? 1.0
                      : std::clamp(baseline_ns_ / static_cast<double>(observed), 0.3, 1.5);
    const long long size = std::llround(ratio * policy_.max_batch * 0.8);
    Window w;
    w.size = static_cast<std::uint32_t>(std::clamp<long long>(size, 1, policy_.max_batch));
    w.delay_ns = max_delay_ns_ == 0
                     ? 0
                     : std::max<std::int64_t>(
                           min_window_ns_,
                           std::llround(ratio * static_cast<double>(max_delay_ns_) * 0.8));
    return w;
  }

  /// The largest preferred size <= n, or 0.
  std::uint32_t LargestPreferredAtMost(std::uint32_t n) const {
    const auto& v = policy_.preferred_batch_sizes;
    auto it = std::upper_bound(v.begin(), v.end(), n);
    return it == v.begin() ? 0 : *(it - 1);
  }

  /// Single-writer counters (Decide's thread): a load and a store, no RMW.
  static void Bump(std::atomic<std::uint64_t>& c, std::uint64_t by = 1) {
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }

  const BatchPolicy policy_;
  const std::int64_t max_delay_ns_;
  const double baseline_ns_;
  const std::int64_t min_window_ns_;
  std::atomic<std::int64_t> observed_rtt_ns_{0};
  mutable std::atomic<std::uint64_t> decisions_{0}, waits_{0}, full_batches_{0},
      preferred_batches_{0}, timeout_batches_{0}, items_dispatched_{0};
  mutable std::array<std::atomic<std::uint64_t>, kBatchSizeBuckets> batches_by_size_{};
  std::atomic<std::uint64_t> rtt_samples_{0}, rtt_samples_ignored_{0};
};

inline absl::Status BatchPolicy::Validate(const BatchPolicy& p) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (p.max_batch < 1 || p.max_batch > 65536) {
    return bad("batch max_batch " + std::to_string(p.max_batch) + " is outside 1..65536");
  }
  const absl::Duration kHour = absl::Hours(1);
  if (p.max_queue_delay < absl::ZeroDuration() || p.max_queue_delay > kHour) {
    return bad("batch max_queue_delay " + absl::FormatDuration(p.max_queue_delay) +
               " is outside 0..1h");
  }
  std::uint32_t prev = 0;
  for (std::size_t i = 0; i < p.preferred_batch_sizes.size(); ++i) {
    const std::uint32_t s = p.preferred_batch_sizes[i];
    const std::string where = "batch preferred_batch_sizes[" + std::to_string(i) + "] " +
                              std::to_string(s);
    if (s < 1 || s > p.max_batch) {
      return bad(where + " is outside 1..max_batch " + std::to_string(p.max_batch));
    }
    if (s <= prev) {
      return bad(where + " is not above the previous size " + std::to_string(prev) +
                 " (sizes must be strictly ascending)");
    }
    prev = s;
  }
  if (p.adaptive && (p.baseline_rtt <= absl::ZeroDuration() || p.baseline_rtt > kHour)) {
    return bad("batch baseline_rtt " + absl::FormatDuration(p.baseline_rtt) +
               " must be in (0, 1h] when adaptive");
  }
  if (p.min_window_us < 1 || p.min_window_us > 3'600'000'000) {
    return bad("batch min_window_us " + std::to_string(p.min_window_us) +
               " is outside 1..3600000000");
  }
  return absl::OkStatus();
}

}  // namespace inferq
