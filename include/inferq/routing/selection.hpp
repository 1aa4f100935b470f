/// @file inferq/routing/selection.hpp
///
/// Selection: which member (lane) of a consumer group serves an event.
/// A `MemberGroup` holds what is known about each member — queued and in-flight
/// work, ack latency, reported load, health — and runs outlier ejection for every
/// policy. A `SelectionPolicy` picks one member from the group's `SelectionView`,
/// which already accounts for health (weights, ejection, panic mode). Users may
/// implement their own policy; the library's are RoundRobinPolicy, LeastLoadedPolicy,
/// PeakEwmaPolicy, TopologyScorePolicy, ConsistentHashPolicy, WeightedShadowPolicy and
/// the AffinityPolicy decorator.
///
/// Usage:
/// @code
///   std::unique_ptr<inferq::MemberGroup> group =
///       inferq::MemberGroup::Create(4, {}, &clock).value();  // InvalidArgument: see Create
///   inferq::LeastLoadedPolicy policy;
///   inferq::Selection s = group->Select(policy, event);  // s.member in 0..3
///   group->OnQueued(s.member);
///   ...                                                   // the member works on it
///   group->OnDone(s.member, inferq::Outcome::kSuccess, latency_ns);
/// @endcode
///
/// Health (outlier ejection, after Envoy's outlier detection and Finagle's
/// failure accrual, shared by all policies):
///  - `consecutive_failures` failures in a row (a nak, an ack_wait expiry, work the
///    engine moved off the member when it stalled, or an ack latency above
///    `latency_factor` x the group's median ack latency and above `latency_floor`)
///    make a member *degraded*: weight `degraded_weight` (0.01).
///  - As many further failures in a row while degraded *eject* it: weight 0 for
///    base_ejection_time x (number of ejections), capped at max_ejection_time, plus
///    a random jitter of up to `ejection_jitter` of that time. `consecutive_failures`
///    successes in a row while degraded make it healthy again; a degraded member
///    that gets too little work to heal or fail becomes *recovering* after
///    base_ejection_time.
///  - The ejection cap is checked with the candidate counted: a member is ejected
///    only if (ejected + 1) * 100 <= max_ejected_percent * members and at least one
///    other member stays in, so a group is never emptied.
///  - An ejected member comes back *recovering*: its weight ramps linearly from
///    degraded_weight to 1 over `slow_start`, so traffic returns gradually.
///  - Panic mode (Envoy's panic threshold): when fewer than
///    panic_threshold_percent of the members are healthy (not degraded, ejected or
///    recovering), every member gets weight 1 and the selection is counted as a
///    panic: a group that is mostly sick spreads load instead of crushing the rest.
///
/// Thread safety: OnQueued, OnDone, ReportLoad and Stats may be called from any
/// thread at any time. Select must be called by one thread at a time per group (the
/// engine calls it under its consumer's own select lock: a publish takes that lock
/// inside the stream's mutex, a redelivery or a move off a stalled member takes only
/// that lock); a policy's Select is only ever called through MemberGroup::Select, so
/// policies need no locking of their own unless they are shared between groups (the
/// library's policies must not be).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/base/adaptive_mutex.hpp"
#include "inferq/base/cache_line.hpp"
#include "inferq/base/clock.hpp"
#include "inferq/base/owned_stats.hpp"
#include "inferq/event/event.hpp"

