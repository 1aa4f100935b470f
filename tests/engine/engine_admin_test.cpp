// Changing a stream after it was added: Engine::PurgeStream (everything, by
// subject, below a sequence, keeping the last N), Engine::UpdateStream (limits),
// StreamConfig::max_msgs_per_subject, StreamStats::first_seq and purged, on memory
// and file streams, and what of it survives a restart.
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "../state/state_test_util.hpp"
#include "engine_test_util.hpp"
#include "inferq/engine/engine.hpp"

using namespace inferq;
using inferq::engine_test::Ev;
using inferq::engine_test::Msg;
using inferq::engine_test::SS;
using state_test::TempDir;

namespace {

using Held = std::vector<std::pair<std::uint64_t, std::string>>;

// (sequence, subject) of every message stream `name` holds up to its last sequence.
Held HeldBy(const Engine& engine, const std::string& name) {
  Held out;
  const std::uint64_t last = SS(engine, name).last_seq;
  for (std::uint64_t seq = 1; seq <= last; ++seq) {
    absl::StatusOr<std::shared_ptr<const Event>> e = engine.GetMessage(name, seq);
    if (e.ok()) {
      out.emplace_back(seq, (*e)->subject);
    } else {
      REQUIRE(e.status().code() == absl::StatusCode::kNotFound);
    }
  }
  return out;
}

StreamConfig Memory() { return {.name = "S", .subjects = {"s.>"}}; }

// After a run of the timers, the msg_id of what member 0 of `c` has now (acked), or "-".
std::string NextAcked(Engine& engine, Consumer& c) {
  engine.RunTimers();
  absl::StatusOr<Message> m = c.member(0)->Next(absl::ZeroDuration());
  if (!m.ok()) return "-";
  REQUIRE(m->Ack().ok());
  return m->event().msg_id;
}

StreamConfig File(const std::string& dir) {
  StreamConfig s = Memory();
  s.storage = StorageType::kFile;
  s.directory = dir;
  s.sync = SyncPolicy::kNone;
  return s;
}

// Publishes s.a, s.b, s.a, s.c, s.b, s.a (sequences 1..6), msg_ids m1..m6.
void PublishSix(Engine& engine) {
  const char* subjects[] = {"s.a", "s.b", "s.a", "s.c", "s.b", "s.a"};
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<PublishAck> ack = engine.Publish(Ev(subjects[i], "m" + std::to_string(i + 1)));
    REQUIRE(ack.ok());
    REQUIRE(ack->seq == static_cast<std::uint64_t>(i + 1));
  }
}

}  // namespace

TEST_CASE("PurgeStream removes what its request selects, on memory and file streams") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  PublishSix(*engine);

  SECTION("everything") {
    CHECK(*engine->PurgeStream("S") == 6);
    CHECK(HeldBy(*engine, "S").empty());
    CHECK(SS(*engine, "S").first_seq == 7);
  }
  SECTION("by subject") {
    CHECK(*engine->PurgeStream("S", {.subject = "s.a"}) == 3);
    CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}});
    CHECK(SS(*engine, "S").first_seq == 2);
  }
  SECTION("by wildcard subject, keeping the newest 2") {
    CHECK(*engine->PurgeStream("S", {.subject = "s.*", .keep = 2}) == 4);
    CHECK(HeldBy(*engine, "S") == Held{{5, "s.b"}, {6, "s.a"}});
  }
  SECTION("below a sequence") {
    CHECK(*engine->PurgeStream("S", {.sequence = 4}) == 3);
    CHECK(HeldBy(*engine, "S") == Held{{4, "s.c"}, {5, "s.b"}, {6, "s.a"}});
    CHECK(SS(*engine, "S").first_seq == 4);
  }
  SECTION("by subject below a sequence") {
    CHECK(*engine->PurgeStream("S", {.subject = "s.a", .sequence = 6}) == 2);
    CHECK(HeldBy(*engine, "S") ==
          Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}, {6, "s.a"}});
  }
  SECTION("keeping more than there are removes nothing") {
    CHECK(*engine->PurgeStream("S", {.keep = 6}) == 0);
    CHECK(HeldBy(*engine, "S").size() == 6);
  }
  const StreamStats st = SS(*engine, "S");
  CHECK(st.messages == HeldBy(*engine, "S").size());
  CHECK(st.purged == 6 - st.messages);
  CHECK(st.discarded == 0);
  CHECK(st.last_seq == 6);
  // The sequence goes on, and the duplicate window still knows every id.
  absl::StatusOr<PublishAck> dup = engine->Publish(Ev("s.a", "m1"));
  REQUIRE(dup.ok());
  CHECK(dup->duplicate);
  CHECK(dup->seq == 1);
  absl::StatusOr<PublishAck> next = engine->Publish(Ev("s.z", "m7"));
  REQUIRE(next.ok());
  CHECK(next->seq == 7);
}

TEST_CASE("a purge a file stream made survives a restart: purged messages never come back") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(File(d.path())).ok());
    PublishSix(*engine);
    REQUIRE(*engine->PurgeStream("S", {.subject = "s.a", .keep = 1}) == 2);  // 1 and 3
    REQUIRE(engine->Publish(Ev("s.a", "m7")).ok());                          // 7
    REQUIRE(*engine->PurgeStream("S", {.sequence = 3}) == 1);                // 2
    REQUIRE(engine->Publish(Ev("s.b", "m8")).ok());                          // 8
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(File(d.path())).ok());
  const Held want{{4, "s.c"}, {5, "s.b"}, {6, "s.a"}, {7, "s.a"}, {8, "s.b"}};
  CHECK(HeldBy(*engine, "S") == want);
  CHECK(SS(*engine, "S").first_seq == 4);
  CHECK(SS(*engine, "S").messages == 5);
  // A consumer that starts with everything gets exactly what is held.
  auto all = *engine->AddConsumer({.stream = "S", .name = "all", .deliver = DeliverPolicy::kAll});
  Held got;
  for (;;) {
    absl::StatusOr<Message> m = all.member(0)->Next(absl::Milliseconds(100));
    if (!m.ok()) break;
    got.emplace_back(m->stream_seq(), m->event().subject);
    REQUIRE(m->Ack().ok());
  }
  CHECK(got == want);
  // The duplicate window survived the purges and the restart (nats-server#3272).
  for (int i = 1; i <= 8; ++i) {
    absl::StatusOr<PublishAck> dup = engine->Publish(Ev("s.a", "m" + std::to_string(i)));
    REQUIRE(dup.ok());
    CHECK(dup->duplicate);
    CHECK(dup->seq == static_cast<std::uint64_t>(i));
  }
}

TEST_CASE("a file stream purged of everything goes on numbering after a restart, its window kept") {
  TempDir d;
  StreamConfig s = File(d.path());
  s.segment_bytes = 4096;  // the purge retires every segment but the tail
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    for (int i = 1; i <= 100; ++i) {
      Event e = Ev("s.x", "id" + std::to_string(i));
      e.payload = Buffer::FromString(std::string(200, 'p'));
      REQUIRE(engine->Publish(std::move(e)).ok());
    }
    REQUIRE(*engine->PurgeStream("S") == 100);
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(SS(*engine, "S").messages == 0);
  CHECK(SS(*engine, "S").first_seq == 101);
  absl::StatusOr<PublishAck> dup = engine->Publish(Ev("s.x", "id50"));
  REQUIRE(dup.ok());
  CHECK(dup->duplicate);
  CHECK(dup->seq == 50);
  absl::StatusOr<PublishAck> fresh = engine->Publish(Ev("s.x", "id101"));
  REQUIRE(fresh.ok());
  CHECK(!fresh->duplicate);
  CHECK(fresh->seq == 101);
}

TEST_CASE("queued deliveries of purged messages are skipped") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c"});
  PublishSix(*engine);
  REQUIRE(*engine->PurgeStream("S", {.subject = "s.b"}) == 2);
  std::vector<std::uint64_t> got;
  for (;;) {
    absl::StatusOr<Message> m = c.member(0)->Next(absl::ZeroDuration());
    if (!m.ok()) break;
    got.push_back(m->stream_seq());
    REQUIRE(m->Ack().ok());
  }
  CHECK(got == std::vector<std::uint64_t>{1, 3, 4, 6});
}

TEST_CASE("PurgeStream refuses bad requests by name and changes nothing") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(Memory()).ok());
  REQUIRE(engine->AddStream({.name = "I",
                             .subjects = {"i.>"},
                             .retention = RetentionPolicy::kInterest})
              .ok());
  PublishSix(*engine);
  absl::StatusOr<std::uint64_t> r = engine->PurgeStream("S", {.subject = "s..a"});
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Msg(r.status()), Catch::StartsWith("purge of stream 'S': subject "));
  CHECK_THAT(Msg(r.status()), Catch::Contains("'s..a'"));
  r = engine->PurgeStream("S", {.sequence = 3, .keep = 1});
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) ==
        "purge of stream 'S': sequence 3 and keep 1 cannot be used together");
  r = engine->PurgeStream("nope");
  REQUIRE(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(r.status()) == "stream 'nope' does not exist");
  r = engine->PurgeStream("I");
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Msg(r.status()), Catch::StartsWith("stream 'I' keeps no index"));
  CHECK(HeldBy(*engine, "S").size() == 6);
  CHECK(SS(*engine, "S").purged == 0);
  engine->Close();
  r = engine->PurgeStream("S");
  CHECK(r.status().code() == absl::StatusCode::kCancelled);
}

TEST_CASE("a file stream purge whose purges file cannot be written removes nothing") {
  TempDir d;
  const std::string kind = GENERATE(std::string("create"), std::string("rename"));
  INFO(kind);
  auto faulty = std::make_shared<state_test::FaultyFileSystem>();
  StreamConfig s = File(d.path());
  s.file_system = faulty;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    PublishSix(*engine);
    faulty->FailNth(kind, 1, ENOSPC);
    absl::StatusOr<std::uint64_t> r = engine->PurgeStream("S", {.subject = "s.a"});
    REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(Msg(r.status()), Catch::StartsWith("stream 'S': writing '" + d.path() + "/purges'"));
    CHECK(HeldBy(*engine, "S").size() == 6);
    CHECK(SS(*engine, "S").purged == 0);
    CHECK(!std::filesystem::exists(d / "purges.tmp"));
    // The next purge works.
    CHECK(*engine->PurgeStream("S", {.subject = "s.c"}) == 1);
  }
  s.file_system = nullptr;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") ==
        Held{{1, "s.a"}, {2, "s.b"}, {3, "s.a"}, {5, "s.b"}, {6, "s.a"}});
}

TEST_CASE("a purge whose directory fsync fails is made, and says it may not survive a power loss") {
  TempDir d;
  auto faulty = std::make_shared<state_test::FaultyFileSystem>();
  StreamConfig s = File(d.path());
  s.file_system = faulty;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    PublishSix(*engine);
    faulty->FailNth("syncdir", 1, EIO);
    absl::StatusOr<std::uint64_t> r = engine->PurgeStream("S", {.subject = "s.a"});
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(Msg(r.status()),
               Catch::StartsWith("purged 3 message(s), but the purge may not survive a power "
                                 "loss: stream 'S': syncing the directory of '" +
                                 d.path() + "/purges': syncdir: injected EIO"));
    CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}});
  }
  s.file_system = nullptr;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}});
}

