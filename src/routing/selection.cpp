#include "inferq/routing/selection.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "predicate_internal.hpp"

namespace inferq {

std::string_view MemberHealthName(MemberHealth h) {
  switch (h) {
    case MemberHealth::kHealthy: return "healthy";
    case MemberHealth::kDegraded: return "degraded";
    case MemberHealth::kEjected: return "ejected";
    case MemberHealth::kRecovering: return "recovering";
  }
  return "unknown";
}

namespace {

// a + b in ns, saturating: a host's clock may read anywhere in int64.
std::int64_t AddSat(std::int64_t a, std::int64_t b) {
  std::int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------
// SelectionView

std::int64_t SelectionView::outstanding(std::uint32_t m) const {
  return group_->Outstanding(m);
}
double SelectionView::peak_ewma_ns(std::uint32_t m) const {
  return group_->members_[m].peak_ewma_ns.load(std::memory_order_relaxed);
}
double SelectionView::score(std::uint32_t m) const {
  return group_->members_[m].score.load(std::memory_order_relaxed);
}
std::uint32_t SelectionView::Random(std::uint32_t n) const {
  // Lemire's multiply-shift reduction of a 32-bit draw to [0, n).
  const auto r = static_cast<std::uint32_t>(group_->NextRandom() >> 32);
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(r) * n) >> 32);
}
std::uint32_t SelectionView::RandomByWeight() const {
  if (all_healthy_) return Random(size_);
  double total = 0;
  for (std::uint32_t i = 0; i < size_; ++i) total += weights_[i];
  if (!(total > 0)) return kNoMember;
  double x = static_cast<double>(group_->NextRandom() >> 11) * 0x1.0p-53 * total;
  std::uint32_t last = kNoMember;
  for (std::uint32_t i = 0; i < size_; ++i) {
    if (weights_[i] <= 0) continue;
    last = i;
    if (x < weights_[i]) return i;
    x -= weights_[i];
  }
  return last;
}

namespace {

// A uniformly random eligible member (weights ignored, except 0 = ineligible).
std::uint32_t RandomEligible(const SelectionView& v) {
  const std::uint32_t n = v.size();
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::uint32_t m = v.Random(n);
    if (v.eligible(m)) return m;
  }
  const std::uint32_t start = v.Random(n);
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t m = (start + k) % n;
    if (v.eligible(m)) return m;
  }
  return kNoMember;
}

// Two distinct random eligible members (the same one twice when only one is).
std::pair<std::uint32_t, std::uint32_t> TwoChoices(const SelectionView& v) {
  const std::uint32_t n = v.size();
  if (n == 1) return {0, 0};
  if (v.all_healthy()) {
    const std::uint32_t a = v.Random(n);
    std::uint32_t b = v.Random(n - 1);
    if (b >= a) ++b;
    return {a, b};
  }
  const std::uint32_t a = RandomEligible(v);
  std::uint32_t b = a;
  for (int attempt = 0; attempt < 8 && b == a; ++attempt) b = RandomEligible(v);
  return {a, b};
}

}  // namespace

// ---------------------------------------------------------------------------------
// MemberGroup

