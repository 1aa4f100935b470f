#include "inferq/state/state_store.hpp"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include "inferq/base/error.hpp"
#include "state/log_format.hpp"
#include "state_test_util.hpp"

using inferq::CheckpointMode;
using inferq::RecoveryMode;
using inferq::StateStore;
using inferq::StateStoreOptions;
using inferq::SyncPolicy;
using namespace state_test;
namespace si = inferq::state_internal;

namespace {

std::unique_ptr<StateStore> OpenOk(const StateStoreOptions& o) {
  auto s = StateStore::Open(o);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return std::move(*s);
}

std::uint64_t Put(StateStore& s, const std::string& k, const std::string& v) {
  auto tx = s.Begin();
  tx.Put(k, v);
  auto id = tx.Commit();
  INFO(id.status().ToString());
  REQUIRE(id.ok());
  return *id;
}

std::map<std::string, std::string> Dump(const StateStore& s, const std::string& prefix = "") {
  std::map<std::string, std::string> out;
  s.Scan(prefix, [&](std::string_view k, std::string_view v) { out.emplace(k, v); });
  return out;
}

// Offsets of the frames in a segment file: [start, end) of each.
std::vector<std::pair<std::size_t, std::size_t>> FrameOffsets(const std::string& bytes) {
  auto h = si::DecodeSegmentHeader(bytes);
  REQUIRE(h.ok());
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t off = si::kSegmentHeaderBytes;
  while (off < bytes.size()) {
    auto f = si::DecodeFrame(bytes, off, h->salt);
    if (bytes.find_first_not_of('\0', off) == std::string::npos) break;  // zero-filled ahead
    REQUIRE(f.status == si::FrameStatus::kOk);
    out.emplace_back(off, off + f.size);
    off += f.size;
  }
  return out;
}

bool Contains(const absl::Status& st, const std::string& s) {
  return std::string(st.message()).find(s) != std::string::npos;
}

}  // namespace

TEST_CASE("commit, get, scan and delete; tx_ids count from 1") {
  TempDir d;
  auto s = OpenOk(Options(d.path()));
  CHECK(s->last_tx_id() == 0);
  CHECK(Put(*s, "user.1.name", "ada") == 1);
  CHECK(Put(*s, "user.1.email", "ada@example.com") == 2);
  CHECK(Put(*s, "user.2.name", "alan") == 3);
  CHECK(Put(*s, "userx", "not under user.") == 4);
  auto tx = s->Begin();
  tx.Put("user.2.name", "turing").Delete("user.1.email");
  REQUIRE(tx.Commit().value() == 5);
  CHECK(s->Get("user.2.name") == "turing");
  CHECK_FALSE(s->Get("user.1.email").has_value());
  CHECK(Dump(*s, "user.") ==
        std::map<std::string, std::string>{{"user.1.name", "ada"}, {"user.2.name", "turing"}});
  CHECK(Dump(*s, "user.1.").size() == 1);
  CHECK(s->last_tx_id() == 5);
  CHECK(s->Stats().keys == 3);
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("records carry create, update and delete as the state saw them") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");                                   // create
    auto tx = s->Begin();
    tx.Put("a", "2").Put("b", "x").Delete("a").Put("a", "3");  // update, create, delete, create
    REQUIRE(tx.Commit().ok());
  }
  const std::string seg = ReadFile(d / si::SegmentName(1));
  auto h = si::DecodeSegmentHeader(seg);
  REQUIRE(h.ok());
  auto f1 = si::DecodeFrame(seg, si::kSegmentHeaderBytes, h->salt);
  REQUIRE(f1.status == si::FrameStatus::kOk);
  auto f2 = si::DecodeFrame(seg, si::kSegmentHeaderBytes + f1.size, h->salt);
  REQUIRE(f2.status == si::FrameStatus::kOk);
  CHECK(f1.record.ops[0].op == si::OpCode::kCreate);
  std::vector<si::OpCode> ops;
  for (const auto& op : f2.record.ops) ops.push_back(op.op);
  CHECK(ops == std::vector<si::OpCode>{si::OpCode::kUpdate, si::OpCode::kCreate,
                                       si::OpCode::kDelete, si::OpCode::kCreate});
  CHECK(f2.record.prev_hash == f1.hash);  // the chain
  auto s = OpenOk(Options(d.path()));
  CHECK(s->Get("a") == "3");
  CHECK(s->Get("b") == "x");
}

TEST_CASE("reopen recovers every commit and continues the tx_ids") {
  TempDir d;
  for (int round = 0; round < 3; ++round) {
    auto s = OpenOk(Options(d.path()));
    CHECK(s->last_tx_id() == static_cast<std::uint64_t>(round * 10));
    for (int i = 0; i < 10; ++i) Put(*s, "k." + std::to_string(i), "r" + std::to_string(round));
    CHECK(s->VerifyChain().ok());
  }
  auto s = OpenOk(Options(d.path()));
  CHECK(s->last_tx_id() == 30);
  CHECK(s->Get("k.7") == "r2");
  CHECK(s->Stats().recovered_log_records == 30);
}

TEST_CASE("bad input is refused with an error naming it, and changes nothing") {
  TempDir d;
  auto s = OpenOk(Options(d.path()));
  Put(*s, "keep", "1");
  SECTION("empty transaction") {
    auto r = s->Begin().Commit();
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message() == "transaction has no changes to commit");
  }
  SECTION("empty key, with good changes around it") {
    auto tx = s->Begin();
    tx.Put("fine", "x").Put("", "y");
    auto r = tx.Commit();
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(r.status().message() == "key '' has 0 bytes; keys have 1 to 65536");
    CHECK_FALSE(s->Get("fine").has_value());
  }
  SECTION("key too long") {
    auto tx = s->Begin();
    tx.Put(std::string(65537, 'k'), "x");
    auto r = tx.Commit();
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(r.status(), "has 65537 bytes"));
  }
  SECTION("committing twice") {
    auto tx = s->Begin();
    tx.Put("x", "1");
    REQUIRE(tx.Commit().ok());
    CHECK(tx.Commit().status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s->last_tx_id() == 2);
  }
  CHECK(s->Get("keep") == "1");
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("bad options are errors naming the field") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  SECTION("no dir") {
    o.dir = "";
    CHECK(StateStore::Open(o).status().message() == "StateStoreOptions.dir is empty");
  }
  SECTION("interval sync without an interval") {
    o.sync = SyncPolicy::kInterval;
    auto st = StateStore::Open(o).status();
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(st, "group_commit_window must be > 0 with SyncPolicy::kInterval"));
  }
  SECTION("negative window") {
    o.group_commit_window = absl::Milliseconds(-1);
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.group_commit_window -1ms is outside 0 to 10s");
  }
  SECTION("tiny segments") {
    o.segment_bytes = 100;
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.segment_bytes 100 is outside 4096 to 2^40");
  }
  SECTION("dir is a file") {
    WriteFile(d.path(), "x");
    CHECK(StateStore::Open(o).status().code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("every sync policy recovers what it acknowledged after a clean close") {
  for (SyncPolicy p : {SyncPolicy::kEveryCommit, SyncPolicy::kGroupCommit, SyncPolicy::kInterval,
                       SyncPolicy::kNone}) {
    TempDir d;
    StateStoreOptions o = Options(d.path());
    o.sync = p;
    o.group_commit_window = absl::Milliseconds(1);
    {
      auto s = OpenOk(o);
      for (int i = 0; i < 50; ++i) Put(*s, "k" + std::to_string(i % 7), std::to_string(i));
    }
    auto s = OpenOk(o);
    CHECK(s->last_tx_id() == 50);
    CHECK(s->Get("k0") == "49");
    CHECK(s->VerifyChain().ok());
  }
}

TEST_CASE("many threads commit at once: unique contiguous tx_ids, all recovered") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.sync = SyncPolicy::kGroupCommit;
  constexpr int kThreads = 8, kPer = 100;
  std::set<std::uint64_t> ids;
  std::mutex mu;
  std::atomic<int> errors{0};
  {
    auto s = OpenOk(o);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (int i = 0; i < kPer; ++i) {
          auto tx = s->Begin();
          tx.Put("t" + std::to_string(t) + ".n", std::to_string(i))
              .Put("t" + std::to_string(t) + ".copy", std::to_string(i));
          auto r = tx.Commit();
          if (!r.ok()) {
            ++errors;
            continue;
          }
          std::lock_guard lock(mu);
          ids.insert(*r);
        }
      });
    }
    for (auto& t : ts) t.join();
    CHECK(s->Stats().commits == kThreads * kPer);
    CHECK(s->VerifyChain().ok());
  }
  CHECK(errors == 0);
  REQUIRE(ids.size() == kThreads * kPer);
  CHECK(*ids.begin() == 1);
  CHECK(*ids.rbegin() == kThreads * kPer);
  auto s = OpenOk(o);
  for (int t = 0; t < kThreads; ++t) {
    CHECK(s->Get("t" + std::to_string(t) + ".n") == std::to_string(kPer - 1));
  }
}

