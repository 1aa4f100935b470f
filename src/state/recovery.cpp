#include "recovery.hpp"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "inferq/base/error.hpp"

namespace inferq::state_internal {
namespace {

// One past the last nonzero byte of `s` at or after `from` (`from` if none).
std::size_t LastNonZero(std::string_view s, std::size_t from) {
  std::size_t end = s.size();
  while (end > from && s[end - 1] == '\0') --end;
  return end;
}

void Apply(StateMap& state, const Record& r) {
  for (const Op& op : r.ops) {
    if (op.op == OpCode::kDelete) {
      state.erase(op.key);
    } else {
      state.insert_or_assign(op.key, op.value);
    }
  }
}

// A record that does not follow `seen_tx` but continues from a checkpoint the
// recovery knows: its tx_id is that checkpoint's + 1, it comes after `seen_tx`, and
// its prev_hash is that checkpoint's chain hash.
bool ContinuesCheckpoint(const std::map<std::uint64_t, Hash>& checkpoint_hash,
                         std::uint64_t seen_tx, const Record& r) {
  if (r.tx_id == 0) return false;
  auto it = checkpoint_hash.find(r.tx_id - 1);
  return it != checkpoint_hash.end() && seen_tx < r.tx_id - 1 && r.prev_hash == it->second;
}

std::string At(const std::string& file, std::uint64_t offset) {
  return "log segment " + QuoteValue(file) + " at offset " + std::to_string(offset);
}

}  // namespace

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

absl::StatusOr<Recovered> Recover(FileSystem& fs, const std::string& dir,
                                  const RecoverOptions& options) {
  Recovered out;
  // "(store id <file's>; the IDENTITY file of state directory '<dir>' says <its>)"
  auto other_store = [&](std::uint64_t file_store_id) {
    return "(store id " + StoreIdHex(file_store_id) + "; the IDENTITY file of state directory " +
           QuoteValue(dir) + " says " + StoreIdHex(out.store_id) + ")";
  };
  auto names = fs.List(dir);
  if (!names.ok()) return names.status();
  std::sort(names->begin(), names->end());
  std::vector<std::pair<std::uint64_t, std::string>> segments;
  bool removed = false;
  bool has_identity = false;
  for (const std::string& name : *names) {
    if (auto first = ParseSegmentName(name)) {
      segments.emplace_back(*first, name);
    } else if (auto c = ParseCheckpointName(name)) {
      out.checkpoints.push_back(CheckpointOnDisk{name, c->kind, c->tx, 0, 0});
    } else if (name == "IDENTITY") {
      has_identity = true;
    } else if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp" &&
               ParseCheckpointName(name.substr(0, name.size() - 4)) && options.modify) {
      // A checkpoint whose rename never happened: never part of the state.
      if (auto st = fs.Remove(JoinPath(dir, name)); !st.ok()) return st;
      out.notes.push_back("removed unfinished " + name);
      removed = true;
    }
  }
  if (has_identity) {
    auto bytes = fs.Read(JoinPath(dir, "IDENTITY"));
    if (!bytes.ok()) return bytes.status();
    auto id = DecodeIdentity(*bytes);
    if (!id.ok()) {
      return absl::DataLossError("state directory " + QuoteValue(dir) + ": " +
                                 std::string(id.status().message()));
    }
    out.store_id = *id;
  } else if (!segments.empty() || !out.checkpoints.empty()) {
    return absl::DataLossError("state directory " + QuoteValue(dir) +
                               " holds log or checkpoint files but no IDENTITY file");
  }
  std::sort(segments.begin(), segments.end());
  std::sort(out.checkpoints.begin(), out.checkpoints.end(),
            [](const auto& a, const auto& b) {
              return a.tx != b.tx ? a.tx < b.tx : a.kind < b.kind;
            });

