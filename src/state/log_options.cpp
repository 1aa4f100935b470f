// File: src/state/log_options.cpp (see log_options.hpp)
#include "log_options.hpp"

#include <chrono>
#include <mutex>
#include <random>

namespace inferq::state_internal {

absl::Status ValidateLogOptions(const std::string& owner, const std::string& dir,
                                SyncPolicy sync, absl::Duration window, RecoveryMode recovery,
                                std::uint64_t segment_bytes) {
  if (dir.empty()) return absl::InvalidArgumentError(owner + ".dir is empty");
  const int s = static_cast<int>(sync);
  if (s < 0 || s > static_cast<int>(SyncPolicy::kNone)) {
    return absl::InvalidArgumentError(owner + ".sync " + std::to_string(s) +
                                      " is not a SyncPolicy");
  }
  const int r = static_cast<int>(recovery);
  if (r < 0 || r > static_cast<int>(RecoveryMode::kStrict)) {
    return absl::InvalidArgumentError(owner + ".recovery " + std::to_string(r) +
                                      " is not a RecoveryMode");
  }
  if (window < absl::ZeroDuration() || window > absl::Seconds(10)) {
    return absl::InvalidArgumentError(owner + ".group_commit_window " +
                                      absl::FormatDuration(window) + " is outside 0 to 10s");
  }
  if (sync == SyncPolicy::kInterval && window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        owner + ".group_commit_window must be > 0 with SyncPolicy::kInterval (it is the "
        "fdatasync interval), got " + absl::FormatDuration(window));
  }
  if (segment_bytes < 4096 || segment_bytes > (std::uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(owner + ".segment_bytes " + std::to_string(segment_bytes) +
                                      " is outside 4096 to 2^40");
  }
  return absl::OkStatus();
}

std::uint64_t RandomSalt() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}() ^
                             static_cast<std::uint64_t>(
                                 std::chrono::steady_clock::now().time_since_epoch().count())};
  std::lock_guard lock(mu);
  std::uint64_t s = 0;
  while (s == 0) s = gen();
  return s;
}

}  // namespace inferq::state_internal
