// File: src/event/traceparent.cpp
//
// The W3C traceparent header (inferq/event/traceparent.hpp).
#include "inferq/event/traceparent.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace inferq {
namespace {

constexpr char kHex[] = "0123456789abcdef";
constexpr std::size_t kVersion00Size = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2

void AppendHex(std::string& out, std::span<const std::uint8_t> bytes) {
  for (std::uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xf]);
  }
}

// Lowercase hex digits only (the specification's HEXDIGLC).
std::optional<std::uint8_t> Nibble(char c) {
  if (c >= '0' && c <= '9') return static_cast<std::uint8_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<std::uint8_t>(c - 'a' + 10);
  return std::nullopt;
}

bool ReadHex(std::string_view s, std::span<std::uint8_t> out) {
  if (s.size() != out.size() * 2) return false;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto hi = Nibble(s[2 * i]);
    const auto lo = Nibble(s[2 * i + 1]);
    if (!hi || !lo) return false;
    out[i] = static_cast<std::uint8_t>(*hi << 4 | *lo);
  }
  return true;
}

bool AllZero(std::span<const std::uint8_t> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0; });
}

absl::Status Bad(std::string_view value, std::string_view why) {
  std::string shown(value.substr(0, 64));
  if (value.size() > 64) shown += "...";
  return absl::InvalidArgumentError("traceparent '" + shown + "' " + std::string(why));
}

}  // namespace

std::string FormatTraceparent(const TraceContext& trace) {
  if (AllZero(trace.trace_id) || AllZero(trace.span_id)) return {};
  std::string out;
  out.reserve(kVersion00Size);
  out += "00-";
  AppendHex(out, trace.trace_id);
  out.push_back('-');
  AppendHex(out, trace.span_id);
  out.push_back('-');
  const std::uint8_t flags[1] = {trace.flags};
  AppendHex(out, flags);
  return out;
}

absl::StatusOr<TraceContext> ParseTraceparent(std::string_view value) {
  if (value.size() < kVersion00Size) {
    return Bad(value, "is " + std::to_string(value.size()) + " characters long, not 55");
  }
  std::uint8_t version[1];
  if (!ReadHex(value.substr(0, 2), version)) return Bad(value, "has no version of 2 lowercase hex digits");
  if (version[0] == 0xff) return Bad(value, "has the invalid version ff");
  if (version[0] == 0 && value.size() != kVersion00Size) {
    return Bad(value, "is " + std::to_string(value.size()) + " characters long, not 55 (version 00)");
  }
  if (value.size() > kVersion00Size && value[kVersion00Size] != '-') {
    return Bad(value, "has no '-' after its first 55 characters");
  }
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') {
    return Bad(value, "is not version-traceid-parentid-flags separated by '-'");
  }
  TraceContext t;
  std::uint8_t flags[1];
  if (!ReadHex(value.substr(3, 32), t.trace_id)) return Bad(value, "has a trace-id that is not 32 lowercase hex digits");
  if (!ReadHex(value.substr(36, 16), t.span_id)) return Bad(value, "has a parent-id that is not 16 lowercase hex digits");
  if (!ReadHex(value.substr(53, 2), flags)) return Bad(value, "has trace-flags that are not 2 lowercase hex digits");
  if (AllZero(t.trace_id)) return Bad(value, "has an all-zero trace-id");
  if (AllZero(t.span_id)) return Bad(value, "has an all-zero parent-id");
  t.flags = flags[0];
  return t;
}

}  // namespace inferq
