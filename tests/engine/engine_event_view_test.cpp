// Engine::PublishView(const EventView&) and PublishViewBatch(std::span<const EventView>): an
// event given as views is stored as a copy, with every field an Event's publish
// would store, the same errors, and nothing that refers to the caller's memory.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/event_view.hpp"
#include "../state/state_test_util.hpp"
#include "span_recorder.hpp"
#include "../event/event_test_util.hpp"

using namespace inferq;
using namespace inferq::engine_test;
using inferq::event_test::CheckSameEvent;
using state_test::TempDir;

namespace {

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// A view that Validate refuses: both a payload (`bytes`) and a shared payload.
EventView BothPayloads(std::string_view subject, std::string_view bytes, const Buffer& shared) {
  EventView v;
  v.subject = subject;
  v.payload = Bytes(bytes);
  v.shared_payload = &shared;
  return v;
}

std::string Body(const Event& e) {
  const auto p = e.payload.span();
  return std::string(reinterpret_cast<const char*>(p.data()), p.size());
}

std::unique_ptr<Engine> EngineWithStream(std::string name = "S", std::vector<std::string> subjects = {"v.>"}) {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = name, .subjects = std::move(subjects)}).ok());
  return engine;
}


}  // namespace

TEST_CASE("a view's publish stores every field, as a copy of the caller's memory") {
  auto engine = EngineWithStream();
  auto consumer = *engine->AddConsumer({.stream = "S", .name = "c"});
  Member m = *consumer.member(0);

  std::string subject = "v.full";
  std::string body = "{\"prompt\":\"hello\"}";
  std::string tenant = "acme", tag = "summarize", model = "llama", version = "3.1";
  std::string msg_id = "id-1", seq_id = "gen-7";
  Headers headers;
  headers.Set("context_tokens", "374");
  headers.Set("route", "a");
  const std::array<std::int64_t, 3> shape = {2, 3, 4};
  EventView v;
  v.subject = subject;
  v.payload = Bytes(body);
  v.task_id = Uuid{0x0102030405060708, 0x1112131415161718};
  v.semantic_tag = tag;
  v.tenant = tenant;
  v.qos = Qos::kGold;
  v.priority = 7;
  v.trace.trace_id[0] = 0xab;
  v.trace.span_id[7] = 0xcd;
  v.trace.flags = 1;
  v.model = model;
  v.model_version = version;
  v.schema_id = 12;
  v.schema_version = 3;
  v.msg_id = msg_id;
  v.seq_id = seq_id;
  v.seq_no = 41;
  v.created = absl::FromUnixSeconds(1'700'000'000);
  v.deadline = absl::Now() + absl::Hours(1);
  v.ttl = absl::Minutes(5);
  v.attempt = 2;
  v.shape = shape;
  v.dtype = DType::kFloat16;
  v.headers = &headers;
  const Event expected = v.ToEvent();

  auto ack = engine->PublishView(v);
  REQUIRE(ack.ok());
  CHECK(ack->seq == 1);
  CHECK_FALSE(ack->duplicate);
  // Nothing refers to the caller's memory once Publish returned.
  std::fill(subject.begin(), subject.end(), 'x');
  std::fill(body.begin(), body.end(), 'x');
  std::fill(tenant.begin(), tenant.end(), 'x');
  std::fill(msg_id.begin(), msg_id.end(), 'x');
  headers.Set("route", "changed");

  auto msg = m.Next(absl::Seconds(5));
  REQUIRE(msg.ok());
  CheckSameEvent(msg->event(), expected);
  CHECK(msg->event().subject == "v.full");
  CHECK(Body(msg->event()) == "{\"prompt\":\"hello\"}");
  CHECK(msg->event().headers.Get("route") == "a");
  CHECK(msg->event().payload.span().data() != reinterpret_cast<const std::byte*>(body.data()));
  REQUIRE(msg->Ack().ok());

  // The same view published again is a duplicate of the first (msg_id copied).
  v.subject = "v.full";
  msg_id = "id-1";
  v.msg_id = msg_id;
  auto again = engine->PublishView(v);
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(again->seq == 1);
}

TEST_CASE("a view's shared_payload is shared, not copied") {
  auto engine = EngineWithStream();
  auto consumer = *engine->AddConsumer({.stream = "S", .name = "c"});
  const Buffer shared = Buffer::FromString("tensor bytes");
  EventView v;
  v.subject = "v.t";
  v.shared_payload = &shared;
  REQUIRE(engine->PublishView(v).ok());
  auto msg = consumer.member(0)->Next(absl::Seconds(5));
  REQUIRE(msg.ok());
  CHECK(msg->event().payload.span().data() == shared.span().data());
  CHECK(Body(msg->event()) == "tensor bytes");
}

TEST_CASE("a view with a payload and a shared_payload is refused, naming both, and stores nothing") {
  auto engine = EngineWithStream();
  const Buffer shared = Buffer::FromString("abc");
  const EventView v = BothPayloads("v.both", "12345", shared);
  auto ack = engine->PublishView(v);
  REQUIRE_FALSE(ack.ok());
  CHECK(ack.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(ack.status()) ==
        "EventView for subject 'v.both' has both a payload of 5 bytes and a shared_payload: set one of them");
  CHECK(engine->Stats().invalid == 1);
  CHECK(engine->Stats().published == 0);
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("a view is refused for what an Event is refused for, with the same error") {
  auto engine = EngineWithStream();
  const std::string bad_subjects[] = {"v..x", "", "other.subject"};
  for (const std::string& subject : bad_subjects) {
    EventView v;
    v.subject = subject;
    v.payload = Bytes("p");
    Event e;
    e.subject = subject;
    e.payload = Buffer::FromString("p");
    auto by_view = engine->PublishView(v);
    auto by_event = engine->Publish(std::move(e));
    REQUIRE_FALSE(by_view.ok());
    REQUIRE_FALSE(by_event.ok());
    CHECK(by_view.status() == by_event.status());
  }
  EventView ttl;
  ttl.subject = "v.ttl";
  ttl.ttl = absl::Seconds(-1);
  Event e;
  e.subject = "v.ttl";
  e.ttl = absl::Seconds(-1);
  auto by_view = engine->PublishView(ttl);
  auto by_event = engine->Publish(std::move(e));
  REQUIRE_FALSE(by_view.ok());
  CHECK(by_view.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(by_view.status() == by_event.status());
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("a view captured by two streams is stored in both, one copy of the event shared") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = "A", .subjects = {"v.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "B", .subjects = {"v.*"}}).ok());
  auto a = *engine->AddConsumer({.stream = "A", .name = "a"});
  auto b = *engine->AddConsumer({.stream = "B", .name = "b"});
  EventView v;
  v.subject = "v.two";
  v.payload = Bytes("both");
  auto ack = engine->PublishView(v);
  REQUIRE(ack.ok());
  CHECK(ack->streams_stored == 2);
  auto ma = a.member(0)->Next(absl::Seconds(5));
  auto mb = b.member(0)->Next(absl::Seconds(5));
  REQUIRE(ma.ok());
  REQUIRE(mb.ok());
  CHECK(Body(ma->event()) == "both");
  CHECK(Body(mb->event()) == "both");
  CHECK(&ma->event() == &mb->event());  // the first stream's record holds it for both
  REQUIRE(ma->Ack().ok());
  REQUIRE(mb->Ack().ok());
}

TEST_CASE("PublishViewBatch publishes in order and stops at the first refused view") {
  auto engine = EngineWithStream();
  auto consumer = *engine->AddConsumer({.stream = "S", .name = "c"});
  const Buffer shared = Buffer::FromString("s");
  std::vector<std::string> bodies = {"b0", "b1", "b2", "b3"};
  std::vector<EventView> views(4);
  for (std::size_t i = 0; i < views.size(); ++i) {
    views[i].subject = "v.batch";
    views[i].payload = Bytes(bodies[i]);
    views[i].seq_no = i;
  }
  views[2].shared_payload = &shared;  // with a payload too: refused
  std::array<PublishAck, 4> acks;

  SECTION("every view published") {
    views[2].shared_payload = nullptr;
    const PublishBatchResult r = engine->PublishViewBatch(std::span<const EventView>(views), acks);
    REQUIRE(r.status.ok());
    CHECK(r.published == 4);
    for (std::uint64_t i = 0; i < 4; ++i) CHECK(acks[i].seq == i + 1);
    Member m = *consumer.member(0);
    for (std::size_t i = 0; i < 4; ++i) {
      auto msg = m.Next(absl::Seconds(5));
      REQUIRE(msg.ok());
      CHECK(Body(msg->event()) == bodies[i]);
      CHECK(msg->event().seq_no == i);
      REQUIRE(msg->Ack().ok());
    }
  }
  SECTION("the third refused: two published, the rest left") {
    const PublishBatchResult r = engine->PublishViewBatch(std::span<const EventView>(views), acks);
    CHECK(r.published == 2);
    CHECK(r.status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(r.status) ==
          "EventView for subject 'v.batch' has both a payload of 2 bytes and a shared_payload: set one of them");
    CHECK(acks[0].seq == 1);
    CHECK(acks[1].seq == 2);
    CHECK(SS(*engine, "S").messages == 2);
    CHECK(engine->Stats().invalid == 1);
  }
  SECTION("an unrouted view stops the batch with NotFound") {
    views[2].shared_payload = nullptr;
    views[1].subject = "elsewhere";
    const PublishBatchResult r = engine->PublishViewBatch(std::span<const EventView>(views), acks);
    CHECK(r.published == 1);
    CHECK(r.status.code() == absl::StatusCode::kNotFound);
    CHECK(SS(*engine, "S").messages == 1);
  }
  SECTION("too few acks: nothing published") {
    std::array<PublishAck, 2> few;
    const PublishBatchResult r = engine->PublishViewBatch(std::span<const EventView>(views), few);
    CHECK(r.published == 0);
    CHECK(r.status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(r.status) == "PublishBatch: acks holds 2 PublishAcks for 4 events (give none, or at least one per event)");
    CHECK(SS(*engine, "S").messages == 0);
  }
}

TEST_CASE("a view published into a file stream is read back by the next engine") {
  TempDir d;
  StreamConfig file{.name = "F", .subjects = {"f.>"}};
  file.storage = StorageType::kFile;
  file.directory = d.path();
  std::string body = "durable body";
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(file).ok());
    EventView v;
    v.subject = "f.one";
    v.payload = Bytes(body);
    v.msg_id = "f-1";
    v.tenant = "t";
    auto ack = engine->PublishView(v);
    REQUIRE(ack.ok());
    CHECK(ack->seq == 1);
  }
  body.assign(body.size(), 'x');
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(file).ok());
  auto all = *engine->AddConsumer({.stream = "F", .name = "all", .deliver = DeliverPolicy::kAll});
  auto msg = all.member(0)->Next(absl::Seconds(5));
  REQUIRE(msg.ok());
  CHECK(msg->event().subject == "f.one");
  CHECK(Body(msg->event()) == "durable body");
  CHECK(msg->event().msg_id == "f-1");
  CHECK(msg->event().tenant == "t");
  REQUIRE(msg->Ack().ok());
}

TEST_CASE("an Event given by designated initializers still picks Publish(Event)") {
  // PublishView has a name of its own: as an overload of Publish, this call (and
  // PublishBatch({})) was ambiguous between the two aggregates.
  auto engine = EngineWithStream();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // the fields left out are defaulted
  auto ack = engine->Publish({.subject = "v.designated", .seq_no = 3});
#pragma GCC diagnostic pop
  REQUIRE(ack.ok());
  CHECK(ack->seq == 1);
  CHECK(engine->PublishBatch({}).published == 0);
  CHECK(engine->PublishViewBatch({}).published == 0);
}

// The adversarial review's reproductions (three defects of the first version).

TEST_CASE("a view's refusals are traced as a refused Publish(Event) is") {
  SECTION("closed engine") {
    auto by_event = std::make_shared<inferq_test::SpanRecorder>();
    auto by_view = std::make_shared<inferq_test::SpanRecorder>();
    EngineOptions oa, ob;
    oa.trace = {.sink = by_event, .sample_ratio = 1.0, .id_seed = 1};
    ob.trace = {.sink = by_view, .sample_ratio = 1.0, .id_seed = 1};
    auto ea = *Engine::Create(std::move(oa));
    auto eb = *Engine::Create(std::move(ob));
    REQUIRE(ea->AddStream({.name = "S", .subjects = {"v.>"}}).ok());
    REQUIRE(eb->AddStream({.name = "S", .subjects = {"v.>"}}).ok());
    ea->Close();
    eb->Close();
    Event e;
    e.subject = "v.x";
    EventView v;
    v.subject = "v.x";
    auto ra = ea->Publish(std::move(e));
    auto rb = eb->PublishView(v);
    CHECK(ra.status() == rb.status());
    CHECK(by_event->Of(SpanStage::kPublish).size() == 1);
    CHECK(by_view->Of(SpanStage::kPublish).size() == 1);
    CHECK(eb->PublishViewBatch(std::span<const EventView>(&v, 1)).status.code() == absl::StatusCode::kCancelled);
    CHECK(by_view->Of(SpanStage::kPublish).size() == 2);
  }
  SECTION("an invalid view, unsampled: errors are always recorded") {
    auto spans = std::make_shared<inferq_test::SpanRecorder>();
    EngineOptions o;
    o.trace = {.sink = spans, .sample_ratio = 0.0, .id_seed = 1};
    auto engine = *Engine::Create(std::move(o));
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"v.>"}}).ok());
    const Buffer shared = Buffer::FromString("x");
    const EventView v = BothPayloads("v.x", "y", shared);
    Event bad;
    bad.subject = "v..x";
    CHECK_FALSE(engine->Publish(std::move(bad)).ok());
    CHECK(spans->Of(SpanStage::kPublish).size() == 1);
    CHECK_FALSE(engine->PublishView(v).ok());
    CHECK(spans->Of(SpanStage::kPublish).size() == 2);
    CHECK_FALSE(engine->PublishViewBatch(std::span<const EventView>(&v, 1)).status.ok());
    CHECK(spans->Of(SpanStage::kPublish).size() == 3);
  }
}

