// Function-in-flight: Engine::RegisterFunction, Call, StartCall and CancelCall.
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <set>
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
absl::StatusOr<Buffer> Get(std::future<absl::StatusOr<Buffer>>&& f) { return Get(f); }

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

TEST_CASE("one function serves a family of subjects and its handler sees the call as made") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("uber", [](const Event& e) -> absl::StatusOr<Buffer> {
    return Buffer::FromString(e.subject + " " + std::string(e.headers.Get("session").value_or("-")) +
                              " " + e.tenant + " " + std::string(e.payload.view()));
  }, {.workers = 2, .subjects = {"agent.tool.uber.>", "agent.tool.taxi"}}).ok());
  Event call;
  call.subject = "agent.tool.uber.ride";
  call.tenant = "acme";
  call.headers.Set("session", "s-7");
  call.payload = Buffer::FromString(R"({"loc":"Berkeley"})");
  call.ttl = absl::Seconds(30);
  PendingCall p = engine->StartCall("uber", call);
  CHECK(p.id == 1);
  absl::StatusOr<Buffer> r = Get(p.reply);
  REQUIRE(r.ok());
  CHECK(r->view() == R"(agent.tool.uber.ride s-7 acme {"loc":"Berkeley"})");
  call.subject = "agent.tool.taxi";
  PendingCall taxi = engine->StartCall("uber", call);
  CHECK(Get(taxi.reply)->view() == R"(agent.tool.taxi s-7 acme {"loc":"Berkeley"})");

  call.subject = "agent.tool.lyft.ride";
  PendingCall other = engine->StartCall("uber", call);
  CHECK(other.id == 0);
  absl::StatusOr<Buffer> refused = Get(other.reply);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(refused.status()) ==
        "call to function 'uber': subject 'agent.tool.lyft.ride' is not one the function serves");
  call.subject.clear();  // the first subject is a pattern: no default
  CHECK(Msg(Get(engine->StartCall("uber", call).reply).status()) ==
        "call to function 'uber' has no subject, and the function's first subject "
        "'agent.tool.uber.>' is a pattern");
  call.subject = "agent.tool.taxi";
  call.ttl = absl::ZeroDuration();
  CHECK(Msg(Get(engine->StartCall("uber", call).reply).status()) ==
        "call to function 'uber' has no time limit: set Event::ttl or Event::deadline");
  call.deadline = absl::Now() - absl::Seconds(1);
  absl::StatusOr<Buffer> late = Get(engine->StartCall("uber", call).reply);
  CHECK(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Msg(late.status()).rfind("call to function 'uber': its deadline ", 0) == 0);
}

TEST_CASE("function subjects are checked at registration") {
  auto engine = Engine::Create().value();
  auto h = [](const Event&) -> absl::StatusOr<Buffer> { return Buffer(); };
  CHECK(Msg(engine->RegisterFunction("f", h, {.subjects = {"fn.>"}})) ==
        "function 'f': subject 'fn.>' can match dead letters of functions (fn.*.dead)");
  CHECK(Msg(engine->RegisterFunction("f", h, {.subjects = {"a..b"}})) ==
        "function 'f': subject pattern 'a..b' has an empty token at position 2");
  CHECK(engine->RegisterFunction("f", h, {.subjects = std::vector<std::string>(4097, "a")}).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(engine->Stats().streams.empty());  // nothing was added
  CHECK(engine->RegisterFunction("f", h, {.subjects = {"fn.f"}}).ok());  // the default, spelled out
}

TEST_CASE("a call the function's admission refuses ends InvalidArgument and is dead-lettered unrun") {
  auto engine = Engine::Create().value();
  std::atomic<int> runs{0};
  REQUIRE(engine->RegisterFunction("pay", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++runs;
    return Buffer::FromString("paid");
  }, {.subjects = {"agent.tool.pay"},
      .admit = [](const Event& e) -> absl::Status {
        if (e.payload.view().find("amount") == std::string_view::npos) {
          return absl::InvalidArgumentError("missing required argument 'amount'");
        }
        return absl::OkStatus();
      }}).ok());
  auto dlq = engine->AddConsumer({.stream = "FN_pay_DLQ", .name = "watch"});
  REQUIRE(dlq.ok());
  Event call;
  call.subject = "agent.tool.pay";
  call.ttl = absl::Seconds(30);
  call.payload = Buffer::FromString(R"({"to":"bob"})");
  call.headers.Set("session", "s-1");
  PendingCall p = engine->StartCall("pay", call);
  CHECK(p.id == 1);
  absl::StatusOr<Buffer> r = Get(p.reply);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) ==
        "call 1 to function 'pay' on 'agent.tool.pay' refused: missing required argument 'amount'");
  auto dead = dlq->member(0)->Next(absl::Seconds(30));
  REQUIRE(dead.ok());
  CHECK(dead->event().subject == "fn.pay.dead");
  CHECK(dead->event().payload.view() == R"({"to":"bob"})");
  CHECK(H(dead->event(), kDeadLetterReasonHeader) == "refused");
  CHECK(H(dead->event(), kDeadLetterDescriptionHeader) == "missing required argument 'amount'");
  CHECK(H(dead->event(), kOriginalSubjectHeader) == "agent.tool.pay");
  CHECK(H(dead->event(), kDeliveryCountHeader) == "0");
  CHECK(H(dead->event(), kCallIdHeader) == "1");
  CHECK(H(dead->event(), "session") == "s-1");
  call.payload = Buffer::FromString(R"({"to":"bob","amount":5})");
  CHECK(Get(engine->StartCall("pay", call).reply)->view() == "paid");
  CHECK(runs.load() == 1);
  CHECK(engine->CancelCall(1).code() == absl::StatusCode::kNotFound);  // it ended
}

