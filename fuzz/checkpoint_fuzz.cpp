// libFuzzer target: the checkpoint loader. The input is a checkpoint file; it is
// decoded on its own and then recovered together with a one-record log. When the
// first input byte is odd, the trailing checksum is recomputed first, so the fuzzer
// reaches the zstd body and the entry parser.
#include <cstddef>
#include <cstdint>
#include <string>

#include "memory_file_system.hpp"
#include "state/log_format.hpp"
#include "state/recovery.hpp"

namespace si = inferq::state_internal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) && file.size() >= 8) {
    const std::uint64_t sum = si::Xxh3(std::string_view(file).substr(0, file.size() - 8));
    for (int i = 0; i < 8; ++i) file[file.size() - 8 + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
  }
  constexpr std::uint64_t kMaxRaw = 64u << 20;  // the fuzzer's memory limit is 2 GiB
  auto c = si::DecodeCheckpoint(file, kMaxRaw);
  if (c.ok()) {
    // Round trip: what decodes re-encodes to something that decodes the same.
    auto again = si::EncodeCheckpoint(*c);
    if (!again.ok()) __builtin_trap();
    auto back = si::DecodeCheckpoint(*again, kMaxRaw);
    if (!back.ok() || back->entries.size() != c->entries.size() || back->tx != c->tx) __builtin_trap();
    inferq_fuzz::MemoryFileSystem fs;
    fs.files[si::CheckpointName(c->tx, c->kind)] = file;
    fs.files["IDENTITY"] = si::EncodeIdentity(c->store_id == 0 ? 1 : c->store_id);
    for (bool strict : {false, true}) {
      si::RecoverOptions o;
      o.strict = strict;
      o.max_checkpoint_raw_bytes = kMaxRaw;
      (void)si::Recover(fs, "mem", o);
    }
  }
  return 0;
}
