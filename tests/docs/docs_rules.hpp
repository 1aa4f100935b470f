// File: tests/docs/docs_rules.hpp
//
// The rules the repository's Markdown keeps, as pure functions over a file's text, so
// that tests/docs/check_docs.cpp applies them to the tree and docs_rules_test.cpp pins
// each one down on small inputs:
//  - the README stays short: at most kMaxReadmeLines lines;
//  - every relative link ([text](path#anchor), ![alt](path), [ref]: path, and the
//    href and src of HTML tags) points at a file that exists inside the repository
//    and, with an #anchor, at a heading of that file (GitHub's slugs: GithubSlug) or
//    an HTML element's id or name, as GitHub resolves them (LinkTarget: %-escapes
//    decoded, a query dropped, a leading '/' from the repository's root);
//  - user-facing text names no issue ("issue 15", "issues 12-14", "#37") and, in
//    the README, the guides and the changelog, no commit id (a word of 7 to 40
//    hexadecimal digits that has both a digit and a letter, other than a name such
//    as ed25519);
//  - the changelog's newest release is the project's version, and every
//    `find_package(inferq X.Y` shown asks for the project's major.minor.
// Text inside fenced code blocks (``` or ~~~, closed by a fence of the same
// character at least as long: FencedLines), `code spans` and HTML comments is not
// prose: links there are not checked, headings there define no anchor, and
// hexadecimal words there (hashes in sample output) are not commit ids.
//
// Every finding is one line "FILE:LINE: message" naming the bad value.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <system_error>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text_lines.hpp"

namespace inferq_docs {

inline constexpr int kMaxReadmeLines = 300;

struct Finding {
  std::string file;
  int line = 0;
  std::string message;
  std::string Text() const { return file + ":" + std::to_string(line) + ": " + message; }
};

// The lines of a text, without their "\n" or "\r\n" (text_lines.hpp).
using inferq_text::SplitLines;

inline bool IsBlank(std::string_view l) {
  return l.find_first_not_of(" \t") == std::string_view::npos;
}

// A code fence (CommonMark): 3 or more backticks or tildes, after any indentation (a
// fence in a list item is indented); a backtick fence's info string has no backtick.
struct Fence {
  char ch = 0;
  std::size_t length = 0;
};

inline std::optional<Fence> OpeningFence(std::string_view line) {
  std::size_t i = line.find_first_not_of(" \t");
  if (i == std::string_view::npos || (line[i] != '`' && line[i] != '~')) return std::nullopt;
  const char ch = line[i];
  std::size_t n = 0;
  while (i + n < line.size() && line[i + n] == ch) ++n;
  if (n < 3) return std::nullopt;
  if (ch == '`' && line.find('`', i + n) != std::string_view::npos) return std::nullopt;
  return Fence{ch, n};
}

// True when `line` closes a block opened by `open`: the same character, at least as
// many, nothing after them but spaces (a "```cpp" line inside a block is content).
inline bool ClosesFence(std::string_view line, const Fence& open) {
  std::size_t i = line.find_first_not_of(" \t");
  if (i == std::string_view::npos) return false;
  std::size_t n = 0;
  while (i + n < line.size() && line[i + n] == open.ch) ++n;
  return n >= open.length && IsBlank(line.substr(i + n));
}

// Which lines are inside a fenced code block (the fences included). A block that is
// never closed runs to the end of the text, as on GitHub.
inline std::vector<bool> FencedLines(const std::vector<std::string_view>& lines) {
  std::vector<bool> fenced(lines.size(), false);
  std::optional<Fence> open;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (!open) {
      open = OpeningFence(lines[i]);
      fenced[i] = open.has_value();
    } else {
      fenced[i] = true;
      if (ClosesFence(lines[i], *open)) open.reset();
    }
  }
  return fenced;
}

// Which lines are inside an HTML comment block: from a line that starts with "<!--"
// (after up to 3 spaces) to the line holding the "-->" that ends it (both included).
// GitHub renders nothing of them. Lines in `fenced` are not looked at.
inline std::vector<bool> CommentLines(const std::vector<std::string_view>& lines,
                                      const std::vector<bool>& fenced) {
  std::vector<bool> out(lines.size(), false);
  bool open = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (fenced[i]) continue;
    const std::string_view l = lines[i];
    std::size_t from = 0;
    if (!open) {
      const std::size_t s = l.find_first_not_of(' ');
      if (s == std::string_view::npos || s > 3 || l.substr(s, 4) != "<!--") continue;
      open = true;
      from = s + 4;
    }
    out[i] = true;
    if (l.find("-->", from) != std::string_view::npos) open = false;
  }
  return out;
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
    // The closing run has exactly as many backticks.
    std::size_t close = i + ticks;
    for (;;) {
      close = out.find(std::string(ticks, '`'), close);
      if (close == std::string::npos) break;
      std::size_t run = 0;
      while (close + run < out.size() && out[close + run] == '`') ++run;
      if (run == ticks) break;
      close += run;
    }
    if (close == std::string::npos) {  // an unmatched run is literal text
      i += ticks;
      continue;
    }
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(i),
              out.begin() + static_cast<std::ptrdiff_t>(close + ticks), ' ');
    i = close + ticks;
  }
  return out;
}

