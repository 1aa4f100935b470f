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
// Record of a message in the log (little-endian): version u8 (2) | seq u64 |
// wall-clock publish time, ns since the Unix epoch, i64 | stored bytes u64
// (Event::StoredSize) | msg_id length u32 | msg_id | the event as a TensorEvent
// (event/tensor_event.hpp), its payload in the codec it was published with. The
// msg_id is also in the TensorEvent; it leads the record so that recovery restores
// the duplicate window without decoding events.
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

constexpr std::uint8_t kRecordVersion = 2;
constexpr std::size_t kRecordHeaderBytes = 1 + 8 + 8 + 8 + 4;

void PutU32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint64_t GetU64(std::string_view in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
  return v;
}
std::uint32_t GetU32(std::string_view in, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
  return v;
}

// The parts of a message record (the layout above); `why` says what is wrong when
// the bytes are not one.
struct ParsedRecord {
  std::uint64_t seq = 0;
  std::int64_t wall_ns = 0;
  std::uint64_t bytes = 0;
  std::string_view msg_id;
  std::string_view wire;
  std::string why;  // empty when parsed
};

ParsedRecord ParseRecord(std::string_view value) {
  ParsedRecord r;
  if (value.size() < kRecordHeaderBytes || value[0] != static_cast<char>(kRecordVersion)) {
    r.why = "not a message record (" + std::to_string(value.size()) + " bytes, version " +
            std::to_string(value.empty() ? -1 : static_cast<int>(value[0])) + ")";
    return r;
  }
  r.seq = GetU64(value, 1);
  r.wall_ns = static_cast<std::int64_t>(GetU64(value, 9));
  r.bytes = GetU64(value, 17);
  const std::uint32_t id_len = GetU32(value, 25);
  if (id_len > value.size() - kRecordHeaderBytes) {
    r.why = "msg_id of " + std::to_string(id_len) + " bytes runs past the record's " +
            std::to_string(value.size()) + " bytes";
    return r;
  }
  r.msg_id = value.substr(kRecordHeaderBytes, id_len);
  r.wire = value.substr(kRecordHeaderBytes + id_len);
  return r;
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
  record.reserve(kRecordHeaderBytes + ev.msg_id.size() + wire->size());
  record.push_back(static_cast<char>(kRecordVersion));
  PutU64(record, next_seq);
  PutU64(record, static_cast<std::uint64_t>(absl::ToUnixNanos(absl::Now())));
  PutU64(record, bytes);
  PutU32(record, static_cast<std::uint32_t>(ev.msg_id.size()));
  record.append(ev.msg_id);
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
  appended_at = e->location;
  return absl::OkStatus();
}

void StreamState::RetireLog() {
  const std::uint64_t first = index.empty() ? next_seq : index.front().seq;
  // A failed removal leaves the segment for the next call; the log stays correct.
  (void)log->RetireBefore(first);
}

absl::Status StreamState::RecoverOne(std::uint64_t tx, const StreamLog::Location& location,
                                     std::string_view value, std::int64_t now_ns,
                                     std::int64_t wall_now_ns) {
  const ParsedRecord r = ParseRecord(value);
  if (!r.why.empty() || r.seq != tx) {
    return absl::DataLossError("stream '" + config.name + "': log " +
                               QuoteValue(config.directory) + " record " + std::to_string(tx) +
                               ": " + (r.why.empty() ? "holds sequence " + std::to_string(r.seq) : r.why));
  }
  // The age it had at recovery, on the engine clock.
  const std::int64_t age_ns = std::max<std::int64_t>(0, wall_now_ns - r.wall_ns);
  const std::int64_t publish_ns = now_ns - age_ns;
  index.push_back(IndexEntry{r.seq, publish_ns, r.bytes, location});
  next_seq = r.seq + 1;
  added_msgs.fetch_add(1, std::memory_order_relaxed);
  added_bytes.fetch_add(static_cast<std::int64_t>(r.bytes), std::memory_order_relaxed);
  stored.fetch_add(1, std::memory_order_relaxed);
  last_seq.store(r.seq, std::memory_order_relaxed);
  // Only what is still inside the window: older ids would be expired at once.
  if (dedup != nullptr && !r.msg_id.empty() && age_ns <= dedup->window_ns()) {
    dedup->Insert(std::string(r.msg_id), r.seq, publish_ns);
  }
  return absl::OkStatus();
}

absl::StatusOr<Handle> StreamState::LoadFromLog(const IndexEntry& e) const {
  auto bad = [&](absl::StatusCode code, const std::string& why) {
    return absl::Status(code, "stream '" + config.name + "': log " +
                                  QuoteValue(config.directory) + " message " +
                                  std::to_string(e.seq) + ": " + why);
  };
  absl::StatusOr<std::string> value = log->Read(e.location);
  if (!value.ok()) return bad(value.status().code(), std::string(value.status().message()));
  const ParsedRecord r = ParseRecord(*value);
  if (!r.why.empty()) return bad(absl::StatusCode::kDataLoss, r.why);
  if (r.seq != e.seq) {
    return bad(absl::StatusCode::kDataLoss, "the record there holds sequence " + std::to_string(r.seq));
  }
  DecodeOptions d;
  d.keep_compressed = true;
  absl::StatusOr<Event> ev = Decode(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(r.wire.data()), r.wire.size()), d);
  if (!ev.ok()) return bad(absl::StatusCode::kDataLoss, std::string(ev.status().message()));
  auto record = std::make_shared<StoredMessage>();
  record->event = std::make_shared<const Event>(*std::move(ev));
  record->stream = const_cast<StreamState*>(this);
  record->seq = e.seq;
  record->publish_ns = e.publish_ns;
  record->bytes = e.bytes;
  return record;
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
    if (index.empty()) break;
    RetireEntry(index.front());
    index.pop_front();
  }
  PublishFirstKept();
  RetireLog();
}

}  // namespace engine_internal
}  // namespace inferq