TEST_CASE("a cancelled call ends Cancelled; queued it never runs, running its reply is dropped") {
  Gate gate;  // outlives the engine
  auto engine = Engine::Create().value();
  std::atomic<int> runs{0};
  REQUIRE(engine->RegisterFunction("slow", [&](const Event& e) -> absl::StatusOr<Buffer> {
    ++runs;
    ++gate.entered;
    gate.opened.wait();
    return Buffer::FromString("done " + std::string(e.payload.view()));
  }).ok());
  Event a;
  a.ttl = absl::Seconds(60);
  a.payload = Buffer::FromString("a");
  PendingCall running = engine->StartCall("slow", a);
  gate.WaitEntered(1);
  Event b = a;
  b.payload = Buffer::FromString("b");
  PendingCall queued = engine->StartCall("slow", b);
  Event c = a;
  c.payload = Buffer::FromString("c");
  PendingCall kept = engine->StartCall("slow", c);
  REQUIRE(engine->CancelCall(queued.id, "user went away").ok());
  REQUIRE(engine->CancelCall(running.id).ok());
  absl::StatusOr<Buffer> rq = Get(queued.reply);
  CHECK(rq.status().code() == absl::StatusCode::kCancelled);
  CHECK(Msg(rq.status()) == "call 2 to function 'slow' cancelled: user went away");
  CHECK(Msg(Get(running.reply).status()) == "call 1 to function 'slow' cancelled: cancelled by the caller");
  CHECK(Msg(engine->CancelCall(queued.id)) ==
        "call 2 is not open (it ended, or no such call was made)");
  CHECK(engine->CancelCall(999).code() == absl::StatusCode::kNotFound);
  gate.open.set_value();
  CHECK(Get(kept.reply)->view() == "done c");
  CHECK(runs.load() == 2);  // a and c; b was dropped unrun
  CHECK(inferq::engine_test::Eventually(
      [&] { return inferq::engine_test::CS(*engine, "FN_slow", "handler").acked == 3; }));
  const EngineStats st = engine->Stats();
  CHECK(st.stream("FN_slow_DLQ")->stored == 0);  // cancelling is not a failure
}

TEST_CASE("a handler's error report (status payloads) reaches the caller with the last error") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("geo", [](const Event&) -> absl::StatusOr<Buffer> {
    absl::Status s = absl::NotFoundError("no such city");
    s.SetPayload("type.inferq/tool-error", absl::Cord(R"({"city":"Atlantis"})"));
    return s;
  }, {.max_deliver = 2}).ok());
  absl::StatusOr<Buffer> r = Get(engine->StartCall("geo", [] {
    Event e;
    e.ttl = absl::Seconds(30);
    return e;
  }()).reply);
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(r.status()) == "function 'geo' failed after 2 tries (max_deliver): no such city");
  auto report = r.status().GetPayload("type.inferq/tool-error");
  REQUIRE(report.has_value());
  CHECK(std::string(*report) == R"({"city":"Atlantis"})");
}

