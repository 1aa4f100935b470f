// File: src/state/stream_log.cpp
//
// StreamLog (inferq/state/stream_log.hpp): appends, syncs, reads, retirement and
// recovery of a segmented record log in the Delta-State Log's formats
// (log_format.hpp). A record is a frame whose payload holds one op, kCreate of key
// "r" with the caller's bytes as its value.
//
// Lock order: mu_ (appends, segments, the failed state) before sync_mu_ (the
// durable tx_id and the one fdatasync under way). A Sync leader holds neither while
// it fdatasyncs, and takes mu_ only after letting go of sync_mu_.
#include "inferq/state/stream_log.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <xxhash.h>

#include "absl/base/thread_annotations.h"
#include "inferq/base/error.hpp"
#include "log_format.hpp"
#include "log_options.hpp"
#include "recovery.hpp"

namespace inferq {

using namespace state_internal;  // NOLINT: private implementation file

namespace {

constexpr std::string_view kRecordKey = "r";

std::string LogSegmentName(std::uint64_t first_tx) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "log-%020llu.seg", static_cast<unsigned long long>(first_tx));
  return buf;
}

std::string SealName(std::uint64_t first_tx) {
  std::string name = LogSegmentName(first_tx);
  name.replace(name.size() - 4, 4, ".seal");
  return name;
}

// The first tx_id in a name `log-<20 digits><suffix>` (".seg" or ".seal").
std::optional<std::uint64_t> ParseLogName(std::string_view name, std::string_view suffix) {
  if (name.size() != 24 + suffix.size() || name.substr(0, 4) != "log-" || name.substr(24) != suffix) {
    return std::nullopt;
  }
  std::uint64_t v = 0;
  for (char c : name.substr(4, 20)) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}
std::optional<std::uint64_t> ParseLogSegmentName(std::string_view name) {
  return ParseLogName(name, ".seg");
}

std::size_t LastNonZeroFrom(std::string_view s, std::size_t from) {
  std::size_t end = s.size();
  while (end > from && s[end - 1] == '\0') --end;
  return end;
}

std::string AtOffset(const std::string& name, std::uint64_t off) {
  return QuoteValue(name) + " at offset " + std::to_string(off);
}

// Bytes of the frame of a value of `n` bytes (log_format.hpp's layout).
std::uint64_t FrameBytes(std::size_t n) {
  return kFrameHeaderBytes + 8 + 32 + 4 + 1 + 4 + 4 + kRecordKey.size() + n;
}

}  // namespace

class StreamLog::Impl {
 public:
  explicit Impl(StreamLogOptions o)
      : opt_(std::move(o)), fs_(opt_.file_system), seg_sum_(XXH3_createState()) {
    if (seg_sum_ == nullptr) throw std::bad_alloc();
  }

  ~Impl() {
    {
      std::lock_guard l(sync_mu_);
      stopping_ = true;
    }
    sync_cv_.notify_all();
    if (interval_.joinable()) interval_.join();
    std::lock_guard lock(mu_);
    if (file_ != nullptr) {
      if (opt_.sync == SyncPolicy::kInterval && failed_.ok() &&
          written_tx_.load() > durable_tx_.load()) {
        (void)file_->Sync();  // a clean close keeps the interval's promise early
      }
      (void)file_->Close();
    }
    XXH3_freeState(seg_sum_);
  }

  absl::Status Recover(RecoverFn on_record) {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = fs_->CreateDir(opt_.dir); !st.ok()) return st;
    auto lock = fs_->Lock(JoinPath(opt_.dir, "LOCK"));
    if (!lock.ok()) return lock.status();
    dir_lock_ = std::move(*lock);
    auto names = fs_->List(opt_.dir);
    if (!names.ok()) return names.status();
    std::vector<std::pair<std::uint64_t, std::string>> files;
    std::vector<std::uint64_t> seals;
    bool has_identity = false;
    for (const std::string& n : *names) {
      if (n == "IDENTITY") has_identity = true;
      if (auto tx = ParseLogSegmentName(n)) files.emplace_back(*tx, n);
      if (auto tx = ParseLogName(n, ".seal")) seals.push_back(*tx);
    }
    std::sort(seals.begin(), seals.end());
    std::sort(files.begin(), files.end());
    (void)fs_->Remove(JoinPath(opt_.dir, "IDENTITY.tmp"));  // a create that did not finish
    if (has_identity) {
      auto id = fs_->Read(JoinPath(opt_.dir, "IDENTITY"));
      if (!id.ok()) return id.status();
      auto decoded = DecodeIdentity(*id);
      if (!decoded.ok()) {
        return absl::DataLossError("stream log " + QuoteValue(opt_.dir) + ": " +
                                   std::string(decoded.status().message()));
      }
      store_id_ = *decoded;
    } else if (!files.empty()) {
      return absl::DataLossError("stream log " + QuoteValue(opt_.dir) + " has segment " +
                                 QuoteValue(files.front().second) + " but no IDENTITY file");
    } else {
      store_id_ = RandomSalt();
      if (auto st = WriteIdentity(); !st.ok()) return st;
    }