  // ---- checkpoints: newest valid full one, then the incremental ones after it ----
  std::map<std::uint64_t, Hash> checkpoint_hash;  // tx -> chain hash, for matching
  bool read_failed = false;  // the last load failed to read, not to decode
  auto load = [&](CheckpointOnDisk& c) -> absl::StatusOr<Checkpoint> {
    auto bytes = fs.Read(JoinPath(dir, c.name));
    read_failed = !bytes.ok();
    if (!bytes.ok()) return bytes.status();
    c.bytes = bytes->size();
    auto decoded = DecodeCheckpoint(*bytes, options.max_checkpoint_raw_bytes);
    if (!decoded.ok()) {
      return absl::DataLossError("checkpoint " + QuoteValue(c.name) + ": " +
                                 std::string(decoded.status().message()));
    }
    if (decoded->store_id != out.store_id) {
      return absl::DataLossError("checkpoint " + QuoteValue(c.name) +
                                 " belongs to another store " + other_store(decoded->store_id));
    }
    if (decoded->tx != c.tx || decoded->kind != c.kind) {
      return absl::DataLossError("checkpoint " + QuoteValue(c.name) + " holds tx_id " +
                                 std::to_string(decoded->tx) + " of another kind or number");
    }
    c.base_tx = decoded->base_tx;
    checkpoint_hash[c.tx] = decoded->chain_hash;
    return decoded;
  };
  if (options.check_all_checkpoints) {
    for (auto& c : out.checkpoints) {
      auto d = load(c);
      if (!d.ok()) return d.status();
    }
  }
  Hash base_hash{};
  std::optional<std::size_t> full_index;
  // Checkpoint files recovery cannot use, with the suffix they are set aside under.
  std::vector<std::pair<std::string, const char*>> set_aside;
  for (std::size_t i = out.checkpoints.size(); i-- > 0;) {
    CheckpointOnDisk& c = out.checkpoints[i];
    if (c.kind != CheckpointKind::kFull) continue;
    auto d = load(c);
    if (!d.ok()) {
      if (options.strict || read_failed) return d.status();  // an I/O error is not damage
      out.notes.push_back("skipped " + std::string(d.status().message()));
      set_aside.emplace_back(c.name, ".damaged");
      continue;
    }
    if (options.build_state) {
      for (auto& e : d->entries) out.state.insert_or_assign(std::move(e.key), std::move(e.value));
    }
    out.base_tx = d->tx;
    base_hash = d->chain_hash;
    ++out.checkpoints_loaded;
    full_index = i;
    break;
  }
  if (full_index) {
    for (std::size_t i = *full_index + 1; i < out.checkpoints.size(); ++i) {
      CheckpointOnDisk& c = out.checkpoints[i];
      if (c.kind != CheckpointKind::kIncremental) continue;
      auto d = load(c);
      if (!d.ok()) {
        if (options.strict || read_failed) return d.status();
        out.notes.push_back("skipped " + std::string(d.status().message()));
        set_aside.emplace_back(c.name, ".damaged");
        continue;  // a later one may still build on the state reached so far
      }
      if (d->base_tx != out.base_tx) {
        const absl::Status st = absl::DataLossError(
            "checkpoint " + QuoteValue(c.name) + " applies on tx_id " + std::to_string(d->base_tx) +
            ", not on the state at tx_id " + std::to_string(out.base_tx));
        if (options.strict) return st;
        out.notes.push_back("skipped " + std::string(st.message()));
        set_aside.emplace_back(c.name, ".unused");  // built on one set aside
        continue;
      }
      if (options.build_state) {
        for (auto& e : d->entries) {
          if (e.tombstone) {
            out.state.erase(e.key);
          } else {
            out.state.insert_or_assign(std::move(e.key), std::move(e.value));
          }
        }
      }
      out.base_tx = d->tx;
      base_hash = d->chain_hash;
      ++out.checkpoints_loaded;
    }
  }

  // A checkpoint recovery cannot use is set aside (renamed *.damaged or *.unused,
  // kept for inspection), so that later checkpoints, segment retirement and
  // VerifyChain never count on it.
  if (options.modify) {
    for (const auto& [name, suffix] : set_aside) {
      if (auto st = fs.Rename(JoinPath(dir, name), JoinPath(dir, name + suffix)); !st.ok()) {
        return st;
      }
      removed = true;
    }
  }

  if (options.snapshot_tx) {
    if (*options.snapshot_tx == 0) {
      out.snapshot_hash = Hash{};  // the empty chain
    } else if (auto it = checkpoint_hash.find(*options.snapshot_tx); it != checkpoint_hash.end()) {
      out.snapshot_hash = it->second;
    }
  }
  // A torn tail after the reader's snapshot is a write still under way (see
  // RecoverOptions::snapshot_tx), not damage.
  auto newer_than_snapshot = [&](std::uint64_t read_to_tx) {
    return options.snapshot_tx && std::max(read_to_tx, out.base_tx) >= *options.snapshot_tx;
  };