TEST_CASE("a damaged purges file fails the stream's recovery by name") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(File(d.path())).ok());
    PublishSix(*engine);
    REQUIRE(*engine->PurgeStream("S", {.subject = "s.a"}) == 3);
  }
  std::string text;
  {
    std::ifstream in(d / "purges");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(text.rfind("inferq-stream-purges 1\npurge 6 0 0 s.a 0\n", 0) == 0);
  SECTION("a changed byte") { text[text.find("s.a")] = 't'; }
  SECTION("cut short") { text.resize(text.size() - 5); }
  {
    std::ofstream out(d / "purges", std::ios::trunc);
    out << text;
  }
  auto engine = *Engine::Create();
  absl::Status st = engine->AddStream(File(d.path()));
  REQUIRE(st.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(Msg(st), Catch::StartsWith("stream 'S': purges file '" + d.path() +
                                        "/purges' is damaged: "));
}

TEST_CASE("max_msgs_per_subject keeps the newest messages of each subject") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  StreamConfig s = file ? File(d.path()) : Memory();
  s.max_msgs_per_subject = 1;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    PublishSix(*engine);
    const Held want{{4, "s.c"}, {5, "s.b"}, {6, "s.a"}};
    CHECK(HeldBy(*engine, "S") == want);
    CHECK(SS(*engine, "S").discarded == 3);
    CHECK(SS(*engine, "S").first_seq == 4);
    // The last value per subject is what a kLastPerSubject consumer starts with.
    auto last = *engine->AddConsumer(
        {.stream = "S", .name = "last", .deliver = DeliverPolicy::kLastPerSubject});
    Held got;
    for (;;) {
      absl::StatusOr<Message> m = last.member(0)->Next(absl::ZeroDuration());
      if (!m.ok()) break;
      got.emplace_back(m->stream_seq(), m->event().subject);
      REQUIRE(m->Ack().ok());
    }
    CHECK(got == want);
  }
  if (!file) return;
  // Recovery rebuilds the subjects: the next s.c replaces 4.
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{4, "s.c"}, {5, "s.b"}, {6, "s.a"}});
  REQUIRE(engine->Publish(Ev("s.c", "m7")).ok());
  CHECK(HeldBy(*engine, "S") == Held{{5, "s.b"}, {6, "s.a"}, {7, "s.c"}});
}

TEST_CASE("max_msgs_per_subject above one keeps that many per subject through purges") {
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.max_msgs_per_subject = 2;
  REQUIRE(engine->AddStream(s).ok());
  PublishSix(*engine);  // s.a at 1, 3, 6: 1 goes
  CHECK(HeldBy(*engine, "S") ==
        Held{{2, "s.b"}, {3, "s.a"}, {4, "s.c"}, {5, "s.b"}, {6, "s.a"}});
  REQUIRE(*engine->PurgeStream("S", {.subject = "s.a", .keep = 1}) == 1);  // 3
  REQUIRE(engine->Publish(Ev("s.a", "m7")).ok());  // s.a: 6, 7 (nothing more goes)
  REQUIRE(engine->Publish(Ev("s.a", "m8")).ok());  // s.a: 7, 8
  CHECK(HeldBy(*engine, "S") ==
        Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}, {7, "s.a"}, {8, "s.a"}});
}

TEST_CASE("UpdateStream applies new limits at once") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  StreamConfig s = file ? File(d.path()) : Memory();
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  PublishSix(*engine);

  SECTION("a lower max_msgs removes the oldest") {
    s.max_msgs = 2;
    REQUIRE(engine->UpdateStream(s).ok());
    CHECK(HeldBy(*engine, "S") == Held{{5, "s.b"}, {6, "s.a"}});
    CHECK(SS(*engine, "S").discarded == 4);
    REQUIRE(engine->Publish(Ev("s.q")).ok());
    CHECK(HeldBy(*engine, "S") == Held{{6, "s.a"}, {7, "s.q"}});
  }
  SECTION("max_msgs_per_subject set on a stream that holds messages") {
    s.max_msgs_per_subject = 1;
    REQUIRE(engine->UpdateStream(s).ok());
    CHECK(HeldBy(*engine, "S") == Held{{4, "s.c"}, {5, "s.b"}, {6, "s.a"}});
    REQUIRE(engine->Publish(Ev("s.b")).ok());
    CHECK(HeldBy(*engine, "S") == Held{{4, "s.c"}, {6, "s.a"}, {7, "s.b"}});
    // Raised again: nothing more goes.
    s.max_msgs_per_subject = 3;
    REQUIRE(engine->UpdateStream(s).ok());
    REQUIRE(engine->Publish(Ev("s.b")).ok());
    CHECK(HeldBy(*engine, "S") == Held{{4, "s.c"}, {6, "s.a"}, {7, "s.b"}, {8, "s.b"}});
  }
  SECTION("discard new with a max_msgs already reached refuses the next publish") {
    s.max_msgs = 6;
    s.discard = DiscardPolicy::kNew;
    REQUIRE(engine->UpdateStream(s).ok());
    absl::StatusOr<PublishAck> r = engine->Publish(Ev("s.a"));
    REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(Msg(r.status()) == "stream 'S' is full: max_msgs 6 reached (discard new)");
  }
  SECTION("a max_msg_size") {
    s.max_msg_size = 10;
    REQUIRE(engine->UpdateStream(s).ok());
    Event big = Ev("s.a");
    big.payload = Buffer::FromString(std::string(100, 'x'));
    CHECK(engine->Publish(std::move(big)).status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(HeldBy(*engine, "S").size() == 6);
  }
}

TEST_CASE("UpdateStream with max_age makes the timer remove old messages") {
  ManualClock clock(1'000'000'000);
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  StreamConfig s = Memory();
  REQUIRE(engine->AddStream(s).ok());
  PublishSix(*engine);
  clock.Advance(absl::Seconds(10));
  REQUIRE(engine->Publish(Ev("s.new")).ok());
  s.max_age = absl::Seconds(5);
  REQUIRE(engine->UpdateStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{7, "s.new"}});
  clock.Advance(absl::Seconds(6));
  engine->RunTimers();
  CHECK(HeldBy(*engine, "S").empty());
  CHECK(SS(*engine, "S").first_seq == 8);
}

TEST_CASE("UpdateStream refuses changes it cannot make by name and changes nothing") {
  TempDir d;
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  REQUIRE(engine->AddStream(s).ok());
  REQUIRE(engine->AddStream({.name = "I",
                             .subjects = {"i.>"},
                             .retention = RetentionPolicy::kInterest})
              .ok());
  PublishSix(*engine);
  StreamConfig bad = s;
  bad.max_msgs = 2;
  std::string field;
  SECTION("subjects") {
    bad.subjects = {"s.>", "t.>"};
    field = "subjects";
  }
  SECTION("storage") {
    bad.storage = StorageType::kFile;
    bad.directory = d.path();
    field = "storage";
  }
  SECTION("duplicate_window") {
    bad.duplicate_window = absl::Minutes(5);
    field = "duplicate_window";
  }
  absl::Status st = engine->UpdateStream(bad);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(st) == "stream 'S': " + field +
                       " cannot be changed by UpdateStream (only max_msgs, max_bytes, "
                       "max_age, max_msg_size, max_msgs_per_subject and discard can)");
  CHECK(HeldBy(*engine, "S").size() == 6);

  bad = s;
  bad.max_msgs_per_subject = 0;
  st = engine->UpdateStream(bad);
  REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(st) == "stream 'S': max_msgs_per_subject 0 is invalid (use -1 for no limit or a "
                   "positive value)");
  bad.name = "nope";
  bad.max_msgs_per_subject = -1;
  CHECK(engine->UpdateStream(bad).code() == absl::StatusCode::kNotFound);
  st = engine->UpdateStream({.name = "I",
                             .subjects = {"i.>"},
                             .max_age = absl::Seconds(1),
                             .retention = RetentionPolicy::kInterest});
  REQUIRE(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Msg(st), Catch::StartsWith("stream 'I': under interest retention this update "
                                        "would make the stream start keeping an index"));
}

// ---- Work-queue retention (RetentionPolicy::kWorkQueue). ----

namespace {

StreamConfig WorkQueue(const std::string& dir) {
  StreamConfig s = dir.empty() ? Memory() : File(dir);
  s.retention = RetentionPolicy::kWorkQueue;
  return s;
}

ConsumerConfig Worker(std::string name, std::string filter = "") {
  return {.stream = "S",
          .name = std::move(name),
          .filter_subject = std::move(filter),
          .deliver = DeliverPolicy::kAll};
}

// Pulls what member 0 has now; acks those whose subject is not `keep`.
Held Work(Consumer& c, const std::string& keep = "") {
  Held got;
  for (;;) {
    absl::StatusOr<Message> m = c.member(0)->Next(absl::Milliseconds(50));
    if (!m.ok()) break;
    got.emplace_back(m->stream_seq(), m->event().subject);
    if (m->event().subject != keep) REQUIRE(m->Ack().ok());
  }
  return got;
}

}  // namespace

TEST_CASE("a work queue keeps a message until its consumer acks it") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(WorkQueue(file ? d.path() : "")).ok());
  PublishSix(*engine);  // nobody consumes yet: every message waits
  CHECK(SS(*engine, "S").messages == 6);
  auto a = *engine->AddConsumer(Worker("a", "s.a"));
  auto rest = *engine->AddConsumer(Worker("rest", "s.*.>"));  // matches none of the six
  CHECK(Work(a) == Held{{1, "s.a"}, {3, "s.a"}, {6, "s.a"}});
  CHECK(Work(rest).empty());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}});
  auto bc = *engine->AddConsumer(Worker("bc", "s.b"));
  CHECK(Work(bc, "s.b") == Held{{2, "s.b"}, {5, "s.b"}});  // not acked: they stay
  auto c = *engine->AddConsumer(Worker("c", "s.c"));
  CHECK(Work(c) == Held{{4, "s.c"}});
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {5, "s.b"}});
  CHECK(SS(*engine, "S").acked_out == 4);
  CHECK(SS(*engine, "S").first_seq == 2);
}

TEST_CASE("work-queue consumers must ack explicitly, start with all and not overlap") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(WorkQueue("")).ok());
  REQUIRE(engine->AddConsumer(Worker("a", "s.a")).ok());
  ConsumerConfig c = Worker("b", "s.b");
  c.ack = AckPolicy::kNone;
  absl::StatusOr<Consumer> r = engine->AddConsumer(c);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) == "consumer 'b' of work-queue stream 'S': needs ack policy explicit");
  c = Worker("b", "s.b");
  c.deliver = DeliverPolicy::kNew;
  r = engine->AddConsumer(c);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(r.status()) == "consumer 'b' of work-queue stream 'S': needs deliver policy all");
  for (const char* filter : {"s.>", "s.*", "", "s.a"}) {
    INFO(filter);
    r = engine->AddConsumer(Worker("b", filter));
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Msg(r.status()) == "consumer 'b' of work-queue stream 'S': its filter '" +
                                 std::string(filter) +
                                 "' overlaps the filter 's.a' of consumer 'a' (each message "
                                 "of a work queue is for one consumer)");
  }
  CHECK(engine->AddConsumer(Worker("b", "s.b")).ok());
  CHECK(engine->Stats().consumers.size() == 2);
}

TEST_CASE("a work queue removes a message that its consumer gives up on") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(WorkQueue(file ? d.path() : "")).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  ConsumerConfig w = Worker("w");
  w.max_deliver = 2;
  w.dead_letter_subject = "dead.s";
  auto c = *engine->AddConsumer(w);
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  REQUIRE(engine->Publish(Ev("s.b", "m2")).ok());
  for (int i = 0; i < 2; ++i) {  // m1 fails twice, m2 is acked at once
    absl::StatusOr<Message> m = c.member(0)->Next(absl::Seconds(5));
    REQUIRE(m.ok());
    if (m->event().msg_id == "m2") {
      REQUIRE(m->Ack().ok());
      m = c.member(0)->Next(absl::Seconds(5));
      REQUIRE(m.ok());
    }
    REQUIRE(m->event().msg_id == "m1");
    REQUIRE(m->Nak().ok());
  }
  CHECK(HeldBy(*engine, "S").empty());
  CHECK(SS(*engine, "S").acked_out == 2);
  CHECK(SS(*engine, "DLQ").messages == 1);
}

