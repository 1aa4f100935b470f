// File: tests/snippets/snippets.hpp
//
// Turns the C++ code blocks of Markdown files into one C++ source file that the
// build compiles and links against libinferq (target `readme_snippets`), so that
// an API snippet in the README that no longer compiles breaks the build.
//
// Every fenced block whose language (the first word of its info string, in any case)
// is `cpp` or `c++` is a snippet, whether fenced with backticks or tildes, of three or
// more (a block closes at a fence of its own character at least as long, with no info
// string, as GitHub reads it). A snippet is the body of a function of its own. What it assumes comes from an
// HTML comment, invisible on GitHub, on the line right before its fence:
//
//   <!-- snippet: returns absl::Status; given const inferq::Event& event -->
//   ```cpp
//   auto wire = inferq::Encode(event, {});
//   if (!wire.ok()) return wire.status();
//   ```
//
// - `returns TYPE`: the function's return type (default void); a function that
//   returns a value ends with `return TYPE{};` after the snippet.
// - `given PARAMETERS`: its parameter list, the names the snippet uses without
//   declaring them.
// - `program PATH`: the block is the whole program at PATH (relative to the
//   repository root), which the build compiles and the tests run as an example; it
//   is not compiled again here, and extract_snippets fails unless the block and the
//   file are the same, line for line (ProgramMismatch).
// - `excerpt PATH`: the block is a part of the file at PATH (an example's key lines,
//   say), compiled where that file is; extract_snippets fails unless the block's lines
//   occur in the file as consecutive lines (ExcerptMismatch).
// Without the comment a snippet is the body of `void Run()`. Lines of a snippet
// that begin with `#include` move to the top of the file. `#line` directives map
// every line back to its Markdown file, so a compiler error names README.md and
// the line a reader sees.
//
// Errors (absl::InvalidArgumentError, naming file and line): a fenced block that is
// never closed; a snippet comment with a part other than `returns`, `given`,
// `program` and `excerpt`, with both `program` and `excerpt`, or not followed by a
// ```cpp fence.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "../docs/text_lines.hpp"
#include "absl/status/statusor.h"

