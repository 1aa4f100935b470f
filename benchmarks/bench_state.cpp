// bench_state: the Delta-State Log (StateStore) against RocksDB and SQLite, in one
// binary and one run (BENCHMARKS.md records the figures and ratios).
//
//   BM_Commit/<impl>/<durability>/threads:<T>
//       T threads commit one 400-byte value under key session.<random>.state each,
//       40,000 commits in all (4,000 for one thread with a durable configuration);
//       commits_per_s, p50_us and p99_us of Commit latency.
//       inferq: every (kEveryCommit), group (kGroupCommit), interval (kInterval 10 ms),
//       none (kNone). RocksDB: WAL with sync=true / sync=false (its writers group
//       commit on their own). SQLite: WAL mode, synchronous=FULL / NORMAL, one
//       connection shared under a mutex (SQLite has one writer at a time).
//       "durable" = survives power loss: inferq every/group, RocksDB sync, SQLite FULL.
//   BM_Recover/<impl>/<source>
//       Reopen a store holding 100,000 keys (session.<i>.state, 400-byte values)
//       after 100,000 creates and 200,000 updates, and read every key once
//       (inferq: Open recovers into memory, then a Scan; RocksDB: Open + iterate;
//       SQLite: open + SELECT *). Page cache warm. inferq sources: full checkpoint +
//       20,000-record tail, incremental checkpoints + tail, log alone.
//       plain_snapshot: one file of length-prefixed pairs read into a hash map (the
//       floor for holding this state in memory).
//   BM_Checkpoint/inferq/<full|incremental>
//       One checkpoint of that state (time: writing it, fsyncs included): bytes, and
//       for incremental ones (mean over those of the incremental run, one every
//       20,000 updates) the bytes of the keys and values changed since the previous
//       checkpoint (size_ratio = file bytes / changed bytes).
#include <rocksdb/db.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/container/flat_hash_map.h"
#include "inferq/base/histogram.hpp"
#include "inferq/state/state_store.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kKeys = 100'000;
constexpr int kUpdates = 200'000;
constexpr std::size_t kValueBytes = 400;

fs::path BenchDir() {
  // On the same file system as the build (not a tmpfs: fsync must cost what it costs).
  const char* env = std::getenv("INFERQ_BENCH_DIR");
  fs::path p = env != nullptr ? fs::path(env) : fs::current_path() / "bench_state_data";
  fs::create_directories(p);
  return p;
}

std::string Key(int i) { return "session." + std::to_string(i) + ".state"; }

// 400 bytes of letters, different for each (key, version): compresses like text.
std::string Value(int key, int version) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(key) * 1'000'003u + static_cast<std::uint64_t>(version));
  std::string v(kValueBytes, ' ');
  for (std::size_t i = 0; i < v.size(); i += 8) {
    std::uint64_t r = rng();
    for (std::size_t j = i; j < i + 8 && j < v.size(); ++j, r >>= 8) v[j] = static_cast<char>('a' + (r & 0xff) % 26);
  }
  return v;
}

// ---- stores behind one interface ----

struct Store {
  virtual ~Store() = default;
  virtual bool Put(const std::string& k, const std::string& v) = 0;
};

struct InferqStore final : Store {
  explicit InferqStore(inferq::StateStoreOptions o) {
    auto s = inferq::StateStore::Open(std::move(o));
    if (!s.ok()) {
      std::fprintf(stderr, "open: %s\n", s.status().ToString().c_str());
      std::abort();
    }
    store = std::move(*s);
  }
  bool Put(const std::string& k, const std::string& v) override {
    auto tx = store->Begin();
    tx.Put(k, v);
    return tx.Commit().ok();
  }
  std::unique_ptr<inferq::StateStore> store;
};

struct RocksStore final : Store {
  RocksStore(const std::string& dir, bool sync) {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    if (!rocksdb::DB::Open(o, dir, &raw).ok()) std::abort();
    db.reset(raw);
    wo.sync = sync;
  }
  bool Put(const std::string& k, const std::string& v) override { return db->Put(wo, k, v).ok(); }
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::WriteOptions wo;
};

