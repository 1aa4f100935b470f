#include "inferq/state/stream_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "state_test_util.hpp"

using inferq::StreamLog;
using inferq::StreamLogOptions;
using inferq::SyncPolicy;
using state_test::Files;
using state_test::ReadFile;
using state_test::TempDir;
using state_test::WriteFile;

namespace {

std::string Value(int i) { return "record-" + std::to_string(i) + std::string(i % 37, 'x'); }

struct Recovered {
  std::vector<std::uint64_t> txs;
  std::vector<std::string> values;
  std::vector<StreamLog::Location> at;
};

absl::StatusOr<std::unique_ptr<StreamLog>> OpenLog(const StreamLogOptions& o, Recovered* r) {
  return StreamLog::Open(o, [&](const StreamLog::Entry& e) {
    r->txs.push_back(e.tx);
    r->values.emplace_back(e.value);
    r->at.push_back(e.location);
    return absl::OkStatus();
  });
}

std::unique_ptr<StreamLog> OpenOk(const StreamLogOptions& o, Recovered* r) {
  auto log = OpenLog(o, r);
  INFO(log.status().ToString());
  REQUIRE(log.ok());
  return std::move(*log);
}

StreamLogOptions Opts(const std::string& dir, SyncPolicy sync = SyncPolicy::kEveryCommit) {
  StreamLogOptions o;
  o.dir = dir;
  o.sync = sync;
  return o;
}

}  // namespace

TEST_CASE("stream log records come back in order after reopening, readable by location") {
  TempDir d;
  std::vector<StreamLog::Location> where;
  {
    Recovered none;
    auto log = OpenOk(Opts(d.path()), &none);
    CHECK(none.txs.empty());
    for (int i = 1; i <= 300; ++i) {
      auto e = log->Append(Value(i));
      REQUIRE(e.ok());
      CHECK(e->tx == static_cast<std::uint64_t>(i));
      where.push_back(e->location);
      REQUIRE(log->Sync(e->tx).ok());
    }
    auto back = log->Read(where[41]);
    REQUIRE(back.ok());
    CHECK(*back == Value(42));
    CHECK(log->Stats().durable_tx == 300);
    CHECK(log->Stats().appends == 300);
  }
  Recovered r;
  auto log = OpenOk(Opts(d.path()), &r);
  REQUIRE(r.txs.size() == 300);
  for (int i = 0; i < 300; ++i) {
    CHECK(r.txs[i] == static_cast<std::uint64_t>(i + 1));
    CHECK(r.values[i] == Value(i + 1));
    CHECK(r.at[i].offset == where[i].offset);
    CHECK(r.at[i].bytes == where[i].bytes);
  }
  auto next = log->Append("after");
  REQUIRE(next.ok());
  CHECK(next->tx == 301);
  CHECK(log->Stats().recovered_records == 300);
  CHECK(log->Stats().torn_tail_bytes == 0);
}

TEST_CASE("stream log retires whole segments and keeps numbering after a purge") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  std::vector<StreamLog::Location> where;
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    for (int i = 1; i <= 200; ++i) where.push_back(log->Append(std::string(100, 'a' + i % 26))->location);
    const auto segs = log->Stats().segments;
    CHECK(segs > 3);
    // Segment k starts at where[...].segment: retire everything below record 101.
    REQUIRE(log->RetireBefore(101).ok());
    CHECK(log->Stats().segments < segs);
    CHECK(log->Stats().first_tx <= 101);
    CHECK(log->Stats().first_tx > 1);
    CHECK(log->Read(where[0]).status().code() == absl::StatusCode::kNotFound);
    auto kept = log->Read(where[150]);
    REQUIRE(kept.ok());
    CHECK(*kept == std::string(100, 'a' + 151 % 26));
  }
  {
    Recovered r;
    auto log = OpenOk(o, &r);
    REQUIRE(!r.txs.empty());
    CHECK(r.txs.front() <= 101);
    CHECK(r.txs.back() == 200);
    CHECK(r.txs.size() == 200 - r.txs.front() + 1);
    // A purge of everything: a new segment, then every older one goes.
    REQUIRE(log->Rotate().ok());
    REQUIRE(log->RetireBefore(201).ok());
    CHECK(log->Stats().segments == 1);
    CHECK(log->Stats().first_tx == 0);
  }
  Recovered r;
  auto log = OpenOk(o, &r);
  CHECK(r.txs.empty());
  auto e = log->Append("x");
  REQUIRE(e.ok());
  CHECK(e->tx == 201);  // numbering survives the purge and the restart
}

