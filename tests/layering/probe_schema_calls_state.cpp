// Compiles, as part of nothing: a function of the state layer reached from schema code
// by a declaration written by hand, with no include for the include path to refuse.
// libinferq's link would resolve it; the test layering.symbols_refuse_a_higher_layer
// runs check_layer_symbols.sh with this object counted in the schema layer and
// expects it to name the symbol.
#include <memory>

#include "absl/status/statusor.h"
#include "inferq/schema/registry.hpp"

namespace inferq {
class StateStore;
absl::StatusOr<std::unique_ptr<SchemaRegistry>> OpenSchemaRegistry(StateStore& store);
}  // namespace inferq

bool LayeringProbeOpensFromState(inferq::StateStore& store) {
  return inferq::OpenSchemaRegistry(store).ok();
}
