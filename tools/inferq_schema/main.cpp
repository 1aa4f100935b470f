// inferq-schema: checks FlatBuffers schema evolution with the rules the schema
// registry applies (inferq/schema/registry.hpp, flatbuffers::Parser::ConformTo).
//
//   inferq-schema check OLD.fbs NEW.fbs [--mode backward|forward|full]
//
// backward (the default, as in the registry): NEW conforms to OLD; forward: OLD
// conforms to NEW; full: both. Exit status: 0 compatible (and for --help), 1 not
// compatible (the reason on stderr), 2 a file that cannot be read or parsed (the
// parser's error on stderr) or bad usage.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "inferq/schema/registry.hpp"

namespace {

constexpr char kUsage[] = "usage: inferq-schema check OLD.fbs NEW.fbs [--mode backward|forward|full]\n";

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return out.str();
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "inferq-schema: %s\n%s", problem.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc < 2 || std::string_view(argv[1]) != "check") return Usage("expected the command 'check'");
  std::string files[2];
  int n_files = 0;
  inferq::Compatibility mode = inferq::Compatibility::kBackward;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--mode") {
      if (i + 1 == argc) return Usage("--mode needs a value");
      const std::string_view value = argv[++i];
      if (value == "backward") {
        mode = inferq::Compatibility::kBackward;
      } else if (value == "forward") {
        mode = inferq::Compatibility::kForward;
      } else if (value == "full") {
        mode = inferq::Compatibility::kFull;
      } else {
        return Usage("--mode '" + std::string(value) + "' is not one of backward, forward, full");
      }
    } else if (arg.size() > 1 && arg[0] == '-') {
      return Usage("unknown option '" + std::string(arg) + "'");
    } else if (n_files < 2) {
      files[n_files++] = std::string(arg);
    } else {
      return Usage("too many files");
    }
  }
  if (n_files != 2) return Usage("expected OLD.fbs and NEW.fbs");
  std::string texts[2];
  for (int i = 0; i < 2; ++i) {
    std::optional<std::string> text = ReadFile(files[i]);
    if (!text) {
      std::fprintf(stderr, "inferq-schema: cannot read '%s'\n", files[i].c_str());
      return 2;
    }
    texts[i] = std::move(*text);
  }
  const absl::Status status = inferq::CheckCompatibility(texts[0], texts[1], mode);
  if (status.ok()) {
    std::printf("compatible (%s): %s -> %s\n", std::string(inferq::CompatibilityName(mode)).c_str(),
                files[0].c_str(), files[1].c_str());
    return 0;
  }
  const std::string message(status.message());
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    std::fprintf(stderr, "inferq-schema: not compatible: %s -> %s: %s\n", files[0].c_str(),
                 files[1].c_str(), message.c_str());
    return 1;
  }
  std::fprintf(stderr, "inferq-schema: %s (%s)\n", message.c_str(),
               message.rfind("old", 0) == 0 ? files[0].c_str() : files[1].c_str());
  return 2;
}