TEST_CASE("stream log cuts a torn tail in point-in-time recovery and refuses it in strict") {
  TempDir d;
  std::uint64_t third_offset = 0;
  {
    Recovered none;
    auto log = OpenOk(Opts(d.path()), &none);
    for (int i = 1; i <= 3; ++i) {
      auto e = log->Append(Value(i));
      REQUIRE(e.ok());
      if (i == 3) third_offset = e->location.offset + 10;  // half a header of record 3
    }
  }
  const std::string seg = d / Files(d.path(), "log-").front();
  std::string bytes = ReadFile(seg);
  // Record 3 torn: its first 10 bytes stay, the rest is gone (zeros after).
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(third_offset), bytes.end(), '\0');
  WriteFile(seg, bytes);
  {
    StreamLogOptions strict = Opts(d.path());
    strict.recovery = inferq::RecoveryMode::kStrict;
    Recovered r;
    auto log = OpenLog(strict, &r);
    REQUIRE(log.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(log.status().message()),
               Catch::StartsWith("torn tail in stream log segment '" + Files(d.path(), "log-").front() +
                                 "' at offset " + std::to_string(third_offset - 10) +
                                 " after tx_id 2"));
  }
  {
    Recovered r;
    auto log = OpenOk(Opts(d.path()), &r);
    CHECK(r.txs == std::vector<std::uint64_t>{1, 2});
    CHECK(log->Stats().torn_tail_bytes == 10);
    auto e = log->Append("new third");
    REQUIRE(e.ok());
    CHECK(e->tx == 3);
  }
  Recovered r;
  auto log = OpenOk(Opts(d.path()), &r);
  REQUIRE(r.values.size() == 3);
  CHECK(r.values[2] == "new third");
  CHECK(log->Stats().torn_tail_bytes == 0);
}

TEST_CASE("stream log reports damage before the tail with file offset and tx_id") {
  TempDir d;
  std::uint64_t second = 0;
  {
    Recovered none;
    auto log = OpenOk(Opts(d.path()), &none);
    for (int i = 1; i <= 5; ++i) {
      auto e = log->Append(Value(i));
      if (i == 2) second = e->location.offset;
    }
  }
  const std::string name = Files(d.path(), "log-").front();
  std::string bytes = ReadFile(d / name);
  bytes[second + 30] ^= 0x40;
  WriteFile(d / name, bytes);
  Recovered r;
  auto log = OpenLog(Opts(d.path()), &r);
  REQUIRE(log.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(log.status().message()),
             Catch::StartsWith("damaged record in stream log segment '" + name + "' at offset " +
                               std::to_string(second) + " after tx_id 1: "));
  CHECK_THAT(std::string(log.status().message()), Catch::Contains("valid records follow at offset"));
}

TEST_CASE("stream log directory is opened by one log at a time and names the holder") {
  TempDir d;
  Recovered a, b;
  auto first = OpenOk(Opts(d.path()), &a);
  auto second = OpenLog(Opts(d.path()), &b);
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(second.status().message() == "'" + d.path() +
                                         "/LOCK' is held by this process: another store in this "
                                         "process has this directory open");
  first.reset();
  auto third = OpenLog(Opts(d.path()), &b);
  CHECK(third.ok());
}

