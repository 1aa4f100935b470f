// SchemaReader: schema-on-read across three versions of one subject (fixtures
// tests/schema/data/read_v{1,2,3}.fbs): an older writer read by a newer reader takes
// the reader's defaults, a newer writer's unknown fields are skipped, deprecated and
// renamed fields follow field ids, corrupt payloads are DataLoss, and the registry's
// binary schemas are the bytes `flatc -b --schema` writes (INFERQ_SCHEMA_BFBS_DIR,
// generated at build time).
#include "inferq/schema/schema_reader.hpp"

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <flatbuffers/idl.h>

#include "../state/state_test_util.hpp"
#include "inferq/schema/registry.hpp"
#include "inferq/state/state_schema_store.hpp"
#include "inferq/state/state_store.hpp"

namespace {

using inferq::FieldOrigin;
using inferq::Record;
using inferq::SchemaRegistry;
using inferq::Value;

constexpr const char* kSubject = "req";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string Fbs(int v) {
  return Slurp(std::string(INFERQ_SCHEMA_DATA_DIR) + "/read_v" + std::to_string(v) + ".fbs");
}

// A payload built from JSON by the writer's own schema (FlatBuffers' parser omits
// scalars equal to their default, as generated code does).
std::string Build(const std::string& fbs, const std::string& json) {
  flatbuffers::Parser parser;
  REQUIRE(parser.Parse(fbs.c_str()));
  INFO(json);
  REQUIRE(parser.ParseJson(json.c_str()));
  return std::string(reinterpret_cast<const char*>(parser.builder_.GetBufferPointer()),
                     parser.builder_.GetSize());
}

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// Registers read_v1..v3 under BACKWARD (the default): each conforms to the one before.
void RegisterAll(SchemaRegistry& registry) {
  for (int v = 1; v <= 3; ++v) {
    auto ref = registry.Register(kSubject, Fbs(v));
    REQUIRE(ref.ok());
    REQUIRE(ref->version == static_cast<std::uint32_t>(v));
  }
}

const Value& Get(const Record& r, const char* name) {
  const inferq::RecordField* f = r.Find(name);
  INFO(name);
  REQUIRE(f != nullptr);
  return f->value;
}
FieldOrigin OriginOf(const Record& r, const char* name) {
  const inferq::RecordField* f = r.Find(name);
  INFO(name);
  REQUIRE(f != nullptr);
  return f->origin;
}

// Every version-1 field set to a non-default value.
const char* kFullV1 = R"({
  id: 18446744073709551615, prompt: "hello", tokens: [1, -2, 3], temperature: 0.25,
  priority: "High", origin: {host: "a", pid: 7}, shape: {rows: 2, cols: 3},
  stream: true, tags: ["x", "y"], history: [{host: "h1"}, {pid: 9}]
})";

// The values of kFullV1 as any version reads them (the prompt under `prompt_name`).
void CheckV1Values(const Record& r, const char* prompt_name) {
  CHECK(Get(r, "id") == Value::Uint(18446744073709551615ULL));
  CHECK(Get(r, prompt_name) == Value::String("hello"));
  CHECK(Get(r, "tokens") == Value::Vector({Value::Int(1), Value::Int(-2), Value::Int(3)}));
  CHECK(Get(r, "temperature") == Value::Float(0.25));
  CHECK(Get(r, "priority") == Value::Int(2));
  CHECK(Get(r, "stream") == Value::Bool(true));
  const Record& origin = Get(r, "origin").as_record();
  CHECK(origin.type_name() == "t.read.Origin");
  CHECK(Get(origin, "host") == Value::String("a"));
  CHECK(Get(origin, "pid") == Value::Uint(7));
  const Record& shape = Get(r, "shape").as_record();
  CHECK(shape.type_name() == "t.read.Shape");
  CHECK(shape.DebugString() == "{rows: 2, cols: 3}");
  const std::vector<Value>& history = Get(r, "history").as_vector();
  REQUIRE(history.size() == 2);
  CHECK(Get(history[0].as_record(), "host") == Value::String("h1"));
  CHECK(Get(history[0].as_record(), "pid") == Value::Uint(0));
  CHECK(OriginOf(history[0].as_record(), "pid") == FieldOrigin::kAbsent);
  CHECK(Get(history[1].as_record(), "host").is_null());
  CHECK(Get(history[1].as_record(), "pid") == Value::Uint(9));
}

