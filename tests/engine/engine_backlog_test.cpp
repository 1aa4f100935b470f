// A file stream's consumer reads the stored messages it starts with from the log a
// chunk at a time, as its lanes take them (ConsumerState::Backlog): what it holds in
// memory is bounded by a chunk, not by the stream, and the order, the counts and the
// publishes made meanwhile come out as if it had read everything at once.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "engine_test_util.hpp"
#include "inferq/engine/engine.hpp"
#include "../state/state_test_util.hpp"

using namespace inferq;
using inferq::engine_test::CS;
using inferq::engine_test::Ev;
using inferq::engine_test::Msg;
using state_test::TempDir;

namespace {

// The chunk FillFromBacklog reads at most (src/engine/delivery.cpp).
constexpr int kChunk = 256;

// The POSIX file system, counting the records read from the stream's log segments
// (ReadAt; the consumers' ack logs apart).
class CountingFs final : public FileSystem {
 public:
  std::atomic<int> reads{0};
  std::function<void()> on_first_read;  // runs in the first ReadAt after it is set

  absl::StatusOr<std::string> ReadAt(const std::string& p, std::uint64_t offset,
                                     std::size_t n) override {
    if (p.find("/consumers/") == std::string::npos) ++reads;
    if (on_first_read && !hooked_.exchange(true)) on_first_read();
    return base_->ReadAt(p, offset, n);
  }
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& p) override {
    return base_->Lock(p);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& p) override {
    return base_->Create(p);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& p) override {
    return base_->OpenForWrite(p);
  }
  absl::StatusOr<std::string> Read(const std::string& p) override { return base_->Read(p); }
  absl::Status ReadInto(const std::string& p, std::string& out) override {
    return base_->ReadInto(p, out);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return base_->List(d);
  }
  absl::Status CreateDir(const std::string& d) override { return base_->CreateDir(d); }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return base_->Rename(a, b);
  }
  absl::Status Remove(const std::string& p) override { return base_->Remove(p); }
  absl::Status SyncDir(const std::string& d) override { return base_->SyncDir(d); }

 private:
  std::shared_ptr<FileSystem> base_ = PosixFileSystem();
  std::atomic<bool> hooked_{false};
};

StreamConfig FileStream(const std::string& dir, std::shared_ptr<FileSystem> fs = nullptr) {
  StreamConfig s;
  s.name = "S";
  s.subjects = {"s.>"};
  s.storage = StorageType::kFile;
  s.directory = dir;
  s.sync = SyncPolicy::kNone;
  s.file_system = std::move(fs);
  return s;
}

Event Numbered(const std::string& subject, int i) {
  Event e = Ev(subject);
  e.payload = Buffer::FromString("m" + std::to_string(i));
  return e;
}

std::string Body(const Message& m) {
  const auto p = m.event().payload.span();
  return std::string(reinterpret_cast<const char*>(p.data()), p.size());
}

// Publishes m<from>..m<to> on s.a (sequences from..to on a fresh stream).
void PublishRange(Engine& engine, int from, int to) {
  for (int i = from; i <= to; ++i) REQUIRE(engine.Publish(Numbered("s.a", i)).ok());
}

// Consumer "c" of S from the front (DeliverPolicy::kAll), one member.
Consumer FromFront(Engine& engine, std::size_t lane_capacity) {
  absl::StatusOr<Consumer> c = engine.AddConsumer(
      {.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll, .lane_capacity = lane_capacity});
  REQUIRE(c.ok());
  return *std::move(c);
}

// The next `n` messages of `m` (each within 5 s), acked: their sequences.
std::vector<std::uint64_t> TakeSeqs(Member& m, int n) {
  std::vector<std::uint64_t> out;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<Message> msg = m.Next(absl::Seconds(5));
    REQUIRE(msg.ok());
    out.push_back(msg->stream_seq());
    REQUIRE(msg->Ack().ok());
  }
  return out;
}

