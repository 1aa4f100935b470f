#include "inferq/routing/subject_index.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/routing/subject.hpp"

using inferq::SubjectIndex;
using inferq::SubjectIndexOptions;
using inferq::SubjectPattern;

namespace {

using Values = std::vector<int>;

Values MatchOf(const SubjectIndex<int>& index, std::string_view subject) {
  Values out;
  const std::size_t n = index.Match(subject, &out);
  if (n != out.size()) out.push_back(-1000000);  // the return value must count them
  return out;
}

// Builds an index from (pattern, value) pairs, failing the test on any error.
SubjectIndex<int> Build(const std::vector<std::pair<std::string, int>>& subs,
                        SubjectIndexOptions options = {}) {
  SubjectIndex<int> index(options);
  for (const auto& [pattern, value] : subs) {
    INFO("insert '" << pattern << "' " << value);
    REQUIRE(index.Insert(pattern, value).ok());
  }
  return index;
}

SubjectIndexOptions NoCache() { return SubjectIndexOptions{.cache_entries = 0}; }

}  // namespace

TEST_CASE("a literal pattern matches exactly its own subject") {
  for (const SubjectIndexOptions& options : {SubjectIndexOptions{}, NoCache()}) {
    INFO("cache_entries " << options.cache_entries);
    const SubjectIndex<int> index =
        Build({{"infer.llama.request", 1}, {"infer.llama", 2}}, options);
    CHECK(MatchOf(index, "infer.llama.request") == Values{1});
    CHECK(MatchOf(index, "infer.llama") == Values{2});
    CHECK(MatchOf(index, "infer").empty());
    CHECK(MatchOf(index, "infer.llama.request.x").empty());
    CHECK(MatchOf(index, "infer.llama.reply").empty());
    CHECK(MatchOf(index, "infer.llamas.request").empty());
    CHECK(MatchOf(index, "infer.llam.request").empty());
  }
}

TEST_CASE("empty tokens and white space in a subject match nothing, even under '>'") {
  const SubjectIndex<int> index = Build({{">", 1}, {"*", 2}, {"a.>", 3}, {"*.*", 4},
                                         {"a.b", 5}});
  CHECK(MatchOf(index, "a.b") == Values{1, 3, 4, 5});  // the control
  for (const char* subject : {"", ".", "..", "a..b", ".a", "a.", ".a.b", "a.b.", "a. b",
                              "a b", "a\tb", "a.b\n", "\ra", "a.\vb", "a\f", " "}) {
    INFO("subject '" << subject << "'");
    CHECK(MatchOf(index, subject).empty());
  }
}

TEST_CASE("'>' matches one or more trailing tokens, never zero") {
  const SubjectIndex<int> index = Build({{"a.>", 1}, {"a.b.>", 2}, {">", 3}});
  CHECK(MatchOf(index, "a") == Values{3});
  CHECK(MatchOf(index, "a.b") == Values{1, 3});
  CHECK(MatchOf(index, "a.b.c") == Values{1, 2, 3});
  CHECK(MatchOf(index, "a.b.c.d.e.f") == Values{1, 2, 3});
  CHECK(MatchOf(index, "b.a") == Values{3});
}

TEST_CASE("'*' matches exactly one token, at any position") {
  const SubjectIndex<int> index = Build({{"*", 1}, {"a.*", 2}, {"*.b", 3}, {"*.*.c", 4},
                                         {"a.*.>", 5}});
  CHECK(MatchOf(index, "a") == Values{1});
  CHECK(MatchOf(index, "a.b") == Values{2, 3});
  CHECK(MatchOf(index, "x.b") == Values{3});
  CHECK(MatchOf(index, "a.b.c") == Values{4, 5});
  CHECK(MatchOf(index, "a.b.d") == Values{5});
  CHECK(MatchOf(index, "x.y.z.w").empty());
}

TEST_CASE("'*' or '>' inside a longer token is a literal character") {
  const SubjectIndex<int> index = Build({{"a*", 1}, {"x.b>", 2}, {"*x.>y", 3}});
  CHECK(MatchOf(index, "a*") == Values{1});
  CHECK(MatchOf(index, "a").empty());
  CHECK(MatchOf(index, "ab").empty());
  CHECK(MatchOf(index, "a**").empty());
  CHECK(MatchOf(index, "x.b>") == Values{2});
  CHECK(MatchOf(index, "x.b").empty());
  CHECK(MatchOf(index, "x.b.c").empty());
  CHECK(MatchOf(index, "*x.>y") == Values{3});
  CHECK(MatchOf(index, "ax.>y").empty());
  CHECK(MatchOf(index, "*x.y").empty());
}