TEST_CASE("a reader reads its own version's values exactly", "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto reader = registry.Reader(kSubject, 1);
  REQUIRE(reader.ok());
  CHECK(reader->subject() == kSubject);
  CHECK(reader->version() == 1);

  SECTION("every field written") {
    auto r = reader->Read(Bytes(Build(Fbs(1), kFullV1)), 1);
    REQUIRE(r.ok());
    CHECK(r->type_name() == "t.read.Request");
    CheckV1Values(*r, "prompt");
    CHECK(Get(*r, "tags") == Value::Vector({Value::String("x"), Value::String("y")}));
    CHECK(r->defaulted() == 0);
    CHECK(r->skipped().empty());
    std::vector<std::string> names;
    for (const auto& f : r->fields()) names.push_back(f.name);
    CHECK(names == std::vector<std::string>{"id", "prompt", "tokens", "temperature", "priority",
                                            "origin", "shape", "stream", "tags", "history"});
  }
  SECTION("fields the buffer does not hold take the schema's defaults") {
    auto r = reader->Read(Bytes(Build(Fbs(1), R"({id: 5, temperature: 0.7})")), 1);
    REQUIRE(r.ok());
    CHECK(r->DebugString() ==
          "{id: 5, prompt: null, tokens: null, temperature: 0.699999988, priority: 1, "
          "origin: null, shape: null, stream: false, tags: null, history: null}");
    CHECK(OriginOf(*r, "id") == FieldOrigin::kWritten);
    // 0.7 equals the default: the parser (like generated code) does not write it.
    CHECK(OriginOf(*r, "temperature") == FieldOrigin::kAbsent);
    CHECK(Get(*r, "temperature") == Value::Float(static_cast<double>(0.7f)));
    CHECK(r->defaulted() == 9);
  }
}

TEST_CASE("an older writer read as a newer version gets the reader's defaults",
          "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto v2 = registry.Reader(kSubject, 2);
  REQUIRE(v2.ok());
  auto r = v2->Read(Bytes(Build(Fbs(1), kFullV1)), 1);
  REQUIRE(r.ok());
  CheckV1Values(*r, "prompt");
  CHECK(Get(*r, "max_tokens") == Value::Int(256));
  CHECK(OriginOf(*r, "max_tokens") == FieldOrigin::kNotInWriter);
  CHECK(r->defaulted() == 1);
  const Record& origin = Get(*r, "origin").as_record();
  CHECK(Get(origin, "zone").is_null());
  CHECK(OriginOf(origin, "zone") == FieldOrigin::kNotInWriter);
  CHECK(OriginOf(Get(*r, "history").as_vector()[1].as_record(), "zone") ==
        FieldOrigin::kNotInWriter);
  CHECK(r->skipped().empty());
}

TEST_CASE("a newer writer's fields unknown to the reader are skipped", "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto v1 = registry.Reader(kSubject, 1);
  REQUIRE(v1.ok());
  SECTION("written") {
    const std::string payload = Build(
        Fbs(2), R"({id: 3, prompt: "p", max_tokens: 512, origin: {host: "a", zone: "eu"}})");
    auto r = v1->Read(Bytes(payload), 2);
    REQUIRE(r.ok());
    CHECK(r->Find("max_tokens") == nullptr);
    CHECK(r->skipped() == std::vector<std::string>{"max_tokens"});
    CHECK(Get(*r, "id") == Value::Uint(3));
    CHECK(Get(*r, "prompt") == Value::String("p"));
    const Record& origin = Get(*r, "origin").as_record();
    CHECK(origin.DebugString() == "{host: \"a\", pid: 0}");
    CHECK(origin.skipped() == std::vector<std::string>{"zone"});
    // The same payload read by its own version holds them.
    auto own = registry.Reader(kSubject, 2)->Read(Bytes(payload), 2);
    REQUIRE(own.ok());
    CHECK(Get(*own, "max_tokens") == Value::Int(512));
    CHECK(own->skipped().empty());
  }
  SECTION("a field at its default is not in the buffer: nothing to skip") {
    auto r = v1->Read(Bytes(Build(Fbs(2), R"({id: 3, max_tokens: 256})")), 2);
    REQUIRE(r.ok());
    CHECK(r->skipped().empty());
  }
}

