// engine_budget WORKLOAD N: one thread runs N events of a fixed engine workload, so that
// callgrind can count the instructions (and benchmarks/instruction_budget.py the locked
// read-modify-writes) one event costs: (I(2N) - I(N)) / N cancels the set-up. The
// workloads are the engine's instruction budgets (BENCHMARKS.md, "Instruction budgets"):
//   base      publish -> Next -> Ack; explicit ack, interest retention, 64-byte payload
//   ack_wait  base with ack_wait 30 s (a redelivery timer per delivery)
//   msg_id    ack_wait with a msg_id per event (the duplicate window)
//   batch32   base in batches of 32: PublishBatch, NextBatch into a span of 32, AckBatch
//   view      base publishing EventViews (PublishView(const EventView&)): the fields copied
//             once into the stored message, no Event built, moved or destroyed
//   view_batch32  batch32 publishing EventViews (PublishViewBatch(span<const EventView>))
//   fanout4   one publish, four consumers (no group: each gets every event), each
//             pulls and acks: the cost per published event, all four included
//   log_core  the engine-core redesign's data path without the engine: the event moved
//             into a MessageLog slot (claim, publish), read back at its sequence by a
//             cursor, settled in an AckWindow, and the log trimmed behind the ack floor
//             once per 32 events: what the log's structures cost by themselves
//   log_view  log_core with a compact slot instead of a whole Event (an interned
//             subject id, seq_no, publish time, the payload's Buffer), written from
//             the fields as an EventView publish would: the floor of that design
//   log_group log_view consumed through a GroupCursor (a consumer group's cursor): a
//             claim of one sequence per event, the ack as a bit, ack_wait 30 s with the
//             timer's Tick and Expire and the log's trim behind lowest_held once per
//             32 events: the redesign's consumer without the engine around it
// The engine runs with manual timers (nothing fires), so a run is the same work every
// time. A second thread waits, idle, for the whole run: glibc skips the lock prefix of
// its mutexes while a process has one thread, and an engine never runs in such a
// process. Exit 0 when every publish and every ack succeeded; 1 otherwise; 2 bad usage.
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/ack_window.hpp"
#include "engine/group_cursor.hpp"
#include "engine/message_log.hpp"
#include "inferq/engine/engine.hpp"