TEST_CASE("stream log refuses bad options naming the value") {
  TempDir d;
  Recovered r;
  StreamLogOptions o = Opts(d.path());
  SECTION("segment_bytes") {
    o.segment_bytes = 100;
    CHECK(OpenLog(o, &r).status().message() == "StreamLogOptions.segment_bytes 100 is outside 4096 to 2^40");
  }
  SECTION("interval without a window") {
    o.sync = SyncPolicy::kInterval;
    CHECK(OpenLog(o, &r).status().message() ==
          "StreamLogOptions.group_commit_window must be > 0 with SyncPolicy::kInterval (it is "
          "the fdatasync interval), got 0");
  }
  SECTION("window") {
    o.group_commit_window = absl::Seconds(11);
    CHECK(OpenLog(o, &r).status().message() ==
          "StreamLogOptions.group_commit_window 11s is outside 0 to 10s");
  }
  SECTION("sync policy") {
    o.sync = static_cast<SyncPolicy>(9);
    CHECK(OpenLog(o, &r).status().message() == "StreamLogOptions.sync 9 is not a SyncPolicy");
  }
  CHECK(!std::filesystem::exists(d.path()));  // nothing was created
}

TEST_CASE("stream log Sync of a record never appended is refused") {
  TempDir d;
  Recovered r;
  auto log = OpenOk(Opts(d.path()), &r);
  CHECK(log->Sync(1).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(log->Append("a").ok());
  CHECK(log->Sync(1).ok());
  CHECK(log->Sync(2).message() == "stream log '" + d.path() + "': tx_id 2 was not appended (last is 1)");
}

TEST_CASE("stream log write and sync failures fail the log and never report a record stored") {
  TempDir d;
  auto faulty = std::make_shared<state_test::FaultyFileSystem>();
  StreamLogOptions o = Opts(d.path());
  o.file_system = faulty;
  const int err = GENERATE(EIO, ENOSPC);
  const std::string kind = GENERATE(std::string("write"), std::string("sync"));
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    for (int i = 1; i <= 3; ++i) {
      auto e = log->Append(Value(i));
      REQUIRE(e.ok());
      REQUIRE(log->Sync(e->tx).ok());
    }
    faulty->FailNth(kind, 1, err);
    auto e = log->Append(Value(4));
    absl::Status st = e.ok() ? log->Sync(e->tx) : e.status();
    const auto code = err == EIO ? absl::StatusCode::kDataLoss : absl::StatusCode::kResourceExhausted;
    CHECK(st.code() == code);
    CHECK(log->Stats().failed);
    auto later = log->Append(Value(5));
    REQUIRE(later.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(later.status().message()), Catch::Contains("injected"));
    CHECK(log->Stats().durable_tx == 3);
  }
  Recovered r;
  o.file_system = nullptr;
  auto log = OpenOk(o, &r);
  // The synced records are there; record 4 was written whole only when the fault was
  // the sync's (it was never reported durable), and never half.
  REQUIRE(r.txs.size() >= 3);
  CHECK(r.txs.size() == (kind == "sync" ? 4u : 3u));
  for (std::size_t i = 0; i < r.txs.size(); ++i) CHECK(r.values[i] == Value(static_cast<int>(i) + 1));
}

TEST_CASE("stream log group commit shares fdatasyncs between concurrent appenders") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kGroupCommit);
  o.group_commit_window = absl::Microseconds(200);
  constexpr int kThreads = 4, kEach = 250;
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    std::vector<std::thread> ts;
    std::vector<std::vector<std::uint64_t>> got(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          auto e = log->Append("t" + std::to_string(t) + "-" + std::to_string(i));
          if (!e.ok() || !log->Sync(e->tx).ok()) return;
          got[t].push_back(e->tx);
        }
      });
    }
    for (auto& t : ts) t.join();
    std::set<std::uint64_t> all;
    for (const auto& g : got) {
      CHECK(g.size() == static_cast<std::size_t>(kEach));
      CHECK(std::is_sorted(g.begin(), g.end()));
      all.insert(g.begin(), g.end());
    }
    CHECK(all.size() == static_cast<std::size_t>(kThreads * kEach));
    CHECK(*all.rbegin() == static_cast<std::uint64_t>(kThreads * kEach));
    CHECK(log->Stats().durable_tx == static_cast<std::uint64_t>(kThreads * kEach));
  }
  Recovered r;
  auto log = OpenOk(o, &r);
  CHECK(r.txs.size() == static_cast<std::size_t>(kThreads * kEach));
}