TEST_CASE("a closed engine refuses an invalid view alike in PublishView and PublishViewBatch") {
  auto e1 = EngineWithStream();
  auto e2 = EngineWithStream();
  e1->Close();
  e2->Close();
  const Buffer shared = Buffer::FromString("s");
  const EventView v = BothPayloads("v.x", "p", shared);
  auto one = e1->PublishView(v);
  const PublishBatchResult batch = e2->PublishViewBatch(std::span<const EventView>(&v, 1));
  CHECK(one.status().code() == absl::StatusCode::kCancelled);
  CHECK(one.status() == batch.status);
  CHECK(batch.published == 0);
  CHECK(e1->Stats().invalid == 0);
  CHECK(e2->Stats().invalid == 0);
}

TEST_CASE("CopyTo into a used Event clears every field the view leaves empty") {
  Event e;
  e.tenant = "old-tenant";
  e.msg_id = "old-id";
  e.semantic_tag = "old-tag";
  e.model = "old-model";
  e.model_version = "old-version";
  e.seq_id = "old-seq";
  e.shape = {9, 9};
  e.headers.Set("stale", "1");
  e.payload = Buffer::FromString("old payload");
  EventView v;
  v.subject = "v.x";
  v.CopyTo(e);
  CHECK(e.subject == "v.x");
  CHECK(e.tenant.empty());
  CHECK(e.msg_id.empty());
  CHECK(e.semantic_tag.empty());
  CHECK(e.model.empty());
  CHECK(e.model_version.empty());
  CHECK(e.seq_id.empty());
  CHECK(e.shape.empty());
  CHECK(e.headers.empty());
  CHECK(e.payload.size() == 0);
}

