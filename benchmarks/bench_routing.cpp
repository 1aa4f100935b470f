// bench_routing: SubjectIndex<V> matching, in one binary and one run.
//
//   BM_Match/<set>/<subs>/<mode>   time per iteration = one Match of a 4-token subject
//                                  "infer.<model>.<tenant>.request"; items_per_second =
//                                  Match calls.
//     set   literal   every subscription is "infer.<model>.<tenant>.request", one
//                     per (model, tenant): each subject matches exactly one value;
//           wildcard  the same count of subscriptions, mixed by a hash of their number:
//                     70% literal as above, 15% "infer.<model>.<tenant>.*", 14%
//                     "infer.<model>.<tenant>.>", 1% "infer.*.<tenant>.request", plus
//                     "infer.<model>.>" for every model and "infer.>" (counted in
//                     subs): values_per_match says how many values a subject matches.
//     subs  10, 10000 or 1000000 subscriptions; 100 models (10 when subs = 10) and
//           subs / models tenants.
//     mode  hit   default cache (4096 subjects); 1024 random subjects, matched once
//                 before timing, so every timed call hits (hit_ratio says so).
//           miss  cache off (cache_entries = 0): every call walks the trie. Subjects
//                 cycle over 65,536 random (model, tenant) pairs (all 10 when subs = 10),
//                 so at 10^6 subscriptions most of the trie they touch is not in the
//                 CPU caches: this is the cold cost, bound by memory latency.
//           miss_hot  cache off, the 1024 subjects of `hit`: the trie walk with the
//                 nodes it touches in the CPU caches; against `hit`, what the cache saves.
//           fill  default cache, subjects cycling over 65,536 random pairs (16x the
//                 cache): a miss plus storing the result and evicting an entry, the cost
//                 of a miss with the cache on. Only for 10000 and 1000000 subs; with
//                 10000 there are only 10,000 distinct subjects, so about 40% still hit.
//   BM_Insert/<set>/<subs>         building the index of `set` with `subs` subscriptions
//                                  (cache off); items_per_second = Insert calls: the
//                                  cost of rebuilding an index to swap in (formatting
//                                  the pattern strings is timed too).
//   Counters: bytes_per_sub = SubjectIndex::Stats().memory_bytes / subs (the index's own
//   estimate; at 10 subscriptions it is mostly fixed costs such as the cache's sets);
//   rss_bytes_per_sub = growth of the process's resident set while the index was
//   built / subs (allocator overhead included; meaningful at 10^6 only, smaller
//   indexes reuse memory the previous one freed); hit_ratio over the timed calls;
//   values_per_match = values appended per call.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "inferq/routing/selection.hpp"
#include "inferq/routing/subject_index.hpp"

namespace {

using Value = std::uint64_t;  // the size of a Consumer*
using Index = inferq::SubjectIndex<Value>;

enum class Set { kLiteral, kWildcard };
enum class Mode { kHit, kMiss, kMissHot, kFill };

std::size_t ModelsFor(std::size_t subs) { return subs < 100 ? subs : 100; }

std::string Model(std::size_t m) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "model-%03zu", m);
  return buf;
}
std::string Tenant(std::size_t t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "tenant-%06zu", t);
  return buf;
}
std::string Subject(std::size_t m, std::size_t t) {
  return "infer." + Model(m) + "." + Tenant(t) + ".request";
}