namespace inferq {

/// No member: a Selection without a member or mirror, or nothing to avoid.
inline constexpr std::uint32_t kNoMember = UINT32_MAX;

/// The result of a selection: the member that serves the event and, for
/// WeightedShadowPolicy, a shadow member that receives a mirrored copy whose ack
/// and result do not count for the primary.
struct Selection {
  std::uint32_t member = kNoMember;  ///< the member that serves the event
  std::uint32_t mirror = kNoMember;  ///< the shadow that gets a mirrored copy; kNoMember: none
};

/// How one unit of work a member was given ended.
enum class Outcome : std::uint8_t {
  kSuccess,  ///< acked: counts for health, latency feeds the EWMAs
  /// nak, ack_wait expiry, error; in the engine also each item moved off a stalled
  /// member: counts against health
  kFailure,
  /// left without a verdict: no health effect. In the engine: a Term, a message the
  /// stream discarded or that expired in the queue, a delivery dropped (drop-oldest,
  /// a lane found full) or superseded by another delivery's ack, a shadow copy taken
  /// off a stalled member
  kDropped,
};

/// Load a member reports about itself (TopologyScorePolicy's inputs). Units: qps in
/// requests/s served (higher is better), rt_ms its response time in ms, hop its
/// topology distance to the producers (0 = same NUMA node, 1 = other socket, 2 =
/// other machine; any non-negative scale), cpu its utilisation in [0, 1].
struct MemberLoadReport {
  double qps = 0;    ///< requests/s served (higher is better)
  double rt_ms = 0;  ///< response time, ms
  double hop = 0;    ///< topology distance to the producers (0 = same NUMA node)
  double cpu = 0;    ///< utilisation, in [0, 1]
};

/// Outlier ejection of a MemberGroup (see Health in the file comment).
/// Every duration below is at most 365 days (Validate).
struct OutlierOptions {
  bool enabled = true;  ///< false: no member is degraded or ejected, and no panic mode
  std::uint32_t consecutive_failures = 5;  ///< >= 1
  double degraded_weight = 0.01;           ///< (0, 1)
  double latency_factor = 5.0;             ///< >= 1; 0 disables the latency check
  absl::Duration latency_floor = absl::Milliseconds(1);  ///< a slow ack fails only above this too
  absl::Duration base_ejection_time = absl::Seconds(1);  ///< more than 0
  absl::Duration max_ejection_time = absl::Seconds(30);  ///< >= base
  double ejection_jitter = 0.1;            ///< [0, 1]
  std::uint32_t max_ejected_percent = 50;  ///< 0..100
  std::uint32_t panic_threshold_percent = 50;  ///< 0..100; 0 disables panic mode
  absl::Duration slow_start = absl::Seconds(1);  ///< >= 0
};

/// A MemberGroup's health and scoring settings.
struct GroupOptions {
  OutlierOptions outlier{};  ///< outlier ejection (health)
  /// TopologyScore: EWMA weight of a new sample (s = a*x + (1-a)*s), in (0, 1].
  double ewma_alpha = 0.85;
  /// TopologyScore: how often member metrics are smoothed and scores recomputed.
  absl::Duration refresh_interval = absl::Milliseconds(500);
  /// PeakEwma: decay time of the latency average (Finagle's default is 10 s).
  absl::Duration peak_ewma_decay = absl::Seconds(10);
  std::uint64_t seed = 0x9E3779B97F4A7C15ULL;  ///< for P2C sampling and jitter
};

/// A member's health (see Health in the file comment).
enum class MemberHealth : std::uint8_t { kHealthy, kDegraded, kEjected, kRecovering };
/// "healthy", "degraded", "ejected" or "recovering".
std::string_view MemberHealthName(MemberHealth h);

/// One member in a GroupSnapshot.
struct MemberSnapshot {
  std::uint32_t index = 0;        ///< the member's index in its group
  MemberHealth health = MemberHealth::kHealthy;  ///< health as of the snapshot
  double weight = 1;              ///< 0 ejected .. 1
  std::int64_t outstanding = 0;   ///< queued + in flight
  std::uint64_t successes = 0;    ///< units of work that ended kSuccess
  std::uint64_t failures = 0;     ///< units that ended kFailure, slow acks included
  std::uint32_t ejections = 0;    ///< times ejected so far
  double peak_ewma_ms = 0;        ///< PeakEwma latency estimate
  double score = 0;               ///< TopologyScore (lower is better)
};

/// A MemberGroup's members and counters (MemberGroup::Stats).
struct GroupSnapshot {
  std::vector<MemberSnapshot> members;  ///< by index
  std::uint64_t selections = 0;    ///< Select calls
  std::uint64_t panics = 0;        ///< selections made in panic mode
  std::uint64_t degradations = 0;  ///< healthy -> degraded transitions
  std::uint64_t ejections = 0;     ///< degraded -> ejected transitions
  std::uint64_t ejections_refused = 0;  ///< ejections the cap refused
};

/// What a policy sees when it selects: the members with health already applied.
/// Valid only during one MemberGroup::Select call.
class SelectionView {
 public:
  /// Number of members.
  std::uint32_t size() const { return size_; }
  /// The time of this selection, in ns of the group's Clock.
  std::int64_t now_ns() const { return now_ns_; }
  /// True when every member has weight 1 (no member sick, or panic mode).
  bool all_healthy() const { return all_healthy_; }
  /// True in panic mode (see Health in the file comment).
  bool panic() const { return panic_; }
  /// 0 (ejected) .. 1; 1 for every member in panic mode.
  double weight(std::uint32_t m) const { return all_healthy_ ? 1.0 : weights_[m]; }
  /// True when member m may be picked: weight(m) > 0.
  bool eligible(std::uint32_t m) const { return weight(m) > 0; }
  /// Queued + in-flight units of member m.
  std::int64_t outstanding(std::uint32_t m) const;
  /// Finagle peak-EWMA latency estimate of member m, ns (0 before any ack).
  double peak_ewma_ns(std::uint32_t m) const;
  /// TopologyScore of member m as of the last refresh (lower is better).
  double score(std::uint32_t m) const;
  /// A uniformly random integer in [0, n), n > 0 (xorshift; one per group).
  std::uint32_t Random(std::uint32_t n) const;
  /// A random eligible member chosen with probability proportional to weight;
  /// kNoMember when none is eligible (cannot happen: the group is never emptied).
  std::uint32_t RandomByWeight() const;

