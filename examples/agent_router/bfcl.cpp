#include "bfcl.hpp"

#include <utility>

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "trace.hpp"

namespace inferq::example {

namespace {

std::string Compact(const rapidjson::Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

std::string Where(const std::string& path, std::size_t line) {
  return "'" + path + "' line " + std::to_string(line);
}

// Calls `fn(document, line number)` for every non-empty line, parsed as JSON.
template <typename F>
absl::Status ForEachJsonLine(const std::string& path, F&& fn) {
  absl::StatusOr<std::string> text = ReadInputFile(path, std::size_t{1} << 30);
  if (!text.ok()) return text.status();
  std::size_t line_no = 0, records = 0;
  std::size_t pos = 0;
  while (pos < text->size()) {
    std::size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    const std::string_view line(text->data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    rapidjson::Document doc;
    doc.Parse(line.data(), line.size());  // one value per line: trailing text is an error
    if (doc.HasParseError()) {
      return absl::InvalidArgumentError(Where(path, line_no) + " is not JSON: " +
                                        rapidjson::GetParseError_En(doc.GetParseError()) +
                                        " at column " + std::to_string(doc.GetErrorOffset() + 1));
    }
    if (!doc.IsObject()) {
      return absl::InvalidArgumentError(Where(path, line_no) + " is not a JSON object");
    }
    if (absl::Status s = fn(doc, line_no); !s.ok()) return s;
    ++records;
  }
  if (records == 0) return absl::InvalidArgumentError("'" + path + "' is empty (no JSON lines)");
  return absl::OkStatus();
}

absl::StatusOr<std::string> StringField(const rapidjson::Value& obj, const char* field,
                                        const std::string& where) {
  auto it = obj.FindMember(field);
  if (it == obj.MemberEnd() || !it->value.IsString()) {
    return absl::InvalidArgumentError(where + ": field '" + field + "' is missing or not a string");
  }
  return std::string(it->value.GetString(), it->value.GetStringLength());
}


// The schema node `v` converted in place (see BfclToJsonSchema); `at` is its JSON
// Pointer in the definition, for errors.
absl::Status Convert(rapidjson::Value& v, rapidjson::Document::AllocatorType& a,
                     const std::string& at) {
  if (!v.IsObject()) {
    return absl::InvalidArgumentError("schema node at '" + at + "' is not an object");
  }
  v.RemoveMember("default");
  v.RemoveMember("description");
  if (auto t = v.FindMember("type"); t != v.MemberEnd()) {
    if (!t->value.IsString()) {
      return absl::InvalidArgumentError("\"type\" at '" + at + "' is not a string");
    }
    const std::string_view type(t->value.GetString(), t->value.GetStringLength());
    if (type == "dict") {
      t->value.SetString("object", a);
    } else if (type == "float") {
      t->value.SetString("number", a);
    } else if (type == "tuple") {
      t->value.SetString("array", a);
    } else if (type == "any") {
      v.RemoveMember("type");
    } else if (type != "string" && type != "integer" && type != "boolean" && type != "array" &&
               type != "object" && type != "number" && type != "null") {
      return absl::InvalidArgumentError("unknown BFCL type '" + std::string(type) + "' at '" + at +
                                        "'");
    }
  }
  if (auto p = v.FindMember("properties"); p != v.MemberEnd()) {
    if (!p->value.IsObject()) {
      return absl::InvalidArgumentError("\"properties\" at '" + at + "' is not an object");
    }
    for (auto& m : p->value.GetObject()) {
      const std::string name(m.name.GetString(), m.name.GetStringLength());
      if (absl::Status s = Convert(m.value, a, at + "/properties/" + PointerToken(name)); !s.ok()) {
        return s;
      }
    }
  }
  if (auto i = v.FindMember("items"); i != v.MemberEnd() && i->value.IsObject()) {
    if (absl::Status s = Convert(i->value, a, at + "/items"); !s.ok()) return s;
  }
  if (auto ap = v.FindMember("additionalProperties"); ap != v.MemberEnd() && ap->value.IsObject()) {
    if (absl::Status s = Convert(ap->value, a, at + "/additionalProperties"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The first acceptable values of the map `acceptable` (argument -> list), into `out`.
// `nested`: inside a chosen dict value, where BFCL also writes plain values (e.g.
// {"lateral": 10.5}): a value that is not a list is then taken as it is.
absl::Status Resolve(const rapidjson::Value& acceptable, rapidjson::Value& out,
                     rapidjson::Document::AllocatorType& a, const std::string& at, bool nested) {
  if (!acceptable.IsObject()) {
    return absl::InvalidArgumentError("arguments at '" + at + "' are not an object");
  }
  out.SetObject();
  for (const auto& m : acceptable.GetObject()) {
    const std::string name(m.name.GetString(), m.name.GetStringLength());
    if (!m.value.IsArray() && nested) {
      rapidjson::Value key(name.data(), static_cast<rapidjson::SizeType>(name.size()), a);
      rapidjson::Value literal;
      literal.CopyFrom(m.value, a);
      out.AddMember(key, literal, a);
      continue;
    }
    if (!m.value.IsArray()) {
      return absl::InvalidArgumentError("acceptable values of '" + at + "/" + name +
                                        "' are not a list");
    }
    // "" (and null) mark an argument that may be left out: not values to send.
    const rapidjson::Value* chosen_value = nullptr;
    for (const auto& v : m.value.GetArray()) {
      if (v.IsNull() || (v.IsString() && v.GetStringLength() == 0)) continue;
      chosen_value = &v;
      break;
    }
    if (chosen_value == nullptr) continue;  // only "" / null: left out
    const rapidjson::Value& first = *chosen_value;
    rapidjson::Value key(name.data(), static_cast<rapidjson::SizeType>(name.size()), a);
    rapidjson::Value chosen;
    if (first.IsObject()) {
      if (absl::Status s = Resolve(first, chosen, a, at + "/" + name, true); !s.ok()) return s;
    } else if (first.IsArray()) {
      // An array of dicts holds a map of acceptable values per element.
      chosen.SetArray();
      std::size_t n = 0;
      for (const auto& e : first.GetArray()) {
        rapidjson::Value item;
        if (e.IsObject()) {
          const std::string where = at + "/" + name + "/" + std::to_string(n);
          if (absl::Status s = Resolve(e, item, a, where, true); !s.ok()) return s;
        } else {
          item.CopyFrom(e, a);
        }
        chosen.PushBack(item, a);
        ++n;
      }
    } else {
      chosen.CopyFrom(first, a);
    }
    out.AddMember(key, chosen, a);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<BfclRequest>> LoadBfclRequests(const std::string& path) {
  std::vector<BfclRequest> out;
  absl::Status s = ForEachJsonLine(path, [&](const rapidjson::Document& doc, std::size_t line) {
    const std::string where = Where(path, line);
    BfclRequest r;
    absl::StatusOr<std::string> id = StringField(doc, "id", where);
    if (!id.ok()) return id.status();
    r.id = *std::move(id);
    auto fns = doc.FindMember("function");
    if (fns == doc.MemberEnd() || !fns->value.IsArray()) {
      return absl::InvalidArgumentError(where + ": field 'function' is missing or not a list");
    }
    for (const auto& f : fns->value.GetArray()) {
      if (!f.IsObject()) return absl::InvalidArgumentError(where + ": a function is not an object");
      absl::StatusOr<std::string> name = StringField(f, "name", where);
      if (!name.ok()) return name.status();
      auto params = f.FindMember("parameters");
      if (params == f.MemberEnd() || !params->value.IsObject()) {
        return absl::InvalidArgumentError(where + ": function '" + *name +
                                          "' has no 'parameters' object");
      }
      r.functions.push_back({*std::move(name), Compact(params->value)});
    }
    out.push_back(std::move(r));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<BfclAnswer>> LoadBfclAnswers(const std::string& path) {
  std::vector<BfclAnswer> out;
  absl::Status s = ForEachJsonLine(path, [&](const rapidjson::Document& doc, std::size_t line) {
    const std::string where = Where(path, line);
    BfclAnswer a;
    absl::StatusOr<std::string> id = StringField(doc, "id", where);
    if (!id.ok()) return id.status();
    a.id = *std::move(id);
    auto gt = doc.FindMember("ground_truth");
    if (gt == doc.MemberEnd() || !gt->value.IsArray()) {
      return absl::InvalidArgumentError(where + ": field 'ground_truth' is missing or not a list");
    }
    for (const auto& call : gt->value.GetArray()) {
      if (!call.IsObject()) {
        return absl::InvalidArgumentError(where + ": a ground-truth call is not an object");
      }
      for (const auto& m : call.GetObject()) {  // one function per entry, in BFCL's files
        if (!m.value.IsObject()) {
          return absl::InvalidArgumentError(where + ": arguments of '" + m.name.GetString() +
                                            "' are not an object");
        }
        a.calls.push_back({std::string(m.name.GetString(), m.name.GetStringLength()),
                           Compact(m.value)});
      }
    }
    out.push_back(std::move(a));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> BfclToJsonSchema(std::string_view bfcl_parameters) {
  rapidjson::Document doc;
  doc.Parse(bfcl_parameters.data(), bfcl_parameters.size());
  if (doc.HasParseError()) {
    return absl::InvalidArgumentError(std::string("parameter definition is not JSON: ") +
                                      rapidjson::GetParseError_En(doc.GetParseError()));
  }
  if (absl::Status s = Convert(doc, doc.GetAllocator(), ""); !s.ok()) return s;
  return Compact(doc);
}

absl::StatusOr<std::string> FirstAcceptableArguments(std::string_view acceptable) {
  rapidjson::Document doc;
  doc.Parse(acceptable.data(), acceptable.size());
  if (doc.HasParseError()) {
    return absl::InvalidArgumentError(std::string("arguments are not JSON: ") +
                                      rapidjson::GetParseError_En(doc.GetParseError()));
  }
  rapidjson::Document out;
  if (absl::Status s = Resolve(doc, out, out.GetAllocator(), "", false); !s.ok()) return s;
  return Compact(out);
}

std::string PointerToken(std::string_view t) {
  std::string out;
  for (char c : t) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string ToolSubject(std::string_view name) {
  std::string out = "agent.tool";
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = name.find('.', start);
    std::string token(name.substr(start, dot == std::string_view::npos ? std::string_view::npos
                                                                        : dot - start));
    for (char& c : token) {
      const auto u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u == 0x7f) c = '_';
    }
    if (token.empty()) token = "_";
    if (token == "*") token = "_star_";
    if (token == ">") token = "_gt_";
    out += '.';
    out += token;
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return out;
}

std::string ToolFamily(std::string_view name) {
  std::string family(name.substr(0, name.find_first_of("._")));
  if (family.empty()) family = "tool";
  if (family.size() > 48) family.resize(48);
  for (char& c : family) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) c = '-';
  }
  return family;
}

}  // namespace inferq::example
