// bench_streams: durable streams (StreamConfig::storage = kFile) against NATS
// JetStream 2.9 (a file stream on a nats-server the benchmark starts on loopback,
// driven through libnats) and SQLite in WAL mode used as a queue, in one binary and
// one run (BENCHMARKS.md records the figures and ratios). 1 KiB payloads.
//
// Durability is compared where both sides offer it:
//   crash  survives a crash of the process (the data is in the page cache):
//          inferq SyncPolicy::kNone, JetStream's file store as shipped (it
//          fsyncs every 2 minutes, sync_interval).
//   power  survives a power loss (fdatasync'ed before the ack): inferq
//          kGroupCommit, SQLite synchronous=FULL (one transaction per message).
//          JetStream 2.9 has no setting for it.
//
//   BM_StreamPublish/<impl>/<durability>/threads:<T>
//       T threads publish 1 KiB messages, each waiting for its ack (inferq Publish
//       returns once the sync policy is met; SQLite commits one INSERT). JetStream
//       gets its fastest path, asynchronous publishes with up to 4096 acks
//       outstanding per connection (js_PublishAsync, one connection per thread),
//       timed until every ack is in (js_PublishAsyncComplete). msgs_per_s.
//   BM_StreamPublish/inferq_async256/power, BM_StreamPublish/sqlite_batch256/power
//       The same with a window at power durability: inferq PublishAsync, 256
//       futures in flight per thread, waited in order (their fdatasyncs shared);
//       SQLite 256 INSERTs per transaction (one fsync per window).
//   BM_StreamPubAck/<impl>/<durability>
//       One publisher and one consumer thread: publish, deliver, ack, with at most
//       1024 messages published and not yet acked (the publisher waits). Consumer
//       acks: inferq Ack (written to the OS before it returns) at crash, AckSync
//       at power; JetStream natsMsg_Ack (sent, not confirmed: weaker than inferq's)
//       from a pull consumer fetching 256 at a time; SQLite deletes the row in its
//       own transaction. msgs_per_s, and p50_us / p99_us from publish to ack.
//   BM_StreamRecover/<impl>
//       1,000,000 messages of 1 KiB written once (and kept in the bench directory
//       for later runs), then: inferq AddStream of the directory (recovery, every
//       message indexed and its duplicate-window id restored); JetStream a restart of
//       nats-server until the stream answers with all its messages; SQLite open +
//       count. recovery_ms, and rss_mb: the memory the recovered stream holds
//       (inferq: the process's RSS after minus before; JetStream: the server's RSS).
//   BM_StreamBacklog/inferq
//       4,194,304 messages of 1 KiB (a 4 GiB stream; written once at crash
//       durability and kept like the recovery sets), then: AddStream of the
//       directory, AddConsumer from the front (DeliverPolicy::kAll), and every
//       message pulled and acked by one member. recovery_ms, drain_msgs_per_s, and
//       peak_rss_mb: the process's peak RSS (VmHWM, reset before) over all of it.
//
// The data lives in $INFERQ_BENCH_DIR (default ./bench_streams_data), on the disk the
// build is on (not a tmpfs: fdatasync must cost what it costs).
#include <signal.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <nats/nats.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench_util.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/engine/engine.hpp"

namespace {

namespace fs = std::filesystem;
using inferq_bench::NowNs;

constexpr std::size_t kPayloadBytes = 1024;
constexpr int kWindow = 1024;           // BM_StreamPubAck: published, not yet acked
constexpr int kRecoverMessages = 1'000'000;

fs::path BenchDir() {
  const char* env = std::getenv("INFERQ_BENCH_DIR");
  fs::path p = env != nullptr ? fs::path(env) : fs::current_path() / "bench_streams_data";
  fs::create_directories(p);
  return p;
}

// A fresh directory under BenchDir() for one benchmark run.
fs::path FreshDir(const std::string& name) {
  fs::path p = BenchDir() / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// 1 KiB: the publish time (ns, NowNs) in the first 8 bytes, then letters.
std::string Payload(std::int64_t now_ns) {
  std::string p(kPayloadBytes, 'x');
  std::memcpy(p.data(), &now_ns, sizeof now_ns);
  return p;
}
std::int64_t PublishTimeOf(const void* data) {
  std::int64_t t;
  std::memcpy(&t, data, sizeof t);
  return t;
}

double RssMb(pid_t pid) {
  std::ifstream in("/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid)) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

void Fail(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());
}

// ---- nats-server, started per benchmark on a free loopback port ----

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class NatsServer {
 public:
  explicit NatsServer(fs::path store) : store_(std::move(store)), port_(FreePort()) {}
  ~NatsServer() { Stop(); }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  // Starts it and waits until a client connects (at most 20 s). False on failure.
  bool Start() {
    const std::string port = std::to_string(port_);
    const std::string dir = store_.string();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execlp("nats-server", "nats-server", "-js", "-sd", dir.c_str(), "-a", "127.0.0.1", "-p",
               port.c_str(), "-l", (dir + "/server.log").c_str(), static_cast<char*>(nullptr));
      std::_Exit(127);
    }
    if (pid_ < 0) return false;
    for (int i = 0; i < 2000; ++i) {
      natsConnection* nc = nullptr;
      if (natsConnection_ConnectTo(&nc, url().c_str()) == NATS_OK) {
        natsConnection_Destroy(nc);
        return true;
      }
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // SIGTERM (a clean shutdown), then waits for it.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

 private:
  fs::path store_;
  int port_;
  pid_t pid_ = -1;
};

// A connection with its JetStream context; async publishes bounded at 4096.
struct NatsClient {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  bool Connect(const std::string& url) {
    if (natsConnection_ConnectTo(&nc, url.c_str()) != NATS_OK) return false;
    jsOptions o;
    jsOptions_Init(&o);
    o.PublishAsync.MaxPending = 4096;
    o.Wait = 30'000;
    return natsConnection_JetStream(&js, nc, &o) == NATS_OK;
  }
  ~NatsClient() {
    if (js != nullptr) jsCtx_Destroy(js);
    if (nc != nullptr) natsConnection_Destroy(nc);
  }
};

bool AddJetStream(jsCtx* js) {
  jsStreamConfig c;
  jsStreamConfig_Init(&c);
  const char* subjects[] = {"bench.>"};
  c.Name = "BENCH";
  c.Subjects = subjects;
  c.SubjectsLen = 1;
  c.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  jsErrCode err = static_cast<jsErrCode>(0);
  const natsStatus s = js_AddStream(&si, js, &c, nullptr, &err);
  if (si != nullptr) jsStreamInfo_Destroy(si);
  return s == NATS_OK;
}

std::uint64_t JetStreamMessages(jsCtx* js) {
  jsStreamInfo* si = nullptr;
  jsErrCode err = static_cast<jsErrCode>(0);
  if (js_GetStreamInfo(&si, js, "BENCH", nullptr, &err) != NATS_OK) return 0;
  const std::uint64_t n = si->State.Msgs;
  jsStreamInfo_Destroy(si);
  return n;
}

// ---- inferq ----

inferq::StreamConfig FileStream(const fs::path& dir, bool power) {
  inferq::StreamConfig s;
  s.name = "BENCH";
  s.subjects = {"bench.>"};
  s.storage = inferq::StorageType::kFile;
  s.directory = dir.string();
  s.sync = power ? inferq::SyncPolicy::kGroupCommit : inferq::SyncPolicy::kNone;
  s.duplicate_window = absl::ZeroDuration();
  return s;
}

inferq::Event BenchEvent(const std::string& payload) {
  inferq::Event e;
  e.subject = "bench.req";
  e.payload = inferq::Buffer::FromString(payload);
  return e;
}

// ---- SQLite in WAL mode as a queue ----

struct SqliteQueue {
  sqlite3* db = nullptr;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* next = nullptr;
  sqlite3_stmt* remove = nullptr;
  // One writer at a time (SQLite's own rule); one shared connection. AUTOINCREMENT:
  // a row deleted by the consumer never gives its seq to a later insert.
  std::mutex mu;
  bool Open(const fs::path& file) {
    if (sqlite3_open(file.c_str(), &db) != SQLITE_OK) return false;
    for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                            "CREATE TABLE IF NOT EXISTS q (seq INTEGER PRIMARY KEY AUTOINCREMENT, subject TEXT, "
                            "payload BLOB)"}) {
      if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return false;
    }
    return sqlite3_prepare_v2(db, "INSERT INTO q (subject, payload) VALUES (?, ?)", -1, &insert,
                              nullptr) == SQLITE_OK &&
           sqlite3_prepare_v2(db, "SELECT seq, payload FROM q WHERE seq > ? ORDER BY seq LIMIT 256",
                              -1, &next, nullptr) == SQLITE_OK &&
           sqlite3_prepare_v2(db, "DELETE FROM q WHERE seq = ?", -1, &remove, nullptr) == SQLITE_OK;
  }
  ~SqliteQueue() {
    sqlite3_finalize(insert);
    sqlite3_finalize(next);
    sqlite3_finalize(remove);
    sqlite3_close(db);
  }
  // `n` rows in one transaction (one WAL fsync for all of them under FULL): the
  // peer of a publisher that keeps a window of acks in flight.
  bool InsertBatch(const std::string& payload, int n) {
    std::lock_guard lock(mu);
    if (sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK) return false;
    bool ok = true;
    for (int i = 0; i < n && ok; ++i) {
      sqlite3_bind_text(insert, 1, "bench.req", -1, SQLITE_STATIC);
      sqlite3_bind_blob(insert, 2, payload.data(), static_cast<int>(payload.size()), SQLITE_STATIC);
      ok = sqlite3_step(insert) == SQLITE_DONE;
      sqlite3_reset(insert);
    }
    return sqlite3_exec(db, ok ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK && ok;
  }
  bool Insert(const std::string& payload) {
    std::lock_guard lock(mu);
    sqlite3_bind_text(insert, 1, "bench.req", -1, SQLITE_STATIC);
    sqlite3_bind_blob(insert, 2, payload.data(), static_cast<int>(payload.size()), SQLITE_STATIC);
    const bool ok = sqlite3_step(insert) == SQLITE_DONE;
    sqlite3_reset(insert);
    return ok;
  }
  // Up to 256 rows after `after`: (seq, publish time).
  std::vector<std::pair<std::int64_t, std::int64_t>> Next(std::int64_t after) {
    std::lock_guard lock(mu);
    std::vector<std::pair<std::int64_t, std::int64_t>> rows;
    sqlite3_bind_int64(next, 1, after);
    while (sqlite3_step(next) == SQLITE_ROW) {
      rows.emplace_back(sqlite3_column_int64(next, 0), PublishTimeOf(sqlite3_column_blob(next, 1)));
    }
    sqlite3_reset(next);
    return rows;
  }
  bool Remove(std::int64_t seq) {
    std::lock_guard lock(mu);
    sqlite3_bind_int64(remove, 1, seq);
    const bool ok = sqlite3_step(remove) == SQLITE_DONE;
    sqlite3_reset(remove);
    return ok;
  }
};

// ---- BM_StreamPublish ----

// kInferqAsync: PublishAsync with kAsyncWindow futures in flight, waited in order;
// kSqliteBatch: kAsyncWindow rows per transaction (each publisher's own window).
enum class Impl { kInferq, kJetStream, kSqlite, kInferqAsync, kSqliteBatch };
constexpr int kAsyncWindow = 256;

void BM_StreamPublish(benchmark::State& state, Impl impl, bool power) {
  const int threads = static_cast<int>(state.range(0));
  const int total = power ? 8'000 : 200'000;
  const int per_thread = total / threads;
  const std::string payload = Payload(0);
  for (auto _ : state) {
    state.PauseTiming();
    const fs::path dir = FreshDir("publish");
    std::unique_ptr<inferq::Engine> engine;
    std::unique_ptr<NatsServer> server;
    std::vector<std::unique_ptr<NatsClient>> clients;
    std::unique_ptr<SqliteQueue> sqlite;
    if (impl == Impl::kInferq || impl == Impl::kInferqAsync) {
      engine = *inferq::Engine::Create();
      if (!engine->AddStream(FileStream(dir / "stream", power)).ok()) return Fail(state, "AddStream");
    } else if (impl == Impl::kJetStream) {
      server = std::make_unique<NatsServer>(dir);
      if (!server->Start()) return Fail(state, "nats-server did not start (is it installed?)");
      for (int t = 0; t < threads; ++t) {
        clients.push_back(std::make_unique<NatsClient>());
        if (!clients.back()->Connect(server->url())) return Fail(state, "connect");
      }
      if (!AddJetStream(clients[0]->js)) return Fail(state, "js_AddStream");
    } else {
      sqlite = std::make_unique<SqliteQueue>();
      if (!sqlite->Open(dir / "q.sqlite")) return Fail(state, "sqlite open");
    }
    std::atomic<int> failures{0};
    state.ResumeTiming();
    const std::int64_t t0 = NowNs();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        if (impl == Impl::kInferqAsync) {
          std::vector<inferq::PublishAckFuture> window;
          window.reserve(kAsyncWindow);
          for (int i = 0; i < per_thread; ++i) {
            absl::StatusOr<inferq::PublishAckFuture> f = engine->PublishAsync(BenchEvent(payload));
            if (!f.ok()) {
              failures.fetch_add(1);
              continue;
            }
            window.push_back(*std::move(f));
            if (window.size() == kAsyncWindow || i + 1 == per_thread) {
              for (inferq::PublishAckFuture& w : window) {
                if (!w.Wait().ok()) failures.fetch_add(1);
              }
              window.clear();
            }
          }
          return;
        }
        if (impl == Impl::kSqliteBatch) {
          for (int i = 0; i < per_thread; i += kAsyncWindow) {
            if (!sqlite->InsertBatch(payload, std::min(kAsyncWindow, per_thread - i))) failures.fetch_add(1);
          }
          return;
        }
        for (int i = 0; i < per_thread; ++i) {
          bool ok;
          switch (impl) {
            case Impl::kInferq: ok = engine->Publish(BenchEvent(payload)).ok(); break;
            case Impl::kJetStream:
              ok = js_PublishAsync(clients[t]->js, "bench.req", payload.data(),
                                   static_cast<int>(payload.size()), nullptr) == NATS_OK;
              break;
            case Impl::kSqlite: ok = sqlite->Insert(payload); break;
            default: ok = false; break;
          }
          if (!ok) failures.fetch_add(1);
        }
        if (impl == Impl::kJetStream) {
          jsPubOptions po;
          jsPubOptions_Init(&po);
          po.MaxWait = 60'000;
          if (js_PublishAsyncComplete(clients[t]->js, &po) != NATS_OK) failures.fetch_add(1);
        }
      });
    }
    for (auto& th : pool) th.join();
    const double secs = static_cast<double>(NowNs() - t0) / 1e9;
    state.PauseTiming();
    if (failures.load() != 0) return Fail(state, std::to_string(failures.load()) + " publishes failed");
    if (impl == Impl::kJetStream &&
        JetStreamMessages(clients[0]->js) != static_cast<std::uint64_t>(per_thread * threads)) {
      return Fail(state, "JetStream does not hold every message");
    }
    state.counters["msgs_per_s"] = static_cast<double>(per_thread * threads) / secs;
    clients.clear();
    server.reset();
    engine.reset();
    sqlite.reset();
    state.ResumeTiming();
  }
}

