/// @file inferq/schema/schema_reader.hpp
///
/// SchemaReader: schema-on-read for FlatBuffers payloads. A consumer
/// declares the version of a subject it reads; events written with older or newer
/// versions of that subject are read through reflection, as the reader's version sees
/// them. The registry keeps each version's binary schema (a reflection::Schema: what
/// `flatc -b --schema` writes; SchemaRegistry computes the same bytes with
/// Parser::Serialize).
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::SchemaReader> reader = registry.Reader("infer.request", 2);
///   // for each event (schema_id / schema_version set by its producer):
///   absl::StatusOr<inferq::Record> r = reader->Read(message.event());
///   if (!r.ok()) { ... r.status().code() == absl::StatusCode::kDataLoss: corrupt ... }
/// @endcode
///
/// How a payload written with version W is read as version R (FlatBuffers evolves a
/// table by field id, the slot in its vtable, so fields are matched by id, never by
/// name: a renamed field keeps its value under the reader's name):
///  1. The payload is verified against W's schema: every field W declares and does
///     not deprecate, walked through reflection with flatbuffers::Verifier's checks
///     (max depth 64, max 1,000,000 tables: FlatBuffers' defaults). Not with
///     flatbuffers::Verify from reflection.h: in FlatBuffers 2.0.8 it crashes on some
///     corrupt buffers. Only fields W declares (and does not deprecate) are then read,
///     so every byte read has been verified.
///  2. For each field of R (deprecated ones left out), in id order: W has a field with
///     that id -> the buffer's value, or, when the buffer does not hold it, R's
///     default (FieldOrigin::kAbsent); W lacks the id or deprecated it -> R's default
///     (kNotInWriter). Defaults are R's: a scalar's declared default; null for an
///     optional scalar, a string, a vector, a table or a struct.
///  3. Fields W wrote that R lacks or deprecated are skipped (Record::skipped names
///     them). Nested tables (and vectors of tables) are resolved the same way, by
///     the types the two versions give the field.
///
/// A field both versions have must have the same type in both (no int -> long
/// promotion: FlatBuffers stores them at different sizes); structs must have the same
/// layout. Parser::ConformTo, which the registry runs under every mode but NONE,
/// guarantees this for consecutive versions; the reader checks it for every pair.
///
/// Errors: kNotFound naming the subject and version when either is not registered;
/// kFailedPrecondition naming the field when the versions give a field different
/// types (possible under NONE or between versions the mode did not compare), and when
/// a version declares no root_type; kUnimplemented naming the field for unions and
/// fixed-length arrays, which this reader does not read; kDataLoss naming the
/// subject, version, root table and size when the payload does not verify against
/// its writer's schema; kInvalidArgument when an event's schema_id is not the id the
/// registry gave its (subject, schema_version), or a binary schema (ReadFlatBuffer)
/// is not a valid reflection::Schema.
///
/// Thread safety: Read may be called from many threads at once (the resolution of
/// each writer version is computed once and cached under a mutex). A SchemaReader
/// refers to its SchemaRegistry, which must outlive it; copies share one cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"
#include "inferq/schema/record.hpp"

namespace inferq {

class SchemaRegistry;

/// Reads FlatBuffers payloads of a subject as one version of it sees them, whichever
/// version wrote them (see the file comment). Cheap to copy.
class SchemaReader {
 public:
  /// The subject and the version this reader reads as.
  ///@{
  const std::string& subject() const;
  std::uint32_t version() const;
  ///@}

  /// Reads `payload`, written with version `writer_version` of the subject.
  absl::StatusOr<Record> Read(std::span<const std::byte> payload,
                              std::uint32_t writer_version) const;
  /// Reads event.payload, written with version event.schema_version; event.schema_id
  /// must be the id the registry gave that version (kInvalidArgument otherwise).
  /// Read does not decompress: kInvalidArgument when event.codec is not kNone (a
  /// consumer gets raw payloads with ConsumerConfig::accept_codecs = {kNone}).
  absl::StatusOr<Record> Read(const Event& event) const;

 private:
  friend class SchemaRegistry;
  struct Impl;
  explicit SchemaReader(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// Reads `payload`, written with the binary schema `writer_bfbs`, as `reader_bfbs`
/// reads it (both reflection::Schema buffers, e.g. from `flatc -b --schema`), by the
/// rules above, without a registry or a cache. Errors as above; kInvalidArgument when
/// a binary schema does not verify as a reflection::Schema.
absl::StatusOr<Record> ReadFlatBuffer(std::span<const std::byte> payload,
                                      std::string_view writer_bfbs,
                                      std::string_view reader_bfbs);

}  // namespace inferq
