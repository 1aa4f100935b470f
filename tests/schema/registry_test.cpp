// SchemaRegistry: the compatibility matrix as FlatBuffers 2.0.8's Parser::ConformTo
// decides it, transitive checks, idempotent registration, errors, durability (on a
// StateStore through StateSchemaStore, and on a SchemaStore written for the test).
#include "inferq/schema/registry.hpp"

#include <array>
#include <cctype>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "../state/state_test_util.hpp"
#include "inferq/state/state_schema_store.hpp"
#include "inferq/state/state_store.hpp"

namespace {

using inferq::Compatibility;
using inferq::SchemaRef;
using inferq::SchemaRegistry;

std::string Table(const std::string& fields) {
  return "namespace t;\ntable T { " + fields + " }\nroot_type T;\n";
}

const std::string kV1 = Table("a:int; b:string; c:float = 1.0;");

constexpr std::array<Compatibility, 7> kModes = {
    Compatibility::kNone,               Compatibility::kBackward,
    Compatibility::kForward,            Compatibility::kFull,
    Compatibility::kBackwardTransitive, Compatibility::kForwardTransitive,
    Compatibility::kFullTransitive};

bool Backward(Compatibility m) {
  return m == Compatibility::kBackward || m == Compatibility::kFull ||
         m == Compatibility::kBackwardTransitive || m == Compatibility::kFullTransitive;
}

bool Forward(Compatibility m) {
  return m == Compatibility::kForward || m == Compatibility::kFull ||
         m == Compatibility::kForwardTransitive || m == Compatibility::kFullTransitive;
}

struct Change {
  const char* name;
  std::string v2;
  // The checker's reason for each direction; empty when it conforms.
  const char* new_to_old;  // v2.ConformTo(v1): BACKWARD (checked first under FULL)
  const char* old_to_new;  // v1.ConformTo(v2): FORWARD
};

// Verdicts found with `flatc --conform` (FlatBuffers 2.0.8) and asserted here exactly.
// Both directions agree on every verdict: ConformTo compares fields by name (offset,
// default, type) and fields present on one side by id (type), which is symmetric; the
// directions differ only in which field the reason names.
const std::vector<Change>& Changes() {
  static const std::vector<Change> changes = {
      {"append a field", Table("a:int; b:string; c:float = 1.0; d:long;"), "", ""},
      {"deprecate a field", Table("a:int; b:string (deprecated); c:float = 1.0;"), "", ""},
      {"insert a field in the middle (ids shift)",
       Table("a:int; x:long; b:string; c:float = 1.0;"),
       "field renamed to different type: x", "offsets differ for field: b"},
      {"change a field's type", Table("a:long; b:string; c:float = 1.0;"),
       "types differ for field: a", "types differ for field: a"},
      // Removing the last field conforms: nothing checks a field that one side lacks
      // unless the other side has a field of another type at its id.
      {"remove the last field", Table("a:int; b:string;"), "", ""},
      {"remove a field in the middle (ids shift)", Table("a:int; c:float = 1.0;"),
       "offsets differ for field: c", "field renamed to different type: b"},
      {"rename a field", Table("a:int; bb:string; c:float = 1.0;"), "", ""},
      {"change a default", Table("a:int; b:string; c:float = 2.0;"),
       "defaults differ for field: c", "defaults differ for field: c"},
  };
  return changes;
}

}  // namespace

