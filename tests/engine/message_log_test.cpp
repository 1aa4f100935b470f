// MessageLog (src/engine/message_log.hpp): claims, publication, reads across
// segments, trimming and removal with pinned readers, segment recycling, the live
// span limit, a stale tombstone reused a directory ring later, a throwing
// constructor, and publishers, readers and a trimmer at once.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/message_log.hpp"

namespace {

using inferq::engine_internal::LogRead;
using inferq::engine_internal::MessageLog;

// Counts constructions and destructions, so that a test can show each message
// destroyed exactly once.
struct Counted {
  static inline std::atomic<std::int64_t> live{0};
  explicit Counted(std::uint64_t v, bool fail = false) : value(v), check(~v) {
    if (fail) throw std::runtime_error("constructor of " + std::to_string(v) + " fails");
    live.fetch_add(1, std::memory_order_relaxed);
  }
  Counted(const Counted&) = delete;
  ~Counted() {
    check = 0;
    live.fetch_sub(1, std::memory_order_relaxed);
  }
  std::uint64_t value;
  std::uint64_t check;  // ~value while alive: a read of a recycled slot shows
};

}  // namespace

TEST_CASE("a published message reads back at its sequence; unpublished ones are not yet") {
  Counted::live = 0;
  {
    MessageLog<Counted> log(2, 1);  // 4 slots a segment
    CHECK(log.next() == 1);
    CHECK(log.first() == 1);
    const std::uint64_t s = log.Claim(3);
    CHECK(s == 1);
    CHECK(log.next() == 4);
    MessageLog<Counted>::Ref r;
    CHECK(log.Read(1, r) == LogRead::kNotYet);  // claimed, not published
    CHECK(log.Read(9, r) == LogRead::kNotYet);  // not claimed
    CHECK(log.Publish(1, 100u));
    CHECK(log.Publish(3, 300u));
    REQUIRE(log.Read(1, r) == LogRead::kReady);
    CHECK(r->value == 100);
    CHECK(r.seq() == 1);
    CHECK(log.Read(2, r) == LogRead::kNotYet);
    CHECK_FALSE(r);
    REQUIRE(log.Read(3, r) == LogRead::kReady);
    CHECK(r->value == 300);
    CHECK(log.Read(0, r) == LogRead::kGone);  // before the first sequence
    CHECK(Counted::live == 2);
  }
  CHECK(Counted::live == 0);  // the log destroyed its messages
}

TEST_CASE("messages span segments, and a segment is made once per 2^bits sequences") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  for (std::uint64_t i = 0; i < 10; ++i) {
    const std::uint64_t s = log.Claim(1);
    REQUIRE(s == i + 1);
    REQUIRE(log.Publish(s, 10 * s));
  }
  // Sequences 1..10: segments 0 (1-3), 1 (4-7), 2 (8-10).
  CHECK(log.segments_allocated() == 3);
  for (std::uint64_t s = 1; s <= 10; ++s) {
    MessageLog<Counted>::Ref r;
    REQUIRE(log.Read(s, r) == LogRead::kReady);
    CHECK(r->value == 10 * s);
  }
}

TEST_CASE("TrimBefore hides what it passes; a held Ref still reads it; the segment recycles when let go") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  const std::uint64_t first = log.Claim(12);
  REQUIRE(first == 1);
  for (std::uint64_t s = 1; s <= 12; ++s) REQUIRE(log.Publish(s, s));
  MessageLog<Counted>::Ref held;
  REQUIRE(log.Read(2, held) == LogRead::kReady);
  log.TrimBefore(9);  // segments 0 (1-3) and 1 (4-7) go whole; 8 stays in segment 2
  CHECK(log.first() == 9);
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(2, r) == LogRead::kGone);
  CHECK(log.Read(5, r) == LogRead::kGone);
  CHECK(log.Read(8, r) == LogRead::kGone);  // below first
  REQUIRE(log.Read(9, r) == LogRead::kReady);
  CHECK(r->value == 9);
  // Segment 1 had no reader: its 4 messages are destroyed; segment 0 is pinned.
  CHECK(Counted::live == 12 - 4);
  CHECK(held->value == 2);
  CHECK(held->check == ~std::uint64_t{2});
  held.reset();
  CHECK(Counted::live == 12 - 4 - 3);  // segment 0 held 1..3
  log.TrimBefore(5);                   // behind first: no-op
  CHECK(log.first() == 9);
}

