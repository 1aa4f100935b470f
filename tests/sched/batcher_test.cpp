#include "inferq/sched/batcher.hpp"

#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using inferq::BatchDecision;
using inferq::Batcher;
using inferq::BatchPolicy;

namespace {

std::unique_ptr<Batcher> Make(BatchPolicy p) {
  auto b = Batcher::Create(std::move(p));
  REQUIRE(b.ok());
  return *std::move(b);
}

BatchPolicy Adaptive(std::uint32_t max_batch, absl::Duration baseline,
                     absl::Duration delay = absl::Milliseconds(2)) {
  BatchPolicy p;
  p.max_batch = max_batch;
  p.max_queue_delay = delay;
  p.adaptive = true;
  p.baseline_rtt = baseline;
  return p;
}

constexpr std::int64_t kMs = 1'000'000;

}  // namespace

TEST_CASE("adaptive window follows baseline / observed RTT, clamped to 0.3..1.5") {
  SECTION("before any sample the ratio is 1: round(8 * 0.8) = 6") {
    auto b = Make(Adaptive(8, absl::Milliseconds(10)));
    CHECK(b->observed_rtt_ns() == 0);
    CHECK(b->window() == 6);
    CHECK(b->window_delay_ns() == 1'600'000);  // 2 ms * 0.8
  }
  SECTION("observed 20 ms: ratio 0.5, round(3.2) = 3, delay 0.8 ms") {
    auto b = Make(Adaptive(8, absl::Milliseconds(10)));
    b->ObserveRtt(20 * kMs);
    CHECK(b->observed_rtt_ns() == 20 * kMs);
    CHECK(b->window() == 3);
    CHECK(b->window_delay_ns() == 800'000);
  }
  SECTION("observed 5 ms: ratio 2 clamps to 1.5, round(9.6) = 10 caps at max_batch 8") {
    auto b = Make(Adaptive(8, absl::Milliseconds(10)));
    b->ObserveRtt(5 * kMs);
    CHECK(b->window() == 8);
    CHECK(b->window_delay_ns() == 2'400'000);  // 2 ms * 1.5 * 0.8
  }
  SECTION("observed 100 ms: ratio 0.1 clamps to 0.3, round(0.3 * 100 * 0.8) = 24") {
    auto b = Make(Adaptive(100, absl::Milliseconds(10)));
    b->ObserveRtt(100 * kMs);
    CHECK(b->window() == 24);
    CHECK(b->window_delay_ns() == 480'000);
  }
  SECTION("the size window never drops below 1") {
    auto b = Make(Adaptive(1, absl::Milliseconds(10)));
    b->ObserveRtt(1000 * kMs);  // ratio 0.3: round(0.24) = 0 -> 1
    CHECK(b->window() == 1);
  }
  SECTION("non-adaptive: window = max_batch, delay = max_queue_delay") {
    BatchPolicy p;
    p.max_batch = 8;
    p.max_queue_delay = absl::Microseconds(50);
    auto b = Make(p);
    b->ObserveRtt(100 * kMs);
    CHECK(b->window() == 8);
    CHECK(b->window_delay_ns() == 50'000);  // no 128 µs floor without adaptive
  }
}

TEST_CASE("observed RTT is an EMA with alpha 0.2 seeded by the first sample") {
  auto b = Make(Adaptive(8, absl::Milliseconds(10)));
  b->ObserveRtt(10 * kMs);
  CHECK(b->observed_rtt_ns() == 10'000'000);
  b->ObserveRtt(20 * kMs);  // 0.2 * 20 + 0.8 * 10
  CHECK(b->observed_rtt_ns() == 12'000'000);
  b->ObserveRtt(20 * kMs);  // 0.2 * 20 + 0.8 * 12
  CHECK(b->observed_rtt_ns() == 13'600'000);
  b->ObserveRtt(5 * kMs);  // 0.2 * 5 + 0.8 * 13.6
  CHECK(b->observed_rtt_ns() == 11'880'000);
  // ratio 10 / 11.88 = 0.8418, window round(5.387) = 5
  CHECK(b->window() == 5);
  b->ObserveRtt(3);  // (3 + 4 * 11'880'000 + 2) / 5 = 9'504'001
  CHECK(b->observed_rtt_ns() == 9'504'001);
  SECTION("samples <= 0 or above 1 hour are ignored and counted") {
    b->ObserveRtt(0);
    b->ObserveRtt(-5);
    b->ObserveRtt(3'600'000'000'001);
    CHECK(b->observed_rtt_ns() == 9'504'001);
    CHECK(b->Stats().rtt_samples == 5);
    CHECK(b->Stats().rtt_samples_ignored == 3);
  }
}

TEST_CASE("the time window has a 128 µs floor, and stays 0 when max_queue_delay is 0") {
  SECTION("ratio 0.3 of 200 µs * 0.8 = 48 µs rises to the floor") {
    auto b = Make(Adaptive(8, absl::Milliseconds(1), absl::Microseconds(200)));
    b->ObserveRtt(10 * kMs);
    CHECK(b->window_delay_ns() == 128'000);
  }
  SECTION("a custom floor") {
    BatchPolicy p = Adaptive(8, absl::Milliseconds(1), absl::Microseconds(200));
    p.min_window_us = 10;
    auto b = Make(p);
    b->ObserveRtt(10 * kMs);
    CHECK(b->window_delay_ns() == 48'000);
  }
  SECTION("max_queue_delay 0 never waits") {
    auto b = Make(Adaptive(8, absl::Milliseconds(1), absl::ZeroDuration()));
    b->ObserveRtt(10 * kMs);
    CHECK(b->window_delay_ns() == 0);
    const BatchDecision d = b->Decide(1, 100, 100);
    CHECK(d.take == 1);
    CHECK(d.wait_until_ns == 100);
  }
}

TEST_CASE("Decide follows the dynamic batcher rules") {
  BatchPolicy p;
  p.max_batch = 8;
  p.max_queue_delay = absl::Microseconds(500);
  SECTION("empty queue waits for an arrival") {
    auto b = Make(p);
    const BatchDecision d = b->Decide(0, 0, 1000);
    CHECK(d.take == 0);
    CHECK(d.wait_until_ns == INT64_MAX);
  }
  SECTION("a full window leaves at once") {
    auto b = Make(p);
    CHECK(b->Decide(8, 1000, 1000).take == 8);
    CHECK(b->Decide(20, 1000, 1000).take == 8);
  }
  SECTION("below the window it waits for the delay of the oldest item, then takes all") {
    auto b = Make(p);
    BatchDecision d = b->Decide(3, 1000, 1200);
    CHECK(d.take == 0);
    CHECK(d.wait_until_ns == 501'000);
    d = b->Decide(3, 1000, 500'999);
    CHECK(d.take == 0);
    d = b->Decide(3, 1000, 501'000);
    CHECK(d.take == 3);
    CHECK(d.wait_until_ns == 501'000);
  }
  SECTION("no 1-then-4 splitting: five items queued while busy leave as one batch") {
    auto b = Make(p);
    // The member was busy for 2 ms; the first of five items came 1.5 ms ago.
    const BatchDecision d = b->Decide(5, 500'000, 2'000'000);
    CHECK(d.take == 5);
    const auto s = b->Stats();
    CHECK(s.timeout_batches == 1);
    CHECK(s.items_dispatched == 5);
    CHECK(s.batches_by_size[2] == 1);  // 5 is in [4, 8)
  }
  SECTION("preferred sizes") {
    p.preferred_batch_sizes = {2, 4};
    auto b = Make(p);
    CHECK(b->Decide(1, 1000, 1000).take == 0);  // no preferred size reachable: wait
    CHECK(b->Decide(2, 1000, 1000).take == 2);
    CHECK(b->Decide(3, 1000, 1000).take == 2);
    CHECK(b->Decide(7, 1000, 1000).take == 4);
    CHECK(b->Decide(8, 1000, 1000).take == 4);  // full window: largest preferred <= 8
    CHECK(b->Decide(1, 1000, 501'000).take == 1);  // delay passed
    const auto s = b->Stats();
    CHECK(s.decisions == 6);
    CHECK(s.waits == 1);
    CHECK(s.preferred_batches == 3);
    CHECK(s.full_batches == 1);
    CHECK(s.timeout_batches == 1);
    CHECK(s.items_dispatched == 13);
  }
  SECTION("with a full window and every preferred size above it, the window is taken") {
    BatchPolicy a = Adaptive(8, absl::Milliseconds(10));
    a.preferred_batch_sizes = {4, 8};
    auto b = Make(a);
    b->ObserveRtt(20 * kMs);  // window 3
    CHECK(b->Decide(6, 1000, 1000).take == 3);
    b->ObserveRtt(5 * kMs);  // 0.2*5 + 0.8*20 = 17 ms: ratio 0.588, window round(3.76) = 4
    CHECK(b->window() == 4);
    CHECK(b->Decide(6, 1000, 1000).take == 4);
  }
  SECTION("the delay deadline saturates instead of wrapping") {
    auto b = Make(p);
    const BatchDecision d = b->Decide(1, INT64_MAX - 10, INT64_MAX - 10);
    CHECK(d.take == 0);
    CHECK(d.wait_until_ns == INT64_MAX);
  }
}

TEST_CASE("BatchPolicy::Validate names the bad field and value") {
  auto msg = [](const BatchPolicy& p) { return std::string(BatchPolicy::Validate(p).message()); };
  BatchPolicy p;
  CHECK(BatchPolicy::Validate(p).ok());
  SECTION("max_batch") {
    p.max_batch = 0;
    CHECK(BatchPolicy::Validate(p).code() == absl::StatusCode::kInvalidArgument);
    CHECK(msg(p) == "batch max_batch 0 is outside 1..65536");
    p.max_batch = 65537;
    CHECK(msg(p) == "batch max_batch 65537 is outside 1..65536");
    p.max_batch = 65536;
    CHECK(BatchPolicy::Validate(p).ok());
  }
  SECTION("max_queue_delay") {
    p.max_queue_delay = absl::Milliseconds(-1);
    CHECK(msg(p) == "batch max_queue_delay -1ms is outside 0..1h");
    p.max_queue_delay = absl::InfiniteDuration();
    CHECK(msg(p) == "batch max_queue_delay inf is outside 0..1h");
  }
  SECTION("preferred sizes") {
    p.max_batch = 8;
    p.preferred_batch_sizes = {2, 9};
    CHECK(msg(p) == "batch preferred_batch_sizes[1] 9 is outside 1..max_batch 8");
    p.preferred_batch_sizes = {0};
    CHECK(msg(p) == "batch preferred_batch_sizes[0] 0 is outside 1..max_batch 8");
    p.preferred_batch_sizes = {4, 4};
    CHECK(msg(p) ==
          "batch preferred_batch_sizes[1] 4 is not above the previous size 4 (sizes must be "
          "strictly ascending)");
  }
  SECTION("adaptive needs a baseline") {
    p.adaptive = true;
    CHECK(msg(p) == "batch baseline_rtt 0 must be in (0, 1h] when adaptive");
    p.baseline_rtt = absl::Hours(2);
    CHECK(msg(p) == "batch baseline_rtt 2h must be in (0, 1h] when adaptive");
  }
  SECTION("min_window_us") {
    p.min_window_us = 0;
    CHECK(msg(p) == "batch min_window_us 0 is outside 1..3600000000");
  }
  SECTION("Create refuses what Validate refuses") {
    p.max_batch = 0;
    CHECK(Batcher::Create(p).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("RTT samples from another thread all reach the EMA") {
  auto b = Make(Adaptive(64, absl::Milliseconds(10)));
  // Every sample equal: the EMA stays at it whatever the interleaving.
  std::thread observer([&] {
    for (int i = 0; i < 20000; ++i) b->ObserveRtt(10 * kMs);
  });
  std::uint64_t taken = 0;
  for (int i = 0; i < 20000; ++i) taken += b->Decide(100, 0, 1).take;
  observer.join();
  CHECK(b->observed_rtt_ns() == 10 * kMs);
  CHECK(b->Stats().rtt_samples == 20000);
  CHECK(b->Stats().decisions == 20000);
  // ratio 1 before and after the first sample: window round(64 * 0.8) = 51
  CHECK(taken == 20000u * 51u);
}
