/// @file inferq/routing/predicate.hpp
///
/// Predicate: a consumer's match rule on an Event — attribute and header match
/// (all/any, exact names, presence), semantic tag set, JSON content rules (RFC 6901 JSON
/// Pointer + comparison) and JSON Schema match (valijson), composed with all/any/not.
/// A consumer receives an event only when its predicate matches.
///
/// Usage:
/// @code
///   using inferq::Predicate;
///   absl::StatusOr<Predicate> model = Predicate::HeadersAll({{"model", "llama"}});
///   absl::StatusOr<Predicate> cold = Predicate::Json("/temperature", inferq::JsonOp::kLt, "1");
///   if (!model.ok()) return model.status();   // InvalidArgument naming the bad value
///   if (!cold.ok()) return cold.status();
///   Predicate p = Predicate::All({*model, *cold});
///   p.DebugString();   // "all(headers_all{model=llama}, json(/temperature < 1))"
///   bool m = p.Matches(event);
/// @endcode
///
/// Semantics in brief:
///  - Header names and semantic tags are compared as exact byte strings (case-sensitive,
///    never a prefix or a suffix).
///  - The payload is parsed as JSON (RFC 8259, UTF-8) at most once per Matches call, and
///    only when a JSON rule or schema is evaluated. A payload that is not valid JSON makes
///    every JSON rule and schema false (Not over one is then true) and is counted in
///    PredicateStats::invalid_json; it never throws or crashes. Bytes that are not valid
///    UTF-8, a NUL byte, an empty payload and a payload nested deeper than kMaxJsonDepth
///    (RFC 8259 §9 lets a parser limit nesting) all count as not valid JSON.
///  - Regular expressions (JsonOp::kMatches and the JSON Schema keywords "pattern",
///    "patternProperties" and "format") run on RE2, not std::regex. Payload strings are
///    untrusted, and libstdc++'s std::regex executor recurses once per input character:
///    a 50 KB string of 'a' against "^a*$" overflows an 8 MiB stack (measured, GCC 12),
///    and it backtracks exponentially on patterns like "(a|a)*b". RE2 runs in time linear
///    in the input with bounded stack. RE2 accepts the ECMAScript syntax used in practice
///    (classes, quantifiers incl. lazy ones, alternation, groups, anchors, `\d \w \s \b`);
///    what needs backtracking — backreferences (`\1`) and lookaround (`(?=`, `(?!`, `(?<=`, `(?<!`)
///    — is rejected with InvalidArgument instead of silently meaning something else.
///    Differences that remain: RE2's '.' excludes only `\n` (ECMAScript also excludes
///    `\r`, U+2028, U+2029); ECMAScript's `\uXXXX` escape is not RE2 syntax (write the
///    character itself or `\x{XXXX}`); RE2-only syntax such as `(?P<name>...)` or `\pL` is
///    accepted.
///
/// Thread safety: a Predicate is immutable after construction; copies share one tree.
/// Matches, Stats and DebugString are const and may run on any number of threads at once
/// on the same or on copied predicates (the statistics are atomics; a Stats snapshot
/// never shows more matches or invalid payloads than evaluations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"

namespace inferq {

/// Comparison of a JSON content rule (Predicate::Json).
enum class JsonOp : std::uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kExists, kMatches };

/// "==", "!=", "<", "<=", ">", ">=", "in", "exists", "matches".
std::string_view JsonOpName(JsonOp op);

/// The JSON Schema draft a schema is read with. valijson (1.0) implements drafts 3, 4
/// and 7; draft 6 is read with valijson's draft 7 rules (draft 7 only adds if/then/else
/// and the keywords "$comment", "contentMediaType", "contentEncoding", "readOnly").
enum class JsonSchemaDraft : std::uint8_t { kAuto, kDraft3, kDraft4, kDraft6, kDraft7 };

/// How Predicate::JsonSchema reads a schema.
struct JsonSchemaOptions {
  /// kAuto: the draft named by the root's "$schema"
  /// ("http://json-schema.org/draft-0N/schema#", http or https, '#' optional) or
  /// draft 7 when there is none. An explicit draft must agree with "$schema" when
  /// both are given.
  JsonSchemaDraft draft = JsonSchemaDraft::kAuto;
  /// Resolves a remote "$ref" document (its URI without the fragment, e.g.
  /// "http://localhost:1234/folder/folderInteger.json") to JSON text, once per
  /// document, while JsonSchema runs; never during Matches. Empty (the default): a
  /// remote "$ref" is InvalidArgument — nothing is fetched behind the caller's back.
  std::function<absl::StatusOr<std::string>(std::string_view uri)> fetch;
};

/// Counters of one predicate node. A node counts every evaluation of itself, whether
/// through Matches on it directly or as a part of an All/Any/Not that reached it
/// (All and Any stop at the first child that decides, so later children are not
/// evaluated and do not count). Copies of a Predicate share their counters.
struct PredicateStats {
  std::uint64_t evaluated = 0;     ///< evaluations of this node
  std::uint64_t matched = 0;       ///< ... that were true
  /// ... in which a JSON rule or schema under this node (itself included) was evaluated
  /// on a payload that is not valid JSON (at most 1 per evaluation, however many rules).
  std::uint64_t invalid_json = 0;
  /// ... in which a JSON Schema under this node hit Predicate::kMaxSchemaDepth and was
  /// taken as "no match".
  std::uint64_t limit_exceeded = 0;
};

namespace predicate_internal {
class Node;
}  // namespace predicate_internal

/// An immutable, cheaply copyable (shared) predicate on an Event.
class Predicate {
 public:
  /// Payloads nested deeper than this (arrays and objects; the root value is depth 1)
  /// are taken as not valid JSON; operands and schemas nested deeper are InvalidArgument.
  static constexpr std::size_t kMaxJsonDepth = 128;
  /// Nesting bound of JSON Schema validation (subschema within subschema, e.g. through a
  /// recursive "$ref"); past it the schema is "no match" and limit_exceeded counts. It
  /// leaves room for a recursive schema over a payload kMaxJsonDepth deep, and bounds the
  /// stack Matches needs: under 1 KiB a level with -O2, about 2 KiB at -O0 (GCC 12), so a
  /// thread with 512 KiB of stack is enough.
  static constexpr std::size_t kMaxSchemaDepth = 256;

  /// Matches everything. Trivial: Matches is a constant true and Stats stays zero
  /// (there is no shared state to count in).
  Predicate();

  /// A rule of HeadersAll and HeadersAny: a name, and the value it must have
  /// (nullopt: present with any value).
  using HeaderRule = std::pair<std::string, std::optional<std::string>>;
  /// Attribute and header match on exact names (case-sensitive; never a prefix or
  /// suffix of a key). A nullopt value means "present with any value"; otherwise the
  /// value must be equal. HeadersAll: every entry holds; HeadersAny: at least one does.
  /// A name of a first-class attribute of Event reads that attribute, so a rule does
  /// not depend on whether a producer set `e.model` or a header "model":
  ///  - model, model_version, tenant, semantic_tag: the attribute when it is not empty
  ///    (byte-equal), else the header of that name;
  ///  - schema_id, schema_version: the attribute when it is not 0 (value in decimal),
  ///    else the header;
  ///  - qos ("gold", "silver", "bronze"), priority (decimal int32), codec ("none",
  ///    "zstd"): always the attribute, which is always present.
  ///
  /// Any other name is a header. InvalidArgument for an empty list, an empty name
  /// (naming its index), or a value that a typed attribute cannot have (naming the
  /// attribute, the value and the accepted form: "qos" = "platinum").
  ///@{
  static absl::StatusOr<Predicate> HeadersAll(std::vector<HeaderRule> h);
  static absl::StatusOr<Predicate> HeadersAny(std::vector<HeaderRule> h);
  ///@}

  /// Event::semantic_tag is one of `tags` (exact bytes; "" matches an event without a
  /// tag). Duplicates are ignored. InvalidArgument for an empty set.
  static absl::StatusOr<Predicate> TagIn(std::vector<std::string> tags);

  /// JSON content rule on the payload: the value at `pointer` (RFC 6901; "" is the
  /// whole document, "~0" is '~' and "~1" is '/', an array index is "0" or a decimal
  /// without leading zeros, "-" and other tokens on an array select nothing; on an
  /// object with duplicate names the first member counts) compared with `operand`,
  /// which is JSON text:
  ///  - kEq, kNe: any JSON value, compared by value: numbers numerically and exactly
  ///    (1 == 1.0; 9007199254740993 != 9007199254740992.0), strings by bytes, arrays
  ///    element-wise, objects as name -> value maps (member order ignored);
  ///  - kLt, kLe, kGt, kGe: a number or a string; numbers order numerically, strings
  ///    lexicographically by bytes (unsigned); a value of the other kind is false;
  ///  - kIn: an array; true when the value is == to one of its elements;
  ///  - kExists: ignored (may be empty); true when the pointer selects a value (even
  ///    null);
  ///  - kMatches: a JSON string holding a regular expression (RE2 syntax, see the top
  ///    of this file), searched (not anchored) in a string value; a non-string is false.
  ///
  /// A pointer that selects nothing makes every op false except that kExists is then
  /// false too: in particular kNe is false for a missing value (as SQL's NULL <> 1 is
  /// not true), so Not(Json(p, kEq, x)) and Json(p, kNe, x) differ exactly there.
  /// InvalidArgument naming the value for an invalid pointer ("a/b" without the leading
  /// '/', an escape other than ~0 ~1), operand text that is not JSON (or nested deeper
  /// than kMaxJsonDepth), an operand of the wrong kind for the op, or a regex RE2
  /// rejects (its message included).
  static absl::StatusOr<Predicate> Json(std::string_view pointer, JsonOp op,
                                        std::string_view operand);

