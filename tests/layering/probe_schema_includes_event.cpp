// Compiles: the schema layer links the event layer (and, through it, memory). The
// positive control of layering.build_refuses_a_higher_layer: same target setup, an
// allowed include.
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"
#include "inferq/schema/registry.hpp"