// The line with inline HTML comments "<!-- ... -->" blanked out (same length).
inline std::string WithoutHtmlComments(std::string line) {
  for (std::size_t at = line.find("<!--"); at != std::string::npos; at = line.find("<!--", at)) {
    std::size_t end = line.find("-->", at + 4);
    end = end == std::string::npos ? line.size() : end + 3;
    std::fill(line.begin() + static_cast<std::ptrdiff_t>(at),
              line.begin() + static_cast<std::ptrdiff_t>(end), ' ');
    at = end;
  }
  return line;
}

// ---------------------------------------------------------------------------------
// UTF-8 and GitHub's slugs.

// The code point at s[i] (advancing i); an invalid byte is U+FFFD and advances 1.
inline char32_t DecodeUtf8(std::string_view s, std::size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
  if (n < 0 || i + static_cast<std::size_t>(n) >= s.size()) {
    ++i;
    return 0xFFFD;
  }
  char32_t cp = b & (0x3F >> n);
  for (int k = 1; k <= n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
    if ((c & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  i += static_cast<std::size_t>(n) + 1;
  return cp;
}

inline void AppendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Appends the lower case of `c` as JavaScript's toLowerCase gives it (GitHub's slugger
// lowercases with it), for the scripts a heading here may use: Latin (Latin-1,
// Extended-A and Additional), Greek, Cyrillic, Armenian, Georgian, fullwidth Latin,
// and the letter-like signs that fold to letters. Other code points are kept.
inline void AppendLower(std::string& out, char32_t c) {
  auto even_odd = [&](char32_t lo, char32_t hi, bool upper_even) {
    return c >= lo && c <= hi && ((c % 2 == 0) == upper_even);
  };
  char32_t l = c;
  if (c >= 'A' && c <= 'Z') {
    l = c + 32;
  } else if (c < 0x80) {
  } else if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
             (c >= 0x410 && c <= 0x42F) || (c >= 0xFF21 && c <= 0xFF3A)) {
    l = c + 0x20;
  } else if (c == 0x130) {  // İ: i and a combining dot above
    out += "i\xCC\x87";
    return;
  } else if (even_odd(0x100, 0x137, true) || even_odd(0x139, 0x148, false) ||
             even_odd(0x14A, 0x177, true) || even_odd(0x179, 0x17E, false) ||
             even_odd(0x1DE, 0x1EF, true) || even_odd(0x1F8, 0x21F, true) ||
             even_odd(0x222, 0x233, true) || even_odd(0x3D8, 0x3EF, true) ||
             even_odd(0x460, 0x481, true) || even_odd(0x48A, 0x4BF, true) ||
             even_odd(0x4C1, 0x4CE, false) || even_odd(0x4D0, 0x52F, true) ||
             even_odd(0x1E00, 0x1E95, true) || even_odd(0x1EA0, 0x1EFF, true)) {
    l = c + 1;
  } else if (c == 0x178) {
    l = 0xFF;
  } else if (c == 0x386) {
    l = 0x3AC;
  } else if (c >= 0x388 && c <= 0x38A) {
    l = c + 0x25;
  } else if (c == 0x38C) {
    l = 0x3CC;
  } else if (c == 0x38E || c == 0x38F) {
    l = c + 0x3F;
  } else if (c >= 0x400 && c <= 0x40F) {
    l = c + 0x50;
  } else if (c == 0x4C0) {
    l = 0x4CF;
  } else if (c >= 0x531 && c <= 0x556) {
    l = c + 0x30;
  } else if ((c >= 0x10A0 && c <= 0x10C5) || c == 0x10C7 || c == 0x10CD) {
    l = c + 0x1C60;
  } else if (c == 0x1E9E) {
    l = 0xDF;
  } else if ((c >= 0x1F08 && c <= 0x1F0F) || (c >= 0x1F18 && c <= 0x1F1D) ||
             (c >= 0x1F28 && c <= 0x1F2F) || (c >= 0x1F38 && c <= 0x1F3F) ||
             (c >= 0x1F48 && c <= 0x1F4D) || (c >= 0x1F68 && c <= 0x1F6F) || c == 0x1F59 ||
             c == 0x1F5B || c == 0x1F5D || c == 0x1F5F) {
    l = c - 8;
  } else if (c == 0x2126) {
    l = 0x3C9;  // Ohm sign -> omega
  } else if (c == 0x212A) {
    l = 'k';  // Kelvin sign
  } else if (c == 0x212B) {
    l = 0xE5;  // Angstrom sign -> a with ring
  } else if (c >= 0x2160 && c <= 0x216F) {
    l = c + 0x10;
  } else if (c >= 0x24B6 && c <= 0x24CF) {
    l = c + 0x1A;
  }
  AppendUtf8(out, l);
}

// True for a code point above ASCII that GitHub's slugger removes from a heading's
// text: punctuation, symbols (arrows, dashes, quotes, emoji, box drawing, currency,
// math), separators such as U+00A0, private use and format characters. Letters,
// marks (U+FE0F after an emoji is a mark, and stays), digits and connector
// punctuation stay. The ranges follow github-slugger's, in the blocks a heading may
// use; a rarer script's own punctuation may be kept where GitHub drops it.
inline bool SlugDrops(char32_t c) {
  static constexpr std::pair<char32_t, char32_t> kDropped[] = {
      {0x80, 0xA9},       {0xAB, 0xB4},       {0xB6, 0xB9},       {0xBB, 0xBF},
      {0xD7, 0xD7},       {0xF7, 0xF7},       {0x2C2, 0x2C5},     {0x2D2, 0x2DF},
      {0x2E5, 0x2EB},     {0x2ED, 0x2ED},     {0x2EF, 0x2FF},     {0x375, 0x375},
      {0x37E, 0x37E},     {0x384, 0x385},     {0x387, 0x387},     {0x3F6, 0x3F6},
      {0x482, 0x482},     {0x55A, 0x55F},     {0x589, 0x58A},     {0x58D, 0x58F},
      {0x5BE, 0x5BE},     {0x5C0, 0x5C0},     {0x5C3, 0x5C3},     {0x5C6, 0x5C6},
      {0x5F3, 0x60F},     {0x61B, 0x61F},     {0x66A, 0x66D},     {0x6D4, 0x6D4},
      {0x964, 0x965},     {0x970, 0x970},     {0xE3F, 0xE3F},     {0xE4F, 0xE4F},
      {0xE5A, 0xE5B},     {0x1FBD, 0x1FBD},   {0x1FBF, 0x1FC1},   {0x1FCD, 0x1FCF},
      {0x1FDD, 0x1FDF},   {0x1FED, 0x1FEF},   {0x1FFD, 0x203E},   {0x2041, 0x2053},
      {0x2055, 0x2070},   {0x2072, 0x207E},   {0x2080, 0x208F},   {0x209D, 0x20CF},
      {0x20F1, 0x2101},   {0x2103, 0x2106},   {0x2108, 0x2109},   {0x2114, 0x2114},
      {0x2116, 0x2118},   {0x211E, 0x2123},   {0x2125, 0x2125},   {0x2127, 0x2127},
      {0x2129, 0x2129},   {0x212E, 0x212E},   {0x213A, 0x213B},   {0x2140, 0x2144},
      {0x214A, 0x214D},   {0x214F, 0x215F},   {0x2189, 0x24B5},   {0x24EA, 0x2BFF},
      {0x2E00, 0x2E2E},   {0x2E30, 0x3004},   {0x3008, 0x3020},   {0x3030, 0x3030},
      {0x3036, 0x3037},   {0x303D, 0x3040},   {0x309B, 0x309C},   {0x30A0, 0x30A0},
      {0x30FB, 0x30FB},   {0x3200, 0x33FF},   {0x4DC0, 0x4DFF},   {0xE000, 0xF8FF},
      {0xFE10, 0xFE1F},   {0xFE30, 0xFE32},   {0xFE35, 0xFE4C},   {0xFE50, 0xFE6F},
      {0xFEFD, 0xFF0F},   {0xFF1A, 0xFF20},   {0xFF3B, 0xFF3E},   {0xFF40, 0xFF40},
      {0xFF5B, 0xFF65},   {0xFFE0, 0xFFFF},   {0x1D000, 0x1D164}, {0x1F000, 0x1F12F},
      {0x1F14A, 0x1F14F}, {0x1F16A, 0x1F16F}, {0x1F18A, 0x1FBEF}, {0x1FBFA, 0x1FBFF},
      {0xE0000, 0xE00FF}, {0xF0000, 0x10FFFF}};
  const auto it = std::upper_bound(std::begin(kDropped), std::end(kDropped), c,
                                   [](char32_t v, const auto& r) { return v < r.first; });
  return it != std::begin(kDropped) && c <= (it - 1)->second;
}

inline bool IsAsciiPunct(char c) {
  return std::ispunct(static_cast<unsigned char>(c)) != 0;
}

// The text GitHub renders for a heading's inline Markdown: code spans give their
// content (one space each side stripped when both are there); a link gives its text,
// an image nothing; HTML tags and entities are dropped (an autolink <x:y> gives
// x:y); a backslash escape gives the character; '_' runs that open or close an
// emphasis are dropped ('_' inside a word stays: max_ack_pending). '*' needs no care:
// the slug drops it anyway.
inline std::string HeadingText(std::string_view h) {
  std::string out;
  std::vector<std::pair<std::size_t, std::size_t>> openers;  // '_' runs that may open
  std::vector<std::pair<std::size_t, std::size_t>> dropped;  // out ranges to remove
  auto boundary = [](char c) {
    return c == ' ' || c == '\t' || IsAsciiPunct(c);
  };
  std::size_t i = 0;
  while (i < h.size()) {
    const char c = h[i];
    if (c == '\\' && i + 1 < h.size() && IsAsciiPunct(h[i + 1])) {
      out += h[i + 1];
      i += 2;
      continue;
    }
    if (c == '`') {
      std::size_t ticks = 0;
      while (i + ticks < h.size() && h[i + ticks] == '`') ++ticks;
      std::size_t close = i + ticks;
      for (;;) {
        close = h.find(std::string(ticks, '`'), close);
        if (close == std::string_view::npos) break;
        std::size_t run = 0;
        while (close + run < h.size() && h[close + run] == '`') ++run;
        if (run == ticks) break;
        close += run;
      }
      if (close == std::string_view::npos) {
        out.append(ticks, '`');
        i += ticks;
        continue;
      }
      std::string_view code = h.substr(i + ticks, close - i - ticks);
      if (code.size() >= 2 && code.front() == ' ' && code.back() == ' ' && !IsBlank(code)) {
        code = code.substr(1, code.size() - 2);
      }
      out += code;
      i = close + ticks;
      continue;
    }
    if (c == '!' && i + 1 < h.size() && h[i + 1] == '[') {  // an image: nothing
      std::size_t depth = 0, k = i + 1;
      for (; k < h.size(); ++k) {
        if (h[k] == '[') ++depth;
        if (h[k] == ']' && --depth == 0) break;
      }
      if (k + 1 < h.size() && h[k + 1] == '(') {
        const std::size_t close = h.find(')', k + 2);
        if (close != std::string_view::npos) {
          i = close + 1;
          continue;
        }
      }
    }
    if (c == ']' && i + 1 < h.size() && (h[i + 1] == '(' || h[i + 1] == '[')) {
      // A link's target or reference: dropped, its text kept.
      const char closer = h[i + 1] == '(' ? ')' : ']';
      std::size_t depth = 0, k = i + 1;
      for (; k < h.size(); ++k) {
        if (h[k] == h[i + 1]) ++depth;
        if (h[k] == closer && --depth == 0) break;
      }
      if (k < h.size()) {
        i = k + 1;
        continue;
      }
    }
    if (c == '<') {
      const std::size_t close = h.find('>', i + 1);
      if (close != std::string_view::npos && i + 1 < h.size()) {
        const std::string_view inner = h.substr(i + 1, close - i - 1);
        const char f = inner.empty() ? ' ' : inner.front();
        if (std::isalpha(static_cast<unsigned char>(f)) && inner.find(':') != std::string_view::npos &&
            inner.find(' ') == std::string_view::npos) {
          out += inner;  // autolink
          i = close + 1;
          continue;
        }
        if (std::isalpha(static_cast<unsigned char>(f)) || f == '/' || f == '!' || f == '?') {
          i = close + 1;  // a tag
          continue;
        }
      }
    }
    if (c == '&') {
      std::size_t k = i + 1;
      if (k < h.size() && h[k] == '#') ++k;
      const std::size_t name = k;
      while (k < h.size() && std::isalnum(static_cast<unsigned char>(h[k]))) ++k;
      if (k > name && k < h.size() && h[k] == ';') {
        i = k + 1;
        continue;
      }
    }
    if (c == '_') {
      std::size_t run = 0;
      while (i + run < h.size() && h[i + run] == '_') ++run;
      const char before = out.empty() ? ' ' : out.back();
      const char after = i + run < h.size() ? h[i + run] : ' ';
      const bool can_open = boundary(before) && after != ' ' && after != '\t';
      const bool can_close = boundary(after) && before != ' ' && before != '\t';
      const std::size_t at = out.size();
      out.append(run, '_');
      if (can_close && !openers.empty()) {
        // An emphasis closes: as many '_' of each run as both have go.
        const auto [from, length] = openers.back();
        const std::size_t n = std::min(length, run);
        dropped.push_back({from + length - n, n});
        dropped.push_back({at, n});
        openers.pop_back();
      } else if (can_open) {
        openers.push_back({at, run});
      }
      i += run;
      continue;
    }
    out += c;
    ++i;
  }
  std::sort(dropped.begin(), dropped.end());
  for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) out.erase(it->first, it->second);
  return out;
}

// GitHub's anchor for a heading's text (github-slugger on the rendered text,
// HeadingText): lower case; letters (of any script), digits, marks, '-' and '_' kept;
// ASCII punctuation and the code points of SlugDrops dropped; each space becomes '-'.
inline std::string GithubSlug(std::string_view heading) {
  const std::string text = HeadingText(heading);
  std::string slug;
  for (std::size_t i = 0; i < text.size();) {
    const char32_t c = DecodeUtf8(text, i);
    if (c < 0x80) {
      const auto a = static_cast<unsigned char>(c);
      if (std::isalnum(a) || a == '-' || a == '_') {
        slug += static_cast<char>(std::tolower(a));
      } else if (a == ' ') {
        slug += '-';
      }
    } else if (!SlugDrops(c)) {
      AppendLower(slug, c);
    }
  }
  return slug;
}

// The anchors a slugger hands out for headings in order: a slug already given (by an
// earlier heading or a suffix) gets "-1", "-2", ... as github-slugger does.
class Slugger {
 public:
  std::string Slug(std::string_view heading) {
    const std::string base = GithubSlug(heading);
    std::string result = base;
    while (occurrences_.contains(result)) {
      result = base + "-" + std::to_string(++occurrences_[base]);
    }
    occurrences_[result] = 0;
    return result;
  }

 private:
  std::map<std::string, int> occurrences_;
};

// The title of an ATX heading line ("## Title ##", up to 3 spaces before it), or
// nullopt for another line.
inline std::optional<std::string_view> AtxHeading(std::string_view l) {
  std::size_t s = 0;
  while (s < l.size() && s < 4 && l[s] == ' ') ++s;
  if (s > 3) return std::nullopt;
  std::size_t level = 0;
  while (s + level < l.size() && l[s + level] == '#') ++level;
  if (level == 0 || level > 6) return std::nullopt;
  std::string_view rest = l.substr(s + level);
  if (!rest.empty() && rest.front() != ' ' && rest.front() != '\t') return std::nullopt;
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  };
  rest = trim(rest);
  // A closing sequence: '#'s that are the whole title or follow a space.
  std::size_t k = rest.size();
  while (k > 0 && rest[k - 1] == '#') --k;
  if (k == 0) return std::string_view();
  if (k < rest.size() && (rest[k - 1] == ' ' || rest[k - 1] == '\t')) rest = trim(rest.substr(0, k));
  return rest;
}

