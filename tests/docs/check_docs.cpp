// check_docs ROOT VERSION: applies the rules of docs_rules.hpp to the repository at
// ROOT, whose project version (CMake's PROJECT_VERSION) is VERSION.
//  - README.md has at most kMaxReadmeLines lines;
//  - in every *.md file (build trees, .git and hidden folders skipped) each relative
//    link points at an existing file or folder, and each #anchor at a heading or an
//    <a id> of its target;
//  - README.md, BENCHMARKS.md, CHANGELOG.md, docs/**.md, the other *.md files, the
//    public headers (include/**.hpp: the API reference is made from them) and what the
//    examples, tools and scripts print name no issue; README.md, CHANGELOG.md and
//    docs/guide/*.md name no commit id (BENCHMARKS.md does: a figure names the code it
//    measured);
//  - CHANGELOG.md's newest release is VERSION, and every `find_package(inferq X.Y` in
//    the Markdown that asks for a version asks for VERSION's major.minor.
// Exit 0 when every rule holds; 1 listing each finding as "FILE:LINE: message" and a
// count; 2 for bad usage.
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "docs_rules.hpp"

namespace fs = std::filesystem;
using inferq_docs::Finding;

namespace {

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Skipped(const fs::path& rel) {
  for (const fs::path& part : rel) {
    const std::string s = part.string();
    if (s.size() > 1 && s.front() == '.' && s != "..") return true;  // .git, .ci stays below
    if (s == "build" || s.rfind("build-", 0) == 0 || s == "third_party") return true;
  }
  return false;
}

// Files under ROOT with one of the extensions, relative, sorted.
std::vector<fs::path> Files(const fs::path& root, const std::vector<std::string>& dirs,
                            const std::vector<std::string>& exts) {
  std::vector<fs::path> out;
  for (const std::string& d : dirs) {
    const fs::path base = d.empty() ? root : root / d;
    if (!fs::is_directory(base)) continue;
    for (auto it = fs::recursive_directory_iterator(base); it != fs::recursive_directory_iterator();
         ++it) {
      const fs::path rel = fs::relative(it->path(), root);
      if (it->is_directory() && Skipped(rel)) {
        it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      for (const std::string& e : exts) {
        const std::string name = rel.filename().string();
        if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) {
          out.push_back(rel);
          break;
        }
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: check_docs ROOT VERSION\n";
    return 2;
  }
  const fs::path root = argv[1];
  const std::string version = argv[2];
  if (!fs::is_directory(root)) {
    std::cerr << "check_docs: '" << root.string() << "' is not a directory\n";
    return 2;
  }
  const std::string major_minor = version.substr(0, version.rfind('.'));
  std::vector<Finding> findings;
  std::map<std::string, std::set<std::string>> anchors;  // by file, read once

  const std::vector<fs::path> markdown = Files(root, {""}, {".md"});
  int links = 0;
  for (const fs::path& rel : markdown) {
    const std::string file = rel.generic_string();
    const std::string text = Read(root / rel);
    const std::vector<std::string_view> lines = inferq_docs::SplitLines(text);
    const std::vector<bool> fenced = inferq_docs::FencedLines(lines);
    if (file == "README.md" && static_cast<int>(lines.size()) > inferq_docs::kMaxReadmeLines) {
      findings.push_back({file, static_cast<int>(lines.size()),
                          "the README has " + std::to_string(lines.size()) + " lines, over " +
                              std::to_string(inferq_docs::kMaxReadmeLines) +
                              ": move the material to a guide in docs/guide/"});
    }
    for (const inferq_docs::Link& link : inferq_docs::Links(text)) {
      if (inferq_docs::IsExternal(link.target)) continue;
      ++links;
      const std::size_t hash = link.target.find('#');
      const std::string path = link.target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : link.target.substr(hash + 1);
      const fs::path target = path.empty() ? rel : (rel.parent_path() / path).lexically_normal();
      if (!path.empty() && !fs::exists(root / target)) {
        findings.push_back({file, link.line, "links to '" + link.target + "': no file '" +
                                                 target.generic_string() + "'"});
        continue;
      }
      if (anchor.empty()) continue;
      if (fs::is_directory(root / target) || target.extension() != ".md") {
        findings.push_back({file, link.line, "links to '" + link.target +
                                                 "': only a Markdown file has anchors"});
        continue;
      }
      auto [it, fresh] = anchors.try_emplace(target.generic_string());
      if (fresh) it->second = inferq_docs::Anchors(Read(root / target));
      if (!it->second.contains(anchor)) {
        findings.push_back({file, link.line, "links to '" + link.target + "': '" +
                                                 target.generic_string() +
                                                 "' has no heading with anchor '" + anchor + "'"});
      }
    }
    const bool no_commits = file == "README.md" || file == "CHANGELOG.md" ||
                            file.rfind("docs/guide/", 0) == 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const int line_no = static_cast<int>(i) + 1;
      if (!fenced[i]) {
        if (std::string m = inferq_docs::IssueMention(lines[i]); !m.empty()) {
          findings.push_back({file, line_no, "names an issue ('" + m +
                                                 "'): say what the change is, not its issue"});
        }
        if (std::string c = inferq_docs::CommitId(lines[i]); no_commits && !c.empty()) {
          findings.push_back({file, line_no, "names commit '" + c +
                                                 "': a figure's commit belongs in BENCHMARKS.md"});
        }
      }
      // Only a find_package that asks for a version must ask for this one.
      const std::string want = "find_package(inferq " + major_minor;
      const std::size_t fp = lines[i].find("find_package(inferq ");
      const std::size_t v = fp + std::string_view("find_package(inferq ").size();
      if (fp != std::string_view::npos && v < lines[i].size() &&
          std::isdigit(static_cast<unsigned char>(lines[i][v])) &&
          lines[i].substr(fp, want.size()) != want) {
        findings.push_back({file, line_no, "shows '" + std::string(lines[i].substr(fp, want.size())) +
                                               "' but the project's version is " + version});
      }
    }
  }

  // What users read besides the Markdown: the public headers (the API reference),
  // and the sources of the examples, tools and scripts (their messages and --help).
  for (const fs::path& rel :
       Files(root, {"include", "examples", "tools", "scripts"}, {".hpp", ".cpp", ".sh", ".py", ".in"})) {
    const std::string text = Read(root / rel);
    const std::vector<std::string_view> lines = inferq_docs::SplitLines(text);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (std::string m = inferq_docs::IssueMention(lines[i]); !m.empty()) {
        findings.push_back({rel.generic_string(), static_cast<int>(i) + 1,
                            "names an issue ('" + m + "'): say what the change is, not its issue"});
      }
    }
  }

  const fs::path changelog = root / "CHANGELOG.md";
  if (!fs::exists(changelog)) {
    findings.push_back({"CHANGELOG.md", 0, "missing: the project keeps a changelog"});
  } else {
    auto [newest, line] = inferq_docs::NewestRelease(Read(changelog));
    if (newest != version) {
      findings.push_back({"CHANGELOG.md", line,
                          "the newest release is '" + newest + "' but the project's version "
                          "(CMakeLists.txt) is " + version});
    }
  }

  for (const Finding& f : findings) std::cout << f.Text() << "\n";
  std::cout << markdown.size() << " Markdown files, " << links << " relative links checked, "
            << findings.size() << " findings\n";
  return findings.empty() ? 0 : 1;
}
