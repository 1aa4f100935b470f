// Child process of the crash test (state_crash_test.cpp): commits in a loop from
// several threads and reports each commit on stdout only after Commit() returned:
//   "<thread> <counter> <tx_id>\n"   (one write(2) per line: a line is all or nothing)
// Each commit of thread w sets w<w>.n and w<w>.copy to the same counter, so a
// recovered state with the two unequal would show a half-applied transaction.
//
// Usage: state_crash_child DIR every|group|interval|none THREADS
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "inferq/state/state_store.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR every|group|interval|none THREADS\n", argv[0]);
    return 2;
  }
  inferq::StateStoreOptions o;
  o.dir = argv[1];
  const std::string policy = argv[2];
  if (policy == "every") {
    o.sync = inferq::SyncPolicy::kEveryCommit;
  } else if (policy == "group") {
    o.sync = inferq::SyncPolicy::kGroupCommit;
  } else if (policy == "interval") {
    o.sync = inferq::SyncPolicy::kInterval;
    o.group_commit_window = absl::Milliseconds(2);
  } else if (policy == "none") {
    o.sync = inferq::SyncPolicy::kNone;
  } else {
    std::fprintf(stderr, "unknown policy '%s'\n", policy.c_str());
    return 2;
  }
  const int threads = std::atoi(argv[3]);
  // Small segments and frequent checkpoints, so kills land in rotations,
  // checkpoint swaps and segment retirement too.
  o.segment_bytes = 16 * 1024;
  o.checkpoint_log_bytes = 48 * 1024;
  o.checkpoint_interval = absl::ZeroDuration();
  o.max_incremental_chain = 3;
  auto store = inferq::StateStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 3;
  }
  inferq::StateStore& s = **store;
  std::vector<std::thread> ts;
  for (int w = 0; w < threads; ++w) {
    ts.emplace_back([&s, w] {
      const std::string key = "w" + std::to_string(w);
      std::uint64_t c = 0;
      if (auto v = s.Get(key + ".n")) c = std::stoull(*v);
      const std::string pad(120, static_cast<char>('a' + w));
      for (;;) {
        ++c;
        auto tx = s.Begin();
        tx.Put(key + ".n", std::to_string(c)).Put(key + ".copy", std::to_string(c)).Put(key + ".pad", pad);
        auto r = tx.Commit();
        if (!r.ok()) {
          std::fprintf(stderr, "commit: %s\n", r.status().ToString().c_str());
          std::_Exit(4);
        }
        const std::string line =
            std::to_string(w) + " " + std::to_string(c) + " " + std::to_string(*r) + "\n";
        if (::write(1, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          std::_Exit(5);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
}
