// inferq-state on a directory made here: exact output of each command.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <optional>
#include <cstdio>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "inferq/engine/engine.hpp"
#include "inferq/state/state_store.hpp"
#include "inferq/state/stream_log.hpp"
#include "inferq/version.hpp"
#include "state/log_format.hpp"
#include "state_test_util.hpp"

namespace si = inferq::state_internal;

namespace {

struct Run {
  std::string out;
  int status = -1;
};

// Runs `inferq-state ARGS`; `redirect` comes after ARGS (stderr joins stdout first,
// so "> /dev/full" sends only stdout there).
Run Tool(const std::string& args, const std::string& redirect = "") {
  Run r;
  const std::string cmd = std::string(INFERQ_STATE_TOOL) + " " + args + " 2>&1 " + redirect;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

TEST_CASE("inferq-state inspect, verify and dump") {
  state_test::TempDir d;
  {
    auto o = state_test::Options(d.path());
    auto s = inferq::StateStore::Open(o);
    REQUIRE(s.ok());
    for (int i = 0; i < 3; ++i) {
      auto tx = (*s)->Begin();
      tx.Put("user." + std::to_string(i), "v\t" + std::to_string(i));
      REQUIRE(tx.Commit().ok());
    }
    REQUIRE((*s)->Checkpoint().ok());
    auto tx = (*s)->Begin();
    tx.Put("zeta", std::string("a\nb\x01\0", 5));
    REQUIRE(tx.Commit().ok());
  }
  const std::string ckpt = si::CheckpointName(3, si::CheckpointKind::kFull);
  const auto ckpt_bytes = std::filesystem::file_size(d / ckpt);
  const auto seg_bytes = std::filesystem::file_size(d / si::SegmentName(1));
  CHECK(seg_bytes == 1 << 20);  // zero-filled ahead, a MiB at a time
  std::size_t used = si::kSegmentHeaderBytes;
  {
    const std::string seg = state_test::ReadFile(d / si::SegmentName(1));
    auto h = si::DecodeSegmentHeader(seg);
    for (int i = 0; i < 4; ++i) used += si::DecodeFrame(seg, used, h->salt).size;
  }

  Run inspect = Tool("inspect " + d.path());
  CHECK(inspect.status == 0);
  CHECK(inspect.out == "directory " + d.path() + "\n" +
                           "checkpoints: 1\n"
                           "  " + ckpt + "  full tx_id 3  3 entries  " + std::to_string(ckpt_bytes) +
                           " bytes  ok\n"
                           "segments: 1\n"
                           "  " + si::SegmentName(1) + "  " + std::to_string(seg_bytes) +
                           " bytes (" + std::to_string(used) + " used)  4 records  tx_id 1..4  ok\n"
                           "log tx_ids from 1\n"
                           "last recoverable tx_id 4\n"
                           "chain ok\n");

  Run verify = Tool("verify " + d.path());
  CHECK(verify.status == 0);
  CHECK(verify.out == "ok: 4 keys at tx_id 4; 1 checkpoints and 1 log records verified\n");

  Run dump = Tool("dump " + d.path() + " user.");
  CHECK(dump.status == 0);
  CHECK(dump.out == "user.0\tv\\t0\nuser.1\tv\\t1\nuser.2\tv\\t2\n");
  CHECK(Tool("dump " + d.path() + " zeta").out == "zeta\ta\\nb\\x01\\x00\n");
  CHECK(Tool("dump " + d.path() + " 'user.\\x31'").out == "user.1\tv\\t1\n");  // escaped PREFIX
  CHECK(Tool("dump " + d.path() + " 'bad\\q'").status == 2);

  // Damage: a flipped byte inside record 2.
  const std::string path = d / si::SegmentName(1);
  std::string bytes = state_test::ReadFile(path);
  bytes[si::kSegmentHeaderBytes + 100] ^= 1;
  state_test::WriteFile(path, bytes);
  Run bad = Tool("verify " + d.path());
  CHECK(bad.status == 1);
  CHECK(bad.out.rfind("FAILED: DATA_LOSS: damaged record in log segment '" + si::SegmentName(1) +
                          "' at offset ", 0) == 0);
  // Point-in-time recovery cannot pass a bad record in the middle: no keys, exit 1,
  // with --allow-damage too (its help says so).
  Run cut = Tool("dump --allow-damage " + d.path());
  CHECK(cut.status == 1);
  CHECK(cut.out.rfind("inferq-state: DATA_LOSS: damaged record in log segment '" +
                          si::SegmentName(1) + "' at offset ", 0) == 0);
  Run damaged = Tool("inspect " + d.path());
  CHECK(damaged.status == 1);
  CHECK(damaged.out.find("not recoverable: damaged record in log segment") != std::string::npos);
  Run unknown = Tool("frobnicate " + d.path());
  CHECK(unknown.status == 2);
  CHECK(unknown.out ==
        "inferq-state: unknown command 'frobnicate' (inspect, verify or dump) (see inferq-state --help)\n");
  Run none = Tool("");
  CHECK(none.status == 2);
  CHECK(none.out == "inferq-state: no command given (inspect, verify or dump) (see inferq-state --help)\n");
  Run help = Tool("--help");
  CHECK(help.status == 0);
  CHECK(help.out.rfind("usage: inferq-state inspect DIR\n"
                       "       inferq-state verify DIR\n"
                       "       inferq-state dump [--allow-damage] DIR [PREFIX]\n"
                       "       inferq-state --help | --version\n", 0) == 0);
  for (const char* part : {"\n  inspect DIR ", "\n  verify DIR ", "\n  dump DIR [PREFIX]\n",
                           "\n  --allow-damage ", "\nexit status: 0 ok; 1 damage"}) {
    INFO(part);
    CHECK(help.out.find(part) != std::string::npos);
  }
  CHECK(Tool("-h").out == help.out);
}

TEST_CASE("inferq-state refuses what is not a state directory and names a bad argument") {
  state_test::TempDir d;
  const std::string empty = d / "empty";
  std::filesystem::create_directories(empty);
  for (const char* cmd : {"verify ", "inspect ", "dump "}) {
    INFO(cmd);
    Run r = Tool(cmd + empty);  // was: "ok: 0 keys at tx_id 0", exit 0
    CHECK(r.status == 1);
    CHECK(r.out == "inferq-state: '" + empty +
                       "' is not an inferq state directory (no IDENTITY, wal-<20 digits>.log or "
                       "ckpt-<20 digits>-{full,incr}.zst file)\n");
    Run missing = Tool(cmd + (d / "mistyped"));  // was: passed verification
    CHECK(missing.status == 1);
    CHECK(missing.out == "inferq-state: '" + (d / "mistyped") +
                             "' is not an inferq state directory: no such directory\n");
    CHECK(!std::filesystem::exists(d / "mistyped"));  // and nothing was created
  }
  Run file = Tool("inspect /etc/passwd");  // was: INTERNAL
  CHECK(file.status == 1);
  CHECK(file.out == "inferq-state: '/etc/passwd' is not an inferq state directory: not a directory\n");

  Run option = Tool("verify --frob " + empty);
  CHECK(option.status == 2);
  CHECK(option.out == "inferq-state: unknown option '--frob' (see inferq-state --help)\n");
  Run extra = Tool("verify " + empty + " more");
  CHECK(extra.status == 2);
  CHECK(extra.out == "inferq-state: verify takes one directory, got 2 arguments (see inferq-state --help)\n");
  Run misplaced = Tool("verify --allow-damage " + empty);
  CHECK(misplaced.status == 2);
  CHECK(misplaced.out ==
        "inferq-state: --allow-damage is an option of dump only (see inferq-state --help)\n");
  Run version = Tool("--version");
  CHECK(version.status == 0);
  CHECK(version.out == std::string("inferq-state ") + INFERQ_VERSION_STRING + "\n");
}

TEST_CASE("inferq-state takes only a store's own file names as the mark of a state directory") {
  // Smallest inputs that passed for a store: any ckpt-* or wal-*.log name.
  for (const char* name : {"ckpt-junk", "wal-x.log", "wal-0000000000000000000a.log",
                           "ckpt-00000000000000000001-half.zst", "IDENTITY.tmp"}) {
    INFO(name);
    state_test::TempDir d;
    std::filesystem::create_directories(d.path());
    state_test::WriteFile(d / name, "x");
    Run r = Tool("verify " + d.path());
    CHECK(r.status == 1);
    CHECK(r.out.rfind("inferq-state: '" + d.path() + "' is not an inferq state directory (no ", 0) == 0);
  }
}

TEST_CASE("inferq-state escapes the directory name it prints and names why it cannot stat it") {
  state_test::TempDir d;
  const std::string odd = d.path() + "nl\nchain ok";  // was: a fake "chain ok" line
  {
    auto s = inferq::StateStore::Open(state_test::Options(odd));
    REQUIRE(s.ok());
  }
  Run r = Tool("inspect '" + odd + "'");
  CHECK(r.status == 0);
  CHECK(r.out.rfind("directory " + d.path() + "nl\\nchain ok\n", 0) == 0);
  std::filesystem::remove_all(odd);
  Run longer = Tool("verify " + std::string(5000, 'a'));  // was: "no such directory"
  CHECK(longer.status == 1);
  CHECK(longer.out.find("is not an inferq state directory: File name too long") != std::string::npos);
}

TEST_CASE("inferq-state never waits on a FIFO in a state directory") {
  state_test::TempDir d;
  std::filesystem::create_directories(d.path());
  REQUIRE(::mkfifo((d / "IDENTITY").c_str(), 0600) == 0);  // was: verify and dump hung
  for (const char* cmd : {"verify ", "dump "}) {
    INFO(cmd);
    Run r = Tool(cmd + d.path());
    CHECK(r.status == 1);
    CHECK(r.out.find("'" + (d / "IDENTITY") + "' is not a regular file (a FIFO)") != std::string::npos);
  }
}

TEST_CASE("inferq-state fails when its output cannot be written") {
  state_test::TempDir d;
  {
    auto s = inferq::StateStore::Open(state_test::Options(d.path()));
    REQUIRE(s.ok());
    auto tx = (*s)->Begin();
    tx.Put("k", "v");
    REQUIRE(tx.Commit().ok());
  }
  Run full = Tool("dump " + d.path(), "> /dev/full");  // was: exit 0
  CHECK(full.status == 1);
  CHECK(full.out == "inferq-state: writing the output failed: No space left on device\n");
  CHECK(Tool("--help", "> /dev/full").status == 1);
}

TEST_CASE("inferq-state dump reports every damage recovery passed over, not only the first") {
  state_test::TempDir d;
  {
    auto s = inferq::StateStore::Open(state_test::Options(d.path()));
    REQUIRE(s.ok());
    for (int i = 0; i < 3; ++i) {
      auto tx = (*s)->Begin();
      tx.Put("k" + std::to_string(i), std::to_string(i));
      REQUIRE(tx.Commit().ok());
      if (i == 0) REQUIRE((*s)->Checkpoint().ok());
    }
  }
  // The checkpoint at tx_id 1 truncated (recovery replays the log from tx_id 1
  // instead) and the last record half written.
  const std::string ckpt = si::CheckpointName(1, si::CheckpointKind::kFull);
  std::string ck = state_test::ReadFile(d / ckpt);
  state_test::WriteFile(d / ckpt, ck.substr(0, ck.size() / 2));
  const std::string path = d / si::SegmentName(1);
  std::string bytes = state_test::ReadFile(path);
  auto h = si::DecodeSegmentHeader(bytes);
  std::size_t last = si::kSegmentHeaderBytes, end = si::kSegmentHeaderBytes;
  for (int i = 0; i < 3; ++i) {
    last = end;
    end += si::DecodeFrame(bytes, end, h->salt).size;
  }
  const std::size_t cut = (last + end) / 2;
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(cut),
            bytes.begin() + static_cast<std::ptrdiff_t>(end), '\0');
  state_test::WriteFile(path, bytes);

  Run dump = Tool("dump " + d.path());  // was: only the torn tail
  INFO(dump.out);
  CHECK(dump.status == 1);
  const std::string head = "inferq-state: dump of '" + d.path() + "' is of damaged files: ";
  CHECK(dump.out.rfind("k0\t0\nk1\t1\n" + head + "a torn tail of " + std::to_string(cut - last) +
                           " bytes after tx_id 2 was left out\n" + head + "checkpoint '" + ckpt +
                           "' is damaged and was not used: ",
                       0) == 0);
  CHECK(std::count(dump.out.begin(), dump.out.end(), '\n') == 4);
}

TEST_CASE("inferq-state dump reports the torn tail it left out and fails unless told to allow it") {
  state_test::TempDir d;
  {
    auto s = inferq::StateStore::Open(state_test::Options(d.path()));
    REQUIRE(s.ok());
    for (int i = 0; i < 3; ++i) {
      auto tx = (*s)->Begin();
      tx.Put("k" + std::to_string(i), std::to_string(i));
      REQUIRE(tx.Commit().ok());
    }
  }
  const std::string path = d / si::SegmentName(1);
  std::string bytes = state_test::ReadFile(path);
  auto h = si::DecodeSegmentHeader(bytes);
  std::size_t last = si::kSegmentHeaderBytes, end = si::kSegmentHeaderBytes;
  for (int i = 0; i < 3; ++i) {
    last = end;
    end += si::DecodeFrame(bytes, end, h->salt).size;
  }
  CHECK(Tool("dump " + d.path()).status == 0);  // intact: no report
  // The last record half written, as a crash leaves it.
  const std::size_t cut = (last + end) / 2;
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(cut),
            bytes.begin() + static_cast<std::ptrdiff_t>(end), '\0');
  state_test::WriteFile(path, bytes);