// Every message member 0 gets within 200 ms of the last, acked: their sequences.
std::vector<std::uint64_t> DrainSeqs(Consumer& c) {
  std::vector<std::uint64_t> out;
  Member m = *c.member(0);
  for (;;) {
    absl::StatusOr<Message> msg = m.Next(absl::Milliseconds(200));
    if (!msg.ok()) break;
    out.push_back(msg->stream_seq());
    REQUIRE(msg->Ack().ok());
  }
  return out;
}

std::vector<std::uint64_t> Range(std::uint64_t from, std::uint64_t to) {
  std::vector<std::uint64_t> v;
  for (std::uint64_t s = from; s <= to; ++s) v.push_back(s);
  return v;
}

}  // namespace

TEST_CASE("a consumer added at the front of a file stream reads the log a chunk at a time") {
  TempDir d;
  auto counting_fs = std::make_shared<CountingFs>();
  CountingFs& counting = *counting_fs;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path(), counting_fs)).ok());
  PublishRange(*engine, 1, 2000);
  counting.reads = 0;
  auto c = FromFront(*engine, 16);
  // One chunk, not the 2,000 messages (before the backlog, AddConsumer read them all).
  CHECK(counting.reads == kChunk);
  CHECK(CS(*engine, "S", "c").num_pending == 2000);
  Member m = *c.member(0);
  for (int i = 1; i <= 300; ++i) {
    absl::StatusOr<Message> msg = m.Next(absl::Seconds(5));
    REQUIRE(msg.ok());
    CHECK(msg->stream_seq() == static_cast<std::uint64_t>(i));
    CHECK(Body(*msg) == "m" + std::to_string(i));
    REQUIRE(msg->Ack().ok());
  }
  CHECK(counting.reads == 2 * kChunk);
  CHECK(CS(*engine, "S", "c").num_pending == 1700);
  CHECK(DrainSeqs(c) == Range(301, 2000));
  CHECK(counting.reads == 2000);  // each record read once
  CHECK(CS(*engine, "S", "c").num_pending == 0);
}

TEST_CASE("publishes while a consumer reads its backlog come after it, in sequence order") {
  TempDir d;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  PublishRange(*engine, 1, 600);
  auto c = FromFront(*engine, 4);
  Member m = *c.member(0);
  std::vector<std::uint64_t> got;
  for (int i = 601; i <= 700; ++i) {  // a publish, then a pull
    PublishRange(*engine, i, i);
    got.push_back(TakeSeqs(m, 1).front());
  }
  for (std::uint64_t s : DrainSeqs(c)) got.push_back(s);
  CHECK(got == Range(1, 700));
  // Read to the end: a publish now is queued at once.
  REQUIRE(engine->Publish(Numbered("s.a", 701)).ok());
  absl::StatusOr<Message> last = m.Next(absl::ZeroDuration());
  REQUIRE(last.ok());
  CHECK(last->stream_seq() == 701);
}

TEST_CASE("the backlog applies the filter and the start position to what it reads") {
  TempDir d;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  for (int i = 1; i <= 1000; ++i) {
    REQUIRE(engine->Publish(Numbered(i % 3 == 0 ? "s.b" : "s.a", i)).ok());
  }
  SECTION("filter") {
    auto c = *engine->AddConsumer(
        {.stream = "S", .name = "b", .filter_subject = "s.b", .deliver = DeliverPolicy::kAll, .lane_capacity = 8});
    std::vector<std::uint64_t> want;
    for (std::uint64_t s = 3; s <= 1000; s += 3) want.push_back(s);
    CHECK(DrainSeqs(c) == want);
  }
  SECTION("start sequence") {
    auto c = *engine->AddConsumer({.stream = "S",
                                   .name = "from",
                                   .deliver = DeliverPolicy::kByStartSequence,
                                   .start_seq = 700,
                                   .lane_capacity = 8});
    CHECK(DrainSeqs(c) == Range(700, 1000));
  }
  SECTION("last per subject") {
    auto c = *engine->AddConsumer({.stream = "S",
                                   .name = "lps",
                                   .deliver = DeliverPolicy::kLastPerSubject,
                                   .lane_capacity = 8});
    REQUIRE(engine->Publish(Numbered("s.a", 1001)).ok());
    CHECK(DrainSeqs(c) == std::vector<std::uint64_t>{999, 1000, 1001});
  }
}

