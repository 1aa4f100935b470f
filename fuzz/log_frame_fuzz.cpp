// libFuzzer target: the log-frame reader. The input is a log segment file; recovery
// (point-in-time and strict) reads it, checking frames, tx_ids and the hash chain.
// When the first input byte is odd, the checksums in the input are recomputed first,
// so the fuzzer reaches the payload parser and the chain checks instead of stopping
// at the checksum every time.
#include <cstddef>
#include <cstdint>
#include <string>

#include "memory_file_system.hpp"
#include "state/log_format.hpp"
#include "state/recovery.hpp"

namespace si = inferq::state_internal;

namespace {

void PutU64(std::string& s, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t GetU64(const std::string& s, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}
std::uint32_t GetU32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

void FixChecksums(std::string& seg) {
  if (seg.size() < si::kSegmentHeaderBytes) return;
  PutU64(seg, 32, si::Xxh3(std::string_view(seg).substr(0, 32)));
  std::size_t off = si::kSegmentHeaderBytes;
  while (seg.size() - off >= si::kFrameHeaderBytes) {
    const std::uint32_t len = GetU32(seg, off + 4);
    if (len > seg.size() - off - si::kFrameHeaderBytes) break;
    std::string covered = seg.substr(off, 16) + seg.substr(off + si::kFrameHeaderBytes, len);
    PutU64(seg, off + 16, si::Xxh3(covered));
    off += si::kFrameHeaderBytes + len;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string seg(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) FixChecksums(seg);
  inferq_fuzz::MemoryFileSystem fs;
  fs.files[si::SegmentName(1)] = seg;
  // The directory's identity: the one the segment header claims (or any).
  const std::uint64_t id = seg.size() >= 16 ? GetU64(seg, 8) : 1;
  fs.files["IDENTITY"] = si::EncodeIdentity(id == 0 ? 1 : id);
  for (bool strict : {false, true}) {
    si::RecoverOptions o;
    o.strict = strict;
    auto r = si::Recover(fs, "mem", o);
    if (r.ok() && r->last_tx != 0 && r->records_replayed == 0 && r->base_tx == 0) __builtin_trap();
  }
  // The raw frame decoder at every offset must stay inside the input.
  if (seg.size() >= 8) {
    const std::uint64_t salt = GetU64(seg, 0);
    for (std::size_t off = 0; off < seg.size() && off < 64; ++off) {
      (void)si::DecodeFrame(seg, off, salt);
      // The unchecked reader of sealed segments, with an end inside and past the input.
      if (auto f = si::ReadCoveredFrame(seg, off, seg.size() - off / 2)) {
        if (f->size > seg.size() - off || f->key.data() + f->key.size() > f->value.data()) __builtin_trap();
      }
      (void)si::ReadCoveredFrame(seg, off, seg.size() + 100);
    }
    (void)si::FindNextFrame(seg, 0, salt);
  }
  return 0;
}
