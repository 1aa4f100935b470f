/// @file inferq/state/stream_log.hpp
///
/// StreamLog: an append-only, segmented log of opaque records, each numbered by a
/// monotonic tx_id, for data that is appended once and read back by position (the
/// messages of a file stream, engine/config.hpp StorageType::kFile). It is the
/// Delta-State Log without the key-value state: the same segment header, frame
/// (length, salt, XXH3-64 checksum, SHA-256 hash chain), torn-tail rules, IDENTITY
/// and LOCK files and sync policies as StateStore (state_store.hpp), so one crash
/// model covers both. What differs: no checkpoints (nothing is replayed into a map;
/// Open hands each record to the caller), and old segments are removed when the
/// caller says their records are no longer needed (RetireBefore).
///
/// Usage:
/// @code
///   inferq::StreamLogOptions o{.dir = "/var/lib/app/streams/REQUESTS",
///                              .sync = inferq::SyncPolicy::kGroupCommit};
///   auto log = inferq::StreamLog::Open(o, [&](const inferq::StreamLog::Entry& e) {
///     index.push_back(e.location);  // one call per recovered record, in tx_id order
///     return absl::OkStatus();
///   });
///   absl::StatusOr<inferq::StreamLog::Entry> at = (*log)->Append(bytes);  // in the OS
///   absl::Status durable = (*log)->Sync(at->tx);    // per the sync policy
///   absl::StatusOr<std::string> back = (*log)->Read(at->location);
/// @endcode
///
/// Durability. Append returns once the record is written to the OS: it survives a
/// crash of the process from then on. Under kNone and kInterval it is copied into a
/// shared mapping of the segment where the file system maps files (no system call);
/// otherwise, and past a segment's first segment_bytes, written with pwrite(2). Sync(tx) returns once record `tx`
/// is as durable as the policy promises:
///  - kEveryCommit, kGroupCommit  fdatasync'ed: survives a power loss (on storage that
///                honours fdatasync). A Sync that finds an fdatasync under way waits
///                for it and, if its record came later, for the next one, which covers
///                every record appended before it started: callers that wait at once
///                share one fdatasync. kGroupCommit first waits `group_commit_window`
///                for more records to join.
///  - kInterval   at once; a background thread fdatasyncs every group_commit_window
///                (a power loss may lose that last window).
///  - kNone       at once; never fdatasync'ed (a power loss may lose any of it).
///
/// A segment is fdatasync'ed before the next one is created, under every policy, so
/// a power loss can only cut the log's tail, never leave a hole in the middle.
///
/// Recovery (Open): segments in tx_id order; within and between them tx_ids are
/// consecutive and the hash chain holds (the first record kept may follow retired
/// ones: its previous hash is taken as given). kPointInTime cuts a torn tail off (an
/// incomplete last frame, as a crash leaves it; its bytes are zeroed before the next
/// append), kStrict fails on it; damage before the tail, a tx_id gap, a broken chain
/// or a file of another log is kDataLoss naming the file, the byte offset and the
/// tx_id, in both modes.
///
/// Seals: once a segment is full and fdatasync'ed, a seal file beside it records its
/// last tx_id, where its last frame ends, the hash of its last record and one
/// XXH3-64 checksum over the segment. Open in kPointInTime checks a sealed segment
/// (not the last) against its seal with that one checksum and a parse of its frames
/// (consecutive tx_ids, the first chained to the previous segment), instead of each
/// frame's checksum and SHA-256 hash: Kafka likewise trusts the segments below its
/// recovery point. Any mismatch, or a seal that is missing or torn (seals are not
/// fdatasync'ed), and the segment is verified frame by frame, with the errors above.
/// kStrict always verifies every frame. Read checks a record's frame checksum either
/// way.
///
/// Directory: IDENTITY, LOCK (held while open; a second opener, in this process or
/// another, gets kFailedPrecondition naming the holder's pid, or "this process"),
/// `log-<first tx_id, 20 digits>.seg` segments and their `log-<...>.seal` seals.
///
/// Failure: a failed write or fdatasync (EIO, ENOSPC, ...) puts the log into a failed
/// state: that Append or Sync and every later one return the error (later ones as
/// kFailedPrecondition quoting it). Nothing is retried and no record that was not
/// written is ever reported appended. Reopen to recover.
///
/// Thread safety: every member may be called from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/state/file_system.hpp"
#include "inferq/state/state_store.hpp"