TEST_CASE("group commit: commits that wait together share one fdatasync") {
  TempDir d;
  auto faulty = std::make_shared<FaultyFileSystem>();
  StateStoreOptions o = Options(d.path());
  o.file_system = faulty;
  const bool group = GENERATE(true, false);
  o.sync = group ? SyncPolicy::kGroupCommit : SyncPolicy::kEveryCommit;
  auto s = OpenOk(o);
  const int syncs0 = faulty->calls("sync");
  faulty->HoldSyncs();
  std::vector<std::thread> ts;
  std::atomic<int> done{0};
  ts.emplace_back([&] {
    auto tx = s->Begin();
    tx.Put("first", "1");
    if (tx.Commit().ok()) ++done;
  });
  while (faulty->syncs_waiting() == 0) std::this_thread::yield();  // the leader is in sync
  for (int t = 0; t < 7; ++t) {
    ts.emplace_back([&, t] {
      auto tx = s->Begin();
      tx.Put("t" + std::to_string(t), "x");
      if (tx.Commit().ok()) ++done;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the 7 queue up
  faulty->Release();
  for (auto& t : ts) t.join();
  CHECK(done == 8);
  // Group commit: the leader's sync, then one for the 7 that queued behind it.
  // Every-commit: one each.
  CHECK(faulty->calls("sync") - syncs0 == (group ? 2 : 8));
  CHECK(s->last_tx_id() == 8);
}

TEST_CASE("incremental checkpoints hold only the changed keys, tombstones included") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 100; ++i) Put(*s, "session." + std::to_string(i), std::string(400, 'a'));
    REQUIRE(s->Checkpoint().ok());  // the first one is full
    CHECK(s->Stats().checkpoints_full == 1);
    Put(*s, "session.3", std::string(400, 'b'));
    auto tx = s->Begin();
    tx.Delete("session.4");
    REQUIRE(tx.Commit().ok());
    REQUIRE(s->Checkpoint().ok());
    auto st = s->Stats();
    CHECK(st.checkpoints_incremental == 1);
    CHECK(st.last_checkpoint_tx == 102);
  }
  auto files = Files(d.path(), "ckpt-");
  REQUIRE(files == std::vector<std::string>{si::CheckpointName(100, si::CheckpointKind::kFull),
                                            si::CheckpointName(102, si::CheckpointKind::kIncremental)});
  auto incr = si::DecodeCheckpoint(ReadFile(d / files[1]));
  REQUIRE(incr.ok());
  CHECK(incr->base_tx == 100);
  REQUIRE(incr->entries.size() == 2);
  CHECK(incr->entries[0].key == "session.3");
  CHECK(incr->entries[0].value == std::string(400, 'b'));
  CHECK(incr->entries[1].key == "session.4");
  CHECK(incr->entries[1].tombstone);
  auto s = OpenOk(o);
  CHECK(s->Stats().recovered_checkpoints == 2);
  CHECK(s->Stats().recovered_log_records == 0);
  CHECK(s->Get("session.3") == std::string(400, 'b'));
  CHECK_FALSE(s->Get("session.4").has_value());
  CHECK(s->Stats().keys == 99);
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("keys replayed from the log after a reopen reach the next incremental checkpoint") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
    REQUIRE(s->Checkpoint().ok());
    Put(*s, "b", "2");  // only in the log
  }
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "c", "3");
    REQUIRE(s->Checkpoint().ok());  // incremental: b (replayed at Open) and c
  }
  auto incr = si::DecodeCheckpoint(ReadFile(d / si::CheckpointName(3, si::CheckpointKind::kIncremental)));
  REQUIRE(incr.ok());
  REQUIRE(incr->entries.size() == 2);  // was: c alone, b lost once its log was retired
  CHECK(incr->entries[0].key == "b");
  CHECK(incr->entries[1].key == "c");
}

TEST_CASE("retirement keeps a way back from any one damaged checkpoint") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.max_incremental_chain = 2;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 100; ++i) Put(*s, "k" + std::to_string(i), std::string(50, 'a'));
    REQUIRE(s->Checkpoint().ok());
    for (int round = 1; round <= 5; ++round) {
      for (int i = 0; i < 20; ++i) Put(*s, "k" + std::to_string(i), std::string(50, 'a' + round));
      REQUIRE(s->Checkpoint().ok());
    }
    // full(100) incr(120) incr(140) full(160) incr(180) incr(200): F = 160, P = 140;
    // kept: P's chain from full(100) on, and the log from 141.
    CHECK(Files(d.path(), "ckpt-") ==
          std::vector<std::string>{si::CheckpointName(100, si::CheckpointKind::kFull),
                                   si::CheckpointName(120, si::CheckpointKind::kIncremental),
                                   si::CheckpointName(140, si::CheckpointKind::kIncremental),
                                   si::CheckpointName(160, si::CheckpointKind::kFull),
                                   si::CheckpointName(180, si::CheckpointKind::kIncremental),
                                   si::CheckpointName(200, si::CheckpointKind::kIncremental)});
    auto report = StateStore::Inspect(d.path());
    REQUIRE(report.ok());
    CHECK(report->chain.ok());
    CHECK(report->first_tx <= 141);  // the log from P on
    CHECK(report->first_tx > 110);   // older segments are gone
  }
  // Damage any one checkpoint: point-in-time recovery still gets every commit.
  const auto victim = GENERATE(si::CheckpointName(160, si::CheckpointKind::kFull),
                               si::CheckpointName(180, si::CheckpointKind::kIncremental),
                               si::CheckpointName(200, si::CheckpointKind::kIncremental));
  std::string bytes = ReadFile(d / victim);
  bytes[bytes.size() / 2] ^= 1;
  WriteFile(d / victim, bytes);
  auto s = OpenOk(o);  // was: tx_id gap once F160 or I180 was damaged
  CHECK(s->last_tx_id() == 200);
  CHECK(s->Get("k0") == std::string(50, 'f'));
  CHECK(s->Get("k99") == std::string(50, 'a'));
  CHECK(s->VerifyChain().ok());  // the damaged one and those built on it are set aside
  StateStoreOptions strict = o;
  strict.recovery = RecoveryMode::kStrict;
  s.reset();
  CHECK(StateStore::Open(strict).ok());
}

TEST_CASE("incremental checkpoints that outweigh the full one are followed by a full one") {
  TempDir d;
  auto s = OpenOk(Options(d.path()));
  for (int i = 0; i < 10; ++i) Put(*s, "k" + std::to_string(i), std::string(100, 'a'));
  REQUIRE(s->Checkpoint().ok());                      // full, 10 keys
  for (int i = 0; i < 10; ++i) Put(*s, "k" + std::to_string(i), std::string(100, 'b'));
  REQUIRE(s->Checkpoint().ok());                      // incremental, the same 10 keys
  Put(*s, "k0", "c");
  REQUIRE(s->Checkpoint().ok());                      // the chain weighs as much: full
  CHECK(s->Stats().checkpoints_full == 2);
  CHECK(s->Stats().checkpoints_incremental == 1);
  CHECK(Files(d.path(), "ckpt-").back() == si::CheckpointName(21, si::CheckpointKind::kFull));
}

// ---- damage ----

// One past the last nonzero byte of bytes[from, to).
std::size_t NonZeroEnd(const std::string& bytes, std::size_t from, std::size_t to) {
  while (to > from && bytes[to - 1] == '\0') --to;
  return to;
}

