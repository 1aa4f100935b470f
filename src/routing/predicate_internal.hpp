// Internal to routing/: hooks the predicate tests use to check properties that the
// public API does not show, and the JSON helpers selection.cpp shares with
// predicate.cpp. Not installed; nothing outside src/routing and its tests includes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace inferq::predicate_internal {

// How many times this thread has parsed an event payload as JSON in Predicate::Matches
// (a counter that only grows). Lets a test check "at most one parse per Matches call".
std::uint64_t PayloadParsesOnThisThread();

// Predicate's JSON machinery for routing's other user, HashKey::JsonPointer, so that
// both read pointers and payloads the same way.
// OK for an RFC 6901 pointer; else InvalidArgument naming it (Predicate::Json's message).
absl::Status ValidateJsonPointer(std::string_view pointer);
// The value at `pointer` in `payload`, parsed as Predicate parses payloads (nesting
// bound Predicate::kMaxJsonDepth, numbers through std::from_chars): a string's text,
// any other value's JSON serialization (numbers as doubles or 64-bit integers: 1.50
// gives "1.5"). nullopt for a bad pointer, a payload that is not JSON, or no value.
std::optional<std::string> JsonPointerText(std::string_view payload, std::string_view pointer);

}  // namespace inferq::predicate_internal
