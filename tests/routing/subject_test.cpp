#include "inferq/routing/subject.hpp"

#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/base/error.hpp"

using inferq::IsValidSubject;
using inferq::SubjectPattern;
using inferq::ValidateSubject;

namespace {
struct Case {
  std::string_view text;
  bool valid;
};
struct MatchCase {
  std::string_view pattern;
  std::string_view subject;
  bool matches;
};
}  // namespace

TEST_CASE("literal subjects: valid and invalid") {
  const Case cases[] = {
      {"a", true},
      {"infer.llama.request", true},
      {"a.b.c.d.e.f.g.h", true},
      {"A-b_c.9", true},
      {"a*", true},        // '*' inside a longer token is literal
      {"a.b>", true},      // '>' inside a longer token is literal
      {"*x.>y", true},
      {"ünïcödé.ok", true},
      {"", false},
      {".", false},
      {"a.", false},
      {".a", false},
      {"a..b", false},
      {"a b", false},
      {"a\tb", false},
      {"a.\nb", false},
      {"a\r", false},
      {" a", false},
      {"*", false},        // wildcards are not publishable
      {">", false},
      {"a.*", false},
      {"a.>", false},
      {"a.*.b", false},
  };
  for (const auto& c : cases) {
    INFO("subject '" << c.text << "'");
    CHECK(IsValidSubject(c.text) == c.valid);
  }
}

TEST_CASE("patterns: valid and invalid") {
  const Case cases[] = {
      {"a", true},        {"*", true},         {">", true},          {"a.*", true},
      {"a.>", true},      {"*.*.*", true},     {"a.*.>", true},      {"*.>", true},
      {"a*.b>", true},    {"", false},         {"a..b", false},      {"a.>.b", false},
      {">.a", false},     {"> ", false},       {"a. *", false},      {".>", false},
      {"a.", false},      {">.>", false},
  };
  for (const auto& c : cases) {
    INFO("pattern '" << c.text << "'");
    CHECK(SubjectPattern::Parse(c.text).ok() == c.valid);
  }
}

TEST_CASE("matching follows the NATS grammar") {
  const MatchCase cases[] = {
      {"a.b", "a.b", true},
      {"a.b", "a.c", false},
      {"a.b", "a.b.c", false},
      {"a.b.c", "a.b", false},
      {"a.*", "a.b", true},
      {"a.*", "a", false},
      {"a.*", "a.b.c", false},
      {"*.b", "a.b", true},
      {"*", "a", true},
      {"*", "a.b", false},
      {"*.*", "a.b", true},
      {"a.>", "a.b", true},
      {"a.>", "a.b.c.d", true},
      {"a.>", "a", false},          // '>' needs at least one token
      {">", "a", true},
      {">", "a.b.c", true},
      {"a.*.>", "a.b.c", true},
      {"a.*.>", "a.b", false},
      {"infer.*.request", "infer.llama.request", true},
      {"infer.*.request", "infer.llama.reply", false},
      {"a*", "a*", true},           // literal '*' character
      {"a*", "ab", false},
      {"a.b>", "a.b>", true},
      {"a.b>", "a.bc", false},
      {"a.>", "a..b", false},       // invalid subject matches nothing
      {">", "a..b", false},
      {"*", "", false},
      {">", "a.b.", false},
      {"a.*", "a.*", false},        // a wildcard is not a literal subject
      {"a.>", "a.>", false},
      {"a.>", "a.b c", false},      // white space in the tail
      {"abc", "ab", false},
      {"ab", "abc", false},
  };
  for (const auto& c : cases) {
    INFO("pattern '" << c.pattern << "' subject '" << c.subject << "'");
    auto p = SubjectPattern::Parse(c.pattern);
    REQUIRE(p.ok());
    CHECK(p->Matches(c.subject) == c.matches);
  }
}

TEST_CASE("errors name the value and the token position") {
  CHECK(std::string(ValidateSubject("a..b").message()) ==
        "subject 'a..b' has an empty token at position 2");
  CHECK(std::string(ValidateSubject("").message()) == "subject '' is empty");
  CHECK(std::string(ValidateSubject("a.b c").message()) ==
        "subject 'a.b c' contains white space at position 2 (byte 3)");
  CHECK(std::string(ValidateSubject("a.*").message()) ==
        "subject 'a.*' has the wildcard '*' at position 2; a published subject must be "
        "literal");
  CHECK(std::string(ValidateSubject("it's bad").message()) ==
        "subject 'it\\x27s bad' contains white space at position 1 (byte 4)");
  CHECK(std::string(ValidateSubject("a\nb").message()) ==
        "subject 'a\\x0ab' contains white space at position 1 (byte 1)");
  auto p = SubjectPattern::Parse("a.>.b");
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(p.status().message()) ==
        "subject pattern 'a.>.b' has '>' at position 2; '>' is valid only as the last token");
}

