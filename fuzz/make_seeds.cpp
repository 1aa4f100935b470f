// Writes seed inputs for the fuzz targets: a real log segment and real full and
// incremental checkpoints, made by a StateStore in a temp directory. Each seed starts
// with the targets' flag byte (0: take the bytes as they are).
//
// Usage: make_seeds LOG_CORPUS_DIR CHECKPOINT_CORPUS_DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <algorithm>
#include <iterator>

#include "inferq/state/state_store.hpp"

namespace fs = std::filesystem;

// Copies `from` behind the flag byte, without the zeros a segment is filled ahead
// with (all but 64 of them): small seeds keep the fuzzer fast.
static void Copy(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::size_t end = bytes.size();
  while (end > 0 && bytes[end - 1] == '\0') --end;
  bytes.resize(std::min(bytes.size(), end + 64));
  std::ofstream out(to, std::ios::binary);
  out.put('\0');
  out << bytes;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds LOG_CORPUS_DIR CHECKPOINT_CORPUS_DIR\n");
    return 2;
  }
  const fs::path dir = fs::temp_directory_path() / "inferq_fuzz_seeds";
  fs::remove_all(dir);
  {
    inferq::StateStoreOptions o;
    o.dir = dir.string();
    o.checkpoint_interval = absl::ZeroDuration();
    o.checkpoint_log_bytes = 0;
    auto s = inferq::StateStore::Open(o);
    if (!s.ok()) return 1;
    for (int i = 0; i < 5; ++i) {
      auto tx = (*s)->Begin();
      tx.Put("session." + std::to_string(i) + ".state", std::string(20, 'a' + i));
      if (i == 3) tx.Delete("session.1.state");
      if (!tx.Commit().ok()) return 1;
    }
    if (!(*s)->Checkpoint().ok()) return 1;
    auto tx = (*s)->Begin();
    tx.Put("session.0.state", "changed").Delete("session.2.state");
    if (!tx.Commit().ok() || !(*s)->Checkpoint().ok()) return 1;
  }
  fs::create_directories(argv[1]);
  fs::create_directories(argv[2]);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    Copy(e.path(), fs::path(name.rfind("wal-", 0) == 0 ? argv[1] : argv[2]) / ("seed-" + name));
  }
  fs::remove_all(dir);
  return 0;
}
