// Private to src/state (and the fuzz targets): the byte formats of the Delta-State
// Log — segment headers, frames, checkpoint files — and their codecs. All integers
// are little-endian.
//
// File `IDENTITY`: "inferq-state <store id, 16 hex digits>\n", written once when
//   the directory is created. Every segment and checkpoint carries the store id, so
//   a file copied in from another store's directory is refused, not mixed in.
// Segment file `wal-<first tx_id, 20 digits>.log`:
//   header (40 bytes): magic "IQWALSG2" | store_id u64 | salt u64 | first_tx u64 |
//   XXH3-64 of the previous 32 bytes; then frames back to back, then zeros (space
//   the writer fills ahead).
// Frame (one committed transaction):
//   magic u32 'IQF1' | payload_len u32 | salt u64 | XXH3-64 over the first 16 bytes
//   and the payload | payload
//   payload: tx_id u64 | prev_hash [32] | op_count u32 |
//            op_count x { op u8 (1 create, 2 update, 3 delete) | key_len u32 |
//                         value_len u32 | key | value }
//   The record's hash is SHA-256 of the payload, which holds the previous record's
//   hash: editing, dropping or reordering a record breaks the chain at the next one.
//   The salt is the segment's (random per segment file): a frame left in a file by
//   an older use is never accepted. The checksum tells a torn or damaged frame from
//   a good one; where the damage sits (tail or middle) is decided by the reader.
// Checkpoint file `ckpt-<tx_id, 20 digits>-<full|incr>.zst` (written as `.tmp`,
//   synced, then renamed):
//   magic "IQCKPT02" | kind u8 (0 full, 1 incremental) | 7 zero bytes | store_id u64 | tx u64 |
//   base_tx u64 (incremental: tx of the checkpoint it applies on; full: 0) |
//   chain_hash [32] (hash of record tx) | entry_count u64 | raw_bytes u64 |
//   zstd frame of the entries | XXH3-64 of everything before it (8 bytes).
//   entry: kind u8 (1 put, 2 tombstone) | key_len u32 | value_len u32 | key | value
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferq::state_internal {

using Hash = std::array<unsigned char, 32>;

inline constexpr std::size_t kSegmentHeaderBytes = 40;
inline constexpr std::size_t kFrameHeaderBytes = 24;
inline constexpr std::uint32_t kFrameMagic = 0x31465149;  // "IQF1"
inline constexpr std::uint32_t kMaxPayloadBytes = 1u << 30;
inline constexpr std::size_t kMaxKeyBytes = 64 * 1024;
inline constexpr std::size_t kMaxValueBytes = 256u << 20;

enum class OpCode : std::uint8_t { kCreate = 1, kUpdate = 2, kDelete = 3 };

struct Op {
  OpCode op;
  std::string key;
  std::string value;  // empty for kDelete
};

struct Record {
  std::uint64_t tx_id = 0;
  Hash prev_hash{};
  std::vector<Op> ops;
};

// SHA-256 (OpenSSL) of `bytes`.
Hash Sha256(std::string_view bytes);
std::string HashHex(const Hash& h);
std::uint64_t Xxh3(std::string_view bytes);

// The IDENTITY file.
std::string EncodeIdentity(std::uint64_t store_id);
// A store id as the IDENTITY file writes it: 16 lowercase hex digits.
std::string StoreIdHex(std::uint64_t store_id);
// kDataLoss naming what is wrong when `file` is not an IDENTITY file.
absl::StatusOr<std::uint64_t> DecodeIdentity(std::string_view file);

// Segment header.
std::string EncodeSegmentHeader(std::uint64_t store_id, std::uint64_t salt,
                                std::uint64_t first_tx);
struct SegmentHeader {
  std::uint64_t store_id = 0;
  std::uint64_t salt = 0;
  std::uint64_t first_tx = 0;
};
// Error (kDataLoss) when the header is short, has a wrong magic or checksum.
absl::StatusOr<SegmentHeader> DecodeSegmentHeader(std::string_view file);

// Seal of a StreamLog segment (`log-<first tx_id, 20 digits>.seal`), written once
// the segment is full and fdatasync'ed (stream_log.hpp, Recovery):
//   magic "IQSEAL01" | store_id u64 | salt u64 | first_tx u64 | last_tx u64 |
//   bytes u64 (end of the last frame) | head_hash [32] (hash of record last_tx) |
//   XXH3-64 of the segment's bytes [0, bytes) | XXH3-64 of the previous 88 bytes.
inline constexpr std::size_t kSealBytes = 96;
struct Seal {
  std::uint64_t store_id = 0;
  std::uint64_t salt = 0;
  std::uint64_t first_tx = 0;
  std::uint64_t last_tx = 0;
  std::uint64_t bytes = 0;
  Hash head_hash{};
  std::uint64_t segment_sum = 0;
};
std::string EncodeSeal(const Seal& seal);
// nullopt when `file` is not a whole seal with a good checksum.
std::optional<Seal> DecodeSeal(std::string_view file);

// Appends the frame of `record` to `out`; returns the record's hash.
Hash AppendFrame(std::string& out, std::uint64_t salt, const Record& record);

enum class FrameStatus {
  kOk,         // a whole frame with this salt, a good checksum and a well-formed payload
  kTruncated,  // fewer bytes left than the header or the payload needs
  kBad,        // wrong magic, length, salt or checksum, or a malformed payload
};
struct DecodedFrame {
  FrameStatus status = FrameStatus::kBad;
  std::size_t size = 0;  // bytes of the frame (header + payload) when kOk
  Record record;         // when kOk
  Hash hash{};           // SHA-256 of the payload, when kOk
  std::string why;       // when not kOk
};
// Decodes the frame at `data[offset]`; never reads outside `data`. With
// `header_only`, checks magic, length, salt and checksum and reads the tx_id, but
// neither parses the ops nor computes the SHA-256 (records a checkpoint covers).
DecodedFrame DecodeFrame(std::string_view data, std::size_t offset, std::uint64_t salt,
                         bool header_only = false);
// A frame of one op, read without checking its checksum or computing its hash: for
// bytes a larger checksum already covers (a sealed StreamLog segment). nullopt when
// the bytes at `offset` (before `end`) are not a whole frame of magic, length, and
// a payload of exactly one op.
struct CoveredFrame {
  std::size_t size = 0;  // header + payload
  std::uint64_t tx_id = 0;
  std::string_view prev_hash;  // 32 bytes
  OpCode op = OpCode::kCreate;
  std::string_view key;
  std::string_view value;
};
std::optional<CoveredFrame> ReadCoveredFrame(std::string_view data, std::size_t offset,
                                             std::size_t end);
// The offset of the first well-formed frame with `salt` at or after `from`, if any
// (used to tell a torn tail from damage followed by good frames).
std::optional<std::size_t> FindNextFrame(std::string_view data, std::size_t from,
                                         std::uint64_t salt);

// Checkpoints.
enum class CheckpointKind : std::uint8_t { kFull = 0, kIncremental = 1 };
struct CheckpointEntry {
  bool tombstone = false;
  std::string key;
  std::string value;
};
struct Checkpoint {
  CheckpointKind kind = CheckpointKind::kFull;
  std::uint64_t store_id = 0;
  std::uint64_t tx = 0;
  std::uint64_t base_tx = 0;
  Hash chain_hash{};
  std::vector<CheckpointEntry> entries;
};
// The file bytes of a checkpoint (entries zstd-compressed at `level`).
absl::StatusOr<std::string> EncodeCheckpoint(const Checkpoint& c, int level = 3);
// Parses and verifies a checkpoint file; kDataLoss naming what is wrong. The whole
// input is checked (checksum first), so a torn or edited file is always rejected.
// A checkpoint that claims more than `max_raw_bytes` of entries is refused before
// anything is allocated for them.
inline constexpr std::uint64_t kMaxCheckpointRawBytes = std::uint64_t{16} << 30;
absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view file,
                                            std::uint64_t max_raw_bytes = kMaxCheckpointRawBytes);

// File names.
std::string SegmentName(std::uint64_t first_tx);
std::string CheckpointName(std::uint64_t tx, CheckpointKind kind);
std::optional<std::uint64_t> ParseSegmentName(std::string_view name);
struct CheckpointFileName {
  std::uint64_t tx = 0;
  CheckpointKind kind = CheckpointKind::kFull;
};
std::optional<CheckpointFileName> ParseCheckpointName(std::string_view name);

}  // namespace inferq::state_internal