TEST_CASE("a file work queue's acks survive a restart, whichever consumer comes first") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(WorkQueue(d.path())).ok());
    auto w = *engine->AddConsumer(Worker("w"));
    PublishSix(*engine);
    CHECK(Work(w, "s.b").size() == 6);  // acks all but s.b (2, 5)
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(WorkQueue(d.path())).ok());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {5, "s.b"}});
  CHECK(SS(*engine, "S").messages == 2);
  CHECK(SS(*engine, "S").first_seq == 2);
  // A consumer of another name (the old one's ack log is not read) gets only those.
  auto other = *engine->AddConsumer(Worker("other"));
  CHECK(Work(other) == Held{{2, "s.b"}, {5, "s.b"}});
  CHECK(HeldBy(*engine, "S").empty());
}

TEST_CASE("a file work queue replays its acks and purges in the order they were made") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(WorkQueue(d.path())).ok());
    PublishSix(*engine);  // s.a at 1, 3, 6
    auto w = *engine->AddConsumer(Worker("w", "s.a"));
    // Acks 1 and 3, holds 6 unacked.
    absl::StatusOr<Message> m1 = w.member(0)->Next(absl::Seconds(5));
    REQUIRE(m1.ok());
    REQUIRE(m1->stream_seq() == 1);
    // Keep the newest s.a: 6 stays, 1 and 3 go (1 is still unacked).
    REQUIRE(*engine->PurgeStream("S", {.subject = "s.a", .keep = 1}) == 2);
    // 6 is acked after the purge: at recovery, keep 1 of s.a must not bring 3 back.
    REQUIRE(m1->Ack().ok());
    for (;;) {
      absl::StatusOr<Message> m = w.member(0)->Next(absl::Milliseconds(50));
      if (!m.ok()) break;
      REQUIRE(m->stream_seq() == 6);  // 3 was purged while queued: skipped
      REQUIRE(m->AckSync().ok());
    }
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(WorkQueue(d.path())).ok());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.b"}, {4, "s.c"}, {5, "s.b"}});
}

TEST_CASE("a file work queue retires its removed log as the stream's log moves on") {
  TempDir d;
  StreamConfig s = WorkQueue(d.path());
  s.segment_bytes = 4096;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  auto w = *engine->AddConsumer(Worker("w"));
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 50; ++i) {
      Event e = Ev("s.x");
      e.payload = Buffer::FromString(std::string(100, 'p'));
      REQUIRE(engine->Publish(std::move(e)).ok());
    }
    REQUIRE(Work(w).size() == 50);
  }
  REQUIRE(engine->Publish(Ev("s.x")).ok());  // drains the last acks
  CHECK(SS(*engine, "S").messages == 1);
  CHECK(SS(*engine, "S").acked_out == 1000);
  int segments = 0;
  for (const auto& f : std::filesystem::directory_iterator(d / "removed")) {
    if (f.path().extension() == ".seg") ++segments;
  }
  // 1000 acks fill about 15 segments of 4 KiB; all but the last few are retired.
  CHECK(segments <= 3);
}

TEST_CASE("purges, limit updates and acks racing publishers keep a work queue's counts exact") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  StreamConfig s = WorkQueue(file ? d.path() : "");
  if (file) s.segment_bytes = 1 << 16;
  constexpr int kPerPublisher = 1500;
  std::set<std::uint64_t> acked;
  StreamStats before;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    auto w = *engine->AddConsumer(Worker("w"));
    std::atomic<int> publishing{2};
    std::vector<std::thread> threads;
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([&, p] {
        for (int i = 0; i < kPerPublisher; ++i) {
          Event e = Ev("s." + std::to_string(i % 4), std::to_string(p) + "-" + std::to_string(i));
          REQUIRE(engine->Publish(std::move(e)).ok());
        }
        publishing.fetch_sub(1);
      });
    }
    threads.emplace_back([&] {  // the admin
      StreamConfig u = s;
      for (int round = 0; publishing.load() > 0; ++round) {
        CHECK(engine->PurgeStream("S", {.subject = "s.1", .keep = 5}).ok());
        u.max_msgs_per_subject = round % 2 == 0 ? 50 : -1;
        CHECK(engine->UpdateStream(u).ok());
        (void)engine->GetMessage("S", static_cast<std::uint64_t>(round) + 1);
        (void)engine->Stats();
        std::this_thread::yield();
      }
    });
    // The consumer, on this thread: acks everything it gets, each once.
    std::set<std::uint64_t> seen;
    for (;;) {
      absl::StatusOr<Message> m = w.member(0)->Next(absl::Milliseconds(200));
      if (!m.ok()) {
        if (publishing.load() == 0) break;
        continue;
      }
      CHECK(seen.insert(m->stream_seq()).second);
      REQUIRE(m->Ack().ok());
      acked.insert(m->stream_seq());
    }
    for (auto& t : threads) t.join();
    REQUIRE(engine->Publish(Ev("s.end")).ok());  // drains the last acks into the counts
    before = SS(*engine, "S");
    CHECK(before.stored == 2 * kPerPublisher + 1);
    CHECK(before.acked_out + before.purged + before.discarded + before.messages == before.stored);
    CHECK(before.acked_out <= acked.size());
  }
  if (!file) return;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  const Held held = HeldBy(*engine, "S");
  CHECK(held.size() == before.messages);
  for (const auto& [seq, subject] : held) {
    INFO(seq);
    CHECK(!acked.contains(seq));
  }
}

TEST_CASE("what max_msgs_per_subject removed from a file stream stays removed without the limit") {
  TempDir d;
  StreamConfig s = File(d.path());
  const bool by_update = GENERATE(false, true);
  INFO((by_update ? "set by UpdateStream" : "set at AddStream"));
  {
    auto engine = *Engine::Create();
    if (!by_update) s.max_msgs_per_subject = 1;
    REQUIRE(engine->AddStream(s).ok());
    if (by_update) {
      PublishSix(*engine);
      s.max_msgs_per_subject = 1;
      REQUIRE(engine->UpdateStream(s).ok());
    } else {
      PublishSix(*engine);
    }
    REQUIRE(engine->Publish(Ev("s.c", "m7")).ok());  // 4 goes
    CHECK(HeldBy(*engine, "S") == Held{{5, "s.b"}, {6, "s.a"}, {7, "s.c"}});
  }
  s.max_msgs_per_subject = -1;  // the next run has no limit: nothing comes back
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{5, "s.b"}, {6, "s.a"}, {7, "s.c"}});
  CHECK(SS(*engine, "S").first_seq == 5);
}

TEST_CASE("a file stream whose removed log fails refuses publishes by name") {
  TempDir d;
  auto faulty = std::make_shared<state_test::FaultyFileSystem>();
  StreamConfig s = File(d.path());
  s.file_system = faulty;
  s.max_msgs_per_subject = 1;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  faulty->FailNth("write", 2, ENOSPC);  // the stream's record of m2, then its removal of m1
  REQUIRE(engine->Publish(Ev("s.a", "m2")).ok());
  absl::StatusOr<PublishAck> r = engine->Publish(Ev("s.b", "m3"));
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Msg(r.status()), Catch::StartsWith("stream 'S': its removed log failed earlier ("));
  CHECK_THAT(Msg(r.status()), Catch::Contains("injected ENOSPC"));
}

TEST_CASE("a consumer with replay original gets the stored messages at the pace they were published") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  ManualClock clock(1'000'000'000);
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  clock.Advance(absl::Seconds(10));
  REQUIRE(engine->Publish(Ev("s.a", "m2")).ok());
  clock.Advance(absl::Seconds(5));
  REQUIRE(engine->Publish(Ev("s.a", "m3")).ok());
  clock.Advance(absl::Hours(1));
  auto c = *engine->AddConsumer({.stream = "S",
                                 .name = "shadow",
                                 .deliver = DeliverPolicy::kAll,
                                 .replay = ReplayPolicy::kOriginal});
  auto next = [&] { return NextAcked(*engine, c); };
  CHECK(next() == "m1");
  CHECK(next() == "-");
  clock.Advance(absl::Milliseconds(9'999));
  CHECK(next() == "-");
  clock.Advance(absl::Milliseconds(1));
  CHECK(next() == "m2");
  REQUIRE(engine->Publish(Ev("s.a", "m4")).ok());  // live, 1 h 25 s after m1 was
  clock.Advance(absl::Seconds(5));
  CHECK(next() == "m3");
  CHECK(next() == "-");  // m4 queues behind the replay, at its pace
  clock.Advance(absl::Hours(1) + absl::Seconds(9));
  CHECK(next() == "-");
  clock.Advance(absl::Seconds(1));
  CHECK(next() == "m4");
  // Replay done: the next live message comes at once.
  REQUIRE(engine->Publish(Ev("s.a", "m5")).ok());
  CHECK(next() == "m5");
}

TEST_CASE("an instant replay consumer gets every stored message at once") {
  ManualClock clock(1'000'000'000);
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(Memory()).ok());
  PublishSix(*engine);
  clock.Advance(absl::Hours(1));
  REQUIRE(engine->Publish(Ev("s.z", "m7")).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll});
  int got = 0;
  while (c.member(0)->Next(absl::ZeroDuration()).ok()) ++got;
  CHECK(got == 7);
  ConsumerConfig bad{.stream = "S", .name = "bad", .replay = static_cast<ReplayPolicy>(7)};
  CHECK(Msg(engine->AddConsumer(bad).status()) ==
        "consumer 'bad': replay policy 7 is not a ReplayPolicy");
}

// ---- Found by the adversarial helper. ----

TEST_CASE("a purges file naming records a power cut took from the log applies to what the log has") {
  TempDir d;
  TempDir saved;
  StreamConfig s = File(d.path());
  s.sync = SyncPolicy::kEveryCommit;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    for (int i = 1; i <= 3; ++i) REQUIRE(engine->Publish(Ev("s.a", "m" + std::to_string(i))).ok());
  }
  std::filesystem::copy(d.path(), saved.path(), std::filesystem::copy_options::recursive);
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    for (int i = 4; i <= 5; ++i) REQUIRE(engine->Publish(Ev("s.a", "m" + std::to_string(i))).ok());
    REQUIRE(*engine->PurgeStream("S") == 5);  // the purges file: everything up to 5
  }
  // The power cut: the log as it was before 4 and 5, the purges file as written.
  std::filesystem::copy_file(d / "purges", saved / "purges",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove_all(d.path());
  std::filesystem::rename(saved.path(), d.path());
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    CHECK(SS(*engine, "S").messages == 0);
    // m5 was lost with the log's tail: publishing it again stores it.
    absl::StatusOr<PublishAck> again = engine->Publish(Ev("s.a", "m5"));
    REQUIRE(again.ok());
    CHECK(!again->duplicate);
    CHECK(again->seq == 4);
    REQUIRE(engine->Publish(Ev("s.a", "m6")).ok());
  }
  // The purge made before 4 and 5 were given again never removes them.
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{4, "s.a"}, {5, "s.a"}});
  absl::StatusOr<PublishAck> dup = engine->Publish(Ev("s.a", "m3"));
  REQUIRE(dup.ok());
  CHECK(dup->duplicate);  // the ids the log kept stay in the window
}