// ---- BM_StreamPubAck ----

void BM_StreamPubAck(benchmark::State& state, Impl impl, bool power) {
  const int total = power ? 4'000 : 100'000;
  for (auto _ : state) {
    state.PauseTiming();
    const fs::path dir = FreshDir("puback");
    std::unique_ptr<inferq::Engine> engine;
    std::optional<inferq::Consumer> consumer;
    std::unique_ptr<NatsServer> server;
    NatsClient pub_client, sub_client;
    natsSubscription* sub = nullptr;
    std::unique_ptr<SqliteQueue> sqlite;
    if (impl == Impl::kInferq) {
      engine = *inferq::Engine::Create();
      if (!engine->AddStream(FileStream(dir / "stream", power)).ok()) return Fail(state, "AddStream");
      auto c = engine->AddConsumer({.stream = "BENCH", .name = "work", .lane_capacity = 2 * kWindow});
      if (!c.ok()) return Fail(state, "AddConsumer");
      consumer = *c;
    } else if (impl == Impl::kJetStream) {
      server = std::make_unique<NatsServer>(dir);
      if (!server->Start()) return Fail(state, "nats-server did not start (is it installed?)");
      if (!pub_client.Connect(server->url()) || !sub_client.Connect(server->url())) {
        return Fail(state, "connect");
      }
      if (!AddJetStream(pub_client.js)) return Fail(state, "js_AddStream");
      jsSubOptions so;
      jsSubOptions_Init(&so);
      so.Config.AckPolicy = js_AckExplicit;
      so.Config.MaxAckPending = 4 * kWindow;
      jsErrCode err = static_cast<jsErrCode>(0);
      if (js_PullSubscribe(&sub, sub_client.js, "bench.>", "work", nullptr, &so, &err) != NATS_OK) {
        return Fail(state, "js_PullSubscribe");
      }
    } else {
      sqlite = std::make_unique<SqliteQueue>();
      if (!sqlite->Open(dir / "q.sqlite")) return Fail(state, "sqlite open");
    }
    std::atomic<int> acked{0};
    std::atomic<int> failures{0};
    inferq::HistogramSnapshot latency_ns;  // the consumer thread's alone
    state.ResumeTiming();
    const std::int64_t t0 = NowNs();
    std::thread publisher([&] {
      for (int i = 0; i < total; ++i) {
        while (i - acked.load(std::memory_order_acquire) >= kWindow) std::this_thread::yield();
        const std::string payload = Payload(NowNs());
        bool ok;
        switch (impl) {
          case Impl::kInferq: ok = engine->Publish(BenchEvent(payload)).ok(); break;
          case Impl::kJetStream:
            ok = js_PublishAsync(pub_client.js, "bench.req", payload.data(),
                                 static_cast<int>(payload.size()), nullptr) == NATS_OK;
            break;
          case Impl::kSqlite: ok = sqlite->Insert(payload); break;
        }
        if (!ok) failures.fetch_add(1);
      }
    });
    auto done = [&](std::int64_t published_ns) {
      latency_ns.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, NowNs() - published_ns)));
      acked.fetch_add(1, std::memory_order_release);
    };
    if (impl == Impl::kInferq) {
      inferq::Member m = *consumer->member(0);
      while (acked.load() < total && failures.load() == 0) {
        auto msg = m.Next(absl::Seconds(10));
        if (!msg.ok()) {
          failures.fetch_add(1);
          break;
        }
        const std::int64_t at = PublishTimeOf(msg->event().payload.span().data());
        if (!(power ? msg->AckSync() : msg->Ack()).ok()) failures.fetch_add(1);
        done(at);
      }
    } else if (impl == Impl::kJetStream) {
      while (acked.load() < total && failures.load() == 0) {
        natsMsgList list{};
        jsErrCode err = static_cast<jsErrCode>(0);
        const natsStatus s = natsSubscription_Fetch(&list, sub, 256, 10'000, &err);
        if (s != NATS_OK) {
          failures.fetch_add(1);
          break;
        }
        for (int i = 0; i < list.Count; ++i) {
          const std::int64_t at = PublishTimeOf(natsMsg_GetData(list.Msgs[i]));
          if (natsMsg_Ack(list.Msgs[i], nullptr) != NATS_OK) failures.fetch_add(1);
          done(at);
        }
        natsMsgList_Destroy(&list);
      }
    } else {
      std::int64_t after = 0;
      while (acked.load() < total && failures.load() == 0) {
        auto rows = sqlite->Next(after);
        if (rows.empty()) std::this_thread::yield();
        for (const auto& [seq, at] : rows) {
          if (!sqlite->Remove(seq)) failures.fetch_add(1);
          after = seq;
          done(at);
        }
      }
    }
    publisher.join();
    const double secs = static_cast<double>(NowNs() - t0) / 1e9;
    state.PauseTiming();
    if (failures.load() != 0) return Fail(state, std::to_string(failures.load()) + " operations failed");
    state.counters["msgs_per_s"] = total / secs;
    state.counters["p50_us"] = static_cast<double>(latency_ns.Percentile(0.50)) / 1e3;
    state.counters["p99_us"] = static_cast<double>(latency_ns.Percentile(0.99)) / 1e3;
    if (sub != nullptr) natsSubscription_Destroy(sub);
    consumer.reset();
    engine.reset();
    state.ResumeTiming();
  }
}

