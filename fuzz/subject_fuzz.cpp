// libFuzzer target: the subject index against one-by-one pattern matching.
//
// Input: lines separated by '\n'. The first line is the subject; every other line is
// a pattern, inserted with its line number as the value (invalid ones are rejected
// and must change nothing). Match must return exactly the values whose patterns
// SubjectPattern::Matches accepts, each once, in insertion order — with the cache
// on (matched twice: a miss, then a hit) and off. ValidateSubject agrees with
// Parse + Matches on the subject line. And SubjectPattern::Overlaps is
// symmetric and holds for every two patterns that both match the subject.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "inferq/routing/subject.hpp"
#include "inferq/routing/subject_index.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= input.size(); ++i) {
    if (i == input.size() || input[i] == '\n') {
      lines.push_back(input.substr(start, i - start));
      start = i + 1;
    }
  }
  if (lines.size() < 2 || lines.size() > 64) return 0;
  const std::string_view subject = lines[0];
  // Publish's check of a subject agrees with Parse + Matches, which validate it in
  // their own passes: a valid subject is a literal pattern that matches itself.
  const absl::Status valid = inferq::ValidateSubject(subject);
  if (valid.code() == absl::StatusCode::kInternal) std::abort();
  const auto self = inferq::SubjectPattern::Parse(subject);
  if (valid.ok() != (self.ok() && self->Matches(subject))) std::abort();
  inferq::SubjectIndex<int> cached({.cache_entries = 8});
  inferq::SubjectIndex<int> uncached({.cache_entries = 0});
  std::vector<int> expected;
  std::vector<inferq::SubjectPattern> parsed;
  std::vector<bool> matches;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    auto p = inferq::SubjectPattern::Parse(lines[i]);
    if (p.status().code() == absl::StatusCode::kInternal) std::abort();
    if (p.ok()) {
      parsed.push_back(*p);
      matches.push_back(p->Matches(subject));
    }
    const absl::Status a = cached.Insert(lines[i], static_cast<int>(i));
    const absl::Status b = uncached.Insert(lines[i], static_cast<int>(i));
    if (a.ok() != p.ok() || b.ok() != p.ok()) std::abort();  // validation agrees with Parse
    if (p.ok() && p->Matches(subject)) expected.push_back(static_cast<int>(i));
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<int> got;
    cached.Match(subject, &got);
    if (got != expected) std::abort();
  }
  std::vector<int> got;
  uncached.Match(subject, &got);
  if (got != expected) std::abort();
  for (std::size_t i = 0; i < parsed.size(); ++i) {
    for (std::size_t j = 0; j < parsed.size(); ++j) {
      const bool overlap = parsed[i].Overlaps(parsed[j]);
      if (overlap != parsed[j].Overlaps(parsed[i])) std::abort();
      if (matches[i] && matches[j] && !overlap) std::abort();
    }
  }
  return 0;
}
