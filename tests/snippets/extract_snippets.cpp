// File: tests/snippets/extract_snippets.cpp
//
// extract_snippets OUT.cpp FILE.md...: writes the ```cpp blocks of the Markdown
// files as one C++ source (see snippets.hpp). Paths are read relative to the
// working directory and named as given in #line directives; so are the files of
// `program PATH` snippets, each of which must equal its block. Exit 0 written,
// 1 a Markdown error or a program block that differs from its file (printed with
// file and line), 2 bad usage or I/O (a Markdown path that is a directory included).
// `excerpt PATH` snippets must occur in their file as consecutive lines; a `program`
// or `excerpt` path that is not a readable file is an error naming it.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "snippets.hpp"

namespace {

// The whole regular file at `path` into `out`; false when it is not one (a directory
// opens as a stream on Linux, and reads as nothing) or cannot be read.
bool ReadFile(const std::string& path, std::string& out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  out = text.str();
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: extract_snippets OUT.cpp FILE.md...\n";
    return 2;
  }
  std::vector<inferq_snippets::Snippet> all;
  for (int a = 2; a < argc; ++a) {
    std::string text;
    if (!ReadFile(argv[a], text)) {
      std::cerr << "extract_snippets: cannot read '" << argv[a] << "'"
                << (std::filesystem::is_directory(argv[a]) ? ": it is a directory" : "") << "\n";
      return 2;
    }
    auto snippets = inferq_snippets::ExtractSnippets(argv[a], text);
    if (!snippets.ok()) {
      std::cerr << std::string(snippets.status().message()) << "\n";
      return 1;
    }
    for (const inferq_snippets::Snippet& sn : *snippets) {
      const std::string& path = sn.program.empty() ? sn.excerpt : sn.program;
      if (path.empty()) continue;
      std::string prog_text;
      if (!ReadFile(path, prog_text)) {
        std::cerr << inferq_snippets::Where(sn.file, sn.fence_line - 1) << "cannot read '"
                  << path << "'"
                  << (std::filesystem::is_directory(path) ? ": it is a directory" : "") << "\n";
        return 1;
      }
      const absl::Status st = sn.program.empty()
                                  ? inferq_snippets::ExcerptMismatch(sn, prog_text)
                                  : inferq_snippets::ProgramMismatch(sn, prog_text);
      if (!st.ok()) {
        std::cerr << std::string(st.message()) << "\n";
        return 1;
      }
    }
    all.insert(all.end(), snippets->begin(), snippets->end());
  }
  const std::string source = inferq_snippets::GenerateSource(all);
  // Written only when changed, so an unrelated README edit does not recompile it.
  std::ifstream old(argv[1], std::ios::binary);
  std::ostringstream old_text;
  if (old) old_text << old.rdbuf();
  if (!old || old_text.str() != source) {
    std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
    out << source;
    if (!out) {
      std::cerr << "extract_snippets: cannot write '" << argv[1] << "'\n";
      return 2;
    }
  }
  std::cout << "extract_snippets: " << all.size() << " snippets\n";
  return 0;
}
