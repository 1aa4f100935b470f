// Tests of the NATS bridge (inferq/adapters/nats/bridge.hpp) against real nats-server
// processes started by each test (tests/adapters/nats_server.hpp).
#include "inferq/adapters/nats/bridge.hpp"

#include <catch2/catch.hpp>
#include <nats/nats.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "inferq/event/traceparent.hpp"
#include "nats_test_util.hpp"
#include "../engine/span_recorder.hpp"

using namespace inferq;
using namespace inferq::nats;
using namespace inferq_test;


TEST_CASE("nats bridge: bad options and unreachable servers are refused") {
  auto engine = NewEngine();
  BridgeOptions none;
  auto b = NatsBridge::Connect(*engine, none);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) == "BridgeOptions.connection.servers is empty");
  BridgeOptions two;
  two.connection.servers = {"nats://127.0.0.1:1"};
  two.connection.user = "u";
  two.connection.token = "t";
  b = NatsBridge::Connect(*engine, two);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
  BridgeOptions origin;
  origin.connection.servers = {"nats://127.0.0.1:1"};
  origin.origin = "has space";
  b = NatsBridge::Connect(*engine, origin);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) == "BridgeOptions.origin 'has space' may hold only [A-Za-z0-9_.-]");
  // An infinite or negative forming wait is refused before anything connects (an
  // infinite one overflowed AddImport's deadline, now() + the wait).
  BridgeOptions forming;
  forming.connection.servers = {"nats://127.0.0.1:1"};
  forming.connection.jetstream_forming_wait = absl::InfiniteDuration();
  b = NatsBridge::Connect(*engine, forming);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) ==
        "BridgeOptions.connection.jetstream_forming_wait inf is not in 0..365 days (kMaxDuration)");
  forming.connection.jetstream_forming_wait = absl::Seconds(-1);
  b = NatsBridge::Connect(*engine, forming);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) ==
        "BridgeOptions.connection.jetstream_forming_wait -1s is not in 0..365 days (kMaxDuration)");
  forming.connection.jetstream_forming_wait = absl::ZeroDuration();
  forming.connection.connect_timeout = absl::InfiniteDuration();
  b = NatsBridge::Connect(*engine, forming);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) ==
        "BridgeOptions.connection.connect_timeout inf is not in 0..365 days (kMaxDuration)");
  forming.connection.connect_timeout = absl::Seconds(2);
  forming.connection.connect_wait = absl::Seconds(-2);
  b = NatsBridge::Connect(*engine, forming);
  REQUIRE_FALSE(b.ok());
  CHECK(std::string(b.status().message()) ==
        "BridgeOptions.connection.connect_wait -2s is not in 0..365 days (kMaxDuration)");
  BridgeOptions down;
  down.connection.servers = {"nats://127.0.0.1:" + std::to_string(inferq_test::FreeLoopbackPort())};
  b = NatsBridge::Connect(*engine, down);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(b.status().message()).rfind("cannot connect to NATS at '" + down.connection.servers[0] + "': ", 0) == 0);
  // With a connect_wait, the error says how long and how often it tried.
  down.connection.connect_wait = absl::Milliseconds(350);
  down.connection.reconnect_wait = absl::Milliseconds(100);
  b = NatsBridge::Connect(*engine, down);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == absl::StatusCode::kUnavailable);
  const std::string msg(b.status().message());
  CHECK(msg.find("times for 350ms, ConnectionOptions.connect_wait)") != std::string::npos);
  CHECK(msg.find(" (tried 1 times") == std::string::npos);  // more than one try
}

TEST_CASE("nats bridge: Connect tries again for connect_wait while no server listens") {
  auto engine = NewEngine();
  TempDir dir;
  NatsServer server(dir.path());  // its port is chosen; it is not started yet
  BridgeOptions o;
  o.connection.servers = {server.url()};
  o.connection.connect_wait = absl::Seconds(60);
  o.connection.reconnect_wait = absl::Milliseconds(100);
  std::atomic<bool> returned{false};
  absl::StatusOr<std::unique_ptr<NatsBridge>> b = absl::UnknownError("not yet");
  std::thread connecting([&] {
    b = NatsBridge::Connect(*engine, o);
    returned = true;
  });
  // Connect keeps trying while nothing listens (it would have failed at once).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const bool waited = !returned.load();
  const bool started = server.Start();
  connecting.join();
  CHECK(waited);
  REQUIRE(started);
  REQUIRE(b.ok());
  CHECK((*b)->Stats().connected);
}

