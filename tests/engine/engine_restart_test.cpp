// The durable promises of engine/config.hpp and engine/engine.hpp that name a
// restart, each checked across real process restarts on the same directory: every
// step is its own process (restart_child), and the test compares what each printed
// with exact expected lines. A step that ends in "crash" leaves with _exit, as a
// killed process would, without closing its engine.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../state/state_test_util.hpp"

namespace {

struct Run {
  int exit_code = -1;
  std::vector<std::string> lines;
};

// Runs `restart_child scenario step dir` to its end; its stdout as lines.
Run Step(const std::string& scenario, const std::string& step, const std::string& dir) {
  const std::string cmd = std::string(INFERQ_RESTART_CHILD) + " " + scenario + " " + step +
                          " '" + dir + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  Run r;
  std::string line;
  for (int ch; (ch = std::fgetc(p)) != EOF;) {
    if (ch == '\n') {
      r.lines.push_back(line);
      line.clear();
    } else {
      line.push_back(static_cast<char>(ch));
    }
  }
  if (!line.empty()) r.lines.push_back(line);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The lines of a step that must exit 0.
std::vector<std::string> Lines(const std::string& scenario, const std::string& step,
                               const std::string& dir) {
  Run r = Step(scenario, step, dir);
  INFO(scenario << " step " << step << " printed " << r.lines.size() << " line(s)");
  REQUIRE(r.exit_code == 0);
  return r.lines;
}

using V = std::vector<std::string>;

}  // namespace

TEST_CASE("the duplicate window survives a restart after a work queue retired the acked messages") {
  state_test::TempDir d;
  // 60 ids, each acked (AckSync) at once: the work queue keeps none, and with
  // 4 KiB segments the log retires the segments that held them.
  CHECK(Lines("dedup_work_queue", "1", d.path()) ==
        V{"stored=60", "job-0 seq=1 duplicate=1", "messages=0 last_seq=60"});
  // A new process publishes the same 60 ids again, within the window: none is
  // stored again (before the fix, 56 were, job-0 as seq 61).
  CHECK(Lines("dedup_work_queue", "2", d.path()) ==
        V{"stored=0", "job-0 seq=1 duplicate=1", "messages=0 last_seq=60"});
}

TEST_CASE("the duplicate window survives a restart after max_msgs removed the messages") {
  state_test::TempDir d;
  CHECK(Lines("dedup_limits", "1", d.path()) ==
        V{"stored=60", "job-0 seq=1 duplicate=1", "messages=5 last_seq=60"});
  // Before the fix, 49 of the 60 were stored again.
  CHECK(Lines("dedup_limits", "2", d.path()) ==
        V{"stored=0", "job-0 seq=1 duplicate=1", "messages=5 last_seq=60"});
}

TEST_CASE("a redelivery after a restart counts as a redelivery") {
  state_test::TempDir d;
  // r-1 acked; r-2 and r-3 delivered and never acked, then the process dies.
  CHECK(Lines("redelivery", "1", d.path()) == V{"t r-1@1,r-2@1,r-3@1", "u r-1@1,r-2@1,r-3@1"});
  // Both come again as second deliveries, are counted as redelivered when queued,
  // and as num_redelivered while out unacked; the process dies again.
  CHECK(Lines("redelivery", "2", d.path()) ==
        V{"t r-2@2,r-3@2", "u r-2@2,r-3@2",
          "t delivered=2 redelivered=2 num_redelivered=2 ack_pending=2",
          "u delivered=2 redelivered=2 num_redelivered=2 ack_pending=2"});
  // Third deliveries, acked: nothing left out.
  CHECK(Lines("redelivery", "3", d.path()) ==
        V{"t r-2@3,r-3@3", "u r-2@3,r-3@3",
          "t delivered=2 redelivered=2 num_redelivered=0 ack_pending=0",
          "u delivered=2 redelivered=2 num_redelivered=0 ack_pending=0"});
  // And after that nothing comes again.
  CHECK(Lines("redelivery", "4", d.path()) ==
        V{"t -", "u -", "t delivered=0 redelivered=0 num_redelivered=0 ack_pending=0",
          "u delivered=0 redelivered=0 num_redelivered=0 ack_pending=0"});
}

TEST_CASE("a lifecycle record never names a message of an earlier process of a memory stream") {
  state_test::TempDir d;
  // "first" is acked: its record is forgotten at once; "second" is left Processing
  // when the process dies.
  CHECK(Lines("lifecycle_memory", "1", d.path()) ==
        V{"records at start=0", "published first seq=1", "published second seq=2", "got first@1",
          "got second@1", "records=1"});
  // The memory stream numbers from 1 again. Before the fix "new-1" (seq 1) was acked
  // unseen as the Completed "S/1", and "new-2" ran as a redelivery of "second". Now
  // the ids carry the stream's incarnation, adding the consumer expires and forgets
  // the earlier life's record, and each ack forgets its own.
  CHECK(Lines("lifecycle_memory", "2", d.path()) ==
        V{"records at start=0", "published new-1 seq=1", "published new-2 seq=2",
          "got new-1@1,new-2@1", "records=0", "expired=0 forgotten=3"});
}

TEST_CASE("a file stream's lifecycle records go once their acks are durable") {
  state_test::TempDir d;
  // "first" AckSync'ed: forgotten; "second" acked with a plain Ack: Completed until
  // its ack is read back from the ack log.
  CHECK(Lines("lifecycle_file", "1", d.path()) ==
        V{"records at start=0", "published first seq=1", "published second seq=2", "got first@1",
          "got second@1", "records=1"});
  // The restart keeps the ids (the stream's log id is the incarnation): the ack log
  // holds second's ack, so its record goes when the consumer is added.
  CHECK(Lines("lifecycle_file", "2", d.path()) ==
        V{"records at start=0", "published new-1 seq=3", "published new-2 seq=4",
          "got new-1@1,new-2@1", "records=0", "expired=0 forgotten=3"});
}

TEST_CASE("durable consumers resume where they were, whatever their start policy") {
  state_test::TempDir d;
  // a1 (st.x), a2 (st.y), a3 (st.x) stored; the consumers added; a4, a5 (st.x). Each
  // AckSyncs the first message it gets and leaves the rest unacked.
  CHECK(Lines("start", "1", d.path()) ==
        V{"new a4@1,a5@1", "by_seq a2@1,a3@1,a4@1,a5@1", "all a1@1,a2@1,a3@1,a4@1,a5@1",
          "last_per_subject a2@1,a3@1,a4@1,a5@1"});
  // Added again after the restart: each gets what it had not acked (as second
  // deliveries), never what came before its start, never what it acked.
  CHECK(Lines("start", "2", d.path()) ==
        V{"new a5@2", "by_seq a3@2,a4@2,a5@2", "all a2@2,a3@2,a4@2,a5@2",
          "last_per_subject a3@2,a4@2,a5@2"});
  CHECK(Lines("start", "3", d.path()) == V{"new -", "by_seq -", "all -", "last_per_subject -"});
}

TEST_CASE("purged messages stay purged after a restart, and their ids stay duplicates") {
  state_test::TempDir d;
  CHECK(Lines("purge", "1", d.path()) ==
        V{"purged 2", "purged 1", "messages=3 first_seq=4 last_seq=6",
          "held 1:- 2:- 3:- 4:id4 5:id5 6:id6"});
  CHECK(Lines("purge", "2", d.path()) ==
        V{"messages=3 first_seq=4 last_seq=6", "held 1:- 2:- 3:- 4:id4 5:id5 6:id6",
          "id1 seq=1 duplicate=1", "id7 seq=7 duplicate=0"});
}

TEST_CASE("what max_msgs_per_subject removed stays removed across restarts with other limits") {
  state_test::TempDir d;
  // x1..x5 and y1, then UpdateStream to 2 per subject: x1..x3 go.
  CHECK(Lines("per_subject", "1", d.path()) == V{"messages=3 discarded=3 held x4 x5 y1"});
  // Recovery replays the removals (the counts are rebuilt from the log, as `stored`).
  CHECK(Lines("per_subject", "2", d.path()) == V{"messages=3 discarded=3 held x4 x5 y1"});
  // No limit now: nothing comes back.
  CHECK(Lines("per_subject", "3", d.path()) == V{"messages=3 discarded=3 held x4 x5 y1"});
  // A lower limit applies at recovery (x4 goes), then x7 takes x5's place.
  CHECK(Lines("per_subject", "4", d.path()) == V{"messages=2 discarded=5 held y1 x7"});
}

TEST_CASE("what a lowered max_msgs removed stays removed after a crash, whatever the next limits") {
  state_test::TempDir d;
  // u1..u5, then UpdateStream to max_msgs 2; the process dies without closing.
  CHECK(Lines("update_max_msgs", "1", d.path()) == V{"messages=2 first_seq=4 held u4 u5"});
  // max_msgs 3, then no limit: u3 does not come back (it did before the update
  // recorded its new front at once: the floor was written only every 64 trims).
  CHECK(Lines("update_max_msgs", "2", d.path()) == V{"messages=2 first_seq=4 held u4 u5"});
  CHECK(Lines("update_max_msgs", "3", d.path()) == V{"messages=2 first_seq=4 held u4 u5"});
}

TEST_CASE("a term of a superseded delivery does not end the message at a restart") {
  state_test::TempDir d;
  // ack_wait passes: a second delivery is out when the first one is terminated,
  // which changes nothing (the newer delivery decides). Then the process dies.
  CHECK(Lines("stale_term", "1", d.path()) == V{"second t1@2", "term of the first: OK"});
  // Before the fix the term was written to the ack log as an ack: the work queue
  // kept the message and never delivered it again.
  CHECK(Lines("stale_term", "2", d.path()) == V{"after restart t1@3", "messages=0"});
}
