// File: src/engine/stats.cpp
//
// Engine::Stats: the snapshot of every counter (engine/stats.hpp).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "cursor.hpp"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq {

absl::StatusOr<std::shared_ptr<const Event>> Engine::GetMessage(std::string_view stream,
                                                                std::uint64_t seq) const {
  engine_internal::StreamState* s;
  {
    std::lock_guard lock(impl_->config_mu);
    s = impl_->FindStream(stream);
  }
  if (s == nullptr) return absl::NotFoundError("stream " + QuoteValue(stream) + " does not exist");
  if (seq == 0) {
    return absl::InvalidArgumentError("stream '" + s->config.name +
                                      "': sequence 0 is invalid (sequences start at 1)");
  }
  if (!s->keeps_index) {
    return absl::FailedPreconditionError(
        "stream '" + s->config.name + "' keeps no index of its messages (interest retention "
        "without max_age or a discard-old limit), so none can be got by sequence");
  }
  std::unique_lock lock(s->mu);
  if (s->deleted) return absl::NotFoundError("stream '" + s->config.name + "' was deleted");
  if (const std::uint64_t last = s->last_seq.load(std::memory_order_relaxed); seq > last) {
    return absl::OutOfRangeError("stream '" + s->config.name + "' has not given out sequence " +
                                 std::to_string(seq) + " (last sequence " + std::to_string(last) + ")");
  }
  s->DrainRemoved();
  if (s->log != nullptr) {
    // A file stream's index, in ascending sequence; the event is read back from the
    // log outside the stream's mutex (a copy of the entry: the index may change).
    const std::size_t lo = s->IndexPosition(seq);
    if (lo < s->index.size() && s->index.at(lo).seq == seq && s->index.at(lo).removed == 0) {
      const engine_internal::IndexEntry e = s->index.at(lo);
      lock.unlock();
      absl::StatusOr<engine_internal::Handle> h = s->LoadFromLog(e);
      // The record's block holds the event: a pointer that shares its ownership.
      if (h.ok()) return std::shared_ptr<const Event>(*h, (*h)->event);
      // Its segment retired meanwhile: a limit removed it after the search.
      if (h.status().code() != absl::StatusCode::kNotFound) return h.status();
    }
  } else {
    // The index is in ascending sequence: a binary search.
    std::size_t lo = 0;
    std::size_t hi = s->messages.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (s->messages.at(mid)->seq < seq) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo < s->messages.size()) {
      const engine_internal::Handle& h = s->messages.at(lo);
      if (h->seq == seq && h->state.load(std::memory_order_acquire) == engine_internal::kLive) {
        return std::shared_ptr<const Event>(h, h->event);
      }
    }
  }
  return absl::NotFoundError("stream '" + s->config.name + "' holds no message " +
                             std::to_string(seq) + " (last sequence " +
                             std::to_string(s->last_seq.load(std::memory_order_relaxed)) + ")");
}