TEST_CASE_METHOD(OneServer, "nats bridge: export to JetStream acks locally only what JetStream stored") {
  client.AddStream("REMOTE", "site-a.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());

  SECTION("bad export configurations change nothing") {
    ExportConfig no_acks{.consumer = {.stream = "LOCAL", .name = "x", .ack = AckPolicy::kNone}};
    CHECK(std::string((*bridge)->AddExport(no_acks).message()) ==
          "ExportConfig.consumer 'x' must use AckPolicy::kExplicit: the bridge acks a message only once NATS has it");
    ExportConfig prefix{.consumer = {.stream = "LOCAL", .name = "x"}, .subject_prefix = "a.>"};
    CHECK(std::string((*bridge)->AddExport(prefix).message()) == "subject prefix 'a.>' is not a valid literal subject");
    ExportConfig window{.consumer = {.stream = "LOCAL", .name = "x"}, .max_in_flight = 0};
    CHECK(std::string((*bridge)->AddExport(window).message()) == "ExportConfig.max_in_flight 0 is not in 1..65536");
    CHECK(engine->Stats().consumers.empty());
  }

  SECTION("every event arrives with its attributes, and the local consumer has nothing pending") {
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "to-nats"},
                                  .subject_prefix = "site-a", .max_in_flight = 64})
                .ok());
    constexpr int kN = 500;
    for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Work(i)).ok());
    REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == kN; }));
    CHECK(client.Messages("REMOTE") == kN);
    const BridgeStats s = (*bridge)->Stats();
    CHECK(s.export_pending == 0);
    CHECK(s.export_failures == 0);
    CHECK(s.connected);
    const EngineStats es = engine->Stats();
    const ConsumerStats* c = es.consumer("LOCAL", "to-nats");
    REQUIRE(c != nullptr);
    CHECK(c->acked == kN);
    const ComponentStats* component = es.component("nats_bridge.site-a");
    REQUIRE(component != nullptr);
    CHECK(component->value("exported_total") == std::optional<double>(kN));
    CHECK(component->value("connected") == std::optional<double>(1));
    CHECK(component->value("export_pending") == std::optional<double>(0));
    CHECK(component->detail.empty());
    // A second bridge of the same origin on this engine is refused; closing the first
    // takes its figures out of the engine's stats.
    CHECK(NatsBridge::Connect(*engine, Options(server, "site-a")).status().code() ==
          absl::StatusCode::kAlreadyExists);
    (*bridge)->Close();
    const EngineStats after = engine->Stats();
    CHECK(after.component("nats_bridge.site-a") == nullptr);
    CHECK(c->ack_pending == 0);
    std::vector<natsMsg*> msgs = client.ReadAll("REMOTE", kN);
    REQUIRE(msgs.size() == kN);
    std::set<std::string> ids;
    for (natsMsg* m : msgs) {
      CHECK(std::string(natsMsg_GetSubject(m)) == "site-a.work.item");
      const char* v = nullptr;
      REQUIRE(natsMsgHeader_Get(m, "Nats-Msg-Id", &v) == NATS_OK);
      const std::string id = v;
      ids.insert(id);
      REQUIRE(natsMsgHeader_Get(m, "i", &v) == NATS_OK);
      CHECK(id == "m-" + std::string(v));
      CHECK(std::string(natsMsg_GetData(m), static_cast<std::size_t>(natsMsg_GetDataLength(m))) ==
            "payload-" + std::string(v));
      REQUIRE(natsMsgHeader_Get(m, "Inferq-Tenant", &v) == NATS_OK);
      CHECK(std::string(v) == "acme");
      REQUIRE(natsMsgHeader_Get(m, "Inferq-Origin", &v) == NATS_OK);
      CHECK(std::string(v) == "site-a");
      natsMsg_Destroy(m);
    }
    CHECK(ids.size() == kN);
  }

  SECTION("at most max_in_flight PubAcks are outstanding, and the export goes on as they come") {
    // The export waits for room and is woken once a quarter of the window is free:
    // windows of 1, 2 and 5 (resume at 0, 1 and 3 in flight) must neither exceed
    // the window nor stall.
    const std::size_t window = GENERATE(1u, 2u, 5u);
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "to-nats"},
                                  .subject_prefix = "site-a", .max_in_flight = window})
                .ok());
    constexpr int kN = 300;
    std::atomic<bool> done{false};
    std::atomic<std::uint64_t> most{0};
    std::thread watcher([&] {
      while (!done.load()) {
        const std::uint64_t now = (*bridge)->Stats().export_pending;
        if (now > most.load()) most.store(now);
      }
    });
    for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Work(i)).ok());
    const bool all = WaitFor([&] { return (*bridge)->Stats().exported == kN; });
    done.store(true);
    watcher.join();
    INFO("window " << window);
    REQUIRE(all);
    CHECK(most.load() <= window);
    CHECK(most.load() >= 1);
    CHECK(client.Messages("REMOTE") == kN);
    CHECK((*bridge)->Stats().export_pending == 0);
  }
}