 private:
  friend class MemberGroup;
  const class MemberGroup* group_ = nullptr;
  const double* weights_ = nullptr;
  std::uint32_t size_ = 0;
  std::int64_t now_ns_ = 0;
  bool all_healthy_ = true;
  bool panic_ = false;
};

/// A member-selection policy. Implement Select; it must return a member index
/// below view.size() (MemberGroup::Select replaces an out-of-range answer by a
/// random eligible member and counts nothing else about it).
class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  /// The policy's name, e.g. "round_robin" (in statistics).
  virtual std::string_view name() const = 0;
  /// The member for `event` (and a mirror, for a policy that mirrors). Called only
  /// through MemberGroup::Select, one thread at a time.
  virtual Selection Select(const Event& event, const SelectionView& view) = 0;
  /// InvalidArgument when the policy cannot serve a group of `members` (a policy
  /// built for a fixed size); the engine checks it in AddConsumer.
  virtual absl::Status CheckGroupSize(std::uint32_t /*members*/) const { return absl::OkStatus(); }
  /// False for a member that takes only mirrored copies (WeightedShadowPolicy's
  /// shadows): when the engine places a message past the policy's pick (a
  /// redelivery or a move whose pick is full or ejected), it never puts one there.
  /// Constant for the policy's life; called from any thread without the policy's lock.
  virtual bool ServesPrimary(std::uint32_t /*member*/) const { return true; }
  /// The policy's own monotonic counts, by name (e.g. AffinityPolicy's "affinity_kept"),
  /// for statistics (ConsumerStats::policy_counts); empty by default. Called from any
  /// thread, also while the engine calls Select: read atomics.
  virtual std::vector<std::pair<std::string, std::uint64_t>> Counts() const { return {}; }
};

/// What is known about each member of a consumer group, and selection through a
/// SelectionPolicy (see the file comment).
class MemberGroup {
 public:
  /// InvalidArgument (naming the field and value) for members == 0 or > 4096 or an
  /// option out of its range; see Validate.
  static absl::StatusOr<std::unique_ptr<MemberGroup>> Create(std::uint32_t members,
                                                             GroupOptions options = {},
                                                             const Clock* clock = nullptr);
  /// The checks of Create, without making a group.
  static absl::Status Validate(std::uint32_t members, const GroupOptions& options);
  ~MemberGroup();
  MemberGroup(const MemberGroup&) = delete;
  MemberGroup& operator=(const MemberGroup&) = delete;

  /// Number of members.
  std::uint32_t size() const { return size_; }
  /// The options the group was made with.
  const GroupOptions& options() const { return options_; }
  /// The clock the group reads (Create's, or SteadyClock's default).
  const Clock& clock() const { return *clock_; }

  /// Selects a member for `event` through `policy` (one thread at a time).
  Selection Select(SelectionPolicy& policy, const Event& event) {
    return Select(policy, event, clock_->NowNanos());
  }
  /// The same at `now_ns`, a reading of clock() the caller already took (the engine
  /// reads its clock once per publish).
  Selection Select(SelectionPolicy& policy, const Event& event, std::int64_t now_ns) {
    return Select(policy, event, now_ns, kNoMember);
  }
  /// The same with member `avoid` shown to the policy as ineligible (weight 0) while
  /// another member is eligible, and asked again with it eligible when the policy
  /// then picks none (the one primary of a WeightedShadowPolicy, say): a retry of
  /// work that failed on `avoid` (Envoy's previous_hosts retry predicate). A stateful
  /// policy re-places the event's key, as it does for an ejected member
  /// (AffinityPolicy moves the key, so that the rest of its sequence follows).
  /// kNoMember, or an index >= size(), avoids nothing.
  Selection Select(SelectionPolicy& policy, const Event& event, std::int64_t now_ns,
                   std::uint32_t avoid);

