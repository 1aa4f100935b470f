// File: tests/docs/text_lines.hpp
//
// SplitLines: a text's lines as views into it, without their "\n" or "\r\n"; a last
// line without a newline counts, an empty text has none. Shared by the Markdown checks
// (docs_rules.hpp) and the snippet extraction (tests/snippets/snippets.hpp).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace inferq_text {

inline std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    lines.push_back(l);
    start = end + 1;
  }
  return lines;
}

}  // namespace inferq_text
