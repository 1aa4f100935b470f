// ImportAck::kConsumed (inferq/adapters/nats/bridge.hpp): an import that acks NATS
// only once the local consumer acked, against a real nats-server.
#include <catch2/catch.hpp>
#include <nats/nats.h>

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "inferq/adapters/nats/bridge.hpp"
#include "nats_test_util.hpp"

using namespace inferq;
using namespace inferq::nats;
using namespace inferq_test;

namespace {

// Publishes jobs.x with Nats-Msg-Id j-<i> for i in [from, to).
void PublishJobs(Client& client, int from, int to) {
  for (int i = from; i < to; ++i) client.Publish("jobs.x", "job-" + std::to_string(i), {{"Nats-Msg-Id", "j-" + std::to_string(i)}});
}

ImportConfig Consumed(int max_ack_pending = 0) {
  return {.stream = "JOBS",
          .durable = "workers",
          .filter_subject = "jobs.>",
          .ack_wait = absl::Seconds(1),
          .ack = ImportAck::kConsumed,
          .ack_stream = "WORK",
          .max_ack_pending = max_ack_pending};
}

std::unique_ptr<Engine> WorkEngine(std::optional<Consumer>* consumer, std::size_t lane_capacity = 1024) {
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "WORK", .subjects = {"jobs.>"}, .retention = RetentionPolicy::kWorkQueue}).ok());
  auto c = engine->AddConsumer(
      {.stream = "WORK", .name = "w", .deliver = DeliverPolicy::kAll, .lane_capacity = lane_capacity,
       .ack_wait = absl::Seconds(60)});
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  consumer->emplace(*c);
  return engine;
}

std::uint64_t Held(const NatsBridge& b) { return b.Stats().import_held; }
std::uint64_t Stored(const Engine& e) {
  const EngineStats st = e.Stats();
  return st.stream("WORK")->messages;
}

// A bridge of `engine` importing JOBS under kConsumed with max_held `held`, once it
// holds that many.
std::unique_ptr<NatsBridge> Holding(Engine& engine, const NatsServer& server, const std::string& origin, int held) {
  auto bridge = NatsBridge::Connect(engine, Options(server, origin));
  REQUIRE(bridge.ok());
  ImportConfig c = Consumed();
  c.max_held = held;
  REQUIRE((*bridge)->AddImport(c).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge) == static_cast<std::uint64_t>(held); }));
  return std::move(*bridge);
}

}  // namespace

TEST_CASE_METHOD(OneServer, "nats import with ImportAck::kConsumed acks NATS only when the local consumer acked") {
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 10);
  std::optional<Consumer> consumer;
  auto engine = WorkEngine(&consumer);
  auto bridge = NatsBridge::Connect(*engine, Options(server, "worker-1"));
  REQUIRE(bridge.ok());
  // At most 4 un-acked in NATS: the import holds 4 and fetches no more.
  REQUIRE((*bridge)->AddImport(Consumed(/*max_ack_pending=*/4)).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge) == 4; }));
  // Three ack_waits later: nothing was redelivered (the bridge told JetStream they
  // are in progress), nothing more was fetched, and NATS still counts 4 pending.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  BridgeStats s = (*bridge)->Stats();
  CHECK(s.imported == 4);
  CHECK(s.import_held == 4);
  CHECK(s.import_redelivered == 0);
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{4, 6}; }));

  // Two consumed locally: NATS hears two acks, and the import takes two more.
  auto member = consumer->member(0);
  std::set<std::string> got;
  for (int i = 0; i < 2; ++i) {
    auto m = member->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    got.insert(m->event().msg_id);
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().imported == 6 && Held(**bridge) == 4; }));
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{4, 4}; }));

  // The rest: every job once, and nothing pending in NATS.
  while (got.size() < 10) {
    auto m = member->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    CHECK(got.insert(m->event().msg_id).second);
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] { return Held(**bridge) == 0; }));
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
  s = (*bridge)->Stats();
  CHECK(s.imported == 10);
  CHECK(s.import_redelivered == 0);
  std::set<std::string> want;
  for (int i = 0; i < 10; ++i) want.insert("j-" + std::to_string(i));
  CHECK(got == want);
}

TEST_CASE_METHOD(OneServer, "nats import with ImportAck::kConsumed and max_held fetches only while it holds fewer") {
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 10);
  std::optional<Consumer> consumer;
  auto engine = WorkEngine(&consumer);
  std::unique_ptr<NatsBridge> bridge = Holding(*engine, server, "worker-1", 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(bridge->Stats().imported == 3);
  // The other 7 stay in JetStream for other processes: 3 delivered, 7 pending.
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{3, 7}; }));
  auto member = consumer->member(0);
  auto m = member->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  REQUIRE(m->Ack().ok());
  REQUIRE(WaitFor([&] { return bridge->Stats().imported == 4 && Held(*bridge) == 3; }));
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{3, 6}; }));
}

TEST_CASE_METHOD(OneServer, "nats imports sharing a durable with ImportAck::kConsumed: what one process held goes to the other") {
  client.AddStream("JOBS", "jobs.>");
  std::optional<Consumer> ca, cb;
  auto a = WorkEngine(&ca);
  auto b = WorkEngine(&cb);
  auto bridge_a = NatsBridge::Connect(*a, Options(server, "worker-a"));
  auto bridge_b = NatsBridge::Connect(*b, Options(server, "worker-b"));
  REQUIRE(bridge_a.ok());
  REQUIRE(bridge_b.ok());
  REQUIRE((*bridge_a)->AddImport(Consumed()).ok());
  PublishJobs(client, 0, 20);
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 20; }));
  // Process a consumes 5 and stops with 15 stored locally and not consumed: its
  // Close naks them in NATS, and process b, importing through the same durable, gets
  // those 15 and nothing else.
  std::set<std::string> done_a, done_b;
  auto ma = ca->member(0);
  for (int i = 0; i < 5; ++i) {
    auto m = ma->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    done_a.insert(m->event().msg_id);
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 15; }));
  REQUIRE((*bridge_b)->AddImport(Consumed()).ok());
  (*bridge_a)->Close();
  auto mb = cb->member(0);
  while (done_b.size() < 15) {
    auto m = mb->Next(absl::Seconds(10));
    REQUIRE(m.ok());
    CHECK(done_b.insert(m->event().msg_id).second);
    REQUIRE(m->Ack().ok());
  }
  REQUIRE(WaitFor([&] { return Held(**bridge_b) == 0; }));
  CHECK(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
  CHECK((*bridge_b)->Stats().import_redelivered == 15);
  std::set<std::string> all = done_a;
  for (const auto& id : done_b) CHECK(all.insert(id).second);  // none done twice
  CHECK(all.size() == 20);
  CHECK(mb->Next(absl::Milliseconds(300)).status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE_METHOD(OneServer, "nats import with ImportAck::kConsumed acks once stored what a second local stream stores too") {
  client.AddStream("JOBS", "jobs.>");
  std::optional<Consumer> consumer;
  auto engine = WorkEngine(&consumer);
  REQUIRE(engine->AddStream({.name = "AUDIT", .subjects = {"jobs.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "worker-1"));
  REQUIRE(bridge.ok());
  REQUIRE((*bridge)->AddImport(Consumed()).ok());
  PublishJobs(client, 0, 3);
  // Nothing consumed locally, yet NATS has its acks: both streams stored each job.
  REQUIRE(WaitFor([&] { return client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{0, 0}; }));
  const BridgeStats s = (*bridge)->Stats();
  CHECK(s.imported == 3);
  CHECK(s.import_held == 0);
  CHECK(s.last_error ==
        "import of 'jobs.x' (ImportAck::kConsumed): 2 local streams stored it, so it was acked to NATS once stored");
}

TEST_CASE_METHOD(OneServer, "nats import: ImportAck::kConsumed needs a local work-queue stream, and bad values are refused") {
  client.AddStream("JOBS", "jobs.>");
  auto engine = NewEngine();
  REQUIRE(engine->AddStream({.name = "KEPT", .subjects = {"jobs.>"}}).ok());
  auto bridge = NatsBridge::Connect(*engine, Options(server, "worker-1"));
  REQUIRE(bridge.ok());
  ImportConfig c = Consumed();
  std::string want;
  SECTION("no such local stream") {
    want = "ImportConfig.ack_stream 'WORK' is not a stream of the engine (ImportAck::kConsumed needs one)";
  }
  SECTION("a stream with limits retention") {
    c.ack_stream = "KEPT";
    want = "ImportConfig.ack_stream 'KEPT' does not have work-queue retention (ImportAck::kConsumed acks NATS when "
           "its consumer's ack removes the message)";
  }
  SECTION("an ack_stream under kStored") {
    c.ack = ImportAck::kStored;
    want = "ImportConfig.ack_stream 'WORK' is set, but ack is kStored (it names the stream of ImportAck::kConsumed)";
  }
  SECTION("max_ack_pending out of range") {
    c.max_ack_pending = -1;
    want = "ImportConfig.max_ack_pending -1 is not in 0..1000000";
  }
  SECTION("max_held out of range") {
    c.max_held = 1'000'001;
    want = "ImportConfig.max_held 1000001 is not in 0..1000000";
  }
  SECTION("max_held under kStored") {
    c.ack = ImportAck::kStored;
    c.ack_stream.clear();
    c.max_held = 8;
    want = "ImportConfig.max_held 8 is set, but ack is kStored (it bounds what ImportAck::kConsumed holds)";
  }
  const absl::Status st = (*bridge)->AddImport(c);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()) == want);
  // Nothing was created in NATS.
  CHECK(client.ConsumerState("JOBS", "workers").first == -1);
}

// Regressions of the adversarial review of ImportAck::kConsumed.
TEST_CASE("nats import with ImportAck::kConsumed keeps held messages in progress while later ones wait on a busy lane") {
  // A holds 2 jobs its full lane (capacity 2) took and waits on the lane for the
  // rest; B imports through the same durable. JetStream's ack_wait is 1 s: without
  // in-progress during the wait, B got the 2 held jobs too and they ran twice.
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  Client client(server.url());
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 6);
  std::optional<Consumer> ca, cb;
  auto a = WorkEngine(&ca, 2);
  auto b = WorkEngine(&cb);
  auto bridge_a = NatsBridge::Connect(*a, Options(server, "worker-a"));
  auto bridge_b = NatsBridge::Connect(*b, Options(server, "worker-b"));
  REQUIRE(bridge_a.ok());
  REQUIRE(bridge_b.ok());
  REQUIRE((*bridge_a)->AddImport(Consumed()).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 2; }));
  REQUIRE(Stored(*a) == 2);
  REQUIRE((*bridge_b)->AddImport(Consumed()).ok());
  std::set<std::string> got_b;
  auto mb = cb->member(0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    auto m = mb->Next(absl::Milliseconds(100));
    if (!m.ok()) continue;
    got_b.insert(m->event().msg_id);
    REQUIRE(m->Ack().ok());
  }
  CHECK(got_b == std::set<std::string>{"j-2", "j-3", "j-4", "j-5"});
  CHECK(Held(**bridge_a) == 2);
}

TEST_CASE("nats import with ImportAck::kConsumed counts a message once however often NATS redelivers it") {
  // A's lane is full and the lane-blocked import naks what it cannot store; the 2
  // held jobs stay held once each (they were counted again at each redelivery).
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  Client client(server.url());
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 6);
  std::optional<Consumer> ca;
  auto a = WorkEngine(&ca, 2);
  auto bridge_a = NatsBridge::Connect(*a, Options(server, "worker-a"));
  REQUIRE(bridge_a.ok());
  REQUIRE((*bridge_a)->AddImport(Consumed()).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 2; }));
  std::this_thread::sleep_for(std::chrono::seconds(4));
  CHECK(Stored(*a) == 2);
  CHECK(Held(**bridge_a) == 2);
}

TEST_CASE_METHOD(OneServer, "nats import with ImportAck::kConsumed naks, not acks, what a deleted ack_stream held") {
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 3);
  std::optional<Consumer> ca;
  auto a = WorkEngine(&ca);
  auto bridge_a = NatsBridge::Connect(*a, Options(server, "worker-a"));
  REQUIRE(bridge_a.ok());
  REQUIRE((*bridge_a)->AddImport(Consumed()).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 3; }));
  ca.reset();
  REQUIRE(a->DeleteStream("WORK").ok());
  REQUIRE(WaitFor([&] { return Held(**bridge_a) == 0; }));
  // Nothing was consumed: all 3 are still to do in NATS (pending or delivered again
  // and refused: no local stream captures them now).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto st = client.ConsumerState("JOBS", "workers");
  CHECK(st.first + static_cast<std::int64_t>(st.second) == 3);
}

// Found by an adversarial review: a stream of the ack_stream's name added again
// "holds no message" at the held sequences, and they were acked although nobody
// consumed them. Now: nak'ed, whether the new stream is empty or holds other
// messages at those sequences.
TEST_CASE_METHOD(OneServer, "nats import with ImportAck::kConsumed naks what it held when ack_stream is added again") {
  client.AddStream("JOBS", "jobs.>");
  PublishJobs(client, 0, 3);
  std::optional<Consumer> ca;
  auto a = WorkEngine(&ca);
  std::unique_ptr<NatsBridge> bridge_a = Holding(*a, server, "worker-a", 3);
  ca.reset();
  const int local = GENERATE(0, 3);  // messages the new stream holds at the held sequences
  INFO(local << " local messages in the new stream");
  REQUIRE(a->DeleteStream("WORK").ok());
  REQUIRE(a->AddStream({.name = "WORK", .subjects = {"other.>"}, .retention = RetentionPolicy::kWorkQueue}).ok());
  for (int i = 0; i < local; ++i) {
    Event e;
    e.subject = "other.x";
    e.msg_id = "local-" + std::to_string(i);
    REQUIRE(a->Publish(std::move(e)).ok());
  }
  REQUIRE(WaitFor([&] { return Held(*bridge_a) == 0; }));
  // Nothing was consumed: all 3 are still to do in NATS.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto st = client.ConsumerState("JOBS", "workers");
  CHECK(st.first + static_cast<std::int64_t>(st.second) == 3);
}

// The cluster example's outage ran finished requests twice: a replica acked a request
// it had finished while the servers were down (or before the restarted cluster had
// elected the consumer's leader), the ack reached no one, and JetStream delivered
// the request again after ack_wait, to the other replica. The smallest input: one
// server, a reconnect buffer of 0 (so that what is sent while it is down is lost
// at once, as an ack flushed to a leaderless cluster is), the local ack during the
// outage.
TEST_CASE("nats import with ImportAck::kConsumed: an ack the outage lost is sent again until JetStream confirms it") {
  TempDir dir;
  NatsServer server(dir.path());
  REQUIRE(server.Start());
  {
    Client client(server.url());
    client.AddStream("JOBS", "jobs.>");
    PublishJobs(client, 0, 1);
  }
  std::optional<Consumer> consumer;
  auto engine = WorkEngine(&consumer);
  BridgeOptions o = Options(server, "worker-1");
  o.connection.reconnect_buffer_bytes = 0;
  auto bridge = NatsBridge::Connect(*engine, o);
  REQUIRE(bridge.ok());
  ImportConfig ic = Consumed();
  ic.ack_wait = absl::Seconds(6);
  REQUIRE((*bridge)->AddImport(ic).ok());
  REQUIRE(WaitFor([&] { return Held(**bridge) == 1; }));
  auto member = consumer->member(0);
  auto job = member->Next(absl::Seconds(5));
  REQUIRE(job.ok());

  server.Kill();
  REQUIRE(WaitFor([&] { return !(*bridge)->Stats().connected; }));
  REQUIRE(job->Ack().ok());  // the work is done while NATS is down
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the import settles it meanwhile
  REQUIRE(server.Start());
  REQUIRE(WaitFor([&] { return (*bridge)->Stats().connected; }));
  // Past ack_wait since the last in-progress JetStream stored: a lost ack shows.
  std::this_thread::sleep_for(std::chrono::seconds(8));
  const BridgeStats s = (*bridge)->Stats();
  INFO(s.last_error);
  CHECK(s.import_redelivered == 0);
  CHECK(s.imported == 1);
  CHECK(s.import_held == 0);
  CHECK_FALSE(member->Next(absl::Milliseconds(300)).ok());  // done once
  Client client(server.url());
  CHECK(client.ConsumerState("JOBS", "workers") == std::pair<std::int64_t, std::uint64_t>{0, 0});
}
