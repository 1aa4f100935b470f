// Adversarial tests of the engine's delivery and scheduling features (dead letters,
// queue timeouts, QoS lanes, duplicate window, max_ack_pending, Call, Close).
//
// Test cases named "regression: ..." are the smallest reproducers of bugs found by
// adversarial testing (each comment block says what was wrong); they pass since the
// fixes. The rest are checks that held up and guard against regressions.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
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
using namespace std::chrono_literals;

using namespace inferq::engine_test;

// ---------------------------------------------------------------------------------
// Was bug 0 (fixed; this test keeps it fixed) (most severe): moving work off a stalled member loops forever when the work
// can only go back to the same lane. RunTimers (now timers.cpp, MoveOffStalledMembers) pops the stalled
// lane with `while (lane.ring.try_pop(d)) Redeliver(*c, d, m)`, and Redeliver falls
// back to `exclude` itself (pass 1) when no other lane takes the item: with one
// member, or with every other lane full, the item is pushed back onto the lane the
// loop is popping. The timer thread spins at 100% CPU (`moved` climbs without end)
// and no timer of any consumer runs again: no ack_wait expiry, no queue timeout,
// no call timeout. Found by the stress test below (max_ack_pending held every member
// back, so every lane looked stalled and all were full).
// ---------------------------------------------------------------------------------
TEST_CASE("regression: RunTimers never returns when a stalled member's work can only go back to its "
          "own lane (single member)", "[bug][stall][livelock]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .ack_wait = absl::Seconds(1)});
  REQUIRE(c.ok());
  REQUIRE(engine->Publish(Ev("work.a", "1")).ok());  // queued; the member does not pull
  engine->RunTimers();                                // marks the lane
  clock.Advance(absl::Seconds(1));
  auto run = std::async(std::launch::async, [&] { engine->RunTimers(); });  // stalled now
  const bool finished = run.wait_for(3s) == std::future_status::ready;
  const std::uint64_t moved = CS(*engine, "S", "c").moved;
  engine->Close();  // closed lanes refuse the push back, so the loop drains and ends
  run.get();
  INFO("moved " << moved);
  CHECK(finished);
  CHECK(moved <= 1);
}

TEST_CASE("regression: RunTimers never returns when every other member's lane is full",
          "[bug][stall][livelock]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 2, .lane_capacity = 2,
                               .ack_wait = absl::Seconds(1)});
  REQUIRE(c.ok());
  for (int i = 0; i < 4; ++i) REQUIRE(engine->Publish(Ev("work.a", std::to_string(i))).ok());
  engine->RunTimers();
  clock.Advance(absl::Seconds(1));
  auto run = std::async(std::launch::async, [&] { engine->RunTimers(); });
  const bool finished = run.wait_for(3s) == std::future_status::ready;
  engine->Close();
  run.get();
  CHECK(finished);
}

// ---------------------------------------------------------------------------------
// Was bug 1 (fixed; this test keeps it fixed): a dead letter takes the mutex of the stream that captures the dead-letter
// subject. When that is the consumer's own stream and a publisher is blocked on a
// full lane of the consumer (holding that mutex while it waits for the member to
// pull), the member's Term (or a max_deliver nak, or the timer's ack_wait expiry)
// waits for the mutex forever: the member never pulls again. Deadlock until Close().
// ---------------------------------------------------------------------------------
TEST_CASE("regression: Term deadlocks when the dead-letter subject is captured by the consumer's own "
          "stream and a publisher is blocked on the consumer's full lane",
          "[bug][deadlock]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .filter_subject = "work.in",
                               .lane_capacity = 2, .dead_letter_subject = "work.dead"});
  REQUIRE(c.ok());
  Member m = *c->member(0);
  REQUIRE(engine->Publish(Ev("work.in", "1")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  REQUIRE(engine->Publish(Ev("work.in", "2")).ok());
  REQUIRE(engine->Publish(Ev("work.in", "3")).ok());  // the lane (2) is full now
  std::thread publisher([&] { (void)engine->Publish(Ev("work.in", "4")); });  // blocks
  std::this_thread::sleep_for(200ms);
  auto term = std::async(std::launch::async, [&] { return held->Term("bad input"); });
  const bool finished = term.wait_for(3s) == std::future_status::ready;
  engine->Close();  // releases the publisher, and with it the Term
  publisher.join();
  (void)term.get();
  CHECK(finished);
}

TEST_CASE("regression: the ack_wait timer deadlocks on a max_deliver dead letter to the consumer's "
          "own stream while a publisher is blocked on its full lane",
          "[bug][deadlock]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .filter_subject = "work.in",
                               .lane_capacity = 2, .ack_wait = absl::Seconds(1),
                               .max_deliver = 1, .dead_letter_subject = "work.dead"});
  REQUIRE(c.ok());
  Member m = *c->member(0);
  REQUIRE(engine->Publish(Ev("work.in", "1")).ok());
  auto held = m.Next(absl::ZeroDuration());  // never acked
  REQUIRE(held.ok());
  REQUIRE(engine->Publish(Ev("work.in", "2")).ok());
  REQUIRE(engine->Publish(Ev("work.in", "3")).ok());
  std::thread publisher([&] { (void)engine->Publish(Ev("work.in", "4")); });  // blocks
  std::this_thread::sleep_for(200ms);
  clock.Advance(absl::Seconds(2));
  auto timers = std::async(std::launch::async, [&] { engine->RunTimers(); });
  const bool finished = timers.wait_for(3s) == std::future_status::ready;
  engine->Close();
  publisher.join();
  timers.get();
  CHECK(finished);
}

