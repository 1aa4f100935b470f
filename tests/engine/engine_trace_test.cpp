// Trace context (engine/trace.hpp): the spans of each stage, their parents, sampling
// by ratio and by parent, errors and dead letters recorded whatever was sampled, and
// a new span id per hop.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine_test_util.hpp"
#include "span_recorder.hpp"
#include "../state/state_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/event/traceparent.hpp"

using namespace inferq;
using namespace inferq::engine_test;

namespace {

using RecordingSink = inferq_test::SpanRecorder;

constexpr std::int64_t kStart = 1'000'000'000;

struct Traced {
  explicit Traced(double ratio = 1.0, std::uint64_t seed = 42) {
    EngineOptions o;
    o.clock = &clock;
    o.manual_timers = true;
    o.trace = {.sink = sink, .sample_ratio = ratio, .id_seed = seed};
    owned = Engine::Create(std::move(o)).value();
    REQUIRE(engine().AddStream({.name = "S", .subjects = {"work.>"}}).ok());
    REQUIRE(engine().AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  }
  Engine& engine() { return *owned; }
  Member Add(ConsumerConfig cc) {
    cc.stream = "S";
    if (cc.name.empty()) cc.name = "c";
    auto c = engine().AddConsumer(cc);
    REQUIRE(c.ok());
    return *c->member(0);
  }
  ManualClock clock{kStart};
  std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
  std::unique_ptr<Engine> owned;
};

// A trace context as an upstream service would send it: sampled or not.
TraceContext Upstream(bool sampled) {
  return *ParseTraceparent(sampled ? "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                                   : "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
}

const Span& Find(const std::vector<Span>& spans, SpanStage stage, int nth = 0) {
  for (const Span& s : spans) {
    if (s.stage == stage && nth-- == 0) return s;
  }
  FAIL("no span " << StageName(stage));
  return spans.front();
}

std::size_t Count(const std::vector<Span>& spans, SpanStage stage) {
  return static_cast<std::size_t>(
      std::count_if(spans.begin(), spans.end(), [&](const Span& s) { return s.stage == stage; }));
}

std::uint64_t Low64(const TraceContext& t) {
  std::uint64_t v = 0;
  for (int i = 8; i < 16; ++i) v = (v << 8) | t.trace_id[i];
  return v;
}

}  // namespace

TEST_CASE("stage names, operation types and kinds follow the messaging conventions") {
  CHECK(StageName(SpanStage::kPublish) == "publish");
  CHECK(StageName(SpanStage::kQueueWait) == "queue_wait");
  CHECK(StageName(SpanStage::kDeliver) == "deliver");
  CHECK(StageName(SpanStage::kAck) == "ack");
  CHECK(StageName(SpanStage::kNak) == "nak");
  CHECK(StageName(SpanStage::kTerm) == "term");
  CHECK(StageName(SpanStage::kDeadLetter) == "dead_letter");
  CHECK(OperationType(SpanStage::kPublish) == "send");
  CHECK(OperationType(SpanStage::kDeadLetter) == "send");
  CHECK(OperationType(SpanStage::kQueueWait) == "receive");
  CHECK(OperationType(SpanStage::kDeliver) == "process");
  CHECK(OperationType(SpanStage::kAck) == "settle");
  CHECK(OperationType(SpanStage::kNak) == "settle");
  CHECK(OperationType(SpanStage::kTerm) == "settle");
  CHECK(KindOf(SpanStage::kPublish) == SpanKind::kProducer);
  CHECK(KindOf(SpanStage::kDeliver) == SpanKind::kConsumer);
  CHECK(KindOf(SpanStage::kQueueWait) == SpanKind::kClient);
  CHECK(KindOf(SpanStage::kAck) == SpanKind::kClient);
}

TEST_CASE("a sample ratio outside 0..1 is refused, naming it") {
  for (double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EngineOptions o;
    o.trace = {.sink = std::make_shared<RecordingSink>(), .sample_ratio = bad};
    auto e = Engine::Create(std::move(o));
    REQUIRE(e.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Msg(e.status()), Catch::Contains("EngineOptions::trace.sample_ratio"));
    CHECK_THAT(Msg(e.status()), Catch::Contains("outside 0..1"));
  }
  EngineOptions o;
  o.trace = {.sink = std::make_shared<RecordingSink>(), .sample_ratio = 1.5};
  CHECK_THAT(Msg(Engine::Create(std::move(o)).status()), Catch::Contains("1.5"));
}

TEST_CASE("without a sink the event's trace is delivered as published") {
  Fixture f;
  Member m = f.Add({});
  Event e = Ev("work.a", "x");
  e.trace = Upstream(true);
  REQUIRE(f.engine.Publish(std::move(e)).ok());
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  CHECK(got->event().trace == Upstream(true));
  CHECK(got->trace() == Upstream(true));
  REQUIRE(got->Ack().ok());
}

TEST_CASE("publish, queue wait, delivery and ack are spans of one trace, each hop a new span") {
  Traced t;
  Member m = t.Add({.ack_wait = absl::Seconds(30)});
  Event e = Ev("work.a", "id-7");
  e.trace = Upstream(true);
  e.payload = Buffer::FromString("hello");
  REQUIRE(t.engine().Publish(std::move(e)).ok());
  t.clock.Advance(absl::Milliseconds(5));
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  t.clock.Advance(absl::Milliseconds(7));
  const TraceContext delivery = got->trace();
  REQUIRE(got->Ack().ok());
  const std::vector<Span> spans = t.sink->Take();
  REQUIRE(spans.size() == 4);
  const Span& pub = Find(spans, SpanStage::kPublish);
  const Span& wait = Find(spans, SpanStage::kQueueWait);
  const Span& deliver = Find(spans, SpanStage::kDeliver);
  const Span& ack = Find(spans, SpanStage::kAck);
  const TraceContext up = Upstream(true);
  for (const Span* s : {&pub, &wait, &deliver, &ack}) {
    CHECK(s->context.trace_id == up.trace_id);
    CHECK(s->context.flags == 1);
    CHECK(s->destination == "work.a");
    CHECK(s->message_id == "id-7");
    CHECK(s->body_size == 5);
    CHECK(s->error_type.empty());
  }
  // The publish is a child of the upstream span, and the stored event names it.
  CHECK(pub.parent_span_id == up.span_id);
  CHECK(pub.context.span_id != up.span_id);
  CHECK(got->event().trace.span_id == pub.context.span_id);
  CHECK(got->event().trace.trace_id == up.trace_id);
  CHECK(pub.stream_seq == 1);
  CHECK(pub.stream.empty());
  CHECK(pub.end_unix_ns == pub.start_unix_ns);  // the manual clock did not move
  // The queue wait: from the store to the pull, 5 ms.
  CHECK(wait.parent_span_id == pub.context.span_id);
  CHECK(wait.start_unix_ns == pub.start_unix_ns);
  CHECK(wait.end_unix_ns - wait.start_unix_ns == 5'000'000);
  CHECK(wait.stream == "S");
  CHECK(wait.consumer == "c");
  CHECK(wait.stream_seq == 1);
  CHECK(wait.delivery_count == 1);
  // The delivery: the pull to the ack, 7 ms; Message::trace() names it.
  CHECK(deliver.parent_span_id == pub.context.span_id);
  CHECK(deliver.context.span_id == delivery.span_id);
  CHECK(delivery.trace_id == up.trace_id);
  CHECK(deliver.start_unix_ns == wait.end_unix_ns);
  CHECK(deliver.end_unix_ns - deliver.start_unix_ns == 7'000'000);
  CHECK(deliver.batch_message_count == 0);
  CHECK(deliver.delivery_count == 1);
  // The ack: a child of the delivery.
  CHECK(ack.parent_span_id == deliver.context.span_id);
  CHECK(ack.start_unix_ns == deliver.end_unix_ns);
  // Every span id is new.
  std::set<std::array<std::uint8_t, 8>> ids{up.span_id};
  for (const Span& s : spans) CHECK(ids.insert(s.context.span_id).second);
  // The wall-clock offset: the engine clock plus a fixed offset near now.
  const std::int64_t now_unix = absl::GetCurrentTimeNanos();
  CHECK(std::abs(ack.end_unix_ns - now_unix) < std::int64_t{60} * 1'000'000'000);
}

TEST_CASE("an event without a trace gets a new trace, a root publish span") {
  Traced t;
  Member m = t.Add({});
  REQUIRE(t.engine().Publish(Ev("work.a", "x")).ok());
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  const TraceContext tr = got->event().trace;
  CHECK(!FormatTraceparent(tr).empty());  // a valid, non-zero context
  CHECK(tr.flags == 1);
  REQUIRE(got->Ack().ok());
  const std::vector<Span> spans = t.sink->Take();
  const Span& pub = Find(spans, SpanStage::kPublish);
  CHECK(pub.parent_span_id == std::array<std::uint8_t, 8>{});
  CHECK(pub.context.trace_id == tr.trace_id);
  CHECK(pub.context.span_id == tr.span_id);
}

TEST_CASE("an unsampled parent makes no spans, but its dead letter is recorded and traced") {
  Traced t(/*ratio=*/1.0);
  Member m = t.Add({.ack_wait = absl::Seconds(30), .max_deliver = 1,
                    .dead_letter_subject = "dead.c"});
  auto dlq = t.engine().AddConsumer({.stream = "DLQ", .name = "dlq"});
  REQUIRE(dlq.ok());
  Event e = Ev("work.a", "x");
  e.trace = Upstream(false);  // the parent decided: not sampled, whatever the ratio
  REQUIRE(t.engine().Publish(std::move(e)).ok());
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  CHECK(got->trace() == got->event().trace);  // no deliver span id
  CHECK(got->event().trace.flags == 0);
  REQUIRE(got->Nak().ok());  // the last delivery: dead-lettered
  const std::vector<Span> spans = t.sink->Take();
  REQUIRE(spans.size() == 2);
  const Span& dl = Find(spans, SpanStage::kDeadLetter);
  CHECK(dl.context.trace_id == Upstream(false).trace_id);
  CHECK(dl.context.flags == 0);
  CHECK(dl.parent_span_id == got->event().trace.span_id);  // the (unsampled) publish
  CHECK(dl.destination == "dead.c");
  CHECK(dl.stream == "S");
  CHECK(dl.consumer == "c");
  CHECK(dl.stream_seq == 1);
  CHECK(dl.delivery_count == 1);
  CHECK(dl.error_type == "max_deliver");
  CHECK(dl.error_message == "nak");
  // The dead letter's publish is sampled, a child of the dead_letter span.
  const Span& dl_pub = Find(spans, SpanStage::kPublish);
  CHECK(dl_pub.destination == "dead.c");
  CHECK(dl_pub.parent_span_id == dl.context.span_id);
  CHECK(dl_pub.context.flags == 1);
  auto letter = dlq->member(0)->Next(absl::ZeroDuration());
  REQUIRE(letter.ok());
  CHECK(letter->event().trace.span_id == dl_pub.context.span_id);
  CHECK(letter->event().trace.trace_id == Upstream(false).trace_id);
}

TEST_CASE("nak, redelivery and term: deliver spans say how they ended, the dead letter is the delivery's child") {
  Traced t;
  Member m = t.Add({.ack_wait = absl::Seconds(30), .dead_letter_subject = "dead.c"});
  REQUIRE(t.engine().Publish(Ev("work.a", "x")).ok());
  auto first = m.Next(absl::ZeroDuration());
  REQUIRE(first.ok());
  const TraceContext first_delivery = first->trace();
  REQUIRE(first->Nak().ok());
  auto second = m.Next(absl::ZeroDuration());
  REQUIRE(second.ok());
  CHECK(second->attempt() == 2);
  const TraceContext second_delivery = second->trace();
  CHECK(second_delivery.span_id != first_delivery.span_id);
  REQUIRE(second->Term("bad input").ok());
  const std::vector<Span> spans = t.sink->Take();
  // publish, queue_wait (first delivery only), deliver x2, nak, term, dead_letter,
  // and the dead letter's publish.
  CHECK(Count(spans, SpanStage::kPublish) == 2);
  CHECK(Count(spans, SpanStage::kQueueWait) == 1);
  CHECK(Count(spans, SpanStage::kDeliver) == 2);
  CHECK(Count(spans, SpanStage::kNak) == 1);
  CHECK(Count(spans, SpanStage::kTerm) == 1);
  CHECK(Count(spans, SpanStage::kDeadLetter) == 1);
  CHECK(spans.size() == 8);
  const Span& d1 = Find(spans, SpanStage::kDeliver, 0);
  const Span& d2 = Find(spans, SpanStage::kDeliver, 1);
  CHECK(d1.context.span_id == first_delivery.span_id);
  CHECK(d1.error_type == "nak");
  CHECK(d1.delivery_count == 1);
  CHECK(d2.context.span_id == second_delivery.span_id);
  CHECK(d2.error_type == "term");
  CHECK(d2.delivery_count == 2);
  const Span& term = Find(spans, SpanStage::kTerm);
  CHECK(term.parent_span_id == second_delivery.span_id);
  CHECK(term.error_type.empty());
  CHECK(term.error_message == "bad input");
  const Span& dl = Find(spans, SpanStage::kDeadLetter);
  CHECK(dl.parent_span_id == second_delivery.span_id);
  CHECK(dl.error_type == "term");
  CHECK(dl.error_message == "bad input");
  CHECK(dl.delivery_count == 2);
}

TEST_CASE("an ack_wait expiry's dead letter is the publish's child") {
  Traced t;
  Member m = t.Add({.ack_wait = absl::Seconds(1), .max_deliver = 1,
                    .dead_letter_subject = "dead.c"});
  REQUIRE(t.engine().Publish(Ev("work.a", "x")).ok());
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  t.clock.Advance(absl::Seconds(2));
  t.engine().RunTimers();
  const std::vector<Span> spans = t.sink->Take();
  const Span& dl = Find(spans, SpanStage::kDeadLetter);
  CHECK(dl.parent_span_id == got->event().trace.span_id);
  CHECK(dl.error_type == "max_deliver");
  CHECK(dl.error_message == "ack_wait expired");
  CHECK(Count(spans, SpanStage::kDeliver) == 0);  // never settled
}

TEST_CASE("a batch's deliver spans carry its size") {
  Traced t;
  Member m = t.Add({});
  for (const char* id : {"a", "b", "c"}) REQUIRE(t.engine().Publish(Ev("work.a", id)).ok());
  auto batch = m.NextBatch(8, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 3);
  for (Message& msg : *batch) REQUIRE(msg.Ack().ok());
  const std::vector<Span> spans = t.sink->Take();
  REQUIRE(Count(spans, SpanStage::kDeliver) == 3);
  for (int i = 0; i < 3; ++i) CHECK(Find(spans, SpanStage::kDeliver, i).batch_message_count == 3);
  auto one = m.Next(absl::ZeroDuration());
  CHECK(one.status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("ratio 0 still records errors (a refused publish, a second settle) but not WouldBlock") {
  Traced t(/*ratio=*/0.0);
  Member m = t.Add({.lane_capacity = 2});
  // NotFound: no stream captures the subject.
  auto lost = t.engine().Publish(Ev("nowhere.a", "n"));
  REQUIRE(lost.status().code() == absl::StatusCode::kNotFound);
  // WouldBlock: the lane (2 slots) is full and TryPublish does not wait.
  REQUIRE(t.engine().Publish(Ev("work.a", "1")).ok());
  REQUIRE(t.engine().Publish(Ev("work.a", "2")).ok());
  auto busy = t.engine().TryPublish(Ev("work.a", "3"));
  REQUIRE(WouldBlock(busy.status()));
  // A second ack: FailedPrecondition.
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  CHECK(got->event().trace.flags == 0);
  REQUIRE(got->Ack().ok());
  REQUIRE(got->Ack().code() == absl::StatusCode::kFailedPrecondition);
  const std::vector<Span> spans = t.sink->Take();
  REQUIRE(spans.size() == 2);
  const Span& pub = Find(spans, SpanStage::kPublish);
  CHECK(pub.destination == "nowhere.a");
  CHECK(pub.error_type == "NOT_FOUND");
  CHECK_THAT(pub.error_message, Catch::Contains("no stream captures subject"));
  CHECK(pub.context.flags == 0);
  const Span& ack = Find(spans, SpanStage::kAck);
  CHECK(ack.error_type == "FAILED_PRECONDITION");
  CHECK_THAT(ack.error_message, Catch::Contains("already settled"));
  CHECK(ack.parent_span_id == got->event().trace.span_id);
}

TEST_CASE("sampling by ratio is the trace-id's decision, and only sampled events make spans") {
  Traced t(/*ratio=*/0.25, /*seed=*/7);
  Member m = t.Add({.lane_capacity = 4096});
  constexpr int kEvents = 2000;
  for (int i = 0; i < kEvents; ++i) REQUIRE(t.engine().Publish(Ev("work.a", std::to_string(i))).ok());
  const std::uint64_t threshold = static_cast<std::uint64_t>(0.25 * 18446744073709551616.0);
  std::size_t sampled = 0;
  std::set<std::array<std::uint8_t, 16>> traces;
  for (int i = 0; i < kEvents; ++i) {
    auto got = m.Next(absl::ZeroDuration());
    REQUIRE(got.ok());
    const TraceContext& tr = got->event().trace;
    CHECK(tr.flags == (Low64(tr) < threshold ? 1 : 0));
    sampled += tr.flags;
    traces.insert(tr.trace_id);
    REQUIRE(got->Ack().ok());
  }
  CHECK(traces.size() == kEvents);  // a new trace per event
  CHECK(sampled > 400);             // 500 expected; binomial sd 19
  CHECK(sampled < 600);
  const std::vector<Span> spans = t.sink->Take();
  CHECK(Count(spans, SpanStage::kPublish) == sampled);
  CHECK(Count(spans, SpanStage::kQueueWait) == sampled);
  CHECK(Count(spans, SpanStage::kDeliver) == sampled);
  CHECK(Count(spans, SpanStage::kAck) == sampled);
  for (const Span& s : spans) CHECK(s.context.flags == 1);
}

TEST_CASE("a sampled parent is traced even at ratio 0") {
  Traced t(/*ratio=*/0.0);
  Member m = t.Add({});
  Event e = Ev("work.a", "x");
  e.trace = Upstream(true);
  REQUIRE(t.engine().Publish(std::move(e)).ok());
  auto got = m.Next(absl::ZeroDuration());
  REQUIRE(got.ok());
  REQUIRE(got->Ack().ok());
  CHECK(t.sink->Take().size() == 4);
}

TEST_CASE("tracing under contention: every stage once per event, ids unique") {
  Traced t;
  auto c = t.engine().AddConsumer({.stream = "S", .name = "c", .members = 2, .lane_capacity = 1024});
  REQUIRE(c.ok());
  constexpr int kPublishers = 3, kPerPublisher = 400, kTotal = kPublishers * kPerPublisher;
  std::atomic<int> received{0};
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      Member mem = *c->member(i);
      while (received.load() < kTotal) {
        auto got = mem.Next(absl::Milliseconds(5));
        if (!got.ok()) continue;
        received.fetch_add(1);
        REQUIRE(got->Ack().ok());
      }
    });
  }
  for (int p = 0; p < kPublishers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerPublisher; ++i) {
        REQUIRE(t.engine().Publish(Ev("work.a", std::to_string(p) + "-" + std::to_string(i))).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::vector<Span> spans = t.sink->Take();
  CHECK(Count(spans, SpanStage::kPublish) == kTotal);
  CHECK(Count(spans, SpanStage::kQueueWait) == kTotal);
  CHECK(Count(spans, SpanStage::kDeliver) == kTotal);
  CHECK(Count(spans, SpanStage::kAck) == kTotal);
  std::set<std::array<std::uint8_t, 8>> ids;
  std::set<std::array<std::uint8_t, 16>> traces;
  for (const Span& s : spans) {
    CHECK(ids.insert(s.context.span_id).second);
    traces.insert(s.context.trace_id);
  }
  CHECK(traces.size() == kTotal);
}

TEST_CASE("an AckSync whose sync fails is an error span, after the deliver span") {
  // Found by the adversarial review: the ack span was reported OK before the sync.
  state_test::TempDir d;
  auto faulty = std::make_shared<state_test::FaultyFileSystem>();
  auto sink = std::make_shared<RecordingSink>();
  EngineOptions o;
  o.trace = {.sink = sink, .sample_ratio = 1.0, .id_seed = 3};
  auto engine = Engine::Create(std::move(o));
  REQUIRE(engine.ok());
  StreamConfig sc;
  sc.name = "REQ";
  sc.subjects = {"req.>"};
  sc.storage = StorageType::kFile;
  sc.directory = d.path();
  sc.sync = SyncPolicy::kEveryCommit;
  sc.file_system = faulty;
  REQUIRE((*engine)->AddStream(sc).ok());
  auto c = (*engine)->AddConsumer({.stream = "REQ", .name = "w"});
  REQUIRE(c.ok());
  REQUIRE((*engine)->Publish(Ev("req.a", "m1")).ok());
  auto m = c->member(0)->Next(absl::Seconds(5));
  REQUIRE(m.ok());
  (void)sink->Take();
  faulty->FailNth("sync", 1, EIO);  // the ack log's fdatasync of this ack
  const absl::Status st = m->AckSync();
  REQUIRE(st.code() == absl::StatusCode::kDataLoss);
  const std::vector<Span> spans = sink->Take();
  REQUIRE(spans.size() == 2);
  CHECK(spans[0].stage == SpanStage::kDeliver);
  CHECK(spans[0].error_type.empty());
  CHECK(spans[1].stage == SpanStage::kAck);
  CHECK(spans[1].error_type == "DATA_LOSS");
  CHECK_THAT(spans[1].error_message, Catch::Contains("is not durable"));
  CHECK(spans[1].parent_span_id == spans[0].context.span_id);
}

TEST_CASE("span texts are bounded: an 8 MB subject refused is a 1 KiB error span") {
  // Found by the adversarial review: every refused publish's span kept its subject
  // and the status message quoting it whole.
  Traced t(/*ratio=*/0.0);
  Event e = Ev(std::string(8 << 20, 'a') + " b", std::string(2000, 'm'));
  REQUIRE(t.engine().Publish(std::move(e)).status().code() == absl::StatusCode::kInvalidArgument);
  const std::vector<Span> spans = t.sink->Take();
  REQUIRE(spans.size() == 1);
  CHECK(spans[0].destination == std::string(1024, 'a') + "...");
  CHECK(spans[0].message_id == std::string(1024, 'm') + "...");
  CHECK(spans[0].error_type == "INVALID_ARGUMENT");
  CHECK(spans[0].error_message.size() <= 1027);
}
