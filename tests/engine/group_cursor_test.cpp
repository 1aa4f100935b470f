// GroupCursor (src/engine/group_cursor.hpp): claims bounded by the published end and
// the window, acks as bits, naks and InProgress into the overflow map, redelivery
// between ack_wait and ack_wait + one tick after the claim, a racing ack against an
// expiry, max_deliver to dead letters, a straggler spilled so that the window moves,
// and members, a timer and redeliveries at once: every sequence done exactly once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
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
  CHECK_THROWS_WITH(GroupCursor({.start = 0}), "GroupCursor start must be 1..2^62, got 0");
  CHECK_THROWS_WITH(GroupCursor({.start = (std::uint64_t{1} << 62) + 1}),
                    "GroupCursor start must be 1..2^62, got 4611686018427387905");
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

// ---- From an adversarial review: each case failed before its fix. ----

namespace {

constexpr std::uint64_t kNoEnd = std::numeric_limits<std::uint64_t>::max();

// Two threads released at once, `rounds` times, on a fresh state from `setup`.
template <class Setup, class A, class B, class Check>
void Race(int rounds, Setup setup, A a, B b, Check check) {
  for (int i = 0; i < rounds; ++i) {
    auto st = setup();
    std::atomic<int> go{0};
    std::thread ta([&] {
      go.fetch_add(1);
      while (go.load() < 2) std::this_thread::yield();
      a(*st);
    });
    std::thread tb([&] {
      go.fetch_add(1);
      while (go.load() < 2) std::this_thread::yield();
      b(*st);
    });
    ta.join();
    tb.join();
    check(*st);
  }
}

}  // namespace

TEST_CASE("Spill takes only claimed sequences, also when the window is not full") {
  GroupCursor g({.window_word_bits = 0, .start = 1, .ack_wait_ns = 100 * kMs});  // W = 32
  REQUIRE(g.Claim(4, /*published_end=*/5).size() == 4);                          // 1..4
  CHECK(g.Spill(0) == 4);  // was 31: 5..31 were never claimed, nor published
  CHECK_FALSE(g.IsHeld(5));
  std::vector<Redelivery> out, dead;
  g.TakeDue(100 * kMs, out, dead);
  CHECK(Seqs(out) == std::vector<std::uint64_t>{1, 2, 3, 4});
}