TEST_CASE("a subject with a wildcard token matches nothing") {
  const SubjectIndex<int> index = Build({{">", 1}, {"a.*", 2}, {"a.>", 3}, {"*", 4}});
  for (const char* subject : {"*", ">", "a.*", "a.>", "*.b", ">.b", "a.*.c"}) {
    INFO("subject '" << subject << "'");
    CHECK(MatchOf(index, subject).empty());
  }
  CHECK(MatchOf(index, "a.c") == Values{1, 2, 3});  // the control
}

TEST_CASE("each value comes once, in the order values were first inserted") {
  SubjectIndex<int> index = Build({{"a.>", 30}, {"a.b", 10}, {"*.b", 20}, {"a.b", 30},
                                   {">", 10}, {"a.*", 40}, {"*.*", 30}});
  CHECK(MatchOf(index, "a.b") == Values{30, 10, 20, 40});
  CHECK(MatchOf(index, "x.b") == Values{30, 10, 20});
  CHECK(index.size() == 7);
  CHECK(index.Stats().values == 4);

  SECTION("a value keeps its place while it has a pattern") {
    REQUIRE(index.Remove("a.>", 30).ok());
    REQUIRE(index.Remove("a.b", 30).ok());
    CHECK(MatchOf(index, "a.b") == Values{30, 10, 20, 40});  // still there by "*.*"
  }
  SECTION("a value removed from all its patterns and inserted again goes last") {
    for (const char* p : {"a.>", "a.b", "*.*"}) REQUIRE(index.Remove(p, 30).ok());
    CHECK(MatchOf(index, "a.b") == Values{10, 20, 40});
    REQUIRE(index.Insert("a.b", 30).ok());
    CHECK(MatchOf(index, "a.b") == Values{10, 20, 40, 30});
  }
}

TEST_CASE("Match appends to what the output holds and returns the count appended") {
  const SubjectIndex<int> index = Build({{"a", 1}, {"*", 2}});
  std::vector<int> out = {7, 8};
  CHECK(index.Match("a", &out) == 2);
  CHECK(index.Match("a", &out) == 2);  // from the cache
  CHECK(index.Match("a..", &out) == 0);
  CHECK(out == std::vector<int>{7, 8, 1, 2, 1, 2});
  absl::InlinedVector<int, 4> inlined = {5};
  CHECK(index.Match("b", &inlined) == 1);
  CHECK(index.Match("a", &inlined) == 2);
  CHECK(inlined == absl::InlinedVector<int, 4>{5, 2, 1, 2});
}

TEST_CASE("Insert and Remove errors name the pattern and the value") {
  SubjectIndex<int> index;
  REQUIRE(index.Insert("a.*", 7).ok());

  absl::Status s = index.Insert("a.*", 7);
  CHECK(s.code() == absl::StatusCode::kAlreadyExists);
  CHECK(std::string(s.message()) == "subject pattern 'a.*' already has value 7");

  s = index.Insert("a..b", 7);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) == "subject pattern 'a..b' has an empty token at position 2");
  s = index.Insert("a.>.b", 7);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "subject pattern 'a.>.b' has '>' at position 2; '>' is valid only as the last token");
  s = index.Insert("", 7);
  CHECK(std::string(s.message()) == "subject pattern '' is empty");

  s = index.Remove("a.*", 8);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(s.message()) == "subject pattern 'a.*' has no value 8");
  s = index.Remove("a.b", 7);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(s.message()) == "subject pattern 'a.b' has no value 7");
  s = index.Remove("a.>", 7);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  s = index.Remove("a", 7);  // a prefix of the stored pattern
  CHECK(s.code() == absl::StatusCode::kNotFound);
  s = index.Remove("a b", 7);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "subject pattern 'a b' contains white space at position 1 (byte 1)");

  // Failed calls change nothing.
  CHECK(index.size() == 1);
  CHECK(index.generation() == 2);
  CHECK(MatchOf(index, "a.x") == Values{7});

  SECTION("pointer values are printed in hex") {
    SubjectIndex<const int*> pointers;
    const int x = 0;
    REQUIRE(pointers.Insert("p", &x).ok());
    char expected[64];
    std::snprintf(expected, sizeof expected, "subject pattern 'p' already has value 0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(&x)));
    CHECK(std::string(pointers.Insert("p", &x).message()) == expected);
  }
  SECTION("string values are quoted") {
    SubjectIndex<std::string> strings;
    REQUIRE(strings.Insert("p", "it's").ok());
    CHECK(std::string(strings.Remove("q", "it's").message()) ==
          "subject pattern 'q' has no value 'it\\x27s'");
  }
}

