#include "inferq/sched/reorder_buffer.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/ring/mpmc_ring.hpp"

using inferq::ReorderBuffer;
using inferq::ReorderBufferOptions;
using inferq::ReorderResult;

namespace {

constexpr std::int64_t kMs = 1'000'000;

struct Out {
  std::string seq_id;
  std::uint64_t seq_no;
  int value;
  friend bool operator==(const Out&, const Out&) = default;
};
std::ostream& operator<<(std::ostream& os, const Out& o) {
  return os << o.seq_id << "#" << o.seq_no << "=" << o.value;
}

struct Gap {
  std::string seq_id;
  std::uint64_t first;
  std::uint64_t end;
  friend bool operator==(const Gap&, const Gap&) = default;
};
std::ostream& operator<<(std::ostream& os, const Gap& g) {
  return os << g.seq_id << "[" << g.first << "," << g.end << ")";
}

// Collects what a buffer releases and reports.
struct Recorder {
  std::vector<Out> out;
  std::vector<Gap> gaps;
  auto Sink() {
    return [this](std::string_view id, std::uint64_t n, int&& v) {
      out.push_back({std::string(id), n, v});
    };
  }
  auto OnGap() {
    return [this](std::string_view id, std::uint64_t first, std::uint64_t end) {
      gaps.push_back({std::string(id), first, end});
    };
  }
};

}  // namespace

TEST_CASE("options are validated, naming the field and value") {
  CHECK(ReorderBuffer<int>::Validate({}).ok());
  absl::Status s = ReorderBuffer<int>::Validate({.max_pending_per_sequence = 0});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "ReorderBufferOptions.max_pending_per_sequence = 0 must be >= 1");
  s = ReorderBuffer<int>::Validate({.max_sequences = 0});
  CHECK(s.message() == "ReorderBufferOptions.max_sequences = 0 must be >= 1");
  s = ReorderBuffer<int>::Validate({.gap_timeout_ns = -5});
  CHECK(s.message() == "ReorderBufferOptions.gap_timeout_ns = -5 must be > 0");
  s = ReorderBuffer<int>::Validate({.max_remembered_gaps_per_sequence = 0});
  CHECK(s.message() == "ReorderBufferOptions.max_remembered_gaps_per_sequence = 0 must be >= 1");
  CHECK_THROWS_AS(ReorderBuffer<int>({.gap_timeout_ns = 0}), std::invalid_argument);
}