  Run dump = Tool("dump " + d.path());  // was: the keys, exit 0, no warning
  CHECK(dump.status == 1);
  const std::string report = "inferq-state: dump of '" + d.path() +
                             "' is of damaged files: a torn tail of " + std::to_string(cut - last) +
                             " bytes after tx_id 2 was left out\n";
  CHECK(dump.out == "k0\t0\nk1\t1\n" + report);
  Run allowed = Tool("dump --allow-damage " + d.path());
  CHECK(allowed.status == 0);
  CHECK(allowed.out == dump.out);
  CHECK(Tool("dump --allow-damage=yes " + d.path()).status == 2);
  CHECK(state_test::ReadFile(path) == bytes);  // read-only: the torn bytes stay
}

TEST_CASE("inferq-state verify and inspect next to a live writer report no damage", "[concurrency]") {
  state_test::TempDir d;
  auto o = state_test::Options(d.path());
  o.segment_bytes = 4096;
  o.max_incremental_chain = 2;
  auto s = inferq::StateStore::Open(o);
  REQUIRE(s.ok());
  std::atomic<bool> stop{false};
  std::atomic<int> writer_errors{0};
  std::thread writer([&] {
    for (int i = 1; !stop.load(); ++i) {
      auto tx = (*s)->Begin();
      tx.Put("k" + std::to_string(i % 10), std::to_string(i));
      if (!tx.Commit().ok()) ++writer_errors;
      if (i % 40 == 0 && !(*s)->Checkpoint().ok()) ++writer_errors;
    }
  });
  for (int round = 0; round < 10; ++round) {
    Run verify = Tool("verify " + d.path());  // was: 1 in 4 runs "FAILED: DATA_LOSS: the files ..."
    INFO(verify.out);
    CHECK(verify.status == 0);
    Run inspect = Tool("inspect " + d.path());  // was: now and then "No such file or directory"
    INFO(inspect.out);
    CHECK(inspect.status == 0);
    Run dump = Tool("dump " + d.path(), "> /dev/null");  // was: now and then "a torn tail"
    INFO(dump.out);
    CHECK(dump.status == 0);
  }
  stop = true;
  writer.join();
  CHECK(writer_errors == 0);
}

