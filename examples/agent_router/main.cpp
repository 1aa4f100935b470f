// agent_router: an agent runtime in miniature on real tool calls, through inferq's
// public API only.
//
// Data: the Berkeley Function Calling Leaderboard, live multiple (BFCL v4; Yan, Mao,
// Ji, Zhang, Patil, Stoica, Gonzalez, 2024; Apache License 2.0; examples/data/README.md).
//
//  - Every candidate function of every request is a tool: (name, parameter
//    definition), a definition converted to JSON Schema by BfclToJsonSchema
//    (bfcl.hpp) and compiled as a Predicate::JsonSchema. The same name can come with
//    different definitions in different requests; each is its own tool version
//    (header Tool-Version), so a call is checked against the definition its request
//    offered.
//  - Tools are grouped into families by the name's prefix (ToolFamily); each family is
//    one registered function (Engine::RegisterFunction) serving the subjects of its
//    tools (agent.tool.<name>, ToolSubject) on --runners threads, the consumer-group
//    members of its stream. Its admission (FunctionOptions::admit) checks a call
//    against its tool's schema (Predicate::Check), so a call that breaks the schema is
//    refused before any runner sees it and lands in the dead-letter subject with the
//    reason, which names the argument.
//  - The "model" is the ground truth: for each request, its calls are made with
//    Engine::StartCall, each argument its first acceptable value, the calls of one
//    request concurrently; --concurrency agents run requests in parallel.
//  - Faults (seeded, --fault-rate F): a call is mutated to break its schema with
//    probability F (a wrong type, a missing required argument, a value outside an
//    enum); a call that passes is made faulty at run time with probability F (its
//    runner throws on every try, throws on the first try only, or is slow past the
//    call's --timeout-ms). Throwing tries are retried up to --max-deliver.
//  - Every call ends as exactly one of: replied, refused (schema), dead-lettered
//    (retries used up, or timed out). The dead letters are counted again from the
//    dead-letter subjects, and the sum is checked.
//  - Agent memory: each session's calls and results are kept in a StateStore under
//    session.<request id>.*, one transaction per finished call; --state-dir keeps it,
//    and a second run over the same directory finds every session.
//
// Exit status: 0 every call accounted for (and the dead-letter subjects agree); 1 a
// call lost or miscounted, or input or the state directory could not be read; 2 bad
// usage.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "bfcl.hpp"
#include "trace.hpp"
#include "inferq/inferq.hpp"

namespace {

using inferq::example::BfclAnswer;
using inferq::example::BfclRequest;

struct Options {
  std::string requests = INFERQ_BFCL_REQUESTS;
  std::string answers = INFERQ_BFCL_ANSWERS;
  std::size_t limit = 0;  // 0 = all
  double fault_rate = 0;
  std::uint64_t seed = 1;
  std::string state_dir;
  std::string json;
  std::uint32_t runners = 2;
  std::int64_t max_deliver = 3;
  double timeout_ms = 1000;
  std::uint32_t concurrency = 4;
};

constexpr char kUsage[] =
    "usage: agent_router [options]   (--option VALUE or --option=VALUE)\n"
    "Runs the Berkeley Function Calling Leaderboard's live tool calls through inferq as\n"
    "an agent runtime would: tools registered per family, calls checked against their\n"
    "JSON Schema before a runner sees them, retries, dead letters, session memory in a\n"
    "StateStore. Prints calls by outcome, per tool family, latency and refusals.\n"
    "\n"
    "  --requests FILE     BFCL requests, JSON Lines, plain or .zst (default: bundled)\n"
    "  --answers FILE      BFCL ground truth, same format (default: bundled)\n"
    "  --limit N           only the first N requests, 1..1e6 (default all)\n"
    "  --fault-rate F      share of calls mutated to break their schema, and of the\n"
    "                      rest made to fail at run time, 0..1 (default 0)\n"
    "  --seed N            seed of the faults, 0..2^64-1 (default 1)\n"
    "  --state-dir DIR     keep the agent memory (StateStore) in DIR (default: a\n"
    "                      temporary directory, removed at exit)\n"
    "  --json FILE         write the summary as JSON\n"
    "  --runners N         runner threads per tool family, 1..16 (default 2)\n"
    "  --max-deliver N     tries of a call whose runner fails, 1..10 (default 3)\n"
    "  --timeout-ms X      time limit of a call, queued and running, 10..600000\n"
    "                      (default 1000)\n"
    "  --concurrency N     agents (requests in flight), 1..64 (default 4)\n"
    "  --help, -h          this text\n"
    "  --version           the inferq version\n"
    "\n"
    "exit status: 0 every call ended as exactly one of replied, refused or\n"
    "dead-lettered, and the dead-letter subjects agree; 1 a call lost or miscounted,\n"
    "or a file or the state directory could not be read; 2 a bad option or value.\n";

[[noreturn]] void Fail(const std::string& msg, int code = 2) {
  std::fprintf(stderr, "agent_router: %s\n", msg.c_str());
  std::exit(code);
}

std::uint64_t ParseUint(const std::string& flag, const std::string& v, std::uint64_t lo,
                        std::uint64_t hi) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  if (v.empty() || v[0] == '-' || end != v.data() + v.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    if (!v.empty() && v[0] == '-' && v.size() > 1 && v.find_first_not_of("0123456789", 1) == std::string::npos) {
      Fail(flag + " '" + v + "' is outside " + range);
    }
    Fail(flag + " '" + v + "' is not an integer (expected " + range + ")");
  }
  if (ec == std::errc::result_out_of_range || n < lo || n > hi) Fail(flag + " '" + v + "' is outside " + range);
  return n;
}

