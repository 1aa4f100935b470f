// bench_metrics: what exporting the engine's metrics costs its data path. One
// publisher thread publishes kMessages events into a work-queue stream and a consumer
// thread pulls (NextBatch) and acks them, while Prometheus' part is played by a
// thread that scrapes a MetricsServer over HTTP (EngineCollector: one Engine::Stats()
// and its exposition per scrape) every 100 ms, or not at all:
//
//   BM_PublishScrape/none          no MetricsServer, no scrapes
//   BM_PublishScrape/every_100ms   a scrape every 100 ms (10x Prometheus' usual
//                                  fastest interval of 1 s)
//
// Counters: msgs_per_s (publish to last ack), scrapes, and the scrape's own latency
// (scrape_ms, the mean) and size (exposition_bytes). BENCHMARKS.md records the ratio.
//
// The same for trace spans (engine/trace.hpp), sent by an OtlpHttpExporter to an
// OTLP/HTTP receiver on loopback in the same process (tests/adapters/http_receiver.hpp:
// it reads each request and answers 200), when inferq::otlp is built:
//
//   BM_PublishTraced/none        no sink
//   BM_PublishTraced/otlp_0.01   1 % of events traced (4 spans each: publish,
//                                queue_wait, deliver, ack)
//   BM_PublishTraced/otlp_1      every event traced
//
// Counters: msgs_per_s, spans (exported), dropped (the exporter's queue was full),
// requests (HTTP posts). The exporter's thread and the receiver run on the same two
// cores as the publisher and the member: their CPU is part of the cost.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <benchmark/benchmark.h>

#include "../tests/adapters/http_get.hpp"
#include "bench_util.hpp"
#include "inferq/adapters/prometheus/engine_collector.hpp"
#include "inferq/adapters/prometheus/metrics_server.hpp"
#include "inferq/engine/engine.hpp"
#ifdef INFERQ_BENCH_OTLP
#include "../tests/adapters/http_receiver.hpp"
#include "inferq/adapters/otlp/otlp_exporter.hpp"
#endif

