#include "inferq/routing/predicate.hpp"

#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/base/error.hpp"
#include "routing/predicate_internal.hpp"

using inferq::Event;
using inferq::JsonOp;
using inferq::JsonSchemaDraft;
using inferq::JsonSchemaOptions;
using inferq::Predicate;
using inferq::PayloadCodec;
using inferq::PredicateStats;
using inferq::Qos;

namespace {

Event WithPayload(std::string_view payload) {
  Event e;
  e.payload = inferq::Buffer::FromString(payload);
  return e;
}

Event WithHeaders(std::vector<std::pair<std::string, std::string>> headers) {
  Event e;
  for (auto& [k, v] : headers) e.headers.Set(std::move(k), std::move(v));
  return e;
}

Event WithTag(std::string tag) {
  Event e;
  e.semantic_tag = std::move(tag);
  return e;
}

Predicate Must(absl::StatusOr<Predicate> p) {
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  return *std::move(p);
}

std::string ErrorOf(const absl::StatusOr<Predicate>& p) {
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(p.status().message());
}

bool Eval(std::string_view pointer, JsonOp op, std::string_view operand, std::string_view payload) {
  return Must(Predicate::Json(pointer, op, operand)).Matches(WithPayload(payload));
}

bool SameStats(const PredicateStats& a, const PredicateStats& b) {
  return a.evaluated == b.evaluated && a.matched == b.matched &&
         a.invalid_json == b.invalid_json && a.limit_exceeded == b.limit_exceeded;
}

std::string Nested(std::size_t depth, std::string_view inner) {
  return std::string(depth, '[') + std::string(inner) + std::string(depth, ']');
}

}  // namespace

TEST_CASE("a default predicate matches everything and counts nothing") {
  const Predicate p;
  CHECK(p.is_trivial());
  CHECK(p.Matches(Event{}));
  CHECK(p.Matches(WithPayload("not json")));
  CHECK(SameStats(p.Stats(), PredicateStats{}));
  CHECK(p.DebugString() == "true");
  CHECK_FALSE(Predicate::All({}).is_trivial());
}

