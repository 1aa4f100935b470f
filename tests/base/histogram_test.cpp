#include "inferq/base/histogram.hpp"

#include <limits>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using inferq::Histogram;
using inferq::HistogramSnapshot;
namespace hi = inferq::histogram_internal;

TEST_CASE("values below 64 are kept exactly") {
  HistogramSnapshot s;
  for (std::uint64_t v = 1; v <= 50; ++v) s.Record(v);
  CHECK(s.count() == 50);
  CHECK(s.Percentile(0.5) == 25);
  CHECK(s.Percentile(0.99) == 50);  // ceil(0.99 * 50) = 50th value
  CHECK(s.Percentile(0.0) == 1);
  CHECK(s.Percentile(1.0) == 50);
  CHECK(s.min() == 1);
  CHECK(s.max() == 50);
  CHECK(s.sum() == 1275);
  CHECK(s.mean() == Approx(25.5));
}

TEST_CASE("large values are reported within 1/32 above the truth") {
  for (std::uint64_t v : {64ull, 100ull, 1000ull, 123456ull, 987654321ull, 1ull << 40}) {
    HistogramSnapshot s;
    s.Record(v);
    s.Record(v * 4);
    const std::uint64_t p50 = s.Percentile(0.5);
    CHECK(p50 >= v);
    CHECK(p50 <= v + v / 32);
  }
}

TEST_CASE("bucket boundaries are consistent") {
  for (std::size_t b = 0; b + 1 < hi::kBuckets; ++b) {
    REQUIRE(hi::BucketOf(hi::BucketUpper(b)) == b);
    REQUIRE(hi::BucketOf(hi::BucketUpper(b) + 1) == b + 1);
  }
}

TEST_CASE("an empty histogram reports zeros") {
  HistogramSnapshot s;
  CHECK(s.count() == 0);
  CHECK(s.Percentile(0.5) == 0);
  CHECK(s.min() == 0);
  CHECK(s.max() == 0);
}

TEST_CASE("merge adds the records of both") {
  HistogramSnapshot a, b;
  a.Record(10, 3);
  b.Record(20, 1);
  a.Merge(b);
  CHECK(a.count() == 4);
  CHECK(a.Percentile(0.75) == 10);
  CHECK(a.Percentile(1.0) == 20);
  CHECK(a.min() == 10);
}

TEST_CASE("concurrent records are all counted") {
  Histogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.Record(static_cast<std::uint64_t>(t * 10 + 1));
    });
  }
  for (auto& t : threads) t.join();
  const HistogramSnapshot s = h.Snapshot();
  CHECK(s.count() == 40000);
  CHECK(s.min() == 1);
  CHECK(s.max() == 31);
  CHECK(s.sum() == 10000ull * (1 + 11 + 21 + 31));
}

TEST_CASE("a snapshot racing the first records is never torn") {
  // Was: count 1 with min UINT64_MAX and max 0, and Percentile clamped with min > max.
  for (int round = 0; round < 200; ++round) {
    Histogram h;
    std::atomic<bool> go{false};
    std::thread writer([&] {
      while (!go.load()) {
      }
      for (int i = 0; i < 50; ++i) h.Record(1000 + static_cast<std::uint64_t>(i));
    });
    go = true;
    for (int i = 0; i < 50; ++i) {
      const HistogramSnapshot s = h.Snapshot();
      if (s.count() == 0) continue;
      REQUIRE(s.min() <= s.max());
      const std::uint64_t p = s.Percentile(0.5);
      REQUIRE(p >= s.min());
      REQUIRE(p <= s.max());
    }
    writer.join();
  }
}

TEST_CASE("CountAtMost is exact at a bucket's upper bound and a lower bound between") {
  inferq::HistogramSnapshot h;
  h.Record(10, 2);
  h.Record(1000, 1);   // bucket [992, 1007]
  h.Record(1007, 1);
  h.Record(5000, 3);
  CHECK(h.CountAtMost(9) == 0);
  CHECK(h.CountAtMost(10) == 2);
  CHECK(h.CountAtMost(991) == 2);
  CHECK(h.CountAtMost(1000) == 2);  // 1000 and 1007 share a bucket that reaches past 1000
  CHECK(h.CountAtMost(1007) == 4);  // that bucket's upper bound: exact
  CHECK(h.CountAtMost(1'000'000) == 7);
  CHECK(h.CountAtMost(std::numeric_limits<std::uint64_t>::max()) == 7);
}

TEST_CASE("RecordMany counts as Record does, also past 8 buckets in one call") {
  // 12 distinct buckets (more than RecordMany gathers), repeats, and the extremes.
  std::vector<std::uint64_t> values;
  for (std::uint64_t v : {5ull, 5ull, 70ull, 1000ull, 5ull, 1ull << 20, 3ull, 63ull, 64ull, 65ull,
                          (1ull << 40) + 7, 9ull, 10ull, 11ull, 70ull, 0ull}) {
    values.push_back(v);
  }
  Histogram one_by_one;
  for (std::uint64_t v : values) one_by_one.Record(v);
  Histogram many;
  many.RecordMany(values);
  many.RecordMany({});  // nothing
  const HistogramSnapshot a = one_by_one.Snapshot();
  const HistogramSnapshot b = many.Snapshot();
  CHECK(b.count() == 16);
  CHECK(many.count() == 16);
  CHECK(b.sum() == a.sum());
  CHECK(b.min() == 0);
  CHECK(b.max() == a.max());
  for (std::uint64_t v : values) CHECK(b.CountAtMost(v) == a.CountAtMost(v));
  for (double q : {0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) CHECK(b.Percentile(q) == a.Percentile(q));
}
