// Child process of the lifecycle crash test (lifecycle_test.cpp): drives random
// lifecycle transitions from several threads, plus a timer thread calling
// RunTimeouts, on a StateStore with the every-commit sync policy, until the parent
// kills it with SIGKILL. After a transition returned OK it reports on stdout what it
// saw (one write(2) per line, so a line is all or nothing):
//   "M <model> <generation> <state>\n"   a model state read after the transition
//   "G <msg_id> <state>\n"               the state a message transition produced
// Both are committed states: queries see a transition only after its Commit.
// Message ids carry RUN so that no id is used twice in one directory.
//
// Usage: lifecycle_crash_child DIR RUN THREADS SEED
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "inferq/engine/lifecycle.hpp"
#include "inferq/state/state_store.hpp"

namespace {

void Say(const std::string& line) {
  if (::write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(5);
}

// Expected refusals (the random walk tries transitions that do not apply) are fine;
// anything else ends the child with a message.
void Check(const absl::Status& st, const char* what) {
  if (st.ok() || st.code() == absl::StatusCode::kFailedPrecondition ||
      st.code() == absl::StatusCode::kNotFound ||
      st.code() == absl::StatusCode::kAlreadyExists) {
    return;
  }
  std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
  std::_Exit(4);
}

void SayModel(inferq::Lifecycle& lc, const std::string& model) {
  auto m = lc.GetModel(model);
  if (!m.ok()) return;
  Say("M " + model + " " + std::to_string(m->generation) + " " +
      std::string(inferq::ModelStateName(m->state)) + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s DIR RUN THREADS SEED\n", argv[0]);
    return 2;
  }
  inferq::StateStoreOptions o;
  o.dir = argv[1];
  o.sync = inferq::SyncPolicy::kEveryCommit;
  // Small segments and frequent checkpoints, so kills land in those too.
  o.segment_bytes = 16 * 1024;
  o.checkpoint_log_bytes = 48 * 1024;
  o.checkpoint_interval = absl::ZeroDuration();
  o.max_incremental_chain = 3;
  const std::string run = argv[2];
  const int threads = std::atoi(argv[3]);
  const unsigned seed = static_cast<unsigned>(std::strtoul(argv[4], nullptr, 10));
  auto store = inferq::StateStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 3;
  }
  inferq::LifecycleOptions lo;
  lo.warmup_timeout = absl::Milliseconds(15);
  lo.inference_timeout = absl::Milliseconds(8);
  auto lc_or = inferq::Lifecycle::Open(store->get(), lo);
  if (!lc_or.ok()) {
    std::fprintf(stderr, "lifecycle open: %s\n", lc_or.status().ToString().c_str());
    return 3;
  }
  inferq::Lifecycle& lc = **lc_or;
  const std::vector<std::string> models = {"m0", "m1", "m2", "m3"};

  std::vector<std::thread> ts;
  ts.emplace_back([&] {  // the timer
    for (;;) {
      auto r = lc.RunTimeouts();
      if (!r.ok()) Check(r.status(), "RunTimeouts");
      if (r.ok()) {
        for (const auto& m : r->evicted_models) SayModel(lc, m);
        for (const auto& id : r->expired_messages) Say("G " + id + " expired\n");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (int w = 0; w < threads; ++w) {
    ts.emplace_back([&, w] {
      std::mt19937 rng(seed * 31 + static_cast<unsigned>(w));
      std::vector<std::string> mine;  // ids this thread enqueued and may move on
      std::uint64_t n = 0;
      auto pick = [&](std::size_t k) { return std::uniform_int_distribution<std::size_t>(0, k - 1)(rng); };
      for (;;) {
        const int roll = static_cast<int>(pick(100));
        const std::string& model = models[pick(models.size())];
        if (roll < 8) {
          absl::Status st = lc.BeginWarmup(model);
          Check(st, "BeginWarmup");
          if (st.ok()) SayModel(lc, model);
        } else if (roll < 20) {
          absl::Status st = lc.ModelReady(model);
          Check(st, "ModelReady");
          if (st.ok()) SayModel(lc, model);
        } else if (roll < 23) {
          auto r = lc.Evict(model, "crash test");
          Check(r.status(), "Evict");
          if (r.ok()) {
            SayModel(lc, model);
            for (const auto& id : *r) Say("G " + id + " expired\n");
          }
        } else if (roll < 50 || mine.empty()) {
          const std::string id = "r" + run + "t" + std::to_string(w) + "n" + std::to_string(++n);
          absl::Status st = lc.Enqueue(id, model);
          Check(st, "Enqueue");
          if (st.ok()) {
            Say("G " + id + " pending\n");
            mine.push_back(id);
          }
        } else {
          const std::size_t i = pick(mine.size());
          const std::string id = mine[i];
          absl::Status st;
          const char* state;
          if (roll < 75) {
            st = lc.StartProcessing(id);
            state = "processing";
          } else if (roll < 93) {
            st = lc.Complete(id);
            state = "completed";
          } else {
            st = lc.Expire(id, "crash test");
            state = "expired";
          }
          Check(st, "message transition");
          if (st.ok()) Say("G " + id + " " + state + "\n");
          auto m = lc.GetMessage(id);
          if (m.ok() && (m->state == inferq::MessageState::kCompleted ||
                         m->state == inferq::MessageState::kExpired)) {
            mine[i] = mine.back();
            mine.pop_back();
          }
        }
      }
    });
  }
  for (auto& t : ts) t.join();
}
