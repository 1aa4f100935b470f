/// @file inferq/event/traceparent.hpp
///
/// The W3C Trace Context `traceparent` header (https://www.w3.org/TR/trace-context/,
/// section 3.2) for Event::trace: the form bridges and exporters carry a trace in.
///
/// Usage:
/// @code
///   std::string h = inferq::FormatTraceparent(event.trace);  // "00-<32 hex>-<16 hex>-01"
///   absl::StatusOr<inferq::TraceContext> t = inferq::ParseTraceparent(h);
/// @endcode
///
/// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"

namespace inferq {

/// The header's value for `trace`: version "00", the trace-id and span_id (parent-id)
/// in lowercase hex and the flags, 55 characters. Empty when `trace` carries no trace
/// (an all-zero trace-id or span_id: the specification forbids both in a header).
std::string FormatTraceparent(const TraceContext& trace);

/// Reads a traceparent value. Version 00: exactly "vv-<32 hex>-<16 hex>-<2 hex>" in
/// lowercase hex. A later version is read as the specification says a version-00
/// reader must: the first 55 characters as above, then nothing or "-" and more.
/// InvalidArgument, quoting the value (at most its first 64 characters), for another
/// length or shape, uppercase or non-hex digits, version "ff", or an all-zero
/// trace-id or parent-id.
absl::StatusOr<TraceContext> ParseTraceparent(std::string_view value);

}  // namespace inferq
