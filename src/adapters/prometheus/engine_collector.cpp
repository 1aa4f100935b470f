// EngineCollector and StateStoreCollector: snapshots as Prometheus metric families.
// docs/guide/observability.md lists every family made here in its metrics table (a test checks it).
#include "inferq/adapters/prometheus/engine_collector.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "inferq/base/histogram.hpp"

namespace inferq::prometheus {
namespace {

using ::prometheus::ClientMetric;
using ::prometheus::MetricFamily;
using ::prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// The families of one snapshot, in the order first added; a name gets its series
// appended to the family made first.
class Builder {
 public:
  void Counter(std::string_view name, std::string_view help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }
  void Gauge(std::string_view name, std::string_view help, Labels labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }
  // A latency histogram recorded in ns, as seconds with kLatencyBuckets.
  void LatencyHistogram(std::string_view name, std::string_view help, Labels labels,
                        const HistogramSnapshot& h) {
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = h.count();
    m.histogram.sample_sum = static_cast<double>(h.sum()) / 1e9;
    for (double le : kLatencyBuckets) {
      const auto le_ns = static_cast<std::uint64_t>(std::llround(le * 1e9));
      m.histogram.bucket.push_back({h.CountAtMost(le_ns), le});
    }
    m.histogram.bucket.push_back({h.count(), std::numeric_limits<double>::infinity()});
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  void RawHistogram(std::string_view name, std::string_view help, ClientMetric m) {
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(out_); }

 private:
  MetricFamily& Family(std::string_view name, std::string_view help, MetricType type) {
    auto [it, inserted] = index_.try_emplace(std::string(name), out_.size());
    if (inserted) out_.push_back({std::string(name), std::string(help), type, {}});
    return out_[it->second];
  }
  std::vector<MetricFamily> out_;
  absl::flat_hash_map<std::string, std::size_t> index_;
};

double D(std::uint64_t v) { return static_cast<double>(v); }

// ConsumerCounts in ForEachCount's order: the family's name (inferq_consumer_<name>_total)
// and help.
constexpr std::pair<const char*, const char*> kConsumerCounts[] = {
    {"acked", "Deliveries acked."},
    {"skipped", "Queued copies passed over: removed by the stream before delivery, or superseded."},
    {"redelivered", "Redeliveries queued: a message delivered before, put on a lane again (ack_wait expiry, nak, moved)."},
    {"ack_timeouts", "Deliveries not acked within ack_wait."},
    {"naks", "Naks."},
    {"moved", "Queued items moved off a stalled member."},
    {"late_acks", "Acks after another delivery of the message won (no-ops)."},
    {"mirrored", "Shadow copies queued (shadow traffic)."},
    {"shadow_acked", "Shadow copies acked."},
    {"terminated", "Term calls."},
    {"dead_letters", "Messages given up (max_deliver, term, expired) and dead-lettered."},
    {"dead_letters_lost", "Dead letters with no dead-letter subject, or that no stream captured."},
    {"dropped", "Queued deliveries dropped by overflow drop-oldest."},
    {"overflow_rejected", "Publishes refused for a full lane (overflow reject, TryPublish)."},
    {"parked", "Deliveries that found every lane full and waited off-lane."},
    {"expired", "Events given up by their queue timeout (timeout action reject)."},
    {"delayed", "Events whose queue timeout passed under timeout action delay."},
    {"evicted", "Queued events evicted by a higher priority (QoS preemption)."},
};
static_assert(std::size(kConsumerCounts) == ConsumerCounts<std::uint64_t>::Listed(),
              "every consumer count needs a metric name");

constexpr const char* kTierNames[kQosTiers] = {"gold", "silver", "bronze"};

// A Prometheus name from a component's name part: [a-zA-Z0-9_], others become '_'.
std::string MetricNamePart(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out.push_back(ok ? c : '_');
  }
  return out;
}

void AddStreams(Builder& b, const EngineStats& s) {
  for (const StreamStats& st : s.streams) {
    const Labels l{{"stream", st.name}};
    b.Gauge("inferq_stream_messages", "Messages the stream keeps now.", l, D(st.messages));
    b.Gauge("inferq_stream_bytes", "Bytes of the messages the stream keeps now.", l, D(st.bytes));
    b.Gauge("inferq_stream_last_sequence", "Last sequence the stream assigned (0: none yet).", l, D(st.last_seq));
    b.Counter("inferq_stream_stored_total", "Events the stream stored.", l, D(st.stored));
    b.Counter("inferq_stream_discarded_total", "Messages removed by max_msgs, max_bytes, max_age or max_msgs_per_subject.",
              l, D(st.discarded));
    b.Counter("inferq_stream_purged_total", "Messages removed by a purge.", l, D(st.purged));
    b.Counter("inferq_stream_rejected_total",
              "Publishes the stream refused: its limits, a full lane (overflow reject, TryPublish), a failed codec "
              "conversion or no memory.",
              l, D(st.rejected));
    b.Counter("inferq_stream_acked_out_total", "Messages removed because every interested consumer acked them.", l,
              D(st.acked_out));
    b.Counter("inferq_stream_duplicates_total", "Publishes found in the duplicate window (duplicate-window hits; not stored).",
              l, D(st.duplicates));
    b.Counter("inferq_stream_duplicate_window_evicted_total", "Message ids forgotten before their duplicate window ended.",
              l, D(st.duplicate_window_evicted));
    b.Gauge("inferq_stream_log_bytes",
            "Bytes of the stream's log of entries its log-reading consumers read (its high-water mark).", l,
            D(st.log_bytes));
  }
}

void AddConsumers(Builder& b, const EngineStats& s) {
  for (const ConsumerStats& c : s.consumers) {
    const Labels l{{"stream", c.stream}, {"consumer", c.name}};
    b.Counter("inferq_consumer_delivered_total", "Deliveries handed to members (Next, NextBatch).", l, D(c.delivered));
    std::size_t i = 0;
    ConsumerCounts<std::uint64_t> scratch;
    static_cast<const ConsumerCounts<std::uint64_t>&>(c).ForEachCount(
        scratch, [&](const std::uint64_t& v, std::uint64_t&) {
          const auto& [name, help] = kConsumerCounts[i++];
          b.Counter(std::string("inferq_consumer_") + name + "_total", help, l, D(v));
        });
    b.Gauge("inferq_consumer_num_pending",
            "Messages waiting for the consumer, not yet delivered: its lag (JetStream's num_pending).", l,
            D(c.num_pending));
    b.Gauge("inferq_consumer_ack_pending", "Deliveries out, not yet acked, nak'ed or expired.", l, D(c.ack_pending));
    b.Gauge("inferq_consumer_num_redelivered", "Messages not yet acked that were delivered before.", l,
            D(c.num_redelivered));
    b.Gauge("inferq_consumer_timers", "Timers pending on the consumer's wheel (ack waits, delayed naks, queue timeouts).",
            l, D(c.timers));
    b.LatencyHistogram("inferq_consumer_deliver_latency_seconds", "Publish to delivery to a member.", l,
                       c.deliver_latency_ns);
    b.LatencyHistogram("inferq_consumer_ack_latency_seconds", "Delivery to ack.", l, c.ack_latency_ns);
    // Batch sizes: bucket k of batches_by_size counts sizes in [2^k, 2^(k+1)), so
    // le = 2^(k+1) - 1 is exact; the last bucket is open-ended (+Inf).
    ClientMetric batch;
    batch.label = l;
    batch.histogram.sample_count = c.batches;
    batch.histogram.sample_sum = D(c.batched_messages);
    std::uint64_t cumulative = 0;
    for (std::size_t k = 0; k + 1 < kBatchSizeBuckets; ++k) {
      cumulative += c.batches_by_size[k];
      batch.histogram.bucket.push_back({cumulative, D((std::uint64_t{2} << k) - 1)});
    }
    batch.histogram.bucket.push_back({c.batches, std::numeric_limits<double>::infinity()});
    b.RawHistogram("inferq_consumer_batch_size", "Messages per batch returned by NextBatch.", std::move(batch));
    b.Counter("inferq_consumer_selections_total", "Members chosen by the selection policy.", l, D(c.group.selections));
    // The policy's own counts: AffinityPolicy's keep its KV-cache locality
    // (affinity_kept / (affinity_kept + affinity_moved): the cache hit rate).
    for (const auto& [name, v] : c.policy_counts) {
      b.Counter("inferq_consumer_policy_" + MetricNamePart(name) + "_total",
                "Counted by the consumer's selection policy as '" + name + "'.", l, D(v));
    }
    b.Counter("inferq_consumer_panic_selections_total",
              "Selections made in panic mode (too many members ejected: all treated as healthy).", l,
              D(c.group.panics));
    b.Counter("inferq_consumer_degradations_total", "Member health transitions healthy to degraded.", l,
              D(c.group.degradations));
    b.Counter("inferq_consumer_ejections_total", "Member health transitions degraded to ejected.", l,
              D(c.group.ejections));
    b.Counter("inferq_consumer_ejections_refused_total", "Ejections the ejection cap refused.", l,
              D(c.group.ejections_refused));
    if (c.qos) {
      for (std::size_t t = 0; t < kQosTiers; ++t) {
        Labels lt = l;
        lt.push_back({"tier", kTierNames[t]});
        const QosTierStats& q = c.qos_tiers[t];
        b.Gauge("inferq_consumer_tier_queued", "Items of the tier queued on the consumer's QoS lanes.", lt, D(q.queued));
        b.Counter("inferq_consumer_tier_served_total", "Items of the tier popped from QoS lanes.", lt, D(q.served));
        b.Counter("inferq_consumer_tier_served_cost_total", "Cost of the items of the tier popped.", lt,
                  D(q.served_cost));
        b.Counter("inferq_consumer_tier_floor_picks_total", "Pops decided by the tier's assured share.", lt,
                  D(q.floor_picks));
        b.Counter("inferq_consumer_tier_evicted_total", "Items of the tier evicted by a higher priority.", lt,
                  D(q.evicted));
        b.Counter("inferq_consumer_tier_refused_total", "Pushes of the tier refused for a full lane.", lt,
                  D(q.refused));
      }
    }
    for (const MemberStats& m : c.members) {
      Labels lm = l;
      lm.push_back({"member", std::to_string(m.index)});
      b.Counter("inferq_member_delivered_total", "Deliveries handed to the member.", lm, D(m.delivered));
      b.Gauge("inferq_member_queued", "Deliveries queued on the member's lane (queue depth).", lm, D(m.queued));
      if (m.index < c.group.members.size()) {
        const MemberSnapshot& g = c.group.members[m.index];
        b.Gauge("inferq_member_outstanding", "Work queued on or in flight at the member.", lm,
                static_cast<double>(std::max<std::int64_t>(0, g.outstanding)));
        b.Gauge("inferq_member_weight", "Selection weight from the member's health: 0 (ejected) to 1.", lm, g.weight);
        b.Gauge("inferq_member_ejected", "1 while the member is ejected, else 0.", lm,
                g.health == MemberHealth::kEjected ? 1.0 : 0.0);
        b.Counter("inferq_member_ejections_total", "Times the member was ejected.", lm, D(g.ejections));
        b.Counter("inferq_member_successes_total", "Deliveries the member completed (acked).", lm, D(g.successes));
        b.Counter("inferq_member_failures_total", "Deliveries the member failed (nak, ack_wait expiry, moved).", lm,
                  D(g.failures));
        b.Gauge("inferq_member_latency_ewma_seconds", "Peak-EWMA estimate of the member's ack latency.", lm,
                g.peak_ewma_ms / 1e3);
      }
    }
  }
}

void AddMemory(Builder& b, const EngineStats& s) {
  for (const NodeMemoryStats& n : s.memory) {
    for (const FixedPoolStats& p : n.pools) {
      const Labels l{{"node", std::to_string(n.node)}, {"block_size", std::to_string(p.block_size)}};
      b.Gauge("inferq_pool_reserved_bytes", "Bytes of the chunks the pool carved.", l, D(p.bytes_reserved));
      b.Gauge("inferq_pool_in_use_bytes", "Bytes of the pool's blocks in use.", l, D(p.blocks_in_use * p.block_size));
      b.Counter("inferq_pool_allocations_total", "Blocks allocated from the pool.", l, D(p.allocations));
      b.Counter("inferq_pool_cache_hits_total", "Allocations served by the allocating thread's cache.", l,
                D(p.cache_hits));
      b.Counter("inferq_pool_cache_misses_total", "Allocations that refilled the thread's cache from the pool.", l,
                D(p.cache_misses));
      b.Counter("inferq_pool_chunks_outside_arena_total", "Chunks taken from operator new because the NUMA arena was full.",
                l, D(p.chunks_outside_arena));
    }
  }
}

void AddFlow(Builder& b, const EngineStats& s) {
  if (!s.flow) return;
  const FlowSnapshot& f = *s.flow;
  b.Gauge("inferq_flow_throttle", "Flow control's throttle on publishers: 0 full speed, 1 stop (min(1, 0.6 memory pressure + 0.4 latency pressure)).", {}, f.throttle);
  b.Gauge("inferq_flow_weight_scale", "Flow control's scale of selection weights, 0.7 to 1.3.", {}, f.weight_scale);
  b.Gauge("inferq_flow_memory_used_bytes", "Memory flow control counts against its budget.", {}, D(f.memory_used_bytes));
  b.Gauge("inferq_flow_memory_pressure", "Flow control's memory pressure, 0 to 1.", {}, f.memory_pressure);
  b.Gauge("inferq_flow_latency_pressure", "Flow control's latency pressure, 0 to 1.", {}, f.latency_pressure);
  b.Gauge("inferq_flow_latency_seconds", "The delivery latency flow control sees.", {}, static_cast<double>(f.latency_ns) / 1e9);
}

// A component named "<kind>.<source>" (e.g. nats_bridge.site-a) gives families
// inferq_<kind>_<value> with label source="<source>"; values ending in _total are
// counters, the others gauges.
void AddComponents(Builder& b, const EngineStats& s) {
  for (const ComponentStats& c : s.components) {
    const std::size_t dot = c.name.find('.');
    const std::string kind = MetricNamePart(c.name.substr(0, dot));
    const Labels l{{"source", dot == std::string::npos ? std::string() : c.name.substr(dot + 1)}};
    for (const auto& [value, v] : c.values) {
      const std::string name = "inferq_" + kind + "_" + MetricNamePart(value);
      const std::string help = "Reported by the engine's stats source '" + kind + "' as '" + value + "'.";
      if (value.size() > 6 && value.ends_with("_total")) {
        b.Counter(name, help, l, v);
      } else {
        b.Gauge(name, help, l, v);
      }
    }
  }
}

}  // namespace

std::vector<MetricFamily> EngineCollector::Families(const EngineStats& s) {
  Builder b;
  b.Counter("inferq_published_total", "Application publishes stored by at least one stream.", {}, D(s.published));
  b.Counter("inferq_publish_refused_total", "Application publishes refused, by reason.", {{"reason", "unrouted"}},
            D(s.unrouted));
  b.Counter("inferq_publish_refused_total", "", {{"reason", "rejected"}}, D(s.rejected));
  b.Counter("inferq_publish_refused_total", "", {{"reason", "invalid"}}, D(s.invalid));
  b.Counter("inferq_codec_conversions_total", "Payloads converted for consumers' accepted codecs.", {},
            D(s.codec_conversions));
  b.Counter("inferq_route_cache_hits_total",
            "Publishes routed from the publishing thread's route cache (its last 4 subjects).", {},
            D(s.route_cache_hits));
  b.Counter("inferq_route_cache_misses_total", "Publishes that searched the subject index.", {},
            D(s.route_cache_misses));
  b.Counter("inferq_subject_index_cache_hits_total",
            "Subject index searches answered by its match cache (4,096 subjects, shared).", {},
            D(s.subject_index_cache_hits));
  b.Counter("inferq_subject_index_cache_misses_total", "Subject index searches that walked the trie.", {},
            D(s.subject_index_cache_misses));
  AddStreams(b, s);
  AddConsumers(b, s);
  AddMemory(b, s);
  AddFlow(b, s);
  AddComponents(b, s);
  return b.Take();
}

std::vector<MetricFamily> EngineCollector::Collect() const { return Families(engine_.Stats()); }

std::vector<MetricFamily> TokenProbeCollector::Families(const TokenProbeStats& s, const std::string& name) {
  Builder b;
  const Labels l = name.empty() ? Labels{} : Labels{{"probe", name}};
  b.LatencyHistogram("inferq_token_ttft_seconds", "Time to first token: request start to the sequence's first token.", l,
                     s.ttft_ns);
  b.LatencyHistogram("inferq_token_inter_token_seconds", "Gap between consecutive tokens of a sequence (TBT).", l,
                     s.inter_token_ns);
  b.Counter("inferq_token_sequences_started_total", "Sequences started.", l, D(s.sequences_started));
  b.Counter("inferq_token_sequences_finished_total", "Sequences finished.", l, D(s.sequences_finished));
  b.Gauge("inferq_token_sequences_open", "Sequences started and not finished.", l, D(s.sequences_open));
  b.Counter("inferq_tokens_total", "Tokens received in order.", l, D(s.tokens));
  b.Counter("inferq_token_reordered_total", "Tokens that arrived ahead of a missing one and were held.", l,
            D(s.reordered));
  b.Counter("inferq_token_missing_total", "Token numbers reported missing (never received).", l, D(s.missing));
  b.Counter("inferq_token_duplicates_total", "Copies of tokens received again and dropped.", l, D(s.duplicates));
  // SLA attainment per tier: only for tiers whose sequences were started with one.
  bool first_tier = true;
  for (std::size_t t = 0; t < s.tiers.size(); ++t) {
    const TokenTierStats& ts = s.tiers[t];
    if (ts.first_tokens == 0 && ts.ttft_sla_ns == 0) continue;
    Labels tl = l;
    tl.push_back({"tier", kTierNames[t]});
    b.Counter("inferq_token_tier_first_tokens_total",
              first_tier ? "First tokens of sequences started with a QoS tier." : "", tl, D(ts.first_tokens));
    b.Counter("inferq_token_tier_within_sla_total",
              first_tier ? "Of those, first tokens within the tier's TTFT SLA (TokenProbe::SetTtftSla)." : "", tl,
              D(ts.within_sla));
    b.Gauge("inferq_token_tier_ttft_sla_seconds", first_tier ? "The tier's TTFT SLA; 0 = none." : "", tl,
            static_cast<double>(ts.ttft_sla_ns) / 1e9);
    first_tier = false;
  }
  return b.Take();
}

std::vector<MetricFamily> TokenProbeCollector::Collect() const { return Families(probe_.Stats(), name_); }

std::vector<MetricFamily> StateStoreCollector::Families(const StateStoreStats& s) {
  Builder b;
  b.Gauge("inferq_state_last_tx", "Newest durable transaction id.", {}, D(s.last_tx_id));
  b.Gauge("inferq_state_keys", "Live keys.", {}, D(s.keys));
  b.Counter("inferq_state_commits_total", "Transactions committed since open.", {}, D(s.commits));
  b.Counter("inferq_state_log_syncs_total", "fdatasync calls on the write-ahead log since open.", {}, D(s.log_syncs));
  b.LatencyHistogram("inferq_state_log_sync_seconds", "Duration of each fdatasync of the write-ahead log.", {},
                     s.log_sync_ns);
  b.LatencyHistogram("inferq_state_checkpoint_seconds",
                     "Duration of each checkpoint written (snapshot, write, sync, rename, retire).", {},
                     s.checkpoint_ns);
  b.Counter("inferq_state_log_written_bytes_total", "Bytes appended to the write-ahead log since open.", {},
            D(s.log_bytes));
  b.Gauge("inferq_state_log_segments", "Write-ahead log segment files now.", {}, D(s.segments));
  b.Counter("inferq_state_checkpoints_total", "Checkpoints written since open, by kind.", {{"kind", "full"}},
            D(s.checkpoints_full));
  b.Counter("inferq_state_checkpoints_total", "", {{"kind", "incremental"}}, D(s.checkpoints_incremental));
  b.Gauge("inferq_state_last_checkpoint_bytes", "Size of the newest checkpoint file.", {}, D(s.last_checkpoint_bytes));
  b.Gauge("inferq_state_recovery_seconds", "Time recovery took at open.", {}, s.recovery_ms / 1e3);
  b.Gauge("inferq_state_failed", "1 once the store is in the failed state (a write or sync failed), else 0.", {},
          s.failed ? 1.0 : 0.0);
  return b.Take();
}

std::vector<MetricFamily> StateStoreCollector::Collect() const { return Families(store_.Stats()); }

}  // namespace inferq::prometheus
