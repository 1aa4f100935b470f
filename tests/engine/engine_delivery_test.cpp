// Delivery guarantees: nak with delay, term, backoff, max_deliver, max_ack_pending,
// dead letters, overflow policies, TryPublish and TryPublishBatch.
#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <atomic>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/engine/engine.hpp"
#include "engine_test_util.hpp"

using namespace inferq;

using namespace inferq::engine_test;

TEST_CASE("nak with a delay redelivers only when the delay has passed") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(30)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto first = m.Next(absl::ZeroDuration());
  REQUIRE(first.ok());
  REQUIRE(first->Nak(absl::Milliseconds(500)).ok());
  f.clock.Advance(absl::Milliseconds(499));
  f.engine.RunTimers();
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Milliseconds(1));
  f.engine.RunTimers();
  auto again = m.Next(absl::ZeroDuration());
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  CHECK(again->event().msg_id == "x");
  REQUIRE(again->Ack().ok());
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.naks == 1);
  CHECK(cs.redelivered == 1);
  CHECK(cs.acked == 1);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.ack_timeouts == 0);
}

TEST_CASE("nak with a delay works without ack_wait, and with the background timer") {
  auto engine = Engine::Create().value();  // steady clock, timer thread
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(c.ok());
  Member m = *c->member(0);
  REQUIRE(engine->Publish(Ev("work.a", "x")).ok());
  auto first = m.Next(absl::Seconds(5));
  REQUIRE(first.ok());
  REQUIRE(first->Nak(absl::Milliseconds(20)).ok());
  auto again = m.Next(absl::Seconds(10));  // the timer thread wakes for the delay
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  REQUIRE(again->Ack().ok());
}

TEST_CASE("a delayed redelivery is dropped when an older delivery acks first") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(1)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto first = m.Next(absl::ZeroDuration());
  REQUIRE(first.ok());
  f.clock.Advance(absl::Seconds(1));
  f.engine.RunTimers();  // expiry: attempt 2 queued
  auto second = m.Next(absl::ZeroDuration());
  REQUIRE(second.ok());
  REQUIRE(second->attempt() == 2);
  REQUIRE(second->Nak(absl::Seconds(5)).ok());  // attempt 3 due in 5 s
  CHECK(first->Nak().ok());                     // an old delivery's nak changes nothing
  REQUIRE(first->Ack().code() == absl::StatusCode::kFailedPrecondition);
  f.clock.Advance(absl::Seconds(5));
  f.engine.RunTimers();
  auto third = m.Next(absl::ZeroDuration());
  REQUIRE(third.ok());
  CHECK(third->attempt() == 3);
}

TEST_CASE("term sends the message to the dead-letter subject with its reason") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(30), .dead_letter_subject = "dead.S.c"});
  Event e = Ev("work.a", "x");
  e.headers.Set("k", "v");
  e.payload = Buffer::FromString("payload");
  REQUIRE(f.engine.Publish(std::move(e)).ok());
  auto msg = m.Next(absl::ZeroDuration());
  REQUIRE(msg.ok());
  REQUIRE(msg->Term("bad prompt").ok());
  CHECK(Msg(msg->Ack()) ==
        "message 1 of stream 'S' was already settled (ack, nak or term) by consumer 'c'");
  auto dead = f.dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  const Event& d = dead->event();
  CHECK(d.subject == "dead.S.c");
  CHECK(d.msg_id == "x");
  CHECK(d.payload.view() == "payload");
  CHECK(H(d, "k") == "v");
  CHECK(H(d, kDeadLetterReasonHeader) == "term");
  CHECK(H(d, kDeadLetterDescriptionHeader) == "bad prompt");
  CHECK(H(d, kDeliveryCountHeader) == "1");
  CHECK(H(d, kStreamHeader) == "S");
  CHECK(H(d, kConsumerHeader) == "c");
  CHECK(H(d, kStreamSeqHeader) == "1");
  CHECK(H(d, kOriginalSubjectHeader) == "work.a");
  f.clock.Advance(absl::Minutes(5));
  f.engine.RunTimers();
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.terminated == 1);
  CHECK(cs.dead_letters == 1);
  CHECK(cs.dead_letters_lost == 0);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.redelivered == 0);
  CHECK(cs.group.members[0].failures == 0);  // term is the member's decision, not its failure
}

TEST_CASE("max_deliver: the failing message is dead-lettered; its batch neighbours are unaffected") {
  Fixture f;
  Member m = f.Add({.max_deliver = 3, .dead_letter_subject = "dead.S.c"});
  for (const char* id : {"a", "b", "c"}) REQUIRE(f.engine.Publish(Ev("work.x", id)).ok());
  auto batch = m.NextBatch(3, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 3);
  REQUIRE((*batch)[0].Ack().ok());
  REQUIRE((*batch)[1].Nak().ok());
  REQUIRE((*batch)[2].Ack().ok());
  std::vector<std::uint32_t> attempts;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    CHECK(r->event().msg_id == "b");
    attempts.push_back(r->attempt());
    REQUIRE(r->Nak().ok());
  }
  CHECK(attempts == std::vector<std::uint32_t>{2, 3});
  auto dead = f.dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  CHECK(dead->event().msg_id == "b");
  CHECK(H(dead->event(), kDeadLetterReasonHeader) == "max_deliver");
  CHECK(H(dead->event(), kDeliveryCountHeader) == "3");
  CHECK(H(dead->event(), kStreamSeqHeader) == "2");
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.acked == 2);
  CHECK(cs.naks == 3);
  CHECK(cs.redelivered == 2);
  CHECK(cs.dead_letters == 1);
  CHECK(cs.ack_pending == 0);
}

TEST_CASE("backoff sets the ack wait of each delivery; ack_wait expiry counts toward max_deliver") {
  Fixture f;
  Member m = f.Add({.backoff = {absl::Seconds(1), absl::Seconds(5)},
                    .max_deliver = 3,
                    .dead_letter_subject = "dead.S.c"});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto pull = [&] { return m.Next(absl::ZeroDuration()); };
  REQUIRE(pull().ok());  // attempt 1: ack wait 1 s
  f.clock.Advance(absl::Milliseconds(999));
  f.engine.RunTimers();
  CHECK(pull().status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Milliseconds(1));
  f.engine.RunTimers();
  auto second = pull();
  REQUIRE(second.ok());
  CHECK(second->attempt() == 2);  // ack wait 5 s
  f.clock.Advance(absl::Seconds(4));
  f.engine.RunTimers();
  CHECK(pull().status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Seconds(1));
  f.engine.RunTimers();
  auto third = pull();
  REQUIRE(third.ok());
  CHECK(third->attempt() == 3);  // the last entry repeats: 5 s
  f.clock.Advance(absl::Seconds(5));
  f.engine.RunTimers();
  CHECK(pull().status().code() == absl::StatusCode::kDeadlineExceeded);
  auto dead = f.dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  CHECK(H(dead->event(), kDeadLetterReasonHeader) == "max_deliver");
  CHECK(H(dead->event(), kDeadLetterDescriptionHeader) == "ack_wait expired");
  CHECK(H(dead->event(), kDeliveryCountHeader) == "3");
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.ack_timeouts == 3);
  CHECK(cs.dead_letters == 1);
  CHECK(cs.ack_pending == 0);
  // The late ack of a dead-lettered delivery is a no-op.
  CHECK(third->Ack().ok());
  CHECK(CS(f.engine, "S", "c").acked == 0);
}

