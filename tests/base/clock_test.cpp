#include "inferq/base/clock.hpp"

#include <chrono>
#include <cmath>

#include <catch2/catch.hpp>

using inferq::DeadlineAfter;
using inferq::kNoDeadline;
using inferq::SteadyClock;

TEST_CASE("DeadlineAfter: zero and negative timeouts give a deadline already passed") {
  CHECK(DeadlineAfter(absl::ZeroDuration()) == 0);
  CHECK(DeadlineAfter(absl::Nanoseconds(-1)) == 0);
  CHECK(DeadlineAfter(-absl::InfiniteDuration()) == 0);
  CHECK(DeadlineAfter(std::chrono::nanoseconds(0)) == 0);
  CHECK(DeadlineAfter(std::chrono::seconds(-5)) == 0);
  CHECK(DeadlineAfter(std::chrono::duration<double>(std::nan(""))) == 0);
  CHECK(SteadyClock::Now() > 0);  // so 0 has passed
}

TEST_CASE("DeadlineAfter: long timeouts saturate at kNoDeadline") {
  CHECK(DeadlineAfter(absl::InfiniteDuration()) == kNoDeadline);
  CHECK(DeadlineAfter(absl::Hours(24 * 365 * 1000)) == kNoDeadline);
  CHECK(DeadlineAfter(std::chrono::hours::max()) == kNoDeadline);
}

TEST_CASE("DeadlineAfter: a positive timeout is that long after now") {
  const std::int64_t before = SteadyClock::Now();
  const std::int64_t d = DeadlineAfter(absl::Seconds(2));
  const std::int64_t d2 = DeadlineAfter(std::chrono::milliseconds(2000));
  const std::int64_t after = SteadyClock::Now();
  CHECK(d >= before + 2'000'000'000);
  CHECK(d <= after + 2'000'000'000);
  CHECK(d2 >= before + 2'000'000'000);
  CHECK(d2 <= after + 2'000'000'000);
}