namespace inferq_snippets {

struct Snippet {
  std::string file;                // as given, e.g. "README.md"
  int fence_line = 0;              // 1-based line of the opening ```cpp
  std::vector<std::string> lines;  // the block's lines, fence indentation removed
  std::string returns = "void";
  std::string given;               // parameter list, may be empty
  std::string program;             // `program PATH`: the file this block shows whole
  std::string excerpt;             // `excerpt PATH`: the file this block shows a part of
};

inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

inline std::string Where(std::string_view file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": ";
}

// Parses "<!-- snippet: returns T; given P -->" into `out`. The caller has seen
// that `comment` starts with "<!-- snippet:".
inline absl::Status ParseSnippetComment(std::string_view file, int line,
                                        std::string_view comment, Snippet& out) {
  std::string_view body = Trim(comment);
  constexpr std::string_view kOpen = "<!-- snippet:";
  constexpr std::string_view kClose = "-->";
  if (body.size() < kOpen.size() + kClose.size() ||
      body.substr(body.size() - kClose.size()) != kClose) {
    return absl::InvalidArgumentError(Where(file, line) +
                                      "snippet comment does not end with '-->' on its line");
  }
  body = body.substr(kOpen.size(), body.size() - kOpen.size() - kClose.size());
  while (!Trim(body).empty()) {
    const std::size_t semi = body.find(';');
    std::string_view part = Trim(body.substr(0, semi));
    body = semi == std::string_view::npos ? std::string_view() : body.substr(semi + 1);
    if (part.substr(0, 8) == "returns ") {
      out.returns = std::string(Trim(part.substr(8)));
    } else if (part.substr(0, 6) == "given ") {
      out.given = std::string(Trim(part.substr(6)));
    } else if (part.substr(0, 8) == "program ") {
      out.program = std::string(Trim(part.substr(8)));
    } else if (part.substr(0, 8) == "excerpt ") {
      out.excerpt = std::string(Trim(part.substr(8)));
    } else {
      return absl::InvalidArgumentError(
          Where(file, line) + "snippet comment: unknown part '" + std::string(part) +
          "' (expected 'returns TYPE', 'given PARAMETERS', 'program PATH' or 'excerpt PATH', "
          "separated by ';')");
    }
  }
  if (!out.program.empty() && !out.excerpt.empty()) {
    return absl::InvalidArgumentError(Where(file, line) + "snippet comment: 'program " +
                                      out.program + "' and 'excerpt " + out.excerpt +
                                      "' together; a block is a whole file or a part of one");
  }
  return absl::OkStatus();
}

// A code fence: three or more backticks or tildes after the indentation; a backtick
// fence's info string holds no backtick. `language` is the info string's first word,
// lower case ("cpp" for "```CPP title=x").
struct Fence {
  std::size_t indent = 0;
  char ch = 0;
  std::size_t length = 0;
  std::string language;
};

inline std::optional<Fence> OpeningFence(std::string_view line) {
  const std::size_t i = line.find_first_not_of(' ');
  if (i == std::string_view::npos || (line[i] != '`' && line[i] != '~')) return std::nullopt;
  Fence f{i, line[i], 0, {}};
  while (i + f.length < line.size() && line[i + f.length] == f.ch) ++f.length;
  if (f.length < 3) return std::nullopt;
  const std::string_view info = Trim(line.substr(i + f.length));
  if (f.ch == '`' && info.find('`') != std::string_view::npos) return std::nullopt;
  for (char c : info.substr(0, info.find_first_of(" \t{"))) {
    f.language += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  }
  return f;
}

// True when `line` closes a block opened by `open`.
inline bool ClosesFence(std::string_view line, const Fence& open) {
  const std::size_t i = line.find_first_not_of(' ');
  if (i == std::string_view::npos) return false;
  std::size_t n = 0;
  while (i + n < line.size() && line[i + n] == open.ch) ++n;
  return n >= open.length && Trim(line.substr(i + n)).empty();
}

inline bool IsCpp(const Fence& f) { return f.language == "cpp" || f.language == "c++"; }

// The lines of a file's text, without "\n" or "\r\n" (tests/docs/text_lines.hpp).
inline std::vector<std::string_view> FileLines(std::string_view text) {
  return inferq_text::SplitLines(text);
}

// The ```cpp blocks of one Markdown text, in order.
inline absl::StatusOr<std::vector<Snippet>> ExtractSnippets(std::string_view file,
                                                            std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0; start <= text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  std::vector<Snippet> out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string_view t = Trim(lines[i]);
    const int line_no = static_cast<int>(i) + 1;
    const bool comment = t.substr(0, 13) == "<!-- snippet:";
    std::optional<Fence> open = comment ? std::nullopt : OpeningFence(lines[i]);
    if (!comment && !open) continue;
    Snippet s;
    s.file = std::string(file);
    std::size_t fence = i;
    if (comment) {
      if (absl::Status st = ParseSnippetComment(file, line_no, t, s); !st.ok()) return st;
      fence = i + 1;
      if (fence < lines.size()) open = OpeningFence(lines[fence]);
      if (!open || !IsCpp(*open)) {
        return absl::InvalidArgumentError(
            Where(file, line_no) + "a snippet comment must be followed by a ```cpp fence on " +
            "the next line");
      }
    }
    // Find the closing fence of this block, whatever its language.
    std::size_t close = fence + 1;
    while (close < lines.size() && !ClosesFence(lines[close], *open)) ++close;
    if (close == lines.size()) {
      return absl::InvalidArgumentError(Where(file, static_cast<int>(fence) + 1) + "the " +
                                        std::string(Trim(lines[fence])) +
                                        " block opened here is never closed");
    }
    if (IsCpp(*open)) {
      s.fence_line = static_cast<int>(fence) + 1;
      for (std::size_t k = fence + 1; k < close; ++k) {
        std::string_view l = lines[k];
        std::size_t cut = 0;
        while (cut < open->indent && cut < l.size() && l[cut] == ' ') ++cut;
        l.remove_prefix(cut);
        if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
        s.lines.emplace_back(l);
      }
      out.push_back(std::move(s));
    }
    i = close;
  }
  return out;
}

// For a `program PATH` snippet: an error naming the Markdown line and the first line
// that differs when the block is not `file_text` (PATH's contents) line for line
// (line ends "\n" and "\r\n" alike); OK otherwise.
inline absl::Status ProgramMismatch(const Snippet& s, std::string_view file_text) {
  const std::vector<std::string_view> lines = FileLines(file_text);
  const std::size_t n = std::max(lines.size(), s.lines.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (i < lines.size() && i < s.lines.size() && lines[i] == s.lines[i]) continue;
    return absl::InvalidArgumentError(
        Where(s.file, s.fence_line + 1 + static_cast<int>(i)) + "the block shown as program '" +
        s.program + "' differs from the file at its line " + std::to_string(i + 1) +
        (i < lines.size() ? "" : " (the block is longer)") +
        (i < s.lines.size() ? "" : " (the block is shorter)") + ": copy the file into the block");
  }
  return absl::OkStatus();
}

// For an `excerpt PATH` snippet: OK when the block's lines occur in `file_text`
// (PATH's contents) as consecutive lines, the same line for line; otherwise an error
// naming the Markdown line of the block's first line that no placement of the block
// matches beyond (the longest matching prefix), so the reader sees where it went stale.
inline absl::Status ExcerptMismatch(const Snippet& s, std::string_view file_text) {
  const std::vector<std::string_view> lines = FileLines(file_text);
  std::size_t best = 0;  // the longest prefix of the block found at some line of the file
  for (std::size_t at = 0; at < lines.size(); ++at) {
    std::size_t k = 0;
    while (k < s.lines.size() && at + k < lines.size() && lines[at + k] == s.lines[k]) ++k;
    if (k == s.lines.size() && k > 0) return absl::OkStatus();
    best = std::max(best, k);
  }
  if (s.lines.empty()) {
    return absl::InvalidArgumentError(Where(s.file, s.fence_line) + "the block shown as an "
                                      "excerpt of '" + s.excerpt + "' is empty");
  }
  return absl::InvalidArgumentError(
      Where(s.file, s.fence_line + 1 + static_cast<int>(best)) + "the block shown as an excerpt "
      "of '" + s.excerpt + "' is not in that file from this line on (its first " +
      std::to_string(best) + " lines are): copy the lines from the file into the block");
}

// One C++ source file: the umbrella header, every snippet's includes, then each
// snippet as `RET inferq_readme_snippet_N::Run(GIVEN)`. `program` snippets are
// compiled where their file is, not here.
inline std::string GenerateSource(const std::vector<Snippet>& snippets) {
  std::string includes = "#include \"inferq/inferq.hpp\"\n";
  std::string bodies;
  for (std::size_t n = 0; n < snippets.size(); ++n) {
    const Snippet& s = snippets[n];
    if (!s.program.empty()) {
      bodies += "\n// " + s.file + ":" + std::to_string(s.fence_line) + " shows " + s.program +
                ", built as its own program\n";
      continue;
    }
    if (!s.excerpt.empty()) {
      bodies += "\n// " + s.file + ":" + std::to_string(s.fence_line) + " shows part of " +
                s.excerpt + ", built where that file is\n";
      continue;
    }
    bodies += "\n// " + s.file + ":" + std::to_string(s.fence_line) + "\nnamespace snippet_" +
              std::to_string(n + 1) + " {\n[[maybe_unused]] " + s.returns + " Run(" + s.given +
              ") {\n#line " + std::to_string(s.fence_line + 1) + " \"" + s.file + "\"\n";
    for (const std::string& l : s.lines) {
      if (Trim(l).substr(0, 8) == "#include") {
        if (includes.find(std::string(Trim(l)) + "\n") == std::string::npos) {
          includes += std::string(Trim(l)) + "\n";
        }
        bodies += "\n";  // keeps the #line mapping
      } else {
        bodies += l + "\n";
      }
    }
    if (s.returns != "void") bodies += "  return " + s.returns + "{};\n";
    bodies += "}\n}  // namespace snippet_" + std::to_string(n + 1) + "\n";
  }
  return "// Generated by extract_snippets (tests/snippets/extract_snippets.cpp) from Markdown code blocks: do not edit.\n" +
         includes + bodies;
}

}  // namespace inferq_snippets