TEST_CASE("pattern accessors") {
  auto p = SubjectPattern::Parse("a.*.>");
  REQUIRE(p.ok());
  CHECK(p->text() == "a.*.>");
  CHECK(p->token_count() == 3);
  CHECK_FALSE(p->is_literal());
  auto q = SubjectPattern::Parse("a.b");
  REQUIRE(q.ok());
  CHECK(q->is_literal());
}

TEST_CASE("patterns overlap when some subject matches both") {
  const auto P = [](const char* s) {
    auto p = SubjectPattern::Parse(s);
    REQUIRE(p.ok());
    return *p;
  };
  struct Case {
    const char* a;
    const char* b;
    bool overlap;
  };
  for (const Case& c : {Case{"a.b", "a.b", true}, Case{"a.b", "a.c", false},
                        Case{"a.*", "*.b", true}, Case{"a.>", "a", false},
                        Case{"a.>", "a.b.c", true}, Case{">", "x", true},
                        Case{"*", "x.y", false}, Case{"a.*.c", "a.>", true},
                        Case{"a.*.c", "a.b.d", false}, Case{"a.b", "a.b.c", false},
                        Case{"a*.b", "ab.b", false}, Case{"a*.b", "a*.*", true},
                        Case{"zzz", "a.>", false}, Case{"*.*", ">", true}}) {
    INFO(c.a << " vs " << c.b);
    CHECK(P(c.a).Overlaps(P(c.b)) == c.overlap);
    CHECK(P(c.b).Overlaps(P(c.a)) == c.overlap);
  }
}

// The subject rules (routing/subject.hpp), written out plainly: the reference for the checks,
// whose quick path (one pass, nothing built) must agree with them on every string.
static bool ReferenceValid(std::string_view s, bool pattern) {
  std::vector<std::string_view> tokens;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      tokens.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const std::string_view tok = tokens[t];
    if (tok.empty()) return false;
    if (tok.find_first_of(" \t\n\v\f\r") != std::string_view::npos) return false;
    if (tok == "*" || tok == ">") {
      if (!pattern) return false;
      if (tok == ">" && t + 1 != tokens.size()) return false;
    }
  }
  return true;
}

TEST_CASE("subject and pattern checks agree with the rules on every string of up to 6 bytes") {
  const std::string alphabet = "a.*> \t";
  std::vector<std::string> strings = {""};
  for (std::size_t len = 1, from = 0; len <= 6; ++len) {
    const std::size_t to = strings.size();
    for (std::size_t i = from; i < to; ++i) {
      for (char c : alphabet) strings.push_back(strings[i] + c);
    }
    from = to;
  }
  REQUIRE(strings.size() == 55987);  // 1 + 6 + 6^2 + ... + 6^6
  std::size_t valid_subjects = 0, valid_patterns = 0;
  for (const std::string& s : strings) {
    const absl::Status subject = inferq::ValidateSubject(s);
    const auto pattern = inferq::SubjectPattern::Parse(s);
    INFO(inferq::QuoteValue(s) << ": " << subject << " / " << pattern.status());
    CHECK(subject.code() != absl::StatusCode::kInternal);
    CHECK(pattern.status().code() != absl::StatusCode::kInternal);
    CHECK(subject.ok() == ReferenceValid(s, false));
    CHECK(pattern.ok() == ReferenceValid(s, true));
    valid_subjects += subject.ok();
    valid_patterns += pattern.ok();
  }
  CHECK(valid_subjects == 1920);  // as the reference counts them
  CHECK(valid_patterns == 2406);
  // And by hand: a wildcard inside a longer token is a literal character.
  CHECK(inferq::ValidateSubject("a*.>a").ok());
  CHECK_FALSE(inferq::ValidateSubject("a.>").ok());
  CHECK(SubjectPattern::Parse("a.>").ok());
  CHECK_FALSE(SubjectPattern::Parse(">.a").ok());
  CHECK_FALSE(SubjectPattern::Parse("a.\t").ok());
}