TEST_CASE("max_ack_pending stops pulls until an ack frees a slot") {
  Fixture f;
  Member m = f.Add({.max_ack_pending = 2});
  for (int i = 0; i < 4; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto a = m.Next(absl::ZeroDuration());
  auto b = m.Next(absl::ZeroDuration());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const absl::Status blocked = m.Next(absl::Milliseconds(1)).status();
  CHECK(blocked.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Msg(blocked) ==
        "consumer 'c' has max_ack_pending 2 deliveries unacknowledged; member 0 got no "
        "message before the timeout");
  CHECK(m.queued() == 2);  // nothing was taken off the lane
  REQUIRE(a->Ack().ok());
  auto c = m.Next(absl::ZeroDuration());
  REQUIRE(c.ok());
  CHECK(c->event().msg_id == "2");
  CHECK(CS(f.engine, "S", "c").ack_pending == 2);
  // A puller waiting for a slot wakes when another thread acks.
  std::atomic<bool> got{false};
  std::thread waiter([&] { got = m.Next(absl::Seconds(30)).ok(); });
  REQUIRE(b->Ack().ok());
  waiter.join();
  CHECK(got.load());
}

TEST_CASE("max_ack_pending: a batch never takes more than the free slots") {
  Fixture f;
  Member m = f.Add({.max_ack_pending = 3});
  for (int i = 0; i < 5; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto batch = m.NextBatch(5, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(batch.ok());
  CHECK(batch->size() == 3);
  CHECK(CS(f.engine, "S", "c").ack_pending == 3);
}

TEST_CASE("close wakes a puller waiting for a max_ack_pending slot") {
  Fixture f;
  Member m = f.Add({.max_ack_pending = 1});
  REQUIRE(f.engine.Publish(Ev("work.a")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  absl::Status result;
  std::thread waiter([&] { result = m.Next(absl::InfiniteDuration()).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  f.engine.Close();
  waiter.join();
  CHECK(result.code() == absl::StatusCode::kCancelled);
}

TEST_CASE("overflow reject refuses the publish and stores nothing") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2, .overflow = OverflowPolicy::kReject});
  REQUIRE(f.engine.Publish(Ev("work.a", "1")).ok());
  REQUIRE(f.engine.Publish(Ev("work.a", "2")).ok());
  const auto third = f.engine.Publish(Ev("work.a", "3"));
  CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Msg(third.status()) ==
        "stream 'S': lane of consumer 'c' member 0 is full (2 queued; overflow reject)");
  CHECK(SS(f.engine, "S").messages == 2);
  CHECK(SS(f.engine, "S").last_seq == 2);
  CHECK(CS(f.engine, "S", "c").overflow_rejected == 1);
  REQUIRE(m.Next(absl::ZeroDuration()).ok());
  CHECK(f.engine.Publish(Ev("work.a", "4")).ok());
}

TEST_CASE("overflow drop-oldest keeps the newest and counts the dropped") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2, .ack_wait = absl::Seconds(1),
                    .overflow = OverflowPolicy::kDropOldest});
  for (int i = 1; i <= 5; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  std::vector<std::string> got;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
    REQUIRE(r->Ack().ok());
  }
  CHECK(got == std::vector<std::string>{"4", "5"});
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.dropped == 3);
  CHECK(cs.acked == 2);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].outstanding == 0);
}

TEST_CASE("drop-oldest under interest retention retires what no consumer will ack") {
  ManualClock clock(1);
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"},
                            .retention = RetentionPolicy::kInterest}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 2,
                               .overflow = OverflowPolicy::kDropOldest});
  REQUIRE(c.ok());
  for (int i = 1; i <= 4; ++i) REQUIRE(engine->Publish(Ev("work.a", std::to_string(i))).ok());
  CHECK(SS(*engine, "S").messages == 2);
  CHECK(SS(*engine, "S").acked_out == 2);
}

TEST_CASE("TryPublish refuses a full blocking lane instead of waiting") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2});
  REQUIRE(f.engine.TryPublish(Ev("work.a", "1")).ok());
  REQUIRE(f.engine.TryPublish(Ev("work.a", "2")).ok());
  const auto third = f.engine.TryPublish(Ev("work.a", "3"));
  CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Msg(third.status()) ==
        "stream 'S': lane of consumer 'c' member 0 is full (2 queued; overflow block, and "
        "TryPublish does not wait)");
  CHECK(SS(f.engine, "S").messages == 2);
  REQUIRE(m.Next(absl::ZeroDuration()).ok());
  CHECK(f.engine.TryPublish(Ev("work.a", "3")).ok());
}

TEST_CASE("a dead letter to a full lane is parked, not lost, and a dead letter with no subject is counted") {
  Fixture f;
  // The DLQ consumer's lane holds 2; three messages are terminated.
  REQUIRE(f.engine.AddStream({.name = "DLQ2", .subjects = {"dead2.>"}}).ok());
  auto d2 = f.engine.AddConsumer({.stream = "DLQ2", .name = "d", .lane_capacity = 2});
  REQUIRE(d2.ok());
  Member m = f.Add({.name = "c", .dead_letter_subject = "dead2.c"});
  Member n = f.Add({.name = "n"});  // no dead-letter subject
  for (int i = 0; i < 3; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  for (int i = 0; i < 3; ++i) {
    auto r = m.Next(absl::ZeroDuration());
    REQUIRE(r.ok());
    REQUIRE(r->Term().ok());
    auto q = n.Next(absl::ZeroDuration());
    REQUIRE(q.ok());
    REQUIRE(q->Term().ok());
  }
  Member dm = *d2->member(0);
  std::vector<std::string> got;
  for (;;) {
    auto r = dm.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
  }
  CHECK(got == std::vector<std::string>{"0", "1", "2"});
  CHECK(CS(f.engine, "DLQ2", "d").parked == 1);
  CHECK(CS(f.engine, "S", "c").dead_letters_lost == 0);
  CHECK(CS(f.engine, "S", "n").dead_letters == 3);
  CHECK(CS(f.engine, "S", "n").dead_letters_lost == 3);
}

TEST_CASE("delivery configuration errors name the value and change nothing") {
  Fixture f;
  auto err = [&](ConsumerConfig cc) {
    cc.stream = "S";
    cc.name = "bad";
    return Msg(f.engine.AddConsumer(cc).status());
  };
  CHECK(err({.backoff = {absl::Seconds(1), absl::ZeroDuration()}}) ==
        "consumer 'bad': backoff[1] = 0 is invalid (each entry > 0 and at most 365 days)");
  CHECK(err({.max_deliver = 0}) ==
        "consumer 'bad': max_deliver 0 is invalid (use -1 for no limit or a value >= 1)");
  CHECK(err({.max_ack_pending = -2}) ==
        "consumer 'bad': max_ack_pending -2 is invalid (use -1 for no limit or a value >= 1)");
  CHECK(err({.ack = AckPolicy::kNone, .max_deliver = 3}) ==
        "consumer 'bad': max_deliver 3 needs explicit acks (ack policy is none)");
  CHECK(err({.ack = AckPolicy::kNone, .backoff = {absl::Seconds(1)}}) ==
        "consumer 'bad': backoff needs explicit acks (ack policy is none)");
  CHECK(err({.dead_letter_subject = "dead..x"}).rfind("consumer 'bad': dead_letter_subject: ", 0) == 0);
  CHECK(err({.overflow = static_cast<OverflowPolicy>(7)}) ==
        "consumer 'bad': overflow policy 7 is not a valid OverflowPolicy");
  CHECK(err({.overflow = OverflowPolicy::kDropOldest, .qos = QosConfig{}}) ==
        "consumer 'bad': overflow drop-oldest needs a FIFO lane; with qos use reject, block, "
        "or QosConfig::preemption (a higher priority evicts the lowest)");
  QosConfig bad_qos;
  bad_qos.quantum = 0;
  CHECK(err({.qos = bad_qos}) == "consumer 'bad': qos quantum 0 is outside 1..1048576");
  CHECK(err({.batch = {.max_batch = 0}}).rfind("consumer 'bad': ", 0) == 0);
  CHECK(f.engine.Stats().consumers.size() == 1);  // only the fixture's DLQ consumer

  Member m = f.Add({});
  REQUIRE(f.engine.Publish(Ev("work.a")).ok());
  auto r = m.Next(absl::ZeroDuration());
  REQUIRE(r.ok());
  CHECK(Msg(r->Nak(absl::Seconds(-1))) ==
        "Nak delay -1s is invalid (zero for at once, or up to 365 days)");
  CHECK(!r->acked());  // still unsettled: the bad nak changed nothing
  CHECK(r->Ack().ok());
}

TEST_CASE("a queue timeout fires while the request is still queued behind a busy member") {
  Fixture f;
  Member m = f.Add({.dead_letter_subject = "dead.S.c", .queue_timeout = absl::Milliseconds(100)});
  REQUIRE(f.engine.Publish(Ev("work.a", "A")).ok());
  REQUIRE(f.engine.Publish(Ev("work.a", "B")).ok());
  auto busy = m.Next(absl::ZeroDuration());  // the member works on A and pulls nothing else
  REQUIRE(busy.ok());
  f.clock.Advance(absl::Milliseconds(99));
  f.engine.RunTimers();
  CHECK(f.dlq.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Milliseconds(1));
  f.engine.RunTimers();
  // B expired while queued: the dead letter is out before the member comes back.
  auto dead = f.dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  CHECK(dead->event().msg_id == "B");
  CHECK(H(dead->event(), kDeadLetterReasonHeader) == "expired");
  CHECK(H(dead->event(), kDeadLetterDescriptionHeader) == "queue timeout");
  CHECK(H(dead->event(), kDeliveryCountHeader) == "0");
  CHECK(CS(f.engine, "S", "c").expired == 1);
  REQUIRE(busy->Ack().ok());
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.delivered == 1);
  CHECK(cs.dead_letters == 1);
  CHECK(cs.group.members[0].outstanding == 0);
}