EngineStats Engine::Stats() const {
  EngineStats out;
  const std::array<std::uint64_t, 3> counts = impl_->publish_counts.Sum();
  out.published = counts[Impl::kPublished];
  out.unrouted = impl_->unrouted.load(std::memory_order_relaxed);
  out.rejected = impl_->rejected.load(std::memory_order_relaxed);
  out.invalid = impl_->invalid.load(std::memory_order_relaxed);
  out.codec_conversions = impl_->codec_conversions.load(std::memory_order_relaxed);
  out.route_cache_hits = counts[Impl::kRouteCacheHit];
  out.route_cache_misses = counts[Impl::kRouteCacheMiss];
  const auto index = impl_->routes.IndexCacheCounts();
  out.subject_index_cache_hits = index.hits;
  out.subject_index_cache_misses = index.misses;
  std::unique_lock lock(impl_->config_mu);
  for (const auto& s : impl_->streams) {
    if (s->keeps_index && s->config.retention != RetentionPolicy::kLimits) {
      // Acks retire messages without the stream's mutex; when it is free, take them
      // out of the front (first_seq) and, for a file work queue, out of the index
      // (the counts). Never waits: a publisher blocked on a full lane holds it.
      std::unique_lock lock(s->mu, std::try_to_lock);
      if (lock.owns_lock()) {
        s->DrainRemoved();
        s->TrimFront(impl_->clock->NowNanos());
      }
    }
    StreamStats st;
    st.name = s->config.name;
    st.retention = s->config.retention;
    st.incarnation = s->incarnation;
    const engine_internal::StreamState::Live live = s->LiveSnapshot();
    st.messages = static_cast<std::uint64_t>(live.msgs);
    st.bytes = static_cast<std::uint64_t>(live.bytes);
    st.last_seq = s->last_seq.load();
    st.first_seq = s->first_seq.load(std::memory_order_relaxed);
    st.purged = s->retired.purged.load();
    st.stored = s->stored.load();
    st.discarded = s->retired.discarded.load();
    st.rejected = s->rejected.load();
    st.acked_out = s->AckedOut();
    st.duplicates = s->duplicates.load();
    st.duplicate_window_evicted = s->dedup_evicted.load(std::memory_order_relaxed);
    if (const engine_internal::StreamCursors* k = s->cursors_made.load(std::memory_order_acquire); k != nullptr) {
      st.log_bytes = engine_internal::CursorLogBytes(*k);
    }
    out.streams.push_back(std::move(st));
  }
  for (const auto& c : impl_->consumers) {
    ConsumerStats cs;
    cs.stream = c->config.stream;
    cs.name = c->config.name;
    for (std::uint32_t i = 0; i < c->lanes.size(); ++i) {
      const Lane& lane = *c->lanes[i];
      MemberStats ms;
      ms.index = i;
      ms.delivered = lane.delivered();
      ms.queued = lane.ring.size_approx();
      cs.delivered += ms.delivered;
      cs.num_pending += ms.queued;
      cs.deliver_latency_ns.Merge(lane.deliver_latency_ns.Snapshot());
      cs.members.push_back(ms);
    }
    if (c->Cursor()) {
      cs.num_pending = engine_internal::CursorPending(*c);
      if (!cs.members.empty()) cs.members[0].queued = cs.num_pending;
    }
    const bool cursor = c->Cursor();
    c->counts.ForEachCount(cs, [](const std::atomic<std::uint64_t>& from, std::uint64_t& to) {
      to = from.load(std::memory_order_relaxed);
    });
    cs.acked = c->ack_latency_ns.count();  // ConsumerState::ack_latency_ns
    cs.ack_pending = static_cast<std::uint64_t>(
        std::max<std::int64_t>(0, c->Unsettled()));
    if (c->reading_backlog.load(std::memory_order_acquire)) {
      // The messages of the stream from its backlog's position on.
      const engine_internal::StreamState& s = *c->stream;
      const std::uint64_t from = std::max(c->backlog_next_seq.load(std::memory_order_relaxed),
                                          s.first_seq.load(std::memory_order_relaxed));
      const std::uint64_t last = s.last_seq.load(std::memory_order_relaxed);
      if (last >= from) cs.num_pending += last - from + 1;
    }
    {
      std::lock_guard lock(c->pending_mu);
      cs.timers = cursor ? engine_internal::CursorTimers(*c, impl_->clock->NowNanos()) : c->wheel->size();
      cs.num_pending += c->parked.size();
      for (const auto& [seq, p] : c->pending) {
        if (p.attempt + c->PriorDeliveries(seq) > 1) ++cs.num_redelivered;
      }
      if (cursor) cs.num_redelivered = c->cursor->cursor.Redelivering();
      if (!c->tracked && !cursor) {
        cs.num_redelivered = static_cast<std::uint64_t>(
            std::max<std::int64_t>(0, c->redelivered_out.load(std::memory_order_relaxed)));
      }
    }
    for (std::uint32_t i = 0; i < c->lanes.size(); ++i) {
      for (std::size_t k = 0; k < kBatchSizeBuckets; ++k) {
        const std::uint64_t n = c->lanes[i]->batch_sizes[k].load(std::memory_order_relaxed);
        cs.batches_by_size[k] += n;
        cs.batches += n;
      }
      cs.batched_messages += c->lanes[i]->batched_messages.load(std::memory_order_relaxed);
      if (c->lanes[i]->ring.scheduled()) {
        cs.qos = true;
        const QosStats q = c->lanes[i]->ring.QosStatsSnapshot();
        for (std::size_t t = 0; t < kQosTiers; ++t) {
          cs.qos_tiers[t].queued += q.tiers[t].queued;
          cs.qos_tiers[t].served += q.tiers[t].served;
          cs.qos_tiers[t].served_cost += q.tiers[t].served_cost;
          cs.qos_tiers[t].floor_picks += q.tiers[t].floor_picks;
          cs.qos_tiers[t].evicted += q.tiers[t].evicted;
          cs.qos_tiers[t].refused += q.tiers[t].refused;
        }
      }
    }
    cs.policy = std::string(c->policy->name());
    cs.policy_counts = c->policy->Counts();
    cs.group = c->group->Stats();
    cs.ack_latency_ns = c->ack_latency_ns.Snapshot();
    out.consumers.push_back(std::move(cs));
  }
  for (std::size_t i = 0; i < impl_->node_pools.size(); ++i) {
    NodeMemoryStats m;
    m.node = impl_->topology.nodes()[i].index;
    m.arena = impl_->node_binding[i];
    const engine_internal::NodePools& p = *impl_->node_pools[i];
    m.pools = {p.records.Stats()};
    out.memory.push_back(std::move(m));
  }
  if (impl_->flow != nullptr) out.flow = impl_->flow->Snapshot();
  lock.unlock();
  {
    std::lock_guard sources(impl_->stats_sources_mu);
    for (const auto& src : impl_->stats_sources) {
      ComponentStats c;
      c.name = src.name;
      src.fn(c);
      c.name = src.name;
      out.components.push_back(std::move(c));
    }
  }
  return out;
}

