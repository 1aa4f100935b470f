// File: tests/docs/docs_rules.hpp
//
// The rules the repository's Markdown keeps, as pure functions over a file's text, so
// that tests/docs/check_docs.cpp applies them to the tree and docs_rules_test.cpp pins
// each one down on small inputs:
//  - the README stays short: at most kMaxReadmeLines lines;
//  - every relative link ([text](path#anchor), ![alt](path), [ref]: path) points at a
//    file that exists and, with an #anchor, at a heading of that file (GitHub's slugs:
//    GithubSlug) or an explicit <a id="..."> / <a name="...">;
//  - user-facing text names no issue ("issue 15", "issues 12-14", "#37") and, in
//    the README, the guides and the changelog, no commit id (a word of 7 to 40
//    hexadecimal digits that has both a digit and a letter, other than a name such
//    as ed25519);
//  - the changelog's newest release is the project's version, and every
//    `find_package(inferq X.Y` shown asks for the project's major.minor.
// Text inside fenced code blocks and `code spans` is not prose: links there are not
// checked, and hexadecimal words there (hashes in sample output) are not commit ids.
//
// Every finding is one line "FILE:LINE: message" naming the bad value.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace inferq_docs {

inline constexpr int kMaxReadmeLines = 300;

struct Finding {
  std::string file;
  int line = 0;
  std::string message;
  std::string Text() const { return file + ":" + std::to_string(line) + ": " + message; }
};

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

// Which lines are inside a fenced code block (``` or ~~~, the fences included).
inline std::vector<bool> FencedLines(const std::vector<std::string_view>& lines) {
  std::vector<bool> fenced(lines.size(), false);
  std::string_view open;  // the fence that opened the current block, "" outside
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view t = lines[i];
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    const bool fence = t.substr(0, 3) == "```" || t.substr(0, 3) == "~~~";
    if (open.empty()) {
      if (fence) {
        open = t.substr(0, 3);
        fenced[i] = true;
      }
    } else {
      fenced[i] = true;
      if (fence && t.substr(0, 3) == open) open = {};
    }
  }
  return fenced;
}

// The line with its `code spans` blanked out (same length, so columns stay).
inline std::string WithoutCodeSpans(std::string_view line) {
  std::string out(line);
  std::size_t i = 0;
  while (i < out.size()) {
    if (out[i] != '`') {
      ++i;
      continue;
    }
    std::size_t ticks = 0;
    while (i + ticks < out.size() && out[i + ticks] == '`') ++ticks;
    const std::string fence(ticks, '`');
    const std::size_t close = out.find(fence, i + ticks);
    if (close == std::string::npos) break;  // an unmatched backtick is literal text
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(i),
              out.begin() + static_cast<std::ptrdiff_t>(close + ticks), ' ');
    i = close + ticks;
  }
  return out;
}

// GitHub's anchor for a heading's text: lower case; letters (any UTF-8 byte at or
// above 0x80 counts as one), digits, spaces, '-' and '_' kept, everything else
// dropped; each space becomes '-'. Inline markup characters (` * [ ] ( ) etc.) are
// dropped by the same rule; a link's target is dropped with its brackets' text kept.
inline std::string GithubSlug(std::string_view heading) {
  // [text](target) -> text
  std::string plain;
  for (std::size_t i = 0; i < heading.size(); ++i) {
    if (heading[i] == ']' && i + 1 < heading.size() && heading[i + 1] == '(') {
      const std::size_t close = heading.find(')', i + 2);
      if (close != std::string_view::npos) {
        i = close;
        continue;
      }
    }
    plain += heading[i];
  }
  std::string slug;
  for (unsigned char c : plain) {
    if (c >= 0x80 || std::isalnum(c) || c == '-' || c == '_') {
      slug += static_cast<char>(c >= 0x80 ? c : std::tolower(c));
    } else if (c == ' ') {
      slug += '-';
    }
  }
  return slug;
}

// Every anchor a Markdown text defines: its headings' slugs (a repeated slug gets
// "-1", "-2", ... as on GitHub) and the ids of <a id="x"> / <a name="x"> tags.
inline std::set<std::string> Anchors(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  const std::vector<bool> fenced = FencedLines(lines);
  std::set<std::string> out;
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (fenced[i]) continue;
    std::string_view l = lines[i];
    for (std::string_view attr : {"<a id=\"", "<a name=\""}) {
      for (std::size_t at = l.find(attr); at != std::string_view::npos; at = l.find(attr, at + 1)) {
        const std::size_t start = at + attr.size();
        const std::size_t end = l.find('"', start);
        if (end != std::string_view::npos) out.insert(std::string(l.substr(start, end - start)));
      }
    }
    std::size_t level = 0;
    while (level < l.size() && l[level] == '#') ++level;
    if (level == 0 || level > 6 || level >= l.size() || l[level] != ' ') continue;
    std::string_view title = l.substr(level + 1);
    while (!title.empty() && (title.back() == ' ' || title.back() == '#')) title.remove_suffix(1);
    std::string slug = GithubSlug(title);
    const int n = seen[slug]++;
    out.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
  }
  return out;
}

struct Link {
  int line = 0;
  std::string target;  // as written, "#anchor" included
};

