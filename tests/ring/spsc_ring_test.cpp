#include "inferq/ring/spsc_ring.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ring_test_util.hpp"

using inferq::SpscRing;
using namespace std::chrono_literals;

TEST_CASE("spsc: capacity, FIFO, full and empty") {
  CHECK_THROWS_AS(SpscRing<int>(0), std::invalid_argument);
  SpscRing<int> ring(3);
  CHECK(ring.capacity() == 4);
  int v = -1;
  CHECK_FALSE(ring.try_pop(v));
  for (int i = 0; i < 4; ++i) REQUIRE(ring.try_push(i));
  CHECK_FALSE(ring.try_push(9));
  CHECK(ring.size_approx() == 4);
  for (int i = 0; i < 4; ++i) {
    REQUIRE(ring.try_pop(v));
    CHECK(v == i);
  }
  CHECK_FALSE(ring.try_pop(v));
}

TEST_CASE("spsc: move-only items, and items left inside are destroyed") {
  auto shared = std::make_shared<int>(7);
  {
    SpscRing<std::shared_ptr<int>> ring(4);
    REQUIRE(ring.try_push(shared));
    REQUIRE(ring.try_emplace(shared));
    std::shared_ptr<int> out;
    REQUIRE(ring.try_pop(out));
    CHECK(shared.use_count() == 3);
  }
  CHECK(shared.use_count() == 1);
  SpscRing<std::unique_ptr<int>> ring(2);
  REQUIRE(ring.push(std::make_unique<int>(3)));
  std::unique_ptr<int> out;
  REQUIRE(ring.pop(out));
  CHECK(*out == 3);
}

TEST_CASE("spsc: close fails pushes, drains, then fails pops, and gives the item back") {
  SpscRing<std::unique_ptr<int>> ring(4);
  REQUIRE(ring.try_push(std::make_unique<int>(1)));
  ring.close();
  auto keep = std::make_unique<int>(2);
  CHECK_FALSE(ring.try_push(std::move(keep)));
  REQUIRE(keep != nullptr);
  std::unique_ptr<int> out;
  REQUIRE(ring.pop(out));
  CHECK(*out == 1);
  CHECK_FALSE(ring.pop(out));
  CHECK_FALSE(ring.pop_for(out, 1h));
}

TEST_CASE("spsc: close wakes a blocked consumer and a blocked producer") {
  SpscRing<int> empty(2);
  std::atomic<bool> pop_result{true};
  std::thread consumer([&] {
    int v;
    pop_result = empty.pop(v);
  });
  SpscRing<int> full(1);
  REQUIRE(full.try_push(1));
  std::atomic<bool> push_result{true};
  std::thread producer([&] { push_result = full.push(2); });
  std::this_thread::sleep_for(30ms);
  empty.close();
  full.close();
  consumer.join();
  producer.join();
  CHECK_FALSE(pop_result.load());
  CHECK_FALSE(push_result.load());
}

TEST_CASE("spsc: one producer, one consumer, every item once and in order") {
#if defined(__SANITIZE_THREAD__)
  constexpr std::uint64_t kItems = 100'000;
#else
  constexpr std::uint64_t kItems = 2'000'000;
#endif
  SpscRing<std::uint64_t> ring(64);
  std::uint64_t out_of_order = 0, received = 0;
  std::thread consumer([&] {
    std::uint64_t v, expect = 0;
    while (ring.pop(v)) {
      if (v != expect) ++out_of_order;
      expect = v + 1;
      ++received;
    }
  });
  for (std::uint64_t i = 0; i < kItems; ++i) ring.push(i);
  ring.close();
  consumer.join();
  CHECK(received == kItems);
  CHECK(out_of_order == 0);
}

TEST_CASE("spsc: close racing with pushes loses no pushed item") {
  for (int round = 0; round < 200; ++round) {
    SpscRing<std::uint64_t> ring(8);
    std::uint64_t pushed = 0, popped = 0;
    std::thread producer([&] {
      for (std::uint64_t i = 0;; ++i) {
        if (!ring.push(i)) break;
        ++pushed;
      }
    });
    std::thread consumer([&] {
      std::uint64_t v;
      while (ring.pop(v)) ++popped;
    });
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ring.close();
    producer.join();
    consumer.join();
    REQUIRE(pushed == popped);
  }
}

namespace {
// A move that takes a while, so that close() lands between constructing the item in
// its slot and publishing it.
struct SlowMove {
  int value = 0;
  SlowMove() = default;
  explicit SlowMove(int v) : value(v) {}
  SlowMove(SlowMove&& o) noexcept : value(o.value) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    o.value = -1;
  }
  SlowMove& operator=(SlowMove&& o) noexcept {
    value = o.value;
    o.value = -1;
    return *this;
  }
};
}  // namespace

TEST_CASE("spsc: a blocking push cut off by close gives the item back") {
  int lost = 0;
  for (int round = 0; round < 40; ++round) {
    SpscRing<SlowMove> ring(4);
    SlowMove item(7);
    bool pushed = true;
    std::thread producer([&] { pushed = ring.push(std::move(item)); });
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    ring.close();
    producer.join();
    if (!pushed && item.value != 7) ++lost;  // was: moved into the slot and destroyed
  }
  CHECK(lost == 0);
}

using inferq::ring_test::SleepAtOnce;
using inferq::ring_test::Watchdog;

// The notifier has no fence of its own: the producer's seq_cst CAS of head_ and the
// consumer's seq_cst store of tail_ pair with the sleeper's (event_count.hpp,
// invariants 2 and 3). A wake-up lost there stalls this ping-pong; a watchdog then
// closes the rings so that the test fails instead of hanging.
TEST_CASE("spsc: a waiter falling asleep as the other side moves is always woken") {
#if defined(__SANITIZE_THREAD__)
  constexpr int kItems = 2'000;
#else
  constexpr int kItems = 20'000;
#endif
  SpscRing<int, SleepAtOnce> there(1), back(1);
  std::atomic<std::uint64_t> progress{0};
  Watchdog watchdog(progress, there, back);
  std::thread echo([&] {
    int v;
    while (there.pop(v)) {
      if (!back.push(v + 1)) return;
    }
  });
  long long sum = 0;
  for (int i = 0; i < kItems; ++i) {
    int v;
    if (!there.push(i) || !back.pop(v)) break;
    sum += v;
    progress.fetch_add(1);
  }
  there.close();
  echo.join();
  watchdog.Stop();
  CHECK_FALSE(watchdog.stalled());
  CHECK(progress.load() == static_cast<std::uint64_t>(kItems));
  CHECK(sum == static_cast<long long>(kItems) * (kItems + 1) / 2);
}
