// check_docs ROOT VERSION: applies the rules of docs_rules.hpp to the repository at
// ROOT, whose project version (CMake's PROJECT_VERSION) is VERSION.
//  - README.md has at most kMaxReadmeLines lines;
//  - in every *.md file (build trees, .git and hidden folders skipped) each relative
//    link points at an existing file or folder inside ROOT (a leading '/' is ROOT, as
//    on GitHub), and each #anchor at a heading or an HTML id of its target (of a
//    folder: of its README.md; of a file other than Markdown: a line, #L12);
//  - README.md, BENCHMARKS.md, CHANGELOG.md, docs/**.md, the other *.md files, the
//    public headers (include/**.hpp: the API reference is made from them) and what the
//    examples, tools and scripts print name no issue; README.md, CHANGELOG.md and
//    docs/guide/*.md name no commit id (BENCHMARKS.md does: a figure names the code it
//    measured);
//  - CHANGELOG.md's newest release is VERSION, and every `find_package(inferq X.Y` in
//    the Markdown that asks for a version asks for VERSION's major.minor.
// Exit 0 when every rule holds; 1 listing each finding as "FILE:LINE: message" and a
// count; 2 for bad usage.
#include <algorithm>
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

bool Skipped(const fs::path& rel) {
  for (const fs::path& part : rel) {
    const std::string s = part.string();
    if (s.size() > 1 && s.front() == '.' && s != "..") return true;  // .git, .ci stays below
    if (s == "build" || s.rfind("build-", 0) == 0 || s == "third_party") return true;
  }
  return false;
}

// Files under ROOT with one of the extensions, relative, sorted. A folder that cannot
// be read is skipped, not fatal.
std::vector<fs::path> Files(const fs::path& root, const std::vector<std::string>& dirs,
                            const std::vector<std::string>& exts) {
  std::vector<fs::path> out;
  for (const std::string& d : dirs) {
    const fs::path base = d.empty() ? root : root / d;
    std::error_code ec;
    if (!fs::is_directory(base, ec)) continue;
    fs::recursive_directory_iterator it(base, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const fs::path rel = it->path().lexically_relative(root);
      std::error_code type_ec;
      if (it->is_directory(type_ec) && Skipped(rel)) {
        it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file(type_ec)) continue;
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
  std::error_code root_ec;
  if (!fs::is_directory(root, root_ec)) {
    std::cerr << "check_docs: '" << root.string() << "' is not a directory\n";
    return 2;
  }
  const std::string major_minor = version.substr(0, version.rfind('.'));
  std::vector<Finding> findings;
  inferq_docs::AnchorCache anchors;  // by file, read once

  const std::vector<fs::path> markdown = Files(root, {""}, {".md"});
  int links = 0;
  for (const fs::path& rel : markdown) {
    const std::string file = rel.generic_string();
    const std::string text = inferq_docs::ReadFile(root / rel);
    const std::vector<std::string_view> lines = inferq_docs::SplitLines(text);
    const std::vector<bool> fenced = inferq_docs::FencedLines(lines);
    if (file == "README.md" && static_cast<int>(lines.size()) > inferq_docs::kMaxReadmeLines) {
      findings.push_back({file, static_cast<int>(lines.size()),
                          "the README has " + std::to_string(lines.size()) + " lines, over " +
                              std::to_string(inferq_docs::kMaxReadmeLines) +
                              ": move the material to a guide in docs/guide/"});
    }
    for (Finding& f : inferq_docs::LinkFindings(root, rel, text, anchors, links)) {
      findings.push_back(std::move(f));
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
        const std::string_view previous = i > 0 && !fenced[i - 1] ? lines[i - 1] : std::string_view();
        if (std::string c = inferq_docs::CommitIdAfter(previous, lines[i]); no_commits && !c.empty()) {
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
    const std::string text = inferq_docs::ReadFile(root / rel);
    const std::vector<std::string_view> lines = inferq_docs::SplitLines(text);
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (std::string m = inferq_docs::IssueMention(lines[i]); !m.empty()) {
        findings.push_back({rel.generic_string(), static_cast<int>(i) + 1,
                            "names an issue ('" + m + "'): say what the change is, not its issue"});
      }
    }
  }

  const fs::path changelog = root / "CHANGELOG.md";
  std::error_code changelog_ec;
  if (!fs::exists(changelog, changelog_ec)) {
    findings.push_back({"CHANGELOG.md", 0, "missing: the project keeps a changelog"});
  } else {
    auto [newest, line] = inferq_docs::NewestRelease(inferq_docs::ReadFile(changelog));
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