TEST_CASE("SpillBelow moves every claimed, unsettled sequence below its stop to the map, held out") {
  GroupCursor g({.window_word_bits = 2, .start = 1});  // W = 128
  REQUIRE(g.Claim(70, /*published_end=*/100).size() == 70);  // 1..70
  for (std::uint64_t s : {1, 2, 3, 40, 41}) CHECK(g.Ack(s));
  CHECK(g.Nak(5, 0));  // waiting in the map already
  CHECK(g.window_low() == 4);
  CHECK(g.NextHeld(0) == 5);
  // A deletion's sweep claims the rest and spills what was claimed before it (below 71).
  CHECK(g.ClaimRest(100) == 71);
  CHECK(g.SpillBelow(71, 0) == 70 - 5 - 1);
  CHECK(g.window_low() == 71);  // 71..99 stay unsettled: the sweep ends them itself
  CHECK(g.held() == 65);
  CHECK(g.NextHeld(0) == 4);
  CHECK(g.NextHeld(40) == 42);
  CHECK(g.NextHeld(71) == std::numeric_limits<std::uint64_t>::max());
  CHECK(g.IsOut(4));
  CHECK_FALSE(g.IsOut(5));  // waiting, not out
  // The members let go of them (Drop) or ack them; the map empties.
  CHECK(g.AckDelivery(4, 1).settled);
  for (std::uint64_t s = 5; s <= 70; ++s) {
    if (s != 40 && s != 41) CHECK(g.Drop(s));
  }
  CHECK(g.held() == 0);
  CHECK(g.NextHeld(0) == std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("a dead letter handed out and not read yet holds NextHeld at its caller's `from`") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 0, .max_deliver = 1});
  REQUIRE(g.Claim(2, 100).size() == 2);
  CHECK(g.Nak(1, 0));
  CHECK(g.NextHeld(0) == 1);
  std::vector<Redelivery> out, dead;
  g.TakeDue(0, out, dead);
  REQUIRE(dead.size() == 1);
  CHECK(g.held() == 0);
  CHECK(g.dead_unread());
  CHECK(g.NextHeld(0) == 0);  // its entry may lie anywhere: nothing may go yet
  CHECK(g.NextHeld(7) == 7);
  g.DeadRead(1);
  CHECK_FALSE(g.dead_unread());
  CHECK(g.NextHeld(0) == std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("a Spill after acks emptied the window takes nothing, and claims stay within W") {
  GroupCursor g({.window_word_bits = 0, .start = 1});
  REQUIRE(g.Claim(100, 1000).size() == 31);  // full
  for (std::uint64_t s = 1; s < 32; ++s) REQUIRE(g.Ack(s));
  CHECK(g.Spill(0) == 0);  // was 32: the next word, none of it claimed
  CHECK(g.held() == 0);
  CHECK(g.next() >= g.floor());
  CHECK(g.Claim(1000, 1000).size() == 32);
}

TEST_CASE("Spill racing the acks of a full window never takes what was not claimed") {
  struct St {
    GroupCursor g{{.window_word_bits = 0, .start = 1, .ack_wait_ns = 50}};
    int acked = 0;
    std::size_t spilled = 0;
  };
  int bad = 0;
  Race(
      2'000,
      [] {
        auto st = std::make_unique<St>();
        REQUIRE(st->g.Claim(31, 100).size() == 31);
        return st;
      },
      [](St& st) {
        for (std::uint64_t s = 1; s < 32; ++s) st.acked += st.g.Ack(s);
      },
      [](St& st) { st.spilled = st.g.Spill(0); },
      [&](St& st) {
        // Each sequence was either acked, or spilled and then acked in the map.
        if (st.acked != 31 || st.g.held() != 0 || st.g.next() < st.g.floor() || st.spilled > 31) ++bad;
      });
  CHECK(bad == 0);
}

TEST_CASE("a spilled straggler keeps the ack deadline of its claim") {
  const std::int64_t ack_wait = 100 * kMs, tick = 10 * kMs;
  GroupCursor g({.window_word_bits = 0, .start = 1, .ack_wait_ns = ack_wait});
  REQUIRE(g.Claim(31, 1000).size() == 31);  // claimed at 0
  g.Tick(0);
  for (std::uint64_t s = 2; s < 32; ++s) REQUIRE(g.Ack(s));  // 1 is the straggler
  std::vector<Redelivery> out, dead;
  std::int64_t back = -1;
  for (std::int64_t now = tick; now <= 400 * kMs && back < 0; now += tick) {
    g.Tick(now);
    g.Expire(now);
    if (now == 90 * kMs) REQUIRE(g.Spill(now) == 1);
    out.clear();
    g.TakeDue(now, out, dead);
    if (!out.empty()) back = now;
  }
  CHECK(back == ack_wait);  // was 190 ms: the spill started its ack_wait again
}

TEST_CASE("ack_wait not a multiple of the tick: back within ack_wait + two ticks") {
  const std::int64_t ack_wait = 105 * kMs, tick = 10 * kMs;
  GroupCursor g({.window_word_bits = 2, .start = 1, .ack_wait_ns = ack_wait});
  g.Tick(0);
  const std::int64_t claimed_at = 1 * kMs;
  REQUIRE(g.Claim(5, 100).size() == 5);
  std::vector<Redelivery> out, dead;
  std::int64_t back = -1;
  for (std::int64_t now = tick; now <= 400 * kMs && back < 0; now += tick) {
    g.Tick(now);
    g.Expire(now);
    out.clear();
    g.TakeDue(now, out, dead);
    if (!out.empty()) back = now;
  }
  CHECK(back == 120 * kMs);  // sampled at 10 ms, expired at the first tick at or past 115 ms
  CHECK(back - claimed_at >= ack_wait);
  CHECK(back - claimed_at <= ack_wait + 2 * tick);
}

TEST_CASE("Tick reads the clock after the cursor: a claim it does not see is not dated earlier") {
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 100});
  std::int64_t clock = 0;
  // The clock is read inside Tick; a claim made by "another thread" while the clock
  // is read is after the cursor's load, so the sample does not cover it.
  g.Tick([&] {
    const GroupCursor::Range r = g.Claim(3, 100);  // 1..3, at time 50
    REQUIRE(r.size() == 3);
    clock = 50;
    return clock;
  });
  CHECK(g.Expire(150) == 0);  // the sample holds 1 (nothing below it): 1..3 are not covered
  g.Tick(160);
  CHECK(g.Expire(259) == 0);
  CHECK(g.Expire(260) == 3);
}

