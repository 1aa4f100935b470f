// bench_bridge: the NATS bridge (inferq::nats) against raw nats.c on the same
// subjects and against the in-process path, in one binary and one run
// (BENCHMARKS.md records the figures and ratios). Each benchmark starts its own
// nats-server with JetStream on a free loopback port, its store in a temporary
// directory, and stops it. 256-byte payloads carrying their publish time.
//
//   BM_Bridge/raw_nats
//       The floor: a publisher thread js_PublishAsync's to a JetStream stream (up to
//       1024 PubAcks outstanding); a consumer thread fetches from a durable pull
//       consumer (256 at a time) and acks each message (natsMsg_Ack).
//   BM_Bridge/raw_nats_msg_id
//       The same with a Nats-Msg-Id header on every message (js_PublishMsgAsync), as
//       a producer that relies on JetStream's duplicate window sends it, and as the
//       bridge's export does: the server then also keeps each id for its window.
//   BM_Bridge/inferq
//       The same messages through two engines and two bridges: a publisher thread
//       Publishes into engine A's stream; bridge A exports it to the JetStream stream
//       (local ack after the PubAck, 1024 in flight); bridge B imports it through a
//       durable pull consumer (fetch 256) into engine B's stream (NATS ack after the
//       publish); a consumer thread of engine B pulls (NextBatch) and acks.
//   BM_Bridge/in_process
//       One engine: a publisher thread Publishes, a consumer thread pulls and acks.
//
// The local streams are work queues (RetentionPolicy::kWorkQueue: a message is gone
// once acked), as an outbox that a bridge forwards and an inbox that a worker drains
// are; with the default kLimits every message of the run stays in memory, and the
// pool growth that costs (page faults on fresh chunks) would be measured instead of
// the path.
//
// Each iteration moves kMessages messages from the first publish to the last
// delivery. Counters: msgs_per_s, p50_us / p99_us from publish to delivery, and
// client_cpu_us_per_msg / server_cpu_us_per_msg: CPU time (user + system, every
// thread) of this process and of nats-server per message, from /proc, in flooded
// runs: on a machine whose cores are all busy, throughput follows the CPU a message
// costs.
// With /paced, the publisher waits for each message's delivery before it sends the
// next (kPacedMessages of them): the latency of one message through an idle path,
// where the flooded runs measure mostly queueing.
#include <nats/nats.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "../tests/adapters/nats_server.hpp"
#include "bench_util.hpp"
#include "inferq/adapters/nats/bridge.hpp"
#include "inferq/base/histogram.hpp"
#include "inferq/engine/engine.hpp"