TEST_CASE("Remove then Match: the value is gone and empty branches are pruned") {
  for (const SubjectIndexOptions& options : {SubjectIndexOptions{}, NoCache()}) {
    INFO("cache_entries " << options.cache_entries);
    SubjectIndex<int> index(options);
    CHECK(index.Stats().nodes == 1);
    REQUIRE(index.Insert("a.b.c", 1).ok());
    REQUIRE(index.Insert("a.*.c", 2).ok());
    REQUIRE(index.Insert("a.b.>", 3).ok());
    REQUIRE(index.Insert("a.b.c", 4).ok());
    // root, a, a.b, a.b.c, a.*, a.*.c
    CHECK(index.Stats().nodes == 6);
    CHECK(MatchOf(index, "a.b.c") == Values{1, 2, 3, 4});

    REQUIRE(index.Remove("a.b.c", 1).ok());
    CHECK(MatchOf(index, "a.b.c") == Values{2, 3, 4});
    CHECK(index.Stats().nodes == 6);  // a.b.c still holds 4
    REQUIRE(index.Remove("a.b.c", 4).ok());
    CHECK(MatchOf(index, "a.b.c") == Values{2, 3});
    CHECK(index.Stats().nodes == 5);
    REQUIRE(index.Remove("a.*.c", 2).ok());
    CHECK(MatchOf(index, "a.b.c") == Values{3});
    CHECK(index.Stats().nodes == 3);
    REQUIRE(index.Remove("a.b.>", 3).ok());
    CHECK(MatchOf(index, "a.b.c").empty());
    const inferq::SubjectIndexStats stats = index.Stats();
    CHECK(stats.nodes == 1);
    CHECK(stats.subscriptions == 0);
    CHECK(stats.values == 0);
    CHECK(index.size() == 0);
    CHECK(index.Remove("a.b.>", 3).code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("an insert or remove after a cached match changes the answer") {
  SubjectIndex<int> index;
  REQUIRE(index.Insert("a.*", 1).ok());
  CHECK(index.generation() == 2);
  CHECK(MatchOf(index, "a.b") == Values{1});
  CHECK(MatchOf(index, "a.b") == Values{1});
  CHECK(index.Stats().cache_hits == 1);
  CHECK(index.Stats().cache_entries == 1);

  REQUIRE(index.Insert("a.b", 2).ok());
  CHECK(index.generation() == 3);
  CHECK(index.Stats().cache_entries == 0);  // the old entry is of generation 2
  CHECK(MatchOf(index, "a.b") == Values{1, 2});
  CHECK(MatchOf(index, "a.b") == Values{1, 2});

  REQUIRE(index.Remove("a.*", 1).ok());
  CHECK(index.generation() == 4);
  CHECK(MatchOf(index, "a.b") == Values{2});

  const inferq::SubjectIndexStats stats = index.Stats();
  CHECK(stats.cache_hits == 2);
  CHECK(stats.cache_misses == 3);
  CHECK(stats.cache_entries == 1);
  CHECK(stats.generation == 4);
}

TEST_CASE("the cache counts hits and misses and holds at most cache_entries subjects") {
  SubjectIndex<int> index(SubjectIndexOptions{.cache_entries = 8});
  REQUIRE(index.Insert(">", 1).ok());
  CHECK(index.Stats().cache_capacity == 8);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 100; ++i) {
      CHECK(MatchOf(index, "s." + std::to_string(i)) == Values{1});
    }
  }
  const inferq::SubjectIndexStats stats = index.Stats();
  CHECK(stats.cache_hits + stats.cache_misses == 300);
  CHECK(stats.cache_misses >= 300 - 8 * 3);
  CHECK(stats.cache_entries == 8);  // full, never beyond

  SECTION("the same subject twice is a hit") {
    CHECK(MatchOf(index, "hot") == Values{1});
    CHECK(MatchOf(index, "hot") == Values{1});
    CHECK(index.Stats().cache_hits == stats.cache_hits + 1);
  }
}

TEST_CASE("cache capacity is rounded down to sets of up to eight ways") {
  const std::pair<std::size_t, std::uint64_t> cases[] = {
      {0, 0},   {1, 1},   {3, 3},       {5, 5},       {8, 8},       {9, 8},
      {16, 16}, {23, 16}, {4096, 4096}, {5000, 4096}, {4095, 2048}, {1u << 20, 1u << 20}};
  for (const auto& [requested, capacity] : cases) {
    INFO("cache_entries " << requested);
    SubjectIndex<int> index(SubjectIndexOptions{.cache_entries = requested});
    CHECK(index.Stats().cache_capacity == capacity);
  }
  CHECK_THROWS_AS(SubjectIndex<int>(SubjectIndexOptions{.cache_entries = (1u << 20) + 1}),
                  std::invalid_argument);
}

TEST_CASE("results over cache_max_values and subjects over cache_max_subject_bytes are "
          "not cached") {
  SubjectIndex<int> index(SubjectIndexOptions{.cache_max_values = 2,
                                              .cache_max_subject_bytes = 5});
  REQUIRE(index.Insert("a.>", 1).ok());
  REQUIRE(index.Insert("a.b", 2).ok());
  REQUIRE(index.Insert("*.b", 3).ok());
  for (int i = 0; i < 2; ++i) CHECK(MatchOf(index, "a.b") == Values{1, 2, 3});
  CHECK(index.Stats().cache_entries == 0);
  for (int i = 0; i < 2; ++i) CHECK(MatchOf(index, "a.bbb") == Values{1});  // 5 bytes
  for (int i = 0; i < 2; ++i) CHECK(MatchOf(index, "a.bbbb") == Values{1});  // 6 bytes
  const inferq::SubjectIndexStats stats = index.Stats();
  CHECK(stats.cache_entries == 1);
  CHECK(stats.cache_hits == 1);
  CHECK(stats.cache_misses == 5);
}

TEST_CASE("Stats count subscriptions, nodes and a plausible memory estimate") {
  SubjectIndex<int> index;
  const inferq::SubjectIndexStats empty = index.Stats();
  for (int m = 0; m < 10; ++m) {
    for (int t = 0; t < 100; ++t) {
      REQUIRE(index.Insert("infer.m" + std::to_string(m) + ".t" + std::to_string(t) +
                               ".request",
                           m * 100 + t)
                  .ok());
    }
  }
  const inferq::SubjectIndexStats stats = index.Stats();
  CHECK(stats.subscriptions == 1000);
  CHECK(stats.values == 1000);
  // root, infer, 10 models, 1000 tenants, 1000 "request" leaves
  CHECK(stats.nodes == 1 + 1 + 10 + 1000 + 1000);
  // At least the 16-byte nodes and 12-byte edges; at most a few hundred bytes each.
  CHECK(stats.memory_bytes - empty.memory_bytes >= 2012 * (16 + 12));
  CHECK(stats.memory_bytes - empty.memory_bytes <= 2012 * 400);
}

TEST_CASE("tokens of every length from 1 to 40 bytes are told apart by each byte") {
  // Interned tokens of up to 16 bytes are compared as two machine words, longer ones
  // by hash and text: a token differing from another in any one byte must not match.
  SubjectIndex<int> index(NoCache());
  std::vector<std::pair<std::string, int>> tokens;
  for (int len = 1; len <= 40; ++len) {
    const std::string base(static_cast<std::size_t>(len), 'a');
    tokens.emplace_back(base, len * 1000);
    for (int pos = 0; pos < len; ++pos) {
      std::string variant = base;
      variant[static_cast<std::size_t>(pos)] = 'b';
      tokens.emplace_back(variant, len * 1000 + pos + 1);
    }
  }
  // Half of them inserted (as the middle token of a pattern); the other half must
  // match nothing.
  for (std::size_t i = 0; i < tokens.size(); i += 2) {
    REQUIRE(index.Insert("t." + tokens[i].first + ".u", tokens[i].second).ok());
  }
  int wrong = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const Values want = i % 2 == 0 ? Values{tokens[i].second} : Values{};
    if (MatchOf(index, "t." + tokens[i].first + ".u") != want) {
      ++wrong;
      UNSCOPED_INFO("token '" << tokens[i].first << "'");
    }
  }
  CHECK(wrong == 0);
  for (std::size_t i = 0; i < tokens.size(); i += 2) {
    REQUIRE(index.Remove("t." + tokens[i].first + ".u", tokens[i].second).ok());
  }
  CHECK(index.Stats().nodes == 1);
}