    const bool strict = opt_.recovery == RecoveryMode::kStrict;
    std::uint64_t seen_tx = 0;
    Hash seen_hash{};
    std::uint64_t expected_first = 0;  // first_tx the next segment must have (0: any)
    std::uint64_t dirty_begin = 0, dirty_end = 0;
    bool removed = false;
    std::string buf;            // one segment at a time, its memory reused
    std::uint64_t buf_tx = 0;   // the segment buf holds
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto& [name_tx, name] = files[i];
      const bool last = i + 1 == files.size();
      const std::string path = JoinPath(opt_.dir, name);
      if (auto st = fs_->ReadInto(path, buf); !st.ok()) return st;
      buf_tx = name_tx;
      const std::string_view bytes = buf;
      auto header = DecodeSegmentHeader(bytes);
      if (!header.ok()) {
        // A crash while creating the last segment leaves a short or zeroed header and
        // nothing after it (nothing is appended before the header is synced).
        const bool torn =
            last && LastNonZeroFrom(bytes, std::min<std::size_t>(bytes.size(), kSegmentHeaderBytes)) <=
                        kSegmentHeaderBytes;
        if (!torn || strict) {
          return absl::DataLossError("stream log segment " + AtOffset(name, 0) +
                                     " (after tx_id " + std::to_string(seen_tx) +
                                     "): " + std::string(header.status().message()));
        }
        // A segment after the first is created while the one before it is still there
        // (retirement keeps the tail), so a torn create with none before it is the
        // first segment's: a log's only segment named past tx_id 1 with no header
        // lost what it held (a file truncated, say), found by the adversarial helper.
        if (i == 0 && name_tx != 1) {
          return absl::DataLossError("stream log segment " + QuoteValue(name) + " holds " +
                                     std::to_string(bytes.size()) +
                                     " bytes and no valid header, and no segment precedes it: "
                                     "tx_ids from " + std::to_string(name_tx) +
                                     " on are lost (" + std::string(header.status().message()) +
                                     ")");
        }
        if (auto st = fs_->Remove(path); !st.ok()) return st;
        torn_tail_bytes_ += bytes.size();
        removed = true;
        break;
      }
      if (header->store_id != store_id_) {
        return absl::DataLossError("stream log segment " + AtOffset(name, 0) +
                                   " belongs to another log (store id " +
                                   StoreIdHex(header->store_id) + "; IDENTITY says " +
                                   StoreIdHex(store_id_) + ")");
      }
      if (header->first_tx != name_tx) {
        return absl::DataLossError("stream log segment " + AtOffset(name, 0) +
                                   ": header says first tx_id " +
                                   std::to_string(header->first_tx) + ", the name says " +
                                   std::to_string(name_tx));
      }
      if (expected_first != 0 && name_tx != expected_first) {
        return absl::DataLossError("tx_id gap at stream log segment " + AtOffset(name, 0) +
                                   ": expected first tx_id " + std::to_string(expected_first) +
                                   ", found " + std::to_string(name_tx));
      }
      Seg seg{name, name_tx, header->salt, kSegmentHeaderBytes, bytes.size(), 0};
      if (!last && !strict && std::binary_search(seals.begin(), seals.end(), name_tx)) {
        absl::StatusOr<bool> sealed = RecoverSealed(seg, bytes, seen_tx, seen_hash, on_record);
        if (!sealed.ok()) return sealed.status();
        if (*sealed) {
          seen_tx = seg.last_tx;
          seen_hash = sealed_head_;
          expected_first = seg.last_tx + 1;
          segments_.emplace(name_tx, std::move(seg));
          continue;
        }
      }
      std::uint64_t want = name_tx;
      std::size_t off = kSegmentHeaderBytes;
      while (off < bytes.size()) {
        DecodedFrame f = DecodeFrame(bytes, off, header->salt);
        if (f.status != FrameStatus::kOk) {
          const std::size_t nonzero_end = LastNonZeroFrom(bytes, off);
          if (nonzero_end == off) break;  // zero-filled ahead: the clean end
          const auto later = FindNextFrame(bytes, off + 1, header->salt);
          if (last && !later && !strict) {
            torn_tail_bytes_ += nonzero_end - off;
            dirty_begin = off;
            dirty_end = nonzero_end;
            break;
          }
          std::string msg = std::string(last && !later ? "torn tail in stream log segment "
                                                       : "damaged record in stream log segment ") +
                            AtOffset(name, off) + " after tx_id " + std::to_string(seen_tx) +
                            ": " + f.why;
          if (later) msg += "; valid records follow at offset " + std::to_string(*later);
          if (last && !later) msg += " (strict recovery)";
          return absl::DataLossError(msg);
        }
        const std::uint64_t tx = f.record.tx_id;
        if (tx != want) {
          return absl::DataLossError("tx_id gap in stream log segment " + AtOffset(name, off) +
                                     ": expected tx_id " + std::to_string(want) + ", found " +
                                     std::to_string(tx));
        }
        if (seen_tx != 0 && f.record.prev_hash != seen_hash) {
          return absl::DataLossError("broken hash chain at tx_id " + std::to_string(tx) +
                                     " in stream log segment " + AtOffset(name, off));
        }
        if (f.record.ops.size() != 1 || f.record.ops[0].key != kRecordKey) {
          return absl::DataLossError("stream log segment " + AtOffset(name, off) + ": tx_id " +
                                     std::to_string(tx) + " is not a stream log record");
        }
        Entry e{tx, {name_tx, off, static_cast<std::uint32_t>(f.size)}, f.record.ops[0].value};
        if (auto st = on_record(e); !st.ok()) return st;
        ++recovered_;
        seen_tx = tx;
        seen_hash = f.hash;
        want = tx + 1;
        off += f.size;
        seg.bytes = off;
        seg.last_tx = tx;
      }
      expected_first = want;
      segments_.emplace(name_tx, std::move(seg));
    }
    if (removed) {
      if (auto st = fs_->SyncDir(opt_.dir); !st.ok()) return st;
    }
    // Seals of retired segments, and the tail's (a crash between its seal and the next
    // segment's creation; it is appended to again now): a seal only ever speaks for a
    // segment that no longer changes.
    for (std::uint64_t tx : seals) {
      if (!segments_.contains(tx) || tx == segments_.rbegin()->first) {
        (void)fs_->Remove(JoinPath(opt_.dir, SealName(tx)));
      }
    }
    head_hash_ = seen_hash;
    if (segments_.empty()) {
      next_tx_ = expected_first != 0 ? expected_first : 1;
      if (auto st = CreateSegment(next_tx_); !st.ok()) return st;
    } else {
      Seg& tail = segments_.rbegin()->second;
      next_tx_ = tail.last_tx != 0 ? tail.last_tx + 1 : tail.first_tx;
      auto f = fs_->OpenForWrite(JoinPath(opt_.dir, tail.name));
      if (!f.ok()) return f.status();
      file_ = std::shared_ptr<WritableFile>(std::move(*f));
      // Zeros are written ahead again from the last record (or the torn bytes zeroed
      // below), not taken as there: the file's zeros may be a hole (a sparse copy of
      // the directory), and a mapped append into a hole on a full disk is SIGBUS, not
      // an error. Found by the adversarial helper.
      allocated_ = std::max<std::uint64_t>(tail.bytes, dirty_end);
      MapCurrent();
      // The tail's running checksum, for its seal: what it holds so far.
      if (buf_tx != tail.first_tx) {
        if (auto st = fs_->ReadInto(JoinPath(opt_.dir, tail.name), buf); !st.ok()) return st;
      }
      if (buf.size() < tail.bytes) {
        return absl::DataLossError("stream log segment " + QuoteValue(tail.name) +
                                   " shrank while it was recovered");
      }
      XXH3_64bits_reset(seg_sum_);
      XXH3_64bits_update(seg_sum_, buf.data(), tail.bytes);
      if (dirty_end > dirty_begin) {
        // No byte of a torn tail may be read back after the records written over it.
        if (auto st = WriteZeros(dirty_begin, dirty_end - dirty_begin); !st.ok()) return st;
        if (auto st = file_->Sync(); !st.ok()) return st;
      }
    }
    first_tx_ = segments_.begin()->second.last_tx != 0 ? segments_.begin()->second.first_tx : next_tx_;
    if (seen_tx == 0) first_tx_ = next_tx_;
    written_tx_.store(next_tx_ - 1);
    // What recovery read was on disk: written before this Open, and synced at least as
    // far as the file system kept it. Later Syncs start from here.
    durable_tx_.store(next_tx_ - 1);
    recovery_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (opt_.sync == SyncPolicy::kInterval) interval_ = std::thread([this] { IntervalLoop(); });
    return absl::OkStatus();
  }

  absl::StatusOr<Entry> Append(std::string_view value) {
    if (value.size() > kMaxValueBytes) {
      return absl::InvalidArgumentError("stream log record of " + std::to_string(value.size()) +
                                        " bytes is larger than " + std::to_string(kMaxValueBytes));
    }
    std::lock_guard lock(mu_);
    if (!failed_.ok()) return FailedError();
    const std::uint64_t need = FrameBytes(value.size());
    Seg* cur = &segments_.rbegin()->second;
    if (cur->last_tx != 0 && cur->bytes + need > opt_.segment_bytes) {
      if (auto st = RotateLocked(); !st.ok()) return st;
      cur = &segments_.rbegin()->second;
    }
    Record r;
    r.tx_id = next_tx_;
    r.prev_hash = head_hash_;
    r.ops.push_back(Op{OpCode::kCreate, std::string(kRecordKey), std::string(value)});
    frame_.clear();
    const Hash h = AppendFrame(frame_, cur->salt, r);
    if (auto st = Preallocate(cur->bytes + frame_.size() + 1); !st.ok()) return Fail(st);
    if (map_ != nullptr && cur->bytes + frame_.size() <= map_bytes_) {
      // Below allocated_ (zeros written ahead): in the page cache once copied, as
      // after a pwrite, without the system call.
      std::memcpy(map_ + cur->bytes, frame_.data(), frame_.size());
      ++mapped_appends_;
    } else if (auto st = file_->WriteAt(cur->bytes, frame_); !st.ok()) {
      return Fail(st);
    }
    XXH3_64bits_update(seg_sum_, frame_.data(), frame_.size());
    Entry e{next_tx_, {cur->first_tx, cur->bytes, static_cast<std::uint32_t>(frame_.size())}, {}};
    cur->bytes += frame_.size();
    cur->last_tx = next_tx_;
    head_hash_ = h;
    ++next_tx_;
    ++appends_;
    bytes_appended_ += frame_.size();
    written_tx_.store(e.tx, std::memory_order_release);
    return e;
  }

  absl::Status Sync(std::uint64_t tx) {
    if (tx == 0 || tx > written_tx_.load(std::memory_order_acquire)) {
      return absl::InvalidArgumentError("stream log " + QuoteValue(opt_.dir) + ": tx_id " +
                                        std::to_string(tx) + " was not appended (last is " +
                                        std::to_string(written_tx_.load()) + ")");
    }
    if (opt_.sync == SyncPolicy::kInterval || opt_.sync == SyncPolicy::kNone) {
      return absl::OkStatus();  // in the OS since Append returned
    }
    return SyncUpTo(tx, opt_.sync == SyncPolicy::kGroupCommit ? opt_.group_commit_window
                                                              : absl::ZeroDuration());
  }

  absl::StatusOr<std::string> Read(const Location& at) const {
    std::string name;
    std::uint64_t salt = 0;
    {
      std::lock_guard lock(mu_);
      auto it = segments_.find(at.segment);
      if (it == segments_.end()) {
        return absl::NotFoundError("stream log " + QuoteValue(opt_.dir) + " has no segment " +
                                   std::to_string(at.segment) + " (retired)");
      }
      name = it->second.name;
      salt = it->second.salt;
    }
    auto bytes = fs_->ReadAt(JoinPath(opt_.dir, name), at.offset, at.bytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == absl::StatusCode::kNotFound) {
        return absl::NotFoundError("stream log segment " + QuoteValue(name) + " was retired");
      }
      return bytes.status();
    }
    DecodedFrame f = DecodeFrame(*bytes, 0, salt);
    if (f.status != FrameStatus::kOk || f.size != at.bytes || f.record.ops.size() != 1) {
      return absl::DataLossError("stream log segment " + AtOffset(name, at.offset) +
                                 " holds no record of " + std::to_string(at.bytes) +
                                 " bytes: " + (f.why.empty() ? "wrong size" : f.why));
    }
    return std::move(f.record.ops[0].value);
  }

  absl::Status RetireBefore(std::uint64_t tx) {
    std::lock_guard lock(mu_);
    bool any = false;
    while (segments_.size() > 1) {
      auto first = segments_.begin();
      auto second = std::next(first);
      if (second->second.first_tx > tx) break;  // `first` holds tx_ids >= ... < second's
      // The seal first: a segment left without one is verified frame by frame.
      if (auto st = fs_->Remove(JoinPath(opt_.dir, SealName(first->second.first_tx)));
          !st.ok() && st.code() != absl::StatusCode::kNotFound) {
        return st;
      }
      if (auto st = fs_->Remove(JoinPath(opt_.dir, first->second.name)); !st.ok()) return st;
      segments_.erase(first);
      any = true;
    }
    const Seg& head = segments_.begin()->second;
    first_tx_ = head.last_tx != 0 || segments_.size() > 1 ? head.first_tx : next_tx_;
    if (any) return fs_->SyncDir(opt_.dir);
    return absl::OkStatus();
  }

  std::uint64_t RetireBound(std::uint64_t tx) const {
    std::lock_guard lock(mu_);
    // As RetireBefore: the segment kept first is the last one that starts at or
    // below `tx`, or the first (the one appended to is never removed).
    std::uint64_t bound = segments_.begin()->second.first_tx;
    for (auto it = std::next(segments_.begin()); it != segments_.end(); ++it) {
      if (it->second.first_tx > tx) break;
      bound = it->second.first_tx;
    }
    return bound;
  }

  absl::Status Rotate() {
    std::lock_guard lock(mu_);
    if (!failed_.ok()) return FailedError();
    if (segments_.rbegin()->second.last_tx == 0) return absl::OkStatus();
    return RotateLocked();
  }

  std::uint64_t last_tx() const { return written_tx_.load(std::memory_order_acquire); }
  bool failed() const { return failed_flag_.load(std::memory_order_acquire); }
  absl::Status failure() const {
    std::lock_guard lock(mu_);
    return failed_;
  }

  StreamLogStats Stats() const {
    StreamLogStats s;
    std::lock_guard lock(mu_);
    s.first_tx = first_tx_ < next_tx_ ? first_tx_ : 0;
    s.last_tx = next_tx_ - 1;
    s.durable_tx = durable_tx_.load();
    s.appends = appends_;
    s.mapped_appends = mapped_appends_;
    s.syncs = syncs_.load();
    s.bytes_appended = bytes_appended_;
    s.segments = segments_.size();
    for (const auto& [tx, seg] : segments_) s.disk_bytes += std::max(seg.bytes, seg.file_bytes);
    s.recovered_records = recovered_;
    s.sealed_segments = sealed_segments_;
    s.torn_tail_bytes = torn_tail_bytes_;
    s.recovery_ms = recovery_ms_;
    s.failed = !failed_.ok();
    return s;
  }

  const std::string& dir() const { return opt_.dir; }
  std::uint64_t store_id() const { return store_id_; }

 private:
  struct Seg {
    std::string name;
    std::uint64_t first_tx = 0;
    std::uint64_t salt = 0;
    std::uint64_t bytes = 0;       // end of the last record: where appends go
    std::uint64_t file_bytes = 0;  // file size when recovered (zero-filled space)
    std::uint64_t last_tx = 0;     // 0: no record yet
  };

  absl::Status WriteIdentity() {
    const std::string tmp = JoinPath(opt_.dir, "IDENTITY.tmp");
    auto f = fs_->Create(tmp);
    if (!f.ok()) return f.status();
    absl::Status st = (*f)->WriteAt(0, EncodeIdentity(store_id_));
    if (st.ok()) st = (*f)->Sync();
    if (absl::Status cl = (*f)->Close(); st.ok()) st = cl;
    if (st.ok()) st = fs_->Rename(tmp, JoinPath(opt_.dir, "IDENTITY"));
    if (st.ok()) st = fs_->SyncDir(opt_.dir);
    if (!st.ok()) (void)fs_->Remove(tmp);  // nothing half made is left behind
    return st;
  }

  absl::Status CreateSegment(std::uint64_t first_tx) {
    const std::uint64_t salt = RandomSalt();
    const std::string name = LogSegmentName(first_tx);
    const std::string path = JoinPath(opt_.dir, name);
    auto f = fs_->Create(path);
    if (!f.ok()) return f.status();
    std::shared_ptr<WritableFile> file(std::move(*f));
    absl::Status st = file->WriteAt(0, EncodeSegmentHeader(store_id_, salt, first_tx));
    if (st.ok()) st = file->Sync();
    if (st.ok()) st = fs_->SyncDir(opt_.dir);
    if (!st.ok()) {
      (void)file->Close();
      (void)fs_->Remove(path);
      return st;
    }
    segments_.emplace(first_tx, Seg{name, first_tx, salt, kSegmentHeaderBytes, kSegmentHeaderBytes, 0});
    const std::string header = EncodeSegmentHeader(store_id_, salt, first_tx);
    XXH3_64bits_reset(seg_sum_);
    XXH3_64bits_update(seg_sum_, header.data(), header.size());
    // Not Close()d here: a Sync leader may hold the old file (SyncUpTo takes it under
    // mu_ and fdatasyncs it outside), and a closed one would fail its fdatasync and
    // with it the log. The last reference closes it (and drops its mapping).
    file_ = std::move(file);
    allocated_ = kSegmentHeaderBytes;
    MapCurrent();
    return absl::OkStatus();
  }

  // Maps the current segment's first segment_bytes for Append (WritableFile::Map),
  // when the file system can and the policy does not fdatasync per commit;
  // otherwise appends use WriteAt. Under kEveryCommit and kGroupCommit a mapping
  // costs more than the pwrite it saves: each fdatasync write-protects the pages it
  // cleans (a TLB shootdown each), and the next record in the same page faults to
  // dirty it again (bench_streams: 2.6k against 4.5k power-durable publishes/s).
  // Requires mu_.
  void MapCurrent() {
    map_ = nullptr;
    map_bytes_ = 0;
    if (opt_.sync != SyncPolicy::kNone && opt_.sync != SyncPolicy::kInterval) return;
    absl::StatusOr<char*> m = file_->Map(opt_.segment_bytes);
    map_ = m.ok() ? *m : nullptr;
    map_bytes_ = m.ok() ? opt_.segment_bytes : 0;
  }

  // Requires mu_. The current segment is fdatasync'ed before the next is created,
  // so a power loss never leaves a hole before a later segment.
  absl::Status RotateLocked() {
    const std::uint64_t last = next_tx_ - 1;
    if (auto st = file_->Sync(); !st.ok()) return Fail(st);
    syncs_.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard l(sync_mu_);
      if (durable_tx_.load() < last) durable_tx_.store(last);
    }
    sync_cv_.notify_all();
    WriteSeal(segments_.rbegin()->second);
    if (auto st = CreateSegment(next_tx_); !st.ok()) return Fail(st);
    return absl::OkStatus();
  }

  // The seal of the full, fdatasync'ed segment `seg` (log_format.hpp): a later
  // recovery checks one checksum over it instead of each frame's checksum and hash.
  // Not fdatasync'ed, and best effort: a seal lost or torn (its own checksum) is
  // ignored, and the segment is then verified frame by frame. Requires mu_.
  void WriteSeal(const Seg& seg) {
    Seal seal;
    seal.store_id = store_id_;
    seal.salt = seg.salt;
    seal.first_tx = seg.first_tx;
    seal.last_tx = seg.last_tx;
    seal.bytes = seg.bytes;
    seal.head_hash = head_hash_;
    seal.segment_sum = XXH3_64bits_digest(seg_sum_);
    const std::string path = JoinPath(opt_.dir, SealName(seg.first_tx));
    auto f = fs_->Create(path);
    if (!f.ok()) return;
    absl::Status st = (*f)->WriteAt(0, EncodeSeal(seal));
    if (absl::Status cl = (*f)->Close(); st.ok()) st = cl;
    if (!st.ok()) (void)fs_->Remove(path);
  }

  // Recovery of sealed segment `seg` (not the last) from its bytes `data`: true, with
  // its records handed to `on_record` and seg's bytes and last_tx set (sealed_head_:
  // the hash of its last record), when its seal matches it: this log's store id and
  // the segment's salt and first tx_id, one XXH3-64 over [0, bytes) as the seal says,
  // zeros after, and frames that parse with consecutive tx_ids from the first, the
  // first chained to `seen_hash` (the previous segment's head), up to the seal's
  // last_tx. False when anything differs (the caller then verifies it frame by
  // frame, which names the damage); on_record's error. Frame checksums and hashes
  // inside are not recomputed: the segment checksum covers their bytes, as Kafka
  // trusts the segments below its recovery point (log.flush, recovery-point
  // checkpoint) instead of rescanning them.
  absl::StatusOr<bool> RecoverSealed(Seg& seg, std::string_view data, std::uint64_t seen_tx,
                                     const Hash& seen_hash, RecoverFn on_record) {
    auto file = fs_->Read(JoinPath(opt_.dir, SealName(seg.first_tx)));
    if (!file.ok()) return false;
    const std::optional<Seal> seal = DecodeSeal(*file);
    if (!seal || seal->store_id != store_id_ || seal->salt != seg.salt ||
        seal->first_tx != seg.first_tx || seal->last_tx < seal->first_tx ||
        seal->bytes < kSegmentHeaderBytes || seal->bytes > data.size() ||
        LastNonZeroFrom(data, seal->bytes) != seal->bytes ||
        Xxh3(data.substr(0, seal->bytes)) != seal->segment_sum) {
      return false;
    }
    struct Found {
      std::uint64_t off;
      std::uint32_t size;
      std::string_view value;
    };
    std::vector<Found> found;
    found.reserve(static_cast<std::size_t>(seal->last_tx - seal->first_tx + 1));
    std::uint64_t off = kSegmentHeaderBytes;
    std::uint64_t want = seg.first_tx;
    while (off < seal->bytes) {
      const std::optional<CoveredFrame> f = ReadCoveredFrame(data, off, seal->bytes);
      if (!f || f->tx_id != want || f->op != OpCode::kCreate || f->key != kRecordKey) return false;
      if (want == seg.first_tx && seen_tx != 0 &&
          std::memcmp(f->prev_hash.data(), seen_hash.data(), seen_hash.size()) != 0) {
        return false;
      }
      found.push_back(Found{off, static_cast<std::uint32_t>(f->size), f->value});
      ++want;
      off += f->size;
    }
    if (off != seal->bytes || want != seal->last_tx + 1) return false;
    for (const Found& f : found) {
      const std::uint64_t tx = seg.first_tx + static_cast<std::uint64_t>(&f - found.data());
      Entry e{tx, {seg.first_tx, f.off, f.size}, f.value};
      if (auto st = on_record(e); !st.ok()) return st;
      ++recovered_;
    }
    seg.bytes = seal->bytes;
    seg.last_tx = seal->last_tx;
    sealed_head_ = seal->head_hash;
    ++sealed_segments_;
    return true;
  }

  // Zero-fills ahead of the writes (1 MiB at a time), so that an fdatasync flushes
  // data, not a new file size; recovery reads the zeros as the clean end. Requires mu_.
  absl::Status Preallocate(std::uint64_t end) {
    if (end <= allocated_) return absl::OkStatus();
    const std::uint64_t chunk = std::min<std::uint64_t>(std::uint64_t{1} << 20, opt_.segment_bytes);
    const std::uint64_t target = (end + chunk - 1) / chunk * chunk;
    if (auto st = WriteZeros(allocated_, target - allocated_); !st.ok()) return st;
    allocated_ = target;
    return absl::OkStatus();
  }
  absl::Status WriteZeros(std::uint64_t offset, std::uint64_t n) {
    // Never destroyed: a log thread may still write while std::exit destroys statics.
    static const std::string& zeros = *new std::string(std::size_t{1} << 20, '\0');
    while (n > 0) {
      const std::uint64_t k = std::min<std::uint64_t>(n, zeros.size());
      if (auto st = file_->WriteAt(offset, std::string_view(zeros).substr(0, k)); !st.ok()) return st;
      offset += k;
      n -= k;
    }
    return absl::OkStatus();
  }

  // One fdatasync at a time covers every record written before it began; a caller
  // whose record it does not cover waits for the next.
  absl::Status SyncUpTo(std::uint64_t tx, absl::Duration window) {
    std::unique_lock l(sync_mu_);
    while (durable_tx_.load() < tx) {
      if (!sync_error_.ok()) {
        return absl::FailedPreconditionError("stream log " + QuoteValue(opt_.dir) +
                                             " failed: " + std::string(sync_error_.message()));
      }
      if (syncing_) {
        sync_cv_.wait(l);
        continue;
      }
      syncing_ = true;
      l.unlock();
      if (window > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(window));
      std::shared_ptr<WritableFile> f;
      std::uint64_t target = 0;
      absl::Status st;
      {
        std::lock_guard lock(mu_);
        if (!failed_.ok()) {
          st = FailedError();
        } else {
          f = file_;
          target = written_tx_.load(std::memory_order_acquire);
        }
      }
      if (st.ok()) {
        st = f->Sync();
        syncs_.fetch_add(1, std::memory_order_relaxed);
        if (!st.ok()) {
          std::lock_guard lock(mu_);
          (void)Fail(st);
        }
      }
      l.lock();
      syncing_ = false;
      if (st.ok()) {
        if (durable_tx_.load() < target) durable_tx_.store(target);
      } else if (sync_error_.ok()) {
        sync_error_ = st;
      }
      sync_cv_.notify_all();
      if (!st.ok() && durable_tx_.load() < tx) return st;
    }
    return absl::OkStatus();
  }

  void IntervalLoop() {
    std::unique_lock l(sync_mu_);
    while (!stopping_) {
      sync_cv_.wait_for(l, absl::ToChronoNanoseconds(opt_.group_commit_window));
      if (stopping_) break;
      const std::uint64_t w = written_tx_.load(std::memory_order_acquire);
      if (w > durable_tx_.load() && sync_error_.ok() && !syncing_) {
        l.unlock();
        (void)SyncUpTo(w, absl::ZeroDuration());
        l.lock();
      }
    }
  }

  // Requires mu_.
  absl::Status Fail(absl::Status st) {
    if (failed_.ok()) {
      failed_ = st;
      failed_flag_.store(true, std::memory_order_release);
    }
    return st;
  }
  absl::Status FailedError() const {
    return absl::FailedPreconditionError("stream log " + QuoteValue(opt_.dir) +
                                         " failed earlier and takes no more records: " +
                                         std::string(failed_.message()));
  }

  const StreamLogOptions opt_;
  const std::shared_ptr<FileSystem> fs_;
  std::unique_ptr<FileLock> dir_lock_;
  std::uint64_t store_id_ = 0;

  mutable std::mutex mu_;
  std::map<std::uint64_t, Seg> segments_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
  std::uint64_t allocated_ ABSL_GUARDED_BY(mu_) = 0;
  // file_'s mapping (MapCurrent), or null; appends below map_bytes_ copy into it.
  char* map_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::uint64_t map_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t next_tx_ ABSL_GUARDED_BY(mu_) = 1;
  std::uint64_t first_tx_ ABSL_GUARDED_BY(mu_) = 1;
  Hash head_hash_ ABSL_GUARDED_BY(mu_){};
  // XXH3-64 of the current segment's bytes so far (its seal's segment_sum).
  XXH3_state_t* const seg_sum_ ABSL_GUARDED_BY(mu_);
  Hash sealed_head_{};  // Open only: RecoverSealed's head hash
  std::string frame_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_flag_{false};  // !failed_.ok(), readable without mu_
  std::uint64_t appends_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t mapped_appends_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t bytes_appended_ ABSL_GUARDED_BY(mu_) = 0;
  std::uint64_t recovered_ = 0;
  std::uint64_t sealed_segments_ = 0;
  std::uint64_t torn_tail_bytes_ = 0;
  double recovery_ms_ = 0;
  // Written under mu_ (release), read anywhere.
  std::atomic<std::uint64_t> written_tx_{0};

  std::mutex sync_mu_;
  std::condition_variable sync_cv_;
  bool syncing_ ABSL_GUARDED_BY(sync_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(sync_mu_) = false;
  absl::Status sync_error_ ABSL_GUARDED_BY(sync_mu_);
  // Written under sync_mu_; read anywhere.
  std::atomic<std::uint64_t> durable_tx_{0};
  std::atomic<std::uint64_t> syncs_{0};
  std::thread interval_;
};