TEST_CASE("a purge by the subject '-' stays a purge of that subject after a restart") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream({.name = "S",
                               .subjects = {">"},
                               .storage = StorageType::kFile,
                               .directory = d.path(),
                               .sync = SyncPolicy::kNone})
                .ok());
    for (const char* subject : {"a", "-", "b"}) REQUIRE(engine->Publish(Ev(subject)).ok());
    REQUIRE(*engine->PurgeStream("S", {.subject = "-"}) == 1);
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream({.name = "S",
                             .subjects = {">"},
                             .storage = StorageType::kFile,
                             .directory = d.path(),
                             .sync = SyncPolicy::kNone})
              .ok());
  CHECK(HeldBy(*engine, "S") == Held{{1, "a"}, {3, "b"}});
}

TEST_CASE("first_seq skips a purged message that discard old brings to the front") {
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.max_msgs = 3;
  REQUIRE(engine->AddStream(s).ok());
  for (const char* subject : {"s.a", "s.b", "s.c"}) REQUIRE(engine->Publish(Ev(subject)).ok());
  REQUIRE(*engine->PurgeStream("S", {.subject = "s.b"}) == 1);
  REQUIRE(engine->Publish(Ev("s.d")).ok());
  REQUIRE(engine->Publish(Ev("s.e")).ok());
  CHECK(HeldBy(*engine, "S") == Held{{3, "s.c"}, {4, "s.d"}, {5, "s.e"}});
  CHECK(SS(*engine, "S").first_seq == 3);
}

// ---- Power cuts (PowerCutFileSystem: each file back to its last fdatasync). ----

TEST_CASE("a keep-N purge of a file work queue survives a power cut that the plain acks before it would not") {
  // Found by the adversarial helper: the purges file was synced, the removed log's
  // record of an earlier plain Ack was not, and the replayed keep-1 counted the
  // acked message as held and removed the unacked one before it.
  TempDir d;
  auto disk = std::make_shared<state_test::PowerCutFileSystem>();
  StreamConfig s = File(d.path());
  s.retention = RetentionPolicy::kWorkQueue;
  s.sync = SyncPolicy::kEveryCommit;
  s.file_system = disk;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    for (int i = 1; i <= 3; ++i) REQUIRE(engine->Publish(Ev("s.a", "m" + std::to_string(i))).ok());
    auto c = *engine->AddConsumer({.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll});
    std::vector<Message> got;
    for (int i = 0; i < 3; ++i) got.push_back(*c.member(0)->Next(absl::Seconds(5)));
    REQUIRE(got[2].stream_seq() == 3);
    REQUIRE(got[2].Ack().ok());  // not AckSync: durable with the purge only
    REQUIRE(*engine->PurgeStream("S", {.keep = 1}) == 1);
    CHECK(HeldBy(*engine, "S") == Held{{2, "s.a"}});
  }
  disk->Cut();
  auto engine = *Engine::Create();
  s.file_system = nullptr;
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.a"}});
}

TEST_CASE("what max_msgs_per_subject removed stays removed after a power cut and a higher limit") {
  const auto sync = GENERATE(SyncPolicy::kEveryCommit, SyncPolicy::kGroupCommit);
  INFO("sync " << static_cast<int>(sync));
  TempDir d;
  auto disk = std::make_shared<state_test::PowerCutFileSystem>();
  StreamConfig s = File(d.path());
  s.sync = sync;
  s.max_msgs_per_subject = 1;
  s.file_system = disk;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
    REQUIRE(engine->Publish(Ev("s.a", "m2")).ok());  // acknowledged: 1 is gone for good
    CHECK(HeldBy(*engine, "S") == Held{{2, "s.a"}});
  }
  disk->Cut();
  s.file_system = nullptr;
  s.max_msgs_per_subject = 5;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  CHECK(HeldBy(*engine, "S") == Held{{2, "s.a"}});
}

// ---- Clocks at the ends of int64 (a host's own Clock may start anywhere). ----

namespace {

class SetClock final : public Clock {
 public:
  std::int64_t NowNanos() const override { return now.load(); }
  std::atomic<std::int64_t> now{0};
};

}  // namespace

TEST_CASE("replay at the original pace saturates publish times at the ends of int64") {
  // Found by the adversarial helper: the distance between two publish times
  // overflowed (undefined; in practice it wrapped negative and the second message
  // came at once).
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  SetClock clock;
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  clock.now = INT64_MIN + 10;
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  clock.now = INT64_MAX - 10;
  REQUIRE(engine->Publish(Ev("s.a", "m2")).ok());
  auto c = *engine->AddConsumer({.stream = "S",
                                 .name = "shadow",
                                 .deliver = DeliverPolicy::kAll,
                                 .replay = ReplayPolicy::kOriginal});
  auto next = [&] { return NextAcked(*engine, c); };
  CHECK(next() == "m1");
  CHECK(next() == "-");  // due at the end of time, not at once
  clock.now = INT64_MAX;
  CHECK(next() == "m2");
}

TEST_CASE("a start time beyond the engine clock's range saturates instead of wrapping") {
  TempDir d;
  const bool file = GENERATE(false, true);
  const bool future = GENERATE(false, true);
  INFO((file ? "file" : "memory") << (future ? ", 1000 years ahead" : ", 1000 years ago"));
  SetClock clock;
  // Near the end of int64 that the start time's distance runs away from.
  clock.now = future ? INT64_MAX - 10 : INT64_MIN + 10;
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  const absl::Duration thousand_years = absl::Hours(24 * 365 * 1000);
  auto c = *engine->AddConsumer(
      {.stream = "S",
       .name = "c",
       .deliver = DeliverPolicy::kByStartTime,
       .start_time = future ? absl::Now() + thousand_years : absl::Now() - thousand_years});
  absl::StatusOr<Message> m = c.member(0)->Next(absl::ZeroDuration());
  if (future) {
    CHECK(!m.ok());  // m1 was stored before the start time
  } else {
    REQUIRE(m.ok());  // m1 was stored after it
    CHECK(m->event().msg_id == "m1");
  }
  REQUIRE(engine->Publish(Ev("s.a", "m2")).ok());  // published after the consumer was added
  if (!future) REQUIRE(m->Ack().ok());
  m = c.member(0)->Next(absl::ZeroDuration());
  REQUIRE(m.ok());
  CHECK(m->event().msg_id == "m2");
}

// ---- DeleteConsumer. ----

namespace {

std::string Next(Consumer& c, std::vector<Message>* out = nullptr) {
  absl::StatusOr<Message> m = c.member(0)->Next(absl::ZeroDuration());
  if (!m.ok()) return Msg(m.status());
  const std::string id = m->event().msg_id;
  if (out != nullptr) out->push_back(*std::move(m));
  return id;
}

}  // namespace