TEST_CASE("header names are exact keys: never a prefix, a suffix or another case") {
  const Predicate p = Must(Predicate::HeadersAll({{"model", "llama"}}));
  CHECK(p.Matches(WithHeaders({{"model", "llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"model_version", "llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"xmodel", "llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"mode", "llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"Model", "llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"model ", "llama"}})));
  CHECK_FALSE(p.Matches(Event{}));
  // Values are exact too.
  CHECK_FALSE(p.Matches(WithHeaders({{"model", "llama2"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"model", "Llama"}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"model", ""}})));
  CHECK(p.Matches(WithHeaders({{"model_version", "3"}, {"xmodel", "x"}, {"model", "llama"}})));
  CHECK(SameStats(p.Stats(), PredicateStats{11, 2, 0, 0}));
}

TEST_CASE("a header without a value means present with any value, empty included") {
  const Predicate p = Must(Predicate::HeadersAll({{"trace", std::nullopt}}));
  CHECK(p.Matches(WithHeaders({{"trace", "abc"}})));
  CHECK(p.Matches(WithHeaders({{"trace", ""}})));
  CHECK_FALSE(p.Matches(WithHeaders({{"traceparent", "abc"}})));
  CHECK_FALSE(p.Matches(Event{}));
  const Predicate empty_value = Must(Predicate::HeadersAll({{"trace", ""}}));
  CHECK(empty_value.Matches(WithHeaders({{"trace", ""}})));
  CHECK_FALSE(empty_value.Matches(WithHeaders({{"trace", "abc"}})));
}

TEST_CASE("headers_all needs every entry, headers_any one of them") {
  const std::vector<Predicate::HeaderRule> rules = {{"model", "llama"}, {"tier", std::nullopt}};
  const Predicate all = Must(Predicate::HeadersAll(rules));
  const Predicate any = Must(Predicate::HeadersAny(rules));
  const Event both = WithHeaders({{"tier", "gold"}, {"model", "llama"}});
  const Event model_only = WithHeaders({{"model", "llama"}});
  const Event tier_only = WithHeaders({{"tier", "bronze"}});
  const Event wrong_model = WithHeaders({{"model", "mistral"}});
  CHECK(all.Matches(both));
  CHECK_FALSE(all.Matches(model_only));
  CHECK_FALSE(all.Matches(tier_only));
  CHECK_FALSE(all.Matches(wrong_model));
  CHECK(any.Matches(both));
  CHECK(any.Matches(model_only));
  CHECK(any.Matches(tier_only));
  CHECK_FALSE(any.Matches(wrong_model));
  CHECK_FALSE(any.Matches(Event{}));
  CHECK(all.DebugString() == "headers_all{model=llama, tier}");
  CHECK(any.DebugString() == "headers_any{model=llama, tier}");
}

TEST_CASE("header rules reject an empty list and an empty name") {
  CHECK(ErrorOf(Predicate::HeadersAll({})) == "HeadersAll needs at least one header");
  CHECK(ErrorOf(Predicate::HeadersAny({})) == "HeadersAny needs at least one header");
  CHECK(ErrorOf(Predicate::HeadersAll({{"a", "1"}, {"", "x\n"}})) ==
        "HeadersAll: header 1 has an empty name (value 'x\\x0a')");
  CHECK(ErrorOf(Predicate::HeadersAny({{"", std::nullopt}})) ==
        "HeadersAny: header 0 has an empty name");
}

TEST_CASE("a rule on a first-class attribute reads the attribute") {
  // Was: HeadersAll({{"model", "llama"}}) looked only at the headers, so an event with
  // e.model = "llama" matched nothing.
  Event e;
  e.model = "llama";
  const Predicate model = Must(Predicate::HeadersAll({{"model", "llama"}}));
  CHECK(model.Matches(e));
  e.model = "mistral";
  CHECK_FALSE(model.Matches(e));
  e.headers.Set("model", "llama");  // the attribute is set: the header is not read
  CHECK_FALSE(model.Matches(e));
  e.model.clear();  // not set: the header of that name is
  CHECK(model.Matches(e));

  SECTION("strings: model_version, tenant, semantic_tag; present means not empty") {
    Event a;
    a.model_version = "3.1";
    a.tenant = "acme";
    a.semantic_tag = "summarize";
    CHECK(Must(Predicate::HeadersAll({{"model_version", "3.1"}, {"tenant", "acme"},
                                      {"semantic_tag", "summarize"}})).Matches(a));
    CHECK_FALSE(Must(Predicate::HeadersAll({{"tenant", "acm"}})).Matches(a));
    CHECK(Must(Predicate::HeadersAll({{"tenant", std::nullopt}})).Matches(a));
    CHECK_FALSE(Must(Predicate::HeadersAll({{"model", std::nullopt}})).Matches(a));
  }
  SECTION("qos, priority and codec are always present") {
    Event a;
    a.qos = Qos::kGold;
    a.priority = -7;
    a.codec = PayloadCodec::kZstd;
    CHECK(Must(Predicate::HeadersAll({{"qos", "gold"}, {"priority", "-7"}, {"codec", "zstd"}}))
              .Matches(a));
    CHECK_FALSE(Must(Predicate::HeadersAny({{"qos", "silver"}, {"qos", "bronze"},
                                            {"priority", "7"}, {"codec", "none"}}))
                    .Matches(a));
    CHECK(Must(Predicate::HeadersAll({{"qos", std::nullopt}, {"priority", std::nullopt}}))
              .Matches(Event{}));
    CHECK(Must(Predicate::HeadersAll({{"qos", "silver"}, {"priority", "0"}, {"codec", "none"}}))
              .Matches(Event{}));  // the defaults
    a.headers.Set("qos", "silver");  // never read: qos is always set
    CHECK_FALSE(Must(Predicate::HeadersAll({{"qos", "silver"}})).Matches(a));
  }
  SECTION("schema_id and schema_version: the attribute when not 0") {
    Event a;
    a.schema_id = 42;
    a.schema_version = 3;
    const Predicate p = Must(Predicate::HeadersAll({{"schema_id", "42"}, {"schema_version", "3"}}));
    CHECK(p.Matches(a));
    a.schema_version = 4;
    CHECK_FALSE(p.Matches(a));
    CHECK_FALSE(Must(Predicate::HeadersAll({{"schema_id", std::nullopt}})).Matches(Event{}));
    Event h;
    h.headers.Set("schema_id", "42");
    CHECK(Must(Predicate::HeadersAll({{"schema_id", "42"}})).Matches(h));
  }
  CHECK(Must(Predicate::HeadersAll({{"qos", "gold"}, {"model", "llama"}})).DebugString() ==
        "headers_all{qos=gold, model=llama}");
}

TEST_CASE("a rule on a typed attribute refuses a value the attribute cannot have") {
  CHECK(ErrorOf(Predicate::HeadersAll({{"qos", "platinum"}})) ==
        "HeadersAll: header 0 names the attribute 'qos', whose value 'platinum' is not a tier: "
        "gold, silver or bronze");
  CHECK(ErrorOf(Predicate::HeadersAny({{"model", "x"}, {"codec", "gzip"}})) ==
        "HeadersAny: header 1 names the attribute 'codec', whose value 'gzip' is not a codec: "
        "none or zstd");
  CHECK(ErrorOf(Predicate::HeadersAll({{"priority", "2147483648"}})) ==
        "HeadersAll: header 0 names the attribute 'priority', whose value '2147483648' is not a "
        "decimal integer in -2147483648..2147483647");
  CHECK(ErrorOf(Predicate::HeadersAll({{"schema_version", "-1"}})) ==
        "HeadersAll: header 0 names the attribute 'schema_version', whose value '-1' is not a "
        "decimal integer in 0..4294967295");
  CHECK(ErrorOf(Predicate::HeadersAll({{"priority", " 1"}})) ==
        "HeadersAll: header 0 names the attribute 'priority', whose value ' 1' is not a "
        "decimal integer in -2147483648..2147483647");
  CHECK(ErrorOf(Predicate::HeadersAll({{"qos", "Gold"}})).find("'Gold' is not a tier") !=
        std::string::npos);
}

TEST_CASE("tag_in matches the exact semantic tag") {
  const Predicate p = Must(Predicate::TagIn({"summarize", "tool.search", "summarize"}));
  CHECK(p.Matches(WithTag("summarize")));
  CHECK(p.Matches(WithTag("tool.search")));
  CHECK_FALSE(p.Matches(WithTag("summarize2")));
  CHECK_FALSE(p.Matches(WithTag("summ")));
  CHECK_FALSE(p.Matches(WithTag("tool")));
  CHECK_FALSE(p.Matches(WithTag("Summarize")));
  CHECK_FALSE(p.Matches(WithTag("")));
  CHECK(p.DebugString() == "tag_in{summarize, tool.search}");  // duplicates dropped
  const Predicate untagged = Must(Predicate::TagIn({""}));
  CHECK(untagged.Matches(Event{}));
  CHECK_FALSE(untagged.Matches(WithTag("x")));
  CHECK(ErrorOf(Predicate::TagIn({})) == "TagIn needs at least one tag");
}

namespace {
struct JsonCase {
  std::string_view pointer;
  JsonOp op;
  std::string_view operand;
  bool expected;
};

void CheckCases(std::string_view payload, const std::vector<JsonCase>& cases) {
  for (const JsonCase& c : cases) {
    INFO("payload " << payload << "; json(" << c.pointer << " " << inferq::JsonOpName(c.op)
                    << " " << c.operand << ")");
    CHECK(Eval(c.pointer, c.op, c.operand, payload) == c.expected);
  }
}
}  // namespace

TEST_CASE("json numbers compare numerically and exactly") {
  const std::string_view doc =
      R"({"t": 0.7, "n": 3, "neg": -2, "big": 9007199254740993, "u64": 18446744073709551615,
          "i64min": -9223372036854775808, "zero": -0.0, "e": 1e2, "f": 2.5})";
  CheckCases(doc, {
      {"/t", JsonOp::kLt, "1", true},
      {"/t", JsonOp::kLt, "0.7", false},
      {"/t", JsonOp::kLe, "0.7", true},
      {"/t", JsonOp::kGt, "0.69999", true},
      {"/t", JsonOp::kGe, "0.8", false},
      {"/t", JsonOp::kEq, "0.7", true},
      {"/t", JsonOp::kNe, "0.7", false},
      {"/n", JsonOp::kEq, "3.0", true},   // 3 == 3.0
      {"/n", JsonOp::kEq, "3", true},
      {"/n", JsonOp::kNe, "4", true},
      {"/n", JsonOp::kGt, "2.9999", true},
      {"/n", JsonOp::kLt, "3.0000001", true},
      {"/neg", JsonOp::kLt, "-1", true},
      {"/neg", JsonOp::kGt, "-2.5", true},
      {"/neg", JsonOp::kLt, "18446744073709551615", true},
      // 2^53 + 1 is not the double 2^53 (a double comparison would say equal).
      {"/big", JsonOp::kEq, "9007199254740992.0", false},
      {"/big", JsonOp::kGt, "9007199254740992.0", true},
      {"/big", JsonOp::kEq, "9007199254740993", true},
      {"/big", JsonOp::kGt, "9007199254740992", true},
      // uint64 max and -1 share a bit pattern; they are not equal.
      {"/u64", JsonOp::kEq, "-1", false},
      {"/u64", JsonOp::kGt, "-1", true},
      {"/u64", JsonOp::kLt, "1.8446744073709552e19", true},  // that double is 2^64
      {"/u64", JsonOp::kGt, "18446744073709549568.0", true},  // the double below 2^64
      {"/i64min", JsonOp::kLt, "-9223372036854775807", true},
      {"/i64min", JsonOp::kEq, "-9223372036854775808.0", true},  // -2^63 is exact
      {"/i64min", JsonOp::kGt, "-1e300", true},
      {"/zero", JsonOp::kEq, "0", true},
      {"/e", JsonOp::kEq, "100", true},
      {"/f", JsonOp::kGt, "2", true},
      {"/f", JsonOp::kLt, "3", true},
      {"/f", JsonOp::kEq, "2", false},
      // A number operand against a value of another kind is false, both ways.
      {"/t", JsonOp::kLt, "\"1\"", false},
      {"/t", JsonOp::kEq, "\"0.7\"", false},
      {"/t", JsonOp::kNe, "\"0.7\"", true},
  });
}

TEST_CASE("json strings compare by bytes, bools and null by value") {
  const std::string_view doc =
      R"({"model": "llama", "up": "Z", "acc": "é", "on": true, "off": false, "nil": null,
          "empty": "", "nul": "a\u0000b"})";
  CheckCases(doc, {
      {"/model", JsonOp::kEq, R"("llama")", true},
      {"/model", JsonOp::kEq, R"("Llama")", false},
      {"/model", JsonOp::kNe, R"("mistral")", true},
      {"/model", JsonOp::kLt, R"("llamb")", true},
      {"/model", JsonOp::kLt, R"("llama2")", true},  // a prefix sorts first
      {"/model", JsonOp::kGt, R"("llam")", true},
      {"/model", JsonOp::kGe, R"("llama")", true},
      {"/model", JsonOp::kLe, R"("ll")", false},
      {"/up", JsonOp::kLt, R"("a")", true},           // 'Z' (0x5a) < 'a' (0x61)
      {"/acc", JsonOp::kGt, R"("z")", true},          // 0xc3 > 'z': unsigned bytes
      {"/acc", JsonOp::kEq, R"("\u00e9")", true},     // escapes are decoded
      {"/empty", JsonOp::kLt, R"("a")", true},
      {"/empty", JsonOp::kEq, R"("")", true},
      {"/nul", JsonOp::kEq, R"("a\u0000b")", true},   // NUL inside a string counts
      {"/nul", JsonOp::kEq, R"("a")", false},
      {"/model", JsonOp::kLt, "1", false},            // string vs number: false
      {"/on", JsonOp::kEq, "true", true},
      {"/on", JsonOp::kEq, "false", false},
      {"/on", JsonOp::kNe, "false", true},
      {"/on", JsonOp::kEq, "1", false},               // no truthiness
      {"/off", JsonOp::kEq, "false", true},
      {"/nil", JsonOp::kEq, "null", true},
      {"/nil", JsonOp::kNe, "null", false},
      {"/nil", JsonOp::kEq, "0", false},
      {"/nil", JsonOp::kEq, R"("")", false},
      {"/on", JsonOp::kLt, R"("z")", false},
  });
}

