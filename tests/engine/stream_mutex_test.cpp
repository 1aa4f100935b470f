// StreamMutex (src/engine/stream_state.hpp): the stream's mutex, glibc's adaptive
// type where it exists. Mutual exclusion under contention (TSan checks the plain
// counter), try_lock's answers, and use through std::unique_lock.
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/stream_state.hpp"

using inferq::engine_internal::StreamMutex;

TEST_CASE("StreamMutex excludes: four threads increment one plain counter under it") {
  StreamMutex mu;
  std::uint64_t counter = 0;  // not atomic: only the mutex orders the increments
  constexpr int kThreads = 4;
  constexpr int kEach = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard lock(mu);
        ++counter;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(counter == std::uint64_t{kThreads} * kEach);
}

TEST_CASE("StreamMutex try_lock fails while another thread holds it and succeeds after") {
  StreamMutex mu;
  std::unique_lock held(mu);
  bool other = true;
  std::thread([&] { other = mu.try_lock(); }).join();
  CHECK_FALSE(other);
  held.unlock();
  std::thread([&] {
    other = mu.try_lock();
    if (other) mu.unlock();
  }).join();
  CHECK(other);
}