TEST_CASE("tens of thousands of inserts and removes in random order keep exact results") {
  // Grows the node table through many doublings and removes from it in random order,
  // so entries are shifted back across runs and across the end of the table.
  constexpr int kA = 150;
  constexpr int kB = 100;
  std::vector<std::pair<std::string, int>> subs;
  for (int a = 0; a < kA; ++a) {
    for (int b = 0; b < kB; ++b) {
      subs.emplace_back("x" + std::to_string(a) + ".y" + std::to_string(b), a * kB + b);
    }
  }
  std::mt19937 rng(7);
  std::shuffle(subs.begin(), subs.end(), rng);
  SubjectIndex<int> index(NoCache());
  for (const auto& [pattern, value] : subs) REQUIRE(index.Insert(pattern, value).ok());
  CHECK(index.Stats().nodes == 1 + kA + kA * kB);
  std::shuffle(subs.begin(), subs.end(), rng);
  const std::size_t half = subs.size() / 2;
  for (std::size_t i = 0; i < half; ++i) {
    REQUIRE(index.Remove(subs[i].first, subs[i].second).ok());
  }
  int wrong = 0;
  for (std::size_t i = 0; i < subs.size(); ++i) {
    const Values want = i < half ? Values{} : Values{subs[i].second};
    wrong += MatchOf(index, subs[i].first) != want;
  }
  CHECK(wrong == 0);
  CHECK(index.size() == subs.size() - half);
  for (std::size_t i = half; i < subs.size(); ++i) {
    REQUIRE(index.Remove(subs[i].first, subs[i].second).ok());
  }
  CHECK(index.Stats().nodes == 1);
  CHECK(MatchOf(index, "x1.y1").empty());
}

