// Writes seed inputs for the fuzz targets: a real log segment and real full and
// incremental checkpoints, made by a StateStore in a temp directory. Each seed starts
// with the targets' flag byte (0: take the bytes as they are). With a third directory,
// also encoded TensorEvents (every field set; raw, zstd and zstd-with-dictionary
// payloads, the dictionary of fuzz_dictionary.hpp), as they are.
//
// Usage: make_seeds LOG_CORPUS_DIR CHECKPOINT_CORPUS_DIR [TENSOR_EVENT_CORPUS_DIR]
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <algorithm>
#include <iterator>

#include "fuzz_dictionary.hpp"
#include "inferq/event/event.hpp"
#include "inferq/event/tensor_event.hpp"
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
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr,
                 "usage: make_seeds LOG_CORPUS_DIR CHECKPOINT_CORPUS_DIR "
                 "[TENSOR_EVENT_CORPUS_DIR]\n");
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
  if (argc == 4) {
    fs::create_directories(argv[3]);
    inferq::Event e;
    e.subject = "infer.llama.request";
    e.task_id = {1, 2};
    e.semantic_tag = "summarize";
    e.tenant = "acme";
    e.qos = inferq::Qos::kGold;
    e.priority = 5;
    e.trace.trace_id[0] = 0xab;
    e.trace.span_id[7] = 0xcd;
    e.model = "llama";
    e.model_version = "3";
    e.schema_id = 1;
    e.schema_version = 2;
    e.msg_id = "m1";
    e.seq_id = "s1";
    e.seq_no = 9;
    e.created = absl::FromUnixNanos(1'700'000'000'000'000'001);
    e.deadline = absl::FromUnixNanos(1'700'000'001'000'000'000);
    e.ttl = absl::Seconds(1);
    e.attempt = 1;
    e.shape = {2, 4};
    e.dtype = inferq::DType::kInt32;
    e.headers.Set("k", "v");
    e.payload = inferq::Buffer::FromString("tokens tokens tokens tokens 17 42 17 42");
    const inferq::ZstdDictionary* dict = inferq_fuzz::FuzzDictionary().get();
    for (auto [name, options] :
         {std::pair{"seed-none", inferq::EncodeOptions{.codec = inferq::PayloadCodec::kNone}},
          std::pair{"seed-zstd", inferq::EncodeOptions{.codec = inferq::PayloadCodec::kZstd}},
          std::pair{"seed-zstd-dict", inferq::EncodeOptions{.codec = inferq::PayloadCodec::kZstd,
                                                            .dictionary = dict}}}) {
      auto wire = inferq::Encode(e, options);
      if (!wire.ok()) return 1;
      std::ofstream out(fs::path(argv[3]) / name, std::ios::binary);
      out << wire->view();
    }
  }
  return 0;
}
