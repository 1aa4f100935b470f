// File: src/engine/stream_store.cpp
//
// A stream's store behind two calls, inline in stream_state.hpp because every
// publish runs them: Admit (max_age at the front, the duplicate window, then the
// limits) decides whether an event may be stored; Append (discard old, the
// counters, the duplicate window's record, retention) stores it. Here: CheckLimits,
// the limits that refuse an event (max_msg_size, discard new, max_bytes) and their
// messages, off the hot path; and a file stream's log: the record of a message
// (AppendToLog), its removal (RetireLog) and recovery (RecoverOne, FinishRecovery).
//
// Record of a message in the log (little-endian): version u8 (1) | seq u64 |
// wall-clock publish time, ns since the Unix epoch, i64 | stored bytes u64
// (Event::StoredSize) | the event as a TensorEvent (event/tensor_event.hpp), its
// payload in the codec it was published with.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "inferq/base/error.hpp"
#include "inferq/event/tensor_event.hpp"
#include "stream_state.hpp"

namespace inferq {
namespace engine_internal {

absl::Status StreamState::CheckLimits(std::uint64_t bytes) const {
  const StreamConfig& cfg = config;
  if (cfg.max_msg_size > 0 && bytes > static_cast<std::uint64_t>(cfg.max_msg_size)) {
    return absl::InvalidArgumentError(
        "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
        " bytes exceeds max_msg_size " + std::to_string(cfg.max_msg_size));
  }
  if (cfg.discard == DiscardPolicy::kNew) {
    const std::int64_t n = LiveMsgs();
    const std::int64_t b = LiveBytes();
    if (cfg.max_msgs > 0 && n + 1 > cfg.max_msgs) {
      return absl::ResourceExhaustedError("stream '" + cfg.name + "' is full: max_msgs " +
                                          std::to_string(cfg.max_msgs) +
                                          " reached (discard new)");
    }
    if (cfg.max_bytes > 0 && b + static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
      return absl::ResourceExhaustedError(
          "stream '" + cfg.name + "' is full: " + std::to_string(b) + " + " +
          std::to_string(bytes) + " bytes would exceed max_bytes " +
          std::to_string(cfg.max_bytes) + " (discard new)");
    }
    return absl::OkStatus();
  }
  if (cfg.max_bytes > 0 && static_cast<std::int64_t>(bytes) > cfg.max_bytes) {
    return absl::ResourceExhaustedError(
        "stream '" + cfg.name + "': message of " + std::to_string(bytes) +
        " bytes is larger than max_bytes " + std::to_string(cfg.max_bytes));
  }
  return absl::OkStatus();
}

namespace {

constexpr std::size_t kRecordHeaderBytes = 1 + 8 + 8 + 8;

void PutU64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t GetU64(std::string_view in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
  return v;
}

}  // namespace

absl::Status StreamState::AppendToLog(const Event& ev, std::uint64_t bytes) {
  EncodeOptions eo;
  eo.codec = ev.codec;
  eo.dictionaries = dictionaries;
  absl::StatusOr<Buffer> wire = Encode(ev, eo);
  if (!wire.ok()) {
    return absl::Status(wire.status().code(), "stream '" + config.name +
                                                  "': cannot encode the message for its log: " +
                                                  std::string(wire.status().message()));
  }
  std::string record;
  record.reserve(kRecordHeaderBytes + wire->size());
  record.push_back(1);
  PutU64(record, next_seq);
  PutU64(record, static_cast<std::uint64_t>(absl::ToUnixNanos(absl::Now())));
  PutU64(record, bytes);
  const auto span = wire->span();
  record.append(reinterpret_cast<const char*>(span.data()), span.size());
  absl::StatusOr<StreamLog::Entry> e = log->Append(record);
  if (!e.ok()) {
    return absl::Status(e.status().code(), "stream '" + config.name + "': log " +
                                               QuoteValue(config.directory) + ": " +
                                               std::string(e.status().message()));
  }
  if (e->tx != next_seq) {  // the invariant of StreamState::log
    return absl::InternalError("stream '" + config.name + "': log tx_id " +
                               std::to_string(e->tx) + " is not the sequence " +
                               std::to_string(next_seq));
  }
  return absl::OkStatus();
}

void StreamState::RetireLog() {
  const std::uint64_t first = messages.empty() ? next_seq : messages.front()->seq;
  // A failed removal leaves the segment for the next call; the log stays correct.
  (void)log->RetireBefore(first);
}

absl::Status StreamState::RecoverOne(std::uint64_t tx, std::string_view value,
                                     std::int64_t now_ns, std::int64_t wall_now_ns) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError("stream '" + config.name + "': log " +
                               QuoteValue(config.directory) + " record " + std::to_string(tx) +
                               ": " + why);
  };
  if (value.size() < kRecordHeaderBytes || value[0] != 1) {
    return bad("not a message record (" + std::to_string(value.size()) + " bytes, version " +
               std::to_string(value.empty() ? -1 : static_cast<int>(value[0])) + ")");
  }
  const std::uint64_t seq = GetU64(value, 1);
  const auto wall_ns = static_cast<std::int64_t>(GetU64(value, 9));
  const std::uint64_t bytes = GetU64(value, 17);
  if (seq != tx) return bad("holds sequence " + std::to_string(seq));
  const std::string_view wire = value.substr(kRecordHeaderBytes);
  DecodeOptions d;
  d.keep_compressed = true;
  absl::StatusOr<Event> ev =
      Decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(wire.data()), wire.size()), d);
  if (!ev.ok()) return bad(std::string(ev.status().message()));
  auto record = std::make_shared<StoredMessage>();
  record->event = std::make_shared<const Event>(*std::move(ev));
  record->stream = this;
  record->seq = seq;
  // The age it had at recovery, on the engine clock.
  record->publish_ns = now_ns - std::max<std::int64_t>(0, wall_now_ns - wall_ns);
  record->bytes = bytes;
  next_seq = seq + 1;
  added_msgs.fetch_add(1, std::memory_order_relaxed);
  added_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
  stored.fetch_add(1, std::memory_order_relaxed);
  last_seq.store(seq, std::memory_order_relaxed);
  if (dedup != nullptr && !record->event->msg_id.empty()) {
    dedup->Insert(record->event->msg_id, seq, record->publish_ns);
  }
  messages.push_back(std::move(record));
  return absl::OkStatus();
}

void StreamState::FinishRecovery(std::int64_t now_ns) {
  if (log->last_tx() >= next_seq) next_seq = log->last_tx() + 1;
  recovered_next_seq = next_seq;
  TrimFront(now_ns);
  if (dedup != nullptr) {
    dedup->Expire(now_ns);
    dedup_evicted.store(dedup->evicted(), std::memory_order_relaxed);
  }
  // Limits lowered since the stream was written apply now.
  while ((config.max_msgs > 0 && LiveMsgs() > config.max_msgs) ||
         (config.max_bytes > 0 && LiveBytes() > config.max_bytes)) {
    if (messages.empty()) break;
    Retire(*messages.front(), kDiscarded);
    messages.pop_front();
  }
  RetireLog();
}

}  // namespace engine_internal
}  // namespace inferq
