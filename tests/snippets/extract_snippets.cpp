// File: tests/snippets/extract_snippets.cpp
//
// extract_snippets OUT.cpp FILE.md...: writes the ```cpp blocks of the Markdown
// files as one C++ source (see snippets.hpp). Paths are read relative to the
// working directory and named as given in #line directives; so are the files of
// `program PATH` snippets, each of which must equal its block. Exit 0 written,
// 1 a Markdown error or a program block that differs from its file (printed with
// file and line), 2 bad usage or I/O. `excerpt PATH` snippets must occur in their
// file as consecutive lines.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "snippets.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: extract_snippets OUT.cpp FILE.md...\n";
    return 2;
  }
  std::vector<inferq_snippets::Snippet> all;
  for (int a = 2; a < argc; ++a) {
    std::ifstream in(argv[a], std::ios::binary);
    if (!in) {
      std::cerr << "extract_snippets: cannot read '" << argv[a] << "'\n";
      return 2;
    }
    std::ostringstream text;
    text << in.rdbuf();
    auto snippets = inferq_snippets::ExtractSnippets(argv[a], text.str());
    if (!snippets.ok()) {
      std::cerr << std::string(snippets.status().message()) << "\n";
      return 1;
    }
    for (const inferq_snippets::Snippet& sn : *snippets) {
      const std::string& path = sn.program.empty() ? sn.excerpt : sn.program;
      if (path.empty()) continue;
      std::ifstream prog(path, std::ios::binary);
      if (!prog) {
        std::cerr << inferq_snippets::Where(sn.file, sn.fence_line - 1) << "cannot read '"
                  << path << "'\n";
        return 1;
      }
      std::ostringstream prog_text;
      prog_text << prog.rdbuf();
      const absl::Status st = sn.program.empty()
                                  ? inferq_snippets::ExcerptMismatch(sn, prog_text.str())
                                  : inferq_snippets::ProgramMismatch(sn, prog_text.str());
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
