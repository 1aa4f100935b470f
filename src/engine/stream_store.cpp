// File: src/engine/stream_store.cpp
//
// A stream's store behind two calls (stream_state.hpp): Admit (max_age at the
// front, the duplicate window, max_msg_size, discard new, max_bytes) decides whether
// an event may be stored; Append (discard old, the counters, the duplicate window's
// record, retention) stores it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "stream_state.hpp"

namespace inferq {
namespace engine_internal {

Admission StreamState::Admit(const Event& incoming, std::uint64_t bytes, std::int64_t now,
                             bool check_duplicates) {
  TrimFront(now);
  CompactIfSparse();
  Admission a;
  if (dedup != nullptr && !incoming.msg_id.empty() && check_duplicates) {
    dedup->Expire(now);
    if (std::optional<std::uint64_t> original = dedup->Find(incoming.msg_id, now)) {
      a.duplicate_of = original;
      return a;
    }
  }
  const StreamConfig& cfg = config;
  if (cfg.max_msg_size > 0 && bytes > static_cast<std::uint64_t>(cfg.max_msg_size)) {
    a.refusal = absl::InvalidArgumentError(
        "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
        " bytes exceeds max_msg_size " + std::to_string(cfg.max_msg_size));
  } else if (cfg.discard == DiscardPolicy::kNew) {
    const std::int64_t n = live_msgs.load(std::memory_order_relaxed);
    const std::int64_t b = live_bytes.load(std::memory_order_relaxed);
    if (cfg.max_msgs > 0 && n + 1 > cfg.max_msgs) {
      a.refusal = absl::ResourceExhaustedError("stream '" + cfg.name + "' is full: max_msgs " +
                                               std::to_string(cfg.max_msgs) +
                                               " reached (discard new)");
    } else if (cfg.max_bytes > 0 && b + static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
      a.refusal = absl::ResourceExhaustedError(
          "stream '" + cfg.name + "' is full: " + std::to_string(b) + " + " +
          std::to_string(bytes) + " bytes would exceed max_bytes " +
          std::to_string(cfg.max_bytes) + " (discard new)");
    }
  } else if (cfg.max_bytes > 0 && static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
    a.refusal = absl::ResourceExhaustedError(
        "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
        " bytes is larger than max_bytes " + std::to_string(cfg.max_bytes));
  }
  return a;
}

void StreamState::Append(const std::shared_ptr<StoredMessage>& record,
                         const std::shared_ptr<const Event>& shared,
                         const ConvertedEvents& converted, std::int64_t now, std::uint64_t bytes,
                         std::uint32_t explicit_acks, bool record_duplicate) {
  if (config.discard == DiscardPolicy::kOld) MakeRoom(bytes);
  record->event = shared;
  record->converted = converted;  // copies of shared_ptrs: no allocation
  record->stream = this;
  record->seq = next_seq++;
  record->publish_ns = now;
  record->bytes = bytes;
  record->pending_acks.store(explicit_acks, std::memory_order_relaxed);

  live_msgs.fetch_add(1, std::memory_order_relaxed);
  live_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  stored.fetch_add(1, std::memory_order_relaxed);
  last_seq.store(record->seq, std::memory_order_relaxed);
  if (dedup != nullptr && !shared->msg_id.empty() && record_duplicate) {
    dedup->Insert(shared->msg_id, record->seq, now);
    dedup_evicted.store(dedup->evicted(), std::memory_order_relaxed);
  }
  if (config.retention == RetentionPolicy::kInterest && explicit_acks == 0) {
    // Nobody will ack it: under interest retention it is done once queued.
    Retire(*record, kDone);
  } else {
    messages.push_back(record);
  }
}

}  // namespace engine_internal
}  // namespace inferq
