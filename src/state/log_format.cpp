#include "log_format.hpp"

#include <openssl/evp.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack: no allocation per frame
#include <xxhash.h>
#include <zstd.h>

#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>

namespace inferq::state_internal {
namespace {

void PutU8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }
void PutU32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
std::uint32_t GetU32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
std::uint64_t GetU64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Bounds-checked reading of a byte string.
class Reader {
 public:
  explicit Reader(std::string_view d) : d_(d) {}
  bool U8(std::uint8_t& v) {
    if (d_.size() - pos_ < 1) return false;
    v = static_cast<std::uint8_t>(d_[pos_++]);
    return true;
  }
  bool U32(std::uint32_t& v) {
    if (d_.size() - pos_ < 4) return false;
    v = GetU32(d_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(std::uint64_t& v) {
    if (d_.size() - pos_ < 8) return false;
    v = GetU64(d_.data() + pos_);
    pos_ += 8;
    return true;
  }
  bool Bytes(std::size_t n, std::string_view& v) {
    if (d_.size() - pos_ < n) return false;
    v = d_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == d_.size(); }
  std::size_t pos() const { return pos_; }

 private:
  std::string_view d_;
  std::size_t pos_ = 0;
};

constexpr char kSegmentMagic[8] = {'I', 'Q', 'W', 'A', 'L', 'S', 'G', '2'};
constexpr char kCheckpointMagic[8] = {'I', 'Q', 'C', 'K', 'P', 'T', '0', '2'};
constexpr std::size_t kCheckpointHeaderBytes = 8 + 8 + 8 + 8 + 8 + 32 + 8 + 8;
constexpr std::string_view kIdentityPrefix = "inferq-state ";

absl::Status Bad(const std::string& what) { return absl::DataLossError(what); }

}  // namespace

namespace {

// SHA-256 fetched once: EVP_sha256() per call makes OpenSSL 3 look the algorithm up
// again (a read lock and a reference count per record, 7 % of a durable publish).
const EVP_MD* Sha256Md() {
  static const EVP_MD* md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
}

}  // namespace

Hash Sha256(std::string_view bytes) {
  // One context per thread, reused: no allocation per record.
  thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(),
                                                                                 &EVP_MD_CTX_free);
  Hash h{};
  unsigned int len = 0;
  if (ctx == nullptr || EVP_DigestInit_ex2(ctx.get(), Sha256Md(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), h.data(), &len) != 1) {
    EVP_Digest(bytes.data(), bytes.size(), h.data(), &len, EVP_sha256(), nullptr);
  }
  return h;
}

std::string HashHex(const Hash& h) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : h) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

std::uint64_t Xxh3(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string StoreIdHex(std::uint64_t store_id) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, store_id);
  return hex;
}

std::string EncodeIdentity(std::uint64_t store_id) {
  return std::string(kIdentityPrefix) + StoreIdHex(store_id) + "\n";
}

absl::StatusOr<std::uint64_t> DecodeIdentity(std::string_view file) {
  if (file.size() != kIdentityPrefix.size() + 17 || file.substr(0, kIdentityPrefix.size()) != kIdentityPrefix ||
      file.back() != '\n') {
    return Bad("IDENTITY file is not 'inferq-state <16 hex digits>'");
  }
  std::uint64_t id = 0;
  for (char c : file.substr(kIdentityPrefix.size(), 16)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return Bad("IDENTITY file is not 'inferq-state <16 hex digits>'");
    id = (id << 4) | static_cast<std::uint64_t>(d);
  }
  if (id == 0) return Bad("IDENTITY file holds store id 0");
  return id;
}

std::string EncodeSegmentHeader(std::uint64_t store_id, std::uint64_t salt,
                                std::uint64_t first_tx) {
  std::string out(kSegmentMagic, sizeof(kSegmentMagic));
  PutU64(out, store_id);
  PutU64(out, salt);
  PutU64(out, first_tx);
  PutU64(out, Xxh3(out));
  return out;
}

absl::StatusOr<SegmentHeader> DecodeSegmentHeader(std::string_view file) {
  if (file.size() < kSegmentHeaderBytes) {
    return Bad("segment header is " + std::to_string(file.size()) + " bytes, needs " +
               std::to_string(kSegmentHeaderBytes));
  }
  if (std::memcmp(file.data(), kSegmentMagic, sizeof(kSegmentMagic)) != 0) {
    return Bad("segment header has a wrong magic");
  }
  if (Xxh3(file.substr(0, 32)) != GetU64(file.data() + 32)) {
    return Bad("segment header checksum mismatch");
  }
  return SegmentHeader{GetU64(file.data() + 8), GetU64(file.data() + 16), GetU64(file.data() + 24)};
}