// ---- randomized differential test -------------------------------------------------

namespace {

// The reference: every (pattern, value) pair, matched one by one with SubjectPattern.
class Reference {
 public:
  bool Insert(const std::string& pattern, int value) {
    auto p = SubjectPattern::Parse(pattern);
    if (!p.ok()) return false;
    for (const auto& s : subs_) {
      if (s.first.text() == pattern && s.second == value) return false;
    }
    subs_.emplace_back(*std::move(p), value);
    if (patterns_of_[value]++ == 0) order_.push_back(value);
    return true;
  }
  bool Remove(const std::string& pattern, int value) {
    for (auto it = subs_.begin(); it != subs_.end(); ++it) {
      if (it->first.text() == pattern && it->second == value) {
        subs_.erase(it);
        if (--patterns_of_[value] == 0) order_.erase(std::find(order_.begin(), order_.end(), value));
        return true;
      }
    }
    return false;
  }
  Values Match(std::string_view subject) const {
    std::map<int, bool> matched;
    for (const auto& [p, value] : subs_) {
      if (p.Matches(subject)) matched[value] = true;
    }
    Values out;
    for (const int v : order_) {
      if (matched.count(v) != 0) out.push_back(v);
    }
    return out;
  }
  std::size_t size() const { return subs_.size(); }
  const std::vector<std::pair<SubjectPattern, int>>& subs() const { return subs_; }

