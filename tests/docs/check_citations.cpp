// check_citations ROOT: every file of the repository that the documentation or a code
// comment cites exists. Exit 0 when all do; 1 listing each missing one as
// "<file>:<line>: cites '<path>', which the repository lacks"; 2 for bad usage.
//
// What counts as a citation:
//  - in Markdown (README.md, BENCHMARKS.md, docs/*.md and every other *.md): each
//    word of a `code span` and each link target ](...), when it is a path into one
//    of the repository's top-level directories (src/, include/, tests/, docs/,
//    examples/, scripts/, benchmarks/, tools/, cmake/, schemas/, fuzz/, .ci/), a
//    header path inferq/... (under include/), a *.md file named alone, or a link to
//    a relative file;
//  - in C++ sources: such a path in a // comment (string literals are test data);
//  - in CMake and shell files: such a path anywhere in the line.
// A path is looked up from the repository root and from the citing file's directory.
// {a,b} alternatives are expanded; a trailing ":line", "#anchor" or punctuation is
// dropped; paths with wildcards or placeholders (*, <, $) and files generated into the
// build tree (inferq/version.hpp, inferq/wire/) are not checked.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kTopDirs = {"src/",     "include/", "tests/",   "docs/",
                                           "examples/", "scripts/", "benchmarks/", "tools/",
                                           "cmake/",   "schemas/", "fuzz/",    ".ci/"};

bool StartsWith(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// "a/{b,c}.hpp" -> {"a/b.hpp", "a/c.hpp"} (one level of braces, several groups).
std::vector<std::string> Expand(const std::string& s) {
  const auto open = s.find('{');
  const auto close = open == std::string::npos ? std::string::npos : s.find('}', open);
  if (close == std::string::npos) return {s};
  std::vector<std::string> out;
  std::stringstream alts(s.substr(open + 1, close - open - 1));
  std::string alt;
  while (std::getline(alts, alt, ',')) {
    for (const std::string& rest : Expand(s.substr(close + 1))) {
      out.push_back(s.substr(0, open) + alt + rest);
    }
  }
  return out;
}

// The repository path a word cites, or "" when it cites none.
std::string Candidate(std::string w, bool markdown) {
  while (!w.empty() && std::string("\"'(),;.:").find(w.front()) != std::string::npos) w.erase(0, 1);
  if (StartsWith(w, "./")) w.erase(0, 2);
  if (const auto hash = w.find('#'); hash != std::string::npos) w.resize(hash);
  // ":12" or ":12-40" after a file name, and trailing punctuation.
  static const std::regex line_suffix(R"(:[0-9][0-9,-]*$)");
  w = std::regex_replace(w, line_suffix, "");
  while (!w.empty() && std::string("\"'(),;.:").find(w.back()) != std::string::npos) w.pop_back();
  if (w.empty() || w.find_first_of("*<>$=|\\") != std::string::npos) return "";
  if (StartsWith(w, "http") || StartsWith(w, "/") || StartsWith(w, "build/")) return "";
  for (const std::string& d : kTopDirs) {
    if (StartsWith(w, d)) return w;
  }
  if (StartsWith(w, "inferq/") && (w.ends_with(".hpp") || w.ends_with("/"))) {
    if (StartsWith(w, "inferq/version.hpp") || StartsWith(w, "inferq/wire/")) return "";
    return "include/" + w;
  }
  if (markdown && w.find('/') == std::string::npos && w.ends_with(".md") && w.size() > 3) return w;
  return "";
}

struct Finding {
  std::string file;
  int line;
  std::string path;
};

void Check(const fs::path& root, const fs::path& file, std::vector<Finding>& missing,
           int& checked) {
  const bool markdown = file.extension() == ".md";
  const std::string ext = file.extension().string();
  const bool cxx = ext == ".hpp" || ext == ".cpp" || ext == ".h";
  std::ifstream in(file);
  std::string text;
  int line_no = 0;
  static const std::regex code_span("`([^`]+)`");
  static const std::regex link(R"(\]\(([^)\s]+)\))");
  static const std::regex source_path(
      R"((?:\.ci|src|include|tests|docs|examples|scripts|benchmarks|tools|cmake|schemas|fuzz)/[A-Za-z0-9_./{},+-]*[A-Za-z0-9_}]|inferq/[a-z_/{},]+\.hpp)");
  const std::string rel_file = fs::relative(file, root).string();
  while (std::getline(in, text)) {
    ++line_no;
    std::vector<std::pair<std::string, bool>> words;  // (word, a Markdown link)
    if (markdown) {
      for (std::sregex_iterator it(text.begin(), text.end(), code_span), end; it != end; ++it) {
        std::stringstream ws((*it)[1].str());
        std::string w;
        while (ws >> w) words.push_back({w, false});
      }
      for (std::sregex_iterator it(text.begin(), text.end(), link), end; it != end; ++it) {
        words.push_back({(*it)[1].str(), true});
      }
    } else {
      std::string scan = text;
      if (cxx) {  // from the first "//" outside a string literal
        std::size_t comment = std::string::npos;
        bool in_string = false;
        for (std::size_t i = 0; i + 1 < text.size(); ++i) {
          if (text[i] == '"' && (i == 0 || text[i - 1] != '\\')) in_string = !in_string;
          if (!in_string && text[i] == '/' && text[i + 1] == '/') {
            comment = i;
            break;
          }
        }
        scan = comment == std::string::npos ? "" : text.substr(comment);
      }
      for (std::sregex_iterator it(scan.begin(), scan.end(), source_path), end; it != end; ++it) {
        // Only what follows a separator (a path inside a longer one is not a
        // citation), and not the start of a pattern (a name followed by '*').
        const auto pos = static_cast<std::size_t>(it->position());
        const auto after = pos + it->str().size();
        if (pos > 0 && (std::isalnum(static_cast<unsigned char>(scan[pos - 1])) ||
                        scan[pos - 1] == '_' || scan[pos - 1] == '/' || scan[pos - 1] == '.')) {
          continue;
        }
        if (after < scan.size() && scan[after] == '*') continue;
        words.push_back({it->str(), false});
      }
    }
    for (const auto& [word, is_link] : words) {
      std::string c = Candidate(word, markdown);
      if (c.empty() && is_link && !StartsWith(word, "http") && !StartsWith(word, "#") &&
          word.find(':') == std::string::npos) {
        c = word;  // a relative link: resolved from the file's directory below
        if (const auto hash = c.find('#'); hash != std::string::npos) c.resize(hash);
      }
      if (c.empty()) continue;
      for (const std::string& path : Expand(c)) {
        ++checked;
        const bool found = fs::exists(root / path) || fs::exists(file.parent_path() / path);
        if (!found) missing.push_back({rel_file, line_no, path});
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: check_citations REPOSITORY_ROOT\n");
    return 2;
  }
  const fs::path root = fs::canonical(argv[1]);
  std::vector<Finding> missing;
  int checked = 0, files = 0;
  const std::set<std::string> exts = {".md", ".hpp", ".cpp", ".h", ".cmake", ".sh", ".txt", ".in"};
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name == ".git" || name.starts_with("build") || name == "data")) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const std::string ext = it->path().extension().string();
    if (!exts.contains(ext) && name != "run") continue;
    ++files;
    Check(root, it->path(), missing, checked);
  }
  for (const Finding& f : missing) {
    std::printf("%s:%d: cites '%s', which the repository lacks\n", f.file.c_str(), f.line,
                f.path.c_str());
  }
  std::printf("%d citations in %d files checked, %zu missing\n", checked, files, missing.size());
  return missing.empty() ? 0 : 1;
}