TEST_CASE("an event can lower the consumer's queue timeout but never raise it") {
  Fixture f;
  Member m = f.Add({.queue_timeout = absl::Seconds(1)});
  Event shorter = Ev("work.a", "short");
  shorter.ttl = absl::Milliseconds(100);
  Event longer = Ev("work.a", "long");
  longer.ttl = absl::Seconds(5);
  REQUIRE(f.engine.Publish(std::move(shorter)).ok());
  REQUIRE(f.engine.Publish(std::move(longer)).ok());
  REQUIRE(f.engine.Publish(Ev("work.a", "plain")).ok());
  f.clock.Advance(absl::Milliseconds(100));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").expired == 1);
  f.clock.Advance(absl::Milliseconds(899));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").expired == 1);
  f.clock.Advance(absl::Milliseconds(1));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").expired == 3);  // "long" is held to the consumer's 1 s
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(CS(f.engine, "S", "c").dead_letters_lost == 3);  // no dead-letter subject
}

TEST_CASE("without a consumer default, the event's ttl and deadline apply") {
  Fixture f;
  Member m = f.Add({});
  Event e = Ev("work.a", "ttl");
  e.ttl = absl::Milliseconds(50);
  Event past = Ev("work.a", "past");
  past.deadline = absl::Now() - absl::Seconds(1);
  REQUIRE(f.engine.Publish(std::move(e)).ok());
  REQUIRE(f.engine.Publish(std::move(past)).ok());
  REQUIRE(f.engine.Publish(Ev("work.a", "none")).ok());
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").expired == 1);  // the past deadline
  f.clock.Advance(absl::Milliseconds(50));
  // Not even a timer run: a pull finds the ttl passed and gives the event up.
  auto r = m.Next(absl::ZeroDuration());
  REQUIRE(r.ok());
  CHECK(r->event().msg_id == "none");
  CHECK(CS(f.engine, "S", "c").expired == 2);
}

TEST_CASE("timeout action delay moves an expired request behind the queue, once") {
  Fixture f;
  Member m = f.Add({.queue_timeout = absl::Milliseconds(10),
                    .timeout_action = TimeoutAction::kDelay});
  REQUIRE(f.engine.Publish(Ev("work.a", "A")).ok());
  f.clock.Advance(absl::Milliseconds(5));
  REQUIRE(f.engine.Publish(Ev("work.a", "B")).ok());
  REQUIRE(f.engine.Publish(Ev("work.a", "C")).ok());
  f.clock.Advance(absl::Milliseconds(5));
  f.engine.RunTimers();  // A expired (delay); B and C have 5 ms left
  std::vector<std::string> got;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
    REQUIRE(r->Ack().ok());
  }
  CHECK(got == std::vector<std::string>{"B", "C", "A"});
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.delayed == 1);
  CHECK(cs.expired == 0);
  CHECK(cs.acked == 3);
}

TEST_CASE("bad ttl, qos and queue timeout are refused and change nothing") {
  Fixture f;
  Event neg = Ev("work.a");
  neg.ttl = absl::Seconds(-1);
  CHECK(Msg(f.engine.Publish(std::move(neg)).status()) ==
        "event ttl -1s is invalid (zero for none, or up to 365 days)");
  Event q = Ev("work.a");
  q.qos = static_cast<Qos>(9);
  CHECK(Msg(f.engine.Publish(std::move(q)).status()) ==
        "event qos 9 is not a tier (0 gold, 1 silver, 2 bronze)");
  CHECK(SS(f.engine, "S").stored == 0);
  CHECK(Msg(f.engine.AddConsumer({.stream = "S", .name = "x",
                                  .queue_timeout = absl::Milliseconds(-1)}).status()) ==
        "consumer 'x': queue_timeout -1ms is invalid (zero for none, or up to 365 days)");
}