// ---------------------------------------------------------------------------------
// Was bug 2 (fixed; this test keeps it fixed): a dead letter is a copy of the event *including its msg_id*, published with
// the normal duplicate check. The stream capturing the dead-letter subject therefore
// drops it as a duplicate (default window 2 minutes) whenever it already accepted
// that msg_id: a second consumer's dead letter of the same message, or any dead
// letter captured by the original stream. The publish "succeeds" (duplicate), so
// dead_letters_lost stays 0: the dead letter silently vanishes.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: dead letters of one message from two consumers: the second is dropped as a "
          "duplicate msg_id", "[bug][dead-letter]") {
  Fixture f;
  Member a = f.Add({.name = "a", .dead_letter_subject = "dead.S"});
  Member b = f.Add({.name = "b", .dead_letter_subject = "dead.S"});
  REQUIRE(f.engine.Publish(Ev("work.x", "order-17")).ok());
  auto ra = a.Next(absl::ZeroDuration());
  auto rb = b.Next(absl::ZeroDuration());
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  REQUIRE(ra->Term("a says no").ok());
  REQUIRE(rb->Term("b says no").ok());
  CHECK(CS(f.engine, "S", "a").dead_letters == 1);
  CHECK(CS(f.engine, "S", "b").dead_letters == 1);
  CHECK(CS(f.engine, "S", "b").dead_letters_lost == 0);  // "not lost"...
  std::vector<std::string> consumers;
  for (;;) {
    auto r = f.dlq.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    consumers.push_back(H(r->event(), kConsumerHeader));
    REQUIRE(r->Ack().ok());
  }
  CHECK(SS(f.engine, "DLQ").duplicates == 0);
  CHECK(consumers == std::vector<std::string>{"a", "b"});
}

TEST_CASE("regression: a dead letter captured by the original stream is dropped as a duplicate of "
          "the original event", "[bug][dead-letter]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .filter_subject = "work.in",
                               .dead_letter_subject = "work.dead"});
  auto d = engine->AddConsumer({.stream = "S", .name = "dead", .filter_subject = "work.dead"});
  REQUIRE(c.ok());
  REQUIRE(d.ok());
  REQUIRE(engine->Publish(Ev("work.in", "job-1")).ok());
  auto r = c->member(0)->Next(absl::ZeroDuration());
  REQUIRE(r.ok());
  REQUIRE(r->Term("poison").ok());
  CHECK(CS(*engine, "S", "c").dead_letters == 1);
  CHECK(CS(*engine, "S", "c").dead_letters_lost == 0);
  auto dl = d->member(0)->Next(absl::ZeroDuration());
  CHECK(dl.ok());
  CHECK(SS(*engine, "S").duplicates == 0);
}

// ---------------------------------------------------------------------------------
// Was bug 3 (fixed; this test keeps it fixed): a message the stream discarded (max_msgs, discard old) while it waited in a
// lane is skipped when pulled, but its queue-timeout entry is left behind: when the
// timeout passes, the timer dead-letters it ("expired") although the consumer never
// had it and the stream already removed it (counted as skipped AND expired).
// ---------------------------------------------------------------------------------
TEST_CASE("regression: a message discarded by the stream is still dead-lettered as expired by its "
          "queue timeout", "[bug][queue-timeout]") {
  ManualClock clock{1'000'000'000};
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}, .max_msgs = 1}).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  auto dq = engine->AddConsumer({.stream = "DLQ", .name = "dlq"});
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .dead_letter_subject = "dead.c",
                               .queue_timeout = absl::Milliseconds(100)});
  REQUIRE(dq.ok());
  REQUIRE(c.ok());
  Member m = *c->member(0);
  REQUIRE(engine->Publish(Ev("work.a", "A")).ok());
  REQUIRE(engine->Publish(Ev("work.a", "B")).ok());  // max_msgs 1: A is discarded
  CHECK(Drain(m) == std::vector<std::string>{"B"});
  CHECK(CS(*engine, "S", "c").skipped == 1);
  clock.Advance(absl::Milliseconds(200));
  engine->RunTimers();
  const ConsumerStats cs = CS(*engine, "S", "c");
  CHECK(cs.expired == 0);
  CHECK(cs.dead_letters == 0);
  Member dm = *dq->member(0);
  CHECK(Drain(dm).empty());
}

// ---------------------------------------------------------------------------------
// Was bug 4 (fixed; this test keeps it fixed): with a QoS lane whose tier is bounded (QosTierConfig::max_items), a lane
// below its capacity but with the tier full refuses the push; TryPublish and
// overflow kReject only check size < capacity, so instead of refusing the publish
// they store it and park the delivery ("parked"), and Publish returns OK.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: TryPublish on a QoS lane whose tier is at max_items stores and parks instead "
          "of refusing", "[bug][qos]") {
  Fixture f;
  QosConfig qos;
  qos.tiers[2].max_items = 1;  // at most one bronze item queued
  (void)f.Add({.lane_capacity = 8, .qos = qos});
  REQUIRE(f.engine.Publish(Tiered("b0", Qos::kBronze, "t")).ok());
  auto r = f.engine.TryPublish(Tiered("b1", Qos::kBronze, "t"));
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(SS(f.engine, "S").stored == 1);
  CHECK(CS(f.engine, "S", "c").parked == 0);
}

TEST_CASE("regression: overflow reject on a QoS lane whose tier is at max_items stores and parks "
          "instead of refusing", "[bug][qos]") {
  Fixture f;
  QosConfig qos;
  qos.tiers[2].max_items = 1;
  (void)f.Add({.lane_capacity = 8, .overflow = OverflowPolicy::kReject, .qos = qos});
  REQUIRE(f.engine.Publish(Tiered("b0", Qos::kBronze, "t")).ok());
  auto r = f.engine.Publish(Tiered("b1", Qos::kBronze, "t"));
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(CS(f.engine, "S", "c").overflow_rejected == 1);
  CHECK(CS(f.engine, "S", "c").parked == 0);
}

// ---------------------------------------------------------------------------------
// Was bug 5 (fixed; this test keeps it fixed): RegisterFunction validates the options one by one but not their product:
// workers x queue_capacity over 2^24 lane slots passes validation, adds streams
// FN_<id> and FN_<id>_DLQ, then fails in AddConsumer with an error about "consumer
// 'handler': members ... x lane_capacity" (not the option names). The streams stay,
// so the id can never be registered (AlreadyExists). Same when FN_<id>_DLQ exists.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: a RegisterFunction that fails leaves its streams behind and the id unusable",
          "[bug][call]") {
  auto engine = Engine::Create().value();
  auto h = [](const Event&) -> absl::StatusOr<Buffer> { return Buffer(); };
  absl::Status s = engine->RegisterFunction("f", h, {.workers = 256, .queue_capacity = 1 << 20});
  REQUIRE(!s.ok());
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  INFO(Msg(s));
  CHECK(Msg(s).find("workers") != std::string::npos);
  CHECK(engine->Stats().streams.empty());
  absl::Status again = engine->RegisterFunction("f", h);     // valid options now
  INFO(Msg(again));
  CHECK(again.ok());

  REQUIRE(engine->AddStream({.name = "FN_g_DLQ", .subjects = {"other.g"}}).ok());
  CHECK(!engine->RegisterFunction("g", h).ok());
  const EngineStats st = engine->Stats();
  CHECK(st.stream("FN_g") == nullptr);
}

// ---------------------------------------------------------------------------------
// Was bug 6 (fixed; this test keeps it fixed) (lower severity): stall detection ignores max_ack_pending. A member that
// cannot pull because the consumer is at max_ack_pending (the engine refuses it a
// slot) is taken as stalled after ack_wait: its queued work is moved to another
// member and each move counts as a failure of its health, every ack_wait.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: a member held back by max_ack_pending is treated as stalled and its work moved "
          "as failures", "[bug][stall]") {
  Fixture f;
  auto c = f.engine.AddConsumer({.stream = "S", .name = "c", .members = 2,
                                 .ack_wait = absl::Seconds(1), .max_ack_pending = 1});
  REQUIRE(c.ok());
  Member m0 = *c->member(0), m1 = *c->member(1);
  for (int i = 0; i < 4; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto held = m0.Next(absl::ZeroDuration());  // takes the only slot; m1 may not pull
  REQUIRE(held.ok());
  CHECK(m1.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  f.engine.RunTimers();
  for (int i = 0; i < 3; ++i) {
    f.clock.Advance(absl::Milliseconds(600));
    REQUIRE(held->InProgress().ok());  // the long task is alive
    f.engine.RunTimers();
  }
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.ack_timeouts == 0);
  CHECK(cs.moved == 0);
  CHECK(cs.group.members[1].health == MemberHealth::kHealthy);
  REQUIRE(held->Ack().ok());
}

// ---------------------------------------------------------------------------------
// Checks that held up (no bug found): concurrency and accounting.
// ---------------------------------------------------------------------------------

TEST_CASE("stress: ack/nak/term/InProgress/expiry/backoff/max_deliver with the timer running: "
          "every message ends acked or dead-lettered once, and the accounting returns to 0",
          "[stress]") {
  auto engine = Engine::Create().value();  // steady clock, background timer
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"},
                            .retention = RetentionPolicy::kInterest}).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 4, .lane_capacity = 64,
                               .ack_wait = absl::Milliseconds(20),
                               .backoff = {absl::Milliseconds(5), absl::Milliseconds(10),
                                           absl::Milliseconds(15)},
                               .max_deliver = 4, .max_ack_pending = 48,
                               .dead_letter_subject = "dead.c"});
  REQUIRE(c.ok());
  auto d = engine->AddConsumer({.stream = "DLQ", .name = "d", .lane_capacity = 1 << 16});
  REQUIRE(d.ok());
  constexpr int kPublishers = 4, kPer = 1500, kN = kPublishers * kPer;
  std::atomic<bool> stop{false};
  std::mutex dl_mu;
  std::multiset<std::string> dead;
  std::thread drainer([&] {
    Member dm = *d->member(0);
    while (!stop.load()) {
      auto r = dm.Next(absl::Milliseconds(5));
      if (!r.ok()) continue;
      {
        std::lock_guard l(dl_mu);
        dead.insert(r->event().msg_id);
      }
      (void)r->Ack();
    }
  });
  std::vector<std::thread> members;
  for (std::uint32_t i = 0; i < 4; ++i) {
    members.emplace_back([&, i] {
      Member m = *c->member(i);
      std::mt19937 rng(i * 7919 + 1);
      while (!stop.load()) {
        auto r = m.Next(absl::Milliseconds(5));
        if (!r.ok()) continue;
        const int p = static_cast<int>(rng() % 100);
        if (p < 55) {
          (void)r->Ack();
        } else if (p < 65) {
          (void)r->Nak();
        } else if (p < 72) {
          (void)r->Nak(absl::Milliseconds(rng() % 3));
        } else if (p < 75) {
          (void)r->Term("stress");
        } else if (p < 85) {
          (void)r->InProgress();
          (void)r->Ack();
        } else if (p < 92) {
          // dropped without settling: the ack wait expires
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 12));
          (void)r->Ack();  // maybe late (another delivery may have won)
        }
      }
    });
  }
  std::vector<std::thread> pubs;
  std::atomic<int> pub_failed{0};
  for (int p = 0; p < kPublishers; ++p) {
    pubs.emplace_back([&, p] {
      for (int i = 0; i < kPer; ++i) {
        if (!engine->Publish(Ev("work.x", std::to_string(p) + "-" + std::to_string(i))).ok()) {
          pub_failed.fetch_add(1);
        }
      }
    });
  }
  const auto until = std::chrono::steady_clock::now() + 60s;
  ConsumerStats cs;
  bool converged = false;
  for (;;) {
    cs = CS(*engine, "S", "c");
    if (cs.acked + cs.dead_letters >= kN) converged = true;
    if (converged || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(10ms);
  }
  // Was bug 0 (fixed; this test keeps it fixed) shows here now and then (about 1 run in 30 on 2 cores): every member waits
  // for a max_ack_pending slot, every lane is full and looks stalled, and the timer
  // thread loops forever moving work back onto the same lane, so nothing converges.
  // Close() breaks the loop so that the test fails instead of hanging.
  INFO("moved " << cs.moved);
  CHECK(converged);
  if (!converged) engine->Close();
  for (auto& t : pubs) t.join();
  CHECK(pub_failed.load() == 0);
  // Let the DLQ drain.
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard l(dl_mu);
      if (dead.size() >= cs.dead_letters) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::this_thread::sleep_for(100ms);  // late redeliveries, if any, would show now
  stop.store(true);
  for (auto& t : members) t.join();
  drainer.join();
  cs = CS(*engine, "S", "c");
  INFO("acked " << cs.acked << " dead " << cs.dead_letters << " lost " << cs.dead_letters_lost
                << " naks " << cs.naks << " timeouts " << cs.ack_timeouts << " late "
                << cs.late_acks << " skipped " << cs.skipped << " parked " << cs.parked);
  CHECK(cs.acked + cs.dead_letters == static_cast<std::uint64_t>(kN));
  CHECK(cs.dead_letters_lost == 0);
  CHECK(cs.ack_pending == 0);
  for (const auto& mm : cs.group.members) CHECK(mm.outstanding == 0);
  CHECK(dead.size() == cs.dead_letters);
  std::set<std::string> unique(dead.begin(), dead.end());
  CHECK(unique.size() == dead.size());
  CHECK(SS(*engine, "S").messages == 0);
  engine->Close();
}

TEST_CASE("stress: pullers waiting for a max_ack_pending slot are woken by acks on another thread",
          "[stress]") {
  // Unsettle notifies only while a puller waits (slot_waiters): a lost wake-up leaves
  // a puller asleep until its 30 s timeout, which fails the test (a wake-up normally
  // takes microseconds; 30 s is far beyond what load 10 on 2 cores delays it).
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  // One member pulled by four threads: a puller that holds the slot always finds a
  // message until the last one (with a lane per puller, one whose lane ran empty
  // would hold the only slot while the others wait: the engine's semantics, not a
  // lost wake-up).
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 1, .lane_capacity = 4096,
                                .max_ack_pending = 1});
  REQUIRE(c.ok());
  constexpr int kN = 2000;
  for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Ev("work.a")).ok());
  std::mutex mu;
  std::vector<Message> handed;  // pulled, for the acker thread
  std::atomic<int> pulled{0}, timed_out{0}, other_errors{0};
  std::vector<std::thread> pullers;
  for (std::uint32_t i = 0; i < 4; ++i) {
    pullers.emplace_back([&] {
      Member m = *c->member(0);
      for (;;) {
        auto r = m.Next(absl::Seconds(30));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kDeadlineExceeded) timed_out.fetch_add(1);
          else if (r.status().code() != absl::StatusCode::kCancelled) other_errors.fetch_add(1);
          return;  // Cancelled: the engine closed after the last ack
        }
        pulled.fetch_add(1);
        std::lock_guard lock(mu);
        handed.push_back(*std::move(r));
      }
    });
  }
  int acked = 0;
  std::thread acker([&] {
    while (acked < kN && timed_out.load() == 0) {
      std::vector<Message> batch;
      {
        std::lock_guard lock(mu);
        batch.swap(handed);
      }
      for (Message& m : batch) {
        if (m.Ack().ok()) ++acked;
      }
      if (batch.empty()) std::this_thread::yield();
    }
  });
  acker.join();
  engine->Close();  // wakes the pullers still waiting for a slot: Cancelled
  for (auto& t : pullers) t.join();
  CHECK(timed_out.load() == 0);
  CHECK(other_errors.load() == 0);
  CHECK(acked == kN);
  CHECK(pulled.load() == kN);
}

TEST_CASE("stress: max_ack_pending is never exceeded by several pullers", "[stress]") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  constexpr std::int64_t kLimit = 5;
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 6, .lane_capacity = 32,
                               .max_ack_pending = kLimit});
  REQUIRE(c.ok());
  std::atomic<int> held{0}, peak{0}, done{0};
  constexpr int kN = 6000;
  std::vector<std::thread> members;
  for (std::uint32_t i = 0; i < 6; ++i) {
    members.emplace_back([&, i] {
      Member m = *c->member(i);
      std::mt19937 rng(i + 3);
      for (;;) {
        std::vector<Message> got;
        if (i % 2 == 0) {
          auto r = m.Next(absl::Milliseconds(20));
          if (r.ok()) got.push_back(*std::move(r));
        } else {
          auto b = m.NextBatch(4, absl::Microseconds(200), absl::Milliseconds(20));
          if (b.ok()) got = *std::move(b);
        }
        if (got.empty()) {
          if (done.load() >= kN) return;
          continue;
        }
        const int h = held.fetch_add(static_cast<int>(got.size())) + static_cast<int>(got.size());
        int p = peak.load();
        while (h > p && !peak.compare_exchange_weak(p, h)) {}
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        for (Message& msg : got) {
          held.fetch_sub(1);
          if (rng() % 10 == 0) {
            (void)msg.Nak();
          } else {
            (void)msg.Ack();
            done.fetch_add(1);
          }
        }
      }
    });
  }
  for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Ev("work.a")).ok());
  for (auto& t : members) t.join();
  CHECK(peak.load() <= kLimit);
  const ConsumerStats cs = CS(*engine, "S", "c");
  CHECK(cs.ack_pending == 0);
  CHECK(cs.acked == static_cast<std::uint64_t>(kN));
}

TEST_CASE("stress: the same msg_ids published from 8 threads are stored exactly once",
          "[stress]") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "T", .subjects = {"work.>"}}).ok());  // its own window
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 1 << 14});
  REQUIRE(c.ok());
  constexpr int kIds = 2000, kThreads = 8;
  std::atomic<int> dup_acks{0};
  std::vector<std::thread> pubs;
  for (int t = 0; t < kThreads; ++t) {
    pubs.emplace_back([&, t] {
      for (int i = 0; i < kIds; ++i) {
        const int id = (i + t * 97) % kIds;
        auto r = engine->Publish(Ev("work.a", "id-" + std::to_string(id)));
        REQUIRE(r.ok());
        // Streams are locked one at a time, so a racing publish may find the id in S
        // and store it in T first: per stream, still exactly one is stored.
        CHECK(r->streams_duplicate + r->streams_stored == 2);
        dup_acks.fetch_add(static_cast<int>(r->streams_duplicate));
      }
    });
  }
  for (auto& t : pubs) t.join();
  CHECK(SS(*engine, "S").stored == kIds);
  CHECK(SS(*engine, "T").stored == kIds);
  CHECK(SS(*engine, "S").duplicates == kIds * (kThreads - 1));
  CHECK(SS(*engine, "T").duplicates == kIds * (kThreads - 1));
  CHECK(dup_acks.load() == 2 * kIds * (kThreads - 1));
  Member m = *c->member(0);
  std::set<std::string> got;
  for (const std::string& id : Drain(m)) CHECK(got.insert(id).second);
  CHECK(got.size() == static_cast<std::size_t>(kIds));
}

TEST_CASE("stress: Close during publishes, pulls, naks, slot waits and timers returns and "
          "wakes everyone", "[stress]") {
  for (int round = 0; round < 5; ++round) {
    auto engine = Engine::Create().value();
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"},
                               .retention = RetentionPolicy::kInterest}).ok());
    REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
    QosConfig qos;
    qos.preemption = true;
    auto c = engine->AddConsumer({.stream = "S", .name = "c", .members = 3, .lane_capacity = 4,
                                  .ack_wait = absl::Milliseconds(3), .max_deliver = 3,
                                  .max_ack_pending = 2, .dead_letter_subject = "dead.c",
                                  .queue_timeout = absl::Milliseconds(2)});
    auto q = engine->AddConsumer({.stream = "S", .name = "q", .members = 2, .lane_capacity = 4,
                                  .ack_wait = absl::Milliseconds(4),
                                  .dead_letter_subject = "dead.q",
                                  .timeout_action = TimeoutAction::kDelay, .qos = qos});
    auto d = engine->AddConsumer({.stream = "DLQ", .name = "d", .lane_capacity = 2});
    REQUIRE(c.ok());
    REQUIRE(q.ok());
    REQUIRE(d.ok());
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int p = 0; p < 3; ++p) {
      threads.emplace_back([&, p] {
        std::mt19937 rng(p);
        for (int i = 0; !stop.load(); ++i) {
          Event e = Ev("work.a", std::to_string(p) + "-" + std::to_string(i));
          e.qos = static_cast<Qos>(rng() % 3);
          e.priority = static_cast<int>(rng() % 4);
          e.tenant = "t" + std::to_string(rng() % 5);
          if (rng() % 5 == 0) e.ttl = absl::Milliseconds(1);
          auto r = (i % 3 == 0) ? engine->TryPublish(std::move(e)) : engine->Publish(std::move(e));
          if (!r.ok() && r.status().code() == absl::StatusCode::kCancelled) return;
        }
      });
    }
    auto puller = [&](Consumer cons, std::uint32_t i, unsigned seed) {
      Member m = *cons.member(i);
      std::mt19937 rng(seed);
      for (;;) {
        auto r = m.Next(absl::Milliseconds(50));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kCancelled) return;
          if (stop.load()) return;
          continue;
        }
        switch (rng() % 5) {
          case 0: (void)r->Nak(); break;
          case 1: (void)r->Nak(absl::Milliseconds(1)); break;
          case 2: (void)r->Term(); break;
          case 3: break;
          default: (void)r->Ack();
        }
      }
    };
    for (std::uint32_t i = 0; i < 3; ++i) threads.emplace_back(puller, *c, i, 10 + i);
    for (std::uint32_t i = 0; i < 2; ++i) threads.emplace_back(puller, *q, i, 20 + i);
    threads.emplace_back(puller, *d, 0, 30);
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 40 * round));
    auto closed = std::async(std::launch::async, [&] { engine->Close(); });
    const bool ok = closed.wait_for(10s) == std::future_status::ready;
    CHECK(ok);
    stop.store(true);
    if (!ok) {
      // Leak the engine and threads rather than hang the suite.
      for (auto& t : threads) t.detach();
      (void)engine.release();
      FAIL("Close did not return");
    }
    closed.get();
    auto joined = std::async(std::launch::async, [&] { for (auto& t : threads) t.join(); });
    const bool all_joined = joined.wait_for(10s) == std::future_status::ready;
    REQUIRE(all_joined);
    engine.reset();
  }
}

