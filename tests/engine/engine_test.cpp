#include "inferq/engine/engine.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using namespace inferq;
using namespace std::chrono_literals;

namespace {

Event Ev(std::string subject, std::string payload = "") {
  Event e;
  e.subject = std::move(subject);
  e.payload = Buffer::FromString(payload);
  return e;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

Member M(const absl::StatusOr<Consumer>& c, std::uint32_t i = 0) {
  REQUIRE(c.ok());
  auto m = c->member(i);
  REQUIRE(m.ok());
  return *m;
}

// Copies of one stream's / consumer's statistics (REQUIRE that they exist).
StreamStats SS(const Engine& engine, std::string_view name) {
  const EngineStats st = engine.Stats();
  const StreamStats* s = st.stream(name);
  REQUIRE(s != nullptr);
  return *s;
}
ConsumerStats CS(const Engine& engine, std::string_view stream, std::string_view name) {
  const EngineStats st = engine.Stats();
  const ConsumerStats* c = st.consumer(stream, name);
  REQUIRE(c != nullptr);
  return *c;
}

// Pops everything queued on `m` right now (zero timeout).
std::vector<std::uint64_t> Drain(Member m) {
  std::vector<std::uint64_t> seqs;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    seqs.push_back(r->stream_seq());
    (void)r->Ack();
  }
  return seqs;
}

}  // namespace

TEST_CASE("fan-out: one publish reaches two streams and shares the event") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "ALL", .subjects = {"orders.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "EU", .subjects = {"orders.eu.*"}}).ok());
  auto all = engine->AddConsumer({.stream = "ALL", .name = "audit"});
  auto eu = engine->AddConsumer({.stream = "EU", .name = "billing"});

  auto ack = engine->Publish(Ev("orders.eu.1", "payload-bytes"));
  REQUIRE(ack.ok());
  CHECK(ack->streams_stored == 2);
  CHECK(ack->streams_rejected == 0);
  CHECK(ack->deliveries == 2);
  CHECK(ack->seq == 1);

  auto ack2 = engine->Publish(Ev("orders.us.1"));
  REQUIRE(ack2.ok());
  CHECK(ack2->streams_stored == 1);
  CHECK(ack2->seq == 2);

  auto a = M(all).Next(absl::Seconds(5));
  auto b = M(eu).Next(absl::Seconds(5));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->event().subject == "orders.eu.1");
  CHECK(&a->event() == &b->event());  // one Event, not a copy
  CHECK(a->event().payload.data() == b->event().payload.data());
  CHECK(a->stream_seq() == 1);
  CHECK(b->stream_seq() == 1);
  CHECK(Drain(M(all)) == std::vector<std::uint64_t>{2});
  CHECK(Drain(M(eu)).empty());
}

TEST_CASE("a publish no stream captures is reported, not dropped in silence") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"a.*"}}).ok());
  auto r = engine->Publish(Ev("b.c"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(r.status()) == "no stream captures subject 'b.c'");
  CHECK(engine->Stats().unrouted == 1);
}

TEST_CASE("an invalid subject is rejected and names the subject") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {">"}}).ok());
  auto r = engine->Publish(Ev("a..b"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) == "subject 'a..b' has an empty token at position 2");
  const EngineStats st = engine->Stats();
  CHECK(st.invalid == 1);
  CHECK(st.stream("S")->stored == 0);
}

TEST_CASE("a consumer group splits the stream round robin over its members") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"jobs.>"}}).ok());
  auto group = engine->AddConsumer({.stream = "S", .name = "workers", .members = 3});
  REQUIRE(group.ok());
  CHECK(group->members() == 3);
  for (int i = 0; i < 9; ++i) REQUIRE(engine->Publish(Ev("jobs.x")).ok());
  CHECK(Drain(M(group, 0)) == std::vector<std::uint64_t>{1, 4, 7});
  CHECK(Drain(M(group, 1)) == std::vector<std::uint64_t>{2, 5, 8});
  CHECK(Drain(M(group, 2)) == std::vector<std::uint64_t>{3, 6, 9});
  auto out = group->member(3);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(Msg(out.status()) == "consumer 'workers' has 3 members; index 3 is out of range");
  const ConsumerStats cs = CS(*engine, "S", "workers");
    CHECK(cs.delivered == 9);
  CHECK(cs.acked == 9);
  CHECK(cs.ack_pending == 0);
  REQUIRE(cs.members.size() == 3);
  CHECK(cs.members[1].delivered == 3);
  CHECK(cs.deliver_latency_ns.count() == 9);
}