TEST_CASE("stream log refuses a segment of another log") {
  TempDir a, b;
  {
    Recovered none;
    auto la = OpenOk(Opts(a.path()), &none);
    REQUIRE(la->Append("a").ok());
    Recovered none2;
    auto lb = OpenOk(Opts(b.path()), &none2);
  }
  const std::string name = Files(a.path(), "log-").front();
  std::filesystem::remove(b / Files(b.path(), "log-").front());
  std::filesystem::copy_file(a / name, b / name);
  Recovered r;
  auto log = OpenLog(Opts(b.path()), &r);
  REQUIRE(log.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(log.status().message()),
             Catch::StartsWith("stream log segment '" + name + "' at offset 0 belongs to another log"));
}

namespace {

std::vector<std::string> Named(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> out;
  for (const std::string& f : Files(dir, "log-")) {
    if (f.ends_with(suffix)) out.push_back(f);
  }
  return out;
}

// 200 records in segments of 4 KiB: 5 or more sealed segments and a tail.
std::vector<StreamLog::Location> FillSegments(const StreamLogOptions& o) {
  Recovered none;
  auto log = OpenOk(o, &none);
  std::vector<StreamLog::Location> at;
  for (int i = 1; i <= 200; ++i) at.push_back(log->Append(Value(i))->location);
  return at;
}

}  // namespace

TEST_CASE("stream log recovers sealed segments through their seals, with the same records") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  const std::vector<StreamLog::Location> at = FillSegments(o);
  const auto segs = Named(d.path(), ".seg");
  REQUIRE(segs.size() > 5);
  CHECK(Named(d.path(), ".seal").size() == segs.size() - 1);  // all but the tail
  Recovered r;
  {
    auto log = OpenOk(o, &r);
    CHECK(log->Stats().sealed_segments == segs.size() - 1);
    CHECK(log->Stats().recovered_records == 200);
    REQUIRE(r.txs.size() == 200);
    for (int i = 1; i <= 200; ++i) {
      INFO("record " << i);
      CHECK(r.txs[i - 1] == static_cast<std::uint64_t>(i));
      CHECK(r.values[i - 1] == Value(i));
      CHECK(r.at[i - 1].segment == at[i - 1].segment);
      CHECK(r.at[i - 1].offset == at[i - 1].offset);
      CHECK(r.at[i - 1].bytes == at[i - 1].bytes);
    }
    CHECK(log->Append("more")->tx == 201);  // the chain goes on from the tail
  }
  SECTION("kStrict verifies every frame") {
    StreamLogOptions strict = o;
    strict.recovery = inferq::RecoveryMode::kStrict;
    Recovered again;
    auto log = OpenOk(strict, &again);
    CHECK(log->Stats().sealed_segments == 0);
    CHECK(again.txs.size() == 201);
  }
  SECTION("a torn seal is ignored: the segment is verified frame by frame") {
    const std::string seal = d / Named(d.path(), ".seal").front();
    WriteFile(seal, ReadFile(seal).substr(0, 50));
    Recovered again;
    auto log = OpenOk(o, &again);
    CHECK(log->Stats().sealed_segments == segs.size() - 2);
    CHECK(again.txs.size() == 201);
    CHECK(again.values[0] == Value(1));
  }
}

TEST_CASE("stream log damage inside a sealed segment is found and named as without seals") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  const std::vector<StreamLog::Location> at = FillSegments(o);
  // Record 3 lies in the first segment, which is sealed.
  const std::string name = Named(d.path(), ".seg").front();
  REQUIRE(at[2].segment == 1);
  std::string bytes = ReadFile(d / name);
  bytes[at[2].offset + 30] ^= 0x40;
  WriteFile(d / name, bytes);
  Recovered r;
  auto log = OpenLog(o, &r);
  REQUIRE(log.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(log.status().message()),
             Catch::StartsWith("damaged record in stream log segment '" + name + "' at offset " +
                               std::to_string(at[2].offset) + " after tx_id 2: "));
  // Frame by frame, as without seals: what came before the damage was handed out.
  CHECK(r.txs == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("stream log removes the seal of a segment that became the tail and of retired ones") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  (void)FillSegments(o);
  auto segs = Named(d.path(), ".seg");
  // A crash after a segment's seal, before its successor was created: the sealed
  // segment is the tail again and is appended to.
  std::filesystem::remove(d / segs.back());
  segs.pop_back();
  std::uint64_t last = 0;
  {
    Recovered r;
    auto log = OpenOk(o, &r);
    last = r.txs.back();
    CHECK(Named(d.path(), ".seal").size() == segs.size() - 1);  // the tail's is gone
    for (int i = 0; i < 5; ++i) REQUIRE(log->Append("after-" + std::to_string(i)).ok());
  }
  {
    Recovered r;
    auto log = OpenOk(o, &r);
    REQUIRE(r.txs.size() == last + 5);
    CHECK(r.values.back() == "after-4");
    REQUIRE(log->RetireBefore(last).ok());
    const auto kept = Named(d.path(), ".seg");
    CHECK(Named(d.path(), ".seal").size() == kept.size() - 1);
  }
}

TEST_CASE("stream log appends through a mapping of the segment, and with pwrite past it") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kInterval);
  o.group_commit_window = absl::Milliseconds(5);
  o.segment_bytes = 4096;
  const std::string big(10'000, 'b');  // larger than a segment: it starts one of its own
  std::vector<StreamLog::Location> at;
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    for (int i = 1; i <= 20; ++i) at.push_back(log->Append(Value(i))->location);
    at.push_back(log->Append(big)->location);
    at.push_back(log->Append(Value(22))->location);
    REQUIRE(log->Sync(22).ok());
    const inferq::StreamLogStats st = log->Stats();
    CHECK(st.appends == 22);
    CHECK(st.mapped_appends == 21);  // all but the record that does not fit a mapping
    CHECK(*log->Read(at[20]) == big);
    CHECK(*log->Read(at[4]) == Value(5));
  }
  SECTION("a file system that does not map writes every record") {
    auto faulty = std::make_shared<state_test::FaultyFileSystem>();
    StreamLogOptions w = o;
    w.file_system = faulty;
    Recovered r;
    auto log = OpenOk(w, &r);
    REQUIRE(r.txs.size() == 22);
    REQUIRE(log->Append(Value(23)).ok());
    CHECK(log->Stats().mapped_appends == 0);
  }
  Recovered r;
  auto log = OpenOk(o, &r);
  REQUIRE(r.txs.size() >= 22);
  CHECK(r.values[20] == big);
  CHECK(r.values[21] == Value(22));
}

TEST_CASE("stream log does not map segments under policies that fdatasync every commit") {
  TempDir d;
  const SyncPolicy sync = GENERATE(SyncPolicy::kEveryCommit, SyncPolicy::kGroupCommit);
  Recovered none;
  auto log = OpenOk(Opts(d.path(), sync), &none);
  for (int i = 1; i <= 5; ++i) REQUIRE(log->Sync(log->Append(Value(i))->tx).ok());
  CHECK(log->Stats().appends == 5);
  CHECK(log->Stats().mapped_appends == 0);
  CHECK(*log->Read(log->Append("x")->location) == "x");
}