  // The log the fallback checkpoint needs: Retire keeps the checkpoint P just before
  // the newest full one and the log from P's tx_id + 1 on (whichever checkpoint
  // turns out usable). A log that starts later lost a segment that was kept.
  for (std::size_t i = out.checkpoints.size(); i-- > 0;) {
    if (out.checkpoints[i].kind != CheckpointKind::kFull) continue;
    if (i == 0) break;  // no checkpoint before it: nothing was retired for it
    const CheckpointOnDisk& fallback = out.checkpoints[i - 1];
    const std::string needs = "the log after the fallback checkpoint " + QuoteValue(fallback.name);
    if (segments.empty()) {
      return absl::DataLossError("state directory " + QuoteValue(dir) +
                                 " holds no log segment: tx_ids from " +
                                 std::to_string(fallback.tx + 1) + " (" + needs + ") are missing");
    }
    if (segments.front().first > fallback.tx + 1) {
      return absl::DataLossError("tx_id gap in " + At(segments.front().second, kSegmentHeaderBytes) +
                                 ": expected tx_id " + std::to_string(fallback.tx + 1) +
                                 " or earlier (" + needs + "), found " +
                                 std::to_string(segments.front().first));
    }
    break;
  }

  // ---- the log ----
  std::uint64_t seen_tx = 0;  // last record read (0: none yet)
  Hash seen_hash{};
  bool seen_hash_known = false;  // false after a record read checksum-only
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::uint64_t name_tx = segments[i].first;
    const std::string& name = segments[i].second;
    const bool last = i + 1 == segments.size();
    const std::string path = JoinPath(dir, name);
    // Every segment is read, also one whose records the checkpoints cover entirely:
    // it adds nothing to the state, but it is the way back if the newest checkpoint
    // is found damaged later, so damage in it (or its absence) is reported now,
    // while the fallback still exists. Covered records cost a checksum each (below).
    auto data = fs.Read(path);
    if (!data.ok()) return data.status();
    auto header = DecodeSegmentHeader(*data);
    if (!header.ok()) {
      // A crash while creating the last segment leaves its header short or zeroed
      // and nothing after it (no record is written before the header is synced):
      // torn, not damage. A bad header with anything after it is damage.
      const bool torn =
          last && LastNonZero(*data, std::min<std::size_t>(data->size(), kSegmentHeaderBytes)) <=
                      kSegmentHeaderBytes;
      if (!torn || (options.strict && !newer_than_snapshot(seen_tx))) {
        return absl::DataLossError(At(name, 0) + " (after tx_id " + std::to_string(seen_tx) +
                                   "): " + std::string(header.status().message()));
      }
      out.torn_tail_bytes += data->size();
      if (options.modify) {
        if (auto st = fs.Remove(path); !st.ok()) return st;
        out.notes.push_back("removed " + name + ", whose header was never written");
        removed = true;
        // The one before it (read whole; synced before this one was created) now
        // takes the appends.
        segments.pop_back();
      }
      break;
    }
    if (header->store_id != out.store_id) {
      return absl::DataLossError(At(name, 0) + " belongs to another store " +
                                 other_store(header->store_id));
    }
    if (header->first_tx != name_tx) {
      return absl::DataLossError(At(name, 0) + ": header says first tx_id " +
                                 std::to_string(header->first_tx) + ", the name says " +
                                 std::to_string(name_tx));
    }
    SegmentFile seg{name, name_tx, header->salt, kSegmentHeaderBytes, data->size(),
                    kSegmentHeaderBytes};
    std::size_t off = kSegmentHeaderBytes;
    const std::string_view bytes = *data;
    while (off < bytes.size()) {
      // Records the checkpoints cover: checksum and tx_id only.
      DecodedFrame f = DecodeFrame(bytes, off, header->salt, /*header_only=*/true);
      // (The record at a checkpoint's tx_id is read whole: its hash must match.)
      const bool covered = f.status == FrameStatus::kOk && f.record.tx_id <= out.base_tx &&
                           !options.check_all_checkpoints &&
                           !checkpoint_hash.contains(f.record.tx_id);
      if (covered) {
        const std::uint64_t tx = f.record.tx_id;
        if (seen_tx != 0 && tx != seen_tx + 1 && !ContinuesCheckpoint(checkpoint_hash, seen_tx, f.record)) {
          return absl::DataLossError("tx_id gap in " + At(name, off) + ": expected tx_id " +
                                     std::to_string(seen_tx + 1) + ", found " + std::to_string(tx));
        }
        seen_tx = tx;
        seen_hash_known = false;
        off += f.size;
        seg.bytes = seg.dirty_end = off;
        continue;
      }
      if (f.status == FrameStatus::kOk) f = DecodeFrame(bytes, off, header->salt);
      if (f.status != FrameStatus::kOk) {
        // Zeros from here on: space the writer zero-filled ahead and never used, so
        // the clean end of the log (in both modes).
        const std::size_t nonzero_end = LastNonZero(bytes, off);
        if (nonzero_end == off) {
          seg.bytes = seg.dirty_end = off;
          break;
        }
        const auto later = FindNextFrame(bytes, off + 1, header->salt);
        if (last && !later) {
          if (options.strict && !newer_than_snapshot(seen_tx)) {
            return absl::DataLossError("torn tail in " + At(name, off) + " after tx_id " +
                                       std::to_string(seen_tx) + ": " + f.why +
                                       " (strict recovery)");
          }
          out.torn_tail_bytes += nonzero_end - off;
          seg.bytes = off;
          seg.dirty_end = nonzero_end;
          break;
        }
        std::string msg = "damaged record in " + At(name, off) + " after tx_id " +
                          std::to_string(seen_tx) + ": " + f.why;
        if (later) msg += "; valid records follow at offset " + std::to_string(*later);
        return absl::DataLossError(msg);
      }
      const std::uint64_t tx = f.record.tx_id;
      const Hash zero{};
      auto broken = [&](const char* what) {
        return absl::DataLossError(std::string(what) + " at tx_id " + std::to_string(tx) +
                                   " in " + At(name, off));
      };
      if (tx == out.base_tx + 1 && seen_tx <= out.base_tx) {
        // First record after the checkpoints (the log before it may be retired,
        // skipped, or may end early: with kNone a power loss can lose log the
        // checkpoint has).
        if (f.record.prev_hash != base_hash) return broken("hash chain does not continue the checkpoint");
      } else if (seen_tx != 0 && tx != seen_tx + 1 &&
                 ContinuesCheckpoint(checkpoint_hash, seen_tx, f.record)) {
        // The same jump after an earlier checkpoint of the chain: the log lost
        // records (kNone/kInterval, power loss) that this checkpoint holds, and
        // the writer went on from the checkpoint's state.
      } else if (seen_tx != 0 && tx == seen_tx + 1) {
        if (seen_hash_known && f.record.prev_hash != seen_hash) return broken("broken hash chain");
      } else if (seen_tx == 0 && tx == 1) {
        if (f.record.prev_hash != zero) return broken("first record has a nonzero previous hash");
      } else if (seen_tx == 0 && tx <= out.base_tx) {
        // Starts inside what the checkpoints cover; checked against them at base_tx.
      } else {
        const std::uint64_t expected = seen_tx != 0 ? seen_tx + 1 : out.base_tx + 1;
        return absl::DataLossError("tx_id gap in " + At(name, off) + ": expected tx_id " +
                                   std::to_string(expected) + ", found " + std::to_string(tx));
      }
      if (auto it = checkpoint_hash.find(tx); it != checkpoint_hash.end() && it->second != f.hash) {
        return absl::DataLossError("checkpoint at tx_id " + std::to_string(tx) +
                                   " does not match the log's hash chain (" + At(name, off) + ")");
      }
      if (options.snapshot_tx && tx == *options.snapshot_tx) out.snapshot_hash = f.hash;
      if (tx > out.base_tx) {
        if (options.build_state) {
          Apply(out.state, f.record);
          for (const Op& op : f.record.ops) out.changed_since_base.insert(op.key);
        }
        ++out.records_replayed;
      }
      seen_tx = tx;
      seen_hash = f.hash;
      seen_hash_known = true;
      off += f.size;
      seg.bytes = seg.dirty_end = off;
    }
    out.segments.push_back(std::move(seg));
  }
  if (seen_tx > out.base_tx) {
    out.last_tx = seen_tx;
    out.last_hash = seen_hash;
  } else {
    out.last_tx = out.base_tx;
    out.last_hash = base_hash;
  }
  if (removed) {
    if (auto st = fs.SyncDir(dir); !st.ok()) return st;
  }
  return out;
}