TEST_CASE("a message a limit removes while it waits in the backlog is skipped") {
  TempDir d;
  auto engine = *Engine::Create();
  StreamConfig cfg = FileStream(d.path());
  cfg.max_msgs = 1000;
  REQUIRE(engine->AddStream(cfg).ok());
  PublishRange(*engine, 1, 1000);
  auto c = FromFront(*engine, 4);
  Member m = *c.member(0);
  std::vector<std::uint64_t> got = TakeSeqs(m, 10);
  CHECK(got == Range(1, 10));
  // 500 more push 1..500 out; the chunk read already (11..256) was read before.
  PublishRange(*engine, 1001, 1500);
  for (std::uint64_t s : DrainSeqs(c)) got.push_back(s);
  // What was read into the first chunk and not yet queued is skipped as discarded
  // when its turn comes (Discarded), and the backlog goes on at 501.
  std::vector<std::uint64_t> want = Range(1, 10);
  for (std::uint64_t s : Range(501, 1500)) want.push_back(s);
  CHECK(got == want);
}

TEST_CASE("a consumer reading its backlog does not make a publish wait or fail on its full lane") {
  TempDir d;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  PublishRange(*engine, 1, 10);
  auto c = *engine->AddConsumer(
      {.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll, .lane_capacity = 2, .overflow = OverflowPolicy::kReject});
  // The lane holds two of the backlog; the publish goes to the log and waits there.
  absl::StatusOr<PublishAck> ack = engine->TryPublish(Numbered("s.a", 11));
  REQUIRE(ack.ok());
  CHECK(ack->seq == 11);
  CHECK(DrainSeqs(c) == Range(1, 11));
}

TEST_CASE("DeleteConsumer ends a backlog being read") {
  TempDir d;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  PublishRange(*engine, 1, 1000);
  auto c = FromFront(*engine, 4);
  Member m = *c.member(0);
  REQUIRE(m.Next(absl::Seconds(5)).ok());
  REQUIRE(engine->DeleteConsumer("S", "c").ok());
  absl::StatusOr<Message> next = m.Next(absl::Seconds(5));
  REQUIRE(!next.ok());
  CHECK(next.status().code() == absl::StatusCode::kCancelled);
  CHECK(Msg(next.status()) == "consumer 'c' of stream 'S' was deleted");
  // The stream goes on, and a new consumer of the name starts over.
  REQUIRE(engine->Publish(Numbered("s.a", 1001)).ok());
  auto again = FromFront(*engine, 4);
  CHECK(DrainSeqs(again) == Range(1, 1001));
}

TEST_CASE("a restarted consumer resumes through the backlog, its attempts counting on") {
  TempDir d;
  {
    auto engine = *Engine::Create();
    REQUIRE(engine->AddStream(FileStream(d.path())).ok());
    PublishRange(*engine, 1, 1000);
    auto c = FromFront(*engine, 4);
    Member m = *c.member(0);
    // 1..300 acked but 5; 301 delivered and left unacked.
    for (int i = 1; i <= 301; ++i) {
      absl::StatusOr<Message> msg = m.Next(absl::Seconds(5));
      REQUIRE(msg.ok());
      REQUIRE(msg->stream_seq() == static_cast<std::uint64_t>(i));
      if (i != 5 && i != 301) REQUIRE(msg->AckSync().ok());
    }
  }
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  auto c = FromFront(*engine, 4);
  Member m = *c.member(0);
  std::vector<std::uint64_t> got;
  std::vector<std::uint32_t> attempts;
  for (;;) {
    absl::StatusOr<Message> msg = m.Next(absl::Milliseconds(200));
    if (!msg.ok()) break;
    got.push_back(msg->stream_seq());
    attempts.push_back(msg->attempt());
    REQUIRE(msg->Ack().ok());
  }
  std::vector<std::uint64_t> want{5};
  for (std::uint64_t s = 301; s <= 1000; ++s) want.push_back(s);
  CHECK(got == want);
  REQUIRE(attempts.size() == want.size());
  CHECK(attempts[0] == 2);  // 5: delivered once before
  CHECK(attempts[1] == 2);  // 301
  CHECK(attempts[2] == 1);  // 302: never delivered
}