  /// One more unit of work was queued for member m.
  void OnQueued(std::uint32_t m) {
    // relaxed: a count; Outstanding's acquire load of `done` orders what it needs.
    members_[m].queued.Add(1);
  }
  /// A unit of work of member m ended; `latency_ns` is its delivery-to-ack time
  /// (ignored unless kSuccess). Updates health and the latency estimates.
  void OnDone(std::uint32_t m, Outcome outcome, std::int64_t latency_ns) {
    if (outcome == Outcome::kDropped) {
      OnDone(m, outcome, latency_ns, 0);  // no time needed
    } else {
      OnDone(m, outcome, latency_ns, clock_->NowNanos());
    }
  }
  /// The same at `now_ns`, a reading of clock() the caller already took.
  void OnDone(std::uint32_t m, Outcome outcome, std::int64_t latency_ns, std::int64_t now_ns);
  /// latencies_ns.size() units of member m ended in success at `now_ns` (a reading
  /// of clock()), with these delivery-to-ack times: the same as one OnDone(m,
  /// kSuccess, latency, now_ns) each, in order, with the member's lock taken once.
  void OnDoneMany(std::uint32_t m, std::span<const std::int64_t> latencies_ns, std::int64_t now_ns);
  /// Reported load for TopologyScorePolicy. InvalidArgument for m out of range or a
  /// negative / non-finite value, or cpu above 1.
  absl::Status ReportLoad(std::uint32_t m, const MemberLoadReport& report);

  /// A snapshot of the members and counters.
  GroupSnapshot Stats() const;
  /// Health of member m now (time-driven transitions applied as of now).
  MemberHealth Health(std::uint32_t m) const;

 private:
  friend class SelectionView;
  MemberSnapshot SnapshotOf(std::uint32_t m, std::int64_t now) const;

  /// A member's outstanding work (queued + in flight) is counted per side and read as
  /// a difference (Outstanding), so that the thread queuing work (OnQueued: in the
  /// engine, the publisher) and the one finishing it (OnDone: the member that acks,
  /// on another core) do not write one cache line per unit of work:
  ///  1. `queued` only grows, in OnQueued; `done` only grows, in OnDone, and has a
  ///     cache line of its own (with the rest OnDone writes).
  ///  2. Outstanding = queued - done. A caller that counts a unit before handing it
  ///     out (the engine does, before the push) has its OnQueued ordered before the
  ///     OnDone of that unit; Outstanding loads `done` first (acquire, pairing with
  ///     OnDone's release), so it never counts the end of a unit whose start it
  ///     missed.
  ///  3. Each is an OwnedCounter (base/owned_stats.hpp): the thread that writes one
  ///     first (the publisher, the member's thread) adds without a locked
  ///     instruction; an acquire Load pairs with the release Add of either part.
  struct alignas(kCacheLineSize) Member {
    OwnedCounter queued;
    alignas(kCacheLineSize) OwnedCounter done;
    std::atomic<double> peak_ewma_ns{0};
    std::atomic<double> score{0};
    AdaptiveMutex mu;  // guards the rest (short sections: OnDone runs on every ack)
    MemberHealth health = MemberHealth::kHealthy;
    std::uint32_t consecutive_failures = 0;
    std::uint32_t consecutive_successes = 0;
    std::uint32_t ejections = 0;
    std::int64_t eject_until_ns = 0;
    std::int64_t degraded_until_ns = 0;
    std::int64_t recover_until_ns = 0;
    std::int64_t last_ack_ns = 0;      // for the peak-EWMA decay
    std::int64_t healthy_since_ns = 0;  // when it last became healthy
    std::int64_t healthy_span_ns = 0;   // how long it stayed healthy before its last degrade
    std::uint64_t successes = 0;
    std::uint64_t failures = 0;
    // TopologyScore inputs: reported (if any) and measured in the current window.
    bool reported = false;
    std::int64_t report_ns = 0;  // when it last reported
    bool report_fresh = false;   // as of the last refresh
    MemberLoadReport report{};
    std::uint64_t window_acks = 0;
    double window_latency_ms_sum = 0;
    MemberLoadReport smoothed{};
    bool smoothed_init = false;
    double ack_latency_ewma_ms = 0;  // for the latency-outlier check
  };