namespace {
constexpr char kSealMagic[8] = {'I', 'Q', 'S', 'E', 'A', 'L', '0', '1'};
}  // namespace

std::string EncodeSeal(const Seal& seal) {
  std::string out(kSealMagic, sizeof(kSealMagic));
  PutU64(out, seal.store_id);
  PutU64(out, seal.salt);
  PutU64(out, seal.first_tx);
  PutU64(out, seal.last_tx);
  PutU64(out, seal.bytes);
  out.append(reinterpret_cast<const char*>(seal.head_hash.data()), seal.head_hash.size());
  PutU64(out, seal.segment_sum);
  PutU64(out, Xxh3(out));
  return out;
}

std::optional<Seal> DecodeSeal(std::string_view file) {
  if (file.size() != kSealBytes || std::memcmp(file.data(), kSealMagic, sizeof(kSealMagic)) != 0 ||
      Xxh3(file.substr(0, kSealBytes - 8)) != GetU64(file.data() + kSealBytes - 8)) {
    return std::nullopt;
  }
  Seal s;
  s.store_id = GetU64(file.data() + 8);
  s.salt = GetU64(file.data() + 16);
  s.first_tx = GetU64(file.data() + 24);
  s.last_tx = GetU64(file.data() + 32);
  s.bytes = GetU64(file.data() + 40);
  std::memcpy(s.head_hash.data(), file.data() + 48, 32);
  s.segment_sum = GetU64(file.data() + 80);
  return s;
}

Hash AppendFrame(std::string& out, std::uint64_t salt, const Record& record) {
  const std::size_t start = out.size();
  out.resize(start + kFrameHeaderBytes);  // filled in below
  PutU64(out, record.tx_id);
  out.append(reinterpret_cast<const char*>(record.prev_hash.data()), record.prev_hash.size());
  PutU32(out, static_cast<std::uint32_t>(record.ops.size()));
  for (const Op& op : record.ops) {
    PutU8(out, static_cast<std::uint8_t>(op.op));
    PutU32(out, static_cast<std::uint32_t>(op.key.size()));
    PutU32(out, static_cast<std::uint32_t>(op.value.size()));
    out += op.key;
    out += op.value;
  }
  const std::string_view payload(out.data() + start + kFrameHeaderBytes,
                                 out.size() - start - kFrameHeaderBytes);
  std::string header;
  PutU32(header, kFrameMagic);
  PutU32(header, static_cast<std::uint32_t>(payload.size()));
  PutU64(header, salt);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_state_t* st = &state;
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header.data(), header.size());
  XXH3_64bits_update(st, payload.data(), payload.size());
  PutU64(header, XXH3_64bits_digest(st));
  std::memcpy(out.data() + start, header.data(), kFrameHeaderBytes);
  return Sha256(payload);
}

DecodedFrame DecodeFrame(std::string_view data, std::size_t offset, std::uint64_t salt,
                         bool header_only) {
  DecodedFrame f;
  if (offset > data.size() || data.size() - offset < kFrameHeaderBytes) {
    f.status = FrameStatus::kTruncated;
    f.why = "frame header cut short";
    return f;
  }
  const char* h = data.data() + offset;
  if (GetU32(h) != kFrameMagic) {
    f.why = "wrong frame magic";
    return f;
  }
  const std::uint32_t len = GetU32(h + 4);
  if (len > kMaxPayloadBytes || len < 8 + 32 + 4) {
    f.why = "frame length " + std::to_string(len) + " out of range";
    return f;
  }
  if (GetU64(h + 8) != salt) {
    f.why = "frame salt is not this segment's";
    return f;
  }
  if (data.size() - offset - kFrameHeaderBytes < len) {
    f.status = FrameStatus::kTruncated;
    f.why = "frame payload cut short";
    return f;
  }
  const std::string_view payload = data.substr(offset + kFrameHeaderBytes, len);
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_state_t* st = &state;
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, h, 16);
  XXH3_64bits_update(st, payload.data(), payload.size());
  const std::uint64_t sum = XXH3_64bits_digest(st);
  if (sum != GetU64(h + 16)) {
    f.why = "frame checksum mismatch";
    return f;
  }
  Reader r(payload);
  std::string_view prev;
  std::uint32_t n = 0;
  if (!r.U64(f.record.tx_id) || !r.Bytes(32, prev) || !r.U32(n)) {
    f.why = "frame payload header malformed";
    return f;
  }
  std::memcpy(f.record.prev_hash.data(), prev.data(), 32);
  if (header_only) {
    f.status = FrameStatus::kOk;
    f.size = kFrameHeaderBytes + len;
    return f;
  }
  if (n == 0 || n > len / 9) {
    f.why = "frame op count " + std::to_string(n) + " out of range";
    return f;
  }
  f.record.ops.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint8_t op = 0;
    std::uint32_t klen = 0, vlen = 0;
    std::string_view k, v;
    if (!r.U8(op) || !r.U32(klen) || !r.U32(vlen) || !r.Bytes(klen, k) || !r.Bytes(vlen, v)) {
      f.why = "frame op " + std::to_string(i) + " cut short";
      return f;
    }
    if (op < 1 || op > 3 || klen == 0 || (op == 3 && vlen != 0)) {
      f.why = "frame op " + std::to_string(i) + " malformed";
      return f;
    }
    f.record.ops.push_back(Op{static_cast<OpCode>(op), std::string(k), std::string(v)});
  }
  if (!r.done()) {
    f.why = "frame payload has trailing bytes";
    return f;
  }
  f.status = FrameStatus::kOk;
  f.size = kFrameHeaderBytes + len;
  f.hash = Sha256(payload);
  return f;
}