TEST_CASE("a consumer filter selects part of the stream") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"infer.>"}}).ok());
  auto llama = engine->AddConsumer({.stream = "S", .name = "llama", .filter_subject = "infer.llama.*"});
  auto all = engine->AddConsumer({.stream = "S", .name = "all"});
  REQUIRE(engine->Publish(Ev("infer.llama.request")).ok());
  REQUIRE(engine->Publish(Ev("infer.mistral.request")).ok());
  REQUIRE(engine->Publish(Ev("infer.llama.cancel")).ok());
  CHECK(Drain(M(llama)) == std::vector<std::uint64_t>{1, 3});
  CHECK(Drain(M(all)) == std::vector<std::uint64_t>{1, 2, 3});
}

TEST_CASE("limits with discard old: the oldest make room and are never delivered") {
  auto engine = Engine::Create().value();
  SECTION("max_msgs") {
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_msgs = 3}).ok());
    auto c = engine->AddConsumer({.stream = "S", .name = "c"});
    for (int i = 0; i < 5; ++i) REQUIRE(engine->Publish(Ev("x")).ok());
    const StreamStats s = SS(*engine, "S");
    CHECK(s.messages == 3);
    CHECK(s.discarded == 2);
    CHECK(s.last_seq == 5);
    CHECK(Drain(M(c)) == std::vector<std::uint64_t>{3, 4, 5});
    CHECK(CS(*engine, "S", "c").skipped == 2);
  }
  SECTION("max_bytes") {
    // Each event is 1 (subject) + 9 (payload) = 10 bytes; 25 bytes keep two.
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_bytes = 25}).ok());
    auto c = engine->AddConsumer({.stream = "S", .name = "c"});
    for (int i = 0; i < 4; ++i) REQUIRE(engine->Publish(Ev("x", "123456789")).ok());
    const StreamStats s = SS(*engine, "S");
    CHECK(s.messages == 2);
    CHECK(s.bytes == 20);
    CHECK(s.discarded == 2);
    CHECK(Drain(M(c)) == std::vector<std::uint64_t>{3, 4});
  }
}

TEST_CASE("limits with discard new: the publish is refused and nothing is lost") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_msgs = 2,
                            .discard = DiscardPolicy::kNew}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  auto r = engine->Publish(Ev("x"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Msg(r.status()) == "stream 'S' is full: max_msgs 2 reached (discard new)");
  const EngineStats st = engine->Stats();
  CHECK(st.stream("S")->messages == 2);
  CHECK(st.stream("S")->rejected == 1);
  CHECK(st.rejected == 1);
  CHECK(Drain(M(c)) == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("discard new on max_bytes names the sizes") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_bytes = 15,
                            .discard = DiscardPolicy::kNew}).ok());
  REQUIRE(engine->Publish(Ev("x", "123456789")).ok());
  auto r = engine->Publish(Ev("x", "123456789"));
  REQUIRE_FALSE(r.ok());
  CHECK(Msg(r.status()) ==
        "stream 'S' is full: 10 + 10 bytes would exceed max_bytes 15 (discard new)");
}

TEST_CASE("max_msg_size refuses a large event") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_msg_size = 4}).ok());
  auto r = engine->Publish(Ev("x", "12345"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) == "stream 'S': message of 6 bytes exceeds max_msg_size 4");
}

TEST_CASE("a refusal by one of two streams is counted in the ack") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "A", .subjects = {"x"}}).ok());
  REQUIRE(engine->AddStream({.name = "B", .subjects = {"x"}, .max_msg_size = 2}).ok());
  auto r = engine->Publish(Ev("x", "12345"));
  REQUIRE(r.ok());
  CHECK(r->streams_stored == 1);
  CHECK(r->streams_rejected == 1);
}