namespace {

// A file stream "REQ" in `dir` as an Engine leaves it, in segments of 4 KiB: 20
// messages of 300 bytes. A work queue has them pulled and acked (AckSync) by
// consumer "w", so that the directory also holds the removed/ log and the
// consumer's consumers/w log; with limits retention they all stay.
void MakeFileStream(const std::string& dir, inferq::RetentionPolicy retention) {
  auto engine = inferq::Engine::Create({}).value();
  inferq::StreamConfig s;
  s.name = "REQ";
  s.subjects = {"req.>"};
  s.storage = inferq::StorageType::kFile;
  s.directory = dir;
  s.retention = retention;
  s.segment_bytes = 4096;
  REQUIRE(engine->AddStream(s).ok());
  std::optional<inferq::Consumer> consumer;
  if (retention == inferq::RetentionPolicy::kWorkQueue) {
    auto c = engine->AddConsumer({.stream = "REQ", .name = "w", .deliver = inferq::DeliverPolicy::kAll});
    REQUIRE(c.ok());
    consumer = *c;
  }
  for (int i = 0; i < 20; ++i) {
    inferq::Event e;
    e.subject = "req.a";
    e.payload = inferq::Buffer::FromString(std::string(300, static_cast<char>('a' + i)));
    REQUIRE(engine->Publish(std::move(e)).ok());
    if (consumer) {
      auto m = consumer->member(0)->Next(absl::Seconds(5));
      REQUIRE(m.ok());
      REQUIRE(m->AckSync().ok());
    }
  }
}

// Every file under `dir` with its bytes.
std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[e.path().string()] = state_test::ReadFile(e.path().string());
  }
  return out;
}

