// The agent_router example's BFCL loaders and conversions (examples/agent_router/bfcl.hpp).
#include "bfcl.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

using namespace inferq::example;

namespace {

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A file in the test's own directory, removed with it.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    path = (std::filesystem::temp_directory_path() /
            ("bfcl_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
               .string();
    std::ofstream(path, std::ios::binary) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
  static inline int counter = 0;
};

}  // namespace

TEST_CASE("BFCL parameter types become JSON Schema types, recursively") {
  auto s = BfclToJsonSchema(R"({"type": "dict", "required": ["loc"], "properties": {
      "loc": {"type": "string", "description": "where"},
      "time": {"type": "float", "default": 10},
      "stops": {"type": "tuple", "items": {"type": "dict", "properties": {"at": {"type": "any"}}}},
      "prefs": {"type": "dict", "additionalProperties": {"type": "float"}},
      "kind": {"type": "string", "enum": ["plus", "comfort"]}}})");
  REQUIRE(s.ok());
  CHECK(*s ==
        R"({"type":"object","required":["loc"],"properties":{"loc":{"type":"string"},)"
        R"("time":{"type":"number"},"stops":{"type":"array","items":{"type":"object",)"
        R"("properties":{"at":{}}}},"prefs":{"type":"object","additionalProperties":)"
        R"({"type":"number"}},"kind":{"type":"string","enum":["plus","comfort"]}}})");
  auto unknown = BfclToJsonSchema(R"({"type": "dict", "properties": {"a": {"type": "complex"}}})");
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Msg(unknown.status()) == "unknown BFCL type 'complex' at '/properties/a'");
  CHECK(Msg(BfclToJsonSchema("[1]").status()) == "schema node at '' is not an object");
  CHECK(Msg(BfclToJsonSchema("{").status()).rfind("parameter definition is not JSON: ", 0) == 0);
}

TEST_CASE("a ground-truth call takes each argument's first value; '' and null mean left out") {
  auto a = FirstAcceptableArguments(R"({"loc": ["Berkeley", "Berkeley, CA"], "time": [10],
      "enabled": ["", true], "t0": [null, ""], "note": [""], "none": [],
      "prefs": [{"size": ["large"], "milk": ["", "soy"], "extra": [""]}],
      "items": [[{"item": ["burgers"], "qty": [5]}, "plain"]],
      "position": [{"lateral": 10.5, "longitudinal": [50]}]})");
  REQUIRE(a.ok());
  CHECK(*a == R"({"loc":"Berkeley","time":10,"enabled":true,"prefs":{"size":"large","milk":"soy"},)"
              R"("items":[{"item":"burgers","qty":5},"plain"],)"
              R"("position":{"lateral":10.5,"longitudinal":50}})");  // was: an error, sent as {}
  CHECK(Msg(FirstAcceptableArguments(R"({"a": 1})").status()) ==
        "acceptable values of '/a' are not a list");
  CHECK(Msg(FirstAcceptableArguments("[]").status()) == "arguments at '' are not an object");
}

TEST_CASE("tool names map to subjects and families") {
  CHECK(ToolSubject("uber.ride") == "agent.tool.uber.ride");
  CHECK(ToolSubject("Music_3_PlayMedia") == "agent.tool.Music_3_PlayMedia");
  CHECK(ToolSubject("a..b") == "agent.tool.a._.b");
  CHECK(ToolSubject(".x.") == "agent.tool._.x._");
  CHECK(ToolSubject("find flights.*.>") == "agent.tool.find_flights._star_._gt_");
  CHECK(ToolSubject("tab\there") == "agent.tool.tab_here");
  CHECK(PointerToken("a/b~c") == "a~1b~0c");
  CHECK(ToolFamily("uber.ride") == "uber");
  CHECK(ToolFamily("Music_3_PlayMedia") == "Music");
  CHECK(ToolFamily("ChaFod") == "ChaFod");
  CHECK(ToolFamily(".hidden") == "tool");
  CHECK(ToolFamily("a b+c.d") == "a-b-c");
  CHECK(ToolFamily(std::string(60, 'x')) == std::string(48, 'x'));
}

TEST_CASE("the loaders read JSON Lines and name the file, line and field of bad input") {
  TempFile good(
      "{\"id\": \"r1\", \"function\": [{\"name\": \"uber.ride\", \"parameters\": {\"type\": \"dict\"}}]}\n"
      "\n"
      "{\"id\": \"r2\", \"function\": []}");
  auto reqs = LoadBfclRequests(good.path);
  REQUIRE(reqs.ok());
  REQUIRE(reqs->size() == 2);
  CHECK((*reqs)[0].id == "r1");
  REQUIRE((*reqs)[0].functions.size() == 1);
  CHECK((*reqs)[0].functions[0].name == "uber.ride");
  CHECK((*reqs)[0].functions[0].parameters == R"({"type":"dict"})");
  CHECK((*reqs)[1].functions.empty());

  TempFile answers("{\"id\": \"r1\", \"ground_truth\": [{\"uber.ride\": {\"loc\": [\"x\"]}}]}\n");
  auto ans = LoadBfclAnswers(answers.path);
  REQUIRE(ans.ok());
  REQUIRE((*ans)[0].calls.size() == 1);
  CHECK((*ans)[0].calls[0].name == "uber.ride");
  CHECK((*ans)[0].calls[0].arguments == R"({"loc":["x"]})");

  TempFile bad_json("{\"id\": \"r1\", \"function\": []}\n{\"id\": ");
  CHECK(Msg(LoadBfclRequests(bad_json.path).status())
            .rfind("'" + bad_json.path + "' line 2 is not JSON: ", 0) == 0);
  TempFile no_function("{\"id\": \"r1\"}\n");
  CHECK(Msg(LoadBfclRequests(no_function.path).status()) ==
        "'" + no_function.path + "' line 1: field 'function' is missing or not a list");
  TempFile no_id("{\"function\": []}\n");
  CHECK(Msg(LoadBfclRequests(no_id.path).status()) ==
        "'" + no_id.path + "' line 1: field 'id' is missing or not a string");
  TempFile empty("");
  CHECK(Msg(LoadBfclAnswers(empty.path).status()) == "'" + empty.path + "' is empty (no JSON lines)");
  TempFile blank(" \n\t\n");  // was: 0 requests, exit 0
  CHECK(Msg(LoadBfclRequests(blank.path).status()) == "'" + blank.path + "' is empty (no JSON lines)");
  TempFile trailing("{\"id\": \"r1\", \"function\": []} garbage\n");  // was: accepted
  CHECK(Msg(LoadBfclRequests(trailing.path).status())
            .rfind("'" + trailing.path + "' line 1 is not JSON: ", 0) == 0);
  TempFile bad_gt("{\"id\": \"r1\", \"ground_truth\": [{\"f\": [1]}]}\n");
  CHECK(Msg(LoadBfclAnswers(bad_gt.path).status()) ==
        "'" + bad_gt.path + "' line 1: arguments of 'f' are not an object");
  CHECK(LoadBfclRequests("/nonexistent/x.jsonl").status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(LoadBfclRequests("/dev/zero").status()) ==
        "'/dev/zero' is a character device, not a regular file");
}
