// Must not compile: the schema layer's target does not link the state layer, so the
// state headers are not on its include path (cmake/InferqLayers.cmake). The test
// layering.build_refuses_a_higher_layer builds it and expects the compiler to say so.
#include "inferq/schema/registry.hpp"
#include "inferq/state/state_store.hpp"