namespace {

constexpr std::size_t kPayloadBytes = 64;
constexpr int kBatch = 32;

inferq::Event MakeEvent(long i, bool msg_id) {
  static const std::string payload(kPayloadBytes, 'x');
  inferq::Event e;
  e.subject = "infer.m.req";
  e.seq_no = static_cast<std::uint64_t>(i);
  e.payload = inferq::Buffer::FromString(payload);
  if (msg_id) e.msg_id = "req-" + std::to_string(i);
  return e;
}

int Usage() {
  std::fprintf(stderr,
               "usage: engine_budget WORKLOAD N (WORKLOAD: base, ack_wait, msg_id, batch32, view, view_batch32, "
               "fanout4, log_core, log_view, log_group; N: events, a positive multiple of 32)\n");
  return 2;
}

// log_view's slot (below): what an EventView publish would write for this workload.
struct CompactSlot {
  std::uint32_t subject_id;
  std::uint64_t seq_no;
  std::int64_t publish_ns;
  inferq::Buffer payload;
};

// log_core and log_view (above), with slots of type Slot that make(i) builds: 0 when
// every event was published, read and settled once.
template <class Slot, class Make>
int RunLog(const char* name, long n, Make make) {
  using inferq::engine_internal::AckWindow;
  using inferq::engine_internal::LogRead;
  using inferq::engine_internal::MessageLog;
  MessageLog<Slot> log(10, 1);
  AckWindow acks(7, 1);
  typename MessageLog<Slot>::Reader reader(log);
  std::uint64_t cursor = 1;
  long ok = 0;
  for (long i = 0; i < n; ++i) {
    const std::uint64_t seq = log.Claim(1);
    ok += log.Publish(seq, make(i));
    typename MessageLog<Slot>::Ref r;
    if (reader.Read(cursor, r) == LogRead::kReady && r->seq_no == static_cast<std::uint64_t>(i)) {
      ++cursor;
      ok += acks.TrySet(r.seq());
    }
    if ((i & 31) == 31) log.TrimBefore(acks.floor());
  }
  std::printf("%s: %ld of %ld publishes and settles succeeded\n", name, ok, 2 * n);
  return ok == 2 * n ? 0 : 1;
}

int RunLogCore(long n) { return RunLog<inferq::Event>("log_core", n, [](long i) { return MakeEvent(i, false); }); }

int RunLogView(long n) {
  static const std::string payload(kPayloadBytes, 'x');
  return RunLog<CompactSlot>("log_view", n, [](long i) {
    return CompactSlot{1, static_cast<std::uint64_t>(i), i, inferq::Buffer::FromString(payload)};
  });
}

// log_group (above): 0 when every event was published, claimed, read and acked once.
int RunLogGroup(long n) {
  using inferq::engine_internal::GroupCursor;
  using inferq::engine_internal::LogRead;
  using inferq::engine_internal::MessageLog;
  static const std::string payload(kPayloadBytes, 'x');
  MessageLog<CompactSlot> log(10, 1);
  GroupCursor group({.window_word_bits = 7, .start = 1, .ack_wait_ns = 30'000'000'000});
  MessageLog<CompactSlot>::Reader reader(log);
  long ok = 0;
  for (long i = 0; i < n; ++i) {
    const std::uint64_t seq = log.Claim(1);
    ok += log.Publish(seq, CompactSlot{1, static_cast<std::uint64_t>(i), i, inferq::Buffer::FromString(payload)});
    const GroupCursor::Range claimed = group.Claim(1, seq + 1);
    MessageLog<CompactSlot>::Ref r;
    if (claimed.size() == 1 && reader.Read(claimed.first, r) == LogRead::kReady &&
        r->seq_no == static_cast<std::uint64_t>(i)) {
      ok += group.Ack(r.seq());
    }
    if ((i & 31) == 31) {
      group.Tick(i);    // the timer, once per 32 events; nothing is 30 s old
      group.Expire(i);
      log.TrimBefore(group.lowest_held());
    }
  }
  std::printf("log_group: %ld of %ld publishes and acks succeeded\n", ok, 2 * n);
  return ok == 2 * n ? 0 : 1;
}

}  // namespace

// view and view_batch32 (engine_budget_views.cpp): base and batch32 publishing
// EventViews, in a file of their own so that this one compiles as before they came
// (GCC's inlining of Run moved by 12 instructions per event when they were here).
void RunViews(bool batched, long n, inferq::Engine& engine, inferq::Member& member, long* ok, long* want);

namespace {

// Runs the workload on an engine of its own: 0 when every publish and ack succeeded,
// 1 otherwise.
int Run(const std::string& workload, long n) {
  if (workload == "log_core") return RunLogCore(n);
  if (workload == "log_view") return RunLogView(n);
  if (workload == "log_group") return RunLogGroup(n);
  const bool ack_wait = workload == "ack_wait" || workload == "msg_id";
  const bool msg_id = workload == "msg_id";
  const int consumers = workload == "fanout4" ? 4 : 1;
  absl::StatusOr<std::unique_ptr<inferq::Engine>> created =
      inferq::Engine::Create({.manual_timers = true});
  if (!created.ok()) return 1;
  inferq::Engine& engine = **created;
  if (!engine.AddStream({.name = "S",
                         .subjects = {"infer.*.req"},
                         .retention = inferq::RetentionPolicy::kInterest})
           .ok()) {
    return 1;
  }
  std::vector<inferq::Member> members;
  for (int c = 0; c < consumers; ++c) {
    auto consumer = engine.AddConsumer({.stream = "S",
                                        .name = "c" + std::to_string(c),
                                        .lane_capacity = 64,
                                        .ack_wait = ack_wait ? absl::Seconds(30) : absl::ZeroDuration()});
    if (!consumer.ok()) return 1;
    members.push_back(*consumer->member(0));
  }

  long ok = 0;
  long want = 0;
  if (workload == "view" || workload == "view_batch32") {
    RunViews(workload == "view_batch32", n, engine, members[0], &ok, &want);
  } else if (workload == "batch32") {
    std::vector<inferq::Event> events(kBatch);
    std::array<inferq::Message, kBatch> batch;
    for (long i = 0; i < n; i += kBatch) {
      for (int k = 0; k < kBatch; ++k) events[k] = MakeEvent(i + k, false);
      const inferq::PublishBatchResult r = engine.PublishBatch(events);
      if (r.status.ok()) ok += static_cast<long>(r.published);
      absl::StatusOr<std::size_t> got = members[0].NextBatch(batch, absl::ZeroDuration(), absl::ZeroDuration());
      if (got.ok() && inferq::AckBatch(std::span<inferq::Message>(batch).first(*got)).ok()) ok += *got;
    }
    want = 2 * n;
  } else {
    for (long i = 0; i < n; ++i) {
      ok += engine.Publish(MakeEvent(i, msg_id)).ok();
      for (inferq::Member& m : members) {
        auto msg = m.Next(absl::ZeroDuration());
        ok += msg.ok() && msg->Ack().ok();
      }
    }
    want = n * (1 + consumers);
  }
  std::printf("%s: %ld of %ld publishes and acks succeeded\n", workload.c_str(), ok, want);
  return ok == want ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return Usage();
  const std::string workload = argv[1];
  char* end = nullptr;
  const long n = std::strtol(argv[2], &end, 10);
  if (*argv[2] == '\0' || *end != '\0' || n <= 0 || n % kBatch != 0) {
    std::fprintf(stderr, "engine_budget: event count '%s' is not a positive multiple of %d\n", argv[2],
                 kBatch);
    return 2;
  }
  if (workload != "base" && workload != "ack_wait" && workload != "msg_id" && workload != "batch32" &&
      workload != "view" && workload != "view_batch32" &&
      workload != "fanout4" && workload != "log_core" && workload != "log_view" &&
      workload != "log_group") {
    std::fprintf(stderr, "engine_budget: unknown workload '%s'\n", workload.c_str());
    return Usage();
  }
  // The idle second thread (see the top of the file).
  std::mutex idle_mu;
  std::condition_variable idle_cv;
  bool done = false;
  std::thread idle([&] {
    std::unique_lock l(idle_mu);
    idle_cv.wait(l, [&] { return done; });
  });
  const int rc = Run(workload, n);
  {
    std::lock_guard l(idle_mu);
    done = true;
  }
  idle_cv.notify_one();
  idle.join();
  return rc;
}