// True for a line that may be part of a paragraph (so a setext underline below it
// makes a heading): not blank, not an ATX heading, a list item, a quote, a table or
// HTML, nor indented code.
inline bool ParagraphLine(std::string_view l) {
  if (IsBlank(l) || AtxHeading(l)) return false;
  const std::size_t s = l.find_first_not_of(' ');
  if (s > 3) return false;
  const std::string_view t = l.substr(s);
  if (t.front() == '>' || t.front() == '|' || t.front() == '<') return false;
  if ((t.front() == '-' || t.front() == '*' || t.front() == '+') &&
      (t.size() == 1 || t[1] == ' ' || t[1] == '\t')) {
    return false;
  }
  std::size_t d = 0;
  while (d < t.size() && std::isdigit(static_cast<unsigned char>(t[d]))) ++d;
  if (d > 0 && d < t.size() && (t[d] == '.' || t[d] == ')') &&
      (d + 1 == t.size() || t[d + 1] == ' ')) {
    return false;
  }
  return true;
}

// A setext underline: '='s or '-'s (up to 3 spaces before, spaces after).
inline bool SetextUnderline(std::string_view l) {
  const std::size_t s = l.find_first_not_of(' ');
  if (s == std::string_view::npos || s > 3 || (l[s] != '=' && l[s] != '-')) return false;
  std::size_t e = s;
  while (e < l.size() && l[e] == l[s]) ++e;
  return IsBlank(l.substr(e));
}