namespace inferq {

/// How StreamLog::Open finds, syncs and recovers a log directory.
struct StreamLogOptions {
  /// Directory of the log; created (with parents) if absent.
  std::string dir;
  SyncPolicy sync = SyncPolicy::kEveryCommit;  ///< what Sync waits for (see Durability above)
  /// kGroupCommit: how long a Sync that starts an fdatasync first waits for more
  /// records (0: none). kInterval: the fdatasync interval, > 0. At most 10 s.
  absl::Duration group_commit_window = absl::ZeroDuration();
  /// A new segment starts once the current one holds this many bytes; 4096 .. 2^40.
  std::uint64_t segment_bytes = std::uint64_t{64} << 20;
  RecoveryMode recovery = RecoveryMode::kPointInTime;  ///< torn tail at Open (see Recovery above)
  /// File layer (null: PosixFileSystem()); tests inject failures through it.
  std::shared_ptr<FileSystem> file_system;
};

/// A StreamLog's counters and recovery figures (StreamLog::Stats).
struct StreamLogStats {
  std::uint64_t first_tx = 0;     ///< oldest record kept (0: none)
  std::uint64_t last_tx = 0;      ///< newest record appended (0: none)
  std::uint64_t durable_tx = 0;   ///< newest record fdatasync'ed (every/group/interval)
  std::uint64_t appends = 0;      ///< since Open
  /// Of them, copied into the segment's mapping (WritableFile::Map) rather than
  /// written with pwrite(2): under kNone and kInterval, all that fit in the first
  /// segment_bytes of a segment, when the file system maps files (PosixFileSystem
  /// does).
  std::uint64_t mapped_appends = 0;
  std::uint64_t syncs = 0;        ///< fdatasync calls since Open
  std::uint64_t bytes_appended = 0;  ///< frame bytes since Open
  std::uint64_t segments = 0;     ///< segment files now
  std::uint64_t disk_bytes = 0;   ///< bytes of the segment files now
  std::uint64_t recovered_records = 0;  ///< records Open handed to its callback
  /// Segments Open recovered through their seals (see Recovery above), not frame by
  /// frame.
  std::uint64_t sealed_segments = 0;
  std::uint64_t torn_tail_bytes = 0;  ///< cut off at Open (kPointInTime)
  double recovery_ms = 0;         ///< time Open spent recovering
  bool failed = false;            ///< in the failed state (see Failure above)
};

/// An append-only, segmented log of opaque records numbered by tx_id (see the file
/// comment).
class StreamLog {
 public:
  /// Where a record's frame sits: the segment (by its first tx_id), the byte offset
  /// of the frame in it and its size in bytes.
  struct Location {
    std::uint64_t segment = 0;  ///< first tx_id of the segment
    std::uint64_t offset = 0;   ///< byte offset of the frame in the segment
    std::uint32_t bytes = 0;    ///< size of the frame in bytes
  };
  /// A record: its tx_id, where it sits, and in Open's callback its value.
  struct Entry {
    std::uint64_t tx = 0;    ///< the record's tx_id
    Location location;       ///< where its frame sits (what Read takes)
    std::string_view value;  ///< Open's callback only: valid during the call
  };
  /// Called by Open for each recovered record, oldest first; an error it returns
  /// ends Open with that error.
  using RecoverFn = absl::FunctionRef<absl::Status(const Entry&)>;

  /// Opens (creating the directory if absent) and recovers. Errors: kInvalidArgument
  /// for bad options (naming the field and value); kFailedPrecondition when the
  /// directory is open elsewhere (naming the holder's pid, or "this process"); kDataLoss for damage
  /// (see Recovery above); the I/O error of a failed file operation.
  static absl::StatusOr<std::unique_ptr<StreamLog>> Open(StreamLogOptions options,
                                                         RecoverFn on_record);
  ~StreamLog();  ///< fdatasyncs what kInterval has not yet, then closes
  StreamLog(const StreamLog&) = delete;
  StreamLog& operator=(const StreamLog&) = delete;

  /// Appends `value` (at most 256 MiB: kInvalidArgument naming its size) as the next
  /// record and returns its tx_id and location once it is written to the OS. The
  /// error of a failed write (the log is then failed), or kFailedPrecondition
  /// quoting the first failure.
  absl::StatusOr<Entry> Append(std::string_view value);
  /// Waits until record `tx` is as durable as the sync policy promises (see above).
  /// kInvalidArgument for a tx that was never appended; the fdatasync error, or
  /// kFailedPrecondition once failed, when `tx` is not yet durable.
  absl::Status Sync(std::uint64_t tx);
  /// The value of the record at `location` (as Append or Open gave it). kNotFound for
  /// a retired segment; kDataLoss when the bytes there are not that record's frame.
  absl::StatusOr<std::string> Read(const Location& location) const;
  /// Removes every segment whose records all have tx_ids below `tx`, except the one
  /// appended to. Their records can no longer be read. The error of a failed removal.
  absl::Status RetireBefore(std::uint64_t tx);
  /// The tx_id below which RetireBefore(tx) would remove every record now (the
  /// first tx_id of the segment it would keep first): what a caller must save
  /// elsewhere before retiring, such as a file stream's duplicate window. Changes
  /// nothing.
  std::uint64_t RetireBound(std::uint64_t tx) const;
  /// Starts a new segment now (the current one is fdatasync'ed first), so that
  /// RetireBefore(last_tx + 1) can remove every record (a purge).
  absl::Status Rotate();

  /// Newest record in the log, recovered or appended (0: none).
  std::uint64_t last_tx() const;
  /// True once the log failed (see Failure above), also by kInterval's background
  /// fdatasync; one atomic load. failure(): the first error (OK when not failed).
  ///@{
  bool failed() const;
  absl::Status failure() const;
  ///@}
  /// A snapshot of the counters.
  StreamLogStats Stats() const;
  /// The log's directory (StreamLogOptions::dir).
  const std::string& dir() const;
  /// The log's id (its IDENTITY file): random when the directory was first opened,
  /// the same for every later Open of it, and new for a directory made again.
  std::uint64_t store_id() const;

 private:
  class Impl;
  explicit StreamLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq
