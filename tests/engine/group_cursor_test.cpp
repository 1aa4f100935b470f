// GroupCursor (src/engine/group_cursor.hpp): claims bounded by the published end and
// the window, acks as bits, naks and InProgress into the overflow map, redelivery
// between ack_wait and ack_wait + one tick after the claim, a racing ack against an
// expiry, max_deliver to dead letters, a straggler spilled so that the window moves,
// and members, a timer and redeliveries at once: every sequence done exactly once.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/group_cursor.hpp"

using inferq::engine_internal::GroupCursor;
using Redelivery = GroupCursor::Redelivery;

namespace {

constexpr std::int64_t kMs = 1'000'000;

std::vector<std::uint64_t> Seqs(const std::vector<Redelivery>& v) {
  std::vector<std::uint64_t> out;
  for (const Redelivery& r : v) out.push_back(r.seq);
  return out;
}

}  // namespace

TEST_CASE("claims stop at the published end and at the window's edge") {
  GroupCursor g({.window_word_bits = 0, .start = 1});  // W = 32
  GroupCursor::Range r = g.Claim(10, 5);
  CHECK(r.first == 1);
  CHECK(r.end == 5);
  r = g.Claim(10, 5);
  CHECK(r.empty());
  CHECK(r.first == 5);
  r = g.Claim(100, 1000);
  CHECK(r.first == 5);
  CHECK(r.end == 32);  // floor 0 + W: the window is full
  CHECK(g.Claim(1, 1000).empty());
  for (std::uint64_t s = 1; s < 32; ++s) CHECK(g.Ack(s));
  CHECK(g.floor() == 32);
  r = g.Claim(100, 1000);
  CHECK(r.first == 32);
  CHECK(r.end == 64);
  CHECK(g.next() == 64);
}

TEST_CASE("an ack settles once; an ack of a message done already is false") {
  GroupCursor g({.window_word_bits = 1, .start = 1});
  const GroupCursor::Range r = g.Claim(3, 100);
  REQUIRE(r.size() == 3);
  CHECK(g.Ack(2));
  CHECK_FALSE(g.Ack(2));
  CHECK(g.Ack(1));
  CHECK(g.Ack(3));
  CHECK(g.lowest_held() == 4);
  CHECK(g.held() == 0);
}

TEST_CASE("AckWord settles a word's sequences with one call and counts what it settled") {
  GroupCursor g({.window_word_bits = 1, .start = 1});
  REQUIRE(g.Claim(40, 100).size() == 40);
  CHECK(g.Ack(3));
  CHECK(g.Nak(4, 0));  // held in the map: AckWord settles it there
  // Bits 1..31 of the word at 0: sequences 1..31; 3 is done already.
  CHECK(g.AckWord(0, 0xffff'fffeU) == 30);
  CHECK(g.floor() == 32);
  CHECK(g.held() == 0);
}

TEST_CASE("a nak holds the message until its delay passes; then it comes back as attempt 2") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 0});
  REQUIRE(g.Claim(4, 100).size() == 4);
  CHECK(g.Nak(2, 50 * kMs));
  CHECK(g.IsHeld(2));
  CHECK(g.held() == 1);
  std::vector<Redelivery> out, dead;
  g.TakeDue(49 * kMs, out, dead);
  CHECK(out.empty());
  g.TakeDue(50 * kMs, out, dead);
  REQUIRE(out.size() == 1);
  CHECK(out[0].seq == 2);
  CHECK(out[0].attempt == 2);
  CHECK(dead.empty());
  // Out again, with no ack_wait: it stays out until acked.
  out.clear();
  g.TakeDue(1000 * kMs, out, dead);
  CHECK(out.empty());
  CHECK(g.lowest_held() == 1);  // 1 is unsettled in the window
  CHECK(g.Ack(1));
  CHECK(g.lowest_held() == 2);  // 2 is in the map
  CHECK(g.Ack(2));              // the redelivery's ack settles it in the map
  CHECK_FALSE(g.Ack(2));
  CHECK(g.held() == 0);
  CHECK(g.lowest_held() == 3);
  CHECK_FALSE(g.Nak(1, 0));     // done: nothing to nak
}