TEST_CASE("renamed fields follow their id; deprecated ones are neither read nor written",
          "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  SECTION("version 1 written, version 3 read") {
    auto r = registry.Reader(kSubject, 3)->Read(Bytes(Build(Fbs(1), kFullV1)), 1);
    REQUIRE(r.ok());
    CheckV1Values(*r, "text");  // prompt, renamed
    CHECK(r->Find("prompt") == nullptr);
    CHECK(r->Find("tags") == nullptr);  // deprecated in the reader
    CHECK(r->skipped() == std::vector<std::string>{"tags"});
    CHECK(Get(*r, "max_tokens") == Value::Int(256));
    CHECK(r->defaulted() == 1);
  }
  SECTION("version 3 written, version 1 read") {
    auto r = registry.Reader(kSubject, 1)->Read(
        Bytes(Build(Fbs(3), R"({id: 1, text: "renamed", max_tokens: 64})")), 3);
    REQUIRE(r.ok());
    CHECK(Get(*r, "prompt") == Value::String("renamed"));
    CHECK(Get(*r, "tags").is_null());
    CHECK(OriginOf(*r, "tags") == FieldOrigin::kNotInWriter);  // deprecated by the writer
    CHECK(r->skipped() == std::vector<std::string>{"max_tokens"});
  }
}

TEST_CASE("corrupt payloads are DataLoss naming what failed", "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto reader = registry.Reader(kSubject, 2);
  REQUIRE(reader.ok());
  const std::string good = Build(Fbs(1), kFullV1);

  auto code_and_message = [&](const std::string& bytes) {
    auto r = reader->Read(Bytes(bytes), 1);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    return std::string(r.status().message());
  };
  CHECK(code_and_message("") ==
        "payload of 0 bytes written with subject 'req' version 1 (root table t.read.Request) "
        "is too short to hold a FlatBuffer root table");
  std::string past_end = good;
  const std::uint32_t far = 0x7ffffff0;
  std::memcpy(past_end.data(), &far, 4);
  CHECK(code_and_message(past_end).find("its root offset points past its end") !=
        std::string::npos);
  CHECK(code_and_message(good.substr(0, good.size() / 2)) ==
        "payload of " + std::to_string(good.size() / 2) +
            " bytes written with subject 'req' version 1 (root table t.read.Request) does not "
            "verify against that schema (an offset, length or alignment is out of bounds)");
  // The prompt's length prefix (the 4 bytes before "hello") made huge.
  std::string long_string = good;
  const std::size_t at = long_string.find("hello");
  REQUIRE(at != std::string::npos);
  const std::uint32_t huge = 0x7ffffff0;
  std::memcpy(long_string.data() + at - 4, &huge, 4);
  CHECK(code_and_message(long_string).find("does not verify") != std::string::npos);

  SECTION("no single flipped byte makes a read go out of bounds") {
    // Each result is OK (a value changed) or DataLoss; ASan checks the reads.
    // (FlatBuffers 2.0.8's own flatbuffers::Verify crashes on byte 23 ^ 0xff.)
    for (const int mask : {0xff, 0x80, 0x01}) {
      for (std::size_t i = 0; i < good.size(); ++i) {
        std::string bad = good;
        bad[i] = static_cast<char>(bad[i] ^ mask);
        auto r = reader->Read(Bytes(bad), 1);
        INFO("byte " << i << " ^ " << mask);
        CHECK((r.ok() || r.status().code() == absl::StatusCode::kDataLoss));
      }
    }
  }
}

