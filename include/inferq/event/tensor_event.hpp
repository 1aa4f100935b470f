// File: inferq/event/tensor_event.hpp
//
// TensorEvent: the wire form of an Event (DESIGN.md §3.3) when it leaves memory
// (durable streams, bridges, files). A FlatBuffers table (schemas/tensor_event.fbs,
// file identifier "IQTE") with an explicit field id for every attribute of Event;
// the payload is stored raw or zstd-compressed (the codec is a field of the wire
// form). Decode treats its input as untrusted: it always runs the FlatBuffers
// Verifier with bounded depth and table count and checks every enum value, so a
// corrupt buffer gives an error naming what failed, never undefined behaviour.
//
// Usage:
//   absl::StatusOr<inferq::Buffer> wire =
//       inferq::Encode(event, {.codec = inferq::PayloadCodec::kZstd});
//   if (!wire.ok()) return wire.status();
//   absl::StatusOr<inferq::Event> back = inferq::Decode(wire->span());
//
// Times: `created` and `deadline` travel as int64 nanoseconds since the Unix epoch,
// with INT64_MIN for absl::InfinitePast() and INT64_MAX for absl::InfiniteFuture();
// `ttl` as int64 nanoseconds, INT64_MAX for absl::InfiniteDuration(). Sub-nanosecond
// parts of a time or duration are truncated toward negative infinity (absl's
// ToUnixNanos / ToInt64Nanoseconds), so a round trip is exact for whole nanoseconds.
//
// Not yet supported: trained zstd dictionaries. Encode has no dictionary option, and
// Decode returns Unimplemented for a payload whose dictionary_id is not 0.
//
// Thread safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

namespace inferq {

// How a TensorEvent stores its payload (the wire enum Codec).
enum class PayloadCodec : std::uint8_t { kNone = 0, kZstd = 1 };

struct EncodeOptions {
  PayloadCodec codec = PayloadCodec::kNone;
  // zstd compression level, 1..22 (ZSTD_maxCLevel()); read only for kZstd.
  int zstd_level = 3;
};

struct DecodeOptions {
  // Largest payload, in bytes after decompression, that Decode produces (a guard
  // against decompression bombs). Default 256 MiB.
  std::size_t max_payload_bytes = std::size_t{256} << 20;
  // FlatBuffers Verifier bounds: nesting depth of tables and vectors, and number of
  // tables (the root, plus one per header). A TensorEvent nests 3 deep.
  std::uint32_t max_depth = 16;
  std::uint32_t max_tables = 4096;
};

// Encodes `event` as a finished TensorEvent FlatBuffer (with its file identifier),
// compressing the payload as `options.codec` says. An empty payload is stored empty
// and uncompressed whatever the codec.
// Errors (InvalidArgument, naming the field and value): `created` or `deadline` a
// finite time outside the int64-nanosecond range, or `ttl` negative or finite beyond
// it; a zstd level outside 1..22. Internal when libzstd fails.
absl::StatusOr<Buffer> Encode(const Event& event, const EncodeOptions& options = {});

// Decodes a TensorEvent from `bytes` (any alignment: a misaligned input is copied
// once into aligned storage). The returned Event owns copies of everything, so
// `bytes` may be released after the call; its payload is decompressed.
// Errors:
//   InvalidArgument: fewer than 8 bytes, or the file identifier is not "IQTE" (the
//     message shows the 4 bytes found, escaped).
//   DataLoss: the FlatBuffers Verifier rejects the buffer (bad offsets, sizes,
//     strings, depth beyond max_depth or tables beyond max_tables); the shape
//     vector's int64 elements are not 8-byte aligned; an enum field
//     (qos, dtype, codec) holds an unknown value; ttl_ns is negative; a header name
//     is repeated; zstd fails (the message carries libzstd's); the decompressed size
//     differs from uncompressed_size; a raw payload declares an uncompressed_size.
//   ResourceExhausted: uncompressed_size exceeds max_payload_bytes (names both).
//   Unimplemented: the payload needs a zstd dictionary (dictionary_id != 0).
absl::StatusOr<Event> Decode(std::span<const std::byte> bytes, const DecodeOptions& options = {});

}  // namespace inferq
