#include "inferq/schema/record.hpp"

#include <algorithm>
#include <cstdio>

namespace inferq {

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kNull: return true;
    case Value::Kind::kBool: return a.as_bool() == b.as_bool();
    case Value::Kind::kInt: return a.as_int() == b.as_int();
    case Value::Kind::kUint: return a.as_uint() == b.as_uint();
    case Value::Kind::kFloat: return a.as_float() == b.as_float();
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kVector: return a.as_vector() == b.as_vector();
    case Value::Kind::kRecord: return a.as_record() == b.as_record();
  }
  return false;
}

namespace {

void AppendQuoted(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void AppendValue(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNull: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kUint: out += std::to_string(v.as_uint()); return;
    case Value::Kind::kFloat: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.9g", v.as_float());
      out += buf;
      return;
    }
    case Value::Kind::kString: AppendQuoted(out, v.as_string()); return;
    case Value::Kind::kVector: {
      out += '[';
      bool first = true;
      for (const Value& e : v.as_vector()) {
        if (!first) out += ", ";
        first = false;
        AppendValue(out, e);
      }
      out += ']';
      return;
    }
    case Value::Kind::kRecord: out += v.as_record().DebugString(); return;
  }
}

}  // namespace

std::string Value::DebugString() const {
  std::string out;
  AppendValue(out, *this);
  return out;
}

std::string_view FieldOriginName(FieldOrigin origin) {
  switch (origin) {
    case FieldOrigin::kWritten: return "written";
    case FieldOrigin::kAbsent: return "absent";
    case FieldOrigin::kNotInWriter: return "not_in_writer";
  }
  return "unknown";
}

const RecordField* Record::Find(std::string_view name) const {
  for (const RecordField& f : fields_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::size_t Record::defaulted() const {
  return static_cast<std::size_t>(std::count_if(
      fields_.begin(), fields_.end(),
      [](const RecordField& f) { return f.origin != FieldOrigin::kWritten; }));
}

bool operator==(const Record& a, const Record& b) {
  if (a.type_name_ != b.type_name_ || a.skipped_ != b.skipped_ ||
      a.fields_.size() != b.fields_.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.fields_.size(); ++i) {
    const RecordField& x = a.fields_[i];
    const RecordField& y = b.fields_[i];
    if (x.name != y.name || x.origin != y.origin || !(x.value == y.value)) return false;
  }
  return true;
}

std::string Record::DebugString() const {
  std::string out = "{";
  bool first = true;
  for (const RecordField& f : fields_) {
    if (!first) out += ", ";
    first = false;
    out += f.name;
    out += ": ";
    AppendValue(out, f.value);
  }
  out += '}';
  return out;
}

}  // namespace inferq