TEST_CASE("a segment whose messages are all removed is recycled and reused, not reallocated") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 4);  // segment 1 is 4..7
  for (int round = 0; round < 5; ++round) {
    const std::uint64_t s = log.Claim(4);
    for (std::uint64_t q = s; q < s + 4; ++q) REQUIRE(log.Publish(q, q));
    // Remove out of order.
    CHECK(log.Remove(s + 2));
    CHECK_FALSE(log.Remove(s + 2));  // removed already
    MessageLog<Counted>::Ref r;
    CHECK(log.Read(s + 2, r) == LogRead::kGone);
    REQUIRE(log.Read(s + 3, r) == LogRead::kReady);
    CHECK(log.Remove(s + 3));
    CHECK(r->value == s + 3);  // a Ref taken before the removal still reads
    r.reset();
    CHECK(log.Remove(s));
    CHECK(Counted::live == 4);
    CHECK(log.Remove(s + 1));  // the last one: the segment goes
    CHECK(Counted::live == 0);
    CHECK(log.Read(s + 1, r) == LogRead::kGone);
  }
  // One segment at a time: the free list gave the same one back every round.
  CHECK(log.segments_allocated() == 1);
}

TEST_CASE("a publish after TrimBefore passed its sequence stores nothing and returns false") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  const std::uint64_t slow = log.Claim(1);    // 1: a slow publisher
  const std::uint64_t fast = log.Claim(10);   // 2..11
  for (std::uint64_t s = fast; s < fast + 10; ++s) REQUIRE(log.Publish(s, s));
  log.TrimBefore(6);  // a limit of 6 messages passes 1 before it is published
  CHECK_FALSE(log.Publish(slow, 1u));
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(slow, r) == LogRead::kGone);
  CHECK(Counted::live == 8);  // 2..11 less segment 0's 2 and 3; segment 1 (4-7) keeps 4 and 5
  // A segment never made (no sequence of it published) is marked gone by the trim.
  const std::uint64_t far = log.Claim(8);  // 12..19: segments 3 (12-15) and 4 (16-19)
  log.TrimBefore(16);
  CHECK_FALSE(log.Publish(far, 12u));
  CHECK(log.Publish(far + 4, 16u));
  REQUIRE(log.Read(16, r) == LogRead::kReady);
  CHECK(r->value == 16);
}

TEST_CASE("a constructor that throws leaves its slot unpublished until a trim passes it") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  const std::uint64_t s = log.Claim(2);
  CHECK_THROWS_WITH(log.Publish(s, 1u, true), "constructor of 1 fails");
  REQUIRE(log.Publish(s + 1, 2u));
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(s, r) == LogRead::kNotYet);
  REQUIRE(log.Read(s + 1, r) == LogRead::kReady);
  r.reset();
  log.TrimBefore(s + 1);
  CHECK(log.Read(s, r) == LogRead::kGone);
  CHECK(Counted::live == 1);
}

TEST_CASE("Claim refuses a claim past the live span and claims nothing") {
  MessageLog<std::uint64_t> log(1, 1);  // 2 slots a segment: 2^23 sequences of span
  const std::uint64_t span = MessageLog<std::uint64_t>::kMaxLiveSegments * 2;
  CHECK(log.Claim(static_cast<std::uint32_t>(span)) == 0);
  CHECK(log.next() == 1);
  CHECK(log.Claim(static_cast<std::uint32_t>(span - 2)) == 1);  // last = span - 2: segment 2^22 - 1
  CHECK(log.next() == span - 1);
  CHECK(log.Claim(2) == 0);  // span - 1 is in segment 2^22
  log.TrimBefore(3);         // the oldest live segment is now 1
  CHECK(log.Claim(2) == span - 1);
}

