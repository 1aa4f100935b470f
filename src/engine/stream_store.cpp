// File: src/engine/stream_store.cpp
//
// A stream's store behind two calls, inline in stream_state.hpp because every
// publish runs them: Admit (max_age at the front, the duplicate window, then the
// limits) decides whether an event may be stored; Append (discard old, the
// counters, the duplicate window's record, retention) stores it. Here: CheckLimits,
// the limits that refuse an event (max_msg_size, discard new, max_bytes) and their
// messages, off the hot path; removal from the middle of a stream (purges,
// max_msgs_per_subject) and UpdateStream's new limits; and a file stream's log: the
// record of a message (AppendToLog), its removal (RetireLog), its purges file and
// recovery (RecoverOne, FinishRecovery).
//
// Record of a message in the log (little-endian): version u8 (3) | seq u64 |
// wall-clock publish time, ns since the Unix epoch, i64 | stored bytes u64
// (Event::StoredSize) | msg_id length u32 | subject length u32 | msg_id | subject |
// the event as a TensorEvent (event/tensor_event.hpp), its payload in the codec it
// was published with. The msg_id and subject are also in the TensorEvent; they lead
// the record so that recovery restores the duplicate window and the subjects
// (max_msgs_per_subject, purges by subject) without decoding events. Version 2
// records (no subject length, no subject) are read too.
//
// The purges file ("purges" in the stream's directory) keeps what Engine::PurgeStream
// removed from a file stream, since its records stay in the log until their segment
// goes: text lines, "inferq-stream-purges 1", then one "purge <last_seq> <sequence>
// <keep> <filter, or "." for none> <removed_tx>" per purge still needed, oldest first (removed_tx: a
// work queue's removed log's last record when it was made, 0 for other streams), then
// "end <XXH3-64 of everything before, hex>". It is replaced atomically on each purge.
// (Files of older versions also hold one "dedup <seq> <wall ns> <msg_id in hex>" line
// per id of the duplicate window; recovery reads them. The window's ids now outlive
// their records in the dedup log instead: SaveDedupBelow.)
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
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

constexpr std::uint8_t kRecordVersion = 3;
constexpr std::uint8_t kRecordVersionNoSubject = 2;
constexpr std::size_t kRecordHeaderBytesV2 = 1 + 8 + 8 + 8 + 4;
constexpr std::size_t kRecordHeaderBytes = kRecordHeaderBytesV2 + 4;

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
  std::optional<std::string_view> subject;  // nullopt: a version 2 record
  std::string_view wire;
  std::string why;  // empty when parsed
};

ParsedRecord ParseRecord(std::string_view value) {
  ParsedRecord r;
  const int version = value.empty() ? -1 : static_cast<unsigned char>(value[0]);
  const std::size_t header =
      version == kRecordVersion ? kRecordHeaderBytes : kRecordHeaderBytesV2;
  if ((version != kRecordVersion && version != kRecordVersionNoSubject) ||
      value.size() < header) {
    r.why = "not a message record (" + std::to_string(value.size()) + " bytes, version " +
            std::to_string(version) + ")";
    return r;
  }
  r.seq = GetU64(value, 1);
  r.wall_ns = static_cast<std::int64_t>(GetU64(value, 9));
  r.bytes = GetU64(value, 17);
  const std::uint64_t id_len = GetU32(value, 25);
  const std::uint64_t subject_len = version == kRecordVersion ? GetU32(value, 29) : 0;
  if (id_len + subject_len > value.size() - header) {
    r.why = "msg_id of " + std::to_string(id_len) + " bytes and subject of " +
            std::to_string(subject_len) + " bytes run past the record's " +
            std::to_string(value.size()) + " bytes";
    return r;
  }
  r.msg_id = value.substr(header, id_len);
  if (version == kRecordVersion) r.subject = value.substr(header + id_len, subject_len);
  r.wire = value.substr(header + id_len + subject_len);
  return r;
}

// msg_ids in an older purges file: lowercase hex (absl::BytesToHexString); reading
// back checks every digit first (absl::HexStringToBytes does not).
bool Unhex(std::string_view hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  *out = absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()));
  return true;
}