// The link targets of a Markdown text outside code: inline links and images
// ](target) (a title after a space is dropped, <target> unwrapped) and reference
// definitions "[label]: target".
inline std::vector<Link> Links(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  const std::vector<bool> fenced = FencedLines(lines);
  std::vector<Link> out;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (fenced[i]) continue;
    const std::string l = WithoutCodeSpans(lines[i]);
    const int line_no = static_cast<int>(i) + 1;
    for (std::size_t at = l.find("]("); at != std::string::npos; at = l.find("](", at + 2)) {
      std::size_t start = at + 2;
      std::size_t depth = 0, end = start;
      for (; end < l.size(); ++end) {
        if (l[end] == '(') ++depth;
        if (l[end] == ')') {
          if (depth == 0) break;
          --depth;
        }
      }
      if (end >= l.size()) continue;
      std::string target = l.substr(start, end - start);
      if (const std::size_t gt = target.find('>'); !target.empty() && target.front() == '<' && gt != std::string::npos) {
        target = target.substr(1, gt - 1);  // <target with spaces> "title"
      } else if (const std::size_t sp = target.find(' '); sp != std::string::npos) {
        target.resize(sp);  // target "title"
      }
      if (!target.empty()) out.push_back({line_no, target});
    }
    // [label]: target at the start of a line
    std::string_view t = l;
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    if (!t.empty() && t.front() == '[') {
      const std::size_t close = t.find("]:");
      if (close != std::string_view::npos && t.find(']') == close) {
        std::string_view target = t.substr(close + 2);
        while (!target.empty() && target.front() == ' ') target.remove_prefix(1);
        if (const std::size_t sp = target.find(' '); sp != std::string_view::npos) {
          target = target.substr(0, sp);
        }
        if (!target.empty()) out.push_back({line_no, std::string(target)});
      }
    }
  }
  return out;
}

// A link leaves the repository (and is not checked) when it has a scheme.
inline bool IsExternal(std::string_view target) {
  for (std::string_view scheme : {"http://", "https://", "mailto:", "ftp://"}) {
    if (target.substr(0, scheme.size()) == scheme) return true;
  }
  return false;
}

inline bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// "issue 15", "Issues 12-14", "issue #3", and "#37" standing alone: the first such
// mention in the line, or "".
inline std::string IssueMention(std::string_view line) {
  const std::string l = WithoutCodeSpans(line);
  std::string lower(l);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (std::size_t at = lower.find("issue"); at != std::string::npos;
       at = lower.find("issue", at + 1)) {
    if (at > 0 && std::isalnum(static_cast<unsigned char>(lower[at - 1]))) continue;
    std::size_t k = at + 5;
    if (k < lower.size() && lower[k] == 's') ++k;
    if (k < lower.size() && lower[k] == ' ') ++k;
    if (k < lower.size() && lower[k] == '#') ++k;
    const std::size_t digits = k;
    while (k < lower.size() && std::isdigit(static_cast<unsigned char>(lower[k]))) ++k;
    if (k > digits) return l.substr(at, k - at);
  }
  for (std::size_t at = l.find('#'); at != std::string::npos; at = l.find('#', at + 1)) {
    if (at > 0 && l[at - 1] != ' ' && l[at - 1] != '(') continue;
    std::size_t k = at + 1;
    while (k < l.size() && std::isdigit(static_cast<unsigned char>(l[k]))) ++k;
    if (k > at + 1 && (k == l.size() || !std::isalnum(static_cast<unsigned char>(l[k])))) {
      return l.substr(at, k - at);
    }
  }
  return "";
}

// The first word of the line, outside code spans and links' targets, that looks like
// a commit id: 7 to 40 hexadecimal digits with at least one digit and one letter,
// not part of a longer word; or "".
inline std::string CommitId(std::string_view line) {
  std::string l = WithoutCodeSpans(line);
  // Blank link targets: a URL may well hold a hash.
  for (std::size_t at = l.find("]("); at != std::string::npos; at = l.find("](", at + 2)) {
    const std::size_t end = l.find(')', at);
    if (end == std::string::npos) break;
    std::fill(l.begin() + static_cast<std::ptrdiff_t>(at + 2),
              l.begin() + static_cast<std::ptrdiff_t>(end), ' ');
  }
  auto word_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '/' ||
           c == '.';
  };
  std::size_t i = 0;
  while (i < l.size()) {
    if (!IsHex(l[i]) || (i > 0 && word_char(l[i - 1]) && l[i - 1] != '.')) {
      ++i;
      continue;
    }
    std::size_t k = i;
    bool digit = false, letter = false;
    while (k < l.size() && IsHex(l[k])) {
      (std::isdigit(static_cast<unsigned char>(l[k])) ? digit : letter) = true;
      ++k;
    }
    // A '.' ends the word unless a letter or digit follows ("a1b2c3d.md" is a file).
    const bool whole = k == l.size() || !word_char(l[k]) ||
                       (l[k] == '.' &&
                        (k + 1 == l.size() || !std::isalnum(static_cast<unsigned char>(l[k + 1]))));
    const std::size_t n = k - i;
    // Names that happen to be hexadecimal.
    static constexpr std::string_view kWords[] = {"ed25519"};
    const bool word = std::find(std::begin(kWords), std::end(kWords),
                                std::string_view(l).substr(i, n)) != std::end(kWords);
    if (whole && n >= 7 && n <= 40 && digit && letter && !word) return l.substr(i, n);
    i = k;
  }
  return "";
}

// The version of the newest release heading "## [X.Y.Z]" of a Keep a Changelog text
// (an "[Unreleased]" heading skipped), and its line; {"", 0} when there is none.
inline std::pair<std::string, int> NewestRelease(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (l.substr(0, 4) != "## [") continue;
    const std::size_t close = l.find(']');
    if (close == std::string_view::npos) continue;
    std::string_view v = l.substr(4, close - 4);
    if (v == "Unreleased") continue;
    return {std::string(v), static_cast<int>(i) + 1};
  }
  return {"", 0};
}

}  // namespace inferq_docs