double ParseDouble(const std::string& flag, const std::string& v, double lo, double hi,
                   const std::string& range) {
  double d = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (v.empty() || end != v.data() + v.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range) || d != d) {
    Fail(flag + " '" + v + "' is not a number (expected " + range + ")");
  }
  if (ec == std::errc::result_out_of_range || d < lo || d > hi) Fail(flag + " '" + v + "' is outside " + range);
  return d;
}

Options ParseArgs(int argc, char** argv) {
  static const std::set<std::string> kValued = {
      "--requests", "--answers", "--limit", "--fault-rate", "--seed", "--state-dir", "--json",
      "--runners", "--max-deliver", "--timeout-ms", "--concurrency"};
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--version") {
      std::printf("agent_router (inferq %s)\n", INFERQ_VERSION_STRING);
      std::exit(0);
    }
    std::string v;
    if (const std::size_t eq = a.find('='); a.starts_with("--") && eq != std::string::npos) {
      v = a.substr(eq + 1);
      a.resize(eq);
      if (kValued.count(a) == 0) Fail("unknown option '" + a + "' (see --help)");
    } else if (kValued.count(a) == 0) {
      Fail("unknown option '" + a + "' (see --help)");
    } else if (i + 1 >= argc) {
      Fail(a + " needs a value (see --help)");
    } else {
      v = argv[++i];
    }
    if ((a == "--requests" || a == "--answers") && v.empty()) Fail(a + " needs a file name");
    if (a == "--requests") o.requests = v;
    else if (a == "--answers") o.answers = v;
    else if (a == "--limit") o.limit = ParseUint(a, v, 1, 1'000'000);
    else if (a == "--fault-rate") o.fault_rate = ParseDouble(a, v, 0, 1, "0..1");
    else if (a == "--seed") o.seed = ParseUint(a, v, 0, UINT64_MAX);
    else if (a == "--state-dir") {
      if (v.empty()) Fail("--state-dir needs a directory");
      o.state_dir = v;
    }
    else if (a == "--json") {
      if (v.empty()) Fail("--json needs a file name");
      o.json = v;
    }
    else if (a == "--runners") o.runners = static_cast<std::uint32_t>(ParseUint(a, v, 1, 16));
    else if (a == "--max-deliver") o.max_deliver = static_cast<std::int64_t>(ParseUint(a, v, 1, 10));
    else if (a == "--timeout-ms") o.timeout_ms = ParseDouble(a, v, 10, 600000, "10..600000");
    else if (a == "--concurrency") o.concurrency = static_cast<std::uint32_t>(ParseUint(a, v, 1, 64));
  }
  if (!o.state_dir.empty() && !o.json.empty()) {
    // The summary must not land on (or in) the agent memory.
    std::error_code ec;
    const auto dir = std::filesystem::weakly_canonical(o.state_dir, ec);
    const auto json = std::filesystem::weakly_canonical(o.json, ec);
    const auto [d_end, j_it] = std::mismatch(dir.begin(), dir.end(), json.begin(), json.end());
    if (d_end == dir.end()) {
      Fail("--json '" + o.json + "' is in --state-dir '" + o.state_dir + "' (it would overwrite the agent memory)");
    }
  }
  return o;
}

// splitmix64: a seed per (request, call), so faults do not depend on thread timing
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", 2014).
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
struct Rng {
  std::uint64_t state;
  std::uint64_t Next() { return state = Mix(state); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  std::size_t Below(std::size_t n) { return static_cast<std::size_t>(Next() % n); }
};

std::string Hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
// FNV-1a 64 of the converted schema: the tool version.
std::uint64_t Fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// A tool: one (name, definition) a request offered.
struct Tool {
  std::string name;
  std::string version;      // Hex64(Fnv1a(schema))
  std::string subject;      // ToolSubject(name)
  std::string family;       // ToolFamily(name)
  std::string schema;       // JSON Schema text
  inferq::Predicate check;  // Predicate::JsonSchema(schema)
};

// What a call is made to do, decided before it is made.
enum class Fault { kNone, kWrongType, kMissingRequired, kNotInEnum, kThrowAlways, kThrowOnce, kSlow };
const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kNone: return "none";
    case Fault::kWrongType: return "wrong_type";
    case Fault::kMissingRequired: return "missing_required";
    case Fault::kNotInEnum: return "not_in_enum";
    case Fault::kThrowAlways: return "throw_always";
    case Fault::kThrowOnce: return "throw_once";
    case Fault::kSlow: return "slow";
  }
  return "?";
}