TEST_CASE("duplicate window: a msg_id seen within the window is acked with the original sequence") {
  Fixture f;  // stream S keeps the default window, 2 minutes
  Member m = f.Add({});
  auto first = f.engine.Publish(Ev("work.a", "id-1"));
  REQUIRE(first.ok());
  CHECK(first->seq == 1);
  CHECK(!first->duplicate);
  f.clock.Advance(absl::Seconds(30));
  auto dup = f.engine.Publish(Ev("work.b", "id-1"));
  REQUIRE(dup.ok());
  CHECK(dup->duplicate);
  CHECK(dup->seq == 1);
  CHECK(dup->streams_stored == 0);
  CHECK(dup->streams_duplicate == 1);
  CHECK(dup->deliveries == 0);
  CHECK(SS(f.engine, "S").stored == 1);
  CHECK(SS(f.engine, "S").duplicates == 1);
  auto r = m.Next(absl::ZeroDuration());
  REQUIRE(r.ok());
  CHECK(r->event().subject == "work.a");
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("duplicate window keys are exact bytes") {
  Fixture f;
  std::vector<std::uint64_t> seqs;
  for (const char* id : {"a", "A", "a ", " a", "a\n"}) {
    auto ack = f.engine.Publish(Ev("work.a", id));
    REQUIRE(ack.ok());
    CHECK(!ack->duplicate);
    seqs.push_back(ack->seq);
  }
  CHECK(seqs == std::vector<std::uint64_t>{1, 2, 3, 4, 5});
  auto again = f.engine.Publish(Ev("work.a", "A"));
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(again->seq == 2);
  // An empty msg_id is never a duplicate.
  CHECK(!f.engine.Publish(Ev("work.a", "")).value().duplicate);
  CHECK(!f.engine.Publish(Ev("work.a", "")).value().duplicate);
}

TEST_CASE("duplicate window is fixed from the first acceptance; duplicates do not extend it") {
  Fixture f;
  REQUIRE(f.engine.Publish(Ev("work.a", "k")).ok());               // t = 0, seq 1
  f.clock.Advance(absl::Seconds(100));
  CHECK(f.engine.Publish(Ev("work.a", "k")).value().duplicate);   // t = 100 s
  f.clock.Advance(absl::Seconds(20) - absl::Nanoseconds(1));
  auto last = f.engine.Publish(Ev("work.a", "k"));                 // t = 2 min - 1 ns
  REQUIRE(last.ok());
  CHECK(last->duplicate);
  CHECK(last->seq == 1);
  f.clock.Advance(absl::Nanoseconds(1));
  auto fresh = f.engine.Publish(Ev("work.a", "k"));                // t = 2 min: a new message
  REQUIRE(fresh.ok());
  CHECK(!fresh->duplicate);
  CHECK(fresh->seq == 2);
  f.clock.Advance(absl::Seconds(1));
  auto dup = f.engine.Publish(Ev("work.a", "k"));
  CHECK(dup.value().duplicate);
  CHECK(dup.value().seq == 2);
}

TEST_CASE("duplicate window per stream, and off when zero") {
  ManualClock clock(1);
  auto engine = Engine::Create({.clock = &clock, .manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "A", .subjects = {"x.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "B", .subjects = {"x.>"},
                            .duplicate_window = absl::ZeroDuration()}).ok());
  auto first = engine->Publish(Ev("x.1", "id"));
  REQUIRE(first.ok());
  CHECK(first->streams_stored == 2);
  auto second = engine->Publish(Ev("x.1", "id"));
  REQUIRE(second.ok());
  CHECK(second->duplicate);
  CHECK(second->seq == 1);            // stream A's original
  CHECK(second->streams_duplicate == 1);
  CHECK(second->streams_stored == 1); // stream B keeps no window
  CHECK(SS(*engine, "B").stored == 2);
  CHECK(Msg(engine->AddStream({.name = "C", .subjects = {"y"},
                              .duplicate_window = absl::Seconds(-5)})) ==
        "stream 'C': duplicate_window -5s is invalid (zero for off, or up to 365 days)");
}

TEST_CASE("a QoS lane serves by tier shares and tenant DRR, not arrival order") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 64, .qos = QosConfig{}});
  for (int i = 0; i < 6; ++i) REQUIRE(f.engine.Publish(Tiered("b" + std::to_string(i), Qos::kBronze, "flood")).ok());
  REQUIRE(f.engine.Publish(Tiered("g0", Qos::kGold, "acme")).ok());
  REQUIRE(f.engine.Publish(Tiered("g1", Qos::kGold, "beta")).ok());
  std::vector<std::string> got;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
    REQUIRE(r->Ack().ok());
  }
  REQUIRE(got.size() == 8);
  // Gold goes ahead of the bronze queued before it. b0 is a floor pick (bronze has
  // had 0 of its assured 5 % of the window); then gold's weight 8 : 1 takes g1.
  // Bronze keeps its order.
  CHECK(got == std::vector<std::string>{"g0", "b0", "g1", "b1", "b2", "b3", "b4", "b5"});
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.qos_tiers[0].served == 2);
  CHECK(cs.qos_tiers[2].served == 6);
}

TEST_CASE("QoS preemption: a higher priority evicts the lowest of its tier from a full lane") {
  Fixture f;
  QosConfig qos;
  qos.preemption = true;
  Member m = f.Add({.lane_capacity = 2, .ack_wait = absl::Seconds(1), .qos = qos});
  REQUIRE(f.engine.Publish(Tiered("low-a", Qos::kBronze, "t", 0)).ok());
  REQUIRE(f.engine.Publish(Tiered("low-b", Qos::kBronze, "t", 0)).ok());
  // Equal priority never evicts: the blocking publish would wait, TryPublish refuses.
  CHECK(f.engine.TryPublish(Tiered("low-c", Qos::kBronze, "t", 0)).status().code() ==
        absl::StatusCode::kResourceExhausted);
  REQUIRE(f.engine.Publish(Tiered("high", Qos::kBronze, "t", 5)).ok());
  std::vector<std::string> got;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
    REQUIRE(r->Ack().ok());
  }
  CHECK(got == std::vector<std::string>{"high", "low-a"});
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.evicted == 1);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].outstanding == 0);
}

TEST_CASE("requests that queued while the member was busy form one batch, not 1 then 4") {
  Fixture f;
  Member m = f.Add({.batch = {.max_batch = 8}});
  for (int i = 0; i < 5; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto batch = m.NextBatch(absl::ZeroDuration());
  REQUIRE(batch.ok());
  CHECK(batch->size() == 5);
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.batches == 1);
  CHECK(cs.batches_by_size[2] == 1);  // [4, 8)
}

