// The NATS bridge's defects found by the adversarial review, each with the smallest
// input that showed it (against real nats-server processes, tests/adapters/).
#include <catch2/catch.hpp>
#include <nats/nats.h>

#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include "nats_test_util.hpp"

using namespace inferq;
using namespace inferq::nats;
using namespace inferq_test;

TEST_CASE("nats defects: an import is acked only when every capturing stream took it") {
  // Two local streams capture the subject; A's consumer has a full kBlock lane. The
  // import used to take B's acceptance for the whole publish and ack NATS, and A lost it.
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  Client client(server.url());
  client.AddStream("REQS", "in.>");
  constexpr int kN = 20;
  for (int i = 0; i < kN; ++i) {
    client.Publish("in.x", "r" + std::to_string(i), {{"Nats-Msg-Id", "id-" + std::to_string(i)}});
  }
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "A", .subjects = {"local.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "B", .subjects = {"local.>"}}).ok());
  auto a = engine->AddConsumer({.stream = "A", .name = "slow", .lane_capacity = 2});
  auto b = engine->AddConsumer({.stream = "B", .name = "fast"});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>", .strip_prefix = "in",
                                .add_prefix = "local", .ack_wait = absl::Seconds(2),
                                .retry_delay = absl::Milliseconds(20)})
              .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // A's lane fills
  std::set<std::string> got_a, got_b;
  std::thread drain_a([&] {
    auto m = a->member(0);
    while (got_a.size() < kN) {
      auto x = m->Next(absl::Seconds(20));
      if (!x.ok()) return;
      got_a.insert(std::string(x->event().payload.view()));
      (void)x->Ack();
    }
  });
  auto mb = b->member(0);
  int b_deliveries = 0;
  while (got_b.size() < kN) {
    auto x = mb->Next(absl::Seconds(20));
    REQUIRE(x.ok());
    got_b.insert(std::string(x->event().payload.view()));
    ++b_deliveries;
    REQUIRE(x->Ack().ok());
  }
  drain_a.join();
  CHECK(got_a.size() == kN);
  CHECK(b_deliveries == kN);  // B's duplicate window dropped the redeliveries
  REQUIRE(WaitFor([&] { return client.ConsumerState("REQS", "d") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
}

TEST_CASE_METHOD(OneServer, "nats defects: an engine limit refusal is nak'ed at once, not held for ack_wait") {
  client.AddStream("REQS", "in.>");
  for (int i = 0; i < 3; ++i) client.Publish("in.x", "r", {{"Nats-Msg-Id", "id-" + std::to_string(i)}});
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "IN", .subjects = {"local.>"}, .max_msgs = 1, .discard = DiscardPolicy::kNew})
              .ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE((*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in.>", .strip_prefix = "in",
                                .add_prefix = "local", .ack_wait = absl::Seconds(6),
                                .retry_delay = absl::Milliseconds(100)})
              .ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().import_refused >= 1; }));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));  // was ack_wait / 2 = 3 s
  CHECK((*bridge)->Stats().imported == 1);
}

TEST_CASE("nats defects: Close of a core export while the server is down takes the drain, not ack_timeout") {
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "core"}, .subject_prefix = "x",
                                .jetstream = false, .ack_timeout = absl::Seconds(15)})
              .ok());
  server.Kill();
  REQUIRE(WaitFor([&] { return !(*bridge)->Stats().connected; }));
  REQUIRE(engine->Publish(Work(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  (*bridge)->Close(absl::Milliseconds(100));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));  // was 14.7 s
  CHECK(Acked(*engine, "LOCAL", "core") == 0);
}

