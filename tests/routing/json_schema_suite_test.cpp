// The official JSON Schema Test Suite (https://github.com/json-schema-org/JSON-Schema-Test-Suite,
// Debian's json-schema-test-suite 2.0.0) run through Predicate::JsonSchema: every group's
// schema becomes a predicate, every case's data an event payload, and Matches must equal
// the case's "valid".
//
// The cases that fail (valijson 1.0's gaps; the reasons are in
// docs/guide/json-schema-conformance.md) are listed below, and the test asserts that
// exactly those fail: a new failure fails the test, and so does a listed case that
// starts to pass (remove it from the list). Files
// under optional/ are run and reported, but asserted only when listed in
// kPassingOptional, and those must pass entirely.
//
// Remote "$ref"s to http://localhost:1234/ are served from the suite's remotes/ folder
// through JsonSchemaOptions::fetch.
//
// With INFERQ_JSON_SCHEMA_SUITE_REPORT=<file> in the environment, the test also appends a
// Markdown report (counts per draft, every failing case) to that file; the per-draft
// tables of docs/guide/json-schema-conformance.md are that report.
#include "inferq/routing/predicate.hpp"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using inferq::JsonSchemaDraft;
using inferq::JsonSchemaOptions;
using inferq::Predicate;

namespace {

#ifndef INFERQ_JSON_SCHEMA_TEST_SUITE_DIR
#error "INFERQ_JSON_SCHEMA_TEST_SUITE_DIR must name the JSON Schema Test Suite directory"
#endif
constexpr std::string_view kSuiteDir = INFERQ_JSON_SCHEMA_TEST_SUITE_DIR;

// One case: draft, file (relative to the draft's folder), group and case descriptions.
struct CaseId {
  std::string draft;
  std::string file;
  std::string group;
  std::string description;
  friend bool operator<(const CaseId& a, const CaseId& b) {
    return std::tie(a.draft, a.file, a.group, a.description) <
           std::tie(b.draft, b.file, b.group, b.description);
  }
};

std::string ToString(const CaseId& c) {
  return c.draft + "/" + c.file + " | " + c.group + " | " + c.description;
}

// Known failures: { draft, file, group description, case description }. Every one of
// them is a schema JsonSchema rejects with InvalidArgument; none is a wrong match.
const std::vector<CaseId> kKnownFailures = {
    // draft3/disallow.json: valijson 1.0 ignores the keyword; JsonSchema rejects it.
    {"draft3", "disallow.json", "disallow", "allowed"},
    {"draft3", "disallow.json", "disallow", "disallowed"},
    {"draft3", "disallow.json", "multiple disallow", "valid"},
    {"draft3", "disallow.json", "multiple disallow", "mismatch"},
    {"draft3", "disallow.json", "multiple disallow", "other mismatch"},
    {"draft3", "disallow.json", "multiple disallow subschema", "match"},
    {"draft3", "disallow.json", "multiple disallow subschema", "other match"},
    {"draft3", "disallow.json", "multiple disallow subschema", "mismatch"},
    {"draft3", "disallow.json", "multiple disallow subschema", "other mismatch"},
    // draft3/extends.json: valijson 1.0 ignores the keyword; JsonSchema rejects it.
    {"draft3", "extends.json", "extends", "extends"},
    {"draft3", "extends.json", "extends", "mismatch extends"},
    {"draft3", "extends.json", "extends", "mismatch extended"},
    {"draft3", "extends.json", "extends", "wrong type"},
    {"draft3", "extends.json", "multiple extends", "valid"},
    {"draft3", "extends.json", "multiple extends", "mismatch first extends"},
    {"draft3", "extends.json", "multiple extends", "mismatch second extends"},
    {"draft3", "extends.json", "multiple extends", "mismatch both"},
    {"draft3", "extends.json", "extends simple types", "valid"},
    {"draft3", "extends.json", "extends simple types", "mismatch extends"},
    // draft3/ref.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft3", "ref.json", "remote ref, containing refs itself", "remote ref valid"},
    {"draft3", "ref.json", "remote ref, containing refs itself", "remote ref invalid"},
    // draft4/definitions.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft4", "definitions.json", "valid definition", "valid definition schema"},
    {"draft4", "definitions.json", "invalid definition", "invalid definition schema"},
    // draft4/ref.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft4", "ref.json", "remote ref, containing refs itself", "remote ref valid"},
    {"draft4", "ref.json", "remote ref, containing refs itself", "remote ref invalid"},
    // draft4/ref.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft4", "ref.json", "Recursive references between schemas", "valid tree"},
    {"draft4", "ref.json", "Recursive references between schemas", "invalid tree"},
    // draft4/refRemote.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft4", "refRemote.json", "base URI change - change folder", "number is valid"},
    {"draft4", "refRemote.json", "base URI change - change folder", "string is invalid"},
    {"draft4", "refRemote.json", "base URI change - change folder in subschema", "number is valid"},
    {"draft4", "refRemote.json", "base URI change - change folder in subschema",
     "string is invalid"},
    {"draft4", "refRemote.json", "root ref in remote ref", "string is valid"},
    {"draft4", "refRemote.json", "root ref in remote ref", "null is valid"},
    {"draft4", "refRemote.json", "root ref in remote ref", "object is invalid"},
    // draft6/definitions.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft6", "definitions.json", "valid definition", "valid definition schema"},
    {"draft6", "definitions.json", "invalid definition", "invalid definition schema"},
    // draft6/ref.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft6", "ref.json", "remote ref, containing refs itself", "remote ref valid"},
    {"draft6", "ref.json", "remote ref, containing refs itself", "remote ref invalid"},
    // draft6/ref.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft6", "ref.json", "Recursive references between schemas", "valid tree"},
    {"draft6", "ref.json", "Recursive references between schemas", "invalid tree"},
    // draft6/refRemote.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft6", "refRemote.json", "base URI change", "base URI change ref valid"},
    {"draft6", "refRemote.json", "base URI change", "base URI change ref invalid"},
    {"draft6", "refRemote.json", "base URI change - change folder", "number is valid"},
    {"draft6", "refRemote.json", "base URI change - change folder", "string is invalid"},
    {"draft6", "refRemote.json", "base URI change - change folder in subschema", "number is valid"},
    {"draft6", "refRemote.json", "base URI change - change folder in subschema",
     "string is invalid"},
    {"draft6", "refRemote.json", "root ref in remote ref", "string is valid"},
    {"draft6", "refRemote.json", "root ref in remote ref", "null is valid"},
    {"draft6", "refRemote.json", "root ref in remote ref", "object is invalid"},
    // draft7/definitions.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft7", "definitions.json", "valid definition", "valid definition schema"},
    {"draft7", "definitions.json", "invalid definition", "invalid definition schema"},
    // draft7/ref.json: $ref to the metaschema on json-schema.org (not in the suite).
    {"draft7", "ref.json", "remote ref, containing refs itself", "remote ref valid"},
    {"draft7", "ref.json", "remote ref, containing refs itself", "remote ref invalid"},
    // draft7/ref.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft7", "ref.json", "Recursive references between schemas", "valid tree"},
    {"draft7", "ref.json", "Recursive references between schemas", "invalid tree"},
    // draft7/refRemote.json: valijson 1.0 appends relative ids/$refs to the base
    // URI (no RFC 3986 resolution) and ignores "$id": the URI fetched is not in the suite.
    {"draft7", "refRemote.json", "base URI change", "base URI change ref valid"},
    {"draft7", "refRemote.json", "base URI change", "base URI change ref invalid"},
    {"draft7", "refRemote.json", "base URI change - change folder", "number is valid"},
    {"draft7", "refRemote.json", "base URI change - change folder", "string is invalid"},
    {"draft7", "refRemote.json", "base URI change - change folder in subschema", "number is valid"},
    {"draft7", "refRemote.json", "base URI change - change folder in subschema",
     "string is invalid"},
    {"draft7", "refRemote.json", "root ref in remote ref", "string is valid"},
    {"draft7", "refRemote.json", "root ref in remote ref", "null is valid"},
    {"draft7", "refRemote.json", "root ref in remote ref", "object is invalid"},
};

// Files under optional/ that pass entirely, and are therefore asserted.
const std::set<std::string> kPassingOptional = {
    "draft3/optional/zeroTerminatedFloats.json",
    "draft4/optional/zeroTerminatedFloats.json",
    "draft7/optional/format/date-time.json",
    "draft7/optional/format/date.json",
    "draft7/optional/format/time.json",
};

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string ToJson(const rapidjson::Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

struct FileResult {
  int passed = 0;
  int failed = 0;
  std::vector<std::pair<CaseId, std::string>> failures;  // with why
};

JsonSchemaOptions OptionsFor(JsonSchemaDraft draft) {
  JsonSchemaOptions o;
  o.draft = draft;
  const fs::path remotes = fs::path(std::string(kSuiteDir)) / "remotes";
  o.fetch = [remotes](std::string_view uri) -> absl::StatusOr<std::string> {
    constexpr std::string_view kPrefix = "http://localhost:1234/";
    if (uri.substr(0, kPrefix.size()) != kPrefix) {
      return absl::NotFoundError("not served by the suite: " + std::string(uri));
    }
    const fs::path p = remotes / std::string(uri.substr(kPrefix.size()));
    if (!fs::is_regular_file(p)) return absl::NotFoundError("no file " + p.string());
    return ReadFile(p);
  };
  return o;
}

FileResult RunFile(const std::string& draft_name, JsonSchemaDraft draft, const fs::path& path,
                   const std::string& rel) {
  FileResult r;
  rapidjson::Document doc;
  const std::string text = ReadFile(path);
  doc.Parse<rapidjson::kParseFullPrecisionFlag>(text.c_str(), text.size());
  INFO("file " << path);
  REQUIRE_FALSE(doc.HasParseError());
  REQUIRE(doc.IsArray());
  const JsonSchemaOptions options = OptionsFor(draft);
  for (const rapidjson::Value& group : doc.GetArray()) {
    const std::string group_name = group["description"].GetString();
    const absl::StatusOr<Predicate> p = Predicate::JsonSchema(ToJson(group["schema"]), options);
    for (const rapidjson::Value& c : group["tests"].GetArray()) {
      CaseId id{draft_name, rel, group_name, c["description"].GetString()};
      const bool valid = c["valid"].GetBool();
      std::string why;
      if (!p.ok()) {
        why = "schema rejected: " + std::string(p.status().message());
      } else {
        inferq::Event e;
        e.payload = inferq::Buffer::FromString(ToJson(c["data"]));
        if (p->Matches(e) != valid) {
          why = valid ? "valid data did not match" : "invalid data matched";
        }
      }
      if (why.empty()) {
        ++r.passed;
      } else {
        ++r.failed;
        r.failures.emplace_back(std::move(id), std::move(why));
      }
    }
  }
  return r;
}

std::vector<fs::path> JsonFiles(const fs::path& dir, bool recursive) {
  std::vector<fs::path> out;
  if (recursive) {
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().extension() == ".json") out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct DraftReport {
  std::string name;
  int passed = 0;
  int failed = 0;
  std::vector<std::pair<CaseId, std::string>> failures;
  std::vector<std::string> optional_run;     // optional files run (all passed)
  std::vector<std::string> optional_skipped;  // "file: passed/total"
};

DraftReport RunDraft(const std::string& name, JsonSchemaDraft draft) {
  DraftReport report;
  report.name = name;
  const fs::path dir = fs::path(std::string(kSuiteDir)) / "tests" / name;
  INFO("the JSON Schema Test Suite directory " << dir
       << " is missing: install the Debian package json-schema-test-suite (a test dependency,"
          " in scripts/install-deps.sh) or point the CMake cache variable"
          " INFERQ_JSON_SCHEMA_TEST_SUITE_DIR at a checkout");
  REQUIRE(fs::is_directory(dir));
  const std::vector<fs::path> files = JsonFiles(dir, /*recursive=*/false);
  REQUIRE(files.size() >= 20);
  for (const fs::path& f : files) {
    FileResult r = RunFile(name, draft, f, f.filename().string());
    report.passed += r.passed;
    report.failed += r.failed;
    for (auto& x : r.failures) report.failures.push_back(std::move(x));
  }
  if (fs::is_directory(dir / "optional")) {
    for (const fs::path& f : JsonFiles(dir / "optional", /*recursive=*/true)) {
      const std::string rel = fs::relative(f, dir).generic_string();
      FileResult r = RunFile(name, draft, f, rel);
      if (kPassingOptional.count(name + "/" + rel) != 0) {
        // Listed as passing: counted and asserted like the required files.
        report.optional_run.push_back(rel);
        report.passed += r.passed;
        report.failed += r.failed;
        for (auto& x : r.failures) report.failures.push_back(std::move(x));
      } else {
        report.optional_skipped.push_back(rel + ": " + std::to_string(r.passed) + "/" +
                                          std::to_string(r.passed + r.failed) + " pass");
      }
    }
  }
  return report;
}

// "schema rejected: JSON Schema '<excerpt>'[... (N bytes)]<rest>" -> "schema rejected<rest>"
// (the excerpt quotes ' as \x27, so the next ' closes it).
std::string ShortReason(const std::string& why) {
  const std::string head = "schema rejected: JSON Schema '";
  if (why.rfind(head, 0) != 0) return why;
  std::size_t end = why.find('\'', head.size());
  if (end == std::string::npos) return why;
  ++end;
  if (why.compare(end, 5, "... (") == 0) end = why.find(')', end) + 1;
  std::string rest = why.substr(end);
  if (!rest.empty() && rest[0] == ':') rest.erase(0, 1);
  return "schema rejected:" + (rest.empty() || rest[0] == ' ' ? rest : " " + rest);
}

void WriteReportSection(std::ostream& out, const DraftReport& r) {
  out << "### " << r.name << ": " << r.passed << " passed, " << r.failed << " failed, "
      << (r.passed + r.failed) << " total\n\n";
  if (!r.optional_run.empty()) {
    out << "Optional files run (and passing): ";
    for (std::size_t i = 0; i < r.optional_run.size(); ++i) {
      out << (i ? ", " : "") << "`" << r.optional_run[i] << "`";
    }
    out << ".\n\n";
  }
  if (!r.optional_skipped.empty()) {
    out << "Optional files run but not asserted (cases passing / total): ";
    for (std::size_t i = 0; i < r.optional_skipped.size(); ++i) {
      out << (i ? ", " : "") << "`" << r.optional_skipped[i] << "`";
    }
    out << ".\n\n";
  }
  if (r.failures.empty()) {
    out << "No failing cases.\n\n";
    return;
  }
  out << "| file | group | case | result |\n|---|---|---|---|\n";
  for (const auto& [id, why] : r.failures) {
    std::string w = ShortReason(why);
    std::replace(w.begin(), w.end(), '|', '/');
    out << "| " << id.file << " | " << id.group << " | " << id.description << " | " << w
        << " |\n";
  }
  out << "\n";
}

// Runs one draft and checks that exactly its known cases fail.
void CheckDraft(const std::string& name, JsonSchemaDraft draft) {
  const DraftReport report = RunDraft(name, draft);

  std::set<CaseId> failing;
  for (const auto& [id, why] : report.failures) {
    INFO("case " << ToString(id) << ": " << why);
    CHECK(failing.insert(id).second);  // case names are unique
    // A case may fail only by JsonSchema refusing the schema, never by a wrong answer.
    CHECK(why.rfind("schema rejected: ", 0) == 0);
  }
  std::set<CaseId> known;
  for (const CaseId& id : kKnownFailures) {
    if (id.draft == name) known.insert(id);
  }
  std::vector<std::string> newly_failing;
  for (const auto& [id, why] : report.failures) {
    if (known.count(id) == 0) newly_failing.push_back(ToString(id) + " (" + why + ")");
  }
  std::vector<std::string> newly_passing;
  for (const CaseId& id : known) {
    if (failing.count(id) == 0) newly_passing.push_back(ToString(id));
  }
  std::ostringstream summary;
  summary << name << ": " << report.passed << " passed, " << report.failed << " failed, "
          << (report.passed + report.failed) << " total";
  WARN(summary.str());
  for (const std::string& s : newly_failing) UNSCOPED_INFO("newly failing: " << s);
  CHECK(newly_failing.empty());
  for (const std::string& s : newly_passing) UNSCOPED_INFO("newly passing (unlist it): " << s);
  CHECK(newly_passing.empty());

  if (const char* path = std::getenv("INFERQ_JSON_SCHEMA_SUITE_REPORT")) {
    std::ofstream out(path, std::ios::app);
    WriteReportSection(out, report);
  }
}

}  // namespace

TEST_CASE("JSON Schema Test Suite draft3: exactly the known cases fail") {
  CheckDraft("draft3", JsonSchemaDraft::kDraft3);
}

TEST_CASE("JSON Schema Test Suite draft4: exactly the known cases fail") {
  CheckDraft("draft4", JsonSchemaDraft::kDraft4);
}

TEST_CASE("JSON Schema Test Suite draft6: exactly the known cases fail") {
  CheckDraft("draft6", JsonSchemaDraft::kDraft6);
}

TEST_CASE("JSON Schema Test Suite draft7: exactly the known cases fail") {
  CheckDraft("draft7", JsonSchemaDraft::kDraft7);
}
