// File: examples/inference_server/trace.hpp
//
// Reads the Azure LLM inference trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens),
// plain or zstd-compressed. Every malformed row is an error that names the line and
// the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferq::example {

struct TraceRequest {
  std::int64_t arrival_us = 0;      // since the first request of the trace
  std::uint32_t context_tokens = 0;
  std::uint32_t generated_tokens = 0;
};

// Parses CSV text. `source` names the input in error messages. The header must be
// "TIMESTAMP,ContextTokens,GeneratedTokens"; TIMESTAMP is "YYYY-MM-DD HH:MM:SS[.f]"
// (UTC, up to 9 fractional digits) and never earlier than the row before; both token
// counts are integers in 1..1,000,000. CRLF line ends and a missing final newline
// are accepted; blank lines are not. InvalidArgument on any violation, e.g.
// "trace.csv line 7: field GeneratedTokens 'x1' is not an integer"; the value (or
// line) is quoted as inferq::QuoteValue does: control bytes, 0x7f and ' as \xNN
// ("'1\x00x'"), so a NUL or a newline in the input never cuts the message.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(std::string_view csv, std::string_view source);

// Reads `path` (zstd-compressed when it starts with the zstd magic number) and parses
// it. NotFound when the file cannot be opened; the errors of ZstdDecompress and
// ParseTrace otherwise.
absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path);

// The bytes of the regular file `path`, decompressed when they begin with zstd's
// magic number: the examples' input files. InvalidArgument naming the path for
// anything but a regular file (a directory, a FIFO, a device: never waits on a
// FIFO, never reads /dev/zero until memory runs out) or a file over `max_bytes`
// (before or after decompression); NotFound when it cannot be opened.
absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::size_t max_bytes);

// Checks that `path` may be written by an example's --json option at the end of a
// run, without creating or truncating it: OK for a new file in an existing
// directory, a regular file or a character device (/dev/null); InvalidArgument
// naming it for a directory, a FIFO (opening it would wait for a reader), a socket
// or a missing directory.
absl::Status CheckOutputPath(const std::string& path);

}  // namespace inferq::example
