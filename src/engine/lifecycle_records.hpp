// File: src/engine/lifecycle_records.hpp (not API)
//
// The lifecycle's records in the StateStore (engine/lifecycle.hpp): one value per
// model ("v1 <state> <since_ns> <generation> <reason>") and per message
// ("v1 <state> <model> <enqueued_ns> <since_ns> <reason>"), fields separated by
// single spaces, the reason last (it may hold spaces). Encode and Decode them, and
// check the reasons and key prefix they carry. Used by lifecycle.cpp.
//
// Thread safety: pure functions.
#pragma once

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "inferq/engine/lifecycle.hpp"

namespace inferq {
namespace lifecycle_internal {

inline constexpr std::string_view kVersion = "v1";

// InvalidArgument unless `reason` is 1 to 256 printable ASCII characters.
absl::Status ValidateReason(std::string_view reason);
// InvalidArgument unless `p` is 1 to 64 of A-Z a-z 0-9 _ - . (no '.' first, last or
// doubled).
absl::Status ValidatePrefix(std::string_view p);
// Splits `v` at its first n-1 spaces into n fields; false if there are fewer.
bool SplitFields(std::string_view v, std::size_t n, std::vector<std::string_view>* f);
// A whole decimal field ("-" allowed for signed types; no '+', no spaces).
template <class T>
bool ParseInt(std::string_view s, T* out) {
  const std::string_view digits = !s.empty() && s[0] == '-' ? s.substr(1) : s;
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string EncodeModel(const ModelInfo& m);
std::string EncodeMessage(const MessageInfo& m);
bool ParseModelState(std::string_view s, ModelState* out);
bool ParseMessageState(std::string_view s, MessageState* out);
// DataLoss naming the key and (the first 300 bytes of) the value.
absl::Status Malformed(std::string_view key, std::string_view value, std::string_view what);
// DataLoss (Malformed) when the value is not a valid record.
absl::Status DecodeModel(std::string_view key, std::string_view v, ModelInfo* m);
absl::Status DecodeMessage(std::string_view key, std::string_view v, MessageInfo* m);

}  // namespace lifecycle_internal
}  // namespace inferq