TEST_CASE("redelivery comes no earlier than ack_wait after the claim, and by ack_wait + one tick") {
  const std::int64_t ack_wait = 100 * kMs;
  const std::int64_t tick = 10 * kMs;
  GroupCursor g({.window_word_bits = 2, .start = 1, .ack_wait_ns = ack_wait});
  std::int64_t now = 0;
  g.Tick(now);  // nothing claimed yet
  REQUIRE(g.Claim(5, 100).size() == 5);  // claimed at 0 (between the ticks at 0 and 10)
  now += tick;
  g.Tick(now);  // samples 6 at 10 ms
  now += 5 * kMs;
  REQUIRE(g.Claim(5, 100).size() == 5);  // 6..10 at 15 ms
  CHECK(g.Ack(3));
  std::vector<Redelivery> out, dead;
  // Every tick: Tick, Expire, TakeDue. Nothing before ack_wait after a claim.
  std::int64_t first_back = -1, second_back = -1;
  for (now = 2 * tick; now <= 300 * kMs; now += tick) {
    g.Tick(now);
    g.Expire(now);
    out.clear();
    g.TakeDue(now, out, dead);
    for (const Redelivery& r : out) {
      if (r.seq == 1 && first_back < 0) first_back = now;
      if (r.seq == 6 && second_back < 0) second_back = now;
      CHECK(r.attempt == 2);
    }
    if (first_back >= 0 && second_back >= 0) break;
  }
  // 1..5 claimed at 0, sampled at 10 ms: back at 110 ms (ack_wait + one tick).
  CHECK(first_back == 110 * kMs);
  // 6..10 claimed at 15 ms, sampled at 20 ms: back at 120 ms.
  CHECK(second_back == 120 * kMs);
  CHECK(first_back >= 0 + ack_wait);
  CHECK(first_back <= 0 + ack_wait + tick);
  CHECK(second_back >= 15 * kMs + ack_wait);
  CHECK(second_back <= 15 * kMs + ack_wait + tick);
  CHECK(dead.empty());
}

TEST_CASE("an ack before the expiry wins; one after it still settles the held message") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 100 * kMs});
  REQUIRE(g.Claim(3, 100).size() == 3);
  g.Tick(0);
  CHECK(g.Ack(1));                 // before the expiry: never redelivered
  CHECK(g.Expire(100 * kMs) == 2); // 2 and 3 move to the map, due now
  CHECK(g.Ack(2));                 // late, but before its redelivery: settled
  std::vector<Redelivery> out, dead;
  g.TakeDue(100 * kMs, out, dead);
  CHECK(Seqs(out) == std::vector<std::uint64_t>{3});
  CHECK(g.Ack(3));                 // the old delivery's ack settles the redelivered copy too
  CHECK_FALSE(g.Ack(3));           // and the copy's own ack finds it done
  CHECK(g.held() == 0);
  CHECK(g.lowest_held() == 4);
}

TEST_CASE("InProgress moves the ack deadline; a message waiting for redelivery is not in progress") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 100 * kMs});
  REQUIRE(g.Claim(2, 100).size() == 2);
  g.Tick(0);
  CHECK(g.InProgress(1, 90 * kMs));  // due at 190 ms now
  CHECK(g.Expire(100 * kMs) == 1);   // only 2: 1 left the window
  std::vector<Redelivery> out, dead;
  g.TakeDue(100 * kMs, out, dead);
  CHECK(Seqs(out) == std::vector<std::uint64_t>{2});
  CHECK(g.Ack(2));
  out.clear();
  g.TakeDue(189 * kMs, out, dead);
  CHECK(out.empty());
  CHECK(g.InProgress(1, 150 * kMs));  // out: due at 250 ms
  g.TakeDue(249 * kMs, out, dead);
  CHECK(out.empty());
  g.TakeDue(250 * kMs, out, dead);
  CHECK(Seqs(out) == std::vector<std::uint64_t>{1});
  CHECK(g.Nak(1, 400 * kMs));          // waiting now
  CHECK_FALSE(g.InProgress(1, 260 * kMs));
  CHECK(g.Ack(1));
  CHECK_FALSE(g.InProgress(2, 300 * kMs));  // done
}