TEST_CASE("compatibility matrix: every change under every mode", "[schema]") {
  for (const Change& change : Changes()) {
    for (Compatibility mode : kModes) {
      DYNAMIC_SECTION(change.name << " under " << inferq::CompatibilityName(mode)) {
        SchemaRegistry registry;
        REQUIRE(registry.SetCompatibility("s", mode).ok());
        auto v1 = registry.Register("s", kV1);
        REQUIRE(v1.ok());
        CHECK(*v1 == SchemaRef{1, 1});
        auto v2 = registry.Register("s", change.v2);

        // The registry checks the backward direction first, then the forward one.
        std::string reason;
        bool backward_failed = false;
        if (Backward(mode) && *change.new_to_old != '\0') {
          reason = change.new_to_old;
          backward_failed = true;
        } else if (Forward(mode)) {
          reason = change.old_to_new;
        }
        if (reason.empty()) {
          REQUIRE(v2.ok());
          CHECK(*v2 == SchemaRef{2, 2});
          CHECK(registry.Versions("s") == std::vector<std::uint32_t>{1, 2});
        } else {
          REQUIRE(v2.status().code() == absl::StatusCode::kFailedPrecondition);
          const std::string message(v2.status().message());
          const std::string mode_name = [&] {
            std::string n(inferq::CompatibilityName(mode));
            for (char& c : n) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
            return n;
          }();
          const std::string direction = backward_failed ? "(it must conform to version 1): "
                                                       : "(version 1 must conform to it): ";
          CHECK(message == "subject 's': new version 2 is not " + mode_name +
                               " compatible with version 1 " + direction + reason);
          CHECK(registry.Versions("s") == std::vector<std::uint32_t>{1});
        }

        // The same verdict from the pairwise check inferq-schema runs.
        const absl::Status pair = inferq::CheckCompatibility(kV1, change.v2, mode);
        CHECK(pair.ok() == reason.empty());
      }
    }
  }
}