std::size_t ResidentBytes() {
  long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0;
    if (std::fscanf(f, "%ld %ld", &size, &pages) != 2) pages = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

struct Built {
  std::unique_ptr<Index> index;
  std::size_t rss_growth = 0;
};

Built Build(Set set, std::size_t subs, bool cache) {
  const std::size_t models = ModelsFor(subs);
  const std::size_t before = ResidentBytes();
  Built b;
  b.index = std::make_unique<Index>(
      inferq::SubjectIndexOptions{.cache_entries = cache ? std::size_t{4096} : 0});
  auto insert = [&](const std::string& pattern, Value v) {
    if (absl::Status s = b.index->Insert(pattern, v); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      std::abort();
    }
  };
  std::size_t extra = 0;
  if (set == Set::kWildcard) {
    insert("infer.>", 0);
    for (std::size_t m = 0; m < models && extra + 1 < subs; ++m, ++extra) {
      insert("infer." + Model(m) + ".>", 1 + m);
    }
    ++extra;
  }
  for (std::size_t i = 0; i + extra < subs; ++i) {
    const std::size_t m = i % models;
    const std::size_t t = i / models;
    const Value v = 1000 + i;
    if (set == Set::kLiteral) {
      insert(Subject(m, t), v);
      continue;
    }
    const std::uint64_t kind = ((i + 1) * 0x9E3779B97F4A7C15ull >> 40) % 100;
    const std::string prefix = "infer." + Model(m) + "." + Tenant(t);
    if (kind < 70) {
      insert(prefix + ".request", v);
    } else if (kind < 85) {
      insert(prefix + ".*", v);
    } else if (kind < 99) {
      insert(prefix + ".>", v);
    } else {
      insert("infer.*." + Tenant(t) + ".request", v);
    }
  }
  const std::size_t after = ResidentBytes();
  b.rss_growth = after > before ? after - before : 0;
  return b;
}

// One index alive at a time: benchmarks are registered grouped by index.
struct Key {
  Set set;
  std::size_t subs;
  bool cache;
  bool operator==(const Key&) const = default;
};
Key current_key{Set::kLiteral, 0, false};
Built current_index;

Built& IndexFor(Key key) {
  if (!(current_key == key) || !current_index.index) {
    current_index = Built{};
    current_index = Build(key.set, key.subs, key.cache);
    current_key = key;
  }
  return current_index;
}

std::vector<std::string> Subjects(std::size_t subs, std::size_t count, std::uint32_t seed) {
  const std::size_t models = ModelsFor(subs);
  const std::size_t tenants = subs / models;
  std::vector<std::string> out;
  if (subs == 10) {  // the whole space: 10 subjects
    for (std::size_t m = 0; m < models; ++m) out.push_back(Subject(m, 0));
    return out;
  }
  std::mt19937_64 rng(seed);
  for (std::size_t i = 0; i < count; ++i) {
    out.push_back(Subject(rng() % models, rng() % tenants));
  }
  return out;
}

void BM_Match(benchmark::State& state, Set set, std::size_t subs, Mode mode) {
  const bool cache = mode == Mode::kHit || mode == Mode::kFill;
  Built& built = IndexFor(Key{set, subs, cache});
  const Index& index = *built.index;
  const bool hot = mode == Mode::kHit || mode == Mode::kMissHot;
  const std::vector<std::string> subjects = Subjects(subs, hot ? 1024 : 65536, 42);
  std::vector<Value> out;
  out.reserve(1024);
  if (hot) {  // the cache, or the CPU caches, see each subject once before timing
    for (const std::string& s : subjects) index.Match(s, &out);
    out.clear();
  }
  const inferq::SubjectIndexStats before = index.Stats();
  std::size_t i = 0;
  std::size_t values = 0;
  for (auto _ : state) {
    out.clear();
    values += index.Match(subjects[i], &out);
    benchmark::DoNotOptimize(out.data());
    if (++i == subjects.size()) i = 0;
  }
  const inferq::SubjectIndexStats after = index.Stats();
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
  state.counters["bytes_per_sub"] =
      static_cast<double>(after.memory_bytes) / static_cast<double>(subs);
  state.counters["rss_bytes_per_sub"] =
      static_cast<double>(built.rss_growth) / static_cast<double>(subs);
  const double hits = static_cast<double>(after.cache_hits - before.cache_hits);
  const double misses = static_cast<double>(after.cache_misses - before.cache_misses);
  state.counters["hit_ratio"] = hits + misses > 0 ? hits / (hits + misses) : 0.0;
  state.counters["values_per_match"] =
      static_cast<double>(values) / static_cast<double>(state.iterations());
}

void BM_Insert(benchmark::State& state, Set set, std::size_t subs) {
  current_index = Built{};  // the last BM_Match index, freed before building others
  for (auto _ : state) {
    Built built = Build(set, subs, /*cache=*/false);
    benchmark::DoNotOptimize(built.index.get());
    state.PauseTiming();  // the destructor is not part of building
    built = Built{};
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * subs));
}

