// MessageLog (src/engine/message_log.hpp): claims, publication, reads across
// segments, trimming and removal with pinned readers, segment recycling, the live
// span limit, a stale tombstone reused a directory ring later, a throwing
// constructor, and publishers, readers and a trimmer at once.
#include <algorithm>
#include <atomic>
#include <chrono>
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

TEST_CASE("UnlinkSegment drops one segment of the middle; first() and the segments around it stay") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);  // segments: 0 (1-3), 1 (4-7), 2 (8-11), 3 (12-15)
  REQUIRE(log.Claim(13) == 1);
  for (std::uint64_t s = 1; s <= 12; ++s) REQUIRE(log.Publish(s, s));
  MessageLog<Counted>::Ref held;
  REQUIRE(log.Read(9, held) == LogRead::kReady);
  CHECK(log.UnlinkSegment(1));
  CHECK(log.UnlinkSegment(2));
  CHECK(log.UnlinkSegment(1));        // gone already: still true
  CHECK_FALSE(log.UnlinkSegment(3));  // 13 is claimed and not published: in flight
  CHECK(log.first() == 1);
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(5, r) == LogRead::kGone);
  CHECK(log.Read(10, r) == LogRead::kGone);
  REQUIRE(log.Read(3, r) == LogRead::kReady);
  CHECK(r->value == 3);
  REQUIRE(log.Read(12, r) == LogRead::kReady);
  CHECK(r->value == 12);
  r.reset();
  // Segment 1 had no reader: its 4 messages are destroyed; segment 2 is pinned.
  CHECK(Counted::live == 12 - 4);
  CHECK(held->value == 9);
  held.reset();
  CHECK(Counted::live == 12 - 8);
  REQUIRE(log.Publish(13, 13));
  CHECK_FALSE(log.UnlinkSegment(3));  // 14 and 15 are not published yet either
  REQUIRE(log.Claim(2) == 14);
  REQUIRE(log.Publish(14, 14));
  REQUIRE(log.Publish(15, 15));
  CHECK(log.UnlinkSegment(3));
  CHECK(Counted::live == 3);  // 1..3
  // TrimBefore passes the holes as it passes what it unlinks itself.
  log.TrimBefore(16);
  CHECK(log.first() == 16);
  CHECK(Counted::live == 0);
  CHECK(log.Read(3, r) == LogRead::kGone);
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

TEST_CASE("a publish that TrimBefore passed is gone at once, and its segment goes after it") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  const std::uint64_t slow = log.Claim(1);    // 1: a slow publisher
  const std::uint64_t fast = log.Claim(10);   // 2..11
  for (std::uint64_t s = fast; s < fast + 10; ++s) REQUIRE(log.Publish(s, s));
  log.TrimBefore(6);  // a limit of 6 messages passes 1 before it is published
  CHECK(log.first() == 6);
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(2, r) == LogRead::kGone);
  CHECK(Counted::live == 10);  // segment 0 (1-3) waits for the publish of 1
  CHECK(log.Publish(slow, 1u));
  CHECK(log.Read(slow, r) == LogRead::kGone);
  log.TrimBefore(6);            // now segment 0 goes
  CHECK(Counted::live == 8);    // 4..11; segment 1 (4-7) keeps 4 and 5 until it goes whole
  // Claim makes the segments it claims in, so a claimed sequence always has one.
  const std::uint64_t far = log.Claim(8);  // 12..19: segments 3 (12-15) and 4 (16-19)
  REQUIRE(far == 12);
  log.TrimBefore(16);  // segments 1 (4-7) and 2 (8-11) go whole; 3 waits for 12..15
  CHECK(Counted::live == 0);
  CHECK(log.Publish(far, 12u));
  CHECK(log.Read(12, r) == LogRead::kGone);
  CHECK(log.Publish(far + 4, 16u));
  REQUIRE(log.Read(16, r) == LogRead::kReady);
  CHECK(r->value == 16);
  r.reset();
  CHECK(Counted::live == 2);  // 12 (gone, in segment 3 until 13..15 come) and 16
  for (std::uint64_t s = 13; s < 16; ++s) CHECK(log.Publish(s, s));
  log.TrimBefore(16);
  CHECK(Counted::live == 1);  // 16
}

