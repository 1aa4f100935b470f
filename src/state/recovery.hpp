// Private to src/state: reading a state directory back (recovery, VerifyChain,
// Inspect). See inferq/state/state_store.hpp for the rules it applies.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
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
};

absl::StatusOr<Recovered> Recover(FileSystem& fs, const std::string& dir,
                                  const RecoverOptions& options);

std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace inferq::state_internal
