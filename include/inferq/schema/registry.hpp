/// @file inferq/schema/registry.hpp
///
/// SchemaRegistry: subjects -> ordered FlatBuffers schema versions with ids, and a
/// compatibility mode per subject that stops an incompatible producer schema before
/// it breaks consumers. Compatibility is decided by FlatBuffers' own
/// conformance rules, `flatbuffers::Parser::ConformTo` (what `flatc --conform` runs);
/// the modes and their names follow Confluent Schema Registry
/// (https://docs.confluent.io/platform/current/schema-registry/fundamentals/schema-evolution.html).
///
/// Usage:
/// @code
///   inferq::SchemaRegistry registry;                        // in memory
///   // or durable, rebuilt from a SchemaStore (schema_store.hpp), e.g. a StateStore's:
///   //   auto r = inferq::OpenSchemaRegistry(state_store);  // state/state_schema_store.hpp
///   absl::StatusOr<inferq::SchemaRef> v1 = registry.Register("tensor.events", fbs_v1);
///   registry.SetCompatibility("tensor.events", inferq::Compatibility::kFull);
///   absl::StatusOr<inferq::SchemaRef> v2 = registry.Register("tensor.events", fbs_v2);
///   // kFailedPrecondition when v2 does not conform, naming the versions compared.
///   absl::StatusOr<inferq::SchemaReader> reader = registry.Reader("tensor.events", 2);
///   absl::StatusOr<inferq::Record> r = reader->Read(event);  // written with v1 or v2
/// @endcode
///
/// What ConformTo checks (FlatBuffers 2.0.8), for every table/struct and enum that both
/// schemas define under the same fully qualified name: a field present in both by name
/// keeps its offset (id), its default and its type; a field present only in one schema
/// may not share its id with a field of a different type in the other ("renamed to a
/// different type"); an enum value present in both keeps its number. Removing a field,
/// renaming a field (same type), deprecating a field and appending a field conform.
/// Not checked by FlatBuffers: a struct's size (a field appended to a struct conforms,
/// although structs are stored inline), `required`, and removed fields whose id a later
/// version reuses (only the transitive modes compare against the versions before).
///
/// Thread safety: every member may be called from many threads at once (one mutex;
/// Register holds it across its SchemaStore write, so versions are numbered in the
/// order their writes complete).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inferq/schema/schema_reader.hpp"
#include "inferq/schema/schema_store.hpp"

namespace inferq {

/// Compatibility modes, as Confluent Schema Registry names them. "Conforms to" is
/// `Parser::ConformTo`: the schema on the left is a valid evolution of the one on the
/// right.
enum class Compatibility {
  kNone,                ///< no check
  kBackward,            ///< new conforms to the latest: new readers read data written with it
  kForward,             ///< the latest conforms to new: readers of the latest read new data
  kFull,                ///< both
  kBackwardTransitive,  ///< kBackward against every earlier version
  kForwardTransitive,   ///< kForward against every earlier version
  kFullTransitive,      ///< kFull against every earlier version
};

/// The default mode of a subject, as in Confluent Schema Registry.
inline constexpr Compatibility kDefaultCompatibility = Compatibility::kBackward;

/// Longest schema subject, in bytes.
/// A subject is 1 to 65,000 bytes, in memory as on a SchemaStore: its longest key,
/// `schema.<subject>.<version>`, is at most 18 bytes longer and so fits a StateStore's
/// 65,536-byte keys. Register and SetCompatibility refuse a longer one
/// (kInvalidArgument) before they touch the store.
inline constexpr std::size_t kMaxSchemaSubjectBytes = 65'000;

/// "none", "backward", "forward", "full", "backward_transitive", ... (lower case).
std::string_view CompatibilityName(Compatibility mode);
/// The inverse of CompatibilityName (lower case, as it prints); kInvalidArgument naming
/// the text otherwise.
absl::StatusOr<Compatibility> ParseCompatibility(std::string_view name);

/// A registered version of a subject: the schema's id and the version's number.
struct SchemaRef {
  /// Identifies the schema text across all subjects: the same text registered under
  /// two subjects has one id (as in Confluent's registry). Starts at 1.
  std::uint64_t id = 0;
  /// 1, 2, ... within the subject.
  std::uint32_t version = 0;
  /// Same id and version.
  friend bool operator==(const SchemaRef&, const SchemaRef&) = default;
};

/// A registered version with its texts (SchemaRegistry::Get, Latest).
struct RegisteredSchema {
  std::string subject;   ///< the subject it is a version of
  SchemaRef ref;         ///< its id and version
  std::string fbs_text;  ///< exactly as registered
  /// The binary schema (a reflection::Schema buffer, file identifier "BFBS"): the bytes
  /// `flatc -b --schema` writes for fbs_text, computed with Parser::Serialize when the
  /// version is registered or loaded. Schema-on-read (schema_reader.hpp) reads with it.
  std::string bfbs;
};

/// Checks one pair of schema texts under `mode` (the transitive modes act as their
/// plain ones: there is no history here). OK when compatible; kFailedPrecondition with
/// the checker's reason ("schemas don't conform (new -> old): types differ for field:
/// a"); kInvalidArgument with the parser's error when a text does not parse ("old
/// schema: 2: 0: error: ...") or holds an `include` (the registry takes self-contained
/// schemas and never reads files).
absl::Status CheckCompatibility(std::string_view old_fbs, std::string_view new_fbs,
                                Compatibility mode);

/// Subjects with their ordered schema versions and compatibility modes, in memory or
/// on a SchemaStore (see the file comment).
class SchemaRegistry {
 public:
  /// An in-memory registry.
  SchemaRegistry();
  /// A registry whose content lives in `store`, rebuilt from the records it holds
  /// (schema_store.hpp gives their format): one Write per Register (the version and
  /// the subject's meta record) and per SetCompatibility. On a StateStore:
  /// OpenSchemaRegistry (inferq/state/state_schema_store.hpp). Errors:
  /// kInvalidArgument when `store` is null; the error of the store's ReadAll;
  /// kDataLoss naming the key when the stored content is malformed (a key without the
  /// `schema.` prefix, a gap in versions, a text that no longer parses, ...).
  static absl::StatusOr<std::unique_ptr<SchemaRegistry>> Open(
      std::unique_ptr<SchemaStore> store);

