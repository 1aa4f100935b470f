#include "trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inferq/base/error.hpp"
#include "inferq/event/codec.hpp"

namespace inferq::example {
namespace {

constexpr std::string_view kHeader = "TIMESTAMP,ContextTokens,GeneratedTokens";

std::string At(std::string_view source, std::size_t line) {
  return std::string(source) + " line " + std::to_string(line) + ": ";
}

absl::Status FieldError(std::string_view source, std::size_t line, std::string_view field,
                        std::string_view value, std::string_view why) {
  return absl::InvalidArgumentError(At(source, line) + "field " + std::string(field) + " " +
                                    QuoteValue(value) + " " + std::string(why));
}

// Exactly "YYYY-MM-DD HH:MM:SS" with an optional "." and 1..9 digits. absl::ParseTime
// alone is lenient (it takes "infinite-future", signs, padding, 60 seconds and any
// number of digits), so the shape is checked first.
bool HasTimestampShape(std::string_view v) {
  constexpr std::string_view kShape = "dddd-dd-dd dd:dd:dd";
  if (v.size() < kShape.size()) return false;
  for (std::size_t i = 0; i < kShape.size(); ++i) {
    const bool digit = v[i] >= '0' && v[i] <= '9';
    if (kShape[i] == 'd' ? !digit : v[i] != kShape[i]) return false;
  }
  if (v[17] > '5') return false;  // seconds 00..59: no leap second
  const std::string_view frac = v.substr(kShape.size());
  if (frac.empty()) return true;
  if (frac[0] != '.' || frac.size() < 2 || frac.size() > 10) return false;
  for (char c : frac.substr(1)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

absl::StatusOr<std::uint32_t> ParseCount(std::string_view source, std::size_t line,
                                         std::string_view field, std::string_view v) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    if (ec == std::errc::result_out_of_range) {
      return FieldError(source, line, field, v, "is out of range 1..1000000");
    }
    return FieldError(source, line, field, v, "is not an integer");
  }
  if (n < 1 || n > 1'000'000) return FieldError(source, line, field, v, "is out of range 1..1000000");
  return static_cast<std::uint32_t>(n);
}

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(std::string_view csv, std::string_view source) {
  std::vector<TraceRequest> out;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  absl::Time first = absl::InfinitePast();
  absl::Time prev = absl::InfinitePast();
  while (pos < csv.size()) {
    std::size_t eol = csv.find('\n', pos);
    if (eol == std::string_view::npos) eol = csv.size();
    std::string_view line = csv.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1) {
      if (line != kHeader) {
        return absl::InvalidArgumentError(At(source, 1) + "header " + QuoteValue(line) +
                                          " is not " + QuoteValue(kHeader));
      }
      continue;
    }
    if (line.empty()) return absl::InvalidArgumentError(At(source, line_no) + "line is empty");
    std::string_view fields[3];
    std::size_t n = 0;
    std::size_t start = 0;
    for (std::size_t i = 0; i <= line.size(); ++i) {
      if (i == line.size() || line[i] == ',') {
        if (n == 3) {
          return absl::InvalidArgumentError(At(source, line_no) +
                                            "has more than 3 fields: " + QuoteValue(line));
        }
        fields[n++] = line.substr(start, i - start);
        start = i + 1;
      }
    }
    if (n < 3) {
      static constexpr const char* kNames[] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
      return absl::InvalidArgumentError(At(source, line_no) + "field " + kNames[n] +
                                        " is missing: " + QuoteValue(line));
    }
    absl::Time t;
    std::string err;
    if (!HasTimestampShape(fields[0])) {
      return FieldError(source, line_no, "TIMESTAMP", fields[0],
                        "is not a time 'YYYY-MM-DD HH:MM:SS' with up to 9 fractional digits");
    }
    if (!absl::ParseTime("%Y-%m-%d %H:%M:%E*S", std::string(fields[0]), absl::UTCTimeZone(),
                         &t, &err)) {
      return FieldError(source, line_no, "TIMESTAMP", fields[0],
                        "is not a time 'YYYY-MM-DD HH:MM:SS.f' (" + err + ")");
    }
    if (t < prev) {
      return FieldError(source, line_no, "TIMESTAMP", fields[0],
                        "is earlier than the line before: the trace must be sorted by time");
    }
    if (out.empty()) first = t;
    prev = t;
    auto context = ParseCount(source, line_no, "ContextTokens", fields[1]);
    if (!context.ok()) return context.status();
    auto generated = ParseCount(source, line_no, "GeneratedTokens", fields[2]);
    if (!generated.ok()) return generated.status();
    out.push_back({absl::ToInt64Microseconds(t - first), *context, *generated});
  }
  if (line_no == 0) return absl::InvalidArgumentError(std::string(source) + " is empty");
  if (out.empty()) return absl::InvalidArgumentError(std::string(source) + " has no requests");
  return out;
}

namespace {

std::string Kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<std::string> ReadInputFile(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = Kind(st.st_mode);
    ::close(fd);
    return absl::InvalidArgumentError("'" + path + "' is " + kind + ", not a regular file");
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError("'" + path + "' is " + std::to_string(st.st_size) +
                                      " bytes, more than the " + std::to_string(max_bytes) +
                                      " an input may have");
  }
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  bytes.resize(got);
  static constexpr unsigned char kZstdMagic[] = {0x28, 0xB5, 0x2F, 0xFD};
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kZstdMagic, 4) == 0) {
    auto text = inferq::ZstdDecompress(bytes, max_bytes);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          "'" + path + "': " + std::string(text.status().message()));
    }
    return *std::move(text);
  }
  return bytes;
}

absl::Status CheckOutputPath(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError("'" + path + "' is " + Kind(st.st_mode) +
                                      ", not a file to write");
  }
  if (errno != ENOENT) {
    return absl::InvalidArgumentError("cannot write '" + path + "': " + std::strerror(errno));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return absl::InvalidArgumentError("cannot write '" + path + "': no directory '" +
                                      parent.string() + "'");
  }
  if (::access(parent.empty() ? "." : parent.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError("cannot write '" + path + "': " + std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadInputFile(path, std::size_t{1} << 30);
  if (!bytes.ok()) {
    const std::string msg(bytes.status().message());
    if (bytes.status().code() == absl::StatusCode::kNotFound) {  // "cannot open 'P': why"
      return absl::NotFoundError("cannot open trace " + msg.substr(std::string("cannot open ").size()));
    }
    return absl::Status(bytes.status().code(), "trace " + msg);
  }
  return ParseTrace(*bytes, path);
}

}  // namespace inferq::example
