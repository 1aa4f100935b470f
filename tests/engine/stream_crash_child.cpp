// Child of engine_stream_crash_test: publishes into a file stream and consumes it
// with a durable consumer until it is killed. It reports, with one write(2) each
// after the call returned OK: "P <seq>" for an acknowledged publish, "S <seq>" for a
// message AckSync'ed. Odd sequences are AckSync'ed, even ones left unacked.
// Usage: stream_crash_child DIR every|group|interval|none
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "inferq/engine/engine.hpp"

namespace {

void Report(char kind, std::uint64_t seq) {
  char line[32];
  const int n = std::snprintf(line, sizeof(line), "%c %llu\n", kind,
                              static_cast<unsigned long long>(seq));
  if (::write(1, line, static_cast<std::size_t>(n)) != n) _exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: stream_crash_child DIR every|group|interval|none\n");
    return 2;
  }
  const std::string policy = argv[2];
  inferq::StreamConfig s{.name = "CRASH", .subjects = {"crash.>"}};
  s.storage = inferq::StorageType::kFile;
  s.directory = argv[1];
  s.segment_bytes = 64 * 1024;  // many segments, so rotations get killed too
  if (policy == "every") {
    s.sync = inferq::SyncPolicy::kEveryCommit;
  } else if (policy == "group") {
    s.sync = inferq::SyncPolicy::kGroupCommit;
    s.sync_window = absl::Microseconds(100);
  } else if (policy == "interval") {
    s.sync = inferq::SyncPolicy::kInterval;
    s.sync_window = absl::Milliseconds(2);
  } else if (policy == "none") {
    s.sync = inferq::SyncPolicy::kNone;
  } else {
    std::fprintf(stderr, "stream_crash_child: unknown policy '%s'\n", policy.c_str());
    return 2;
  }
  auto engine = inferq::Engine::Create();
  if (!engine.ok()) return 1;
  if (absl::Status st = (*engine)->AddStream(s); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  auto c = (*engine)->AddConsumer(
      {.stream = "CRASH", .name = "work", .deliver = inferq::DeliverPolicy::kAll});
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  inferq::Member m = *c->member(0);
  // Pulls one message if one is there (AckSync'ing the odd ones); whether it did.
  auto pull_one = [&]() -> bool {
    auto msg = m.Next(absl::ZeroDuration());
    if (!msg.ok()) return false;
    if (msg->stream_seq() % 2 == 1) {
      if (absl::Status st = msg->AckSync(); !st.ok()) {
        std::fprintf(stderr, "ack: %s\n", st.ToString().c_str());
        _exit(1);
      }
      Report('S', msg->stream_seq());
    }
    return true;
  };
  std::string body(200, 'x');
  for (;;) {
    inferq::Event e;
    e.subject = "crash.a";
    e.payload = inferq::Buffer::FromString(body);
    // This thread alone drains the lane: a blocking Publish into a lane that a
    // restart's backlog filled would wait for itself. TryPublish refuses a full
    // lane (nothing stored); pull one and try again.
    auto ack = (*engine)->TryPublish(e);
    while (!ack.ok() && ack.status().code() == absl::StatusCode::kResourceExhausted) {
      if (!pull_one()) {
        std::fprintf(stderr, "publish refused with an empty lane: %s\n",
                     ack.status().ToString().c_str());
        return 1;
      }
      ack = (*engine)->TryPublish(e);
    }
    if (!ack.ok()) {
      std::fprintf(stderr, "publish: %s\n", ack.status().ToString().c_str());
      return 1;
    }
    Report('P', ack->seq);
    // Two pulls per publish: the backlog of a restart drains while it runs.
    for (int k = 0; k < 2 && pull_one(); ++k) {
    }
  }
}
