// libFuzzer target: routing predicates on untrusted payloads. The input is an event
// payload; JSON rules of every operator and a JSON Schema evaluate it. Anything but
// a clean true/false (a crash, a sanitizer report, an exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "inferq/event/event.hpp"
#include "inferq/routing/predicate.hpp"

namespace {

inferq::Predicate Build() {
  using inferq::JsonOp;
  using inferq::Predicate;
  std::vector<Predicate> any;
  auto add = [&](absl::StatusOr<Predicate> p) {
    if (!p.ok()) std::abort();
    any.push_back(*std::move(p));
  };
  add(Predicate::Json("/a", JsonOp::kEq, "1"));
  add(Predicate::Json("/a/0/b", JsonOp::kLt, "2.5"));
  add(Predicate::Json("/s", JsonOp::kMatches, R"("^(a+)+$")"));
  add(Predicate::Json("/t", JsonOp::kIn, R"(["x", 3, null, {"k": [1]}])"));
  add(Predicate::Json("/~0~1", JsonOp::kExists, ""));
  add(Predicate::Json("", JsonOp::kNe, R"({"a": 1})"));
  add(Predicate::JsonSchema(R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
      "s": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 64}},
      "required": ["a"], "additionalProperties": {"type": ["array", "number"]}})"));
  return Predicate::Any(std::move(any));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const inferq::Predicate p = Build();
  inferq::Event e;
  e.subject = "fuzz";
  e.payload = inferq::Buffer::Copy(std::as_bytes(std::span<const std::uint8_t>(data, size)));
  (void)p.Matches(e);
  return 0;
}