TEST_CASE("max_age removes old messages, also while they wait in a lane") {
  ManualClock clock;
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_age = absl::Seconds(10)}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  clock.Advance(absl::Seconds(11));
  REQUIRE(engine->Publish(Ev("x")).ok());
  const StreamStats s = SS(*engine, "S");
  CHECK(s.messages == 1);
  CHECK(s.discarded == 2);
  CHECK(Drain(M(c)) == std::vector<std::uint64_t>{3});

  REQUIRE(engine->Publish(Ev("x")).ok());  // seq 4, queued
  clock.Advance(absl::Seconds(11));       // ages out in the lane, no publish since
  CHECK(Drain(M(c)).empty());             // seq 4 is discarded when pulled
  CHECK(CS(*engine, "S", "c").skipped == 3);
  // Seq 3 (delivered) has aged out too; on an idle stream it goes at the next timer
  // run (none has run yet), no write needed.
  CHECK(SS(*engine, "S").messages == 1);
  engine->RunTimers();
  CHECK(SS(*engine, "S").messages == 0);
  CHECK(SS(*engine, "S").discarded == 4);
  REQUIRE(engine->Publish(Ev("x")).ok());  // seq 5
  const StreamStats after = SS(*engine, "S");
  CHECK(after.messages == 1);
  CHECK(after.discarded == 4);
}

TEST_CASE("the timer removes messages older than max_age from a stream nobody writes") {
  // Without manual timers: the engine's own timer thread, which a max_age stream
  // starts even with no consumer. The clock is manual, so only its runs can trim.
  ManualClock clock;
  auto engine = Engine::Create({.clock = &clock}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_age = absl::Milliseconds(80)}).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("x")).ok());
  clock.Advance(absl::Milliseconds(81));
  // A run comes within 10 ms (max_age / 8); wait up to 10 s of real time for it.
  for (int i = 0; i < 10'000 && SS(*engine, "S").messages != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const StreamStats s = SS(*engine, "S");
  CHECK(s.messages == 0);
  CHECK(s.discarded == 3);
  CHECK(s.last_seq == 3);
}

TEST_CASE("interest retention removes a message once every consumer acked it") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"},
                            .retention = RetentionPolicy::kInterest}).ok());
  auto a = engine->AddConsumer({.stream = "S", .name = "a"});
  auto b = engine->AddConsumer({.stream = "S", .name = "b"});
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("x")).ok());
  auto m1 = M(a).Next(absl::Seconds(1));
  REQUIRE(m1.ok());
  REQUIRE(m1->Ack().ok());
  CHECK(SS(*engine, "S").messages == 3);  // b has not acked seq 1
  auto m2 = M(b).Next(absl::Seconds(1));
  REQUIRE(m2.ok());
  REQUIRE(m2->Ack().ok());
  CHECK(SS(*engine, "S").messages == 2);
  CHECK(SS(*engine, "S").acked_out == 1);
}

TEST_CASE("interest retention keeps nothing no consumer takes") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"},
                            .retention = RetentionPolicy::kInterest}).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  const StreamStats s = SS(*engine, "S");
  CHECK(s.stored == 1);
  CHECK(s.messages == 0);
  CHECK(s.acked_out == 1);
}

TEST_CASE("ack errors") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  auto none = engine->AddConsumer({.stream = "S", .name = "fire", .ack = AckPolicy::kNone});
  REQUIRE(engine->Publish(Ev("x")).ok());
  auto m = M(c).Next(absl::Seconds(1));
  REQUIRE(m.ok());
  CHECK(m->Ack().ok());
  CHECK(m->acked());
  const absl::Status again = m->Ack();
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(again) == "message 1 of stream 'S' was already settled (ack, nak or term) by consumer 'c'");
  auto n = M(none).Next(absl::Seconds(1));
  REQUIRE(n.ok());
  CHECK(Msg(n->Ack()) == "consumer 'fire' of stream 'S' has ack policy none");
  Message empty;
  CHECK(Msg(empty.Ack()) == "cannot ack an empty Message");
  const ConsumerStats fs = CS(*engine, "S", "fire");
  CHECK(fs.delivered == 1);
  CHECK(fs.ack_pending == 0);
}

TEST_CASE("unacked deliveries are counted as pending") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("x")).ok());
  auto a = M(c).Next(absl::Seconds(1));
  auto b = M(c).Next(absl::Seconds(1));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->Ack().ok());
  const ConsumerStats cs = CS(*engine, "S", "c");
  CHECK(cs.delivered == 2);
  CHECK(cs.acked == 1);
  CHECK(cs.ack_pending == 1);
  CHECK(cs.members[0].queued == 1);
  CHECK(cs.ack_latency_ns.count() == 1);
}

TEST_CASE("NextBatch returns at once when the batch is full") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  for (int i = 0; i < 6; ++i) REQUIRE(engine->Publish(Ev("x")).ok());
  // With a one-hour max_queue_delay this only finishes if a full batch returns early.
  auto batch = M(c).NextBatch(4, absl::Hours(1));
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 4);
  CHECK((*batch)[0].stream_seq() == 1);
  CHECK((*batch)[3].stream_seq() == 4);
  // Zero max_queue_delay: takes what is queued now, without waiting for more.
  auto rest = M(c).NextBatch(4, absl::ZeroDuration());
  REQUIRE(rest.ok());
  REQUIRE(rest->size() == 2);
  CHECK((*rest)[0].stream_seq() == 5);
  CHECK((*rest)[1].stream_seq() == 6);
}