std::optional<CoveredFrame> ReadCoveredFrame(std::string_view data, std::size_t offset,
                                             std::size_t end) {
  // payload: tx_id u64 | prev_hash [32] | op_count u32 (1) | op u8 | key_len u32 |
  // value_len u32 | key | value
  constexpr std::size_t kFixed = 8 + 32 + 4 + 1 + 4 + 4;
  end = std::min(end, data.size());
  if (offset > end || end - offset < kFrameHeaderBytes + kFixed) return std::nullopt;
  const char* h = data.data() + offset;
  if (GetU32(h) != kFrameMagic) return std::nullopt;
  const std::uint32_t len = GetU32(h + 4);
  if (len < kFixed || len > end - offset - kFrameHeaderBytes) return std::nullopt;
  const char* p = h + kFrameHeaderBytes;
  const auto op = static_cast<std::uint8_t>(p[44]);
  const std::uint32_t klen = GetU32(p + 45);
  const std::uint32_t vlen = GetU32(p + 49);
  if (GetU32(p + 40) != 1 || op < 1 || op > 3 || klen == 0 ||
      static_cast<std::uint64_t>(klen) + vlen != len - kFixed) {
    return std::nullopt;
  }
  CoveredFrame f;
  f.size = kFrameHeaderBytes + len;
  f.tx_id = GetU64(p);
  f.prev_hash = std::string_view(p + 8, 32);
  f.op = static_cast<OpCode>(op);
  f.key = std::string_view(p + kFixed, klen);
  f.value = std::string_view(p + kFixed + klen, vlen);
  return f;
}