TEST_CASE("json arrays and objects compare by value, and in tests membership") {
  const std::string_view doc =
      R"({"tags": ["a", 1, [2, {"x": null}]], "cfg": {"k": 1, "m": {"n": [true]}},
          "lang": "fr", "n": 2})";
  CheckCases(doc, {
      {"/tags", JsonOp::kEq, R"(["a", 1.0, [2, {"x": null}]])", true},
      {"/tags", JsonOp::kEq, R"(["a", 1, [2, {"x": 0}]])", false},
      {"/tags", JsonOp::kEq, R"([1, "a", [2, {"x": null}]])", false},  // order counts
      {"/tags", JsonOp::kEq, R"(["a", 1])", false},
      {"/tags", JsonOp::kNe, R"(["a"])", true},
      {"/cfg", JsonOp::kEq, R"({"m": {"n": [true]}, "k": 1})", true},  // member order not
      {"/cfg", JsonOp::kEq, R"({"k": 1})", false},
      {"/cfg", JsonOp::kEq, R"({"k": 1, "m": {"n": [true]}, "z": 0})", false},
      {"/cfg", JsonOp::kEq, R"({"k": 1, "k": 1})", false},  // duplicates do not fool it
      {"/cfg", JsonOp::kLt, "1", false},
      {"/lang", JsonOp::kIn, R"(["en", "fr", "de"])", true},
      {"/lang", JsonOp::kIn, R"(["en", "de"])", false},
      {"/lang", JsonOp::kIn, "[]", false},
      {"/n", JsonOp::kIn, R"(["2", 2.0])", true},
      {"/n", JsonOp::kIn, R"(["2", 3])", false},
      {"/cfg/m", JsonOp::kIn, R"([{"n": [true]}])", true},
      {"/tags/2", JsonOp::kIn, R"([[2, {"x": null}]])", true},
  });
}

TEST_CASE("json pointers: nesting, escapes, array indices, the whole document") {
  const std::string_view doc =
      R"({"a": {"b": {"c": 7}}, "a/b": 1, "m~n": 2, "~1": 3, "": 4, " ": 5,
          "arr": [10, {"x": "y"}, [30, 31]], "10": "ten", "dup": 1, "dup": 2})";
  CheckCases(doc, {
      {"/a/b/c", JsonOp::kEq, "7", true},
      {"/a/b", JsonOp::kEq, R"({"c": 7})", true},
      {"/a~1b", JsonOp::kEq, "1", true},        // ~1 is '/'
      {"/m~0n", JsonOp::kEq, "2", true},        // ~0 is '~'
      {"/~01", JsonOp::kEq, "3", true},         // "~01" is "~1", not "/"
      {"/", JsonOp::kEq, "4", true},            // the empty name
      {"/ ", JsonOp::kEq, "5", true},
      {"/arr/0", JsonOp::kEq, "10", true},
      {"/arr/1/x", JsonOp::kEq, R"("y")", true},
      {"/arr/2/1", JsonOp::kEq, "31", true},
      {"/arr/3", JsonOp::kExists, "", false},   // past the end
      {"/arr/-", JsonOp::kExists, "", false},   // "-" is the element after the last
      {"/arr/01", JsonOp::kExists, "", false},  // leading zero: not an index
      {"/arr/+1", JsonOp::kExists, "", false},
      {"/arr/x", JsonOp::kExists, "", false},
      {"/arr/99999999999999999999999", JsonOp::kExists, "", false},
      {"/10", JsonOp::kEq, R"("ten")", true},   // digits name an object member
      {"/a/b/c/d", JsonOp::kExists, "", false}, // through a number
      {"/dup", JsonOp::kEq, "1", true},         // the first of duplicate names
      {"", JsonOp::kExists, "", true},
      {"", JsonOp::kEq, R"({"a": 1})", false},
  });
  CHECK(Eval("", JsonOp::kEq, "[1, 2]", "[1,2]"));
  CHECK(Eval("", JsonOp::kEq, R"("s")", R"("s")"));
  CHECK(Eval("/0", JsonOp::kEq, "5", "[5]"));
  CHECK(Eval("", JsonOp::kMatches, R"("^x+$")", R"("xxx")"));
}

TEST_CASE("a missing value makes every op false, != and exists included") {
  const std::string_view doc = R"({"a": 1, "nil": null})";
  for (JsonOp op : {JsonOp::kEq, JsonOp::kNe, JsonOp::kLt, JsonOp::kLe, JsonOp::kGt,
                    JsonOp::kGe}) {
    INFO(inferq::JsonOpName(op));
    CHECK_FALSE(Eval("/b", op, "1", doc));
  }
  CHECK_FALSE(Eval("/b", JsonOp::kIn, "[1]", doc));
  CHECK_FALSE(Eval("/b", JsonOp::kExists, "", doc));
  CHECK_FALSE(Eval("/b", JsonOp::kMatches, R"("")", doc));
  CHECK(Eval("/nil", JsonOp::kExists, "", doc));  // present with the value null
  CHECK(Eval("/a", JsonOp::kExists, "whatever: ignored", doc));
  // not(==) is true where != is false: exactly on a missing value.
  const Predicate negated_eq = Predicate::Not(Must(Predicate::Json("/b", JsonOp::kEq, "1")));
  CHECK(negated_eq.Matches(WithPayload(doc)));
}

TEST_CASE("matches searches string values with RE2, never other kinds") {
  const std::string_view doc =
      R"({"model": "llama-3-70b", "n": 70, "multi": "line1\nline2", "u": "日本語"})";
  CheckCases(doc, {
      {"/model", JsonOp::kMatches, R"("^llama-\\d+")", true},
      {"/model", JsonOp::kMatches, R"("70b$")", true},
      {"/model", JsonOp::kMatches, R"("3-70")", true},       // a search, not anchored
      {"/model", JsonOp::kMatches, R"("^70")", false},
      {"/model", JsonOp::kMatches, R"("LLAMA")", false},     // case-sensitive
      {"/model", JsonOp::kMatches, R"("(?i)LLAMA")", true},
      {"/model", JsonOp::kMatches, R"("^(llama|mistral)-[0-9]+-[0-9]+b$")", true},
      {"/model", JsonOp::kMatches, R"("l+?a")", true},
      {"/n", JsonOp::kMatches, R"("70")", false},            // a number is not a string
      {"/multi", JsonOp::kMatches, R"("^line2")", false},    // no multi-line mode
      {"/multi", JsonOp::kMatches, R"("line1.line2")", false},  // '.' excludes \n
      {"/u", JsonOp::kMatches, R"("^...$")", true},          // UTF-8: one char per '.'
      {"/u", JsonOp::kMatches, R"("本")", true},
  });
}