TEST_CASE("DeleteConsumer stops its deliveries, refuses its settles and frees its name") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(Memory()).ok());
  const ConsumerConfig cfg{.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll,
                           .ack_wait = absl::Minutes(1)};
  auto c = *engine->AddConsumer(cfg);
  for (const char* id : {"m1", "m2", "m3"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
  std::vector<Message> held;
  REQUIRE(Next(c, &held) == "m1");
  REQUIRE(engine->DeleteConsumer("S", "c").ok());
  CHECK(Next(c) == "consumer 'c' of stream 'S' was deleted");  // m2, m3 were dropped
  CHECK(Msg(held[0].Ack()) == "cannot ack message 1: consumer 'c' of stream 'S' was deleted");
  CHECK(Msg(held[0].InProgress()) ==
        "cannot mark in progress message 1: consumer 'c' of stream 'S' was deleted");
  const EngineStats stats = engine->Stats();
  CHECK(stats.consumer("S", "c") == nullptr);
  CHECK(Msg(engine->DeleteConsumer("S", "c")) == "consumer 'c' of stream 'S' does not exist");
  CHECK(Msg(engine->DeleteConsumer("T", "c")) == "stream 'T' does not exist");
  // The name is free: a consumer added under it starts afresh.
  auto again = *engine->AddConsumer(cfg);
  CHECK(Next(again) == "m1");
  CHECK(Next(again) == "m2");
  CHECK(Next(again) == "m3");
  CHECK(SS(*engine, "S").messages == 3);  // limits retention: nothing left the stream
}

TEST_CASE("DeleteConsumer lets interest retention stop waiting for the deleted consumer") {
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  // a tracked (ack_wait), b not: DeleteConsumer lets go of a's deliveries out with a
  // member at once, and of b's when the member settles them.
  auto a = *engine->AddConsumer({.stream = "S", .name = "a", .ack_wait = absl::Minutes(1)});
  auto b = *engine->AddConsumer({.stream = "S", .name = "b"});
  for (const char* id : {"m1", "m2", "m3"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
  std::vector<Message> out_a, out_b;
  REQUIRE(Next(a, &out_a) == "m1");
  REQUIRE(Next(b, &out_b) == "m1");
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  CHECK(SS(*engine, "S").messages == 3);  // b still owes all three
  REQUIRE(out_b[0].Ack().ok());
  CHECK(SS(*engine, "S").messages == 2);
  REQUIRE(Next(b, &out_b) == "m2");
  REQUIRE(engine->DeleteConsumer("S", "b").ok());
  CHECK(SS(*engine, "S").messages == 1);  // m3 (queued) went; m2 is out with b's member
  CHECK(Msg(out_b[1].Nak()) == "cannot nak message 2: consumer 'b' of stream 'S' was deleted");
  CHECK(SS(*engine, "S").messages == 0);
  CHECK(Msg(out_a[0].Ack()) == "cannot ack message 1: consumer 'a' of stream 'S' was deleted");
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("a work queue keeps a deleted consumer's unacked messages for the next one") {
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  StreamConfig s = file ? File(d.path()) : Memory();
  s.retention = RetentionPolicy::kWorkQueue;
  REQUIRE(engine->AddStream(s).ok());
  auto w = *engine->AddConsumer({.stream = "S", .name = "w", .deliver = DeliverPolicy::kAll,
                                 .ack_wait = absl::Minutes(1)});
  for (const char* id : {"m1", "m2", "m3"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
  std::vector<Message> held;
  REQUIRE(Next(w, &held) == "m1");
  REQUIRE(held[0].Ack().ok());
  REQUIRE(Next(w, &held) == "m2");
  REQUIRE(engine->DeleteConsumer("S", "w").ok());
  CHECK(Msg(held[1].Ack()) == "cannot ack message 2: consumer 'w' of stream 'S' was deleted");
  if (file) CHECK(!std::filesystem::exists(d / "consumers/w"));
  CHECK(SS(*engine, "S").messages == 2);
  auto next = *engine->AddConsumer({.stream = "S", .name = "w", .deliver = DeliverPolicy::kAll});
  std::vector<Message> got;
  CHECK(Next(next, &got) == "m2");
  CHECK(Next(next, &got) == "m3");
  for (Message& m : got) REQUIRE(m.Ack().ok());
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("a durable consumer deleted and added again starts afresh, also after a restart") {
  TempDir d;
  const ConsumerConfig cfg{.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll};
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(File(d.path())).ok());
    auto c = *engine->AddConsumer(cfg);
    for (const char* id : {"m1", "m2"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
    std::vector<Message> got;
    REQUIRE(Next(c, &got) == "m1");
    REQUIRE(got[0].AckSync().ok());
    REQUIRE(engine->DeleteConsumer("S", "c").ok());
    CHECK(!std::filesystem::exists(d / "consumers/c"));
    // Its ack log is closed to records, not failed: a pull says it was deleted.
    CHECK(Next(c) == "consumer 'c' of stream 'S' was deleted");
    auto again = *engine->AddConsumer(cfg);
    got.clear();
    CHECK(Next(again, &got) == "m1");  // its acks went with it
    REQUIRE(got[0].AckSync().ok());
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(File(d.path())).ok());
  auto c = *engine->AddConsumer(cfg);
  CHECK(Next(c) == "m2");  // the new consumer's ack of m1 holds
}

TEST_CASE("the consumer of a registered function is not deleted alone") {
  auto engine = *Engine::Create();
  REQUIRE(engine->RegisterFunction("f", [](const Event&) -> absl::StatusOr<Buffer> {
                  return Buffer::FromString("r");
                }).ok());
  CHECK(Msg(engine->DeleteConsumer("FN_f", "handler")) ==
        "consumer 'handler' of stream 'FN_f' serves a registered function "
        "(Engine::RegisterFunction); it is not deleted alone");
  engine->Close();
  CHECK(Msg(engine->DeleteConsumer("FN_f", "handler")) == "engine is closed");
}

TEST_CASE("DeleteConsumer racing publishers and acking members leaves an interest stream exact") {
  // Under TSan in CI. Consumer a is deleted while messages are published, queued
  // for it, out with its member and being acked; b acks everything. In the end no
  // message may be left waiting for a. a's member pulls one message at a time, or in
  // batches (with cursor consumers a batch claims its sequences at once, and what it
  // claimed when the deletion comes between its pulls is let go of at its end).
  const bool tracked = GENERATE(false, true);
  const bool batches = GENERATE(false, true);
  INFO((tracked ? "a tracked (ack_wait)" : "a untracked") << (batches ? ", batches" : ", one at a time"));
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  ConsumerConfig ca{.stream = "S", .name = "a", .lane_capacity = 64};
  if (tracked) ca.ack_wait = absl::Minutes(5);
  auto a = *engine->AddConsumer(ca);
  auto b = *engine->AddConsumer({.stream = "S", .name = "b", .lane_capacity = 4096});
  constexpr int kN = 3000;
  std::atomic<int> published{0};
  std::thread publisher([&] {
    for (int i = 0; i < kN; ++i) {
      Event e = Ev("s.a");
      // a's full lane refuses; b's never fills. Try again until stored.
      while (!engine->TryPublish(e).ok()) std::this_thread::yield();
      published.fetch_add(1);
    }
  });
  std::thread member_a([&] {
    std::array<Message, 16> batch;
    for (;;) {
      if (batches) {
        absl::StatusOr<std::size_t> n =
            a.member(0)->NextBatch(batch, absl::ZeroDuration(), absl::Milliseconds(50));
        if (!n.ok()) {
          if (n.status().code() == absl::StatusCode::kCancelled) return;
          continue;
        }
        (void)AckBatch(std::span<Message>(batch).first(*n));  // FailedPrecondition once a is deleted
        continue;
      }
      absl::StatusOr<Message> m = a.member(0)->Next(absl::Milliseconds(50));
      if (!m.ok()) {
        if (m.status().code() == absl::StatusCode::kCancelled) return;
        continue;
      }
      (void)m->Ack();  // FailedPrecondition once a is deleted
    }
  });
  int b_acked = 0;
  int b_failed = 0;  // counted here, checked on the test's thread (Catch is not thread-safe)
  std::thread member_b([&] {
    while (b_acked + b_failed < kN) {
      absl::StatusOr<Message> m = b.member(0)->Next(absl::Milliseconds(50));
      if (!m.ok()) continue;
      ++(m->Ack().ok() ? b_acked : b_failed);
    }
  });
  while (published.load() < kN / 3) std::this_thread::yield();
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  publisher.join();
  member_a.join();
  member_b.join();
  CHECK(b_failed == 0);
  CHECK(b_acked == kN);
  CHECK(SS(*engine, "S").messages == 0);
}

// ---- DeleteStream. ----

TEST_CASE("DeleteStream removes the stream, its consumers and its messages, and frees its name") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(Memory()).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .ack_wait = absl::Minutes(1)});
  for (const char* id : {"m1", "m2"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
  std::vector<Message> held;
  REQUIRE(Next(c, &held) == "m1");
  REQUIRE(engine->DeleteStream("S").ok());
  CHECK(Msg(engine->Publish(Ev("s.a", "m3")).status()) == "no stream captures subject 's.a'");
  CHECK(Next(c) == "consumer 'c' of stream 'S' was deleted");
  CHECK(Msg(held[0].Ack()) == "cannot ack message 1: consumer 'c' of stream 'S' was deleted");
  CHECK(held[0].event().msg_id == "m1");  // a Message keeps its own event
  CHECK(Msg(engine->GetMessage("S", 1).status()) == "stream 'S' does not exist");
  CHECK(Msg(engine->DeleteStream("S")) == "stream 'S' does not exist");
  CHECK(Msg(engine->DeleteConsumer("S", "c")) == "stream 'S' does not exist");
  {
    const EngineStats stats = engine->Stats();
    CHECK(stats.stream("S") == nullptr);
    CHECK(stats.consumer("S", "c") == nullptr);
  }
  // Added again: a new stream, empty, its sequences from 1.
  REQUIRE(engine->AddStream(Memory()).ok());
  CHECK(SS(*engine, "S").messages == 0);
  absl::StatusOr<PublishAck> ack = engine->Publish(Ev("s.a", "m1"));
  REQUIRE(ack.ok());
  CHECK(ack->seq == 1);
  CHECK(!ack->duplicate);  // the duplicate window went with the old stream
}

TEST_CASE("DeleteStream removes a file stream's directory, and a stream added over it starts empty") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(File(d.path())).ok());
    REQUIRE(engine->AddConsumer({.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll}).ok());
    for (const char* id : {"m1", "m2"}) REQUIRE(engine->Publish(Ev("s.a", id)).ok());
    REQUIRE(*engine->PurgeStream("S", {.keep = 1}) == 1);
    REQUIRE(engine->DeleteStream("S").ok());
    CHECK(!std::filesystem::exists(d.path()));
    REQUIRE(engine->AddStream(File(d.path())).ok());
    CHECK(SS(*engine, "S").messages == 0);
    absl::StatusOr<PublishAck> ack = engine->Publish(Ev("s.a", "n1"));
    REQUIRE(ack.ok());
    CHECK(ack->seq == 1);
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(File(d.path())).ok());
  CHECK(HeldBy(*engine, "S") == Held{{1, "s.a"}});
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll});
  CHECK(Next(c) == "n1");  // a new consumer of the name: the old one's log went
}

TEST_CASE("the streams of a registered function are not deleted alone") {
  auto engine = *Engine::Create();
  REQUIRE(engine->RegisterFunction("f", [](const Event&) -> absl::StatusOr<Buffer> {
                  return Buffer::FromString("r");
                }).ok());
  CHECK(Msg(engine->DeleteStream("FN_f")) ==
        "stream 'FN_f' serves registered function 'f' (Engine::RegisterFunction); it is not "
        "deleted alone");
  CHECK(Msg(engine->DeleteStream("FN_f_DLQ")) ==
        "stream 'FN_f_DLQ' serves registered function 'f' (Engine::RegisterFunction); it is "
        "not deleted alone");
}

TEST_CASE("DeleteStream racing publishers refuses or stores each publish, never both") {
  // Under TSan in CI. Every publish either is stored (before the delete) or gets
  // NotFound: routed nowhere, or refused by the deleted stream under its mutex.
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(file ? File(d.path()) : Memory()).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 1 << 14});
  std::atomic<bool> stop{false};
  std::atomic<int> stored{0}, refused{0}, other{0};
  std::vector<std::thread> publishers;
  for (int t = 0; t < 2; ++t) {
    publishers.emplace_back([&] {
      while (!stop.load()) {
        absl::StatusOr<PublishAck> r = engine->Publish(Ev("s.a"));
        if (r.ok()) {
          ++stored;
        } else if (r.status().code() == absl::StatusCode::kNotFound &&
                   (Msg(r.status()) == "no stream captures subject 's.a'" ||
                    Msg(r.status()) == "stream 'S' was deleted")) {
          ++refused;
        } else {
          ++other;
        }
      }
    });
  }
  while (stored.load() < 200) std::this_thread::yield();
  REQUIRE(engine->DeleteStream("S").ok());
  const int stored_at_delete = stored.load();
  while (refused.load() < 100) std::this_thread::yield();
  stop = true;
  for (std::thread& t : publishers) t.join();
  CHECK(other.load() == 0);
  CHECK(stored.load() <= stored_at_delete + 2);  // at most one racing publish per thread
  CHECK(Next(c) == "consumer 'c' of stream 'S' was deleted");
}

// ---- PublishAsync. ----

TEST_CASE("PublishAsync's futures share fdatasyncs and each ack holds after a power cut") {
  const auto sync = GENERATE(SyncPolicy::kEveryCommit, SyncPolicy::kGroupCommit);
  INFO("sync " << static_cast<int>(sync));
  TempDir d;
  auto disk = std::make_shared<state_test::PowerCutFileSystem>();
  StreamConfig s = File(d.path());
  s.sync = sync;
  s.file_system = disk;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());
    std::vector<PublishAckFuture> window;
    for (int i = 1; i <= 10; ++i) {
      absl::StatusOr<PublishAckFuture> f = engine->PublishAsync(Ev("s.a", "m" + std::to_string(i)));
      REQUIRE(f.ok());
      window.push_back(*std::move(f));
    }
    for (int i = 1; i <= 10; ++i) {
      absl::StatusOr<PublishAck> ack = window[i - 1].Wait();
      REQUIRE(ack.ok());
      CHECK(ack->seq == static_cast<std::uint64_t>(i));
    }
    CHECK(Msg(window[0].Wait().status()) == "PublishAckFuture::Wait was called already");
    // Published, never waited for: not promised after a power cut.
    REQUIRE(engine->PublishAsync(Ev("s.a", "m11")).ok());
  }
  disk->Cut();
  s.file_system = nullptr;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  Held want;
  for (std::uint64_t seq = 1; seq <= 10; ++seq) want.emplace_back(seq, "s.a");
  CHECK(HeldBy(*engine, "S") == want);
}

TEST_CASE("ten PublishAsync futures waited in order cost one fdatasync of the stream's log") {
  TempDir d;
  auto counting = std::make_shared<state_test::FaultyFileSystem>();
  StreamConfig s = File(d.path());
  s.sync = SyncPolicy::kEveryCommit;
  s.file_system = counting;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(s).ok());
  std::vector<PublishAckFuture> window;
  for (int i = 0; i < 10; ++i) window.push_back(*engine->PublishAsync(Ev("s.a")));
  const int before = counting->calls("sync");
  for (PublishAckFuture& f : window) REQUIRE(f.Wait().ok());
  CHECK(counting->calls("sync") - before == 1);
  // Publish, for comparison: one each.
  const int before_sync = counting->calls("sync");
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("s.a")).ok());
  CHECK(counting->calls("sync") - before_sync == 3);
}

TEST_CASE("PublishAsync returns Publish's refusals at once, and a memory stream's ack on Wait") {
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(Memory()).ok());
  CHECK(Msg(engine->PublishAsync(Ev("t.a")).status()) == "no stream captures subject 't.a'");
  absl::StatusOr<PublishAckFuture> f = engine->PublishAsync(Ev("s.a", "m1"));
  REQUIRE(f.ok());
  absl::StatusOr<PublishAck> ack = f->Wait();
  REQUIRE(ack.ok());
  CHECK(ack->seq == 1);
  CHECK(ack->streams_stored == 1);
  PublishAckFuture empty;
  CHECK(Msg(empty.Wait().status()) == "an empty PublishAckFuture");
}

// ---- Front trims across restarts. ----

