#include "layering_check.hpp"

#include <algorithm>
#include <fstream>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>

namespace inferq_layering {
namespace {

namespace fs = std::filesystem;

struct Directive {
  int line = 0;
  char open = '"';   // '"' or '<'
  std::string path;  // between the delimiters
};

// The #include directives of `text`, skipping comments and string and character
// literals (a literal ends at the end of its line at the latest, so a digit separator
// such as 65'000 costs nothing but the rest of its line, which holds no directive).
std::vector<Directive> FindIncludes(const std::string& text) {
  std::vector<Directive> out;
  bool in_block_comment = false;
  int line_no = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    ++line_no;
    bool at_line_start = true;  // only white space (or comments) so far
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (in_block_comment) {
        if (line.substr(i, 2) == "*/") {
          in_block_comment = false;
          ++i;
        }
        continue;
      }
      if (line.substr(i, 2) == "//") break;
      if (line.substr(i, 2) == "/*") {
        in_block_comment = true;
        ++i;
        continue;
      }
      if (c == ' ' || c == '\t' || c == '\r') continue;
      if (c == '#' && at_line_start) {
        std::size_t j = i + 1;
        while (j < line.size() && (line[j] == ' ' || line[j] == '\t')) ++j;
        constexpr std::string_view kInclude = "include";
        if (line.substr(j, kInclude.size()) == kInclude) {
          j += kInclude.size();
          while (j < line.size() && (line[j] == ' ' || line[j] == '\t')) ++j;
          if (j < line.size() && (line[j] == '"' || line[j] == '<')) {
            const char close = line[j] == '"' ? '"' : '>';
            const std::size_t stop = line.find(close, j + 1);
            if (stop != std::string_view::npos) {
              out.push_back(Directive{line_no, line[j],
                                      std::string(line.substr(j + 1, stop - j - 1))});
            }
          }
        }
        break;  // the rest of a directive line holds no other directive
      }
      at_line_start = false;
      if (c == '"' || c == '\'') {
        std::size_t j = i + 1;
        while (j < line.size() && line[j] != c) j += line[j] == '\\' ? 2 : 1;
        i = j;  // the closing quote, or past the end of the line
      }
    }
    if (end == text.size()) break;
    pos = end + 1;
  }
  return out;
}

std::vector<std::string> Components(const fs::path& p) {
  std::vector<std::string> out;
  for (const fs::path& part : p) out.push_back(part.generic_string());
  return out;
}

bool HasInternal(const std::vector<std::string>& parts) {
  return std::find(parts.begin(), parts.end(), "internal") != parts.end();
}

// What an include reaches.
struct Target {
  enum Kind { kLayer, kUmbrella, kAnywhere, kNotALayer, kOutside, kThirdParty } kind;
  std::string layer;
  bool internal = false;  // an internal/ header
  bool src = false;       // a file under src/ (never installed)
  std::string where;      // for kNotALayer and kOutside: the folder or path
};

std::optional<std::size_t> LevelOf(const std::vector<std::string>& layers,
                                   const std::string& name) {
  auto it = std::find(layers.begin(), layers.end(), name);
  if (it == layers.end()) return std::nullopt;
  return static_cast<std::size_t>(it - layers.begin());
}

// Where the file `rel` (relative to the root) sits: its layer, whether it is under
// src/, whether it is internal. nullopt outside include/inferq/<dir>/ and src/<dir>/.
std::optional<Target> Locate(const std::vector<std::string>& parts,
                             const std::vector<std::string>& layers) {
  std::string dir;
  bool src = false;
  if (parts.size() >= 4 && parts[0] == "include" && parts[1] == "inferq") {
    dir = parts[2];
  } else if (parts.size() >= 3 && parts[0] == "src") {
    dir = parts[1];
    src = true;
  } else {
    return std::nullopt;
  }
  Target t{Target::kLayer, dir, HasInternal(parts), src, ""};
  if (!LevelOf(layers, dir)) {
    t.kind = Target::kNotALayer;
    t.where = src ? "src/" + dir : "include/inferq/" + dir;
  }
  return t;
}

Target Resolve(const fs::path& root, const fs::path& including_file, const Directive& d,
               const std::vector<std::string>& layers) {
  const std::vector<std::string> parts = Components(fs::path(d.path).lexically_normal());
  if (!parts.empty() && parts[0] == "inferq") {
    if (d.path == "inferq/inferq.hpp") return Target{Target::kUmbrella, "", false, false, ""};
    if (d.path == "inferq/version.hpp") return Target{Target::kAnywhere, "", false, false, ""};
    if (parts.size() >= 3 && parts[1] == "wire") {
      return Target{Target::kLayer, "event", false, true, ""};  // generated, private
    }
    if (parts.size() >= 3) {
      if (LevelOf(layers, parts[1])) {
        return Target{Target::kLayer, parts[1], HasInternal(parts), false, ""};
      }
      return Target{Target::kNotALayer, parts[1], false, false, "inferq/" + parts[1]};
    }
    return Target{Target::kNotALayer, "", false, false, d.path};
  }
  if (d.open == '"') {
    const fs::path resolved = (including_file.parent_path() / d.path).lexically_normal();
    std::error_code ec;
    if (fs::is_regular_file(resolved, ec)) {
      const fs::path rel = resolved.lexically_relative(root);
      const std::vector<std::string> rel_parts = Components(rel);
      if (std::optional<Target> t = Locate(rel_parts, layers)) return *t;
      return Target{Target::kOutside, "", false, false, rel.generic_string()};
    }
  }
  return Target{Target::kThirdParty, "", false, false, ""};
}

