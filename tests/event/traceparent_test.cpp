// Tests of the W3C traceparent header (inferq/event/traceparent.hpp).
#include "inferq/event/traceparent.hpp"

#include <catch2/catch.hpp>

using inferq::FormatTraceparent;
using inferq::ParseTraceparent;
using inferq::TraceContext;

namespace {

// The example of the W3C specification, section 3.2.2.
constexpr std::string_view kExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TraceContext ExampleTrace() {
  TraceContext t;
  t.trace_id = {0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6,
                0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36};
  t.span_id = {0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7};
  t.flags = 0x01;
  return t;
}

}  // namespace

TEST_CASE("traceparent: the specification's example reads and writes back") {
  auto t = ParseTraceparent(kExample);
  REQUIRE(t.ok());
  CHECK(*t == ExampleTrace());
  CHECK(FormatTraceparent(*t) == kExample);
  TraceContext unsampled = ExampleTrace();
  unsampled.flags = 0;
  CHECK(FormatTraceparent(unsampled) == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
}

TEST_CASE("traceparent: no trace context formats as nothing") {
  CHECK(FormatTraceparent(TraceContext{}).empty());
  TraceContext no_span = ExampleTrace();
  no_span.span_id = {};
  CHECK(FormatTraceparent(no_span).empty());
}

TEST_CASE("traceparent: a later version is read by its first 55 characters") {
  auto t = ParseTraceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-adds");
  REQUIRE(t.ok());
  CHECK(*t == ExampleTrace());
  auto exact = ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  REQUIRE(exact.ok());
  CHECK(*exact == ExampleTrace());
}

TEST_CASE("traceparent: bad values are refused, naming the value and the fault") {
  struct Case {
    std::string value;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "traceparent '' is 0 characters long, not 55"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
       "traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0' is 54 characters long, not 55"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
       "traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-' is 56 characters long, "
       "not 55 (version 00)"},
      {"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
       "traceparent 'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' has the invalid version ff"},
      {"0G-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
       "traceparent '0G-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' has no version of 2 "
       "lowercase hex digits"},
      {"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
       "traceparent '00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01' has a trace-id that is not "
       "32 lowercase hex digits"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
       "traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01' has a parent-id that is not "
       "16 lowercase hex digits"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-x1",
       "traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-x1' has trace-flags that are "
       "not 2 lowercase hex digits"},
      {"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
       "traceparent '00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' is not "
       "version-traceid-parentid-flags separated by '-'"},
      {"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
       "traceparent '00-00000000000000000000000000000000-00f067aa0ba902b7-01' has an all-zero trace-id"},
      {"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
       "traceparent '00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01' has an all-zero parent-id"},
      {"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
       "traceparent 'cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x' has no '-' after its "
       "first 55 characters"},
  };
  for (const Case& c : cases) {
    INFO(c.value);
    auto t = ParseTraceparent(c.value);
    REQUIRE_FALSE(t.ok());
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(t.status().message()) == c.message);
  }
  const std::string longer = "cc-" + std::string(100, 'a');
  auto t = ParseTraceparent(longer);
  REQUIRE_FALSE(t.ok());
  CHECK(std::string(t.status().message()) ==
        "traceparent '" + longer.substr(0, 64) + "...' has no '-' after its first 55 characters");
}