TEST_CASE("past max_deliver a held message is handed out as a dead letter and removed") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 0, .max_deliver = 2});
  REQUIRE(g.Claim(1, 100).size() == 1);
  std::vector<Redelivery> out, dead;
  CHECK(g.Nak(1, 0));
  g.TakeDue(0, out, dead);
  REQUIRE(out.size() == 1);
  CHECK(out[0].attempt == 2);
  CHECK(g.Nak(1, 0));
  out.clear();
  g.TakeDue(0, out, dead);
  CHECK(out.empty());
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].seq == 1);
  CHECK(dead[0].attempt == 2);  // deliveries it had
  CHECK(g.held() == 0);
  CHECK_FALSE(g.Ack(1));
}

TEST_CASE("a straggler held 10x the window spills to the map; the window moves and nothing is lost") {
  GroupCursor g({.window_word_bits = 0, .start = 1});  // W = 32
  std::uint64_t acked = 0;
  const std::uint64_t total = 320;
  std::uint64_t spilled = 0;
  // 1 is held throughout; everything else is acked as soon as it is claimed.
  while (g.next() <= total) {
    const GroupCursor::Range r = g.Claim(8, total + 1);
    if (r.empty()) {
      spilled += g.Spill(0);
      continue;
    }
    for (std::uint64_t s = r.first; s < r.end; ++s) {
      if (s != 1 && g.Ack(s)) ++acked;
    }
  }
  CHECK(acked == total - 1);
  CHECK(spilled == 1);          // only the straggler was unsettled in the floor's word
  CHECK(g.held() == 1);
  CHECK(g.IsHeld(1));
  CHECK(g.lowest_held() == 1);  // retention keeps it
  CHECK(g.floor() >= total - 31);
  CHECK(g.Ack(1));
  CHECK(g.held() == 0);
  CHECK(g.lowest_held() == total + 1);
}

TEST_CASE("bad options are refused naming the value") {
  CHECK_THROWS_WITH(GroupCursor({.window_word_bits = 21}), "GroupCursor window_word_bits must be 0..20, got 21");
  CHECK_THROWS_WITH(GroupCursor({.start = 0}), "GroupCursor start must be at least 1, got 0");
  CHECK_THROWS_WITH(GroupCursor({.ack_wait_ns = -1}), "GroupCursor ack_wait_ns must not be negative, got -1");
}

TEST_CASE("stress: members, a timer and redeliveries at once settle every sequence exactly once") {
  constexpr std::uint64_t kTotal = 200'000;
  constexpr int kMembers = 4;
  // A logical clock every thread reads: the timer moves it on, so expiries happen.
  std::atomic<std::int64_t> clock{0};
  GroupCursor g({.window_word_bits = 4, .start = 1, .ack_wait_ns = 20, .max_deliver = 0});
  std::vector<std::atomic<std::uint32_t>> settled(kTotal + 1);
  std::mutex redo_mu;
  std::vector<Redelivery> redo;  // handed out by the timer, taken by members
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> settles{0};
  std::vector<Redelivery> dead;  // the timer's

  auto settle = [&](std::uint64_t seq, std::mt19937& rng) {
    const std::uint32_t roll = rng() % 100;
    if (roll < 3) {
      g.Nak(seq, clock.load() + 5);
    } else if (roll < 5) {
      g.InProgress(seq, clock.load());
      if (g.Ack(seq)) {
        settled[seq].fetch_add(1);
        settles.fetch_add(1);
      }
    } else if (roll < 8) {
      // dropped: the timer brings it back
    } else if (g.Ack(seq)) {
      settled[seq].fetch_add(1);
      settles.fetch_add(1);
    }
  };
  std::vector<std::thread> members;
  for (int m = 0; m < kMembers; ++m) {
    members.emplace_back([&, m] {
      std::mt19937 rng(static_cast<std::uint32_t>(m + 1));
      std::vector<Redelivery> mine;
      while (!stop.load()) {
        {
          std::lock_guard lock(redo_mu);
          mine.swap(redo);
        }
        for (const Redelivery& r : mine) settle(r.seq, rng);
        mine.clear();
        const GroupCursor::Range r = g.Claim(1 + rng() % 16, kTotal + 1);
        if (r.empty()) {
          if (settles.load() >= kTotal) break;
          std::this_thread::yield();
          continue;
        }
        for (std::uint64_t s = r.first; s < r.end; ++s) settle(s, rng);
      }
    });
  }
  std::thread timer([&] {
    std::vector<Redelivery> out;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (settles.load() < kTotal && std::chrono::steady_clock::now() < give_up) {
      const std::int64_t now = clock.fetch_add(1) + 1;
      g.Tick(now);
      g.Expire(now);
      out.clear();
      g.TakeDue(now, out, dead);
      if (!out.empty()) {
        std::lock_guard lock(redo_mu);
        redo.insert(redo.end(), out.begin(), out.end());
      }
      // The window fills behind naks and drops until Expire moves them out; a full
      // window with nothing due is spilled.
      if (g.next() < kTotal + 1 && g.next() >= g.floor() + 16 * 32) g.Spill(now);
      std::this_thread::yield();
    }
    stop.store(true);
  });
  timer.join();
  for (std::thread& t : members) t.join();
  CHECK(dead.empty());
  REQUIRE(settles.load() == kTotal);
  std::uint64_t once = 0, twice = 0;
  for (std::uint64_t s = 1; s <= kTotal; ++s) {
    const std::uint32_t n = settled[s].load();
    if (n == 1) ++once;
    if (n > 1) ++twice;
  }
  CHECK(once == kTotal);
  CHECK(twice == 0);
  CHECK(g.held() == 0);
  CHECK(g.lowest_held() == kTotal + 1);
}