TEST_CASE("a directory entry a ring earlier held a tombstone is made anew") {
  MessageLog<std::uint64_t> log(1, 1);
  const std::uint64_t ring = MessageLog<std::uint64_t>::kMaxLiveSegments * 2;  // sequences
  REQUIRE(log.Claim(2) == 1);
  REQUIRE(log.Publish(2, 2u));
  REQUIRE(log.Publish(1, 1u));  // segment 0: sequences 0 (never) and 1
  // Trim far ahead: segment 0's entry holds its tombstone.
  REQUIRE(log.Claim(static_cast<std::uint32_t>(ring - 4)) == 3);  // up to ring - 2
  log.TrimBefore(ring - 2);
  CHECK(log.first() == ring - 2);
  MessageLog<std::uint64_t>::Ref r;
  CHECK(log.Read(1, r) == LogRead::kGone);
  // Sequence `ring` is in segment 2^22, whose entry is segment 0's.
  REQUIRE(log.Claim(4) == ring - 1);
  CHECK(log.Read(ring, r) == LogRead::kNotYet);
  REQUIRE(log.Publish(ring, 7u));
  REQUIRE(log.Read(ring, r) == LogRead::kReady);
  CHECK(*r == 7);
}

TEST_CASE("publishers, readers and a trimmer at once: every read is whole, every message destroyed once") {
  Counted::live = 0;
  constexpr int kPublishers = 3;
  constexpr std::uint64_t kPerPublisher = 40'000;
  constexpr std::uint64_t kKeep = 50;  // the trimmer keeps about this many
  {
    MessageLog<Counted> log(4, 1);  // 16 slots a segment: many recyclings
    std::atomic<int> publishing{kPublishers};
    std::atomic<std::uint64_t> bad{0}, read{0}, gone{0};
    std::vector<std::thread> threads;
    for (int p = 0; p < kPublishers; ++p) {
      threads.emplace_back([&] {
        for (std::uint64_t i = 0; i < kPerPublisher;) {
          const std::uint32_t n = 1 + static_cast<std::uint32_t>(i % 3);
          const std::uint64_t s = log.Claim(n);
          if (s == 0) bad.fetch_add(1);  // refused: the span is far from full here
          for (std::uint64_t q = s; q < s + n; ++q) log.Publish(q, q * 7);
          i += n;
        }
        publishing.fetch_sub(1);
      });
    }
    for (int c = 0; c < 2; ++c) {
      threads.emplace_back([&] {
        std::uint64_t cursor = 1;
        std::vector<MessageLog<Counted>::Ref> held;
        while (publishing.load() > 0 || cursor < log.next()) {
          MessageLog<Counted>::Ref r;
          const LogRead got = log.Read(cursor, r);
          if (got == LogRead::kNotYet) {
            if (publishing.load() == 0 && cursor >= log.next()) break;
            std::this_thread::yield();
            continue;
          }
          if (got == LogRead::kReady) {
            if (r->value != cursor * 7 || r->check != ~(cursor * 7)) bad.fetch_add(1);
            read.fetch_add(1);
            held.push_back(std::move(r));  // hold a few across trims
            if (held.size() > 8) held.erase(held.begin());
          } else {
            gone.fetch_add(1);
          }
          ++cursor;
        }
        for (auto& h : held) {
          if (h->value != h.seq() * 7 || h->check != ~(h.seq() * 7)) bad.fetch_add(1);
        }
      });
    }
    threads.emplace_back([&] {
      while (publishing.load() > 0) {
        const std::uint64_t n = log.next();
        if (n > kKeep) log.TrimBefore(n - kKeep);
        std::this_thread::yield();
      }
    });
    for (auto& t : threads) t.join();
    CHECK(bad.load() == 0);
    CHECK(read.load() + gone.load() == 2 * kPublishers * kPerPublisher);  // each reader: each seq once
    CHECK(log.next() == 1 + kPublishers * kPerPublisher);
    // With the readers gone, a last trim leaves in use only the segments of the last
    // kKeep sequences (at most kKeep / 16 + 2); the others wait on the free list.
    log.TrimBefore(log.next() - kKeep);
    CHECK(log.segments_allocated() - log.segments_free() <= kKeep / 16 + 2);
    CHECK(Counted::live == static_cast<std::int64_t>(kKeep + (log.next() - kKeep) % 16));
  }
  CHECK(Counted::live == 0);
}
