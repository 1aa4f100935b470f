// File: examples/agent_router/bfcl.hpp
//
// The Berkeley Function Calling Leaderboard's files as the agent_router example reads
// them (examples/data/README.md has the format and the attribution): requests with
// their candidate functions, the ground-truth calls, and the conversions the example
// needs: BFCL's parameter definitions to JSON Schema, a ground-truth call's first
// acceptable arguments, a function name to a subject.
//
// Every loader names the file, the line and the field of bad input
// (InvalidArgument), and reads plain or zstd-compressed JSON Lines of at most 1 GiB
// from a regular file (ReadInputFile of examples/inference_server/trace.hpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace inferq::example {

struct BfclFunction {
  std::string name;        // e.g. "uber.ride", "Music_3_PlayMedia"
  std::string parameters;  // BFCL's parameter definition, as compact JSON text
};

struct BfclRequest {
  std::string id;  // e.g. "live_multiple_0-0-0"
  std::vector<BfclFunction> functions;
};

struct BfclCall {
  std::string name;       // the function called
  std::string arguments;  // JSON object: argument -> list of acceptable values
};

struct BfclAnswer {
  std::string id;
  std::vector<BfclCall> calls;  // ground truth; more than one are parallel calls
};

// One request per line: {"id", "question", "function": [{"name", "parameters"}]}.
absl::StatusOr<std::vector<BfclRequest>> LoadBfclRequests(const std::string& path);
// One answer per line: {"id", "ground_truth": [{name: {argument: [values...]}}]}.
absl::StatusOr<std::vector<BfclAnswer>> LoadBfclAnswers(const std::string& path);

// BFCL's JSON-Schema-like parameter definition as a JSON Schema (draft 7), the one
// conversion the example makes:
//  - "type": "dict" -> "object", "float" -> "number", "tuple" -> "array", "any" ->
//    no "type" (any value); "string", "integer", "boolean", "array", "object",
//    "number" and "null" stay; any other type is InvalidArgument naming it and the
//    place (a JSON Pointer into the definition);
//  - applied to the root and, recursively, to "properties", "items" and
//    "additionalProperties" (when an object);
//  - "default" and "description" are dropped (they describe, they do not
//    constrain); "required", "enum" and every other keyword stay as they are.
// Source of the BFCL types: the data's README (examples/data/README.md), which
// follows BFCL's own checker (bfcl_eval, type names "dict", "float", "tuple", "any").
absl::StatusOr<std::string> BfclToJsonSchema(std::string_view bfcl_parameters);

// A ground-truth call's arguments as a JSON object: each argument takes its first
// acceptable value that is a value: "" is BFCL's mark for "may be left out" (the
// data's README), and null appears where the default is None, so both are passed
// over (["", true] gives true); an argument whose acceptable values are only "" or
// null, or none at all, is left out. A chosen value that is an object is itself a
// map of lists of acceptable values (BFCL's nested dict arguments) and is resolved
// the same way, as is each object in a chosen array (a list of dicts); inside such a
// value, a plain value where a list is expected is taken as it is (BFCL writes
// {"lateral": 10.5} there too). At the top level every value must be a list
// (InvalidArgument naming the argument).
absl::StatusOr<std::string> FirstAcceptableArguments(std::string_view acceptable);

// The subject a tool is called on: "agent.tool." + the name, each '.' of the name a
// token separator. A subject cannot hold white space, an empty token or a token that
// is exactly "*" or ">": each white-space or control byte becomes '_', an empty
// token (leading, trailing or doubled '.') becomes "_", and a token "*" or ">"
// becomes "_star_" or "_gt_". (No name in the bundled file needs any of these.) The
// map is not one to one ("a b" and "a_b" share a subject): agent_router keys tools by
// subject and definition, and puts a subject's tools in one family.
std::string ToolSubject(std::string_view name);

// `name` as one token of a JSON Pointer (RFC 6901: '~' -> "~0", '/' -> "~1"), as
// valijson writes an argument's place.
std::string PointerToken(std::string_view name);

// The family a tool belongs to, for its group of runners: the name up to its first
// '.' or '_' ("uber.ride" -> "uber", "Music_3_PlayMedia" -> "Music"), made a valid
// function id (1..48 of [A-Za-z0-9_-]; other bytes become '-').
std::string ToolFamily(std::string_view name);

}  // namespace inferq::example