TEST_CASE("a log cut at any byte of its last three records recovers to the last whole one") {
  // Two shapes of a torn write: the file ends at the cut (no space written ahead),
  // or the space after the cut is still the zeros the writer filled in ahead.
  TempDir base;
  {
    auto s = OpenOk(Options(base.path()));
    for (int i = 1; i <= 6; ++i) Put(*s, "k" + std::to_string(i), std::string(i * 10, 'v'));
  }
  const std::string seg_name = si::SegmentName(1);
  const std::string full = ReadFile(base / seg_name);
  const auto frames = FrameOffsets(full);
  REQUIRE(frames.size() == 6);
  const std::size_t end = frames.back().second;
  for (const bool zero_filled : {false, true}) {
    for (std::size_t cut = frames[3].first; cut <= end; ++cut) {
      INFO("cut at " << cut << (zero_filled ? ", zero-filled after" : ", file ends there"));
      TempDir d;
      std::filesystem::create_directories(d.path());
      std::filesystem::copy_file(base / "IDENTITY", d / "IDENTITY");
      std::string bytes = full.substr(0, cut);
      if (zero_filled) bytes += std::string(full.size() - cut, '\0');
      WriteFile(d / seg_name, bytes);
      std::uint64_t whole = 0;
      for (const auto& [a, b] : frames) whole += b <= cut ? 1 : 0;
      const std::size_t good_end = frames[whole - 1].second;
      const std::size_t torn = NonZeroEnd(bytes, good_end, bytes.size()) - good_end;
      StateStoreOptions o = Options(d.path());
      o.recovery = RecoveryMode::kStrict;
      auto strict = StateStore::Open(o);
      if (torn == 0) {
        REQUIRE(strict.ok());
        CHECK((*strict)->last_tx_id() == whole);
        strict->reset();
      } else {
        REQUIRE(strict.status().code() == absl::StatusCode::kDataLoss);
        CHECK(Contains(strict.status(), "torn tail in log segment '" + seg_name + "' at offset " +
                                            std::to_string(good_end)));
      }
      o.recovery = RecoveryMode::kPointInTime;
      {
        auto s = OpenOk(o);
        REQUIRE(s->last_tx_id() == whole);
        CHECK(s->Stats().torn_tail_bytes == torn);
        CHECK(s->Get("k" + std::to_string(whole)) == std::string(whole * 10, 'v'));
        CHECK_FALSE(s->Get("k" + std::to_string(whole + 1)).has_value());
        CHECK(Put(*s, "after", "cut") == whole + 1);  // written over the torn bytes
      }
      auto s = OpenOk(o);
      CHECK(s->last_tx_id() == whole + 1);
      CHECK(s->Get("after") == "cut");
      CHECK(s->Stats().torn_tail_bytes == 0);  // the torn bytes were zeroed, not left
      CHECK(s->VerifyChain().ok());
    }
  }
}

TEST_CASE("zeros after the last record are the clean end of the log, in both modes") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 0; i < 5; ++i) Put(*s, "k", std::to_string(i));
  }
  const std::string seg = d / si::SegmentName(1);
  std::string bytes = ReadFile(seg);
  const auto frames = FrameOffsets(bytes);
  REQUIRE(frames.size() == 5);
  // Zero the last record too, as a file system that never got its blocks would.
  bytes.replace(frames[4].first, frames[4].second - frames[4].first,
                std::string(frames[4].second - frames[4].first, '\0'));
  WriteFile(seg, bytes + std::string(4096, '\0'));
  for (RecoveryMode m : {RecoveryMode::kStrict, RecoveryMode::kPointInTime}) {
    StateStoreOptions o = Options(d.path());
    o.recovery = m;
    auto s = OpenOk(o);
    CHECK(s->last_tx_id() == 4);
    CHECK(s->Stats().torn_tail_bytes == 0);
    CHECK(s->Get("k") == "3");
  }
}

TEST_CASE("one flipped byte in an older segment fails recovery, naming file, offset and tx_id") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 200; ++i) Put(*s, "k" + std::to_string(i), std::string(40, 'x'));
  }
  const auto segs = Files(d.path(), "wal-");
  REQUIRE(segs.size() >= 3);
  const std::string path = d / segs[0];
  std::string bytes = ReadFile(path);
  const auto frames = FrameOffsets(bytes);
  const std::size_t victim = frames[frames.size() / 2].first + 40;  // inside a record
  bytes[victim] ^= 0x01;
  WriteFile(path, bytes);
  const std::string expect = "damaged record in log segment '" + segs[0] + "' at offset " +
                             std::to_string(frames[frames.size() / 2].first) + " after tx_id " +
                             std::to_string(frames.size() / 2);
  for (RecoveryMode m : {RecoveryMode::kStrict, RecoveryMode::kPointInTime}) {
    o.recovery = m;
    auto r = StateStore::Open(o);
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(r.status(), expect));
    CHECK(Contains(r.status(), "frame checksum mismatch"));
  }
}

TEST_CASE("an edited record with a recomputed checksum breaks the hash chain") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 0; i < 4; ++i) Put(*s, "balance", std::to_string(100 + i));
  }
  const std::string path = d / si::SegmentName(1);
  std::string bytes = ReadFile(path);
  auto h = si::DecodeSegmentHeader(bytes);
  const auto frames = FrameOffsets(bytes);
  auto f = si::DecodeFrame(bytes, frames[1].first, h->salt);
  f.record.ops[0].value = "999";  // same length: the file layout stays
  std::string forged;
  si::AppendFrame(forged, h->salt, f.record);
  REQUIRE(forged.size() == frames[1].second - frames[1].first);
  bytes.replace(frames[1].first, forged.size(), forged);
  WriteFile(path, bytes);
  auto r = StateStore::Open(Options(d.path()));
  REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(r.status(), "broken hash chain at tx_id 3 in log segment '" + si::SegmentName(1) +
                                 "' at offset " + std::to_string(frames[2].first)));
}

TEST_CASE("a deleted middle segment is a tx_id gap naming the next one") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 200; ++i) Put(*s, "k" + std::to_string(i), std::string(40, 'x'));
  }
  const auto segs = Files(d.path(), "wal-");
  REQUIRE(segs.size() >= 3);
  std::filesystem::remove(d / segs[1]);
  const std::uint64_t first_missing = *si::ParseSegmentName(segs[1]);
  const std::uint64_t found = *si::ParseSegmentName(segs[2]);
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(r.status().message() == "tx_id gap in log segment '" + segs[2] + "' at offset 40: expected tx_id " +
                                    std::to_string(first_missing) + ", found " + std::to_string(found));
}

TEST_CASE("a torn checkpoint falls back to the one before it") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 100; ++i) Put(*s, "k" + std::to_string(i), "old");
    REQUIRE(s->Checkpoint().ok());
    for (int i = 0; i < 50; ++i) Put(*s, "k" + std::to_string(i), "new");
    REQUIRE(s->Checkpoint().ok());
    Put(*s, "tail", "t");
  }
  const std::string newest = d / si::CheckpointName(150, si::CheckpointKind::kIncremental);
  const std::string bytes = ReadFile(newest);
  WriteFile(newest, bytes.substr(0, bytes.size() / 2));
  o.recovery = RecoveryMode::kStrict;
  auto strict = StateStore::Open(o);
  REQUIRE(strict.status().code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(strict.status(), "checkpoint '" + si::CheckpointName(150, si::CheckpointKind::kIncremental) +
                                      "': checkpoint checksum mismatch"));
  o.recovery = RecoveryMode::kPointInTime;
  auto s = OpenOk(o);
  CHECK(s->Stats().recovered_checkpoints == 1);   // the full one at 100
  CHECK(s->Stats().recovered_log_records == 51);  // 101..151 from the log
  CHECK(s->Get("k0") == "new");
  CHECK(s->Get("k99") == "old");
  CHECK(s->Get("tail") == "t");
  CHECK(s->last_tx_id() == 151);
}

TEST_CASE("an unfinished checkpoint temp file is ignored and removed") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
  }
  WriteFile(d / (si::CheckpointName(1, si::CheckpointKind::kFull) + ".tmp"), "garbage");
  auto s = OpenOk(Options(d.path()));
  CHECK(s->Get("a") == "1");
  CHECK(Files(d.path(), "ckpt-").empty());
}

TEST_CASE("read-only open changes no file, even with a torn tail") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 0; i < 3; ++i) Put(*s, "k", std::to_string(i));
  }
  const std::string seg = d / si::SegmentName(1);
  const std::string torn = ReadFile(seg) + "partial";
  WriteFile(seg, torn);
  StateStoreOptions o = Options(d.path());
  o.read_only = true;
  {
    auto s = OpenOk(o);
    CHECK(s->Get("k") == "2");
    auto tx = s->Begin();
    tx.Put("x", "y");
    CHECK(tx.Commit().status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s->Checkpoint().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK(ReadFile(seg) == torn);
}

// ---- injected I/O failures ----

TEST_CASE("a failed write or fdatasync fails the store; acknowledged commits survive") {
  const std::string kind = GENERATE(std::string("write"), std::string("sync"));
  const int err = GENERATE(EIO, ENOSPC);
  TempDir d;
  auto faulty = std::make_shared<FaultyFileSystem>();
  StateStoreOptions o = Options(d.path());
  o.file_system = faulty;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 5; ++i) Put(*s, "k" + std::to_string(i), "v");
    faulty->FailNth(kind, 1, err);
    auto tx = s->Begin();
    tx.Put("doomed", "x");
    auto r = tx.Commit();
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == (err == EIO ? absl::StatusCode::kDataLoss
                                           : absl::StatusCode::kResourceExhausted));
    CHECK(Contains(r.status(), "injected"));
    auto again = s->Begin();
    again.Put("later", "x");
    auto r2 = again.Commit();
    CHECK(r2.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(r2.status(), "is in the failed state after: " + kind + ": injected"));
    CHECK(s->Stats().failed);
    CHECK(s->last_tx_id() == 5);
    CHECK_FALSE(s->Get("doomed").has_value());
  }
  auto s = OpenOk(Options(d.path()));
  for (int i = 0; i < 5; ++i) CHECK(s->Get("k" + std::to_string(i)) == "v");
  CHECK_FALSE(s->Get("later").has_value());
  CHECK(s->VerifyChain().ok());
  const std::uint64_t before = s->last_tx_id();
  CHECK(Put(*s, "next", "ok") == before + 1);
}

TEST_CASE("a failure at any step of a checkpoint swap loses nothing acknowledged") {
  // Steps of Checkpoint(): create temp, write, sync, close, rename, sync dir, then
  // retire: remove old files, sync dir.
  const std::string kind = GENERATE(std::string("create"), std::string("write"),
                                    std::string("sync"), std::string("close"),
                                    std::string("rename"), std::string("syncdir"),
                                    std::string("remove"));
  const int err = GENERATE(EIO, ENOSPC);
  TempDir d;
  auto faulty = std::make_shared<FaultyFileSystem>();
  StateStoreOptions o = Options(d.path());
  o.file_system = faulty;
  o.segment_bytes = 4096;
  {
    auto s = OpenOk(o);
    for (int i = 0; i < 100; ++i) Put(*s, "k" + std::to_string(i), std::string(50, 'a'));
    REQUIRE(s->Checkpoint().ok());
    for (int i = 0; i < 100; ++i) Put(*s, "k" + std::to_string(i), std::string(50, 'b'));
    REQUIRE(s->Checkpoint().ok());
    for (int i = 0; i < 100; ++i) Put(*s, "k" + std::to_string(i), std::string(50, 'c'));
    faulty->FailNth(kind, 1, err);
    const absl::Status st = s->Checkpoint();  // the third: retires files of the first
    UNSCOPED_INFO("step " << kind << " errno " << err);
    REQUIRE_FALSE(st.ok());
    CHECK(Contains(st, kind + ": injected"));
    CHECK(s->Stats().failed);
    auto tx = s->Begin();
    tx.Put("x", "y");
    CHECK(tx.Commit().status().code() == absl::StatusCode::kFailedPrecondition);
  }
  auto s = OpenOk(Options(d.path()));
  CHECK(s->last_tx_id() == 300);
  for (int i = 0; i < 100; i += 9) CHECK(s->Get("k" + std::to_string(i)) == std::string(50, 'c'));
  CHECK(s->VerifyChain().ok());
  CHECK(Files(d.path(), "ckpt-").size() >= 2);
  for (const auto& f : Files(d.path(), "ckpt-")) CHECK(f.find(".tmp") == std::string::npos);
}

TEST_CASE("VerifyChain detects a record edited on disk under an open store") {
  TempDir d;
  auto s = OpenOk(Options(d.path()));
  for (int i = 0; i < 5; ++i) Put(*s, "k", std::to_string(i));
  REQUIRE(s->VerifyChain().ok());
  const std::string path = d / si::SegmentName(1);
  std::string bytes = ReadFile(path);
  const auto frames = FrameOffsets(bytes);
  bytes[frames[2].first + 30] ^= 0x40;
  WriteFile(path, bytes);
  const absl::Status st = s->VerifyChain();
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(st, "damaged record in log segment '" + si::SegmentName(1) + "' at offset " +
                         std::to_string(frames[2].first) + " after tx_id 2"));
}

TEST_CASE("automatic checkpoints by log size") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.checkpoint_log_bytes = 16 * 1024;
  auto s = OpenOk(o);
  for (int i = 0; i < 400; ++i) Put(*s, "k" + std::to_string(i % 20), std::string(100, 'z'));
  // 400 records of ~150 bytes = ~60 KiB: the maintenance thread checkpoints.
  for (int i = 0; i < 500 && s->Stats().last_checkpoint_tx == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s->Stats().last_checkpoint_tx > 0);
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("VerifyChain and Checkpoint while many threads commit: no hang, nothing lost") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.sync = SyncPolicy::kGroupCommit;
  o.segment_bytes = 8192;
  auto s = OpenOk(o);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        auto tx = s->Begin();
        tx.Put("t" + std::to_string(t), std::to_string(i));
        (tx.Commit().ok() ? ok : bad)++;
      }
    });
  }
  int verified = 0;
  for (int round = 0; round < 20; ++round) {
    verified += s->VerifyChain().ok() ? 1 : 0;
    REQUIRE(s->Checkpoint().ok());
  }
  stop = true;
  for (auto& t : ts) t.join();
  CHECK(verified == 20);
  CHECK(bad == 0);
  CHECK(s->last_tx_id() == static_cast<std::uint64_t>(ok.load()));
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("an fdatasync failure fails its batch with the I/O error and queued commits with the failed state") {
  TempDir d;
  auto faulty = std::make_shared<FaultyFileSystem>();
  StateStoreOptions o = Options(d.path());
  o.file_system = faulty;
  o.sync = SyncPolicy::kGroupCommit;
  auto s = OpenOk(o);
  faulty->HoldSyncs();
  faulty->FailNth("sync", 1, EIO);
  std::vector<absl::StatusCode> codes(8, absl::StatusCode::kOk);
  std::vector<std::thread> ts;
  ts.emplace_back([&] {
    auto tx = s->Begin();
    tx.Put("first", "1");
    codes[0] = tx.Commit().status().code();
  });
  while (faulty->syncs_waiting() == 0) std::this_thread::yield();
  for (int t = 1; t < 8; ++t) {
    ts.emplace_back([&, t] {
      auto tx = s->Begin();
      tx.Put("t" + std::to_string(t), "x");
      codes[t] = tx.Commit().status().code();
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  faulty->Release();
  for (auto& t : ts) t.join();
  CHECK(codes[0] == absl::StatusCode::kDataLoss);
  for (int t = 1; t < 8; ++t) CHECK(codes[t] == absl::StatusCode::kFailedPrecondition);
  CHECK(s->last_tx_id() == 0);
}

TEST_CASE("a directory is opened by one store at a time; read-only opens are not locked out") {
  TempDir d;
  auto first = OpenOk(Options(d.path()));
  Put(*first, "a", "1");
  auto second = StateStore::Open(Options(d.path()));
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(second.status().message() ==
        "'" + d.path() +
            "/LOCK' is held by this process: another store in this process has this directory open");
  StateStoreOptions ro = Options(d.path());
  ro.read_only = true;
  auto reader = OpenOk(ro);
  CHECK(reader->Get("a") == "1");
  first.reset();
  auto third = OpenOk(Options(d.path()));  // the lock went with the first store
  CHECK(third->Get("a") == "1");
}

TEST_CASE("automatic checkpoints by interval") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.checkpoint_interval = absl::Milliseconds(20);
  auto s = OpenOk(o);
  Put(*s, "a", "1");
  for (int i = 0; i < 500 && s->Stats().last_checkpoint_tx == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s->Stats().last_checkpoint_tx == 1);
  CHECK(Files(d.path(), "ckpt-") ==
        std::vector<std::string>{si::CheckpointName(1, si::CheckpointKind::kFull)});
}

// ---- regressions from an adversarial run (each is its smallest reproducer) ----

TEST_CASE("a segment left empty by a crash during rotation is replaced; appends go to the one before") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 1; i <= 10; ++i) Put(*s, "k" + std::to_string(i), "v");
    REQUIRE(s->Checkpoint().ok());  // covers all of wal-1 (once skipped unread)
  }
  WriteFile(d / si::SegmentName(11), "");  // created, header never written
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 11; i <= 13; ++i) CHECK(Put(*s, "k" + std::to_string(i), "v") == static_cast<std::uint64_t>(i));
  }
  auto s = OpenOk(Options(d.path()));  // was: wal-1's header overwritten, DATA_LOSS
  CHECK(s->last_tx_id() == 13);
  CHECK(s->Get("k13") == "v");
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("full checkpoints in a row keep the log the fallback checkpoint needs") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.checkpoint_mode = CheckpointMode::kFull;
  o.segment_bytes = 4096;
  {
    auto s = OpenOk(o);
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < 200; ++i) Put(*s, "k" + std::to_string(i % 50), std::to_string(round));
      REQUIRE(s->Checkpoint().ok());
    }
  }
  const std::string newest = d / si::CheckpointName(600, si::CheckpointKind::kFull);
  std::string bytes = ReadFile(newest);
  bytes[bytes.size() / 2] ^= 1;
  WriteFile(newest, bytes);
  auto s = OpenOk(o);  // was: the log after tx 400 was retired: tx_id gap
  CHECK(s->last_tx_id() == 600);
  CHECK(s->Stats().recovered_checkpoints == 1);
  CHECK(s->Get("k49") == "2");
}