std::string Hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A wall-clock time read back from disk as an age at recovery (never negative: a
// clock set back makes it 0), for the engine clock's `now_ns` taken at `wall_now_ns`.
std::int64_t AgeAt(std::int64_t wall_ns, std::int64_t wall_now_ns) {
  return std::max<std::int64_t>(0, SatSub(wall_now_ns, wall_ns));
}

constexpr std::string_view kPurgesFile = "purges";
constexpr std::string_view kPurgesMagic = "inferq-stream-purges 1";

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
  record.reserve(kRecordHeaderBytes + ev.msg_id.size() + ev.subject.size() + wire->size());
  record.push_back(static_cast<char>(kRecordVersion));
  PutU64(record, next_seq);
  PutU64(record, static_cast<std::uint64_t>(absl::ToUnixNanos(absl::Now())));
  PutU64(record, bytes);
  PutU32(record, static_cast<std::uint32_t>(ev.msg_id.size()));
  PutU32(record, static_cast<std::uint32_t>(ev.subject.size()));
  record.append(ev.msg_id);
  record.append(ev.subject);
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
  if (removed_log != nullptr && first >= floor_recorded + 64) RecordFloor(false);
  // The window's ids of the records about to go are saved first; when they cannot
  // be, the segments stay (a restart reads the ids from them).
  // (Every publish of a file stream comes here: the log is asked only when the front
  // moved past what was saved.)
  if (dedup != nullptr && first > dedup_saved_below && !SaveDedupBelow(log->RetireBound(first))) {
    return;
  }
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
  // The purges file and the removed log, once the log holds the directory's lock (it
  // replays records).
  if (!purges_loaded) {
    if (absl::Status st = LoadPurges(); !st.ok()) return st;
    if (absl::Status st = LoadDedupLog(now_ns, wall_now_ns); !st.ok()) return st;
    if (absl::Status st = OpenRemovedLog(); !st.ok()) return st;
  }
  // The purges made before this message was stored apply to what came before it.
  while (recovery_next_purge < purges.size() && purges[recovery_next_purge].last_seq < r.seq) {
    if (absl::Status st = ReplayPurge(purges[recovery_next_purge]); !st.ok()) return st;
    ++recovery_next_purge;
  }
  // The age it had at recovery, on the engine clock.
  const std::int64_t age_ns = AgeAt(r.wall_ns, wall_now_ns);
  const std::int64_t publish_ns = SatSub(now_ns, age_ns);
  index.push_back(IndexEntry::Of(r.seq, publish_ns, r.bytes, location));
  next_seq = r.seq + 1;
  BumpUnderMu(added_msgs, 1, std::memory_order_release);  // LiveSnapshot
  BumpUnderMu(added_bytes, static_cast<std::int64_t>(r.bytes), std::memory_order_release);
  BumpUnderMu(stored, 1);
  last_seq.store(r.seq, std::memory_order_relaxed);
  // Only what is still inside the window (older ids would be expired at once), and
  // not what the dedup log (or an older purges file) restored already.
  if (dedup != nullptr && !r.msg_id.empty() && age_ns <= dedup->window_ns() &&
      r.seq > dedup_snapshot_seq) {
    dedup->Insert(std::string(r.msg_id), r.seq, publish_ns);
  }
  if (NeedsRecoverySubjects()) {
    std::string subject;
    if (r.subject.has_value()) {
      subject = std::string(*r.subject);
    } else {  // a version 2 record: the subject is in the event only
      DecodeOptions d;
      d.keep_compressed = true;
      absl::StatusOr<Event> ev = Decode(
          std::span<const std::byte>(reinterpret_cast<const std::byte*>(r.wire.data()),
                                     r.wire.size()),
          d);
      if (!ev.ok()) {
        return absl::DataLossError("stream '" + config.name + "': log " +
                                   QuoteValue(config.directory) + " record " +
                                   std::to_string(tx) + ": " + std::string(ev.status().message()));
      }
      subject = std::move(ev->subject);
    }
    recovery_subjects.push_back(std::move(subject));
  }
  return absl::OkStatus();
}

bool StreamState::NeedsRecoverySubjects() const {
  if (config.max_msgs_per_subject > 0) return true;
  for (std::size_t i = recovery_next_purge; i < purges.size(); ++i) {
    if (purges[i].filter.has_value()) return true;
  }
  return false;
}

void StreamState::ReplayRemoved(std::uint64_t up_to_tx) {
  for (; recovery_next_removed < recovery_removed.size() &&
         recovery_removed[recovery_next_removed].tx <= up_to_tx;
       ++recovery_next_removed) {
    RemoveSeq(recovery_removed[recovery_next_removed].seq,
              recovery_removed[recovery_next_removed].why);
  }
}

absl::Status StreamState::ReplayPurge(const Purge& p) {
  ReplayRemoved(p.removed_tx);
  absl::StatusOr<std::vector<std::uint64_t>> victims =
      PurgeVictims(p, [&](std::size_t i, std::uint64_t) -> absl::StatusOr<std::string> {
        return recovery_subjects[i];
      });
  if (!victims.ok()) return victims.status();
  for (std::uint64_t seq : *victims) RemoveSeq(seq, Removal::kPurge);
  return absl::OkStatus();
}

absl::StatusOr<Handle> StreamState::LoadFromLog(const IndexEntry& e) const {
  auto bad = [&](absl::StatusCode code, const std::string& why) {
    return absl::Status(code, "stream '" + config.name + "': log " +
                                  QuoteValue(config.directory) + " message " +
                                  std::to_string(e.seq) + ": " + why);
  };
  absl::StatusOr<std::string> value = log->Read(e.location());
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
  auto record = std::make_shared<StoredMessage>(*std::move(ev));
  record->stream = const_cast<StreamState*>(this);
  record->seq = e.seq;
  record->publish_ns = e.publish_ns;
  record->bytes = e.bytes;
  return record;
}

