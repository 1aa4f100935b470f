#include "inferq/routing/subject.hpp"

#include <string>

#include "inferq/base/error.hpp"

namespace inferq {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// True when `s` is valid: the same rules as Validate below, in one pass without
// building anything (Publish checks every subject; Validate runs only to explain a
// failure).
bool QuickValid(std::string_view s, bool allow_wildcards) {
  if (s.empty()) return false;
  std::size_t token_bytes = 0;
  char first = 0;  // first byte of the current token
  auto wildcard_ok = [&](bool last) {
    if (token_bytes != 1 || (first != '*' && first != '>')) return true;
    return allow_wildcards && (first == '*' || last);  // '>' only as the last token
  };
  for (const char c : s) {
    if (c == '.') {
      if (token_bytes == 0 || !wildcard_ok(false)) return false;
      token_bytes = 0;
      continue;
    }
    if (static_cast<unsigned char>(c) <= ' ' && IsSpace(c)) return false;
    if (token_bytes++ == 0) first = c;
  }
  return token_bytes != 0 && wildcard_ok(true);
}

// Shared validation. `what` is "subject" or "subject pattern".
absl::Status Validate(std::string_view s, bool allow_wildcards, const char* what) {
  if (QuickValid(s, allow_wildcards)) return absl::OkStatus();
  if (s.empty()) return absl::InvalidArgumentError(std::string(what) + " '' is empty");
  std::size_t token = 1;
  std::size_t token_start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i < s.size() && IsSpace(s[i])) {
      return absl::InvalidArgumentError(std::string(what) + " " + QuoteValue(s) +
                                        " contains white space at position " +
                                        std::to_string(token) + " (byte " +
                                        std::to_string(i) + ")");
    }
    if (i == s.size() || s[i] == '.') {
      const std::string_view tok = s.substr(token_start, i - token_start);
      if (tok.empty()) {
        return absl::InvalidArgumentError(std::string(what) + " " + QuoteValue(s) +
                                          " has an empty token at position " +
                                          std::to_string(token));
      }
      if (tok == "*" || tok == ">") {
        if (!allow_wildcards) {
          return absl::InvalidArgumentError(std::string(what) + " " + QuoteValue(s) +
                                            " has the wildcard '" + std::string(tok) +
                                            "' at position " + std::to_string(token) +
                                            "; a published subject must be literal");
        }
        if (tok == ">" && i != s.size()) {
          return absl::InvalidArgumentError(
              std::string(what) + " " + QuoteValue(s) + " has '>' at position " +
              std::to_string(token) + "; '>' is valid only as the last token");
        }
      }
      ++token;
      token_start = i + 1;
    }
  }
  // QuickValid refused what these rules accept: a defect of this file, never of the
  // input (subject_fuzz aborts on it).
  return absl::InternalError(std::string(what) + " " + QuoteValue(s) +
                             ": the quick check and the full check disagree");
}

}  // namespace

absl::Status ValidateSubject(std::string_view subject) {
  return Validate(subject, /*allow_wildcards=*/false, "subject");
}

bool IsValidSubject(std::string_view subject) { return ValidateSubject(subject).ok(); }

absl::StatusOr<SubjectPattern> SubjectPattern::Parse(std::string_view pattern) {
  if (absl::Status s = Validate(pattern, /*allow_wildcards=*/true, "subject pattern");
      !s.ok()) {
    return s;
  }
  SubjectPattern p;
  p.text_ = std::string(pattern);
  std::size_t start = 0;
  for (std::size_t i = 0; i <= pattern.size(); ++i) {
    if (i == pattern.size() || pattern[i] == '.') {
      const std::string_view tok = pattern.substr(start, i - start);
      Kind kind = Kind::kLiteral;
      if (tok == "*") kind = Kind::kStar;
      if (tok == ">") kind = Kind::kTail;
      if (kind != Kind::kLiteral) p.literal_ = false;
      p.tokens_.push_back(Token{kind, start, tok.size()});
      start = i + 1;
    }
  }
  return p;
}

bool SubjectPattern::Matches(std::string_view subject) const {
  // One pass over the subject, validating it as we go (an invalid subject matches
  // nothing), without allocating.
  std::size_t ti = 0;      // pattern token index
  std::size_t start = 0;   // start of the current subject token
  bool in_tail = false;    // a '>' has consumed at least one token
  if (subject.empty()) return false;
  for (std::size_t i = 0; i <= subject.size(); ++i) {
    if (i < subject.size() && IsSpace(subject[i])) return false;
    if (i != subject.size() && subject[i] != '.') continue;
    const std::string_view tok = subject.substr(start, i - start);
    start = i + 1;
    if (tok.empty() || tok == "*" || tok == ">") return false;
    if (in_tail) continue;  // keep validating the rest of the subject
    if (ti == tokens_.size()) return false;  // subject longer than the pattern
    const Token& pt = tokens_[ti];
    switch (pt.kind) {
      case Kind::kTail:
        in_tail = true;
        break;
      case Kind::kStar:
        ++ti;
        break;
      case Kind::kLiteral:
        if (tok != std::string_view(text_).substr(pt.begin, pt.size)) return false;
        ++ti;
        break;
    }
  }
  return in_tail || ti == tokens_.size();
}

bool SubjectPattern::Overlaps(const SubjectPattern& other) const {
  const std::vector<Token>& a = tokens_;
  const std::vector<Token>& b = other.tokens_;
  for (std::size_t i = 0;; ++i) {
    const bool a_ended = i == a.size();
    const bool b_ended = i == b.size();
    // Without a '>' so far, a subject matched by both has exactly as many tokens.
    if (a_ended || b_ended) return a_ended && b_ended;
    // '>' takes one or more tokens, and the other pattern has at least one left here
    // (any of its tokens matches some literal token).
    if (a[i].kind == Kind::kTail || b[i].kind == Kind::kTail) return true;
    if (a[i].kind == Kind::kStar || b[i].kind == Kind::kStar) continue;
    if (std::string_view(text_).substr(a[i].begin, a[i].size) !=
        std::string_view(other.text_).substr(b[i].begin, b[i].size)) {
      return false;
    }
  }
}

}  // namespace inferq