TEST_CASE("unknown subjects and versions are NotFound naming them", "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto none = registry.Reader("nope", 1);
  CHECK(none.status().code() == absl::StatusCode::kNotFound);
  CHECK(none.status().message() == "schema subject 'nope' has no versions");
  auto v9 = registry.Reader(kSubject, 9);
  CHECK(v9.status().code() == absl::StatusCode::kNotFound);
  CHECK(v9.status().message() == "schema subject 'req' has no version 9 (it has 1..3)");
  auto r = registry.Reader(kSubject, 1)->Read(Bytes(Build(Fbs(1), "{id: 1}")), 7);
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(r.status().message() == "schema subject 'req' has no version 7 (it has 1..3)");
}

TEST_CASE("a version registered after the reader was made is read", "[schema_reader]") {
  SchemaRegistry registry;
  REQUIRE(registry.Register(kSubject, Fbs(1)).ok());
  auto v1 = registry.Reader(kSubject, 1);
  REQUIRE(v1.ok());
  REQUIRE(registry.Register(kSubject, Fbs(2)).ok());
  auto r = v1->Read(Bytes(Build(Fbs(2), "{id: 1, max_tokens: 5}")), 2);
  REQUIRE(r.ok());
  CHECK(r->skipped() == std::vector<std::string>{"max_tokens"});
}

TEST_CASE("a field whose type differs between versions is FailedPrecondition naming it",
          "[schema_reader]") {
  SchemaRegistry registry;
  REQUIRE(registry.SetCompatibility("x", inferq::Compatibility::kNone).ok());
  const std::string data = INFERQ_SCHEMA_DATA_DIR;
  REQUIRE(registry.Register("x", Slurp(data + "/v1.fbs")).ok());
  REQUIRE(registry.Register("x", Slurp(data + "/v2_type_change.fbs")).ok());
  auto reader = registry.Reader("x", 2);
  REQUIRE(reader.ok());
  auto r = reader->Read(Bytes(Build(Slurp(data + "/v1.fbs"), "{a: 1}")), 1);
  CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(r.status().message() ==
        "field 't.T.a' (id 0) is Long in subject 'x' version 2 but Int ('a') in subject 'x' "
        "version 1");
}

