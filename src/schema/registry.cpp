#include "inferq/schema/registry.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <flatbuffers/idl.h>

#include "inferq/base/error.hpp"

namespace inferq {
namespace {

using ParserPtr = std::unique_ptr<flatbuffers::Parser>;

constexpr std::string_view kKeyPrefix = kSchemaStoreKeyPrefix;
constexpr std::string_view kMetaToken = "meta";

bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// True when the first token of `text` (after white space and comments) is `include`.
// FlatBuffers reads include statements only at the start of a schema, before any
// declaration, mixed with native_include statements (which name a header for code
// generation and read nothing), after an optional UTF-8 byte order mark
// (flatbuffers::Parser::DoParse). So the registry looks at exactly those
// statements and refuses an include among them: registering a schema never reads a
// file.
bool StartsWithInclude(std::string_view text) {
  std::size_t i = 0;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") i = 3;  // the byte order mark
  auto skip_space_and_comments = [&] {
    while (i < text.size()) {
      const char c = text[i];
      if (std::isspace(static_cast<unsigned char>(c)) != 0) {
        ++i;
      } else if (text.substr(i, 2) == "//") {
        const std::size_t nl = text.find('\n', i);
        i = nl == std::string_view::npos ? text.size() : nl + 1;
      } else if (text.substr(i, 2) == "/*") {
        const std::size_t end = text.find("*/", i + 2);
        i = end == std::string_view::npos ? text.size() : end + 2;
      } else {
        return;
      }
    }
  };
  auto word = [&](std::string_view w) {
    return text.substr(i, w.size()) == w &&
           (i + w.size() == text.size() || !IsIdentChar(text[i + w.size()]));
  };
  for (;;) {
    skip_space_and_comments();
    if (word("include")) return true;
    if (!word("native_include")) return false;
    // native_include "<header>"; : past the string (which may hold ';') and the ';'.
    i += std::string_view("native_include").size();
    skip_space_and_comments();
    if (i >= text.size() || (text[i] != '"' && text[i] != '\'')) return false;  // a parse error
    const char quote = text[i++];
    while (i < text.size() && text[i] != quote) i += text[i] == '\\' ? 2 : 1;
    ++i;
    skip_space_and_comments();
    if (i >= text.size() || text[i] != ';') return false;
    ++i;
  }
}

// Parses one schema text; `what` names it in the error ("old schema", "subject 'x'").
absl::StatusOr<ParserPtr> ParseSchema(std::string_view text, const std::string& what) {
  // The parser reads a NUL-terminated string: text after a NUL would be stored but
  // never checked.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return absl::InvalidArgumentError(what + " is not schema text: it has a NUL byte at offset " +
                                      std::to_string(nul));
  }
  if (StartsWithInclude(text)) {
    return absl::InvalidArgumentError(
        what + ": include statements are not supported (register a self-contained schema)");
  }
  auto parser = std::make_unique<flatbuffers::Parser>();
  const std::string source(text);  // Parse reads a NUL-terminated string
  if (!parser->Parse(source.c_str())) {
    std::string error = parser->error_;
    while (!error.empty() && (error.back() == '\n' || error.back() == ' ')) error.pop_back();
    return absl::InvalidArgumentError(what + " does not parse: " + error);
  }
  return parser;
}

// The reflection::Schema of a parsed schema: what `flatc -b --schema` writes (flatc
// also calls Parser::Serialize; tests/schema compares the bytes).
std::string BinarySchema(flatbuffers::Parser& parser) {
  parser.Serialize();
  return std::string(reinterpret_cast<const char*>(parser.builder_.GetBufferPointer()),
                     parser.builder_.GetSize());
}