  ~SchemaRegistry();
  SchemaRegistry(const SchemaRegistry&) = delete;
  SchemaRegistry& operator=(const SchemaRegistry&) = delete;

  /// Registers `fbs_text` as the subject's next version, after checking it against the
  /// earlier version(s) per the subject's mode. Idempotent: a text identical (byte for
  /// byte) to one of the subject's versions returns that version's ref, unchecked and
  /// unwritten. Errors: kInvalidArgument for an empty subject, one longer than
  /// kMaxSchemaSubjectBytes ("schema subject starting 'tensor.xx' has 70000 bytes;
  /// subjects have 1 to 65000 bytes", the subject cut to its first 64 bytes at most),
  /// or a text that does not parse (the parser's error), has a NUL byte, or uses
  /// `include`;
  /// kFailedPrecondition when it does
  /// not conform, with the checker's reason, the direction and the versions compared;
  /// the SchemaStore's error when its Write fails (nothing is registered then).
  absl::StatusOr<SchemaRef> Register(std::string_view subject, std::string_view fbs_text);

  /// Sets the subject's mode (the subject need not have versions yet); applies to later
  /// registrations only. Durable when the registry has a store (its Write error).
  /// kInvalidArgument for a subject that Register refuses for its length.
  absl::Status SetCompatibility(std::string_view subject, Compatibility mode);
  /// The subject's mode: kDefaultCompatibility until SetCompatibility sets another.
  Compatibility GetCompatibility(std::string_view subject) const;

  /// Version `version` of the subject. kNotFound naming the subject (and version) when absent.
  absl::StatusOr<RegisteredSchema> Get(std::string_view subject, std::uint32_t version) const;
  /// The subject's last version; kNotFound naming the subject when it has none.
  absl::StatusOr<RegisteredSchema> Latest(std::string_view subject) const;
  /// A schema-on-read reader of the subject as its version `version` (see
  /// schema_reader.hpp): reads payloads written with any version of the subject,
  /// registered now or later. The registry must outlive it. kNotFound naming the
  /// subject and version when absent; kFailedPrecondition when that version declares
  /// no root_type; kUnimplemented naming a union or fixed-length array field.
  absl::StatusOr<SchemaReader> Reader(std::string_view subject, std::uint32_t version) const;

  /// The subject's versions in order (empty when it has none).
  std::vector<std::uint32_t> Versions(std::string_view subject) const;
  /// Subjects with at least one version, sorted.
  std::vector<std::string> Subjects() const;

 private:
  class Impl;
  explicit SchemaRegistry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq
