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
//   BM_Bridge/inferq
//       The same messages through two engines and two bridges: a publisher thread
//       Publishes into engine A's stream; bridge A exports it to the JetStream stream
//       (local ack after the PubAck, 1024 in flight); bridge B imports it through a
//       durable pull consumer (fetch 256) into engine B's stream (NATS ack after the
//       publish); a consumer thread of engine B pulls (NextBatch) and acks.
//   BM_Bridge/in_process
//       One engine: a publisher thread Publishes, a consumer thread pulls and acks.
//
// Each iteration moves kMessages messages from the first publish to the last
// delivery. Counters: msgs_per_s, and p50_us / p99_us from publish to delivery.
// With /paced, the publisher waits for each message's delivery before it sends the
// next (kPacedMessages of them): the latency of one message through an idle path,
// where the flooded runs measure mostly queueing.
#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "../tests/adapters/nats_server.hpp"
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

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

void BM_BridgeRaw(benchmark::State& state) {
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
      while (js_PublishAsync(pub_js, "bench.x", p.data(), static_cast<int>(p.size()), nullptr) != NATS_OK) {
      }
      Pace(state, i);
    }
    js_PublishAsyncComplete(pub_js, nullptr);
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
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
  (void)(*a)->AddStream({.name = "OUT", .subjects = {"out.>"}, .duplicate_window = absl::ZeroDuration()});
  (void)(*b)->AddStream({.name = "IN", .subjects = {"in.>"}, .duplicate_window = absl::ZeroDuration()});
  auto sink = (*b)->AddConsumer({.stream = "IN", .name = "sink"});
  inferq::nats::BridgeOptions oa;
  oa.connection.servers = {server.url()};
  oa.origin = "a";
  inferq::nats::BridgeOptions ob = oa;
  ob.origin = "b";
  auto ba = inferq::nats::NatsBridge::Connect(**a, oa);
  auto bb = inferq::nats::NatsBridge::Connect(**b, ob);
  if (!sink.ok() || !ba.ok() || !bb.ok()) return state.SkipWithError("bridge");
  if (!(*ba)->AddExport({.consumer = {.stream = "OUT", .name = "to-nats"}, .subject_prefix = "bench"}).ok() ||
      !(*bb)->AddImport({.stream = "BENCH", .durable = "b", .filter_subject = "bench.>",
                         .strip_prefix = "bench.out", .add_prefix = "in", .fetch_batch = 256})
           .ok()) {
    return state.SkipWithError("export/import");
  }
  auto member = sink->member(0);
  inferq::Histogram lat;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    g_delivered.store(0);
    std::thread consumer([&] { Drain(state, *member, lat); });
    PublishAll(state, **a, "out.x");
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
  state.counters["export_failures"] = static_cast<double>((*ba)->Stats().export_failures);
  state.counters["import_refused"] = static_cast<double>((*bb)->Stats().import_refused);
}

void BM_BridgeInProcess(benchmark::State& state) {
  auto e = inferq::Engine::Create();
  if (!e.ok()) return state.SkipWithError("engine");
  (void)(*e)->AddStream({.name = "S", .subjects = {"in.>"}, .duplicate_window = absl::ZeroDuration()});
  auto c = (*e)->AddConsumer({.stream = "S", .name = "sink"});
  auto member = c->member(0);
  inferq::Histogram lat;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    g_delivered.store(0);
    std::thread consumer([&] { Drain(state, *member, lat); });
    PublishAll(state, **e, "in.x");
    consumer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Report(state, seconds, lat);
}

// Arg 0: flooded (the publisher runs ahead as far as the path lets it); 1: paced.
void Modes(benchmark::internal::Benchmark* b) {
  b->ArgName("paced")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
}
BENCHMARK(BM_BridgeRaw)->Name("BM_Bridge/raw_nats")->Apply(Modes);
BENCHMARK(BM_BridgeInferq)->Name("BM_Bridge/inferq")->Apply(Modes);
BENCHMARK(BM_BridgeInProcess)->Name("BM_Bridge/in_process")->Apply(Modes);

}  // namespace

BENCHMARK_MAIN();