TEST_CASE("lowest_held never passes a sequence that is being moved to the map") {
  GroupCursor g({.window_word_bits = 0, .start = 1, .ack_wait_ns = 1});
  std::atomic<std::uint64_t> batch{1};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> violations{0};
  std::thread timer([&] {
    std::int64_t now = 0;
    for (int i = 0; i < 10'000; ++i) {
      const GroupCursor::Range r = g.Claim(32, kNoEnd);
      if (r.empty()) break;
      batch.store(r.first);
      g.Tick(++now);
      now += 2;
      g.Expire(now);  // r moves to the map
      for (std::uint64_t s = r.first; s < r.end; ++s) g.Ack(s);
    }
    stop.store(true);
  });
  std::thread reader([&] {
    while (!stop.load()) {
      const std::uint64_t c = batch.load();
      const std::uint64_t low = g.lowest_held();
      if (low > c && g.IsHeld(c)) violations.fetch_add(1);  // was 35-1,373 per run
    }
  });
  timer.join();
  reader.join();
  CHECK(violations.load() == 0);
}

TEST_CASE("claims and acks at the top of the sequence range") {
  const std::uint64_t top = std::uint64_t{1} << 62;
  GroupCursor g({.window_word_bits = 0, .start = top});
  GroupCursor::Range r = g.Claim(100, kNoEnd);
  REQUIRE(r.size() == 32);
  CHECK(r.first == top);
  for (std::uint64_t s = r.first; s < r.end; ++s) REQUIRE(g.Ack(s));
  CHECK(g.floor() == top + 32);
  CHECK(g.Claim(100, kNoEnd).size() == 32);
}

TEST_CASE("TakeDue's max counts what this call hands out, not what `out` held") {
  GroupCursor g({.window_word_bits = 1, .start = 1});
  REQUIRE(g.Claim(4, 100).size() == 4);
  for (std::uint64_t s = 1; s <= 4; ++s) REQUIRE(g.Nak(s, 0));
  std::vector<Redelivery> out{{99, 2}, {98, 2}}, dead;
  g.TakeDue(0, out, dead, /*max=*/2);
  CHECK(out.size() == 4);  // was 2: nothing taken
  CHECK(out[2].seq == 1);
  CHECK(out[3].seq == 2);
}

