// File: src/engine/stream_store.cpp
//
// A stream's store behind two calls, inline in stream_state.hpp because every
// publish runs them: Admit (max_age at the front, the duplicate window, then the
// limits) decides whether an event may be stored; Append (discard old, the
// counters, the duplicate window's record, retention) stores it. Here: CheckLimits,
// the limits that refuse an event (max_msg_size, discard new, max_bytes) and their
// messages, off the hot path.
#include <cstdint>
#include <memory>
#include <string>

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

}  // namespace engine_internal
}  // namespace inferq