TEST_CASE("a zeroed header in front of records is damage, not a torn segment") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    for (int i = 0; i < 20; ++i) Put(*s, "k" + std::to_string(i), "v");
  }
  const std::string seg = d / si::SegmentName(1);
  std::string bytes = ReadFile(seg);
  std::fill(bytes.begin(), bytes.begin() + si::kSegmentHeaderBytes, '\0');
  WriteFile(seg, bytes);
  auto r = StateStore::Open(Options(d.path()));  // was: segment deleted, OK with 0 keys
  REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(r.status().message() == "log segment '" + si::SegmentName(1) +
                                    "' at offset 0 (after tx_id 0): segment header has a wrong magic");
  CHECK(std::filesystem::exists(seg));
}

TEST_CASE("a transaction over the 1 GiB record limit is refused before anything is written") {
  TempDir d;
  auto s = OpenOk(Options(d.path()));
  const std::string big(256u << 20, 'x');  // each value at the per-value limit
  auto tx = s->Begin();
  for (int i = 0; i < 4; ++i) tx.Put("big" + std::to_string(i), big);
  auto r = tx.Commit();  // was: acknowledged, then unreadable
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "transaction of 4 changes encodes to 1073741920 bytes, more than the 1073741824-byte "
        "record limit");
  CHECK(s->last_tx_id() == 0);
}

TEST_CASE("a damaged incremental checkpoint is set aside and later ones build past it") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  auto round = [&](StateStore& s, int from, int n) {
    for (int i = from; i < from + n; ++i) Put(s, "k" + std::to_string(i % 10), std::to_string(i));
    REQUIRE(s.Checkpoint().ok());
  };
  {
    auto s = OpenOk(o);
    round(*s, 0, 100);   // full at 100
    round(*s, 100, 60);  // incremental at 160
    round(*s, 160, 60);  // incremental at 220
  }
  const std::string victim = d / si::CheckpointName(220, si::CheckpointKind::kIncremental);
  std::string bytes = ReadFile(victim);
  bytes[bytes.size() / 2] ^= 1;
  WriteFile(victim, bytes);
  {
    auto s = OpenOk(o);
    CHECK(s->last_tx_id() == 220);
    CHECK(std::filesystem::exists(victim + ".damaged"));
    round(*s, 220, 60);  // incremental at 280, on 160
    round(*s, 280, 60);  // incremental at 340: retires the log up to 280
  }
  auto s = OpenOk(o);  // was: stopped at the damaged one, tx_id gap
  CHECK(s->last_tx_id() == 340);
  CHECK(s->Get("k9") == "339");
  CHECK(s->Stats().recovered_log_records == 0);
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("checkpoints and segments of another store's directory are refused") {
  TempDir a, b;
  {
    auto sa = OpenOk(Options(a.path()));
    for (int i = 0; i < 10; ++i) Put(*sa, "mine", std::to_string(i));
    auto sb = OpenOk(Options(b.path()));
    for (int i = 0; i < 25; ++i) Put(*sb, "theirs", std::to_string(i));
    REQUIRE(sb->Checkpoint().ok());
  }
  SECTION("a checkpoint beyond our log") {
    const std::string name = si::CheckpointName(25, si::CheckpointKind::kFull);
    std::filesystem::copy_file(b / name, a / name);
    StateStoreOptions o = Options(a.path());
    o.recovery = RecoveryMode::kStrict;
    auto strict = StateStore::Open(o);
    REQUIRE(strict.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(strict.status(), "checkpoint '" + name + "' belongs to another store"));
    auto s = OpenOk(Options(a.path()));  // was: accepted, last_tx 25, wrong keys
    CHECK(s->last_tx_id() == 10);
    CHECK(s->Get("mine") == "9");
    CHECK_FALSE(s->Get("theirs").has_value());
  }
  SECTION("a segment") {
    std::filesystem::copy_file(b / si::SegmentName(1), a / si::SegmentName(11));
    auto r = StateStore::Open(Options(a.path()));
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(r.status(), "log segment '" + si::SegmentName(11) + "' at offset 0 belongs to another store"));
  }
  SECTION("log files without an IDENTITY") {
    std::filesystem::remove(a / "IDENTITY");
    auto r = StateStore::Open(Options(a.path()));
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(r.status(), "holds log or checkpoint files but no IDENTITY file"));
  }
}

TEST_CASE("out-of-range enums and unbounded durations in the options are refused") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  SECTION("sync") {
    o.sync = static_cast<SyncPolicy>(42);
    CHECK(StateStore::Open(o).status().message() == "StateStoreOptions.sync 42 is not a SyncPolicy");
  }
  SECTION("recovery") {
    o.recovery = static_cast<RecoveryMode>(7);
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.recovery 7 is not a RecoveryMode");
  }
  SECTION("checkpoint mode") {
    o.checkpoint_mode = static_cast<CheckpointMode>(9);
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.checkpoint_mode 9 is not a CheckpointMode");
  }
  SECTION("infinite checkpoint interval") {
    o.checkpoint_interval = absl::InfiniteDuration();
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.checkpoint_interval inf is outside 0 (never) to 720h");
  }
  SECTION("infinite group commit window") {
    o.group_commit_window = absl::InfiniteDuration();
    CHECK(StateStore::Open(o).status().message() ==
          "StateStoreOptions.group_commit_window inf is outside 0 to 10s");
  }
  CHECK_FALSE(std::filesystem::exists(d.path()));  // nothing created
}

TEST_CASE("files that are not the store's are left alone") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
  }
  WriteFile(d / "notes.tmp", "mine");
  std::filesystem::create_directories(d / "x.tmp");
  auto s = OpenOk(Options(d.path()));  // was: notes.tmp deleted; x.tmp failed the open
  CHECK(ReadFile(d / "notes.tmp") == "mine");
  CHECK(s->Get("a") == "1");
}

// ---- regressions from a second adversarial run ----