TEST_CASE("concurrent calls and cancels each end exactly once", "[concurrency]") {
  auto engine = Engine::Create().value();
  std::atomic<int> runs{0};
  REQUIRE(engine->RegisterFunction("work", [&](const Event& e) -> absl::StatusOr<Buffer> {
    ++runs;
    return Buffer::FromString(std::string(e.payload.view()));
  }, {.workers = 2, .queue_capacity = 4}).ok());
  constexpr int kCalls = 400;
  std::vector<PendingCall> calls(kCalls);
  std::thread caller([&] {
    for (int i = 0; i < kCalls; ++i) {
      Event e;
      e.ttl = absl::Seconds(60);
      e.payload = Buffer::FromString(std::to_string(i));
      calls[i] = engine->StartCall("work", std::move(e));
    }
  });
  caller.join();
  std::atomic<int> cancelled_ok{0};
  std::thread canceller([&] {
    for (int i = 0; i < kCalls; i += 2) {
      if (engine->CancelCall(calls[i].id).ok()) ++cancelled_ok;
    }
  });
  int replied = 0, cancelled = 0;
  for (int i = 1; i < kCalls; i += 2) {
    absl::StatusOr<Buffer> r = Get(calls[i].reply);
    REQUIRE(r.ok());
    CHECK(r->view() == std::to_string(i));
    ++replied;
  }
  canceller.join();
  for (int i = 0; i < kCalls; i += 2) {
    absl::StatusOr<Buffer> r = Get(calls[i].reply);
    if (r.ok()) {
      CHECK(r->view() == std::to_string(i));
      ++replied;
    } else {
      CHECK(r.status().code() == absl::StatusCode::kCancelled);
      ++cancelled;
    }
  }
  CHECK(replied + cancelled == kCalls);
  CHECK(cancelled == cancelled_ok.load());
  CHECK(runs.load() <= kCalls);
  CHECK(runs.load() >= replied);
}

TEST_CASE("a call's wall-clock deadline ends it when it comes before its ttl") {
  ManualClock clock(1);
  Gate gate;  // outlives the engine
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->RegisterFunction("slow", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++gate.entered;
    gate.opened.wait();
    return Buffer::FromString("late");
  }).ok());
  Event call;
  call.ttl = absl::Seconds(60);
  call.deadline = absl::Now() + absl::Seconds(5);  // the time limit is about 5 s, not 60
  PendingCall p = engine->StartCall("slow", call);
  gate.WaitEntered(1);
  clock.Advance(absl::Seconds(4));
  engine->RunTimers();
  CHECK(p.reply.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  clock.Advance(absl::Seconds(2));
  engine->RunTimers();
  absl::StatusOr<Buffer> r = Get(p.reply);
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Msg(r.status()).rfind("call 1 to function 'slow' timed out after 4.9", 0) == 0);
  gate.open.set_value();
}

TEST_CASE("a call goes to its own function only, even when another serves the same subject") {
  // Was: both functions' streams stored the call, and the other handler answered it
  // without the first one's admission.
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("pay", [](const Event&) -> absl::StatusOr<Buffer> {
    return Buffer::FromString("paid");
  }, {.subjects = {"tools.pay"}}).ok());
  std::atomic<int> audit_runs{0};
  REQUIRE(engine->RegisterFunction("audit", [&](const Event&) -> absl::StatusOr<Buffer> {
    ++audit_runs;
    return absl::PermissionDeniedError("audit handler");
  }, {.subjects = {"tools.>"}}).ok());
  REQUIRE(engine->RegisterFunction("plain", [](const Event&) -> absl::StatusOr<Buffer> {
    return Buffer::FromString("plain");
  }).ok());
  REQUIRE(engine->RegisterFunction("greedy", [](const Event&) -> absl::StatusOr<Buffer> {
    return Buffer::FromString("greedy");
  }, {.subjects = {"fn.*"}}).ok());
  for (int i = 0; i < 50; ++i) {
    Event e;
    e.subject = "tools.pay";
    e.ttl = absl::Seconds(30);
    CHECK(Get(engine->StartCall("pay", std::move(e)).reply)->view() == "paid");
    CHECK(Get(engine->Call("plain", Buffer(), absl::Seconds(30)))->view() == "plain");
  }
  CHECK(audit_runs.load() == 0);
}

TEST_CASE("another stream capturing a call's subject does not make a waiting call look queued") {
  // Was: an audit stream stored the call while the function's full queue refused it,
  // the OK publish took the call off the backlog, and it timed out unrun.
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("f", [](const Event&) -> absl::StatusOr<Buffer> {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return Buffer::FromString("ok");
  }, {.workers = 1, .queue_capacity = 1}).ok());
  REQUIRE(engine->AddStream({.name = "AUDIT", .subjects = {"fn.*"}}).ok());
  std::vector<std::future<absl::StatusOr<Buffer>>> calls;
  for (int i = 0; i < 10; ++i) calls.push_back(engine->Call("f", Buffer(), absl::Seconds(30)));
  for (auto& c : calls) CHECK(Get(c).ok());
  const EngineStats st = engine->Stats();
  CHECK(st.stream("AUDIT")->stored == 0);  // calls go into their function's stream alone
}