TEST_CASE("both NextBatch forms are counted in batches by the size they returned") {
  // Was: only NextBatch(timeout) counted (through its batcher's decisions).
  Fixture f;
  Member m = f.Add({.batch = {.max_batch = 8}});
  for (int i = 0; i < 3; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto explicit_form = m.NextBatch(2, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(explicit_form.ok());
  CHECK(explicit_form->size() == 2);
  auto policy_form = m.NextBatch(absl::ZeroDuration());
  REQUIRE(policy_form.ok());
  CHECK(policy_form->size() == 1);
  for (int i = 3; i < 12; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto nine = m.NextBatch(100, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(nine.ok());
  CHECK(nine->size() == 9);
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.batches == 3);
  CHECK(cs.batches_by_size[0] == 1);  // 1
  CHECK(cs.batches_by_size[1] == 1);  // [2, 4)
  CHECK(cs.batches_by_size[3] == 1);  // [8, 16)
  CHECK(cs.members[0].delivered == 12);
}

TEST_CASE("preferred batch sizes dispatch at once; the rest waits for max_queue_delay") {
  Fixture f;
  Member m = f.Add({.batch = {.max_batch = 8,
                              .max_queue_delay = absl::Milliseconds(5),
                              .preferred_batch_sizes = {4}}});
  for (int i = 0; i < 6; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto first = m.NextBatch(absl::ZeroDuration());
  REQUIRE(first.ok());
  CHECK(first->size() == 4);
  // Two are left: no preferred size, so the batcher waits out the 5 ms (real time:
  // the manual clock does not move, so the wait runs out on its steady deadline).
  auto second = m.NextBatch(absl::ZeroDuration());
  REQUIRE(second.ok());
  CHECK(second->size() == 2);
  CHECK((*second)[0].event().msg_id == "4");
}

TEST_CASE("the adaptive window shrinks when acks come back slower than the baseline") {
  Fixture f;
  Member m = f.Add({.batch = {.max_batch = 8, .adaptive = true,
                              .baseline_rtt = absl::Milliseconds(10)}});
  for (int i = 0; i < 16; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  auto first = m.NextBatch(absl::ZeroDuration());
  REQUIRE(first.ok());
  CHECK(first->size() == 6);  // no RTT yet: ratio 1, window round(8 * 0.8) = 6
  f.clock.Advance(absl::Milliseconds(20));  // every ack 20 ms after delivery
  for (Message& msg : *first) REQUIRE(msg.Ack().ok());
  auto second = m.NextBatch(absl::ZeroDuration());
  REQUIRE(second.ok());
  CHECK(second->size() == 3);  // ratio 0.5: round(0.5 * 8 * 0.8) = 3
}

TEST_CASE("a QoS lane under a bronze backlog serves queued gold within its weighted share") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 256, .qos = QosConfig{}});
  for (int i = 0; i < 100; ++i) {
    REQUIRE(f.engine.Publish(Tiered("b" + std::to_string(i), Qos::kBronze, "flood")).ok());
  }
  for (int i = 0; i < 20; ++i) {
    REQUIRE(f.engine.Publish(Tiered("g" + std::to_string(i), Qos::kGold, i % 2 ? "acme" : "beta")).ok());
  }
  int gold_in_first_30 = 0;
  for (int i = 0; i < 30; ++i) {
    auto r = m.Next(absl::ZeroDuration());
    REQUIRE(r.ok());
    gold_in_first_30 += r->event().qos == Qos::kGold;
    REQUIRE(r->Ack().ok());
  }
  CHECK(gold_in_first_30 == 20);
}

TEST_CASE("flow control: publishes carry the throttle from memory and delay, and the reward's weight scale") {
  ManualClock clock(1);
  auto engine = Engine::Create({.clock = &clock,
                                .manual_timers = true,
                                .flow_control = FlowControlConfig{.memory_budget_bytes = 1000,
                                                                  .latency_sla = absl::Milliseconds(10)}})
                    .value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(c.ok());
  auto publish = [&](int i) {
    Event e = Ev("work.a", std::to_string(i));
    e.payload = Buffer::FromString(std::string(594, 'x'));  // 600 bytes with the subject
    return engine->Publish(std::move(e));
  };
  for (int i = 0; i < 3; ++i) {
    auto ack = publish(i);
    REQUIRE(ack.ok());
    CHECK(ack->throttle == 0);  // the timer has not looked yet
  }
  engine->RunTimers();  // 1800 bytes kept: bp = 0.8, no delay yet: rt = 0
  auto ack = publish(3);
  REQUIRE(ack.ok());
  CHECK(ack->throttle == Approx(0.6 * 0.8));
  CHECK(ack->weight_scale == 1);
  clock.Advance(absl::Milliseconds(30));
  REQUIRE(c->member(0)->Next(absl::ZeroDuration()).ok());  // waited 30 ms: rt = 1
  engine->RunTimers();  // 2400 bytes kept: bp = 1
  ack = publish(4);
  REQUIRE(ack.ok());
  CHECK(ack->throttle == 1);
  REQUIRE(engine->SetReward(0.5).ok());
  CHECK(publish(5)->weight_scale == Approx(1.15));
  CHECK(std::string(engine->SetReward(2).message()).find("2") != std::string::npos);
  CHECK(engine->SetReward(2).code() == absl::StatusCode::kInvalidArgument);
  const EngineStats st = engine->Stats();
  REQUIRE(st.flow.has_value());
  CHECK(st.flow->throttle == 1);

  auto plain = Engine::Create().value();
  CHECK(plain->SetReward(0).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("every settle cancels the ack wait it ends: the consumer holds only live timers") {
  // Ack waits, delayed naks and queue timeouts share the consumer's timer wheel; a
  // settled delivery's timer is cancelled at once, not skipped when it comes due.
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Hours(1), .max_deliver = 5, .dead_letter_subject = "dead.c"});
  for (const char* id : {"a", "b", "c", "d"}) REQUIRE(f.engine.Publish(Ev("work.a", id)).ok());
  std::vector<Message> got;
  for (int i = 0; i < 4; ++i) {
    auto msg = m.Next(absl::ZeroDuration());
    REQUIRE(msg.ok());
    got.push_back(*std::move(msg));
  }
  CHECK(CS(f.engine, "S", "c").timers == 4);  // four ack waits
  REQUIRE(got[0].Ack().ok());
  CHECK(CS(f.engine, "S", "c").timers == 3);
  REQUIRE(got[1].Term("bad").ok());
  CHECK(CS(f.engine, "S", "c").timers == 2);
  REQUIRE(got[2].Nak().ok());  // redelivered at once: queued, no timer until pulled
  CHECK(CS(f.engine, "S", "c").timers == 1);
  REQUIRE(got[3].Nak(absl::Seconds(5)).ok());  // its ack wait gives way to the delay
  CHECK(CS(f.engine, "S", "c").timers == 1);
  auto again = m.Next(absl::ZeroDuration());  // "c", attempt 2: a new ack wait
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  CHECK(CS(f.engine, "S", "c").timers == 2);
  f.clock.Advance(absl::Seconds(5));
  f.engine.RunTimers();  // "d"'s delayed redelivery fires
  CHECK(CS(f.engine, "S", "c").timers == 1);
  auto late = m.Next(absl::ZeroDuration());
  REQUIRE(late.ok());
  CHECK(late->event().msg_id == "d");
  CHECK(late->attempt() == 2);
  CHECK(CS(f.engine, "S", "c").timers == 2);
  REQUIRE(again->Ack().ok());
  REQUIRE(late->Ack().ok());
  CHECK(CS(f.engine, "S", "c").timers == 0);
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.acked == 3);
  CHECK(cs.terminated == 1);
  CHECK(cs.naks == 2);
  CHECK(cs.ack_timeouts == 0);
}

TEST_CASE("InProgress many times with a long ack_wait keeps one timer") {
  // Each InProgress restarts the ack wait (a 1-day one: it never comes due during
  // the loop). The timer it replaces is cancelled, so the consumer holds exactly
  // one timer however often it is restarted (it once kept stale ones in a heap).
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Hours(24)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  for (int i = 0; i < 200'000; ++i) {
    f.clock.Advance(absl::Nanoseconds(1));  // every call a new deadline, a new timer
    REQUIRE(held->InProgress().ok());
  }
  CHECK(CS(f.engine, "S", "c").timers == 1);
  f.clock.Advance(absl::Hours(24) - absl::Nanoseconds(1));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  f.clock.Advance(absl::Nanoseconds(1));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);  // the last InProgress's deadline
}

// InProgress only moves a delivery's deadline; the timer set for the earlier one
// fires, finds it moved, and sets itself for the new one. Redelivery comes exactly
// ack_wait after the last InProgress, through any number of such early firings.
TEST_CASE("InProgress moves the ack wait: the early timer sets itself again and redelivery comes at the last deadline") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(1)});
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  auto held = m.Next(absl::ZeroDuration());
  REQUIRE(held.ok());
  f.clock.Advance(absl::Milliseconds(600));
  REQUIRE(held->InProgress().ok());  // deadline 1.6 s
  f.clock.Advance(absl::Milliseconds(400));  // 1.0 s: the first timer comes due
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  CHECK(CS(f.engine, "S", "c").timers == 1);
  f.clock.Advance(absl::Milliseconds(200));
  REQUIRE(held->InProgress().ok());  // 1.2 s: deadline 2.2 s
  f.clock.Advance(absl::Milliseconds(400));  // 1.6 s: the second comes due
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  f.clock.Advance(absl::Milliseconds(600) - absl::Nanoseconds(1));
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 0);
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  f.clock.Advance(absl::Nanoseconds(1));  // 2.2 s
  f.engine.RunTimers();
  CHECK(CS(f.engine, "S", "c").ack_timeouts == 1);
  auto again = m.Next(absl::ZeroDuration());
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  CHECK(held->Ack().ok());  // the first delivery's ack still settles it
  CHECK(CS(f.engine, "S", "c").acked == 1);
}