TEST_CASE("after kNone loses log a checkpoint holds, later checkpoints keep the store openable") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.sync = SyncPolicy::kNone;
  {
    auto s = OpenOk(o);
    for (int i = 1; i <= 60; ++i) Put(*s, "k", std::to_string(i));
    REQUIRE(s->Checkpoint().ok());  // full at 60
  }
  // A power loss keeps the checkpoint (synced) but not the log after tx 40.
  const std::string seg = d / si::SegmentName(1);
  std::string bytes = ReadFile(seg);
  const auto frames = FrameOffsets(bytes);
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(frames[40].first), bytes.end(), '\0');
  WriteFile(seg, bytes);
  {
    auto s = OpenOk(o);
    CHECK(s->last_tx_id() == 60);
    for (int i = 61; i <= 70; ++i) Put(*s, "k", std::to_string(i));  // the log jumps 40 -> 61
    REQUIRE(s->Checkpoint().ok());  // incremental at 70
    CHECK(s->VerifyChain().ok());   // was: tx_id gap, expected 41, found 61
  }
  auto s = OpenOk(o);  // was: the same gap, in both modes
  CHECK(s->last_tx_id() == 70);
  CHECK(s->Get("k") == "70");
}

TEST_CASE("an I/O error reading a checkpoint at open is returned, and the file is kept") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
    REQUIRE(s->Checkpoint().ok());
  }
  auto faulty = std::make_shared<FaultyFileSystem>();
  StateStoreOptions o = Options(d.path());
  o.file_system = faulty;
  faulty->FailNth("read", 2, EIO);  // IDENTITY, then the checkpoint
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(r.status().message() == "read: injected EIO");  // was: renamed *.damaged, tx_id gap
  CHECK(std::filesystem::exists(d / si::CheckpointName(1, si::CheckpointKind::kFull)));
  auto s = OpenOk(o);  // the error was transient
  CHECK(s->Get("a") == "1");
  CHECK(s->Stats().recovered_checkpoints == 1);
}

TEST_CASE("a read-only open lists again when a file it listed is gone before it reads it") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
  }
  // Stands for a writer retiring the segment between the listing and the read.
  class VanishingOnce final : public inferq::FileSystem {
   public:
    std::shared_ptr<inferq::FileSystem> base = inferq::PosixFileSystem();
    int reads = 0;
    absl::StatusOr<std::unique_ptr<inferq::FileLock>> Lock(const std::string& p) override { return base->Lock(p); }
    absl::StatusOr<std::unique_ptr<inferq::WritableFile>> Create(const std::string& p) override { return base->Create(p); }
    absl::StatusOr<std::unique_ptr<inferq::WritableFile>> OpenForWrite(const std::string& p) override { return base->OpenForWrite(p); }
    absl::StatusOr<std::string> Read(const std::string& p) override {
      if (p.find("wal-") != std::string::npos && reads++ == 0) {
        return absl::NotFoundError("open '" + p + "': No such file or directory");
      }
      return base->Read(p);
    }
    absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override { return base->List(dir); }
    absl::Status CreateDir(const std::string& dir) override { return base->CreateDir(dir); }
    absl::Status Rename(const std::string& a, const std::string& b) override { return base->Rename(a, b); }
    absl::Status Remove(const std::string& p) override { return base->Remove(p); }
    absl::Status SyncDir(const std::string& dir) override { return base->SyncDir(dir); }
  };
  auto fs = std::make_shared<VanishingOnce>();
  StateStoreOptions o = Options(d.path());
  o.read_only = true;
  o.file_system = fs;
  auto s = OpenOk(o);  // was: NOT_FOUND now and then next to a writer
  CHECK(s->Get("a") == "1");
  CHECK(fs->reads == 2);
}

// ---- regressions from an outside tester ----

namespace {

// Commits `n` records (keys k0..k9) after the last one.
void Commits(StateStore& s, int n) {
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tx = s.last_tx_id() + 1;
    Put(s, "k" + std::to_string(tx % 10), std::to_string(tx));
  }
}

StateStoreOptions ReadOnly(StateStoreOptions o, RecoveryMode mode) {
  o.read_only = true;
  o.recovery = mode;
  return o;
}

}  // namespace

TEST_CASE("a read-only store's VerifyChain accepts what the writer committed and retired after its open") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.checkpoint_mode = CheckpointMode::kFull;
  auto writer = OpenOk(o);
  Commits(*writer, 100);
  auto hooked = std::make_shared<HookedFileSystem>();
  StateStoreOptions ro = ReadOnly(o, RecoveryMode::kStrict);  // as inferq-state verify opens
  ro.file_system = hooked;
  auto reader = OpenOk(ro);
  REQUIRE(reader->last_tx_id() == 100);
  bool retired = false;  // outlives the sections: the read hook runs after them
  SECTION("commits after the open") {
    Commits(*writer, 15);
  }
  SECTION("checkpoints that retire the segments the reader read") {
    for (int round = 0; round < 3; ++round) {
      Commits(*writer, 100);
      REQUIRE(writer->Checkpoint().ok());
    }
    REQUIRE_FALSE(std::filesystem::exists(d / si::SegmentName(1)));
  }
  SECTION("a segment retired between VerifyChain's listing and its read of it") {
    Commits(*writer, 100);
    REQUIRE(writer->Checkpoint().ok());  // full at 200
    Commits(*writer, 100);
    REQUIRE(writer->Checkpoint().ok());  // full at 300
    Commits(*writer, 100);
    hooked->before_read = [&](const std::string& path) {
      if (retired || path.find("/wal-") == std::string::npos) return;
      retired = true;
      REQUIRE(writer->Checkpoint().ok());  // full at 400: the log up to 300 goes
      REQUIRE_FALSE(std::filesystem::exists(path));
    };
  }
  const absl::Status st = reader->VerifyChain();  // was: DATA_LOSS, files end at 115 but
  INFO(st.ToString());                            // the store has committed up to 100
  CHECK(st.ok());
  CHECK(reader->last_tx_id() == 100);  // the reader's cut stays where it was read
  CHECK(reader->Get("k0") == "100");
}

TEST_CASE("a read-only store's VerifyChain still reports records it read that are gone") {
  TempDir d;
  {
    auto writer = OpenOk(Options(d.path()));
    Commits(*writer, 10);
  }
  auto reader = OpenOk(ReadOnly(Options(d.path()), RecoveryMode::kStrict));
  const std::string seg = d / si::SegmentName(1);
  std::string bytes = ReadFile(seg);
  const auto frames = FrameOffsets(bytes);
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(frames[6].first), bytes.end(), '\0');
  WriteFile(seg, bytes);  // records 7..10 gone
  const absl::Status st = reader->VerifyChain();
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(st, "the files of '" + d.path() + "' end at tx_id 6 "));
}

TEST_CASE("a read-only open that reads the tail while the writer writes it reads it again") {
  TempDir d;
  auto writer = OpenOk(Options(d.path()));
  Commits(*writer, 5);
  const std::string seg = d / si::SegmentName(1);
  const auto frames = FrameOffsets(ReadFile(seg));
  REQUIRE(frames.size() == 5);
  auto hooked = std::make_shared<HookedFileSystem>();
  int reads = 0;
  bool always = false;
  RecoveryMode mode = RecoveryMode::kStrict;
  std::size_t zero_from = 0, zero_to = 0;
  SECTION("the last record half written (strict: a torn tail)") {
    zero_from = (frames[4].first + frames[4].second) / 2;
    zero_to = frames[4].second;
  }
  SECTION("a read(2) that saw the later part of a write and not its start") {
    mode = RecoveryMode::kPointInTime;  // damage before the tail: an error in both modes
    zero_from = frames[2].first;
    zero_to = frames[2].first + 16;
  }
  SECTION("the same torn tail on every read is reported") {
    zero_from = (frames[4].first + frames[4].second) / 2;
    zero_to = frames[4].second;
    always = true;
  }
  hooked->after_read = [&](const std::string& path, std::string& bytes) {
    if (path != seg || (reads++ > 0 && !always)) return;
    std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(zero_from),
              bytes.begin() + static_cast<std::ptrdiff_t>(zero_to), '\0');
  };
  StateStoreOptions ro = ReadOnly(Options(d.path()), mode);
  ro.file_system = hooked;
  auto r = StateStore::Open(ro);
  if (always) {
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(Contains(r.status(), "torn tail in log segment '" + si::SegmentName(1) + "' at offset " +
                                   std::to_string(frames[4].first) + " after tx_id 4"));
  } else {
    INFO(r.status().ToString());  // was: DATA_LOSS torn tail / damaged record, valid records follow
    REQUIRE(r.ok());
    CHECK((*r)->last_tx_id() == 5);
    CHECK((*r)->Get("k5") == "5");
    CHECK(reads == 2);
  }
}

