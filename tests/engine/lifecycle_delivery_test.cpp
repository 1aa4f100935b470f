// Tests of ConsumerConfig::lifecycle: deliveries, acks, naks, dead letters and model
// evictions moving messages through a Lifecycle (engine/lifecycle.hpp), each
// transition one StateStore transaction, with the exact states, reasons and store
// values, and across a restart of a file stream and its store.
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "../state/state_test_util.hpp"
#include "engine_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/state/state_store.hpp"

using namespace inferq;
using inferq::engine_test::CS;
using inferq::engine_test::Ev;
using inferq::engine_test::H;
using inferq::engine_test::Msg;
using state_test::TempDir;

namespace {

// A StateStore and a Lifecycle over it, and an engine with stream S (s.>), dead
// letters in stream DLQ (dead.>), and consumer c of S with the lifecycle.
struct Env {
  TempDir dir;
  TempDir stream_dir;
  std::unique_ptr<StateStore> store;
  std::unique_ptr<Lifecycle> lc;
  std::unique_ptr<Engine> engine;
  std::optional<Consumer> c;
  std::optional<Consumer> dead;
  bool file = false;

  // A file stream by default: its finished records stay until a durable ack
  // (AckSync) or the next AddConsumer, so a plain Ack's Completed and a dead letter's
  // Expired can be read back; a memory stream's go at once (see the last tests).
  explicit Env(bool file_stream = true, std::int64_t max_deliver = -1) : file(file_stream) {
    Open(max_deliver);
  }
  void Open(std::int64_t max_deliver = -1) {
    c.reset();
    dead.reset();
    engine.reset();
    lc.reset();
    store.reset();
    store = *StateStore::Open(state_test::Options(dir.path()));
    lc = *Lifecycle::Open(store.get(), {});
    engine = *Engine::Create();
    StreamConfig s{.name = "S", .subjects = {"s.>"}};
    if (file) {
      s.storage = StorageType::kFile;
      s.directory = stream_dir.path();
    }
    REQUIRE(engine->AddStream(s).ok());
    REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
    c = *engine->AddConsumer({.stream = "S",
                              .name = "c",
                              .deliver = DeliverPolicy::kAll,
                              .max_deliver = max_deliver,
                              .dead_letter_subject = "dead.c",
                              .lifecycle = lc.get()});
    dead = *engine->AddConsumer({.stream = "DLQ", .name = "d", .deliver = DeliverPolicy::kAll});
  }
  // Model `model` warmed up and ready (Inference).
  void Ready(const std::string& model) {
    REQUIRE(lc->BeginWarmup(model).ok());
    REQUIRE(lc->ModelReady(model).ok());
  }
  absl::Status Publish(const std::string& id, const std::string& model) {
    Event e = Ev("s.a", id);
    e.model = model;
    return engine->Publish(std::move(e)).status();
  }
  // The lifecycle id of stream S's sequence `seq`.
  std::string Id(std::uint64_t seq) const {
    const EngineStats st = engine->Stats();
    return "S/c/" + st.stream("S")->incarnation + "/" + std::to_string(seq);
  }
  std::string State(const std::string& id) {
    absl::StatusOr<MessageInfo> m = lc->GetMessage(id);
    if (!m.ok()) return Msg(m.status());
    std::string s(MessageStateName(m->state));
    if (!m->reason.empty()) s += " (" + m->reason + ")";
    return s;
  }
  // The next dead letter: "<reason> | <description>", or the pull's error.
  std::string DeadLetter() {
    absl::StatusOr<Message> m = dead->member(0)->Next(absl::Seconds(5));
    if (!m.ok()) return Msg(m.status());
    REQUIRE(m->Ack().ok());
    return H(m->event(), kDeadLetterReasonHeader) + " | " +
           H(m->event(), kDeadLetterDescriptionHeader);
  }
};

}  // namespace