struct SqliteStore final : Store {
  SqliteStore(const std::string& file, bool full) {
    if (sqlite3_open(file.c_str(), &db) != SQLITE_OK) std::abort();
    Exec("PRAGMA journal_mode=WAL");
    Exec(full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
    Exec("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID");
    sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", -1, &put, nullptr);
  }
  ~SqliteStore() override {
    sqlite3_finalize(put);
    sqlite3_close(db);
  }
  void Exec(const char* sql) {
    if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "sqlite: %s\n", sqlite3_errmsg(db));
      std::abort();
    }
  }
  bool Put(const std::string& k, const std::string& v) override {
    std::lock_guard lock(mu);
    sqlite3_bind_text(put, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
    sqlite3_bind_blob(put, 2, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    const bool ok = sqlite3_step(put) == SQLITE_DONE;
    sqlite3_reset(put);
    return ok;
  }
  std::mutex mu;
  sqlite3* db = nullptr;
  sqlite3_stmt* put = nullptr;
};

enum Impl { kInferqEvery, kInferqGroup, kInferqInterval, kInferqNone, kRocksSync, kRocksNoSync,
            kSqliteFull, kSqliteNormal };

std::unique_ptr<Store> MakeStore(Impl impl, const fs::path& dir) {
  inferq::StateStoreOptions o;
  o.dir = dir.string();
  o.checkpoint_interval = absl::ZeroDuration();
  switch (impl) {
    case kInferqEvery: o.sync = inferq::SyncPolicy::kEveryCommit; return std::make_unique<InferqStore>(o);
    case kInferqGroup: o.sync = inferq::SyncPolicy::kGroupCommit; return std::make_unique<InferqStore>(o);
    case kInferqInterval:
      o.sync = inferq::SyncPolicy::kInterval;
      o.group_commit_window = absl::Milliseconds(10);
      return std::make_unique<InferqStore>(o);
    case kInferqNone: o.sync = inferq::SyncPolicy::kNone; return std::make_unique<InferqStore>(o);
    case kRocksSync: return std::make_unique<RocksStore>(dir.string(), true);
    case kRocksNoSync: return std::make_unique<RocksStore>(dir.string(), false);
    case kSqliteFull:
      fs::create_directories(dir);
      return std::make_unique<SqliteStore>((dir / "db.sqlite").string(), true);
    case kSqliteNormal:
      fs::create_directories(dir);
      return std::make_unique<SqliteStore>((dir / "db.sqlite").string(), false);
  }
  return nullptr;
}

void BM_Commit(benchmark::State& state, Impl impl, bool durable) {
  const int threads = static_cast<int>(state.range(0));
  const int total = durable && threads == 1 ? 4'000 : 40'000;
  inferq::HistogramSnapshot lat;
  double seconds = 0;
  std::int64_t commits = 0;
  for (auto _ : state) {
    const fs::path dir = BenchDir() / "commit";
    fs::remove_all(dir);
    auto store = MakeStore(impl, dir);
    inferq::Histogram hist;
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> ts;
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t));
        const std::string value = Value(t, 0);
        while (next.fetch_add(1) < total) {
          const int k = static_cast<int>(rng() % kKeys);
          const auto a = Clock::now();
          if (!store->Put(Key(k), value)) failed = true;
          hist.Record(static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count()));
        }
      });
    }
    for (auto& th : ts) th.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(s);
    seconds += s;
    commits += total;
    lat.Merge(hist.Snapshot());
    if (auto* in = dynamic_cast<InferqStore*>(store.get())) {
      state.counters["commits_per_sync"] =
          static_cast<double>(total) / static_cast<double>(std::max<std::uint64_t>(1, in->store->Stats().log_syncs));
    }
    store.reset();
    fs::remove_all(dir);
    if (failed) state.SkipWithError("a commit failed");
  }
  state.counters["commits_per_s"] = static_cast<double>(commits) / seconds;
  state.counters["p50_us"] = static_cast<double>(lat.Percentile(0.50)) / 1000.0;
  state.counters["p99_us"] = static_cast<double>(lat.Percentile(0.99)) / 1000.0;
}

// ---- recovery data, built once ----

struct RecoveryData {
  fs::path root;
  double full_checkpoint_bytes = 0, full_checkpoint_ms = 0;
  double incr_checkpoint_bytes = 0, incr_checkpoint_ms = 0, incr_changed_bytes = 0;
  int incr_checkpoints = 0;
};

// The workload: creates of 0..kKeys-1, then kUpdates updates of random keys.
template <class F>
void Workload(F&& put) {
  for (int i = 0; i < kKeys; ++i) put(i, 0, i);
  std::mt19937 rng(7);
  for (int u = 1; u <= kUpdates; ++u) put(static_cast<int>(rng() % kKeys), u, kKeys + u - 1);
}

inferq::StateStoreOptions LoadOptions(const fs::path& dir) {
  inferq::StateStoreOptions o;
  o.dir = dir.string();
  o.sync = inferq::SyncPolicy::kNone;  // building the data, not measuring commits
  o.checkpoint_interval = absl::ZeroDuration();
  o.checkpoint_log_bytes = 0;
  o.segment_bytes = std::uint64_t{64} << 20;
  return o;
}