TEST_CASE("Inspect next to a writer that retires a segment after the listing reports one cut") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.checkpoint_mode = CheckpointMode::kFull;
  auto writer = OpenOk(o);
  Commits(*writer, 100);
  REQUIRE(writer->Checkpoint().ok());  // full at 100
  Commits(*writer, 100);
  REQUIRE(writer->Checkpoint().ok());  // full at 200
  Commits(*writer, 100);
  auto hooked = std::make_shared<HookedFileSystem>();
  bool retired = false;
  hooked->before_read = [&](const std::string& path) {
    if (retired || path.find("/wal-") == std::string::npos) return;
    retired = true;
    REQUIRE(writer->Checkpoint().ok());  // full at 300: checkpoint 100 and the log up to 200 go
    REQUIRE_FALSE(std::filesystem::exists(path));
  };
  auto rep = StateStore::Inspect(d.path(), hooked);
  REQUIRE(rep.ok());
  INFO(rep->chain.ToString());  // was: NOT_FOUND "open '.../wal-...': No such file or directory"
  CHECK(rep->chain.ok());
  CHECK(rep->point_in_time.ok());
  CHECK(rep->last_tx == 300);
  std::vector<std::string> segments, checkpoints;
  for (const auto& s : rep->segments) {
    CHECK(s.problem == "");
    segments.push_back(s.name);
  }
  for (const auto& c : rep->checkpoints) checkpoints.push_back(c.name);
  CHECK(segments == Files(d.path(), "wal-"));  // the directory as it is after the retirement
  CHECK(checkpoints == Files(d.path(), "ckpt-"));
}

TEST_CASE("a live writer never makes a read-only open, its VerifyChain or Inspect report damage",
          "[concurrency]") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.max_incremental_chain = 2;
  auto writer = OpenOk(o);
  Commits(*writer, 50);
  std::atomic<bool> stop{false};
  std::atomic<int> writer_errors{0};
  std::thread t([&] {
    for (int i = 1; !stop.load(); ++i) {
      auto tx = writer->Begin();
      tx.Put("k" + std::to_string(i % 10), std::to_string(i));
      if (!tx.Commit().ok()) ++writer_errors;
      if (i % 40 == 0 && !writer->Checkpoint().ok()) ++writer_errors;
    }
  });
  for (int round = 0; round < 30; ++round) {
    INFO("round " << round);
    auto reader = StateStore::Open(ReadOnly(o, RecoveryMode::kStrict));
    CHECK(reader.status().ToString() == "OK");
    if (reader.ok()) CHECK((*reader)->VerifyChain().ToString() == "OK");
    auto rep = StateStore::Inspect(d.path());
    REQUIRE(rep.ok());
    CHECK(rep->chain.ToString() == "OK");
    CHECK(rep->point_in_time.ToString() == "OK");
  }
  stop = true;
  t.join();
  CHECK(writer_errors == 0);
}

TEST_CASE("damage in a retained segment older than the newest checkpoint fails Open in both modes") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.checkpoint_mode = CheckpointMode::kFull;
  {
    auto s = OpenOk(o);
    for (int round = 0; round < 3; ++round) {
      Commits(*s, 100);
      REQUIRE(s->Checkpoint().ok());  // full at 100, 200, 300; 200 is the fallback
    }
    Commits(*s, 5);  // 301..305: only in the log
  }
  // Kept: checkpoints 200 and 300, and the log from 201 on (for the fallback).
  REQUIRE(Files(d.path(), "ckpt-") ==
          std::vector<std::string>{si::CheckpointName(200, si::CheckpointKind::kFull),
                                   si::CheckpointName(300, si::CheckpointKind::kFull)});
  const auto segs = Files(d.path(), "wal-");
  REQUIRE(segs.size() >= 3);
  std::vector<std::uint64_t> first;
  for (const auto& s : segs) first.push_back(*si::ParseSegmentName(s));
  REQUIRE(first[0] <= 201);
  REQUIRE(first[1] > 201);
  REQUIRE(first[2] - 1 <= 300);  // segments 0 and 1 are older than checkpoint 300
  std::string expect;
  SECTION("a flipped byte in the first retained segment") {
    const std::string path = d / segs[0];
    std::string bytes = ReadFile(path);
    const auto frames = FrameOffsets(bytes);
    const std::size_t k = frames.size() / 2;
    bytes[frames[k].first + 40] ^= 0x01;
    WriteFile(path, bytes);
    expect = "damaged record in log segment '" + segs[0] + "' at offset " +
             std::to_string(frames[k].first) + " after tx_id " + std::to_string(first[0] + k - 1) +
             ": frame checksum mismatch; valid records follow at offset " +
             std::to_string(frames[k].second);
  }
  SECTION("a flipped byte in a later retained segment") {
    const std::string path = d / segs[1];
    std::string bytes = ReadFile(path);
    const auto frames = FrameOffsets(bytes);
    bytes[frames[0].first + 30] ^= 0x10;
    WriteFile(path, bytes);
    expect = "damaged record in log segment '" + segs[1] + "' at offset " +
             std::to_string(frames[0].first) + " after tx_id " + std::to_string(first[1] - 1) +
             ": frame checksum mismatch; valid records follow at offset " +
             std::to_string(frames[0].second);
  }
  SECTION("a middle retained segment deleted") {
    std::filesystem::remove(d / segs[1]);
    expect = "tx_id gap in log segment '" + segs[2] + "' at offset 40: expected tx_id " +
             std::to_string(first[1]) + ", found " + std::to_string(first[2]);
  }
  SECTION("the first retained segment deleted") {
    std::filesystem::remove(d / segs[0]);
    expect = "tx_id gap in log segment '" + segs[1] + "' at offset 40: expected tx_id 201 or " +
             "earlier (the log after the fallback checkpoint '" +
             si::CheckpointName(200, si::CheckpointKind::kFull) + "'), found " +
             std::to_string(first[1]);
  }
  for (RecoveryMode m : {RecoveryMode::kStrict, RecoveryMode::kPointInTime}) {
    INFO((m == RecoveryMode::kStrict ? "strict" : "point-in-time"));
    o.recovery = m;
    auto r = StateStore::Open(o);  // was: OK (and VerifyChain then found the damage)
    REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(r.status().message() == expect);
    o.read_only = true;
    CHECK(StateStore::Open(o).status().message() == expect);
    o.read_only = false;
  }
  CHECK(Files(d.path(), "ckpt-").size() == 2);  // nothing set aside or removed
}

TEST_CASE("a torn tail after retained segments is still cut off in point-in-time mode") {
  TempDir d;
  StateStoreOptions o = Options(d.path());
  o.segment_bytes = 4096;
  o.checkpoint_mode = CheckpointMode::kFull;
  {
    auto s = OpenOk(o);
    for (int round = 0; round < 3; ++round) {
      Commits(*s, 100);
      REQUIRE(s->Checkpoint().ok());
    }
    Commits(*s, 5);
  }
  const std::string last = d / Files(d.path(), "wal-").back();
  std::string bytes = ReadFile(last);
  const auto frames = FrameOffsets(bytes);
  const auto [a, b] = frames.back();
  std::fill(bytes.begin() + static_cast<std::ptrdiff_t>((a + b) / 2),
            bytes.begin() + static_cast<std::ptrdiff_t>(b), '\0');  // record 305 torn
  WriteFile(last, bytes);
  const std::size_t torn = NonZeroEnd(bytes, a, b) - a;
  REQUIRE(torn > 0);
  o.recovery = RecoveryMode::kStrict;
  auto strict = StateStore::Open(o);
  REQUIRE(strict.status().code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(strict.status(), "torn tail in log segment '" + Files(d.path(), "wal-").back() +
                                      "' at offset " + std::to_string(a) + " after tx_id 304"));
  o.recovery = RecoveryMode::kPointInTime;
  auto s = OpenOk(o);
  CHECK(s->last_tx_id() == 304);
  CHECK(s->Stats().torn_tail_bytes == torn);
  CHECK(s->VerifyChain().ok());
}