// verify's line for the stream log in `dir` (named `name`), from the log's own
// strict recovery in this process: its segments, records and tx_ids.
std::string VerifyLine(const std::string& dir, const std::string& name) {
  inferq::StreamLogOptions o;
  o.dir = dir;
  o.recovery = inferq::RecoveryMode::kStrict;
  std::uint64_t records = 0, first = 0, last = 0;
  auto log = inferq::StreamLog::Open(o, [&](const inferq::StreamLog::Entry& e) {
    if (records++ == 0) first = e.tx;
    last = e.tx;
    return absl::OkStatus();
  });
  REQUIRE(log.ok());
  const std::uint64_t segments = (*log)->Stats().segments;
  return "stream log " + name + ": " + std::to_string(segments) + (segments == 1 ? " segment, " : " segments, ") +
         std::to_string(records) + " records, tx_id " + std::to_string(first) + ".." + std::to_string(last) + "\n";
}

}  // namespace

TEST_CASE("inferq-state verify and inspect check a file stream's logs and change nothing") {
  state_test::TempDir d;
  MakeFileStream(d.path(), inferq::RetentionPolicy::kLimits);
  const std::vector<std::string> segs = state_test::Files(d.path(), "log-");
  const std::size_t n = std::count_if(segs.begin(), segs.end(), [](const std::string& f) { return f.ends_with(".seg"); });
  REQUIRE(n >= 2);  // 20 frames of over 300 bytes in 4 KiB segments
  const auto before = Snapshot(d.path());

  Run verify = Tool("verify " + d.path());
  CHECK(verify.status == 0);
  CHECK(verify.out == "stream log .: " + std::to_string(n) + " segments, 20 records, tx_id 1..20\n"
                      "ok: 1 stream log, 20 records verified (frame checksums, tx_ids, hash chain)\n");
  Run inspect = Tool("inspect " + d.path());
  CHECK(inspect.status == 0);
  CHECK(inspect.out.rfind("stream directory " + d.path() + "\nstream log .\n  segments: " + std::to_string(n) +
                              "\n    log-00000000000000000001.seg  ",
                          0) == 0);
  CHECK(inspect.out.ends_with("  20 records, tx_id 1..20: chain ok\n"));
  // dump has no keys to show: it says what the directory is.
  Run dump = Tool("dump " + d.path());
  CHECK(dump.status == 1);
  CHECK(dump.out == "inferq-state: '" + d.path() +
                        "' is a file stream's directory (stream logs, log-<20 digits>.seg), not a "
                        "StateStore: it has no keys to dump; inspect and verify check it\n");
  CHECK(Snapshot(d.path()) == before);  // not a byte changed, LOCK included

  SECTION("a flipped byte in a record: exit 1 naming the segment, offset and tx_id") {
    const std::string seg_path = d / "log-00000000000000000001.seg";
    std::string seg = state_test::ReadFile(seg_path);
    auto h = si::DecodeSegmentHeader(seg);
    REQUIRE(h.ok());
    const std::size_t second = si::kSegmentHeaderBytes + si::DecodeFrame(seg, si::kSegmentHeaderBytes, h->salt).size;
    const std::size_t third = second + si::DecodeFrame(seg, second, h->salt).size;
    seg[second + 100] ^= 0x01;  // in the second record's value
    state_test::WriteFile(seg_path, seg);
    const std::string why = si::DecodeFrame(seg, second, h->salt).why;
    REQUIRE(!why.empty());
    const std::string damage = "DATA_LOSS: damaged record in stream log segment 'log-00000000000000000001.seg' "
                               "at offset " + std::to_string(second) + " after tx_id 1: " + why +
                               "; valid records follow at offset " + std::to_string(third);
    Run bad = Tool("verify " + d.path());
    CHECK(bad.status == 1);
    CHECK(bad.out == "stream log .: FAILED: " + damage + "\nFAILED: 1 of 1 stream log is damaged\n");
    Run bad_inspect = Tool("inspect " + d.path());
    CHECK(bad_inspect.status == 1);
    CHECK(bad_inspect.out.ends_with("  1 records, tx_id 1..1: FAILED: " + damage + "\n"));
  }
  SECTION("an open stream is refused, naming the process that has it") {
    auto engine = inferq::Engine::Create({}).value();
    REQUIRE(engine->AddStream({.name = "REQ", .subjects = {"req.>"}, .storage = inferq::StorageType::kFile,
                               .directory = d.path(), .segment_bytes = 4096}).ok());
    Run open = Tool("verify " + d.path());
    CHECK(open.status == 1);
    CHECK(open.out == "stream log .: FAILED: FAILED_PRECONDITION: '" + d.path() + "/LOCK' is held by process " +
                          std::to_string(::getpid()) +
                          ": the stream is open; inferq-state reads a stream log only while nothing writes it\n"
                          "FAILED: 1 of 1 stream log is damaged\n");
  }
}

