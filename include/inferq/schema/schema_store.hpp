/// @file inferq/schema/schema_store.hpp
///
/// SchemaStore: where a durable SchemaRegistry keeps its versions. The schema layer
/// declares it and a higher layer implements it, the way
/// state/file_system.hpp puts the Delta-State Log's files behind an interface:
/// `StateSchemaStore` (inferq/state/state_schema_store.hpp) keeps the records in a
/// StateStore; a host may keep them anywhere else that writes a set of records
/// atomically.
///
/// The registry owns the records' format; a store keeps them byte for byte:
/// @code{.unparsed}
///   schema.<subject>.<version>  "<id>\n<fbs text>"             one per version
///   schema.<subject>.meta       "mode=<name>\nlatest=<version>"  one per subject
/// @endcode
/// Every key starts with kSchemaStoreKeyPrefix, so a store that holds other data too
/// (a StateStore) tells the registry's records apart by that prefix. A key is at most
/// kMaxSchemaSubjectBytes + 18 = 65,018 bytes (registry.hpp); a value is the schema
/// text plus at most 21 bytes.
///
/// Usage:
/// @code
///   class MyStore : public inferq::SchemaStore { ... };
///   absl::StatusOr<std::unique_ptr<inferq::SchemaRegistry>> registry =
///       inferq::SchemaRegistry::Open(std::make_unique<MyStore>(...));
/// @endcode
///
/// Thread safety: a registry calls its store from one thread at a time (ReadAll from
/// Open, before it returns; Write under the registry's mutex), so a store used by one
/// registry needs no lock for the registry's sake.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace inferq {

/// The first bytes of every key a SchemaRegistry writes.
inline constexpr std::string_view kSchemaStoreKeyPrefix = "schema.";

/// One record a SchemaStore keeps: a key and its value.
struct SchemaStoreRecord {
  std::string key;    ///< starts with kSchemaStoreKeyPrefix
  std::string value;  ///< bytes
};

/// Where a durable SchemaRegistry keeps its records (see the file comment).
/// Implementations must make each Write atomic.
class SchemaStore {
 public:
  virtual ~SchemaStore() = default;

  /// Calls fn(key, value) once for every record the store holds whose key starts with
  /// kSchemaStoreKeyPrefix (the newest value of each key), in any order, on one
  /// consistent state: a Write is seen whole or not at all. Errors: the store's; the
  /// registry's Open returns it unchanged.
  virtual absl::Status ReadAll(
      absl::FunctionRef<void(std::string_view key, std::string_view value)> fn) = 0;

  /// Stores every record of `records` (1 or 2 of them) as one atomic change: a later
  /// ReadAll, in this process or after a crash, sees all of them or none. A key
  /// written before gets the new value. OK only once the change is as durable as the
  /// store promises. Errors: the store's; the registry's Register or SetCompatibility
  /// returns it unchanged and keeps nothing of the change in memory. (Whether a change
  /// whose Write failed is read back after a restart is the store's to say; a
  /// StateStore whose fdatasync failed, for one, may have written it.)
  virtual absl::Status Write(const std::vector<SchemaStoreRecord>& records) = 0;
};

}  // namespace inferq