TEST_CASE("members, publishers and a front limit racing a backlog lose and repeat nothing") {
  TempDir d;
  const bool limited = GENERATE(false, true);
  INFO((limited ? "max_msgs 3000" : "no limit"));
  auto engine = *Engine::Create();
  StreamConfig cfg = FileStream(d.path());
  if (limited) cfg.max_msgs = 3000;
  REQUIRE(engine->AddStream(cfg).ok());
  PublishRange(*engine, 1, 2000);
  auto c = *engine->AddConsumer({.stream = "S", .name = "c", .deliver = DeliverPolicy::kAll, .members = 2, .lane_capacity = 8});
  std::mutex mu;
  std::vector<std::uint64_t> got;
  std::atomic<bool> published{false};
  std::vector<std::thread> threads;
  std::vector<std::vector<std::uint64_t>> per_member(2);
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      Member m = *c.member(w);
      for (;;) {
        absl::StatusOr<Message> msg = m.Next(absl::Milliseconds(500));
        if (!msg.ok()) {
          if (published) break;
          continue;
        }
        per_member[w].push_back(msg->stream_seq());
        REQUIRE(msg->Ack().ok());
      }
    });
  }
  std::thread publisher([&] {
    PublishRange(*engine, 2001, 4000);
    published = true;
  });
  publisher.join();
  for (auto& t : threads) t.join();
  for (const auto& seqs : per_member) {
    CHECK(std::is_sorted(seqs.begin(), seqs.end()));  // each member in stream order
    got.insert(got.end(), seqs.begin(), seqs.end());
  }
  std::sort(got.begin(), got.end());
  CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());  // no repeats
  if (!limited) {
    CHECK(got == Range(1, 4000));
  } else {
    // Everything still stored at the end was delivered; what went, went in order.
    const std::vector<std::uint64_t> tail = Range(1001, 4000);
    CHECK(std::includes(got.begin(), got.end(), tail.begin(), tail.end()));
  }
}