TEST_CASE("a constructor that throws abandons its slot: readers see it gone, the segment still goes") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);
  const std::uint64_t s = log.Claim(3);  // 1..3: all of segment 0
  CHECK_THROWS_WITH(log.Publish(s, 1u, true), "constructor of 1 fails");
  REQUIRE(log.Publish(s + 1, 2u));
  REQUIRE(log.Publish(s + 2, 3u));
  MessageLog<Counted>::Ref r;
  CHECK(log.Read(s, r) == LogRead::kGone);
  REQUIRE(log.Read(s + 1, r) == LogRead::kReady);
  r.reset();
  CHECK(Counted::live == 2);
  log.TrimBefore(4);
  CHECK(Counted::live == 0);
  CHECK(log.segments_free() == 1);
}

// A log whose directory tells 4,096 segments of 2 apart (top_bits 0): 8,192 sequences.
constexpr std::uint64_t kSmallRing = 8192;

// Claims, and publishes, [first, end) in claims of at most 1,000.
void ClaimAndPublish(MessageLog<std::uint64_t>& log, std::uint64_t first, std::uint64_t end) {
  while (first < end) {
    const auto n = static_cast<std::uint32_t>(std::min<std::uint64_t>(1000, end - first));
    REQUIRE(log.Claim(n) == first);
    for (std::uint64_t s = first; s < first + n; ++s) REQUIRE(log.Publish(s, s));
    first += n;
  }
}

TEST_CASE("Claim refuses a claim past the live span and claims nothing") {
  MessageLog<std::uint64_t> log(1, 1, 0);
  REQUIRE(log.live_span() == 4096);
  ClaimAndPublish(log, 1, kSmallRing - 2);   // up to segment 4,095 (8,190 and 8,191)
  CHECK(log.Claim(1) == kSmallRing - 2);      // 8,190: still segment 4,095
  REQUIRE(log.Publish(kSmallRing - 2, 0u));
  CHECK(log.Claim(2) == 0);                   // 8,191 and 8,192: segment 4,096 is segment 0's entry
  CHECK(log.next() == kSmallRing - 1);
  log.TrimBefore(3);                          // segment 0 (0, 1) goes: the oldest is now 1
  CHECK(log.Claim(2) == kSmallRing - 1);
  CHECK_THROWS_WITH(log.Claim(0), "MessageLog claim of 0 sequences: 1..65536");
  CHECK_THROWS_WITH(log.Claim(65537), "MessageLog claim of 65537 sequences: 1..65536");
  CHECK_THROWS_WITH(MessageLog<int>(0, 1), "MessageLog segment_bits must be 1..20, got 0");
  CHECK_THROWS_WITH(MessageLog<int>(1, 0), "MessageLog first_seq must be 1..2^62, got 0");
  CHECK_THROWS_WITH(MessageLog<int>(1, 1, 11), "MessageLog top_bits must be 0..10, got 11");
}

TEST_CASE("ClaimExclusive claims as Claim does: consecutive, refused past the live span, checked") {
  MessageLog<std::uint64_t> log(1, 1, 0);
  CHECK(log.ClaimExclusive(1) == 1);
  CHECK(log.ClaimExclusive(3) == 2);  // 2, 3, 4: segments 1 and 2 made first
  CHECK(log.Claim(1) == 5);           // the two kinds share next_
  CHECK(log.ClaimExclusive(1) == 6);
  CHECK(log.next() == 7);
  for (std::uint64_t s = 1; s < 7; ++s) REQUIRE(log.Publish(s, s * 10));
  MessageLog<std::uint64_t>::Ref r;
  REQUIRE(log.Read(4, r) == LogRead::kReady);
  CHECK(*r == 40);
  r.reset();
  ClaimAndPublish(log, 7, kSmallRing - 2);     // up to segment 4,095 (8,190 and 8,191)
  CHECK(log.ClaimExclusive(1) == kSmallRing - 2);
  REQUIRE(log.Publish(kSmallRing - 2, 0u));
  CHECK(log.ClaimExclusive(2) == 0);  // segment 4,096 would be segment 0's entry
  CHECK(log.next() == kSmallRing - 1);
  log.TrimBefore(3);
  CHECK(log.ClaimExclusive(2) == kSmallRing - 1);
  CHECK_THROWS_WITH(log.ClaimExclusive(0), "MessageLog claim of 0 sequences: 1..65536");
  CHECK_THROWS_WITH(log.ClaimExclusive(65537), "MessageLog claim of 65537 sequences: 1..65536");
}