TEST_CASE("NextBatch returns a partial batch after max_queue_delay") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  auto batch = M(c).NextBatch(8, absl::Milliseconds(30));
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE(batch.ok());
  CHECK(batch->size() == 2);
  // A lower bound only: the batch may not close before the delay has passed.
  CHECK(waited >= 30ms);
}

TEST_CASE("NextBatch gathers events that arrive while it waits") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(engine->Publish(Ev("x")).ok());
  std::atomic<int> failed{0};
  std::thread late([&] {
    std::this_thread::sleep_for(5ms);
    for (int i = 0; i < 3; ++i) {
      if (!engine->Publish(Ev("x")).ok()) failed.fetch_add(1);
    }
  });
  // Full at 4 within an hour-long delay: returns as soon as the 4th arrives.
  auto batch = M(c).NextBatch(4, absl::Hours(1));
  late.join();
  CHECK(failed == 0);
  REQUIRE(batch.ok());
  CHECK(batch->size() == 4);
}

TEST_CASE("NextBatch and Next argument and timeout errors") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  auto zero = M(c).NextBatch(0, absl::Milliseconds(1));
  CHECK(Msg(zero.status()) == "NextBatch max_batch 0 is invalid; it must be > 0");
  auto neg = M(c).NextBatch(4, absl::Milliseconds(-1));
  CHECK(Msg(neg.status()) == "NextBatch max_queue_delay -1ms is negative");
  auto empty = M(c).NextBatch(4, absl::Milliseconds(1), absl::ZeroDuration());
  CHECK(empty.status().code() == absl::StatusCode::kDeadlineExceeded);
  auto next = M(c).Next(absl::Milliseconds(2));
  CHECK(next.status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("configuration errors name the bad value and change nothing") {
  auto engine = Engine::Create().value();
  auto check = [&](const StreamConfig& cfg, absl::StatusCode code, const std::string& msg) {
    const absl::Status s = engine->AddStream(cfg);
    CHECK(s.code() == code);
    CHECK(Msg(s) == msg);
    // Every InvalidArgument of AddStream is a check of the config alone.
    const absl::Status v = StreamConfig::Validate(cfg);
    CHECK(v.ok() == (code != absl::StatusCode::kInvalidArgument));
    if (!v.ok()) CHECK(Msg(v) == msg);
  };
  check({.name = "", .subjects = {"x"}}, absl::StatusCode::kInvalidArgument,
        "stream name '' must have 1 to 64 characters");
  check({.name = "a.b", .subjects = {"x"}}, absl::StatusCode::kInvalidArgument,
        "stream name 'a.b' has the character '.' at byte 1; only A-Z a-z 0-9 _ - are allowed");
  check({.name = "S"}, absl::StatusCode::kInvalidArgument, "stream 'S' has no subjects");
  check({.name = "S", .subjects = {"a", "b..c"}}, absl::StatusCode::kInvalidArgument,
        "stream 'S': subject pattern 'b..c' has an empty token at position 2");
  check({.name = "S", .subjects = {"x"}, .max_msgs = 0}, absl::StatusCode::kInvalidArgument,
        "stream 'S': max_msgs 0 is invalid (use -1 for no limit or a positive value)");
  check({.name = "S", .subjects = {"x"}, .max_bytes = -7}, absl::StatusCode::kInvalidArgument,
        "stream 'S': max_bytes -7 is invalid (use -1 for no limit or a positive value)");
  check({.name = "S", .subjects = {"x"}, .max_age = absl::Seconds(-1)},
        absl::StatusCode::kInvalidArgument,
        "stream 'S': max_age -1s is invalid (use zero for no limit or a positive, finite "
        "duration)");
  CHECK(engine->Stats().streams.empty());

  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  check({.name = "S", .subjects = {"y"}}, absl::StatusCode::kAlreadyExists,
        "stream 'S' already exists");

  auto bad = [&](const ConsumerConfig& cfg, absl::StatusCode code, const std::string& msg) {
    auto r = engine->AddConsumer(cfg);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == code);
    CHECK(Msg(r.status()) == msg);
    // These InvalidArgument cases are all checks of the config alone.
    const absl::Status v = ConsumerConfig::Validate(cfg);
    CHECK(v.ok() == (code != absl::StatusCode::kInvalidArgument));
    if (!v.ok()) CHECK(Msg(v) == msg);
  };
  bad({.stream = "NOPE", .name = "c"}, absl::StatusCode::kNotFound,
      "consumer 'c': stream 'NOPE' does not exist");
  bad({.stream = "S", .name = "c", .members = 0}, absl::StatusCode::kInvalidArgument,
      "consumer 'c': members 0 is outside 1..4096");
  bad({.stream = "S", .name = "c", .lane_capacity = 0}, absl::StatusCode::kInvalidArgument,
      "consumer 'c': lane_capacity 0 is outside 1..16777216");
  bad({.stream = "S", .name = "c", .filter_subject = "a.>.b"},
      absl::StatusCode::kInvalidArgument,
      "consumer 'c': filter subject pattern 'a.>.b' has '>' at position 2; '>' is valid "
      "only as the last token");
  REQUIRE(engine->AddConsumer({.stream = "S", .name = "c"}).ok());
  bad({.stream = "S", .name = "c"}, absl::StatusCode::kAlreadyExists,
      "consumer 'c' of stream 'S' already exists");
  CHECK(engine->Stats().consumers.size() == 1);
}