// The ids and names of the HTML tags in `line` (<a id="x">, <a name='y'>,
// <h3 id=z>, ...): GitHub keeps them (as user-content-x) and resolves #x to them.
inline std::vector<std::string> HtmlIds(std::string_view line) {
  std::vector<std::string> out;
  for (std::size_t at = line.find('<'); at != std::string_view::npos; at = line.find('<', at + 1)) {
    if (at + 1 >= line.size() || !std::isalpha(static_cast<unsigned char>(line[at + 1]))) continue;
    const std::size_t end = line.find('>', at);
    if (end == std::string_view::npos) break;
    const std::string_view tag = line.substr(at, end - at);
    for (std::size_t k = 0; k < tag.size(); ++k) {
      if (tag[k] != ' ' && tag[k] != '\t') continue;
      std::size_t n = k + 1;
      while (n < tag.size() && (std::isalnum(static_cast<unsigned char>(tag[n])) || tag[n] == '-')) ++n;
      std::string attr(tag.substr(k + 1, n - k - 1));
      std::transform(attr.begin(), attr.end(), attr.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      if ((attr != "id" && attr != "name") || n >= tag.size() || tag[n] != '=') continue;
      std::size_t v = n + 1;
      std::string value;
      if (v < tag.size() && (tag[v] == '"' || tag[v] == '\'')) {
        const std::size_t q = tag.find(tag[v], v + 1);
        value = std::string(tag.substr(v + 1, (q == std::string_view::npos ? tag.size() : q) - v - 1));
      } else {
        std::size_t e = v;
        while (e < tag.size() && tag[e] != ' ' && tag[e] != '\t' && tag[e] != '/') ++e;
        value = std::string(tag.substr(v, e - v));
      }
      if (!value.empty()) out.push_back(value);
    }
  }
  return out;
}

// Every anchor a Markdown text defines: its headings' slugs (ATX and setext, outside
// fences and HTML comments; a repeated slug gets "-1", "-2", ... as on GitHub) and
// the ids and names of its HTML tags outside code.
inline std::set<std::string> Anchors(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  const std::vector<bool> fenced = FencedLines(lines);
  const std::vector<bool> comment = CommentLines(lines, fenced);
  std::set<std::string> out;
  Slugger slugger;
  std::size_t paragraph = lines.size();  // first line of the paragraph above, if any
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (fenced[i] || comment[i]) {
      paragraph = lines.size();
      continue;
    }
    const std::string_view l = lines[i];
    for (std::string& id : HtmlIds(WithoutCodeSpans(l))) out.insert(std::move(id));
    if (paragraph < i && SetextUnderline(l)) {
      std::string title;
      for (std::size_t k = paragraph; k < i; ++k) {
        std::string_view p = lines[k];
        while (!p.empty() && p.front() == ' ') p.remove_prefix(1);
        while (!p.empty() && (p.back() == ' ' || p.back() == '\t')) p.remove_suffix(1);
        title += (k == paragraph ? "" : "\n") + std::string(p);
      }
      out.insert(slugger.Slug(title));
      paragraph = lines.size();
      continue;
    }
    if (const std::optional<std::string_view> title = AtxHeading(l)) {
      if (!title->empty()) out.insert(slugger.Slug(*title));
      paragraph = lines.size();
      continue;
    }
    if (ParagraphLine(l)) {
      if (paragraph == lines.size()) paragraph = i;
    } else {
      paragraph = lines.size();
    }
  }
  return out;
}

