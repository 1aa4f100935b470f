#include "inferq/routing/predicate.hpp"

// INFERQ_HAVE_JSON_SCHEMA (1 or 0) is set by CMakeLists.txt from INFERQ_WITH_JSON_SCHEMA:
// with 0, nothing of valijson is compiled and Predicate::JsonSchema is Unimplemented.
#ifndef INFERQ_HAVE_JSON_SCHEMA
#error "INFERQ_HAVE_JSON_SCHEMA is set by CMakeLists.txt (INFERQ_WITH_JSON_SCHEMA)"
#endif

#include <algorithm>
#include <charconv>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "inferq/base/error.hpp"
#include "predicate_internal.hpp"

// RapidJSON and valijson are private to this file: no type of theirs reaches the
// public header. valijson reports schema errors by exception only when
// VALIJSON_USE_EXCEPTIONS is 1 (otherwise it prints and calls abort()); JsonSchema
// catches them.
//
// A failed RapidJSON assertion throws too (so that a schema that trips one is an error
// of JsonSchema), but without the std::string that valijson's rapidjson_adapter.hpp
// would build from __FILE__ on every check, taken or not, when it defines the macro
// itself: RapidJSON checks in every accessor, and Matches runs them per event. That
// header defines its own version whenever VALIJSON_USE_EXCEPTIONS is defined (and
// #warns when RAPIDJSON_ASSERT already is), and of its dependencies only
// exceptions.hpp reads VALIJSON_USE_EXCEPTIONS; hence the order below.
namespace inferq::predicate_internal {
[[noreturn]] void RapidJsonAssertFailed(const char* expr, const char* file, int line);
}  // namespace inferq::predicate_internal
#define RAPIDJSON_ASSERT(x)                    \
  ((x) ? static_cast<void>(0)                  \
       : ::inferq::predicate_internal::RapidJsonAssertFailed(#x, __FILE__, __LINE__))
#if INFERQ_HAVE_JSON_SCHEMA  // valijson, read after RAPIDJSON_ASSERT
#define VALIJSON_USE_EXCEPTIONS 1
#include <valijson/exceptions.hpp>
#undef VALIJSON_USE_EXCEPTIONS
#include <valijson/adapters/rapidjson_adapter.hpp>
#define VALIJSON_USE_EXCEPTIONS 1
#endif  // INFERQ_HAVE_JSON_SCHEMA
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <re2/re2.h>
#if INFERQ_HAVE_JSON_SCHEMA  // valijson
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_visitor.hpp>
#endif  // INFERQ_HAVE_JSON_SCHEMA

namespace inferq::predicate_internal {
namespace {

// A RapidJSON value type of this file's own (through the allocator type), so that the
// valijson templates instantiated on it below — and the member specializations that
// replace valijson's std::regex code with RE2 — belong to this file alone and cannot
// collide with another user of valijson in the same program.
class JsonAllocator : public rapidjson::MemoryPoolAllocator<rapidjson::CrtAllocator> {
  using Base = rapidjson::MemoryPoolAllocator<rapidjson::CrtAllocator>;

 public:
  JsonAllocator() = default;
  JsonAllocator(void* buffer, std::size_t size, std::size_t chunk_size)
      : Base(buffer, size, chunk_size) {}
};
using JsonValue = rapidjson::GenericValue<rapidjson::UTF8<>, JsonAllocator>;
using JsonDocument =
    rapidjson::GenericDocument<rapidjson::UTF8<>, JsonAllocator, rapidjson::CrtAllocator>;
#if INFERQ_HAVE_JSON_SCHEMA  // the valijson adapter
using SchemaAdapter = valijson::adapters::GenericRapidJsonAdapter<JsonValue>;
#endif  // INFERQ_HAVE_JSON_SCHEMA

}  // namespace
}  // namespace inferq::predicate_internal

#if INFERQ_HAVE_JSON_SCHEMA  // valijson adapter traits and specializations
namespace valijson::adapters {
template <>
struct AdapterTraits<inferq::predicate_internal::SchemaAdapter> {
  using DocumentType = inferq::predicate_internal::JsonDocument;
  static std::string adapterName() { return "inferq RapidJSON adapter"; }
};
}  // namespace valijson::adapters

// valijson 1.0 runs "pattern", "patternProperties" and "format" on std::regex over the
// validated (untrusted) strings; libstdc++'s executor recurses once per input character
// (see predicate.hpp). These explicit specializations replace exactly those visits, for
// this file's adapter type only, with RE2; validateSchema gains a nesting bound. They
// are declared before anything instantiates ValidationVisitor<SchemaAdapter>.
namespace valijson {
using inferq::predicate_internal::SchemaAdapter;
template <>
bool ValidationVisitor<SchemaAdapter>::validateSchema(const Subschema& subschema);
template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::FormatConstraint& constraint);
template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::PatternConstraint& constraint);
template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::PropertiesConstraint& constraint);
template <>
bool ValidationVisitor<SchemaAdapter>::visit(
    const constraints::PropertyNamesConstraint& constraint);
// The parser's recursion (one call per subschema and per "$ref" hop), with a bound:
// valijson 1.0 recurses forever on a "$ref" cycle such as {"$ref": "#"}.
template <>
const Subschema* SchemaParser::makeOrReuseSchema<SchemaAdapter>(
    Schema& rootSchema, const SchemaAdapter& rootNode, const SchemaAdapter& node,
    const opt::optional<std::string> currentScope, const std::string& nodePath,
    const FunctionPtrs<SchemaAdapter>::FetchDoc fetchDoc, const Subschema* parentSubschema,
    const std::string* ownName, DocumentCache<SchemaAdapter>::Type& docCache,
    SchemaCache& schemaCache, std::vector<std::string>& newCacheKeys);
// The same for a "$ref" at the root of a document; this one also stops valijson 1.0
// from fetching a document again (and leaking it) when a root "$ref" chain returns to it.
template <>
void SchemaParser::resolveThenPopulateSchema<SchemaAdapter>(
    Schema& rootSchema, const SchemaAdapter& rootNode, const SchemaAdapter& node,
    const Subschema& subschema, const opt::optional<std::string> currentScope,
    const std::string& nodePath, const FunctionPtrs<SchemaAdapter>::FetchDoc fetchDoc,
    const Subschema* parentSchema, const std::string* ownName,
    DocumentCache<SchemaAdapter>::Type& docCache, SchemaCache& schemaCache);
}  // namespace valijson

#endif  // INFERQ_HAVE_JSON_SCHEMA
namespace inferq::predicate_internal {
namespace {

thread_local std::uint64_t t_payload_parses = 0;

}  // namespace

void RapidJsonAssertFailed(const char* expr, const char* file, int line) {
  throw std::logic_error(std::string("RapidJSON assertion failed: ") + expr + " (" + file +
                         ":" + std::to_string(line) + ")");
}

namespace {

// ---------------------------------------------------------------------------------------
// Parsing JSON with a nesting bound.

// RFC 8259 text in UTF-8: invalid UTF-8 is an error; numbers are parsed to the nearest
// double unless they are integers that fit 64 bits. RapidJSON hands numbers over as
// text and std::from_chars converts them: Debian's RapidJSON 1.1.0 misreads some
// (0.000...0 with many zeros reads as a positive number, through clz(0) in
// internal/diyfp.h; found by predicate_fuzz).
constexpr unsigned kParseFlags =
    rapidjson::kParseValidateEncodingFlag | rapidjson::kParseNumbersAsStringsFlag;

enum class ParseStatus : std::uint8_t { kOk, kNulByte, kTooDeep, kSyntax };
struct ParseResult {
  ParseStatus status = ParseStatus::kOk;
  rapidjson::ParseErrorCode code = rapidjson::kParseErrorNone;
  std::size_t offset = 0;
};

// Forwards SAX events to a document and fails at nesting depth kMaxJsonDepth + 1.
// RapidJSON's recursive parser then recurses at most kMaxJsonDepth + 1 levels, so
// the stack it needs is bounded whatever the input.
class DepthLimitedHandler {
 public:
  explicit DepthLimitedHandler(JsonDocument& d) : d_(d) {}
  bool Null() { return d_.Null(); }
  bool Bool(bool b) { return d_.Bool(b); }
  bool Int(int i) { return d_.Int(i); }
  bool Uint(unsigned u) { return d_.Uint(u); }
  bool Int64(std::int64_t i) { return d_.Int64(i); }
  bool Uint64(std::uint64_t u) { return d_.Uint64(u); }
  bool Double(double d) { return d_.Double(d); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool /*copy*/) {
    const char* end = s + n;
    if (std::string_view(s, n).find_first_of(".eE") == std::string_view::npos) {
      if (s != end && *s == '-') {
        std::int64_t i = 0;
        if (auto r = std::from_chars(s, end, i); r.ec == std::errc() && r.ptr == end) return d_.Int64(i);
      } else {
        std::uint64_t u = 0;
        if (auto r = std::from_chars(s, end, u); r.ec == std::errc() && r.ptr == end) return d_.Uint64(u);
      }
    }
    double d = 0;
    const auto r = std::from_chars(s, end, d);
    if (r.ptr != end) return false;
    if (r.ec == std::errc::result_out_of_range) {
      // Overflow is an error (as RapidJSON's "number too big"); underflow reads as
      // the nearest double, 0 or a subnormal (strtod gives it; the text is JSON, so
      // no locale-specific characters).
      const std::string text(s, n);
      d = std::strtod(text.c_str(), nullptr);
      if (std::isinf(d)) return false;
    } else if (r.ec != std::errc()) {
      return false;
    }
    return d_.Double(d);
  }
  bool String(const char* s, rapidjson::SizeType n, bool copy) { return d_.String(s, n, copy); }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) { return d_.Key(s, n, copy); }
  bool StartObject() { return Enter() && d_.StartObject(); }
  bool EndObject(rapidjson::SizeType n) {
    --depth_;
    return d_.EndObject(n);
  }
  bool StartArray() { return Enter() && d_.StartArray(); }
  bool EndArray(rapidjson::SizeType n) {
    --depth_;
    return d_.EndArray(n);
  }
  bool too_deep() const { return too_deep_; }