// ---- BM_StreamRecover ----

// The 1M-message data set of `impl`, written once into BenchDir()/recover_<impl>
// and kept for later runs: NeedsFill empties the directory and says so when no
// complete set is there; MarkFilled records a complete one.
fs::path RecoverDir(const char* impl) { return BenchDir() / (std::string("recover_") + impl); }
bool NeedsFill(const fs::path& dir) {
  if (fs::exists(dir / "complete")) return false;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return true;
}
void MarkFilled(const fs::path& dir) { std::ofstream(dir / "complete") << kRecoverMessages << "\n"; }

void BM_StreamRecoverInferq(benchmark::State& state) {
  const fs::path dir = RecoverDir("inferq");
  if (NeedsFill(dir)) {
    auto engine = *inferq::Engine::Create();
    if (!engine->AddStream(FileStream(dir / "stream", false)).ok()) return Fail(state, "AddStream");
    const std::string payload = Payload(0);
    for (int i = 0; i < kRecoverMessages; ++i) {
      if (!engine->Publish(BenchEvent(payload)).ok()) return Fail(state, "Publish");
    }
    MarkFilled(dir);
  }
  for (auto _ : state) {
    const double before = RssMb(0);
    const std::int64_t t0 = NowNs();
    auto engine = *inferq::Engine::Create();
    if (!engine->AddStream(FileStream(dir / "stream", false)).ok()) return Fail(state, "AddStream");
    const double ms = static_cast<double>(NowNs() - t0) / 1e6;
    const double after = RssMb(0);
    const inferq::EngineStats st = engine->Stats();
    if (st.streams.empty() || st.streams[0].messages != static_cast<std::uint64_t>(kRecoverMessages)) {
      return Fail(state, "recovered a wrong number of messages");
    }
    state.counters["recovery_ms"] = ms;
    state.counters["rss_mb"] = after - before;
    state.PauseTiming();
    engine.reset();
    state.ResumeTiming();
  }
}

