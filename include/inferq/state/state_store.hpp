/// @file inferq/state/state_store.hpp
///
/// StateStore: durable key-value state over the Delta-State Log.
/// Every committed transaction is one record {tx_id, ops: (key, create/update/delete,
/// value)..., prev_hash} appended to a segmented write-ahead log; prev_hash chains the
/// records with SHA-256, so an edited, dropped or reordered record is detected.
/// Checkpoints (full, or incremental: only the keys changed since the previous one)
/// bound recovery time and let old log segments be retired.
///
/// Usage:
/// @code
///   inferq::StateStoreOptions o;
///   o.dir = "/var/lib/app/state";
///   o.sync = inferq::SyncPolicy::kGroupCommit;
///   auto store = inferq::StateStore::Open(o);          // recovers what is there
///   if (!store.ok()) return store.status();
///   auto tx = (*store)->Begin();
///   tx.Put("session.42.state", bytes).Delete("session.41.state");
///   absl::StatusOr<std::uint64_t> id = tx.Commit();    // durable when it returns
///   (*store)->Scan("session.", [](std::string_view k, std::string_view v) { ... });
/// @endcode
///
/// Durability (what a successful Commit guarantees, by SyncPolicy):
///  - kEveryCommit  the record was written and fdatasync'ed before Commit returned; each
///                  commit pays its own fdatasync. Survives a process crash and a
///                  power loss (on storage that honours fdatasync).
///  - kGroupCommit  the same guarantee; commits that wait at the same time share one
///                  write and one fdatasync (after up to `group_commit_window` of
///                  waiting for more to join).
///  - kInterval     the record was written to the OS (survives a process crash) and is
///                  fdatasync'ed within `group_commit_window` (a power loss may lose
///                  that last window).
///  - kNone         written to the OS only: survives a process crash, not a power loss.
///
/// Checkpoints are always made durable (temp file, fsync, rename, fsync of the
/// directory) before any log segment they replace is removed.
///
/// Recovery (Open on an existing directory): the newest valid full checkpoint, then
/// the incremental checkpoints after it, then the log after them, checking tx_id
/// continuity and the hash chain. kPointInTime stops at a torn tail (an incomplete
/// last frame, as a crash leaves it) and cuts it off; kStrict fails on it. A gap in
/// tx_ids, a broken chain, or damage anywhere before the tail is kDataLoss naming the
/// file, the byte offset and the tx_id, in both modes. That includes the segments
/// older than the newest checkpoint that are kept for the fallback (see Directory):
/// Open reads every segment (records the checkpoints cover by frame checksum and
/// tx_id only; VerifyChain also checks their hash chain), and a log that starts
/// after the tx_id following the checkpoint before the newest full one lost a kept
/// segment (a tx_id gap): a broken fallback log is found while the newest checkpoint
/// still stands. (The fallback checkpoint file itself is decoded only when needed,
/// and by VerifyChain.) A damaged (e.g. torn) checkpoint file is skipped for the one
/// before it in kPointInTime and is an error in kStrict. An I/O error reading a file
/// is returned as it is, never taken for damage.
///
/// Directory: IDENTITY (the store id every segment and checkpoint carries, so files
/// from another store's directory are refused), LOCK (held by the open store),
/// `wal-<first tx_id>.log` segments (zero-filled ahead of the last record),
/// `ckpt-<tx_id>-<full|incr>.zst` checkpoints; a checkpoint found damaged is renamed
/// `*.damaged`, and ones built on it `*.unused`. Retirement keeps the checkpoint before
/// the newest full one (with the chain it builds on) and the log from it, so any one
/// damaged checkpoint leaves a way back. There is no manifest: removing the newest
/// segment file loses its records without an error.
///
/// Failure: a failed write or fdatasync (EIO, ENOSPC, ...) puts the store into a
/// failed state: that commit and every later one return the error (the later ones as
/// kFailedPrecondition quoting it); nothing is retried. Reopen to recover.
///
/// Thread safety: every member may be called from many threads at once. A
/// Transaction belongs to one thread until it is committed or dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/base/histogram.hpp"
#include "inferq/state/file_system.hpp"

namespace inferq {

/// What a successful commit guarantees: see Durability in the file comment.
enum class SyncPolicy { kEveryCommit, kGroupCommit, kInterval, kNone };
/// What a checkpoint holds: the keys changed since the previous one, or all of them
/// (StateStoreOptions::checkpoint_mode).
enum class CheckpointMode { kIncremental, kFull };
/// What Open does with a torn tail or a damaged checkpoint: kPointInTime cuts it off
/// or falls back to the checkpoint before, kStrict fails (see Recovery in the file
/// comment).
enum class RecoveryMode { kPointInTime, kStrict };

/// How StateStore::Open finds, syncs, checkpoints and recovers a state directory.
struct StateStoreOptions {
  /// Directory of the log and checkpoints; created (with parents) if absent.
  std::string dir;
  SyncPolicy sync = SyncPolicy::kEveryCommit;  ///< when a commit is durable
  /// kGroupCommit: how long a commit that finds no write in progress waits for others
  /// to join its fdatasync (0: none; those that arrive during a write join the next).
  /// kInterval: the fdatasync interval; must be > 0. At most 10 s.
  absl::Duration group_commit_window = absl::ZeroDuration();
  /// kIncremental writes a full checkpoint first, then incremental ones until there
  /// are `max_incremental_chain` of them or they add up to more bytes than the full
  /// one (recovery reads them all), then a full one again; kFull writes full ones.
  CheckpointMode checkpoint_mode = CheckpointMode::kIncremental;
  /// Automatic checkpoints: every `checkpoint_interval` (0: never by time; at most
  /// 720 h) and when `checkpoint_log_bytes` of log were written since the last one
  /// (0: never by size).
  ///@{
  absl::Duration checkpoint_interval = absl::Minutes(5);
  std::uint64_t checkpoint_log_bytes = std::uint64_t{64} << 20;
  ///@}
  RecoveryMode recovery = RecoveryMode::kPointInTime;  ///< torn tail and damage at Open