TEST_CASE_METHOD(OneServer, "nats defects: a subject too long for the server is refused alone, the connection stays") {
  client.AddStream("REMOTE", "x.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x",
                                .retry_delay = absl::Milliseconds(20)})
              .ok());
  REQUIRE(engine->Publish(Work(0, "work." + std::string(5000, 'a'))).ok());
  for (int i = 1; i <= 20; ++i) REQUIRE(engine->Publish(Work(i)).ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported >= 20; }, std::chrono::seconds(12)));
  const BridgeStats s = (*bridge)->Stats();
  CHECK(s.disconnects == 0);
  CHECK(s.export_invalid == 1);
  CHECK(s.connected);
  CHECK(client.Messages("REMOTE") == 20);
}

TEST_CASE("nats defects: a payload over the server's max_payload is refused, naming both sizes") {
  TempDir dir;
  std::ofstream(dir.path() / "server.conf") << "max_payload: 4096\n";
  NatsServer server(dir.path(), {"-c", (dir.path() / "server.conf").string()});
  REQUIRE(server.Start());
  Client client(server.url());
  client.AddStream("REMOTE", "x.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x"}).ok());
  Event big = Work(0);
  big.payload = Buffer::FromString(std::string(5000, 'p'));
  REQUIRE(engine->Publish(std::move(big)).ok());
  REQUIRE(engine->Publish(Work(1)).ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == 1 && (*bridge)->Stats().export_invalid == 1; }));
  const BridgeStats s = (*bridge)->Stats();
  INFO(s.last_error);
  CHECK(s.last_error.find("is larger than the server's max_payload of 4096") != std::string::npos);
}

TEST_CASE("nats defects: a second Close waits for the first") {
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  {
    Client client(server.url());
    client.AddStream("REMOTE", "x.>");
  }
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x",
                                .ack_timeout = absl::Seconds(30)})
              .ok());
  server.Kill();
  REQUIRE(WaitFor([&] { return !(*bridge)->Stats().connected; }));
  for (int i = 0; i < 10; ++i) REQUIRE(engine->Publish(Work(i)).ok());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().export_pending == 10; }));
  std::thread first([&] { (*bridge)->Close(absl::Milliseconds(500)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*bridge)->Close();
  // The first Close is done: nothing is in flight, and the engine may go (TSan saw
  // the export thread in NextBatch racing ~Engine before).
  CHECK((*bridge)->Stats().export_pending == 0);
  const EngineStats es = engine->Stats();
  CHECK(es.consumer("LOCAL", "js")->ack_pending == 0);
  engine.reset();
  first.join();
}

TEST_CASE_METHOD(OneServer, "nats defects: an event imported from a plain NATS publisher is not exported back") {
  client.AddStream("SHARED", "shared.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "WORK", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "WORK", .name = "out"}, .subject_prefix = "shared"}).ok());
  REQUIRE((*bridge)->AddImport({.stream = "SHARED", .durable = "a", .filter_subject = "shared.>",
                                .strip_prefix = "shared"})
              .ok());
  client.Publish("shared.work.x", "plain", {});
  // The import counts the message after its NATS ack; the export may see the event first.
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().export_loops == 1 && (*bridge)->Stats().imported == 1; }));
  CHECK((*bridge)->Stats().exported == 0);
  CHECK(client.Messages("SHARED") == 1);
  auto m = engine->GetMessage("WORK", 1);
  REQUIRE(m.ok());
  CHECK((*m)->headers.Get("Inferq-Origin") == std::optional<std::string_view>("nats:SHARED"));
}

TEST_CASE_METHOD(OneServer, "nats defects: retried exports of events without msg_id are stored once") {
  client.AddStream("REMOTE", "x.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x",
                                .ack_timeout = absl::Milliseconds(1), .retry_delay = absl::Milliseconds(1)})
              .ok());
  constexpr int kN = 200;
  for (int i = 0; i < kN; ++i) {
    Event e = Work(i);
    e.msg_id.clear();
    REQUIRE(engine->Publish(std::move(e)).ok());
  }
  REQUIRE(WaitFor([&] { return Acked(*engine, "LOCAL", "js") == kN; }, std::chrono::seconds(60)));
  REQUIRE(WaitFor([&] { return client.Messages("REMOTE") >= kN; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(client.Messages("REMOTE") == kN);  // was 3,769
  const std::set<std::string> ids = client.Ids("REMOTE", kN);
  CHECK(ids.size() == kN);
  CHECK(ids.begin()->rfind("site-a.", 0) == 0);
}

TEST_CASE_METHOD(OneServer, "nats defects: import names and prefixes JetStream cannot use are refused up front") {
  client.AddStream("REQS", "in.>");
  auto engine = NewEngine();
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());
  auto dot = (*bridge)->AddImport({.stream = "REQS", .durable = "a.b", .filter_subject = "in.>"});
  CHECK(dot.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(dot.message()) == "ImportConfig.durable 'a.b' may hold only [A-Za-z0-9_-]");
  auto strip = (*bridge)->AddImport(
      {.stream = "REQS", .durable = "d", .filter_subject = "in.>", .strip_prefix = "site-b", .add_prefix = "local"});
  CHECK(strip.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(strip.message()) ==
        "ImportConfig.strip_prefix 'site-b' does not lead every subject of filter_subject 'in.>' (the filter "
        "must start with 'site-b.' and a further token)");
  auto filter = (*bridge)->AddImport({.stream = "REQS", .durable = "d", .filter_subject = "in..x"});
  CHECK(filter.code() == absl::StatusCode::kInvalidArgument);
  auto timing = (*bridge)->AddImport(
      {.stream = "REQS", .durable = "d", .filter_subject = "in.>", .ack_wait = absl::ZeroDuration()});
  CHECK(std::string(timing.message()) ==
        "ImportConfig: ack_wait (0) must be positive and retry_delay (200ms) not negative, both at most 168h");
  // Found by an adversarial review: an infinite ack_wait overflowed the import's
  // deadlines into the past (busy lanes nak'ed at once, in-progress on every poll).
  auto infinite = (*bridge)->AddImport(
      {.stream = "REQS", .durable = "d", .filter_subject = "in.>", .ack_wait = absl::InfiniteDuration()});
  CHECK(std::string(infinite.message()) ==
        "ImportConfig: ack_wait (inf) must be positive and retry_delay (200ms) not negative, both at most 168h");
  CHECK(client.ConsumerState("REQS", "d").first == -1);  // nothing was created
}

// Found by an adversarial review: each of these was accepted, then failed every
// event (a prefix that leaves no room) or every try (headers JetStream refuses,
// retried without end), or reached libnats unchecked.
TEST_CASE_METHOD(OneServer, "nats defects: exports that could never cross are refused up front or terminated once") {
  client.AddStream("REMOTE", "x.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "LOCAL", .subjects = {"work.>"}}).ok());

  SECTION("connection options libnats would misread are named") {
    BridgeOptions empty_url = Options(server, "site-a");
    empty_url.connection.servers.push_back("");
    auto b = NatsBridge::Connect(*engine, empty_url);
    CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(b.status().message()) ==
          "BridgeOptions.connection.servers[1] '' is not a server URL (empty, or white space, a comma or a NUL in it)");
    BridgeOptions quote = Options(server, "site-a");
    quote.connection.name = "a\"b";
    b = NatsBridge::Connect(*engine, quote);
    CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(b.status().message()) ==
          "BridgeOptions.connection.name 'a\"b' has a control character, '\"' or '\\', which libnats sends "
          "unescaped");
  }

  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());

  SECTION("a prefix that leaves no room for a subject") {
    const std::string prefix(4000, 'p');
    auto st = (*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = prefix});
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(st.message()) ==
          "ExportConfig.subject_prefix of 4000 bytes leaves no room for a subject under the 3840 bytes the bridge "
          "sends");
    auto forever = (*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x",
                                         .ack_timeout = absl::InfiniteDuration()});
    CHECK(std::string(forever.message()) == "ExportConfig: ack_timeout (inf) and retry_delay (200ms) must be at most 365 days (kMaxDuration)");
    const EngineStats es = engine->Stats();
    CHECK(es.consumers.empty());
  }

  SECTION("headers over JetStream's 64 KiB, and a Nats-* header, are terminated once; the rest flows") {
    REQUIRE((*bridge)->AddExport({.consumer = {.stream = "LOCAL", .name = "js"}, .subject_prefix = "x",
                                  .retry_delay = absl::Milliseconds(20)})
                .ok());
    Event big = Work(0);
    big.headers.Set("big", std::string(70'000, 'h'));
    REQUIRE(engine->Publish(std::move(big)).ok());
    Event rollup = Work(1);
    rollup.headers.Set("Nats-Rollup", "all");
    REQUIRE(engine->Publish(std::move(rollup)).ok());
    REQUIRE(engine->Publish(Work(2)).ok());
    REQUIRE(WaitFor([&] { return (*bridge)->Stats().exported == 1 && (*bridge)->Stats().export_invalid == 2; }));
    const BridgeStats s = (*bridge)->Stats();
    CHECK(s.export_failures == 0);
    CHECK(client.Messages("REMOTE") == 1);
    const EngineStats es = engine->Stats();
    CHECK(es.consumer("LOCAL", "js")->ack_pending == 0);
  }
}

namespace {

// Stream `name` capturing `subjects`, on the server `js` talks to, tried every 250 ms
// for up to 30 s while a cluster forms (its meta leader, its peers). True once made.
bool AddStreamWhenFormed(jsCtx* js, const char* name, std::vector<const char*> subjects, int replicas) {
  jsStreamConfig c;
  jsStreamConfig_Init(&c);
  c.Name = name;
  c.Subjects = subjects.data();
  c.SubjectsLen = static_cast<int>(subjects.size());
  c.Storage = js_FileStorage;
  c.Replicas = replicas;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    jsStreamInfo* si = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    const natsStatus s = js_AddStream(&si, js, &c, nullptr, &err);
    if (si != nullptr) jsStreamInfo_Destroy(si);
    if (s == NATS_OK) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace

// bridge.hpp said "(empty: the whole stream)" and AddImport refused an empty filter.
TEST_CASE_METHOD(OneServer, "nats defects: an import with an empty filter_subject takes the whole stream") {
  REQUIRE(AddStreamWhenFormed(client.js, "ALL", {"a.>", "b.>"}, 1));
  client.Publish("a.x", "one", {{"Nats-Msg-Id", "id-1"}});
  client.Publish("b.y.z", "two", {{"Nats-Msg-Id", "id-2"}});
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "IN", .subjects = {"a.>", "b.>"}}).ok());
  auto local = engine->AddConsumer({.stream = "IN", .name = "c", .deliver = DeliverPolicy::kAll});
  REQUIRE(local.ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "site-a"));
  REQUIRE(bridge.ok());

  SECTION("a new durable is created without a filter and gets every subject") {
    const absl::Status st = (*bridge)->AddImport({.stream = "ALL", .durable = "all"});
    INFO(st.ToString());
    REQUIRE(st.ok());
    std::set<std::string> got;
    auto m = local->member(0);
    for (int i = 0; i < 2; ++i) {
      auto x = m->Next(absl::Seconds(20));
      REQUIRE(x.ok());
      got.insert(x->event().subject + "=" + std::string(x->event().payload.view()));
      REQUIRE(x->Ack().ok());
    }
    CHECK(got == std::set<std::string>{"a.x=one", "b.y.z=two"});
    CHECK(WaitFor([&] { return client.ConsumerState("ALL", "all") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
    jsConsumerInfo* ci = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    REQUIRE(js_GetConsumerInfo(&ci, client.js, "ALL", "all", nullptr, &err) == NATS_OK);
    CHECK(ci->Config->FilterSubject == nullptr);
    jsConsumerInfo_Destroy(ci);
    CHECK((*bridge)->Stats().imported == 2);
  }
  SECTION("a durable that exists with a filter is refused, naming the filter") {
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "part";
    cc.AckPolicy = js_AckExplicit;
    cc.FilterSubject = "a.>";
    jsConsumerInfo* ci = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    REQUIRE(js_AddConsumer(&ci, client.js, "ALL", &cc, nullptr, &err) == NATS_OK);
    jsConsumerInfo_Destroy(ci);
    const absl::Status st = (*bridge)->AddImport({.stream = "ALL", .durable = "part"});
    CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(st.message()) ==
          "JetStream pull consumer 'part' on stream 'ALL' (filter '') exists with filter 'a.>': it does not "
          "deliver the whole stream (name a durable without a filter, or set ImportConfig.filter_subject to "
          "'a.>')");
  }
}

// The smallest input of a flaky cluster_demo run: stream creation was retried while
// the cluster formed, the consumer's creation was tried once ("JetStream pull
// consumer 'replicas' ... Timeout"). Here one node of three runs, restarted after
// the cluster made the stream (no quorum: no meta or stream leader), when AddImport
// runs.
TEST_CASE("nats defects: AddImport retries a forming cluster for jetstream_forming_wait and names it") {
  TempDir dir;
  NatsCluster cluster(dir.path(), 3);
  REQUIRE(cluster.Start());
  {
    Client client(cluster.url_list());
    REQUIRE(AddStreamWhenFormed(client.js, "JOBS", {"jobs.>"}, 3));
  }
  // The whole cluster down, then node 0 back alone: no quorum, so no meta or stream
  // leader (nodes 1 and 2 merely killed left node 0 answering as the stream's leader
  // for a while, sometimes for 30 s).
  for (int i = 0; i < 3; ++i) cluster.server(i).Kill();
  REQUIRE(cluster.server(0).Start());
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "WORK", .subjects = {"jobs.>"}}).ok());
  BridgeOptions o = Options(cluster.server(0), "site-a");
  o.connection.jetstream_timeout = absl::Milliseconds(500);

  SECTION("an error after the wait says how long it was tried") {
    o.connection.jetstream_forming_wait = absl::Seconds(2);
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE(bridge.ok());
    const absl::Status st = (*bridge)->AddImport({.stream = "JOBS", .durable = "d", .filter_subject = "jobs.>"});
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kUnavailable);
    const std::string msg(st.message());
    const std::string tail = " (a cluster still forming? retried for 2s, ConnectionOptions.jetstream_forming_wait)";
    REQUIRE(msg.size() > tail.size());
    CHECK(msg.substr(msg.size() - tail.size()) == tail);
  }
  SECTION("the import starts once the nodes are back") {
    o.connection.jetstream_forming_wait = absl::Seconds(60);
    auto bridge = NatsBridge::Connect(*engine, o);
    REQUIRE(bridge.ok());
    absl::Status st = absl::UnknownError("not run");
    std::thread add([&] { st = (*bridge)->AddImport({.stream = "JOBS", .durable = "d", .filter_subject = "jobs.>"}); });
    std::this_thread::sleep_for(std::chrono::seconds(3));  // AddImport meets the leaderless cluster first
    REQUIRE(cluster.server(1).Start());
    REQUIRE(cluster.server(2).Start());
    add.join();
    INFO(st.ToString());
    REQUIRE(st.ok());
    Client client(cluster.url_list());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    natsStatus s = NATS_ERR;
    while (s != NATS_OK && std::chrono::steady_clock::now() < until) {  // the stream's leader may still be elected
      jsPubAck* pa = nullptr;
      jsErrCode err = static_cast<jsErrCode>(0);
      s = js_Publish(&pa, client.js, "jobs.x", "j", 1, nullptr, &err);
      jsPubAck_Destroy(pa);
      if (s != NATS_OK) std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    REQUIRE(s == NATS_OK);
    CHECK(WaitFor([&] { return (*bridge)->Stats().imported == 1; }, std::chrono::seconds(30)));
  }
}
