/// @file inferq/routing/subject.hpp
///
/// Subjects and subject patterns, with the grammar of NATS:
///  - a subject is a non-empty sequence of tokens separated by '.';
///  - empty tokens ("a..b", ".a", "a.") and white space (' ', `\t`, `\n`, `\v`, `\f`, `\r`)
///    anywhere are invalid;
///  - in a pattern, the token "*" matches exactly one token and the token ">" matches
///    one or more trailing tokens and is valid only as the last token;
///  - '*' or '>' inside a longer token ("a*", ">b") is an ordinary character;
///  - a publishable (literal) subject contains no "*" or ">" token.
///
/// A subject that is not valid matches no pattern.
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::SubjectPattern> p = inferq::SubjectPattern::Parse("infer.*.request");
///   if (!p.ok()) return p.status();          // InvalidArgument naming the pattern
///   bool m = p->Matches("infer.llama.request");   // true
/// @endcode
///
/// Thread safety: SubjectPattern is immutable after Parse; const methods may run on
/// any number of threads.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferq {

/// True when `subject` is a valid literal subject (no wildcard tokens).
bool IsValidSubject(std::string_view subject);

/// OK for a valid literal subject; otherwise InvalidArgument naming the subject and
/// the first problem with its 1-based token position, e.g.
/// "subject 'a..b' has an empty token at position 2".
absl::Status ValidateSubject(std::string_view subject);

/// A parsed subject pattern (see the file comment for the grammar).
class SubjectPattern {
 public:
  /// Parses a pattern. InvalidArgument (naming the pattern and the token position)
  /// for an empty pattern, an empty token, white space, or '>' before the last token.
  static absl::StatusOr<SubjectPattern> Parse(std::string_view pattern);

  /// True when the literal subject `subject` matches. False for an invalid subject
  /// (including one with wildcard tokens: a pattern is not a subject).
  bool Matches(std::string_view subject) const;

  /// True when some literal subject matches both patterns (NATS's "subjects
  /// collide"): "a.*" and "*.b" overlap (a.b), "a.>" and "a" do not. Symmetric.
  bool Overlaps(const SubjectPattern& other) const;

  /// The pattern text as given to Parse.
  const std::string& text() const { return text_; }
  /// True when the pattern has no wildcard token.
  bool is_literal() const { return literal_; }
  /// Number of tokens (the dot-separated parts).
  std::size_t token_count() const { return tokens_.size(); }

  /// Equal when the texts are.
  friend bool operator==(const SubjectPattern& a, const SubjectPattern& b) {
    return a.text_ == b.text_;
  }

 private:
  enum class Kind : unsigned char { kLiteral, kStar, kTail };
  struct Token {
    Kind kind;
    std::size_t begin;  ///< into text_
    std::size_t size;
  };
  SubjectPattern() = default;

  std::string text_;
  std::vector<Token> tokens_;
  bool literal_ = true;
};

}  // namespace inferq