std::string Joined(const std::vector<std::string>& layers, std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i) out += (i == 0 ? "" : ", ") + layers[i];
  return out;
}

// Empty when the file of layer `layer` (a public header unless `from_src`) may include
// `t`; otherwise the reason.
std::string Judge(const std::string& layer, bool from_src, const Target& t,
                  const std::vector<std::string>& layers) {
  const std::size_t level = *LevelOf(layers, layer);
  switch (t.kind) {
    case Target::kThirdParty:
    case Target::kAnywhere:
      return "";
    case Target::kUmbrella:
      return "the umbrella header includes every layer; layer " + layer +
             " includes the headers it uses";
    case Target::kNotALayer:
      return t.where + " is not a layer (the layers: " + Joined(layers, layers.size()) + ")";
    case Target::kOutside:
      return "it resolves to " + t.where + ", outside include/inferq/<layer>/ and src/<layer>/";
    case Target::kLayer:
      break;
  }
  const std::size_t target_level = *LevelOf(layers, t.layer);
  if (target_level > level) {
    return "layer " + layer + " may not include layer " + t.layer + " (a higher layer; " +
           layer + (level == 0 ? " may use no other layer)"
                               : " may use " + Joined(layers, level) + ")");
  }
  if (target_level == level) {
    if (t.src && !from_src) {
      return "a public header may not include a private file (src/ or generated: not "
             "installed)";
    }
    return "";
  }
  if (t.src) return "the file is private to layer " + t.layer + " (src/ or generated)";
  if (t.internal) return "layer " + t.layer + "'s internal/ headers are for layer " + t.layer + " only";
  return "";
}

bool IsSourceFile(const fs::path& p) {
  static const std::vector<std::string> kExtensions = {".hpp", ".h",   ".hh", ".cpp",
                                                       ".cc",  ".cxx", ".ipp", ".inc"};
  return std::find(kExtensions.begin(), kExtensions.end(), p.extension().string()) !=
         kExtensions.end();
}

void CheckFile(const fs::path& root, const fs::path& file, const std::string& layer,
               bool from_src, const std::vector<std::string>& layers,
               std::vector<Violation>& out) {
  std::ifstream in(file, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string rel = file.lexically_relative(root).generic_string();
  if (!in.good() && !in.eof()) {
    out.push_back(Violation{rel, 0, "", "cannot be read"});
    return;
  }
  for (const Directive& d : FindIncludes(text)) {
    const std::string reason = Judge(layer, from_src, Resolve(root, file, d, layers), layers);
    if (!reason.empty()) {
      const std::string written = d.open == '"' ? "\"" + d.path + "\"" : "<" + d.path + ">";
      out.push_back(Violation{rel, d.line, written, reason});
    }
  }
}

// Every layer folder directly under `base` (include/inferq or src), checked; a folder
// that is not a layer is a violation, and so is a file of src/ outside every layer.
void CheckFolder(const fs::path& root, const fs::path& base, bool from_src,
                 const std::vector<std::string>& layers, std::vector<Violation>& out) {
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return;
  for (const fs::directory_entry& entry : fs::directory_iterator(base)) {
    const std::string name = entry.path().filename().string();
    const std::string rel = entry.path().lexically_relative(root).generic_string();
    if (!entry.is_directory()) {
      // include/inferq/ holds the umbrella header (and a generated version.hpp in
      // the build tree); src/ holds nothing but layer folders.
      if (from_src && IsSourceFile(entry.path())) {
        out.push_back(Violation{rel, 0, "", "a file of src/ outside every layer folder"});
      }
      continue;
    }
    if (!LevelOf(layers, name)) {
      out.push_back(Violation{rel, 0, "",
                              "the folder is not a layer (the layers: " +
                                  Joined(layers, layers.size()) + ")"});
      continue;
    }
    for (const fs::directory_entry& f : fs::recursive_directory_iterator(entry.path())) {
      if (f.is_regular_file() && IsSourceFile(f.path())) {
        CheckFile(root, f.path(), name, from_src, layers, out);
      }
    }
  }
}

}  // namespace

std::string Format(const Violation& v) {
  std::string out = v.file;
  if (v.line > 0) out += ":" + std::to_string(v.line);
  out += ": ";
  if (!v.include.empty()) out += "#include " + v.include + ": ";
  return out + v.reason;
}

std::vector<Violation> CheckTree(const fs::path& root_in, const std::vector<std::string>& layers) {
  fs::path root = fs::absolute(root_in).lexically_normal();
  if (root.filename().empty()) root = root.parent_path();  // "/x/" -> "/x"
  std::vector<Violation> out;
  CheckFolder(root, root / "include" / "inferq", /*from_src=*/false, layers, out);
  CheckFolder(root, root / "src", /*from_src=*/true, layers, out);
  std::sort(out.begin(), out.end(), [](const Violation& a, const Violation& b) {
    return std::tie(a.file, a.line, a.include) < std::tie(b.file, b.line, b.include);
  });
  return out;
}

}  // namespace inferq_layering
