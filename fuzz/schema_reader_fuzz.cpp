// Fuzz target: SchemaReader::Read (schema-on-read) on untrusted payload bytes, for
// every pair of writer and reader versions of the schema-on-read fixtures
// (tests/schema/data/read_v{1,2,3}.fbs). The first input byte picks the pair
// (writer = 1 + b % 3, reader = 1 + (b / 3) % 3); the rest is the payload. A payload
// must give a Record or a DataLoss error, never a crash or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "inferq/schema/registry.hpp"
#include "inferq/schema/schema_reader.hpp"

namespace {

struct Fixture {
  inferq::SchemaRegistry registry;
  std::vector<inferq::SchemaReader> readers;  // readers[v - 1] reads as version v
};

Fixture* MakeFixture() {
  auto* f = new Fixture;
  if (!f->registry.SetCompatibility("fuzz", inferq::Compatibility::kNone).ok()) std::abort();
  for (int v = 1; v <= 3; ++v) {
    const std::string path = std::string(INFERQ_SCHEMA_DATA_DIR) + "/read_v" + std::to_string(v) + ".fbs";
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    auto ref = f->registry.Register("fuzz", text);
    if (!ref.ok() || ref->version != static_cast<std::uint32_t>(v)) {
      std::fprintf(stderr, "schema_reader_fuzz: %s: %s\n", path.c_str(),
                   std::string(ref.status().message()).c_str());
      std::abort();
    }
  }
  for (std::uint32_t v = 1; v <= 3; ++v) {
    auto reader = f->registry.Reader("fuzz", v);
    if (!reader.ok()) std::abort();
    f->readers.push_back(*reader);
  }
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture* const fixture = MakeFixture();
  if (size < 1) return 0;
  const std::uint32_t writer = 1 + data[0] % 3;
  const std::uint32_t reader = 1 + (data[0] / 3) % 3;
  // A copy, so that reads past the payload are caught by ASan at its real end.
  std::vector<std::byte> payload(size - 1);
  for (std::size_t i = 1; i < size; ++i) payload[i - 1] = static_cast<std::byte>(data[i]);
  auto record = fixture->readers[reader - 1].Read(payload, writer);
  if (!record.ok() && record.status().code() != absl::StatusCode::kDataLoss) {
    std::fprintf(stderr, "unexpected status: %s\n", record.status().ToString().c_str());
    std::abort();
  }
  if (record.ok()) (void)record->DebugString();
  return 0;
}