TEST_CASE("an Ack racing Expire, Nak or InProgress on the same sequences: settled exactly once") {
  struct St {
    GroupCursor g{{.window_word_bits = 0, .start = 1, .ack_wait_ns = 1}};
    int acked = 0;
  };
  for (int kind = 0; kind < 3; ++kind) {
    Race(
        1'000,
        [] {
          auto st = std::make_unique<St>();
          REQUIRE(st->g.Claim(31, 100).size() == 31);
          st->g.Tick(0);
          return st;
        },
        [](St& st) {
          for (std::uint64_t s = 1; s < 32; ++s) st.acked += st.g.Ack(s);
        },
        [kind](St& st) {
          if (kind == 0) st.g.Expire(10);
          for (std::uint64_t s = 31; kind > 0 && s >= 1; --s) {
            if (kind == 1) st.g.Nak(s, 0);
            if (kind == 2) st.g.InProgress(s, 0);
          }
        },
        [](St& st) {
          REQUIRE(st.acked == 31);
          REQUIRE(st.g.held() == 0);
          REQUIRE(st.g.floor() == 32);
          REQUIRE(st.g.lowest_held() == 32);
        });
  }
}

TEST_CASE("max_in_flight holds while the timer moves words to the map") {
  constexpr std::uint64_t kMax = 31;
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 1, .max_in_flight = kMax});
  // A lower bound of what is out: claims counted after Claim returns, acks before Ack.
  std::atomic<std::int64_t> out{0}, most{0}, failed_acks{0};
  std::atomic<bool> stop{false};
  auto claimed = [&](const GroupCursor::Range& r) {
    const std::int64_t n = static_cast<std::int64_t>(r.size());
    const std::int64_t now_out = out.fetch_add(n) + n;
    std::int64_t seen = most.load();
    while (now_out > seen && !most.compare_exchange_weak(seen, now_out)) {
    }
  };
  auto ack_all = [&](const GroupCursor::Range& r) {
    for (std::uint64_t s = r.first; s < r.end; ++s) {
      out.fetch_sub(1);
      if (!g.Ack(s)) failed_acks.fetch_add(1);
    }
  };
  std::thread timer([&] {
    std::int64_t now = 0;
    for (int i = 0; i < 10'000; ++i) {
      const GroupCursor::Range r = g.Claim(32, kNoEnd);
      if (r.empty()) {
        std::this_thread::yield();
        continue;
      }
      claimed(r);
      g.Tick(++now);
      now += 2;
      g.Expire(now);
      ack_all(r);
    }
    stop.store(true);
  });
  std::thread member([&] {
    while (!stop.load()) {
      const GroupCursor::Range r = g.Claim(32, kNoEnd);
      if (r.empty()) continue;
      claimed(r);
      ack_all(r);
    }
  });
  timer.join();
  member.join();
  CHECK(failed_acks.load() == 0);
  CHECK(most.load() <= static_cast<std::int64_t>(kMax));  // was 61-62
}

TEST_CASE("laps of a small window with acks in random order: lowest_held exact throughout") {
  for (unsigned bits : {0u, 1u}) {
    GroupCursor g({.window_word_bits = bits, .start = 1});
    const std::uint64_t w = 32ull << bits;
    std::mt19937_64 rng(bits + 7);
    std::vector<std::uint64_t> open;
    std::uint64_t acked = 0;
    const std::uint64_t total = 200'000;
    while (acked < total) {
      const GroupCursor::Range r = g.Claim(1 + rng() % 40, total + 1);
      REQUIRE(r.end <= g.floor() + w);
      for (std::uint64_t s = r.first; s < r.end; ++s) open.push_back(s);
      std::shuffle(open.begin(), open.end(), rng);
      const std::size_t n = open.empty() ? 0 : 1 + rng() % open.size();
      for (std::size_t i = 0; i < n; ++i) {
        REQUIRE(g.Ack(open.back()));
        open.pop_back();
        ++acked;
      }
      const std::uint64_t low = open.empty() ? g.next() : *std::min_element(open.begin(), open.end());
      REQUIRE(g.lowest_held() == low);
    }
    CHECK(g.lowest_held() == total + 1);
  }
}