StreamLog::StreamLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StreamLog::~StreamLog() = default;

absl::StatusOr<std::unique_ptr<StreamLog>> StreamLog::Open(StreamLogOptions options,
                                                           RecoverFn on_record) {
  if (auto st = ValidateLogOptions("StreamLogOptions", options.dir, options.sync,
                                   options.group_commit_window, options.recovery,
                                   options.segment_bytes);
      !st.ok()) {
    return st;
  }
  if (options.file_system == nullptr) options.file_system = PosixFileSystem();
  auto impl = std::make_unique<Impl>(std::move(options));
  if (auto st = impl->Recover(on_record); !st.ok()) return st;
  return std::unique_ptr<StreamLog>(new StreamLog(std::move(impl)));
}

absl::StatusOr<StreamLog::Entry> StreamLog::Append(std::string_view value) {
  return impl_->Append(value);
}
absl::Status StreamLog::Sync(std::uint64_t tx) { return impl_->Sync(tx); }
absl::StatusOr<std::string> StreamLog::Read(const Location& location) const {
  return impl_->Read(location);
}
absl::Status StreamLog::RetireBefore(std::uint64_t tx) { return impl_->RetireBefore(tx); }
absl::Status StreamLog::Rotate() { return impl_->Rotate(); }
std::uint64_t StreamLog::RetireBound(std::uint64_t tx) const { return impl_->RetireBound(tx); }
std::uint64_t StreamLog::last_tx() const { return impl_->last_tx(); }
bool StreamLog::failed() const { return impl_->failed(); }
absl::Status StreamLog::failure() const { return impl_->failure(); }
StreamLogStats StreamLog::Stats() const { return impl_->Stats(); }
const std::string& StreamLog::dir() const { return impl_->dir(); }
std::uint64_t StreamLog::store_id() const { return impl_->store_id(); }

}  // namespace inferq