TEST_CASE("a call ends with one dead letter at most when its last try fails as it expires or is cancelled",
          "[concurrency]") {
  // Was: 21 of 400 calls got both an "expired" and a "max_deliver" dead letter, and
  // cancelled calls were dead-lettered.
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("flaky", [](const Event&) -> absl::StatusOr<Buffer> {
    std::this_thread::sleep_for(std::chrono::microseconds(1500));
    return absl::UnavailableError("down");
  }, {.workers = 4, .max_deliver = 1}).ok());
  auto dlq = engine->AddConsumer({.stream = "FN_flaky_DLQ", .name = "watch"});
  REQUIRE(dlq.ok());
  constexpr int kCalls = 300;
  std::vector<PendingCall> calls;
  for (int i = 0; i < kCalls; ++i) {
    Event e;
    e.ttl = absl::Microseconds(1000 + 10 * (i % 100));  // expiries around the try's end
    calls.push_back(engine->StartCall("flaky", std::move(e)));
  }
  std::set<std::uint64_t> cancelled;
  for (int i = 0; i < kCalls; i += 3) {
    if (engine->CancelCall(calls[i].id).ok()) cancelled.insert(calls[i].id);
  }
  for (auto& c : calls) CHECK(!Get(c.reply).ok());
  std::map<std::string, int> letters;  // call id -> dead letters
  Member watch = *dlq->member(0);
  for (;;) {
    auto m = watch.Next(absl::Seconds(2));  // a dead letter follows its future's end
    if (!m.ok()) break;
    ++letters[std::string(H(m->event(), kCallIdHeader))];
    REQUIRE(m->Ack().ok());
  }
  int twice = 0, cancelled_with_letter = 0;
  for (const auto& [id, n] : letters) {
    twice += n > 1;
    cancelled_with_letter += cancelled.count(std::stoull(id));
  }
  CHECK(twice == 0);
  CHECK(cancelled_with_letter == 0);
  CHECK(letters.size() + cancelled.size() == static_cast<std::size_t>(kCalls));
}

TEST_CASE("admission runs inside the call's time limit, and a throwing admit refuses the call") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction("slowadmit", [](const Event&) -> absl::StatusOr<Buffer> {
    return Buffer::FromString("late");
  }, {.admit = [](const Event& e) -> absl::Status {
        if (e.payload.view() == "throw") throw std::runtime_error("admit boom");
        if (e.payload.view() == "quiet") return absl::InvalidArgumentError("");
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        return absl::OkStatus();
      }}).ok());
  Event slow;
  slow.ttl = absl::Milliseconds(100);  // admission alone takes 300 ms
  PendingCall sp = engine->StartCall("slowadmit", slow);
  absl::StatusOr<Buffer> r = Get(sp.reply);
  CHECK(r.status().code() == absl::StatusCode::kDeadlineExceeded);  // was: "late", OK
  CHECK(Msg(r.status()) == "call " + std::to_string(sp.id) +
                               " to function 'slowadmit' timed out after 100ms (in admission, 0 tries)");
  Event thrower;
  thrower.ttl = absl::Seconds(30);
  thrower.payload = Buffer::FromString("throw");
  PendingCall t = engine->StartCall("slowadmit", thrower);  // was: the exception escaped
  absl::StatusOr<Buffer> tr = Get(t.reply);
  CHECK(tr.status().code() == absl::StatusCode::kInternal);
  CHECK(Msg(tr.status()) == "call " + std::to_string(t.id) +
                                " to function 'slowadmit' on 'fn.slowadmit' refused: admit threw: admit boom");
  Event quiet = thrower;
  quiet.payload = Buffer::FromString("quiet");
  PendingCall q = engine->StartCall("slowadmit", quiet);
  CHECK(Msg(Get(q.reply).status()) == "call " + std::to_string(q.id) +
                                          " to function 'slowadmit' on 'fn.slowadmit' refused: "
                                          "(admit gave no reason)");
  Event bad_qos = thrower;
  bad_qos.qos = static_cast<Qos>(77);
  PendingCall b = engine->StartCall("slowadmit", bad_qos);  // refused before admit, no id
  CHECK(b.id == 0);
  CHECK(Get(b.reply).status().code() == absl::StatusCode::kInvalidArgument);
}
