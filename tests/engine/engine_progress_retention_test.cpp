// Interest-retention streams that hold no queue of their messages
// (StreamState::KeepsIndex) and InProgress moving the ack wait without touching the
// timer wheel (ConsumerState::ExtendAckWait), under hostile orders of settlements,
// timers, Close and destruction; written by an adversarial review of both changes.
//
// "regression: ..." cases reproduce a defect that review found (they failed on
// 414f0ce); the others held up and keep it that way.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/engine/engine.hpp"
#include "engine_test_util.hpp"

using namespace inferq;
using namespace inferq::engine_test;

namespace {

StreamConfig InterestNoIndex(std::string name = "W", std::string subject = "work.>") {
  StreamConfig s{.name = std::move(name), .subjects = {std::move(subject)}};
  s.retention = RetentionPolicy::kInterest;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Was a defect (fixed): an InProgress whose moved deadline has passed by the time the timer run
// comes is not redelivered by that run. The ack-wait timer set for the original
// deadline fires, finds deadline_ns moved, and re-schedules itself from inside
// TimerWheel::Advance's callback (timers.cpp), which the wheel documents as firing
// "in a later Advance, never in the running one, even when its deadline has passed".
// So RunTimers at 2.0 s does not redeliver a delivery whose ack wait ended at 1.6 s;
// before 7ca6969 (ArmAckWait re-scheduled at InProgress time) it did.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: a timer run after the moved ack wait passed redelivers in that run") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(1)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  f.clock.Advance(absl::Milliseconds(600));
  REQUIRE(held->InProgress().ok());          // deadline 1.6 s
  f.clock.Advance(absl::Milliseconds(1400)); // 2.0 s: both deadlines have passed
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  CHECK(CS(f.engine, "S", "c").redelivered == 1);
  auto again = m.Next(absl::ZeroDuration());
  CHECK(again.ok());
  if (again.ok()) CHECK(again->attempt() == 2);
}

// Same root cause with max_deliver: the last delivery, extended and then left to
// expire, is dead-lettered one timer run late.
TEST_CASE("regression: the last delivery extended by InProgress is dead-lettered by the first run past its deadline") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(1), .max_deliver = 1, .dead_letter_subject = "dead.c"});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  f.clock.Advance(absl::Milliseconds(500));
  REQUIRE(held->InProgress().ok());          // deadline 1.5 s
  f.clock.Advance(absl::Seconds(5));         // 5.5 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  CHECK(CS(f.engine, "S", "c").dead_letters == 1);
  CHECK(CS(f.engine, "S", "c").timers == 0);
  auto dead = f.dlq.Next(absl::ZeroDuration());
  CHECK(dead.ok());
  if (dead.ok()) CHECK(H(dead->event(), kDeadLetterDescriptionHeader) == "ack_wait expired");
}

// ---------------------------------------------------------------------------------
// What held up: the lazy re-arm with Nak, Nak(delay), Term, backoff and max_deliver.
// ---------------------------------------------------------------------------------

TEST_CASE("InProgress then Nak with a delay redelivers at the nak delay not at the moved ack wait") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(1)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  f.clock.Advance(absl::Milliseconds(500));
  REQUIRE(held->InProgress().ok());  // deadline 1.5 s, timer still at 1.0 s
  CHECK(CS(f.engine, "S", "c").timers == 1);
  REQUIRE(held->Nak(absl::Milliseconds(300)).ok());  // redelivery at 0.8 s from start
  CHECK(CS(f.engine, "S", "c").timers == 1);          // the ack wait cancelled, the nak's set
  CHECK(held->InProgress().code() == absl::StatusCode::kFailedPrecondition);
  f.clock.Advance(absl::Milliseconds(300) - absl::Nanoseconds(1));
  f.engine.RunTimers();
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Nanoseconds(1));
  f.engine.RunTimers();
  auto again = m.Next(absl::ZeroDuration());
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  CHECK(CS(f.engine, "S", "c").timers == 1);  // attempt 2's ack wait
  // The old timer at 1.0 s is gone: nothing fires then.
  f.clock.Advance(absl::Milliseconds(200));  // 1.0 s from start
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  f.clock.Advance(absl::Milliseconds(800));  // attempt 2 delivered at 0.8 s: due at 1.8 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  CHECK(CS(f.engine, "S", "c").naks == 1);
  CHECK(CS(f.engine, "S", "c").redelivered == 2);
}