TEST_CASE("what max_msgs trimmed from a file stream stays gone under higher limits") {
  TempDir d;
  TempDir copy;
  StreamConfig s = File(d.path());
  s.max_msgs = 3;
  const bool by_update = GENERATE(false, true);
  INFO((by_update ? "max_msgs set by UpdateStream" : "max_msgs set at AddStream"));
  {
    auto engine = *Engine::Create();
    StreamConfig first = s;
    if (by_update) first.max_msgs = -1;
    REQUIRE(engine->AddStream(first).ok());
    if (by_update) REQUIRE(engine->UpdateStream(s).ok());
    for (int i = 1; i <= 200; ++i) REQUIRE(engine->Publish(Ev("s.a")).ok());
    // A crash now: the files as the page cache holds them. Floor records go every
    // 64 trims: the last says 192 (at most 63 trims are lost to a crash); 193 when
    // UpdateStream recorded its front (1) at once, and the next ones 64 apart.
    std::filesystem::copy(d.path(), copy.path(), std::filesystem::copy_options::recursive);
    std::filesystem::remove(copy / "LOCK");
  }
  s.max_msgs = -1;  // no limit from now on
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(s).ok());  // after a clean end: exactly what was held
    CHECK(HeldBy(*engine, "S") == Held{{198, "s.a"}, {199, "s.a"}, {200, "s.a"}});
    CHECK(SS(*engine, "S").first_seq == 198);
  }
  StreamConfig crashed = s;
  crashed.directory = copy.path();
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(crashed).ok());
  CHECK(SS(*engine, "S").messages == (by_update ? 8 : 9));  // 193 (192) .. 200
  CHECK(SS(*engine, "S").first_seq == (by_update ? 193 : 192));
}

TEST_CASE("DeleteConsumer frees a publisher blocked on the deleted consumer's full lane") {
  // The publisher holds the stream's mutex while it waits for room; the delete
  // closes the lanes before it takes that mutex, and the publish is stored.
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(Memory()).ok());
  (void)*engine->AddConsumer({.stream = "S", .name = "c", .lane_capacity = 2});
  for (int i = 0; i < 2; ++i) REQUIRE(engine->Publish(Ev("s.a")).ok());
  std::atomic<bool> returned{false};
  absl::StatusOr<PublishAck> blocked;
  std::thread publisher([&] {
    blocked = engine->Publish(Ev("s.a", "m3"));  // the lane is full: waits
    returned = true;
  });
  // TryPublish says when a Publish holds the stream blocked (else: the lane is full).
  while (Msg(engine->TryPublish(Ev("s.a")).status()).find("a Publish is blocked") ==
         std::string::npos) {
    std::this_thread::yield();
  }
  std::atomic<bool> deleted{false};
  std::thread deleter([&] {
    (void)engine->DeleteConsumer("S", "c");
    deleted = true;
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((!deleted || !returned) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!deleted || !returned) {
    FAIL_CHECK("DeleteConsumer and the blocked Publish did not both return in 20 s");
    std::_Exit(1);  // a deadlock: the threads cannot be joined
  }
  deleter.join();
  publisher.join();
  REQUIRE(blocked.ok());
  CHECK(blocked->seq == 3);
  CHECK(SS(*engine, "S").messages == 3);
}

TEST_CASE("DeleteConsumer racing members that ack and nak leaves an interest stream exact") {
  // Found by the adversarial helper (up to 481 messages left waiting for the deleted
  // consumer): naks redelivered, parked or scheduled after DeleteConsumer's sweep,
  // and deliveries popped before it and tracked after it, never let go. Consumer a
  // (4 members) is deleted while they settle; b acks everything.
  const int mode = GENERATE(0, 1, 2, 3, 4);
  const bool tracked = mode == 0 || mode == 1 || mode == 4;
  INFO("mode " << mode << (tracked ? " (a tracked)" : " (a untracked)"));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto engine = *Engine::Create();
    StreamConfig s = Memory();
    s.retention = RetentionPolicy::kInterest;
    REQUIRE(engine->AddStream(s).ok());
    ConsumerConfig ca{.stream = "S", .name = "a", .members = 4, .lane_capacity = 64};
    if (tracked) ca.ack_wait = absl::Minutes(5);
    auto a = *engine->AddConsumer(ca);
    auto b = *engine->AddConsumer({.stream = "S", .name = "b", .lane_capacity = 4096});
    constexpr int kN = 1000;
    std::atomic<int> published{0};
    std::thread publisher([&] {
      for (int i = 0; i < kN; ++i) {
        while (!engine->TryPublish(Ev("s.a")).ok()) std::this_thread::yield();
        published.fetch_add(1);
      }
    });
    std::vector<std::thread> members_a;
    for (std::uint32_t k = 0; k < 4; ++k) {
      members_a.emplace_back([&, k] {
        Member m = *a.member(k);
        for (;;) {
          absl::StatusOr<Message> r = m.Next(absl::Milliseconds(20));
          if (!r.ok()) {
            if (r.status().code() == absl::StatusCode::kCancelled) return;
            continue;
          }
          if (mode == 0 || r->attempt() > 1) {
            (void)r->Ack();
          } else if (mode == 3 || mode == 4) {
            (void)r->Nak(absl::Microseconds(50));
          } else {
            (void)r->Nak();
          }
        }
      });
    }
    int b_acked = 0;
    std::thread member_b([&] {
      Member m = *b.member(0);
      while (b_acked < kN) {
        absl::StatusOr<Message> r = m.Next(absl::Milliseconds(50));
        if (r.ok() && r->Ack().ok()) ++b_acked;
      }
    });
    while (published.load() < kN / 3 + round * 150) std::this_thread::yield();
    REQUIRE(engine->DeleteConsumer("S", "a").ok());
    publisher.join();
    for (std::thread& t : members_a) t.join();
    member_b.join();
    CHECK(SS(*engine, "S").messages == 0);
  }
}

TEST_CASE("DeleteConsumer lets go of every dead letter its full consumer still had queued") {
  // Dead letters (an internal publish never waits) pile up behind a message the
  // consumer's only member holds: parked behind its full lanes, or, for a cursor
  // consumer (INFERQ_CURSOR_CONSUMERS=1), past the end of its window, which the held
  // message keeps from moving; its deletion's sweep could not settle what lay beyond
  // and left it waiting for the deleted consumer (found by the adversarial helper).
  const bool tracked = GENERATE(true, false);
  INFO((tracked ? "tracked" : "untracked"));
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  REQUIRE(engine->AddStream({.name = "SRC", .subjects = {"src.>"}}).ok());
  auto src = *engine->AddConsumer({.stream = "SRC", .name = "src", .dead_letter_subject = "s.dl"});
  ConsumerConfig ca{.stream = "S", .name = "a", .lane_capacity = 2};
  if (tracked) ca.ack_wait = absl::Minutes(5);
  auto a = *engine->AddConsumer(ca);
  constexpr int kN = 100;
  for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Ev("src.x")).ok());
  Member terminator = *src.member(0);
  auto term_one = [&] {
    absl::StatusOr<Message> r = terminator.Next(absl::Seconds(5));
    REQUIRE(r.ok());
    REQUIRE(r->Term("to S").ok());
  };
  term_one();
  engine->RunTimers();  // (a dead letter deferred to the outbox, if any)
  absl::StatusOr<Message> held = a.member(0)->Next(absl::Seconds(5));
  REQUIRE(held.ok());
  for (int i = 1; i < kN; ++i) term_one();
  engine->RunTimers();
  CHECK(SS(*engine, "S").messages == kN);
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  // The held message lets go when it is dropped (untracked) or at once (tracked).
  CHECK(SS(*engine, "S").messages == (tracked ? 0 : 1));
  held = absl::CancelledError("dropped");
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("DeleteConsumer racing parked first deliveries of a tracked consumer leaves an interest stream exact") {
  // The smallest reproduction of the rare failure of the case above: a first delivery
  // parked off a full lane, taken out of `parked` by a RetryParked just before
  // DeleteConsumer's sweep, met the closed lanes after it and was dropped without
  // letting go of the stream (a tracked consumer's first delivery has no pending
  // entry for the sweep to find). Dead letters park first deliveries whenever the
  // lanes are full (an internal publish never waits), so here every message of S is
  // one: consumer `src` terms what it pulls from SRC, its dead letters go to S, and
  // consumer `a` of S (lanes of two slots) is deleted while they pour in. With one
  // member (a cursor consumer under INFERQ_CURSOR_CONSUMERS=1) the dead letters go
  // past the cursor's window, and the sweep left what lay beyond it (the adversarial
  // helper: up to 229 messages kept), tracked or not.
  const std::uint32_t members = GENERATE(1u, 2u);
  const bool tracked = GENERATE(true, false);
  INFO(members << " member(s), " << (tracked ? "tracked" : "untracked"));
  for (int round = 0; round < 5; ++round) {
    CAPTURE(round);
    auto engine = *Engine::Create();
    StreamConfig s = Memory();
    s.retention = RetentionPolicy::kInterest;
    REQUIRE(engine->AddStream(s).ok());
    REQUIRE(engine->AddStream({.name = "SRC", .subjects = {"src.>"}}).ok());
    auto src = *engine->AddConsumer({.stream = "SRC", .name = "src", .dead_letter_subject = "s.dl"});
    ConsumerConfig ca{.stream = "S", .name = "a", .members = members, .lane_capacity = 2};
    if (tracked) ca.ack_wait = absl::Minutes(5);
    auto a = *engine->AddConsumer(ca);
    constexpr int kN = 400;
    std::atomic<int> refused{0};
    std::thread publisher([&] {
      for (int i = 0; i < kN; ++i) {
        if (!engine->Publish(Ev("src.x")).ok()) refused.fetch_add(1);
      }
    });
    std::atomic<int> termed{0};
    std::thread terminator([&] {
      Member m = *src.member(0);
      while (termed.load() < kN) {
        absl::StatusOr<Message> r = m.Next(absl::Milliseconds(50));
        if (r.ok() && r->Term("to S").ok()) termed.fetch_add(1);
      }
    });
    std::vector<std::thread> pullers;
    for (std::uint32_t k = 0; k < members; ++k) {
      pullers.emplace_back([&, k] {
        Member m = *a.member(k);
        for (;;) {
          absl::StatusOr<Message> r = m.Next(absl::Milliseconds(20));
          if (!r.ok()) {
            if (r.status().code() == absl::StatusCode::kCancelled) return;
            continue;
          }
          (void)r->Ack();
        }
      });
    }
    while (termed.load() < kN / 4 + round * 10) std::this_thread::yield();
    REQUIRE(engine->DeleteConsumer("S", "a").ok());
    publisher.join();
    terminator.join();
    for (std::thread& t : pullers) t.join();
    CHECK(refused.load() == 0);
    // Dead letters stored before the deletion: a let go of them; after it: nobody
    // waited for them.
    CHECK(SS(*engine, "S").messages == 0);
  }
}

