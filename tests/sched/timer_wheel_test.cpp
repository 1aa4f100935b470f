#include "inferq/sched/timer_wheel.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

using inferq::TimerId;
using inferq::TimerWheel;
using inferq::TimerWheelOptions;

namespace {

struct Fired {
  int value;
  std::int64_t deadline_ns;
  friend bool operator==(const Fired&, const Fired&) = default;
};

std::ostream& operator<<(std::ostream& os, const Fired& f) {
  return os << "{" << f.value << " @" << f.deadline_ns << "}";
}

// Advances and returns what fired, in firing order.
std::vector<Fired> AdvanceTo(TimerWheel<int>& w, std::int64_t now_ns) {
  std::vector<Fired> out;
  const std::size_t n = w.Advance(now_ns, [&](int&& v, std::int64_t d) { out.push_back({v, d}); });
  REQUIRE(n == out.size());
  return out;
}

}  // namespace

TEST_CASE("options are validated, naming the field and value") {
  CHECK(TimerWheel<int>::Validate({}).ok());
  absl::Status s = TimerWheel<int>::Validate({.tick_ns = 0});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "TimerWheelOptions.tick_ns = 0 must be > 0");
  s = TimerWheel<int>::Validate({.slots_per_level = 100});
  CHECK(s.message() == "TimerWheelOptions.slots_per_level = 100 must be a power of two in [2, 65536]");
  CHECK(!TimerWheel<int>::Validate({.slots_per_level = 1}).ok());
  CHECK(!TimerWheel<int>::Validate({.slots_per_level = 131072}).ok());
  CHECK(TimerWheel<int>::Validate({.slots_per_level = 2}).ok());
  CHECK(TimerWheel<int>::Validate({.slots_per_level = 65536, .levels = 8}).ok());
  s = TimerWheel<int>::Validate({.levels = 0});
  CHECK(s.message() == "TimerWheelOptions.levels = 0 must be in 1..8");
  CHECK(!TimerWheel<int>::Validate({.levels = 9}).ok());
  CHECK_THROWS_AS(TimerWheel<int>(0, {.tick_ns = -1}), std::invalid_argument);
}