TEST_CASE("a changed root_type or namespace is not compatible in any checking mode", "[schema]") {
  // ConformTo pairs tables by fully qualified name, so these passed every mode: a
  // reader of one would read the other's field 0 as the wrong type.
  const std::string a = "namespace t; table A { x:int; y:string; } root_type A;";
  const std::string renamed_ns = "namespace u; table A { x:string; y:string; } root_type A;";
  const std::string other_root = "table Z { q:string; } root_type Z;";
  for (Compatibility m : {Compatibility::kBackward, Compatibility::kForward, Compatibility::kFull,
                          Compatibility::kFullTransitive}) {
    const absl::Status ns = inferq::CheckCompatibility(a, renamed_ns, m);
    CHECK(ns.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(ns.message()).find("root_type changed from '") != std::string::npos);
    CHECK(inferq::CheckCompatibility(a, other_root, m).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  CHECK(inferq::CheckCompatibility(a, renamed_ns, Compatibility::kNone).ok());
  SchemaRegistry registry;
  REQUIRE(registry.Register("s", a).ok());
  auto v2 = registry.Register("s", renamed_ns);
  REQUIRE(v2.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(v2.status().message()) ==
        "subject 's': new version 2 is not BACKWARD compatible with version 1 (it must conform "
        "to version 1): root_type changed from 't.A' to 'u.A' (a renamed table or namespace is "
        "a new type to FlatBuffers)");
}

TEST_CASE("FlatBuffers checks neither struct size nor enum additions", "[schema]") {
  // Surprise: a field appended to a struct conforms, although structs are stored
  // inline and old readers would misread every later field of the struct's table.
  const std::string s1 = "struct S { x:int; }\ntable T { s:S; }\nroot_type T;\n";
  const std::string s2 = "struct S { x:int; y:int; }\ntable T { s:S; }\nroot_type T;\n";
  CHECK(inferq::CheckCompatibility(s1, s2, Compatibility::kFull).ok());
  // An enum value renumbered does not conform; one appended does.
  const std::string e1 = "enum E:byte { A, B }\ntable T { e:E; }\nroot_type T;\n";
  const std::string e2 = "enum E:byte { B, A }\ntable T { e:E; }\nroot_type T;\n";
  const std::string e3 = "enum E:byte { A, B, C }\ntable T { e:E; }\nroot_type T;\n";
  const absl::Status renumbered = inferq::CheckCompatibility(e1, e2, Compatibility::kBackward);
  CHECK(renumbered.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(renumbered.message()) ==
        "schemas don't conform under BACKWARD (the new schema must conform to the old one): "
        "values differ for enum: B");
  CHECK(inferq::CheckCompatibility(e1, e3, Compatibility::kFull).ok());
}

TEST_CASE("transitive modes check every earlier version, the plain ones only the latest",
          "[schema]") {
  // v1 -> v2 removes c (conforms), v2 -> v3 adds d:long (conforms), but v3's d takes
  // the id of v1's c:float: v1 -> v3 does not conform.
  const std::string v2 = Table("a:int; b:string;");
  const std::string v3 = Table("a:int; b:string; d:long;");
  REQUIRE(inferq::CheckCompatibility(kV1, v2, Compatibility::kFull).ok());
  REQUIRE(inferq::CheckCompatibility(v2, v3, Compatibility::kFull).ok());
  REQUIRE_FALSE(inferq::CheckCompatibility(kV1, v3, Compatibility::kFull).ok());

  struct Case {
    Compatibility mode;
    const char* error;  // empty: v3 accepted
  };
  const std::vector<Case> cases = {
      {Compatibility::kNone, ""},
      {Compatibility::kBackward, ""},
      {Compatibility::kForward, ""},
      {Compatibility::kFull, ""},
      {Compatibility::kBackwardTransitive,
       "subject 's': new version 3 is not BACKWARD_TRANSITIVE compatible with version 1 "
       "(it must conform to version 1): field renamed to different type: d"},
      {Compatibility::kForwardTransitive,
       "subject 's': new version 3 is not FORWARD_TRANSITIVE compatible with version 1 "
       "(version 1 must conform to it): field renamed to different type: c"},
      {Compatibility::kFullTransitive,
       "subject 's': new version 3 is not FULL_TRANSITIVE compatible with version 1 "
       "(it must conform to version 1): field renamed to different type: d"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(inferq::CompatibilityName(c.mode)) {
      SchemaRegistry registry;
      REQUIRE(registry.SetCompatibility("s", c.mode).ok());
      REQUIRE(registry.Register("s", kV1).ok());
      REQUIRE(registry.Register("s", v2).ok());
      auto r3 = registry.Register("s", v3);
      if (std::string(c.error).empty()) {
        REQUIRE(r3.ok());
        CHECK(*r3 == SchemaRef{3, 3});
      } else {
        REQUIRE(r3.status().code() == absl::StatusCode::kFailedPrecondition);
        CHECK(std::string(r3.status().message()) == c.error);
        CHECK(registry.Versions("s") == std::vector<std::uint32_t>{1, 2});
      }
    }
  }
}

TEST_CASE("the default mode is BACKWARD and a mode change applies to later versions",
          "[schema]") {
  SchemaRegistry registry;
  CHECK(registry.GetCompatibility("s") == Compatibility::kBackward);
  CHECK(inferq::kDefaultCompatibility == Compatibility::kBackward);
  REQUIRE(registry.Register("s", kV1).ok());
  const std::string retyped = Table("a:long; b:string; c:float = 1.0;");
  CHECK(registry.Register("s", retyped).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(registry.SetCompatibility("s", Compatibility::kNone).ok());
  CHECK(registry.GetCompatibility("s") == Compatibility::kNone);
  auto v2 = registry.Register("s", retyped);
  REQUIRE(v2.ok());
  CHECK(*v2 == SchemaRef{2, 2});
}

TEST_CASE("registration is idempotent for identical text", "[schema]") {
  SchemaRegistry registry;
  auto first = registry.Register("s", kV1);
  REQUIRE(first.ok());
  auto again = registry.Register("s", kV1);
  REQUIRE(again.ok());
  CHECK(*again == *first);
  CHECK(registry.Versions("s") == std::vector<std::uint32_t>{1});

  const std::string v2 = Table("a:int; b:string; c:float = 1.0; d:long;");
  REQUIRE(*registry.Register("s", v2) == SchemaRef{2, 2});
  // An earlier version's text returns that version, it is not appended again.
  CHECK(*registry.Register("s", kV1) == SchemaRef{1, 1});
  CHECK(registry.Versions("s") == std::vector<std::uint32_t>{1, 2});
  // Ids belong to the text: the same text under another subject keeps its id.
  CHECK(*registry.Register("other", v2) == SchemaRef{2, 1});
  CHECK(registry.Subjects() == std::vector<std::string>{"other", "s"});
  // Text that differs only in white space is another schema.
  CHECK(*registry.Register("s", kV1 + "\n") == SchemaRef{3, 3});
}

TEST_CASE("Get, Latest and Versions", "[schema]") {
  SchemaRegistry registry;
  CHECK(registry.Versions("s").empty());
  CHECK(registry.Latest("s").status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(registry.Latest("s").status().message()) ==
        "schema subject 's' has no versions");
  const std::string v2 = Table("a:int; b:string; c:float = 1.0; d:long;");
  REQUIRE(registry.Register("s", kV1).ok());
  REQUIRE(registry.Register("s", v2).ok());
  auto got = registry.Get("s", 1);
  REQUIRE(got.ok());
  CHECK(got->subject == "s");
  CHECK(got->ref == SchemaRef{1, 1});
  CHECK(got->fbs_text == kV1);
  auto latest = registry.Latest("s");
  REQUIRE(latest.ok());
  CHECK(latest->ref == SchemaRef{2, 2});
  CHECK(latest->fbs_text == v2);
  auto missing = registry.Get("s", 3);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()) == "schema subject 's' has no version 3 (it has 1..2)");
  CHECK(registry.Get("s", 0).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("bad schema text is InvalidArgument with the parser's error", "[schema]") {
  SchemaRegistry registry;
  auto bad = registry.Register("s", "table T { a:int");
  REQUIRE(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(bad.status().message()) ==
        "subject 's' schema does not parse: 1: 15: error: expecting: ; instead got: end of file");
  auto unknown_type = registry.Register("s", "table T { a:Missing; }");
  REQUIRE(unknown_type.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(unknown_type.status().message()).find("Missing") != std::string::npos);
  CHECK(registry.Versions("s").empty());

  // The registry never reads files: include statements are refused before parsing.
  auto include = registry.Register("s", "// comment\n/* c */ include \"other.fbs\";\n" + kV1);
  REQUIRE(include.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(include.status().message()) ==
        "subject 's' schema: include statements are not supported (register a "
        "self-contained schema)");
  // Smallest inputs that got an include past the check: after native_include
  // statements (FlatBuffers takes both, mixed, at the start) and after a UTF-8 byte
  // order mark. The file named does not exist: a parse that tried it would say so.
  for (const std::string& hidden :
       {std::string("native_include \"x\";\ninclude \"/nonexistent/base.fbs\";\n"),
        std::string("native_include 'a;b' ; /* c */ native_include \"y\";include \"/nonexistent/b.fbs\";"),
        std::string("\xEF\xBB\xBFinclude \"/nonexistent/base.fbs\";\n")}) {
    INFO(hidden);
    auto r = registry.Register("s", hidden + kV1);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()) ==
          "subject 's' schema: include statements are not supported (register a "
          "self-contained schema)");
  }
  CHECK(registry.Register("n", "native_include \"x\";\n" + kV1).ok());  // reads nothing
  CHECK(registry.Register("", kV1).status().code() == absl::StatusCode::kInvalidArgument);

  // Text after a NUL byte would be stored unchecked (the parser stops at the NUL).
  using namespace std::string_literals;
  auto nul = registry.Register("s", "table T { a:int; }\0junk"s);
  REQUIRE(nul.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(nul.status().message()) ==
        "subject 's' schema is not schema text: it has a NUL byte at offset 18");
  CHECK(registry.Versions("s").empty());

  const absl::Status pair = inferq::CheckCompatibility(kV1, "table T {", Compatibility::kFull);
  CHECK(pair.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(pair.message()).rfind("new schema does not parse: ", 0) == 0);
}

TEST_CASE("a subject longer than the limit is InvalidArgument naming it, before the store",
          "[schema]") {
  const std::string too_long = "tensor." + std::string(70'000 - 7, 'x');
  const std::string expected = "schema subject starting 'tensor." + std::string(57, 'x') +
                               "' has 70000 bytes; subjects have 1 to 65000 bytes";
  state_test::TempDir dir;
  inferq::StateStoreOptions options;
  options.dir = dir.path();
  auto store = inferq::StateStore::Open(options);
  REQUIRE(store.ok());
  auto durable = inferq::OpenSchemaRegistry(**store);
  REQUIRE(durable.ok());
  SchemaRegistry in_memory;
  for (SchemaRegistry* registry : {durable->get(), &in_memory}) {
    const absl::Status registered = registry->Register(too_long, kV1).status();
    CHECK(registered.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(registered.message()) == expected);
    const absl::Status mode = registry->SetCompatibility(too_long, Compatibility::kNone);
    CHECK(mode.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(mode.message()) == expected);
    CHECK(registry->Subjects().empty());
    // At the limit: registered, and durable (its longest key fits the store's keys).
    const std::string at_limit(65'000, 's');
    CHECK(*registry->Register(at_limit, kV1) == SchemaRef{1, 1});
    CHECK(registry->SetCompatibility(at_limit, Compatibility::kFull).ok());
  }
  std::vector<std::string> keys;
  (*store)->Scan("schema.", [&keys](std::string_view k, std::string_view) {
    keys.push_back(std::string(k.substr(0, 9)) + "..." + std::to_string(k.size()));
  });
  CHECK(keys == std::vector<std::string>{"schema.ss...65009", "schema.ss...65012"});
  // A multi-byte UTF-8 character is not cut in the message: 63 bytes + "é" would
  // cross the 64-byte mark, so the quoted start stops before it.
  const std::string utf8 = std::string(63, 'u') + "\xc3\xa9" + std::string(65'000, 'u');
  CHECK(std::string(in_memory.Register(utf8, kV1).status().message()) ==
        "schema subject starting '" + std::string(63, 'u') +
            "' has 65065 bytes; subjects have 1 to 65000 bytes");
}

TEST_CASE("compatibility mode names round-trip", "[schema]") {
  for (Compatibility mode : kModes) {
    auto parsed = inferq::ParseCompatibility(inferq::CompatibilityName(mode));
    REQUIRE(parsed.ok());
    CHECK(*parsed == mode);
  }
  CHECK(inferq::CompatibilityName(Compatibility::kFullTransitive) == "full_transitive");
  CHECK(inferq::ParseCompatibility("FULL").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a registry on a StateStore is rebuilt when reopened", "[schema]") {
  state_test::TempDir dir;
  inferq::StateStoreOptions options;
  options.dir = dir.path();
  const std::string v2 = Table("a:int; b:string; c:float = 1.0; d:long;");
  {
    auto store = inferq::StateStore::Open(options);
    REQUIRE(store.ok());
    auto registry = inferq::OpenSchemaRegistry(**store);
    REQUIRE(registry.ok());
    REQUIRE((*registry)->Register("tensor.events", kV1).ok());
    REQUIRE((*registry)->Register("tensor.events", v2).ok());
    REQUIRE((*registry)->SetCompatibility("tensor.events", Compatibility::kFullTransitive).ok());
    REQUIRE((*registry)->SetCompatibility("empty", Compatibility::kNone).ok());
    REQUIRE((*registry)->Register("other", kV1).ok());
    CHECK((*store)->Get("tensor.events.2").has_value() == false);
    CHECK((*store)->Get("schema.tensor.events.2") == "2\n" + v2);
    CHECK((*store)->Get("schema.tensor.events.meta") == "mode=full_transitive\nlatest=2");
  }
  auto store = inferq::StateStore::Open(options);
  REQUIRE(store.ok());
  auto registry = inferq::OpenSchemaRegistry(**store);
  REQUIRE(registry.ok());
  SchemaRegistry& r = **registry;
  CHECK(r.Versions("tensor.events") == std::vector<std::uint32_t>{1, 2});
  CHECK(r.GetCompatibility("tensor.events") == Compatibility::kFullTransitive);
  CHECK(r.GetCompatibility("empty") == Compatibility::kNone);
  CHECK(r.Subjects() == std::vector<std::string>{"other", "tensor.events"});
  CHECK(r.Latest("tensor.events")->fbs_text == v2);
  CHECK(*r.Register("tensor.events", kV1) == SchemaRef{1, 1});  // idempotent after reopen
  CHECK(*r.Register("other", v2) == SchemaRef{2, 2});           // the id of v2's text
  // The rebuilt parsers still check: a type change under FULL_TRANSITIVE is refused.
  CHECK(r.Register("tensor.events", Table("a:long;")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  auto v3 = r.Register("tensor.events", Table("a:int; b:string; c:float = 1.0; d:long; e:int;"));
  REQUIRE(v3.ok());
  CHECK(*v3 == SchemaRef{3, 3});  // a new id after the largest stored one
}

TEST_CASE("damaged registry keys in the store are DataLoss naming the key", "[schema]") {
  state_test::TempDir dir;
  inferq::StateStoreOptions options;
  options.dir = dir.path();
  auto store = inferq::StateStore::Open(options);
  REQUIRE(store.ok());
  SECTION("a version gap") {
    REQUIRE((*store)->Begin().Put("schema.s.2", "1\n" + kV1).Put("schema.s.meta",
                                                                 "mode=backward\nlatest=2").Commit().ok());
    auto r = inferq::OpenSchemaRegistry(**store);
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()) ==
          "schema registry subject 's' records latest 2 but holds 1 version keys (versions must "
          "be 1..latest)");
  }
  SECTION("a text that does not parse") {
    REQUIRE((*store)->Begin().Put("schema.s.1", "1\ntable {").Put("schema.s.meta",
                                                                  "mode=backward\nlatest=1").Commit().ok());
    auto r = inferq::OpenSchemaRegistry(**store);
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()).rfind("schema registry key 'schema.s.1' does not parse: ", 0) == 0);
  }
  SECTION("an unknown mode") {
    REQUIRE((*store)->Begin().Put("schema.s.meta", "mode=sideways\nlatest=0").Commit().ok());
    auto r = inferq::OpenSchemaRegistry(**store);
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(r.status().message()).rfind("schema registry key 'schema.s.meta': compatibility mode 'sideways'", 0) == 0);
  }
}

TEST_CASE("concurrent registrations number versions without gaps", "[schema]") {
  SchemaRegistry registry;
  REQUIRE(registry.SetCompatibility("s", Compatibility::kNone).ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10;
  std::vector<std::thread> threads;
  std::vector<std::vector<SchemaRef>> refs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &registry, &refs] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every thread also registers one shared text: one version for all of them.
        auto shared = registry.Register("s", Table("shared:int;"));
        auto own = registry.Register(
            "s", Table("f" + std::to_string(t) + "_" + std::to_string(i) + ":int;"));
        REQUIRE(shared.ok());
        REQUIRE(own.ok());
        refs[t].push_back(*shared);
        refs[t].push_back(*own);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<std::uint32_t> versions = registry.Versions("s");
  REQUIRE(versions.size() == kThreads * kPerThread + 1);
  for (std::size_t i = 0; i < versions.size(); ++i) CHECK(versions[i] == i + 1);
  for (const auto& per_thread : refs) {
    for (std::size_t i = 0; i < per_thread.size(); i += 2) CHECK(per_thread[i] == refs[0][0]);
  }
}

namespace {

// A SchemaStore in memory that records every Write and fails on request.
class FakeSchemaStore : public inferq::SchemaStore {
 public:
  struct Shared {
    std::map<std::string, std::string> records;
    std::vector<std::vector<inferq::SchemaStoreRecord>> writes;
    absl::Status read_error;   // ReadAll's result when not OK
    absl::Status write_error;  // Write's result when not OK (nothing stored then)
  };
  explicit FakeSchemaStore(Shared& shared) : shared_(shared) {}
  absl::Status ReadAll(
      absl::FunctionRef<void(std::string_view, std::string_view)> fn) override {
    if (!shared_.read_error.ok()) return shared_.read_error;
    for (const auto& [key, value] : shared_.records) fn(key, value);
    return absl::OkStatus();
  }
  absl::Status Write(const std::vector<inferq::SchemaStoreRecord>& records) override {
    shared_.writes.push_back(records);
    if (!shared_.write_error.ok()) return shared_.write_error;
    for (const inferq::SchemaStoreRecord& r : records) shared_.records[r.key] = r.value;
    return absl::OkStatus();
  }

 private:
  Shared& shared_;
};

std::vector<std::string> Keys(const std::vector<inferq::SchemaStoreRecord>& records) {
  std::vector<std::string> out;
  for (const inferq::SchemaStoreRecord& r : records) out.push_back(r.key);
  return out;
}

}  // namespace

TEST_CASE("a registry writes a version and its meta record in one SchemaStore write",
          "[schema]") {
  FakeSchemaStore::Shared shared;
  auto registry = SchemaRegistry::Open(std::make_unique<FakeSchemaStore>(shared));
  REQUIRE(registry.ok());
  CHECK(shared.writes.empty());  // opening reads only
  REQUIRE((*registry)->Register("s", kV1).ok());
  REQUIRE(shared.writes.size() == 1);
  CHECK(Keys(shared.writes[0]) == std::vector<std::string>{"schema.s.1", "schema.s.meta"});
  CHECK(shared.writes[0][0].value == "1\n" + kV1);
  CHECK(shared.writes[0][1].value == "mode=backward\nlatest=1");
  REQUIRE((*registry)->SetCompatibility("s", Compatibility::kFull).ok());
  REQUIRE(shared.writes.size() == 2);
  CHECK(Keys(shared.writes[1]) == std::vector<std::string>{"schema.s.meta"});
  CHECK(shared.writes[1][0].value == "mode=full\nlatest=1");
  CHECK(*(*registry)->Register("s", kV1) == SchemaRef{1, 1});  // idempotent: no write
  CHECK(shared.writes.size() == 2);
  // Reopened on the same records: the same content.
  auto reopened = SchemaRegistry::Open(std::make_unique<FakeSchemaStore>(shared));
  REQUIRE(reopened.ok());
  CHECK((*reopened)->Versions("s") == std::vector<std::uint32_t>{1});
  CHECK((*reopened)->GetCompatibility("s") == Compatibility::kFull);
}

TEST_CASE("a failed SchemaStore write is returned and keeps nothing", "[schema]") {
  FakeSchemaStore::Shared shared;
  auto registry = SchemaRegistry::Open(std::make_unique<FakeSchemaStore>(shared));
  REQUIRE(registry.ok());
  shared.write_error = absl::UnavailableError("disk 'd0' is gone");
  const absl::Status registered = (*registry)->Register("s", kV1).status();
  CHECK(registered == absl::UnavailableError("disk 'd0' is gone"));
  CHECK((*registry)->Versions("s").empty());
  CHECK((*registry)->Subjects().empty());
  CHECK((*registry)->SetCompatibility("s", Compatibility::kNone) ==
        absl::UnavailableError("disk 'd0' is gone"));
  CHECK((*registry)->GetCompatibility("s") == inferq::kDefaultCompatibility);
  CHECK(shared.writes.size() == 2);
  shared.write_error = absl::OkStatus();
  CHECK(*(*registry)->Register("s", kV1) == SchemaRef{1, 1});  // id 1 was not used up
}

TEST_CASE("opening a registry returns the SchemaStore's read error", "[schema]") {
  FakeSchemaStore::Shared shared;
  shared.read_error = absl::PermissionDeniedError("cannot read 'registry.db'");
  auto registry = SchemaRegistry::Open(std::make_unique<FakeSchemaStore>(shared));
  CHECK(registry.status() == absl::PermissionDeniedError("cannot read 'registry.db'"));
}

TEST_CASE("opening a registry on a null SchemaStore is InvalidArgument", "[schema]") {
  auto registry = SchemaRegistry::Open(nullptr);
  CHECK(registry.status() ==
        absl::InvalidArgumentError("SchemaRegistry::Open: the SchemaStore is null"));
}

TEST_CASE("a stored record without the schema. prefix is DataLoss naming its key",
          "[schema]") {
  FakeSchemaStore::Shared shared;
  shared.records["s.1"] = "1\n" + kV1;
  auto registry = SchemaRegistry::Open(std::make_unique<FakeSchemaStore>(shared));
  CHECK(registry.status() ==
        absl::DataLossError("schema registry key 's.1' does not start with 'schema.'"));
}