std::string Json(const rapidjson::Value& v) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  v.Accept(w);
  return std::string(sb.GetString(), sb.GetSize());
}

// Breaks `args` (a JSON object) against `schema` as `kind` says; returns the argument
// it changed, or "" when the schema gives that kind nothing to break.
std::string Mutate(Fault kind, const std::string& schema_text, rapidjson::Document& args, Rng& rng) {
  rapidjson::Document schema;
  schema.Parse(schema_text.c_str());
  auto& a = args.GetAllocator();
  const auto props = schema.FindMember("properties");
  const bool has_props = props != schema.MemberEnd() && props->value.IsObject();
  std::vector<std::string> candidates;
  if (kind == Fault::kMissingRequired) {
    if (auto req = schema.FindMember("required"); req != schema.MemberEnd() && req->value.IsArray()) {
      for (const auto& r : req->value.GetArray()) {
        if (r.IsString() && args.HasMember(r)) candidates.emplace_back(r.GetString(), r.GetStringLength());
      }
    }
    if (candidates.empty()) return "";
    const std::string victim = candidates[rng.Below(candidates.size())];
    args.RemoveMember(rapidjson::StringRef(victim.data(), victim.size()));
    return victim;
  }
  if (!has_props) return "";
  for (const auto& p : props->value.GetObject()) {
    if (!p.value.IsObject()) continue;
    const auto type = p.value.FindMember("type");
    if (kind == Fault::kWrongType && type != p.value.MemberEnd() && type->value.IsString()) {
      candidates.emplace_back(p.name.GetString(), p.name.GetStringLength());
    }
    if (kind == Fault::kNotInEnum) {
      const auto e = p.value.FindMember("enum");
      if (e != p.value.MemberEnd() && e->value.IsArray() && !e->value.Empty()) {
        candidates.emplace_back(p.name.GetString(), p.name.GetStringLength());
      }
    }
  }
  if (candidates.empty()) return "";
  const std::string victim = candidates[rng.Below(candidates.size())];
  const std::string type = [&] {
    const auto& p = props->value.FindMember(rapidjson::StringRef(victim.data(), victim.size()))->value;
    const auto t = p.FindMember("type");
    return t != p.MemberEnd() && t->value.IsString() ? std::string(t->value.GetString()) : "";
  }();
  rapidjson::Value bad;
  if (kind == Fault::kWrongType) {
    if (type == "string") {
      bad.SetInt(12345);
    } else {
      const std::string text = "not a " + type;  // wrong for integer, number, boolean, object, array
      bad.SetString(text.c_str(), static_cast<rapidjson::SizeType>(text.size()), a);
    }
    if (type == "null") bad.SetInt(0);
  } else {  // kNotInEnum: a value no enum of the data holds, of the property's type
    if (type == "integer" || type == "number") {
      bad.SetInt(-987654321);
    } else {
      bad.SetString("__not_in_enum__", a);
    }
  }
  rapidjson::Value key(victim.data(), static_cast<rapidjson::SizeType>(victim.size()), a);
  args.RemoveMember(rapidjson::StringRef(victim.data(), victim.size()));
  args.AddMember(key, bad, a);
  return victim;
}

struct Counts {
  std::uint64_t total = 0, replied = 0, refused = 0, dead_lettered = 0, lost = 0;
};

// A request id as one key token: '%' -> "%25", '.' -> "%2E".
std::string SessionToken(std::string_view id) {
  std::string out;
  for (char c : id) {
    if (c == '%') {
      out += "%25";
    } else if (c == '.') {
      out += "%2E";
    } else {
      out += c;
    }
  }
  return out;
}

// The temporary agent memory, removed by an atexit handler (Fail exits too).
std::string& TempStateDir() {
  static std::string dir;
  return dir;
}


}  // namespace

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);
  if (!opt.json.empty()) {
    if (absl::Status s = inferq::example::CheckOutputPath(opt.json); !s.ok()) {
      Fail("--json: " + std::string(s.message()), 1);
    }
  }
  auto requests_or = inferq::example::LoadBfclRequests(opt.requests);
  if (!requests_or.ok()) Fail(std::string(requests_or.status().message()), 1);
  auto answers_or = inferq::example::LoadBfclAnswers(opt.answers);
  if (!answers_or.ok()) Fail(std::string(answers_or.status().message()), 1);
  std::vector<BfclRequest> requests = *std::move(requests_or);
  if (opt.limit > 0 && opt.limit < requests.size()) requests.resize(opt.limit);
  std::unordered_map<std::string, const BfclAnswer*> answer_of;
  for (const BfclAnswer& a : *answers_or) answer_of.emplace(a.id, &a);
  std::unordered_set<std::string> ids;
  for (const BfclRequest& r : requests) {
    if (!ids.insert(r.id).second) Fail("request id '" + r.id + "' appears twice in '" + opt.requests + "'", 1);
    if (answer_of.count(r.id) == 0) Fail("request '" + r.id + "' has no answer in '" + opt.answers + "'", 1);
  }
  // Every ground-truth call resolved before anything runs: an answer the example
  // cannot use is bad input, named, not a call sent with made-up arguments.
  std::vector<std::vector<std::string>> arguments(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    for (const auto& call : answer_of.at(requests[i].id)->calls) {
      const bool offered_fn = std::any_of(requests[i].functions.begin(), requests[i].functions.end(),
                                          [&](const auto& f) { return f.name == call.name; });
      if (!offered_fn) {
        Fail("answer of request '" + requests[i].id + "' calls '" + call.name +
             "', which the request does not offer", 1);
      }
      absl::StatusOr<std::string> args = inferq::example::FirstAcceptableArguments(call.arguments);
      if (!args.ok()) {
        Fail("answer of request '" + requests[i].id + "', call '" + call.name + "': " +
             std::string(args.status().message()), 1);
      }
      arguments[i].push_back(*std::move(args));
    }
  }

  std::printf("agent_router: Berkeley Function Calling Leaderboard, live multiple (BFCL v4)\n");
  std::printf("  data: Yan, Mao, Ji, Zhang, Patil, Stoica, Gonzalez, \"Berkeley Function Calling\n"
              "  Leaderboard\", 2024; Apache License 2.0 (examples/data/README.md)\n");

  // ---- tools: every (name, definition) of every request --------------------------
  // Every tool's arguments are checked against its JSON Schema: a build of inferq
  // without JSON Schema support cannot run this example (found by the fresh-user
  // helper: each of 4178 definitions was reported as not a schema).
  if (absl::StatusOr<inferq::Predicate> probe = inferq::Predicate::JsonSchema("{}");
      !probe.ok() && probe.status().code() == absl::StatusCode::kUnimplemented) {
    Fail("this build of inferq has no JSON Schema support, which the tools' argument "
         "checks need (" + std::string(probe.status().message()) +
         "): install libvalijson-dev (./scripts/install-deps.sh --for tests), then "
         "configure and build again (cmake --preset release && cmake --build --preset "
         "release --target agent_router)", 1);
  }
  std::map<std::pair<std::string, std::string>, std::unique_ptr<Tool>> tools;  // (subject, version)
  // Per request: its function names and their tools (two names may share a subject
  // and a definition, and so a Tool).
  std::vector<std::vector<std::pair<std::string, const Tool*>>> offered(requests.size());
  std::map<std::string, std::set<std::string>> family_subjects;
  std::size_t bad_definitions = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    for (const auto& f : requests[i].functions) {
      absl::StatusOr<std::string> schema = inferq::example::BfclToJsonSchema(f.parameters);
      if (!schema.ok()) {
        Fail("request '" + requests[i].id + "' function '" + f.name + "': " +
                 std::string(schema.status().message()), 1);
      }
      const std::string subject = inferq::example::ToolSubject(f.name);
      const std::string version = Hex64(Fnv1a(*schema));
      auto& slot = tools[{subject, version}];
      if (!slot) {
        auto check = inferq::Predicate::JsonSchema(*schema);
        if (!check.ok()) {
          ++bad_definitions;  // not a schema valijson takes: report, do not register
          std::fprintf(stderr, "agent_router: tool '%s' of request '%s': %s\n", f.name.c_str(),
                       requests[i].id.c_str(), std::string(check.status().message()).c_str());
          continue;
        }
        // The family follows the subject, so that names that map to one subject
        // ("a b", "a_b") are served by one function.
        slot = std::make_unique<Tool>(Tool{f.name, version, subject,
                                           inferq::example::ToolFamily(subject.substr(11)), *schema,
                                           *check});
        family_subjects[slot->family].insert(subject);
      }
      offered[i].emplace_back(f.name, slot.get());
    }
  }
  if (bad_definitions > 0) Fail(std::to_string(bad_definitions) + " tool definitions are not JSON Schemas", 1);

  // ---- the engine, one function per tool family ----------------------------------
  auto engine_or = inferq::Engine::Create();
  if (!engine_or.ok()) Fail(engine_or.status().ToString(), 1);
  inferq::Engine& engine = **engine_or;
  // Every dead letter of every tool, counted again here (streams may overlap).
  if (absl::Status s = engine.AddStream({.name = "AGENT_DEAD", .subjects = {"fn.*.dead"}}); !s.ok()) {
    Fail(s.ToString(), 1);
  }
  auto dead_watch = engine.AddConsumer({.stream = "AGENT_DEAD", .name = "audit"});
  if (!dead_watch.ok()) Fail(dead_watch.status().ToString(), 1);

  const auto timeout = absl::Milliseconds(opt.timeout_ms);
  std::mutex seen_mu;
  std::unordered_set<std::string> seen_calls;  // call ids whose first try ran (kThrowOnce)
  std::map<std::string, std::atomic<std::uint64_t>> runs_by_family;
  for (const auto& [family, _] : family_subjects) runs_by_family[family];
  for (const auto& [family, subjects] : family_subjects) {
    std::atomic<std::uint64_t>* runs = &runs_by_family[family];
    auto handler = [&, runs](const inferq::Event& call) -> absl::StatusOr<inferq::Buffer> {
      runs->fetch_add(1, std::memory_order_relaxed);
      const std::string fault(call.headers.Get("Agent-Fault").value_or("none"));
      const std::string id(call.headers.Get(inferq::kCallIdHeader).value_or(""));
      if (fault == "throw_always") throw std::runtime_error("tool crashed (injected)");
      if (fault == "throw_once") {
        std::lock_guard lock(seen_mu);
        if (seen_calls.insert(id).second) throw std::runtime_error("tool crashed once (injected)");
      }
      // Slow: past the call's time limit (its reply, when it comes, is dropped).
      if (fault == "slow") std::this_thread::sleep_for(absl::ToChronoMilliseconds(timeout + absl::Milliseconds(50)));
      // The tool's work: a result naming the tool and echoing the arguments.
      return inferq::Buffer::FromString(R"({"tool":")" + call.subject.substr(11) + R"(","ok":true,"arguments":)" +
                                        std::string(call.payload.view()) + "}");
    };
    inferq::FunctionOptions fo;
    fo.workers = opt.runners;
    fo.max_deliver = opt.max_deliver;
    fo.subjects.assign(subjects.begin(), subjects.end());
    fo.admit = [&tools](const inferq::Event& call) -> absl::Status {
      const std::string version(call.headers.Get("Tool-Version").value_or(""));
      auto it = tools.find({call.subject, version});
      if (it == tools.end()) {
        return absl::InvalidArgumentError("no tool version '" + version + "' on " + call.subject);
      }
      return it->second->check.Check(call);
    };
    if (absl::Status s = engine.RegisterFunction(family, handler, std::move(fo)); !s.ok()) {
      Fail("tool family '" + family + "': " + s.ToString(), 1);
    }
  }

  // ---- agent memory ---------------------------------------------------------------
  std::string state_dir = opt.state_dir;
  const bool temp_state = state_dir.empty();
  if (temp_state) {
    // A new directory of our own (mkdtemp), removed at exit whatever the exit.
    std::string pattern = (std::filesystem::temp_directory_path() / "agent_router_XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      Fail("agent memory: cannot create a temporary directory '" + pattern + "': " + std::strerror(errno), 1);
    }
    state_dir = pattern;
    TempStateDir() = state_dir;
    std::atexit([] { std::filesystem::remove_all(TempStateDir()); });
  }
  inferq::StateStoreOptions so;
  so.dir = state_dir;
  so.sync = inferq::SyncPolicy::kGroupCommit;
  auto store_or = inferq::StateStore::Open(so);
  if (!store_or.ok()) Fail("agent memory: " + store_or.status().ToString(), 1);
  inferq::StateStore& store = **store_or;
  // Keys: session.<id with '%' and '.' escaped>.calls and ...call.<k>.<field>, so a
  // session's id is the key's second token whatever the id holds.
  auto sessions_in = [&store] {
    std::set<std::string> ids;
    store.Scan("session.", [&](std::string_view k, std::string_view) {
      const std::string_view rest = k.substr(8);
      ids.emplace(rest.substr(0, rest.find('.')));
    });
    return ids;
  };
  const std::size_t sessions_before = sessions_in().size();

  // ---- the agents ------------------------------------------------------------------
  struct CallRecord {
    std::string family;
    Fault fault = Fault::kNone;
    std::string mutated;  // the argument a schema fault changed
    enum Outcome { kReplied, kRefused, kDeadLettered, kLost } outcome = kLost;
    std::string error;
    double latency_us = 0;
  };
  std::vector<std::vector<CallRecord>> records(requests.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> memory_errors{0};
  auto agent = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < requests.size();) {
      const BfclRequest& req = requests[i];
      const BfclAnswer& ans = *answer_of.at(req.id);
      std::vector<inferq::PendingCall> pending;
      std::vector<std::chrono::steady_clock::time_point> started;
      std::vector<std::string> call_args;
      records[i].resize(ans.calls.size());
      for (std::size_t k = 0; k < ans.calls.size(); ++k) {
        CallRecord& rec = records[i][k];
        const auto& gt = ans.calls[k];
        const Tool* tool = nullptr;
        for (const auto& [name, t] : offered[i]) {
          if (name == gt.name) tool = t;
        }
        const std::string& args_text = arguments[i][k];
        rapidjson::Document args;
        args.Parse(args_text.data(), args_text.size());
        Rng rng{Mix(opt.seed ^ Mix(i * 64 + k))};
        if (tool != nullptr && opt.fault_rate > 0 && rng.Uniform() < opt.fault_rate) {
          // A schema fault: the first kind (from a random start) the schema allows.
          const Fault kinds[] = {Fault::kWrongType, Fault::kMissingRequired, Fault::kNotInEnum};
          const std::size_t first = rng.Below(3);
          for (std::size_t n = 0; n < 3 && rec.mutated.empty(); ++n) {
            const Fault kind = kinds[(first + n) % 3];
            rec.mutated = Mutate(kind, tool->schema, args, rng);
            if (!rec.mutated.empty()) rec.fault = kind;
          }
        }
        if (tool != nullptr && rec.fault == Fault::kNone && opt.fault_rate > 0 &&
            rng.Uniform() < opt.fault_rate) {
          const Fault kinds[] = {Fault::kThrowAlways, Fault::kThrowOnce, Fault::kSlow};
          rec.fault = kinds[rng.Below(3)];
        }
        inferq::Event call;
        call.subject = tool != nullptr ? tool->subject : inferq::example::ToolSubject(gt.name);
        call.payload = inferq::Buffer::FromString(Json(args));
        call.ttl = timeout;
        call.headers.Set("Session", req.id);
        call.headers.Set("Tool-Version", tool != nullptr ? tool->version : "");
        call.headers.Set("Agent-Fault", FaultName(rec.fault));
        rec.family = tool != nullptr ? tool->family : inferq::example::ToolFamily(gt.name);
        call_args.push_back(std::string(call.payload.view()));
        started.push_back(std::chrono::steady_clock::now());
        pending.push_back(engine.StartCall(rec.family, std::move(call)));  // parallel calls
      }
      for (std::size_t k = 0; k < pending.size(); ++k) {
        CallRecord& rec = records[i][k];
        absl::StatusOr<inferq::Buffer> reply = pending[k].reply.get();
        rec.latency_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                                   started[k]).count();
        std::string result;
        if (reply.ok()) {
          rec.outcome = CallRecord::kReplied;
          result = std::string(reply->view());
        } else {
          rec.error = std::string(reply.status().message());
          const auto code = reply.status().code();
          if (code == absl::StatusCode::kInvalidArgument && rec.error.find(" refused: ") != std::string::npos) {
            rec.outcome = CallRecord::kRefused;
          } else if (code == absl::StatusCode::kDeadlineExceeded ||
                     rec.error.find("(max_deliver)") != std::string::npos) {
            rec.outcome = CallRecord::kDeadLettered;
          } else {
            rec.outcome = CallRecord::kLost;
          }
        }
        // One transaction per finished call: the call and its result in the session.
        static const char* kOutcome[] = {"replied", "refused", "dead_lettered", "lost"};
        auto tx = store.Begin();
        const std::string key = "session." + SessionToken(req.id) + ".call." + std::to_string(k);
        tx.Put(key + ".tool", ans.calls[k].name);
        tx.Put(key + ".arguments", call_args[k]);
        tx.Put(key + ".outcome", kOutcome[rec.outcome]);
        tx.Put(key + ".result", reply.ok() ? result : rec.error);
        if (!tx.Commit().ok()) memory_errors.fetch_add(1);
      }
      // The session itself, also for a request with no calls.
      auto tx = store.Begin();
      tx.Put("session." + SessionToken(req.id) + ".calls", std::to_string(ans.calls.size()));
      if (!tx.Commit().ok()) memory_errors.fetch_add(1);
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> agents;
  for (std::uint32_t a = 0; a < opt.concurrency; ++a) agents.emplace_back(agent);
  for (auto& t : agents) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- accounting ------------------------------------------------------------------
  Counts all;
  std::map<std::string, Counts> by_family;
  std::map<std::string, std::uint64_t> refusals_by_reason;
  std::uint64_t refusals_naming_argument = 0, unmutated_refused = 0, first20_unchanged = 0,
                first20_calls = 0;
  inferq::Histogram latency_ns;  // call publish -> reply
  for (std::size_t i = 0; i < records.size(); ++i) {
    for (const CallRecord& rec : records[i]) {
      Counts& f = by_family[rec.family];
      ++all.total;
      ++f.total;
      latency_ns.Record(static_cast<std::uint64_t>(rec.latency_us * 1e3));
      switch (rec.outcome) {
        case CallRecord::kReplied: ++all.replied; ++f.replied; break;
        case CallRecord::kRefused: ++all.refused; ++f.refused; break;
        case CallRecord::kDeadLettered: ++all.dead_lettered; ++f.dead_lettered; break;
        case CallRecord::kLost: ++all.lost; ++f.lost;
          std::fprintf(stderr, "agent_router: call of request '%s' lost: %s\n", requests[i].id.c_str(), rec.error.c_str());
          break;
      }
      if (rec.outcome == CallRecord::kRefused) {
        if (rec.mutated.empty()) {
          ++unmutated_refused;
          ++refusals_by_reason["ground truth"];
          std::fprintf(stderr, "agent_router: ground-truth call of '%s' refused: %s\n",
                       requests[i].id.c_str(), rec.error.c_str());
        } else {
          ++refusals_by_reason[FaultName(rec.fault)];
          if (rec.error.find("'" + rec.mutated + "'") != std::string::npos ||
              rec.error.find("/" + inferq::example::PointerToken(rec.mutated) + ":") != std::string::npos) {
            ++refusals_naming_argument;
          }
        }
      }
      if (i < 20 && rec.mutated.empty()) {
        ++first20_calls;
        if (rec.outcome != CallRecord::kRefused) ++first20_unchanged;
      }
    }
  }
  // A request is completed when each of its calls ended (replied, refused or
  // dead-lettered).
  std::uint64_t requests_completed = 0;
  for (const auto& r : records) {
    requests_completed += std::none_of(r.begin(), r.end(), [](const CallRecord& c) {
      return c.outcome == CallRecord::kLost;
    });
  }
  std::uint64_t schema_faults = 0;
  std::map<std::string, std::uint64_t> run_faults;  // injected at run time, by kind
  std::map<std::string, std::uint64_t> dead_by_fault;  // dead-lettered calls, by what was injected
  for (const auto& r : records) {
    for (const CallRecord& rec : r) {
      schema_faults += !rec.mutated.empty();
      if (rec.mutated.empty() && rec.fault != Fault::kNone) ++run_faults[FaultName(rec.fault)];
      if (rec.outcome == CallRecord::kDeadLettered) ++dead_by_fault[FaultName(rec.fault)];
    }
  }
  // The dead letters, as the dead-letter subjects saw them.
  std::map<std::string, std::uint64_t> dead_by_reason;
  std::uint64_t dead_seen = 0;
  const std::uint64_t dead_expected = all.refused + all.dead_lettered;
  inferq::Member audit = *dead_watch->member(0);
  const auto audit_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (dead_seen < dead_expected && std::chrono::steady_clock::now() < audit_deadline) {
    auto m = audit.Next(absl::Milliseconds(100));
    if (!m.ok()) continue;
    ++dead_seen;
    ++dead_by_reason[std::string(m->event().headers.Get(inferq::kDeadLetterReasonHeader).value_or("?"))];
    (void)m->Ack();
  }
  // A little longer for any dead letter beyond the expected count.
  for (;;) {
    auto m = audit.Next(absl::Milliseconds(50));
    if (!m.ok()) break;
    ++dead_seen;
    ++dead_by_reason[std::string(m->event().headers.Get(inferq::kDeadLetterReasonHeader).value_or("?"))];
    (void)m->Ack();
  }
  const inferq::EngineStats stats = engine.Stats();
  std::uint64_t retries = 0;
  for (const auto& c : stats.consumers) {
    if (c.name == "handler") retries += c.naks;
  }
  const std::size_t sessions_after = sessions_in().size();
  const inferq::HistogramSnapshot latencies = latency_ns.Snapshot();
  auto Percentile = [](const inferq::HistogramSnapshot& h, double q) {  // µs
    return static_cast<double>(h.Percentile(q)) / 1e3;
  };

  // ---- the summary -----------------------------------------------------------------
  std::printf("  %zu requests, %zu tools (%zu names) in %zu families, %u runners each, %u agents\n",
              requests.size(), tools.size(),
              [&] {
                std::set<std::string> names;
                for (const auto& [k, t] : tools) names.insert(t->name);
                return names.size();
              }(),
              family_subjects.size(), opt.runners, opt.concurrency);
  std::printf("  faults: rate %.3g, seed %llu; timeout %.0f ms, max deliver %lld\n\n", opt.fault_rate,
              static_cast<unsigned long long>(opt.seed), opt.timeout_ms,
              static_cast<long long>(opt.max_deliver));
  std::printf("  requests   %zu total, %llu completed\n", requests.size(),
              static_cast<unsigned long long>(requests_completed));
  std::printf("  calls      %llu total: %llu replied, %llu refused, %llu dead-lettered, %llu lost\n",
              static_cast<unsigned long long>(all.total), static_cast<unsigned long long>(all.replied),
              static_cast<unsigned long long>(all.refused), static_cast<unsigned long long>(all.dead_lettered),
              static_cast<unsigned long long>(all.lost));
  std::printf("  refusals   %llu schema faults injected, %llu refused naming the argument;",
              static_cast<unsigned long long>(schema_faults),
              static_cast<unsigned long long>(refusals_naming_argument));
  for (const auto& [reason, n] : refusals_by_reason) {
    std::printf(" %s %llu", reason.c_str(), static_cast<unsigned long long>(n));
  }
  std::printf("\n  dead letters seen on fn.*.dead: %llu;", static_cast<unsigned long long>(dead_seen));
  for (const auto& [reason, n] : dead_by_reason) {
    std::printf(" %s %llu", reason.c_str(), static_cast<unsigned long long>(n));
  }
  std::printf("\n  run faults");
  for (const auto& [kind, n] : run_faults) std::printf(" %s %llu", kind.c_str(), static_cast<unsigned long long>(n));
  std::printf("; dead-lettered calls by fault:");
  for (const auto& [kind, n] : dead_by_fault) std::printf(" %s %llu", kind.c_str(), static_cast<unsigned long long>(n));
  std::printf("\n  retries    %llu (naks of failed tries)\n", static_cast<unsigned long long>(retries));
  std::printf("  latency    call publish -> reply (us): p50 %.1f  p95 %.1f  p99 %.1f  (%.2f s wall, %.0f calls/s)\n",
              Percentile(latencies, 0.50), Percentile(latencies, 0.95), Percentile(latencies, 0.99), wall,
              static_cast<double>(all.total) / wall);
  std::printf("  first 20   %llu of %llu unmutated ground-truth calls passed their schemas\n",
              static_cast<unsigned long long>(first20_unchanged), static_cast<unsigned long long>(first20_calls));
  std::printf("  memory     %zu sessions in '%s' (%zu found from an earlier run)%s\n", sessions_after,
              temp_state ? "(temporary)" : state_dir.c_str(), sessions_before,
              memory_errors.load() ? " COMMIT ERRORS" : "");
  std::printf("\n  family                         calls  replied  refused  dead  runs\n");
  std::vector<std::pair<std::uint64_t, std::string>> top;
  for (const auto& [f, c] : by_family) top.emplace_back(c.total, f);
  std::sort(top.rbegin(), top.rend());
  for (std::size_t n = 0; n < top.size() && n < 12; ++n) {
    const Counts& c = by_family[top[n].second];
    std::printf("  %-28s %7llu  %7llu  %7llu  %4llu  %4llu\n", top[n].second.c_str(),
                static_cast<unsigned long long>(c.total), static_cast<unsigned long long>(c.replied),
                static_cast<unsigned long long>(c.refused), static_cast<unsigned long long>(c.dead_lettered),
                static_cast<unsigned long long>(runs_by_family[top[n].second].load()));
  }
  if (top.size() > 12) std::printf("  (%zu more families)\n", top.size() - 12);

  const bool accounted = all.lost == 0 && all.replied + all.refused + all.dead_lettered == all.total &&
                         dead_seen == dead_expected && dead_by_reason["refused"] == all.refused &&
                         memory_errors.load() == 0 &&
                         sessions_after >= requests.size();
  if (!opt.json.empty()) {
    std::ofstream j(opt.json, std::ios::trunc);
    j << "{\"requests_total\": " << requests.size() << ", \"requests_completed\": "
      << requests_completed << ", \"calls_total\": " << all.total
      << ", \"calls_replied\": " << all.replied << ", \"calls_refused\": " << all.refused
      << ", \"calls_dead_lettered\": " << all.dead_lettered << ", \"calls_lost\": " << all.lost
      << ", \"schema_faults\": " << schema_faults
      << ", \"refusals_naming_argument\": " << refusals_naming_argument
      << ", \"ground_truth_refused\": " << unmutated_refused << ", \"retries\": " << retries
      << ", \"dead_letters_seen\": " << dead_seen << ", \"first20_unchanged\": " << first20_unchanged
      << ", \"first20_calls\": " << first20_calls << ", \"sessions\": " << sessions_after
      << ", \"sessions_found\": " << sessions_before << ", \"latency_us\": {\"p50\": "
      << Percentile(latencies, 0.5) << ", \"p95\": " << Percentile(latencies, 0.95)
      << ", \"p99\": " << Percentile(latencies, 0.99) << "}, \"wall_s\": " << wall
      << ", \"refusals_by_reason\": {";
    bool first = true;
    for (const auto& [reason, n] : refusals_by_reason) {
      j << (first ? "" : ", ") << "\"" << reason << "\": " << n;
      first = false;
    }
    j << "}, \"calls_by_family\": {";
    first = true;
    for (const auto& [f, c] : by_family) {
      j << (first ? "" : ", ") << "\"" << f << "\": " << c.total;
      first = false;
    }
    j << "}, \"accounted\": " << (accounted ? "true" : "false") << "}\n";
    j.close();  // flushes: a full disk shows only here
    if (!j) Fail("writing --json file '" + opt.json + "' failed", 1);
  }
  engine.Close();
  store_or->reset();  // the atexit handler removes a temporary directory after this
  if (accounted) {
    std::printf("\nOK: every call accounted for\n");
    return 0;
  }
  std::printf("\nFAILED:");
  if (all.lost > 0) std::printf(" %llu calls lost;", static_cast<unsigned long long>(all.lost));
  if (dead_seen != dead_expected || dead_by_reason["refused"] != all.refused) {
    std::printf(" the dead-letter subjects saw %llu dead letters (%llu refused), the calls say %llu (%llu);",
                static_cast<unsigned long long>(dead_seen),
                static_cast<unsigned long long>(dead_by_reason["refused"]),
                static_cast<unsigned long long>(dead_expected), static_cast<unsigned long long>(all.refused));
  }
  if (memory_errors.load() > 0) {
    std::printf(" %llu agent-memory commits failed;", static_cast<unsigned long long>(memory_errors.load()));
  }
  if (sessions_after < requests.size()) {
    std::printf(" %zu of %zu sessions in the agent memory;", sessions_after, requests.size());
  }
  std::printf("\n");
  return 1;
}
