#include "inferq/sched/duplicate_window.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

using inferq::DuplicateWindow;

TEST_CASE("the window must be positive and finite") {
  CHECK(DuplicateWindow::Validate(absl::Minutes(2)).ok());
  absl::Status s = DuplicateWindow::Validate(absl::ZeroDuration());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "duplicate window 0 must be > 0 and at most 2^63-1 ns");
  CHECK(DuplicateWindow::Validate(-absl::Seconds(1)).message() ==
        "duplicate window -1s must be > 0 and at most 2^63-1 ns");
  CHECK(!DuplicateWindow::Validate(absl::InfiniteDuration()).ok());
  CHECK_THROWS_AS(DuplicateWindow(absl::ZeroDuration()), std::invalid_argument);
  CHECK(DuplicateWindow(absl::Minutes(2)).window_ns() == 120'000'000'000);
}

TEST_CASE("ids are compared as exact bytes") {
  DuplicateWindow w(absl::Seconds(1));
  CHECK(w.Insert("a", 1, 0));
  CHECK(w.Find("a", 0) == 1u);
  CHECK(w.Find("A", 0) == std::nullopt);
  CHECK(w.Find("a ", 0) == std::nullopt);
  CHECK(w.Find(" a", 0) == std::nullopt);
  CHECK(w.Find("", 0) == std::nullopt);
  CHECK(w.Insert("A", 2, 0));
  CHECK(w.Insert("a ", 3, 0));
  CHECK(w.Insert(std::string("a\0b", 3), 4, 0));
  CHECK(w.Find(std::string_view("a\0b", 3), 0) == 4u);
  CHECK(w.Find("a", 0) == 1u);  // "a\0b" is not "a"
  CHECK(!w.Insert("a", 5, 0));
  CHECK(w.Find("a", 0) == 1u);  // the duplicate did not replace the sequence
  CHECK(w.size() == 4);
}