struct Link {
  int line = 0;
  std::string target;  // as written, "#anchor" included
};

// The link targets of a Markdown text outside code and HTML comments: inline links
// and images ](target) (a title after a space is dropped, <target> unwrapped),
// reference definitions "[label]: target" (not footnotes "[^1]: text"), and the href
// and src of HTML tags.
inline std::vector<Link> Links(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  const std::vector<bool> fenced = FencedLines(lines);
  const std::vector<bool> comment = CommentLines(lines, fenced);
  std::vector<Link> out;
  auto destination = [](std::string_view t) {
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    if (!t.empty() && t.front() == '<') {
      const std::size_t gt = t.find('>');
      return std::string(t.substr(1, (gt == std::string_view::npos ? t.size() : gt) - 1));
    }
    const std::size_t sp = t.find_first_of(" \t");
    return std::string(t.substr(0, sp));
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (fenced[i] || comment[i]) continue;
    const std::string l = WithoutHtmlComments(WithoutCodeSpans(lines[i]));
    const int line_no = static_cast<int>(i) + 1;
    for (std::size_t at = l.find("]("); at != std::string::npos; at = l.find("](", at + 2)) {
      std::size_t start = at + 2;
      std::size_t depth = 0, end = start;
      bool angle = false;
      for (; end < l.size(); ++end) {
        if (end == l.find_first_not_of(" \t", start) && l[end] == '<') angle = true;
        if (angle) {
          if (l[end] == '>') angle = false;
          continue;
        }
        if (l[end] == '(') ++depth;
        if (l[end] == ')') {
          if (depth == 0) break;
          --depth;
        }
      }
      if (end >= l.size()) continue;
      const std::string target = destination(std::string_view(l).substr(start, end - start));
      if (!target.empty()) out.push_back({line_no, target});
    }
    // [label]: target at the start of a line; not a footnote [^label]: text
    std::string_view t = l;
    std::size_t indent = 0;
    while (!t.empty() && t.front() == ' ') {
      t.remove_prefix(1);
      ++indent;
    }
    if (indent <= 3 && t.size() > 1 && t.front() == '[' && t[1] != '^') {
      const std::size_t close = t.find("]:");
      if (close != std::string_view::npos && t.find(']') == close) {
        const std::string target = destination(t.substr(close + 2));
        if (!target.empty()) out.push_back({line_no, target});
      }
    }
    // <a href="target">, <img src="target">
    for (std::size_t at = l.find('<'); at != std::string::npos; at = l.find('<', at + 1)) {
      if (at + 1 >= l.size() || !std::isalpha(static_cast<unsigned char>(l[at + 1]))) continue;
      const std::size_t end = l.find('>', at);
      if (end == std::string::npos) break;
      const std::string tag = l.substr(at, end - at);
      std::string lower = tag;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      for (std::string_view attr : {" href=", " src="}) {
        for (std::size_t a = lower.find(attr); a != std::string::npos; a = lower.find(attr, a + 1)) {
          std::size_t v = a + attr.size();
          if (v >= tag.size()) continue;
          std::string value;
          if (tag[v] == '"' || tag[v] == '\'') {
            const std::size_t q = tag.find(tag[v], v + 1);
            value = tag.substr(v + 1, (q == std::string::npos ? tag.size() : q) - v - 1);
          } else {
            std::size_t e = v;
            while (e < tag.size() && tag[e] != ' ' && tag[e] != '/') ++e;
            value = tag.substr(v, e - v);
          }
          if (!value.empty()) out.push_back({line_no, value});
        }
      }
    }
  }
  return out;
}