TEST_CASE("stress: concurrent Calls with failing, throwing and slow handlers all complete",
          "[stress][call]") {
  std::atomic<int> running{0};  // outlives the engine: handlers may run after Close
  auto engine = Engine::Create().value();
  REQUIRE(engine->RegisterFunction(
      "f",
      [&](const Event& e) -> absl::StatusOr<Buffer> {
        running.fetch_add(1);
        struct Dec { std::atomic<int>& r; ~Dec() { r.fetch_sub(1); } } dec{running};
        const std::string p(reinterpret_cast<const char*>(e.payload.data()), e.payload.size());
        const int k = std::stoi(p);
        switch (k % 6) {
          case 0: return absl::UnavailableError("busy");
          case 1: throw std::runtime_error("boom");
          case 2: std::this_thread::sleep_for(std::chrono::milliseconds(k % 7)); break;
          case 3: return absl::InternalError("always");
          default: break;
        }
        return e.payload;
      },
      {.workers = 4, .queue_capacity = 64, .max_deliver = 2}).ok());
  constexpr int kThreads = 8, kPer = 150;
  std::vector<std::thread> callers;
  std::atomic<int> ok{0}, deadline{0}, failed{0}, wrong{0}, other{0};
  std::mutex other_mu;
  std::vector<std::string> others;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      std::vector<std::pair<int, std::future<absl::StatusOr<Buffer>>>> fs;
      for (int i = 0; i < kPer; ++i) {
        const int k = t * kPer + i;
        const std::string s = std::to_string(k);
        fs.emplace_back(k, engine->Call("f", Buffer::FromString(s),
                                       absl::Milliseconds(2 + k % 20)));
      }
      for (auto& [k, f] : fs) {
        if (f.wait_for(20s) != std::future_status::ready) {
          other.fetch_add(1000000);
          continue;
        }
        absl::StatusOr<Buffer> r = f.get();
        if (r.ok()) {
          const std::string p(reinterpret_cast<const char*>(r->data()), r->size());
          (p == std::to_string(k) ? ok : wrong).fetch_add(1);
        } else if (r.status().code() == absl::StatusCode::kDeadlineExceeded) {
          deadline.fetch_add(1);
        } else if (k % 6 == 0 || k % 6 == 1 || k % 6 == 3) {
          failed.fetch_add(1);
        } else {
          other.fetch_add(1);
          std::lock_guard l(other_mu);
          others.push_back(std::to_string(k) + ": " + r.status().ToString());
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  INFO("ok " << ok << " deadline " << deadline << " failed " << failed << " other " << other);
  CHECK(wrong.load() == 0);
  for (std::size_t i = 0; i < others.size() && i < 5; ++i) UNSCOPED_INFO(others[i]);
  CHECK(other.load() == 0);
  CHECK(ok + deadline + failed == kThreads * kPer);
  engine->Close();  // a handler may still run: Close does not wait for it
  CHECK(Eventually([&] { return CS(*engine, "FN_f", "handler").ack_pending == 0; }));
}

// ---------------------------------------------------------------------------------
// Was bug 7 (fixed; this test keeps it fixed) (lower severity, consistency): with QosConfig::preemption a blocking Publish
// of a higher priority evicts the lowest queued item of its tier from a full lane,
// but TryPublish (and overflow kReject) refuse before the scheduler is asked, by
// size == capacity alone: the same event is accepted by Publish and refused by
// TryPublish although neither would wait.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: TryPublish of a higher priority is refused by a full preemptive QoS lane that "
          "Publish would evict from without waiting", "[bug][qos]") {
  Fixture f;
  QosConfig qos;
  qos.preemption = true;
  (void)f.Add({.lane_capacity = 2, .qos = qos});
  REQUIRE(f.engine.Publish(Tiered("low-a", Qos::kBronze, "t", 0)).ok());
  REQUIRE(f.engine.Publish(Tiered("low-b", Qos::kBronze, "t", 0)).ok());
  auto r = f.engine.TryPublish(Tiered("high", Qos::kBronze, "t", 5));
  INFO(Msg(r.status()));
  CHECK(r.ok());
  CHECK(CS(f.engine, "S", "c").evicted == 1);
}

// ---------------------------------------------------------------------------------
// Was bug 8 (fixed; this test keeps it fixed; a use-after-free, seen under ASan): Close() from inside a
// function handler detaches that worker and cancels every open call, the running one
// included. A caller that sees its future completed (Cancelled) and destroys the
// Engine frees the ConsumerState that the detached worker then uses (Ack, Next) when
// the handler returns.  Run: adversarial_delivery_test "[use-after-free]"
// ---------------------------------------------------------------------------------
TEST_CASE("regression: Close from a handler, then destroying the engine, is a use-after-free in the "
          "detached worker", "[bug][call][use-after-free]") {
  auto engine = Engine::Create().value();
  Engine* raw = engine.get();
  std::atomic<bool> returned{false};
  REQUIRE(engine->RegisterFunction("f", [raw, &returned](const Event& e) -> absl::StatusOr<Buffer> {
    raw->Close();  // e.g. a "shutdown" function
    std::this_thread::sleep_for(200ms);
    returned.store(true);
    return e.payload;
  }).ok());
  auto fut = engine->Call("f", Buffer::FromString("x"), absl::Seconds(10));
  REQUIRE(fut.wait_for(10s) == std::future_status::ready);
  CHECK(fut.get().status().code() == absl::StatusCode::kCancelled);
  CHECK(!returned.load());  // the handler is still running in the detached worker...
  engine.reset();           // ...and the engine is destroyed under it
  std::this_thread::sleep_for(500ms);  // the worker now Acks into freed memory
}

TEST_CASE("configuration and argument errors of the new fields name the value and change "
          "nothing") {
  Fixture f;
  auto err = [&](ConsumerConfig cc) {
    cc.stream = "S";
    cc.name = "bad";
    absl::StatusOr<Consumer> c = f.engine.AddConsumer(cc);
    return c.ok() ? std::string("<ok>") : Msg(c.status());
  };
  CHECK(err({.ack_wait = absl::InfiniteDuration()}).find("ack_wait inf") != std::string::npos);
  CHECK(err({.ack_wait = -absl::Nanoseconds(1)}).find("ack_wait -1ns") != std::string::npos);
  CHECK(err({.backoff = std::vector<absl::Duration>(65, absl::Seconds(1))})
            .find("backoff has 65 entries") != std::string::npos);
  CHECK(err({.backoff = {absl::InfiniteDuration()}}).find("backoff[0] = inf") != std::string::npos);
  CHECK(err({.backoff = {absl::Hours(24 * 365) + absl::Nanoseconds(1)}}).find("backoff[0]") !=
        std::string::npos);
  CHECK(err({.max_deliver = -2}).find("max_deliver -2") != std::string::npos);
  CHECK(err({.max_ack_pending = 0}).find("max_ack_pending 0") != std::string::npos);
  CHECK(err({.ack = AckPolicy::kNone, .max_ack_pending = 1}) ==
        "consumer 'bad': max_ack_pending 1 needs explicit acks (ack policy is none)");
  CHECK(err({.ack = AckPolicy::kNone, .dead_letter_subject = "dead.x"}) ==
        "consumer 'bad': dead_letter_subject 'dead.x' needs explicit acks (ack policy is none)");
  CHECK(err({.dead_letter_subject = "dead.*"}).find("dead_letter_subject") != std::string::npos);
  CHECK(err({.dead_letter_subject = "dead.>"}).find("dead_letter_subject") != std::string::npos);
  CHECK(err({.queue_timeout = absl::InfiniteDuration()}).find("queue_timeout inf") !=
        std::string::npos);
  CHECK(err({.queue_timeout = -absl::Seconds(1)}).find("queue_timeout -1s") != std::string::npos);
  CHECK(err({.timeout_action = static_cast<TimeoutAction>(9)}).find("timeout action 9") !=
        std::string::npos);
  QosConfig q;
  q.tiers[0].max_items = 5;
  CHECK(err({.lane_capacity = 4, .qos = q}).rfind("consumer 'bad': ", 0) == 0);
  QosConfig q2;
  q2.tiers[1].weight = 0;
  CHECK(err({.qos = q2}).rfind("consumer 'bad': ", 0) == 0);
  QosConfig q3;
  q3.tiers[0].assured_share = 0.7;
  q3.tiers[1].assured_share = 0.7;
  CHECK(err({.qos = q3}).rfind("consumer 'bad': ", 0) == 0);
  CHECK(f.engine.Stats().consumers.size() == 1);  // only the DLQ consumer

  auto pub_err = [&](Event e) {
    auto r = f.engine.Publish(std::move(e));
    return r.ok() ? std::string("<ok>") : Msg(r.status());
  };
  Event e1 = Ev("work.a");
  e1.ttl = absl::InfiniteDuration();
  CHECK(pub_err(e1).find("ttl inf") != std::string::npos);
  Event e2 = Ev("work.a");
  e2.ttl = -absl::Milliseconds(1);
  CHECK(pub_err(e2).find("ttl -1ms") != std::string::npos);
  Event e3 = Ev("work.a");
  e3.qos = static_cast<Qos>(3);
  CHECK(pub_err(e3).find("qos 3") != std::string::npos);
  Event e4 = Ev("work.a");
  e4.qos = static_cast<Qos>(255);
  CHECK(pub_err(e4).find("qos 255") != std::string::npos);
  CHECK(SS(f.engine, "S").stored == 0);

  auto h = [](const Event&) -> absl::StatusOr<Buffer> { return Buffer(); };
  CHECK(Msg(f.engine.RegisterFunction("g", h, {.workers = 0})).find("workers 0") != std::string::npos);
  CHECK(Msg(f.engine.RegisterFunction("g", h, {.workers = 257})).find("workers 257") != std::string::npos);
  CHECK(Msg(f.engine.RegisterFunction("g", h, {.queue_capacity = 0})).find("queue_capacity 0") !=
        std::string::npos);
  CHECK(Msg(f.engine.RegisterFunction("g", h, {.max_deliver = 0})).find("max_deliver 0") !=
        std::string::npos);
  CHECK(Msg(f.engine.RegisterFunction("g", h, {.max_deliver = 101})).find("max_deliver 101") !=
        std::string::npos);
  CHECK(!f.engine.RegisterFunction("g.h", h).ok());
  CHECK(!f.engine.RegisterFunction(std::string(49, 'a'), h).ok());
  CHECK(!f.engine.RegisterFunction("g", FunctionHandler{}).ok());
  CHECK(f.engine.Stats().streams.size() == 2);
  REQUIRE(f.engine.RegisterFunction("g", h).ok());
  for (absl::Duration t : {absl::ZeroDuration(), -absl::Seconds(1), absl::InfiniteDuration(),
                           absl::Hours(24 * 365) + absl::Nanoseconds(1)}) {
    auto fut = f.engine.Call("g", Buffer(), t);
    REQUIRE(fut.wait_for(1s) == std::future_status::ready);
    CHECK(fut.get().status().code() == absl::StatusCode::kInvalidArgument);
  }
  auto nf = f.engine.Call("nope", Buffer(), absl::Seconds(1));
  CHECK(nf.get().status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("queue timeouts: deadline in the past, delay with everything expired, requeue on a "
          "full lane, QoS lanes") {
  Fixture f;
  Member m = f.Add({.filter_subject = "work.a", .lane_capacity = 4,
                    .dead_letter_subject = "dead.c", .queue_timeout = absl::Milliseconds(10),
                    .timeout_action = TimeoutAction::kDelay});
  for (int i = 0; i < 4; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  f.clock.Advance(absl::Milliseconds(20));
  f.engine.RunTimers();  // every one expired: delay
  std::vector<std::string> got = Drain(m);
  CHECK(got.size() == 4);  // each moved behind the others once, all delivered
  ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.delayed == 4);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].outstanding == 0);

  // Deadline already in the past with reject: dead-lettered at the next timer run.
  Member r = f.Add({.name = "r", .filter_subject = "work.r", .dead_letter_subject = "dead.r"});
  Event past = Ev("work.r", "past");
  past.deadline = absl::Now() - absl::Hours(1);
  REQUIRE(f.engine.Publish(std::move(past)).ok());
  Event far = Ev("work.r", "far");
  far.deadline = absl::Now() + absl::Hours(24 * 365 * 100);
  REQUIRE(f.engine.Publish(std::move(far)).ok());
  Event inf_past = Ev("work.r", "infpast");
  inf_past.deadline = absl::InfinitePast();
  REQUIRE(f.engine.Publish(std::move(inf_past)).ok());
  f.engine.RunTimers();
  CHECK(Drain(r) == std::vector<std::string>{"far"});
  cs = CS(f.engine, "S", "r");
  CHECK(cs.expired == 2);
  CHECK(cs.dead_letters == 2);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].outstanding == 0);

  // QoS lane, reject: expired ones are skipped, the rest served by tier.
  QosConfig qos;
  Member q = f.Add({.name = "q", .filter_subject = "work.q", .lane_capacity = 8,
                    .queue_timeout = absl::Milliseconds(5), .qos = qos});
  for (int i = 0; i < 4; ++i) {
    Event e = Ev("work.q", "q" + std::to_string(i));
    e.qos = static_cast<Qos>(i % 3);
    if (i % 2 == 0) e.ttl = absl::Milliseconds(1);
    REQUIRE(f.engine.Publish(std::move(e)).ok());
  }
  f.clock.Advance(absl::Milliseconds(2));
  f.engine.RunTimers();
  std::vector<std::string> qs = Drain(q);
  std::sort(qs.begin(), qs.end());
  CHECK(qs == std::vector<std::string>{"q1", "q3"});
  cs = CS(f.engine, "S", "q");
  CHECK(cs.expired == 2);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].outstanding == 0);
}

