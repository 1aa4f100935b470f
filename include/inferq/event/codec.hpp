// File: inferq/event/codec.hpp
//
// Payload codecs. zstd (RFC 8878) through libzstd; the codec of a payload is an
// attribute of its event, so consumers can ask for raw bytes or accept compressed
// ones. Also used to read zstd-compressed files such as the bundled trace.
//
// Usage:
//   absl::StatusOr<std::string> z = inferq::ZstdCompress(raw, /*level=*/3);
//   absl::StatusOr<std::string> back = inferq::ZstdDecompress(*z);
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace inferq {

// Compresses `input` as one zstd frame at `level` (1..22; ZSTD_maxCLevel()).
// InvalidArgument when `level` is outside 1..22.
absl::StatusOr<std::string> ZstdCompress(std::string_view input, int level = 3);

// Decompresses one or more concatenated zstd frames (streaming, so frames without a
// recorded content size work too).
// Errors: InvalidArgument when `input` is not zstd data or is corrupt (the message
// names libzstd's reason and the input offset), DataLoss when the input ends inside
// a frame (truncated), ResourceExhausted when the output would exceed `max_output`
// bytes (a guard against decompression bombs; default 1 GiB).
absl::StatusOr<std::string> ZstdDecompress(std::string_view input,
                                           std::size_t max_output = std::size_t{1} << 30);

}  // namespace inferq
