// Internal to routing/: hooks the predicate tests use to check properties that the
// public API does not show. Not installed; nothing outside src/routing and its tests
// includes this.
#pragma once

#include <cstdint>

namespace inferq::predicate_internal {

// How many times this thread has parsed an event payload as JSON in Predicate::Matches
// (a counter that only grows). Lets a test check "at most one parse per Matches call".
std::uint64_t PayloadParsesOnThisThread();

}  // namespace inferq::predicate_internal
