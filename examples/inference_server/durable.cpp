#include "durable.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>

namespace inferq::example {
namespace {

constexpr std::string_view kHeader = "inference_server replay 1";

std::string Kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a directory";
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InvalidArgumentError(what + " '" + path + "': " + std::strerror(errno));
}

// Writes `text` to `path` and makes it durable: a temporary file beside it,
// fdatasync'ed, renamed over `path`, and the directory fsync'ed so that the rename
// survives too.
absl::Status WriteDurably(const std::string& dir, const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const absl::Status st = Errno("cannot write", tmp);
      ::close(fd);
      return st;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fdatasync(fd) != 0) {
    const absl::Status st = Errno("cannot fdatasync", tmp);
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return Errno("cannot close", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename into", path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("cannot open", dir);
  const bool synced = ::fsync(dfd) == 0;
  const absl::Status st = synced ? absl::OkStatus() : Errno("cannot fsync", dir);
  ::close(dfd);
  return st;
}

}  // namespace

absl::Status PrepareStateDir(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError("'" + dir + "' is " + Kind(st.st_mode) + ", not a directory");
    }
  } else {
    // Parents that exist but are not directories fail here too (ENOTDIR).
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::NotFoundError("cannot create '" + dir + "': " + ec.message());
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError("cannot write in '" + dir + "': " + std::strerror(errno));
  }
  return absl::OkStatus();
}

std::uint64_t TraceFingerprint(const std::vector<TraceRequest>& trace) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 offset basis
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;  // FNV-1a 64 prime
    }
  };
  for (const TraceRequest& t : trace) {
    mix(static_cast<std::uint64_t>(t.arrival_us));
    mix(t.context_tokens);
    mix(t.generated_tokens);
  }
  return h;
}

absl::Status CheckReplaySettings(const std::string& dir, const ReplaySettings& settings) {
  const std::string path = (std::filesystem::path(dir) / "replay").string();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return Errno("cannot read", path);
    std::string text = std::string(kHeader) + "\n";
    for (const auto& [key, value] : settings) text += key + " " + value + "\n";
    return WriteDurably(dir, path, text);
  }
  absl::StatusOr<std::string> text = ReadInputFile(path, 1 << 16);
  if (!text.ok()) return text.status();
  std::map<std::string, std::string, std::less<>> stored;
  std::string_view rest = *text;
  bool header = true;
  while (!rest.empty()) {
    const std::size_t eol = rest.find('\n');
    const std::string_view line = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    if (header) {
      if (line != kHeader) {
        return absl::FailedPreconditionError("'" + path + "' does not start with '" +
                                             std::string(kHeader) + "': not a replay of this program");
      }
      header = false;
      continue;
    }
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos) {
      return absl::FailedPreconditionError("'" + path + "' has a line without a value: '" +
                                           std::string(line) + "'");
    }
    stored.emplace(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }
  for (const auto& [key, value] : settings) {
    const auto it = stored.find(key);
    if (it == stored.end()) {
      return absl::FailedPreconditionError("'" + path + "' has no line for " + key);
    }
    if (it->second != value) {
      return absl::FailedPreconditionError(
          "--state-dir '" + dir + "' holds a replay run with " + key + " " + it->second +
          "; this run has " + key + " " + value +
          " (a replay resumes with the settings of its first run; only --speed, --json, "
          "--crash-at and --kill-replica may change)");
    }
  }
  return absl::OkStatus();
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace inferq::example
