/// @file inferq/base/error.hpp
///
/// Helpers for error messages that name the bad value: the value is quoted and any
/// control character (and the quote itself) is escaped as `\xNN`, so that a message
/// never carries raw newlines or NULs from user input.
///
/// Usage:
/// @code
///   return absl::InvalidArgumentError("stream name " + inferq::QuoteValue(name) + " ...");
///   // -> stream name 'a\x0ab' ...
/// @endcode
///
/// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace inferq {

namespace error_internal {
inline void AppendHex(std::string& out, unsigned char u) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[u >> 4];
  out += kHex[u & 15];
}
}  // namespace error_internal

/// `s` in single quotes; bytes below 0x20, 0x7f and ' as `\xNN`. Other bytes (UTF-8
/// text) are kept.
inline std::string QuoteValue(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '\'') {
      error_internal::AppendHex(out, u);
    } else {
      out += c;
    }
  }
  return out + "'";
}

/// One byte in single quotes: itself when printable ASCII, else `\xNN` (a lone byte of
/// a multi-byte UTF-8 character is not printable on its own).
inline std::string QuoteByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x20 && u < 0x7f && c != '\'') return std::string("'") + c + "'";
  std::string out = "'";
  error_internal::AppendHex(out, u);
  return out + "'";
}

}  // namespace inferq