// Under interest retention a stream without a limit that removes live messages from
// its front (max_age; max_msgs or max_bytes with discard old) does not hold its
// messages: an acked message's memory goes when its last delivery ends, not at the
// next publish. With such a limit the stream holds it until a publish trims it.
TEST_CASE("interest retention frees an acked message when its delivery ends unless a front limit holds it") {
  struct Case {
    const char* name;
    StreamConfig stream;
    std::uint32_t held_after_ack;  // Buffer::use_count once the message is acked and dropped
  };
  std::vector<Case> cases;
  cases.push_back({"no limit", {.name = "W", .subjects = {"work.>"}}, 1});
  cases.push_back({"discard new with max_msgs", {.name = "W", .subjects = {"work.>"}}, 1});
  cases.back().stream.max_msgs = 10;
  cases.back().stream.discard = DiscardPolicy::kNew;
  cases.push_back({"max_age", {.name = "W", .subjects = {"work.>"}}, 2});
  cases.back().stream.max_age = absl::Hours(1);
  cases.push_back({"discard old with max_msgs", {.name = "W", .subjects = {"work.>"}}, 2});
  cases.back().stream.max_msgs = 10;
  for (Case& k : cases) {
    SECTION(k.name) {
      k.stream.retention = RetentionPolicy::kInterest;
      auto engine = Engine::Create({.manual_timers = true}).value();
      REQUIRE(engine->AddStream(k.stream).ok());
      Consumer c = engine->AddConsumer({.stream = "W", .name = "c"}).value();
      Member m = c.member(0).value();
      const Buffer payload = Buffer::Copy(std::as_bytes(std::span("abc", 3)));
      Event e = Ev("work.a");
      e.payload = payload;
      REQUIRE(engine->Publish(std::move(e)).ok());
      {
        Message msg = m.Next(absl::ZeroDuration()).value();
        CHECK(payload.use_count() == 2);
        REQUIRE(msg.Ack().ok());
      }
      CHECK(payload.use_count() == k.held_after_ack);
      CHECK(SS(*engine, "W").messages == 0);
      // The next publish trims it from a stream that holds it.
      REQUIRE(engine->Publish(Ev("work.b")).ok());
      CHECK(payload.use_count() == 1);
      REQUIRE(m.Next(absl::ZeroDuration()).value().Ack().ok());
      CHECK(SS(*engine, "W").messages == 0);
    }
  }
}

TEST_CASE("TryPublishBatch stops at the first event a stream refuses and leaves the rest as they were") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2});
  std::vector<Event> events{Ev("work.a", "1"), Ev("work.a", "2"), Ev("work.a", "3"), Ev("work.a", "4")};
  const auto results = f.engine.TryPublishBatch(std::span(events));
  REQUIRE(results.size() == 3);
  REQUIRE(results[0].ok());
  CHECK(results[0]->seq == 1);
  REQUIRE(results[1].ok());
  CHECK(results[1]->seq == 2);
  CHECK(results[2].status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(WouldBlock(results[2].status()));
  CHECK(events[3].msg_id == "4");  // not tried
  CHECK(SS(f.engine, "S").messages == 2);
  CHECK(Drain(m) == std::vector<std::string>{"1", "2"});
  // The caller goes on from the refused one, in order.
  const auto rest = f.engine.TryPublishBatch(std::span(events).subspan(3));
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].ok());
  CHECK(Drain(m) == std::vector<std::string>{"4"});
  CHECK(f.engine.TryPublishBatch({}).empty());
}

TEST_CASE("TryPublishBatch stops at an invalid event and at one no stream captures") {
  Fixture f;
  Member m = f.Add({});
  std::vector<Event> events{Ev("work.a", "1"), Ev("nowhere.a", "2"), Ev("work.a", "3")};
  auto results = f.engine.TryPublishBatch(std::span(events));
  REQUIRE(results.size() == 2);
  CHECK(results[0].ok());
  CHECK(results[1].status().code() == absl::StatusCode::kNotFound);
  CHECK(events[2].msg_id == "3");
  std::vector<Event> bad{Ev("work..a", "5"), Ev("work.a", "6")};
  results = f.engine.TryPublishBatch(std::span(bad));
  REQUIRE(results.size() == 1);
  CHECK(results[0].status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Drain(m) == std::vector<std::string>{"1"});
}

