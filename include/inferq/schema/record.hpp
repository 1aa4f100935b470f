/// @file inferq/schema/record.hpp
///
/// Record and Value: a FlatBuffers table (or struct) as a schema-on-read consumer sees
/// it — the fields of the version it reads, by name, with typed values.
/// SchemaReader (schema_reader.hpp) produces them; think of an Avro
/// GenericRecord, resolved against the reader's schema.
///
/// Usage:
/// @code
///   absl::StatusOr<inferq::Record> r = reader.Read(event);
///   const inferq::RecordField* f = r->Find("max_tokens");
///   if (f != nullptr && f->value.kind() == inferq::Value::Kind::kInt) use(f->value.as_int());
///   if (f->origin == inferq::FieldOrigin::kNotInWriter) ...  // an older writer: the default
/// @endcode
///
/// Value kinds: bool -> kBool; byte, short, int, long -> kInt (int64); ubyte, ushort,
/// uint, ulong -> kUint (uint64); float, double -> kFloat (double); an enum -> its
/// underlying integer kind; string -> kString; a vector -> kVector (elements of one
/// kind); a table or struct -> kRecord; a table, string or vector the buffer does not
/// hold, and an optional scalar (`= null`) it does not hold -> kNull.
///
/// Thread safety: plain immutable-after-construction values; many threads may read
/// one at once. Nested records are shared (not copied) between copies of a Value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace inferq {

class Record;

/// A typed value of a Record's field (see the file comment for the kinds).
class Value {
 public:
  /// What a Value holds; which FlatBuffers types give which kind: see the file comment.
  enum class Kind : std::uint8_t { kNull, kBool, kInt, kUint, kFloat, kString, kVector, kRecord };

  Value() = default;  ///< kNull
  /// A Value of kind kBool, kInt, kUint, kFloat, kString, kVector or (Table) kRecord
  /// holding `v` (or `r`).
  ///@{
  static Value Bool(bool v) { return Value(Storage(std::in_place_index<1>, v)); }
  static Value Int(std::int64_t v) { return Value(Storage(std::in_place_index<2>, v)); }
  static Value Uint(std::uint64_t v) { return Value(Storage(std::in_place_index<3>, v)); }
  static Value Float(double v) { return Value(Storage(std::in_place_index<4>, v)); }
  static Value String(std::string v) { return Value(Storage(std::in_place_index<5>, std::move(v))); }
  static Value Vector(std::vector<Value> v) {
    return Value(Storage(std::in_place_index<6>, std::move(v)));
  }
  static Value Table(Record r);
  ///@}

  /// What the Value holds.
  Kind kind() const { return static_cast<Kind>(v_.index()); }
  /// True for kind() kNull.
  bool is_null() const { return kind() == Kind::kNull; }
  /// The content, for kind() kBool, kInt, kUint, kFloat, kString, kVector and kRecord.
  /// Each throws std::bad_variant_access when kind() is another one.
  ///@{
  bool as_bool() const { return std::get<1>(v_); }
  std::int64_t as_int() const { return std::get<2>(v_); }
  std::uint64_t as_uint() const { return std::get<3>(v_); }
  double as_float() const { return std::get<4>(v_); }
  const std::string& as_string() const { return std::get<5>(v_); }
  const std::vector<Value>& as_vector() const { return std::get<6>(v_); }
  const Record& as_record() const { return *std::get<7>(v_); }
  ///@}

  /// Same kind and equal content (records compared field by field, deeply).
  friend bool operator==(const Value& a, const Value& b);
  /// JSON-like text: 1, -2, 0.5, true, "text", [1, 2], {a: 1, b: "x"}, null.
  std::string DebugString() const;

 private:
  using Storage = std::variant<std::monostate, bool, std::int64_t, std::uint64_t, double,
                               std::string, std::vector<Value>, std::shared_ptr<const Record>>;
  /// Kind's enumerators are the alternatives' indexes, in this order.
  static_assert(std::variant_size_v<Storage> == static_cast<std::size_t>(Kind::kRecord) + 1);
  explicit Value(Storage v) : v_(std::move(v)) {}
  Storage v_;
};

/// Where a field's value came from.
enum class FieldOrigin : std::uint8_t {
  kWritten,      ///< the buffer holds it
  kAbsent,       ///< the writer's version has the field but the buffer does not hold it
                 ///< (FlatBuffers omits a scalar equal to its default): the reader's
                 ///< default for a scalar, null otherwise
  kNotInWriter,  ///< the writer's version lacks the field or deprecated it (an older or
                 ///< newer writer): the reader's default for a scalar, null otherwise
};
std::string_view FieldOriginName(FieldOrigin origin);  ///< "written", "absent", "not_in_writer"

/// One field of a Record: its name, its value and where the value came from.
struct RecordField {
  std::string name;  ///< the reader's name (a renamed field reads under its new name)
  Value value;       ///< the value (FieldOrigin says whether the buffer held it)
  FieldOrigin origin = FieldOrigin::kWritten;  ///< where the value came from
};

/// A FlatBuffers table or struct as the reader's version sees it: its fields by name
/// (see the file comment).
class Record {
 public:
  Record() = default;
  /// A record of table or struct `type_name` with `fields`, and the names of the
  /// writer's fields it `skipped` (as SchemaReader builds it).
  Record(std::string type_name, std::vector<RecordField> fields, std::vector<std::string> skipped)
      : type_name_(std::move(type_name)), fields_(std::move(fields)), skipped_(std::move(skipped)) {}

  /// Fully qualified table or struct name in the reader's schema ("t.read.Request").
  const std::string& type_name() const { return type_name_; }
  /// The reader's fields in field-id order; its deprecated fields are left out.
  const std::vector<RecordField>& fields() const { return fields_; }
  /// The field named `name`, or nullptr when the reader's version has no such field.
  const RecordField* Find(std::string_view name) const;
  /// Writer fields the buffer holds that the reader's version does not read (it lacks
  /// or deprecated them): skipped, by the writer's names, in id order.
  const std::vector<std::string>& skipped() const { return skipped_; }
  /// Fields (of this table, not of nested ones) whose origin is not kWritten.
  std::size_t defaulted() const;

  /// Same type name, skipped fields, and fields (name, origin and value, deeply).
  friend bool operator==(const Record& a, const Record& b);
  /// {name: value, ...} in id order.
  std::string DebugString() const;

 private:
  std::string type_name_;
  std::vector<RecordField> fields_;
  std::vector<std::string> skipped_;
};

inline Value Value::Table(Record r) {
  return Value(Storage(std::in_place_index<7>, std::make_shared<const Record>(std::move(r))));
}

}  // namespace inferq