namespace {

constexpr int kMessages = 300'000;

void BM_PublishScrape(benchmark::State& state, bool scrape) {
  auto engine = inferq::Engine::Create().value();
  // Four streams with a consumer each (two members but for S0's): the exposition of a small
  // deployment (some 300 series), not of an empty engine.
  for (int s = 0; s < 4; ++s) {
    const std::string name = "S" + std::to_string(s);
    if (!engine->AddStream({.name = name, .subjects = {"work" + std::to_string(s) + ".>"},
                            .retention = inferq::RetentionPolicy::kWorkQueue,
                            .duplicate_window = absl::ZeroDuration()})
             .ok()) {
      return state.SkipWithError("AddStream");
    }
  }
  std::vector<inferq::Consumer> consumers;
  for (int s = 0; s < 4; ++s) {
    // S0's consumer, the one the benchmark drains, has one member: one drainer
    // thread beside the publisher on 2 vCPUs.
    auto c = engine->AddConsumer({.stream = "S" + std::to_string(s), .name = "c",
                                  .deliver = inferq::DeliverPolicy::kAll, .members = s == 0 ? 1u : 2u});
    if (!c.ok()) return state.SkipWithError(std::string(c.status().message()).c_str());
    consumers.push_back(*c);
  }
  std::unique_ptr<inferq::prometheus::MetricsServer> server;
  if (scrape) {
    auto s = inferq::prometheus::MetricsServer::Start({});
    if (!s.ok()) return state.SkipWithError(std::string(s.status().message()).c_str());
    server = std::move(*s);
    server->Add(std::make_shared<inferq::prometheus::EngineCollector>(*engine));
  }
  inferq::Member m0 = *consumers[0].member(0);
  double seconds = 0;
  std::uint64_t scrapes = 0, scrape_ns = 0, bytes = 0;
  for (auto _ : state) {
    std::atomic<bool> done{false};
    std::atomic<int> acked{0};
    auto drain = [&](inferq::Member& m) {
      while (acked.load(std::memory_order_relaxed) < kMessages) {
        auto batch = m.NextBatch(64, absl::ZeroDuration(), absl::Milliseconds(20));
        if (!batch.ok()) continue;
        for (inferq::Message& msg : *batch) (void)msg.Ack();
        acked.fetch_add(static_cast<int>(batch->size()), std::memory_order_relaxed);
      }
    };
    std::thread d0([&] { drain(m0); });
    std::thread scraper([&] {
      if (!scrape) return;
      std::int64_t next = inferq_bench::NowNs();
      while (!done.load()) {
        next += 100'000'000;
        inferq_bench::SleepUntilNs(next);
        if (done.load()) break;
        const std::int64_t t0 = inferq_bench::NowNs();
        auto r = inferq_test::HttpGet(server->port(), "/metrics");
        if (r && r->status == 200) {
          ++scrapes;
          scrape_ns += static_cast<std::uint64_t>(inferq_bench::NowNs() - t0);
          bytes = r->body.size();
        }
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kMessages; ++i) {
      inferq::Event e;
      e.subject = "work0.x";
      (void)engine->Publish(std::move(e));
    }
    d0.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done.store(true);
    scraper.join();
  }
  state.counters["msgs_per_s"] =
      benchmark::Counter(static_cast<double>(kMessages) * static_cast<double>(state.iterations()) / seconds);
  state.counters["scrapes"] = static_cast<double>(scrapes);
  if (scrapes > 0) {
    state.counters["scrape_ms"] = static_cast<double>(scrape_ns) / static_cast<double>(scrapes) / 1e6;
    state.counters["exposition_bytes"] = static_cast<double>(bytes);
  }
}

#ifdef INFERQ_BENCH_OTLP
void BM_PublishTraced(benchmark::State& state, double ratio) {
  inferq_test::HttpReceiver receiver;
  receiver.KeepRequests(false);
  std::shared_ptr<inferq::otlp::OtlpHttpExporter> exporter;
  inferq::EngineOptions options;
  if (ratio > 0) {
    auto e = inferq::otlp::OtlpHttpExporter::Create(
        {.endpoint = receiver.url("/v1/traces"), .schedule_delay = absl::Milliseconds(200)});  // queue 2048
    if (!e.ok()) return state.SkipWithError(std::string(e.status().message()).c_str());
    exporter = *e;
    options.trace = {.sink = exporter, .sample_ratio = ratio};
  }
  auto engine = inferq::Engine::Create(std::move(options)).value();
  if (!engine->AddStream({.name = "S", .subjects = {"work.>"}, .retention = inferq::RetentionPolicy::kWorkQueue,
                          .duplicate_window = absl::ZeroDuration()})
           .ok()) {
    return state.SkipWithError("AddStream");
  }
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .deliver = inferq::DeliverPolicy::kAll});
  if (!c.ok()) return state.SkipWithError(std::string(c.status().message()).c_str());
  inferq::Member m = *c->member(0);
  double seconds = 0;
  for (auto _ : state) {
    std::atomic<int> acked{0};
    std::thread drainer([&] {
      while (acked.load(std::memory_order_relaxed) < kMessages) {
        auto batch = m.NextBatch(64, absl::ZeroDuration(), absl::Milliseconds(20));
        if (!batch.ok()) continue;
        for (inferq::Message& msg : *batch) (void)msg.Ack();
        acked.fetch_add(static_cast<int>(batch->size()), std::memory_order_relaxed);
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kMessages; ++i) {
      inferq::Event e;
      e.subject = "work.x";
      (void)engine->Publish(std::move(e));
    }
    drainer.join();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.counters["msgs_per_s"] =
      benchmark::Counter(static_cast<double>(kMessages) * static_cast<double>(state.iterations()) / seconds);
  if (exporter != nullptr) {
    (void)exporter->ForceFlush(absl::Seconds(60));
    const inferq::otlp::OtlpExporterStats st = exporter->stats();
    state.counters["spans"] = static_cast<double>(st.exported);
    state.counters["dropped"] = static_cast<double>(st.dropped);
    state.counters["requests"] = static_cast<double>(st.requests);
  }
}
#endif

// The parts of one scrape of the engine above, each alone: Engine::Stats(), its
// families, and the text exposition (what the server sends).
void BM_ScrapeParts(benchmark::State& state) {
  auto engine = inferq::Engine::Create().value();
  for (int s = 0; s < 4; ++s) {
    const std::string name = "S" + std::to_string(s);
    (void)engine->AddStream({.name = name, .subjects = {"work" + std::to_string(s) + ".>"},
                             .retention = inferq::RetentionPolicy::kWorkQueue});
    (void)engine->AddConsumer({.stream = name, .name = "c", .deliver = inferq::DeliverPolicy::kAll, .members = 2});
  }
  const inferq::prometheus::EngineCollector collector(*engine);
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0: benchmark::DoNotOptimize(engine->Stats()); break;
      case 1: benchmark::DoNotOptimize(collector.Collect()); break;
      default: benchmark::DoNotOptimize(inferq::prometheus::ExpositionText(collector)); break;
    }
  }
}

}  // namespace

BENCHMARK(BM_ScrapeParts)->ArgName("stats0_families1_text2")->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_PublishScrape, none, false)
    ->Name("BM_PublishScrape/none")
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PublishScrape, every_100ms, true)
    ->Name("BM_PublishScrape/every_100ms")
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

#ifdef INFERQ_BENCH_OTLP
BENCHMARK_CAPTURE(BM_PublishTraced, none, 0.0)->Name("BM_PublishTraced/none")->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PublishTraced, otlp_001, 0.01)
    ->Name("BM_PublishTraced/otlp_0.01")
    ->Iterations(3)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_PublishTraced, otlp_1, 1.0)->Name("BM_PublishTraced/otlp_1")->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

BENCHMARK_MAIN();
