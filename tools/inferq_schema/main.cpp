// inferq-schema: checks FlatBuffers schema evolution with the rules the schema
// registry applies (inferq/schema/registry.hpp, flatbuffers::Parser::ConformTo).
//
//   inferq-schema check OLD.fbs NEW.fbs [--mode backward|forward|full]
//   (--mode=VALUE too; --help, --version)
//
// backward (the default, as in the registry): NEW conforms to OLD; forward: OLD
// conforms to NEW; full: both. Exit status: 0 compatible (and for --help), 1 not
// compatible (the reason on stderr), 2 bad usage or a file that cannot be read
// ("cannot read 'F': Is a directory"), is not schema text ("'F' is not a schema: it
// is binary (a NUL byte at offset 1)", e.g. what `flatc -b --schema` writes) or does
// not parse (the parser's error), on stderr naming the file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "inferq/schema/registry.hpp"
#include "inferq/version.hpp"

namespace {

constexpr char kUsage[] = "usage: inferq-schema check OLD.fbs NEW.fbs [--mode backward|forward|full]\n";

constexpr char kHelp[] =
    "usage: inferq-schema check OLD.fbs NEW.fbs [--mode backward|forward|full]\n"
    "       inferq-schema --help | --version\n"
    "\n"
    "Checks that NEW.fbs is an allowed evolution of OLD.fbs (FlatBuffers schema text),\n"
    "with the rules the schema registry applies: flatbuffers::Parser::ConformTo, what\n"
    "`flatc --conform` runs. A field kept keeps its id, type and default; an enum\n"
    "value kept keeps its number; fields may be appended, deprecated or renamed.\n"
    "\n"
    "options:\n"
    "  --mode MODE, --mode=MODE\n"
    "      backward  (default) NEW conforms to OLD: readers of NEW read data written\n"
    "                with OLD\n"
    "      forward   OLD conforms to NEW: readers of OLD read data written with NEW\n"
    "      full      both\n"
    "  --help, -h   this text\n"
    "  --version    the inferq version\n"
    "\n"
    "exit status: 0 compatible (\"compatible (MODE): OLD -> NEW\" on stdout);\n"
    "1 not compatible (the field and the rule on stderr); 2 usage, or a file that\n"
    "cannot be read, is binary (e.g. `flatc -b --schema` output), is over 1 MiB,\n"
    "includes another file or does not parse (the error on stderr, naming the file),\n"
    "or the result could not be written.\n";

// No .fbs schema comes near this, and parse time grows faster than size (10 MB of
// 400,000 tables took FlatBuffers 53 s here): a longer input is not taken as schema
// text.
constexpr std::size_t kMaxSchemaBytes = std::size_t{1} << 20;

// The whole file; the error names the path and what is wrong (open(2) and read(2)
// report a directory only when read, so it is checked first).
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  auto error = [&path](int err) {
    return absl::InvalidArgumentError("cannot read '" + path + "': " + std::strerror(err));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error(errno);
  struct stat st {};
  std::string text;
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
  } else if (S_ISDIR(st.st_mode)) {
    err = EISDIR;
  } else {
    // Reading stops at the first NUL (not schema text) and at kMaxSchemaBytes, so
    // /dev/urandom or a huge file is refused instead of read until memory runs out.
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        const std::size_t before = text.size();
        text.append(buf, static_cast<std::size_t>(n));
        if (text.find('\0', before) != std::string::npos) break;
        if (text.size() > kMaxSchemaBytes) {
          ::close(fd);
          return absl::InvalidArgumentError("'" + path + "' is not a schema: it is longer than " +
                                            std::to_string(kMaxSchemaBytes) + " bytes");
        }
      } else if (n == 0) {
        break;
      } else if (errno != EINTR) {
        err = errno;
        break;
      }
    }
  }
  ::close(fd);
  if (err != 0) return error(err);
  // FlatBuffers' parser reads a NUL-terminated string: it would see only the text
  // before the first NUL ("input file is empty" when that is the first byte).
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError("'" + path +
                                      "' is not a schema: it is binary (a NUL byte at offset " +
                                      std::to_string(nul) + ")");
  }
  return text;
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "inferq-schema: %s\n%s", problem.c_str(), kUsage);
  return 2;
}

}  // namespace

int Run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("inferq-schema %s\n", INFERQ_VERSION_STRING);
      return 0;
    }
  }
  if (argc < 2) return Usage("no command given (expected 'check')");
  if (std::string_view(argv[1]) != "check") {
    if (argv[1][0] == '-') return Usage("unknown option '" + std::string(argv[1]) + "'");
    return Usage("unknown command '" + std::string(argv[1]) + "' (expected 'check')");
  }
  std::string files[2];
  int n_files = 0;
  inferq::Compatibility mode = inferq::Compatibility::kBackward;
  for (int i = 2; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--mode" || arg.starts_with("--mode=")) {
      std::string_view value;
      if (arg == "--mode") {
        if (i + 1 == argc) return Usage("--mode needs a value (backward, forward or full)");
        value = argv[++i];
      } else {
        value = arg.substr(7);
      }
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
      return Usage("too many files: '" + std::string(arg) + "' after OLD.fbs and NEW.fbs");
    }
  }
  if (n_files != 2) return Usage("expected OLD.fbs and NEW.fbs");
  std::string texts[2];
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> text = ReadFile(files[i]);
    if (!text.ok()) {
      std::fprintf(stderr, "inferq-schema: %s\n", std::string(text.status().message()).c_str());
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

// A failed write of the result (a full disk, a closed pipe) is an error: exit 2.
int main(int argc, char** argv) {
  const int status = Run(argc, argv);
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "inferq-schema: writing the output failed: %s\n", std::strerror(errno));
    return 2;
  }
  return status;
}