TEST_CASE("regexes stay linear on long untrusted strings") {
  // std::regex overflows an 8 MiB stack on "^a*$" over ~50 KB; RE2 does not recurse.
  const std::string long_a(1 << 20, 'a');
  const std::string doc = R"({"s": ")" + long_a + R"("})";
  CHECK(Eval("/s", JsonOp::kMatches, R"("^a*$")", doc));
  CHECK(Eval("/s", JsonOp::kMatches, R"("^(a|aa)*$")", doc));
  CHECK_FALSE(Eval("/s", JsonOp::kMatches, R"("^(a|a)*b$")", doc));  // exponential for backtrackers
  const Predicate schema = Must(Predicate::JsonSchema(
      R"({"properties": {"s": {"pattern": "^(a|aa)*$", "format": "date"}},
          "patternProperties": {"^s$": {"pattern": "a*"}},
          "propertyNames": {"pattern": "^[a-z]+$"}})"));
  CHECK_FALSE(schema.Matches(WithPayload(doc)));  // a million a's is not a date
  const Predicate schema2 = Must(Predicate::JsonSchema(
      R"({"properties": {"s": {"pattern": "^(a|aa)*$"}}, "propertyNames": {"pattern": "^s$"}})"));
  CHECK(schema2.Matches(WithPayload(doc)));
  const std::string long_key = R"({")" + long_a + R"(": 1})";
  CHECK_FALSE(schema2.Matches(WithPayload(long_key)));
  const Predicate date = Must(Predicate::JsonSchema(R"({"format": "date"})"));
  CHECK_FALSE(date.Matches(WithPayload("\"" + std::string(1 << 20, '1') + "-01-01x\"")));
  CHECK(date.Matches(WithPayload("\"" + std::string(1 << 20, '1') + "-01-01\"")));
}

TEST_CASE("invalid pointers, operands and regexes are errors that name the value") {
  CHECK(ErrorOf(Predicate::Json("a/b", JsonOp::kEq, "1")) ==
        "JSON pointer 'a/b' must be empty or start with '/' (RFC 6901)");
  CHECK(ErrorOf(Predicate::Json("/a~2", JsonOp::kEq, "1")) ==
        "JSON pointer '/a~2' has an invalid escape '~2' at offset 2 (only ~0 and ~1 are valid)");
  CHECK(ErrorOf(Predicate::Json("/a/~", JsonOp::kExists, "")) ==
        "JSON pointer '/a/~' ends in an incomplete escape '~' at offset 3 (only ~0 and ~1 are "
        "valid)");
  CHECK(ErrorOf(Predicate::Json("/a~/b", JsonOp::kEq, "1")) ==
        "JSON pointer '/a~/b' has an invalid escape '~/' at offset 2 (only ~0 and ~1 are valid)");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kEq, "{")) ==
        "operand '{' of '==' is not valid JSON at offset 1: Missing a name for object member.");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kEq, "")) ==
        "operand '' of '==' is not valid JSON at offset 0: The document is empty.");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kEq, "llama")) ==
        "operand 'llama' of '==' is not valid JSON at offset 0: Invalid value.");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kEq, "1 2")) ==
        "operand '1 2' of '==' is not valid JSON at offset 2: The document root must not be "
        "followed by other values.");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kEq, Nested(129, "1"))).find(
            "is not valid JSON at offset 129: nesting deeper than 128 levels") !=
        std::string::npos);
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kLt, "true")) ==
        "operand 'true' of '<' must be a JSON number or string");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kGe, "[1]")) ==
        "operand '[1]' of '>=' must be a JSON number or string");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kIn, "1")) ==
        "operand '1' of 'in' must be a JSON array");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, "1")) ==
        "operand '1' of 'matches' must be a JSON string holding a regular expression");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, "llama")) ==
        "operand 'llama' of 'matches' is not valid JSON at offset 0: Invalid value.");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, R"("(")")) ==
        "operand '\"(\"' of 'matches': regex '(' is not valid for RE2: missing ): (");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, R"x("a(?=b)")x")) ==
        "operand '\"a(?=b)\"' of 'matches': regex 'a(?=b)' is not valid for RE2: invalid perl "
        "operator: (?=");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, R"("(a)\\1")")) ==
        "operand '\"(a)\\\\1\"' of 'matches': regex '(a)\\1' is not valid for RE2: invalid "
        "escape sequence: \\1");
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kMatches, R"("\\u00e9")")) ==
        "operand '\"\\\\u00e9\"' of 'matches': regex '\\u00e9' is not valid for RE2: invalid "
        "escape sequence: \\u");
  CHECK(ErrorOf(Predicate::Json("/a", static_cast<JsonOp>(42), "1")) == "unknown JsonOp 42");
  // A long operand is cut in the message.
  const std::string long_operand = "[" + std::string(200, '1');
  CHECK(ErrorOf(Predicate::Json("/a", JsonOp::kIn, long_operand)) ==
        "operand '[" + std::string(79, '1') +
            "'... (201 bytes) of 'in' is not valid JSON at offset 201: Missing a comma or ']' "
            "after an array element.");
}

TEST_CASE("payloads that are not JSON make JSON rules false and count invalid_json") {
  const Predicate rule = Must(Predicate::Json("/a", JsonOp::kExists, ""));
  const Predicate neg = Predicate::Not(rule);
  const std::string invalid_utf8 = "{\"a\": \"\xff\"}";
  const std::string nul_inside = std::string("{\"a\": 1}\0", 9);
  const std::string nul_in_string = std::string("{\"a\": \"x\0y\"}", 12);
  const std::vector<std::string> bad = {
      "",                      // empty
      "   ",                   // white space only
      "{\"a\": ",              // truncated
      "{\"a\": 1",             // truncated
      "\x89PNG\r\n\x1a\n\0\0", // binary
      invalid_utf8,            // not UTF-8
      nul_inside,              // a NUL after a complete document
      nul_in_string,           // a raw NUL inside a string
      "{\"a\": 1} x",          // trailing garbage
      "{\"a\": 1}{}",          // two documents
      "{'a': 1}",              // not JSON quotes
      "{\"a\": NaN}",
      "{\"a\": 01}",
      "{\"a\": [1,]}",
      "{\"a\": \"\n\"}",       // raw control character in a string
      "{\"a\": " + Nested(128, "1") + "}",  // 129 levels
  };
  for (const std::string& payload : bad) {
    INFO("payload " << inferq::QuoteValue(payload));
    CHECK_FALSE(rule.Matches(WithPayload(payload)));
    CHECK(neg.Matches(WithPayload(payload)));  // not over a false rule
  }
  const auto n = static_cast<std::uint64_t>(bad.size());
  CHECK(SameStats(rule.Stats(), PredicateStats{2 * n, 0, 2 * n, 0}));
  CHECK(SameStats(neg.Stats(), PredicateStats{n, n, n, 0}));

  // The edges that are valid: 128 levels, and JSON that is not an object.
  CHECK(rule.Matches(WithPayload("{\"a\": " + Nested(127, "1") + "}")));
  CHECK(Eval("", JsonOp::kEq, "1", " 1 "));
  CHECK(Eval("", JsonOp::kEq, "null", "null"));
  CHECK(rule.Stats().invalid_json == 2 * n);
}