TEST_CASE("a start inside a word: what lies below it is settled and never expired") {
  GroupCursor g({.window_word_bits = 0, .start = 45, .ack_wait_ns = 100});
  CHECK(g.floor() == 32);
  CHECK(g.lowest_held() == 45);
  GroupCursor::Range r = g.Claim(100, 1000);
  CHECK(r.first == 45);
  CHECK(r.end == 64);
  CHECK_FALSE(g.Ack(44));
  g.Tick(0);
  CHECK(g.Expire(100) == 19);  // 45..63
  CHECK_FALSE(g.IsHeld(44));
  CHECK(g.IsHeld(45));
  for (std::uint64_t s = 45; s < 64; ++s) CHECK(g.Ack(s));
  CHECK(g.floor() == 64);
  CHECK(g.lowest_held() == 64);
}

TEST_CASE("irregular ticks: a message moves no earlier than ack_wait after its claim, and moves") {
  for (std::uint32_t seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    const std::int64_t ack_wait = 1 + rng() % 50;
    const unsigned bits = static_cast<unsigned>(rng() % 3);
    const std::uint64_t w = 32ull << bits;
    GroupCursor g({.window_word_bits = bits, .start = 1 + rng() % 70, .ack_wait_ns = ack_wait});
    std::map<std::uint64_t, std::int64_t> claimed_at;  // unacked, not yet moved
    std::int64_t now = 0, last_tick = 0, max_gap = 0;
    for (int step = 0; step < 3000; ++step) {
      now += rng() % 3;
      const GroupCursor::Range r = g.Claim(1 + rng() % 20, kNoEnd);
      for (std::uint64_t s = r.first; s < r.end; ++s) {
        if (rng() % 4 == 0) {
          REQUIRE(g.Ack(s));
        } else {
          claimed_at[s] = now;
        }
      }
      if (rng() % 3 == 0) {
        now += 1;
        g.Tick(now);
        g.Expire(now);
        max_gap = std::max(max_gap, now - last_tick);
        last_tick = now;
        for (auto it = claimed_at.begin(); it != claimed_at.end();) {
          if (g.IsHeld(it->first)) {
            REQUIRE(now - it->second >= ack_wait);
            REQUIRE(g.Ack(it->first));
            it = claimed_at.erase(it);
          } else {
            REQUIRE(now - it->second < ack_wait + max_gap);
            ++it;
          }
        }
      }
      if (g.next() >= g.floor() + w && !claimed_at.empty()) {
        REQUIRE(g.Ack(claimed_at.begin()->first));
        claimed_at.erase(claimed_at.begin());
      }
    }
    for (int i = 0; i < 3; ++i) {
      now += ack_wait + 10;
      g.Tick(now);
      g.Expire(now);
    }
    for (const auto& [s, at] : claimed_at) REQUIRE(g.IsHeld(s));
  }
}