 private:
  std::vector<std::pair<SubjectPattern, int>> subs_;
  std::map<int, int> patterns_of_;
  Values order_;  // values with a pattern, by first insertion
};

// Tokens of a small alphabet so that wildcards hit often; "a*" and ">b" are literal.
constexpr const char* kLiteralTokens[] = {"a", "b", "c", "a*", ">b"};

std::string RandomPattern(std::mt19937& rng) {
  const int n = std::uniform_int_distribution<int>(1, 4)(rng);
  std::string p;
  for (int i = 0; i < n; ++i) {
    if (i > 0) p += '.';
    const int r = std::uniform_int_distribution<int>(0, 9)(rng);
    if (r < 2) {
      p += '*';
    } else if (r == 2 && i == n - 1) {
      p += '>';
    } else {
      p += kLiteralTokens[std::uniform_int_distribution<int>(0, 4)(rng)];
    }
  }
  if (std::uniform_int_distribution<int>(0, 49)(rng) == 0) p += ".>.x";  // invalid
  return p;
}

std::string RandomSubject(std::mt19937& rng) {
  static constexpr const char* kInvalid[] = {"a..b", ".a", "a.", "*", "a.>", "a.*.b",
                                             "a b", "", "b.\t"};
  if (std::uniform_int_distribution<int>(0, 19)(rng) == 0) {
    return kInvalid[std::uniform_int_distribution<int>(0, 8)(rng)];
  }
  const int n = std::uniform_int_distribution<int>(1, 5)(rng);
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += '.';
    s += kLiteralTokens[std::uniform_int_distribution<int>(0, 4)(rng)];
  }
  return s;
}

}  // namespace

TEST_CASE("randomized: Match equals matching every pattern one by one") {
  struct Config {
    const char* name;
    SubjectIndexOptions options;
  };
  const Config configs[] = {
      {"default cache", SubjectIndexOptions{}},
      {"tiny cache (evicts)", SubjectIndexOptions{.cache_entries = 16}},
      {"no cache", NoCache()},
  };
  for (const Config& config : configs) {
    for (const std::uint32_t seed : {1u, 2u, 3u}) {
      INFO(config.name << ", seed " << seed);
      std::mt19937 rng(seed);
      SubjectIndex<int> index(config.options);
      Reference ref;
      int mismatches = 0;
      int nonempty = 0;
      int removed = 0;
      constexpr int kOps = 4000;
      for (int op = 1; op <= kOps; ++op) {
        // Insert two of three times; remove an existing pair or a random one.
        if (std::uniform_int_distribution<int>(0, 2)(rng) != 0 || ref.size() == 0) {
          const std::string p = RandomPattern(rng);
          const int v = std::uniform_int_distribution<int>(0, 99)(rng);
          const bool expected = ref.Insert(p, v);
          const absl::Status s = index.Insert(p, v);
          if (s.ok() != expected) {
            FAIL_CHECK("insert '" << p << "' " << v << ": " << s);
          }
        } else if (std::uniform_int_distribution<int>(0, 3)(rng) != 0) {
          const auto& pick = ref.subs()[std::uniform_int_distribution<std::size_t>(
              0, ref.size() - 1)(rng)];
          const std::string p = pick.first.text();
          const int v = pick.second;
          REQUIRE(ref.Remove(p, v));
          const absl::Status s = index.Remove(p, v);
          if (!s.ok()) FAIL_CHECK("remove '" << p << "' " << v << ": " << s);
          ++removed;
        } else {
          const std::string p = RandomPattern(rng);
          const int v = std::uniform_int_distribution<int>(0, 99)(rng);
          const bool expected = ref.Remove(p, v);
          removed += expected;
          if (index.Remove(p, v).ok() != expected) {
            FAIL_CHECK("remove of a random pair '" << p << "' " << v);
          }
        }
        if (op % 400 != 0) continue;
        // A checkpoint: 300 fresh subjects, each matched twice (the second time from
        // the cache when there is one).
        REQUIRE(index.size() == ref.size());
        for (int i = 0; i < 300; ++i) {
          const std::string subject = RandomSubject(rng);
          const Values want = ref.Match(subject);
          nonempty += !want.empty();
          for (int pass = 0; pass < 2; ++pass) {
            const Values got = MatchOf(index, subject);
            if (got != want && ++mismatches <= 5) {
              FAIL_CHECK("subject '" << subject << "' after op " << op << ": got "
                                     << Catch::Detail::stringify(got) << ", want "
                                     << Catch::Detail::stringify(want));
            }
          }
        }
      }
      CHECK(mismatches == 0);
      CHECK(removed > 500);
      CHECK(nonempty > 1500);  // of 3000: the alphabet makes most subjects match
      if (config.options.cache_entries > 0) CHECK(index.Stats().cache_hits > 0);
      // Removing everything leaves the bare root.
      while (ref.size() > 0) {
        const std::string p = ref.subs().back().first.text();
        const int v = ref.subs().back().second;
        REQUIRE(ref.Remove(p, v));
        REQUIRE(index.Remove(p, v).ok());
      }
      CHECK(index.Stats().nodes == 1);
      CHECK(index.Stats().values == 0);
      CHECK(MatchOf(index, "a.b").empty());
    }
  }
}

