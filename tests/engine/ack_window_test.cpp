// AckWindow (src/engine/ack_window.hpp): bits, the floor over whole words, the
// window's edge, a start inside a word, a settle delayed past its word's reuse, and
// settlers racing for the same sequences while the floor moves.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/ack_window.hpp"

using inferq::engine_internal::AckWindow;

TEST_CASE("the first settle of a sequence wins; the floor moves over whole words only") {
  AckWindow w(1, 0);  // 2 words: 64 sequences
  CHECK(w.capacity() == 64);
  CHECK(w.floor() == 0);
  CHECK(w.TrySet(5));
  CHECK_FALSE(w.TrySet(5));
  CHECK(w.IsSet(5));
  CHECK_FALSE(w.IsSet(4));
  CHECK(w.floor() == 0);
  for (std::uint64_t s = 0; s < 32; ++s) {
    if (s != 5 && s != 0) CHECK(w.TrySet(s));
  }
  CHECK(w.floor() == 0);  // 0 is still open
  CHECK(w.first_unsettled() == 0);
  CHECK(w.TrySet(0));
  CHECK(w.floor() == 32);
  CHECK(w.IsSet(17));     // below the floor
  CHECK_FALSE(w.TrySet(17));
  CHECK(w.first_unsettled() == 32);
}

TEST_CASE("a sequence at or past floor + W does not fit and sets nothing") {
  AckWindow w(1, 0);
  CHECK(w.Fits(63));
  CHECK_FALSE(w.Fits(64));
  CHECK_FALSE(w.TrySet(64));
  CHECK_FALSE(w.IsSet(64));
  for (std::uint64_t s = 0; s < 32; ++s) REQUIRE(w.TrySet(s));
  CHECK(w.floor() == 32);
  CHECK(w.Fits(95));
  CHECK(w.TrySet(95));  // the word of 0..31, reused for 64..95
  CHECK(w.IsSet(95));
  CHECK_FALSE(w.IsSet(64));
}

TEST_CASE("a word filled ahead of the floor is passed when the floor reaches it") {
  AckWindow w(2, 0);  // 128
  for (std::uint64_t s = 32; s < 96; ++s) REQUIRE(w.TrySet(s));  // words 1 and 2 full
  CHECK(w.floor() == 0);
  for (std::uint64_t s = 1; s < 32; ++s) REQUIRE(w.TrySet(s));
  CHECK(w.floor() == 0);
  REQUIRE(w.TrySet(0));
  CHECK(w.floor() == 96);  // three words at once
  CHECK(w.first_unsettled() == 96);
}

TEST_CASE("sequences below the start are settled from the outset") {
  AckWindow w(1, 40);
  CHECK(w.floor() == 32);
  CHECK(w.first_unsettled() == 40);
  CHECK(w.IsSet(39));
  CHECK_FALSE(w.TrySet(39));
  CHECK_FALSE(w.IsSet(40));
  CHECK(w.Fits(95));
  CHECK_FALSE(w.Fits(96));
  for (std::uint64_t s = 40; s < 64; ++s) REQUIRE(w.TrySet(s));
  CHECK(w.floor() == 64);
}

TEST_CASE("TrySetWord sets up to 32 with one call and reports which it set") {
  AckWindow w(1, 0);
  CHECK(w.TrySetWord(32, 0b1011) == 0b1011);
  CHECK(w.TrySetWord(32, 0b1111) == 0b0100);
  CHECK(w.TrySetWord(32, 0b1111) == 0);
  CHECK(w.TrySetWord(0, 0xffff'ffffULL) == 0xffff'ffffU);
  CHECK(w.floor() == 32);
  CHECK(w.TrySetWord(0, 1) == 0);   // below the floor
  CHECK(w.TrySetWord(96, 1) == 0);  // past the window
  CHECK_THROWS_WITH(w.TrySetWord(33, 1), "AckWindow word base 33 is not a multiple of 32");
  CHECK_THROWS_WITH(AckWindow(21, 0), "AckWindow word_bits must be 0..20, got 21");
}

TEST_CASE("a settle that comes after its word was reused for the next lap changes nothing") {
  AckWindow w(0, 0);  // one word: 32 sequences a lap
  for (std::uint64_t s = 0; s < 32; ++s) REQUIRE(w.TrySet(s));
  CHECK(w.floor() == 32);
  // A caller that read the floor as 0 and the sequence 7 fits would now reach the
  // word of 32..63: its tag is the next lap's, so it sets nothing.
  CHECK(w.TrySetWord(0, 1u << 7) == 0);
  CHECK_FALSE(w.IsSet(39));
  CHECK(w.TrySet(39));
}

TEST_CASE("settlers racing over the same sequences: each settled exactly once, the floor reaches the end") {
  constexpr std::uint64_t kTotal = 200'000;
  constexpr int kThreads = 4;
  for (unsigned word_bits : {0u, 3u}) {
    AckWindow w(word_bits, 1);
    std::atomic<std::uint64_t> won{0}, next{1};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 1);
        std::uint64_t local = 0;
        std::vector<std::uint64_t> mine;
        // A floor that never moves would keep Fits false: after 60 s the thread stops
        // and the totals below fail.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        for (;;) {
          if (std::chrono::steady_clock::now() > give_up) break;
          // Take a run of up to 8 sequences that fit, then settle them in a shuffled
          // order, each twice (an ack and a redelivery timer racing), and some of
          // another thread's range too.
          std::uint64_t s = next.load();
          if (s > kTotal) break;
          const std::uint64_t n = 1 + rng() % 8;
          const std::uint64_t end = std::min(s + n, kTotal + 1);
          if (!w.Fits(end - 1)) {
            std::this_thread::yield();
            continue;
          }
          if (!next.compare_exchange_weak(s, end)) continue;
          mine.clear();
          for (std::uint64_t q = s; q < end; ++q) mine.push_back(q);
          std::shuffle(mine.begin(), mine.end(), rng);
          for (std::uint64_t q : mine) local += w.TrySet(q) ? 1 : 0;
          for (std::uint64_t q : mine) local += w.TrySet(q) ? 1 : 0;
          const std::uint64_t other = s > 40 ? s - 1 - rng() % 40 : 0;
          if (other >= 1) local += w.TrySet(other) ? 1 : 0;
        }
        won.fetch_add(local);
      });
    }
    for (auto& t : threads) t.join();
    CHECK(won.load() == kTotal);
    CHECK(w.first_unsettled() == kTotal + 1);
    CHECK(w.floor() == (kTotal + 1) / 32 * 32);
  }
}