TEST_CASE("the payload is parsed once per Matches call, and only when a JSON rule needs it") {
  using inferq::predicate_internal::PayloadParsesOnThisThread;
  const Predicate p = Predicate::All({
      Must(Predicate::Json("/a", JsonOp::kEq, "1")),
      Must(Predicate::Json("/b", JsonOp::kExists, "")),
      Must(Predicate::JsonSchema(R"({"type": "object", "required": ["a"]})")),
      Predicate::Not(Must(Predicate::Json("/c", JsonOp::kMatches, R"("x")"))),
  });
  const std::uint64_t before = PayloadParsesOnThisThread();
  CHECK(p.Matches(WithPayload(R"({"a": 1, "b": 2})")));
  CHECK(PayloadParsesOnThisThread() == before + 1);
  CHECK_FALSE(p.Matches(WithPayload(R"({"a": 1, "b": 2, "c": "x"})")));
  CHECK(PayloadParsesOnThisThread() == before + 2);

  // Invalid JSON: one parse, and the root counts it once although every rule met it.
  const Predicate any = Predicate::Any({
      Must(Predicate::Json("/a", JsonOp::kEq, "1")),
      Must(Predicate::Json("/b", JsonOp::kExists, "")),
      Must(Predicate::JsonSchema(R"({"type": "object"})")),
  });
  CHECK_FALSE(any.Matches(WithPayload("{oops")));
  CHECK(PayloadParsesOnThisThread() == before + 3);
  CHECK(SameStats(any.Stats(), PredicateStats{1, 0, 1, 0}));

  // Header and tag rules never parse; neither do JSON rules that are not reached.
  const Predicate headers_first = Predicate::All({
      Must(Predicate::HeadersAll({{"model", "llama"}})),
      Must(Predicate::Json("/a", JsonOp::kEq, "1")),
  });
  CHECK_FALSE(headers_first.Matches(WithPayload(R"({"a": 1})")));
  CHECK(Must(Predicate::TagIn({"x"})).Matches(WithTag("x")));
  CHECK(PayloadParsesOnThisThread() == before + 3);
}

TEST_CASE("composition: all, any and not, with short-circuit counts") {
  const Predicate llama = Must(Predicate::HeadersAll({{"model", "llama"}}));
  const Predicate cold = Must(Predicate::Json("/temperature", JsonOp::kLt, "1"));
  const Predicate tool = Must(Predicate::TagIn({"tool.search"}));
  const Predicate p = Predicate::Any({Predicate::All({llama, cold}), Predicate::Not(tool)});
  CHECK(p.DebugString() ==
        "any(all(headers_all{model=llama}, json(/temperature < 1)), not(tag_in{tool.search}))");

  Event e = WithPayload(R"({"temperature": 0.2})");
  e.headers.Set("model", "llama");
  e.semantic_tag = "tool.search";
  CHECK(p.Matches(e));  // all() holds; not() is not reached
  e.headers.Set("model", "mistral");
  CHECK_FALSE(p.Matches(e));  // all() fails at llama; cold is not reached; not(tool) false
  e.semantic_tag = "chat";
  CHECK(p.Matches(e));  // not(tool)

  CHECK(SameStats(p.Stats(), PredicateStats{3, 2, 0, 0}));
  CHECK(SameStats(llama.Stats(), PredicateStats{3, 1, 0, 0}));
  CHECK(SameStats(cold.Stats(), PredicateStats{1, 1, 0, 0}));
  CHECK(SameStats(tool.Stats(), PredicateStats{2, 1, 0, 0}));

  CHECK(Predicate::All({}).Matches(Event{}));
  CHECK_FALSE(Predicate::Any({}).Matches(Event{}));
  CHECK_FALSE(Predicate::Not(Predicate()).Matches(Event{}));
  CHECK(Predicate::Any({Predicate::Any({}), Predicate()}).Matches(Event{}));
  CHECK(Predicate::Not(Predicate::Not(llama)).Matches(WithHeaders({{"model", "llama"}})));
  CHECK(Predicate::All({Predicate(), Predicate::Any({})}).DebugString() == "all(true, any())");
}

TEST_CASE("debug strings show the whole tree") {
  CHECK(Must(Predicate::Json("/a~1b/0", JsonOp::kIn, R"([1, "x", {"k": null}])")).DebugString() ==
        R"(json(/a~1b/0 in [1,"x",{"k":null}]))");
  CHECK(Must(Predicate::Json("", JsonOp::kExists, "")).DebugString() == R"(json("" exists))");
  CHECK(Must(Predicate::Json("/m", JsonOp::kMatches, R"("^ll")")).DebugString() ==
        R"(json(/m matches "^ll"))");
  CHECK(Must(Predicate::Json("/t", JsonOp::kGe, "0.50")).DebugString() == "json(/t >= 0.5)");
  CHECK(Must(Predicate::Json("/t", JsonOp::kNe, "false")).DebugString() == "json(/t != false)");
  CHECK(Must(Predicate::JsonSchema(R"({"type":"object"})")).DebugString() ==
        "json_schema(draft7, 17 bytes)");
  CHECK(Must(Predicate::JsonSchema(
                 R"({"$schema":"http://json-schema.org/draft-04/schema#","type":"object"})"))
            .DebugString() == "json_schema(draft4, 69 bytes)");
}

TEST_CASE("json schema: matches, draft selection and errors") {
  const Predicate p = Must(Predicate::JsonSchema(R"({
      "type": "object",
      "required": ["model", "max_tokens"],
      "properties": {
        "model": {"type": "string", "enum": ["llama", "mistral"]},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4096},
        "stop": {"type": "array", "items": {"type": "string"}, "maxItems": 4}
      },
      "additionalProperties": false})"));
  CHECK(p.Matches(WithPayload(R"({"model": "llama", "max_tokens": 256})")));
  CHECK(p.Matches(WithPayload(R"({"model": "mistral", "max_tokens": 1, "stop": ["\n"]})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "gpt", "max_tokens": 256})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "llama", "max_tokens": 0})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "llama", "max_tokens": 2.5})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "llama"})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "llama", "max_tokens": 5, "x": 1})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"model": "llama", "max_tokens": 5, "stop": [1]})")));
  CHECK_FALSE(p.Matches(WithPayload(R"(["model"])")));
  CHECK_FALSE(p.Matches(WithPayload("model: llama")));
  CHECK(SameStats(p.Stats(), PredicateStats{10, 2, 1, 0}));

  // Draft 4 reads exclusiveMaximum as a boolean, draft 6 and 7 as a number.
  const std::string_view d4 = R"({"$schema": "http://json-schema.org/draft-04/schema#",
                                  "maximum": 10, "exclusiveMaximum": true})";
  const Predicate draft4 = Must(Predicate::JsonSchema(d4));
  CHECK(draft4.Matches(WithPayload("9")));
  CHECK_FALSE(draft4.Matches(WithPayload("10")));
  const Predicate draft7 = Must(Predicate::JsonSchema(R"({"exclusiveMaximum": 10})"));
  CHECK(draft7.Matches(WithPayload("9.5")));
  CHECK_FALSE(draft7.Matches(WithPayload("10")));
  JsonSchemaOptions o6;
  o6.draft = JsonSchemaDraft::kDraft6;
  CHECK(Must(Predicate::JsonSchema(R"({"exclusiveMinimum": 1})", o6)).DebugString() ==
        "json_schema(draft6, 23 bytes)");
  CHECK(Must(Predicate::JsonSchema("true")).Matches(WithPayload("1")));
  CHECK_FALSE(Must(Predicate::JsonSchema("false")).Matches(WithPayload("1")));
  // "format" applies to strings; valijson 1.0 alone throws on a number here.
  const Predicate date = Must(Predicate::JsonSchema(R"({"format": "date"})"));
  CHECK(date.Matches(WithPayload("12")));
  CHECK(date.Matches(WithPayload(R"("2024-02-29")")));
  CHECK_FALSE(date.Matches(WithPayload(R"("2024-02-30")")));
  CHECK_FALSE(date.Matches(WithPayload(R"("2024-2-3")")));

  CHECK(ErrorOf(Predicate::JsonSchema(R"({"type": )")) ==
        "JSON Schema '{\"type\": ' is not valid JSON at offset 9: Invalid value.");
  CHECK(ErrorOf(Predicate::JsonSchema(
            R"({"$schema": "https://json-schema.org/draft/2020-12/schema"})")) ==
        "JSON Schema '{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\"}' names "
        "\"$schema\" 'https://json-schema.org/draft/2020-12/schema'; supported are drafts 3, 4, "
        "6 and 7");
  JsonSchemaOptions o3;
  o3.draft = JsonSchemaDraft::kDraft3;
  CHECK(ErrorOf(Predicate::JsonSchema(d4, o3)).find(
            "names \"$schema\" 'http://json-schema.org/draft-04/schema#' but the options ask "
            "for draft3") != std::string::npos);
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$schema": 4})")) ==
        "JSON Schema '{\"$schema\": 4}' has a \"$schema\" that is not a string");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"minLength": "x"})")) ==
        "JSON Schema '{\"minLength\": \"x\"}' is rejected by valijson (draft7): Expected a "
        "non-negative integer value for 'minLength' constraint.");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"multipleOf": 3})", o3)) ==
        "JSON Schema '{\"multipleOf\": 3}' is rejected by valijson (draft3): 'multipleOf' "
        "constraint not available in draft 3");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"properties": {"a": {"pattern": "(?<=x)a"}}})")) ==
        "JSON Schema '{\"properties\": {\"a\": {\"pattern\": \"(?<=x)a\"}}}' has a pattern that "
        "regex '(?<=x)a' is not valid for RE2: invalid perl operator: (?<");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"patternProperties": {"[": {}}})")) ==
        "JSON Schema '{\"patternProperties\": {\"[\": {}}}' has a pattern that regex '[' is not "
        "valid for RE2: missing ]: [");
  // valijson 1.0 ignores draft 3's "disallow" and "extends": rejected, not ignored.
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"properties": {"a": {"extends": {}}}})", o3)) ==
        "JSON Schema '{\"properties\": {\"a\": {\"extends\": {}}}}' uses the draft 3 keyword "
        "\"extends\", which valijson 1.0 does not implement (a member of that name anywhere in "
        "the document counts)");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"disallow": "string"})", o3)).find(
            "uses the draft 3 keyword \"disallow\"") != std::string::npos);
  CHECK(Must(Predicate::JsonSchema(R"({"properties": {"a": {"extends": {}}}})")).Matches(
      WithPayload("{}")));  // in draft 7 it is an unknown keyword
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": "http://example.com/s.json#/a"})")) ==
        "JSON Schema '{\"$ref\": \"http://example.com/s.json#/a\"}' has a remote \"$ref\" to "
        "'http://example.com/s.json' and JsonSchemaOptions::fetch is empty");
}