TEST_CASE("timers fire in deadline order, ties in schedule order, never early") {
  TimerWheel<int> w(1'000, {.tick_ns = 100});
  w.Schedule(1'550, 1);
  w.Schedule(1'320, 2);
  w.Schedule(1'550, 3);
  w.Schedule(1'301, 4);
  w.Schedule(1'399, 5);
  CHECK(w.size() == 5);
  CHECK(w.NextDeadline() == 1'301);

  CHECK(AdvanceTo(w, 1'300).empty());  // 1'301 shares the tick but is later
  CHECK(AdvanceTo(w, 1'320) == std::vector<Fired>{{4, 1'301}, {2, 1'320}});
  CHECK(w.NextDeadline() == 1'399);
  CHECK(AdvanceTo(w, 1'549) == std::vector<Fired>{{5, 1'399}});
  CHECK(AdvanceTo(w, 10'000) == std::vector<Fired>{{1, 1'550}, {3, 1'550}});
  CHECK(w.empty());
  CHECK(w.NextDeadline() == std::nullopt);
}

TEST_CASE("past deadlines fire at the next advance, and time never goes back") {
  TimerWheel<int> w(1'000, {.tick_ns = 10});
  w.Schedule(5, 1);  // before start
  CHECK(AdvanceTo(w, 0) == std::vector<Fired>{{1, 5}});  // now 0 counts as 1'000
  CHECK(AdvanceTo(w, 2'000).empty());
  w.Schedule(1'500, 2);  // before the latest now
  w.Schedule(2'000, 3);  // exactly the latest now
  w.Schedule(2'001, 4);
  CHECK(AdvanceTo(w, 1'000) == std::vector<Fired>{{2, 1'500}, {3, 2'000}});
  CHECK(AdvanceTo(w, 2'001) == std::vector<Fired>{{4, 2'001}});
}

TEST_CASE("cancel is true once, and false after firing") {
  TimerWheel<int> w(0, {.tick_ns = 10});
  TimerId a = w.Schedule(100, 1);
  TimerId b = w.Schedule(200, 2);
  CHECK(!w.Cancel(TimerId{}));
  CHECK(w.Cancel(a));
  CHECK(!w.Cancel(a));
  CHECK(w.size() == 1);
  CHECK(AdvanceTo(w, 200) == std::vector<Fired>{{2, 200}});
  CHECK(!w.Cancel(b));
  // The freed node is reused; the stale handles still name nothing.
  TimerId c = w.Schedule(300, 3);
  CHECK(c != a);
  CHECK(c != b);
  CHECK(!w.Cancel(a));
  CHECK(!w.Cancel(b));
  CHECK(w.Cancel(c));
  CHECK(w.empty());
  CHECK(!w.Cancel(TimerId{0xFFFF'FFFF'0000'0007ULL}));  // an index never used
}

TEST_CASE("deadlines beyond the span wait in overflow and cascade down") {
  // Span: 10 ns x 4^2 = 160 ns.
  TimerWheel<int> w(0, {.tick_ns = 10, .slots_per_level = 4, .levels = 2});
  w.Schedule(1'000'005, 1);
  w.Schedule(165, 2);
  w.Schedule(159, 3);
  w.Schedule(INT64_MAX, 4);
  CHECK(w.NextDeadline() == 159);
  CHECK(AdvanceTo(w, 160) == std::vector<Fired>{{3, 159}});
  CHECK(AdvanceTo(w, 164).empty());
  CHECK(AdvanceTo(w, 165) == std::vector<Fired>{{2, 165}});
  CHECK(w.NextDeadline() == 1'000'005);
  CHECK(AdvanceTo(w, 1'000'000).empty());
  CHECK(AdvanceTo(w, 1'000'004).empty());
  CHECK(AdvanceTo(w, 1'000'005) == std::vector<Fired>{{1, 1'000'005}});
  CHECK(w.NextDeadline() == INT64_MAX);
  CHECK(AdvanceTo(w, INT64_MAX - 1).empty());
  CHECK(AdvanceTo(w, INT64_MAX) == std::vector<Fired>{{4, INT64_MAX}});
}

TEST_CASE("a timer scheduled from fire fires at the next advance, not the running one") {
  TimerWheel<int> w(0, {.tick_ns = 10});
  w.Schedule(50, 1);
  std::vector<Fired> fired;
  auto fire = [&](int&& v, std::int64_t d) {
    fired.push_back({v, d});
    if (v == 1) w.Schedule(40, 10);  // already due
    if (v == 1) w.Schedule(60, 11);  // due in this advance's range
  };
  CHECK(w.Advance(100, fire) == 1);
  CHECK(fired == std::vector<Fired>{{1, 50}});
  CHECK(w.size() == 2);
  CHECK(w.Advance(100, fire) == 2);
  CHECK(fired == std::vector<Fired>{{1, 50}, {10, 40}, {11, 60}});
}

TEST_CASE("fire may cancel a later timer of the same advance") {
  TimerWheel<int> w(0, {.tick_ns = 10});
  w.Schedule(10, 1);
  TimerId second = w.Schedule(20, 2);
  w.Schedule(30, 3);
  std::vector<int> fired;
  bool cancelled = false;
  const std::size_t n = w.Advance(100, [&](int&& v, std::int64_t) {
    fired.push_back(v);
    if (v == 1) cancelled = w.Cancel(second);
  });
  CHECK(cancelled);
  CHECK(n == 2);
  CHECK(fired == std::vector<int>{1, 3});
  CHECK(w.empty());
}

TEST_CASE("a nested advance from fire does nothing") {
  TimerWheel<int> w(0, {.tick_ns = 10});
  w.Schedule(10, 1);
  w.Schedule(20, 2);
  std::size_t nested = 99;
  std::vector<int> fired;
  w.Advance(100, [&](int&& v, std::int64_t) {
    fired.push_back(v);
    nested = w.Advance(200, [](int&&, std::int64_t) {});
  });
  CHECK(nested == 0);
  CHECK(fired == std::vector<int>{1, 2});
}

TEST_CASE("when fire throws, the timers not yet fired stay pending") {
  TimerWheel<int> w(0, {.tick_ns = 10});
  w.Schedule(10, 1);
  w.Schedule(20, 2);
  w.Schedule(30, 3);
  std::vector<int> fired;
  CHECK_THROWS_AS(w.Advance(100,
                            [&](int&& v, std::int64_t) {
                              fired.push_back(v);
                              if (v == 2) throw std::runtime_error("callback failed");
                            }),
                  std::runtime_error);
  CHECK(fired == std::vector<int>{1, 2});
  CHECK(w.size() == 1);
  CHECK(w.NextDeadline() == 30);
  CHECK(AdvanceTo(w, 100) == std::vector<Fired>{{3, 30}});
}

TEST_CASE("move-only values are handed to fire") {
  TimerWheel<std::unique_ptr<int>> w(0, {.tick_ns = 10});
  w.Schedule(5, std::make_unique<int>(42));
  int got = 0;
  w.Advance(5, [&](std::unique_ptr<int>&& p, std::int64_t) { got = *p; });
  CHECK(got == 42);
}

// Differential test: the wheel against an ordered multimap, with random schedules
// (past, near, far, beyond the span), cancels (live and stale) and advances
// (small steps, slot-sized, and huge jumps).
TEST_CASE("randomized differential test against a multimap") {
  struct Config {
    TimerWheelOptions options;
    std::int64_t start_ns;
  };
  const std::vector<Config> configs = {
      {{.tick_ns = 1, .slots_per_level = 2, .levels = 1}, 0},
      {{.tick_ns = 10, .slots_per_level = 4, .levels = 2}, -1'000},
      {{.tick_ns = 7, .slots_per_level = 8, .levels = 3}, 123},
      {{.tick_ns = 1'000, .slots_per_level = 64, .levels = 2}, 5'000'000},
      {{.tick_ns = 1'000'000, .slots_per_level = 256, .levels = 4}, 0},
      {{.tick_ns = 1, .slots_per_level = 65536, .levels = 8}, INT64_MIN / 2},
  };
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    for (const Config& cfg : configs) {
      INFO("seed " << seed << " tick " << cfg.options.tick_ns << " slots "
                   << cfg.options.slots_per_level << " levels " << cfg.options.levels);
      std::mt19937_64 rng(seed * 7919 + cfg.options.slots_per_level);
      TimerWheel<int> w(cfg.start_ns, cfg.options);
      const std::int64_t tick = cfg.options.tick_ns;
      double span = static_cast<double>(tick);
      for (std::uint32_t l = 0; l < cfg.options.levels; ++l) span *= cfg.options.slots_per_level;
      const std::int64_t span_ns = span > 1e15 ? std::int64_t{1'000'000'000'000'000} : static_cast<std::int64_t>(span);

      std::multimap<std::pair<std::int64_t, std::uint64_t>, std::pair<int, TimerId>> ref;
      std::vector<std::pair<TimerId, std::pair<std::int64_t, std::uint64_t>>> ids;  // all ever issued
      std::int64_t now = cfg.start_ns;
      std::uint64_t order = 0;
      int next_value = 0;
      std::size_t total_fired = 0;
      auto offset = [&]() -> std::int64_t {
        switch (rng() % 8) {
          case 0: return -static_cast<std::int64_t>(rng() % (4 * tick + 1));  // past
          case 1: return 0;
          case 2: return static_cast<std::int64_t>(rng() % (2 * tick));
          case 3: return static_cast<std::int64_t>(rng() % (64 * tick));
          case 4: return static_cast<std::int64_t>(rng() % span_ns);
          case 5: return span_ns + static_cast<std::int64_t>(rng() % (3 * span_ns));  // beyond
          case 6: return static_cast<std::int64_t>(rng() % (span_ns / 3 + 1));
          default: return static_cast<std::int64_t>(rng() % (tick * 1000));
        }
      };
      for (int step = 0; step < 4000; ++step) {
        const unsigned op = rng() % 10;
        if (op < 5) {
          const std::int64_t d = now + offset();
          const int v = next_value++;
          TimerId id = w.Schedule(d, v);
          ref.emplace(std::make_pair(d, order), std::make_pair(v, id));
          ids.push_back({id, {d, order}});
          ++order;
        } else if (op < 7 && !ids.empty()) {
          auto [id, key] = ids[rng() % ids.size()];
          bool in_ref = false;
          auto range = ref.equal_range(key);
          for (auto it = range.first; it != range.second; ++it) {
            if (it->second.second == id) {
              ref.erase(it);
              in_ref = true;
              break;
            }
          }
          REQUIRE(w.Cancel(id) == in_ref);
        } else {
          std::int64_t jump;
          switch (rng() % 6) {
            case 0: jump = 0; break;
            case 1: jump = static_cast<std::int64_t>(rng() % (3 * tick)); break;
            case 2: jump = static_cast<std::int64_t>(rng() % (300 * tick)); break;
            case 3: jump = static_cast<std::int64_t>(rng() % (span_ns + 1)); break;
            case 4: jump = 5 * span_ns + static_cast<std::int64_t>(rng() % span_ns); break;  // huge
            default: jump = -static_cast<std::int64_t>(rng() % (10 * tick)); break;  // backwards
          }
          const std::int64_t asked = now + jump;
          now = std::max(now, asked);
          std::vector<Fired> want;
          while (!ref.empty() && ref.begin()->first.first <= now) {
            want.push_back({ref.begin()->second.first, ref.begin()->first.first});
            ref.erase(ref.begin());
          }
          std::vector<Fired> got = AdvanceTo(w, asked);
          REQUIRE(got == want);
          total_fired += got.size();
        }
        REQUIRE(w.size() == ref.size());
        if (ref.empty()) {
          REQUIRE(w.NextDeadline() == std::nullopt);
        } else {
          REQUIRE(w.NextDeadline() == ref.begin()->first.first);
        }
      }
      // Drain everything.
      std::vector<Fired> want;
      for (auto& [k, v] : ref) want.push_back({v.first, k.first});
      REQUIRE(AdvanceTo(w, INT64_MAX) == want);
      CHECK(w.empty());
      CHECK(total_fired > 500);  // the run exercised firing, not only scheduling
    }
  }
}