  MemberGroup(std::uint32_t members, GroupOptions options, const Clock* clock);
  /// Member m's queued + in-flight units (invariant 2 of Member).
  std::int64_t Outstanding(std::uint32_t m) const {
    const Member& mem = members_[m];
    const std::int64_t done = mem.done.Load(std::memory_order_acquire);
    return mem.queued.Load() - done;
  }
  void Failure(Member& mem, std::uint32_t index, std::int64_t now);  ///< requires mem.mu
  /// OnDone's kSuccess, after `done` was counted. Requires mem.mu.
  void Success(Member& mem, std::uint32_t m, std::int64_t latency_ns, std::int64_t now);
  void RecomputeWeights(std::int64_t now);  ///< Select's thread
  void Refresh(std::int64_t now);           ///< Select's thread
  std::uint64_t NextRandom() const;

  const std::uint32_t size_;
  const GroupOptions options_;
  const Clock* clock_;
  std::unique_ptr<Member[]> members_;
  /// From options_, converted once (OnDone runs on every ack).
  const double peak_ewma_decay_ns_;
  const double latency_floor_ms_;

  /// Select's thread only.
  std::vector<double> weights_;
  bool all_healthy_ = true;
  bool panic_ = false;
  std::int64_t next_refresh_ns_ = 0;
  std::int64_t next_transition_ns_ = INT64_MAX;  ///< earliest time-driven weight change
  std::uint64_t seen_epoch_ = 0;
  bool weights_valid_ = false;  ///< weights_ reflect seen_epoch_
  std::uint64_t window_start_ns_ = 0;
  std::vector<double> scratch_;
  std::vector<double> avoid_weights_;  ///< weights_ with the avoided member at 0
  mutable std::uint64_t rng_;

  /// Any thread.
  std::atomic<std::uint64_t> health_epoch_{0};  ///< bumped on every health transition
  std::atomic<std::uint32_t> sick_{0};          ///< members not healthy
  std::atomic<std::uint32_t> ejected_{0};       ///< members ejected now
  std::atomic<double> median_latency_ms_{0};    ///< group's median ack latency EWMA
  std::mutex eject_mu_;                         ///< serializes ejection decisions
  std::atomic<std::uint64_t> selections_{0}, panics_{0}, degradations_{0}, ejections_{0},
      ejections_refused_{0};
};

// ---------------------------------------------------------------------------------
// Policies. Each instance serves one MemberGroup.

/// Smooth weighted round robin (nginx's algorithm) over eligible members; plain
/// round robin while every member is healthy.
class RoundRobinPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }
  Selection Select(const Event& event, const SelectionView& view) override;

 private:
  std::uint64_t next_ = 0;
  std::vector<double> current_;  ///< SWRR state
};

/// Power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized Load
/// Balancing", 2001): two random eligible members, the one with the lower
/// (outstanding + 1) / weight wins (outstanding = queued + in flight).
class LeastLoadedPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "least_loaded"; }
  Selection Select(const Event& event, const SelectionView& view) override;
};

/// Finagle's peak EWMA (com.twitter.finagle.loadbalancer.PeakEwma): cost =
/// latency_estimate x (outstanding + 1) / weight, lowest of two random eligible
/// members. The estimate jumps to any higher observed latency (peak) and decays
/// towards lower ones with time constant GroupOptions::peak_ewma_decay (applied when
/// an ack arrives). As in Finagle, a member without any latency yet costs 0 while
/// idle (so it is tried) and a large penalty once work is pending on it (so it is
/// not flooded before it answers).
class PeakEwmaPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "peak_ewma"; }
  Selection Select(const Event& event, const SelectionView& view) override;
};