TEST_CASE("backoff with a shorter second ack wait and InProgress on both attempts") {
  Fixture f;
  Member m = f.Add({.backoff = {absl::Seconds(10), absl::Seconds(1)}, .max_deliver = 3,
                    .dead_letter_subject = "dead.c"});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto d1 = m.Next(absl::ZeroDuration());
  REQUIRE(d1.ok());
  f.clock.Advance(absl::Seconds(4));
  REQUIRE(d1->InProgress().ok());  // deadline 14 s; armed at 10 s
  f.clock.Advance(absl::Seconds(6));  // 10 s: early firing re-arms for 14 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  CHECK(CS(f.engine, "S", "c").timers == 1);
  f.clock.Advance(absl::Seconds(4));  // 14 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  auto d2 = m.Next(absl::ZeroDuration());
  REQUIRE(d2.ok());
  CHECK(d2->attempt() == 2);
  // The first delivery cannot extend the second.
  CHECK(d1->InProgress().ok());
  f.clock.Advance(absl::Milliseconds(500));
  REQUIRE(d2->InProgress().ok());  // attempt 2's wait is 1 s: deadline 15.5 s
  f.clock.Advance(absl::Milliseconds(500));  // 15 s: armed timer fires early
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  f.clock.Advance(absl::Milliseconds(500) - absl::Nanoseconds(1));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  f.clock.Advance(absl::Nanoseconds(1));  // 15.5 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 2);
  auto d3 = m.Next(absl::ZeroDuration());
  REQUIRE(d3.ok());
  CHECK(d3->attempt() == 3);
  REQUIRE(d3->InProgress().ok());  // same instant as delivery: the equal-deadline shortcut
  REQUIRE(d3->Nak().ok());         // attempt 3 = max_deliver: dead letter
  CHECK(CS(f.engine, "S", "c").dead_letters == 1);
  CHECK(CS(f.engine, "S", "c").timers == 0);
  auto dead = f.dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  CHECK(H(dead->event(), kDeliveryCountHeader) == "3");
  CHECK(H(dead->event(), kDeadLetterDescriptionHeader) == "nak");
  CHECK(d1->Ack().ok());  // late: a no-op
  CHECK(CS(f.engine, "S", "c").late_acks == 1);
  CHECK(CS(f.engine, "S", "c").acked == 0);
}

TEST_CASE("InProgress then Term on an interest stream without index frees the record and cancels the timer") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  Member m = engine->AddConsumer({.stream = "W", .name = "c", .ack_wait = absl::Seconds(1)})
                 .value().member(0).value();
  const Buffer payload = Buffer::Copy(std::as_bytes(std::span("abc", 3)));
  Event e = Ev("work.a", "x");
  e.payload = payload;
  REQUIRE(engine->Publish(std::move(e)).ok());
  {
    auto held = m.Next(absl::ZeroDuration());
    REQUIRE(held.ok());
    clock.Advance(absl::Milliseconds(500));
    REQUIRE(held->InProgress().ok());
    CHECK(payload.use_count() == 2);  // ours and the record's (Message and pending share it)
    REQUIRE(held->Term("stop").ok());
    CHECK(CS(*engine, "W", "c").timers == 0);
    CHECK(SS(*engine, "W").messages == 0);
    CHECK(SS(*engine, "W").acked_out == 1);
  }
  CHECK(payload.use_count() == 1);
  clock.Advance(absl::Seconds(5));
  engine->RunTimers();
  CHECK(CS(*engine, "W", "c").ack_timeouts == 0);
  CHECK(CS(*engine, "W", "c").terminated == 1);
  CHECK(CS(*engine, "W", "c").dead_letters == 1);
}

// ---------------------------------------------------------------------------------
// Interest retention without an index: exact counts and no leaks (ASan) whatever ends
// a delivery, and whatever the engine holds when it is destroyed.
// ---------------------------------------------------------------------------------