TEST_CASE("DeleteConsumer returns after a timer run that holds the consumer's redeliveries") {
  // A run of the timers takes the due delayed naks off the consumer's wheel and
  // queues them after it lets go of the wheel's lock: DeleteConsumer's sweep meanwhile
  // found neither them nor, later, the lanes they were headed for, and returned while
  // the run still held them; the stream kept them until the run ended (found as the
  // untracked mode of the case above failing on a loaded machine). DeleteConsumer now
  // waits for the run, so the stream is exact when it returns.
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    auto engine = *Engine::Create({.manual_timers = true});
    StreamConfig s = Memory();
    s.retention = RetentionPolicy::kInterest;
    REQUIRE(engine->AddStream(s).ok());
    auto a = *engine->AddConsumer({.stream = "S", .name = "a", .members = 2, .lane_capacity = 4096});
    constexpr int kN = 4000;
    for (int i = 0; i < kN; ++i) REQUIRE(engine->Publish(Ev("s.a")).ok());
    int naked = 0;
    for (std::uint32_t k = 0; k < 2; ++k) {
      Member m = *a.member(k);
      for (;;) {
        absl::StatusOr<Message> r = m.Next(absl::ZeroDuration());
        if (!r.ok()) break;
        REQUIRE(r->Nak(absl::Nanoseconds(1)).ok());
        ++naked;
      }
    }
    REQUIRE(naked == kN);
    std::this_thread::sleep_for(std::chrono::microseconds(10));  // every nak is due
    std::atomic<bool> started{false};
    std::thread timers([&] {
      started.store(true);
      engine->RunTimers();
    });
    while (!started.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(round * 20));
    REQUIRE(engine->DeleteConsumer("S", "a").ok());
    const std::uint64_t left = SS(*engine, "S").messages;
    timers.join();
    CHECK(left == 0);
    CHECK(SS(*engine, "S").messages == 0);
  }
}

