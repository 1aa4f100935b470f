// quickstart: one stream, a consumer group of two members, a publisher, batches,
// acks, stats and the errors a caller meets. The README shows this program whole;
// the test suite builds it and runs it (example.quickstart).
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "inferq/inferq.hpp"

int main(int argc, char** argv) {
  if (argc > 1) {  // no options: it shows the API; --help says what it does
    const bool help = std::string(argv[1]) == "--help";
    std::fprintf(help ? stdout : stderr,
                 "%susage: quickstart (no options): publishes 100 requests to a consumer group "
                 "of two members and acks them; exit 0 when all were acked\n",
                 help ? "" : ("quickstart: unknown argument '" + std::string(argv[1]) + "'\n").c_str());
    return help ? 0 : 2;
  }
  absl::StatusOr<std::unique_ptr<inferq::Engine>> created = inferq::Engine::Create();
  if (!created.ok()) {  // InvalidArgument names the bad EngineOptions value
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  inferq::Engine& engine = **created;
  // A stream keeps what its subjects capture; interest retention drops a message
  // once every consumer has acked it.
  if (absl::Status s = engine.AddStream({.name = "REQUESTS",
                                         .subjects = {"infer.*.request"},
                                         .retention = inferq::RetentionPolicy::kInterest});
      !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  // A consumer group: each message goes to one of its members (round robin here),
  // in batches of up to 8 that wait at most 2 ms for company.
  absl::StatusOr<inferq::Consumer> replicas = engine.AddConsumer(
      {.stream = "REQUESTS", .name = "replicas", .members = 2,
       .ack_wait = absl::Seconds(30),
       .batch = {.max_batch = 8, .max_queue_delay = absl::Milliseconds(2)}});
  if (!replicas.ok()) {
    std::fprintf(stderr, "%s\n", replicas.status().ToString().c_str());
    return 1;
  }

  constexpr int kRequests = 100;
  std::vector<std::thread> members;
  std::vector<int> served(2, 0);
  for (std::uint32_t i = 0; i < 2; ++i) {
    members.emplace_back([&, i] {
      inferq::Member member = *replicas->member(i);
      for (;;) {
        auto batch = member.NextBatch(absl::Seconds(1));
        if (!batch.ok()) break;  // DeadlineExceeded: idle for 1 s; Cancelled: closed
        for (inferq::Message& m : *batch) {
          // ... run the request in m.event().payload ...
          if (m.Ack().ok()) ++served[i];  // or m.Nak(delay), m.Term(why), m.InProgress()
        }
      }
    });
  }

  for (int r = 0; r < kRequests; ++r) {
    inferq::Event e;
    e.subject = "infer.llama.request";
    e.msg_id = "req-" + std::to_string(r);  // a retry within the duplicate window is not stored twice
    e.payload = inferq::Buffer::FromString(R"({"prompt": "hello"})");
    if (absl::StatusOr<inferq::PublishAck> ack = engine.Publish(std::move(e)); !ack.ok()) {
      std::fprintf(stderr, "publish: %s\n", ack.status().ToString().c_str());
      return 1;
    }
  }
  // The errors a caller meets: a subject no stream captures, and an invalid one.
  inferq::Event stray;
  stray.subject = "chat.llama.request";
  std::printf("stray: %s\n", engine.Publish(std::move(stray)).status().ToString().c_str());
  inferq::Event bad;
  bad.subject = "infer..request";
  std::printf("bad:   %s\n", engine.Publish(std::move(bad)).status().ToString().c_str());

  for (std::thread& t : members) t.join();  // each stops after 1 s without work
  const inferq::EngineStats stats = engine.Stats();
  const inferq::ConsumerStats* c = stats.consumer("REQUESTS", "replicas");
  std::printf("published %llu, acked %llu (member 0: %d, member 1: %d), in %llu batches\n",
              static_cast<unsigned long long>(stats.published),
              static_cast<unsigned long long>(c->acked), served[0], served[1],
              static_cast<unsigned long long>(c->batches));
  engine.Close();
  return c->acked == kRequests ? 0 : 1;
}
