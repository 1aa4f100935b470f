/// @file inferq/state/state_schema_store.hpp
///
/// StateSchemaStore: the SchemaStore (inferq/schema/schema_store.hpp) of a schema
/// registry kept in a StateStore. The registry's records are StateStore keys under
/// `schema.` (`schema.<subject>.<version>`, `schema.<subject>.meta`); each Write is one
/// Transaction, so a version and its subject's meta record are committed together, as
/// durable as the store's SyncPolicy makes a commit. The schema layer cannot include
/// the state layer: this adapter is how a registry reaches a StateStore.
///
/// Usage:
/// @code
///   auto store = inferq::StateStore::Open(options);
///   absl::StatusOr<std::unique_ptr<inferq::SchemaRegistry>> registry =
///       inferq::OpenSchemaRegistry(**store);   // rebuilt from the `schema.` keys
///   // the same as:
///   //   inferq::SchemaRegistry::Open(std::make_unique<inferq::StateSchemaStore>(**store));
/// @endcode
///
/// Thread safety: as StateStore's (Scan and Commit may be called from many threads).
/// The StateStore must outlive the StateSchemaStore and the registry that owns it.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inferq/schema/registry.hpp"
#include "inferq/schema/schema_store.hpp"
#include "inferq/state/state_store.hpp"

namespace inferq {

/// The SchemaStore of a registry kept in a StateStore (see the file comment).
class StateSchemaStore final : public SchemaStore {
 public:
  /// Keeps the records in `store`, which must outlive this object.
  explicit StateSchemaStore(StateStore& store) : store_(store) {}

  /// Scan(kSchemaStoreKeyPrefix) on one consistent state. Always OK: a StateStore's
  /// keys are in memory once it is open.
  absl::Status ReadAll(
      absl::FunctionRef<void(std::string_view key, std::string_view value)> fn) override;

  /// One Transaction of Puts. Errors: its Commit's (kInvalidArgument for a key or
  /// value of a bad size, kFailedPrecondition for a read-only or failed store, the I/O
  /// error of the commit whose write or fdatasync failed).
  absl::Status Write(const std::vector<SchemaStoreRecord>& records) override;

 private:
  StateStore& store_;
};

/// A registry whose content lives in `store` (which must outlive it):
/// SchemaRegistry::Open on a StateSchemaStore of `store`. Errors: SchemaRegistry::Open's.
absl::StatusOr<std::unique_ptr<SchemaRegistry>> OpenSchemaRegistry(StateStore& store);

}  // namespace inferq
