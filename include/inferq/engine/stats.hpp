/// @file inferq/engine/stats.hpp
///
/// The snapshot Engine::Stats() returns: counters and
/// latency histograms per stream, consumer and member, the memory of each NUMA node,
/// and flow control's state.
///
/// Usage:
/// @code
///   inferq::EngineStats s = engine->Stats();
///   if (const inferq::ConsumerStats* c = s.consumer("REQUESTS", "replicas")) {
///     inferq::LatencySummary lat = c->deliver_latency();  // ns: p50, p95, p99, max
///   }
/// @endcode
///
/// Thread safety: plain values, copied out of the engine; a snapshot does not change
/// afterwards. Its counters are read one by one while the engine runs, so two of them
/// need not agree to the event.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferq/base/histogram.hpp"
#include "inferq/engine/config.hpp"
#include "inferq/memory/fixed_pool.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/flow_control.hpp"
#include "inferq/sched/qos_scheduler.hpp"

namespace inferq {

/// Latency percentiles (nearest rank) of a histogram, in the histogram's unit.
struct LatencySummary {
  std::uint64_t count = 0;  ///< values recorded
  std::uint64_t p50 = 0;    ///< median
  std::uint64_t p95 = 0;    ///< 95th percentile
  std::uint64_t p99 = 0;    ///< 99th percentile
  std::uint64_t max = 0;    ///< the largest value (HistogramSnapshot::max)
  /// The summary of `h`.
  static LatencySummary Of(const HistogramSnapshot& h) {
    return {h.count(), h.Percentile(0.50), h.Percentile(0.95), h.Percentile(0.99), h.max()};
  }
};

/// One stream's figures (EngineStats::streams).
struct StreamStats {
  std::string name;  ///< the stream's name
  RetentionPolicy retention = RetentionPolicy::kLimits;  ///< the stream's StreamConfig::retention
  /// 16 hex digits naming this life of the stream, in the ids of its messages in a
  /// consumer's lifecycle (`<stream>/<consumer>/<incarnation>/<seq>`:
  /// ConsumerConfig::lifecycle):
  /// the same across a file stream's restarts, new for a memory stream in each
  /// process and for a stream deleted and added again.
  std::string incarnation;
  /// Kept now: the count at one instant while publishers run, never above the
  /// stream's max_msgs (and `bytes` never above max_bytes) under discard old.
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;       ///< kept now (see `messages`)
  std::uint64_t last_seq = 0;    ///< last sequence assigned (0: none yet)
  /// The oldest sequence the stream holds; last_seq + 1 when it holds none; 0 for a
  /// stream that keeps no index (interest retention without max_age, a discard-old
  /// limit or max_msgs_per_subject), whose messages live in its deliveries only.
  std::uint64_t first_seq = 0;
  std::uint64_t stored = 0;      ///< events accepted since creation
  /// Removed by max_msgs / max_bytes / max_age / max_msgs_per_subject.
  std::uint64_t discarded = 0;
  std::uint64_t purged = 0;      ///< removed by Engine::PurgeStream
  /// Publishes this stream refused: its limits (discard new, max_msg_size), a full
  /// lane (overflow reject; TryPublish on a full or held lane), a payload conversion
  /// for accept_codecs that failed, or no memory for the record.
  std::uint64_t rejected = 0;
  std::uint64_t acked_out = 0;   ///< removed because every interested consumer acked
  std::uint64_t duplicates = 0;  ///< publishes found in the duplicate window (not stored)
  /// Ids forgotten before their window ended (StreamConfig::duplicate_window_max_entries).
  std::uint64_t duplicate_window_evicted = 0;
  /// Memory of the stream's log of entries that its log-reading consumers read, in
  /// bytes: segments of 1,024 entries in use, kept by a Message, or free for reuse
  /// (the log reuses a segment it lets go of, never frees it while the stream lives:
  /// this is its high-water mark). Messages whose record the log holds in place are
  /// counted here, not in EngineStats::memory's pools. 0 for a stream without the log.
  std::uint64_t log_bytes = 0;
};

/// One member's figures (ConsumerStats::members).
struct MemberStats {
  std::uint32_t index = 0;      ///< the member's index in its group
  std::uint64_t delivered = 0;  ///< messages handed to it by Next / NextBatch
  std::size_t queued = 0;       ///< events queued on its lane now (approximate)
};

/// The monotonic counts of one consumer. A template on the type of a count: the
/// engine keeps them as ConsumerCounts<std::atomic<std::uint64_t>>, ConsumerStats
/// has them as plain numbers, and a snapshot copies one into the other with
/// ForEachCount, so that a count is declared once and copied by the same list.
template <class Count>
struct ConsumerCounts {
  Count acked{};        ///< acks that settled their message (Ack, AckSync)
  /// Queued copies passed over when pulled or redelivered: discarded by the stream
  /// (limits, max_age, expiry) before delivery, or superseded (another delivery of
  /// the message was acked, or a newer one is out).
  Count skipped{};
  /// Redeliveries queued: a message that had been delivered before, put on a lane
  /// again after an ack_wait expiry or a nak, or moved off a stalled member after a
  /// delivery, or (a durable consumer) delivered before a restart and not acked;
  /// counted when it is queued, before a member pulls it (`delivered` counts the
  /// pull). Queued work moved before anyone pulled it counts in `moved`
  /// only.
  Count redelivered{};
  Count ack_timeouts{}; ///< deliveries not acked within ack_wait
  Count naks{};         ///< Nak calls that succeeded
  Count moved{};        ///< queued items moved off a stalled member
  Count late_acks{};    ///< acks after another delivery of the message won (no-ops)
  Count mirrored{};     ///< shadow copies queued (WeightedShadowPolicy)
  Count shadow_acked{};  ///< acks of shadow copies (member health only)
  Count terminated{};   ///< Term calls
  Count dead_letters{}; ///< messages given up (max_deliver, term, expired)
  Count dead_letters_lost{};  ///< of those: no dead_letter_subject, or no stream captured it
  Count dropped{};      ///< queued deliveries dropped by OverflowPolicy::kDropOldest
  Count overflow_rejected{};  ///< publishes refused for a full lane (kReject, TryPublish)
  Count parked{};       ///< deliveries that found every lane full and waited off-lane
  Count expired{};      ///< events given up by their queue timeout (kReject)
  Count delayed{};      ///< events whose queue timeout passed under kDelay
  Count evicted{};      ///< queued events evicted by a higher priority (QoS preemption)