absl::StatusOr<std::uint64_t> Engine::AddStatsSource(std::string name, StatsSource source) {
  if (name.empty() || name.size() > 256) {
    return absl::InvalidArgumentError("stats source name '" + name.substr(0, 256) +
                                      "' must be 1..256 bytes");
  }
  if (!source) return absl::InvalidArgumentError("stats source '" + name + "' has no function");
  std::lock_guard lock(impl_->stats_sources_mu);
  for (const auto& s : impl_->stats_sources) {
    if (s.name == name) return absl::AlreadyExistsError("stats source '" + name + "' is attached already");
  }
  const std::uint64_t id = impl_->next_stats_source++;
  impl_->stats_sources.push_back({id, std::move(name), std::move(source)});
  return id;
}

absl::Status Engine::RemoveStatsSource(std::uint64_t id) {
  std::lock_guard lock(impl_->stats_sources_mu);
  auto& v = impl_->stats_sources;
  auto it = std::find_if(v.begin(), v.end(), [&](const auto& s) { return s.id == id; });
  if (it == v.end()) return absl::NotFoundError("no stats source " + std::to_string(id) + " is attached");
  v.erase(it);
  return absl::OkStatus();
}

const StreamStats* EngineStats::stream(std::string_view name) const& {
  for (const auto& s : streams) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const ComponentStats* EngineStats::component(std::string_view name) const& {
  for (const auto& c : components) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const ConsumerStats* EngineStats::consumer(std::string_view stream,
                                           std::string_view name) const& {
  for (const auto& c : consumers) {
    if (c.stream == stream && c.name == name) return &c;
  }
  return nullptr;
}

}  // namespace inferq