TEST_CASE("json schema: remote refs go through the fetch callback, once per document") {
  int calls = 0;
  JsonSchemaOptions o;
  o.fetch = [&](std::string_view uri) -> absl::StatusOr<std::string> {
    ++calls;
    if (uri == "http://x.test/int.json") return std::string(R"({"type": "integer"})");
    if (uri == "http://x.test/bad.json") return std::string("{");
    return absl::NotFoundError("no document " + std::string(uri));
  };
  const Predicate p = Must(Predicate::JsonSchema(
      R"({"properties": {"a": {"$ref": "http://x.test/int.json"},
                         "b": {"$ref": "http://x.test/int.json#"}}})",
      o));
  CHECK(calls == 1);
  CHECK(p.Matches(WithPayload(R"({"a": 1, "b": 2})")));
  CHECK_FALSE(p.Matches(WithPayload(R"({"a": 1, "b": "2"})")));
  CHECK(calls == 1);  // never during Matches
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": "http://x.test/none.json"})", o)) ==
        "JSON Schema '{\"$ref\": \"http://x.test/none.json\"}': fetching the remote \"$ref\" "
        "'http://x.test/none.json' failed: no document http://x.test/none.json");
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": "http://x.test/bad.json"})", o)) ==
        "JSON Schema '{\"$ref\": \"http://x.test/bad.json\"}': the remote \"$ref\" document "
        "'http://x.test/bad.json' is not valid JSON at offset 1: Missing a name for object "
        "member.");
  // What the callback throws is the caller's.
  JsonSchemaOptions throwing;
  throwing.fetch = [](std::string_view) -> absl::StatusOr<std::string> {
    throw std::runtime_error("callback says no");
  };
  CHECK_THROWS_WITH(Predicate::JsonSchema(R"({"$ref": "http://x.test/int.json"})", throwing),
                    "callback says no");
}

TEST_CASE("json schema: recursion is bounded, by payload depth and by kMaxSchemaDepth") {
  // A recursive tree schema over a payload 128 levels deep (the most a payload may be).
  const Predicate tree = Must(Predicate::JsonSchema(
      R"({"type": "array", "items": {"$ref": "#"}})"));
  CHECK(tree.Matches(WithPayload(Nested(128, ""))));
  CHECK_FALSE(tree.Matches(WithPayload(Nested(127, "1"))));
  CHECK(SameStats(tree.Stats(), PredicateStats{2, 1, 0, 0}));

  // A schema that refers to itself without consuming the payload never ends on its
  // own: it stops at kMaxSchemaDepth and is "no match", under a "not" too.
  const Predicate loop = Must(Predicate::JsonSchema(R"({"allOf": [{"$ref": "#"}]})"));
  CHECK_FALSE(loop.Matches(WithPayload("1")));
  const Predicate not_loop = Must(Predicate::JsonSchema(R"({"not": {"$ref": "#"}})"));
  CHECK_FALSE(not_loop.Matches(WithPayload("1")));
  CHECK(SameStats(loop.Stats(), PredicateStats{1, 0, 0, 1}));
  CHECK(SameStats(not_loop.Stats(), PredicateStats{1, 0, 0, 1}));
  const Predicate outer = Predicate::Not(loop);
  CHECK(outer.Matches(WithPayload("1")));
  CHECK(SameStats(outer.Stats(), PredicateStats{1, 1, 0, 1}));
  // And the next evaluation on this thread starts from depth 0 again.
  CHECK(tree.Matches(WithPayload(Nested(128, ""))));
}

TEST_CASE("json schema: $ref cycles and over-long URIs are errors, not a stack overflow") {
  const std::string cycle_msg =
      "is rejected by valijson (draft7): subschemas and \"$ref\" hops nest deeper than 256 "
      "levels (a \"$ref\" cycle such as {\"$ref\": \"#\"} never ends)";
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": "#"})")) ==
        "JSON Schema '{\"$ref\": \"#\"}' " + cycle_msg);
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"items": {"$ref": "#/items"}})")) ==
        "JSON Schema '{\"items\": {\"$ref\": \"#/items\"}}' " + cycle_msg);
  CHECK(ErrorOf(Predicate::JsonSchema(
                    R"({"definitions": {"a": {"$ref": "#/definitions/b"},
                                        "b": {"$ref": "#/definitions/a"}},
                        "$ref": "#/definitions/a"})"))
            .find(cycle_msg) != std::string::npos);
  // A remote document whose root "$ref" names itself: fetched once, then the bound.
  int fetches = 0;
  JsonSchemaOptions o;
  o.fetch = [&](std::string_view) -> absl::StatusOr<std::string> {
    ++fetches;
    return std::string(R"({"$ref": "http://x.test/self.json"})");
  };
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": "http://x.test/self.json"})", o))
            .find("nest deeper than 256 levels") != std::string::npos);
  CHECK(fetches == 1);
  // Recursion that consumes the payload is fine.
  CHECK(Must(Predicate::JsonSchema(R"({"properties": {"next": {"$ref": "#"}}})"))
            .Matches(WithPayload(R"({"next": {"next": {}}})")));

  const std::string long_ref = "urn:ab:" + std::string(506, 'a');  // 513 bytes
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": ")" + long_ref + R"("})"))
            .find(" has a \"$ref\" of 513 bytes; at most 512 are accepted") != std::string::npos);
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"items": {"$id": ")" + long_ref + R"("}})"))
            .find(" has a \"$id\" of 513 bytes; at most 512 are accepted") != std::string::npos);
  const std::string ok_ref = "urn:ab:" + std::string(505, 'a');  // 512 bytes: a URN
  CHECK(ErrorOf(Predicate::JsonSchema(R"({"$ref": ")" + ok_ref + R"("})"))
            .find("and JsonSchemaOptions::fetch is empty") != std::string::npos);
}