 private:
  bool Enter() {
    if (++depth_ > Predicate::kMaxJsonDepth) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  JsonDocument& d_;
  std::size_t depth_ = 0;
  bool too_deep_ = false;
};

// Parses `text` (not NUL-terminated) into `doc`.
ParseResult ParseJson(std::string_view text, JsonDocument& doc) {
  ParseResult r;
  // A NUL byte cannot occur in JSON text (not even in a string, where control
  // characters must be escaped), and RapidJSON's MemoryStream reads it as the end.
  if (!text.empty()) {
    if (const void* nul = std::memchr(text.data(), '\0', text.size())) {
      r.status = ParseStatus::kNulByte;
      r.offset = static_cast<std::size_t>(static_cast<const char*>(nul) - text.data());
      return r;
    }
  }
  rapidjson::MemoryStream stream(text.data(), text.size());
  auto generate = [&](JsonDocument& d) {
    DepthLimitedHandler handler(d);
    rapidjson::GenericReader<rapidjson::UTF8<>, rapidjson::UTF8<>, rapidjson::CrtAllocator> reader;
    const rapidjson::ParseResult pr = reader.Parse<kParseFlags>(stream, handler);
    if (!pr.IsError()) return true;
    r.status = handler.too_deep() ? ParseStatus::kTooDeep : ParseStatus::kSyntax;
    r.code = pr.Code();
    r.offset = pr.Offset();
    return false;
  };
  doc.Populate(generate);
  return r;
}

// "at offset N: what", for a message.
std::string DescribeParseError(const ParseResult& r) {
  std::string out = "at offset " + std::to_string(r.offset) + ": ";
  switch (r.status) {
    case ParseStatus::kOk:
      return out + "no error";
    case ParseStatus::kNulByte:
      return out + "a NUL byte";
    case ParseStatus::kTooDeep:
      return out + "nesting deeper than " + std::to_string(Predicate::kMaxJsonDepth) + " levels";
    case ParseStatus::kSyntax:
      break;
  }
  return out + rapidjson::GetParseError_En(r.code);
}

// `text` quoted for a message, cut after 80 bytes (at a UTF-8 character boundary).
std::string QuoteExcerpt(std::string_view text) {
  constexpr std::size_t kMax = 80;
  if (text.size() <= kMax) return QuoteValue(text);
  std::size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return QuoteValue(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::string CompactJson(const JsonValue& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> writer(sb);
  v.Accept(writer);
  return std::string(sb.GetString(), sb.GetSize());
}

std::string_view StringOf(const JsonValue& v) {
  return std::string_view(v.GetString(), v.GetStringLength());
}

// ---------------------------------------------------------------------------------------
// JSON values: exact numeric order and equality by value.

__extension__ typedef __int128 Int128;  // holds every int64 and uint64

// An integer value (RapidJSON keeps integers that fit 64 bits as integers).
Int128 IntegerOf(const JsonValue& v) {
  if (v.IsInt64()) return v.GetInt64();
  return v.GetUint64();
}

// The sign of i - d, exactly (d finite: RapidJSON rejects NaN and infinities).
int CompareIntegerDouble(Int128 i, double d) {
  if (d >= 18446744073709551616.0) return -1;  // 2^64: above every uint64
  if (d < -9223372036854775808.0) return 1;    // -2^63: below every int64
  const double t = std::trunc(d);               // |t| < 2^64: exact as Int128
  const auto ti = static_cast<Int128>(t);
  if (i != ti) return i < ti ? -1 : 1;
  const double frac = d - t;  // exact
  if (frac > 0) return -1;
  if (frac < 0) return 1;
  return 0;
}

// The sign of a - b for two numbers.
int CompareNumbers(const JsonValue& a, const JsonValue& b) {
  const bool ad = a.IsDouble();
  const bool bd = b.IsDouble();
  if (!ad && !bd) {
    const Int128 x = IntegerOf(a);
    const Int128 y = IntegerOf(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (ad && bd) {
    const double x = a.GetDouble();
    const double y = b.GetDouble();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (ad) return -CompareIntegerDouble(IntegerOf(b), a.GetDouble());
  return CompareIntegerDouble(IntegerOf(a), b.GetDouble());
}

const JsonValue* FindFirstMember(const JsonValue& object, std::string_view name) {
  for (auto it = object.MemberBegin(); it != object.MemberEnd(); ++it) {
    if (StringOf(it->name) == name) return &it->value;
  }
  return nullptr;
}

bool JsonEquals(const JsonValue& a, const JsonValue& b);

// Every member of `a` has an equal value under the same name in `b` (first member).
bool MembersIn(const JsonValue& a, const JsonValue& b) {
  for (auto it = a.MemberBegin(); it != a.MemberEnd(); ++it) {
    const JsonValue* other = FindFirstMember(b, StringOf(it->name));
    if (other == nullptr || !JsonEquals(it->value, *other)) return false;
  }
  return true;
}

// Equality by value. Recursion depth is at most the smaller nesting depth of the two,
// and both are parsed under kMaxJsonDepth.
bool JsonEquals(const JsonValue& a, const JsonValue& b) {
  if (a.IsNumber() && b.IsNumber()) return CompareNumbers(a, b) == 0;
  if (a.GetType() != b.GetType()) return false;
  switch (a.GetType()) {
    case rapidjson::kNullType:
    case rapidjson::kFalseType:
    case rapidjson::kTrueType:
      return true;
    case rapidjson::kStringType:
      return StringOf(a) == StringOf(b);
    case rapidjson::kArrayType:
      if (a.Size() != b.Size()) return false;
      for (rapidjson::SizeType i = 0; i < a.Size(); ++i) {
        if (!JsonEquals(a[i], b[i])) return false;
      }
      return true;
    case rapidjson::kObjectType:
      // Both ways, so that duplicate names cannot make unequal objects equal.
      return a.MemberCount() == b.MemberCount() && MembersIn(a, b) && MembersIn(b, a);
    case rapidjson::kNumberType:
      break;
  }
  return false;
}

// ---------------------------------------------------------------------------------------
// RFC 6901 JSON Pointer.

struct PointerToken {
  std::string name;                   // unescaped
  std::optional<std::size_t> index;   // set when `name` is an array index
};

absl::StatusOr<std::vector<PointerToken>> ParsePointer(std::string_view p) {
  std::vector<PointerToken> tokens;
  if (p.empty()) return tokens;
  if (p[0] != '/') {
    return absl::InvalidArgumentError("JSON pointer " + QuoteValue(p) +
                                      " must be empty or start with '/' (RFC 6901)");
  }
  std::size_t i = 1;
  while (true) {
    PointerToken t;
    for (; i < p.size() && p[i] != '/'; ++i) {
      if (p[i] != '~') {
        t.name += p[i];
        continue;
      }
      if (i + 1 == p.size()) {
        return absl::InvalidArgumentError("JSON pointer " + QuoteValue(p) +
                                          " ends in an incomplete escape '~' at offset " +
                                          std::to_string(i) + " (only ~0 and ~1 are valid)");
      }
      if (p[i + 1] != '0' && p[i + 1] != '1') {
        return absl::InvalidArgumentError(
            "JSON pointer " + QuoteValue(p) + " has an invalid escape " +
            QuoteValue(p.substr(i, 2)) + " at offset " + std::to_string(i) +
            " (only ~0 and ~1 are valid)");
      }
      t.name += p[i + 1] == '0' ? '~' : '/';
      ++i;
    }
    // An array index: "0" or digits without a leading zero (RFC 6901 §4). One too
    // large for size_t selects nothing, like any index past the end.
    const std::string& n = t.name;
    if (!n.empty() && (n == "0" || n[0] != '0') &&
        std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        n.size() <= 18) {
      t.index = std::stoull(n);
    }
    tokens.push_back(std::move(t));
    if (i == p.size()) break;
    ++i;  // past '/'
  }
  return tokens;
}

const JsonValue* Resolve(const JsonValue& root, const std::vector<PointerToken>& tokens) {
  const JsonValue* v = &root;
  for (const PointerToken& t : tokens) {
    if (v->IsObject()) {
      v = FindFirstMember(*v, t.name);
    } else if (v->IsArray()) {
      v = (t.index && *t.index < v->Size()) ? &(*v)[static_cast<rapidjson::SizeType>(*t.index)]
                                            : nullptr;
    } else {
      v = nullptr;
    }
    if (v == nullptr) return nullptr;
  }
  return v;
}

// ---------------------------------------------------------------------------------------
// Regular expressions (RE2; see predicate.hpp for why not std::regex).

absl::StatusOr<std::unique_ptr<const re2::RE2>> CompileRegex(std::string_view pattern) {
  re2::RE2::Options options;  // UTF-8, Perl-like syntax, case-sensitive
  options.set_log_errors(false);
  auto re = std::make_unique<const re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()),
                                             options);
  if (!re->ok()) {
    return absl::InvalidArgumentError("regex " + QuoteValue(pattern) +
                                      " is not valid for RE2: " + re->error());
  }
  return re;
}

bool RegexSearch(const re2::RE2& re, std::string_view s) {
  return re2::RE2::PartialMatch(re2::StringPiece(s.data(), s.size()), re);
}

#if INFERQ_HAVE_JSON_SCHEMA  // JSON Schema validation state
// The compiled regexes of one JSON Schema, by pattern text. Built once when the schema
// is parsed; read-only afterwards.
using SchemaRegexes = absl::flat_hash_map<std::string, std::unique_ptr<const re2::RE2>>;

// Per-thread state of the JSON Schema validation in progress on this thread (set by
// SchemaScope; read by the valijson specializations at the end of this file).
struct SchemaValidationState {
  const SchemaRegexes* regexes = nullptr;
  std::size_t depth = 0;
  bool limit_hit = false;
};
thread_local SchemaValidationState t_schema;

class SchemaScope {
 public:
  explicit SchemaScope(const SchemaRegexes* regexes) : saved_(t_schema) {
    t_schema = SchemaValidationState{regexes, 0, false};
  }
  ~SchemaScope() { t_schema = saved_; }
  SchemaScope(const SchemaScope&) = delete;
  SchemaScope& operator=(const SchemaScope&) = delete;
  bool limit_hit() const { return t_schema.limit_hit; }

 private:
  SchemaValidationState saved_;
};

#endif  // INFERQ_HAVE_JSON_SCHEMA
}  // namespace

#if INFERQ_HAVE_JSON_SCHEMA  // hooks of the valijson specializations
// Used by the valijson specializations below: searches `s` with the schema's compiled
// `pattern`. Every pattern of the schema was compiled when it was parsed; one missing
// here would be a bug, and matches nothing.
bool SchemaRegexSearch(std::string_view pattern, std::string_view s) {
  if (t_schema.regexes == nullptr) return false;
  const auto it = t_schema.regexes->find(absl::string_view(pattern.data(), pattern.size()));
  return it != t_schema.regexes->end() && RegexSearch(*it->second, s);
}

// True while the validation may go one level deeper; sets limit_hit otherwise.
bool EnterSchemaLevel() {
  if (t_schema.limit_hit || t_schema.depth >= Predicate::kMaxSchemaDepth) {
    t_schema.limit_hit = true;
    return false;
  }
  ++t_schema.depth;
  return true;
}
void LeaveSchemaLevel() { --t_schema.depth; }

// Nesting of valijson's schema parser on this thread (subschemas and "$ref" hops).
thread_local std::size_t t_parse_depth = 0;
constexpr std::size_t kMaxParseDepth = 256;

// Throws (a valijson error, so JsonSchema reports it) past kMaxParseDepth.
void EnterParseLevel() {
  if (t_parse_depth >= kMaxParseDepth) {
    valijson::throwRuntimeError(
        "subschemas and \"$ref\" hops nest deeper than " + std::to_string(kMaxParseDepth) +
        " levels (a \"$ref\" cycle such as {\"$ref\": \"#\"} never ends)");
  }
  ++t_parse_depth;
}
void LeaveParseLevel() { --t_parse_depth; }

#endif  // INFERQ_HAVE_JSON_SCHEMA
std::uint64_t PayloadParsesOnThisThread() { return t_payload_parses; }

absl::Status ValidateJsonPointer(std::string_view pointer) {
  return ParsePointer(pointer).status();
}

std::optional<std::string> JsonPointerText(std::string_view payload, std::string_view pointer) {
  absl::StatusOr<std::vector<PointerToken>> tokens = ParsePointer(pointer);
  if (!tokens.ok()) return std::nullopt;
  JsonDocument doc;
  if (ParseJson(payload, doc).status != ParseStatus::kOk) return std::nullopt;
  const JsonValue* v = Resolve(doc, *tokens);
  if (v == nullptr) return std::nullopt;
  if (v->IsString()) return std::string(v->GetString(), v->GetStringLength());
  // The parse bounded the nesting, so the writer's recursion is bounded too.
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v->Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

namespace {

// ---------------------------------------------------------------------------------------
// Evaluation.

// One Matches call: the event and its payload, parsed on first use and at most once.
class EvalContext {
 public:
  explicit EvalContext(const Event& e) : event_(e) {}
  EvalContext(const EvalContext&) = delete;
  EvalContext& operator=(const EvalContext&) = delete;

  const Event& event() const { return event_; }

  // The payload as JSON, or nullptr when it is not valid JSON.
  const JsonValue* Payload() {
    if (state_ == State::kUnparsed) {
      ++t_payload_parses;
      // Small payloads parse into `buffer_` without touching the heap's pool chunks.
      allocator_.emplace(buffer_, sizeof(buffer_), kChunkBytes);
      doc_.emplace(&*allocator_);
      state_ = ParseJson(event_.payload.view(), *doc_).status == ParseStatus::kOk
                   ? State::kValid
                   : State::kInvalid;
    }
    return state_ == State::kValid ? &*doc_ : nullptr;
  }

  // Bumped by each JSON rule or schema that met a payload that is not valid JSON, and
  // by each schema that hit kMaxSchemaDepth; nodes compare before and after.
  std::uint64_t invalid_hits = 0;
  std::uint64_t limit_hits = 0;
  // Predicate::Check only: where a node that does not match says why (the first
  // reason stays; Node::Evaluate supplies a generic one when the node gave none).
  std::string* why = nullptr;

 private:
  enum class State : std::uint8_t { kUnparsed, kValid, kInvalid };
  static constexpr std::size_t kChunkBytes = 4096;

  const Event& event_;
  State state_ = State::kUnparsed;
  alignas(16) char buffer_[1024];
  std::optional<JsonAllocator> allocator_;
  std::optional<JsonDocument> doc_;  // destroyed before allocator_ and buffer_
};

}  // namespace

// A node of the predicate tree. Immutable after construction except for its counters.
class Node {
 public:
  virtual ~Node() = default;

  bool Evaluate(EvalContext& ctx) const {
    const std::uint64_t invalid_before = ctx.invalid_hits;
    const std::uint64_t limit_before = ctx.limit_hits;
    const std::size_t why_before = ctx.why == nullptr ? 0 : ctx.why->size();
    const bool r = Eval(ctx);
    if (!r && ctx.why != nullptr && ctx.why->size() == why_before) {
      if (ctx.invalid_hits != invalid_before) {
        *ctx.why += "the payload is not valid JSON, so ";
      }
      *ctx.why += "the event does not match ";
      AppendDebug(*ctx.why);
    }
    // Counters: `evaluated` first (relaxed), then the others with release; Stats loads
    // the others with acquire before `evaluated`, so a snapshot never shows more
    // matches (or invalid payloads) than evaluations. No other data is published
    // through them.
    evaluated_.fetch_add(1, std::memory_order_relaxed);
    if (r) matched_.fetch_add(1, std::memory_order_release);
    if (ctx.invalid_hits != invalid_before) invalid_json_.fetch_add(1, std::memory_order_release);
    if (ctx.limit_hits != limit_before) limit_exceeded_.fetch_add(1, std::memory_order_release);
    return r;
  }

  PredicateStats Stats() const {
    PredicateStats s;
    s.matched = matched_.load(std::memory_order_acquire);
    s.invalid_json = invalid_json_.load(std::memory_order_acquire);
    s.limit_exceeded = limit_exceeded_.load(std::memory_order_acquire);
    s.evaluated = evaluated_.load(std::memory_order_relaxed);
    return s;
  }

  virtual void AppendDebug(std::string& out) const = 0;

 protected:
  virtual bool Eval(EvalContext& ctx) const = 0;

 private:
  mutable std::atomic<std::uint64_t> evaluated_{0};
  mutable std::atomic<std::uint64_t> matched_{0};
  mutable std::atomic<std::uint64_t> invalid_json_{0};
  mutable std::atomic<std::uint64_t> limit_exceeded_{0};
};

namespace {

using NodePtr = std::shared_ptr<const Node>;

// A null child is a trivial (always true) predicate.
bool EvaluateChild(const NodePtr& n, EvalContext& ctx) { return n == nullptr || n->Evaluate(ctx); }
void AppendChild(const NodePtr& n, std::string& out) {
  if (n == nullptr) {
    out += "true";
  } else {
    n->AppendDebug(out);
  }
}

// Which field of an Event a header rule's name reads (Predicate::HeadersAll): a
// first-class attribute, or the header map.
enum class RuleField : std::uint8_t {
  kHeader, kModel, kModelVersion, kTenant, kSemanticTag,  // strings
  kSchemaId, kSchemaVersion,                               // 0 = not set
  kQos, kPriority, kCodec,                                 // always set
};

struct FieldName {
  std::string_view name;
  RuleField field;
};
constexpr FieldName kRuleFields[] = {
    {"model", RuleField::kModel},         {"model_version", RuleField::kModelVersion},
    {"tenant", RuleField::kTenant},       {"semantic_tag", RuleField::kSemanticTag},
    {"schema_id", RuleField::kSchemaId},  {"schema_version", RuleField::kSchemaVersion},
    {"qos", RuleField::kQos},             {"priority", RuleField::kPriority},
    {"codec", RuleField::kCodec},
};

RuleField FieldOf(std::string_view name) {
  for (const FieldName& f : kRuleFields) {
    if (f.name == name) return f.field;
  }
  return RuleField::kHeader;
}

// A rule value for a typed attribute, as the attribute's own value: the tier or codec
// number, the priority, the schema id or version. nullopt when the text is not one.
std::optional<std::int64_t> TypedValue(RuleField field, std::string_view v) {
  auto number = [&](std::int64_t lo, std::int64_t hi) -> std::optional<std::int64_t> {
    std::int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || n < lo || n > hi) {
      return std::nullopt;
    }
    return n;
  };
  switch (field) {
    case RuleField::kQos:
      if (v == "gold") return static_cast<std::int64_t>(Qos::kGold);
      if (v == "silver") return static_cast<std::int64_t>(Qos::kSilver);
      if (v == "bronze") return static_cast<std::int64_t>(Qos::kBronze);
      return std::nullopt;
    case RuleField::kCodec:
      if (v == "none") return static_cast<std::int64_t>(PayloadCodec::kNone);
      if (v == "zstd") return static_cast<std::int64_t>(PayloadCodec::kZstd);
      return std::nullopt;
    case RuleField::kPriority:
      return number(INT32_MIN, INT32_MAX);
    case RuleField::kSchemaId:
    case RuleField::kSchemaVersion:
      return number(0, UINT32_MAX);
    default:
      return std::nullopt;
  }
}

// What a rule's value must be for its typed attribute, for the error message.
std::string_view TypedForm(RuleField field) {
  switch (field) {
    case RuleField::kQos:
      return "a tier: gold, silver or bronze";
    case RuleField::kCodec:
      return "a codec: none or zstd";
    case RuleField::kPriority:
      return "a decimal integer in -2147483648..2147483647";
    case RuleField::kSchemaId:
    case RuleField::kSchemaVersion:
      return "a decimal integer in 0..4294967295";
    default:
      return "";
  }
}

class HeadersNode final : public Node {
 public:
  // Every rule was checked by CheckHeaders: a typed attribute's value parses.
  HeadersNode(bool all, std::vector<Predicate::HeaderRule> rules) : all_(all) {
    for (auto& [name, value] : rules) {
      Rule r;
      r.field = FieldOf(name);
      if (value && r.field >= RuleField::kSchemaId) r.number = *TypedValue(r.field, *value);
      r.name = std::move(name);
      r.value = std::move(value);
      rules_.push_back(std::move(r));
    }
  }

  void AppendDebug(std::string& out) const override {
    out += all_ ? "headers_all{" : "headers_any{";
    for (std::size_t i = 0; i < rules_.size(); ++i) {
      if (i > 0) out += ", ";
      out += rules_[i].name;
      if (rules_[i].value) {
        out += '=';
        out += *rules_[i].value;
      }
    }
    out += '}';
  }

 protected:
  bool Eval(EvalContext& ctx) const override {
    for (const Rule& r : rules_) {
      const bool holds = Holds(r, ctx.event());
      if (all_ && !holds) return false;
      if (!all_ && holds) return true;
    }
    return all_;
  }

 private:
  struct Rule {
    std::string name;
    std::optional<std::string> value;
    RuleField field = RuleField::kHeader;
    std::int64_t number = 0;  // a typed attribute's value (TypedValue)
  };

  // A string attribute when it is set (not empty), an id when it is not 0, else the
  // header of the rule's name; qos, priority and codec are always set.
  static bool Holds(const Rule& r, const Event& e) {
    auto text = [&](const std::string& attribute) {
      if (attribute.empty()) return HeaderHolds(r, e);
      return !r.value || attribute == *r.value;
    };
    auto id = [&](std::uint32_t attribute) {
      if (attribute == 0) return HeaderHolds(r, e);
      return !r.value || attribute == r.number;
    };
    auto always = [&](std::int64_t attribute) { return !r.value || attribute == r.number; };
    switch (r.field) {
      case RuleField::kHeader: return HeaderHolds(r, e);
      case RuleField::kModel: return text(e.model);
      case RuleField::kModelVersion: return text(e.model_version);
      case RuleField::kTenant: return text(e.tenant);
      case RuleField::kSemanticTag: return text(e.semantic_tag);
      case RuleField::kSchemaId: return id(e.schema_id);
      case RuleField::kSchemaVersion: return id(e.schema_version);
      case RuleField::kQos: return always(static_cast<std::int64_t>(e.qos));
      case RuleField::kPriority: return always(e.priority);
      case RuleField::kCodec: return always(static_cast<std::int64_t>(e.codec));
    }
    return false;
  }
  static bool HeaderHolds(const Rule& r, const Event& e) {
    const std::optional<std::string_view> got = e.headers.Get(r.name);
    return got.has_value() && (!r.value || *got == *r.value);
  }

  bool all_;
  std::vector<Rule> rules_;
};

class TagNode final : public Node {
 public:
  explicit TagNode(std::vector<std::string> tags) : ordered_(std::move(tags)) {
    set_.insert(ordered_.begin(), ordered_.end());
  }

  void AppendDebug(std::string& out) const override {
    out += "tag_in{";
    for (std::size_t i = 0; i < ordered_.size(); ++i) {
      if (i > 0) out += ", ";
      out += ordered_[i];
    }
    out += '}';
  }

 protected:
  bool Eval(EvalContext& ctx) const override { return set_.contains(ctx.event().semantic_tag); }

 private:
  std::vector<std::string> ordered_;  // as given, duplicates removed (for DebugString)
  absl::flat_hash_set<std::string> set_;
};

class JsonRuleNode final : public Node {
 public:
  JsonRuleNode(std::string pointer, std::vector<PointerToken> tokens, JsonOp op,
               std::unique_ptr<JsonDocument> operand, std::unique_ptr<const re2::RE2> re)
      : pointer_(std::move(pointer)),
        tokens_(std::move(tokens)),
        op_(op),
        operand_(std::move(operand)),
        re_(std::move(re)) {}

  void AppendDebug(std::string& out) const override {
    out += "json(";
    out += pointer_.empty() ? "\"\"" : pointer_;
    out += ' ';
    out += JsonOpName(op_);
    if (op_ != JsonOp::kExists) {
      out += ' ';
      out += CompactJson(*operand_);
    }
    out += ')';
  }

 protected:
  bool Eval(EvalContext& ctx) const override {
    const JsonValue* root = ctx.Payload();
    if (root == nullptr) {
      ++ctx.invalid_hits;
      return false;
    }
    const JsonValue* v = Resolve(*root, tokens_);
    if (v == nullptr) return false;  // every op, kNe and kExists included
    const JsonValue& x = *operand_;
    switch (op_) {
      case JsonOp::kEq:
        return JsonEquals(*v, x);
      case JsonOp::kNe:
        return !JsonEquals(*v, x);
      case JsonOp::kLt:
      case JsonOp::kLe:
      case JsonOp::kGt:
      case JsonOp::kGe: {
        int c;
        if (x.IsNumber() && v->IsNumber()) {
          c = CompareNumbers(*v, x);
        } else if (x.IsString() && v->IsString()) {
          const int s = StringOf(*v).compare(StringOf(x));
          c = s < 0 ? -1 : (s > 0 ? 1 : 0);
        } else {
          return false;
        }
        if (op_ == JsonOp::kLt) return c < 0;
        if (op_ == JsonOp::kLe) return c <= 0;
        if (op_ == JsonOp::kGt) return c > 0;
        return c >= 0;
      }
      case JsonOp::kIn:
        for (const JsonValue& e : x.GetArray()) {
          if (JsonEquals(*v, e)) return true;
        }
        return false;
      case JsonOp::kExists:
        return true;
      case JsonOp::kMatches:
        return v->IsString() && RegexSearch(*re_, StringOf(*v));
    }
    return false;
  }

 private:
  std::string pointer_;
  std::vector<PointerToken> tokens_;
  JsonOp op_;
  std::unique_ptr<JsonDocument> operand_;  // read-only after construction
  std::unique_ptr<const re2::RE2> re_;     // kMatches only
};

#if INFERQ_HAVE_JSON_SCHEMA  // JsonSchemaNode
std::string_view DraftName(JsonSchemaDraft d) {
  switch (d) {
    case JsonSchemaDraft::kAuto:
      return "auto";
    case JsonSchemaDraft::kDraft3:
      return "draft3";
    case JsonSchemaDraft::kDraft4:
      return "draft4";
    case JsonSchemaDraft::kDraft6:
      return "draft6";
    case JsonSchemaDraft::kDraft7:
      return "draft7";
  }
  return "?";
}

// valijson's errors as "JSON Schema: /a/b: what; ..." with each place as a JSON
// Pointer into the payload ("(root)" for the root), innermost first as valijson
// reports them, at most 4. valijson also reports each enclosing level that failed
// because of an inner one ("Failed to validate against schema associated with
// property name 'a'.", "Failed to validate item #0 in array.", "Failed to validate
// against child schema #0."): those wrappers are left out when a finer error is
// there.
std::string DescribeErrors(valijson::ValidationResults& results) {
  std::vector<std::pair<std::string, std::string>> errors;  // pointer, description
  valijson::ValidationResults::Error e;
  while (results.popError(e)) {
    std::string pointer;
    for (const std::string& part : e.context) {
      if (part == "<root>") continue;
      // "[name]" for a property, "[3]" for an array index (valijson's form).
      std::string_view token = part;
      if (token.size() >= 2 && token.front() == '[' && token.back() == ']') {
        token = token.substr(1, token.size() - 2);
      }
      pointer += '/';
      for (char c : token) {  // RFC 6901 escapes
        if (c == '~') {
          pointer += "~0";
        } else if (c == '/') {
          pointer += "~1";
        } else {
          pointer += c;
        }
      }
    }
    errors.emplace_back(pointer.empty() ? std::string("(root)") : std::move(pointer),
                        std::move(e.description));
  }
  // "Failed to validate against schema associated with property ...", "... item #0
  // in array", "... child schema #0", "... any child schemas allowed by anyOf", and
  // the conditional ones: each says only that a part below failed.
  auto wrapper = [](const std::string& d) { return d.starts_with("Failed to validate"); };
  std::vector<std::pair<std::string, std::string>> kept;
  for (auto& err : errors) {
    if (!wrapper(err.second)) kept.push_back(std::move(err));
  }
  if (kept.empty()) kept = std::move(errors);
  std::string out = "JSON Schema: ";
  if (kept.empty()) return out + "the payload does not validate";
  for (std::size_t i = 0; i < kept.size() && i < 4; ++i) {
    if (i > 0) out += "; ";
    out += kept[i].first + ": " + kept[i].second;
  }
  if (kept.size() > 4) out += "; and " + std::to_string(kept.size() - 4) + " more";
  return out;
}

class JsonSchemaNode final : public Node {
 public:
  JsonSchemaNode(std::unique_ptr<valijson::Schema> schema, SchemaRegexes regexes,
                 JsonSchemaDraft draft, std::size_t bytes)
      : schema_(std::move(schema)), regexes_(std::move(regexes)), draft_(draft), bytes_(bytes) {}

  void AppendDebug(std::string& out) const override {
    out += "json_schema(";
    out += DraftName(draft_);
    out += ", " + std::to_string(bytes_) + " bytes)";
  }

 protected:
  bool Eval(EvalContext& ctx) const override {
    const JsonValue* root = ctx.Payload();
    if (root == nullptr) {
      ++ctx.invalid_hits;
      return false;
    }
    SchemaScope scope(&regexes_);
    // valijson's Validator keeps a mutable regex cache, so it is not shareable between
    // threads; a ValidationVisitor per call is (the Schema is only read). The cache it
    // is handed stays empty: the specializations below never use std::regex.
    std::unordered_map<std::string, std::regex> unused_regex_cache;
    valijson::ValidationVisitor<SchemaAdapter> visitor(SchemaAdapter(*root), {},
                                                       /*strictTypes=*/true, nullptr,
                                                       unused_regex_cache);
    const bool ok = visitor.validateSchema(*schema_);
    if (scope.limit_hit()) {
      ++ctx.limit_hits;
      if (ctx.why != nullptr) {
        *ctx.why += "JSON Schema validation stopped at the nesting limit of " +
                    std::to_string(Predicate::kMaxSchemaDepth);
      }
      return false;  // even under a "not": an unfinished validation is no match
    }
    if (!ok && ctx.why != nullptr) Describe(*root, ctx);
    return ok;
  }

 private:
  // Check's reason for a payload that does not validate (Matches decided that): a
  // second validation that collects valijson's errors, which goes on past the first
  // one and so costs more; above kDescribeBytes of payload the errors are not
  // collected (a caller's check must not cost seconds and gigabytes on a large
  // failing payload), and a second pass that hits the nesting limit is not reported.
  static constexpr std::size_t kDescribeBytes = std::size_t{1} << 16;
  void Describe(const JsonValue& root, EvalContext& ctx) const {
    if (ctx.event().payload.size() > kDescribeBytes) {
      *ctx.why += "JSON Schema: the payload does not validate (its " +
                  std::to_string(ctx.event().payload.size()) + " bytes are over " +
                  std::to_string(kDescribeBytes) + ", so the errors are not collected)";
      return;
    }
    SchemaScope scope(&regexes_);
    std::unordered_map<std::string, std::regex> unused_regex_cache;
    valijson::ValidationResults results;
    valijson::ValidationVisitor<SchemaAdapter> visitor(SchemaAdapter(root), {},
                                                       /*strictTypes=*/true, &results,
                                                       unused_regex_cache);
    (void)visitor.validateSchema(*schema_);
    if (scope.limit_hit()) {
      *ctx.why += "JSON Schema: the payload does not validate (describing it reached the "
                  "nesting limit of " + std::to_string(Predicate::kMaxSchemaDepth) + ")";
      return;
    }
    *ctx.why += DescribeErrors(results);
  }

  std::unique_ptr<valijson::Schema> schema_;
  SchemaRegexes regexes_;
  JsonSchemaDraft draft_;
  std::size_t bytes_;
};

#endif  // INFERQ_HAVE_JSON_SCHEMA
class AllAnyNode final : public Node {
 public:
  AllAnyNode(bool all, std::vector<NodePtr> children) : all_(all), children_(std::move(children)) {}

  void AppendDebug(std::string& out) const override {
    out += all_ ? "all(" : "any(";
    for (std::size_t i = 0; i < children_.size(); ++i) {
      if (i > 0) out += ", ";
      AppendChild(children_[i], out);
    }
    out += ')';
  }

 protected:
  bool Eval(EvalContext& ctx) const override {
    if (!all_ && ctx.why != nullptr) return EvalAnyExplained(ctx);
    for (const NodePtr& c : children_) {
      const bool r = EvaluateChild(c, ctx);
      if (all_ && !r) return false;  // the child said why
      if (!all_ && r) return true;
    }
    return all_;
  }

 private:
  // Any, for Check: "none of N matched: <reason 1>; <reason 2>; ...".
  bool EvalAnyExplained(EvalContext& ctx) const {
    std::string* why = ctx.why;
    std::string reasons;
    for (const NodePtr& c : children_) {
      std::string child_why;
      ctx.why = &child_why;
      const bool r = EvaluateChild(c, ctx);
      ctx.why = why;
      if (r) return true;
      if (!reasons.empty()) reasons += "; ";
      reasons += child_why;
    }
    *why += "none of " + std::to_string(children_.size()) + " matched";
    if (!reasons.empty()) *why += ": " + reasons;
    return false;
  }

  bool all_;
  std::vector<NodePtr> children_;
};

class NotNode final : public Node {
 public:
  explicit NotNode(NodePtr child) : child_(std::move(child)) {}
  void AppendDebug(std::string& out) const override {
    out += "not(";
    AppendChild(child_, out);
    out += ')';
  }

 protected:
  bool Eval(EvalContext& ctx) const override {
    // The child's own reasons are of its failures, which are this node's successes.
    std::string* why = ctx.why;
    ctx.why = nullptr;
    const bool r = !EvaluateChild(child_, ctx);
    ctx.why = why;
    return r;
  }

 private:
  NodePtr child_;
};

// ---------------------------------------------------------------------------------------
// JSON Schema construction.

#if INFERQ_HAVE_JSON_SCHEMA  // JSON Schema construction
// Walks every subschema reachable from the root (iteratively: "$ref" chains can be
// long) and compiles each "pattern" and "patternProperties" key with RE2, so that a
// pattern RE2 rejects is an error of JsonSchema, not a surprise in Matches.
class RegexCollector final : public valijson::constraints::ConstraintVisitor {
 public:
  absl::Status Collect(const valijson::Subschema& root, SchemaRegexes& out) {
    out_ = &out;
    Push(&root);
    valijson::Subschema::ApplyFunction fn = [this](const valijson::constraints::Constraint& c) {
      c.accept(*this);
      return true;
    };
    while (!work_.empty() && status_.ok()) {
      const valijson::Subschema* s = work_.back();
      work_.pop_back();
      s->apply(fn);
    }
    return status_;
  }

  bool visit(const AllOfConstraint& c) override { return PushAll(c); }
  bool visit(const AnyOfConstraint& c) override { return PushAll(c); }
  bool visit(const OneOfConstraint& c) override { return PushAll(c); }
  bool visit(const ConditionalConstraint& c) override {
    Push(c.getIfSubschema());
    Push(c.getThenSubschema());
    Push(c.getElseSubschema());
    return true;
  }
  bool visit(const ContainsConstraint& c) override { return Push(c.getSubschema()); }
  bool visit(const DependenciesConstraint& c) override {
    c.applyToSchemaDependencies([this](const auto&, const valijson::Subschema* s) {
      return Push(s);
    });
    return true;
  }
  bool visit(const LinearItemsConstraint& c) override {
    c.applyToItemSubschemas([this](unsigned, const valijson::Subschema* s) { return Push(s); });
    return Push(c.getAdditionalItemsSubschema());
  }
  bool visit(const SingularItemsConstraint& c) override { return Push(c.getItemsSubschema()); }
  bool visit(const NotConstraint& c) override { return Push(c.getSubschema()); }
  bool visit(const PropertiesConstraint& c) override {
    c.applyToProperties([this](const auto&, const valijson::Subschema* s) { return Push(s); });
    c.applyToPatternProperties([this](const auto& pattern, const valijson::Subschema* s) {
      Add(std::string(pattern.c_str()));
      return Push(s);
    });
    return Push(c.getAdditionalPropertiesSubschema());
  }
  bool visit(const PropertyNamesConstraint& c) override { return Push(c.getSubschema()); }
  bool visit(const TypeConstraint& c) override {
    c.applyToSchemaTypes([this](unsigned, const valijson::Subschema* s) { return Push(s); });
    return true;
  }
  bool visit(const PatternConstraint& c) override {
    Add(c.getPattern<std::string::allocator_type>());
    return true;
  }
  // No subschemas and no regexes.
  bool visit(const ConstConstraint&) override { return true; }
  bool visit(const EnumConstraint&) override { return true; }
  bool visit(const FormatConstraint&) override { return true; }
  bool visit(const MaximumConstraint&) override { return true; }
  bool visit(const MaxItemsConstraint&) override { return true; }
  bool visit(const MaxLengthConstraint&) override { return true; }
  bool visit(const MaxPropertiesConstraint&) override { return true; }
  bool visit(const MinimumConstraint&) override { return true; }
  bool visit(const MinItemsConstraint&) override { return true; }
  bool visit(const MinLengthConstraint&) override { return true; }
  bool visit(const MinPropertiesConstraint&) override { return true; }
  bool visit(const MultipleOfDoubleConstraint&) override { return true; }
  bool visit(const MultipleOfIntConstraint&) override { return true; }
  bool visit(const PolyConstraint&) override { return true; }
  bool visit(const RequiredConstraint&) override { return true; }
  bool visit(const UniqueItemsConstraint&) override { return true; }

 private:
  template <typename C>
  bool PushAll(const C& c) {
    c.applyToSubschemas([this](unsigned, const valijson::Subschema* s) { return Push(s); });
    return true;
  }
  bool Push(const valijson::Subschema* s) {
    if (s != nullptr && seen_.insert(s).second) work_.push_back(s);
    return true;
  }
  void Add(const std::string& pattern) {
    if (!status_.ok() || out_->contains(pattern)) return;
    absl::StatusOr<std::unique_ptr<const re2::RE2>> re = CompileRegex(pattern);
    if (!re.ok()) {
      status_ = re.status();
      return;
    }
    out_->emplace(pattern, *std::move(re));
  }

  SchemaRegexes* out_ = nullptr;
  std::set<const valijson::Subschema*> seen_;
  std::vector<const valijson::Subschema*> work_;
  absl::Status status_;
};

// Longest "$ref", "id" or "$id" string JsonSchema accepts. valijson 1.0 tests such
// URIs with std::regex (internal::uri::isUrn), whose executor recurses per character:
// about 250 bytes of stack per byte of URI (1 KiB under ASan), measured with GCC 12.
constexpr std::size_t kMaxSchemaUriBytes = 512;

// What JsonSchema refuses in a schema document (the root one or a fetched one) before
// valijson reads it, or nullopt:
//  - a string "$ref", "id" or "$id" longer than kMaxSchemaUriBytes;
//  - in draft 3, a member named "disallow" or "extends": valijson 1.0 parses draft 3
//    but silently ignores those keywords, so the schema would match what it should not.
// Member names are checked anywhere in the document (conservatively: also where the
// name is data, e.g. a property called "extends").
std::optional<std::string> SchemaDocumentProblem(const JsonValue& doc, JsonSchemaDraft draft) {
  std::vector<const JsonValue*> work = {&doc};
  while (!work.empty()) {
    const JsonValue* v = work.back();
    work.pop_back();
    if (v->IsObject()) {
      for (auto it = v->MemberBegin(); it != v->MemberEnd(); ++it) {
        const std::string_view name = StringOf(it->name);
        if (draft == JsonSchemaDraft::kDraft3 && (name == "disallow" || name == "extends")) {
          return "uses the draft 3 keyword \"" + std::string(name) +
                 "\", which valijson 1.0 does not implement (a member of that name anywhere "
                 "in the document counts)";
        }
        if ((name == "$ref" || name == "id" || name == "$id") && it->value.IsString() &&
            it->value.GetStringLength() > kMaxSchemaUriBytes) {
          return "has a \"" + std::string(name) + "\" of " +
                 std::to_string(it->value.GetStringLength()) + " bytes; at most " +
                 std::to_string(kMaxSchemaUriBytes) + " are accepted";
        }
        work.push_back(&it->value);
      }
    } else if (v->IsArray()) {
      for (const JsonValue& e : v->GetArray()) work.push_back(&e);
    }
  }
  return std::nullopt;
}

// The draft named by a "$schema" URI, or nullopt for one this file does not know.
std::optional<JsonSchemaDraft> DraftOfUri(std::string_view uri) {
  for (std::string_view prefix : {"http://", "https://"}) {
    if (uri.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = uri.substr(prefix.size());
    if (!rest.empty() && rest.back() == '#') rest.remove_suffix(1);
    if (rest == "json-schema.org/draft-03/schema") return JsonSchemaDraft::kDraft3;
    if (rest == "json-schema.org/draft-04/schema") return JsonSchemaDraft::kDraft4;
    if (rest == "json-schema.org/draft-06/schema") return JsonSchemaDraft::kDraft6;
    if (rest == "json-schema.org/draft-07/schema") return JsonSchemaDraft::kDraft7;
  }
  return std::nullopt;
}

#endif  // INFERQ_HAVE_JSON_SCHEMA
}  // namespace
}  // namespace inferq::predicate_internal

namespace inferq {

using predicate_internal::JsonDocument;
using predicate_internal::Node;

std::string_view JsonOpName(JsonOp op) {
  switch (op) {
    case JsonOp::kEq:
      return "==";
    case JsonOp::kNe:
      return "!=";
    case JsonOp::kLt:
      return "<";
    case JsonOp::kLe:
      return "<=";
    case JsonOp::kGt:
      return ">";
    case JsonOp::kGe:
      return ">=";
    case JsonOp::kIn:
      return "in";
    case JsonOp::kExists:
      return "exists";
    case JsonOp::kMatches:
      return "matches";
  }
  return "?";
}

Predicate::Predicate() = default;
Predicate::Predicate(std::shared_ptr<const Node> node) : node_(std::move(node)) {}

namespace {

absl::Status CheckHeaders(const char* what, const std::vector<Predicate::HeaderRule>& h) {
  if (h.empty()) {
    return absl::InvalidArgumentError(std::string(what) + " needs at least one header");
  }
  for (std::size_t i = 0; i < h.size(); ++i) {
    if (h[i].first.empty()) {
      std::string msg = std::string(what) + ": header " + std::to_string(i) + " has an empty name";
      if (h[i].second) msg += " (value " + QuoteValue(*h[i].second) + ")";
      return absl::InvalidArgumentError(msg);
    }
    const predicate_internal::RuleField field = predicate_internal::FieldOf(h[i].first);
    if (h[i].second && field >= predicate_internal::RuleField::kSchemaId &&
        !predicate_internal::TypedValue(field, *h[i].second)) {
      return absl::InvalidArgumentError(
          std::string(what) + ": header " + std::to_string(i) + " names the attribute " +
          QuoteValue(h[i].first) + ", whose value " + QuoteValue(*h[i].second) + " is not " +
          std::string(predicate_internal::TypedForm(field)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Predicate> Predicate::HeadersAll(std::vector<HeaderRule> h) {
  if (absl::Status s = CheckHeaders("HeadersAll", h); !s.ok()) return s;
  return Predicate(std::make_shared<const predicate_internal::HeadersNode>(true, std::move(h)));
}

absl::StatusOr<Predicate> Predicate::HeadersAny(std::vector<HeaderRule> h) {
  if (absl::Status s = CheckHeaders("HeadersAny", h); !s.ok()) return s;
  return Predicate(std::make_shared<const predicate_internal::HeadersNode>(false, std::move(h)));
}

absl::StatusOr<Predicate> Predicate::TagIn(std::vector<std::string> tags) {
  if (tags.empty()) return absl::InvalidArgumentError("TagIn needs at least one tag");
  std::vector<std::string> unique;
  unique.reserve(tags.size());
  absl::flat_hash_set<std::string> seen;
  for (std::string& t : tags) {
    if (seen.insert(t).second) unique.push_back(std::move(t));
  }
  return Predicate(std::make_shared<const predicate_internal::TagNode>(std::move(unique)));
}

absl::StatusOr<Predicate> Predicate::Json(std::string_view pointer, JsonOp op,
                                          std::string_view operand) {
  using predicate_internal::ParseStatus;
  const std::string_view name = JsonOpName(op);
  if (name == "?") {
    return absl::InvalidArgumentError("unknown JsonOp " +
                                      std::to_string(static_cast<int>(op)));
  }
  absl::StatusOr<std::vector<predicate_internal::PointerToken>> tokens =
      predicate_internal::ParsePointer(pointer);
  if (!tokens.ok()) return tokens.status();

  auto doc = std::make_unique<JsonDocument>();
  if (op == JsonOp::kExists) {
    doc->SetNull();  // the operand is ignored
  } else {
    const predicate_internal::ParseResult r = predicate_internal::ParseJson(operand, *doc);
    if (r.status != ParseStatus::kOk) {
      return absl::InvalidArgumentError("operand " + predicate_internal::QuoteExcerpt(operand) +
                                        " of '" + std::string(name) +
                                        "' is not valid JSON " +
                                        predicate_internal::DescribeParseError(r));
    }
  }
  const auto wrong_kind = [&](const char* wanted) {
    return absl::InvalidArgumentError("operand " + predicate_internal::QuoteExcerpt(operand) +
                                      " of '" + std::string(name) + "' must be " + wanted);
  };
  std::unique_ptr<const re2::RE2> re;
  switch (op) {
    case JsonOp::kEq:
    case JsonOp::kNe:
    case JsonOp::kExists:
      break;
    case JsonOp::kLt:
    case JsonOp::kLe:
    case JsonOp::kGt:
    case JsonOp::kGe:
      if (!doc->IsNumber() && !doc->IsString()) return wrong_kind("a JSON number or string");
      break;
    case JsonOp::kIn:
      if (!doc->IsArray()) return wrong_kind("a JSON array");
      break;
    case JsonOp::kMatches: {
      if (!doc->IsString()) return wrong_kind("a JSON string holding a regular expression");
      absl::StatusOr<std::unique_ptr<const re2::RE2>> compiled =
          predicate_internal::CompileRegex(predicate_internal::StringOf(*doc));
      if (!compiled.ok()) {
        return absl::InvalidArgumentError("operand " + predicate_internal::QuoteExcerpt(operand) +
                                          " of 'matches': " +
                                          std::string(compiled.status().message()));
      }
      re = *std::move(compiled);
      break;
    }
  }
  return Predicate(std::make_shared<const predicate_internal::JsonRuleNode>(
      std::string(pointer), *std::move(tokens), op, std::move(doc), std::move(re)));
}

absl::StatusOr<Predicate> Predicate::JsonSchema(std::string_view schema_json) {
  return JsonSchema(schema_json, JsonSchemaOptions());
}

absl::StatusOr<Predicate> Predicate::JsonSchema(std::string_view schema_json,
                                                JsonSchemaOptions options) {
#if INFERQ_HAVE_JSON_SCHEMA
  using predicate_internal::ParseStatus;
  const std::string named = "JSON Schema " + predicate_internal::QuoteExcerpt(schema_json);
  JsonDocument doc;
  if (const predicate_internal::ParseResult r = predicate_internal::ParseJson(schema_json, doc);
      r.status != ParseStatus::kOk) {
    return absl::InvalidArgumentError(named + " is not valid JSON " +
                                      predicate_internal::DescribeParseError(r));
  }

  // The draft: options.draft, "$schema", or draft 7.
  JsonSchemaDraft draft = options.draft;
  if (doc.IsObject()) {
    if (const auto* s = predicate_internal::FindFirstMember(doc, "$schema")) {
      if (!s->IsString()) {
        return absl::InvalidArgumentError(named + " has a \"$schema\" that is not a string");
      }
      const std::string_view uri = predicate_internal::StringOf(*s);
      const std::optional<JsonSchemaDraft> named_draft = predicate_internal::DraftOfUri(uri);
      if (!named_draft) {
        return absl::InvalidArgumentError(named + " names \"$schema\" " + QuoteValue(uri) +
                                          "; supported are drafts 3, 4, 6 and 7");
      }
      if (draft != JsonSchemaDraft::kAuto && draft != *named_draft) {
        return absl::InvalidArgumentError(
            named + " names \"$schema\" " + QuoteValue(uri) + " but the options ask for " +
            std::string(predicate_internal::DraftName(draft)));
      }
      draft = *named_draft;
    }
  }
  if (draft == JsonSchemaDraft::kAuto) draft = JsonSchemaDraft::kDraft7;
  if (auto problem = predicate_internal::SchemaDocumentProblem(doc, draft)) {
    return absl::InvalidArgumentError(named + " " + *problem);
  }
  valijson::SchemaParser::Version version = valijson::SchemaParser::kDraft7;
  if (draft == JsonSchemaDraft::kDraft3) version = valijson::SchemaParser::kDraft3;
  if (draft == JsonSchemaDraft::kDraft4) version = valijson::SchemaParser::kDraft4;

  // Remote documents: fetched through options.fetch, parsed under the same limits.
  absl::Status fetch_error;
  std::exception_ptr fetch_exception;
  auto fetch = [&](const std::string& uri) -> const JsonDocument* {
    if (!fetch_error.ok() || fetch_exception) return nullptr;
    if (!options.fetch) {
      fetch_error = absl::InvalidArgumentError(
          named + " has a remote \"$ref\" to " + QuoteValue(uri) +
          " and JsonSchemaOptions::fetch is empty");
      return nullptr;
    }
    absl::StatusOr<std::string> text;
    try {
      text = options.fetch(uri);
    } catch (...) {
      // What a user callback throws is the caller's: rethrown once valijson unwinds.
      fetch_exception = std::current_exception();
      return nullptr;
    }
    if (!text.ok()) {
      fetch_error = absl::InvalidArgumentError(named + ": fetching the remote \"$ref\" " +
                                               QuoteValue(uri) + " failed: " +
                                               std::string(text.status().message()));
      return nullptr;
    }
    auto remote = std::make_unique<JsonDocument>();
    if (const predicate_internal::ParseResult r = predicate_internal::ParseJson(*text, *remote);
        r.status != ParseStatus::kOk) {
      fetch_error = absl::InvalidArgumentError(named + ": the remote \"$ref\" document " +
                                               QuoteValue(uri) + " is not valid JSON " +
                                               predicate_internal::DescribeParseError(r));
      return nullptr;
    }
    if (auto problem = predicate_internal::SchemaDocumentProblem(*remote, draft)) {
      fetch_error = absl::InvalidArgumentError(named + ": the remote \"$ref\" document " +
                                               QuoteValue(uri) + " " + *problem);
      return nullptr;
    }
    return remote.release();  // freed by free_doc below
  };
  auto free_doc = [](const JsonDocument* d) { delete d; };

  auto schema = std::make_unique<valijson::Schema>();
  try {
    valijson::SchemaParser parser(version);
    parser.populateSchema(predicate_internal::SchemaAdapter(doc), *schema, fetch, free_doc);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    if (fetch_exception) std::rethrow_exception(fetch_exception);
    if (!fetch_error.ok()) return fetch_error;
    return absl::InvalidArgumentError(named + " is rejected by valijson (" +
                                      std::string(predicate_internal::DraftName(draft)) +
                                      "): " + e.what());
  }
  if (fetch_exception) std::rethrow_exception(fetch_exception);

  predicate_internal::SchemaRegexes regexes;
  predicate_internal::RegexCollector collector;
  if (absl::Status s = collector.Collect(*schema, regexes); !s.ok()) {
    return absl::InvalidArgumentError(named + " has a pattern that " + std::string(s.message()));
  }
  return Predicate(std::make_shared<const predicate_internal::JsonSchemaNode>(
      std::move(schema), std::move(regexes), draft, schema_json.size()));
#else
  (void)schema_json;
  (void)options;
  return absl::UnimplementedError(
      "Predicate::JsonSchema is not in this build of inferq: it was configured without "
      "JSON Schema predicates (INFERQ_WITH_JSON_SCHEMA=OFF, or AUTO with valijson not "
      "found; they need valijson, Debian libvalijson-dev)");
#endif  // INFERQ_HAVE_JSON_SCHEMA
}

Predicate Predicate::All(std::vector<Predicate> ps) {
  std::vector<std::shared_ptr<const Node>> children;
  children.reserve(ps.size());
  for (Predicate& p : ps) children.push_back(std::move(p.node_));
  return Predicate(
      std::make_shared<const predicate_internal::AllAnyNode>(true, std::move(children)));
}

Predicate Predicate::Any(std::vector<Predicate> ps) {
  std::vector<std::shared_ptr<const Node>> children;
  children.reserve(ps.size());
  for (Predicate& p : ps) children.push_back(std::move(p.node_));
  return Predicate(
      std::make_shared<const predicate_internal::AllAnyNode>(false, std::move(children)));
}

Predicate Predicate::Not(Predicate p) {
  return Predicate(std::make_shared<const predicate_internal::NotNode>(std::move(p.node_)));
}

bool Predicate::Matches(const Event& e) const {
  if (node_ == nullptr) return true;
  predicate_internal::EvalContext ctx(e);
  return node_->Evaluate(ctx);
}

absl::Status Predicate::Check(const Event& e) const {
  if (node_ == nullptr) return absl::OkStatus();
  predicate_internal::EvalContext ctx(e);
  std::string why;
  ctx.why = &why;
  if (node_->Evaluate(ctx)) return absl::OkStatus();
  return absl::FailedPreconditionError(why);
}

PredicateStats Predicate::Stats() const {
  return node_ == nullptr ? PredicateStats{} : node_->Stats();
}

std::string Predicate::DebugString() const {
  std::string out;
  predicate_internal::AppendChild(node_, out);
  return out;
}

}  // namespace inferq

#if INFERQ_HAVE_JSON_SCHEMA  // the valijson specializations
// ---------------------------------------------------------------------------------------
// The valijson specializations declared at the top. Each follows valijson 1.0's own
// code for the same visit, with std::regex replaced by RE2 (the schema's compiled
// patterns, through predicate_internal::SchemaRegexSearch).
namespace valijson {

template <>
bool ValidationVisitor<SchemaAdapter>::validateSchema(const Subschema& subschema) {
  if (!inferq::predicate_internal::EnterSchemaLevel()) return false;
  struct Leave {
    ~Leave() { inferq::predicate_internal::LeaveSchemaLevel(); }
  } leave;
  if (subschema.getAlwaysInvalid()) return false;
  Subschema::ApplyFunction fn(
      std::bind(validationCallback, std::placeholders::_1, std::ref(*this)));
  return m_results == nullptr ? subschema.applyStrict(fn) : subschema.apply(fn);
}

template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::FormatConstraint& constraint) {
  // As valijson: "date", "time" and "date-time" are checked, other formats pass. The
  // expressions are valijson's, on RE2. Unlike valijson 1.0, which calls asString()
  // on any value and so throws on a number, a value that is not a string passes: a
  // format applies to strings only (JSON Schema draft 7 §7.1).
  if ((m_strictTypes && !m_target.isString()) || !m_target.maybeString()) return true;
  static const re2::RE2 kDate("([0-9]+)-(0[1-9]|1[012])-(0[1-9]|[12][0-9]|3[01])");
  static const re2::RE2 kTime(
      "([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)(\\.[0-9]+)?"
      "(([Zz])|([\\+|\\-]([01][0-9]|2[0-3]):[0-5][0-9]))");
  static const re2::RE2 kDateTime(
      "([0-9]+)-(0[1-9]|1[012])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):"
      "([0-5][0-9]):([0-5][0-9]|60)(\\.[0-9]+)?"
      "(([Zz])|([\\+|\\-]([01][0-9]|2[0-3]):[0-5][0-9]))");
  const std::string s = m_target.asString();
  const std::string format = constraint.getFormat();
  std::string year;
  int month = 0;
  int day = 0;
  if (format == "date") {
    if (!re2::RE2::FullMatch(s, kDate, &year, &month, &day)) {
      if (m_results) m_results->pushError(m_context, "String should be a valid date");
      return false;
    }
    return validate_date_range(month, day);
  }
  if (format == "time") {
    if (!re2::RE2::FullMatch(s, kTime)) {
      if (m_results) m_results->pushError(m_context, "String should be a valid time");
      return false;
    }
    return true;
  }
  if (format == "date-time") {
    if (!re2::RE2::FullMatch(s, kDateTime, &year, &month, &day)) {
      if (m_results) m_results->pushError(m_context, "String should be a valid date-time");
      return false;
    }
    return validate_date_range(month, day);
  }
  return true;
}

template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::PatternConstraint& constraint) {
  if ((m_strictTypes && !m_target.isString()) || !m_target.maybeString()) return true;
  const std::string pattern = constraint.getPattern<std::string::allocator_type>();
  if (!inferq::predicate_internal::SchemaRegexSearch(pattern, m_target.asString())) {
    if (m_results) {
      m_results->pushError(m_context, "Failed to match regex specified by 'pattern' constraint.");
    }
    return false;
  }
  return true;
}

template <>
bool ValidationVisitor<SchemaAdapter>::visit(const constraints::PropertiesConstraint& constraint) {
  if ((m_strictTypes && !m_target.isObject()) || !m_target.maybeObject()) return true;

  bool validated = true;
  std::set<std::string> propertiesMatched;
  const SchemaAdapter::Object object = m_target.asObject();
  constraint.applyToProperties(ValidatePropertySubschemas(
      object, m_context, true, m_results != nullptr, true, m_strictTypes, m_results,
      &propertiesMatched, &validated, m_regexesCache));
  if (!validated && !m_results) return false;

  // patternProperties, as valijson's ValidatePatternPropertySubschemas with
  // continueOnSuccess = true, continueOnFailure = false, continueIfUnmatched = true.
  constraint.applyToPatternProperties([&](const auto& pattern_property,
                                          const Subschema* subschema) {
    const std::string pattern(pattern_property.c_str());
    for (const SchemaAdapter::ObjectMember m : object) {
      if (!inferq::predicate_internal::SchemaRegexSearch(pattern, m.first)) continue;
      propertiesMatched.insert(m.first);
      std::vector<std::string> newContext = m_context;
      newContext.push_back("[" + m.first + "]");
      ValidationVisitor validator(m.second, newContext, m_strictTypes, m_results, m_regexesCache);
      if (validator.validateSchema(*subschema)) continue;
      if (m_results) {
        m_results->pushError(m_context, "Failed to validate against schema associated with "
                                        "pattern '" + pattern + "'.");
      }
      validated = false;
      return false;
    }
    return true;
  });

  const Subschema* additionalPropertiesSubschema = constraint.getAdditionalPropertiesSubschema();
  if (!additionalPropertiesSubschema) {
    if (propertiesMatched.size() != m_target.getObjectSize()) {
      if (m_results) {
        std::string unwanted;
        for (const SchemaAdapter::ObjectMember m : object) {
          if (propertiesMatched.find(m.first) == propertiesMatched.end()) {
            unwanted = m.first;
            break;
          }
        }
        m_results->pushError(m_context, "Object contains a property that could not be "
                                        "validated using 'properties' or "
                                        "'additionalProperties' constraints: '" + unwanted + "'.");
      }
      return false;
    }
    return validated;
  }

  for (const SchemaAdapter::ObjectMember m : object) {
    if (propertiesMatched.find(m.first) == propertiesMatched.end()) {
      std::vector<std::string> newContext = m_context;
      newContext.push_back("[" + m.first + "]");
      ValidationVisitor validator(m.second, newContext, m_strictTypes, m_results, m_regexesCache);
      if (!validator.validateSchema(*additionalPropertiesSubschema)) {
        if (m_results) {
          m_results->pushError(m_context,
                               "Failed to validate against additional properties schema");
        }
        validated = false;
      }
    }
  }
  return validated;
}

template <>
bool ValidationVisitor<SchemaAdapter>::visit(
    const constraints::PropertyNamesConstraint& constraint) {
  if ((m_strictTypes && !m_target.isObject()) || !m_target.maybeObject()) return true;
  // valijson validates each name through a StdStringAdapter visitor, whose "pattern"
  // would be std::regex; here the name is a JSON string value of this file's type.
  for (const SchemaAdapter::ObjectMember m : m_target.asObject()) {
    const inferq::predicate_internal::JsonValue name(
        rapidjson::StringRef(m.first.data(), m.first.size()));
    ValidationVisitor<SchemaAdapter> validator(SchemaAdapter(name), m_context, m_strictTypes,
                                               nullptr, m_regexesCache);
    if (!validator.validateSchema(*constraint.getSubschema())) return false;
  }
  return true;
}

template <>
const Subschema* SchemaParser::makeOrReuseSchema<SchemaAdapter>(
    Schema& rootSchema, const SchemaAdapter& rootNode, const SchemaAdapter& node,
    const opt::optional<std::string> currentScope, const std::string& nodePath,
    const FunctionPtrs<SchemaAdapter>::FetchDoc fetchDoc, const Subschema* parentSubschema,
    const std::string* ownName, DocumentCache<SchemaAdapter>::Type& docCache,
    SchemaCache& schemaCache, std::vector<std::string>& newCacheKeys) {
  inferq::predicate_internal::EnterParseLevel();
  struct Leave {
    ~Leave() { inferq::predicate_internal::LeaveParseLevel(); }
  } leave;

  // From here on, valijson 1.0's body unchanged.
  std::string jsonRef;
  if (!extractJsonReference(node, jsonRef)) {
    const std::string schemaCacheKey = currentScope ? (*currentScope + nodePath) : nodePath;
    const Subschema* cachedPtr = querySchemaCache(schemaCache, schemaCacheKey);
    const Subschema* subschema = cachedPtr ? cachedPtr : rootSchema.createSubschema();
    updateSchemaCache(schemaCache, newCacheKeys, subschema);
    if (!cachedPtr) {
      populateSchema(rootSchema, rootNode, node, *subschema, currentScope, nodePath, fetchDoc,
                     parentSubschema, ownName, docCache, schemaCache);
    }
    return subschema;
  }

  const opt::optional<std::string> documentUri =
      internal::json_reference::getJsonReferenceUri(jsonRef);
  const std::string actualJsonPointer =
      sanitiseJsonPointer(internal::json_reference::getJsonReferencePointer(jsonRef));
  const opt::optional<std::string> actualDocumentUri =
      resolveDocumentUri(currentScope, documentUri);
  const std::string queryKey =
      actualDocumentUri ? (*actualDocumentUri + actualJsonPointer) : actualJsonPointer;
  const Subschema* cachedPtr = querySchemaCache(schemaCache, queryKey);
  if (cachedPtr) {
    updateSchemaCache(schemaCache, newCacheKeys, cachedPtr);
    return cachedPtr;
  }

  if (actualDocumentUri && (!currentScope || *actualDocumentUri != *currentScope)) {
    const FunctionPtrs<SchemaAdapter>::DocumentType* newDoc = nullptr;
    auto docCacheItr = docCache.find(*actualDocumentUri);
    if (docCacheItr == docCache.end()) {
      if (!fetchDoc) throwRuntimeError("Fetching of remote JSON References not enabled.");
      newDoc = fetchDoc(*actualDocumentUri);
      if (!newDoc) {
        throwRuntimeError("Failed to fetch referenced schema document: " + *actualDocumentUri);
      }
      docCache.insert(DocumentCache<SchemaAdapter>::Type::value_type(*actualDocumentUri, newDoc));
    } else {
      newDoc = docCacheItr->second;
    }
    const SchemaAdapter newRootNode(*newDoc);
    const SchemaAdapter& referencedAdapter =
        internal::json_pointer::resolveJsonPointer(newRootNode, actualJsonPointer);
    newCacheKeys.push_back(queryKey);
    return makeOrReuseSchema(rootSchema, newRootNode, referencedAdapter, currentScope,
                             actualJsonPointer, fetchDoc, parentSubschema, ownName, docCache,
                             schemaCache, newCacheKeys);
  }

  const SchemaAdapter& referencedAdapter =
      internal::json_pointer::resolveJsonPointer(rootNode, actualJsonPointer);
  newCacheKeys.push_back(queryKey);
  return makeOrReuseSchema(rootSchema, rootNode, referencedAdapter, currentScope,
                           actualJsonPointer, fetchDoc, parentSubschema, ownName, docCache,
                           schemaCache, newCacheKeys);
}

template <>
void SchemaParser::resolveThenPopulateSchema<SchemaAdapter>(
    Schema& rootSchema, const SchemaAdapter& rootNode, const SchemaAdapter& node,
    const Subschema& subschema, const opt::optional<std::string> currentScope,
    const std::string& nodePath, const FunctionPtrs<SchemaAdapter>::FetchDoc fetchDoc,
    const Subschema* parentSchema, const std::string* ownName,
    DocumentCache<SchemaAdapter>::Type& docCache, SchemaCache& schemaCache) {
  inferq::predicate_internal::EnterParseLevel();
  struct Leave {
    ~Leave() { inferq::predicate_internal::LeaveParseLevel(); }
  } leave;

  // valijson 1.0's body, but a document already in docCache is not fetched again.
  std::string jsonRef;
  if (!extractJsonReference(node, jsonRef)) {
    populateSchema(rootSchema, rootNode, node, subschema, currentScope, nodePath, fetchDoc,
                   parentSchema, ownName, docCache, schemaCache);
    return;
  }
  const opt::optional<std::string> documentUri =
      internal::json_reference::getJsonReferenceUri(jsonRef);
  const std::string actualJsonPointer =
      sanitiseJsonPointer(internal::json_reference::getJsonReferencePointer(jsonRef));
  if (documentUri &&
      (internal::uri::isUriAbsolute(*documentUri) || internal::uri::isUrn(*documentUri))) {
    const FunctionPtrs<SchemaAdapter>::DocumentType* newDoc = nullptr;
    auto docCacheItr = docCache.find(*documentUri);
    if (docCacheItr == docCache.end()) {
      if (!fetchDoc) throwRuntimeError("Fetching of remote JSON References not enabled.");
      newDoc = fetchDoc(*documentUri);
      if (!newDoc) {
        throwRuntimeError("Failed to fetch referenced schema document: " + *documentUri);
      }
      docCache.insert(DocumentCache<SchemaAdapter>::Type::value_type(*documentUri, newDoc));
    } else {
      newDoc = docCacheItr->second;
    }
    const SchemaAdapter newRootNode(*newDoc);
    const SchemaAdapter& referencedAdapter =
        internal::json_pointer::resolveJsonPointer(newRootNode, actualJsonPointer);
    resolveThenPopulateSchema(rootSchema, newRootNode, referencedAdapter, subschema, {},
                              actualJsonPointer, fetchDoc, parentSchema, ownName, docCache,
                              schemaCache);
  } else {
    const SchemaAdapter& referencedAdapter =
        internal::json_pointer::resolveJsonPointer(rootNode, actualJsonPointer);
    resolveThenPopulateSchema(rootSchema, rootNode, referencedAdapter, subschema, {},
                              actualJsonPointer, fetchDoc, parentSchema, ownName, docCache,
                              schemaCache);
  }
}

}  // namespace valijson
#endif  // INFERQ_HAVE_JSON_SCHEMA