// Selection cost per decision.
//
// BM_Select/<policy>/<members>: MemberGroup::Select through each library policy on
// the steady clock, with uneven outstanding work and latencies already recorded, so
// the load-aware policies compare real numbers. ns per decision = 1e9 /
// items_per_second.
namespace select_bench {


std::unique_ptr<inferq::SelectionPolicy> MakePolicy(const std::string& name, std::uint32_t n) {
  if (name == "consistent_hash") {
    return *inferq::ConsistentHashPolicy::Create(inferq::HashKey::SeqId(), n);
  }
  if (name == "weighted_shadow") {
    std::vector<double> w(n, 1.0);
    return *inferq::WeightedShadowPolicy::Create(
        n, {.weights = w, .shadows = {n - 1}, .mirror_fraction = 0.1});
  }
  if (name == "affinity") {
    return *inferq::AffinityPolicy::Create(*inferq::MakeSelectionPolicy("topology_score"),
                                           inferq::HashKey::SeqId());
  }
  return *inferq::MakeSelectionPolicy(name);
}

void BM_Select(benchmark::State& state, std::string policy_name) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  auto group = *inferq::MemberGroup::Create(n);
  for (std::uint32_t m = 0; m < n; ++m) {
    for (std::uint32_t k = 0; k < (m * 7) % 13; ++k) group->OnQueued(m);
    group->OnQueued(m);
    group->OnDone(m, inferq::Outcome::kSuccess, 100'000 + 10'000 * (m % 5));
  }
  auto policy = MakePolicy(policy_name, n);
  // 1024 sequences, as a replica group serving 1024 generations would see them.
  std::vector<inferq::Event> events(1024);
  for (std::size_t i = 0; i < events.size(); ++i) events[i].seq_id = "gen-" + std::to_string(i);
  std::size_t i = 0;
  std::uint64_t sum = 0;
  for (auto _ : state) {
    sum += group->Select(*policy, events[i++ & 1023]).member;
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations());
}

void RegisterSelect() {
  for (const char* p : {"round_robin", "least_loaded", "peak_ewma", "topology_score",
                        "consistent_hash", "weighted_shadow", "affinity"}) {
    benchmark::RegisterBenchmark((std::string("BM_Select/") + p).c_str(), BM_Select, std::string(p))
        ->Arg(4)
        ->Arg(64);
  }
}

}  // namespace select_bench

void RegisterAll() {
  select_bench::RegisterSelect();
  for (const Set set : {Set::kLiteral, Set::kWildcard}) {
    const char* set_name = set == Set::kLiteral ? "literal" : "wildcard";
    for (const std::size_t subs : {std::size_t{10}, std::size_t{10000}, std::size_t{1000000}}) {
      // Grouped so that each index is built once: hit and fill share the cached one,
      // miss and miss_hot the uncached one.
      for (const Mode mode : {Mode::kHit, Mode::kFill, Mode::kMiss, Mode::kMissHot}) {
        if (mode == Mode::kFill && subs == 10) continue;
        const char* mode_name = mode == Mode::kHit    ? "hit"
                                : mode == Mode::kMiss ? "miss"
                                : mode == Mode::kFill ? "fill"
                                                      : "miss_hot";
        const std::string name = std::string("BM_Match/") + set_name + "/" +
                                 std::to_string(subs) + "/" + mode_name;
        benchmark::RegisterBenchmark(name.c_str(), BM_Match, set, subs, mode);
      }
    }
  }
  for (const Set set : {Set::kLiteral, Set::kWildcard}) {
    for (const std::size_t subs : {std::size_t{10000}, std::size_t{1000000}}) {
      const std::string name = std::string("BM_Insert/") +
                               (set == Set::kLiteral ? "literal/" : "wildcard/") +
                               std::to_string(subs);
      benchmark::RegisterBenchmark(name.c_str(), BM_Insert, set, subs)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(subs > 100000 ? 1 : 20);
    }
  }
}

}  // namespace

// Engine publish -> deliver against ZeroMQ and NNG (bench_routing_peers.cpp).
namespace pubsub_peers {
int RegisterPubSubBenchmarks();
}  // namespace pubsub_peers

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RegisterAll();
  pubsub_peers::RegisterPubSubBenchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
