// Contract tests of AdaptiveMutex (also the engine's stream mutex, StreamMutex):
// mutual exclusion (also with more threads than cores, which sends waiters to sleep),
// try_lock, and that a sleeper is always woken.
#include "inferq/base/adaptive_mutex.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace {

TEST_CASE("adaptive mutex: try_lock fails while held and succeeds once unlocked") {
  inferq::AdaptiveMutex mu;
  REQUIRE(mu.try_lock());
  std::thread other([&] { CHECK_FALSE(mu.try_lock()); });
  other.join();
  CHECK_FALSE(mu.try_lock());  // not recursive
  mu.unlock();
  REQUIRE(mu.try_lock());
  mu.unlock();
}

TEST_CASE("adaptive mutex: increments under the lock are never lost, 8 threads on 2 cores") {
  inferq::AdaptiveMutex mu;
  std::uint64_t count = 0;  // plain: only the lock orders its writes
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        std::lock_guard lock(mu);
        ++count;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::lock_guard lock(mu);
  CHECK(count == std::uint64_t{kThreads} * kPerThread);
}

TEST_CASE("adaptive mutex: waiters put to sleep by a long holder all get the lock") {
  // The holder keeps the lock far beyond the spin phase, so every waiter sleeps on
  // the futex; each unlock must wake the next one (a lost wake-up hangs here).
  inferq::AdaptiveMutex mu;
  std::vector<int> order;
  std::atomic<int> started{0};
  mu.lock();
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t) {
    waiters.emplace_back([&, t] {
      started.fetch_add(1);
      std::lock_guard lock(mu);
      order.push_back(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the next one sleeps too
    });
  }
  while (started.load() < 4) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  mu.unlock();
  for (std::thread& t : waiters) t.join();
  std::lock_guard lock(mu);
  REQUIRE(order.size() == 4);
  std::vector<int> seen(4, 0);
  for (int t : order) ++seen[static_cast<std::size_t>(t)];
  CHECK(seen == std::vector<int>{1, 1, 1, 1});
}

TEST_CASE("adaptive mutex: a hand-off between two threads, 10,000 rounds, loses no wake-up") {
  // Each thread waits for its turn under the lock, so the lock changes hands on every
  // round and the loser of each race alternates between spinning and sleeping.
  inferq::AdaptiveMutex mu;
  int turn = 0;
  std::uint64_t rounds[2] = {0, 0};
  constexpr std::uint64_t kRounds = 10000;
  auto run = [&](int me) {
    while (true) {
      std::lock_guard lock(mu);
      if (rounds[me] == kRounds) return;
      if (turn != me) continue;
      ++rounds[me];
      turn = 1 - me;
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  CHECK(rounds[0] == kRounds);
  CHECK(rounds[1] == kRounds);
}

}  // namespace