TEST_CASE("the window is fixed from the first acceptance") {
  DuplicateWindow w(absl::Nanoseconds(100));
  CHECK(w.Insert("m", 7, 1'000));
  CHECK(!w.Insert("m", 8, 1'050));  // a duplicate seen in between: no extension
  CHECK(w.Find("m", 1'099) == 7u);  // t = window - 1
  CHECK(w.Find("m", 1'100) == std::nullopt);  // t = window, not found before Expire
  CHECK(w.size() == 1);
  // New again: stored with its new sequence, and a fresh window from now.
  CHECK(w.Insert("m", 9, 1'100));
  CHECK(w.size() == 1);
  CHECK(w.Find("m", 1'150) == 9u);
  CHECK(w.Find("m", 1'199) == 9u);
  CHECK(w.Find("m", 1'200) == std::nullopt);
}

TEST_CASE("entries expire in acceptance order") {
  DuplicateWindow w(absl::Nanoseconds(100));
  CHECK(w.Insert("a", 1, 0));
  CHECK(w.Insert("b", 2, 10));
  CHECK(w.Insert("c", 3, 20));
  CHECK(w.Expire(99) == 0);
  CHECK(w.Expire(110) == 2);  // a (until 100) and b (until 110)
  CHECK(w.size() == 1);
  CHECK(w.Find("a", 110) == std::nullopt);
  CHECK(w.Find("b", 110) == std::nullopt);
  CHECK(w.Find("c", 110) == 3u);
  // Time never goes back: an earlier now_ns counts as the latest seen.
  CHECK(w.Find("c", 50) == 3u);
  CHECK(w.Expire(5) == 0);
  CHECK(w.Find("c", 119) == 3u);
  CHECK(w.Expire(120) == 1);
  CHECK(w.empty());
  // Insert removes the expired entries itself.
  CHECK(w.Insert("d", 4, 200));
  CHECK(w.Insert("e", 5, 250));
  CHECK(w.Insert("f", 6, 300));  // d expires at 300
  CHECK(w.size() == 2);
}

TEST_CASE("randomized against a map of (sequence, accepted at)") {
  constexpr std::int64_t kWindow = 1'000;
  DuplicateWindow w(absl::Nanoseconds(kWindow));
  std::map<std::string, std::pair<std::uint64_t, std::int64_t>> ref;
  std::mt19937_64 rng(42);
  std::int64_t now = 0;
  std::uint64_t seq = 0;
  int found = 0;
  int duplicates = 0;
  for (int i = 0; i < 20'000; ++i) {
    now += static_cast<std::int64_t>(rng() % 40);
    const std::string id = "id-" + std::to_string(rng() % 50);
    auto it = ref.find(id);
    const bool live = it != ref.end() && now < it->second.second + kWindow;
    const auto got = w.Find(id, now);
    REQUIRE(got.has_value() == live);
    if (live) {
      REQUIRE(*got == it->second.first);
      ++found;
    }
    if (rng() % 2 == 0) {
      const bool inserted = w.Insert(id, ++seq, now);
      REQUIRE(inserted == !live);
      if (inserted) ref[id] = {seq, now};
      else ++duplicates;
    }
    if (rng() % 16 == 0) w.Expire(now);
    std::size_t live_count = 0;
    for (auto& [k, v] : ref) live_count += now < v.second + kWindow;
    REQUIRE(w.size() >= live_count);
  }
  CHECK(found > 1'000);
  CHECK(duplicates > 1'000);
}

TEST_CASE("ForEachInRange calls for the unexpired ids of a sequence range, in order") {
  DuplicateWindow w(absl::Nanoseconds(100));
  for (std::uint64_t seq = 1; seq <= 10; ++seq) {
    REQUIRE(w.Insert("id" + std::to_string(seq), seq, static_cast<std::int64_t>(seq * 10)));
  }
  std::string got;
  w.ForEachInRange(3, 7, 50, [&](std::string_view id, std::uint64_t seq, std::int64_t at) {
    got += std::string(id) + "=" + std::to_string(seq) + "@" + std::to_string(at) + " ";
  });
  CHECK(got == "id3=3@30 id4=4@40 id5=5@50 id6=6@60 ");
  // At 135 the ids accepted at 35 or before have expired (window 100).
  got.clear();
  w.ForEachInRange(1, 100, 135, [&](std::string_view id, std::uint64_t, std::int64_t) {
    got += std::string(id) + " ";
  });
  CHECK(got == "id4 id5 id6 id7 id8 id9 id10 ");
  got.clear();
  w.ForEachInRange(11, 20, 50, [&](std::string_view id, std::uint64_t, std::int64_t) {
    got += std::string(id);
  });
  CHECK(got.empty());
}

TEST_CASE("ForEachInRange finds every id of the range when sequences came out of order") {
  DuplicateWindow w(absl::Seconds(1));
  for (std::uint64_t seq : {5, 2, 9, 3}) REQUIRE(w.Insert("s" + std::to_string(seq), seq, 0));
  std::string got;
  w.ForEachInRange(2, 6, 0, [&](std::string_view id, std::uint64_t, std::int64_t) {
    got += std::string(id) + " ";
  });
  CHECK(got == "s5 s2 s3 ");  // acceptance order
}

TEST_CASE("a hashed id finds and inserts as the id does, also in a full window") {
  // Two windows of 8 entries, one fed ids and one fed Hashed(id): every answer, the
  // size and the evictions agree. A full window keeps everything on a duplicate.
  DuplicateWindow plain(absl::Nanoseconds(1'000), 8);
  DuplicateWindow hashed(absl::Nanoseconds(1'000), 8);
  std::mt19937_64 rng(7);
  std::int64_t now = 0;
  std::uint64_t seq = 0;
  int inserted = 0;
  int refused = 0;
  for (int i = 0; i < 5'000; ++i) {
    now += static_cast<std::int64_t>(rng() % 30);
    const std::string id = "request-" + std::to_string(rng() % 12) + "-of-a-longer-id";
    const DuplicateWindow::HashedId key = DuplicateWindow::Hashed(id);
    REQUIRE(key.hash == DuplicateWindow::Hashed(std::string(id)).hash);
    REQUIRE(plain.Find(id, now) == hashed.Find(key, now));
    ++seq;
    const bool a = plain.Insert(id, seq, now);
    const bool b = hashed.Insert(key, seq, now);
    REQUIRE(a == b);
    (a ? inserted : refused)++;
    REQUIRE(plain.size() == hashed.size());
    REQUIRE(plain.evicted() == hashed.evicted());
    REQUIRE(hashed.size() <= 8);
  }
  CHECK(inserted > 500);
  CHECK(refused > 500);
  CHECK(hashed.evicted() > 0);

  SECTION("a duplicate in a full window changes nothing") {
    DuplicateWindow w(absl::Seconds(10), 2);
    REQUIRE(w.Insert(DuplicateWindow::Hashed("a"), 1, 0));
    REQUIRE(w.Insert(DuplicateWindow::Hashed("b"), 2, 0));
    CHECK_FALSE(w.Insert(DuplicateWindow::Hashed("a"), 3, 1));
    CHECK(w.evicted() == 0);
    CHECK(w.Find("a", 1) == std::optional<std::uint64_t>(1));
    CHECK(w.Find("b", 1) == std::optional<std::uint64_t>(2));
    CHECK(w.Insert(DuplicateWindow::Hashed("c"), 4, 1));  // now the oldest goes
    CHECK(w.evicted() == 1);
    CHECK_FALSE(w.Find("a", 1).has_value());
    CHECK(w.Find("c", 1) == std::optional<std::uint64_t>(4));
  }
}