/// Topology score: score = 0.4*qps^-1 + 0.3*rt + 0.2*hop + 0.1*cpu,
/// each term normalised by its maximum over the group (so in [0, 1]) after each
/// metric is smoothed by an EWMA (alpha GroupOptions::ewma_alpha = 0.85), refreshed
/// every GroupOptions::refresh_interval (500 ms). Metrics come from ReportLoad, or,
/// for a member that never reported, from the engine's measurements: qps = acks per
/// second in the last window (a measured qps of 0 gives the qps term 0 when the member
/// has no work outstanding — unknown, not slow — and the worst term, 1, when work
/// waits on it; a reported 0 gives 1), rt = mean ack latency in the window,
/// hop = 0, cpu = outstanding / max outstanding in the group. A member with nothing
/// known yet (no report, no ack) gets the mean score of the members that have data.
/// A report older than two refresh intervals is ignored: a member that stopped
/// reporting (crashed) is judged by what the engine measures. Lowest score wins; to avoid sending
/// a whole refresh interval of work to one member, the pick uses (score + 0.01) x
/// (outstanding + 1) / weight, Finagle's pending multiplier — with equal load it is
/// exactly lowest-score-wins.
class TopologyScorePolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "topology_score"; }
  Selection Select(const Event& event, const SelectionView& view) override;

 private:
  std::uint32_t start_ = 0;  ///< rotates the tie-break
};

/// What an affinity policy hashes: an event attribute, a header or a JSON value.
class HashKey {
 public:
  /// Event::seq_id.
  static HashKey SeqId();
  /// Event::tenant.
  static HashKey Tenant();
  /// InvalidArgument for an empty name.
  static absl::StatusOr<HashKey> Header(std::string name);
  /// RFC 6901 JSON Pointer into a JSON payload, read as Predicate reads payloads: a
  /// string value hashes its text, any other value its JSON serialization (1.50 and
  /// 1.5 are one key). A payload nested deeper than Predicate::kMaxJsonDepth levels
  /// has no key. InvalidArgument (naming the pointer) for a malformed pointer.
  static absl::StatusOr<HashKey> JsonPointer(std::string pointer);

  /// The key bytes of `e` into *out; false when the event has no such key (empty
  /// seq_id/tenant, missing header, non-JSON payload or missing pointer target).
  bool Extract(const Event& e, std::string* out) const;
  /// "seq_id", "tenant", "header:<name>" or "json:<pointer>".
  std::string DebugString() const;

 private:
  enum class Kind : std::uint8_t { kSeqId, kTenant, kHeader, kJsonPointer };
  HashKey(Kind k, std::string arg) : kind_(k), arg_(std::move(arg)) {}
  Kind kind_;
  std::string arg_;
};

/// Consistent hashing on a ring with `virtual_nodes` points per member (Karger et
/// al., 1997; Ketama's layout), XXH3 hashes. A key goes to the first eligible member
/// clockwise from its hash, so one generation (seq_id) or one session stays on one
/// replica and its KV cache; when a member joins or leaves only the keys of its arcs
/// move (about 1/N). Events without the key go round robin. Health: ejected members
/// are skipped (their keys move to the next point); degraded ones keep their keys.
class ConsistentHashPolicy final : public SelectionPolicy {
 public:
  /// InvalidArgument for members == 0 or virtual_nodes == 0 or > 10000.
  static absl::StatusOr<std::unique_ptr<ConsistentHashPolicy>> Create(
      HashKey key, std::uint32_t members, std::uint32_t virtual_nodes = 160);
  std::string_view name() const override { return "consistent_hash"; }
  Selection Select(const Event& event, const SelectionView& view) override;
  absl::Status CheckGroupSize(std::uint32_t members) const override;
  /// The member the ring gives `key_bytes` when every member is eligible.
  std::uint32_t Owner(std::string_view key_bytes) const;
  /// Events without the key (placed round robin) so far; Select's thread.
  std::uint64_t keyless() const { return keyless_; }

 private:
  ConsistentHashPolicy(HashKey key, std::uint32_t members, std::uint32_t vnodes);
  std::uint32_t Walk(std::uint64_t h, const SelectionView* view) const;
  HashKey key_;
  std::uint32_t members_;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> ring_;  ///< (point, member), sorted
  std::string scratch_;
  std::uint64_t next_ = 0;
  std::uint64_t keyless_ = 0;
};

