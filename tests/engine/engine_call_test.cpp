// Function-in-flight: Engine::RegisterFunction and Engine::Call.
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "inferq/engine/engine.hpp"
#include "engine_test_util.hpp"

using namespace inferq;
using inferq::engine_test::H;
using inferq::engine_test::Msg;

namespace {

// Waits (real time) for a future that a worker thread completes.
absl::StatusOr<Buffer> Get(std::future<absl::StatusOr<Buffer>>& f) {
  REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  return f.get();
}

// A gate that a handler waits on until the test opens it.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::atomic<int> entered{0};
  void WaitEntered(int n) {
    while (entered.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

}  // namespace

TEST_CASE("a call returns the handler's reply") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("echo", [](const Event& e) -> absl::StatusOr<Buffer> {
    return Buffer::FromString(std::string(e.payload.view()) + "!");
  }, {.workers = 2}).ok());
  std::vector<std::future<absl::StatusOr<Buffer>>> calls;
  for (int i = 0; i < 50; ++i) {
    calls.push_back(engine->Call("echo", Buffer::FromString(std::to_string(i)), absl::Seconds(30)));
  }
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<Buffer> r = Get(calls[i]);
    REQUIRE(r.ok());
    CHECK(r->view() == std::to_string(i) + "!");
  }
  const EngineStats st = engine->Stats();
  CHECK(st.consumer("FN_echo", "handler")->acked == 50);
  CHECK(st.stream("FN_echo")->messages == 0);  // interest retention: acked calls leave
}

TEST_CASE("a failing call is retried up to max_deliver, then fails with the last error and is dead-lettered") {
  auto engine = Engine::Create().value();
  std::atomic<int> tries{0};
  REQUIRE(engine->RegisterFunction("flaky", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++tries;
    return absl::InvalidArgumentError("bad input #" + std::to_string(tries.load()));
  }, {.max_deliver = 3}).ok());
  auto dlq = engine->AddConsumer({.stream = "FN_flaky_DLQ", .name = "watch"});
  REQUIRE(dlq.ok());
  auto f = engine->Call("flaky", Buffer::FromString("x"), absl::Seconds(30));
  absl::StatusOr<Buffer> r = Get(f);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) == "function 'flaky' failed after 3 tries (max_deliver): bad input #3");
  CHECK(tries.load() == 3);
  auto dead = dlq->member(0)->Next(absl::Seconds(30));
  REQUIRE(dead.ok());
  CHECK(dead->event().subject == "fn.flaky.dead");
  CHECK(dead->event().payload.view() == "x");
  CHECK(H(dead->event(), kDeadLetterReasonHeader) == "max_deliver");
  CHECK(H(dead->event(), kDeliveryCountHeader) == "3");
  CHECK(H(dead->event(), kCallIdHeader) == "1");
}

TEST_CASE("a call whose first try fails succeeds on the second") {
  auto engine = Engine::Create().value();
  std::atomic<int> tries{0};
  REQUIRE(engine->RegisterFunction("second", [&](const Event&) -> absl::StatusOr<Buffer> {
    if (++tries == 1) throw std::runtime_error("boom");
    return Buffer::FromString("ok");
  }, {.max_deliver = 2}).ok());
  auto f = engine->Call("second", Buffer(), absl::Seconds(30));
  absl::StatusOr<Buffer> r = Get(f);
  REQUIRE(r.ok());
  CHECK(r->view() == "ok");
  CHECK(tries.load() == 2);
}

TEST_CASE("a handler exception fails the try as internal") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("throws", [](const Event&) -> absl::StatusOr<Buffer> {
    throw std::runtime_error("boom");
  }).ok());
  auto f = engine->Call("throws", Buffer(), absl::Seconds(30));
  absl::StatusOr<Buffer> r = Get(f);
  CHECK(r.status().code() == absl::StatusCode::kInternal);
  CHECK(Msg(r.status()) == "function 'throws' failed after 1 try (max_deliver): handler threw: boom");
}