  /// A new log segment is started once the current one holds this many bytes;
  /// 4096 .. 2^40, else Open returns InvalidArgument naming the value.
  std::uint64_t segment_bytes = std::uint64_t{64} << 20;
  /// At least 1 (InvalidArgument otherwise); see checkpoint_mode.
  int max_incremental_chain = 16;
  /// Recover and serve reads without changing any file (no torn-tail truncation, no
  /// commits, no checkpoints): for inspection tools. Allowed next to an open writer:
  /// it serves one consistent cut, a prefix of the committed transactions. A pass
  /// that catches the files mid-change — a file the writer retires after the
  /// listing, a listing taken during a checkpoint swap, the record the writer is
  /// writing (a torn tail, in kStrict) — is listed and read again, up to 5 passes
  /// (1+2+4+8 ms apart); damage still there on the last pass is reported.
  bool read_only = false;
  /// File layer (null: PosixFileSystem()); tests inject failures through it.
  std::shared_ptr<FileSystem> file_system;
};

/// A StateStore's counters and recovery figures (StateStore::Stats).
struct StateStoreStats {
  std::uint64_t last_tx_id = 0;     ///< newest durable transaction
  std::uint64_t keys = 0;           ///< live keys
  std::uint64_t commits = 0;        ///< since Open
  std::uint64_t log_syncs = 0;      ///< fdatasync calls on the log since Open
  std::uint64_t log_bytes = 0;      ///< bytes appended to the log since Open
  std::uint64_t segments = 0;       ///< log segment files now
  std::uint64_t checkpoints_full = 0;         ///< written since Open
  std::uint64_t checkpoints_incremental = 0;  ///< written since Open
  std::uint64_t last_checkpoint_tx = 0;       ///< newest checkpoint on disk
  std::uint64_t last_checkpoint_bytes = 0;    ///< size of that checkpoint's file
  /// Durations in ns since Open: each fdatasync of the log that succeeded, and each
  /// checkpoint written (taking the snapshot, writing, syncing and renaming the file,
  /// retiring what it replaces).
  ///@{
  HistogramSnapshot log_sync_ns{};
  HistogramSnapshot checkpoint_ns{};
  ///@}
  // Recovery at Open.
  std::uint64_t recovered_checkpoints = 0;    ///< checkpoint files loaded
  std::uint64_t recovered_log_records = 0;    ///< log records replayed after them
  std::uint64_t torn_tail_bytes = 0;          ///< cut off (kPointInTime)
  double recovery_ms = 0;                     ///< time Open spent recovering
  bool failed = false;                        ///< in the failed state
};

/// What `inferq-state inspect` prints: the files of a state directory, read without
/// changing them.
struct StateDirReport {
  /// A log segment file.
  struct Segment {
    std::string name;              ///< file name, `wal-<first tx_id>.log`
    std::uint64_t bytes = 0;       ///< file size (the writer zero-fills ahead)
    std::uint64_t used_bytes = 0;  ///< header and valid records
    std::uint64_t first_tx = 0;    ///< 0 when it holds no valid record
    std::uint64_t last_tx = 0;     ///< 0 when it holds no valid record
    std::uint64_t records = 0;     ///< valid records, up to the first invalid frame
    std::string problem;         ///< empty when the whole file is valid
    bool unreadable = false;     ///< the problem is an I/O error reading it, not damage
  };
  /// A checkpoint file.
  struct CheckpointFile {
    std::string name;         ///< file name, `ckpt-<tx_id>-<full|incr>.zst`
    std::uint64_t bytes = 0;  ///< file size
    bool full = false;        ///< a full checkpoint (else incremental), by its name
    std::uint64_t tx = 0;     ///< the tx_id it brings the state to, by its name
    std::uint64_t base_tx = 0;  ///< incremental: the tx_id it applies on; full: 0
    std::uint64_t entries = 0;  ///< keys it records (an incremental one's deletions included)
    std::string problem;      ///< empty when valid
    bool unreadable = false;  ///< the problem is an I/O error reading it, not damage
  };
  std::vector<Segment> segments;            ///< by file name
  std::vector<CheckpointFile> checkpoints;  ///< by file name
  std::uint64_t first_tx = 0;  ///< oldest record in the log (0: none)
  std::uint64_t last_tx = 0;    ///< newest recoverable tx_id (when point_in_time is OK)
  absl::Status point_in_time;   ///< what recovery in kPointInTime mode would report
  absl::Status chain;           ///< what recovery in kStrict mode would report
};

class StateStore;

/// A set of changes committed atomically: all of them become durable, or none.
class Transaction {
 public:
  /// Movable, not copyable.
  ///@{
  Transaction(Transaction&&) noexcept = default;
  Transaction& operator=(Transaction&&) noexcept = default;
  ///@}