bool MayBeMidChange(const absl::Status& st) {
  return st.code() == absl::StatusCode::kNotFound || st.code() == absl::StatusCode::kDataLoss;
}

void WaitBeforePass(int pass) {
  if (pass > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1 << (pass - 1)));
}

absl::StatusOr<Recovered> RecoverReadOnly(FileSystem& fs, const std::string& dir,
                                          const RecoverOptions& options) {
  RecoverOptions ro = options;
  ro.modify = false;
  absl::StatusOr<Recovered> r = Recover(fs, dir, ro);
  for (int pass = 1; pass < kReadOnlyPasses && !r.ok() && MayBeMidChange(r.status()); ++pass) {
    WaitBeforePass(pass);
    const absl::Status before = r.status();
    r = Recover(fs, dir, ro);
    // The same error twice (same file, offset and tx_id) is damage that stays, not a
    // writer's change caught midway: no more passes (each reads every file).
    if (!r.ok() && r.status() == before) break;
  }
  return r;
}

// ---- PinnedDirectory ----

absl::StatusOr<std::unique_ptr<PinnedDirectory>> PinnedDirectory::Make(FileSystem& fs,
                                                                       const std::string& dir) {
  // A listed file that is gone when read was retired by a live writer after the
  // listing: list again (a few times) so that the cut is consistent, instead of
  // reporting a file that no longer matters.
  constexpr int kListings = 8;
  for (int listing = 0;; ++listing) {
    auto names = fs.List(dir);
    if (!names.ok()) return names.status();
    std::string newest;
    std::uint64_t newest_tx = 0;
    for (const std::string& name : *names) {
      if (auto first = ParseSegmentName(name); first && (newest.empty() || *first > newest_tx)) {
        newest = name;
        newest_tx = *first;
      }
    }
    const std::string newest_path = newest.empty() ? std::string() : JoinPath(dir, newest);
    auto pinned = std::unique_ptr<PinnedDirectory>(
        new PinnedDirectory(fs, dir, *names, newest_path));
    // Every segment and checkpoint is read now, right after the listing: a writer that
    // retires files while the pass verifies the earlier ones (slowly: SHA-256 per
    // record) can then only catch the short time these reads take. A file unreadable
    // now is read again (and reported) when the pass asks for it.
    bool vanished = false;
    for (const std::string& name : *names) {
      if (!ParseSegmentName(name) && !ParseCheckpointName(name)) continue;
      const std::string path = JoinPath(dir, name);
      absl::StatusOr<std::string> bytes = fs.Read(path);
      if (bytes.ok()) {
        pinned->fingerprint_ = pinned->fingerprint_ * 0x100000001b3ULL ^
                               XXH3_64bits(bytes->data(), bytes->size()) ^
                               XXH3_64bits(name.data(), name.size());
        pinned->bytes_.emplace(path, *std::move(bytes));
      } else if (bytes.status().code() == absl::StatusCode::kNotFound) {
        vanished = true;
      }
    }
    if (!vanished || listing + 1 == kListings) return pinned;
  }
}

absl::StatusOr<std::vector<std::string>> PinnedDirectory::List(const std::string& dir) {
  if (dir != dir_) return fs_.List(dir);
  return names_;
}

absl::StatusOr<std::string> PinnedDirectory::Read(const std::string& path) {
  if (auto it = bytes_.find(path); it != bytes_.end()) return it->second;
  if (newest_segment_.empty() || path != newest_segment_) return fs_.Read(path);
  if (!newest_bytes_) newest_bytes_ = fs_.Read(path);
  return *newest_bytes_;
}

namespace {
absl::Status Refused(const std::string& path) {
  return absl::FailedPreconditionError("a pinned view of a state directory only reads (asked to change " +
                                       QuoteValue(path) + ")");
}
}  // namespace

absl::StatusOr<std::unique_ptr<FileLock>> PinnedDirectory::Lock(const std::string& path) {
  return Refused(path);
}
absl::StatusOr<std::unique_ptr<WritableFile>> PinnedDirectory::Create(const std::string& path) {
  return Refused(path);
}
absl::StatusOr<std::unique_ptr<WritableFile>> PinnedDirectory::OpenForWrite(const std::string& path) {
  return Refused(path);
}
absl::Status PinnedDirectory::CreateDir(const std::string& dir) { return Refused(dir); }
absl::Status PinnedDirectory::Rename(const std::string& from, const std::string&) {
  return Refused(from);
}
absl::Status PinnedDirectory::Remove(const std::string& path) { return Refused(path); }
absl::Status PinnedDirectory::SyncDir(const std::string& dir) { return Refused(dir); }

}  // namespace inferq::state_internal