TEST_CASE("call timeouts fire when they pass, queued or running, and land in the dead-letter subject") {
  ManualClock clock(1);
  Gate gate;  // outlives the engine: a handler may still wait on it after Close
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->RegisterFunction("slow", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++gate.entered;
    gate.opened.wait();
    return Buffer::FromString("late");
  }).ok());
  auto dlq = engine->AddConsumer({.stream = "FN_slow_DLQ", .name = "watch"});
  REQUIRE(dlq.ok());
  auto running = engine->Call("slow", Buffer::FromString("a"), absl::Milliseconds(100));
  gate.WaitEntered(1);  // the one worker is busy with call 1
  auto queued = engine->Call("slow", Buffer::FromString("b"), absl::Milliseconds(100));
  clock.Advance(absl::Milliseconds(99));
  engine->RunTimers();
  CHECK(running.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  CHECK(queued.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  clock.Advance(absl::Milliseconds(1));
  engine->RunTimers();
  absl::StatusOr<Buffer> r1 = Get(running);
  absl::StatusOr<Buffer> r2 = Get(queued);
  CHECK(r1.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Msg(r1.status()) == "call 1 to function 'slow' timed out after 100ms (running, 1 try)");
  CHECK(Msg(r2.status()) == "call 2 to function 'slow' timed out after 100ms (queued, 0 tries)");
  Member watch = *dlq->member(0);
  auto d1 = watch.Next(absl::ZeroDuration());
  auto d2 = watch.Next(absl::ZeroDuration());
  REQUIRE(d1.ok());
  REQUIRE(d2.ok());
  CHECK(d1->event().payload.view() == "a");
  CHECK(H(d1->event(), kDeadLetterReasonHeader) == "expired");
  CHECK(H(d1->event(), kDeadLetterDescriptionHeader) == "call timeout while running");
  CHECK(d2->event().payload.view() == "b");
  CHECK(H(d2->event(), kDeadLetterDescriptionHeader) == "call timeout while queued");
  gate.open.set_value();  // the late reply is dropped; the queued call is skipped
  engine->Close();         // does not wait for the handler
  CHECK(inferq::engine_test::Eventually(
      [&] { return inferq::engine_test::CS(*engine, "FN_slow", "handler").acked == 2; }));
}

TEST_CASE("call and registration errors") {
  auto engine = Engine::Create().value();
  auto handler = [](const Event&) -> absl::StatusOr<Buffer> { return Buffer(); };
  CHECK(Msg(engine->RegisterFunction("a.b", handler)) ==
        "function name 'a.b' has the character '.' at byte 1; only A-Z a-z 0-9 _ - are allowed");
  CHECK(Msg(engine->RegisterFunction("f", handler, {.workers = 0})) ==
        "function 'f': workers 0 is outside 1..256");
  CHECK(Msg(engine->RegisterFunction("f", handler, {.max_deliver = 0})) ==
        "function 'f': max_deliver 0 is outside 1..100");
  REQUIRE(engine->RegisterFunction("f", handler).ok());
  CHECK(engine->RegisterFunction("f", handler).code() == absl::StatusCode::kAlreadyExists);
  auto unknown = engine->Call("g", Buffer(), absl::Seconds(1));
  CHECK(Msg(unknown.get().status()) == "function 'g' is not registered");
  auto bad = engine->Call("f", Buffer(), absl::ZeroDuration());
  CHECK(Msg(bad.get().status()) ==
        "call to function 'f': timeout 0 is invalid (> 0 and up to 365 days)");
}

TEST_CASE("closing the engine fails open calls with Cancelled") {
  Gate gate;  // outlives the engine: a handler may still wait on it after Close
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("stuck", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++gate.entered;
    gate.opened.wait();
    return absl::UnavailableError("closing");
  }).ok());
  auto first = engine->Call("stuck", Buffer(), absl::Seconds(60));
  gate.WaitEntered(1);
  auto second = engine->Call("stuck", Buffer(), absl::Seconds(60));
  std::thread closer([&] { engine->Close(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.open.set_value();
  closer.join();
  for (auto* f : {&first, &second}) {
    absl::StatusOr<Buffer> r = Get(*f);
    CHECK((r.status().code() == absl::StatusCode::kCancelled ||
           r.status().code() == absl::StatusCode::kUnavailable));
  }
  CHECK(engine->Call("stuck", Buffer(), absl::Seconds(1)).get().status().code() ==
        absl::StatusCode::kCancelled);
}