TEST_CASE("cache on and cache off give the same results, call after call") {
  std::mt19937 rng(11);
  SubjectIndex<int> cached(SubjectIndexOptions{.cache_entries = 64});
  SubjectIndex<int> uncached(NoCache());
  int compared = 0;
  int different = 0;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 50; ++i) {
      const std::string p = RandomPattern(rng);
      const int v = std::uniform_int_distribution<int>(0, 49)(rng);
      const bool remove = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
      const absl::Status a = remove ? cached.Remove(p, v) : cached.Insert(p, v);
      const absl::Status b = remove ? uncached.Remove(p, v) : uncached.Insert(p, v);
      REQUIRE(a == b);
    }
    std::vector<std::string> subjects;
    for (int i = 0; i < 100; ++i) subjects.push_back(RandomSubject(rng));
    for (int pass = 0; pass < 3; ++pass) {  // later passes are mostly cache hits
      for (const std::string& subject : subjects) {
        ++compared;
        different += MatchOf(cached, subject) != MatchOf(uncached, subject);
      }
    }
  }
  CHECK(compared == 6000);
  CHECK(different == 0);
  CHECK(cached.Stats().cache_hits > 1000);
  CHECK(cached.generation() == uncached.generation());
}

// ---- concurrency ------------------------------------------------------------------

TEST_CASE("concurrent Match calls return exact results while the cache evicts") {
  std::vector<std::pair<std::string, int>> subs;
  for (int m = 0; m < 8; ++m) {
    for (int t = 0; t < 32; ++t) {
      subs.emplace_back("infer.m" + std::to_string(m) + ".t" + std::to_string(t) + ".request",
                        m * 100 + t);
    }
    subs.emplace_back("infer.m" + std::to_string(m) + ".>", 10000 + m);
  }
  subs.emplace_back("infer.*.t3.request", 20000);
  subs.emplace_back(">", 30000);

  std::vector<std::string> subjects;
  for (int m = 0; m < 9; ++m) {  // m8 has no literal or model subscription
    for (int t = 0; t < 33; ++t) {
      subjects.push_back("infer.m" + std::to_string(m) + ".t" + std::to_string(t) + ".request");
    }
  }
  subjects.push_back("infer..bad");
  const SubjectIndex<int> reference = Build(subs, NoCache());
  std::vector<Values> expected;
  for (const std::string& s : subjects) expected.push_back(MatchOf(reference, s));
  CHECK(expected[3] == Values{3, 10000, 20000, 30000});  // infer.m0.t3.request

  for (const std::size_t cache_entries : {std::size_t{4}, std::size_t{64}, std::size_t{4096}}) {
    INFO("cache_entries " << cache_entries);
    const SubjectIndex<int> index = Build(subs, SubjectIndexOptions{.cache_entries = cache_entries});
    constexpr int kThreads = 4;
    constexpr int kRounds = 20;
    std::atomic<int> failures{0};
    std::atomic<int> calls{0};
    std::vector<std::thread> threads;
    for (int id = 0; id < kThreads; ++id) {
      threads.emplace_back([&, id] {
        std::mt19937 rng(static_cast<std::uint32_t>(id + 1));
        Values out;
        int local_calls = 0;
        for (int round = 0; round < kRounds; ++round) {
          for (std::size_t k = 0; k < subjects.size(); ++k) {
            // Half the calls on one hot subject shared by every thread, half spread.
            const std::size_t i = (k % 2 == 0)
                                      ? 3
                                      : std::uniform_int_distribution<std::size_t>(
                                            0, subjects.size() - 1)(rng);
            out.clear();
            const std::size_t n = index.Match(subjects[i], &out);
            ++local_calls;
            if (n != out.size() || out != expected[i]) failures.fetch_add(1);
          }
        }
        calls.fetch_add(local_calls);
      });
    }
    for (std::thread& t : threads) t.join();
    REQUIRE(failures.load() == 0);
    const inferq::SubjectIndexStats stats = index.Stats();
    CHECK(stats.cache_hits + stats.cache_misses == static_cast<std::uint64_t>(calls.load()));
    CHECK(stats.cache_hits > 0);
    CHECK(stats.cache_entries <= cache_entries);
  }
}
