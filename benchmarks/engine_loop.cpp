// One thread publishes, pulls and acks N events on one consumer: a deterministic
// workload for counting instructions per event with callgrind (BENCHMARKS.md), where
// wall-clock figures on a shared 2-vCPU machine move by 2x between runs.
//   valgrind --tool=callgrind ./engine_loop 20000; valgrind --tool=callgrind ./engine_loop 40000
//   instructions per event = (I(40000) - I(20000)) / 20000
#include <cstdio>
#include <cstdlib>

#include "inferq/engine/engine.hpp"

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  if (n <= 0) {
    std::fprintf(stderr, "engine_loop: event count %s must be a positive integer\n", argv[1]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<inferq::Engine>> created =
      inferq::Engine::Create({.manual_timers = true});
  if (!created.ok()) return 1;
  inferq::Engine& engine = **created;
  if (!engine.AddStream({.name = "S", .subjects = {"infer.*.req"}, .max_msgs = 1000}).ok()) return 1;
  auto c = engine.AddConsumer({.stream = "S", .name = "c", .lane_capacity = 64});
  if (!c.ok()) return 1;
  inferq::Member m = *c->member(0);
  long ok = 0;
  for (int i = 0; i < n; ++i) {
    inferq::Event e;
    e.subject = "infer.m.req";
    e.seq_no = static_cast<std::uint64_t>(i);
    ok += engine.Publish(std::move(e)).ok();
    auto msg = m.Next(absl::ZeroDuration());
    ok += msg.ok() && msg->Ack().ok();
  }
  std::printf("%ld of %d publishes and acks succeeded\n", ok, 2 * n);
  return ok == 2L * n ? 0 : 1;
}