TEST_CASE("a directory entry a ring earlier held a tombstone is made anew") {
  MessageLog<std::uint64_t> log(1, 1, 0);
  ClaimAndPublish(log, 1, kSmallRing - 2);
  log.TrimBefore(kSmallRing - 2);  // segment 0's entry holds its tombstone
  CHECK(log.first() == kSmallRing - 2);
  MessageLog<std::uint64_t>::Ref r;
  CHECK(log.Read(1, r) == LogRead::kGone);
  // Sequence 8,192 is in segment 4,096, whose entry is segment 0's.
  REQUIRE(log.Claim(4) == kSmallRing - 2);
  CHECK(log.Read(kSmallRing, r) == LogRead::kNotYet);
  REQUIRE(log.Publish(kSmallRing, 7u));
  REQUIRE(log.Read(kSmallRing, r) == LogRead::kReady);
  CHECK(*r == 7);
  CHECK(log.Read(1, r) == LogRead::kGone);  // the old index reads gone, not the new segment
}

TEST_CASE("publishers, readers and a trimmer at once: every read is whole, every message destroyed once") {
  Counted::live = 0;
  constexpr int kPublishers = 3;
  constexpr std::uint64_t kPerPublisher = 40'000;
  constexpr std::uint64_t kKeep = 50;  // the trimmer keeps about this many
  {
    const unsigned bits = GENERATE(1u, 4u);  // 2 or 16 slots a segment: many recyclings
    MessageLog<Counted> log(bits, 1);
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
        MessageLog<Counted>::Reader reader(log);
        // A sequence that never becomes readable nor gone would stall the reader:
        // after 60 s it stops and counts that as a bad read.
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (publishing.load() > 0 || cursor < log.next()) {
          MessageLog<Counted>::Ref r;
          const LogRead got = reader.Read(cursor, r);
          if (got == LogRead::kNotYet) {
            if (publishing.load() == 0 && cursor >= log.next()) break;
            if (std::chrono::steady_clock::now() > give_up) {
              bad.fetch_add(1);
              break;
            }
            std::this_thread::yield();
            continue;
          }
          if (got == LogRead::kReady) {
            if (r->value != cursor * 7 || r->check != ~(cursor * 7)) bad.fetch_add(1);
            read.fetch_add(1);
            held.push_back(r.Share());  // hold a few across trims (r lets go of its own)
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
    const std::uint64_t slots = std::uint64_t{1} << bits;
    CHECK(log.segments_allocated() - log.segments_free() <= kKeep / slots + 2);
    CHECK(Counted::live == static_cast<std::int64_t>(kKeep + (log.next() - kKeep) % slots));
  }
  CHECK(Counted::live == 0);
}

// The smallest inputs of an adversarial review's findings.
TEST_CASE("a read far ahead of the log is not yet, at once") {
  MessageLog<std::uint64_t> log(1, 1, 0);
  REQUIRE(log.Claim(1) == 1);
  REQUIRE(log.Publish(1, 1u));
  MessageLog<std::uint64_t>::Ref r;
  // Sequence 8,192 is in segment 4,096, whose directory entry is segment 0's.
  CHECK(log.Read(kSmallRing, r) == LogRead::kNotYet);
  CHECK(log.Read(kSmallRing + 1, r) == LogRead::kNotYet);
}

TEST_CASE("a slow publisher holds the span: claims a directory ring later wait for it") {
  MessageLog<std::uint64_t> log(1, 1, 0);
  REQUIRE(log.Claim(1) == 1);  // slow: segment 0, made by the claim
  ClaimAndPublish(log, 2, kSmallRing - 2);
  log.TrimBefore(kSmallRing - 2);
  // Segment 0 cannot go before 1 is published, so the ring cannot wrap onto it.
  CHECK(log.Claim(4) == 0);
  REQUIRE(log.Publish(1, 1u));
  MessageLog<std::uint64_t>::Ref r;
  CHECK(log.Read(1, r) == LogRead::kGone);
  log.TrimBefore(kSmallRing - 2);
  CHECK(log.Claim(4) == kSmallRing - 2);
  REQUIRE(log.Publish(kSmallRing, 7u));
  REQUIRE(log.Read(kSmallRing, r) == LogRead::kReady);
  CHECK(*r == 7);
}

TEST_CASE("removing every message of a first segment that starts below the first sequence unlinks it") {
  Counted::live = 0;
  MessageLog<Counted> log(2, 1);  // segment 0 holds 1..3 only
  REQUIRE(log.Claim(3) == 1);
  for (std::uint64_t s = 1; s <= 3; ++s) REQUIRE(log.Publish(s, s));
  CHECK(log.Remove(2));
  CHECK(log.Remove(1));
  CHECK(Counted::live == 3);
  CHECK(log.Remove(3));
  CHECK(Counted::live == 0);
}

TEST_CASE("ReadyEnd stops at the first slot a publisher still writes, and passes what is gone") {
  Counted::live = 0;
  {
    MessageLog<Counted> log(2, 1);  // 4 slots a segment: [0,4) holds 1..3
    MessageLog<Counted>::Reader reader(log);
    CHECK(reader.ReadyEnd(1, 100) == 1);  // nothing claimed: segment 0 not made
    REQUIRE(log.Claim(9) == 1);           // 1..9: segments 0, 1, 2
    CHECK(reader.ReadyEnd(1, 100) == 1);  // claimed, not published
    REQUIRE(log.Publish(1, 1u));
    REQUIRE(log.Publish(2, 2u));
    REQUIRE(log.Publish(4, 4u));
    CHECK(reader.ReadyEnd(1, 100) == 3);  // 3 is still being written
    CHECK(reader.ReadyEnd(1, 1) == 2);    // at most max_n
    CHECK(reader.ReadyEnd(4, 100) == 5);
    CHECK_THROWS_WITH(log.Publish(3, 3u, true), "constructor of 3 fails");  // abandoned
    CHECK(reader.ReadyEnd(1, 100) == 5);  // an abandoned slot needs no publisher
    for (std::uint64_t s = 5; s <= 9; ++s) REQUIRE(log.Publish(s, static_cast<unsigned>(s)));
    CHECK(reader.ReadyEnd(1, 100) == 10);  // 10 is not claimed
    CHECK(log.Remove(6));
    CHECK(reader.ReadyEnd(5, 100) == 10);  // removed: published, nothing to wait for
    reader.Drop();
    log.TrimBefore(8);                     // segments 0 and 1 go
    CHECK(reader.ReadyEnd(2, 100) == 10);  // trimmed: gone
    CHECK(reader.ReadyEnd(2, 3) == 5);
  }
  CHECK(Counted::live == 0);
}

TEST_CASE("ReadyEnd under publishers publishing out of order: never past an unpublished slot") {
  constexpr std::uint64_t kTotal = 100'000;
  MessageLog<std::uint64_t> log(6, 1);
  std::vector<std::thread> publishers;
  std::atomic<bool> failed{false};  // Catch2's checks are for the test's own thread
  for (int p = 0; p < 3; ++p) {
    publishers.emplace_back([&, p] {
      for (std::uint32_t k = static_cast<std::uint32_t>(p);; ++k) {
        const std::uint32_t n = 1 + k % 7;
        const std::uint64_t s = log.Claim(n);
        if (s == 0) {
          failed = true;
          return;
        }
        // Published in reverse order, so a reader meets slots still being written.
        for (std::uint64_t i = n; i-- > 0;) {
          if (s + i <= kTotal && !log.Publish(s + i, s + i)) failed = true;
        }
        if (s + n > kTotal) return;
      }
    });
  }
  MessageLog<std::uint64_t>::Reader reader(log);
  std::uint64_t next = 1, checked = 0;
  while (next <= kTotal) {
    const std::uint64_t end = std::min(reader.ReadyEnd(next, 64), kTotal + 1);
    for (std::uint64_t s = next; s < end; ++s) {
      MessageLog<std::uint64_t>::Ref r;
      REQUIRE(reader.Read(s, r) == LogRead::kReady);  // everything before the end is there
      REQUIRE(*r == s);
      ++checked;
    }
    next = end;
    if ((next & 1023) == 0) log.TrimBefore(next);
  }
  for (std::thread& t : publishers) t.join();
  CHECK_FALSE(failed.load());
  CHECK(checked == kTotal);
}
