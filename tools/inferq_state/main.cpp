// inferq-state: look into a Delta-State Log directory without changing it.
//
//   inferq-state inspect DIR          segments, checkpoints, tx range, chain status
//   inferq-state verify DIR           strict recovery + VerifyChain; exit 1 on damage
//   inferq-state dump DIR [PREFIX]    key<TAB>value lines (recovered point-in-time);
//                                     PREFIX takes the same escapes as the output
//
// Keys and values are printed with \t, \n, \\ and bytes outside printable ASCII as
// \xNN. Exit status: 0 fine (and for --help), 1 damage or an error reading the
// directory, 2 usage.
#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "inferq/state/state_store.hpp"

namespace {

std::string Escape(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u >= 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

constexpr char kUsage[] =
    "usage: inferq-state inspect DIR\n"
    "       inferq-state verify DIR\n"
    "       inferq-state dump DIR [PREFIX]\n";

// The inverse of Escape, for a PREFIX given on the command line: \\, \t, \n, \xNN.
std::optional<std::string> Unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i == s.size()) return std::nullopt;
    if (s[i] == '\\') {
      out += '\\';
    } else if (s[i] == 't') {
      out += '\t';
    } else if (s[i] == 'n') {
      out += '\n';
    } else if (s[i] == 'x' && i + 2 < s.size() &&
               std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

int Usage() {
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

int Inspect(const std::string& dir) {
  auto r = inferq::StateStore::Inspect(dir);
  if (!r.ok()) {
    std::fprintf(stderr, "inferq-state: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("directory %s\n", dir.c_str());
  std::printf("checkpoints: %zu\n", r->checkpoints.size());
  for (const auto& c : r->checkpoints) {
    std::printf("  %s  %s tx_id %llu", c.name.c_str(), c.full ? "full" : "incremental",
                static_cast<unsigned long long>(c.tx));
    if (!c.full) std::printf(" on %llu", static_cast<unsigned long long>(c.base_tx));
    std::printf("  %llu entries  %llu bytes  %s\n", static_cast<unsigned long long>(c.entries),
                static_cast<unsigned long long>(c.bytes),
                c.problem.empty() ? "ok" : ("DAMAGED: " + c.problem).c_str());
  }
  std::printf("segments: %zu\n", r->segments.size());
  for (const auto& s : r->segments) {
    std::printf("  %s  %llu bytes (%llu used)  %llu records", s.name.c_str(),
                static_cast<unsigned long long>(s.bytes), static_cast<unsigned long long>(s.used_bytes),
                static_cast<unsigned long long>(s.records));
    if (s.records != 0) {
      std::printf("  tx_id %llu..%llu", static_cast<unsigned long long>(s.first_tx),
                  static_cast<unsigned long long>(s.last_tx));
    }
    std::printf("  %s\n", s.problem.empty() ? "ok" : ("stops: " + s.problem).c_str());
  }
  std::printf("log tx_ids from %llu\n", static_cast<unsigned long long>(r->first_tx));
  if (r->point_in_time.ok()) {
    std::printf("last recoverable tx_id %llu\n", static_cast<unsigned long long>(r->last_tx));
  } else {
    std::printf("not recoverable: %s\n", std::string(r->point_in_time.message()).c_str());
  }
  std::printf("chain %s\n", r->chain.ok() ? "ok" : std::string(r->chain.message()).c_str());
  return r->chain.ok() ? 0 : 1;
}

absl::StatusOr<std::unique_ptr<inferq::StateStore>> OpenReadOnly(const std::string& dir,
                                                                 inferq::RecoveryMode mode) {
  inferq::StateStoreOptions o;
  o.dir = dir;
  o.read_only = true;
  o.recovery = mode;
  o.checkpoint_interval = absl::ZeroDuration();
  o.checkpoint_log_bytes = 0;
  return inferq::StateStore::Open(o);
}

int Verify(const std::string& dir) {
  auto s = OpenReadOnly(dir, inferq::RecoveryMode::kStrict);
  absl::Status st = s.ok() ? (*s)->VerifyChain() : s.status();
  if (!st.ok()) {
    std::printf("FAILED: %s\n", st.ToString().c_str());
    return 1;
  }
  const auto stats = (*s)->Stats();
  std::printf("ok: %llu keys at tx_id %llu; %llu checkpoints and %llu log records verified\n",
              static_cast<unsigned long long>(stats.keys),
              static_cast<unsigned long long>(stats.last_tx_id),
              static_cast<unsigned long long>(stats.recovered_checkpoints),
              static_cast<unsigned long long>(stats.recovered_log_records));
  return 0;
}

int Dump(const std::string& dir, const std::string& prefix) {
  auto s = OpenReadOnly(dir, inferq::RecoveryMode::kPointInTime);
  if (!s.ok()) {
    std::fprintf(stderr, "inferq-state: %s\n", s.status().ToString().c_str());
    return 1;
  }
  (*s)->Scan(prefix, [](std::string_view k, std::string_view v) {
    std::printf("%s\t%s\n", Escape(k).c_str(), Escape(v).c_str());
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (argc < 3) return Usage();
  const std::string cmd = argv[1];
  const std::string dir = argv[2];
  if (cmd == "inspect" && argc == 3) return Inspect(dir);
  if (cmd == "verify" && argc == 3) return Verify(dir);
  if (cmd == "dump" && (argc == 3 || argc == 4)) {
    const auto prefix = Unescape(argc == 4 ? argv[3] : "");
    if (!prefix) {
      std::fprintf(stderr, "inferq-state: PREFIX '%s' has a bad escape (use \\\\, \\t, \\n, \\xNN)\n", argv[3]);
      return 2;
    }
    return Dump(dir, *prefix);
  }
  return Usage();
}