TEST_CASE("a work queue's publish blocked on the full lane of a consumer being deleted leaves its message to the next consumer") {
  // Found by the adversarial helper: the publish whose lane closed under it gave back
  // the deleted consumer's count only under interest retention, so a work queue's
  // message kept it, the next consumer added its own, and its ack left the message
  // in the stream forever (1 of 3 messages left, 5 of 5 runs).
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kWorkQueue;
  REQUIRE(engine->AddStream(s).ok());
  auto a = *engine->AddConsumer({.stream = "S", .name = "a", .deliver = DeliverPolicy::kAll, .lane_capacity = 2});
  REQUIRE(engine->Publish(Ev("s.x", "m1")).ok());
  REQUIRE(engine->Publish(Ev("s.x", "m2")).ok());
  absl::Status third;
  std::thread blocked([&] { third = engine->Publish(Ev("s.x", "m3")).status(); });  // waits: a's lane is full
  // TryPublish says when a Publish holds the stream blocked (else: the lane is full).
  const auto start = std::chrono::steady_clock::now();
  bool waits = false;
  while (!waits && std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    waits = Msg(engine->TryPublish(Ev("s.y", "probe")).status()).find("a Publish is blocked") !=
            std::string::npos;
    if (!waits) std::this_thread::yield();
  }
  REQUIRE(waits);  // within 20 s
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  blocked.join();
  CHECK(third.ok());
  CHECK(SS(*engine, "S").messages == 3);
  auto b = *engine->AddConsumer({.stream = "S", .name = "b", .deliver = DeliverPolicy::kAll});
  Member m = *b.member(0);
  std::vector<std::string> acked;
  for (;;) {
    absl::StatusOr<Message> r = m.Next(absl::Milliseconds(200));
    if (!r.ok()) break;
    if (r->Ack().ok()) acked.push_back(r->event().msg_id);
  }
  CHECK(acked == std::vector<std::string>{"m1", "m2", "m3"});
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("a deleted untracked consumer's Message dropped unsettled lets go of the stream") {
  auto engine = *Engine::Create();
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c"});
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  {
    std::vector<Message> held;
    REQUIRE(Next(c, &held) == "m1");
    REQUIRE(engine->DeleteConsumer("S", "c").ok());
    CHECK(SS(*engine, "S").messages == 1);  // out with the member
  }
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("deleting a stream removes only its own directory, through a symbolic link too") {
  // Found by the adversarial helper: the delete cleared ".deleted-<name>" beside the
  // directory first, which was another stream's; and it renamed a symbolic link
  // instead of the directory it names.
  TempDir d;
  auto engine = *Engine::Create();
  StreamConfig a = File(d / "y");
  StreamConfig b = File(d / ".deleted-y");
  b.name = "B";
  b.subjects = {"b.>"};
  REQUIRE(engine->AddStream(a).ok());
  REQUIRE(engine->AddStream(b).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(engine->Publish(Ev("b.x")).ok());
  REQUIRE(engine->DeleteStream("S").ok());
  CHECK(!std::filesystem::exists(d / "y"));
  CHECK(std::filesystem::exists(d / ".deleted-y"));
  CHECK(SS(*engine, "B").messages == 3);

  std::filesystem::create_directories(d / "real");
  std::filesystem::create_directory_symlink(d / "real", d / "link");
  StreamConfig linked = File(d / "link/S");
  REQUIRE(engine->AddStream(linked).ok());
  REQUIRE(engine->Publish(Ev("s.a")).ok());
  REQUIRE(engine->DeleteStream("S").ok());
  CHECK(!std::filesystem::exists(d / "real/S"));
  CHECK(std::filesystem::is_symlink(d / "link"));
  REQUIRE(engine->AddStream(linked).ok());  // its lock went with it
  CHECK(SS(*engine, "S").messages == 0);
}

TEST_CASE("ack waits, nak delays and queue timeouts fire on a clock that reads below zero") {
  // Found by the adversarial helper: a deadline past a negative reading overflowed
  // and saturated to never.
  ManualClock clock(-10'000'000'000);
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(Memory()).ok());
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .ack_wait = absl::Seconds(1)});
  REQUIRE(engine->Publish(Ev("s.a", "m1")).ok());
  std::vector<Message> held;
  REQUIRE(Next(c, &held) == "m1");
  clock.Advance(absl::Seconds(2));
  engine->RunTimers();
  absl::StatusOr<Message> again = c.member(0)->Next(absl::ZeroDuration());
  REQUIRE(again.ok());
  CHECK(again->attempt() == 2);
  REQUIRE(again->Nak(absl::Seconds(1)).ok());
  CHECK(Next(c) == "no message for consumer 'c' member 0 before the timeout");
  clock.Advance(absl::Seconds(2));
  engine->RunTimers();
  absl::StatusOr<Message> third = c.member(0)->Next(absl::ZeroDuration());
  REQUIRE(third.ok());
  CHECK(third->attempt() == 3);
}

TEST_CASE("stats sources: a component's figures appear in Stats until it is removed") {
  auto engine = Engine::Create();
  REQUIRE(engine.ok());
  Engine& e = **engine;
  std::atomic<int> calls{0};
  auto id = e.AddStatsSource("bridge.a", [&](ComponentStats& out) {
    ++calls;
    CHECK(out.name == "bridge.a");
    out.values = {{"connected", 1}, {"exported_total", 42}};
    out.detail = "last error: none";
  });
  REQUIRE(id.ok());
  auto other = e.AddStatsSource("bridge.b", [](ComponentStats& out) {
    out.name = "renamed";  // the engine keeps the source's own name
    out.values = {{"x", 2.5}};
  });
  REQUIRE(other.ok());
  CHECK(*other != *id);

  SECTION("bad sources are refused") {
    CHECK(e.AddStatsSource("bridge.a", [](ComponentStats&) {}).status().code() ==
          absl::StatusCode::kAlreadyExists);
    CHECK(std::string(e.AddStatsSource("", [](ComponentStats&) {}).status().message()) ==
          "stats source name '' must be 1..256 bytes");
    CHECK(std::string(e.AddStatsSource("c", nullptr).status().message()) == "stats source 'c' has no function");
    CHECK(std::string(e.RemoveStatsSource(999).message()) == "no stats source 999 is attached");
  }

  EngineStats s = e.Stats();
  REQUIRE(s.components.size() == 2);
  const ComponentStats* a = s.component("bridge.a");
  REQUIRE(a != nullptr);
  CHECK(a->value("connected") == std::optional<double>(1));
  CHECK(a->value("exported_total") == std::optional<double>(42));
  CHECK(a->value("missing") == std::nullopt);
  CHECK(a->detail == "last error: none");
  CHECK(s.components[1].name == "bridge.b");
  CHECK(s.components[1].value("x") == std::optional<double>(2.5));
  CHECK(calls == 1);

  REQUIRE(e.RemoveStatsSource(*id).ok());
  CHECK(e.RemoveStatsSource(*id).code() == absl::StatusCode::kNotFound);
  s = e.Stats();
  CHECK(calls == 1);
  REQUIRE(s.components.size() == 1);
  CHECK(s.component("bridge.a") == nullptr);
  CHECK(s.components[0].name == "bridge.b");
}

TEST_CASE("TryPublish tells busy streams (a full kBlock lane) from refusing ones") {
  auto engine = Engine::Create();
  REQUIRE(engine.ok());
  Engine& e = **engine;
  REQUIRE(e.AddStream({.name = "BLOCK", .subjects = {"b.>", "all.>"}}).ok());
  REQUIRE(e.AddStream({.name = "REJECT", .subjects = {"r.>", "all.>"}}).ok());
  REQUIRE(e.AddStream({.name = "OPEN", .subjects = {"o.>"}}).ok());
  REQUIRE(e.AddConsumer({.stream = "BLOCK", .name = "c", .lane_capacity = 2}).ok());
  REQUIRE(e.AddConsumer({.stream = "REJECT", .name = "c", .lane_capacity = 2, .overflow = OverflowPolicy::kReject})
              .ok());
  auto ev = [](std::string subject) {
    Event x;
    x.subject = std::move(subject);
    return x;
  };
  for (int i = 0; i < 2; ++i) REQUIRE(e.TryPublish(ev("all.x")).ok());  // both lanes full now

  auto busy_only = e.TryPublish(ev("b.x"));
  REQUIRE_FALSE(busy_only.ok());
  CHECK(busy_only.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(WouldBlock(busy_only.status()));

  auto reject_only = e.TryPublish(ev("r.x"));
  REQUIRE_FALSE(reject_only.ok());
  CHECK_FALSE(WouldBlock(reject_only.status()));

  auto both = e.TryPublish(ev("all.x"));
  REQUIRE_FALSE(both.ok());
  CHECK_FALSE(WouldBlock(both.status()));  // one of them would refuse anyway

  REQUIRE(e.AddStream({.name = "ALSO", .subjects = {"b.>"}}).ok());
  auto partial = e.TryPublish(ev("b.y"));  // ALSO stores it, BLOCK is busy
  REQUIRE(partial.ok());
  CHECK(partial->streams_stored == 1);
  CHECK(partial->streams_rejected == 1);
  CHECK(partial->streams_busy == 1);
  auto open = e.TryPublish(ev("o.x"));
  REQUIRE(open.ok());
  CHECK(open->streams_busy == 0);
  CHECK_FALSE(WouldBlock(absl::ResourceExhaustedError("not from TryPublish")));
}

// ---- DeleteConsumer under load: every way a message reaches consumer `a` (a first
// delivery, a nak, a redelivery by ack_wait, a queue timeout, a dead letter past
// max_deliver, a Message dropped unsettled) racing its deletion. Found by an
// adversarial review: a message whose interest `a` gave back twice (a queue timeout's
// dead letter, then a publish that met a's closed lane; or, with cursor consumers, an
// ack, nak or term landing after the deletion's sweep let go of it) left the stream
// while consumer `hold` still needed it: about one message in each full run of the
// configurations below before the fix. ----
namespace {

struct DeleteUnderLoad {
  bool tracked = false;        // ack_wait 3 ms (redeliveries, dropped Messages)
  bool queue_timeout = false;  // queue_timeout 500 µs
  bool via_dead_letters = true;  // S is fed by another consumer's dead letters
  bool manual_timers = false;  // timers on a thread of the test's
  OverflowPolicy overflow = OverflowPolicy::kBlock;
  int max_deliver = -1;
  bool work_queue = false;
};

// `hold` (interest streams) pulls everything and acks nothing until `a` is gone, so S
// must keep every message it stored until then: a double release by `a` shows as fewer.
// A work queue's messages left by `a` go to a new consumer, which acks them all.
void RunDeleteUnderLoad(const DeleteUnderLoad& k, int round) {
  EngineOptions eo;
  eo.manual_timers = k.manual_timers;
  auto engine = *Engine::Create(eo);
  StreamConfig s = Memory();
  s.retention = k.work_queue ? RetentionPolicy::kWorkQueue : RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  REQUIRE(engine->AddStream({.name = "SRC", .subjects = {"src.>"}}).ok());
  auto src = *engine->AddConsumer({.stream = "SRC", .name = "src", .dead_letter_subject = "s.dl"});
  std::optional<Consumer> hold;
  if (!k.work_queue) hold = *engine->AddConsumer({.stream = "S", .name = "hold", .lane_capacity = 1 << 16});
  ConsumerConfig ca{.stream = "S", .name = "a", .members = 2, .lane_capacity = 2};
  ca.overflow = k.overflow;
  if (k.work_queue) ca.deliver = DeliverPolicy::kAll;
  if (k.tracked) ca.ack_wait = absl::Milliseconds(3);
  if (k.queue_timeout) ca.queue_timeout = absl::Microseconds(500);
  if (k.max_deliver > 0) ca.max_deliver = k.max_deliver;
  auto a = *engine->AddConsumer(ca);
  constexpr int kN = 600;
  std::atomic<bool> stop{false};
  std::atomic<int> termed{0};
  std::thread publisher([&] {
    for (int i = 0; i < kN; ++i) {
      if (k.via_dead_letters) {
        (void)engine->Publish(Ev("src.x"));
      } else {
        while (!engine->TryPublish(Ev("s.x")).ok() && !stop.load()) std::this_thread::yield();
      }
    }
  });
  std::thread terminator([&] {  // each message of SRC goes to S as a dead letter
    Member m = *src.member(0);
    while (!stop.load()) {
      absl::StatusOr<Message> r = m.Next(absl::Milliseconds(5));
      if (r.ok() && r->Term("to S").ok()) termed.fetch_add(1);
    }
  });
  std::thread timers;
  if (k.manual_timers) {
    timers = std::thread([&] {
      while (!stop.load()) {
        engine->RunTimers();
        std::this_thread::yield();
      }
    });
  }
  std::vector<std::thread> members;
  for (std::uint32_t i = 0; i < 2; ++i) {
    members.emplace_back([&, i] {
      Member mem = *a.member(i);
      unsigned x = 12345 + i * 7 + static_cast<unsigned>(round);  // a fixed mix of settles
      for (;;) {
        absl::StatusOr<Message> r = mem.Next(absl::Milliseconds(5));
        if (!r.ok()) {
          if (r.status().code() == absl::StatusCode::kCancelled) return;
          continue;
        }
        x = x * 1103515245 + 12345;
        switch ((x >> 16) % 6) {
          case 0: case 1: (void)r->Ack(); break;
          case 2: (void)r->Nak(); break;
          case 3: (void)r->Nak(absl::Microseconds(200)); break;
          case 4:  // dropped unsettled (tracked only: an untracked consumer never learns)
            if (!k.tracked) (void)r->Ack();
            break;
          case 5: std::this_thread::sleep_for(std::chrono::microseconds(300)); (void)r->Ack(); break;
        }
      }
    });
  }
  std::vector<Message> held;
  std::atomic<bool> hold_stop{false};
  std::thread holder;
  if (hold) {
    holder = std::thread([&] {
      Member m = *hold->member(0);
      while (!hold_stop.load()) {
        absl::StatusOr<Message> r = m.Next(absl::Milliseconds(5));
        if (r.ok()) held.push_back(*std::move(r));
      }
      for (;;) {
        absl::StatusOr<Message> r = m.Next(absl::ZeroDuration());
        if (!r.ok()) break;
        held.push_back(*std::move(r));
      }
    });
  }
  const std::uint64_t target = 50 + static_cast<std::uint64_t>(round) * 97 % 400;
  const auto waited = std::chrono::steady_clock::now();
  while (SS(*engine, "S").last_seq < target) {
    REQUIRE(std::chrono::steady_clock::now() - waited < std::chrono::seconds(60));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  publisher.join();
  // Bounded wait for the dead letters still under way (60 s on a loaded machine).
  for (int i = 0; i < 60000 && termed.load() < kN && k.via_dead_letters; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop.store(true);
  terminator.join();
  if (timers.joinable()) timers.join();
  for (std::thread& t : members) t.join();
  engine->RunTimers();
  const std::uint64_t stored = SS(*engine, "S").last_seq;
  CHECK(stored == kN);
  if (hold) {
    hold_stop.store(true);
    holder.join();
    CHECK(held.size() == stored);
    CHECK(SS(*engine, "S").messages == stored);  // hold has acked nothing yet
    for (Message& m : held) REQUIRE(m.Ack().ok());
    held.clear();
  } else {
    auto b = *engine->AddConsumer(
        {.stream = "S", .name = "b", .deliver = DeliverPolicy::kAll, .lane_capacity = 1 << 16});
    Member m = *b.member(0);
    engine->RunTimers();  // flushes deferred dead letters
    for (int idle = 0; idle < 1000 && SS(*engine, "S").messages != 0;) {
      absl::StatusOr<Message> r = m.Next(absl::Milliseconds(2));
      if (!r.ok()) {
        ++idle;
        continue;
      }
      REQUIRE(r->Ack().ok());
    }
  }
  CHECK(SS(*engine, "S").messages == 0);
}

}  // namespace

TEST_CASE("DeleteConsumer under load keeps an interest stream's count exact") {
  DeleteUnderLoad k;
  k.tracked = GENERATE(false, true);
  k.queue_timeout = GENERATE(false, true);
  k.via_dead_letters = GENERATE(true, false);
  k.manual_timers = GENERATE(false, true);
  k.overflow = GENERATE(OverflowPolicy::kBlock, OverflowPolicy::kDropOldest);
  k.max_deliver = GENERATE(-1, 2);
  CAPTURE(k.tracked, k.queue_timeout, k.via_dead_letters, k.manual_timers,
          static_cast<int>(k.overflow), k.max_deliver);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    RunDeleteUnderLoad(k, round);
  }
}

TEST_CASE("DeleteConsumer under load leaves a work queue's messages to the next consumer") {
  DeleteUnderLoad k;
  k.work_queue = true;
  k.tracked = GENERATE(false, true);
  k.queue_timeout = GENERATE(false, true);
  k.via_dead_letters = GENERATE(true, false);
  k.overflow = GENERATE(OverflowPolicy::kBlock, OverflowPolicy::kDropOldest);
  CAPTURE(k.tracked, k.queue_timeout, k.via_dead_letters, static_cast<int>(k.overflow));
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    RunDeleteUnderLoad(k, round);
  }
}

// Found by the adversarial helper (cursor consumers): a message with a ttl, nak'd (or
// whose ack wait ran out) and waiting to be delivered again, was never let go when its
// consumer was deleted: the sweep took the `taken` bit, which the member's first claim
// had set, for the timer's expiry. The stream kept it forever (1 == 0).
TEST_CASE("a nak'd message with a ttl, waiting to be delivered again, lets go when its consumer is deleted") {
  const bool tracked = GENERATE(false, true);
  const bool delayed = GENERATE(false, true);
  CAPTURE(tracked, delayed);
  EngineOptions eo;
  eo.manual_timers = true;
  auto engine = *Engine::Create(eo);
  StreamConfig s = Memory();
  s.retention = RetentionPolicy::kInterest;
  REQUIRE(engine->AddStream(s).ok());
  auto hold = *engine->AddConsumer({.stream = "S", .name = "hold"});
  ConsumerConfig ca{.stream = "S", .name = "a"};
  if (tracked) ca.ack_wait = absl::Seconds(30);
  auto a = *engine->AddConsumer(ca);
  Event e = Ev("s.x", "m1");
  e.ttl = absl::Seconds(60);
  REQUIRE(engine->Publish(std::move(e)).ok());
  absl::StatusOr<Message> m = a.member(0)->Next(absl::ZeroDuration());
  REQUIRE(m.ok());
  REQUIRE(m->Nak(delayed ? absl::Seconds(10) : absl::ZeroDuration()).ok());
  REQUIRE(engine->DeleteConsumer("S", "a").ok());
  CHECK(SS(*engine, "S").messages == 1);  // hold's
  absl::StatusOr<Message> h = hold.member(0)->Next(absl::ZeroDuration());
  REQUIRE(h.ok());
  REQUIRE(h->Ack().ok());
  engine->RunTimers();
  CHECK(SS(*engine, "S").messages == 0);
}

// Found by the adversarial helper (cursor consumers, tracked): a member whose claim
// found the message's ttl passed let go of it although DeleteConsumer's sweep, which
// saw the claim on its way, had already: one message too few (6053 == 6054) in 3 of
// 150 rounds under load. `hold` pulls at once and keeps what it gets, so the stream
// must hold exactly what hold holds.
TEST_CASE("an expiry at the pull racing DeleteConsumer lets go of the message once") {
  const bool tracked = GENERATE(true, false);
  CAPTURE(tracked);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    EngineOptions eo;
    eo.manual_timers = true;  // every expiry at a pull
    auto engine = *Engine::Create(eo);
    StreamConfig s = Memory();
    s.retention = RetentionPolicy::kInterest;
    REQUIRE(engine->AddStream(s).ok());
    auto hold = *engine->AddConsumer({.stream = "S", .name = "hold", .lane_capacity = 1 << 16});
    std::vector<Message> held;
    std::atomic<bool> hold_stop{false};
    std::thread holder([&] {
      Member m = *hold.member(0);
      while (!hold_stop.load()) {
        absl::StatusOr<Message> r = m.Next(absl::Milliseconds(5));
        if (r.ok()) held.push_back(*std::move(r));
      }
    });
    std::atomic<bool> stop{false};
    std::thread publisher([&] {
      while (!stop.load()) {
        for (int i = 0; i < 20; ++i) {
          Event e = Ev("s.x");
          e.ttl = absl::Milliseconds(2);
          (void)engine->Publish(std::move(e));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    ConsumerConfig ca{.stream = "S", .name = "a", .lane_capacity = 1024};
    if (tracked) ca.ack_wait = absl::Seconds(30);
    for (int incarnation = 0; incarnation < 40; ++incarnation) {
      auto a = *engine->AddConsumer(ca);
      std::thread member([&] {
        Member mem = *a.member(0);
        for (;;) {
          std::this_thread::sleep_for(std::chrono::milliseconds(3));  // long enough to expire
          absl::StatusOr<Message> r = mem.Next(absl::Milliseconds(1));
          if (r.ok()) {
            (void)r->Ack();
          } else if (r.status().code() == absl::StatusCode::kCancelled) {
            return;
          }
        }
      });
      std::this_thread::sleep_for(std::chrono::microseconds(3000 + (incarnation * 379) % 3000));
      REQUIRE(engine->DeleteConsumer("S", "a").ok());
      member.join();
    }
    stop.store(true);
    publisher.join();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    hold_stop.store(true);
    holder.join();
    engine->RunTimers();
    const std::uint64_t stored = SS(*engine, "S").last_seq;
    const std::uint64_t hold_expired = engine_test::CS(*engine, "S", "hold").expired;
    CHECK(held.size() + hold_expired == stored);  // a ttl expires hold's copies too
    CHECK(SS(*engine, "S").messages == held.size());
    for (Message& m : held) REQUIRE(m.Ack().ok());
    held.clear();
    CHECK(SS(*engine, "S").messages == 0);
  }
}