// ---------------------------------------------------------------------------------
// Was a stats defect (found by an adversarial helper; fixed in DropQueued): an event
// whose queue timeout gave it up (counted expired, dead-lettered) while it still sat
// in a full lane was counted again as dropped when drop-oldest made room, or as
// evicted when a higher priority pushed it out: one event, two ends.
// ---------------------------------------------------------------------------------
TEST_CASE("regression: an event its queue timeout gave up is not counted again when drop-oldest "
          "or preemption removes it from the lane", "[bug]") {
  Fixture f;
  SECTION("drop-oldest") {
    Member m = f.Add({.lane_capacity = 2, .overflow = OverflowPolicy::kDropOldest,
                      .queue_timeout = absl::Milliseconds(1)});
    REQUIRE(f.engine.Publish(Ev("work.a", "1")).ok());
    REQUIRE(f.engine.Publish(Ev("work.a", "2")).ok());
    f.clock.Advance(absl::Milliseconds(5));
    f.engine.RunTimers();
    ConsumerStats cs = CS(f.engine, "S", "c");
    REQUIRE(cs.expired == 2);
    REQUIRE(cs.dead_letters == 2);
    REQUIRE(f.engine.Publish(Ev("work.a", "3")).ok());
    REQUIRE(f.engine.Publish(Ev("work.a", "4")).ok());
    CHECK(Drain(m) == std::vector<std::string>{"3", "4"});
    cs = CS(f.engine, "S", "c");
    CHECK(cs.expired == 2);
    CHECK(cs.dropped == 0);
    CHECK(cs.delivered == 2);
    CHECK(cs.delivered + cs.dropped + cs.expired + cs.skipped == 4);
    CHECK(cs.group.members[0].outstanding == 0);
  }
  SECTION("QoS preemption") {
    QosConfig qos;
    qos.preemption = true;
    Member m = f.Add({.lane_capacity = 2, .queue_timeout = absl::Milliseconds(1), .qos = qos});
    REQUIRE(f.engine.Publish(Tiered("low-a", Qos::kBronze, "t", 0)).ok());
    REQUIRE(f.engine.Publish(Tiered("low-b", Qos::kBronze, "t", 0)).ok());
    f.clock.Advance(absl::Milliseconds(5));
    f.engine.RunTimers();
    REQUIRE(CS(f.engine, "S", "c").expired == 2);
    REQUIRE(f.engine.Publish(Tiered("high", Qos::kBronze, "t", 5)).ok());
    CHECK(Drain(m) == std::vector<std::string>{"high"});
    const ConsumerStats cs = CS(f.engine, "S", "c");
    CHECK(cs.expired == 2);
    CHECK(cs.evicted == 0);
    CHECK(cs.delivered == 1);
    CHECK(cs.group.members[0].outstanding == 0);
  }
}