std::optional<std::size_t> FindNextFrame(std::string_view data, std::size_t from,
                                         std::uint64_t salt) {
  unsigned char magic[4];
  for (int i = 0; i < 4; ++i) magic[i] = static_cast<unsigned char>((kFrameMagic >> (8 * i)) & 0xff);
  for (std::size_t off = from; off + kFrameHeaderBytes <= data.size(); ++off) {
    const void* hit = std::memchr(data.data() + off, magic[0], data.size() - off);
    if (hit == nullptr) return std::nullopt;
    off = static_cast<std::size_t>(static_cast<const char*>(hit) - data.data());
    if (off + kFrameHeaderBytes > data.size()) return std::nullopt;
    if (std::memcmp(data.data() + off, magic, 4) != 0) continue;
    if (DecodeFrame(data, off, salt).status == FrameStatus::kOk) return off;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> EncodeCheckpoint(const Checkpoint& c, int level) {
  std::string raw;
  for (const CheckpointEntry& e : c.entries) {
    PutU8(raw, e.tombstone ? 2 : 1);
    PutU32(raw, static_cast<std::uint32_t>(e.key.size()));
    PutU32(raw, static_cast<std::uint32_t>(e.value.size()));
    raw += e.key;
    raw += e.value;
  }
  std::string out(kCheckpointMagic, sizeof(kCheckpointMagic));
  PutU8(out, static_cast<std::uint8_t>(c.kind));
  out.append(7, '\0');
  PutU64(out, c.store_id);
  PutU64(out, c.tx);
  PutU64(out, c.base_tx);
  out.append(reinterpret_cast<const char*>(c.chain_hash.data()), c.chain_hash.size());
  PutU64(out, c.entries.size());
  PutU64(out, raw.size());
  const std::size_t bound = ZSTD_compressBound(raw.size());
  const std::size_t at = out.size();
  out.resize(at + bound);
  const std::size_t n = ZSTD_compress(out.data() + at, bound, raw.data(), raw.size(), level);
  if (ZSTD_isError(n)) {
    return absl::InternalError(std::string("zstd compression of a checkpoint failed: ") +
                               ZSTD_getErrorName(n));
  }
  out.resize(at + n);
  PutU64(out, Xxh3(out));
  return out;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view file, std::uint64_t max_raw_bytes) {
  if (file.size() < kCheckpointHeaderBytes + 8) {
    return Bad("checkpoint is " + std::to_string(file.size()) + " bytes, shorter than its header");
  }
  if (std::memcmp(file.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0) {
    return Bad("checkpoint has a wrong magic");
  }
  const std::string_view body = file.substr(0, file.size() - 8);
  if (Xxh3(body) != GetU64(file.data() + file.size() - 8)) {
    return Bad("checkpoint checksum mismatch (torn or damaged file)");
  }
  Reader r(body);
  std::string_view magic, pad, hash;
  std::uint8_t kind = 0;
  Checkpoint c;
  std::uint64_t count = 0, raw_bytes = 0;
  r.Bytes(8, magic);
  r.U8(kind);
  r.Bytes(7, pad);
  r.U64(c.store_id);
  r.U64(c.tx);
  r.U64(c.base_tx);
  r.Bytes(32, hash);
  r.U64(count);
  r.U64(raw_bytes);
  if (kind > 1) return Bad("checkpoint kind " + std::to_string(kind) + " unknown");
  c.kind = static_cast<CheckpointKind>(kind);
  std::memcpy(c.chain_hash.data(), hash.data(), 32);
  if (c.tx == 0) return Bad("checkpoint tx_id is 0");
  if (c.kind == CheckpointKind::kFull ? c.base_tx != 0 : c.base_tx >= c.tx) {
    return Bad("checkpoint base tx_id " + std::to_string(c.base_tx) + " inconsistent with tx_id " +
               std::to_string(c.tx));
  }
  const std::string_view z = body.substr(r.pos());
  const unsigned long long content = ZSTD_getFrameContentSize(z.data(), z.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
      content != raw_bytes || raw_bytes > max_raw_bytes || count > raw_bytes / 9 + 1) {
    return Bad("checkpoint body sizes inconsistent (" + std::to_string(raw_bytes) + " bytes, " +
               std::to_string(count) + " entries)");
  }
  std::string raw(raw_bytes, '\0');
  const std::size_t n = ZSTD_decompress(raw.data(), raw.size(), z.data(), z.size());
  if (ZSTD_isError(n) || n != raw_bytes) return Bad("checkpoint body does not decompress");
  Reader e(raw);
  c.entries.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint8_t k = 0;
    std::uint32_t klen = 0, vlen = 0;
    std::string_view key, value;
    if (!e.U8(k) || !e.U32(klen) || !e.U32(vlen) || !e.Bytes(klen, key) || !e.Bytes(vlen, value) ||
        (k != 1 && k != 2) || klen == 0 || (k == 2 && vlen != 0)) {
      return Bad("checkpoint entry " + std::to_string(i) + " malformed");
    }
    if (k == 2 && c.kind == CheckpointKind::kFull) {
      return Bad("full checkpoint holds a tombstone (entry " + std::to_string(i) + ")");
    }
    c.entries.push_back(CheckpointEntry{k == 2, std::string(key), std::string(value)});
  }
  if (!e.done()) return Bad("checkpoint body has trailing bytes");
  return c;
}

std::string SegmentName(std::uint64_t first_tx) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "wal-%020" PRIu64 ".log", first_tx);
  return buf;
}

std::string CheckpointName(std::uint64_t tx, CheckpointKind kind) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ckpt-%020" PRIu64 "-%s.zst", tx,
                kind == CheckpointKind::kFull ? "full" : "incr");
  return buf;
}

namespace {
std::optional<std::uint64_t> Digits20(std::string_view s) {
  if (s.size() != 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}
}  // namespace

std::optional<std::uint64_t> ParseSegmentName(std::string_view name) {
  if (name.size() != 28 || name.substr(0, 4) != "wal-" || name.substr(24) != ".log") {
    return std::nullopt;
  }
  return Digits20(name.substr(4, 20));
}

std::optional<CheckpointFileName> ParseCheckpointName(std::string_view name) {
  if (name.size() != 34 || name.substr(0, 5) != "ckpt-" || name[25] != '-' ||
      name.substr(30) != ".zst") {
    return std::nullopt;
  }
  const auto tx = Digits20(name.substr(5, 20));
  if (!tx) return std::nullopt;
  const std::string_view kind = name.substr(26, 4);
  if (kind == "full") return CheckpointFileName{*tx, CheckpointKind::kFull};
  if (kind == "incr") return CheckpointFileName{*tx, CheckpointKind::kIncremental};
  return std::nullopt;
}

}  // namespace inferq::state_internal