namespace {
// Random JSON text from a fixed seed: every kind, big and fractional numbers, strings
// with escapes and non-ASCII, keys from a small set so that schemas find them.
class RandomJson {
 public:
  explicit RandomJson(std::uint64_t seed) : rng_(seed) {}
  // A payload: an object half of the time.
  std::string Payload(int depth) { return Pick(2) ? Object(depth) : Value(depth); }
  std::string Value(int depth) {
    switch (Pick(depth > 0 ? 10 : 6)) {
      case 0: return "null";
      case 1: return Pick(2) ? "true" : "false";
      case 2: case 3: return Number();
      case 4: case 5: return String();
      case 6: case 7:
        return Object(depth);
      default: {
        std::string out = "[";
        const int n = Pick(5);
        for (int i = 0; i < n; ++i) {
          if (i) out += ",";
          out += Value(depth - 1);
        }
        return out + "]";
      }
    }
  }
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<std::uint64_t>(n)); }

 private:
  std::string Object(int depth) {
    std::string out = "{";
    const int n = Pick(5);
    for (int i = 0; i < n; ++i) {
      if (i) out += ",";
      out += Key() + ":" + Value(depth - 1);
    }
    return out + "}";
  }
  std::string Number() {
    static const char* kNumbers[] = {"0", "-0", "1", "-1", "2.5", "1e308", "-1e-300", "3.0",
                                     "9007199254740993", "18446744073709551615",
                                     "-9223372036854775808", "123456789012345678901234567890",
                                     "0.1", "7", "42"};
    return kNumbers[Pick(15)];
  }
  std::string String() {
    static const char* kStrings[] = {R"("a")", R"("a")", R"("llama")", R"("2024-02-29")",
                                     R"("12:30:00Z")", R"("2024-01-01T00:00:00+01:00")",
                                     R"("\u00e9\u65e5")", R"("a\nb")", R"("\u0000")",
                                     R"("x@y.z")", R"("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")"};
    return kStrings[Pick(11)];
  }
  std::string Key() {
    static const char* kKeys[] = {R"("a")", R"("b")", R"("model")", R"("n")", R"("tags")",
                                  R"("x1")", R"("")", R"("\u00e9")", R"("tags")", R"("b")"};
    return kKeys[Pick(10)];
  }
  std::mt19937_64 rng_;
};
}  // namespace

TEST_CASE("random payloads and their mutations never throw, and match consistently") {
  const char* kSchemas[] = {
      R"({"type": ["object", "array"], "minProperties": 1, "maxItems": 3})",
      R"({"enum": [1, "a", null, [1], {"a": 1}]})",
      R"({"const": "a"})",
      R"({"multipleOf": 0.5, "minimum": -1, "exclusiveMaximum": 100})",
      R"({"type": "integer", "multipleOf": 7})",
      R"({"minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"})",
      R"({"anyOf": [{"format": "date"}, {"format": "time"}, {"format": "date-time"},
                    {"format": "email"}]})",
      R"({"items": [{"type": "number"}, {"type": "string"}], "additionalItems": false})",
      R"({"items": {"type": ["null", "boolean"]}, "uniqueItems": true, "contains": {"const": null}})",
      R"({"properties": {"a": {"type": "string"}, "n": {"minimum": 0}},
          "patternProperties": {"^x[0-9]$": {"type": "number"}, "^$": {}},
          "additionalProperties": {"type": ["object", "array"]},
          "propertyNames": {"maxLength": 5}, "required": ["a"],
          "dependencies": {"a": ["b"], "b": {"required": ["model"]}}})",
      R"({"allOf": [{"type": "object"}], "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
          "not": {"required": ["model"]}})",
      R"({"if": {"type": "object"}, "then": {"maxProperties": 2}, "else": {"type": "array"}})",
      R"({"properties": {"tags": {"$ref": "#"}}, "type": "object"})",
      R"({"uniqueItems": true})",
  };
  const auto make = [&] {
    std::vector<Predicate> ps;
    for (const char* s : kSchemas) ps.push_back(Must(Predicate::JsonSchema(s)));
    for (JsonOp op : {JsonOp::kEq, JsonOp::kNe, JsonOp::kLt, JsonOp::kGe}) {
      ps.push_back(Must(Predicate::Json("/a", op, "1")));
      ps.push_back(Must(Predicate::Json("/tags/0", op, R"("a")")));
    }
    ps.push_back(Must(Predicate::Json("/b", JsonOp::kEq, R"({})")));
    ps.push_back(Must(Predicate::Json("/model", JsonOp::kIn, R"([[], {}, "a", 42])")));
    ps.push_back(Must(Predicate::Json("/x1", JsonOp::kMatches, R"("^a+$")")));
    return ps;
  };
  const std::vector<Predicate> predicates = make();
  const Predicate any = Predicate::Any(make());  // its own nodes: counts stay apart

  RandomJson gen(20240601);
  int exceptions = 0;
  int valid_payloads = 0;
  int mutated = 0;
  std::vector<int> matches(predicates.size(), 0);
  for (int i = 0; i < 3000; ++i) {
    std::string payload = gen.Payload(5);
    const bool mutate = i % 3 == 2;
    if (mutate) {
      ++mutated;
      if (gen.Pick(2) != 0 && !payload.empty()) {
        payload.resize(static_cast<std::size_t>(gen.Pick(static_cast<int>(payload.size()))));
      } else {
        payload[static_cast<std::size_t>(gen.Pick(static_cast<int>(payload.size())))] =
            static_cast<char>(gen.Pick(256));
      }
    } else {
      ++valid_payloads;
    }
    const Event e = WithPayload(payload);
    for (std::size_t k = 0; k < predicates.size(); ++k) {
      try {
        matches[k] += predicates[k].Matches(e) ? 1 : 0;
      } catch (...) {
        ++exceptions;
      }
    }
    try {
      any.Matches(e);
    } catch (...) {
      ++exceptions;
    }
  }
  CHECK(exceptions == 0);
  CHECK(valid_payloads == 2000);
  CHECK(mutated == 1000);
  // Every generated (unmutated) payload is valid JSON; some mutations are too.
  std::uint64_t invalid = predicates[0].Stats().invalid_json;
  CHECK(invalid > 0);
  CHECK(invalid <= 1000);
  for (const Predicate& p : predicates) {
    INFO(p.DebugString());
    CHECK(p.Stats().evaluated == 3000);
    CHECK(p.Stats().invalid_json == invalid);  // one parse outcome per payload, for all
  }
  // Each predicate matched something and missed something: the inputs reach them.
  for (std::size_t k = 0; k < predicates.size(); ++k) {
    INFO(predicates[k].DebugString() << ": " << matches[k]);
    CHECK(matches[k] > 0);
    CHECK(matches[k] < 3000);
  }
  CHECK(any.Stats().evaluated == 3000);
}

