// inferq-state: look into a Delta-State Log directory without changing it.
//
//   inferq-state inspect DIR                         segments, checkpoints, tx range,
//                                                    chain status
//   inferq-state verify DIR                          strict recovery + VerifyChain
//   inferq-state dump [--allow-damage] DIR [PREFIX]  key<TAB>value lines (recovered
//                                                    point-in-time); PREFIX takes the
//                                                    same escapes as the output
//
// A file stream's directory (its stream logs: StreamLog, log-<20 digits>.seg) is
// checked by inspect and verify too: every stream log in it (the messages, and the
// logs in its subdirectories such as a work queue's removed/ and durable consumers'
// consumers/<name>/) is opened read-only in strict recovery, which checks every
// frame's checksum, the tx_ids and the hash chain. dump refuses it (no keys).
//
// Keys and values are printed with \t, \n, \\ and bytes outside printable ASCII as
// \xNN. Exit status (kHelp spells it out): 0 fine (and for --help, --version), 1
// damage, not a state directory, or an error reading it, 2 usage.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <map>

#include "inferq/state/state_store.hpp"
#include "inferq/state/stream_log.hpp"
#include "inferq/version.hpp"
#include "read_only_file_system.hpp"

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

constexpr char kHelp[] =
    "usage: inferq-state inspect DIR\n"
    "       inferq-state verify DIR\n"
    "       inferq-state dump [--allow-damage] DIR [PREFIX]\n"
    "       inferq-state --help | --version\n"
    "\n"
    "Reads a StateStore directory (the Delta-State Log: wal-*.log segments, ckpt-*\n"
    "checkpoints, IDENTITY) without changing it; safe next to a running writer.\n"
    "inspect and verify also check a file stream's directory (log-*.seg stream\n"
    "logs, in it and in its subdirectories such as removed/ and consumers/<name>/):\n"
    "every frame's checksum, the tx_ids and the hash chain, without changing a\n"
    "file; the stream must not be open (its LOCK held: that is an error, exit 1).\n"
    "\n"
    "commands:\n"
    "  inspect DIR   every checkpoint and log segment with its tx_id range and any\n"
    "                problem, the last tx_id point-in-time recovery would reach, and\n"
    "                whether strict recovery (hash chain included) passes.\n"
    "                Exit 0 when the chain is intact, 1 otherwise.\n"
    "  verify DIR    strict recovery and a check of the whole SHA-256 hash chain:\n"
    "                prints \"ok: N keys at tx_id T; ...\" and exits 0, or prints\n"
    "                \"FAILED: <status>\" naming the file, offset and tx_id, exit 1.\n"
    "                A stream directory: a line per stream log (segments, records,\n"
    "                tx_ids, or FAILED naming the file, offset and tx_id), then\n"
    "                \"ok: N stream logs, R records verified\" (exit 0) or\n"
    "                \"FAILED: D of N stream logs are damaged\" (exit 1).\n"
    "  dump DIR [PREFIX]\n"
    "                key<TAB>value for every key starting with PREFIX, in key order,\n"
    "                as point-in-time recovery sees the store. Keys, values and\n"
    "                PREFIX use the escapes \\\\ \\t \\n \\xNN. When recovery had\n"
    "                to cut off a torn tail or do without a damaged checkpoint, or\n"
    "                the chain is broken, the damage is reported on stderr and the\n"
    "                exit status is 1, unless --allow-damage is given. Damage that\n"
    "                point-in-time recovery cannot pass (a bad record in the middle\n"
    "                of the log, a gap in tx_ids) prints no keys and exits 1 even\n"
    "                with --allow-damage; inspect shows where it is. A stream\n"
    "                directory has no keys: dump refuses it (exit 1).\n"
    "\n"
    "options:\n"
    "  --allow-damage  (dump) exit 0 after reporting recovered damage\n"
    "  --help, -h      this text\n"
    "  --version       the inferq version\n"
    "\n"
    "exit status: 0 ok; 1 damage, DIR is not an inferq state directory, an error\n"
    "reading it, or an error writing the output; 2 usage (unknown command or option,\n"
    "wrong arguments).\n";

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

int Usage(const std::string& problem) {
  std::fprintf(stderr, "inferq-state: %s (see inferq-state --help)\n", problem.c_str());
  return 2;
}

// Whether `name` is one of a store's own files: IDENTITY, a segment
// `wal-<20 digits>.log` or a checkpoint `ckpt-<20 digits>-full.zst` /
// `-incr.zst` (src/state/log_format.hpp has the formats).
bool IsStoreFileName(std::string_view name) {
  auto digits = [](std::string_view d) {
    return d.size() == 20 && std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (name == "IDENTITY") return true;
  if (name.size() == 28 && name.starts_with("wal-") && name.ends_with(".log")) {
    return digits(name.substr(4, 20));
  }
  if (name.size() == 34 && name.starts_with("ckpt-") && name[25] == '-') {
    const std::string_view rest = name.substr(26);
    return digits(name.substr(5, 20)) && (rest == "full.zst" || rest == "incr.zst");
  }
  return false;
}

// Whether `name` is a stream log segment, `log-<20 digits>.seg` (StreamLog).
bool IsStreamSegmentName(std::string_view name) {
  return name.size() == 28 && name.starts_with("log-") && name.ends_with(".seg") &&
         std::all_of(name.begin() + 4, name.begin() + 24, [](char c) { return c >= '0' && c <= '9'; });
}

// What a directory holds: a state store's files, a file stream's (stream log
// segments and no state store file), or neither (printed, with why).
enum class DirKind { kNone, kStateStore, kStream };

DirKind Classify(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    const int err = errno;
    const std::string why = ::stat(dir.c_str(), &st) == 0 ? "not a directory"
                            : err == ENOENT               ? "no such directory"
                                                          : std::strerror(err);
    std::fprintf(stderr, "inferq-state: '%s' is not an inferq state directory: %s\n",
                 Escape(dir).c_str(), why.c_str());
    return DirKind::kNone;
  }
  std::error_code ec;
  bool identity = false, stream_segments = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "IDENTITY") {
      identity = true;
    } else if (IsStoreFileName(name)) {
      return DirKind::kStateStore;
    } else if (IsStreamSegmentName(name)) {
      stream_segments = true;
    }
  }
  if (ec) {
    std::fprintf(stderr, "inferq-state: cannot list '%s': %s\n", Escape(dir).c_str(), ec.message().c_str());
    return DirKind::kNone;
  }
  if (stream_segments) return DirKind::kStream;
  if (identity) return DirKind::kStateStore;
  std::fprintf(stderr,
               "inferq-state: '%s' is not an inferq state directory (no IDENTITY, "
               "wal-<20 digits>.log or ckpt-<20 digits>-{full,incr}.zst file)\n",
               Escape(dir).c_str());
  return DirKind::kNone;
}

bool IsStateDir(const std::string& dir) {
  switch (Classify(dir)) {
    case DirKind::kStateStore:
      return true;
    case DirKind::kStream:
      std::fprintf(stderr,
                   "inferq-state: '%s' is a file stream's directory (stream logs, "
                   "log-<20 digits>.seg), not a StateStore: it has no keys to dump; "
                   "inspect and verify check it\n",
                   Escape(dir).c_str());
      return false;
    case DirKind::kNone:
      return false;
  }
  return false;
}

// --- File stream directories ---------------------------------------------------

bool HoldsStreamSegments(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (IsStreamSegmentName(entry.path().filename().string())) return true;
  }
  return false;
}

struct SegmentTally {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t records = 0;
  std::uint64_t first_tx = 0;
  std::uint64_t last_tx = 0;
};

// One stream log, opened read-only in strict recovery (ReadOnlyFileSystem).
struct StreamLogCheck {
  std::string name;  // relative to the stream directory; "." for itself
  absl::Status status;
  std::map<std::uint64_t, SegmentTally> segments;  // by first tx_id, as the files are named
  std::uint64_t records = 0;
  std::uint64_t first_tx = 0;
  std::uint64_t last_tx = 0;
};

StreamLogCheck CheckStreamLog(const std::string& dir, const std::string& name) {
  StreamLogCheck r;
  r.name = name;
  const std::string path = name == "." ? dir : dir + "/" + name;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
    const std::string file = entry.path().filename().string();
    if (!IsStreamSegmentName(file)) continue;
    SegmentTally& s = r.segments[std::stoull(file.substr(4, 20))];
    s.name = file;
    s.bytes = entry.file_size(ec);
  }
  inferq::StreamLogOptions o;
  o.dir = path;
  o.sync = inferq::SyncPolicy::kNone;  // nothing is written: no fdatasync thread either
  o.recovery = inferq::RecoveryMode::kStrict;
  o.file_system = std::make_shared<inferq_state_tool::ReadOnlyFileSystem>();
  auto log = inferq::StreamLog::Open(o, [&](const inferq::StreamLog::Entry& e) {
    SegmentTally& s = r.segments[e.location.segment];
    if (s.records++ == 0) s.first_tx = e.tx;
    s.last_tx = e.tx;
    if (r.records++ == 0) r.first_tx = e.tx;
    r.last_tx = e.tx;
    return absl::OkStatus();
  });
  r.status = log.status();
  return r;
}

// Every stream log of the stream directory `dir` (itself first, then each directory
// under it holding stream log segments, in name order), and the files in it that
// belong to none (such as the engine's purges file), which no check covers.
std::vector<StreamLogCheck> CheckStreamDir(const std::string& dir, std::vector<std::string>& unchecked) {
  std::vector<std::string> logs = {"."};
  std::error_code ec;
  std::vector<std::filesystem::path> entries;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    entries.push_back(it->path());
  }
  std::sort(entries.begin(), entries.end());
  auto relative = [&](const std::filesystem::path& p) { return p.lexically_relative(dir).string(); };
  for (const auto& p : entries) {
    if (std::filesystem::is_directory(p, ec) && HoldsStreamSegments(p)) {
      logs.push_back(relative(p));
    }
  }
  for (const auto& p : entries) {
    if (std::filesystem::is_directory(p, ec)) continue;
    const std::string file = p.filename().string();
    const std::string parent = p.parent_path() == std::filesystem::path(dir) ? "." : relative(p.parent_path());
    const bool in_log = std::find(logs.begin(), logs.end(), parent) != logs.end();
    const bool log_file = file == "IDENTITY" || file == "LOCK" || IsStreamSegmentName(file) ||
                          (file.size() == 29 && file.starts_with("log-") && file.ends_with(".seal"));
    if (!(in_log && log_file)) unchecked.push_back(relative(p));
  }
  std::vector<StreamLogCheck> out;
  for (const std::string& name : logs) out.push_back(CheckStreamLog(dir, name));
  return out;
}

std::string TxRange(std::uint64_t records, std::uint64_t first, std::uint64_t last) {
  return records == 0 ? "" : ", tx_id " + std::to_string(first) + ".." + std::to_string(last);
}

int InspectStream(const std::string& dir) {
  std::vector<std::string> unchecked;
  const std::vector<StreamLogCheck> logs = CheckStreamDir(dir, unchecked);
  std::printf("stream directory %s\n", Escape(dir).c_str());
  bool ok = true;
  for (const StreamLogCheck& l : logs) {
    std::printf("stream log %s\n", Escape(l.name).c_str());
    std::printf("  segments: %zu\n", l.segments.size());
    for (const auto& [tx, s] : l.segments) {
      std::printf("    %s  %llu bytes  %llu records%s\n", s.name.c_str(),
                  static_cast<unsigned long long>(s.bytes), static_cast<unsigned long long>(s.records),
                  TxRange(s.records, s.first_tx, s.last_tx).c_str());
    }
    std::printf("  %llu records%s: %s\n", static_cast<unsigned long long>(l.records),
                TxRange(l.records, l.first_tx, l.last_tx).c_str(),
                l.status.ok() ? "chain ok" : ("FAILED: " + l.status.ToString()).c_str());
    ok = ok && l.status.ok();
  }
  for (const std::string& f : unchecked) std::printf("not a stream log file, not checked: %s\n", Escape(f).c_str());
  return ok ? 0 : 1;
}

int VerifyStream(const std::string& dir) {
  std::vector<std::string> unchecked;
  const std::vector<StreamLogCheck> logs = CheckStreamDir(dir, unchecked);
  std::size_t damaged = 0;
  std::uint64_t records = 0;
  for (const StreamLogCheck& l : logs) {
    if (!l.status.ok()) {
      ++damaged;
      std::printf("stream log %s: FAILED: %s\n", Escape(l.name).c_str(), l.status.ToString().c_str());
      continue;
    }
    records += l.records;
    std::printf("stream log %s: %zu segment%s, %llu records%s\n", Escape(l.name).c_str(), l.segments.size(),
                l.segments.size() == 1 ? "" : "s", static_cast<unsigned long long>(l.records),
                TxRange(l.records, l.first_tx, l.last_tx).c_str());
  }
  for (const std::string& f : unchecked) std::printf("not a stream log file, not checked: %s\n", Escape(f).c_str());
  if (damaged != 0) {
    std::printf("FAILED: %zu of %zu stream log%s damaged\n", damaged, logs.size(),
                logs.size() == 1 ? " is" : "s are");
    return 1;
  }
  std::printf("ok: %zu stream log%s, %llu records verified (frame checksums, tx_ids, hash chain)\n",
              logs.size(), logs.size() == 1 ? "" : "s", static_cast<unsigned long long>(records));
  return 0;
}

int Inspect(const std::string& dir) {
  const DirKind kind = Classify(dir);
  if (kind == DirKind::kStream) return InspectStream(dir);
  if (kind != DirKind::kStateStore) return 1;
  auto r = inferq::StateStore::Inspect(dir);
  if (!r.ok()) {
    std::fprintf(stderr, "inferq-state: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("directory %s\n", Escape(dir).c_str());  // a name cannot fake a line
  std::printf("checkpoints: %zu\n", r->checkpoints.size());
  for (const auto& c : r->checkpoints) {
    std::printf("  %s  %s tx_id %llu", c.name.c_str(), c.full ? "full" : "incremental",
                static_cast<unsigned long long>(c.tx));
    if (!c.full) std::printf(" on %llu", static_cast<unsigned long long>(c.base_tx));
    std::printf("  %llu entries  %llu bytes  %s\n", static_cast<unsigned long long>(c.entries),
                static_cast<unsigned long long>(c.bytes),
                c.problem.empty() ? "ok"
                : c.unreadable    ? ("UNREADABLE: " + c.problem).c_str()
                                  : ("DAMAGED: " + c.problem).c_str());
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
    std::printf("  %s\n", s.problem.empty() ? "ok"
                          : s.unreadable    ? ("UNREADABLE: " + s.problem).c_str()
                                            : ("stops: " + s.problem).c_str());
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
  const DirKind kind = Classify(dir);
  if (kind == DirKind::kStream) return VerifyStream(dir);
  if (kind != DirKind::kStateStore) return 1;
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

int Dump(const std::string& dir, const std::string& prefix, bool allow_damage) {
  if (!IsStateDir(dir)) return 1;
  auto s = OpenReadOnly(dir, inferq::RecoveryMode::kPointInTime);
  if (!s.ok()) {
    std::fprintf(stderr, "inferq-state: %s\n", s.status().ToString().c_str());
    return 1;
  }
  (*s)->Scan(prefix, [](std::string_view k, std::string_view v) {
    std::printf("%s\t%s\n", Escape(k).c_str(), Escape(v).c_str());
  });
  // What point-in-time recovery passed over to get here: a torn tail it cut off (in
  // memory only: the store is read-only), damaged checkpoints it did without, and
  // whatever else strict recovery refuses.
  std::vector<std::string> damage;
  const auto stats = (*s)->Stats();
  bool live_tail = false;
  if (stats.torn_tail_bytes > 0) {
    // Next to a live writer the "torn tail" may be the record it is writing: a second
    // look a moment later that finds the log grown past it says so.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto again = OpenReadOnly(dir, inferq::RecoveryMode::kPointInTime);
    live_tail = again.ok() && (*again)->Stats().last_tx_id > stats.last_tx_id;
  }
  if (stats.torn_tail_bytes > 0 && !live_tail) {
    damage.push_back("a torn tail of " + std::to_string(stats.torn_tail_bytes) +
                     " bytes after tx_id " + std::to_string(stats.last_tx_id) + " was left out");
  }
  if (auto r = inferq::StateStore::Inspect(dir); r.ok()) {
    for (const auto& c : r->checkpoints) {
      if (!c.problem.empty()) {
        damage.push_back("checkpoint '" + c.name + "' is damaged and was not used: " + c.problem);
      }
    }
    for (std::size_t i = 0; i < r->segments.size(); ++i) {
      const auto& seg = r->segments[i];
      const bool is_torn_tail = i + 1 == r->segments.size() && stats.torn_tail_bytes > 0;
      if (live_tail) continue;  // the store moved on since: its files are a writer's
      if (!seg.problem.empty() && !is_torn_tail) {
        damage.push_back("log segment '" + seg.name + "' stops early: " + seg.problem);
      }
    }
    if (!r->chain.ok() && damage.empty() && !live_tail) {
      damage.push_back("strict recovery fails: " + std::string(r->chain.message()));
    }
  } else {
    damage.push_back("the files could not be inspected: " + std::string(r.status().message()));
  }
  if (damage.empty()) return 0;
  std::fflush(stdout);
  for (const std::string& d : damage) {
    std::fprintf(stderr, "inferq-state: dump of '%s' is of damaged files: %s\n", Escape(dir).c_str(), d.c_str());
  }
  return allow_damage ? 0 : 1;
}

// The exit status after the output is written: a failed write to stdout (a full
// disk, a closed pipe) makes a dump incomplete, so it is an error (exit 1).
int Finish(int status) {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "inferq-state: writing the output failed: %s\n", std::strerror(errno));
    return 1;
  }
  return status;
}

int Run(int argc, char** argv) {
  std::vector<std::string> args;
  bool allow_damage = false;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (options_done || a.empty() || a[0] != '-' || a == "-") {
      args.push_back(a);
    } else if (a == "--") {
      options_done = true;
    } else if (a == "--help" || a == "-h") {
      std::printf("%s", kHelp);
      return 0;
    } else if (a == "--version") {
      std::printf("inferq-state %s\n", INFERQ_VERSION_STRING);
      return 0;
    } else if (a == "--allow-damage") {
      allow_damage = true;
    } else if (a.starts_with("--allow-damage=")) {
      return Usage("option --allow-damage takes no value, got '" + a + "'");
    } else {
      return Usage("unknown option '" + a + "'");
    }
  }
  if (args.empty()) return Usage("no command given (inspect, verify or dump)");
  const std::string& cmd = args[0];
  const std::size_t operands = args.size() - 1;
  if (cmd != "inspect" && cmd != "verify" && cmd != "dump") {
    return Usage("unknown command '" + cmd + "' (inspect, verify or dump)");
  }
  if (allow_damage && cmd != "dump") return Usage("--allow-damage is an option of dump only");
  if (cmd == "dump") {
    if (operands < 1 || operands > 2) {
      return Usage("dump takes DIR and an optional PREFIX, got " + std::to_string(operands) +
                   " arguments");
    }
    const auto prefix = Unescape(operands == 2 ? args[2] : "");
    if (!prefix) {
      return Usage("PREFIX '" + args[2] + "' has a bad escape (use \\\\, \\t, \\n, \\xNN)");
    }
    return Dump(args[1], *prefix, allow_damage);
  }
  if (operands != 1) {
    return Usage(cmd + " takes one directory, got " + std::to_string(operands) + " arguments");
  }
  return cmd == "inspect" ? Inspect(args[1]) : Verify(args[1]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Finish(Run(argc, argv));
  } catch (const std::bad_alloc&) {  // a store larger than the memory it may use
    std::fprintf(stderr, "inferq-state: out of memory (the store's files are read whole)\n");
    return 1;
  }
}