namespace {

constexpr int kMessages = 20'000;
constexpr int kPacedMessages = 2'000;
// Deliveries so far in the running iteration (the paced publisher waits on it).
std::atomic<int> g_delivered{0};

int Count(const benchmark::State& state) { return state.range(0) == 1 ? kPacedMessages : kMessages; }

// In paced mode: waits until message `i` (0-based) was delivered.
void Pace(const benchmark::State& state, int i) {
  if (state.range(0) != 1) return;
  while (g_delivered.load(std::memory_order_acquire) <= i) std::this_thread::yield();
}
constexpr std::size_t kPayloadBytes = 256;

using inferq_bench::NowNs;

std::string Payload() {
  std::string p(kPayloadBytes, 'x');
  const std::int64_t t = NowNs();
  std::memcpy(p.data(), &t, sizeof t);
  return p;
}

std::int64_t SentAt(const void* data) {
  std::int64_t t;
  std::memcpy(&t, data, sizeof t);
  return t;
}

// CPU time (user + system, all threads) of another process, in µs: getrusage
// (inferq_bench::ProcessCpuSeconds) reads only this one.
double OtherProcessCpuMicros(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  // Fields after the command's closing parenthesis; utime and stime are the 12th
  // and 13th of them (proc(5): fields 14 and 15), in clock ticks.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i) {
    if (i >= 12) ticks += std::stod(field);
  }
  return ticks * 1e6 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// CPU time of this process and of the server over the benchmark's iterations.
struct CpuMeter {
  pid_t server;
  double self0;
  double server0;
  explicit CpuMeter(pid_t server_pid)
      : server(server_pid),
        self0(inferq_bench::ProcessCpuSeconds() * 1e6),
        server0(server_pid > 0 ? OtherProcessCpuMicros(server_pid) : 0) {}
  void Report(benchmark::State& state, int messages) const {
    if (state.range(0) == 1) return;  // paced: the publisher's wait for each delivery spins
    state.counters["client_cpu_us_per_msg"] = (inferq_bench::ProcessCpuSeconds() * 1e6 - self0) / messages;
    if (server > 0) state.counters["server_cpu_us_per_msg"] = (OtherProcessCpuMicros(server) - server0) / messages;
  }
};

void Report(benchmark::State& state, double seconds, inferq::Histogram& lat) {
  const inferq::HistogramSnapshot h = lat.Snapshot();
  state.counters["msgs_per_s"] =
      benchmark::Counter(static_cast<double>(Count(state)) * static_cast<double>(state.iterations()) / seconds);
  state.counters["p50_us"] = static_cast<double>(h.Percentile(0.50)) / 1e3;
  state.counters["p99_us"] = static_cast<double>(h.Percentile(0.99)) / 1e3;
}

bool AddStream(jsCtx* js, const char* name, const char* subject) {
  jsStreamConfig c;
  jsStreamConfig_Init(&c);
  const char* subjects[] = {subject};
  c.Name = name;
  c.Subjects = subjects;
  c.SubjectsLen = 1;
  c.Storage = js_FileStorage;
  jsStreamInfo* si = nullptr;
  const bool ok = js_AddStream(&si, js, &c, nullptr, nullptr) == NATS_OK;
  if (si != nullptr) jsStreamInfo_Destroy(si);
  return ok;
}

void BM_BridgeRaw(benchmark::State& state, bool with_msg_id) {
  std::uint64_t next_id = 0;
  inferq_test::TempDir dir;
  inferq_test::NatsServer server(dir.path());
  if (!server.Start()) return state.SkipWithError("nats-server did not start");
  natsConnection* pub_nc = nullptr;
  natsConnection* sub_nc = nullptr;
  jsCtx* pub_js = nullptr;
  jsCtx* sub_js = nullptr;
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.PublishAsync.MaxPending = 1024;
  jo.Wait = 10'000;
  if (natsConnection_ConnectTo(&pub_nc, server.url().c_str()) != NATS_OK ||
      natsConnection_ConnectTo(&sub_nc, server.url().c_str()) != NATS_OK ||
      natsConnection_JetStream(&pub_js, pub_nc, &jo) != NATS_OK ||
      natsConnection_JetStream(&sub_js, sub_nc, &jo) != NATS_OK || !AddStream(pub_js, "BENCH", "bench.>")) {
    return state.SkipWithError("cannot set up JetStream");
  }
  natsSubscription* sub = nullptr;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = "BENCH";
  so.Config.AckPolicy = js_AckExplicit;
  so.ManualAck = true;
  if (js_PullSubscribe(&sub, sub_js, "bench.>", "raw", nullptr, &so, nullptr) != NATS_OK) {
    return state.SkipWithError("cannot subscribe");
  }
  inferq::Histogram lat;
  double seconds = 0;
  const CpuMeter cpu(server.pid());
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    g_delivered.store(0);
    const int n = Count(state);
    std::thread consumer([&] {
      int got = 0;
      while (got < n) {
        natsMsgList list{};
        if (natsSubscription_Fetch(&list, sub, 256, 5000, nullptr) != NATS_OK) continue;
        for (int i = 0; i < list.Count; ++i) {
          lat.Record(static_cast<std::uint64_t>(NowNs() - SentAt(natsMsg_GetData(list.Msgs[i]))));
          natsMsg_Ack(list.Msgs[i], nullptr);
          ++got;
          g_delivered.store(got, std::memory_order_release);
        }
        natsMsgList_Destroy(&list);
      }
    });
    for (int i = 0; i < n; ++i) {
      const std::string p = Payload();
      if (with_msg_id) {
        // As the bridge sends it: a message id for JetStream's duplicate window.
        natsMsg* m = nullptr;
        natsMsg_Create(&m, "bench.x", nullptr, p.data(), static_cast<int>(p.size()));
        const std::string id = "raw." + std::to_string(next_id++);
        natsMsgHeader_Set(m, "Nats-Msg-Id", id.c_str());
        while (js_PublishMsgAsync(pub_js, &m, nullptr) != NATS_OK) {
        }
      } else {
        while (js_PublishAsync(pub_js, "bench.x", p.data(), static_cast<int>(p.size()), nullptr) != NATS_OK) {
        }
      }
      Pace(state, i);
    }
    js_PublishAsyncComplete(pub_js, nullptr);
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
  cpu.Report(state, Count(state) * static_cast<int>(state.iterations()));
  natsSubscription_Destroy(sub);
  jsCtx_Destroy(pub_js);
  jsCtx_Destroy(sub_js);
  natsConnection_Destroy(pub_nc);
  natsConnection_Destroy(sub_nc);
}

void Drain(const benchmark::State& state, inferq::Member& m, inferq::Histogram& lat) {
  int got = 0;
  const int n = Count(state);
  while (got < n) {
    auto batch = m.NextBatch(256, absl::ZeroDuration(), absl::Seconds(5));
    if (!batch.ok()) continue;
    for (inferq::Message& msg : *batch) {
      lat.Record(static_cast<std::uint64_t>(NowNs() - SentAt(msg.event().payload.data())));
      (void)msg.Ack();
      ++got;
      g_delivered.store(got, std::memory_order_release);
    }
  }
}

void PublishAll(const benchmark::State& state, inferq::Engine& e, const char* subject) {
  const int n = Count(state);
  for (int i = 0; i < n; ++i) {
    inferq::Event ev;
    ev.subject = subject;
    ev.payload = inferq::Buffer::FromString(Payload());
    (void)e.Publish(std::move(ev));
    Pace(state, i);
  }
}

void BM_BridgeInferq(benchmark::State& state) {
  inferq_test::TempDir dir;
  inferq_test::NatsServer server(dir.path());
  if (!server.Start()) return state.SkipWithError("nats-server did not start");
  {
    natsConnection* nc = nullptr;
    jsCtx* js = nullptr;
    if (natsConnection_ConnectTo(&nc, server.url().c_str()) != NATS_OK ||
        natsConnection_JetStream(&js, nc, nullptr) != NATS_OK || !AddStream(js, "BENCH", "bench.>")) {
      return state.SkipWithError("cannot set up JetStream");
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
  }
  auto a = inferq::Engine::Create();
  auto b = inferq::Engine::Create();
  if (!a.ok() || !b.ok()) return state.SkipWithError("engine");
  (void)(*a)->AddStream({.name = "OUT", .subjects = {"out.>"}, .retention = inferq::RetentionPolicy::kWorkQueue,
                         .duplicate_window = absl::ZeroDuration()});
  (void)(*b)->AddStream({.name = "IN", .subjects = {"in.>"}, .retention = inferq::RetentionPolicy::kWorkQueue,
                         .duplicate_window = absl::ZeroDuration()});
  auto sink = (*b)->AddConsumer({.stream = "IN", .name = "sink", .deliver = inferq::DeliverPolicy::kAll});
  inferq::nats::BridgeOptions oa;
  oa.connection.servers = {server.url()};
  oa.origin = "a";
  inferq::nats::BridgeOptions ob = oa;
  ob.origin = "b";
  auto ba = inferq::nats::NatsBridge::Connect(**a, oa);
  auto bb = inferq::nats::NatsBridge::Connect(**b, ob);
  for (const absl::Status& st : {sink.status(), ba.status(), bb.status()}) {
    if (!st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  }
  if (absl::Status st = (*ba)->AddExport(
          {.consumer = {.stream = "OUT", .name = "to-nats", .deliver = inferq::DeliverPolicy::kAll}, .subject_prefix = "bench"});
      !st.ok()) {
    return state.SkipWithError(("AddExport: " + std::string(st.message())).c_str());
  }
  if (absl::Status st = (*bb)->AddImport({.stream = "BENCH", .durable = "b", .filter_subject = "bench.out.>",
                                          .strip_prefix = "bench.out", .add_prefix = "in", .fetch_batch = 256});
      !st.ok()) {
    return state.SkipWithError(("AddImport: " + std::string(st.message())).c_str());
  }
  auto member = sink->member(0);
  inferq::Histogram lat;
  double seconds = 0;
  const CpuMeter cpu(server.pid());
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    g_delivered.store(0);
    std::thread consumer([&] { Drain(state, *member, lat); });
    PublishAll(state, **a, "out.x");
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
  cpu.Report(state, Count(state) * static_cast<int>(state.iterations()));
  state.counters["export_failures"] = static_cast<double>((*ba)->Stats().export_failures);
  state.counters["import_refused"] = static_cast<double>((*bb)->Stats().import_refused);
}

void BM_BridgeInProcess(benchmark::State& state) {
  auto e = inferq::Engine::Create();
  if (!e.ok()) return state.SkipWithError("engine");
  (void)(*e)->AddStream({.name = "S", .subjects = {"in.>"}, .retention = inferq::RetentionPolicy::kWorkQueue,
                         .duplicate_window = absl::ZeroDuration()});
  auto c = (*e)->AddConsumer({.stream = "S", .name = "sink", .deliver = inferq::DeliverPolicy::kAll});
  auto member = c->member(0);
  inferq::Histogram lat;
  double seconds = 0;
  const CpuMeter cpu(0);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    g_delivered.store(0);
    std::thread consumer([&] { Drain(state, *member, lat); });
    PublishAll(state, **e, "in.x");
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
  cpu.Report(state, Count(state) * static_cast<int>(state.iterations()));
}

// Arg 0: flooded (the publisher runs ahead as far as the path lets it); 1: paced.
void Modes(benchmark::internal::Benchmark* b) {
  b->ArgName("paced")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
}
BENCHMARK_CAPTURE(BM_BridgeRaw, plain, false)->Name("BM_Bridge/raw_nats")->Apply(Modes);
BENCHMARK_CAPTURE(BM_BridgeRaw, msg_id, true)->Name("BM_Bridge/raw_nats_msg_id")->Apply(Modes);
BENCHMARK(BM_BridgeInferq)->Name("BM_Bridge/inferq")->Apply(Modes);
BENCHMARK(BM_BridgeInProcess)->Name("BM_Bridge/in_process")->Apply(Modes);

}  // namespace

BENCHMARK_MAIN();