// ---- BM_StreamBacklog ----

constexpr int kBacklogMessages = 4 * 1024 * 1024;  // 4 GiB of 1 KiB payloads

double PeakRssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return 0;
}

void BM_StreamBacklog(benchmark::State& state) {
  const fs::path dir = BenchDir() / "backlog_inferq";
  if (!fs::exists(dir / "complete")) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto engine = *inferq::Engine::Create();
    if (!engine->AddStream(FileStream(dir / "stream", false)).ok()) return Fail(state, "AddStream");
    const std::string payload = Payload(0);
    for (int i = 0; i < kBacklogMessages; ++i) {
      if (!engine->Publish(BenchEvent(payload)).ok()) return Fail(state, "Publish");
    }
    std::ofstream(dir / "complete") << kBacklogMessages << "\n";
  }
  for (auto _ : state) {
    state.PauseTiming();
    fs::remove_all(dir / "stream" / "consumers");  // every run starts from the front
    std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
    state.ResumeTiming();
    const std::int64_t t0 = NowNs();
    auto engine = *inferq::Engine::Create();
    if (!engine->AddStream(FileStream(dir / "stream", false)).ok()) return Fail(state, "AddStream");
    const std::int64_t t1 = NowNs();
    absl::StatusOr<inferq::Consumer> c = engine->AddConsumer(
        {.stream = "BENCH", .name = "reader", .deliver = inferq::DeliverPolicy::kAll});
    if (!c.ok()) return Fail(state, "AddConsumer: " + std::string(c.status().message()));
    inferq::Member m = *c->member(0);
    for (int i = 0; i < kBacklogMessages; ++i) {
      absl::StatusOr<inferq::Message> msg = m.Next(absl::Seconds(10));
      if (!msg.ok()) return Fail(state, "Next: " + std::string(msg.status().message()));
      if (msg->stream_seq() != static_cast<std::uint64_t>(i) + 1) return Fail(state, "out of order");
      if (!msg->Ack().ok()) return Fail(state, "Ack");
    }
    const std::int64_t t2 = NowNs();
    state.counters["recovery_ms"] = static_cast<double>(t1 - t0) / 1e6;
    state.counters["drain_msgs_per_s"] = kBacklogMessages / (static_cast<double>(t2 - t1) / 1e9);
    state.counters["peak_rss_mb"] = PeakRssMb();
    state.PauseTiming();
    engine.reset();
    state.ResumeTiming();
  }
}