  /// JSON Schema match with valijson, read with the draft of `options` (see
  /// JsonSchemaOptions): true when the payload is valid JSON that validates. Regex
  /// keywords run on RE2 (see the top of this file); "format" checks "date", "time" and
  /// "date-time" (as valijson does) and accepts every other format.
  /// InvalidArgument for schema text that is not JSON (or nested deeper than
  /// kMaxJsonDepth), a "$schema" naming a draft other than 3, 4, 6 or 7 (or disagreeing
  /// with options.draft), a schema valijson rejects (its message included), a pattern
  /// RE2 rejects, a remote "$ref" that cannot be fetched (options.fetch empty or
  /// failing: its status message included), a draft 3 schema with a member named
  /// "disallow" or "extends" anywhere (valijson 1.0 ignores those keywords, which would
  /// silently match too much), a "$ref", "id" or "$id" string longer than 512 bytes
  /// (valijson tests URIs with std::regex, whose stack use grows with the length), and
  /// subschemas and "$ref" hops nested deeper than 256 levels — which is what a "$ref"
  /// cycle such as {"$ref": "#"} does (valijson 1.0 alone recurses until the stack ends).
  /// valijson 1.0 limits, all of which end in InvalidArgument rather than in a different
  /// schema: "$id" does not change the base URI (only draft 4's "id" does), and a
  /// relative "id" or "$ref" is resolved by appending it to the base URI rather than by
  /// RFC 3986 §5.2, so relative remote references under a changed base fail to fetch.
  /// The JSON Schema Test Suite results are in docs/guide/json-schema-conformance.md.
  /// Unimplemented, naming the option, when inferq was built with
  /// INFERQ_WITH_JSON_SCHEMA=OFF (without valijson).
  ///@{
  static absl::StatusOr<Predicate> JsonSchema(std::string_view schema_json);
  static absl::StatusOr<Predicate> JsonSchema(std::string_view schema_json,
                                              JsonSchemaOptions options);
  ///@}

  /// True when every predicate matches (empty: true); evaluation stops at the first
  /// false one, in order.
  static Predicate All(std::vector<Predicate> ps);
  /// True when at least one predicate matches (empty: false); stops at the first true.
  static Predicate Any(std::vector<Predicate> ps);
  /// True when `p` does not match.
  static Predicate Not(Predicate p);

  /// True when the event matches. Never throws for any event content.
  bool Matches(const Event& e) const;
  /// Matches, saying why not: OK when the event matches, else FailedPrecondition
  /// naming the reason, e.g. "JSON Schema: /new_preferences/size: Failed to match
  /// against any enum values." or "JSON Schema: (root): Missing required property
  /// 'id'." (valijson's words; each failing place as a JSON Pointer into the payload,
  /// at most 4, without the enclosing levels that failed because of it), "none of 2
  /// matched: ...; ..."
  /// for Any, or "the event does not match headers_all{model=llama}" (the node's
  /// DebugString) where a node has no finer reason. Counts in Stats like Matches. A
  /// JSON Schema is validated in full to collect its errors, so Check costs more
  /// than Matches on an event that fails; use it where the reason is reported.
  absl::Status Check(const Event& e) const;

  /// This node's counters (see PredicateStats). Zero for a trivial predicate.
  PredicateStats Stats() const;

  /// The tree in one line, e.g. all(headers_all{model=llama}, json(/temperature < 1)).
  /// Forms: true, headers_all{k=v, k2}, headers_any{...} (a name alone: present with any
  /// value), tag_in{a, b}, json(<pointer> <op> <operand as compact JSON>),
  /// json(<pointer> exists), json_schema(draft7, <n> bytes), all(...), any(...), not(...).
  /// The empty pointer prints as "".
  std::string DebugString() const;

  /// True for a default-constructed Predicate (Matches is a constant true). All({}) is
  /// also always true but is not trivial: it counts its evaluations.
  bool is_trivial() const { return node_ == nullptr; }

 private:
  explicit Predicate(std::shared_ptr<const predicate_internal::Node> node);
  std::shared_ptr<const predicate_internal::Node> node_;
};

}  // namespace inferq
