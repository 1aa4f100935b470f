// Memory bounds of the engine (issue 14 items 8 and 9): the route table grows linearly
// with the streams' patterns and old tables are freed; the duplicate window is bounded
// and gives its memory back. This binary replaces the global operator new to count the
// bytes held (tests/alloc_counter.hpp), so it does not run under the sanitizers.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "../alloc_counter.hpp"

#include "inferq/engine/engine.hpp"
#include "inferq/sched/duplicate_window.hpp"

using namespace inferq;

namespace {
std::int64_t Live() { return live_bytes.load(std::memory_order_relaxed); }
}  // namespace

// 14.8: every AddStream built a whole new route table (a subject index with its match
// cache) and kept every old one: 8,000 streams took 11.3 GB.
TEST_CASE("14.8 streams cost memory linear in their patterns; old route tables are freed",
          "[issue14][memory]") {
  constexpr int kStreams = 10'000;
  auto engine = Engine::Create({.manual_timers = true}).value();
  // The first stream pays for the fixed parts (the match caches).
  REQUIRE(engine->AddStream({.name = "T0", .subjects = {"t0.a.*", "t0.b.>"}}).ok());
  const std::int64_t base = Live();
  for (int i = 1; i <= kStreams; ++i) {
    const std::string t = "t" + std::to_string(i);
    REQUIRE(engine->AddStream({.name = "T" + std::to_string(i),
                              .subjects = {t + ".a.*", t + ".b.>"}}).ok());
  }
  const std::int64_t per_stream = (Live() - base) / kStreams;
  INFO("bytes per stream of two patterns: " << per_stream);
  // A StreamState with its config, duplicate window and queue, plus two patterns in
  // the route index (two copies: readers never wait for AddStream).
  CHECK(per_stream < 4096);
  // Routing still works for the first and the last stream.
  CHECK(engine->Publish([] { Event e; e.subject = "t1.a.x"; return e; }()).ok());
  CHECK(engine->Publish([] { Event e; e.subject = "t10000.b.x.y"; return e; }()).ok());

  const std::int64_t before_functions = Live();
  for (int i = 0; i < 100; ++i) {
    REQUIRE(engine->RegisterFunction("f" + std::to_string(i), [](const Event&) -> absl::StatusOr<Buffer> {
      return Buffer();
    }, {.workers = 1, .queue_capacity = 4}).ok());
  }
  const std::int64_t per_function = (Live() - before_functions) / 100;
  INFO("bytes per function (two streams, a consumer, a thread): " << per_function);
  CHECK(per_function < 64 * 1024);
}

// 14.9: the duplicate window kept every id of its window however many, and its hash
// table kept its peak size after the ids expired.
TEST_CASE("14.9 the duplicate window gives its memory back when its ids expire",
          "[issue14][memory][dedup]") {
  const std::int64_t base = Live();
  DuplicateWindow w(absl::Seconds(1));
  for (std::uint64_t i = 0; i < 200'000; ++i) {
    REQUIRE(w.Insert("id-" + std::to_string(i), i + 1, 0));
  }
  const std::int64_t peak = Live() - base;
  INFO("peak " << peak);
  REQUIRE(peak > 4'000'000);
  CHECK(w.Expire(absl::ToInt64Nanoseconds(absl::Seconds(1))) == 200'000);
  const std::int64_t left = Live() - base;
  INFO("left after expiry " << left);
  CHECK(left < peak / 20);
}

TEST_CASE("14.9 a stream's duplicate window holds at most duplicate_window_max_entries ids",
          "[issue14][memory][dedup]") {
  auto engine = Engine::Create({.manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"s"}, .max_msgs = 1000,
                            .duplicate_window_max_entries = 1000}).ok());
  const std::int64_t base = Live();
  for (int i = 0; i < 100'000; ++i) {
    Event e;
    e.subject = "s";
    e.msg_id = "msg-id-that-is-not-short-" + std::to_string(i);
    REQUIRE(engine->Publish(std::move(e)).ok());
  }
  const std::int64_t grown = Live() - base;
  INFO("grown " << grown);
  CHECK(grown < 1'000'000);
  const EngineStats st = engine->Stats();
  CHECK(st.stream("S")->duplicate_window_evicted == 99'000);
  // An id forgotten early is new again; one still held is a duplicate.
  Event old_id;
  old_id.subject = "s";
  old_id.msg_id = "msg-id-that-is-not-short-0";
  auto ack = engine->Publish(old_id);
  REQUIRE(ack.ok());
  CHECK(!ack->duplicate);
  old_id.msg_id = "msg-id-that-is-not-short-99999";
  ack = engine->Publish(old_id);
  REQUIRE(ack.ok());
  CHECK(ack->duplicate);
}

// Issue 36 item 6: a file work queue holding one message no consumer matches grew
// 25.5 bytes per message passed through it (the removed sequences above the held one,
// one entry per ack, and one entry per removed-log record), while it stored one.
TEST_CASE("a file work queue's memory stays flat while one message waits and others pass through",
          "[issue36][memory]") {
  const std::string dir = std::filesystem::temp_directory_path().string() +
                          "/inferq_wq_memory_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  {
    auto engine = Engine::Create().value();
    StreamConfig s{.name = "WQ", .subjects = {"wq.>"}};
    s.retention = RetentionPolicy::kWorkQueue;
    s.storage = StorageType::kFile;
    s.directory = dir;
    s.sync = SyncPolicy::kNone;
    s.duplicate_window = absl::ZeroDuration();
    REQUIRE(engine->AddStream(s).ok());
    auto c = engine->AddConsumer({.stream = "WQ", .name = "b", .filter_subject = "wq.b",
                                  .deliver = DeliverPolicy::kAll});
    REQUIRE(c.ok());
    Member m = c->member(0).value();
    Event held;
    held.subject = "wq.a";  // no consumer matches it: the work queue keeps it
    REQUIRE(engine->Publish(held).ok());
    auto cycle = [&](int n) {
      for (int i = 0; i < n; ++i) {
        Event e;
        e.subject = "wq.b";
        REQUIRE(engine->Publish(std::move(e)).ok());
        absl::StatusOr<Message> msg = m.Next(absl::Seconds(10));
        REQUIRE(msg.ok());
        REQUIRE(msg->Ack().ok());
      }
    };
    cycle(20'000);  // containers at their steady size
    const std::int64_t before = Live();
    cycle(60'000);
    const std::int64_t grown = Live() - before;
    INFO("grew " << grown << " bytes over 60,000 messages");
    CHECK(grown < 60'000);  // under 1 byte per message (25.5 before the fix)
    const EngineStats stats = engine->Stats();
    REQUIRE(stats.stream("WQ") != nullptr);
    CHECK(stats.stream("WQ")->messages == 1);
    CHECK(stats.stream("WQ")->acked_out == 80'000);
  }
  std::filesystem::remove_all(dir);
}
