// A program, not a Catch2 test: it calls std::exit while an engine's threads are busy,
// as a server does when it refuses a flag after starting its engine. std::exit runs the
// destructors of statics while those threads go on, so every static the library's
// threads use must never be destroyed. ctest runs it in every build; under ASan+UBSan
// a destroyed static is reported (the CI found the timer thread calling a destroyed
// SteadyClock::Default(): "member call ... which does not point to an object of type
// 'Clock'"). Exit status 0 when nothing was reported.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "inferq/inferq.hpp"

namespace {

// Registered before SteadyClock::Default() is first used, so it runs after that
// static would have been destroyed: it reads the clock the way an engine thread does.
void ReadClockAtExit() {
  const std::int64_t now = inferq::SteadyClock::Default()->NowNanos();
  if (now <= 0) std::fprintf(stderr, "exit_while_running: clock read %lld at exit\n",
                             static_cast<long long>(now));
}

void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "exit_while_running: %s: %s\n", what, s.ToString().c_str());
  std::_Exit(1);
}

}  // namespace

int main() {
  std::atexit(ReadClockAtExit);
  char tmpl[] = "/tmp/inferq_exit_while_running.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;

  auto created = inferq::Engine::Create();
  Check(created.status(), "Engine::Create");
  inferq::Engine& engine = **created;  // never destroyed: std::exit does not unwind
  // A file stream (its log thread preallocates segments with zeros) and a memory
  // stream, each with a consumer whose ack_wait keeps the timer thread busy.
  Check(engine.AddStream({.name = "DISK",
                          .subjects = {"disk.>"},
                          .storage = inferq::StorageType::kFile,
                          .directory = dir + "/disk",
                          .segment_bytes = 1 << 16}),
        "AddStream DISK");
  Check(engine.AddStream({.name = "MEM", .subjects = {"mem.>"}}), "AddStream MEM");
  auto disk = engine.AddConsumer({.stream = "DISK", .name = "c", .ack_wait = absl::Milliseconds(1)});
  Check(disk.status(), "AddConsumer DISK");
  auto mem = engine.AddConsumer({.stream = "MEM", .name = "c", .ack_wait = absl::Milliseconds(1)});
  Check(mem.status(), "AddConsumer MEM");

  std::atomic<long> published{0};
  std::atomic<long> pulled{0};
  // Detached: std::exit ends them wherever they are.
  std::thread([&] {
    for (long i = 0;; ++i) {
      inferq::Event e;
      e.subject = (i % 2 == 0) ? "disk.x" : "mem.x";
      e.payload = inferq::Buffer::FromString(std::string(512, 'p'));
      if (engine.Publish(std::move(e)).ok()) published.fetch_add(1, std::memory_order_relaxed);
    }
  }).detach();
  for (inferq::Consumer* c : {&*disk, &*mem}) {
    std::thread([&pulled, m = *c->member(0)]() mutable {
      for (long i = 0;; ++i) {
        auto msg = m.Next(absl::Milliseconds(1));
        if (!msg.ok()) continue;
        pulled.fetch_add(1, std::memory_order_relaxed);
        if (i % 3 != 0) (void)msg->Ack();  // the rest wait for ack_wait and come back
      }
    }).detach();
  }
  while (published.load() < 2000 || pulled.load() < 500) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("exit_while_running: exiting with %ld published, %ld pulled\n", published.load(),
              pulled.load());
  std::fflush(stdout);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // the log thread may still write; harmless
  std::exit(0);
}