void BM_StreamRecoverJetStream(benchmark::State& state) {
  const fs::path dir = RecoverDir("jetstream");
  NatsServer server(dir);
  if (NeedsFill(dir)) {
    if (!server.Start()) return Fail(state, "nats-server did not start (is it installed?)");
    NatsClient c;
    if (!c.Connect(server.url()) || !AddJetStream(c.js)) return Fail(state, "connect / js_AddStream");
    const std::string payload = Payload(0);
    for (int i = 0; i < kRecoverMessages; ++i) {
      if (js_PublishAsync(c.js, "bench.req", payload.data(), static_cast<int>(payload.size()), nullptr) !=
          NATS_OK) {
        return Fail(state, "js_PublishAsync");
      }
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 120'000;
    if (js_PublishAsyncComplete(c.js, &po) != NATS_OK) return Fail(state, "js_PublishAsyncComplete");
    if (JetStreamMessages(c.js) != static_cast<std::uint64_t>(kRecoverMessages)) {
      return Fail(state, "JetStream does not hold every message");
    }
    server.Stop();
    MarkFilled(dir);
  }
  for (auto _ : state) {
    const std::int64_t t0 = NowNs();
    if (!server.Start()) return Fail(state, "nats-server did not start");
    NatsClient c;
    if (!c.Connect(server.url())) return Fail(state, "connect");
    while (JetStreamMessages(c.js) != static_cast<std::uint64_t>(kRecoverMessages)) {
      if (NowNs() - t0 > 120'000'000'000) return Fail(state, "the stream did not come back");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    state.counters["recovery_ms"] = static_cast<double>(NowNs() - t0) / 1e6;
    state.counters["rss_mb"] = RssMb(server.pid());
    state.PauseTiming();
    server.Stop();
    state.ResumeTiming();
  }
}

void BM_StreamRecoverSqlite(benchmark::State& state) {
  const fs::path dir = RecoverDir("sqlite");
  if (NeedsFill(dir)) {
    SqliteQueue q;
    if (!q.Open(dir / "q.sqlite")) return Fail(state, "sqlite open");
    sqlite3_exec(q.db, "BEGIN", nullptr, nullptr, nullptr);  // one transaction: filling only
    const std::string payload = Payload(0);
    for (int i = 0; i < kRecoverMessages; ++i) {
      if (!q.Insert(payload)) return Fail(state, "INSERT");
    }
    sqlite3_exec(q.db, "COMMIT", nullptr, nullptr, nullptr);
    MarkFilled(dir);
  }
  for (auto _ : state) {
    const double before = RssMb(0);
    const std::int64_t t0 = NowNs();
    SqliteQueue q;
    if (!q.Open(dir / "q.sqlite")) return Fail(state, "sqlite open");
    sqlite3_stmt* count = nullptr;
    sqlite3_prepare_v2(q.db, "SELECT count(*) FROM q", -1, &count, nullptr);
    const bool ok = sqlite3_step(count) == SQLITE_ROW && sqlite3_column_int64(count, 0) == kRecoverMessages;
    sqlite3_finalize(count);
    if (!ok) return Fail(state, "sqlite count");
    state.counters["recovery_ms"] = static_cast<double>(NowNs() - t0) / 1e6;
    state.counters["rss_mb"] = RssMb(0) - before;
  }
}

void PublishArgs(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(8)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
}
void PubAckArgs(benchmark::internal::Benchmark* b) {
  b->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(BM_StreamPublish, inferq_crash, Impl::kInferq, false)->Name("BM_StreamPublish/inferq/crash")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPublish, jetstream_crash, Impl::kJetStream, false)->Name("BM_StreamPublish/jetstream/crash")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPublish, inferq_power, Impl::kInferq, true)->Name("BM_StreamPublish/inferq/power")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPublish, sqlite_power, Impl::kSqlite, true)->Name("BM_StreamPublish/sqlite/power")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPublish, inferq_async_power, Impl::kInferqAsync, true)->Name("BM_StreamPublish/inferq_async256/power")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPublish, sqlite_batch_power, Impl::kSqliteBatch, true)->Name("BM_StreamPublish/sqlite_batch256/power")->Apply(PublishArgs);
BENCHMARK_CAPTURE(BM_StreamPubAck, inferq_crash, Impl::kInferq, false)->Name("BM_StreamPubAck/inferq/crash")->Apply(PubAckArgs);
BENCHMARK_CAPTURE(BM_StreamPubAck, jetstream_crash, Impl::kJetStream, false)->Name("BM_StreamPubAck/jetstream/crash")->Apply(PubAckArgs);
BENCHMARK_CAPTURE(BM_StreamPubAck, inferq_power, Impl::kInferq, true)->Name("BM_StreamPubAck/inferq/power")->Apply(PubAckArgs);
BENCHMARK_CAPTURE(BM_StreamPubAck, sqlite_power, Impl::kSqlite, true)->Name("BM_StreamPubAck/sqlite/power")->Apply(PubAckArgs);
BENCHMARK(BM_StreamRecoverInferq)->Name("BM_StreamRecover/inferq")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamBacklog)->Name("BM_StreamBacklog/inferq")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamRecoverJetStream)->Name("BM_StreamRecover/jetstream")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_StreamRecoverSqlite)->Name("BM_StreamRecover/sqlite")->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