absl::Status StreamState::FinishRecovery(std::int64_t now_ns, std::int64_t wall_now_ns) {
  if (!purges_loaded) {  // a log without records
    if (absl::Status st = LoadPurges(); !st.ok()) return st;
    if (absl::Status st = LoadDedupLog(now_ns, wall_now_ns); !st.ok()) return st;
    if (absl::Status st = OpenRemovedLog(); !st.ok()) return st;
  }
  // The purges made after the last record still in the log. One that names
  // records beyond the log's last (a power cut took the log's tail, which the
  // policy had not promised to keep, after the purges file was synced) applies to
  // what the log has; the ids of those lost records leave the duplicate window, so
  // that a publish of them again is stored (it was never acknowledged as durable).
  const std::uint64_t log_last = std::max(log->last_tx(), next_seq - 1);
  bool clamped = false;
  for (; recovery_next_purge < purges.size(); ++recovery_next_purge) {
    Purge& p = purges[recovery_next_purge];
    if (p.last_seq > log_last) {
      p.last_seq = log_last;
      clamped = true;
    }
    if (absl::Status st = ReplayPurge(p); !st.ok()) return st;
    next_seq = std::max(next_seq, p.last_seq + 1);
  }
  if (clamped) {
    if (dedup != nullptr) dedup->ForgetAbove(log_last);
    // Written back clamped: the sequences it named are given to new messages now,
    // which a purge made before them must never remove at the next recovery.
    bool renamed = false;
    if (absl::Status st = WritePurges(purges, &renamed); !st.ok()) return st;
  }
  ReplayRemoved(UINT64_MAX);  // the removals made after the last purge
  recovery_removed = {};
  if (config.max_msgs_per_subject > 0) {
    // The subjects' lists from what recovery kept (recovery_subjects is in step with
    // the index: nothing was dropped from it yet); a limit lowered since removes
    // more now, and records it.
    if (absl::Status st = OpenRemovedLog(); !st.ok()) return st;
    for (std::size_t i = 0; i < index.size(); ++i) {
      if (index.at(i).removed == 0) LimitSubject(recovery_subjects[i], index.at(i).seq);
    }
  }
  recovering = false;
  recovery_subjects = {};
  // What max_msgs, max_bytes and max_age trimmed, as far as a floor record says
  // (limits raised since must not bring it back).
  while (!index.empty() && index.front().seq < recovered_floor) PopIndexFront();
  if (log->last_tx() >= next_seq) next_seq = log->last_tx() + 1;
  recovered_next_seq = next_seq;
  if (absl::Status st = VoidRemovalsAbove(next_seq - 1); !st.ok()) return st;
  TrimFront(now_ns);
  if (dedup != nullptr) {
    dedup->Expire(now_ns);
    dedup_evicted.store(dedup->evicted(), std::memory_order_relaxed);
  }
  // Limits lowered since the stream was written apply now.
  while ((config.max_msgs > 0 && LiveMsgs() > config.max_msgs) ||
         (config.max_bytes > 0 && LiveBytes() > config.max_bytes)) {
    if (index.empty()) break;
    PopIndexFront();
  }
  AfterRemovals();
  // The ids below the log's first record are in the dedup log, or were lost by a
  // version that did not keep one; from here on those of each retired segment are.
  const std::uint64_t log_first = log->Stats().first_tx;
  dedup_saved_below = std::max(dedup_saved_below, log_first != 0 ? log_first : next_seq);
  RetireLog();
  return absl::OkStatus();
}

// ---- A file stream's side logs: removed, dedup. ----

StreamLogOptions StreamState::SideLogOptions(std::string_view name) const {
  StreamLogOptions lo;
  lo.dir = config.directory + "/" + std::string(name);
  lo.sync = config.sync;
  lo.group_commit_window = config.sync_window;
  lo.segment_bytes = std::min<std::uint64_t>(config.segment_bytes, std::uint64_t{4} << 20);
  lo.file_system = fs;
  return lo;
}

namespace {
constexpr std::string_view kDedupDir = "dedup";
}  // namespace