  /// Sets `key` to `value` (bytes). Keys are 1 to 65,536 bytes, values at most
  /// 256 MiB, a whole transaction at most 1 GiB encoded (9 bytes per change plus
  /// keys and values); a bad size is reported by Commit (kInvalidArgument naming the
  /// key, or the transaction's size).
  Transaction& Put(std::string_view key, std::string_view value);
  /// Removes `key` (absent keys are fine).
  Transaction& Delete(std::string_view key);
  /// Makes the changes durable under the store's sync policy and returns the tx_id.
  /// kInvalidArgument: no changes, or a key/value of a bad size (nothing written);
  /// kFailedPrecondition: read-only store, already committed (or failed with an I/O
  /// error: a transaction is submitted once), or the store failed; the I/O error
  /// itself for the commit whose write or fdatasync failed.
  absl::StatusOr<std::uint64_t> Commit();

 private:
  friend class StateStore;
  struct Change {
    bool del = false;
    std::string key;
    std::string value;
  };
  explicit Transaction(StateStore* store) : store_(store) {}
  StateStore* store_;
  std::vector<Change> changes_;
  bool committed_ = false;
};

/// Durable key-value state over the Delta-State Log (see the file comment).
class StateStore {
 public:
  /// Opens (creating the directory if absent) and recovers. Unless read-only, takes
  /// an exclusive lock on `dir`/LOCK for the store's lifetime. Errors:
  /// kInvalidArgument for bad options (naming the field), kFailedPrecondition when
  /// another store (in any process) has the directory open, kPermissionDenied when
  /// a writer may not write `dir` — on a read-only file system (EROFS) or without
  /// permission (EACCES, EPERM) — naming the directory and the failed call ("state
  /// directory '/d' is not writable (read_only = true opens it for reading): open
  /// '/d/LOCK': Read-only file system"; a read_only open writes nothing and works
  /// there), kDataLoss for damage recovery must not skip (naming file, offset,
  /// tx_id) and for files of another store (naming the directory and both store
  /// ids), the I/O error of a failed file operation.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(StateStoreOptions options);

  /// Reads the files of `dir` without changing them (see StateDirReport). Allowed
  /// next to an open writer: the report describes one cut of the directory (one
  /// listing; the newest segment read once); a report that shows a problem is taken
  /// again, up to 5 passes as for read_only, and the last one is returned. Errors:
  /// the I/O error of listing `dir`.
  static absl::StatusOr<StateDirReport> Inspect(const std::string& dir,
                                                std::shared_ptr<FileSystem> fs = nullptr);

  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  /// A new, empty transaction on this store, which must outlive it.
  Transaction Begin() { return Transaction(this); }

  /// The value of `key` after the newest durable transaction that changed it.
  std::optional<std::string> Get(std::string_view key) const;

  /// Calls fn(key, value) for every key starting with `prefix`, in key order, on one
  /// consistent state (no commit is half applied). `fn` must not call this store.
  template <class F>
  void Scan(std::string_view prefix, F&& fn) const {
    ScanImpl(prefix, absl::FunctionRef<void(std::string_view, std::string_view)>(fn));
  }

  /// Writes a checkpoint now (full or incremental per the options) and retires the
  /// log segments no longer needed. kFailedPrecondition when read-only or failed.
  absl::Status Checkpoint();

  /// Re-reads the log and checkpoints on disk and checks tx_id continuity, every
  /// frame checksum and the hash chain up to last_tx_id(), and that each checkpoint's
  /// chain hash matches the log. kDataLoss naming file, offset and tx_id on a break.
  /// Commits wait while it reads. On a read-only store the files may have moved on
  /// since Open (a writer committed, checkpointed, retired files): they must still
  /// hold the chain up to last_tx_id() with the same record there, and be intact
  /// after it up to a torn tail (a write under way, newer than the store's cut, so
  /// not an error); kDataLoss when they end before last_tx_id() or hold another
  /// record at it.
  absl::Status VerifyChain() const;

  /// Newest durable tx_id (0 when nothing was ever committed).
  std::uint64_t last_tx_id() const;

  /// A snapshot of the counters.
  StateStoreStats Stats() const;

 private:
  friend class Transaction;
  class Impl;
  explicit StateStore(std::unique_ptr<Impl> impl);
  void ScanImpl(std::string_view prefix,
                absl::FunctionRef<void(std::string_view, std::string_view)> fn) const;
  absl::StatusOr<std::uint64_t> CommitChanges(std::vector<Transaction::Change>& changes);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq
