/// @file inferq/sched/qos_scheduler.hpp
///
/// QosScheduler<T>: the order in which one lane serves queued items of three QoS
/// tiers (gold, silver, bronze) and many tenants. Each tier has an
/// assured share of the lane's service while it is backlogged and a weight for the
/// rest; inside a tier, tenants share by deficit round robin; inside a tenant, items
/// leave FIFO (or by priority when preemption is on). Bounded: at most `capacity`
/// items.
///
/// Usage:
/// @code
///   inferq::QosConfig config;                            // gold 20 %, silver 10 %, bronze 5 %
///   auto sched = inferq::QosScheduler<Request>::Create(config);  // StatusOr<unique_ptr<..>>
///   std::optional<Request> evicted;
///   switch ((*sched)->Push(std::move(req), inferq::QosKey::Of(event), evicted)) { ... }
///   while (std::optional<Request> next = (*sched)->Pop()) serve(*next);
/// @endcode
///
/// Service is counted in cost units (QosKey::cost, e.g. 1 per request or its
/// token count); shares below are shares of cost served.
///
/// Pick rule (Pop), in this order:
///  1. Assured shares. Over the last `service_window` picks, tier t received c_t of
///     the C cost units served. A backlogged tier with assured share A_t > 0 and
///     c_t / C < A_t is below its floor; if any is, the one with the smallest
///     c_t / A_t (the most below, relative to its floor) is served; ties go to the
///     better tier. (The window is a sliding window of picks, exact and
///     deterministic; an empty window (C = 0) puts no tier below its floor.)
///  2. Otherwise the backlogged tiers share by weight: stride scheduling (Waldspurger
///     and Weihl, "Stride Scheduling", MIT/LCS/TM-528, 1995) with start-time fair
///     queueing's virtual time for tiers that become backlogged (Goyal, Vin and
///     Cheng, SIGCOMM 1996). Each tier has a pass; the backlogged tier with the
///     lowest pass is served (ties to the better tier) and its pass grows by
///     cost / weight. A tier that becomes backlogged starts at max(its pass, v),
///     v = the pass the last weight-picked tier had when it was picked, so idle time
///     earns no credit. Floor picks (rule 1) advance the pass too: the floor is a
///     minimum inside the weighted share, not service on top of it.
///  Consequences: a backlogged tier never gets less than its assured share over a
///  window (within one item's cost); with the defaults the weights alone give gold
///  8/13, silver 4/13, bronze 1/13 of the service when all three are backlogged, above
///  every floor, so the floors matter when weights are skewed against a tier or when
///  a tier comes back from idle (it is then served first until it reaches its
///  floor in the window: at most about A_t x service_window picks in a row). Every
///  tier has a weight >= 1, so no backlogged tier is ever starved.
///  3. Inside the tier: deficit round robin between its backlogged tenants (Shreedhar
///     and Varghese, "Efficient Fair Queuing Using Deficit Round Robin", SIGCOMM
///     1995). A tenant whose turn comes adds quantum x its weight to its deficit and
///     serves head items while the deficit covers their cost, then the turn passes.
///     An emptied tenant's deficit resets to 0. Full rounds in which nobody can
///     serve (costs above quantum x weight) are skipped arithmetically, so a Pop is
///     O(tenants) in the worst case, not O(cost / quantum).
///
/// Preemption (QosConfig::preemption): inside a tenant, items leave in strict
/// `priority` order (higher first), FIFO among equal priorities; and a push into a
/// full scheduler (or a tier at its max_items) evicts the lowest-priority item of
/// the same tier (the most recently pushed among equals) if, and only if, the new
/// item's priority is strictly higher. Arrival time never decides an eviction: an equal priority never
/// evicts, however old the queued item. Without preemption priority is ignored and a
/// full scheduler refuses every push.
///
/// Costs: Push is O(1) plus a tenant lookup (one hash of the tenant name), and with
/// preemption O(queued items of that tenant with a lower priority) for the ordered
/// insert and O(backlogged tenants of the tier) for an eviction. Pop is O(1) amortised
/// for costs <= quantum x weight. Memory: the item slots (capacity of them) and the
/// share window are allocated by Create; a tenant's record and its per-tier queue
/// are allocated on its first push (or SetTenantWeight) and kept for the life of the
/// scheduler, so steady-state Push and Pop of known tenants do not allocate. Tenants
/// are never forgotten: a scheduler that sees unboundedly many tenant names grows.
///
/// Thread safety: none. One thread at a time (the engine holds the lane's mutex).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inferq/event/event.hpp"
#include "inferq/sched/internal/format.hpp"

namespace inferq {

inline constexpr std::size_t kQosTiers = 3;  ///< Qos::kGold, kSilver, kBronze

/// One tier's assured share, weight and bound (QosConfig::tiers).
struct QosTierConfig {
  /// Fraction of the lane's service (cost units) the tier gets at least while it is
  /// backlogged: [0, 1], resolution 1e-6; the three sum to at most 1.
  double assured_share = 0;
  /// Share of the rest, relative to the other backlogged tiers: 1..65536.
  std::uint32_t weight = 1;
  /// Items of this tier queued at most, 0..capacity; 0 means capacity. Bounding the
  /// lower tiers keeps room for the higher ones: without it a flood of bronze fills
  /// the scheduler and a gold push finds it full.
  std::uint32_t max_items = 0;
};

/// A QosScheduler's tiers and limits (see the file comment); checked by Validate.
struct QosConfig {
  /// Indexed by Qos (gold, silver, bronze).
  std::array<QosTierConfig, kQosTiers> tiers{{{0.20, 8, 0}, {0.10, 4, 0}, {0.05, 1, 0}}};
  /// DRR quantum, cost units per turn and unit of tenant weight: 1..1,048,576.
  std::uint32_t quantum = 1;
  /// Items queued at most: 1..16,777,216. All slots are allocated by Create.
  std::uint32_t capacity = 4096;
  /// Strict priority inside a tenant and eviction by priority when full.
  bool preemption = false;
  /// Picks the assured-share accounting looks back over: 1..1,048,576.
  std::uint32_t service_window = 1024;

  /// InvalidArgument naming the field and value when one is out of range.
  static absl::Status Validate(const QosConfig& c);
};

/// How a pushed item is classified. `tenant` is only read during Push.
struct QosKey {
  Qos tier = Qos::kSilver;     ///< the item's tier
  std::string_view tenant{};   ///< the item's tenant (deficit round robin in the tier)
  std::int32_t priority = 0;  ///< higher = more urgent; used only with preemption
  std::uint32_t cost = 1;     ///< service units, >= 1

  /// The key of `e`: its qos, tenant and priority, with `cost`.
  static QosKey Of(const Event& e, std::uint32_t cost = 1) {
    return {e.qos, e.tenant, e.priority, cost};
  }
};

/// What QosScheduler::Push did with an item.
enum class QosPushResult : std::uint8_t {
  kAccepted,          ///< queued
  kAcceptedEvicted,   ///< queued; a lower-priority item of its tier left (the out-param)
  kFull,              ///< refused: no room (capacity or the tier's max_items), nothing to evict
  kInvalidKey,        ///< refused: cost 0 or a tier outside gold..bronze
};

/// One tier's counters (QosStats::tiers).
struct QosTierStats {
  std::uint64_t queued = 0;       ///< items of this tier queued now
  std::uint64_t served = 0;       ///< items popped
  std::uint64_t served_cost = 0;  ///< their cost
  std::uint64_t floor_picks = 0;  ///< pops decided by the assured share (rule 1)
  std::uint64_t evicted = 0;      ///< items of this tier evicted by a higher priority
  std::uint64_t refused = 0;      ///< pushes of this tier answered kFull
};

/// One tenant's counters over every tier (QosStats::tenants).
struct QosTenantStats {
  std::string tenant;             ///< the tenant's name
  std::uint32_t weight = 1;       ///< its DRR weight (SetTenantWeight)
  std::uint64_t queued = 0;       ///< its items queued now
  std::uint64_t served = 0;       ///< its items popped
  std::uint64_t served_cost = 0;  ///< their cost
};

/// A QosScheduler's counters (QosScheduler::Stats).
struct QosStats {
  std::array<QosTierStats, kQosTiers> tiers{};  ///< indexed by Qos
  std::vector<QosTenantStats> tenants;  ///< in order of first appearance
};

/// The order in which one lane serves items of three QoS tiers and many tenants (see
/// the file comment).
template <class T>
class QosScheduler {
 public:
  /// InvalidArgument as QosConfig::Validate.
  static absl::StatusOr<std::unique_ptr<QosScheduler>> Create(const QosConfig& config) {
    if (absl::Status s = QosConfig::Validate(config); !s.ok()) return s;
    return std::unique_ptr<QosScheduler>(new QosScheduler(config));
  }
  QosScheduler(const QosScheduler&) = delete;
  QosScheduler& operator=(const QosScheduler&) = delete;

  /// Queues `item` under `key`. Moves from `item` only when the result is
  /// kAccepted or kAcceptedEvicted; on kAcceptedEvicted `evicted` holds the item
  /// that made room (otherwise it is left as it was).
  QosPushResult Push(T&& item, const QosKey& key, std::optional<T>& evicted) {
    const auto tier = static_cast<std::size_t>(key.tier);
    if (key.cost == 0 || tier >= kQosTiers) return QosPushResult::kInvalidKey;
    Tier& tr = tiers_[tier];
    bool did_evict = false;
    if (size_ == config_.capacity || tr.queued == tier_limit_[tier]) {
      const std::uint32_t victim = config_.preemption ? LowestOfTier(tier) : kNil;
      if (victim == kNil || !(key.priority > nodes_[victim].priority)) {
        ++tr.stats.refused;
        return QosPushResult::kFull;
      }
      evicted.emplace(std::move(*nodes_[victim].value));
      Flow& vf = flows_[nodes_[victim].flow];
      Unlink(vf, victim);
      Release(victim);
      AfterRemove(vf);
      ++tr.stats.evicted;
      did_evict = true;
    }
    const std::uint32_t fi = FlowOf(tier, key.tenant);
    Flow& f = flows_[fi];
    const std::uint32_t n = free_;
    free_ = nodes_[n].next;
    Node& node = nodes_[n];
    node.value.emplace(std::move(item));
    node.priority = key.priority;
    node.cost = key.cost;
    node.flow = fi;
    node.seq = push_seq_++;
    Insert(f, n);
    if (f.count++ == 0) Activate(tr, fi);
    if (tr.queued++ == 0 && tr.pass < vtime_) tr.pass = vtime_;  // SFQ join
    ++tenants_[f.tenant].queued;
    ++size_;
    return did_evict ? QosPushResult::kAcceptedEvicted : QosPushResult::kAccepted;
  }

  /// Whether a Push with `key` would be accepted now (kAccepted or
  /// kAcceptedEvicted). Changes nothing.
  bool WouldAccept(const QosKey& key) {
    const auto tier = static_cast<std::size_t>(key.tier);
    if (key.cost == 0 || tier >= kQosTiers) return false;
    if (size_ < config_.capacity && tiers_[tier].queued < tier_limit_[tier]) return true;
    const std::uint32_t victim = config_.preemption ? LowestOfTier(tier) : kNil;
    return victim != kNil && key.priority > nodes_[victim].priority;
  }

  /// The next item by the pick rule; nullopt when empty.
  std::optional<T> Pop() {
    if (size_ == 0) return std::nullopt;
    bool floor_pick = false;
    const std::size_t t = PickTier(floor_pick);
    Tier& tr = tiers_[t];
    Flow& f = flows_[DrrPick(tr)];
    const std::uint32_t n = f.head;
    Node& node = nodes_[n];
    const std::uint32_t cost = node.cost;
    std::optional<T> out(std::move(*node.value));
    Unlink(f, n);
    Release(n);
    Tenant& tn = tenants_[f.tenant];
    ++tn.served;
    tn.served_cost += cost;
    AfterRemove(f);
    ++tr.stats.served;
    tr.stats.served_cost += cost;
    // A floor pick is service like any other: it advances the tier's stride pass,
    // so the floor is a minimum within the weighted share, not service on top of it
    // (a tier back from idle does not get its floor and then its stride turns).
    if (floor_pick) {
      ++tr.stats.floor_picks;
    } else {
      vtime_ = tr.pass;
    }
    tr.pass += static_cast<double>(cost) / static_cast<double>(config_.tiers[t].weight);
    Account(t, cost);
    return out;
  }

  /// Weight of `tenant` in every tier's DRR (quantum x weight per turn), 1..65536;
  /// default 1. Takes effect at the tenant's next turn. InvalidArgument naming the
  /// tenant and weight when out of range.
  absl::Status SetTenantWeight(std::string_view tenant, std::uint32_t weight) {
    if (weight < 1 || weight > 65536) {
      return absl::InvalidArgumentError("qos tenant '" + std::string(tenant) + "' weight " +
                                        std::to_string(weight) + " is outside 1..65536");
    }
    tenants_[TenantOf(tenant)].weight = weight;
    return absl::OkStatus();
  }

  /// Items queued.
  std::size_t size() const { return size_; }
  /// True when size() is 0.
  bool empty() const { return size_ == 0; }
  /// Most items queued at once (QosConfig::capacity).
  std::size_t capacity() const { return config_.capacity; }
  /// The configuration it was created with.
  const QosConfig& config() const { return config_; }

  /// Allocates (the tenant list).
  QosStats Stats() const {
    QosStats s;
    for (std::size_t t = 0; t < kQosTiers; ++t) {
      s.tiers[t] = tiers_[t].stats;
      s.tiers[t].queued = tiers_[t].queued;
    }
    s.tenants.reserve(tenants_.size());
    for (const Tenant& tn : tenants_) {
      s.tenants.push_back({tn.name, tn.weight, tn.queued, tn.served, tn.served_cost});
    }
    return s;
  }

 private:
  static constexpr std::uint32_t kNil = UINT32_MAX;

  struct Node {
    std::uint32_t prev = kNil;
    std::uint32_t next = kNil;  ///< also the free list link
    std::int32_t priority = 0;
    std::uint32_t cost = 0;
    std::uint32_t flow = kNil;
    std::uint64_t seq = 0;  ///< push order, for the eviction tie-break
    std::optional<T> value;
  };
  /// One tenant's queue in one tier, and its DRR state.
  struct Flow {
    std::uint32_t tenant = 0;
    std::uint32_t head = kNil, tail = kNil;  ///< items, in service order
    std::uint64_t count = 0;
    std::int64_t deficit = 0;
    bool granted = false;                    ///< got its quantum for the current turn
    std::uint32_t prev = kNil, next = kNil;  ///< the tier's circular active list
    std::uint8_t tier = 0;
  };
  struct Tenant {
    std::string name;
    std::uint32_t weight = 1;
    std::array<std::uint32_t, kQosTiers> flow{kNil, kNil, kNil};
    std::uint64_t queued = 0, served = 0, served_cost = 0;
  };
  struct Tier {
    std::uint64_t queued = 0;
    std::uint32_t active = kNil;  ///< the flow whose turn it is
    std::uint32_t active_count = 0;
    double pass = 0;              ///< stride pass, cost / weight
    QosTierStats stats;
  };
  struct WindowEntry {
    std::uint8_t tier;
    std::uint32_t cost;
  };

  explicit QosScheduler(const QosConfig& c)
      : config_(c), nodes_(c.capacity), window_(c.service_window) {
    for (std::uint32_t i = 0; i < c.capacity; ++i) nodes_[i].next = i + 1 < c.capacity ? i + 1 : kNil;
    free_ = 0;
    for (std::size_t t = 0; t < kQosTiers; ++t) {
      assured_ppm_[t] = static_cast<std::uint64_t>(std::llround(c.tiers[t].assured_share * 1e6));
      tier_limit_[t] = c.tiers[t].max_items == 0 ? c.capacity : c.tiers[t].max_items;
    }
  }

  std::uint32_t TenantOf(std::string_view name) {
    // Debian's Abseil has its own absl::string_view, the type its hash takes.
    const absl::string_view key(name.data(), name.size());
    auto it = tenant_index_.find(key);
    if (it != tenant_index_.end()) return it->second;
    const auto id = static_cast<std::uint32_t>(tenants_.size());
    tenants_.push_back(Tenant{std::string(name)});
    tenant_index_.emplace(std::string(name), id);
    return id;
  }

  std::uint32_t FlowOf(std::size_t tier, std::string_view tenant) {
    const std::uint32_t ti = TenantOf(tenant);
    std::uint32_t& fi = tenants_[ti].flow[tier];
    if (fi == kNil) {
      fi = static_cast<std::uint32_t>(flows_.size());
      Flow f;
      f.tenant = ti;
      f.tier = static_cast<std::uint8_t>(tier);
      flows_.push_back(f);
    }
    return fi;
  }

  /// Inserts node n into flow f: at the tail, or with preemption after the last
  /// item of priority >= its own.
  void Insert(Flow& f, std::uint32_t n) {
    std::uint32_t after = f.tail;
    if (config_.preemption) {
      while (after != kNil && nodes_[after].priority < nodes_[n].priority) after = nodes_[after].prev;
    }
    const std::uint32_t before = after == kNil ? f.head : nodes_[after].next;
    nodes_[n].prev = after;
    nodes_[n].next = before;
    if (after == kNil) f.head = n; else nodes_[after].next = n;
    if (before == kNil) f.tail = n; else nodes_[before].prev = n;
  }

  void Unlink(Flow& f, std::uint32_t n) {
    const std::uint32_t p = nodes_[n].prev, x = nodes_[n].next;
    if (p == kNil) f.head = x; else nodes_[p].next = x;
    if (x == kNil) f.tail = p; else nodes_[x].prev = p;
  }

  void Release(std::uint32_t n) {
    nodes_[n].value.reset();
    nodes_[n].next = free_;
    free_ = n;
  }

  /// Bookkeeping after one item of flow f left (popped or evicted).
  void AfterRemove(Flow& f) {
    Tier& tr = tiers_[f.tier];
    --tr.queued;
    --tenants_[f.tenant].queued;
    --size_;
    if (--f.count == 0) {
      f.deficit = 0;
      f.granted = false;
      Deactivate(tr, static_cast<std::uint32_t>(&f - flows_.data()));
    }
  }

  /// Appends flow fi at the back of the tier's round (just before the current turn).
  void Activate(Tier& tr, std::uint32_t fi) {
    Flow& f = flows_[fi];
    if (tr.active == kNil) {
      f.prev = f.next = fi;
      tr.active = fi;
    } else {
      const std::uint32_t last = flows_[tr.active].prev;
      f.prev = last;
      f.next = tr.active;
      flows_[last].next = fi;
      flows_[tr.active].prev = fi;
    }
    ++tr.active_count;
  }

  void Deactivate(Tier& tr, std::uint32_t fi) {
    Flow& f = flows_[fi];
    if (f.next == fi) {
      tr.active = kNil;
    } else {
      flows_[f.prev].next = f.next;
      flows_[f.next].prev = f.prev;
      if (tr.active == fi) tr.active = f.next;  // the turn passes to the next tenant
    }
    f.prev = f.next = kNil;
    --tr.active_count;
  }

  std::int64_t Grant(const Flow& f) const {
    return static_cast<std::int64_t>(config_.quantum) * tenants_[f.tenant].weight;
  }

  /// DRR: the flow whose head item is served now (its deficit already charged).
  std::uint32_t DrrPick(Tier& tr) {
    std::uint32_t misses = 0;
    for (;;) {
      const std::uint32_t fi = tr.active;
      Flow& f = flows_[fi];
      if (!f.granted) {
        f.deficit += Grant(f);
        f.granted = true;
      }
      const std::uint32_t cost = nodes_[f.head].cost;
      if (f.deficit >= cost) {
        f.deficit -= cost;
        return fi;
      }
      f.granted = false;
      tr.active = f.next;
      if (++misses == tr.active_count) {
        // A whole round served nothing: skip the rounds in which nobody could,
        // giving every flow those rounds' quanta, as plain DRR would one by one.
        std::int64_t rounds = INT64_MAX;
        std::uint32_t g = tr.active;
        do {
          const Flow& h = flows_[g];
          const std::int64_t need = nodes_[h.head].cost - h.deficit;  // > 0
          rounds = std::min(rounds, (need + Grant(h) - 1) / Grant(h));
          g = h.next;
        } while (g != tr.active);
        g = tr.active;
        do {
          flows_[g].deficit += (rounds - 1) * Grant(flows_[g]);
          g = flows_[g].next;
        } while (g != tr.active);
        misses = 0;
      }
    }
  }

  std::size_t PickTier(bool& floor_pick) {
    using u128 = sched_internal::u128;
    // Rule 1: the backlogged tier most below its assured share.
    std::size_t best = kQosTiers;
    if (window_total_ > 0) {
      for (std::size_t t = 0; t < kQosTiers; ++t) {
        if (tiers_[t].queued == 0 || assured_ppm_[t] == 0) continue;
        // c_t / C < A_t  <=>  c_t * 1e6 < A_ppm * C
        if (static_cast<u128>(window_cost_[t]) * 1'000'000 >=
            static_cast<u128>(assured_ppm_[t]) * window_total_) {
          continue;
        }
        // smaller c_t / A_t is further below: c_t * A_b < c_b * A_t
        if (best == kQosTiers || static_cast<u128>(window_cost_[t]) * assured_ppm_[best] <
                                     static_cast<u128>(window_cost_[best]) * assured_ppm_[t]) {
          best = t;
        }
      }
    }
    if (best != kQosTiers) {
      floor_pick = true;
      return best;
    }
    // Rule 2: lowest stride pass among the backlogged tiers.
    for (std::size_t t = 0; t < kQosTiers; ++t) {
      if (tiers_[t].queued == 0) continue;
      if (best == kQosTiers || tiers_[t].pass < tiers_[best].pass) best = t;
    }
    floor_pick = false;
    return best;
  }

  void Account(std::size_t t, std::uint32_t cost) {
    WindowEntry& e = window_[window_pos_];
    if (window_fill_ == window_.size()) {
      window_cost_[e.tier] -= e.cost;
      window_total_ -= e.cost;
    } else {
      ++window_fill_;
    }
    e = {static_cast<std::uint8_t>(t), cost};
    window_cost_[t] += cost;
    window_total_ += cost;
    if (++window_pos_ == window_.size()) window_pos_ = 0;
  }

  /// The lowest-priority item of a tier, the most recently pushed among equals: each
  /// flow's tail is its lowest-priority, newest item (preemption orders the flow);
  /// between flows the push sequence numbers decide.
  std::uint32_t LowestOfTier(std::size_t t) {
    const Tier& tr = tiers_[t];
    if (tr.active == kNil) return kNil;
    std::uint32_t best = kNil;
    std::uint32_t fi = tr.active;
    do {
      const std::uint32_t n = flows_[fi].tail;
      if (best == kNil || nodes_[n].priority < nodes_[best].priority ||
          (nodes_[n].priority == nodes_[best].priority && nodes_[n].seq > nodes_[best].seq)) {
        best = n;
      }
      fi = flows_[fi].next;
    } while (fi != tr.active);
    return best;
  }

  const QosConfig config_;
  std::vector<Node> nodes_;
  std::uint64_t push_seq_ = 0;
  std::uint32_t free_ = kNil;
  std::size_t size_ = 0;
  std::vector<Flow> flows_;
  std::vector<Tenant> tenants_;
  absl::flat_hash_map<std::string, std::uint32_t> tenant_index_;
  std::array<Tier, kQosTiers> tiers_{};
  std::array<std::uint64_t, kQosTiers> assured_ppm_{};
  std::array<std::uint64_t, kQosTiers> tier_limit_{};
  double vtime_ = 0;
  /// Sliding window of the last service_window picks.
  std::vector<WindowEntry> window_;
  std::size_t window_pos_ = 0;
  std::size_t window_fill_ = 0;
  std::array<std::uint64_t, kQosTiers> window_cost_{};
  std::uint64_t window_total_ = 0;
};

inline absl::Status QosConfig::Validate(const QosConfig& c) {
  using sched_internal::Num;
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  static constexpr const char* kNames[kQosTiers] = {"gold", "silver", "bronze"};
  std::uint64_t sum_ppm = 0;
  for (std::size_t t = 0; t < kQosTiers; ++t) {
    const QosTierConfig& x = c.tiers[t];
    const std::string name = std::string("qos ") + kNames[t];
    if (!(x.assured_share >= 0 && x.assured_share <= 1)) {
      return bad(name + " assured_share " + Num(x.assured_share) + " is outside [0, 1]");
    }
    sum_ppm += static_cast<std::uint64_t>(std::llround(x.assured_share * 1e6));
    if (x.weight < 1 || x.weight > 65536) {
      return bad(name + " weight " + std::to_string(x.weight) + " is outside 1..65536");
    }
  }
  if (sum_ppm > 1'000'000) {
    return bad("qos assured shares " + Num(c.tiers[0].assured_share) + " + " +
               Num(c.tiers[1].assured_share) + " + " + Num(c.tiers[2].assured_share) +
               " sum above 1");
  }
  if (c.quantum < 1 || c.quantum > (1u << 20)) {
    return bad("qos quantum " + std::to_string(c.quantum) + " is outside 1..1048576");
  }
  if (c.capacity < 1 || c.capacity > (1u << 24)) {
    return bad("qos capacity " + std::to_string(c.capacity) + " is outside 1..16777216");
  }
  for (std::size_t t = 0; t < kQosTiers; ++t) {
    if (c.tiers[t].max_items > c.capacity) {
      return bad(std::string("qos ") + kNames[t] + " max_items " +
                 std::to_string(c.tiers[t].max_items) + " is above capacity " +
                 std::to_string(c.capacity));
    }
  }
  if (c.service_window < 1 || c.service_window > (1u << 20)) {
    return bad("qos service_window " + std::to_string(c.service_window) +
               " is outside 1..1048576");
  }
  return absl::OkStatus();
}

}  // namespace inferq