TEST_CASE("a state directory on a read-only file system is refused naming it") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
  }
  auto hooked = std::make_shared<HookedFileSystem>();
  // What the POSIX layer returns on a read-only mount (see inferq/state/file_system.hpp):
  // mkdir of the existing directory is fine, anything that writes fails with EROFS.
  hooked->refuse = [](const std::string& op, const std::string& path) {
    if (op == "createdir" || op == "read") return absl::OkStatus();
    return absl::PermissionDeniedError("open " + inferq::QuoteValue(path) + ": Read-only file system");
  };
  StateStoreOptions o = Options(d.path());
  o.file_system = hooked;
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(r.status().message() ==
        "state directory '" + d.path() + "' is not writable (read_only = true opens it for "
        "reading): open '" + d.path() + "/LOCK': Read-only file system");
  o.read_only = true;  // reading needs no write
  auto reader = OpenOk(o);
  CHECK(reader->Get("a") == "1");
}

TEST_CASE("a writer that cannot create IDENTITY names the directory it was given") {
  // Smallest input of a use after move: the error was built from the options after
  // they had been moved into the store, and named '' as the directory.
  TempDir d;
  auto hooked = std::make_shared<HookedFileSystem>();
  hooked->refuse = [](const std::string& op, const std::string& path) {
    if (op == "create" && path.ends_with("IDENTITY.tmp")) {
      return absl::PermissionDeniedError("create " + inferq::QuoteValue(path) + ": Permission denied");
    }
    return absl::OkStatus();
  };
  StateStoreOptions o = Options(d.path());
  o.file_system = hooked;
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(r.status().message() ==
        "state directory '" + d.path() + "' is not writable (read_only = true opens it for "
        "reading): create '" + d.path() + "/IDENTITY.tmp': Permission denied");
}

TEST_CASE("a read-only open that cannot read a file returns the read error, not 'not writable'") {
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
  }
  auto hooked = std::make_shared<HookedFileSystem>();
  hooked->refuse = [](const std::string& op, const std::string& path) {
    if (op == "read" && path.ends_with("IDENTITY")) {
      return absl::PermissionDeniedError("open " + inferq::QuoteValue(path) + ": Permission denied");
    }
    return absl::OkStatus();
  };
  StateStoreOptions o = Options(d.path());
  o.file_system = hooked;
  o.read_only = true;
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(r.status().message() == "open '" + d.path() + "/IDENTITY': Permission denied");
}

TEST_CASE("the POSIX file system reads only regular files and never waits for a FIFO") {
  TempDir d;
  std::filesystem::create_directories(d.path());
  const std::string fifo = d / "IDENTITY";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto fs = inferq::PosixFileSystem();
  auto r = fs->Read(fifo);  // would block until a writer opened the FIFO
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(r.status().message() == "'" + fifo + "' is not a regular file (a FIFO)");
  auto dev = fs->Read("/dev/zero");  // would read until memory runs out
  REQUIRE(dev.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(dev.status().message() == "'/dev/zero' is not a regular file (a character device)");
  auto dir = fs->Read(d.path());
  REQUIRE(dir.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(dir.status().message() == "'" + d.path() + "' is not a regular file (a directory)");
  // A read-only open over the FIFO IDENTITY fails with that error instead of hanging.
  StateStoreOptions o = Options(d.path());
  o.read_only = true;
  auto s = StateStore::Open(o);
  CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("the POSIX file system refuses a file larger than physical memory") {
  TempDir d;
  std::filesystem::create_directories(d.path());
  const std::string sparse = d / "wal-00000000000000000001.log";
  const long long mem = static_cast<long long>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  REQUIRE(mem > 0);
  {
    std::ofstream f(sparse);
  }
  REQUIRE(::truncate(sparse.c_str(), static_cast<off_t>(mem) + 1) == 0);  // sparse: no blocks
  auto r = inferq::PosixFileSystem()->Read(sparse);
  REQUIRE(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(r.status().message() == "'" + sparse + "' is " + std::to_string(mem + 1) +
                                    " bytes, more than the machine's " + std::to_string(mem) +
                                    " bytes of memory: it cannot be read whole");
}

TEST_CASE("the POSIX file system reports EROFS and EACCES as PERMISSION_DENIED") {
  const absl::Status rofs = inferq::FileSystemError(EROFS, "open", "/srv/state/LOCK");
  CHECK(rofs.code() == absl::StatusCode::kPermissionDenied);
  CHECK(rofs.message() == "open '/srv/state/LOCK': Read-only file system");
  CHECK(inferq::FileSystemError(EACCES, "mkdir", "/srv").code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(inferq::FileSystemError(EIO, "read", "/x").code() == absl::StatusCode::kDataLoss);
  CHECK(inferq::FileSystemError(ENOSPC, "write", "/x").code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(inferq::FileSystemError(ENOENT, "open", "/x").code() == absl::StatusCode::kNotFound);
  CHECK(inferq::FileSystemError(EBADF, "close", "/x").code() == absl::StatusCode::kInternal);
}

// Needs a read-only mount, so ctest does not run it:
//   mount -t tmpfs -o ro tmpfs /mnt/ro
//   INFERQ_TEST_READONLY_DIR=/mnt/ro state_store_test '[erofs]'
TEST_CASE("Open on a real read-only mount is PERMISSION_DENIED naming the directory", "[.][erofs]") {
  const char* dir = std::getenv("INFERQ_TEST_READONLY_DIR");
  REQUIRE(dir != nullptr);
  auto r = StateStore::Open(Options(dir));
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(r.status(), "state directory '" + std::string(dir) + "' is not writable"));
  CHECK(Contains(r.status(), "Read-only file system"));
}

TEST_CASE("files of another store name this directory and both store ids") {
  TempDir a, b;
  {
    auto sa = OpenOk(Options(a.path()));
    Put(*sa, "mine", "1");
    auto sb = OpenOk(Options(b.path()));
    Put(*sb, "theirs", "1");
    REQUIRE(sb->Checkpoint().ok());
  }
  auto id = [](const TempDir& t) {  // "inferq-state <16 hex digits>\n"
    const std::string f = ReadFile(t / "IDENTITY");
    return f.substr(f.size() - 17, 16);
  };
  std::string expect;
  SECTION("a segment") {
    std::filesystem::copy_file(b / si::SegmentName(1), a / si::SegmentName(2));
    expect = "log segment '" + si::SegmentName(2) + "' at offset 0 belongs to another store (store id " +
             id(b) + "; the IDENTITY file of state directory '" + a.path() + "' says " + id(a) + ")";
  }
  SECTION("a checkpoint") {
    const std::string name = si::CheckpointName(1, si::CheckpointKind::kFull);
    std::filesystem::copy_file(b / name, a / name);
    expect = "checkpoint '" + name + "' belongs to another store (store id " + id(b) +
             "; the IDENTITY file of state directory '" + a.path() + "' says " + id(a) + ")";
  }
  SECTION("a damaged IDENTITY file") {
    WriteFile(a / "IDENTITY", "inferq-state 12\n");
    expect = "state directory '" + a.path() + "': IDENTITY file is not 'inferq-state <16 hex digits>'";
  }
  StateStoreOptions o = Options(a.path());
  o.recovery = RecoveryMode::kStrict;
  auto r = StateStore::Open(o);
  REQUIRE(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK(r.status().message() == expect);
}

TEST_CASE("Inspect tells a file it cannot read from a damaged one") {
  // Was: an EACCES checkpoint was listed as "DAMAGED ... 0 entries".
  TempDir d;
  {
    auto s = OpenOk(Options(d.path()));
    Put(*s, "a", "1");
    REQUIRE(s->Checkpoint().ok());
  }
  auto hooked = std::make_shared<HookedFileSystem>();
  hooked->refuse = [](const std::string& op, const std::string& path) {
    if (op == "read" && path.find("/ckpt-") != std::string::npos) {
      return absl::PermissionDeniedError("open " + inferq::QuoteValue(path) + ": Permission denied");
    }
    return absl::OkStatus();
  };
  auto r = StateStore::Inspect(d.path(), hooked);
  REQUIRE(r.ok());
  REQUIRE(r->checkpoints.size() == 1);
  CHECK(r->checkpoints[0].unreadable);
  CHECK(r->checkpoints[0].problem.find("Permission denied") != std::string::npos);
  REQUIRE(r->segments.size() == 1);
  CHECK_FALSE(r->segments[0].unreadable);
}
