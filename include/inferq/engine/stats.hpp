// File: inferq/engine/stats.hpp
//
// The snapshot Engine::Stats() returns (DESIGN.md §3.8 "Stats"): counters and
// latency histograms per stream, consumer and member, the memory of each NUMA node,
// and flow control's state.
//
// Usage:
//   inferq::EngineStats s = engine->Stats();
//   if (const inferq::ConsumerStats* c = s.consumer("REQUESTS", "replicas")) {
//     inferq::LatencySummary lat = c->deliver_latency();  // ns: p50, p95, p99, max
//   }
//
// Thread safety: plain values, copied out of the engine; a snapshot does not change
// afterwards. Its counters are read one by one while the engine runs, so two of them
// need not agree to the event.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "inferq/base/histogram.hpp"
#include "inferq/memory/fixed_pool.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/flow_control.hpp"
#include "inferq/sched/qos_scheduler.hpp"

namespace inferq {

// Latency percentiles (nearest rank) of a histogram, in the histogram's unit.
struct LatencySummary {
  std::uint64_t count = 0;
  std::uint64_t p50 = 0;
  std::uint64_t p95 = 0;
  std::uint64_t p99 = 0;
  std::uint64_t max = 0;
  static LatencySummary Of(const HistogramSnapshot& h) {
    return {h.count(), h.Percentile(0.50), h.Percentile(0.95), h.Percentile(0.99), h.max()};
  }
};

struct StreamStats {
  std::string name;
  std::uint64_t messages = 0;    // kept now
  std::uint64_t bytes = 0;       // kept now
  std::uint64_t last_seq = 0;    // last sequence assigned (0: none yet)
  std::uint64_t stored = 0;      // events accepted since creation
  std::uint64_t discarded = 0;   // removed by max_msgs / max_bytes / max_age
  std::uint64_t rejected = 0;    // publishes refused (discard new, max_msg_size)
  std::uint64_t acked_out = 0;   // removed because every interested consumer acked
  std::uint64_t duplicates = 0;  // publishes found in the duplicate window (not stored)
  // Ids forgotten before their window ended (StreamConfig::duplicate_window_max_entries).
  std::uint64_t duplicate_window_evicted = 0;
};

struct MemberStats {
  std::uint32_t index = 0;
  std::uint64_t delivered = 0;
  std::size_t queued = 0;
};

struct ConsumerStats {
  std::string stream;
  std::string name;
  std::uint64_t delivered = 0;    // handed to members by Next / NextBatch
  std::uint64_t acked = 0;
  std::uint64_t ack_pending = 0;  // deliveries out, not yet acked, nak'ed or expired
  std::uint64_t skipped = 0;      // queued but discarded by the stream before delivery
  std::uint64_t redelivered = 0;  // deliveries after an ack_wait expiry, nak or move
  std::uint64_t ack_timeouts = 0; // deliveries not acked within ack_wait
  std::uint64_t naks = 0;
  std::uint64_t moved = 0;        // queued items moved off a stalled member
  std::uint64_t late_acks = 0;    // acks after another delivery of the message won (no-ops)
  std::uint64_t mirrored = 0;     // shadow copies queued (WeightedShadowPolicy)
  std::uint64_t shadow_acked = 0;
  std::uint64_t terminated = 0;   // Term calls
  std::uint64_t dead_letters = 0; // messages given up (max_deliver, term, expired)
  std::uint64_t dead_letters_lost = 0;  // of those: no dead_letter_subject, or no stream captured it
  std::uint64_t dropped = 0;      // queued deliveries dropped by OverflowPolicy::kDropOldest
  std::uint64_t overflow_rejected = 0;  // publishes refused for a full lane (kReject, TryPublish)
  std::uint64_t parked = 0;       // deliveries that found every lane full and waited off-lane
  std::uint64_t expired = 0;      // events given up by their queue timeout (kReject)
  std::uint64_t delayed = 0;      // events whose queue timeout passed under kDelay
  std::uint64_t evicted = 0;      // queued events evicted by a higher priority (QoS preemption)
  std::uint64_t timers = 0;       // timers pending on the consumer's wheel: ack waits,
                                  // delayed naks, queue timeouts (a settled delivery's is cancelled)
  // NextBatch(timeout) batches by size (log2 buckets, BatcherStats), all members.
  std::array<std::uint64_t, kBatchSizeBuckets> batches_by_size{};
  std::uint64_t batches = 0;
  // Scheduled lanes (ConsumerConfig::qos), summed over members: per tier served,
  // floor picks, evictions, refusals.
  std::array<QosTierStats, kQosTiers> qos_tiers{};
  std::string policy;             // SelectionPolicy::name()
  GroupSnapshot group;            // health, load and selection counts per member
  std::vector<MemberStats> members;
  HistogramSnapshot deliver_latency_ns;  // publish -> handed to a member
  HistogramSnapshot ack_latency_ns;      // handed to a member -> acked
  LatencySummary deliver_latency() const { return LatencySummary::Of(deliver_latency_ns); }
};

// Memory of one NUMA node: where its pools get chunks, and the pools (128, 512 and
// 2048-byte blocks: stream records, events, large events).
struct NodeMemoryStats {
  int node = 0;               // OS index
  std::string arena;          // e.g. "one node: not bound", "bound to node 1"
  std::vector<FixedPoolStats> pools;
};

struct EngineStats {
  // The application's publishes (Publish, TryPublish, Call); the engine's own dead
  // letters are counted per consumer (ConsumerStats::dead_letters,
  // dead_letters_lost), and duplicates per stream (StreamStats::duplicates).
  std::uint64_t published = 0;   // stored by at least one stream (not only duplicates)
  std::uint64_t unrouted = 0;    // no stream captured the subject (NotFound)
  std::uint64_t rejected = 0;    // every capturing stream refused (and none found a duplicate)
  std::uint64_t invalid = 0;     // an invalid subject, attribute or payload
  // Payloads converted for consumers (ConsumerConfig::accept_codecs): one per publish
  // and target codec, however many consumers and streams share the result.
  std::uint64_t codec_conversions = 0;
  std::vector<StreamStats> streams;
  std::vector<ConsumerStats> consumers;
  std::vector<NodeMemoryStats> memory;  // one per NUMA node
  std::optional<FlowSnapshot> flow;      // EngineOptions::flow_control's state
  // nullptr when absent. The pointer lives as long as this EngineStats; calling these
  // on a temporary (engine.Stats().stream(...)) does not compile, so that no pointer
  // into a destroyed snapshot can be kept.
  const StreamStats* stream(std::string_view name) const&;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&;
  const StreamStats* stream(std::string_view name) const&& = delete;
  const ConsumerStats* consumer(std::string_view stream, std::string_view name) const&& = delete;
};

}  // namespace inferq