const RecoveryData& Data() {
  static RecoveryData d = [] {
    RecoveryData d;
    d.root = BenchDir() / "recovery";
    fs::remove_all(d.root);
    constexpr int kTail = 20'000;   // records after the last checkpoint
    constexpr int kEvery = 20'000;  // updates between incremental checkpoints
    // inferq: log alone; full checkpoint + tail; incremental checkpoints + tail.
    for (const char* kind : {"log", "full", "incremental"}) {
      auto o = LoadOptions(d.root / (std::string("inferq_") + kind));
      o.checkpoint_mode = std::string(kind) == "full" ? inferq::CheckpointMode::kFull
                                                      : inferq::CheckpointMode::kIncremental;
      auto s = std::move(*inferq::StateStore::Open(o));
      std::unordered_set<int> changed;
      Workload([&](int k, int version, int n) {
        auto tx = s->Begin();
        tx.Put(Key(k), Value(k, version));
        (void)tx.Commit();
        changed.insert(k);
        const int done = n + 1;
        const bool full_point = std::string(kind) == "full" && done == kKeys + kUpdates - kTail;
        const bool incr_point = std::string(kind) == "incremental" && done >= kKeys &&
                                (done - kKeys) % kEvery == 0 && done <= kKeys + kUpdates - kTail;
        if (full_point || incr_point) {
          std::uint64_t changed_bytes = 0;
          for (int c : changed) changed_bytes += Key(c).size() + kValueBytes;
          const std::uint64_t incr_before = s->Stats().checkpoints_incremental;
          const auto t0 = Clock::now();
          (void)s->Checkpoint();
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          const auto st = s->Stats();
          if (full_point) {
            d.full_checkpoint_bytes = static_cast<double>(st.last_checkpoint_bytes);
            d.full_checkpoint_ms = ms;
          } else if (st.checkpoints_incremental > incr_before) {  // (some are full ones)
            d.incr_checkpoint_bytes += static_cast<double>(st.last_checkpoint_bytes);
            d.incr_checkpoint_ms += ms;
            d.incr_changed_bytes += static_cast<double>(changed_bytes);
            ++d.incr_checkpoints;
          }
          changed.clear();
        }
      });
    }
    {  // RocksDB
      RocksStore r((d.root / "rocksdb").string(), false);
      Workload([&](int k, int version, int) { r.Put(Key(k), Value(k, version)); });
    }
    {  // SQLite, 1,000 changes per transaction
      SqliteStore q((d.root / "sqlite.db").string(), false);
      int n = 0;
      q.Exec("BEGIN");
      Workload([&](int k, int version, int) {
        q.Put(Key(k), Value(k, version));
        if (++n % 1000 == 0) {
          q.Exec("COMMIT");
          q.Exec("BEGIN");
        }
      });
      q.Exec("COMMIT");
    }
    {  // plain snapshot of the final state
      absl::flat_hash_map<std::string, std::string> final_state;
      Workload([&](int k, int version, int) { final_state[Key(k)] = Value(k, version); });
      std::ofstream out(d.root / "plain.snapshot", std::ios::binary);
      for (const auto& [k, v] : final_state) {
        const std::uint32_t kl = static_cast<std::uint32_t>(k.size()), vl = static_cast<std::uint32_t>(v.size());
        out.write(reinterpret_cast<const char*>(&kl), 4);
        out.write(reinterpret_cast<const char*>(&vl), 4);
        out << k << v;
      }
    }
    return d;
  }();
  return d;
}

void BM_RecoverInferq(benchmark::State& state, const char* source) {
  const fs::path dir = Data().root / (std::string("inferq_") + source);
  std::uint64_t keys = 0, records = 0, checkpoints = 0;
  for (auto _ : state) {
    inferq::StateStoreOptions o;
    o.dir = dir.string();
    o.checkpoint_interval = absl::ZeroDuration();
    o.checkpoint_log_bytes = 0;
    auto s = inferq::StateStore::Open(o);
    if (!s.ok()) {
      state.SkipWithError(s.status().ToString().c_str());
      return;
    }
    std::uint64_t n = 0, bytes = 0;
    (*s)->Scan("", [&](std::string_view, std::string_view v) {
      ++n;
      bytes += v.size();
    });
    benchmark::DoNotOptimize(bytes);
    keys = n;
    records = (*s)->Stats().recovered_log_records;
    checkpoints = (*s)->Stats().recovered_checkpoints;
  }
  state.counters["keys"] = static_cast<double>(keys);
  state.counters["log_records"] = static_cast<double>(records);
  state.counters["checkpoints"] = static_cast<double>(checkpoints);
}