TEST_CASE("a delivery moves its message Pending -> Processing and an ack to Completed") {
  Env e;
  e.Ready("llama");
  const std::uint64_t before = e.lc->Stats().transactions;
  REQUIRE(e.Publish("r1", "llama").ok());
  CHECK(e.State(e.Id(1)) == "message \'" + e.Id(1) + "\' is unknown");  // Pending from its first delivery
  absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  CHECK(e.State(e.Id(1)) == "processing");
  CHECK(e.lc->Stats().transactions - before == 2);  // Enqueue, StartProcessing
  REQUIRE(m->Ack().ok());
  CHECK(e.State(e.Id(1)) == "completed");
  CHECK(e.lc->Stats().transactions - before == 3);
  CHECK_THAT(e.store->Get("lifecycle.msg." + e.Id(1)).value_or("<absent>"),
             Catch::StartsWith("v1 completed llama "));
  CHECK(CS(*e.engine, "S", "c").acked == 1);
}

TEST_CASE("a nak moves it back to Pending, and the redelivery to Processing again") {
  Env e;
  e.Ready("m");
  REQUIRE(e.Publish("r1", "m").ok());
  absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  REQUIRE(m->Nak(absl::Seconds(3600)).ok());  // held back: the state is seen between
  CHECK(e.State(e.Id(1)) == "pending");
  REQUIRE(e.Publish("r2", "m").ok());
  absl::StatusOr<Message> m2 = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m2.ok());
  CHECK(m2->stream_seq() == 2);
  REQUIRE(m2->Nak().ok());
  absl::StatusOr<Message> again = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(again.ok());
  CHECK(again->stream_seq() == 2);
  CHECK(again->attempt() == 2);
  CHECK(e.State(e.Id(2)) == "processing");
}

TEST_CASE("a dead letter expires the message with its reason") {
  SECTION("term") {
    Env e;
    e.Ready("m");
    REQUIRE(e.Publish("r1", "m").ok());
    absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    REQUIRE(m->Term("bad input").ok());
    CHECK(e.State(e.Id(1)) == "expired (term: bad input)");
    CHECK(e.DeadLetter() == "term | bad input");
  }
  SECTION("max_deliver") {
    Env e(/*file_stream=*/true, /*max_deliver=*/1);
    e.Ready("m");
    REQUIRE(e.Publish("r1", "m").ok());
    absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    REQUIRE(m->Nak().ok());
    CHECK(e.State(e.Id(1)) == "expired (max_deliver: nak)");
    CHECK(e.DeadLetter() == "max_deliver | nak");
  }
}

TEST_CASE("a message whose model warms up stays Pending until the model is ready") {
  Env e;
  REQUIRE(e.lc->BeginWarmup("m").ok());
  REQUIRE(e.Publish("r1", "m").ok());
  CHECK(!e.c->member(0)->Next(absl::ZeroDuration()).ok());  // put back for 50 ms
  CHECK(e.State(e.Id(1)) == "pending");
  REQUIRE(e.lc->ModelReady("m").ok());
  absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  CHECK(m->stream_seq() == 1);
  CHECK(e.State(e.Id(1)) == "processing");
}

TEST_CASE("a message the lifecycle cannot enqueue is terminated, naming why") {
  Env e;
  e.Ready("m");
  REQUIRE(e.Publish("r1", "").ok());
  REQUIRE(e.Publish("r2", "other").ok());
  CHECK(!e.c->member(0)->Next(absl::ZeroDuration()).ok());
  CHECK(e.DeadLetter() ==
        "term | lifecycle: model '' must be 1 to 256 visible ASCII characters (0x21 to 0x7e)");
  CHECK(e.DeadLetter() == "term | lifecycle: model 'other' is unknown");
  CHECK(e.State(e.Id(1)) == "message \'" + e.Id(1) + "\' is unknown");
}

TEST_CASE("evicting a model expires its Processing messages, whose acks then terminate them") {
  Env e;
  e.Ready("m");
  REQUIRE(e.Publish("r1", "m").ok());
  REQUIRE(e.Publish("r2", "m").ok());
  absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  CHECK(e.State(e.Id(1)) == "processing");
  absl::StatusOr<std::vector<std::string>> expired = e.lc->Evict("m", "out of memory");
  REQUIRE(expired.ok());
  CHECK(*expired == std::vector<std::string>{e.Id(1)});  // S/2 was never delivered
  CHECK(Msg(m->Ack()) ==
        "ack of message 1 by consumer 'c': the message expired in its lifecycle (model "
        "evicted), so it was terminated, not acked");
  CHECK(e.State(e.Id(1)) == "expired (model evicted)");
  CHECK(e.DeadLetter() == "term | lifecycle: expired (model evicted)");
  // S/2's first delivery finds the model evicted: terminated.
  CHECK(!e.c->member(0)->Next(absl::ZeroDuration()).ok());
  CHECK(e.DeadLetter() == "term | lifecycle: model 'm' is evicted; Enqueue needs it in warmup or inference");
  CHECK(CS(*e.engine, "S", "c").acked == 0);
}

TEST_CASE("a redelivery of a message its lifecycle completed is acked without reaching a member") {
  // As after a crash between the ack's Complete and its ack record.
  Env e;
  e.Ready("m");
  REQUIRE(e.Publish("r1", "m").ok());
  absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  REQUIRE(e.lc->Complete(e.Id(1)).ok());
  REQUIRE(m->Nak().ok());  // its Requeue fails (completed); it is redelivered
  CHECK(!e.c->member(0)->Next(absl::ZeroDuration()).ok());
  CHECK(CS(*e.engine, "S", "c").acked == 1);
  CHECK(e.State(e.Id(1)) == "completed");
}

TEST_CASE("after a restart an unacked delivery stays Processing and its ack completes it") {
  Env e(/*file_stream=*/true);
  e.Ready("m");
  REQUIRE(e.Publish("r1", "m").ok());
  {
    absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
    REQUIRE(m.ok());
  }  // never acked
  e.Open();
  CHECK(e.State(e.Id(1)) == "processing");
  {
    const std::uint64_t before = e.lc->Stats().transactions;
    absl::StatusOr<Message> m = e.c->member(0)->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    CHECK(m->attempt() == 2);
    CHECK(e.lc->Stats().transactions == before);  // Processing already: no transition
    REQUIRE(m->Ack().ok());
    CHECK(e.State(e.Id(1)) == "completed");
  }
  // A durable ack: the record is done with.
  e.Open();
  CHECK(e.State(e.Id(1)) == "message '" + e.Id(1) + "' is unknown");
  CHECK(e.lc->Stats().forgotten == 1);
}

TEST_CASE("AddConsumer refuses a lifecycle without explicit acks or used by another consumer") {
  Env e;
  CHECK(Msg(e.engine->AddConsumer({.stream = "S", .name = "n", .ack = AckPolicy::kNone,
                                   .lifecycle = e.lc.get()})
                .status()) == "consumer 'n': lifecycle needs explicit acks (ack policy is none)");
  CHECK(Msg(e.engine->AddConsumer({.stream = "S", .name = "x", .lifecycle = e.lc.get()})
                .status()) ==
        "consumer 'x': its lifecycle is already used by consumer 'c' of stream 'S' (its ids are "
        "per stream sequence: give each consumer its own)");
}

TEST_CASE("members acking, naking and terminating at once keep the lifecycle exact") {
  // Under TSan in CI. Every message ends Completed (acked) or Expired (terminated),
  // then forgotten (a memory stream's record is done with once settled), and the
  // lifecycle's own check holds.
  TempDir dir;
  auto store = *StateStore::Open(state_test::Options(dir.path()));
  auto lc = *Lifecycle::Open(store.get(), {});
  REQUIRE(lc->BeginWarmup("m").ok());
  REQUIRE(lc->ModelReady("m").ok());
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"s.>"}}).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .members = 2,
                                 .lane_capacity = 1024, .lifecycle = lc.get()});
  constexpr int kN = 300;
  std::atomic<int> acked{0}, termed{0}, failed{0};
  std::vector<std::thread> members;
  for (std::uint32_t i = 0; i < 2; ++i) {
    members.emplace_back([&, i] {
      Member m = *c.member(i);
      while (acked.load() + termed.load() < kN) {
        absl::StatusOr<Message> msg = m.Next(absl::Milliseconds(20));
        if (!msg.ok()) continue;
        const std::uint64_t seq = msg->stream_seq();
        absl::Status st;
        if (seq % 5 == 0 && msg->attempt() == 1) {
          st = msg->Nak();
        } else if (seq % 7 == 0) {
          st = msg->Term("seven");
          if (st.ok()) ++termed;
        } else {
          st = msg->Ack();
          if (st.ok()) ++acked;
        }
        if (!st.ok()) ++failed;
      }
    });
  }
  for (int i = 0; i < kN; ++i) {
    Event e = Ev("s.a");
    e.model = "m";
    REQUIRE(engine->Publish(std::move(e)).ok());
  }
  for (std::thread& t : members) t.join();
  CHECK(failed.load() == 0);
  CHECK(termed.load() == kN / 7);
  CHECK(acked.load() == kN - kN / 7);
  const LifecycleStats st = lc->Stats();
  CHECK(st.messages_completed == 0);
  CHECK(st.messages_expired == 0);
  CHECK(st.messages_pending == 0);
  CHECK(st.messages_processing == 0);
  CHECK(st.forgotten == static_cast<std::uint64_t>(kN));
  CHECK(st.expirations_by_reason == std::map<std::string, std::uint64_t>{{"term: seven", kN / 7}});
  CHECK(lc->Messages().empty());
  CHECK(lc->Verify().ok());
}

TEST_CASE("a memory stream's lifecycle records are forgotten once acked or dead-lettered") {
  Env e(/*file_stream=*/false);
  e.Ready("llama");
  REQUIRE(e.Publish("a", "llama").ok());
  REQUIRE(e.Publish("b", "llama").ok());
  Member m = *e.c->member(0);
  absl::StatusOr<Message> a = m.Next(absl::Seconds(5));
  REQUIRE(a.ok());
  CHECK(e.State(e.Id(1)) == "processing");
  REQUIRE(a->Ack().ok());
  CHECK(e.State(e.Id(1)) == "message '" + e.Id(1) + "' is unknown");
  CHECK(e.store->Get("lifecycle.msg." + e.Id(1)).value_or("<absent>") == "<absent>");
  absl::StatusOr<Message> b = m.Next(absl::Seconds(5));
  REQUIRE(b.ok());
  REQUIRE(b->Term("bad input").ok());
  CHECK(e.DeadLetter() == "term | bad input");
  CHECK(e.State(e.Id(2)) == "message '" + e.Id(2) + "' is unknown");
  const LifecycleStats st = e.lc->Stats();
  CHECK(st.forgotten == 2);
  CHECK(st.expirations_by_reason == std::map<std::string, std::uint64_t>{{"term: bad input", 1}});
  CHECK(e.lc->Messages().empty());
}

// Found by the adversarial review: a record whose message the stream removed after
// a nak (max_msgs) stayed Pending for ever, one per cycle.
TEST_CASE("the record of a message its stream removed goes when its delivery is skipped") {
  TempDir dir;
  auto store = *StateStore::Open(state_test::Options(dir.path()));
  auto lc = *Lifecycle::Open(store.get(), {});
  REQUIRE(lc->BeginWarmup("m").ok());
  REQUIRE(lc->ModelReady("m").ok());
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"s.>"}, .max_msgs = 1}).ok());
  ConsumerConfig cc{.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll};
  cc.lifecycle = lc.get();
  Consumer c = *engine->AddConsumer(cc);
  Member m = *c.member(0);
  auto publish = [&] {
    Event e = Ev("s.x");
    e.model = "m";
    REQUIRE(engine->Publish(std::move(e)).ok());
  };
  for (int i = 0; i < 3; ++i) {
    publish();
    REQUIRE(m.Next(absl::Seconds(5))->Nak().ok());  // Processing -> Pending, queued again
    publish();                                      // max_msgs 1 removes it
    absl::StatusOr<Message> next = m.Next(absl::Seconds(5));  // the removed one is skipped
    REQUIRE(next.ok());
    CHECK(next->stream_seq() == static_cast<std::uint64_t>(2 * i + 2));
    REQUIRE(next->Ack().ok());
  }
  CHECK(lc->Messages().empty());
  const LifecycleStats st = lc->Stats();
  CHECK(st.forgotten == 6);
  CHECK(st.expirations_by_reason ==
        std::map<std::string, std::uint64_t>{{"its message was removed from stream 'S'", 3}});
  CHECK(lc->Verify().ok());
}

// Found by the adversarial review: a file stream's plain Ack leaves a Completed
// record until the next AddConsumer; a consumer deleted and added again under the
// same name (with the same lifecycle) had its deliveries acked unseen by them.
TEST_CASE("a consumer deleted and added again starts with no lifecycle records") {
  Env e;  // a file stream
  e.Ready("m");
  for (int i = 0; i < 3; ++i) REQUIRE(e.Publish("r" + std::to_string(i), "m").ok());
  {
    Member m = *e.c->member(0);
    for (int i = 0; i < 3; ++i) REQUIRE(m.Next(absl::Seconds(5))->Ack().ok());
  }
  CHECK(e.lc->Messages().size() == 3);  // Completed, the acks not yet durable
  e.c.reset();
  REQUIRE(e.engine->DeleteConsumer("S", "c").ok());
  CHECK(e.lc->Messages().empty());
  ConsumerConfig cc{.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll};
  cc.lifecycle = e.lc.get();
  Consumer again = *e.engine->AddConsumer(cc);
  Member m = *again.member(0);
  std::vector<std::string> seen;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Message> msg = m.Next(absl::Seconds(5));
    REQUIRE(msg.ok());
    seen.push_back(msg->event().msg_id + "@" + std::to_string(msg->attempt()));
    REQUIRE(msg->AckSync().ok());
  }
  CHECK(seen == std::vector<std::string>{"r0@1", "r1@1", "r2@1"});
  CHECK(e.lc->Messages().empty());
}

// Found by the adversarial review: NextBatch into a span pulled straight into the
// slot after the batch, and a message the lifecycle's delivery step terminated there
// replaced the caller's own Message (given up unsettled) although the count ended
// before it.
TEST_CASE("NextBatch into a span keeps the caller's Message after the count when the lifecycle takes a pull") {
  TempDir dir;
  auto store = *StateStore::Open(state_test::Options(dir.path()));
  auto lc = *Lifecycle::Open(store.get(), {});
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"s.>"}}).ok());
  Member m = engine->AddConsumer({.stream = "S", .name = "c", .lifecycle = lc.get()})->member(0).value();
  REQUIRE(lc->BeginWarmup("m").ok());
  REQUIRE(lc->ModelReady("m").ok());
  auto publish = [&](const std::string& id, const std::string& model) {
    Event e = Ev("s.a", id);
    e.model = model;
    REQUIRE(engine->Publish(std::move(e)).ok());
  };
  publish("keep", "m");
  std::array<Message, 2> out;
  out[1] = m.Next(absl::Seconds(5)).value();  // the caller's, after the coming batch
  publish("e1", "m");
  publish("e2", "no-such-model");  // terminated by the lifecycle when pulled
  absl::StatusOr<std::size_t> n = m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(n.ok());
  CHECK(*n == 1);
  CHECK(out[0].event().msg_id == "e1");
  CHECK(out[1].event().msg_id == "keep");
  CHECK(out[1].Ack().ok());
  // An error leaves every slot as it was.
  out[0] = Message();
  n = m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration());
  CHECK(n.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(out[0].empty());
  CHECK(out[1].event().msg_id == "keep");
}
