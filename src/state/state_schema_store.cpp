#include "inferq/state/state_schema_store.hpp"

#include <utility>

namespace inferq {

absl::Status StateSchemaStore::ReadAll(
    absl::FunctionRef<void(std::string_view key, std::string_view value)> fn) {
  store_.Scan(kSchemaStoreKeyPrefix,
              [&fn](std::string_view key, std::string_view value) { fn(key, value); });
  return absl::OkStatus();
}

absl::Status StateSchemaStore::Write(const std::vector<SchemaStoreRecord>& records) {
  Transaction tx = store_.Begin();
  for (const SchemaStoreRecord& record : records) tx.Put(record.key, record.value);
  absl::StatusOr<std::uint64_t> committed = tx.Commit();
  return committed.ok() ? absl::OkStatus() : committed.status();
}

absl::StatusOr<std::unique_ptr<SchemaRegistry>> OpenSchemaRegistry(StateStore& store) {
  return SchemaRegistry::Open(std::make_unique<StateSchemaStore>(store));
}

}  // namespace inferq