TEST_CASE("stream log writes zeros ahead again after reopening a sparse tail") {
  // A sparse copy of the directory turns the zeros written ahead into a hole; a
  // mapped append into a hole on a full disk is SIGBUS (found by the adversarial
  // helper). After reopening, the bytes ahead of the next append are data again.
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = std::uint64_t{1} << 20;
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    REQUIRE(log->Append(Value(1)).ok());
  }
  const std::string seg = d / Named(d.path(), ".seg").front();
  WriteFile(seg, ReadFile(seg).substr(0, 4096));
  std::filesystem::resize_file(seg, o.segment_bytes);  // the rest is a hole
  auto hole_at = [&](off_t from) {
    const int fd = ::open(seg.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    const off_t h = ::lseek(fd, from, SEEK_HOLE);
    ::close(fd);
    return h;
  };
  REQUIRE(hole_at(0) < static_cast<off_t>(o.segment_bytes));  // the file system keeps holes
  Recovered r;
  auto log = OpenOk(o, &r);
  REQUIRE(r.txs.size() == 1);
  auto e = log->Append(std::string(2000, 'z'));
  REQUIRE(e.ok());
  // Zeros were written from the first record's end to the next MiB: no hole before it.
  CHECK(hole_at(0) >= static_cast<off_t>(o.segment_bytes));
  CHECK(*log->Read(e->location) == std::string(2000, 'z'));
}

TEST_CASE("stream log refuses an only segment past tx_id 1 emptied, and takes an empty first one") {
  // Found by the adversarial helper: a segment truncated to 0 bytes read as a torn
  // create, and the log started again with what that segment held gone unsaid.
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  {
    Recovered none;
    auto log = OpenOk(o, &none);
    for (int i = 1; i <= 3; ++i) REQUIRE(log->Append(Value(i)).ok());
    REQUIRE(log->Rotate().ok());
    REQUIRE(log->Append(Value(4)).ok());
    REQUIRE(log->RetireBefore(4).ok());
    REQUIRE(log->Stats().segments == 1);
  }
  const std::vector<std::string> segs = Files(d.path(), "log-");
  REQUIRE(segs.size() == 1);
  SECTION("emptied: refused, naming the segment and the lost tx_ids") {
    std::filesystem::resize_file(d / segs.front(), 0);
    Recovered r;
    auto log = OpenLog(o, &r);
    REQUIRE(log.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(log.status().message()),
               Catch::StartsWith("stream log segment '" + segs.front() +
                                 "' holds 0 bytes and no valid header, and no "
                                 "segment precedes it: tx_ids from 4 on are lost ("));
    CHECK(Files(d.path(), "log-") == segs);  // changes nothing
  }
  SECTION("a fresh log's first segment torn in its create still opens empty") {
    TempDir fresh;
    StreamLogOptions f = Opts(fresh.path(), SyncPolicy::kNone);
    {
      Recovered none;
      auto log = OpenOk(f, &none);
    }
    const std::vector<std::string> first = Files(fresh.path(), "log-");
    REQUIRE(first.size() == 1);
    std::filesystem::resize_file(fresh / first.front(), 0);
    Recovered r;
    auto log = OpenOk(f, &r);
    CHECK(r.txs.empty());
    CHECK(log->Append("x")->tx == 1);
  }
}

TEST_CASE("stream log's RetireBound names the first record RetireBefore would keep") {
  TempDir d;
  StreamLogOptions o = Opts(d.path(), SyncPolicy::kNone);
  o.segment_bytes = 4096;
  Recovered none;
  auto log = OpenOk(o, &none);
  std::vector<std::uint64_t> starts;  // first tx of each segment, from the locations
  for (int i = 1; i <= 200; ++i) {
    const StreamLog::Location at = log->Append(std::string(100, 'x'))->location;
    if (starts.empty() || starts.back() != at.segment) starts.push_back(at.segment);
  }
  REQUIRE(starts.size() > 3);
  CHECK(starts.front() == 1);
  CHECK(log->RetireBound(0) == 1);
  CHECK(log->RetireBound(starts[1] - 1) == 1);
  CHECK(log->RetireBound(starts[1]) == starts[1]);
  CHECK(log->RetireBound(starts[2] + 1) == starts[2]);
  CHECK(log->RetireBound(UINT64_MAX) == starts.back());  // the one appended to stays
  const std::uint64_t segments = log->Stats().segments;
  CHECK(log->Stats().segments == segments);  // it changes nothing
  REQUIRE(log->RetireBefore(starts[2] + 1).ok());
  CHECK(log->Stats().first_tx == starts[2]);
}
