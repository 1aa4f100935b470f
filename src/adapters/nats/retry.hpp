// File: src/adapters/nats/retry.hpp (internal to the NATS bridge)
//
// ExportRetryDelay: how long an export's failed publish waits before the engine
// delivers it again (ExportConfig::retry_delay). The delay doubles with each further
// delivery of the message, up to kExportRetryCap x retry_delay: during an outage, or
// while a restarted JetStream cluster elects its stream leaders (publishes find "no
// responders"), a replica process of the cluster example (4,096 publishes in flight,
// 200 ms) retried 139,598 failed publishes in the 20 s its restarted servers took to
// elect their leaders at load average 10-36 on 2 vCPUs: CPU the elections needed. Exponential backoff, as nats.c's own reconnects and
// JetStream's consumer BackOff do; capped, so that the first publish after the
// outage waits at most the cap.
// Thread safety: a pure function.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"
#include "inferq/base/limits.hpp"

namespace inferq::nats::internal {

inline constexpr std::uint32_t kExportRetryCap = 16;

// retry_delay x 2^(attempt - 1), at most kExportRetryCap x retry_delay and at most
// kMaxDuration (365 days, the longest delay Message::Nak takes: a longer one would be
// refused and the retry lost); `attempt` is Message::attempt() of the delivery that
// failed (1 for the first).
inline absl::Duration ExportRetryDelay(absl::Duration retry_delay, std::uint32_t attempt) {
  std::uint32_t factor = 1;
  for (std::uint32_t a = 1; a < attempt && factor < kExportRetryCap; ++a) factor *= 2;
  return std::min(retry_delay * static_cast<std::int64_t>(std::min(factor, kExportRetryCap)),
                  kMaxDuration);
}

}  // namespace inferq::nats::internal