TEST_CASE("inferq-state verify checks every stream log of a work queue's directory") {
  state_test::TempDir d;
  MakeFileStream(d.path(), inferq::RetentionPolicy::kWorkQueue);
  REQUIRE(std::filesystem::is_directory(d / "removed"));
  REQUIRE(std::filesystem::is_directory(d / "consumers/w"));
  const std::string expected = VerifyLine(d.path(), ".") + VerifyLine(d / "consumers/w", "consumers/w") +
                               VerifyLine(d / "removed", "removed");
  Run verify = Tool("verify " + d.path());
  CHECK(verify.status == 0);
  CHECK(verify.out.rfind(expected + "ok: 3 stream logs, ", 0) == 0);
  // Damage in a sub-log is found too, and named by it.
  const std::string removed_seg = state_test::Files(d / "removed", "log-").front();
  std::string seg = state_test::ReadFile(d / ("removed/" + removed_seg));
  seg[si::kSegmentHeaderBytes + 40] ^= 0x01;
  state_test::WriteFile(d / ("removed/" + removed_seg), seg);
  Run bad = Tool("verify " + d.path());
  CHECK(bad.status == 1);
  CHECK(bad.out.find("stream log removed: FAILED: DATA_LOSS: ") != std::string::npos);
  CHECK(bad.out.find("'" + removed_seg + "' at offset " + std::to_string(si::kSegmentHeaderBytes)) !=
        std::string::npos);
  CHECK(bad.out.ends_with("FAILED: 1 of 3 stream logs are damaged\n"));
}