TEST_CASE("interest stream without index counts every way a delivery ends exactly") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  // a: acks; b: max_deliver 2 by expiry; d: drop-oldest lane of 2; n: ack none.
  Member a = engine->AddConsumer({.stream = "W", .name = "a", .ack_wait = absl::Seconds(1)})
                 .value().member(0).value();
  Member b = engine->AddConsumer({.stream = "W", .name = "b", .ack_wait = absl::Seconds(1),
                                  .max_deliver = 2, .dead_letter_subject = "dead.b"})
                 .value().member(0).value();
  Member d = engine->AddConsumer({.stream = "W", .name = "d", .lane_capacity = 2,
                                  .overflow = OverflowPolicy::kDropOldest})
                 .value().member(0).value();
  Member n = engine->AddConsumer({.stream = "W", .name = "n", .ack = AckPolicy::kNone})
                 .value().member(0).value();
  for (int i = 0; i < 4; ++i) REQUIRE(engine->Publish(Ev("work.a", "m" + std::to_string(i))).ok());
  CHECK(SS(*engine, "W").messages == 4);
  CHECK(CS(*engine, "W", "d").dropped == 2);  // m0, m1 dropped for d
  CHECK(Drain(n, false).size() == 4);
  CHECK(Drain(a).size() == 4);
  CHECK(SS(*engine, "W").messages == 4);  // b and d (m2, m3) still hold them
  CHECK(Drain(d).size() == 2);
  CHECK(SS(*engine, "W").messages == 4);  // b
  {
    std::vector<Message> out;
    for (int i = 0; i < 4; ++i) out.push_back(b.Next(absl::ZeroDuration()).value());
    REQUIRE(out[0].InProgress().ok());  // at delivery time: same deadline, nothing moves
    clock.Advance(absl::Milliseconds(1500));
    engine->RunTimers();
    CHECK(CS(*engine, "W", "b").ack_timeouts == 4);
  }
  std::vector<Message> second;
  for (;;) {
    auto r = b.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    second.push_back(std::move(*r));
  }
  CHECK(second.size() == 4);
  REQUIRE(second[0].Ack().ok());
  REQUIRE(second[1].Term().ok());
  REQUIRE(second[2].Nak().ok());  // attempt 2 = max_deliver
  second.clear();                 // m3's second delivery released unsettled
  clock.Advance(absl::Seconds(2));
  engine->RunTimers();  // m3 expires a second time: dead letter
  CHECK(CS(*engine, "W", "b").dead_letters == 3);
  CHECK(CS(*engine, "W", "b").timers == 0);
  CHECK(SS(*engine, "W").messages == 0);
  CHECK(SS(*engine, "W").bytes == 0);
  CHECK(SS(*engine, "W").acked_out == 4);
  CHECK(SS(*engine, "DLQ").messages == 3);
}