TEST_CASE("a backlog that skips long stretches of the stream lets go of its mutex between them") {
  // kLastPerSubject takes 1 and 140,000 only: the backlog looks at 65,536 index
  // entries per hold of the stream's mutex, so one read finds nothing, and it goes
  // on instead of taking that for the end.
  TempDir d;
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  REQUIRE(engine->Publish(Numbered("s.a", 1)).ok());
  for (int i = 2; i <= 140'000; ++i) REQUIRE(engine->Publish(Numbered("s.b", i)).ok());
  auto c = *engine->AddConsumer({.stream = "S",
                                 .name = "lps",
                                 .deliver = DeliverPolicy::kLastPerSubject,
                                 .lane_capacity = 8});
  CHECK(DrainSeqs(c) == std::vector<std::uint64_t>{1, 140'000});
  REQUIRE(engine->Publish(Numbered("s.a", 140'001)).ok());
  CHECK(DrainSeqs(c) == std::vector<std::uint64_t>{140'001});
}

TEST_CASE("a publish that waits in the log during catch-up keeps its queue timeout") {
  // Found by the adversarial helper's angle: such a publish is queued for nobody, so
  // its queue timeout was never registered (a memory stream's, parked, had one).
  TempDir d;
  const bool file = GENERATE(false, true);
  INFO((file ? "file" : "memory"));
  ManualClock clock{1'000'000'000};
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  StreamConfig cfg = FileStream(d.path());
  if (!file) {
    cfg.storage = StorageType::kMemory;
    cfg.directory.clear();
  }
  REQUIRE(engine->AddStream(cfg).ok());
  REQUIRE(engine->AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
  Member dlq = *engine->AddConsumer({.stream = "DLQ", .name = "dlq"})->member(0);
  PublishRange(*engine, 1, 5);
  auto c = *engine->AddConsumer({.stream = "S",
                                 .name = "c",
                                 .deliver = DeliverPolicy::kAll,
                                 .lane_capacity = 2,
                                 .dead_letter_subject = "dead.c",
                                 .queue_timeout = absl::Seconds(1)});
  REQUIRE(engine->Publish(Numbered("s.a", 6)).ok());
  clock.Advance(absl::Seconds(2));
  engine->RunTimers();
  Member m = *c.member(0);
  std::vector<std::uint64_t> got;
  for (;;) {
    absl::StatusOr<Message> msg = m.Next(absl::ZeroDuration());
    if (!msg.ok()) break;
    got.push_back(msg->stream_seq());
    REQUIRE(msg->Ack().ok());
    engine->RunTimers();
  }
  CHECK(got == Range(1, 5));
  absl::StatusOr<Message> dead = dlq.Next(absl::ZeroDuration());
  REQUIRE(dead.ok());
  CHECK(Body(*dead) == "m6");
  CHECK(inferq::engine_test::H(dead->event(), kDeadLetterReasonHeader) == "expired");
  CHECK(CS(*engine, "S", "c").expired == 1);
}

TEST_CASE("a pull reads the backlog on without the timer once a blocked publisher lets go") {
  // Found by the adversarial helper: a publisher blocked on another consumer's full
  // lane holds the stream's mutex, so a pull could not read the next chunk; with
  // manual timers nothing read it later, and the consumer got nothing more.
  TempDir d;
  ManualClock clock{1'000'000'000};
  auto engine = *Engine::Create({.clock = &clock, .manual_timers = true});
  REQUIRE(engine->AddStream(FileStream(d.path())).ok());
  PublishRange(*engine, 1, 10);
  auto a = *engine->AddConsumer({.stream = "S", .name = "a", .lane_capacity = 2});
  auto b = *engine->AddConsumer(
      {.stream = "S", .name = "b", .deliver = DeliverPolicy::kAll, .lane_capacity = 4});
  std::thread publisher([&] {
    PublishRange(*engine, 11, 13);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // 13 waits for a's lane
  std::vector<std::uint64_t> got = DrainSeqs(b);
  Member am = *a.member(0);
  for (int i = 0; i < 3; ++i) REQUIRE(am.Next(absl::Seconds(10)).ok());
  publisher.join();
  for (std::uint64_t s : DrainSeqs(b)) got.push_back(s);
  CHECK(got == Range(1, 13));
}

TEST_CASE("a segment file gone from under the backlog fails the consumer instead of skipping it") {
  // Found by the adversarial helper: the log reports a missing segment file as
  // kNotFound, which the backlog took for a segment the stream retired, and 27
  // messages were skipped without an error.
  TempDir d;
  auto engine = *Engine::Create();
  StreamConfig cfg = FileStream(d.path());
  cfg.segment_bytes = 4096;
  REQUIRE(engine->AddStream(cfg).ok());
  PublishRange(*engine, 1, 1000);
  auto c = FromFront(*engine, 4);
  std::vector<std::string> segments;
  for (const auto& f : std::filesystem::directory_iterator(d.path())) {
    if (f.path().extension() == ".seg") segments.push_back(f.path().string());
  }
  std::sort(segments.begin(), segments.end());
  REQUIRE(segments.size() > 4);
  const std::string gone = segments[segments.size() / 2];  // log-<first seq, 20 digits>.seg
  const std::uint64_t first = std::stoull(std::filesystem::path(gone).stem().string().substr(4));
  REQUIRE(std::filesystem::remove(gone));
  Member m = *c.member(0);
  std::vector<std::uint64_t> got;
  absl::Status last;
  for (;;) {
    absl::StatusOr<Message> msg = m.Next(absl::Milliseconds(300));
    if (!msg.ok()) {
      last = msg.status();
      break;
    }
    got.push_back(msg->stream_seq());
    REQUIRE(msg->Ack().ok());
  }
  // A prefix (the chunk that holds the damage is not delivered: the consumer fails
  // when it reads it), never a gap.
  CHECK(got == Range(1, got.size()));
  CHECK(got.size() < first);
  CHECK(last.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Msg(last), Catch::Contains("stored message " + std::to_string(first) +
                                        " cannot be read back"));
}

TEST_CASE("one call reads at most eight chunks of a backlog that parks nothing") {
  // Found by the adversarial helper: a filter that matches nothing made AddConsumer
  // (and a pull, or the timer) read chunk after chunk while a publisher kept adding
  // to the log; it returned only when the publisher stopped.
  TempDir d;
  auto counting_fs = std::make_shared<CountingFs>();
  auto engine = *Engine::Create({.manual_timers = true});
  REQUIRE(engine->AddStream(FileStream(d.path(), counting_fs)).ok());
  PublishRange(*engine, 1, 5000);
  counting_fs->reads = 0;
  auto c = *engine->AddConsumer({.stream = "S",
                                 .name = "c",
                                 .filter_subject = "s.b",
                                 .deliver = DeliverPolicy::kAll,
                                 .lane_capacity = 4});
  CHECK(counting_fs->reads == 8 * kChunk);
  REQUIRE(engine->Publish(Numbered("s.b", 5001)).ok());
  // The timer (here RunTimers) and pulls go on with it.
  engine->RunTimers();
  CHECK(counting_fs->reads == 16 * kChunk);
  absl::StatusOr<Message> msg = c.member(0)->Next(absl::ZeroDuration());
  REQUIRE(msg.ok());  // that pull read the rest
  CHECK(msg->stream_seq() == 5001);
  CHECK(counting_fs->reads == 5001);
}

TEST_CASE("kLast and kLastPerSubject read the stored messages without the stream's mutex") {
  // Found by the adversarial helper: they read the whole log back under it when the
  // consumer was added (a publish waited 2.8 s on a 200,000-message stream).
  TempDir d;
  const DeliverPolicy policy = GENERATE(DeliverPolicy::kLast, DeliverPolicy::kLastPerSubject);
  INFO((policy == DeliverPolicy::kLast ? "kLast" : "kLastPerSubject"));
  auto counting_fs = std::make_shared<CountingFs>();
  auto engine = *Engine::Create();
  REQUIRE(engine->AddStream(FileStream(d.path(), counting_fs)).ok());
  for (int i = 1; i <= 100; ++i) {
    REQUIRE(engine->Publish(Numbered(i % 2 == 1 ? "s.a" : "s.b", i)).ok());
  }
  // While the start is read back, another thread publishes; it must not wait for
  // the read to end.
  std::atomic<bool> published_during_read{false};
  std::thread publisher;
  counting_fs->on_first_read = [&] {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> f = done->get_future();
    publisher = std::thread([&engine, done] {
      REQUIRE(engine->Publish(Numbered("s.a", 101)).ok());
      done->set_value();
    });
    published_during_read = f.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  };
  auto c = *engine->AddConsumer(
      {.stream = "S", .name = "c", .deliver = policy, .lane_capacity = 8});
  publisher.join();
  CHECK(published_during_read);
  // The publish made during the read counts: it is the newest, and the newest of s.a.
  CHECK(DrainSeqs(c) == (policy == DeliverPolicy::kLast ? std::vector<std::uint64_t>{101}
                                                         : std::vector<std::uint64_t>{100, 101}));
}