TEST_CASE("max_in_flight bounds what is claimed and unsettled, the overflow map included") {
  GroupCursor g({.window_word_bits = 2, .start = 1, .max_in_flight = 3});
  GroupCursor::Range r = g.Claim(10, 100);
  CHECK(r.first == 1);
  CHECK(r.end == 4);              // 3 out
  CHECK(g.Claim(10, 100).empty());
  CHECK(g.Ack(2));                // out of order: 1 is still out, so no room yet
  CHECK(g.Claim(10, 100).empty());
  CHECK(g.Ack(1));                // 1 and 2 settled: 3 is out alone
  r = g.Claim(10, 100);
  CHECK(r.first == 4);
  CHECK(r.end == 6);              // 3, 4, 5 out
  CHECK(g.Nak(3, 1000));          // moved to the map: still counted
  CHECK(g.Claim(10, 100).empty());
  std::vector<Redelivery> out, dead;
  g.TakeDue(1000, out, dead);     // redelivered: still counted
  CHECK(Seqs(out) == std::vector<std::uint64_t>{3});
  CHECK(g.Claim(10, 100).empty());
  CHECK(g.Ack(3));                // settled in the map
  r = g.Claim(10, 100);
  CHECK(r.first == 6);
  CHECK(r.end == 7);              // 4, 5, 6 out
}

TEST_CASE("stress: claims never put more than max_in_flight out") {
  constexpr std::uint64_t kTotal = 100'000;
  constexpr std::uint64_t kMax = 50;
  GroupCursor g({.window_word_bits = 3, .start = 1, .max_in_flight = kMax});
  std::atomic<std::int64_t> out{0};
  std::atomic<std::int64_t> most{0};
  std::atomic<std::uint64_t> done{0};
  std::vector<std::thread> members;
  for (int m = 0; m < 4; ++m) {
    members.emplace_back([&, m] {
      std::mt19937 rng(static_cast<std::uint32_t>(m + 7));
      std::vector<std::uint64_t> mine;
      while (done.load() < kTotal) {
        const GroupCursor::Range r = g.Claim(1 + rng() % 8, kTotal + 1);
        if (!r.empty()) {
          const std::int64_t now_out = out.fetch_add(static_cast<std::int64_t>(r.size())) +
                                       static_cast<std::int64_t>(r.size());
          std::int64_t m_seen = most.load();
          while (now_out > m_seen && !most.compare_exchange_weak(m_seen, now_out)) {
          }
          for (std::uint64_t s = r.first; s < r.end; ++s) mine.push_back(s);
        }
        // Ack a random one of what this member holds (out of order on purpose).
        if (!mine.empty() && (r.empty() || rng() % 2 == 0)) {
          const std::size_t i = rng() % mine.size();
          const std::uint64_t s = mine[i];
          mine[i] = mine.back();
          mine.pop_back();
          out.fetch_sub(1);  // before the ack makes room
          if (g.Ack(s)) done.fetch_add(1);
        }
        if (r.empty() && mine.empty()) std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : members) t.join();
  CHECK(done.load() == kTotal);
  CHECK(most.load() <= static_cast<std::int64_t>(kMax));
}
