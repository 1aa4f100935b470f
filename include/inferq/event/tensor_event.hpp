/// @file inferq/event/tensor_event.hpp
///
/// TensorEvent: the wire form of an Event when it leaves memory
/// (durable streams, bridges, files). A FlatBuffers table (schemas/tensor_event.fbs,
/// file identifier "IQTE") with an explicit field id for every attribute of Event;
/// the payload is stored raw or zstd-compressed (the codec is a field of the wire
/// form). Decode treats its input as untrusted: it always runs the FlatBuffers
/// Verifier with bounded depth and table count and checks every enum value, so a
/// corrupt buffer gives an error naming what failed, never undefined behaviour.
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::Buffer> wire =
///       inferq::Encode(event, {.codec = inferq::PayloadCodec::kZstd});
///   if (!wire.ok()) return wire.status();
///   absl::StatusOr<inferq::Event> back = inferq::Decode(wire->span());
///   // Small payloads with a trained dictionary (ZstdDictionary::Train):
///   auto small = inferq::Encode(event, {.codec = inferq::PayloadCodec::kZstd,
///                                       .dictionary = dict.get()});
///   auto again = inferq::Decode(small->span(), {.dictionaries = &dicts});
/// @endcode
///
/// Times: `created` and `deadline` travel as int64 nanoseconds since the Unix epoch,
/// with INT64_MIN for absl::InfinitePast() and INT64_MAX for absl::InfiniteFuture();
/// `ttl` as int64 nanoseconds, INT64_MAX for absl::InfiniteDuration(). Sub-nanosecond
/// parts of a time or duration are truncated toward negative infinity (absl's
/// ToUnixNanos / ToInt64Nanoseconds), so a round trip is exact for whole nanoseconds.
///
/// Payload codecs (event/codec.hpp): Event::codec and Event::dictionary_id say how the
/// in-memory payload is stored. Encode writes a payload that is already in the
/// requested codec and dictionary through as it is (no recompression), and transcodes
/// it otherwise. Decode decompresses, or with keep_compressed hands the payload over
/// still compressed (the Event then carries codec kZstd and its dictionary_id). A
/// payload compressed with a trained dictionary records the dictionary's id in the
/// wire field dictionary_id (and in its zstd frame header); the decoder needs the
/// dictionary in DecodeOptions::dictionaries, unless it keeps the payload compressed.
///
/// Thread safety: free functions without shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

namespace inferq {

// PayloadCodec (the wire enum Codec) is defined in event.hpp.

/// How Encode stores the payload.
struct EncodeOptions {
  /// How the wire form stores the payload.
  PayloadCodec codec = PayloadCodec::kNone;
  /// zstd compression level, 1..22 (ZSTD_maxCLevel()); read only for kZstd without a
  /// dictionary (a dictionary compresses at its own level).
  int zstd_level = 3;
  /// kZstd: compress with this dictionary (its id goes into dictionary_id); nullptr =
  /// none. Must outlive the call.
  const ZstdDictionary* dictionary = nullptr;
  /// Where an event whose payload is compressed with a dictionary (Event::dictionary_id
  /// != 0) finds it, when Encode has to transcode that payload; nullptr = none.
  const ZstdDictionaries* dictionaries = nullptr;
};

/// Decode's limits, dictionaries, and whether it decompresses the payload.
struct DecodeOptions {
  /// Largest payload, in bytes after decompression, that Decode produces (a guard
  /// against decompression bombs). Default 256 MiB.
  std::size_t max_payload_bytes = std::size_t{256} << 20;
  /// FlatBuffers Verifier bounds: nesting depth of tables and vectors, and number of
  /// tables (the root, plus one per header). A TensorEvent nests 3 deep.
  ///@{
  std::uint32_t max_depth = 16;
  std::uint32_t max_tables = 4096;
  ///@}
  /// Dictionaries for payloads compressed with one (wire dictionary_id != 0); nullptr
  /// = none. Not needed with keep_compressed.
  const ZstdDictionaries* dictionaries = nullptr;
  /// "Accept compressed": a zstd payload is not decompressed; the Event keeps it as
  /// stored, with codec kZstd and the dictionary_id. Decode still checks its frame
  /// headers (content size against uncompressed_size and max_payload_bytes,
  /// dictionary id against dictionary_id), not the compressed blocks: corruption in
  /// them shows when the payload is decompressed.
  bool keep_compressed = false;
};

/// Encodes `event` as a finished TensorEvent FlatBuffer (with its file identifier),
/// storing the payload as `options.codec` and `options.dictionary` say
/// (TranscodePayload): a payload already in that form (Event::codec and
/// dictionary_id) is written through byte for byte, without recompression; its
/// uncompressed_size is read from its zstd frame headers. An empty payload is stored
/// empty and uncompressed whatever the codec.
/// Errors (InvalidArgument, naming the field and value): `created` or `deadline` a
/// finite time outside the int64-nanosecond range, or `ttl` negative or finite beyond
/// it; a zstd level outside 1..22; options.codec not a PayloadCodec, or a dictionary
/// with codec kNone; the event's codec invalid, or kNone with a dictionary_id; a zstd
/// payload whose frames are invalid, do not record their content size, or name
/// another dictionary than Event::dictionary_id; an event whose stored payload and
/// fields reach 1 GiB (half of FlatBuffers' 2 GiB buffer limit). NotFound when the payload must be
/// transcoded and needs a dictionary options.dictionaries lacks (names the id); the
/// other errors of TranscodePayload (DataLoss, ResourceExhausted) when its zstd
/// payload cannot be decompressed. Internal when libzstd fails.
absl::StatusOr<Buffer> Encode(const Event& event, const EncodeOptions& options = {});

/// Decodes a TensorEvent from `bytes` (any alignment: a misaligned input is copied
/// once into aligned storage). The returned Event owns copies of everything, so
/// `bytes` may be released after the call; its payload is decompressed (codec kNone),
/// or kept compressed with options.keep_compressed.
/// Errors:
///  - InvalidArgument: fewer than 8 bytes; 2^31 - 1 bytes or more (FlatBuffers'
///     largest buffer); or the file identifier is not "IQTE" (the message shows the 4
///     bytes found, escaped).
///  - DataLoss: the FlatBuffers Verifier rejects the buffer (bad offsets, sizes,
///     strings, depth beyond max_depth or tables beyond max_tables); the shape
///     vector's int64 elements are not 8-byte aligned; an enum field
///     (qos, dtype, codec) holds an unknown value; ttl_ns is negative; a header name
///     is repeated; zstd fails (the message carries libzstd's); the decompressed size
///     differs from uncompressed_size; a raw payload declares an uncompressed_size or a
///     dictionary_id; the zstd frame header names another dictionary than the
///     dictionary_id field; with keep_compressed, frame headers that are invalid,
///     lack a content size, or sum to another size than uncompressed_size.
///  - ResourceExhausted: uncompressed_size exceeds max_payload_bytes (names both).
///  - NotFound: the payload was compressed with zstd dictionary dictionary_id and
///     options.dictionaries lacks it (names the id); never with keep_compressed.
absl::StatusOr<Event> Decode(std::span<const std::byte> bytes, const DecodeOptions& options = {});

}  // namespace inferq