absl::Status MemberGroup::Validate(std::uint32_t members, const GroupOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (members == 0 || members > 4096) {
    return bad("member group size " + std::to_string(members) + " is outside 1..4096");
  }
  const OutlierOptions& x = o.outlier;
  if (x.consecutive_failures == 0) return bad("outlier consecutive_failures 0 is invalid (>= 1)");
  if (!(x.degraded_weight > 0 && x.degraded_weight < 1)) {
    return bad("outlier degraded_weight " + Num(x.degraded_weight) + " is outside (0, 1)");
  }
  if (!(x.latency_factor == 0 || (x.latency_factor >= 1 && std::isfinite(x.latency_factor)))) {
    return bad("outlier latency_factor " + Num(x.latency_factor) + " must be 0 (off) or >= 1");
  }
  if (x.latency_floor < absl::ZeroDuration()) {
    return bad("outlier latency_floor " + absl::FormatDuration(x.latency_floor) + " is negative");
  }
  if (x.base_ejection_time <= absl::ZeroDuration() ||
      x.base_ejection_time == absl::InfiniteDuration()) {
    return bad("outlier base_ejection_time " + absl::FormatDuration(x.base_ejection_time) +
               " must be positive and finite");
  }
  if (x.max_ejection_time < x.base_ejection_time ||
      x.max_ejection_time == absl::InfiniteDuration()) {
    return bad("outlier max_ejection_time " + absl::FormatDuration(x.max_ejection_time) +
               " must be finite and >= base_ejection_time " +
               absl::FormatDuration(x.base_ejection_time));
  }
  if (!(x.ejection_jitter >= 0 && x.ejection_jitter <= 1)) {
    return bad("outlier ejection_jitter " + Num(x.ejection_jitter) + " is outside [0, 1]");
  }
  if (x.max_ejected_percent > 100) {
    return bad("outlier max_ejected_percent " + std::to_string(x.max_ejected_percent) +
               " is above 100");
  }
  if (x.panic_threshold_percent > 100) {
    return bad("outlier panic_threshold_percent " + std::to_string(x.panic_threshold_percent) +
               " is above 100");
  }
  if (x.slow_start < absl::ZeroDuration() || x.slow_start == absl::InfiniteDuration()) {
    return bad("outlier slow_start " + absl::FormatDuration(x.slow_start) +
               " must be zero or positive and finite");
  }
  if (!(o.ewma_alpha > 0 && o.ewma_alpha <= 1)) {
    return bad("ewma_alpha " + Num(o.ewma_alpha) + " is outside (0, 1]");
  }
  if (o.refresh_interval <= absl::ZeroDuration() ||
      o.refresh_interval == absl::InfiniteDuration()) {
    return bad("refresh_interval " + absl::FormatDuration(o.refresh_interval) +
               " must be positive and finite");
  }
  if (o.peak_ewma_decay <= absl::ZeroDuration() || o.peak_ewma_decay == absl::InfiniteDuration()) {
    return bad("peak_ewma_decay " + absl::FormatDuration(o.peak_ewma_decay) +
               " must be positive and finite");
  }
  // Times are added to clock readings in int64 ns: kMaxDuration keeps every one far
  // from overflow.
  for (auto [name, d] : {std::pair{"outlier latency_floor", x.latency_floor},
                         std::pair{"outlier base_ejection_time", x.base_ejection_time},
                         std::pair{"outlier max_ejection_time", x.max_ejection_time},
                         std::pair{"outlier slow_start", x.slow_start},
                         std::pair{"refresh_interval", o.refresh_interval},
                         std::pair{"peak_ewma_decay", o.peak_ewma_decay}}) {
    if (d > kMaxDuration) return bad(std::string(name) + " " + absl::FormatDuration(d) + " is above 365 days");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MemberGroup>> MemberGroup::Create(std::uint32_t members,
                                                                 GroupOptions options,
                                                                 const Clock* clock) {
  if (absl::Status s = Validate(members, options); !s.ok()) return s;
  return std::unique_ptr<MemberGroup>(new MemberGroup(members, std::move(options), clock));
}

MemberGroup::MemberGroup(std::uint32_t members, GroupOptions options, const Clock* clock)
    : size_(members),
      options_(std::move(options)),
      clock_(clock != nullptr ? clock : SteadyClock::Default()),
      members_(new Member[members]),
      peak_ewma_decay_ns_(static_cast<double>(absl::ToInt64Nanoseconds(options_.peak_ewma_decay))),
      latency_floor_ms_(absl::ToDoubleMilliseconds(options_.outlier.latency_floor)),
      weights_(members, 1.0),
      rng_(options_.seed == 0 ? 1 : options_.seed) {
  scratch_.reserve(members);  // Refresh then never allocates (engine_alloc_test)
}

MemberGroup::~MemberGroup() = default;

std::uint64_t MemberGroup::NextRandom() const {
  // xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift
  // generators", 2016). Select's thread only.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return rng_ * 0x2545F4914F6CDD1DULL;
}

void MemberGroup::OnDone(std::uint32_t m, Outcome outcome, std::int64_t latency_ns,
                         std::int64_t now) {
  Member& mem = members_[m];
  // release: pairs with Outstanding's acquire (invariant 2 of Member).
  mem.done.Add(1, std::memory_order_release);
  if (outcome == Outcome::kDropped) return;
  std::lock_guard lock(mem.mu);
  if (outcome == Outcome::kFailure) {
    Failure(mem, m, now);
    return;
  }
  Success(mem, m, latency_ns, now);
}

void MemberGroup::OnDoneMany(std::uint32_t m, std::span<const std::int64_t> latencies_ns,
                             std::int64_t now) {
  if (latencies_ns.empty()) return;
  Member& mem = members_[m];
  // release: pairs with Outstanding's acquire (invariant 2 of Member).
  mem.done.Add(static_cast<std::int64_t>(latencies_ns.size()), std::memory_order_release);
  std::lock_guard lock(mem.mu);
  for (const std::int64_t latency_ns : latencies_ns) Success(mem, m, latency_ns, now);
}

namespace {

// exp(-x) for x >= 0. Acks come microseconds apart and the decay time is seconds, so
// x is mostly below 2^-10: there the Taylor series to x^3 (its error below
// x^4 / 24 < 4e-14, relative) costs a few multiplies where std::exp costs ~50
// instructions on every ack.
double DecayWeight(double x) {
  if (x < 0x1p-10) return 1 - x * (1 - x * (0.5 - x * (1.0 / 6)));
  return std::exp(-x);
}

}  // namespace

void MemberGroup::Success(Member& mem, std::uint32_t m, std::int64_t latency_ns, std::int64_t now) {
  ++mem.successes;
  const double lat = static_cast<double>(std::max<std::int64_t>(0, latency_ns));
  // Peak EWMA (Finagle): jump up to a higher sample, decay towards a lower one with
  // weight exp(-dt / tau), dt clamped at 0. dt = 0 (acks at one reading of the
  // clock: an AckBatch) is weight 1, the cost unchanged, without calling exp.
  double cost = mem.peak_ewma_ns.load(std::memory_order_relaxed);
  if (lat > cost || mem.last_ack_ns == 0) {
    cost = lat;
  } else if (now > mem.last_ack_ns) {
    const double w = DecayWeight(static_cast<double>(now - mem.last_ack_ns) / peak_ewma_decay_ns_);
    cost = cost * w + lat * (1 - w);
  }
  mem.peak_ewma_ns.store(cost, std::memory_order_relaxed);
  mem.last_ack_ns = now == 0 ? 1 : now;
  const double lat_ms = lat / 1e6;
  ++mem.window_acks;
  mem.window_latency_ms_sum += lat_ms;
  mem.ack_latency_ewma_ms = mem.successes == 1 ? lat_ms : 0.8 * mem.ack_latency_ewma_ms + 0.2 * lat_ms;

  // Latency far above the group's counts as a failure.
  const OutlierOptions& o = options_.outlier;
  const double median = median_latency_ms_.load(std::memory_order_relaxed);
  if (o.enabled && o.latency_factor > 0 && median > 0 &&
      lat_ms > std::max(o.latency_factor * median, latency_floor_ms_)) {
    Failure(mem, m, now);
    return;
  }
  mem.consecutive_failures = 0;
  ++mem.consecutive_successes;
  if (mem.health == MemberHealth::kDegraded &&
      mem.consecutive_successes >= o.consecutive_failures) {
    mem.health = MemberHealth::kHealthy;
    mem.consecutive_successes = 0;
    mem.healthy_since_ns = now;
    sick_.fetch_sub(1, std::memory_order_relaxed);
    health_epoch_.fetch_add(1, std::memory_order_release);
  }
}

void MemberGroup::Failure(Member& mem, std::uint32_t /*index*/, std::int64_t now) {
  ++mem.failures;
  mem.consecutive_successes = 0;
  const OutlierOptions& o = options_.outlier;
  if (!o.enabled || mem.health == MemberHealth::kEjected) return;
  if (++mem.consecutive_failures < o.consecutive_failures) return;
  mem.consecutive_failures = 0;
  if (mem.health == MemberHealth::kHealthy || mem.health == MemberHealth::kRecovering) {
    if (mem.health == MemberHealth::kHealthy) {
      sick_.fetch_add(1, std::memory_order_relaxed);
      mem.healthy_span_ns = now - mem.healthy_since_ns;
    } else {
      mem.healthy_span_ns = 0;
    }
    mem.health = MemberHealth::kDegraded;
    mem.degraded_until_ns = AddSat(now, absl::ToInt64Nanoseconds(o.base_ejection_time));
    degradations_.fetch_add(1, std::memory_order_relaxed);
    health_epoch_.fetch_add(1, std::memory_order_release);
    return;
  }
  // Degraded and still failing: eject, if the cap allows it with this member
  // counted, and never the last member standing.
  std::lock_guard lock(eject_mu_);
  const std::uint32_t ejected = ejected_.load(std::memory_order_relaxed);
  if ((static_cast<std::uint64_t>(ejected) + 1) * 100 >
          static_cast<std::uint64_t>(o.max_ejected_percent) * size_ ||
      ejected + 1 >= size_) {
    ejections_refused_.fetch_add(1, std::memory_order_relaxed);
    mem.degraded_until_ns = AddSat(now, absl::ToInt64Nanoseconds(o.base_ejection_time));
    return;
  }
  if (mem.healthy_span_ns > absl::ToInt64Nanoseconds(o.max_ejection_time)) {
    mem.ejections = 0;  // healthy for longer than the longest ejection: start over
  }
  ++mem.ejections;
  const double base = static_cast<double>(absl::ToInt64Nanoseconds(o.base_ejection_time));
  const double cap = static_cast<double>(absl::ToInt64Nanoseconds(o.max_ejection_time));
  double t = std::min(base * mem.ejections, cap);
  // Jitter from a hash of (time, member, count): OnDone runs on any thread, so it
  // must not touch the Select thread's generator.
  const std::uint64_t h = XXH3_64bits_withSeed(&now, sizeof now, mem.ejections * 0x9E37u + size_);
  t += t * o.ejection_jitter * (static_cast<double>(h >> 11) * 0x1.0p-53);
  mem.health = MemberHealth::kEjected;
  mem.eject_until_ns = AddSat(now, static_cast<std::int64_t>(t));
  ejected_.fetch_add(1, std::memory_order_relaxed);
  ejections_.fetch_add(1, std::memory_order_relaxed);
  health_epoch_.fetch_add(1, std::memory_order_release);
}

absl::Status MemberGroup::ReportLoad(std::uint32_t m, const MemberLoadReport& r) {
  if (m >= size_) {
    return absl::InvalidArgumentError("ReportLoad member " + std::to_string(m) +
                                      " is out of range (group of " + std::to_string(size_) + ")");
  }
  for (auto [name, v] : {std::pair{"qps", r.qps}, std::pair{"rt_ms", r.rt_ms},
                         std::pair{"hop", r.hop}, std::pair{"cpu", r.cpu}}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError("ReportLoad member " + std::to_string(m) + ": " + name +
                                        " " + Num(v) + " must be finite and >= 0");
    }
  }
  if (r.cpu > 1) {
    return absl::InvalidArgumentError("ReportLoad member " + std::to_string(m) + ": cpu " +
                                      Num(r.cpu) + " is above 1");
  }
  Member& mem = members_[m];
  std::lock_guard lock(mem.mu);
  mem.reported = true;
  mem.report_ns = clock_->NowNanos();
  mem.report = r;
  return absl::OkStatus();
}

void MemberGroup::Refresh(std::int64_t now) {
  // In double and saturated: a host's clock may read anywhere in int64 (UBSan found
  // now + refresh_interval overflowing near INT64_MAX).
  const double window_s =
      window_start_ns_ == 0
          ? 0
          : (static_cast<double>(now) - static_cast<double>(static_cast<std::int64_t>(window_start_ns_))) / 1e9;
  window_start_ns_ = static_cast<std::uint64_t>(now == 0 ? 1 : now);
  next_refresh_ns_ = AddSat(now, absl::ToInt64Nanoseconds(options_.refresh_interval));
  const double a = options_.ewma_alpha;
  std::vector<double>& lat = scratch_;
  lat.clear();
  double max_inv = 0, max_rt = 0, max_hop = 0, max_cpu = 0;
  for (std::uint32_t i = 0; i < size_; ++i) {
    Member& mem = members_[i];
    std::lock_guard lock(mem.mu);
    MemberLoadReport x;
    mem.report_fresh = mem.reported && now - mem.report_ns <= 2 * absl::ToInt64Nanoseconds(options_.refresh_interval);
    if (mem.report_fresh) {
      x = mem.report;
    } else {
      x.qps = window_s > 0 ? static_cast<double>(mem.window_acks) / window_s : 0;
      x.rt_ms = mem.window_acks > 0 ? mem.window_latency_ms_sum / static_cast<double>(mem.window_acks)
                                    : mem.smoothed.rt_ms;
      x.hop = 0;
      x.cpu = static_cast<double>(std::max<std::int64_t>(0, Outstanding(i)));
    }
    mem.window_acks = 0;
    mem.window_latency_ms_sum = 0;
    if (!mem.smoothed_init) {
      mem.smoothed = x;
      mem.smoothed_init = true;
    } else {
      mem.smoothed.qps = a * x.qps + (1 - a) * mem.smoothed.qps;
      mem.smoothed.rt_ms = a * x.rt_ms + (1 - a) * mem.smoothed.rt_ms;
      mem.smoothed.hop = a * x.hop + (1 - a) * mem.smoothed.hop;
      mem.smoothed.cpu = a * x.cpu + (1 - a) * mem.smoothed.cpu;
    }
    if (mem.successes > 0) lat.push_back(mem.ack_latency_ewma_ms);
    const double inv = mem.smoothed.qps > 0 ? 1.0 / mem.smoothed.qps : 0;
    max_inv = std::max(max_inv, inv);
    max_rt = std::max(max_rt, mem.smoothed.rt_ms);
    max_hop = std::max(max_hop, mem.smoothed.hop);
    max_cpu = std::max(max_cpu, mem.smoothed.cpu);
  }
  auto norm = [](double v, double mx) { return mx > 0 ? v / mx : 0.0; };
  double informed_sum = 0;
  std::uint32_t informed = 0;
  for (std::uint32_t i = 0; i < size_; ++i) {
    Member& mem = members_[i];
    std::lock_guard lock(mem.mu);
    const MemberLoadReport& s = mem.smoothed;
    // A member that reports qps 0 serves nothing: the worst qps term, 1. A measured
    // member with no acks yet is unknown, not slow: term 0 (else an idle member would
    // never get the work that would show its rate).
    const bool busy = Outstanding(i) > 0;
    const double inv_term =
        s.qps > 0 ? norm(1.0 / s.qps, max_inv) : (mem.report_fresh || busy ? 1.0 : 0.0);
    const double score = 0.4 * inv_term + 0.3 * norm(s.rt_ms, max_rt) +
                         0.2 * norm(s.hop, max_hop) + 0.1 * norm(s.cpu, max_cpu);
    mem.score.store(score, std::memory_order_relaxed);
    if (mem.reported || mem.successes > 0) {
      informed_sum += score;
      ++informed;
    }
  }
  // A member with nothing known yet (no report, no ack) is scored as the average
  // informed member: neither a magnet (score ~0 next to members that report) nor
  // shunned.
  if (informed > 0 && informed < size_) {
    const double mean = informed_sum / informed;
    for (std::uint32_t i = 0; i < size_; ++i) {
      Member& mem = members_[i];
      std::lock_guard lock(mem.mu);
      if (!mem.reported && mem.successes == 0) mem.score.store(mean, std::memory_order_relaxed);
    }
  }
  if (!lat.empty()) {
    std::nth_element(lat.begin(), lat.begin() + static_cast<std::ptrdiff_t>(lat.size() / 2), lat.end());
    median_latency_ms_.store(lat[lat.size() / 2], std::memory_order_relaxed);
  }
}

void MemberGroup::RecomputeWeights(std::int64_t now) {
  seen_epoch_ = health_epoch_.load(std::memory_order_acquire);
  const OutlierOptions& o = options_.outlier;
  const std::int64_t slow = absl::ToInt64Nanoseconds(o.slow_start);
  const double dw = o.degraded_weight;
  std::uint32_t healthy = 0;
  std::int64_t next = INT64_MAX;
  for (std::uint32_t i = 0; i < size_; ++i) {
    Member& mem = members_[i];
    std::lock_guard lock(mem.mu);
    if (mem.health == MemberHealth::kEjected && now >= mem.eject_until_ns) {
      std::lock_guard eject_lock(eject_mu_);
      ejected_.fetch_sub(1, std::memory_order_relaxed);
      mem.health = MemberHealth::kRecovering;
      mem.recover_until_ns = mem.eject_until_ns + slow;
      mem.consecutive_failures = 0;
      health_epoch_.fetch_add(1, std::memory_order_release);
    }
    if (mem.health == MemberHealth::kDegraded && now >= mem.degraded_until_ns) {
      // Degraded and given (almost) no work, it can neither heal nor fail: after
      // base_ejection_time it is given a chance through the slow start.
      mem.health = MemberHealth::kRecovering;
      mem.recover_until_ns = AddSat(now, slow);
      mem.consecutive_failures = 0;
      health_epoch_.fetch_add(1, std::memory_order_release);
    }
    if (mem.health == MemberHealth::kRecovering && now >= mem.recover_until_ns) {
      mem.health = MemberHealth::kHealthy;
      mem.healthy_since_ns = now;
      sick_.fetch_sub(1, std::memory_order_relaxed);
      health_epoch_.fetch_add(1, std::memory_order_release);
    }
    double w = 1;
    switch (mem.health) {
      case MemberHealth::kHealthy:
        ++healthy;
        break;
      case MemberHealth::kDegraded:
        w = dw;
        next = std::min(next, mem.degraded_until_ns);
        break;
      case MemberHealth::kEjected:
        w = 0;
        next = std::min(next, mem.eject_until_ns);
        break;
      case MemberHealth::kRecovering: {
        const double f = slow > 0 ? static_cast<double>(now - (mem.recover_until_ns - slow)) /
                                        static_cast<double>(slow)
                                  : 1.0;
        w = dw + (1 - dw) * std::clamp(f, 0.0, 1.0);
        // Re-weigh at least 100 times over the ramp.
        next = std::min({next, mem.recover_until_ns, AddSat(now, std::max<std::int64_t>(1, slow / 100))});
        break;
      }
    }
    weights_[i] = w;
  }
  next_transition_ns_ = next;
  panic_ = o.enabled && o.panic_threshold_percent > 0 &&
           static_cast<std::uint64_t>(healthy) * 100 <
               static_cast<std::uint64_t>(o.panic_threshold_percent) * size_;
  all_healthy_ = panic_ || healthy == size_;
}

Selection MemberGroup::Select(SelectionPolicy& policy, const Event& event, std::int64_t now,
                              std::uint32_t avoid) {
  selections_.store(selections_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  if (now >= next_refresh_ns_) Refresh(now);
  if (sick_.load(std::memory_order_relaxed) == 0) {
    // Fast path: nobody is sick, every weight is 1.
    all_healthy_ = true;
    panic_ = false;
    weights_valid_ = false;
  } else if (!weights_valid_ || health_epoch_.load(std::memory_order_acquire) != seen_epoch_ ||
             now >= next_transition_ns_) {
    RecomputeWeights(now);
    weights_valid_ = true;
  }
  SelectionView view;
  view.group_ = this;
  view.weights_ = weights_.data();
  view.size_ = size_;
  view.now_ns_ = now;
  view.all_healthy_ = all_healthy_;
  view.panic_ = panic_;
  if (panic_) panics_.store(panics_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  Selection s;
  bool avoided = false;
  if (avoid < size_) {
    // The policy sees `avoid` at weight 0, unless nobody else is eligible.
    avoid_weights_.resize(size_);
    bool other = false;
    for (std::uint32_t i = 0; i < size_; ++i) {
      avoid_weights_[i] = i == avoid ? 0.0 : all_healthy_ ? 1.0 : weights_[i];
      other = other || avoid_weights_[i] > 0;
    }
    if (other) {
      SelectionView avoiding = view;
      avoiding.weights_ = avoid_weights_.data();
      avoiding.all_healthy_ = false;
      s = policy.Select(event, avoiding);
      // No answer with `avoid` out (a policy whose only candidate it was, such as
      // the one primary of a WeightedShadowPolicy): ask again with it in.
      avoided = s.member < size_ && avoiding.eligible(s.member);
    }
  }
  if (!avoided) s = policy.Select(event, view);
  if (s.member >= size_ || !view.eligible(s.member)) {
    const std::uint32_t m = RandomEligible(view);
    s.member = m == kNoMember ? 0 : m;
  }
  if (s.mirror != kNoMember && (s.mirror >= size_ || s.mirror == s.member)) s.mirror = kNoMember;
  return s;
}

GroupSnapshot MemberGroup::Stats() const {
  GroupSnapshot g;
  g.selections = selections_.load(std::memory_order_relaxed);
  g.panics = panics_.load(std::memory_order_relaxed);
  g.degradations = degradations_.load(std::memory_order_relaxed);
  g.ejections = ejections_.load(std::memory_order_relaxed);
  g.ejections_refused = ejections_refused_.load(std::memory_order_relaxed);
  const std::int64_t now = clock_->NowNanos();
  for (std::uint32_t i = 0; i < size_; ++i) g.members.push_back(SnapshotOf(i, now));
  return g;
}

MemberHealth MemberGroup::Health(std::uint32_t m) const {
  return SnapshotOf(m, clock_->NowNanos()).health;
}

MemberSnapshot MemberGroup::SnapshotOf(std::uint32_t i, std::int64_t now) const {
  const OutlierOptions& o = options_.outlier;
  const std::int64_t slow = absl::ToInt64Nanoseconds(o.slow_start);
  {
    Member& mem = members_[i];
    std::lock_guard lock(mem.mu);
    MemberSnapshot s;
    s.index = i;
    s.health = mem.health;
    // Time-driven transitions as they stand now (Select applies them lazily).
    if (s.health == MemberHealth::kEjected && now >= mem.eject_until_ns) {
      s.health = now >= mem.eject_until_ns + slow ? MemberHealth::kHealthy : MemberHealth::kRecovering;
    } else if (s.health == MemberHealth::kRecovering && now >= mem.recover_until_ns) {
      s.health = MemberHealth::kHealthy;
    } else if (s.health == MemberHealth::kDegraded && now >= mem.degraded_until_ns) {
      s.health = now >= mem.degraded_until_ns + slow ? MemberHealth::kHealthy : MemberHealth::kRecovering;
    }
    switch (s.health) {
      case MemberHealth::kHealthy: s.weight = 1; break;
      case MemberHealth::kDegraded: s.weight = o.degraded_weight; break;
      case MemberHealth::kEjected: s.weight = 0; break;
      case MemberHealth::kRecovering: {
        const std::int64_t until = mem.health == MemberHealth::kEjected   ? mem.eject_until_ns + slow
                                   : mem.health == MemberHealth::kDegraded ? mem.degraded_until_ns + slow
                                                                           : mem.recover_until_ns;
        const double f = slow > 0 ? static_cast<double>(now - (until - slow)) / static_cast<double>(slow) : 1;
        s.weight = o.degraded_weight + (1 - o.degraded_weight) * std::clamp(f, 0.0, 1.0);
        break;
      }
    }
    s.outstanding = Outstanding(i);
    s.successes = mem.successes;
    s.failures = mem.failures;
    s.ejections = mem.ejections;
    s.peak_ewma_ms = mem.peak_ewma_ns.load(std::memory_order_relaxed) / 1e6;
    s.score = mem.score.load(std::memory_order_relaxed);
    return s;
  }
}

// ---------------------------------------------------------------------------------
// Policies

Selection RoundRobinPolicy::Select(const Event&, const SelectionView& v) {
  const std::uint32_t n = v.size();
  if (v.all_healthy()) return {static_cast<std::uint32_t>(next_++ % n), kNoMember};
  // Smooth weighted round robin (nginx, ngx_http_upstream_get_peer): every eligible
  // member gains its weight, the richest is picked and pays the total.
  if (current_.size() != n) current_.assign(n, 0.0);
  double total = 0;
  std::uint32_t best = kNoMember;
  for (std::uint32_t i = 0; i < n; ++i) {
    const double w = v.weight(i);
    if (w <= 0) continue;
    current_[i] += w;
    total += w;
    if (best == kNoMember || current_[i] > current_[best]) best = i;
  }
  if (best != kNoMember) current_[best] -= total;
  return {best, kNoMember};
}

Selection LeastLoadedPolicy::Select(const Event&, const SelectionView& v) {
  const auto [a, b] = TwoChoices(v);
  if (a == kNoMember) return {};
  // (outstanding + 1): an idle degraded member still costs 1 / 0.01.
  const double la = static_cast<double>(std::max<std::int64_t>(0, v.outstanding(a)) + 1) / v.weight(a);
  const double lb = static_cast<double>(std::max<std::int64_t>(0, v.outstanding(b)) + 1) / v.weight(b);
  return {lb < la ? b : a, kNoMember};
}

Selection PeakEwmaPolicy::Select(const Event&, const SelectionView& v) {
  const auto [a, b] = TwoChoices(v);
  if (a == kNoMember) return {};
  // Finagle: a member with no latency yet costs 0 when idle (so it is tried) and a
  // large penalty once it has work pending (so it is not flooded before it answers).
  constexpr double kPenalty = 1e15;  // ns; Finagle's Long.MaxValue >> 16 is ~1.4e14
  auto cost = [&](std::uint32_t m) {
    const double lat = v.peak_ewma_ns(m);
    const auto pending = static_cast<double>(std::max<std::int64_t>(0, v.outstanding(m)));
    const double c = (lat == 0 && pending > 0) ? kPenalty + pending : lat * (pending + 1);
    return c / v.weight(m);
  };
  return {cost(b) < cost(a) ? b : a, kNoMember};
}

Selection TopologyScorePolicy::Select(const Event&, const SelectionView& v) {
  const std::uint32_t n = v.size();
  std::uint32_t best = kNoMember;
  double best_cost = 0;
  const std::uint32_t start = start_++ % n;
  for (std::uint32_t k = 0; k < n; ++k) {
    const std::uint32_t m = (start + k) % n;
    const double w = v.weight(m);
    if (w <= 0) continue;
    const auto pending = static_cast<double>(std::max<std::int64_t>(0, v.outstanding(m)));
    const double c = (v.score(m) + 0.01) * (pending + 1) / w;
    if (best == kNoMember || c < best_cost) {
      best = m;
      best_cost = c;
    }
  }
  return {best, kNoMember};
}

// ---------------------------------------------------------------------------------
// HashKey

HashKey HashKey::SeqId() { return HashKey(Kind::kSeqId, ""); }
HashKey HashKey::Tenant() { return HashKey(Kind::kTenant, ""); }

absl::StatusOr<HashKey> HashKey::Header(std::string name) {
  if (name.empty()) return absl::InvalidArgumentError("hash key header name '' is empty");
  return HashKey(Kind::kHeader, std::move(name));
}

absl::StatusOr<HashKey> HashKey::JsonPointer(std::string pointer) {
  if (absl::Status st = predicate_internal::ValidateJsonPointer(pointer); !st.ok()) {
    return absl::InvalidArgumentError("hash key: " + std::string(st.message()));
  }
  return HashKey(Kind::kJsonPointer, std::move(pointer));
}

bool HashKey::Extract(const Event& e, std::string* out) const {
  switch (kind_) {
    case Kind::kSeqId:
      if (e.seq_id.empty()) return false;
      out->assign(e.seq_id);
      return true;
    case Kind::kTenant:
      if (e.tenant.empty()) return false;
      out->assign(e.tenant);
      return true;
    case Kind::kHeader: {
      const auto v = e.headers.Get(arg_);
      if (!v) return false;
      out->assign(v->data(), v->size());
      return true;
    }
    case Kind::kJsonPointer: {
      std::optional<std::string> text = predicate_internal::JsonPointerText(
          std::string_view(reinterpret_cast<const char*>(e.payload.data()), e.payload.size()), arg_);
      if (!text) return false;
      *out = *std::move(text);
      return true;
    }
  }
  return false;
}

std::string HashKey::DebugString() const {
  switch (kind_) {
    case Kind::kSeqId: return "seq_id";
    case Kind::kTenant: return "tenant";
    case Kind::kHeader: return "header:" + arg_;
    case Kind::kJsonPointer: return "json:" + arg_;
  }
  return "?";
}

// ---------------------------------------------------------------------------------
// ConsistentHashPolicy

absl::StatusOr<std::unique_ptr<ConsistentHashPolicy>> ConsistentHashPolicy::Create(
    HashKey key, std::uint32_t members, std::uint32_t virtual_nodes) {
  if (members == 0 || members > 4096) {
    return absl::InvalidArgumentError("consistent hash members " + std::to_string(members) +
                                      " is outside 1..4096");
  }
  if (virtual_nodes == 0 || virtual_nodes > 10000) {
    return absl::InvalidArgumentError("consistent hash virtual_nodes " +
                                      std::to_string(virtual_nodes) + " is outside 1..10000");
  }
  return std::unique_ptr<ConsistentHashPolicy>(
      new ConsistentHashPolicy(std::move(key), members, virtual_nodes));
}

ConsistentHashPolicy::ConsistentHashPolicy(HashKey key, std::uint32_t members,
                                           std::uint32_t vnodes)
    : key_(std::move(key)), members_(members) {
  ring_.reserve(static_cast<std::size_t>(members) * vnodes);
  for (std::uint32_t m = 0; m < members; ++m) {
    for (std::uint32_t v = 0; v < vnodes; ++v) {
      // A point depends only on (member, vnode): adding member N leaves every other
      // member's points where they were, which is what bounds the movement to ~1/N.
      const std::uint64_t id = (static_cast<std::uint64_t>(m) << 32) | v;
      ring_.emplace_back(XXH3_64bits(&id, sizeof id), m);
    }
  }
  std::sort(ring_.begin(), ring_.end());
}

std::uint32_t ConsistentHashPolicy::Walk(std::uint64_t h, const SelectionView* view) const {
  auto it = std::lower_bound(ring_.begin(), ring_.end(),
                             std::pair<std::uint64_t, std::uint32_t>{h, 0});
  for (std::size_t k = 0; k < ring_.size(); ++k, ++it) {
    if (it == ring_.end()) it = ring_.begin();
    if (view == nullptr || view->eligible(it->second)) return it->second;
  }
  return kNoMember;
}

absl::Status ConsistentHashPolicy::CheckGroupSize(std::uint32_t members) const {
  if (members == members_) return absl::OkStatus();
  return absl::InvalidArgumentError("consistent hash policy built for " + std::to_string(members_) +
                                    " members cannot serve a group of " + std::to_string(members));
}

std::uint32_t ConsistentHashPolicy::Owner(std::string_view key_bytes) const {
  return Walk(XXH3_64bits(key_bytes.data(), key_bytes.size()), nullptr);
}

Selection ConsistentHashPolicy::Select(const Event& event, const SelectionView& v) {
  if (v.size() != members_) return {};  // misconfigured: the group picks at random
  if (!key_.Extract(event, &scratch_)) {
    ++keyless_;
    for (std::uint32_t k = 0; k < members_; ++k) {
      const auto m = static_cast<std::uint32_t>(next_++ % members_);
      if (v.eligible(m)) return {m, kNoMember};
    }
    return {};
  }
  return {Walk(XXH3_64bits(scratch_.data(), scratch_.size()), &v), kNoMember};
}

// ---------------------------------------------------------------------------------
// WeightedShadowPolicy

absl::StatusOr<std::unique_ptr<WeightedShadowPolicy>> WeightedShadowPolicy::Create(
    std::uint32_t members, WeightedShadowOptions o) {
  if (o.weights.size() != members) {
    return absl::InvalidArgumentError("weighted shadow: weights has " +
                                      std::to_string(o.weights.size()) + " entries for " +
                                      std::to_string(members) + " members");
  }
  std::vector<bool> shadow(members, false);
  for (std::uint32_t s : o.shadows) {
    if (s >= members) {
      return absl::InvalidArgumentError("weighted shadow: shadow member " + std::to_string(s) +
                                        " is out of range (group of " + std::to_string(members) +
                                        ")");
    }
    if (shadow[s]) {
      return absl::InvalidArgumentError("weighted shadow: shadow member " + std::to_string(s) +
                                        " is listed twice");
    }
    shadow[s] = true;
  }
  bool any_primary = false;
  for (std::uint32_t i = 0; i < members; ++i) {
    const double w = o.weights[i];
    if (!std::isfinite(w) || w < 0) {
      return absl::InvalidArgumentError("weighted shadow: weights[" + std::to_string(i) + "] " +
                                        Num(w) + " must be finite and >= 0");
    }
    if (!shadow[i] && w > 0) any_primary = true;
  }
  if (!any_primary) {
    return absl::InvalidArgumentError(
        "weighted shadow: no primary (non-shadow) member has a positive weight");
  }
  double sum = 0;
  for (double w : o.weights) sum += w;
  if (!std::isfinite(sum)) {
    return absl::InvalidArgumentError("weighted shadow: the weights sum to " + Num(sum) +
                                      "; their sum must be finite");
  }
  if (!(o.mirror_fraction >= 0 && o.mirror_fraction <= 1)) {
    return absl::InvalidArgumentError("weighted shadow: mirror_fraction " +
                                      Num(o.mirror_fraction) + " is outside [0, 1]");
  }
  auto p = std::unique_ptr<WeightedShadowPolicy>(new WeightedShadowPolicy(std::move(o)));
  p->is_shadow_ = std::move(shadow);
  return p;
}

WeightedShadowPolicy::WeightedShadowPolicy(WeightedShadowOptions o) : options_(std::move(o)) {}

absl::Status WeightedShadowPolicy::CheckGroupSize(std::uint32_t members) const {
  if (members == options_.weights.size()) return absl::OkStatus();
  return absl::InvalidArgumentError("weighted shadow policy built for " +
                                    std::to_string(options_.weights.size()) +
                                    " members cannot serve a group of " + std::to_string(members));
}

Selection WeightedShadowPolicy::Select(const Event&, const SelectionView& v) {
  const std::uint32_t n = v.size();
  if (n != options_.weights.size()) return {};
  auto uniform = [&] { return static_cast<double>(v.Random(1u << 30)) / static_cast<double>(1u << 30); };
  double total = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (!is_shadow_[i]) total += options_.weights[i] * v.weight(i);
  }
  Selection s;
  if (total > 0) {
    double x = uniform() * total;
    for (std::uint32_t i = 0; i < n; ++i) {
      if (is_shadow_[i]) continue;
      const double w = options_.weights[i] * v.weight(i);
      if (w <= 0) continue;
      s.member = i;
      if (x < w) break;
      x -= w;
    }
  } else {
    // Every weighted primary is ejected: any eligible primary.
    for (std::uint32_t i = 0; i < n && s.member == kNoMember; ++i) {
      if (!is_shadow_[i] && v.eligible(i)) s.member = i;
    }
  }
  if (!options_.shadows.empty() && options_.mirror_fraction > 0 &&
      uniform() < options_.mirror_fraction) {
    const std::size_t k = options_.shadows.size();
    for (std::size_t t = 0; t < k; ++t) {
      const std::uint32_t m = options_.shadows[next_shadow_++ % k];
      if (v.eligible(m)) {
        s.mirror = m;
        break;
      }
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------
// AffinityPolicy

struct AffinityPolicy::Table {
  struct Entry {
    std::uint32_t member;
    std::uint64_t gen;
  };
  // Guards map, order and next_gen: Select runs under the engine's stream mutex,
  // Forget on any thread (a sequence ending on a replica). Uncontended but for a
  // Forget, it costs Select one lock and unlock.
  std::mutex mu;
  absl::flat_hash_map<std::string, Entry> map;
  std::deque<std::pair<std::string, std::uint64_t>> order;  // oldest first
  std::uint64_t next_gen = 1;
};

absl::StatusOr<std::unique_ptr<AffinityPolicy>> AffinityPolicy::Create(
    std::unique_ptr<SelectionPolicy> inner, HashKey key, std::size_t capacity) {
  if (inner == nullptr) return absl::InvalidArgumentError("affinity: inner policy is null");
  if (capacity == 0) return absl::InvalidArgumentError("affinity: capacity 0 is invalid (>= 1)");
  return std::unique_ptr<AffinityPolicy>(
      new AffinityPolicy(std::move(inner), std::move(key), capacity));
}

AffinityPolicy::AffinityPolicy(std::unique_ptr<SelectionPolicy> inner, HashKey key,
                               std::size_t capacity)
    : inner_(std::move(inner)), key_(std::move(key)), table_(std::make_unique<Table>()),
      capacity_(capacity) {}

AffinityPolicy::~AffinityPolicy() = default;

Selection AffinityPolicy::Select(const Event& event, const SelectionView& v) {
  if (!key_.Extract(event, &scratch_)) return inner_->Select(event, v);
  Table& t = *table_;
  std::lock_guard lock(t.mu);
  if (auto it = t.map.find(scratch_); it != t.map.end()) {
    if (it->second.member < v.size() && v.eligible(it->second.member)) {
      kept_.fetch_add(1, std::memory_order_relaxed);
      return {it->second.member, kNoMember};
    }
    Selection s = inner_->Select(event, v);
    if (s.member < v.size()) {
      it->second.member = s.member;
      moves_.fetch_add(1, std::memory_order_relaxed);
    }
    return s;
  }
  Selection s = inner_->Select(event, v);
  if (s.member >= v.size()) return s;
  while (t.map.size() >= capacity_ && !t.order.empty()) {
    auto& [k, gen] = t.order.front();
    if (auto it = t.map.find(k); it != t.map.end() && it->second.gen == gen) t.map.erase(it);
    t.order.pop_front();
  }
  const std::uint64_t gen = t.next_gen++;
  placed_.fetch_add(1, std::memory_order_relaxed);
  t.map.emplace(scratch_, Table::Entry{s.member, gen});
  t.order.emplace_back(scratch_, gen);
  return s;
}

std::vector<std::pair<std::string, std::uint64_t>> AffinityPolicy::Counts() const {
  return {{"affinity_kept", kept()}, {"affinity_moved", moves()}, {"affinity_new", placed()}};
}

bool AffinityPolicy::Forget(std::string_view key_bytes) {
  const std::string key(key_bytes);
  std::lock_guard lock(table_->mu);
  auto it = table_->map.find(key);
  if (it == table_->map.end()) return false;
  table_->map.erase(it);
  // Its entry in `order` is skipped when it reaches the front (generation mismatch).
  // A long-lived key at the front would keep every forgotten one behind it: when
  // stale entries outnumber live ones, drop them all (amortized O(1) per Forget).
  Table& t = *table_;
  if (t.order.size() > 2 * t.map.size() + 64) {
    std::deque<std::pair<std::string, std::uint64_t>> live;
    for (auto& [k, gen] : t.order) {
      if (auto e = t.map.find(k); e != t.map.end() && e->second.gen == gen) live.emplace_back(std::move(k), gen);
    }
    t.order.swap(live);
  }
  return true;
}

absl::StatusOr<std::unique_ptr<SelectionPolicy>> MakeSelectionPolicy(std::string_view name) {
  if (name == "round_robin") return std::make_unique<RoundRobinPolicy>();
  if (name == "least_loaded") return std::make_unique<LeastLoadedPolicy>();
  if (name == "peak_ewma") return std::make_unique<PeakEwmaPolicy>();
  if (name == "topology_score") return std::make_unique<TopologyScorePolicy>();
  return absl::InvalidArgumentError(
      "selection policy " + QuoteValue(name) +
      " is not one of round_robin, least_loaded, peak_ewma, topology_score");
}

}  // namespace inferq