bool ChecksBackward(Compatibility m) {
  return m == Compatibility::kBackward || m == Compatibility::kFull ||
         m == Compatibility::kBackwardTransitive || m == Compatibility::kFullTransitive;
}
bool ChecksForward(Compatibility m) {
  return m == Compatibility::kForward || m == Compatibility::kFull ||
         m == Compatibility::kForwardTransitive || m == Compatibility::kFullTransitive;
}
bool IsTransitive(Compatibility m) {
  return m == Compatibility::kBackwardTransitive || m == Compatibility::kForwardTransitive ||
         m == Compatibility::kFullTransitive;
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

template <class Int>
bool ParseInt(std::string_view s, Int& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string VersionKey(std::string_view subject, std::uint32_t version) {
  return std::string(kKeyPrefix) + std::string(subject) + "." + std::to_string(version);
}
std::string MetaKey(std::string_view subject) {
  return std::string(kKeyPrefix) + std::string(subject) + "." + std::string(kMetaToken);
}
std::string MetaValue(Compatibility mode, std::uint32_t latest) {
  return "mode=" + std::string(CompatibilityName(mode)) + "\nlatest=" + std::to_string(latest);
}

// OK for a subject of 1 to kMaxSchemaSubjectBytes bytes. A longer one is named by its
// first 64 bytes at most, cut before a UTF-8 continuation byte so that the quoted
// start is not half a character.
absl::Status ValidateSubject(std::string_view subject) {
  if (subject.empty()) return absl::InvalidArgumentError("schema subject is empty");
  if (subject.size() <= kMaxSchemaSubjectBytes) return absl::OkStatus();
  std::size_t cut = 64;
  while (cut > 0 && (static_cast<unsigned char>(subject[cut]) & 0xC0) == 0x80) --cut;
  return absl::InvalidArgumentError(
      "schema subject starting " + QuoteValue(subject.substr(0, cut)) + " has " +
      std::to_string(subject.size()) + " bytes; subjects have 1 to " +
      std::to_string(kMaxSchemaSubjectBytes) + " bytes");
}

}  // namespace

std::string_view CompatibilityName(Compatibility mode) {
  switch (mode) {
    case Compatibility::kNone: return "none";
    case Compatibility::kBackward: return "backward";
    case Compatibility::kForward: return "forward";
    case Compatibility::kFull: return "full";
    case Compatibility::kBackwardTransitive: return "backward_transitive";
    case Compatibility::kForwardTransitive: return "forward_transitive";
    case Compatibility::kFullTransitive: return "full_transitive";
  }
  return "unknown";
}

absl::StatusOr<Compatibility> ParseCompatibility(std::string_view name) {
  for (Compatibility m : {Compatibility::kNone, Compatibility::kBackward, Compatibility::kForward,
                          Compatibility::kFull, Compatibility::kBackwardTransitive,
                          Compatibility::kForwardTransitive, Compatibility::kFullTransitive}) {
    if (CompatibilityName(m) == name) return m;
  }
  return absl::InvalidArgumentError(
      "compatibility mode '" + std::string(name) +
      "' is not one of none, backward, forward, full, backward_transitive, "
      "forward_transitive, full_transitive");
}

namespace {

// `candidate.ConformTo(base)`, after a check ConformTo does not make: when both
// declare a root_type, it must be the same, by fully qualified name. ConformTo pairs tables by that name,
// so a renamed namespace or a new root table pairs nothing and passes, while a
// reader of one version would read the other's fields by the wrong types.
std::string Conform(flatbuffers::Parser& candidate, flatbuffers::Parser& base) {
  const flatbuffers::StructDef* a = base.root_struct_def_;
  const flatbuffers::StructDef* b = candidate.root_struct_def_;
  auto qualified = [](const flatbuffers::StructDef* d) {
    return d->defined_namespace != nullptr ? d->defined_namespace->GetFullyQualifiedName(d->name)
                                           : d->name;
  };
  if (a != nullptr && b != nullptr && qualified(a) != qualified(b)) {
    return "root_type changed from '" + qualified(a) + "' to '" + qualified(b) +
           "' (a renamed table or namespace is a new type to FlatBuffers)";
  }
  return candidate.ConformTo(base);
}

}  // namespace

absl::Status CheckCompatibility(std::string_view old_fbs, std::string_view new_fbs,
                                Compatibility mode) {
  absl::StatusOr<ParserPtr> old_parser = ParseSchema(old_fbs, "old schema");
  if (!old_parser.ok()) return old_parser.status();
  absl::StatusOr<ParserPtr> new_parser = ParseSchema(new_fbs, "new schema");
  if (!new_parser.ok()) return new_parser.status();
  if (ChecksBackward(mode)) {
    const std::string err = Conform(**new_parser, **old_parser);
    if (!err.empty()) {
      return absl::FailedPreconditionError(
          "schemas don't conform under " + Upper(CompatibilityName(mode)) +
          " (the new schema must conform to the old one): " + err);
    }
  }
  if (ChecksForward(mode)) {
    const std::string err = Conform(**old_parser, **new_parser);
    if (!err.empty()) {
      return absl::FailedPreconditionError(
          "schemas don't conform under " + Upper(CompatibilityName(mode)) +
          " (the old schema must conform to the new one): " + err);
    }
  }
  return absl::OkStatus();
}

class SchemaRegistry::Impl {
 public:
  struct Version {
    SchemaRef ref;
    std::string text;
    ParserPtr parser;  // ConformTo is a non-const member: used under mu_ only
    std::string bfbs;  // BinarySchema(*parser)
  };
  struct Subject {
    Compatibility mode = kDefaultCompatibility;
    std::vector<Version> versions;
  };

  explicit Impl(std::unique_ptr<SchemaStore> store) : store_(std::move(store)) {}

  absl::StatusOr<SchemaRef> Register(std::string_view subject, std::string_view text) {
    if (absl::Status valid = ValidateSubject(subject); !valid.ok()) return valid;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subjects_.find(subject);
    if (it != subjects_.end()) {
      for (const Version& v : it->second.versions) {
        if (v.text == text) return v.ref;
      }
    }
    const std::string name = "subject '" + std::string(subject) + "'";
    absl::StatusOr<ParserPtr> parser = ParseSchema(text, name + " schema");
    if (!parser.ok()) return parser.status();

    const Compatibility mode = it == subjects_.end() ? kDefaultCompatibility : it->second.mode;
    const auto next_version = static_cast<std::uint32_t>(
        it == subjects_.end() ? 1 : it->second.versions.size() + 1);
    if (it != subjects_.end() && mode != Compatibility::kNone &&
        !it->second.versions.empty()) {
      std::vector<Version>& versions = it->second.versions;
      // Newest first, so the error names the nearest version that breaks.
      const std::size_t oldest = IsTransitive(mode) ? 0 : versions.size() - 1;
      for (std::size_t i = versions.size(); i-- > oldest;) {
        Version& prev = versions[i];
        if (ChecksBackward(mode)) {
          const std::string err = Conform(**parser, *prev.parser);
          if (!err.empty()) {
            return absl::FailedPreconditionError(
                name + ": new version " + std::to_string(next_version) +
                " is not " + Upper(CompatibilityName(mode)) + " compatible with version " +
                std::to_string(prev.ref.version) + " (it must conform to version " +
                std::to_string(prev.ref.version) + "): " + err);
          }
        }
        if (ChecksForward(mode)) {
          const std::string err = Conform(*prev.parser, **parser);
          if (!err.empty()) {
            return absl::FailedPreconditionError(
                name + ": new version " + std::to_string(next_version) +
                " is not " + Upper(CompatibilityName(mode)) + " compatible with version " +
                std::to_string(prev.ref.version) + " (version " +
                std::to_string(prev.ref.version) + " must conform to it): " + err);
          }
        }
      }
    }

    auto id_it = ids_by_text_.find(text);
    const std::uint64_t id = id_it != ids_by_text_.end() ? id_it->second : next_id_;
    const SchemaRef ref{id, next_version};
    if (store_ != nullptr) {
      absl::Status written = store_->Write(
          {{VersionKey(subject, next_version), std::to_string(id) + "\n" + std::string(text)},
           {MetaKey(subject), MetaValue(mode, next_version)}});
      if (!written.ok()) return written;
    }
    if (id == next_id_) ++next_id_;
    ids_by_text_.emplace(std::string(text), id);
    Subject& s = it != subjects_.end() ? it->second : subjects_[std::string(subject)];
    std::string bfbs = BinarySchema(**parser);
    s.versions.push_back(Version{ref, std::string(text), std::move(*parser), std::move(bfbs)});
    return ref;
  }

  absl::Status SetCompatibility(std::string_view subject, Compatibility mode) {
    if (absl::Status valid = ValidateSubject(subject); !valid.ok()) return valid;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subjects_.find(subject);
    const auto latest =
        static_cast<std::uint32_t>(it == subjects_.end() ? 0 : it->second.versions.size());
    if (store_ != nullptr) {
      absl::Status written = store_->Write({{MetaKey(subject), MetaValue(mode, latest)}});
      if (!written.ok()) return written;
    }
    if (it == subjects_.end()) it = subjects_.emplace(std::string(subject), Subject{}).first;
    it->second.mode = mode;
    return absl::OkStatus();
  }

  Compatibility GetCompatibility(std::string_view subject) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subjects_.find(subject);
    return it == subjects_.end() ? kDefaultCompatibility : it->second.mode;
  }

  absl::StatusOr<RegisteredSchema> Get(std::string_view subject, std::uint32_t version,
                                       bool latest) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = subjects_.find(subject);
    if (it == subjects_.end() || it->second.versions.empty()) {
      return absl::NotFoundError("schema subject '" + std::string(subject) +
                                 "' has no versions");
    }
    const std::vector<Version>& versions = it->second.versions;
    if (latest) version = static_cast<std::uint32_t>(versions.size());
    if (version == 0 || version > versions.size()) {
      return absl::NotFoundError("schema subject '" + std::string(subject) + "' has no version " +
                                 std::to_string(version) + " (it has 1.." +
                                 std::to_string(versions.size()) + ")");
    }
    const Version& v = versions[version - 1];
    return RegisteredSchema{std::string(subject), v.ref, v.text, v.bfbs};
  }

  std::vector<std::uint32_t> Versions(std::string_view subject) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::uint32_t> out;
    auto it = subjects_.find(subject);
    if (it != subjects_.end()) {
      for (const Version& v : it->second.versions) out.push_back(v.ref.version);
    }
    return out;
  }

  std::vector<std::string> Subjects() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& entry : subjects_) {
      if (!entry.second.versions.empty()) out.push_back(entry.first);
    }
    return out;  // std::map: already sorted
  }

  // Rebuilds from the store's `schema.` records (called before the registry is shared).
  absl::Status Load() {
    std::map<std::string, std::string> kv;
    absl::Status read = store_->ReadAll([&kv](std::string_view k, std::string_view v) {
      kv.insert_or_assign(std::string(k), std::string(v));
    });
    if (!read.ok()) return read;
    struct Loaded {
      bool has_meta = false;
      Compatibility mode = kDefaultCompatibility;
      std::uint32_t latest = 0;
      std::map<std::uint32_t, std::pair<std::string, std::string>> versions;  // -> key, value
    };
    std::map<std::string, Loaded, std::less<>> loaded;
    for (const auto& entry : kv) {
      const std::string& key = entry.first;
      const std::string& value = entry.second;
      if (std::string_view(key).substr(0, kKeyPrefix.size()) != kKeyPrefix) {
        return absl::DataLossError("schema registry key " + QuoteValue(key) +
                                   " does not start with '" + std::string(kKeyPrefix) + "'");
      }
      const std::string_view rest = std::string_view(key).substr(kKeyPrefix.size());
      const std::size_t dot = rest.rfind('.');
      if (dot == std::string_view::npos || dot == 0) {
        return absl::DataLossError("schema registry key '" + key + "' is malformed");
      }
      const std::string subject(rest.substr(0, dot));
      const std::string_view token = rest.substr(dot + 1);
      Loaded& l = loaded[subject];
      if (token == kMetaToken) {
        const std::size_t nl = value.find('\n');
        std::string_view v(value);
        if (nl == std::string::npos || v.substr(0, 5) != "mode=" ||
            v.substr(nl + 1, 7) != "latest=" || !ParseInt(v.substr(nl + 8), l.latest)) {
          return absl::DataLossError("schema registry key '" + key + "' holds malformed metadata");
        }
        absl::StatusOr<Compatibility> mode = ParseCompatibility(v.substr(5, nl - 5));
        if (!mode.ok()) {
          return absl::DataLossError("schema registry key '" + key +
                                     "': " + std::string(mode.status().message()));
        }
        l.mode = *mode;
        l.has_meta = true;
      } else {
        std::uint32_t version = 0;
        if (!ParseInt(token, version) || version == 0) {
          return absl::DataLossError("schema registry key '" + key + "' is malformed");
        }
        l.versions.emplace(version, std::make_pair(key, value));
      }
    }
    for (auto& entry : loaded) {
      const std::string& subject = entry.first;
      Loaded& l = entry.second;
      if (!l.has_meta) {
        return absl::DataLossError("schema registry subject '" + subject + "' has no key '" +
                                   MetaKey(subject) + "'");
      }
      if (l.versions.size() != l.latest ||
          (!l.versions.empty() && l.versions.rbegin()->first != l.latest)) {
        return absl::DataLossError("schema registry subject '" + subject + "' records latest " +
                                   std::to_string(l.latest) + " but holds " +
                                   std::to_string(l.versions.size()) +
                                   " version keys (versions must be 1..latest)");
      }
      Subject s;
      s.mode = l.mode;
      for (auto& v : l.versions) {
        const std::string& key = v.second.first;
        const std::string& value = v.second.second;
        const std::size_t nl = value.find('\n');
        std::uint64_t id = 0;
        if (nl == std::string::npos || !ParseInt(std::string_view(value).substr(0, nl), id) ||
            id == 0) {
          return absl::DataLossError("schema registry key '" + key + "' has no schema id");
        }
        std::string text = value.substr(nl + 1);
        absl::StatusOr<ParserPtr> parser = ParseSchema(text, "schema registry key '" + key + "'");
        if (!parser.ok()) return absl::DataLossError(std::string(parser.status().message()));
        ids_by_text_.emplace(text, id);
        next_id_ = std::max(next_id_, id + 1);
        std::string bfbs = BinarySchema(**parser);
        s.versions.push_back(
            Version{SchemaRef{id, v.first}, std::move(text), std::move(*parser), std::move(bfbs)});
      }
      subjects_.emplace(subject, std::move(s));
    }
    return absl::OkStatus();
  }

 private:
  mutable std::mutex mu_;
  std::unique_ptr<SchemaStore> store_;  // null: in memory only
  std::map<std::string, Subject, std::less<>> subjects_;
  std::map<std::string, std::uint64_t, std::less<>> ids_by_text_;
  std::uint64_t next_id_ = 1;
};