TEST_CASE("destroying the engine with records only in lanes pending entries nak timers and parked deliveries") {
  ManualClock clock{1'000'000'000};
  const Buffer payload = Buffer::Copy(std::as_bytes(std::span("payload", 7)));
  {
    auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
    REQUIRE(engine->AddStream(InterestNoIndex()).ok());
    Member m = engine->AddConsumer({.stream = "W", .name = "c", .lane_capacity = 2,
                                    .ack_wait = absl::Seconds(1)})
                   .value().member(0).value();
    auto pub = [&](int i) {
      Event e = Ev("work.a", "m" + std::to_string(i));
      e.payload = payload;
      REQUIRE(engine->Publish(std::move(e)).ok());
    };
    pub(0);
    pub(1);
    {
      auto x = m.Next(absl::ZeroDuration());  // m0: pending, released unsettled
      REQUIRE(x.ok());
      auto y = m.Next(absl::ZeroDuration());  // m1: a kRedeliver timer holds it
      REQUIRE(y.ok());
      REQUIRE(y->Nak(absl::Seconds(30)).ok());
    }
    pub(2);
    pub(3);  // the lane is full
    clock.Advance(absl::Seconds(2));
    engine->RunTimers();  // m0 expires; its redelivery parks (then RetryParked parks it again)
    CHECK(CS(*engine, "W", "c").ack_timeouts == 1);
    CHECK(CS(*engine, "W", "c").parked == 2);
    CHECK(CS(*engine, "W", "c").timers == 1);
    CHECK(SS(*engine, "W").messages == 4);
    CHECK(payload.use_count() == 5);
    SECTION("closed first") { engine->Close(); }
    SECTION("not closed") {}
  }
  CHECK(payload.use_count() == 1);
}

// Messages destroyed after Close but before ~Engine (the contract allows it), with
// the last reference in the Message.
TEST_CASE("messages outliving Close but not the engine free their records") {
  const Buffer payload = Buffer::Copy(std::as_bytes(std::span("p", 1)));
  auto engine = Engine::Create({.manual_timers = true}).value();
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  Member m = engine->AddConsumer({.stream = "W", .name = "c", .ack_wait = absl::Seconds(1)})
                 .value().member(0).value();
  Event e = Ev("work.a");
  e.payload = payload;
  REQUIRE(engine->Publish(std::move(e)).ok());
  std::vector<Message> held;
  held.push_back(m.Next(absl::ZeroDuration()).value());
  engine->Close();
  REQUIRE(held[0].InProgress().ok());
  REQUIRE(held[0].Ack().ok());
  CHECK(SS(*engine, "W").messages == 0);
  CHECK(payload.use_count() == 2);
  held.clear();
  CHECK(payload.use_count() == 1);
  engine.reset();
}

// ---------------------------------------------------------------------------------
// Concurrency (TSan): InProgress racing Ack / Nak(delay) / Term on the same Message,
// the background timer thread expiring and re-arming, stalled-member moves and Close.
// Every message ends exactly once (acked or dead-lettered) and the stream's counts
// return to zero.
// ---------------------------------------------------------------------------------
TEST_CASE("InProgress races settles and the timer thread with exact final counts") {
  constexpr int kMessages = 1500;
  auto engine = Engine::Create().value();  // steady clock, background timer thread
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  Consumer c = engine->AddConsumer({.stream = "W", .name = "c", .members = 3,
                                    .lane_capacity = 1 << 14, .ack_wait = absl::Milliseconds(4),
                                    .max_deliver = 4, .dead_letter_subject = "dead.c"})
                   .value();
  Member dlq = engine->AddConsumer({.stream = "DLQ", .name = "dlq", .lane_capacity = 1 << 14})
                   .value().member(0).value();
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (std::uint32_t i = 0; i < 3; ++i) {
    workers.emplace_back([&, i] {
      Member m = c.member(i).value();
      std::mt19937 rng(i + 1);
      while (!stop.load()) {
        auto r = m.Next(absl::Milliseconds(2));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kCancelled) return;
          continue;
        }
        Message msg = std::move(*r);
        const int what = static_cast<int>(rng() % 8);
        if (what == 7 && i == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(6));  // let it expire
        }
        // A second thread settles while this one reports progress.
        std::atomic<int> wins{0};
        std::atomic<bool> finished{false};
        std::thread other([&] {
          absl::Status s = what < 3 ? msg.Ack() : what < 5 ? msg.Nak(absl::Milliseconds(1))
                                    : what < 6 ? msg.Term("t") : msg.Ack();
          if (s.ok()) wins.fetch_add(1);
          finished.store(true);
        });
        // Progress reports until the other settle is done (bounded).
        for (int k = 0; k < 10'000 && !finished.load(); ++k) (void)msg.InProgress();
        absl::Status mine = msg.Ack();
        other.join();
        if (mine.ok()) wins.fetch_add(1);
        CHECK(wins.load() == 1);
      }
    });
  }
  for (int i = 0; i < kMessages; ++i) {
    REQUIRE(engine->Publish(Ev("work.a", "m" + std::to_string(i))).ok());
  }
  // Wait until every message has ended for c: acked or dead-lettered.
  const bool done = Eventually([&] {
    const ConsumerStats s = CS(*engine, "W", "c");
    return SS(*engine, "W").messages == 0 && s.ack_pending == 0 && s.timers == 0;
  });
  stop.store(true);
  for (auto& w : workers) w.join();
  CHECK(done);
  const ConsumerStats s = CS(*engine, "W", "c");
  const StreamStats w = SS(*engine, "W");
  CHECK(w.messages == 0);
  CHECK(w.bytes == 0);
  CHECK(w.acked_out == kMessages);
  CHECK(s.timers == 0);
  CHECK(s.ack_pending == 0);
  CHECK(s.parked == 0);
  // Each message ends once: first acks counted in `acked`, the rest dead-lettered.
  CHECK(s.acked + s.dead_letters == kMessages);
  CHECK(s.dead_letters_lost == 0);
  WARN("acked " << s.acked << " dead_letters " << s.dead_letters << " ack_timeouts "
                << s.ack_timeouts << " naks " << s.naks << " moved " << s.moved
                << " redelivered " << s.redelivered << " late_acks " << s.late_acks);
  const std::size_t dead = Drain(dlq).size();
  CHECK(dead == s.dead_letters);
  engine->Close();
}