TEST_CASE_METHOD(OneServer, "nats bridge: import publishes into the engine and acks NATS after") {
  client.AddStream("REQS", "site-b.>");
  constexpr int kN = 300;
  for (int i = 0; i < kN; ++i) {
    client.Publish("site-b.infer.req", "r" + std::to_string(i),
                   {{"Nats-Msg-Id", "id-" + std::to_string(i)}, {"Inferq-Qos", "gold"},
                    {"Inferq-Seq-No", std::to_string(i)}, {"custom", "c" + std::to_string(i)}});
  }
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"local.>"}, .duplicate_window = absl::Minutes(2)}).ok());
  auto consumer = engine->AddConsumer({.stream = "LOCAL", .name = "workers"});
  REQUIRE(consumer.ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());

  SECTION("a stream that does not exist is NotFound") {
    auto st = (*bridge)->AddImport({.stream = "NOPE", .durable = "d", .filter_subject = "x.>"});
    CHECK(st.code() == absl::StatusCode::kNotFound);
    CHECK(std::string(st.message()) == "JetStream stream 'NOPE' does not exist");
  }

  SECTION("every message arrives once, in order, with its attributes") {
    REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "site-a", .filter_subject = "site-b.>",
                                  .strip_prefix = "site-b", .add_prefix = "local"})
                .ok());
    auto member = consumer->member(0);
    REQUIRE(member.ok());
    for (int i = 0; i < kN; ++i) {
      auto m = member->Next(absl::Seconds(20));
      REQUIRE(m.ok());
      const Event& e = m->event();
      CHECK(e.subject == "local.infer.req");
      CHECK(e.msg_id == "id-" + std::to_string(i));
      CHECK(e.qos == Qos::kGold);
      CHECK(e.seq_no == static_cast<std::uint64_t>(i));
      CHECK(e.headers.Get("custom") == std::optional<std::string_view>("c" + std::to_string(i)));
      CHECK(e.payload.view() == "r" + std::to_string(i));
      REQUIRE(m->Ack().ok());
    }
    REQUIRE(WaitFor([&] { return client.ConsumerState("REQS", "site-a") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
    const BridgeStats s = (*bridge)->Stats();
    CHECK(s.imported == kN);
    CHECK(s.import_invalid == 0);
    CHECK(s.import_refused == 0);
    CHECK(member->Next(absl::Milliseconds(50)).status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

TEST_CASE_METHOD(OneServer, "nats bridge: two sites bridging the same subjects both ways do not loop") {
  client.AddStream("SHARED", "shared.>");
  auto a = NewEngine();
  auto b = NewEngine();
  for (Engine* e : {a.get(), b.get()}) {
    REQUIRE(e->AddStream({.name = "WORK", .subjects = {"work.>"}}).ok());
  }
  auto sink_a = a->AddConsumer({.stream = "WORK", .name = "sink"});
  auto sink_b = b->AddConsumer({.stream = "WORK", .name = "sink"});
  REQUIRE(sink_a.ok());
  REQUIRE(sink_b.ok());
  auto bridge_a = NatsBridge::Connect(*a, Options(server, "site-a"));
  auto bridge_b = NatsBridge::Connect(*b, Options(server, "site-b"));
  REQUIRE(bridge_a.ok());
  REQUIRE(bridge_b.ok());
  for (auto* br : {bridge_a->get(), bridge_b->get()}) {
    REQUIRE(br->AddExport({.consumer = {.stream = "WORK", .name = "out"}, .subject_prefix = "shared"}).ok());
    REQUIRE(br->AddImport({.stream = "SHARED", .durable = br->origin(), .filter_subject = "shared.>",
                           .strip_prefix = "shared"})
                .ok());
  }
  constexpr int kN = 100;
  for (int i = 0; i < kN; ++i) REQUIRE(a->Publish(Work(i)).ok());
  auto mb = sink_b->member(0);
  for (int i = 0; i < kN; ++i) {
    auto m = mb->Next(absl::Seconds(20));
    REQUIRE(m.ok());
    CHECK(m->event().msg_id == "m-" + std::to_string(i));
    CHECK(m->event().headers.Get("Inferq-Origin") == std::optional<std::string_view>("site-a"));
    REQUIRE(m->Ack().ok());
  }
  // Site a's own publishes reach its sink once; nothing comes back from NATS.
  auto ma = sink_a->member(0);
  for (int i = 0; i < kN; ++i) {
    auto m = ma->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] {
    return (*bridge_a)->Stats().import_loops == kN && (*bridge_b)->Stats().export_loops == kN &&
           (*bridge_b)->Stats().imported == kN;
  }));
  CHECK(ma->Next(absl::Milliseconds(200)).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(mb->Next(absl::Milliseconds(10)).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(client.Messages("SHARED") == kN);
  CHECK((*bridge_b)->Stats().imported == kN);
  CHECK((*bridge_a)->Stats().imported == 0);
}

TEST_CASE_METHOD(OneServer, "nats bridge: a trace crosses the bridge, each engine's publish a new span of it") {
  client.AddStream("SHARED", "shared.>");
  auto rec_a = std::make_shared<SpanRecorder>();
  auto rec_b = std::make_shared<SpanRecorder>();
  EngineOptions oa, ob;
  oa.trace = {.sink = rec_a};
  ob.trace = {.sink = rec_b};
  auto a = Engine::Create(std::move(oa));
  auto b = Engine::Create(std::move(ob));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE((*a)->AddStream({.name = "WORK", .subjects = {"work.>"}}).ok());
  REQUIRE((*b)->AddStream({.name = "WORK", .subjects = {"work.>"}}).ok());
  auto sink_b = (*b)->AddConsumer({.stream = "WORK", .name = "sink"});
  REQUIRE(sink_b.ok());
  auto bridge_a = NatsBridge::Connect(**a, Options(server, "site-a"));
  auto bridge_b = NatsBridge::Connect(**b, Options(server, "site-b"));
  REQUIRE(bridge_a.ok());
  REQUIRE(bridge_b.ok());
  REQUIRE((*bridge_a)->AddExport({.consumer = {.stream = "WORK", .name = "out"}, .subject_prefix = "shared"}).ok());
  REQUIRE((*bridge_b)->AddImport({.stream = "SHARED", .durable = "site-b", .filter_subject = "shared.>",
                                  .strip_prefix = "shared"})
              .ok());
  Event e = Work(0);
  e.trace = *ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  REQUIRE((*a)->Publish(std::move(e)).ok());
  auto m = sink_b->member(0)->Next(absl::Seconds(20));
  REQUIRE(m.ok());
  const TraceContext at_b = m->event().trace;
  REQUIRE(m->Ack().ok());
  const std::vector<Span> pub_a = rec_a->Of(SpanStage::kPublish);
  const std::vector<Span> pub_b = rec_b->Of(SpanStage::kPublish);
  REQUIRE(pub_a.size() == 1);
  REQUIRE(pub_b.size() == 1);
  // One trace: the upstream span -> a's publish -> (traceparent over NATS) -> b's publish.
  CHECK(FormatTraceparent(at_b).substr(0, 35) == "00-4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(pub_a[0].parent_span_id == ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")->span_id);
  CHECK(pub_b[0].parent_span_id == pub_a[0].context.span_id);
  CHECK(pub_b[0].context.span_id != pub_a[0].context.span_id);
  CHECK(pub_b[0].context.trace_id == pub_a[0].context.trace_id);
  CHECK(at_b.span_id == pub_b[0].context.span_id);
  // a's export consumer delivered it (a deliver span of "out") and b's member too.
  REQUIRE(WaitFor([&] { return rec_a->Of(SpanStage::kAck).size() == 1; }));
  CHECK(rec_a->Of(SpanStage::kDeliver)[0].consumer == "out");
  CHECK(rec_b->Of(SpanStage::kDeliver)[0].consumer == "sink");
}

TEST_CASE("nats bridge: an outage holds the export's work, and nothing is lost when the server returns") {
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  {
    Client client(server.url());
    client.AddStream("REMOTE", "site-a.>");
  }
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  BridgeOptions o = Options(server, "site-a");
  auto bridge = NatsBridge::Connect(*engine, o);
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "to-nats", .lane_capacity = 64},
                                .subject_prefix = "site-a",
                                .ack_timeout = absl::Milliseconds(500),
                                .retry_delay = absl::Milliseconds(50)})
              .ok());
  constexpr int kN = 400;
  int i = 0;
  for (; i < kN / 4; ++i) REQUIRE(engine->Publish(Work(i)).ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == kN / 4; }));
  server.Kill();
  REQUIRE(WaitFor([&] { return !(*bridge)->Stats().connected; }));
  // The lane holds 64; publishing more waits for room (backpressure), so a thread does it.
  std::thread publisher([&] {
    for (int j = kN / 4; j < kN; ++j) (void)engine->Publish(Work(j));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  CHECK((*bridge)->Stats().exported == kN / 4);
  REQUIRE(server.Start());
  publisher.join();
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported >= kN; }, std::chrono::seconds(30)));
  Client client(server.url());
  REQUIRE(WaitFor([&] { return client.Messages("REMOTE") == kN; }));
  const EngineStats es = engine->Stats();
  const ConsumerStats* c = es.consumer("LOCAL", "to-nats");
  REQUIRE(c != nullptr);
  CHECK(c->ack_pending == 0);
  CHECK((*bridge)->Stats().reconnects >= 1);
  std::vector<natsMsg*> msgs = client.ReadAll("REMOTE", kN);
  std::set<std::string> ids;
  for (natsMsg* m : msgs) {
    const char* v = nullptr;
    if (natsMsgHeader_Get(m, "Nats-Msg-Id", &v) == NATS_OK) ids.insert(v);
    natsMsg_Destroy(m);
  }
  CHECK(ids.size() == kN);
}