TEST_CASE("unions, arrays and a missing root_type are refused when the reader is made",
          "[schema_reader]") {
  SchemaRegistry registry;
  REQUIRE(registry.Register("u", "table A { x:int; }\nunion U { A }\n"
                                 "table T { u:U; }\nroot_type T;\n").ok());
  auto u = registry.Reader("u", 1);
  CHECK(u.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(u.status().message() ==
        "subject 'u' version 1: field 'T.u_type' (id 0) is a union, which schema-on-read "
        "does not read");
  REQUIRE(registry.Register("arr", "struct S { v:[int:3]; }\ntable T { s:S; }\nroot_type T;\n")
              .ok());
  CHECK(registry.Reader("arr", 1).status().code() == absl::StatusCode::kUnimplemented);
  REQUIRE(registry.Register("noroot", "table T { a:int; }\n").ok());
  auto noroot = registry.Reader("noroot", 1);
  CHECK(noroot.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(noroot.status().message() == "subject 'noroot' version 1 declares no root_type");
}

TEST_CASE("Read(event) uses schema_version and checks schema_id", "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto reader = registry.Reader(kSubject, 2);
  REQUIRE(reader.ok());
  inferq::Event e;
  e.schema_version = 1;
  e.schema_id = static_cast<std::uint32_t>(registry.Get(kSubject, 1)->ref.id);
  e.payload = inferq::Buffer::FromString(Build(Fbs(1), "{id: 4}"));
  auto r = reader->Read(e);
  REQUIRE(r.ok());
  CHECK(Get(*r, "id") == Value::Uint(4));
  e.schema_id = 99;
  auto wrong = reader->Read(e);
  CHECK(wrong.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(wrong.status().message() ==
        "event schema_id 99 is not the id of subject 'req' version 1 (1)");
  // A compressed payload is named, not reported as a corrupt FlatBuffer.
  e.schema_id = static_cast<std::uint32_t>(registry.Get(kSubject, 1)->ref.id);
  e.codec = inferq::PayloadCodec::kZstd;
  auto compressed = reader->Read(e);
  CHECK(compressed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(compressed.status().message() ==
        "event payload of subject 'req' version 1 is compressed (codec zstd); SchemaReader reads "
        "raw FlatBuffers: decompress it first, or have the consumer receive it raw "
        "(ConsumerConfig::accept_codecs = {PayloadCodec::kNone})");
}

TEST_CASE("the registry's binary schemas are what flatc -b --schema writes",
          "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  std::vector<std::string> flatc;
  for (int v = 1; v <= 3; ++v) {
    flatc.push_back(Slurp(std::string(INFERQ_SCHEMA_BFBS_DIR) + "/read_v" + std::to_string(v) +
                          ".bfbs"));
    INFO("version " << v);
    CHECK(registry.Get(kSubject, static_cast<std::uint32_t>(v))->bfbs == flatc.back());
  }
  // And ReadFlatBuffer on flatc's files reads as the registry's reader does.
  const std::string payload = Build(Fbs(1), kFullV1);
  auto from_flatc = inferq::ReadFlatBuffer(Bytes(payload), flatc[0], flatc[2]);
  REQUIRE(from_flatc.ok());
  auto from_registry = registry.Reader(kSubject, 3)->Read(Bytes(payload), 1);
  REQUIRE(from_registry.ok());
  CHECK(*from_flatc == *from_registry);
  auto not_bfbs = inferq::ReadFlatBuffer(Bytes(payload), "not a schema", flatc[0]);
  CHECK(not_bfbs.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(not_bfbs.status().message() ==
        "writer schema: not a binary schema (reflection::Schema, 12 bytes)");
}

TEST_CASE("a registry reopened from its StateStore keeps the binary schemas",
          "[schema_reader]") {
  state_test::TempDir dir;
  inferq::StateStoreOptions options;
  options.dir = dir.path();
  std::string bfbs2;
  {
    auto store = inferq::StateStore::Open(options);
    REQUIRE(store.ok());
    auto registry = inferq::OpenSchemaRegistry(**store);
    REQUIRE(registry.ok());
    RegisterAll(**registry);
    bfbs2 = (*registry)->Get(kSubject, 2)->bfbs;
  }
  auto store = inferq::StateStore::Open(options);
  REQUIRE(store.ok());
  auto registry = inferq::OpenSchemaRegistry(**store);
  REQUIRE(registry.ok());
  CHECK((*registry)->Get(kSubject, 2)->bfbs == bfbs2);
  auto r = (*registry)->Reader(kSubject, 2)->Read(Bytes(Build(Fbs(1), "{id: 8}")), 1);
  REQUIRE(r.ok());
  CHECK(Get(*r, "max_tokens") == Value::Int(256));
}

TEST_CASE("many threads read through one reader while it resolves new writer versions",
          "[schema_reader]") {
  SchemaRegistry registry;
  RegisterAll(registry);
  auto reader = registry.Reader(kSubject, 2);
  REQUIRE(reader.ok());
  const std::vector<std::string> payloads = {
      Build(Fbs(1), kFullV1), Build(Fbs(2), R"({id: 2, max_tokens: 9})"),
      Build(Fbs(3), R"({id: 3, text: "t"})")};
  std::vector<Record> expected;
  {
    SchemaRegistry fresh;  // expected values from a reader no other thread touches
    RegisterAll(fresh);
    for (std::uint32_t v = 1; v <= 3; ++v) {
      expected.push_back(*fresh.Reader(kSubject, 2)->Read(Bytes(payloads[v - 1]), v));
    }
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      const inferq::SchemaReader copy = *reader;  // copies share the cache
      for (int i = 0; i < 300; ++i) {
        const std::uint32_t v = static_cast<std::uint32_t>((i + t) % 3) + 1;
        auto r = copy.Read(Bytes(payloads[v - 1]), v);
        if (!r.ok() || !(*r == expected[v - 1])) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
}

}  // namespace