TEST_CASE("config Validate passes what needs the engine to AddConsumer") {
  // A filter no subject of the stream can match, and a member_nodes entry that is
  // not a node, are refused by AddConsumer; the config alone is valid.
  const ConsumerConfig far{.stream = "S", .name = "c", .filter_subject = "y"};
  CHECK(ConsumerConfig::Validate(far).ok());
  const ConsumerConfig node{.stream = "S", .name = "d", .member_nodes = {999}};
  CHECK(ConsumerConfig::Validate(node).ok());
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  CHECK(Msg(engine->AddConsumer(far).status()) ==
        "consumer 'c': filter_subject 'y' matches no subject of stream 'S' (subjects 'x')");
  CHECK(engine->AddConsumer(node).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(StreamConfig::Validate({.name = "S", .subjects = {"x"}}).ok());
}

TEST_CASE("close wakes pullers and refuses later publishes") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 2});
  REQUIRE(engine->Publish(Ev("x")).ok());  // queued on member 0
  std::atomic<int> cancelled{0};
  Member second = M(c, 1);
  std::thread waiter([&] {
    auto r = second.Next(absl::InfiniteDuration());
    if (r.status().code() == absl::StatusCode::kCancelled) ++cancelled;
  });
  std::this_thread::sleep_for(20ms);
  engine->Close();
  waiter.join();
  CHECK(cancelled == 1);
  auto drained = M(c, 0).Next(absl::InfiniteDuration());
  REQUIRE(drained.ok());  // what was queued is still delivered
  CHECK(drained->stream_seq() == 1);
  CHECK(M(c, 0).Next(absl::InfiniteDuration()).status().code() ==
        absl::StatusCode::kCancelled);
  CHECK(engine->Publish(Ev("x")).status().code() == absl::StatusCode::kCancelled);
}

TEST_CASE("a full lane holds the publisher back until the member pulls") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 2});
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  std::atomic<bool> third_done{false};
  std::atomic<bool> third_ok{false};
  std::thread publisher([&] {
    third_ok = engine->Publish(Ev("x")).ok();
    third_done = true;
  });
  std::this_thread::sleep_for(30ms);
  CHECK_FALSE(third_done.load());  // the lane is full: backpressure
  CHECK(Drain(M(c)).size() >= 2);
  publisher.join();
  CHECK(third_done.load());
  CHECK(third_ok.load());
  (void)Drain(M(c));
  CHECK(CS(*engine, "S", "c").delivered == 3);
}