void BM_RecoverRocksDB(benchmark::State& state) {
  const std::string dir = (Data().root / "rocksdb").string();
  std::uint64_t keys = 0;
  for (auto _ : state) {
    rocksdb::Options o;
    rocksdb::DB* raw = nullptr;
    if (!rocksdb::DB::Open(o, dir, &raw).ok()) {
      state.SkipWithError("rocksdb open failed");
      return;
    }
    std::unique_ptr<rocksdb::DB> db(raw);
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
    std::uint64_t n = 0, bytes = 0;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ++n;
      bytes += it->value().size();
    }
    benchmark::DoNotOptimize(bytes);
    keys = n;
  }
  state.counters["keys"] = static_cast<double>(keys);
}

void BM_RecoverSqlite(benchmark::State& state) {
  const std::string file = (Data().root / "sqlite.db").string();
  std::uint64_t keys = 0;
  for (auto _ : state) {
    sqlite3* db = nullptr;
    sqlite3_open(file.c_str(), &db);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "SELECT k, v FROM kv", -1, &st, nullptr);
    std::uint64_t n = 0, bytes = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
      ++n;
      bytes += static_cast<std::uint64_t>(sqlite3_column_bytes(st, 1));
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    benchmark::DoNotOptimize(bytes);
    keys = n;
  }
  state.counters["keys"] = static_cast<double>(keys);
}

void BM_RecoverPlainSnapshot(benchmark::State& state) {
  const fs::path file = Data().root / "plain.snapshot";
  std::uint64_t keys = 0;
  for (auto _ : state) {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    absl::flat_hash_map<std::string, std::string> m;
    m.reserve(kKeys);
    std::size_t off = 0;
    while (off + 8 <= bytes.size()) {
      std::uint32_t kl, vl;
      std::memcpy(&kl, bytes.data() + off, 4);
      std::memcpy(&vl, bytes.data() + off + 4, 4);
      off += 8;
      m.emplace(bytes.substr(off, kl), bytes.substr(off + kl, vl));
      off += kl + vl;
    }
    keys = m.size();
    benchmark::DoNotOptimize(m);
  }
  state.counters["keys"] = static_cast<double>(keys);
}

void BM_Checkpoint(benchmark::State& state, bool full) {
  const RecoveryData& d = Data();
  for (auto _ : state) {
    state.SetIterationTime((full ? d.full_checkpoint_ms
                                 : d.incr_checkpoint_ms / std::max(1, d.incr_checkpoints)) / 1000.0);
  }
  if (full) {
    state.counters["bytes"] = d.full_checkpoint_bytes;
  } else {
    const double n = std::max(1, d.incr_checkpoints);
    state.counters["bytes"] = d.incr_checkpoint_bytes / n;
    state.counters["changed_bytes"] = d.incr_changed_bytes / n;
    state.counters["size_ratio"] = d.incr_checkpoint_bytes / d.incr_changed_bytes;
  }
}

void CommitArgs(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(8)->Arg(64)->ArgName("threads")->UseManualTime()->Iterations(1)->Unit(
      benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(BM_Commit, inferq_every, kInferqEvery, true)->Name("BM_Commit/inferq/every")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, inferq_group, kInferqGroup, true)->Name("BM_Commit/inferq/group")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, rocksdb_sync, kRocksSync, true)->Name("BM_Commit/rocksdb/sync")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, sqlite_full, kSqliteFull, true)->Name("BM_Commit/sqlite/full")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, inferq_interval, kInferqInterval, false)->Name("BM_Commit/inferq/interval")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, inferq_none, kInferqNone, false)->Name("BM_Commit/inferq/none")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, rocksdb_nosync, kRocksNoSync, false)->Name("BM_Commit/rocksdb/nosync")->Apply(CommitArgs);
BENCHMARK_CAPTURE(BM_Commit, sqlite_normal, kSqliteNormal, false)->Name("BM_Commit/sqlite/normal")->Apply(CommitArgs);

BENCHMARK_CAPTURE(BM_RecoverInferq, full, "full")->Name("BM_Recover/inferq/full_checkpoint+tail")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_RecoverInferq, incremental, "incremental")->Name("BM_Recover/inferq/incremental_checkpoints+tail")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_RecoverInferq, log, "log")->Name("BM_Recover/inferq/log_only")->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_RecoverRocksDB)->Name("BM_Recover/rocksdb/reopen+scan")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_RecoverSqlite)->Name("BM_Recover/sqlite/reopen+select")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_RecoverPlainSnapshot)->Name("BM_Recover/plain_snapshot/hash_map")->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK_CAPTURE(BM_Checkpoint, full, true)->Name("BM_Checkpoint/inferq/full")->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Checkpoint, incremental, false)->Name("BM_Checkpoint/inferq/incremental")->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