TEST_CASE("TryPublishBatch wakes a puller asleep on the lane once the batch is queued") {
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(c.ok());
  Member m = *c->member(0);
  std::vector<std::string> got;
  std::thread puller([&] {
    while (got.size() < 3) {
      auto r = m.Next(absl::Seconds(30));
      if (!r.ok()) return;
      got.push_back(r->event().msg_id);
      (void)r->Ack();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // asleep by now, most likely
  std::vector<Event> events{Ev("work.a", "1"), Ev("work.a", "2"), Ev("work.a", "3")};
  const auto results = engine->TryPublishBatch(std::span(events));
  puller.join();
  CHECK(results.size() == 3);
  CHECK(got == std::vector<std::string>{"1", "2", "3"});
}

TEST_CASE("TryPublishBatch under contention: every event delivered once, each publisher's in order") {
  constexpr int kPublishers = 2, kPerPublisher = 5'000, kBatch = 16;
  auto engine = Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"},
                             .retention = RetentionPolicy::kWorkQueue}).ok());
  auto c = engine->AddConsumer(
      {.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll, .lane_capacity = 8});
  REQUIRE(c.ok());
  Member m = *c->member(0);
  std::vector<std::string> got;
  std::thread puller([&] {
    while (got.size() < static_cast<std::size_t>(kPublishers) * kPerPublisher) {
      auto r = m.NextBatch(32, absl::ZeroDuration(), absl::Seconds(30));
      if (!r.ok()) return;
      for (Message& msg : *r) {
        got.push_back(msg.event().msg_id);
        (void)msg.Ack();
      }
    }
  });
  std::vector<std::thread> publishers;
  std::atomic<int> refused_other{0};
  for (int p = 0; p < kPublishers; ++p) {
    publishers.emplace_back([&, p] {
      std::vector<Event> events;
      for (int i = 0; i < kPerPublisher; ++i) {
        events.push_back(Ev("work.a", std::to_string(p) + ":" + std::to_string(i)));
      }
      std::size_t next = 0;
      while (next < events.size()) {
        const std::size_t n = std::min<std::size_t>(kBatch, events.size() - next);
        const auto results = engine->TryPublishBatch(std::span(events).subspan(next, n));
        next += results.size();
        if (!results.back().ok() || results.back()->streams_rejected > 0) {
          if (!results.back().ok() && !WouldBlock(results.back().status())) ++refused_other;
          --next;  // refused because the lane was full: that one again
          events[next] = Ev("work.a", std::to_string(p) + ":" + std::to_string(next));
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& t : publishers) t.join();
  puller.join();
  CHECK(refused_other == 0);
  REQUIRE(got.size() == static_cast<std::size_t>(kPublishers) * kPerPublisher);
  std::vector<int> last(kPublishers, -1);
  for (const std::string& id : got) {
    const auto colon = id.find(':');
    const int p = std::stoi(id.substr(0, colon));
    const int i = std::stoi(id.substr(colon + 1));
    REQUIRE(i == last[static_cast<std::size_t>(p)] + 1);  // in order, none lost, none twice
    last[static_cast<std::size_t>(p)] = i;
  }
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("NextBatch into a span fills its front and returns the count") {
  Fixture f;
  Member m = f.Add({});
  for (int i = 0; i < 5; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  std::array<Message, 3> out;
  absl::StatusOr<std::size_t> n = m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(n.ok());
  CHECK(*n == 3);
  CHECK(out[0].event().msg_id == "0");
  CHECK(out[1].event().msg_id == "1");
  CHECK(out[2].event().msg_id == "2");
  for (Message& msg : out) REQUIRE(msg.Ack().ok());
  // A batch smaller than the span leaves the slots after it as they were: acked
  // Messages, which the next batch's first slot (overwritten) gives up.
  n = m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(n.ok());
  CHECK(*n == 2);
  CHECK(out[0].event().msg_id == "3");
  CHECK(out[1].event().msg_id == "4");
  CHECK(!out[0].acked());
  CHECK(out[2].acked());
  CHECK(out[2].event().msg_id == "2");
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.batches == 2);
  CHECK(cs.batches_by_size[1] == 2);  // 3 and 2: [2, 4)
  CHECK(cs.members[0].delivered == 5);
}

TEST_CASE("NextBatch into a span: errors as the vector form, and an empty span") {
  Fixture f;
  Member m = f.Add({});
  std::array<Message, 2> out;
  absl::StatusOr<std::size_t> n = m.NextBatch(std::span<Message>(), absl::ZeroDuration());
  CHECK(n.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(n.status()) == "NextBatch into an empty span: it must hold at least one Message");
  n = m.NextBatch(out, absl::Milliseconds(-1), absl::ZeroDuration());
  CHECK(n.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(n.status()) == "NextBatch max_queue_delay -1ms is negative");
  n = m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration());
  CHECK(n.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(out[0].empty());
  CHECK(out[1].empty());
  // A batch waits max_queue_delay (of the engine clock) for company.
  REQUIRE(f.engine.Publish(Ev("work.a", "x")).ok());
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(f.engine.Publish(Ev("work.a", "y")).ok());
  });
  n = m.NextBatch(out, absl::InfiniteDuration(), absl::ZeroDuration());
  late.join();
  REQUIRE(n.ok());
  CHECK(*n == 2);
  CHECK(out[1].event().msg_id == "y");
}

TEST_CASE("AckBatch acks each message as Ack does and counts them once per member run") {
  Fixture f;
  Member m = f.Add({.ack_wait = absl::Seconds(30), .max_ack_pending = 4});
  for (int i = 0; i < 4; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  std::array<Message, 4> out;
  REQUIRE(m.NextBatch(out, absl::ZeroDuration(), absl::ZeroDuration()).value() == 4);
  CHECK(CS(f.engine, "S", "c").ack_pending == 4);
  f.clock.Advance(absl::Milliseconds(7));
  REQUIRE(AckBatch(out).ok());
  for (const Message& msg : out) CHECK(msg.acked());
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.acked == 4);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].successes == 4);
  CHECK(cs.group.members[0].outstanding == 0);
  CHECK(cs.ack_latency_ns.count() == 4);
  CHECK(cs.group.members[0].peak_ewma_ms == Approx(7.0));
  // Nothing is redelivered: the acks cancelled their ack waits.
  f.clock.Advance(absl::Seconds(31));
  f.engine.RunTimers();
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("AckBatch acks what it can and reports the first failure with the count") {
  Fixture f;
  Member a = f.Add({});
  Member b = f.Add({.name = "other"});
  for (int i = 0; i < 3; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  std::vector<Message> batch;
  batch.push_back(a.Next(absl::ZeroDuration()).value());
  batch.push_back(b.Next(absl::ZeroDuration()).value());  // another consumer: its own run
  batch.emplace_back();                                   // empty
  batch.push_back(a.Next(absl::ZeroDuration()).value());
  REQUIRE(batch[3].Ack().ok());                           // settled already
  batch.push_back(a.Next(absl::ZeroDuration()).value());
  const absl::Status st = AckBatch(batch);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(st) == "cannot ack an empty Message (message 2 of the batch; 2 of its 5 acks failed)");
  CHECK(batch[0].acked());
  CHECK(batch[1].acked());
  CHECK(batch[4].acked());
  CHECK(CS(f.engine, "S", "c").acked == 3);
  CHECK(CS(f.engine, "S", "other").acked == 1);
  CHECK(AckBatch({}).ok());
}

TEST_CASE("AckBatch from several threads at once settles each message exactly once", "[concurrency]") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 1 << 12, .ack_wait = absl::Seconds(30)});
  constexpr int kMessages = 2000;
  for (int i = 0; i < kMessages; ++i) REQUIRE(f.engine.Publish(Ev("work.a", std::to_string(i))).ok());
  std::vector<Message> all;
  for (int i = 0; i < kMessages; ++i) all.push_back(m.Next(absl::ZeroDuration()).value());
  // Two threads ack the same messages: for each, exactly one of the two succeeds.
  std::atomic<int> failures{0};
  auto acker = [&] {
    for (int i = 0; i < kMessages; i += 50) {
      const absl::Status st = AckBatch(std::span<Message>(all).subspan(i, 50));
      if (!st.ok()) {
        CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
        failures.fetch_add(1);
      }
    }
  };
  std::thread t1(acker);
  std::thread t2(acker);
  t1.join();
  t2.join();
  const ConsumerStats cs = CS(f.engine, "S", "c");
  CHECK(cs.acked == kMessages);
  CHECK(cs.ack_pending == 0);
  CHECK(cs.group.members[0].successes == kMessages);
  CHECK(failures.load() >= kMessages / 50);  // every batch lost at least one race, on one side
}

TEST_CASE("PublishBatch publishes each event in order as Publish does") {
  Fixture f;
  REQUIRE(f.engine.AddStream({.name = "B", .subjects = {"both.>"}}).ok());
  REQUIRE(f.engine.AddStream({.name = "B2", .subjects = {"both.x"}}).ok());
  Member m = f.Add({});
  std::vector<Event> events;
  for (int i = 0; i < 4; ++i) events.push_back(Ev(i % 2 == 0 ? "work.a" : "work.b", std::to_string(i)));
  events.push_back(Ev("both.x", "two streams"));  // not one stream's run: as Publish
  events.push_back(Ev("work.a", "4"));
  std::vector<PublishAck> acks(events.size());
  const PublishBatchResult r = f.engine.PublishBatch(events, acks);
  REQUIRE(r.status.ok());
  CHECK(r.published == 6);
  CHECK(acks[0].seq == 1);
  CHECK(acks[3].seq == 4);
  CHECK(acks[4].streams_stored == 2);
  CHECK(acks[5].seq == 5);
  for (const char* want : {"0", "1", "2", "3", "4"}) {
    absl::StatusOr<Message> got = m.Next(absl::ZeroDuration());
    REQUIRE(got.ok());
    CHECK(got->event().msg_id == want);
    REQUIRE(got->Ack().ok());
  }
  CHECK(f.engine.Stats().published == 6);
  // Again: the subjects are in this thread's routes now (the run's path).
  std::vector<Event> again;
  for (int i = 5; i < 8; ++i) again.push_back(Ev("work.a", std::to_string(i)));
  REQUIRE(f.engine.PublishBatch(again).status.ok());
  for (const char* want : {"5", "6", "7"}) CHECK(m.Next(absl::ZeroDuration())->event().msg_id == want);
}

TEST_CASE("PublishBatch stops at the first error and leaves the events after it") {
  Fixture f;
  Member m = f.Add({});
  std::vector<Event> events;
  events.push_back(Ev("work.a", "0"));
  events.push_back(Ev("work.a", "1"));
  events.push_back(Ev("work.a", "2"));
  events[1].ttl = absl::Seconds(-1);  // refused by Publish's checks
  PublishBatchResult r = f.engine.PublishBatch(events);
  CHECK(r.published == 1);
  CHECK(r.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status) == "event ttl -1s is invalid (zero for none, or up to 365 days)");
  CHECK(events[2].subject == "work.a");  // not tried: not moved from
  CHECK(m.Next(absl::ZeroDuration())->event().msg_id == "0");
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);

  std::vector<Event> unrouted;
  unrouted.push_back(Ev("nowhere.a", "x"));
  r = f.engine.PublishBatch(unrouted);
  CHECK(r.published == 0);
  CHECK(r.status.code() == absl::StatusCode::kNotFound);

  std::vector<PublishAck> short_acks(2);
  r = f.engine.PublishBatch(events, short_acks);
  CHECK(r.published == 0);
  CHECK(r.status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status) == "PublishBatch: acks holds 2 PublishAcks for 3 events (give none, or at least one per event)");
  CHECK(m.Next(absl::ZeroDuration()).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(f.engine.PublishBatch({}).published == 0);
}