TEST_CASE("concurrent publishers and pullers: every event once, per-publisher order") {
#if defined(__SANITIZE_THREAD__)
  constexpr int kPerPublisher = 2'000;
#else
  constexpr int kPerPublisher = 20'000;
#endif
  constexpr int kPublishers = 4;
  constexpr std::uint32_t kMembers = 3;
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"p.*"},
                            .retention = RetentionPolicy::kInterest}).ok());
  auto group = engine->AddConsumer({.stream = "S", .name = "g", .members = kMembers,
                                   .lane_capacity = 64});
  REQUIRE(group.ok());
  std::vector<std::vector<std::pair<int, int>>> got(kMembers);
  std::atomic<int> failures{0};
  std::vector<std::thread> pullers;
  for (std::uint32_t m = 0; m < kMembers; ++m) {
    pullers.emplace_back([&, m] {
      absl::StatusOr<Member> member_or = group->member(m);
      if (!member_or.ok()) {
        failures.fetch_add(1);
        return;
      }
      Member member = *member_or;
      for (;;) {
        auto batch = member.NextBatch(16, absl::ZeroDuration());
        if (!batch.ok()) {  // Cancelled once closed and drained
          if (batch.status().code() != absl::StatusCode::kCancelled) failures.fetch_add(1);
          break;
        }
        for (Message& msg : *batch) {
          const Event& e = msg.event();
          got[m].emplace_back(e.subject[2] - '0', static_cast<int>(e.seq_no));
          if (!msg.Ack().ok()) failures.fetch_add(1);
        }
      }
    });
  }
  std::vector<std::thread> publishers;
  for (int p = 0; p < kPublishers; ++p) {
    publishers.emplace_back([&, p] {
      for (int i = 0; i < kPerPublisher; ++i) {
        Event e;
        e.subject = "p." + std::to_string(p);
        e.seq_no = static_cast<std::uint64_t>(i);
        if (!engine->Publish(std::move(e)).ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& t : publishers) t.join();
  // Wait until everything is acked, then close to release the pullers.
  for (int spins = 0; spins < 100000; ++spins) {
    if (CS(*engine, "S", "g").acked == kPublishers * kPerPublisher) break;
    std::this_thread::sleep_for(1ms);
  }
  engine->Close();
  for (auto& t : pullers) t.join();

  CHECK(failures == 0);
  std::set<std::pair<int, int>> seen;
  std::size_t order_violations = 0;
  for (const auto& list : got) {
    std::map<int, int> last;
    for (const auto& [p, i] : list) {
      seen.insert({p, i});
      auto it = last.find(p);
      if (it != last.end() && i <= it->second) ++order_violations;
      last[p] = i;
    }
  }
  std::size_t total = 0;
  for (const auto& list : got) total += list.size();
  CHECK(total == kPublishers * kPerPublisher);
  CHECK(seen.size() == kPublishers * kPerPublisher);
  CHECK(order_violations == 0);
  const EngineStats st = engine->Stats();
  CHECK(st.stream("S")->messages == 0);  // interest retention: all acked out
  CHECK(st.stream("S")->acked_out == kPublishers * kPerPublisher);
}

// ---- regressions from an adversarial run (smallest inputs that showed each bug) ----

TEST_CASE("Close and Stats are not blocked by AddConsumer waiting behind a full lane") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 2});
  REQUIRE(c.ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());  // fills the lane
  std::atomic<int> publish_code{-1};
  std::thread publisher([&] {  // blocks on the full lane, holding the stream
    publish_code = static_cast<int>(engine->Publish(Ev("x")).status().code());
  });
  std::this_thread::sleep_for(20ms);
  std::atomic<bool> added{false};
  std::thread adder([&] {  // waits for the stream behind the blocked publisher
    (void)engine->AddConsumer({.stream = "S", .name = "late"});
    added = true;
  });
  std::this_thread::sleep_for(20ms);
  CHECK(engine->Stats().consumers.size() == 2);  // returns although both are blocked
  engine->Close();  // a deadlock here hangs the test (ctest timeout)
  publisher.join();
  adder.join();
  CHECK(added.load());
  CHECK(publish_code.load() == static_cast<int>(absl::StatusCode::kCancelled));
}

TEST_CASE("a publish cut off by Close is reported and does not pin interest retention") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"},
                            .retention = RetentionPolicy::kInterest}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 2});
  REQUIRE(engine->Publish(Ev("x")).ok());
  REQUIRE(engine->Publish(Ev("x")).ok());
  absl::Status second;
  std::thread publisher([&] { second = engine->Publish(Ev("x")).status(); });
  std::this_thread::sleep_for(20ms);
  engine->Close();
  publisher.join();
  CHECK(second.code() == absl::StatusCode::kCancelled);
  CHECK(Msg(second) ==
        "engine closed during publish: stored as sequence 3 but not queued for 1 consumer(s)");
  for (int i = 0; i < 2; ++i) {  // what was queued still drains after Close
    auto m = M(c).Next(absl::ZeroDuration());
    REQUIRE(m.ok());
    REQUIRE(m->Ack().ok());
  }
  const StreamStats s = SS(*engine, "S");
  CHECK(s.messages == 0);  // seq 3 no longer waits for an ack that cannot come
  CHECK(s.acked_out == 3);
}

