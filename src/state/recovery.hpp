// Private to src/state: reading a state directory back (recovery, VerifyChain,
// Inspect). See inferq/state/state_store.hpp for the rules it applies.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "inferq/state/file_system.hpp"
#include "inferq/state/state_store.hpp"
#include "log_format.hpp"

namespace inferq::state_internal {

using StateMap = absl::btree_map<std::string, std::string>;

struct SegmentFile {
  std::string name;
  std::uint64_t first_tx = 0;
  std::uint64_t salt = 0;
  std::uint64_t bytes = 0;      // end of the last valid record: where appends go
  std::uint64_t file_bytes = 0; // size of the file (zero-filled space included)
  std::uint64_t dirty_end = 0;  // end of a torn tail's bytes (> bytes only when torn)
};

struct CheckpointOnDisk {
  std::string name;
  CheckpointKind kind = CheckpointKind::kFull;
  std::uint64_t tx = 0;
  std::uint64_t base_tx = 0;
  std::uint64_t bytes = 0;
};

struct RecoverOptions {
  bool strict = false;          // RecoveryMode::kStrict
  bool modify = false;          // remove temp files and a torn header-less last segment
  bool build_state = true;      // replay into `state`
  bool check_all_checkpoints = false;  // decode every checkpoint and match it to the log
  std::uint64_t max_checkpoint_raw_bytes = kMaxCheckpointRawBytes;
  // The tx_id a read-only store read at Open (its VerifyChain): a torn tail after it
  // is newer than that cut (a writer is writing it), not damage, in kStrict too; and
  // Recovered::snapshot_hash gets the hash at that tx_id if the files still hold it.
  std::optional<std::uint64_t> snapshot_tx;
};

struct Recovered {
  std::uint64_t store_id = 0;  // from IDENTITY; 0 for a directory without files yet
  StateMap state;
  std::uint64_t last_tx = 0;
  Hash last_hash{};
  std::uint64_t base_tx = 0;  // newest checkpoint loaded (0: none)
  std::vector<SegmentFile> segments;  // in tx order; the last one gets the appends
  std::vector<CheckpointOnDisk> checkpoints;  // valid names, in tx order
  std::uint64_t checkpoints_loaded = 0;
  std::uint64_t records_replayed = 0;
  std::uint64_t torn_tail_bytes = 0;  // in the last segment, after segments.back().bytes
  std::vector<std::string> notes;     // checkpoints skipped, files removed
  absl::flat_hash_set<std::string> changed_since_base;  // keys of replayed records
  std::optional<Hash> snapshot_hash;  // see RecoverOptions::snapshot_tx
};

absl::StatusOr<Recovered> Recover(FileSystem& fs, const std::string& dir,
                                  const RecoverOptions& options);

// A reader next to a live writer (read-only opens, Inspect) can catch the directory
// mid-change: a file the writer retires after the listing (kNotFound), a listing
// taken while a checkpoint swap renames and removes files (a tx_id gap), the tail
// record while the writer's pwrite(2) of it is under way (a torn or damaged tail).
// Each of these is gone on a later pass, while real damage stays. Readers therefore
// list and read again, up to kReadOnlyPasses passes in all (waiting 1, 2, 4, ... ms
// between them), and report what the last pass found.
inline constexpr int kReadOnlyPasses = 5;
bool MayBeMidChange(const absl::Status& st);  // kNotFound or kDataLoss
void WaitBeforePass(int pass);                // before pass 1, 2, ... (0-based)

// Recover with options.modify == false, in up to kReadOnlyPasses passes.
absl::StatusOr<Recovered> RecoverReadOnly(FileSystem& fs, const std::string& dir,
                                          const RecoverOptions& options);

// A view of a state directory for several passes over one cut of it (Inspect):
// every List of `dir` returns the listing taken by Make, and Make reads every
// segment and checkpoint of that listing at once and serves them from memory
// afterwards (so the view holds the retained directory in memory: Inspect is a
// diagnostic). A file Make could not read is read through later (a retired one is
// kNotFound); the newest segment, the only file a writer still appends to, is then
// read once. Calls that change files are refused.
// One thread at a time (it caches without a lock).
class PinnedDirectory final : public FileSystem {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedDirectory>> Make(FileSystem& fs,
                                                               const std::string& dir);
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override;
  absl::StatusOr<std::string> Read(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status SyncDir(const std::string& dir) override;
  // A hash of the names and bytes of the store files read by Make: two pins with the
  // same fingerprint saw the same files (a static directory; a pass over it gives the
  // same report).
  std::uint64_t fingerprint() const { return fingerprint_; }

 private:
  PinnedDirectory(FileSystem& fs, std::string dir, std::vector<std::string> names,
                  std::string newest_segment)
      : fs_(fs), dir_(std::move(dir)), names_(std::move(names)),
        newest_segment_(std::move(newest_segment)) {}
  FileSystem& fs_;
  const std::string dir_;
  const std::vector<std::string> names_;
  const std::string newest_segment_;  // path; empty when the listing has none
  std::optional<absl::StatusOr<std::string>> newest_bytes_;
  absl::flat_hash_map<std::string, std::string> bytes_;  // path -> bytes read by Make
  std::uint64_t fingerprint_ = 0;
};

std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace inferq::state_internal