  /// Calls f(this->count, other.count) for every count above, in order.
  template <class Other, class F>
  constexpr void ForEachCount(Other& other, F&& f) const {
    f(acked, other.acked);
    f(skipped, other.skipped);
    f(redelivered, other.redelivered);
    f(ack_timeouts, other.ack_timeouts);
    f(naks, other.naks);
    f(moved, other.moved);
    f(late_acks, other.late_acks);
    f(mirrored, other.mirrored);
    f(shadow_acked, other.shadow_acked);
    f(terminated, other.terminated);
    f(dead_letters, other.dead_letters);
    f(dead_letters_lost, other.dead_letters_lost);
    f(dropped, other.dropped);
    f(overflow_rejected, other.overflow_rejected);
    f(parked, other.parked);
    f(expired, other.expired);
    f(delayed, other.delayed);
    f(evicted, other.evicted);
  }
  /// How many counts ForEachCount visits: a count declared and not listed there
  /// fails the static_assert below.
  static constexpr std::size_t Listed() {
    std::size_t n = 0;
    ConsumerCounts<std::uint64_t> a, b;
    a.ForEachCount(b, [&n](const std::uint64_t&, std::uint64_t&) { ++n; });
    return n;
  }
};
static_assert(ConsumerCounts<std::uint64_t>::Listed() * sizeof(std::uint64_t) ==
                  sizeof(ConsumerCounts<std::uint64_t>),
              "ConsumerCounts::ForEachCount must list every count once");

/// One consumer's figures (EngineStats::consumers), its ConsumerCounts included.
struct ConsumerStats : ConsumerCounts<std::uint64_t> {
  std::string stream;             ///< its stream's name
  std::string name;               ///< the consumer's name
  std::uint64_t delivered = 0;    ///< handed to members by Next / NextBatch
  std::uint64_t ack_pending = 0;  ///< deliveries out, not yet acked, nak'ed or expired
                                  ///< (JetStream's num_ack_pending)
  /// Messages waiting for it, not yet delivered: queued on its lanes or parked (the
  /// stored messages it starts with that no lane took yet, redeliveries that found
  /// every lane full). JetStream's num_pending: the consumer's lag. Queued copies of
  /// messages removed since (limits, max_age) count until a pull skips them. A
  /// consumer of a file stream reads the stored messages it starts with from the log a
  /// chunk at a time: until it has read them all, every message of the stream past
  /// the chunk counts (for a filtered consumer, or past a purge in the middle, more
  /// than will be delivered).
  std::uint64_t num_pending = 0;
  /// Messages not yet acked that were delivered before (counting the deliveries before
  /// a restart, for durable consumers) and are out again or waiting to be, after an
  /// ack_wait expiry or a nak; JetStream's num_redelivered, which counts a message
  /// only once it is sent again. A consumer without ack_wait or backoff (untracked)
  /// counts the deliveries out with Message::attempt() > 1 that are not yet settled
  /// (it keeps no entry for one waiting to be sent).
  std::uint64_t num_redelivered = 0;
  // ...and the counts of ConsumerCounts: acked, skipped, redelivered, ack_timeouts,
  // naks, moved, late_acks, mirrored, shadow_acked, terminated, dead_letters,
  // dead_letters_lost, dropped, overflow_rejected, parked, expired, delayed, evicted.
  std::uint64_t timers = 0;       ///< timers pending on the consumer's wheel: ack waits,
                                  ///< delayed naks, queue timeouts (a settled delivery's is cancelled)
  /// Batches returned by either NextBatch form, all members, by the number of messages
  /// in them: batches_by_size[k] counts sizes in [2^k, 2^(k+1)), except the last
  /// bucket (k = kBatchSizeBuckets - 1 = 16), which counts every size from 2^16 up;
  /// batches is their sum.
  std::array<std::uint64_t, kBatchSizeBuckets> batches_by_size{};
  std::uint64_t batches = 0;  ///< batches returned: the sum of batches_by_size
  std::uint64_t batched_messages = 0;  ///< messages in those batches (the sum of their sizes)
  /// Scheduled lanes (ConsumerConfig::qos), summed over members: per tier served,
  /// floor picks, evictions, refusals.
  std::array<QosTierStats, kQosTiers> qos_tiers{};
  bool qos = false;               ///< the lanes are QoS-scheduled (ConsumerConfig::qos)
  std::string policy;             ///< SelectionPolicy::name()
  /// SelectionPolicy::Counts(): the policy's own counts (AffinityPolicy: affinity_kept,
  /// affinity_moved, affinity_new).
  std::vector<std::pair<std::string, std::uint64_t>> policy_counts;
  GroupSnapshot group;            ///< health, load and selection counts per member
  std::vector<MemberStats> members;  ///< one per member, by index
  HistogramSnapshot deliver_latency_ns;  ///< publish -> handed to a member
  HistogramSnapshot ack_latency_ns;      ///< handed to a member -> acked
  /// The summary of deliver_latency_ns, in ns.
  LatencySummary deliver_latency() const { return LatencySummary::Of(deliver_latency_ns); }
};

/// Memory of one NUMA node: where its pools get chunks, and the pools (one pool of
/// 576-byte blocks: each stream's record of an event, the first one holding the
/// event).
struct NodeMemoryStats {
  int node = 0;               ///< OS index
  std::string arena;          ///< e.g. "one node: not bound", "bound to node 1"
  std::vector<FixedPoolStats> pools;  ///< its pools, smallest blocks first
};

/// The state of a component the host attached to the engine (an adapter such as the
/// NATS bridge), read from it when the snapshot is taken (Engine::AddStatsSource).
struct ComponentStats {
  std::string name;  ///< the source's name, e.g. "nats_bridge.site-a"
  /// Its figures in the order the component reports them: counters (names ending
  /// in "_total") and gauges (a state as 0 or 1, a count now).
  std::vector<std::pair<std::string, double>> values;
  std::string detail;  ///< free text, e.g. the component's last error; may be empty
  /// The value named `name`, or nullopt.
  std::optional<double> value(std::string_view name) const {
    for (const auto& [k, v] : values) {
      if (k == name) return v;
    }
    return std::nullopt;
  }
};

/// What Engine::Stats() returns (see the file comment).
struct EngineStats {
  /// The application's publishes (Publish, TryPublish, Call); the engine's own dead
  /// letters are counted per consumer (ConsumerStats::dead_letters,
  /// dead_letters_lost), and duplicates per stream (StreamStats::duplicates).
  std::uint64_t published = 0;   ///< stored by at least one stream (not only duplicates)
  std::uint64_t unrouted = 0;    ///< no stream captured the subject (NotFound)
  std::uint64_t rejected = 0;    ///< every capturing stream refused (and none found a duplicate)
  std::uint64_t invalid = 0;     ///< an invalid subject, attribute or payload
  /// Payloads converted for consumers (ConsumerConfig::accept_codecs): one per publish
  /// and target codec, however many consumers and streams share the result.
  std::uint64_t codec_conversions = 0;
  /// Routing of every publish (the application's and the engine's dead letters), in
  /// two levels. First the publishing thread's route cache: 64 entries of subjects it
  /// routed since the last AddStream or DeleteStream (direct-mapped: an entry is
  /// picked by a hash of the subject, and a subject evicts the one before it in its
  /// entry). A hit gives the capturing streams at once; a miss searches the
  /// subject index, whose match cache (4,096 subjects, shared by every thread, the
  /// SubjectIndex's own) answers or walks the trie. Hit rates = hits / (hits + misses).
  ///@{
  std::uint64_t route_cache_hits = 0;
  std::uint64_t route_cache_misses = 0;
  std::uint64_t subject_index_cache_hits = 0;
  std::uint64_t subject_index_cache_misses = 0;
  ///@}
  std::vector<StreamStats> streams;      ///< one per stream
  std::vector<ConsumerStats> consumers;  ///< one per consumer
  std::vector<NodeMemoryStats> memory;  ///< one per NUMA node
  std::optional<FlowSnapshot> flow;      ///< EngineOptions::flow_control's state
  std::vector<ComponentStats> components;  ///< Engine::AddStatsSource, in the order added
  /// The stream, consumer (of `stream`) or component named `name`;
  /// nullptr when absent. The pointer lives as long as this EngineStats; calling these
  /// on a temporary (engine.Stats().stream(...)) does not compile, so that no pointer
  /// into a destroyed snapshot can be kept.
  ///@{
  const StreamStats* stream(std::string_view name) const&;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&;
  const ComponentStats* component(std::string_view name) const&;
  ///@}
  const StreamStats* stream(std::string_view name) const&& = delete;
  const ComponentStats* component(std::string_view name) const&& = delete;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&& = delete;
};

}  // namespace inferq