// A batch into a lane of 2 (overflow block) must wait for the puller, which sleeps
// until it is woken: the batch must not hold back the wake-up it waits for.
TEST_CASE("PublishBatch waits at a full lane and wakes the puller it waits for", "[concurrency]") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2});
  constexpr int kEvents = 2000;
  std::vector<std::string> got;
  bool stuck = false;
  std::thread puller([&] {
    while (static_cast<int>(got.size()) < kEvents) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Message> msg = m.Next(absl::Seconds(60));
      if (!msg.ok() || std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
        // 30 s for one event (a held-back wake-up lets the puller sleep until its
        // wait's deadline, and then it finds the lane full): close, so that the
        // publisher stuck on the full lane returns (Cancelled) and the test fails
        // instead of crawling.
        stuck = true;
        f.engine.Close();
        break;
      }
      got.push_back(msg->event().msg_id);
      (void)msg->Ack();
    }
  });
  std::vector<Event> events;
  for (int i = 0; i < kEvents; ++i) events.push_back(Ev("work.a", std::to_string(i)));
  for (int round = 0; round < 2; ++round) {  // the second round runs on the cached route
    const std::size_t half = kEvents / 2;
    const PublishBatchResult r =
        f.engine.PublishBatch(std::span<Event>(events).subspan(round * half, half));
    CHECK(r.status.ok());
    CHECK(r.published == half);
  }
  puller.join();
  CHECK(!stuck);
  REQUIRE(got.size() == static_cast<std::size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) CHECK(got[i] == std::to_string(i));
}

TEST_CASE("PublishBatch from two threads keeps each publisher's order and loses nothing",
          "[concurrency]") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 64});
  constexpr int kPerPublisher = 3000;
  std::map<std::string, int> next{{"p0", 0}, {"p1", 0}};
  int out_of_order = 0;
  int received = 0;
  std::thread puller([&] {
    while (received < 2 * kPerPublisher) {
      std::array<Message, 16> batch;
      absl::StatusOr<std::size_t> n = m.NextBatch(batch, absl::ZeroDuration(), absl::Seconds(60));
      if (!n.ok()) break;
      for (std::size_t k = 0; k < *n; ++k) {
        const Event& e = batch[k].event();
        if (static_cast<int>(e.seq_no) != next[e.seq_id]++) ++out_of_order;
        ++received;
      }
      (void)AckBatch(std::span(batch).first(*n));
    }
  });
  auto publisher = [&](const std::string& who) {
    for (int i = 0; i < kPerPublisher; i += 100) {
      std::vector<Event> events;
      for (int k = i; k < i + 100; ++k) {
        events.push_back(Ev("work.a", who + "-" + std::to_string(k), who));
        events.back().seq_no = static_cast<std::uint64_t>(k);
      }
      REQUIRE(f.engine.PublishBatch(events).status.ok());
    }
  };
  std::thread p0(publisher, "p0");
  std::thread p1(publisher, "p1");
  p0.join();
  p1.join();
  puller.join();
  CHECK(received == 2 * kPerPublisher);
  CHECK(out_of_order == 0);
  CHECK(CS(f.engine, "S", "c").acked == 2 * kPerPublisher);
}

// A batch pops what is queued without waking the publisher blocked on the full lane
// (one wake-up per batch); before it waits for more it wakes it, or it would wait
// out its max_queue_delay with the publisher asleep behind a lane it emptied.
TEST_CASE("NextBatch wakes a publisher blocked on its full lane before it waits for more",
          "[concurrency]") {
  Fixture f;
  Member m = f.Add({.lane_capacity = 2});
  constexpr int kEvents = 8;
  std::thread publisher([&] {
    for (int i = 0; i < kEvents; ++i) {
      if (!f.engine.Publish(Ev("work.a", std::to_string(i))).ok()) return;
    }
  });
  // Blocked on the third event: two are queued.
  for (int i = 0; i < 6000 && m.queued() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // asleep by now, as a rule
  std::array<Message, kEvents> batch;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::size_t> n = m.NextBatch(batch, absl::Seconds(20), absl::Seconds(60));
  const auto took = std::chrono::steady_clock::now() - start;
  publisher.join();
  REQUIRE(n.ok());
  CHECK(*n == kEvents);  // not the 3 that were there before it would have waited
  CHECK(took < std::chrono::seconds(20));
  for (int i = 0; i < kEvents; ++i) CHECK(batch[i].event().msg_id == std::to_string(i));
}

// Found by the adversarial review: dead letters deferred to the outbox while a
// PublishBatch held their stream went out when the batch's run ended, pushed quietly
// (their wake-ups held by the batch), and filled the lane whose puller the batch's
// next event then waited for: the puller slept to its deadline, and with an infinite
// one the batch never returned.
TEST_CASE("a PublishBatch that flushes the outbox wakes the pullers of those dead letters",
          "[concurrency]") {
  auto engine = Engine::Create({.manual_timers = true}).value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"s.>"}}).ok());
  REQUIRE(engine->AddStream({.name = "S2", .subjects = {"s.dlq"}}).ok());  // s.dlq: no one stream's run
  Member work = engine->AddConsumer({.stream = "S", .name = "work", .filter_subject = "s.work",
                                     .dead_letter_subject = "s.dlq"})
                    ->member(0)
                    .value();
  Member full = engine->AddConsumer({.stream = "S", .name = "full", .filter_subject = "s.full",
                                     .lane_capacity = 2})
                    ->member(0)
                    .value();
  Member dlq = engine->AddConsumer({.stream = "S", .name = "dlq", .filter_subject = "s.dlq",
                                    .lane_capacity = 2})
                   ->member(0)
                   .value();
  REQUIRE(engine->Publish(Ev("s.work", "w1")).ok());
  REQUIRE(engine->Publish(Ev("s.work", "w2")).ok());
  absl::StatusOr<Message> w1 = work.Next(absl::ZeroDuration());
  absl::StatusOr<Message> w2 = work.Next(absl::ZeroDuration());
  REQUIRE((w1.ok() && w2.ok()));
  std::atomic<int> got{0};
  std::atomic<bool> stuck{false};
  std::thread puller([&] {
    while (got.load() < 3) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Message> m = dlq.Next(absl::Seconds(30));
      // A pull of a message that was there all along, woken only by its deadline.
      if (!m.ok() || std::chrono::steady_clock::now() - start > std::chrono::seconds(10)) {
        stuck.store(true);
        break;
      }
      got.fetch_add(1);
      (void)m->Ack();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the puller asleep, as a rule
  std::thread batch([&] {
    std::vector<Event> events = {Ev("s.full", "f0"), Ev("s.full", "f1"), Ev("s.full", "f2"),
                                 Ev("s.dlq", "d3")};
    CHECK(engine->PublishBatch(events).status.ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // f2 waits for room, holding S
  REQUIRE(w1->Term("one").ok());  // their dead letters find S held: to the outbox
  REQUIRE(w2->Term("two").ok());
  REQUIRE(full.Next(absl::Seconds(60)).ok());  // room: the batch goes on
  batch.join();
  puller.join();
  CHECK(!stuck.load());
  CHECK(got.load() == 3);
}