TEST_CASE_METHOD(OneServer, "nats bridge: export to core NATS acks locally after a flush") {
  natsSubscription* sub = nullptr;
  REQUIRE(natsConnection_SubscribeSync(&sub, client.nc, "core.>") == NATS_OK);
  REQUIRE(natsConnection_Flush(client.nc) == NATS_OK);
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "to-core"},
                                .subject_prefix = "core", .jetstream = false})
              .ok());
  constexpr int kN = 200;
  for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Work(i)).ok());
  for (int i = 0; i < kN; ++i) {
    natsMsg* m = nullptr;
    REQUIRE(natsSubscription_NextMsg(&m, sub, 10'000) == NATS_OK);
    CHECK(std::string(natsMsg_GetSubject(m)) == "core.work.item");
    const char* v = nullptr;
    REQUIRE(natsMsgHeader_Get(m, "Nats-Msg-Id", &v) == NATS_OK);
    CHECK(std::string(v) == "m-" + std::to_string(i));
    natsMsg_Destroy(m);
  }
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == kN; }));
  const EngineStats es = engine->Stats();
  CHECK(es.consumer("LOCAL", "to-core")->acked == kN);
  natsSubscription_Destroy(sub);
}

TEST_CASE_METHOD(OneServer, "nats bridge: an import into a file stream is on disk before NATS hears the ack") {
  client.AddStream("REQS", "in.>");
  constexpr int kN = 100;
  for (int i = 0; i < kN; ++i) client.Publish("in.req", "r" + std::to_string(i), {});
  const std::string local_dir = (dir.path() / "local").string();
  StreamConfig file{.name = "LOCAL", .subjects = {"in.>"}, .storage = StorageType::kFile,
                    .directory = local_dir, .sync = SyncPolicy::kEveryCommit};
  {
    auto engine = NewEngine();
    REQUIRE(engine->AddStream(file).ok());
    auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
    REQUIRE(bridge.ok());
    REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>"}).ok());
    REQUIRE(WaitFor([&] { return client.ConsumerState("REQS", "d") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
    CHECK((*bridge)->Stats().imported == kN);
  }
  // A new engine over the same directory holds every message, msg_id "<stream>:<seq>" of
  // JetStream where the publisher set none; a new import under the same durable name
  // has nothing left to bring.
  auto engine = NewEngine();
  REQUIRE(engine->AddStream(file).ok());
  EngineStats s = engine->Stats();
  CHECK(s.stream("LOCAL")->messages == kN);
  auto first = engine->GetMessage("LOCAL", 1);
  REQUIRE(first.ok());
  CHECK((*first)->msg_id == "REQS:1");
  CHECK((*first)->payload.view() == "r0");
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>"}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK((*bridge)->Stats().imported == 0);
  s = engine->Stats();
  CHECK(s.stream("LOCAL")->messages == kN);
}

TEST_CASE_METHOD(OneServer, "nats bridge: an import the engine refuses is nak'ed and comes again, once stored") {
  client.AddStream("REQS", "in.>");
  constexpr int kN = 20;
  for (int i = 0; i < kN; ++i) client.Publish("in.req", "r" + std::to_string(i), {{"Nats-Msg-Id", std::to_string(i)}});
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"in.>"}}).ok());
  // A lane of 2 that rejects when full: the import's publishes are refused until the
  // member pulls.
  auto consumer = engine->AddConsumer(
      {.stream = "LOCAL", .name = "slow", .lane_capacity = 2, .overflow = OverflowPolicy::kReject});
  REQUIRE(consumer.ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>",
                                .ack_wait = absl::Milliseconds(400), .retry_delay = absl::Milliseconds(20)})
              .ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().import_refused > 0; }));
  auto member = consumer->member(0);
  std::set<std::string> got;
  while (got.size() < kN) {
    auto m = member->Next(absl::Seconds(20));
    REQUIRE(m.ok());
    CHECK(got.insert(std::string(m->event().payload.view())).second);  // never twice
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] { return client.ConsumerState("REQS", "d") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
  CHECK(member->Next(absl::Milliseconds(100)).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK((*bridge)->Stats().imported == kN);
  CHECK((*bridge)->Stats().import_redelivered > 0);
}

TEST_CASE_METHOD(OneServer, "nats bridge: a NATS message that cannot be mapped is terminated and named, the rest flows") {
  client.AddStream("REQS", "in.>");
  client.Publish("in.req", "bad", {{"Inferq-Qos", "platinum"}});
  client.Publish("in.req", "good", {{"Inferq-Qos", "bronze"}});
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"in.>"}}).ok());
  auto consumer = engine->AddConsumer({.stream = "LOCAL", .name = "c"});
  REQUIRE(consumer.ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>"}).ok());
  auto m = consumer->member(0)->Next(absl::Seconds(20));
  REQUIRE(m.ok());
  CHECK(m->event().payload.view() == "good");
  CHECK(m->event().qos == Qos::kBronze);
  REQUIRE(m->Ack().ok());
  REQUIRE(WaitFor([&] { return client.ConsumerState("REQS", "d") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
  const BridgeStats s = (*bridge)->Stats();
  CHECK(s.import_invalid == 1);
  CHECK(s.imported == 1);
  CHECK(s.last_error ==
        "import of 'in.req' from JetStream stream 'REQS' refused: NATS header 'Inferq-Qos' has value "
        "'platinum': not gold, silver or bronze");
}

TEST_CASE("nats bridge: a cluster node killed mid-export loses nothing") {
  TempDir dir;
  inferq_test::NatsCluster cluster(dir.path(), 3);
  REQUIRE(cluster.Start());
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, cluster.url_list().c_str()) == NATS_OK);
  jsCtx* js = nullptr;
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = 10'000;
  REQUIRE(natsConnection_JetStream(&js, nc, &jo) == NATS_OK);
  // JetStream elects its meta leader once the routes are up: retry the stream's creation.
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  const char* subjects[] = {"site-a.>"};
  sc.Name = "REMOTE";
  sc.Subjects = subjects;
  sc.SubjectsLen = 1;
  sc.Storage = js_FileStorage;
  sc.Replicas = 3;
  REQUIRE(WaitFor([&] {
    jsStreamInfo* si = nullptr;
    const bool ok = js_AddStream(&si, js, &sc, nullptr, nullptr) == NATS_OK;
    if (si != nullptr) jsStreamInfo_Destroy(si);
    return ok;
  }, std::chrono::seconds(30)));

  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  BridgeOptions o;
  o.connection.servers = cluster.urls();
  o.connection.reconnect_wait = absl::Milliseconds(50);
  o.origin = "site-a";
  auto bridge = NatsBridge::Connect(*engine, o);
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "to-nats", .lane_capacity = 64},
                                .subject_prefix = "site-a",
                                .max_in_flight = 32,
                                .ack_timeout = absl::Seconds(2),
                                .retry_delay = absl::Milliseconds(50)})
              .ok());
  constexpr int kN = 300;
  std::thread publisher([&] {
    for (int i = 0; i < kN; ++i) {
      (void)engine->Publish(Work(i));
      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported >= kN / 4; }));
  // Kill the node the bridge is connected to.
  const std::string url = (*bridge)->Stats().connected_url;
  int victim = -1;
  for (int i = 0; i < cluster.size(); ++i) {
    if (cluster.server(i).url() == url) victim = i;
  }
  INFO("connected to " << url);
  REQUIRE(victim >= 0);
  cluster.server(victim).Kill();
  publisher.join();
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported >= kN; }, std::chrono::seconds(60)));
  CHECK((*bridge)->Stats().reconnects >= 1);
  CHECK((*bridge)->Stats().connected_url != url);
  const EngineStats es = engine->Stats();
  CHECK(es.consumer("LOCAL", "to-nats")->ack_pending == 0);
  // Every event is in the stream once (a retried publish is dropped by Nats-Msg-Id).
  std::uint64_t msgs = 0;
  REQUIRE(WaitFor([&] {
    jsStreamInfo* si = nullptr;
    if (js_GetStreamInfo(&si, js, "REMOTE", nullptr, nullptr) != NATS_OK) return false;
    msgs = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return msgs == kN;
  }, std::chrono::seconds(30)));
  CHECK(msgs == kN);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
}

TEST_CASE("test harness: a TempDir removes the directories dead processes left, and keeps live ones'") {
  // A process that is gone: a child that exited and was reaped.
  const pid_t child = ::fork();
  if (child == 0) std::_Exit(0);
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const auto tmp = std::filesystem::temp_directory_path();
  const auto stale = tmp / ("inferq-nats-" + std::to_string(child) + "-1");
  const auto live = tmp / ("inferq-nats-" + std::to_string(::getppid()) + "-1");
  std::filesystem::create_directories(stale / "n0");
  std::filesystem::create_directories(live);
  {
    TempDir dir;
    CHECK(std::filesystem::exists(dir.path()));
  }
  CHECK_FALSE(std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(live));  // our parent (ctest) is alive
  std::filesystem::remove_all(live);
}