TEST_CASE("interest retention frees acked messages behind an unacked one") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"},
                            .retention = RetentionPolicy::kInterest}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  const Buffer payload = Buffer::FromString(std::string(1000, 'p'));
  auto publish = [&] {
    Event e;
    e.subject = "x";
    e.payload = payload;
    REQUIRE(engine->Publish(std::move(e)).ok());
  };
  publish();
  auto held = M(c).Next(absl::ZeroDuration());  // never acked
  REQUIRE(held.ok());
  for (int i = 0; i < 1000; ++i) {
    publish();
    auto m = M(c).Next(absl::ZeroDuration());
    REQUIRE(m.ok());
    REQUIRE(m->Ack().ok());
  }
  CHECK(SS(*engine, "S").messages == 1);
  // The payload is shared by every event still referenced. Before the fix all 1001
  // stayed in the stream; now the stream keeps at most 64 retired entries around
  // the live one (plus this test's own reference).
  CHECK(payload.use_count() <= 66);
}

TEST_CASE("NextBatch with an infinite max_queue_delay waits for a full batch") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(engine->Publish(Ev("x")).ok());
  std::atomic<int> failed{0};
  std::thread late([&] {
    for (int i = 0; i < 3; ++i) {
      std::this_thread::sleep_for(5ms);
      if (!engine->Publish(Ev("x")).ok()) ++failed;
    }
  });
  auto batch = M(c).NextBatch(4, absl::InfiniteDuration(), absl::Seconds(30));
  late.join();
  CHECK(failed == 0);
  REQUIRE(batch.ok());
  CHECK(batch->size() == 4);  // was 1: the deadline overflowed into the past
}

TEST_CASE("out-of-range enum values are configuration errors") {
  auto engine = Engine::Create().value();
  CHECK(Msg(engine->AddStream({.name = "S", .subjects = {"x"},
                              .discard = static_cast<DiscardPolicy>(7)})) ==
        "stream 'S': discard policy 7 is not a valid DiscardPolicy");
  CHECK(Msg(engine->AddStream({.name = "S", .subjects = {"x"},
                              .retention = static_cast<RetentionPolicy>(9)})) ==
        "stream 'S': retention policy 9 is not a valid RetentionPolicy");
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto r = engine->AddConsumer({.stream = "S", .name = "c", .ack = static_cast<AckPolicy>(5)});
  CHECK(Msg(r.status()) == "consumer 'c': ack policy 5 is not a valid AckPolicy");
}

TEST_CASE("a consumer's lanes are bounded in all and not allocated for a bad stream") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto big = engine->AddConsumer(
      {.stream = "S", .name = "c", .members = 2, .lane_capacity = std::size_t{1} << 24});
  CHECK(Msg(big.status()) ==
        "consumer 'c': members 2 x lane_capacity 16777216 = 33554432 lane slots (after "
        "rounding up to powers of two) exceed 16777216");
  // Was: 1 GiB allocated and touched before the stream was looked up.
  auto missing = engine->AddConsumer(
      {.stream = "NOPE", .name = "c", .lane_capacity = std::size_t{1} << 24});
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a non-ASCII byte in a name is escaped in the error") {
  auto engine = Engine::Create().value();
  CHECK(Msg(engine->AddStream({.name = "caf\xc3\xa9", .subjects = {"x"}})) ==
        "stream name 'caf\xc3\xa9' has the character '\\xc3' at byte 3; only A-Z a-z 0-9 _ - "
        "are allowed");
}

