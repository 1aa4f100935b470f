// Proves that SubjectIndex::Match makes no general-heap allocation on a cache hit
// (and, with the cache off, on a miss of a short subject) once *out has capacity:
// this binary replaces the global operator new and counts every call.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "../alloc_counter.hpp"

#include "inferq/routing/subject_index.hpp"


namespace {
// Subjects longer than the small-string buffer, so that a cached key is on the heap.
const std::vector<std::string> kSubjects = {
    "infer.llama-3-70b-instruct.tenant-0001.request",
    "infer.llama-3-70b-instruct.tenant-0002.request",
    "infer.mistral-7b.tenant-0001.request",
    "infer.mistral-7b.tenant-0003.request",
};

inferq::SubjectIndex<int> Build(inferq::SubjectIndexOptions options) {
  inferq::SubjectIndex<int> index(options);
  int v = 0;
  for (const std::string& s : kSubjects) REQUIRE(index.Insert(s, v++).ok());
  REQUIRE(index.Insert("infer.*.tenant-0001.request", v++).ok());
  REQUIRE(index.Insert("infer.mistral-7b.>", v++).ok());
  REQUIRE(index.Insert(">", v++).ok());
  return index;
}
}  // namespace

TEST_CASE("a cache hit makes zero allocations when the output has capacity") {
  const inferq::SubjectIndex<int> index = Build({});
  std::vector<int> out;
  out.reserve(64);
  for (const std::string& s : kSubjects) index.Match(s, &out);  // fill the cache
  out.clear();
  allocations = 0;
  counting = true;
  std::size_t matched = 0;
  for (int round = 0; round < 1000; ++round) {
    for (const std::string& s : kSubjects) {
      out.clear();
      matched += index.Match(s, &out);
    }
  }
  counting = false;
  CHECK(allocations.load() == 0);
  // 3 + 2 + 4 + 3 values per round (literal, '>', and the '*' or mistral.> ones).
  CHECK(matched == 1000 * 12);
  CHECK(index.Stats().cache_hits == 4000);
}

TEST_CASE("with the cache off a miss of a short subject makes zero allocations") {
  const inferq::SubjectIndex<int> index = Build({.cache_entries = 0});
  std::vector<int> out;
  out.reserve(64);
  allocations = 0;
  counting = true;
  std::size_t matched = 0;
  for (int round = 0; round < 1000; ++round) {
    for (const std::string& s : kSubjects) {
      out.clear();
      matched += index.Match(s, &out);
    }
  }
  counting = false;
  CHECK(allocations.load() == 0);
  CHECK(matched == 1000 * 12);
}