TEST_CASE("one predicate evaluated by several threads at once") {
  const Predicate p = Predicate::All({
      Must(Predicate::HeadersAny({{"model", "llama"}, {"model", "mistral"}})),
      Predicate::Any({
          Must(Predicate::Json("/temperature", JsonOp::kLt, "0.5")),
          Must(Predicate::JsonSchema(R"({"required": ["tools"], "properties":
                                          {"tools": {"type": "array", "minItems": 1}}})")),
      }),
      Predicate::Not(Must(Predicate::Json("/user", JsonOp::kMatches, R"("^bot-")"))),
  });
  // Events i = 0..N-1: model by i % 3, temperature by i % 5, tools by i % 7, user by
  // i % 11, and every 13th payload is not JSON.
  constexpr int kEvents = 2000;
  constexpr int kThreads = 4;
  constexpr int kRounds = 5;
  std::vector<Event> events;
  std::vector<char> expected;
  std::uint64_t expected_matches = 0;
  std::uint64_t expected_invalid = 0;
  for (int i = 0; i < kEvents; ++i) {
    const char* models[] = {"llama", "mistral", "gpt"};
    const bool json = i % 13 != 0;
    const double temperature = (i % 5) * 0.2;  // 0, .2, .4, .6, .8
    const bool tools = i % 7 == 0;
    const bool bot = i % 11 == 0;
    std::string payload = json ? "{\"temperature\": " + std::to_string(temperature) +
                                     (tools ? ", \"tools\": [\"search\"]" : ", \"tools\": []") +
                                     ", \"user\": \"" + (bot ? "bot-" : "u-") +
                                     std::to_string(i) + "\"}"
                               : "temperature=" + std::to_string(temperature);
    Event e = WithPayload(payload);
    e.headers.Set("model", models[i % 3]);
    const bool model_ok = i % 3 != 2;
    // Not JSON: both JSON branches of any() are false, and not(matches) is true.
    const bool m = model_ok && json && (temperature < 0.5 || tools) && !bot;
    expected.push_back(m ? 1 : 0);
    expected_matches += m ? 1 : 0;
    // The root counts an invalid payload when a JSON rule was reached: model_ok.
    expected_invalid += (!json && model_ok) ? 1 : 0;
    events.push_back(std::move(e));
  }

  std::vector<std::vector<char>> got(kThreads, std::vector<char>(kEvents * kRounds));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the events from its own offset; no assertions here.
      for (int r = 0; r < kRounds; ++r) {
        for (int k = 0; k < kEvents; ++k) {
          const int i = (k + t * 517) % kEvents;
          got[t][r * kEvents + i] = p.Matches(events[i]) ? 1 : 0;
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRounds; ++r) {
      const std::vector<char> round(got[t].begin() + r * kEvents,
                                    got[t].begin() + (r + 1) * kEvents);
      INFO("thread " << t << " round " << r);
      CHECK(round == expected);
    }
  }
  const std::uint64_t n = kThreads * kRounds;
  CHECK(expected_matches == 735);  // the expected values themselves, pinned
  CHECK(expected_invalid == 103);
  CHECK(SameStats(p.Stats(),
                  PredicateStats{n * kEvents, n * expected_matches, n * expected_invalid, 0}));
}

// predicate_fuzz found RapidJSON 1.1.0 calling clz(0) on this kind of number (a long
// run of zero digits); whatever the builtin returns, the value must read as 0.
TEST_CASE("a number with a long run of zero digits reads as zero") {
  const std::string zero = "0." + std::string(80, '0');
  CHECK(Must(Predicate::Json("", JsonOp::kEq, "0")).Matches(WithPayload(zero)));
  CHECK(Must(Predicate::Json("/x", JsonOp::kLt, "1e-300")).Matches(WithPayload("{\"x\": " + zero + "}")));
  CHECK_FALSE(Must(Predicate::Json("/x", JsonOp::kGt, "0")).Matches(WithPayload("{\"x\": " + zero + "}")));
}

TEST_CASE("Check says why an event does not match, naming the JSON Schema place") {
  // A tool's parameters, as an agent runtime checks a call before running it.
  const Predicate tool = Must(Predicate::JsonSchema(R"({
    "type": "object", "required": ["new_preferences"],
    "properties": {
      "drink_id": {"type": "string"},
      "new_preferences": {"type": "object", "properties": {
        "size": {"type": "string", "enum": ["small", "medium", "large"]},
        "shots": {"type": "integer"}}}}})"));
  auto why = [&](std::string_view payload) {
    const absl::Status s = tool.Check(WithPayload(payload));
    return s.ok() ? std::string("OK") : std::string(absl::StatusCodeToString(s.code())) + ": " +
                                            std::string(s.message());
  };
  CHECK(why(R"({"new_preferences": {"size": "large"}})") == "OK");
  CHECK(why(R"({"new_preferences": {"size": "huge"}})") ==
        "FAILED_PRECONDITION: JSON Schema: /new_preferences/size: Failed to match against any "
        "enum values.");
  CHECK(why(R"({"drink_id": "latte"})") ==
        "FAILED_PRECONDITION: JSON Schema: (root): Missing required property 'new_preferences'.");
  CHECK(why(R"({"drink_id": 5, "new_preferences": {"shots": "two"}})") ==
        "FAILED_PRECONDITION: JSON Schema: /drink_id: Value type not permitted by 'type' "
        "constraint.; /new_preferences/shots: Value type not permitted by 'type' constraint.");
  CHECK(why("not json") ==
        "FAILED_PRECONDITION: the payload is not valid JSON, so the event does not match "
        "json_schema(draft7, 289 bytes)");  // the schema text above
  // Check agrees with Matches, and counts like it.
  const PredicateStats before = tool.Stats();
  for (std::string_view p : {R"({"new_preferences": {}})", R"({})", "[1]"}) {
    CHECK(tool.Check(WithPayload(p)).ok() == tool.Matches(WithPayload(p)));
  }
  CHECK(tool.Stats().evaluated == before.evaluated + 6);
}

TEST_CASE("Check names the node that failed for other predicates and combinations") {
  const Predicate model = Must(Predicate::HeadersAll({{"model", "llama"}}));
  const Predicate tag = Must(Predicate::TagIn({"chat"}));
  Event e = WithTag("code");
  CHECK(model.Check(e).message() == "the event does not match headers_all{model=llama}");
  CHECK(Predicate::All({model, tag}).Check(e).message() ==
        "the event does not match headers_all{model=llama}");  // the first that failed
  CHECK(Predicate::Any({model, tag}).Check(e).message() ==
        "none of 2 matched: the event does not match headers_all{model=llama}; the event "
        "does not match tag_in{chat}");
  CHECK(Predicate::Not(Predicate::Not(model)).Check(e).message() ==
        "the event does not match not(not(headers_all{model=llama}))");
  CHECK(Predicate::Not(model).Check(e).ok());
  CHECK(Predicate().Check(e).ok());
  e.model = "llama";
  CHECK(model.Check(e).ok());
}

TEST_CASE("Check agrees with Matches where a full validation would walk further") {
  // Smallest input found: Matches passes by the second anyOf branch; collecting the
  // first branch's errors walked a recursion to the nesting limit and said it failed.
  const Predicate p = Must(Predicate::JsonSchema(
      R"({"definitions":{"rec":{"anyOf":[{"type":"array","items":{"$ref":"#/definitions/rec"}},)"
      R"({"type":"integer"}]}},"anyOf":[{"properties":{"x":{"type":"string"},"y":{"$ref":)"
      R"("#/definitions/rec"}}},{"required":["x"]}]})"));
  const std::string payload = R"({"x":1,"y":)" + std::string(127, '[') + "1" + std::string(127, ']') + "}";
  CHECK(p.Matches(WithPayload(payload)));
  CHECK(p.Check(WithPayload(payload)).ok());
  CHECK(p.Stats().limit_exceeded == 0);
}

TEST_CASE("Check does not collect the errors of a large failing payload") {
  const Predicate strings = Must(Predicate::JsonSchema(R"({"type":"array","items":{"type":"string"}})"));
  std::string big = "[";
  for (int i = 0; i < 40000; ++i) big += (i ? ",1" : "1");  // 80 KB
  big += "]";
  const absl::Status s = strings.Check(WithPayload(big));
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message() == "JSON Schema: the payload does not validate (its " + std::to_string(big.size()) +
                           " bytes are over 65536, so the errors are not collected)");
  const absl::Status small = strings.Check(WithPayload("[1, \"a\", 2]"));
  CHECK(small.message() ==
        "JSON Schema: /0: Value type not permitted by 'type' constraint.; /2: Value type not "
        "permitted by 'type' constraint.");
  // An anyOf's wrapper error is left out when the branches' own errors are there.
  const Predicate either = Must(Predicate::JsonSchema(R"({"anyOf":[{"type":"string"},{"type":"integer"}]})"));
  const std::string why(either.Check(WithPayload("true")).message());
  CHECK(why.find("Failed to validate") == std::string::npos);
}