SchemaRegistry::SchemaRegistry() : impl_(std::make_unique<Impl>(nullptr)) {}
SchemaRegistry::SchemaRegistry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SchemaRegistry::~SchemaRegistry() = default;

absl::StatusOr<std::unique_ptr<SchemaRegistry>> SchemaRegistry::Open(
    std::unique_ptr<SchemaStore> store) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("SchemaRegistry::Open: the SchemaStore is null");
  }
  auto impl = std::make_unique<Impl>(std::move(store));
  absl::Status loaded = impl->Load();
  if (!loaded.ok()) return loaded;
  return std::unique_ptr<SchemaRegistry>(new SchemaRegistry(std::move(impl)));
}

absl::StatusOr<SchemaRef> SchemaRegistry::Register(std::string_view subject,
                                                   std::string_view fbs_text) {
  return impl_->Register(subject, fbs_text);
}
absl::Status SchemaRegistry::SetCompatibility(std::string_view subject, Compatibility mode) {
  return impl_->SetCompatibility(subject, mode);
}
Compatibility SchemaRegistry::GetCompatibility(std::string_view subject) const {
  return impl_->GetCompatibility(subject);
}
absl::StatusOr<RegisteredSchema> SchemaRegistry::Get(std::string_view subject,
                                                     std::uint32_t version) const {
  return impl_->Get(subject, version, /*latest=*/false);
}
absl::StatusOr<RegisteredSchema> SchemaRegistry::Latest(std::string_view subject) const {
  return impl_->Get(subject, 0, /*latest=*/true);
}
std::vector<std::uint32_t> SchemaRegistry::Versions(std::string_view subject) const {
  return impl_->Versions(subject);
}
std::vector<std::string> SchemaRegistry::Subjects() const { return impl_->Subjects(); }

}  // namespace inferq