/// The settings of a WeightedShadowPolicy.
struct WeightedShadowOptions {
  std::vector<double> weights{};       ///< one per member, >= 0, some primary > 0
  std::vector<std::uint32_t> shadows{};  ///< member indices, distinct
  double mirror_fraction = 0;          ///< [0, 1]
};
/// Weighted split with shadow mirroring: the primary member is drawn among members
/// with a positive weight in `weights` (probability weight x health weight); with
/// probability `mirror_fraction` the event is also mirrored to one of the `shadows`
/// (round robin among eligible shadows). Shadow members never serve as primary.
class WeightedShadowPolicy final : public SelectionPolicy {
 public:
  /// InvalidArgument when weights has not `members` entries, a weight is negative
  /// or not finite, the weights do not sum to a finite number, no non-shadow member
  /// has a positive weight, a shadow index is out of range or repeated, or
  /// mirror_fraction is outside [0, 1].
  static absl::StatusOr<std::unique_ptr<WeightedShadowPolicy>> Create(
      std::uint32_t members, WeightedShadowOptions options);
  std::string_view name() const override { return "weighted_shadow"; }
  Selection Select(const Event& event, const SelectionView& view) override;
  absl::Status CheckGroupSize(std::uint32_t members) const override;
  bool ServesPrimary(std::uint32_t member) const override {
    return member >= is_shadow_.size() || !is_shadow_[member];
  }
  /// The options it was created with.
  const WeightedShadowOptions& options() const { return options_; }

 private:
  explicit WeightedShadowPolicy(WeightedShadowOptions o);
  WeightedShadowOptions options_;
  std::vector<bool> is_shadow_;
  std::uint64_t next_shadow_ = 0;
};

/// Session affinity on top of any policy: the first event with a given key is placed
/// by `inner`; later events with the same key go to the same member while it is
/// eligible (weight > 0), and are placed anew (and remembered) when it is not. The
/// table holds at most `capacity` keys; when full, the least recently placed key is
/// forgotten. Events without the key are placed by `inner`. Use it for decode steps:
/// the sequence stays with the replica that holds its KV cache.
class AffinityPolicy final : public SelectionPolicy {
 public:
  /// InvalidArgument for a null inner policy or capacity 0.
  static absl::StatusOr<std::unique_ptr<AffinityPolicy>> Create(
      std::unique_ptr<SelectionPolicy> inner, HashKey key, std::size_t capacity = 65536);
  ~AffinityPolicy() override;
  std::string_view name() const override { return "affinity"; }
  Selection Select(const Event& event, const SelectionView& view) override;
  absl::Status CheckGroupSize(std::uint32_t members) const override {
    return inner_->CheckGroupSize(members);
  }
  bool ServesPrimary(std::uint32_t member) const override { return inner_->ServesPrimary(member); }
  /// Forgets `key_bytes` (e.g. when its sequence ends). True when it was known.
  /// Safe from any thread, also while the engine calls Select (the key table has
  /// its own mutex).
  bool Forget(std::string_view key_bytes);
  /// Keys re-placed because their member left; any thread.
  std::uint64_t moves() const { return moves_.load(std::memory_order_relaxed); }
  /// Keyed events placed on the member their key was on (its KV cache kept: a cache
  /// hit), and keys placed for the first time; any thread. kept / (kept + moves) is
  /// the share of a sequence's later steps that found their cache.
  ///@{
  std::uint64_t kept() const { return kept_.load(std::memory_order_relaxed); }
  std::uint64_t placed() const { return placed_.load(std::memory_order_relaxed); }
  ///@}
  /// {"affinity_kept", kept()}, {"affinity_moved", moves()}, {"affinity_new", placed()}.
  std::vector<std::pair<std::string, std::uint64_t>> Counts() const override;

 private:
  struct Table;
  AffinityPolicy(std::unique_ptr<SelectionPolicy> inner, HashKey key, std::size_t capacity);
  std::unique_ptr<SelectionPolicy> inner_;
  HashKey key_;
  std::unique_ptr<Table> table_;
  std::size_t capacity_;
  std::string scratch_;  ///< Select's only (one thread at a time, as for every policy)
  std::atomic<std::uint64_t> moves_{0};
  std::atomic<std::uint64_t> kept_{0};
  std::atomic<std::uint64_t> placed_{0};
};

/// The policy named `name` ("round_robin", "least_loaded", "peak_ewma",
/// "topology_score") with default settings; InvalidArgument naming an unknown name
/// (the hash, shadow and affinity policies need settings: use their Create).
absl::StatusOr<std::unique_ptr<SelectionPolicy>> MakeSelectionPolicy(std::string_view name);

}  // namespace inferq