TEST_CASE("attempt-aware settles: only the newest delivery, while out, decides") {
  using Found = GroupCursor::Found;
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = 100 * kMs, .max_deliver = 3});
  REQUIRE(g.Claim(4, 100).size() == 4);
  g.Tick(0);
  CHECK(g.Finish(1, 1) == Found::kCurrent);  // a term of the claim's delivery
  CHECK(g.Finish(1, 1) == Found::kDone);
  CHECK(g.Ack(1) == false);
  CHECK(g.Nak(2, 1, 50 * kMs) == Found::kCurrent);  // waits for redelivery
  CHECK(g.Nak(2, 1, 60 * kMs) == Found::kStale);    // waiting: no second nak
  CHECK(g.InProgress(2, 1, 10 * kMs) == Found::kStale);
  CHECK(g.Current(2, 1) == Found::kStale);
  std::vector<Redelivery> out, dead;
  g.TakeDue(50 * kMs, out, dead);
  REQUIRE(out.size() == 1);
  CHECK(out[0].attempt == 2);
  CHECK(g.Current(2, 2) == Found::kCurrent);
  CHECK(g.Finish(2, 1) == Found::kStale);  // the old delivery's term changes nothing
  CHECK(g.InProgress(2, 2, 60 * kMs) == Found::kCurrent);  // deadline 160 ms
  // The expiry of 3 and 4 (claimed at 0) at 100 ms; 2 is due at 160 ms.
  CHECK(g.Expire(100 * kMs) == 2);
  std::vector<Redelivery> timed_out;
  g.TimeOut(100 * kMs, timed_out, dead);
  CHECK(Seqs(timed_out) == std::vector<std::uint64_t>{3, 4});
  CHECK(timed_out[0].attempt == 1);
  CHECK(g.InProgress(3, 1, 100 * kMs) == Found::kStale);  // its ack wait expired
  CHECK(g.Ack(4));  // a late ack of the expired delivery still settles the message
  CHECK(g.Current(4, 1) == Found::kDone);
  timed_out.clear();
  g.TimeOut(159 * kMs, timed_out, dead);
  CHECK(timed_out.empty());
  g.TimeOut(160 * kMs, timed_out, dead);
  REQUIRE(timed_out.size() == 1);
  CHECK(timed_out[0].seq == 2);
  CHECK(timed_out[0].attempt == 2);
  CHECK(g.next_due() == 100 * kMs);  // 3 waits since its expiry
  out.clear();
  g.TakeDue(200 * kMs, out, dead);
  REQUIRE(out.size() == 2);  // 3 (attempt 2, due since 100 ms), then 2 (attempt 3, due since 160 ms)
  CHECK(out[0].seq == 3);
  CHECK(out[0].attempt == 2);
  CHECK(out[1].seq == 2);
  CHECK(out[1].attempt == 3);
  // Delivery 3 of 2 is max_deliver: its time-out gives it up.
  timed_out.clear();
  g.TimeOut(300 * kMs, timed_out, dead);
  CHECK(Seqs(timed_out) == std::vector<std::uint64_t>{3});
  REQUIRE(dead.size() == 1);
  CHECK(dead[0].seq == 2);
  CHECK(dead[0].attempt == 3);
  CHECK(g.Current(2, 3) == Found::kDone);
  CHECK(g.Drop(3));  // the stream removed it: gone from the map
  CHECK(g.held() == 0);
  CHECK(g.next_due() == GroupCursor::kNever);
  CHECK(g.lowest_held() == 5);
}

TEST_CASE("a member's claim register dates its claim exactly, not at the next tick") {
  const std::int64_t ack_wait = 1000 * kMs;
  GroupCursor g({.window_word_bits = 1, .start = 1, .ack_wait_ns = ack_wait, .members = 2});
  g.Tick(0);
  REQUIRE(g.Claim(3, 100).size() == 3);  // 1..3 at 100 ms, by member 1
  g.NoteClaim(1, 4, 100 * kMs);
  REQUIRE(g.Claim(2, 100).size() == 2);  // 4..5 at 700 ms, by member 0
  g.NoteClaim(0, 6, 700 * kMs);
  g.Tick(1400 * kMs);                    // the timer comes late
  CHECK(g.Expire(1099 * kMs) == 0);
  CHECK(g.Expire(1100 * kMs) == 3);      // 1..3: exactly ack_wait after their claim
  CHECK(g.Expire(1699 * kMs) == 0);
  CHECK(g.Expire(1700 * kMs) == 2);
  // A register older than what a later sample covers adds nothing.
  GroupCursor h({.window_word_bits = 1, .start = 1, .ack_wait_ns = ack_wait, .members = 1});
  REQUIRE(h.Claim(2, 100).size() == 2);
  h.Tick(50 * kMs);                      // sample {3, 50 ms}
  h.NoteClaim(0, 3, 60 * kMs);           // read late: dated after the sample
  h.Tick(80 * kMs);
  CHECK(h.Expire(1049 * kMs) == 0);
  CHECK(h.Expire(1050 * kMs) == 2);
}
