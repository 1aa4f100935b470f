// Child of engine_restart_test: one step of a scenario, run as its own process on a
// directory that earlier steps (earlier processes) wrote. It prints what it saw, one
// "key=value" line each, for the test to compare with exact expected lines. A step
// ends with a normal exit (the engine closed) unless the scenario says "crash": then
// it leaves with _exit(0) after its last durable call, as a killed process would.
//
// Usage: restart_child SCENARIO STEP DIR
// Exit status: 0 when the step ran (what it saw is on stdout), 1 when a call the step
// needs failed (the error on stderr), 2 for bad arguments.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "inferq/engine/engine.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/state/state_store.hpp"

namespace {

using inferq::Engine;

[[noreturn]] void Fail(const std::string& what, const absl::Status& st) {
  std::fprintf(stderr, "restart_child: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::fflush(stdout);
  std::exit(1);
}

template <class T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(what, v.status());
  return *std::move(v);
}

void Must(const absl::Status& st, const std::string& what) {
  if (!st.ok()) Fail(what, st);
}

void Out(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void Crash() {
  std::fflush(stdout);
  ::_exit(0);
}

inferq::Event Ev(std::string subject, std::string msg_id, std::size_t body = 0) {
  inferq::Event e;
  e.subject = std::move(subject);
  e.msg_id = std::move(msg_id);
  if (body > 0) e.payload = inferq::Buffer::FromString(std::string(body, 'x'));
  return e;
}

inferq::StreamConfig FileStream(std::string name, std::vector<std::string> subjects,
                                const std::string& dir) {
  inferq::StreamConfig s;
  s.name = std::move(name);
  s.subjects = std::move(subjects);
  s.storage = inferq::StorageType::kFile;
  s.directory = dir + "/" + s.name;
  return s;
}

std::unique_ptr<Engine> NewEngine(inferq::EngineOptions o = {}) {
  return Must(Engine::Create(o), "Engine::Create");
}

inferq::StreamStats Stream(const Engine& e, std::string_view name) {
  const inferq::EngineStats st = e.Stats();
  if (st.stream(name) == nullptr) Fail("stats of stream " + std::string(name), absl::NotFoundError("none"));
  return *st.stream(name);
}

inferq::ConsumerStats Consumer(const Engine& e, std::string_view stream, std::string_view name) {
  const inferq::EngineStats st = e.Stats();
  const inferq::ConsumerStats* c = st.consumer(stream, name);
  if (c == nullptr) Fail("stats of consumer " + std::string(name), absl::NotFoundError("none"));
  return *c;
}

// The msg_ids a member has ready now (each pull waits at most `wait`), settled as
// `ack` says: "none", "first" (AckSync the first only) or "all" (AckSync each).
// Unacked messages stay out in `held` (a Message's destructor neither acks nor naks;
// `held` must go before the engine).
std::string PullIds(inferq::Member& m, const std::string& ack, std::vector<inferq::Message>& held,
                    absl::Duration wait = absl::Milliseconds(500)) {
  std::string ids;
  bool first = true;
  for (;;) {
    absl::StatusOr<inferq::Message> msg = m.Next(wait);
    if (!msg.ok()) break;
    if (!ids.empty()) ids += ",";
    ids += msg->event().msg_id + "@" + std::to_string(msg->attempt());
    if (ack == "all" || (ack == "first" && first)) Must(msg->AckSync(), "AckSync");
    first = false;
    held.push_back(*std::move(msg));
  }
  return ids.empty() ? "-" : ids;
}

// The msg_ids stream `name` holds (Engine::GetMessage of each sequence up to its
// last), " id" each; with `gaps`, " <seq>:<id>" for every sequence, "-" for those it
// no longer holds.
std::string HeldIds(const Engine& engine, std::string_view name, bool gaps = false) {
  std::string held;
  const std::uint64_t last = Stream(engine, name).last_seq;
  for (std::uint64_t seq = 1; seq <= last; ++seq) {
    absl::StatusOr<std::shared_ptr<const inferq::Event>> e = engine.GetMessage(name, seq);
    if (gaps) {
      held += " " + std::to_string(seq) + ":" + (e.ok() ? (*e)->msg_id : std::string("-"));
    } else if (e.ok()) {
      held += " " + (*e)->msg_id;
    }
  }
  return held;
}

// ---- The duplicate window across a restart (a work queue, and limits). ----
int Dedup(const std::string& step, const std::string& dir, bool work_queue) {
  inferq::StreamConfig s = FileStream(work_queue ? "WQ" : "LIM", {"job.>"}, dir);
  s.segment_bytes = 4096;
  if (work_queue) {
    s.retention = inferq::RetentionPolicy::kWorkQueue;
  } else {
    s.max_msgs = 5;
  }
  auto engine = NewEngine();
  Must(engine->AddStream(s), "AddStream");
  std::unique_ptr<inferq::Member> member;
  if (work_queue) {
    inferq::Consumer c = Must(engine->AddConsumer({.stream = s.name, .name = "w",
                                                   .deliver = inferq::DeliverPolicy::kAll}),
                              "AddConsumer");
    member = std::make_unique<inferq::Member>(Must(c.member(0), "member"));
  }
  int stored = 0;
  for (int i = 0; i < 60; ++i) {
    const std::string id = "job-" + std::to_string(i);
    inferq::PublishAck ack = Must(engine->Publish(Ev("job.a", id, 300)), "Publish " + id);
    if (!ack.duplicate) ++stored;
    if (work_queue && !ack.duplicate) {
      inferq::Message m = Must(member->Next(absl::Seconds(10)), "Next " + id);
      Must(m.AckSync(), "AckSync " + id);
    }
  }
  Out("stored=" + std::to_string(stored));
  const inferq::PublishAck again = Must(engine->Publish(Ev("job.a", "job-0", 300)), "Publish job-0");
  Out("job-0 seq=" + std::to_string(again.seq) + " duplicate=" + std::to_string(again.duplicate));
  const inferq::StreamStats st = Stream(*engine, s.name);
  Out("messages=" + std::to_string(st.messages) + " last_seq=" + std::to_string(st.last_seq));
  (void)step;
  return 0;
}

// ---- Delivery counts across a crash: attempt(), redelivered, num_redelivered. ----
int Redelivery(const std::string& step, const std::string& dir) {
  auto engine = NewEngine();
  Must(engine->AddStream(FileStream("R", {"r.>"}, dir)), "AddStream");
  // "t": tracked (ack_wait); "u": untracked (no ack_wait).
  inferq::Consumer t = Must(engine->AddConsumer({.stream = "R", .name = "t",
                                                 .deliver = inferq::DeliverPolicy::kAll,
                                                 .ack_wait = absl::Hours(1)}),
                            "AddConsumer t");
  inferq::Consumer u = Must(
      engine->AddConsumer({.stream = "R", .name = "u", .deliver = inferq::DeliverPolicy::kAll}),
      "AddConsumer u");
  inferq::Member mt = Must(t.member(0), "member");
  inferq::Member mu = Must(u.member(0), "member");
  std::vector<inferq::Message> held;
  if (step == "1") {
    for (int i = 1; i <= 3; ++i) {
      Must(engine->Publish(Ev("r.x", "r-" + std::to_string(i))), "Publish");
    }
    Out("t " + PullIds(mt, "first", held));
    Out("u " + PullIds(mu, "first", held));
    Crash();
  }
  const std::string got_t = PullIds(mt, step == "2" ? "none" : "all", held);
  const std::string got_u = PullIds(mu, step == "2" ? "none" : "all", held);
  Out("t " + got_t);
  Out("u " + got_u);
  for (const char* name : {"t", "u"}) {
    const inferq::ConsumerStats cs = Consumer(*engine, "R", name);
    Out(std::string(name) + " delivered=" + std::to_string(cs.delivered) +
        " redelivered=" + std::to_string(cs.redelivered) +
        " num_redelivered=" + std::to_string(cs.num_redelivered) +
        " ack_pending=" + std::to_string(cs.ack_pending));
  }
  if (step == "2") Crash();
  return 0;
}

// ---- A consumer's lifecycle across a restart: a memory stream numbers from 1
// again, a file stream goes on. ----
int LifecycleScenario(const std::string& step, const std::string& dir, bool file) {
  inferq::StateStoreOptions so;
  so.dir = dir + "/state";
  std::unique_ptr<inferq::StateStore> store = Must(inferq::StateStore::Open(so), "StateStore::Open");
  std::unique_ptr<inferq::Lifecycle> lc =
      Must(inferq::Lifecycle::Open(store.get(), {}), "Lifecycle::Open");
  if (step == "1") {
    Must(lc->BeginWarmup("m"), "BeginWarmup");
    Must(lc->ModelReady("m"), "ModelReady");
  }
  {
    auto engine = NewEngine();
    inferq::StreamConfig s{.name = "S", .subjects = {"s.>"}};
    if (file) s = FileStream("S", {"s.>"}, dir);
    Must(engine->AddStream(s), "AddStream");
    inferq::ConsumerConfig cc{.stream = "S", .name = "c", .deliver = inferq::DeliverPolicy::kAll};
    cc.lifecycle = lc.get();
    inferq::Consumer c = Must(engine->AddConsumer(cc), "AddConsumer");
    inferq::Member m = Must(c.member(0), "member");
    Out("records at start=" + std::to_string(lc->Messages().size()));
    auto publish = [&](const std::string& id) {
      inferq::Event e = Ev("s.x", id);
      e.model = "m";
      const inferq::PublishAck ack = Must(engine->Publish(std::move(e)), "Publish " + id);
      Out("published " + id + " seq=" + std::to_string(ack.seq));
    };
    std::vector<inferq::Message> held;
    if (step == "1") {
      publish("first");
      publish("second");
      // "first" acked (AckSync), "second" acked with a plain Ack on a file stream, left
      // Processing on a memory stream; then the process dies.
      for (int i = 0; i < 2; ++i) {
        inferq::Message msg = Must(m.Next(absl::Seconds(5)), "Next");
        Out("got " + msg.event().msg_id + "@" + std::to_string(msg.attempt()));
        if (i == 0) Must(msg.AckSync(), "AckSync");
        if (i == 1 && file) Must(msg.Ack(), "Ack");
        held.push_back(std::move(msg));
      }
      Out("records=" + std::to_string(lc->Messages().size()));
      Crash();
    }
    publish("new-1");
    publish("new-2");
    // Every message published in this run comes, and is acked.
    Out("got " + PullIds(m, "all", held, absl::Seconds(2)));
    std::string records;
    for (const auto& [id, info] : lc->Messages()) {
      records += " " + id.substr(0, 2) + ":" + std::string(inferq::MessageStateName(info.state));
    }
    Out("records=" + std::to_string(lc->Messages().size()) + records);
    const inferq::LifecycleStats st = lc->Stats();
    Out("expired=" + std::to_string(st.messages_expired) +
        " forgotten=" + std::to_string(st.forgotten));
    held.clear();
  }
  Must(lc->Verify(), "Verify");
  return 0;
}

// ---- Start positions of durable consumers across a restart. ----
// Step 1: a1..a3 stored, then consumers added (kNew, kByStartSequence 2, kAll,
// kLastPerSubject), then a4, a5; each consumer AckSyncs the first message it gets.
// Step 2: the same consumers added again with the same configs; what each gets.
int StartPositions(const std::string& step, const std::string& dir) {
  auto engine = NewEngine();
  Must(engine->AddStream(FileStream("ST", {"st.>"}, dir)), "AddStream");
  if (step == "1") {
    for (int i = 1; i <= 3; ++i) {
      Must(engine->Publish(Ev(i == 2 ? "st.y" : "st.x", "a" + std::to_string(i))), "Publish");
    }
  }
  std::vector<inferq::ConsumerConfig> configs = {
      {.stream = "ST", .name = "new", .deliver = inferq::DeliverPolicy::kNew},
      {.stream = "ST", .name = "by_seq", .deliver = inferq::DeliverPolicy::kByStartSequence,
       .start_seq = 2},
      {.stream = "ST", .name = "all", .deliver = inferq::DeliverPolicy::kAll},
      {.stream = "ST", .name = "last_per_subject",
       .deliver = inferq::DeliverPolicy::kLastPerSubject},
  };
  std::vector<inferq::Member> members;
  for (const inferq::ConsumerConfig& cc : configs) {
    inferq::Consumer c = Must(engine->AddConsumer(cc), "AddConsumer " + cc.name);
    members.push_back(Must(c.member(0), "member"));
  }
  if (step == "1") {
    for (int i = 4; i <= 5; ++i) {
      Must(engine->Publish(Ev("st.x", "a" + std::to_string(i))), "Publish");
    }
  }
  std::vector<inferq::Message> held;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    Out(configs[i].name + " " + PullIds(members[i], step == "1" ? "first" : "all", held));
  }
  held.clear();
  return 0;
}

// ---- Purges across a restart. ----
int PurgeScenario(const std::string& step, const std::string& dir) {
  auto engine = NewEngine();
  Must(engine->AddStream(FileStream("P", {"p.>"}, dir)), "AddStream");
  if (step == "1") {
    const char* subjects[] = {"p.a", "p.b", "p.a", "p.b", "p.a", "p.b"};
    for (int i = 0; i < 6; ++i) {
      Must(engine->Publish(Ev(subjects[i], "id" + std::to_string(i + 1))), "Publish");
    }
    // p.a keeping its newest one: seqs 1 and 3 go; then every sequence below 4: seq 2.
    Out("purged " + std::to_string(Must(engine->PurgeStream("P", {.subject = "p.a", .keep = 1}),
                                        "PurgeStream")));
    Out("purged " + std::to_string(Must(engine->PurgeStream("P", {.sequence = 4}), "PurgeStream")));
  }
  const inferq::StreamStats st = Stream(*engine, "P");
  Out("messages=" + std::to_string(st.messages) + " first_seq=" + std::to_string(st.first_seq) +
      " last_seq=" + std::to_string(st.last_seq));
  Out("held" + HeldIds(*engine, "P", /*gaps=*/true));
  if (step == "2") {
    const inferq::PublishAck dup = Must(engine->Publish(Ev("p.a", "id1")), "Publish id1");
    Out("id1 seq=" + std::to_string(dup.seq) + " duplicate=" + std::to_string(dup.duplicate));
    const inferq::PublishAck fresh = Must(engine->Publish(Ev("p.a", "id7")), "Publish id7");
    Out("id7 seq=" + std::to_string(fresh.seq) + " duplicate=" + std::to_string(fresh.duplicate));
  }
  return 0;
}

// ---- UpdateStream and max_msgs_per_subject across restarts: what a limit removed
// from the middle stays removed whatever the next run's limits. ----
int PerSubject(const std::string& step, const std::string& dir) {
  // Step "1": limit none, then UpdateStream to 2; "2": limit 2; "3": none; "4": 1.
  inferq::StreamConfig s = FileStream("M", {"m.>"}, dir);
  s.max_msgs_per_subject = step == "2" ? 2 : step == "4" ? 1 : -1;
  auto engine = NewEngine();
  Must(engine->AddStream(s), "AddStream");
  if (step == "1") {
    for (int i = 1; i <= 5; ++i) Must(engine->Publish(Ev("m.x", "x" + std::to_string(i))), "Publish");
    Must(engine->Publish(Ev("m.y", "y1")), "Publish");
    s.max_msgs_per_subject = 2;
    Must(engine->UpdateStream(s), "UpdateStream");
  }
  if (step == "4") Must(engine->Publish(Ev("m.x", "x7")), "Publish");
  const inferq::StreamStats st = Stream(*engine, "M");
  Out("messages=" + std::to_string(st.messages) + " discarded=" + std::to_string(st.discarded) +
      " held" + HeldIds(*engine, "M"));
  return 0;
}

// ---- UpdateStream of max_msgs across a restart: a file stream's limits are not
// kept in its directory; the next AddStream's config sets them. ----
int UpdateMaxMsgs(const std::string& step, const std::string& dir) {
  inferq::StreamConfig s = FileStream("U", {"u.>"}, dir);
  s.max_msgs = step == "2" ? 3 : -1;
  auto engine = NewEngine();
  Must(engine->AddStream(s), "AddStream");
  if (step == "1") {
    for (int i = 1; i <= 5; ++i) Must(engine->Publish(Ev("u.x", "u" + std::to_string(i))), "Publish");
    s.max_msgs = 2;
    Must(engine->UpdateStream(s), "UpdateStream");
  }
  const inferq::StreamStats st = Stream(*engine, "U");
  struct CrashAtEnd {
    bool crash;
    ~CrashAtEnd() { if (crash) Crash(); }
  } crash_at_end{step == "1"};  // after printing, without closing the engine
  Out("messages=" + std::to_string(st.messages) + " first_seq=" + std::to_string(st.first_seq) +
      " held" + HeldIds(*engine, "U"));
  return 0;
}

// ---- A term of a delivery a newer one superseded, across a restart (found by the
// adversarial review: it was recorded as the message's ack). ----
int StaleTerm(const std::string& step, const std::string& dir) {
  auto engine = NewEngine();
  inferq::StreamConfig s = FileStream("T", {"t.>"}, dir);
  s.retention = inferq::RetentionPolicy::kWorkQueue;
  Must(engine->AddStream(s), "AddStream");
  inferq::Consumer c = Must(engine->AddConsumer({.stream = "T", .name = "c",
                                                 .deliver = inferq::DeliverPolicy::kAll,
                                                 .ack_wait = absl::Milliseconds(50)}),
                            "AddConsumer");
  inferq::Member m = Must(c.member(0), "member");
  std::vector<inferq::Message> held;
  if (step == "1") {
    Must(engine->Publish(Ev("t.x", "t1")), "Publish");
    inferq::Message first = Must(m.Next(absl::Seconds(10)), "Next");
    // Its ack_wait expires: the second delivery comes (however loaded the machine).
    inferq::Message second = Must(m.Next(absl::Seconds(60)), "Next (the redelivery)");
    Out("second " + second.event().msg_id + "@" + std::to_string(second.attempt()));
    Out("term of the first: " + first.Term("stale").ToString());
    held.push_back(std::move(second));  // out, never settled
    held.push_back(std::move(first));
    Crash();
  }
  // The message comes again (its last delivery was never settled), and is acked.
  Out("after restart " + PullIds(m, "all", held, absl::Seconds(2)));
  Out("messages=" + std::to_string(Stream(*engine, "T").messages));
  held.clear();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: restart_child SCENARIO STEP DIR\n");
    return 2;
  }
  const std::string scenario = argv[1];
  const std::string step = argv[2];
  const std::string dir = argv[3];
  if (scenario == "dedup_work_queue") return Dedup(step, dir, true);
  if (scenario == "dedup_limits") return Dedup(step, dir, false);
  if (scenario == "redelivery") return Redelivery(step, dir);
  if (scenario == "start") return StartPositions(step, dir);
  if (scenario == "purge") return PurgeScenario(step, dir);
  if (scenario == "per_subject") return PerSubject(step, dir);
  if (scenario == "update_max_msgs") return UpdateMaxMsgs(step, dir);
  if (scenario == "stale_term") return StaleTerm(step, dir);
  if (scenario == "lifecycle_memory") return LifecycleScenario(step, dir, false);
  if (scenario == "lifecycle_file") return LifecycleScenario(step, dir, true);
  std::fprintf(stderr, "restart_child: unknown scenario '%s'\n", scenario.c_str());
  return 2;
}
