/// @file inferq/base/limits.hpp
///
/// Bounds shared by every layer: the longest duration a configuration or a call may
/// give (kMaxDuration); the rule for names of the things an Engine holds (streams,
/// consumers, functions: ValidateName); and the rule for ids the host chooses and the
/// library keeps as state keys (lifecycle model names and msg_ids: ValidateId).
///
/// Usage:
/// @code
///   if (d < absl::ZeroDuration() || d > inferq::kMaxDuration) { ... "up to 365 days" }
///   if (absl::Status s = inferq::ValidateName("stream", name); !s.ok()) return s;
///   if (absl::Status s = inferq::ValidateId("model", model); !s.ok()) return s;
/// @endcode
///
/// Thread safety: constants and pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inferq/base/error.hpp"

namespace inferq {

/// Longest duration any configuration field, timeout, ttl or delay may have: 365 days.
/// Durations are added to clock readings in int64 nanoseconds (about 292 years from
/// the epoch), so every sum of a reading and such a duration stays far from overflow.
/// Error messages say "365 days".
inline constexpr absl::Duration kMaxDuration = absl::Hours(24 * 365);

/// Longest name (bytes) ValidateName accepts.
inline constexpr std::size_t kMaxNameBytes = 64;

/// True for the bytes a name may hold: A-Z a-z 0-9 _ -. Names become subject tokens
/// ("fn.<id>") and parts of stream names ("FN_<id>_DLQ"), so '.', '*', '>' and
/// whitespace are excluded.
constexpr bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '-';
}

/// The name rule: 1 to kMaxNameBytes (64) bytes, each IsNameChar. InvalidArgument
/// otherwise, naming `what` ("stream", "consumer", "function"), the name and the first
/// bad byte and its position, e.g.
/// @code{.unparsed}
///   stream name 'a.b' has the character '.' at byte 1; only A-Z a-z 0-9 _ - are allowed
///   stream name '' must have 1 to 64 characters
/// @endcode
inline absl::Status ValidateName(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(std::string(what) + " name " + QuoteValue(name) +
                                      " must have 1 to " + std::to_string(kMaxNameBytes) +
                                      " characters");
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(std::string(what) + " name " + QuoteValue(name) +
                                        " has the character " + QuoteByte(name[i]) +
                                        " at byte " + std::to_string(i) +
                                        "; only A-Z a-z 0-9 _ - are allowed");
    }
  }
  return absl::OkStatus();
}

/// Longest id (bytes) ValidateId accepts.
inline constexpr std::size_t kMaxIdBytes = 256;

/// The id rule, looser than the name rule because ids are chosen by the host (model
/// names such as "llama-3.1-8b", request ids) and are already kept in durable state
/// under it: 1 to kMaxIdBytes (256) visible ASCII bytes, 0x21 to 0x7e (no space, no
/// control byte, no UTF-8). Ids never become subject tokens. InvalidArgument
/// otherwise, naming `what` and the id, e.g.
/// @code{.unparsed}
///   model 'a b' must be 1 to 256 visible ASCII characters (0x21 to 0x7e)
/// @endcode
inline absl::Status ValidateId(std::string_view what, std::string_view id) {
  bool ok = !id.empty() && id.size() <= kMaxIdBytes;
  for (char c : id) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e) ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(std::string(what) + " " + QuoteValue(id) + " must be 1 to " +
                                    std::to_string(kMaxIdBytes) +
                                    " visible ASCII characters (0x21 to 0x7e)");
}

}  // namespace inferq