absl::Status StreamState::LoadDedupLog(std::int64_t now_ns, std::int64_t wall_now_ns) {
  if (dedup == nullptr) {
    recovery_dedup = {};
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<std::string>> names = fs->List(config.directory);
  if (names.ok() && std::find(names->begin(), names->end(), kDedupDir) != names->end()) {
    const StreamLogOptions lo = SideLogOptions(kDedupDir);
    absl::StatusOr<std::unique_ptr<StreamLog>> opened =
        StreamLog::Open(lo, [&](const StreamLog::Entry& e) -> absl::Status {
          // Ids one after another: seq u64 | wall ns i64 | length u32 | msg_id.
          std::int64_t newest_wall = INT64_MIN;
          for (std::size_t at = 0; at < e.value.size();) {
            if (e.value.size() - at < 20 || GetU32(e.value, at + 16) > e.value.size() - at - 20) {
              return absl::DataLossError("stream '" + config.name + "': dedup log " +
                                         QuoteValue(lo.dir) + " record " + std::to_string(e.tx) +
                                         " is damaged at byte " + std::to_string(at) + " of " +
                                         std::to_string(e.value.size()) +
                                         " (not a sequence, a time and a msg_id)");
            }
            const auto wall = static_cast<std::int64_t>(GetU64(e.value, at + 8));
            const std::uint32_t len = GetU32(e.value, at + 16);
            recovery_dedup.push_back({GetU64(e.value, at), wall, std::string(e.value.substr(at + 20, len))});
            newest_wall = std::max(newest_wall, wall);
            at += 20 + len;
          }
          if (e.value.empty()) {
            return absl::DataLossError("stream '" + config.name + "': dedup log " +
                                       QuoteValue(lo.dir) + " record " + std::to_string(e.tx) +
                                       " is empty");
          }
          dedup_saves.emplace_back(e.tx, SatSub(now_ns, AgeAt(newest_wall, wall_now_ns)));
          return absl::OkStatus();
        });
    if (!opened.ok()) {
      std::string msg(opened.status().message());
      if (msg.rfind("stream '", 0) != 0) {
        msg = "stream '" + config.name + "': dedup log " + QuoteValue(lo.dir) + ": " + msg;
      }
      return absl::Status(opened.status().code(), std::move(msg));
    }
    dedup_log = *std::move(opened);
  }
  // Oldest first, each id once (an older purges file and the dedup log may both
  // hold one), as the window was filled.
  std::stable_sort(recovery_dedup.begin(), recovery_dedup.end(),
                   [](const SavedId& a, const SavedId& b) { return a.seq < b.seq; });
  std::uint64_t last = 0;
  for (const SavedId& s : recovery_dedup) {
    if (s.seq <= last && last != 0) continue;
    last = s.seq;
    const std::int64_t age_ns = AgeAt(s.wall_ns, wall_now_ns);
    if (age_ns <= dedup->window_ns()) dedup->Insert(s.id, s.seq, SatSub(now_ns, age_ns));
  }
  dedup_snapshot_seq = std::max(dedup_snapshot_seq, last);
  dedup_saved_below = last + 1;
  recovery_dedup = {};
  return absl::OkStatus();
}

bool StreamState::SaveDedupBelow(std::uint64_t below) {
  if (below <= dedup_saved_below) return true;
  const std::int64_t now_ns = clock->NowNanos();
  const std::int64_t wall_now = absl::ToUnixNanos(absl::Now());
  std::string record;
  std::uint64_t last_tx = 0;
  std::int64_t newest = INT64_MIN;
  bool failed = false;
  // Ids go in records of up to 1 MiB, so that a frame (and its SHA-256) is paid per
  // save, not per id: one frame per id cost file_loop 25 % more instructions per
  // event (BENCHMARKS.md).
  auto flush = [&] {
    if (failed || record.empty()) return;
    if (dedup_log == nullptr) {
      absl::StatusOr<std::unique_ptr<StreamLog>> opened = StreamLog::Open(
          SideLogOptions(kDedupDir), [](const StreamLog::Entry&) { return absl::OkStatus(); });
      if (!opened.ok()) {
        failed = true;
        return;
      }
      dedup_log = *std::move(opened);
    }
    absl::StatusOr<StreamLog::Entry> e = dedup_log->Append(record);
    if (!e.ok()) {
      failed = true;
      return;
    }
    last_tx = e->tx;
    record.clear();
  };
  dedup->ForEachInRange(dedup_saved_below, below, now_ns,
                        [&](std::string_view id, std::uint64_t seq, std::int64_t accepted_ns) {
    PutU64(record, seq);
    PutU64(record, static_cast<std::uint64_t>(SatSub(wall_now, SatSub(now_ns, accepted_ns))));
    PutU32(record, static_cast<std::uint32_t>(id.size()));
    record.append(id);
    newest = accepted_ns;
    if (record.size() >= (std::size_t{1} << 20)) flush();
  });
  flush();
  if (failed) return false;
  if (last_tx != 0) {
    if (!dedup_log->Sync(last_tx).ok()) return false;
    dedup_saves.emplace_back(last_tx, newest);
  }
  dedup_saved_below = below;
  // The saves whose ids have all expired.
  std::uint64_t retire_below = 0;
  while (!dedup_saves.empty() &&
         SatAdd(dedup_saves.front().second, dedup->window_ns()) <= now_ns) {
    retire_below = dedup_saves.front().first + 1;
    dedup_saves.pop_front();
  }
  // A failed removal leaves the segment for the next call.
  if (retire_below != 0 && dedup_log != nullptr) (void)dedup_log->RetireBefore(retire_below);
  return true;
}

// ---- A file stream's removed log. ----

absl::Status StreamState::OpenRemovedLog(bool force) {
  if (removed_log != nullptr) return absl::OkStatus();
  if (!force && config.retention != RetentionPolicy::kWorkQueue &&
      config.max_msgs_per_subject <= 0 && config.max_msgs <= 0 && config.max_bytes <= 0 &&
      config.max_age <= absl::ZeroDuration()) {
    // Opened only where removals are recorded, or were under an earlier config.
    absl::StatusOr<std::vector<std::string>> names = fs->List(config.directory);
    if (!names.ok() || std::find(names->begin(), names->end(), "removed") == names->end()) {
      return absl::OkStatus();
    }
  }
  const StreamLogOptions lo = SideLogOptions("removed");
  // Records 'a' (a work queue's ack) and 'l' (max_msgs_per_subject) remove their
  // sequence; 'f' (a front trim: RecordFloor) every sequence below its own; 'v'
  // voids the earlier records naming a sequence above its own (written by
  // FinishRecovery when a power cut took the stream log's tail: the next publishes
  // reuse those sequences), and lowers an earlier floor to one above it.
  struct Loaded {
    std::uint64_t tx;
    std::uint64_t seq;
    char kind;
    StreamLog::Location at;
  };
  std::vector<Loaded> loaded;
  absl::StatusOr<std::unique_ptr<StreamLog>> opened =
      StreamLog::Open(lo, [&](const StreamLog::Entry& e) -> absl::Status {
        if (e.value.size() != 9 || (e.value[8] != 'a' && e.value[8] != 'l' && e.value[8] != 'v' &&
                                    e.value[8] != 'f')) {
          return absl::DataLossError("stream '" + config.name + "': removed log " +
                                     QuoteValue(lo.dir) + " record " + std::to_string(e.tx) +
                                     " holds " + std::to_string(e.value.size()) +
                                     " bytes, not a removal");
        }
        loaded.push_back({e.tx, GetU64(e.value, 0), e.value[8], e.location});
        return absl::OkStatus();
      });
  if (!opened.ok()) {
    std::string msg(opened.status().message());
    if (msg.rfind("stream '", 0) != 0) {
      msg = "stream '" + config.name + "': removed log " + QuoteValue(lo.dir) + ": " + msg;
    }
    return absl::Status(opened.status().code(), std::move(msg));
  }
  // Voided records count for nothing, not even for retirement (a void's own
  // sequence keeps the segments before it until the stream's log passes it).
  for (std::size_t i = 0; i < loaded.size(); ++i) {
    if (loaded[i].kind != 'v') continue;
    for (std::size_t j = 0; j < i; ++j) {
      if (loaded[j].kind == 'f') {
        loaded[j].seq = std::min(loaded[j].seq, loaded[i].seq + 1);
      } else if (loaded[j].kind != 'v' && loaded[j].seq > loaded[i].seq) {
        loaded[j].kind = 'x';
      }
    }
  }
  std::uint64_t max_seq = 0;
  for (const Loaded& r : loaded) {
    if (r.kind == 'a' || r.kind == 'l') {
      recovery_removed.push_back({r.tx, r.seq, r.kind == 'a' ? Removal::kAck : Removal::kLimit});
    }
    if (r.kind == 'f') {
      recovered_floor = std::max(recovered_floor, r.seq);
      // It speaks of the sequences below its own.
      if (r.seq > 0) max_seq = std::max(max_seq, r.seq - 1);
    } else if (r.kind != 'x') {
      max_seq = std::max(max_seq, r.seq);
    }
    NoteRemovedRecord(r.at, r.tx, max_seq);
  }
  floor_recorded = recovered_floor;
  removed_log = *std::move(opened);
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> StreamState::RecordRemoval(std::uint64_t seq, Removal why,
                                                         bool pending) {
  std::string value;
  PutU64(value, seq);
  value.push_back(why == Removal::kAck ? 'a' : 'l');
  std::lock_guard lock(removed_mu);
  absl::StatusOr<StreamLog::Entry> e = removed_log->Append(value);
  if (!e.ok()) {
    return absl::Status(e.status().code(), "stream '" + config.name + "': removed log " +
                                               QuoteValue(removed_log->dir()) + ": " +
                                               std::string(e.status().message()));
  }
  NoteRemovedRecord(e->location, e->tx, std::max(seq, RemovedMaxSeq()));
  if (pending) {
    removed_seqs.insert(seq);
    // release: a delivery that sees the count sees the set (Discarded).
    removed_count.store(removed_seqs.ranges(), std::memory_order_release);
    removed_pending.push_back(seq);
    has_removed_pending.store(true, std::memory_order_relaxed);
  }
  return e->tx;
}

absl::Status StreamState::VoidRemovalsAbove(std::uint64_t last) {
  if (removed_log == nullptr) return absl::OkStatus();
  std::lock_guard lock(removed_mu);
  if (removed_max.empty() || RemovedMaxSeq() <= last) return absl::OkStatus();
  std::string value;
  PutU64(value, last);
  value.push_back('v');
  absl::StatusOr<StreamLog::Entry> e = removed_log->Append(value);
  absl::Status st = e.ok() ? removed_log->Sync(e->tx) : e.status();
  if (!st.ok()) {
    return absl::Status(st.code(), "stream '" + config.name + "': removed log " +
                                       QuoteValue(removed_log->dir()) +
                                       ": voiding the removals of sequences above " +
                                       std::to_string(last) + ", which a power cut took from "
                                       "the stream's log: " + std::string(st.message()));
  }
  // Every record it voids named a sequence above `last`, and every other one at most
  // `last`: the running maxima are `last` at most from here on.
  for (RemovedSegment& r : removed_max) r.max_seq = std::min(r.max_seq, last);
  NoteRemovedRecord(e->location, e->tx, last);
  floor_recorded = std::min(floor_recorded, last + 1);
  return absl::OkStatus();
}

void StreamState::RecordFloor(bool force) {
  if (removed_log == nullptr || deleted) return;
  const std::uint64_t first = index.empty() ? next_seq : index.front().seq;
  if (first <= floor_recorded || (!force && first - floor_recorded < 64)) return;
  std::string value;
  PutU64(value, first);
  value.push_back('f');
  {
    std::lock_guard lock(removed_mu);
    absl::StatusOr<StreamLog::Entry> e = removed_log->Append(value);
    if (!e.ok()) return;  // the removed log failed: publishes are refused from now on (Admit)
    NoteRemovedRecord(e->location, e->tx, std::max(first - 1, RemovedMaxSeq()));
  }
  floor_recorded = first;
  if (++limit_records % 64 == 0) RetireRemovedLog();
}

absl::StatusOr<std::uint64_t> StreamState::AckOut(std::uint64_t seq) {
  return RecordRemoval(seq, Removal::kAck, /*pending=*/true);
}

void StreamState::DrainRemoved(std::uint64_t* removed_tx) {
  if (removed_log == nullptr) return;
  std::vector<std::uint64_t> taken;
  {
    std::lock_guard lock(removed_mu);
    taken.swap(removed_pending);
    has_removed_pending.store(false, std::memory_order_relaxed);
    if (removed_tx != nullptr) *removed_tx = removed_log->last_tx();
  }
  if (taken.empty()) return;
  for (std::uint64_t seq : taken) RemoveSeq(seq, Removal::kAck);
  AfterRemovals();
  RetireLog();
  RetireRemovedLog();
}

void StreamState::RetireRemovedLog() {
  if (removed_log == nullptr) return;
  // The removed log's records that speak only of messages below the stream log's
  // first record are needed no more (a restart cannot recover those messages).
  const std::uint64_t log_first = log->Stats().first_tx;
  const std::uint64_t first = log_first != 0 ? log_first : next_seq;
  std::uint64_t retire_below = 0;
  {
    std::lock_guard lock(removed_mu);
    while (!removed_max.empty() && removed_max.front().max_seq < first) {
      retire_below = removed_max.front().tx + 1;
      removed_max.pop_front();
    }
  }
  // A failed removal leaves the segment for the next call.
  if (retire_below != 0) (void)removed_log->RetireBefore(retire_below);
}

// ---- Removal from the middle: purges, max_msgs_per_subject, UpdateStream. ----

namespace {

// Position of the first element of `q` whose sequence is not below `seq`.
template <class Q, class SeqOf>
std::size_t LowerBound(const Q& q, std::uint64_t seq, SeqOf seq_of) {
  std::size_t lo = 0;
  std::size_t hi = q.size();
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (seq_of(q.at(mid)) < seq) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace

bool StreamState::RemoveSeq(std::uint64_t seq, Removal why) {
  if (is_file()) {
    const std::size_t i = LowerBound(index, seq, [](const IndexEntry& e) { return e.seq; });
    if (i == index.size() || index.at(i).seq != seq || index.at(i).removed != 0) return false;
    IndexEntry& e = index.at(i);
    RetireEntry(e, why);
    e.removed = 1;
    ++removed_in_index;
    std::lock_guard lock(removed_mu);
    removed_seqs.insert(seq);
    // release: a delivery that sees the count sees the set (Discarded).
    removed_count.store(removed_seqs.ranges(), std::memory_order_release);
    return true;
  }
  const std::size_t i = LowerBound(messages, seq, [](const Handle& h) { return h->seq; });
  if (i == messages.size() || messages.at(i)->seq != seq) return false;
  return Retire(*messages.at(i), kDiscarded, why == Removal::kPurge);
}

void StreamState::AfterRemovals() {
  if (is_file()) {
    PublishFirstKept();  // drops removed entries at the front
    if (removed_in_index >= 64 && removed_in_index * 2 > index.size()) {
      index.erase_if([](const IndexEntry& e) { return e.removed != 0; });
      removed_in_index = 0;
    }
  } else {
    bool popped = false;
    while (!messages.empty() &&
           messages.front()->state.load(std::memory_order_acquire) != kLive) {
      messages.pop_front();
      popped = true;
    }
    if (popped || messages.empty()) NoteFront();
    CompactIfSparse();
  }
  if (per_subject.size() > 64 &&
      per_subject.size() > 2 * static_cast<std::size_t>(std::max<std::int64_t>(0, LiveMsgs()))) {
    PruneSubjects();
  }
}

void StreamState::PruneSubjects() {
  // Subjects whose messages are all gone (their newest sequence included).
  for (auto it = per_subject.begin(); it != per_subject.end();) {
    if (Holds(it->second.back())) {
      ++it;
    } else {
      per_subject.erase(it++);
    }
  }
}

bool StreamState::Holds(std::uint64_t seq) const {
  if (is_file()) {
    const std::size_t i = LowerBound(index, seq, [](const IndexEntry& e) { return e.seq; });
    if (i == index.size() || index.at(i).seq != seq || index.at(i).removed != 0) return false;
    if (removed_count.load(std::memory_order_acquire) == 0) return true;
    std::lock_guard lock(removed_mu);  // an ack not yet drained (AckOut)
    return !removed_seqs.contains(seq);
  }
  const std::size_t i = LowerBound(messages, seq, [](const Handle& h) { return h->seq; });
  return i < messages.size() && messages.at(i)->seq == seq &&
         messages.at(i)->state.load(std::memory_order_acquire) == kLive;
}

void StreamState::LimitSubject(std::string_view subject, std::uint64_t seq) {
  auto it = per_subject.find(absl::string_view(subject.data(), subject.size()));
  if (it == per_subject.end()) {
    // Subjects whose messages all went (limits, max_age, purges) leave once they
    // outnumber the messages held twice over: amortised O(1) per new subject, and
    // the map stays within the subjects that hold messages (found by the
    // adversarial helper: 1 M unique subjects under max_msgs 100 kept 1 M entries).
    if (!recovering && per_subject.size() >= 64 &&
        per_subject.size() > 2 * static_cast<std::size_t>(std::max<std::int64_t>(0, LiveMsgs()))) {
      PruneSubjects();
    }
    // Built in place: GCC 12 warned (-Wmaybe-uninitialized) of a moved empty InlinedVector.
    it = per_subject.try_emplace(std::string(subject)).first;
  }
  SubjectSeqs& seqs = it->second;
  seqs.push_back(seq);
  const auto limit = static_cast<std::size_t>(config.max_msgs_per_subject);
  if (seqs.size() <= limit) return;
  // Sequences removed otherwise (limits, purges, a work queue's acks, which need not
  // be the oldest) leave first, so that only what the stream holds is counted.
  SubjectSeqs held;
  for (std::size_t i = seqs.head; i < seqs.seqs.size(); ++i) {
    if (Holds(seqs.seqs[i])) held.push_back(seqs.seqs[i]);
  }
  seqs = std::move(held);
  bool removed = false;
  while (seqs.size() > limit) {
    const std::uint64_t oldest = seqs.front();
    seqs.pop_front();
    if (!RemoveSeq(oldest, Removal::kLimit)) continue;
    removed = true;
    if (removed_log != nullptr) {
      // Recorded, so that a restart with a higher limit (or none) does not bring it
      // back. A failed record fails the removed log, and publishes are refused
      // (Admit) from then on.
      absl::StatusOr<std::uint64_t> tx = RecordRemoval(oldest, Removal::kLimit, /*pending=*/false);
      if (tx.ok()) limit_removed_tx = *tx;
      if (++limit_records % 256 == 0 && !recovering) RetireRemovedLog();
    }
  }
  if (removed && !recovering) AfterRemovals();
}

absl::StatusOr<std::vector<std::uint64_t>> StreamState::PurgeVictims(
    const Purge& p,
    absl::FunctionRef<absl::StatusOr<std::string>(std::size_t, std::uint64_t)> subject_at) const {
  std::vector<std::uint64_t> matching;
  const std::size_t n = is_file() ? index.size() : messages.size();
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t seq;
    if (is_file()) {
      const IndexEntry& e = index.at(i);
      if (e.removed != 0) continue;
      seq = e.seq;
    } else {
      const Handle& h = messages.at(i);
      if (h->state.load(std::memory_order_acquire) != kLive) continue;
      seq = h->seq;
    }
    if (p.sequence != 0 && seq >= p.sequence) break;
    if (p.filter.has_value()) {
      absl::StatusOr<std::string> subject = subject_at(i, seq);
      if (!subject.ok()) return subject.status();
      if (!p.filter->Matches(*subject)) continue;
    }
    matching.push_back(seq);
  }
  if (p.keep > 0) {
    matching.resize(matching.size() > p.keep ? matching.size() - p.keep : 0);
  }
  return matching;
}

absl::StatusOr<std::string> StreamState::SubjectFromLog(const IndexEntry& e) const {
  absl::StatusOr<std::string> value = log->Read(e.location());
  if (value.ok()) {
    const ParsedRecord r = ParseRecord(*value);
    if (r.why.empty() && r.seq == e.seq && r.subject.has_value()) return std::string(*r.subject);
  }
  // Errors, and version 2 records, through the full read.
  absl::StatusOr<Handle> h = LoadFromLog(e);
  if (!h.ok()) return h.status();
  return (*h)->event->subject;
}

absl::Status StreamState::WritePurges(const std::vector<Purge>& list, bool* renamed) {
  *renamed = false;
  std::string text(kPurgesMagic);
  text.push_back('\n');
  for (const Purge& p : list) {
    text += "purge " + std::to_string(p.last_seq) + " " + std::to_string(p.sequence) + " " +
            std::to_string(p.keep) + " " + (p.filter ? p.filter->text() : std::string(".")) +
            " " + std::to_string(p.removed_tx) + "\n";
  }
  text += "end " + Hex64(XXH3_64bits(text.data(), text.size())) + "\n";

  FileSystem& fs = *this->fs;
  const std::string dir = log->dir();
  const std::string path = dir + "/" + std::string(kPurgesFile);
  const std::string tmp = path + ".tmp";
  auto fail = [&](const absl::Status& st) {
    (void)fs.Remove(tmp);
    return absl::Status(st.code(), "stream '" + config.name + "': writing " + QuoteValue(path) +
                                       ": " + std::string(st.message()));
  };
  (void)fs.Remove(tmp);  // one a crash left behind
  absl::StatusOr<std::unique_ptr<WritableFile>> f = fs.Create(tmp);
  if (!f.ok()) return fail(f.status());
  absl::Status st = (*f)->WriteAt(0, text);
  if (st.ok()) st = (*f)->Sync();
  if (absl::Status closed = (*f)->Close(); st.ok()) st = closed;
  if (st.ok()) st = fs.Rename(tmp, path);
  if (!st.ok()) return fail(st);
  *renamed = true;
  // The rename made durable; when this fails the new file is in place (a restart
  // reads it) but may not survive a power loss.
  if (absl::Status synced = fs.SyncDir(dir); !synced.ok()) {
    return absl::Status(synced.code(), "stream '" + config.name + "': syncing the directory of " +
                                           QuoteValue(path) + ": " +
                                           std::string(synced.message()));
  }
  return absl::OkStatus();
}

absl::Status StreamState::LoadPurges() {
  const std::string path = config.directory + "/" + std::string(kPurgesFile);
  absl::StatusOr<std::string> text = fs->Read(path);
  if (!text.ok()) {
    if (text.status().code() == absl::StatusCode::kNotFound) {
      purges_loaded = true;
      return absl::OkStatus();
    }
    return absl::Status(text.status().code(), "stream '" + config.name + "': reading " +
                                                  QuoteValue(path) + ": " +
                                                  std::string(text.status().message()));
  }
  auto damaged = [&](const std::string& why) {
    return absl::DataLossError("stream '" + config.name + "': purges file " + QuoteValue(path) +
                               " is damaged: " + why);
  };
  const std::size_t end = text->rfind("end ");
  if (end == std::string::npos || (end != 0 && (*text)[end - 1] != '\n')) {
    return damaged("no end line");
  }
  std::string_view body(text->data(), end);
  std::string_view tail(text->data() + end + 4, text->size() - end - 4);
  if (tail != Hex64(XXH3_64bits(body.data(), body.size())) + "\n") {
    return damaged("its checksum does not match");
  }
  std::vector<Purge> list;
  std::size_t line_no = 0;
  std::string id;
  for (absl::string_view split : absl::StrSplit(absl::string_view(body.data(), body.size()),
                                                '\n', absl::SkipEmpty())) {
    const std::string_view line(split.data(), split.size());
    ++line_no;
    auto bad = [&] { return damaged("line " + std::to_string(line_no) + " " + QuoteValue(line)); };
    if (line_no == 1) {
      if (line != kPurgesMagic) return bad();
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(absl::string_view(line.data(), line.size()), ' ');
    if (f[0] == "purge" && f.size() == 6) {
      Purge p;
      if (!absl::SimpleAtoi(f[1], &p.last_seq) || !absl::SimpleAtoi(f[2], &p.sequence) ||
          !absl::SimpleAtoi(f[3], &p.keep) || !absl::SimpleAtoi(f[5], &p.removed_tx) ||
          (p.sequence != 0 && p.keep != 0)) {
        return bad();
      }
      if (f[4] != ".") {  // "." (never a valid pattern): no filter
        absl::StatusOr<SubjectPattern> pattern = SubjectPattern::Parse(std::string(f[4]));
        if (!pattern.ok()) return bad();
        p.filter = *std::move(pattern);
      }
      if (!list.empty() && p.last_seq < list.back().last_seq) return bad();
      list.push_back(std::move(p));
    } else if (f[0] == "dedup" && f.size() == 4) {
      std::uint64_t seq = 0;
      std::int64_t wall_ns = 0;
      if (!absl::SimpleAtoi(f[1], &seq) || !absl::SimpleAtoi(f[2], &wall_ns) ||
          !Unhex(std::string_view(f[3].data(), f[3].size()), &id)) {
        return bad();
      }
      if (dedup != nullptr) recovery_dedup.push_back({seq, wall_ns, id});
    } else {
      return bad();
    }
  }
  purges = std::move(list);
  purges_loaded = true;
  return absl::OkStatus();
}

void StreamState::ApplyLimits(std::int64_t now_ns,
                              const std::vector<std::pair<std::string, std::uint64_t>>* held) {
  TrimFront(now_ns);
  // Lowered max_msgs / max_bytes remove the oldest, whichever the discard policy.
  auto over = [&] {
    return (config.max_msgs > 0 && LiveMsgs() > config.max_msgs) ||
           (config.max_bytes > 0 && LiveBytes() > config.max_bytes);
  };
  if (log != nullptr) {
    while (!index.empty() && over()) PopIndexFront();
    PublishFirstKept();
  } else {
    while (!messages.empty() && over()) {
      Retire(*messages.front(), kDiscarded);
      messages.pop_front();
    }
    NoteFront();
  }
  // max_msgs_per_subject: the lists rebuilt from what the stream holds (`held`,
  // HeldSubjects read before anything changed) when the limit changed; when it did
  // not, the lists stay right (the removals above take each subject's oldest).
  if (config.max_msgs_per_subject <= 0) {
    per_subject.clear();
  } else if (held != nullptr) {
    per_subject.clear();
    for (const auto& [subject, seq] : *held) {
      if (Holds(seq)) LimitSubject(subject, seq);
    }
  }
  AfterRemovals();
  if (log != nullptr) {
    // The new front is recorded at once (not after 64 more trims), so that what the
    // new limits removed stays removed after a restart, also a crash, whatever the
    // next run's limits. Best effort: a removed log that cannot be opened or written
    // refuses the next publishes (Admit), and a restart may bring the messages back.
    const std::uint64_t first = index.empty() ? next_seq : index.front().seq;
    if (first > floor_recorded && (removed_log != nullptr || OpenRemovedLog(/*force=*/true).ok())) {
      RecordFloor(/*force=*/true);
    }
    RetireLog();
  }
}

absl::StatusOr<std::vector<std::pair<std::string, std::uint64_t>>> StreamState::HeldSubjects()
    const {
  std::vector<std::pair<std::string, std::uint64_t>> held;
  const std::size_t n = log != nullptr ? index.size() : messages.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (log != nullptr) {
      const IndexEntry& e = index.at(i);
      if (e.removed != 0) continue;
      absl::StatusOr<std::string> subject = SubjectFromLog(e);
      if (!subject.ok()) return subject.status();
      held.emplace_back(*std::move(subject), e.seq);
    } else {
      const Handle& h = messages.at(i);
      if (h->state.load(std::memory_order_acquire) != kLive) continue;
      held.emplace_back(h->event->subject, h->seq);
    }
  }
  return held;
}

}  // namespace engine_internal
}  // namespace inferq