// A member that heartbeats its held message but pulls nothing: its queued work moves
// (stalled), its held delivery is not redelivered through the early firings.
TEST_CASE("a heartbeating stalled member keeps its delivery while its queue moves") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  Consumer c = engine->AddConsumer({.stream = "W", .name = "c", .members = 2,
                                    .ack_wait = absl::Seconds(1)})
                   .value();
  Member m0 = c.member(0).value();
  Member m1 = c.member(1).value();
  for (int i = 0; i < 4; ++i) REQUIRE(engine->Publish(Ev("work.a", "m" + std::to_string(i))).ok());
  auto held = m0.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  CHECK(held->event().msg_id == "m0");
  std::vector<std::string> got1 = Drain(m1);
  for (int k = 0; k < 6; ++k) {
    clock.Advance(absl::Milliseconds(500));
    REQUIRE(held->InProgress().ok());
    engine->RunTimers();
    for (const std::string& id : Drain(m1)) got1.push_back(id);
  }
  CHECK(got1 == std::vector<std::string>{"m1", "m3", "m2"});
  const ConsumerStats s = CS(*engine, "W", "c");
  CHECK(s.ack_timeouts == 0);
  CHECK(s.moved == 1);
  CHECK(s.redelivered == 0);
  CHECK(s.timers == 1);
  CHECK(SS(*engine, "W").messages == 1);
  REQUIRE(held->Ack().ok());
  CHECK(CS(*engine, "W", "c").acked == 4);
  CHECK(CS(*engine, "W", "c").timers == 0);
  CHECK(SS(*engine, "W").messages == 0);
  CHECK(SS(*engine, "W").acked_out == 4);
}

// Close while members heartbeat and settle and the timer thread re-arms; the members
// drop their Messages after Close, then the engine goes. Every record is freed.
TEST_CASE("Close during heartbeats then Messages then the engine go with every record freed") {
  const Buffer payload = Buffer::Copy(std::as_bytes(std::span("pp", 2)));
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream(InterestNoIndex()).ok());
  Consumer c = engine->AddConsumer({.stream = "W", .name = "c", .members = 2,
                                    .lane_capacity = 1 << 12, .ack_wait = absl::Milliseconds(3)})
                   .value();
  for (int i = 0; i < 2000; ++i) {
    Event e = Ev("work.a", "m" + std::to_string(i));
    e.payload = payload;
    REQUIRE(engine->Publish(std::move(e)).ok());
  }
  std::atomic<int> cancelled{0};
  std::vector<std::thread> workers;
  std::mutex mu;
  std::vector<Message> kept;  // some outlive Close
  for (std::uint32_t i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      Member m = c.member(i).value();
      int n = 0;
      for (;;) {
        auto r = m.Next(absl::Milliseconds(50));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kCancelled) {
            cancelled.fetch_add(1);
            return;
          }
          continue;
        }
        for (int k = 0; k < 3; ++k) (void)r->InProgress();
        if (++n % 5 == 0) {
          std::lock_guard lock(mu);
          kept.push_back(std::move(*r));  // held, unsettled
        } else if (n % 5 == 1) {
          (void)r->Nak(absl::Milliseconds(1));
        } else {
          (void)r->Ack();
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  engine->Close();
  for (auto& w : workers) w.join();
  CHECK(cancelled.load() == 2);
  for (Message& m : kept) {
    (void)m.InProgress();
    (void)m.Ack();
  }
  kept.clear();
  engine.reset();
  CHECK(payload.use_count() == 1);
}
