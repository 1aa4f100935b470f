// Private to src/state: what StateStore (state_store.cpp) and StreamLog
// (stream_log.cpp) share about their logs: the checks of the options both take,
// and the random salt of a new segment or store id.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inferq/state/state_store.hpp"

namespace inferq::state_internal {

// InvalidArgument naming `owner`'s field ("StateStoreOptions.segment_bytes 100 is
// outside 4096 to 2^40") for: an empty dir, a sync or recovery value outside its
// enum, a group_commit_window outside 0 to 10 s (bounded so that deadlines computed
// from it never overflow) or not > 0 with kInterval, a segment_bytes outside 4096 to
// 2^40.
absl::Status ValidateLogOptions(const std::string& owner, const std::string& dir,
                                SyncPolicy sync, absl::Duration group_commit_window,
                                RecoveryMode recovery, std::uint64_t segment_bytes);

// A random nonzero 64-bit value (segment salts, store ids).
std::uint64_t RandomSalt();

}  // namespace inferq::state_internal