TEST_CASE("events are allocated on the NUMA node of the lane that drains them") {
  auto topo = Topology::Synthetic("numa:2 core:2 pu:1");
  REQUIRE(topo.ok());
  auto engine = Engine::Create({.topology = &*topo}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x.*"}}).ok());
  auto on1 = engine->AddConsumer({.stream = "S", .name = "gpu1", .filter_subject = "x.one",
                                 .members = 2, .member_nodes = {1, 1}});
  auto on0 = engine->AddConsumer({.stream = "S", .name = "gpu0", .filter_subject = "x.zero",
                                 .member_nodes = {0}});
  REQUIRE(on1.ok());
  REQUIRE(on0.ok());
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("x.one")).ok());
  REQUIRE(engine->Publish(Ev("x.zero")).ok());
  const EngineStats st = engine->Stats();
  REQUIRE(st.memory.size() == 2);
  CHECK(st.memory[1].pools[0].allocations == 3);  // records (with their events) for node-1 lanes
  CHECK(st.memory[0].pools[0].allocations == 1);
  CHECK(st.memory[0].arena == "synthetic topology: operator new");

  auto bad = engine->AddConsumer({.stream = "S", .name = "bad", .members = 2,
                                 .member_nodes = {0, 2}});
  CHECK(Msg(bad.status()) ==
        "consumer 'bad': member_nodes[1] = 2 is not a node of this machine (0..1)");
  auto count = engine->AddConsumer({.stream = "S", .name = "bad", .members = 2,
                                   .member_nodes = {0}});
  CHECK(Msg(count.status()) == "consumer 'bad': member_nodes has 1 entries for 2 members");
}

TEST_CASE("memory stats: one node on this machine says how its arena is placed") {
  auto engine = Engine::Create().value();
  const EngineStats st = engine->Stats();
  REQUIRE_FALSE(st.memory.empty());
  for (const auto& m : st.memory) {
    CHECK_FALSE(m.arena.empty());
    REQUIRE(m.pools.size() == 1);
    CHECK(m.pools[0].block_size == 576);
  }
}

namespace {
std::string Text(const Event& e) {
  const auto p = e.payload.span();
  return std::string(reinterpret_cast<const char*>(p.data()), p.size());
}
}  // namespace

TEST_CASE("GetMessage returns the stored event of a sequence and names what it does not hold") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}, .max_msgs = 3}).ok());
  for (int i = 1; i <= 4; ++i) REQUIRE(engine->Publish(Ev("x", "m" + std::to_string(i))).ok());
  auto two = engine->GetMessage("S", 2);
  REQUIRE(two.ok());
  CHECK(Text(**two) == "m2");
  CHECK((*two)->subject == "x");
  auto four = engine->GetMessage("S", 4);
  REQUIRE(four.ok());
  CHECK(Text(**four) == "m4");
  // 1 went to max_msgs; 5 was never stored.
  CHECK(engine->GetMessage("S", 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(engine->GetMessage("S", 1).status()) == "stream 'S' holds no message 1 (last sequence 4)");
  CHECK(engine->GetMessage("S", 5).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(Msg(engine->GetMessage("S", 5).status()) == "stream 'S' has not given out sequence 5 (last sequence 4)");
  CHECK(engine->GetMessage("S", 0).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(engine->GetMessage("S", 0).status()) == "stream 'S': sequence 0 is invalid (sequences start at 1)");
  CHECK(Msg(engine->GetMessage("T", 1).status()) == "stream 'T' does not exist");
  REQUIRE(engine->AddStream({.name = "I", .subjects = {"i"}, .retention = RetentionPolicy::kInterest}).ok());
  CHECK(engine->GetMessage("I", 1).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("consumer stats count its lag and its redelivered messages not yet acked") {
  ManualClock clock(1);
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"x"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .ack_wait = absl::Seconds(1)});
  for (int i = 1; i <= 3; ++i) REQUIRE(engine->Publish(Ev("x", std::to_string(i))).ok());
  auto stats = [&] {
    const EngineStats st = engine->Stats();
    const ConsumerStats* cs = st.consumer("S", "c");
    REQUIRE(cs != nullptr);
    return std::make_tuple(cs->num_pending, cs->ack_pending, cs->num_redelivered);
  };
  CHECK(stats() == std::make_tuple(3, 0, 0));
  auto first = M(c).Next(absl::ZeroDuration());
  REQUIRE(first.ok());
  CHECK(stats() == std::make_tuple(2, 1, 0));
  REQUIRE(first->Nak().ok());  // queued again, behind 2 and 3: it counts as redelivered
  CHECK(stats() == std::make_tuple(3, 0, 1));
  std::vector<Message> out;
  for (int i = 0; i < 3; ++i) {
    auto m = M(c).Next(absl::ZeroDuration());
    REQUIRE(m.ok());
    out.push_back(*std::move(m));
  }
  CHECK(out[2].attempt() == 2);
  CHECK(stats() == std::make_tuple(0, 3, 1));
  REQUIRE(out[2].Ack().ok());
  CHECK(stats() == std::make_tuple(0, 2, 0));
  clock.Advance(absl::Seconds(2));  // 2 and 3 time out and come again
  engine->RunTimers();
  CHECK(stats() == std::make_tuple(2, 0, 2));
}
