// ExportRetryDelay (src/adapters/nats/retry.hpp): the backoff of an export's failed
// publishes. A replica process of the cluster example retried 139,598 failed
// publishes while its restarted JetStream cluster elected its leaders, every
// message in flight each 200 ms; the delay now doubles per delivery of a message.
#include <catch2/catch.hpp>

#include "../../src/adapters/nats/retry.hpp"

using inferq::nats::internal::ExportRetryDelay;

TEST_CASE("an export's failed publish waits retry_delay, doubled per further delivery, at most 16 times") {
  const absl::Duration d = absl::Milliseconds(200);
  CHECK(ExportRetryDelay(d, 0) == absl::Milliseconds(200));  // no delivery counted: as the first
  CHECK(ExportRetryDelay(d, 1) == absl::Milliseconds(200));
  CHECK(ExportRetryDelay(d, 2) == absl::Milliseconds(400));
  CHECK(ExportRetryDelay(d, 3) == absl::Milliseconds(800));
  CHECK(ExportRetryDelay(d, 4) == absl::Milliseconds(1600));
  CHECK(ExportRetryDelay(d, 5) == absl::Milliseconds(3200));
  CHECK(ExportRetryDelay(d, 6) == absl::Milliseconds(3200));
  CHECK(ExportRetryDelay(d, 4'000'000'000u) == absl::Milliseconds(3200));
  CHECK(ExportRetryDelay(absl::ZeroDuration(), 7) == absl::ZeroDuration());
  // Never past the longest nak delay: 30 days x 16 would be refused by Nak.
  CHECK(ExportRetryDelay(absl::Hours(24 * 30), 4) == absl::Hours(24 * 240));
  CHECK(ExportRetryDelay(absl::Hours(24 * 30), 5) == inferq::kMaxDuration);
  CHECK(ExportRetryDelay(absl::Hours(24 * 365), 1) == inferq::kMaxDuration);
}
