// A stress of the rings' wake-up protocol (internal/event_count.hpp): tiny rings,
// 1-4 producers x 1-4 consumers, timed and untimed operations, random pauses. Built
// with -O2 even in Debug and sanitizer builds: at -O0 the interleavings that hung
// the first two versions of the event count's invariant 7 did not occur in 100
// rounds; at -O2 they hung within a few.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/ring/mpmc_ring.hpp"

using inferq::MpmcRing;
using namespace std::chrono_literals;

namespace {

// One round of the wake-up stress below: P producers and C consumers on a ring of
// `cap`, every other one with timed operations, all pausing at random.
template <class W>
std::int64_t WakeStressRound(int producers, int consumers, std::size_t cap, int items, unsigned seed) {
  MpmcRing<std::uint64_t, W> ring(cap);
  std::atomic<std::int64_t> got{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(seed * 31 + static_cast<unsigned>(c));
      std::uint64_t v;
      for (;;) {
        const bool ok = c % 2 == 1 ? ring.pop_for(v, std::chrono::microseconds(30 + rng() % 100)) : ring.pop(v);
        if (ok) {
          got.fetch_add(1);
        } else if (ring.closed() && ring.size_approx() == 0) {
          return;
        }
        if (rng() % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
      }
    });
  }
  std::vector<std::thread> prods;
  for (int p = 0; p < producers; ++p) {
    prods.emplace_back([&, p] {
      std::mt19937 rng(seed * 17 + static_cast<unsigned>(p));
      for (int i = 0; i < items; ++i) {
        if (p % 2 == 1) {
          while (!ring.push_for(static_cast<std::uint64_t>(i), std::chrono::microseconds(20 + rng() % 80))) {
          }
        } else {
          if (!ring.push(static_cast<std::uint64_t>(i))) return;
        }
        if (rng() % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
      }
    });
  }
  for (auto& t : prods) t.join();
  // Every item pushed reaches a consumer without close(). A lost wake-up leaves items
  // in the ring: after 60 s (a round takes milliseconds, seconds on a loaded machine)
  // the round fails, naming what is stuck, and close() lets the threads go.
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (got.load() < static_cast<std::int64_t>(producers) * items && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(1ms);
  }
  INFO("waited 60 s: " << got.load() << " of " << producers * items << " items delivered, " << ring.size_approx()
                       << " in the ring (" << producers << " producers, " << consumers << " consumers, capacity "
                       << cap << ")");
  CHECK(got.load() == static_cast<std::int64_t>(producers) * items);
  ring.close();
  for (auto& t : threads) t.join();
  return got.load();
}

}  // namespace

// The input that hung the first two versions of EventCount's invariant 7 (a wake-up
// marked on its way and then absorbed, or cleared without a re-check): rings of 2 to
// 8 slots, 1-4 producers x 1-4 consumers, timed and untimed operations, random pauses.
TEST_CASE("tiny rings under every mix of producers, consumers and timeouts deliver every item") {
  // 96 rounds take about 6 s on an idle machine, and over 6 minutes at load average
  // 10 on 2 cores (every hand-off then waits for the scheduler): past 16 rounds the
  // test stops starting new ones after 60 s, so it stays a bounded stress.
  const auto stop_after = std::chrono::steady_clock::now() + 60s;
  unsigned rounds = 0;
  for (unsigned r = 0; r < 96 && (r < 16 || std::chrono::steady_clock::now() < stop_after); ++r, ++rounds) {
    const int producers = 1 + static_cast<int>(r % 4);
    const int consumers = 1 + static_cast<int>((r / 4) % 4);
    const std::size_t cap = std::size_t{2} << (r % 3);
    CHECK(WakeStressRound<inferq::BudgetedWait>(producers, consumers, cap, 5000, r) == producers * 5000);
    CHECK(WakeStressRound<inferq::HybridWait>(producers, consumers, cap, 5000, r) == producers * 5000);
  }
  WARN("wake stress: " << rounds << " of 96 rounds run");
}