TEST_CASE("items are released strictly in order, per sequence") {
  ReorderBuffer<int> rb;
  Recorder r;
  CHECK(rb.Offer("a", 2, 102, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("b", 0, 200, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("a", 1, 101, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Stats().buffered_now == 2);
  CHECK(rb.Offer("a", 0, 100, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("a", 4, 104, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("a", 3, 103, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(r.out == std::vector<Out>{{"b", 0, 200}, {"a", 0, 100}, {"a", 1, 101}, {"a", 2, 102},
                                  {"a", 3, 103}, {"a", 4, 104}});
  CHECK(rb.NextExpected("a") == 5);
  CHECK(rb.NextExpected("b") == 1);
  CHECK(rb.NextExpected("c") == std::nullopt);
  const inferq::ReorderStats st = rb.Stats();
  CHECK(st.released == 6);
  CHECK(st.buffered_now == 0);
  CHECK(st.sequences_now == 2);
  CHECK(st.duplicates == 0);
}

TEST_CASE("duplicates of released and of buffered numbers are dropped and counted") {
  ReorderBuffer<int> rb;
  Recorder r;
  CHECK(rb.Offer("g", 0, 1, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("g", 0, 2, 0, r.Sink()) == ReorderResult::kDuplicate);
  CHECK(rb.Offer("g", 2, 3, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("g", 2, 4, 0, r.Sink()) == ReorderResult::kDuplicate);
  CHECK(rb.Offer("g", 1, 5, 0, r.Sink()) == ReorderResult::kReleased);
  // The first copy of 2 wins.
  CHECK(r.out == std::vector<Out>{{"g", 0, 1}, {"g", 1, 5}, {"g", 2, 3}});
  CHECK(rb.Stats().duplicates == 2);
}

TEST_CASE("Start sets the first number, and numbers below it are duplicates") {
  ReorderBuffer<int> rb;
  Recorder r;
  REQUIRE(rb.Start("s", 10).ok());
  absl::Status again = rb.Start("s", 3);
  CHECK(again.code() == absl::StatusCode::kAlreadyExists);
  CHECK(again.message() == "sequence 's' is already open (next expected 10)");
  CHECK(rb.Offer("s", 9, 0, 0, r.Sink()) == ReorderResult::kDuplicate);
  CHECK(rb.Offer("s", 11, 11, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("s", 10, 10, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(r.out == std::vector<Out>{{"s", 10, 10}, {"s", 11, 11}});
}

TEST_CASE("an item too far ahead is refused with nothing changed") {
  ReorderBuffer<int> rb({.max_pending_per_sequence = 4});
  Recorder r;
  CHECK(rb.Offer("x", 5, 0, 0, r.Sink()) == ReorderResult::kOverflow);
  CHECK(rb.NextExpected("x") == std::nullopt);  // not even opened
  CHECK(rb.Offer("x", 4, 4, 0, r.Sink()) == ReorderResult::kBuffered);  // 4 - 0 <= 4
  CHECK(rb.Offer("x", 5, 5, 0, r.Sink()) == ReorderResult::kOverflow);
  const inferq::ReorderStats st = rb.Stats();
  CHECK(st.overflow == 2);
  CHECK(st.buffered_now == 1);
  CHECK(rb.Offer("x", 0, 0, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("x", 5, 5, 0, r.Sink()) == ReorderResult::kBuffered);  // next is 1 now
  CHECK(rb.NextGapDeadline() == 50 * kMs);
}

TEST_CASE("sequences beyond max_sequences are refused until one finishes") {
  ReorderBuffer<int> rb({.max_sequences = 2});
  Recorder r;
  CHECK(rb.Offer("a", 0, 0, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("b", 1, 0, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("c", 0, 0, 0, r.Sink()) == ReorderResult::kTooManySequences);
  absl::Status s = rb.Start("d", 0);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.message() == "sequence 'd' refused: max_sequences = 2 are open");
  CHECK(rb.Stats().too_many_sequences == 2);
  CHECK(r.out.size() == 1);
  CHECK(rb.Finish("a", r.Sink(), r.OnGap()));
  CHECK(!rb.Finish("a", r.Sink(), r.OnGap()));
  CHECK(rb.Offer("c", 0, 7, 0, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Stats().sequences_now == 2);
}

TEST_CASE("a missing number is reported as exactly its range after the timeout") {
  ReorderBuffer<int> rb;  // gap_timeout 50 ms
  Recorder r;
  CHECK(rb.Offer("g", 0, 0, 1'000, r.Sink()) == ReorderResult::kReleased);
  CHECK(rb.Offer("g", 2, 2, 1'000, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("g", 3, 3, 5'000, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.NextGapDeadline() == 1'000 + 50 * kMs);
  CHECK(rb.ExpireGaps(1'000 + 50 * kMs - 1, r.Sink(), r.OnGap()) == 0);
  CHECK(r.gaps.empty());
  CHECK(rb.ExpireGaps(1'000 + 50 * kMs, r.Sink(), r.OnGap()) == 1);
  CHECK(r.gaps == std::vector<Gap>{{"g", 1, 2}});
  CHECK(r.out == std::vector<Out>{{"g", 0, 0}, {"g", 2, 2}, {"g", 3, 3}});
  CHECK(rb.NextGapDeadline() == std::nullopt);
  // The missing number arrives later: late, dropped, counted each time.
  CHECK(rb.Offer("g", 1, 1, 60 * kMs, r.Sink()) == ReorderResult::kLate);
  CHECK(rb.Offer("g", 1, 1, 61 * kMs, r.Sink()) == ReorderResult::kLate);
  CHECK(rb.Offer("g", 2, 2, 61 * kMs, r.Sink()) == ReorderResult::kDuplicate);
  CHECK(rb.Offer("g", 4, 4, 62 * kMs, r.Sink()) == ReorderResult::kReleased);
  const inferq::ReorderStats st = rb.Stats();
  CHECK(st.gaps == 1);
  CHECK(st.missing_numbers == 1);
  CHECK(st.late == 2);
  CHECK(st.duplicates == 1);
  CHECK(st.released == 4);
}

TEST_CASE("each gap waits from the first arrival behind it") {
  ReorderBuffer<int> rb({.gap_timeout_ns = 50 * kMs});
  Recorder r;
  // 0 and 1 missing; 2 comes at 0 ms. 3..4 missing; 5 comes at 40 ms.
  CHECK(rb.Offer("g", 2, 2, 0, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("g", 5, 5, 40 * kMs, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.ExpireGaps(50 * kMs, r.Sink(), r.OnGap()) == 1);
  CHECK(r.gaps == std::vector<Gap>{{"g", 0, 2}});
  CHECK(r.out == std::vector<Out>{{"g", 2, 2}});
  CHECK(rb.NextGapDeadline() == 90 * kMs);
  CHECK(rb.ExpireGaps(90 * kMs - 1, r.Sink(), r.OnGap()) == 0);
  CHECK(rb.ExpireGaps(90 * kMs, r.Sink(), r.OnGap()) == 1);
  CHECK(r.gaps == std::vector<Gap>{{"g", 0, 2}, {"g", 3, 5}});
  CHECK(r.out == std::vector<Out>{{"g", 2, 2}, {"g", 5, 5}});
  CHECK(rb.Stats().missing_numbers == 4);
  // Two gaps that both waited long enough go in one call, in order.
  CHECK(rb.Offer("h", 1, 1, 100 * kMs, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.Offer("h", 3, 3, 100 * kMs, r.Sink()) == ReorderResult::kBuffered);
  CHECK(rb.ExpireGaps(150 * kMs, r.Sink(), r.OnGap()) == 2);
  CHECK(r.gaps == std::vector<Gap>{{"g", 0, 2}, {"g", 3, 5}, {"h", 0, 1}, {"h", 2, 3}});
  CHECK(rb.Offer("h", 2, 2, 151 * kMs, r.Sink()) == ReorderResult::kLate);
  CHECK(rb.Offer("h", 0, 0, 151 * kMs, r.Sink()) == ReorderResult::kLate);
}

TEST_CASE("only the last max_remembered_gaps gaps make late arrivals") {
  ReorderBuffer<int> rb({.gap_timeout_ns = 1, .max_remembered_gaps_per_sequence = 2});
  Recorder r;
  for (std::int64_t n = 1; n <= 5; n += 2) {  // gaps at 0, 2, 4
    CHECK(rb.Offer("g", n, 0, n, r.Sink()) == ReorderResult::kBuffered);
    CHECK(rb.ExpireGaps(n + 1, r.Sink(), r.OnGap()) == 1);
  }
  CHECK(r.gaps == std::vector<Gap>{{"g", 0, 1}, {"g", 2, 3}, {"g", 4, 5}});
  CHECK(rb.Offer("g", 0, 0, 7, r.Sink()) == ReorderResult::kDuplicate);  // forgotten
  CHECK(rb.Offer("g", 2, 0, 7, r.Sink()) == ReorderResult::kLate);
  CHECK(rb.Offer("g", 4, 0, 7, r.Sink()) == ReorderResult::kLate);
  CHECK(rb.Offer("g", 5, 0, 7, r.Sink()) == ReorderResult::kDuplicate);
}

TEST_CASE("Finish releases what is held, reporting every hole and the missing tail") {
  ReorderBuffer<int> rb;
  Recorder r;
  rb.Offer("g", 0, 0, 0, r.Sink());
  rb.Offer("g", 3, 3, 0, r.Sink());
  rb.Offer("g", 4, 4, 0, r.Sink());
  rb.Offer("g", 7, 7, 0, r.Sink());
  CHECK(rb.Finish("g", r.Sink(), r.OnGap(), /*end_seq_no=*/10));
  CHECK(r.gaps == std::vector<Gap>{{"g", 1, 3}, {"g", 5, 7}, {"g", 8, 10}});
  CHECK(r.out == std::vector<Out>{{"g", 0, 0}, {"g", 3, 3}, {"g", 4, 4}, {"g", 7, 7}});
  inferq::ReorderStats st = rb.Stats();
  CHECK(st.gaps == 3);
  CHECK(st.missing_numbers == 6);
  CHECK(st.buffered_now == 0);
  CHECK(st.sequences_now == 0);
  CHECK(rb.NextGapDeadline() == std::nullopt);
  // Without end_seq_no (or with one already reached) no tail is reported.
  rb.Offer("h", 0, 0, 0, r.Sink());
  CHECK(rb.Finish("h", r.Sink(), r.OnGap(), 1));
  CHECK(r.gaps.size() == 3);
  // A finished seq_id opens anew at 0.
  CHECK(rb.Offer("g", 0, 0, 0, r.Sink()) == ReorderResult::kReleased);
}

TEST_CASE("move-only items") {
  ReorderBuffer<std::unique_ptr<int>> rb;
  std::vector<int> got;
  auto sink = [&](std::string_view, std::uint64_t, std::unique_ptr<int>&& p) { got.push_back(*p); };
  rb.Offer("m", 1, std::make_unique<int>(1), 0, sink);
  rb.Offer("m", 0, std::make_unique<int>(0), 0, sink);
  CHECK(got == std::vector<int>{0, 1});
}

namespace {

// One emitted token: generation, number, and a payload that identifies the copy.
struct Token {
  int gen = 0;
  std::uint64_t seq_no = 0;
  int payload = 0;
};

std::string GenId(int gen) { return "gen-" + std::to_string(gen); }

// Splits the tokens of `gens` generations of `tokens` each between two workers at
// random; each worker emits its share generation by generation in order, with a
// few extra copies: the same worker repeating a token, or the other worker
// emitting a copy too. Returns the two emission lists and the number of copies.
struct Plan {
  std::vector<Token> worker[2];
  std::uint64_t copies = 0;
};

Plan MakePlan(int gens, int tokens, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Plan p;
  for (int g = 0; g < gens; ++g) {
    for (int t = 0; t < tokens; ++t) {
      const int w = static_cast<int>(rng() % 2);
      const Token tok{g, static_cast<std::uint64_t>(t), g * 1000 + t};
      p.worker[w].push_back(tok);
      switch (rng() % 40) {
        case 0: p.worker[w].push_back(tok); ++p.copies; break;      // repeated
        case 1: p.worker[1 - w].push_back(tok); ++p.copies; break;  // both emit
        default: break;
      }
    }
  }
  return p;
}

struct Received {
  std::map<int, std::vector<std::pair<std::uint64_t, int>>> released;  // by generation
  std::uint64_t duplicates = 0;
  std::uint64_t other = 0;  // any result besides released, buffered, duplicate
  inferq::ReorderStats stats;
};

void CheckReceived(const Received& got, int gens, int tokens, std::uint64_t copies) {
  REQUIRE(got.released.size() == static_cast<std::size_t>(gens));
  for (const auto& [g, items] : got.released) {
    INFO("generation " << g);
    REQUIRE(items.size() == static_cast<std::size_t>(tokens));
    for (int t = 0; t < tokens; ++t) {
      REQUIRE(items[t].first == static_cast<std::uint64_t>(t));
      REQUIRE(items[t].second == g * 1000 + t);
    }
  }
  CHECK(got.duplicates == copies);
  CHECK(got.other == 0);
  CHECK(got.stats.duplicates == copies);
  CHECK(got.stats.released == static_cast<std::uint64_t>(gens) * tokens);
  CHECK(got.stats.buffered_now == 0);
  CHECK(got.stats.gaps == 0);
  CHECK(got.stats.late == 0);
}

}  // namespace

TEST_CASE("two post-processing workers, one receiver: every generation in order") {
  constexpr int kGens = 200;
  constexpr int kTokens = 100;
  for (std::uint64_t seed : {1, 2, 3}) {
    const Plan plan = MakePlan(kGens, kTokens, seed);
    REQUIRE(plan.copies > 0);
    inferq::MpmcRing<Token> ring(256);
    Received got;  // written by the receiver only, read after join
    std::thread receiver([&] {
      ReorderBuffer<int> rb;
      auto sink = [&](std::string_view id, std::uint64_t n, int&& v) {
        got.released[std::stoi(std::string(id.substr(4)))].emplace_back(n, v);
      };
      Token tok;
      while (ring.pop(tok)) {
        switch (rb.Offer(GenId(tok.gen), tok.seq_no, tok.payload, 0, sink)) {
          case ReorderResult::kReleased:
          case ReorderResult::kBuffered: break;
          case ReorderResult::kDuplicate: ++got.duplicates; break;
          default: ++got.other; break;
        }
      }
      got.stats = rb.Stats();
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < 2; ++w) {
      workers.emplace_back([&, w] {
        for (const Token& t : plan.worker[w]) {
          // Yield now and then so that the two workers interleave in varied ways.
          if (t.payload % 7 == w) std::this_thread::yield();
          ring.push(t);
        }
      });
    }
    for (auto& t : workers) t.join();
    ring.close();
    receiver.join();
    INFO("seed " << seed);
    CheckReceived(got, kGens, kTokens, plan.copies);
  }
}

// The same scenario with the interleaving drawn from a seed: a deterministic
// scheduler picks which worker emits next, so each seed is one reproducible
// interleaving (folly-style), and the same seed gives the same trace.
TEST_CASE("seed-driven interleavings of two workers") {
  constexpr int kGens = 50;
  constexpr int kTokens = 100;
  auto run = [&](std::uint64_t seed, std::vector<ReorderResult>* trace) {
    const Plan plan = MakePlan(kGens, kTokens, seed);
    std::mt19937_64 sched(seed ^ 0x5DEECE66DULL);
    std::size_t pos[2] = {0, 0};
    Received got;
    ReorderBuffer<int> rb;
    auto sink = [&](std::string_view id, std::uint64_t n, int&& v) {
      got.released[std::stoi(std::string(id.substr(4)))].emplace_back(n, v);
    };
    while (pos[0] < plan.worker[0].size() || pos[1] < plan.worker[1].size()) {
      int w = static_cast<int>(sched() % 2);
      if (pos[w] == plan.worker[w].size()) w = 1 - w;
      // A burst of 1..8 tokens from the chosen worker.
      for (int burst = 1 + static_cast<int>(sched() % 8); burst > 0 && pos[w] < plan.worker[w].size();
           --burst) {
        const Token& t = plan.worker[w][pos[w]++];
        const ReorderResult res = rb.Offer(GenId(t.gen), t.seq_no, t.payload, 0, sink);
        trace->push_back(res);
        if (res == ReorderResult::kDuplicate) ++got.duplicates;
        else if (res != ReorderResult::kReleased && res != ReorderResult::kBuffered) ++got.other;
      }
    }
    got.stats = rb.Stats();
    INFO("seed " << seed);
    CheckReceived(got, kGens, kTokens, plan.copies);
  };
  for (std::uint64_t seed = 100; seed < 110; ++seed) {
    std::vector<ReorderResult> first, second;
    run(seed, &first);
    run(seed, &second);
    CHECK(first == second);
    // The interleaving actually reordered something.
    CHECK(std::count(first.begin(), first.end(), ReorderResult::kBuffered) > 100);
  }
}