// A link leaves the repository (and is not checked) when it has a scheme
// ("https:", "mailto:", any letters then ':', in any case) or starts with "//".
inline bool IsExternal(std::string_view target) {
  if (target.substr(0, 2) == "//") return true;
  std::size_t k = 0;
  if (target.empty() || !std::isalpha(static_cast<unsigned char>(target[0]))) return false;
  while (k < target.size() && (std::isalnum(static_cast<unsigned char>(target[k])) ||
                               target[k] == '+' || target[k] == '-' || target[k] == '.')) {
    ++k;
  }
  return k < target.size() && target[k] == ':';
}

// %XX escapes decoded (a '%' not followed by two hexadecimal digits stays).
inline std::string PercentDecoded(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A relative link as GitHub resolves it: the path (a query "?..." dropped, %-escapes
// decoded), whether it starts at the repository's root ("/docs/x.md"), and the
// anchor after '#' (decoded; empty when there is none).
struct LinkTarget {
  std::string path;
  bool from_root = false;
  std::string anchor;
};

inline LinkTarget ParseLinkTarget(std::string_view target) {
  LinkTarget t;
  const std::size_t hash = target.find('#');
  std::string_view path = target.substr(0, hash);
  if (hash != std::string_view::npos) t.anchor = PercentDecoded(target.substr(hash + 1));
  path = path.substr(0, path.find('?'));
  t.from_root = !path.empty() && path.front() == '/';
  while (!path.empty() && path.front() == '/') path.remove_prefix(1);
  t.path = PercentDecoded(path);
  if (t.from_root && t.path.empty()) t.path = ".";
  return t;
}

// True for an anchor GitHub gives every line of a file it shows as code: "L12" or
// "L12-L20".
inline bool IsLineAnchor(std::string_view a) {
  auto number = [&a](std::size_t& k) {
    const std::size_t from = k;
    while (k < a.size() && std::isdigit(static_cast<unsigned char>(a[k]))) ++k;
    return k > from;
  };
  std::size_t k = 0;
  if (a.empty() || a[k++] != 'L' || !number(k)) return false;
  if (k == a.size()) return true;
  if (a.substr(k, 2) != "-L") return false;
  k += 2;
  return number(k) && k == a.size();
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
// not part of a longer word; or a code span holding only such a word right after
// "commit" ("at commit `7c2bfb0`"); or "".
inline std::string CommitId(std::string_view line) {
  // "commit `7c2bfb0`": a code span is no hiding place for a commit the prose names.
  std::string lower(line);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (std::size_t at = lower.find("commit"); at != std::string::npos;
       at = lower.find("commit", at + 1)) {
    std::size_t k = at + 6;
    if (k < lower.size() && lower[k] == ':') ++k;
    while (k < lower.size() && lower[k] == ' ') ++k;
    if (k < lower.size() && lower[k] == '[') ++k;
    if (k >= lower.size() || lower[k] != '`') continue;
    const std::size_t close = lower.find('`', k + 1);
    if (close == std::string::npos) continue;
    const std::string word(line.substr(k + 1, close - k - 1));
    const bool hex = word.size() >= 7 && word.size() <= 40 &&
                     std::all_of(word.begin(), word.end(), IsHex) &&
                     std::any_of(word.begin(), word.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }) &&
                     std::any_of(word.begin(), word.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; });
    if (hex) return word;
  }
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

// CommitId of `line`, or of "commit <line>" when the previous line of the same
// paragraph ends with the word "commit" (a sentence wrapped between the two).
inline std::string CommitIdAfter(std::string_view previous, std::string_view line) {
  if (std::string c = CommitId(line); !c.empty()) return c;
  while (!previous.empty() && (previous.back() == ' ' || previous.back() == '\t')) previous.remove_suffix(1);
  if (previous.size() < 6) return "";
  std::string tail(previous.substr(previous.size() - 6));
  std::transform(tail.begin(), tail.end(), tail.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const bool word_start = previous.size() == 6 ||
                          !std::isalnum(static_cast<unsigned char>(previous[previous.size() - 7]));
  if (tail != "commit" || !word_start) return "";
  std::string_view rest = line;
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  if (rest.empty() || (rest.front() != '`' && rest.front() != '[')) return "";
  return CommitId("commit " + std::string(rest));
}

// The version of the newest release heading "## [X.Y.Z]" of a Keep a Changelog text
// (an "[Unreleased]" heading skipped, in any case; headings in code blocks are not
// headings), and its line; {"", 0} when there is none.
inline std::pair<std::string, int> NewestRelease(std::string_view text) {
  const std::vector<std::string_view> lines = SplitLines(text);
  const std::vector<bool> fenced = FencedLines(lines);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (fenced[i] || l.substr(0, 4) != "## [") continue;
    const std::size_t close = l.find(']');
    if (close == std::string_view::npos) continue;
    std::string v(l.substr(4, close - 4));
    std::string lower = v;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "unreleased") continue;
    return {v, static_cast<int>(i) + 1};
  }
  return {"", 0};
}

// ---------------------------------------------------------------------------------
// Links against a tree.

// The whole file, or "" when it cannot be read.
inline std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Whether GitHub renders the file as Markdown (and so gives its headings anchors).
inline bool IsMarkdown(const std::filesystem::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".md" || ext == ".markdown";
}

// The anchors of the Markdown files read so far, by path relative to the root.
using AnchorCache = std::map<std::string, std::set<std::string>>;

// The findings for the relative links of `text`, the Markdown file `rel` (relative to
// `root`), as GitHub resolves them: the path from rel's folder (from the root with a
// leading '/'), %-escapes decoded and a query dropped, must stay inside the root and
// exist; an #anchor must be a heading or HTML id of the Markdown file, or of a folder's
// README.md; another file has only its lines' anchors (#L12, #L12-L20). `checked`
// counts the relative links looked at.
inline std::vector<Finding> LinkFindings(const std::filesystem::path& root,
                                         const std::filesystem::path& rel, std::string_view text,
                                         AnchorCache& anchors, int& checked) {
  namespace fs = std::filesystem;
  const std::string file = rel.generic_string();
  std::vector<Finding> findings;
  for (const Link& link : Links(text)) {
    if (IsExternal(link.target)) continue;
    ++checked;
    const LinkTarget t = ParseLinkTarget(link.target);
    const fs::path target =
        t.path.empty() ? rel
                       : ((t.from_root ? fs::path() : rel.parent_path()) / t.path).lexically_normal();
    if (!t.path.empty() && (target.empty() || *target.begin() == "..")) {
      findings.push_back({file, link.line, "links to '" + link.target + "': it leaves the repository"});
      continue;
    }
    std::error_code ec;  // a name too long for the file system is simply not there
    if (!t.path.empty() && !fs::exists(root / target, ec)) {
      findings.push_back({file, link.line, "links to '" + link.target + "': no file '" +
                                               target.generic_string() + "'"});
      continue;
    }
    if (t.anchor.empty()) continue;
    fs::path page = target;  // a folder shows its README.md, anchors and all
    if (fs::is_directory(root / target, ec) && fs::is_regular_file(root / target / "README.md", ec)) {
      page = (target / "README.md").lexically_normal();
    }
    if (fs::is_directory(root / page, ec) || !IsMarkdown(page)) {
      if (!fs::is_directory(root / page, ec) && IsLineAnchor(t.anchor)) continue;
      findings.push_back({file, link.line, "links to '" + link.target +
                                               "': only a Markdown file has anchors (another "
                                               "file has its lines': #L12)"});
      continue;
    }
    auto [it, fresh] = anchors.try_emplace(page.generic_string());
    if (fresh) it->second = Anchors(ReadFile(root / page));
    if (!it->second.contains(t.anchor)) {
      findings.push_back({file, link.line, "links to '" + link.target + "': '" +
                                               page.generic_string() +
                                               "' has no heading with anchor '" + t.anchor + "'"});
    }
  }
  return findings;
}

}  // namespace inferq_docs