TEST_CASE("PublishView and PublishViewBatch racing Close: each view stored with an ack, or Cancelled") {
  // Engine::Close's promise for publishes, under contention: every call returns OK (the
  // view is stored, at the sequence its ack names) or Cancelled (nothing stored), and
  // the stream holds exactly the acknowledged sequences. Bounded: each publisher stops
  // at its first Cancelled, or after kMax views.
  constexpr int kPublishers = 2;
  constexpr int kMax = 200'000;
  auto engine = EngineWithStream();
  std::atomic<int> started{0};
  std::vector<std::vector<std::uint64_t>> seqs(kPublishers);
  std::vector<absl::Status> last(kPublishers);
  std::vector<std::thread> publishers;
  for (int p = 0; p < kPublishers; ++p) {
    publishers.emplace_back([&, p] {
      const std::string body = "p" + std::to_string(p);
      EventView v;
      v.subject = "v.race";
      v.payload = Bytes(body);
      std::array<EventView, 4> views;
      views.fill(v);
      std::array<PublishAck, 4> acks;
      started.fetch_add(1);
      for (int i = 0; i < kMax; ++i) {
        if (i % 2 == 0) {
          auto ack = engine->PublishView(v);
          if (!ack.ok()) {
            last[p] = ack.status();
            return;
          }
          seqs[p].push_back(ack->seq);
        } else {
          const PublishBatchResult r = engine->PublishViewBatch(views, acks);
          for (std::size_t k = 0; k < r.published; ++k) seqs[p].push_back(acks[k].seq);
          if (!r.status.ok()) {
            last[p] = r.status;
            return;
          }
        }
      }
    });
  }
  while (started.load() < kPublishers) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine->Close();
  for (auto& t : publishers) t.join();
  std::vector<std::uint64_t> all;
  for (int p = 0; p < kPublishers; ++p) {
    if (!last[p].ok()) {
      CHECK(last[p].code() == absl::StatusCode::kCancelled);
      CHECK(Msg(last[p]) == "engine is closed");
    }
    all.insert(all.end(), seqs[p].begin(), seqs[p].end());
  }
  std::sort(all.begin(), all.end());
  // The acknowledged sequences are 1..n, each once, and the stream holds n messages.
  for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == i + 1);
  CHECK(SS(*engine, "S").messages == all.size());
  CHECK(SS(*engine, "S").last_seq == all.size());
}
