// Proves that in steady state publish -> deliver -> ack makes no general-heap
// allocation: this binary replaces the global operator new and counts every call.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../alloc_counter.hpp"

#include "inferq/engine/engine.hpp"


using namespace inferq;

namespace {
// One round: publish an event with a payload, pull it on both consumers, ack both.
void Round(Engine& engine, Member& a, Member& b, std::uint64_t i, bool* ok) {
  Event e;
  e.subject = "infer.m.req";         // short strings: in the small-string buffer
  e.tenant = "acme";
  e.seq_no = i;
  const char bytes[200] = {};
  e.payload = Buffer::Copy(std::as_bytes(std::span<const char>(bytes, sizeof bytes)));
  *ok &= engine.Publish(std::move(e)).ok();
  for (Member* m : {&a, &b}) {
    absl::StatusOr<Message> msg = m->Next(absl::ZeroDuration());
    *ok &= msg.ok();
    if (msg.ok()) {
      *ok &= msg->event().seq_no == i;
      *ok &= msg->Ack().ok();
    }
  }
}
}  // namespace

TEST_CASE("steady-state publish -> deliver -> ack makes zero general-heap allocations") {
  for (RetentionPolicy retention : {RetentionPolicy::kInterest, RetentionPolicy::kLimits})
  for (bool negotiates : {false, true}) {
    INFO("retention " << static_cast<int>(retention) << ", negotiates " << negotiates);
    auto engine = Engine::Create().value();
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"infer.*.req"}, .max_msgs = 1000,
                              .retention = retention}).ok());
    auto first = engine->AddConsumer({.stream = "S", .name = "a", .lane_capacity = 64});
    // A consumer that declares accept_codecs, for raw events it accepts: the
    // conversion pre-pass runs and finds nothing to convert.
    std::vector<PayloadCodec> accept;
    if (negotiates) accept = {PayloadCodec::kNone};
    auto second = engine->AddConsumer(
        {.stream = "S", .name = "b", .lane_capacity = 64, .accept_codecs = accept});
    REQUIRE(first.ok());
    REQUIRE(second.ok());
    Member a = *first->member(0);
    Member b = *second->member(0);
    bool ok = true;
    // Warm-up: pools carve their chunks, thread caches fill, the stream's queue and
    // limits reach their steady size.
    for (std::uint64_t i = 0; i < 5000; ++i) Round(*engine, a, b, i, &ok);
    REQUIRE(ok);
    allocations = 0;
    counting = true;
    for (std::uint64_t i = 5000; i < 25000; ++i) Round(*engine, a, b, i, &ok);
    counting = false;
    CHECK(ok);
    CHECK(allocations.load() == 0);

    // The counter works: a plain std::string beyond the small buffer is counted.
    counting = true;
    std::string big(100, 'x');
    counting = false;
    CHECK(allocations.load() == 1);
    const EngineStats st = engine->Stats();
    REQUIRE(st.memory.size() >= 1);
    CHECK(st.memory[0].pools[0].allocations >= 25000);  // records, with their events, from the pool
    CHECK(st.codec_conversions == 0);
  }
}

// A batch ends when its member's lane is empty: that is no error, so it must not
// build one. It used to build and drop a "no message ... before the timeout" status
// per batch (two heap allocations and some 870 instructions in a 1 x 4 fan-out).
TEST_CASE("a NextBatch that ends on an empty lane allocates only its batch's vector") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"infer.*.req"}, .retention = RetentionPolicy::kInterest}).ok());
  auto consumer = engine->AddConsumer({.stream = "S", .name = "a", .lane_capacity = 64});
  REQUIRE(consumer.ok());
  Member m = *consumer->member(0);
  auto publish3 = [&](std::uint64_t base) {
    for (std::uint64_t i = 0; i < 3; ++i) {
      Event e;
      e.subject = "infer.m.req";
      e.seq_no = base + i;
      REQUIRE(engine->Publish(std::move(e)).ok());
    }
  };
  for (std::uint64_t round = 0; round < 200; ++round) {  // warm-up: pools, caches
    publish3(3 * round);
    auto batch = m.NextBatch(8, absl::ZeroDuration(), absl::ZeroDuration());
    REQUIRE(batch.ok());
    REQUIRE(batch->size() == 3);
    for (Message& msg : *batch) REQUIRE(msg.Ack().ok());
  }
  publish3(600);
  allocations = 0;
  counting = true;
  auto batch = m.NextBatch(8, absl::ZeroDuration(), absl::ZeroDuration());
  counting = false;
  REQUIRE(batch.ok());
  CHECK(batch->size() == 3);
  CHECK((*batch)[0].event().seq_no == 600);
  CHECK(allocations.load() == 1);  // the vector of the batch
  for (Message& msg : *batch) CHECK(msg.Ack().ok());
}
