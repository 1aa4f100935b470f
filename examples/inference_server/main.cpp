// inference_server: replays the Azure LLM inference trace (conversation service,
// 2023) through inferq.
//
// A client publishes each request of the trace on `infer.<model>.request` at its
// recorded arrival time (compressed by --speed). A consumer group of --replicas
// simulated model replicas pulls requests with NextBatch and runs continuous batching:
// a prefill step for newly admitted requests, then decode steps that produce one
// token per running sequence. Every token is an event on `infer.reply.<request>` with
// seq_id/seq_no; the client consumes the tokens, checks their order and measures
// TTFT, TBT and E2E latency in trace time.
//
// Routing: a running sequence is an event too. After each step a replica publishes
// one `infer.<model>.decode` event per unfinished sequence (its state in headers)
// and acks the one it consumed; the group's policy is AffinityPolicy over --policy
// (TopologyScore by default) keyed by seq_id, so new requests go where the score is
// lowest and every decode step of a generation returns to the replica holding its KV
// cache. With --kill-replica K@T replica K stops at trace time T without acking what
// it holds: ack_wait expiry and stall detection redeliver its work, affinity moves
// its sequences (the new replica re-runs prefill over prompt + generated tokens), and
// the summary shows that no token was lost and how long the move took.
//
// Cost model (all in trace time, all configurable; defaults chosen to resemble a
// 70B-parameter model served on one 8-GPU node, not measured on hardware):
//   prefill step = prefill_base_ms + prefill_us_per_token * (prompt tokens admitted)
//   decode step  = decode_base_ms + decode_us_per_seq * (sequences in the batch)
// Replicas keep a virtual clock in trace time; with --speed X > 0 they also wait in
// wall time so that X seconds of trace pass per second, with --speed 0 they run as
// fast as they can and the trace-time figures are the same as at any speed.
//
// QoS: request i gets a tier and a tenant from splitmix64(i), no RNG state: the tier
// by --tier-mix (percent gold:silver:bronze, default 20:30:50), the tenant uniform
// over tenant-0..tenant-<--tenants - 1> (default 8), independent of the tier (a
// tenant buys per-request service classes). --overload X divides every arrival time
// by X. The client counts, per tier, the requests whose first token came within the
// tier's TTFT SLA (--sla-ms, trace time, default 2 s / 5 s / 15 s: at 1x every tier
// meets them, the TTFT p99 is about 0.45 s; at 2x the queue for a free batch slot
// grows to tens of seconds and only the tier order decides who waits).
// Requests and decode steps share the consumer `replicas` (affinity needs both in
// one group), which has QoS lanes (ConsumerConfig::qos, default QosConfig). Decode
// steps of running sequences are published gold, so in the lane they are never
// stuck behind a backlog of new bronze requests. But the queue that decides TTFT is
// the wait for a free slot of the batch, and it must be decided in trace time to
// keep the figures the same at any --speed (the lane's pop order depends on what the
// publisher has queued by then in wall time, at --speed 0 the whole trace). So a
// replica drains its lane at each step, keeps requests from its future aside, and
// admits the ones that arrived by its clock through a QosScheduler of its own with
// the same QosConfig (assured shares 20/10/5 %, weights 8/4/1, DRR between tenants):
// the lanes' QoS order is real, the admission order is its trace-time twin.
// Pulls use Member::NextBatch(timeout) under ConsumerConfig::batch: max_batch =
// --max-batch, no queue delay, adaptive, baseline RTT = one decode step of a full
// batch (decode_base_ms + decode_us_per_seq * max_batch) divided by --speed (the
// engine measures deliver -> ack in wall time; at --speed 0 the trace-time step, so
// the window stays at max_batch). The window sets how much one pull takes, not what
// is admitted (the replica drains the lane either way), so the figures stay speed-
// independent; the batch-size distribution is real time and varies run to run.
// Dead letters: --max-deliver (default 5) deliveries, then the event goes to
// `infer.dead.<model>`, kept in stream DEAD; the summary counts redeliveries and
// dead letters.
//
// The client passes every token through a ReorderBuffer keyed by seq_id: what it
// releases, strictly in seq_no order, is what reaches the user (the latency figures
// and completeness are taken from it); a second copy of a number is dropped there
// and counted as duplicated.
//
// Durable replay (--state-dir DIR, durable.hpp): the three streams are file streams
// in DIR (limits retention, which file streams need; sync kInterval every second:
// a publish or ack returns once written to the OS, which survives a crash of the
// process, and a power loss could take the last second) and both consumers are
// durable. --crash-at T SIGKILLs the process at trace time T. A later run over DIR
// continues the replay:
//  - the client's figures are rebuilt from the tokens stored in REPLIES (read back
//    with Engine::GetMessage, through the same ReorderBuffer), so the summary covers
//    the whole replay; its durable consumer then delivers again what it had not
//    acked, which the rebuild already read (acked and passed over);
//  - the publisher goes on after the last request stored in REQUESTS (found from the
//    newest message back), each with msg_id req-<i> in a duplicate window of 365
//    days, and the trace clock resumes at the latest trace time stored;
//  - every request or decode step the replicas had not acked comes again (attempt >
//    1) and is prefilled anew (the KV cache died with the process). A decode step
//    carries msg_id dec-<request>-<produced>, so when the step before it was not
//    acked either, its second publish is a duplicate and one chain goes on, not two.
//    The tokens a redone step had produced before the crash come again: the
//    client's ReorderBuffer drops them, and they are counted apart from copies of
//    tokens received in the same run, which fail the run as in any replay.
// DIR/replay holds the settings of the first run; a run whose trace, --limit,
// --overload or other replay settings differ is refused. Nothing is removed from
// the streams: a resumed run reads back every token stored, and the directory grows
// by about 280 MB per 1,000 requests.
//
// Prometheus (--metrics-port N, with inferq::prometheus): the engine's metrics
// (EngineCollector: streams, consumers, members, tiers, pools, the NATS bridge) at
// http://127.0.0.1:N/metrics while the replay runs. --metrics-hold S keeps serving
// after the replay, up to S seconds, until a scraper has taken the final figures,
// which are the ones the summary and --json report.
//
// Tracing (--otlp-endpoint URL, with inferq::otlp): the engine's spans (publish,
// queue wait, delivery, ack or nak, dead letter) of a --otlp-sample share of the
// requests (default 0.01), one trace per request (the replicas publish its tokens and
// decode steps as children of the delivery they work on), sent as OTLP/HTTP JSON to a collector
// (an OpenTelemetry Collector, Jaeger, Tempo: http://HOST:4318/v1/traces); the
// summary says how many spans went out. A collector that is down or never answers
// costs at most 15 s after the replay (a 10 s flush, then 5 s to shut the exporter
// down) and does not fail the run.
//
// Data: Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024),
// CC-BY-4.0; see examples/data/README.md.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <span>
#include <atomic>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "durable.hpp"
#include "inferq/inferq.hpp"
#include "trace.hpp"
#ifdef INFERQ_EXAMPLE_NATS
#include "cluster.hpp"
#endif
#ifdef INFERQ_EXAMPLE_OTLP
#include "inferq/adapters/otlp/otlp_exporter.hpp"
#endif
#ifdef INFERQ_EXAMPLE_PROMETHEUS
#include "inferq/adapters/prometheus/engine_collector.hpp"
#include "inferq/adapters/prometheus/metrics_server.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using inferq::example::TraceRequest;

struct Options {
  std::string trace = INFERQ_DEFAULT_TRACE;
  std::string json;
  std::string model = "llama2-70b";
  std::uint32_t replicas = 4;
  std::uint32_t max_batch = 32;
  double speed = 60.0;
  std::size_t limit = 0;  // 0 = all
  double prefill_base_ms = 10.0;
  double prefill_us_per_token = 100.0;
  double decode_base_ms = 25.0;
  double decode_us_per_seq = 500.0;
  std::string policy = "topology_score";
  double ack_wait_ms = 30'000;  // trace time
  std::int64_t kill_replica = -1;
  double kill_at_s = 0;  // trace time
  // QoS (see the banner): percentages of requests per tier (gold, silver, bronze),
  // tenants, TTFT SLA per tier (trace ms), arrival-rate multiplier.
  std::array<std::uint32_t, 3> tier_mix{20, 30, 50};
  std::uint32_t tenants = 8;
  std::array<double, 3> sla_ms{2000, 5000, 15000};
  double overload = 1.0;
  std::int64_t max_deliver = 5;
  // Durable replay (see the banner): file streams and consumers in this directory;
  // empty = memory streams. crash_at_s: SIGKILL at this trace second; < 0 = never.
  std::string state_dir;
  double crash_at_s = -1;
  // Across processes (see the banner): "" = one process, "client" or "replica"; the
  // NATS servers; JetStream replicas of the shared streams.
  std::string role;
  std::vector<std::string> nats;
  int js_replicas = 1;
  bool js_replicas_given = false;
  // Prometheus (see the banner): the port of /metrics on 127.0.0.1, -1 = none (0 = a
  // free port); after the replay, serve for up to metrics_hold_s more seconds until
  // two scrapes began after the final figures (so a scraper holds them).
  int metrics_port = -1;
  double metrics_hold_s = 0;
  // --timeline FILE: a CSV row every 100 ms of wall time (scripts/plot_replay.py).
  std::string timeline;
  std::string otlp_endpoint;  // --otlp-endpoint: where spans go; empty = no tracing
  double otlp_sample = -1;   // --otlp-sample, 0..1; -1 = not given (0.01)
};

constexpr std::array<const char*, 3> kTierNames{"gold", "silver", "bronze"};

// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014): a fixed bijection of the request index, so the tier and
// tenant of a request depend on nothing but its index and the flags.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Assignment {
  inferq::Qos tier;
  std::uint32_t tenant;  // tenant-<k>
};

// Request i: tier from the low bits of Mix(i) (per --tier-mix), tenant from the high
// bits (uniform over --tenants). Tier and tenant are independent: a tenant sends
// requests of every tier, as a customer buying per-request service classes.
Assignment Assign(const Options& o, std::uint64_t request) {
  const std::uint64_t h = Mix(request);
  const std::uint64_t pct = (h & 0xffffffffULL) % 100;
  const inferq::Qos tier = pct < o.tier_mix[0]                  ? inferq::Qos::kGold
                           : pct < o.tier_mix[0] + o.tier_mix[1] ? inferq::Qos::kSilver
                                                                 : inferq::Qos::kBronze;
  return {tier, static_cast<std::uint32_t>((h >> 32) % o.tenants)};
}

void Usage(std::FILE* f) {
  std::fprintf(f,
               "usage: inference_server [options]   (--option VALUE or --option=VALUE)\n"
               "Replays the Azure LLM inference trace (2023, conversation) through inferq: a\n"
               "client publishes each request at its arrival time, a consumer group of\n"
               "simulated model replicas runs continuous batching, and every token comes back\n"
               "as an event that the client checks for loss, duplication and order.\n"
               "Prints TTFT/TBT/E2E percentiles in trace time, per-tier SLA attainment and\n"
               "the engine's own latency.\n"
               "\n"
               "  --trace PATH              trace CSV, plain or .zst (default: bundled trace)\n"
               "  --replicas N              simulated model replicas, 1..256 (default 4)\n"
               "  --speed X                 trace seconds per wall second, 0.001..1e6; 0 = as "
               "fast as possible (default 60)\n"
               "  --limit N                 replay only the first N requests, 1..1e9 (default\n"
               "                            all)\n"
               "  --json FILE               write a JSON summary\n"
               "  --model NAME              model token of the request subject (default "
               "llama2-70b)\n"
               "  --max-batch N             sequences per replica batch, 1..4096 (default 32)\n"
               "  --prefill-base-ms X       fixed cost of a prefill step, 0..1e6 (default 10)\n"
               "  --prefill-us-per-token X  prefill cost per prompt token, 0..1e6 (default 100)\n"
               "  --decode-base-ms X        fixed cost of a decode step, 0..1e6 (default 25)\n"
               "  --decode-us-per-seq X     decode cost per sequence in the batch, 0..1e6\n"
               "                            (default 500, i.e. 0.5 ms)\n"
               "  --policy NAME             placement of new requests: topology_score (default),\n"
               "                            least_loaded, peak_ewma, round_robin; decode steps\n"
               "                            always follow their sequence (affinity by seq_id)\n"
               "  --ack-wait-ms X           trace ms before an unacked event is redelivered,\n"
               "                            1..1e9 (default 30000; at --speed 0 nothing is\n"
               "                            redelivered and X is ignored)\n"
               "  --kill-replica K@T        stop replica K (0..N-1 of --replicas N, N >= 2) at\n"
               "                            trace second T, 0..1e9 (needs --speed > 0)\n"
               "  --tier-mix G:S:B          percent of requests in tier gold:silver:bronze,\n"
               "                            integers summing to 100 (default 20:30:50)\n"
               "  --tenants N               tenants tenant-0..tenant-N-1, 1..10000 (default 8)\n"
               "  --sla-ms G:S:B            TTFT SLA per tier, trace ms, each 1..1e9\n"
               "                            (default 2000:5000:15000)\n"
               "  --overload X              multiply the arrival rate by X (divide the gaps\n"
               "                            between arrivals), 0.01..100 (default 1)\n"
               "  --max-deliver N           deliveries of an event before it is a dead letter,\n"
               "                            1..100 (default 5)\n"
               "  --state-dir DIR           durable replay: file streams and durable consumers\n"
               "                            in DIR (created if missing); a later run over DIR\n"
               "                            with the same options continues the replay, and its\n"
               "                            summary covers all of it (DIR/replay records the\n"
               "                            trace, --model, --replicas, --max-batch, the cost\n"
               "                            model, --policy, --ack-wait-ms, --tier-mix,\n"
               "                            --tenants, --sla-ms and --max-deliver, which must\n"
               "                            stay the same; the other options may change)\n"
               "  --crash-at T              SIGKILL this process at trace second T, 0..1e9\n"
               "                            (needs --state-dir and --speed > 0; after the trace\n"
               "                            time a resumed replay starts at)\n"
               "  --role client|replica     run one side of the replay across processes over\n"
               "                            NATS JetStream (needs --nats and --speed > 0): the\n"
               "                            client publishes the trace and checks the tokens,\n"
               "                            each replica process runs --replicas replicas for\n"
               "                            one replay, until SIGTERM or SIGINT\n"
               "  --nats URL[,URL...]       the NATS servers (nats://host:port) for --role\n"
               "  --js-replicas N           replicas of the JetStream streams, 1..5 (default 1)\n"
               "  --metrics-port N          serve Prometheus metrics at http://127.0.0.1:N/metrics\n"
               "                            while replaying, 0..65535 (0: a free port, printed\n"
               "                            on stderr); needs inferq::prometheus\n"
               "  --timeline FILE           write a CSV row every 100 ms: wall and trace time,\n"
               "                            requests published and completed, tokens, the\n"
               "                            replicas' queued steps (scripts/plot_replay.py)\n"
               "  --metrics-hold S          after the replay, keep serving up to S seconds\n"
               "                            (0..3600, default 0) until two scrapes began after\n"
               "                            the final figures, so the scraper has them\n"
               "  --otlp-endpoint URL       send trace spans as OTLP/HTTP JSON to URL (e.g.\n"
               "                            http://127.0.0.1:4318/v1/traces); needs inferq::otlp\n"
               "  --otlp-sample R           share of requests traced, each whole, 0..1\n"
               "                            (default 0.01)\n"
               "  --help, -h                this text\n"
               "  --version                 the inferq version\n"
               "\n"
               "exit status: 0 every request completed with no token lost, duplicated or out\n"
               "of order (but for the tokens of steps redone after a crash, which the client\n"
               "drops and counts); 1 a token was lost, duplicated or out of order, a request\n"
               "did not complete, or the trace, --json file or state directory could not be\n"
               "read or written; 2 a bad option or value, or a --state-dir of another replay.\n"
               "--crash-at ends the process by SIGKILL (status 137 in a shell).\n");
}

#ifdef INFERQ_EXAMPLE_PROMETHEUS
// The engine's metrics, counting the scrapes that began (--metrics-hold waits for two
// after the final figures: the first takes them, and the second begins only once the
// first was answered, a scraper never overlapping its scrapes of one target).
class CountedEngineCollector final : public ::prometheus::Collectable {
 public:
  explicit CountedEngineCollector(const inferq::Engine& engine) : inner_(engine) {}
  std::vector<::prometheus::MetricFamily> Collect() const override {
    began_.fetch_add(1);
    return inner_.Collect();
  }
  std::uint64_t began() const { return began_.load(); }

 private:
  inferq::prometheus::EngineCollector inner_;
  mutable std::atomic<std::uint64_t> began_{0};
};
#endif

[[noreturn]] void Fail(const std::string& msg, int code = 2) {
  std::fprintf(stderr, "inference_server: %s\n", msg.c_str());
  std::exit(code);
}

// An option whose adapter this build lacks: names the adapter and the commands that
// add it (install the packages, configure this build directory again, build).
// INFERQ_WITH_<NAME> is AUTO by default and looks for its package at every configure.
[[noreturn, maybe_unused]] void FailMissingAdapter(const std::string& option,
                                                   const std::string& adapter,
                                                   const std::string& package,
                                                   const std::string& purpose,
                                                   const std::string& cmake_option) {
  Fail(option + " needs " + adapter + ", which this build lacks (" + cmake_option +
       " was OFF, or found no " + package + ", when the build was configured). To add it:\n"
       "  " INFERQ_EXAMPLE_SOURCE_DIR "/scripts/install-deps.sh --for " + purpose + "\n"
       "  cmake -D" + cmake_option + "=AUTO " INFERQ_EXAMPLE_BUILD_DIR "\n"
       "  cmake --build " INFERQ_EXAMPLE_BUILD_DIR " --target inference_server");
}

// `range` names the accepted values in messages; by default "lo..hi".
double ParseDouble(const std::string& flag, const std::string& v, double lo, double hi,
                   std::string range = "") {
  double d = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  // %g, with the exponent written as in --help: 1e6, not 1e+06.
  auto text = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    std::string t = buf;
    if (const std::size_t e = t.find("e+"); e != std::string::npos) {
      std::size_t digits = e + 2;
      while (digits + 1 < t.size() && t[digits] == '0') ++digits;
      t = t.substr(0, e + 1) + t.substr(digits);
    }
    return t;
  };
  if (range.empty()) range = text(lo) + ".." + text(hi);
  if (v.empty() || end != v.data() + v.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range) || std::isnan(d)) {
    Fail(flag + " '" + v + "' is not a number (expected " + range + ")");
  }
  // from_chars reports a magnitude beyond double (1e400) as out of range; so is inf.
  if (ec == std::errc::result_out_of_range || std::isinf(d) || d < lo || d > hi) {
    Fail(flag + " '" + v + "' is outside " + range);
  }
  return d;
}

std::uint64_t ParseUint(const std::string& flag, const std::string& v, std::uint64_t lo,
                        std::uint64_t hi) {
  // Parsed as a signed number first, so that '-5' is named as out of range, not as
  // something other than an integer.
  long long n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  if (v.empty() || end != v.data() + v.size() || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    Fail(flag + " '" + v + "' is not an integer (expected " + range + ")");
  }
  if (ec == std::errc::result_out_of_range || n < 0 || static_cast<std::uint64_t>(n) < lo ||
      static_cast<std::uint64_t>(n) > hi) {
    Fail(flag + " '" + v + "' is outside " + range);
  }
  return static_cast<std::uint64_t>(n);
}

// "a:b:c" -> {"a", "b", "c"}; anything else fails naming the flag and value.
std::array<std::string, 3> SplitTriple(const std::string& flag, const std::string& v,
                                       const char* form) {
  std::array<std::string, 3> out;
  std::size_t start = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    const std::size_t colon = k < 2 ? v.find(':', start) : std::string::npos;
    if (k < 2 && colon == std::string::npos) break;
    out[k] = v.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (k == 2 && out[k].find(':') == std::string::npos) return out;
    start = colon + 1;
  }
  Fail(flag + " '" + v + "' must be " + form);
}

// The options that take a value (all but --help and --version).
bool KnownOption(std::string_view a) {
  static constexpr std::string_view kOptions[] = {
      "--trace", "--json", "--model", "--replicas", "--max-batch", "--speed", "--limit",
      "--prefill-base-ms", "--prefill-us-per-token", "--decode-base-ms", "--decode-us-per-seq",
      "--policy", "--ack-wait-ms", "--kill-replica", "--tier-mix", "--tenants", "--sla-ms",
      "--overload", "--max-deliver", "--state-dir", "--crash-at", "--role", "--nats", "--js-replicas",
      "--metrics-port", "--metrics-hold", "--timeline", "--otlp-endpoint", "--otlp-sample"};
  return std::find(std::begin(kOptions), std::end(kOptions), a) != std::end(kOptions);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (a == "--version") {
      std::printf("inference_server (inferq %s)\n", INFERQ_VERSION_STRING);
      std::exit(0);
    }
    std::string v;
    if (const std::size_t eq = a.find('='); a.starts_with("--") && eq != std::string::npos) {
      v = a.substr(eq + 1);  // --flag=value
      a.resize(eq);
    } else if (i + 1 >= argc) {
      if (!KnownOption(a)) Fail("unknown option '" + a + "' (see --help)");
      Fail(a + " needs a value (see --help)");
    } else {
      v = argv[++i];
    }
    if (a == "--trace") o.trace = v;
    else if (a == "--json") {
      if (v.empty()) Fail("--json needs a file name");
      o.json = v;
    }
    else if (a == "--model") {
      if (!inferq::IsValidSubject(v) || v.find('.') != std::string::npos) {
        Fail("--model '" + v + "' must be one subject token (no '.', no white space, not * or >)");
      }
      o.model = v;
    }
    else if (a == "--replicas") o.replicas = static_cast<std::uint32_t>(ParseUint(a, v, 1, 256));
    else if (a == "--max-batch") o.max_batch = static_cast<std::uint32_t>(ParseUint(a, v, 1, 4096));
    else if (a == "--speed") {
      // The range --help gives: 0, or 0.001..1e6.
      o.speed = ParseDouble(a, v, 0, 1e6, "0 or 0.001..1e6");
      if (o.speed > 0 && o.speed < 0.001) Fail("--speed '" + v + "' must be 0 or 0.001..1e6");
    }
    else if (a == "--limit") o.limit = ParseUint(a, v, 1, 1'000'000'000);
    else if (a == "--prefill-base-ms") o.prefill_base_ms = ParseDouble(a, v, 0, 1e6);
    else if (a == "--prefill-us-per-token") o.prefill_us_per_token = ParseDouble(a, v, 0, 1e6);
    else if (a == "--decode-base-ms") o.decode_base_ms = ParseDouble(a, v, 0, 1e6);
    else if (a == "--decode-us-per-seq") o.decode_us_per_seq = ParseDouble(a, v, 0, 1e6);
    else if (a == "--policy") {
      if (!inferq::MakeSelectionPolicy(v).ok()) {
        Fail("--policy '" + v + "' is not one of topology_score, least_loaded, peak_ewma, round_robin");
      }
      o.policy = v;
    }
    else if (a == "--ack-wait-ms") o.ack_wait_ms = ParseDouble(a, v, 1, 1e9);
    else if (a == "--kill-replica") {
      const auto at = v.find('@');
      if (at == std::string::npos || at == 0 || at + 1 == v.size()) {
        Fail("--kill-replica '" + v + "' must be K@T (replica K at trace second T)");
      }
      o.kill_replica = static_cast<std::int64_t>(ParseUint(a, v.substr(0, at), 0, 255));
      o.kill_at_s = ParseDouble(a, v.substr(at + 1), 0, 1e9);
    }
    else if (a == "--tier-mix") {
      const auto parts = SplitTriple(a, v, "G:S:B (percent gold:silver:bronze)");
      std::uint32_t sum = 0;
      for (std::size_t t = 0; t < 3; ++t) {
        o.tier_mix[t] = static_cast<std::uint32_t>(ParseUint(a, parts[t], 0, 100));
        sum += o.tier_mix[t];
      }
      if (sum != 100) Fail("--tier-mix '" + v + "' must sum to 100 (it sums to " + std::to_string(sum) + ")");
    }
    else if (a == "--tenants") o.tenants = static_cast<std::uint32_t>(ParseUint(a, v, 1, 10000));
    else if (a == "--sla-ms") {
      const auto parts = SplitTriple(a, v, "G:S:B (TTFT ms for gold:silver:bronze)");
      for (std::size_t t = 0; t < 3; ++t) o.sla_ms[t] = ParseDouble(a, parts[t], 1, 1e9);
    }
    else if (a == "--overload") o.overload = ParseDouble(a, v, 0.01, 100);
    else if (a == "--max-deliver") o.max_deliver = static_cast<std::int64_t>(ParseUint(a, v, 1, 100));
    else if (a == "--state-dir") {
      if (v.empty()) Fail("--state-dir needs a directory name");
      o.state_dir = v;
    }
    else if (a == "--crash-at") o.crash_at_s = ParseDouble(a, v, 0, 1e9);
    else if (a == "--role") {
      if (v != "client" && v != "replica") Fail("--role '" + v + "' is not client or replica");
      o.role = v;
    }
    else if (a == "--nats") {
      o.nats.clear();
      std::size_t start = 0;
      for (;;) {
        const std::size_t comma = v.find(',', start);
        const std::string url = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (url.empty()) Fail("--nats '" + v + "' has an empty URL (expected URL[,URL...])");
        o.nats.push_back(url);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
    else if (a == "--js-replicas") {
      o.js_replicas = static_cast<int>(ParseUint(a, v, 1, 5));
      o.js_replicas_given = true;
    }
    else if (a == "--metrics-port") o.metrics_port = static_cast<int>(ParseUint(a, v, 0, 65535));
    else if (a == "--metrics-hold") o.metrics_hold_s = ParseDouble(a, v, 0, 3600);
    else if (a == "--otlp-endpoint") {
      if (v.empty()) Fail("--otlp-endpoint needs a URL");
      o.otlp_endpoint = v;
    }
    else if (a == "--otlp-sample") o.otlp_sample = ParseDouble(a, v, 0, 1);
    else if (a == "--timeline") {
      if (v.empty()) Fail("--timeline needs a file name");
      o.timeline = v;
    }
    else {
      Fail("unknown option '" + a + "' (see --help)");
    }
  }
  if (o.kill_replica >= static_cast<std::int64_t>(o.replicas)) {
    Fail("--kill-replica " + std::to_string(o.kill_replica) + " is not a replica (0.." +
         std::to_string(o.replicas - 1) + ")");
  }
  if (o.kill_replica >= 0 && o.speed <= 0) {
    Fail("--kill-replica needs --speed > 0 (ack_wait and ejection run in wall time)");
  }
  if (o.kill_replica >= 0 && o.replicas < 2) Fail("--kill-replica needs --replicas >= 2");
  if (o.crash_at_s >= 0 && o.state_dir.empty()) {
    Fail("--crash-at needs --state-dir (without durable state a crash loses the replay)");
  }
  if (o.crash_at_s >= 0 && o.speed <= 0) {
    Fail("--crash-at needs --speed > 0 (the trace clock runs in wall time)");
  }
  if (!o.role.empty()) {
#ifndef INFERQ_EXAMPLE_NATS
    FailMissingAdapter("--role", "the NATS bridge (inferq::nats)", "libnats-dev", "cluster",
                       "INFERQ_WITH_NATS");
#endif
    if (o.nats.empty()) Fail("--role " + o.role + " needs --nats URL[,URL...]");
    if (o.speed <= 0) Fail("--role needs --speed > 0 (replica processes pace the trace in wall time)");
    if (!o.state_dir.empty()) Fail("--state-dir is for one process (not with --role)");
    if (o.kill_replica >= 0) {
      Fail("--kill-replica is for one process (with --role, kill a replica process: scripts/cluster_demo.sh)");
    }
  } else if (!o.nats.empty()) {
    Fail("--nats needs --role client or --role replica");
  } else if (o.js_replicas_given) {
    Fail("--js-replicas needs --role client or --role replica (they create the JetStream streams)");
  }
  if (o.metrics_port >= 0) {
#ifndef INFERQ_EXAMPLE_PROMETHEUS
    FailMissingAdapter("--metrics-port", "the Prometheus exposition (inferq::prometheus)",
                       "prometheus-cpp-dev", "metrics", "INFERQ_WITH_PROMETHEUS");
#endif
  } else if (o.metrics_hold_s > 0) {
    Fail("--metrics-hold needs --metrics-port");
  }
  if (!o.otlp_endpoint.empty()) {
#ifndef INFERQ_EXAMPLE_OTLP
    FailMissingAdapter("--otlp-endpoint", "the OTLP trace exporter (inferq::otlp)",
                       "libcurl4-openssl-dev", "metrics", "INFERQ_WITH_OTLP");
#endif
    if (o.otlp_sample < 0) o.otlp_sample = 0.01;
  } else if (o.otlp_sample >= 0) {
    Fail("--otlp-sample needs --otlp-endpoint");
  }
  if (!o.state_dir.empty() && !o.json.empty()) {
    // The summary must not land on (or in) the replay's state.
    std::error_code ec;
    const auto dir = std::filesystem::weakly_canonical(o.state_dir, ec);
    const auto json = std::filesystem::weakly_canonical(o.json, ec);
    const auto [d_end, j_it] = std::mismatch(dir.begin(), dir.end(), json.begin(), json.end());
    if (d_end == dir.end()) {
      Fail("--json '" + o.json + "' is in --state-dir '" + o.state_dir + "' (it would overwrite the replay's state)");
    }
  }
  return o;
}

std::uint64_t HeaderU64(const inferq::Event& e, std::string_view name) {
  const auto v = e.headers.Get(name);
  std::uint64_t n = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), n).ec != std::errc()) {
    Fail("request event " + e.msg_id + " lacks a numeric header '" + std::string(name) + "'", 1);
  }
  return n;
}

// Token payload: when the token was produced (trace time, µs) and its id.
struct TokenPayload {
  std::int64_t trace_us;
  std::int32_t token_id;
  std::int32_t reserved;
};

std::int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

struct Shared {
  const Options* opt;
  const std::vector<TraceRequest>* trace;
  inferq::Engine* engine;
  // The client's token-level figures (trace time, ns): TTFT and TBT of the summary,
  // and --metrics-port's inferq_token_* (probe="client").
  inferq::TokenProbe* probe = nullptr;
  // Trace time 0 in wall time: PaceTo's anchor. A resumed durable replay sets it in
  // the past, so that the trace clock goes on where the stored replay stopped.
  Clock::time_point wall_start;
  Clock::time_point run_start;  // when this run's replay began (wall figures)
  std::atomic<bool> all_published{false};
  // Arrival (trace µs) of the next request the publisher has not published yet;
  // INT64_MAX once all are. A replica at trace time vt waits until this is > vt, so
  // it has seen every request that arrived by vt: admissions, and with them every
  // trace-time figure, are the same at any --speed and on any machine.
  std::atomic<std::int64_t> next_unpublished_us{0};
  std::atomic<std::size_t> published{0};
  std::atomic<std::uint32_t> replicas_done{0};
  std::atomic<std::size_t> completed{0};
  std::atomic<std::uint64_t> tokens_received{0};
  std::atomic<int> fatal{0};
  std::atomic<bool> done{false};  // the client has every token (or gave up)
  std::atomic<std::uint32_t> reported{0};  // replicas that reported their load once
  std::atomic<std::uint64_t> redelivered_seen{0};  // events replicas got on attempt > 1
  // Tokens the client's durable consumer delivered again after a restart, which the
  // rebuild had read from the stream already (acked, not counted again).
  std::atomic<std::uint64_t> client_redelivered{0};
  std::atomic<std::int64_t> killed_at_wall_ns{0};
  std::atomic<std::size_t> killed_holding{0};
  std::mutex graveyard_mu;
  std::vector<inferq::Message> graveyard;  // what the killed replica held, never acked
  // --role replica: requests are held (not acked) until their generation is
  // complete, so that the bridge acks them to NATS only then (ImportAck::kConsumed);
  // `held` is keyed by request index. Trace time 0 is anchor_ns on this process's
  // steady clock (0 until the first request says when the client began), and tokens
  // carry header "replica" = `producer`.
  bool replica_role = false;
  bool local_replicas = true;  // false for --role client: its replicas are elsewhere
  // --role client: the messages JetStream holds for the replay (MessagesInJetStream),
  // so that the client does not give up on tokens still on their way (RunClient).
  std::function<absl::StatusOr<std::uint64_t>()> jetstream_in_flight;
  std::string producer;
  std::atomic<std::int64_t> anchor_ns{0};
  std::atomic<std::int64_t> replay_start_unix_ns{0};  // the replay this replica process serves
  std::mutex held_mu;
  std::unordered_map<std::uint64_t, inferq::Message> held;
  std::atomic<std::uint64_t> generations_done{0};  // a replica process's figures
  std::atomic<std::uint64_t> tokens_emitted{0};

  // Waits until every request that arrives by trace time `vt_us` is published. A
  // replica process cannot see the client's publisher: it waits until the trace
  // clock is kTransitUs past vt_us, so that a request published by then has arrived.
  static constexpr double kTransitUs = 20'000;  // wall µs
  void AwaitPublishedThrough(double vt_us) const {
    if (replica_role) {
      const std::int64_t anchor = anchor_ns.load(std::memory_order_acquire);
      if (anchor == 0) return;
      const auto at = Clock::time_point(std::chrono::nanoseconds(anchor)) +
                      std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double, std::micro>(vt_us / opt->speed + kTransitUs));
      std::this_thread::sleep_until(at);
      return;
    }
    while (static_cast<double>(next_unpublished_us.load(std::memory_order_acquire)) <= vt_us) {
      if (opt->speed > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }

  // Waits until `trace_us` of trace time have passed in wall time (speed > 0).
  void PaceTo(double trace_us) const {
    if (opt->speed <= 0) return;
    const auto wall = std::chrono::duration<double, std::micro>(trace_us / opt->speed);
    Clock::time_point start = wall_start;
    if (replica_role) {
      const std::int64_t anchor = anchor_ns.load(std::memory_order_acquire);
      if (anchor == 0) return;
      start = Clock::time_point(std::chrono::nanoseconds(anchor));
    }
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(wall));
  }
};

// One simulated model replica: member `index` of consumer group "replicas".
void RunReplica(Shared& sh, inferq::Member in, std::uint32_t index) {
  const Options& o = *sh.opt;
  struct Seq {
    inferq::Message msg;
    std::uint64_t request = 0;
    double arrival_us = 0;
    double ready_us = 0;  // decode: when the previous step ended (trace µs)
    std::uint32_t context = 0;
    std::uint32_t generated = 0;
    std::uint32_t produced = 0;
    Assignment who{};
    bool decode = false;  // msg is a decode step (else the request itself)
  };
  // New requests pulled and not yet admitted, by request index (= arrival order):
  // `future` arrive after this replica's clock vt; `ready` have arrived and wait in
  // `order`, which picks the next one to admit (QosScheduler: tier shares, DRR
  // between tenants), in trace time, so the choice is the same at any --speed.
  std::map<std::uint64_t, Seq> future;
  std::map<std::uint64_t, Seq> ready;
  // The same tier shares as the lanes (ConsumerConfig::qos): the default QosConfig.
  inferq::QosConfig order_cfg;
  order_cfg.capacity = static_cast<std::uint32_t>(
      std::clamp<std::size_t>(sh.trace->size(), 1, std::size_t{1} << 24));
  auto order = *inferq::QosScheduler<std::uint64_t>::Create(order_cfg);
  std::vector<std::string> tenant_names;
  for (std::uint32_t k = 0; k < o.tenants; ++k) tenant_names.push_back("tenant-" + std::to_string(k));
  std::vector<Seq> active;     // decode steps of sequences whose KV cache is here
  std::vector<Seq> migrated;   // decode steps of sequences that come from elsewhere
  std::vector<Seq> admitted;
  std::unordered_set<std::uint64_t> kv;  // requests whose KV cache this replica holds
  std::size_t expected = 0;    // own decode events published and not pulled back yet
  double vt = 0;               // this replica's clock, trace µs
  const bool doomed = static_cast<std::int64_t>(index) == o.kill_replica;
  const bool durable = !o.state_dir.empty();
  const double kill_at_us = o.kill_at_s * 1e6;
  const std::string from = std::to_string(index);
  // Half the consumer's ack_wait in wall ns (its setting in main); 0 = no ack_wait.
  const std::int64_t heartbeat_ns =
      o.speed > 0 && !sh.replica_role ? static_cast<std::int64_t>(o.ack_wait_ms * 1e6 / o.speed / 2) : 0;
  std::int64_t last_heartbeat_ns = SteadyNs();

  auto classify = [&](inferq::Message& m) {
    const inferq::Event& e = m.event();
    Seq s;
    s.request = HeaderU64(e, "request");
    s.arrival_us = static_cast<double>(HeaderU64(e, "arrival_us"));
    s.context = static_cast<std::uint32_t>(HeaderU64(e, "context_tokens"));
    s.generated = static_cast<std::uint32_t>(HeaderU64(e, "generated_tokens"));
    const bool decode = e.subject.ends_with(".decode");
    s.decode = decode;
    if (sh.replica_role && !decode) {
      // A replica process serves one replay (its replicas' clocks run on from it).
      const auto start_unix_ns = static_cast<std::int64_t>(HeaderU64(e, "replay_start_unix_ns"));
      std::int64_t unset = 0;
      if (sh.replay_start_unix_ns.compare_exchange_strong(unset, start_unix_ns)) {
        // Trace time 0 on this process's clock: the client's start (Unix ns) less
        // the time since then, read on the system clock (the processes may be on
        // different machines; their clocks' skew adds to the transit time).
        const std::int64_t since_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count() -
            start_unix_ns;
        sh.anchor_ns.store(SteadyNs() - since_ns, std::memory_order_release);
      } else if (unset != start_unix_ns) {
        Fail("request " + e.msg_id + " belongs to another replay (its client began at Unix ns " +
                 std::to_string(start_unix_ns) + ", this replica process serves the one begun at " +
                 std::to_string(unset) + "): a replica process serves one replay, start new ones for the next",
             1);
      }
    }
    if (decode) {
      s.produced = static_cast<std::uint32_t>(HeaderU64(e, "produced"));
      s.ready_us = static_cast<double>(HeaderU64(e, "ready_us"));
      if (e.headers.Get("from") == std::optional<std::string_view>(from) && expected > 0) --expected;
    }
    if (m.attempt() > 1) sh.redelivered_seen.fetch_add(1, std::memory_order_relaxed);
    s.who = Assign(o, s.request);
    s.msg = std::move(m);
    if (!decode) {
      // A redelivered request this replica already holds (its earlier delivery was
      // moved while it waited): keep one, settle the other.
      const std::uint64_t r = s.request;
      if (ready.contains(r)) {
        (void)s.msg.Ack();
      } else {
        future.insert_or_assign(r, std::move(s));
      }
    } else if (kv.contains(s.request)) {
      active.push_back(std::move(s));
    } else {
      migrated.push_back(std::move(s));
    }
  };
  // Pulls what the lane holds (blocking up to 50 ms when `block`); false when the
  // lane was empty.
  auto pull = [&](bool block) {
    auto batch = in.NextBatch(block ? absl::Milliseconds(50) : absl::ZeroDuration());
    if (!batch.ok()) return false;
    for (inferq::Message& m : *batch) classify(m);
    return true;
  };

  // A step's tokens are published together (Engine::PublishViewBatch), and the
  // messages it settles are acked together (inferq::AckBatch), after every token and
  // decode event of the step is stored. A token is published as a view
  // (inferq::EventView) of the step's own memory: its subject and seq_id in
  // `step_text`, its payload in `step_tokens`; the engine copies them into the
  // stream's record once, and no Event is built for it.
  struct StepToken {
    std::size_t subject_at, subject_len, seq_id_at, seq_id_len;
    std::uint64_t seq_no;
    TokenPayload payload;
    inferq::TraceContext trace;
  };
  std::string step_text;  // read through views only once the step is complete
  std::vector<StepToken> step_tokens;
  std::vector<inferq::EventView> step_views;
  inferq::Headers token_headers;
  if (!sh.producer.empty()) token_headers.Set("replica", sh.producer);
  std::vector<inferq::Message> step_acks;
  auto emit = [&](Seq& s) {
    StepToken t{};
    const std::string id = std::to_string(s.request);
    t.subject_at = step_text.size();
    step_text.append("infer.reply.").append(id);
    t.subject_len = step_text.size() - t.subject_at;
    t.seq_id_at = step_text.size();
    step_text.append(id);
    t.seq_id_len = id.size();
    t.seq_no = s.produced;
    // One trace per request: its tokens and decode steps are children of the
    // delivery being worked on (--otlp-endpoint; a sampled request is traced whole).
    if (!s.msg.empty()) t.trace = s.msg.trace();
    t.payload = {static_cast<std::int64_t>(vt),
                 static_cast<std::int32_t>((s.request * 7919 + s.produced) % 32000), 0};
    sh.tokens_emitted.fetch_add(1, std::memory_order_relaxed);
    step_tokens.push_back(t);
    ++s.produced;
  };
  auto publish_tokens = [&] {
    step_views.clear();
    const std::string_view text = step_text;
    for (const StepToken& t : step_tokens) {
      step_views.push_back({.subject = text.substr(t.subject_at, t.subject_len),
                            .payload = std::as_bytes(std::span<const TokenPayload>(&t.payload, 1)),
                            .trace = t.trace,
                            .model = o.model,
                            .seq_id = text.substr(t.seq_id_at, t.seq_id_len),
                            .seq_no = t.seq_no,
                            .headers = token_headers.empty() ? nullptr : &token_headers});
    }
    const inferq::PublishBatchResult r = sh.engine->PublishViewBatch(step_views);
    if (!r.status.ok()) {
      std::fprintf(stderr, "replica %u: token publish failed: %s\n", index,
                   std::string(r.status.message()).c_str());
      sh.fatal.store(1);
    }
    step_tokens.clear();
    step_text.clear();
  };
  auto ack_step = [&] {
    if (absl::Status st = inferq::AckBatch(step_acks); !st.ok()) {
      std::fprintf(stderr, "replica %u: ack failed: %s\n", index, std::string(st.message()).c_str());
      sh.fatal.store(1);
    }
    step_acks.clear();
  };

  // After a step: the sequence either finished or continues as a decode event that
  // affinity routes back here; either way the consumed event is acked. A replica
  // process holds a request until its generation finished (see Shared::held).
  const std::string decode_subject = "infer." + o.model + ".decode";
  inferq::Headers decode_headers;  // settle's, reused for every decode event
  auto settle = [&](Seq& s) {
    const bool finished = s.produced == s.generated;
    if (finished) {
      sh.generations_done.fetch_add(1, std::memory_order_relaxed);
      kv.erase(s.request);
    } else {
      // A view (inferq::EventView) of this step's values: the engine copies them
      // into the stream's record; `decode_headers` is reused, its entries set anew.
      const std::string seq_id = std::to_string(s.request);
      decode_headers.Set("request", seq_id);
      decode_headers.Set("arrival_us", std::to_string(static_cast<std::int64_t>(s.arrival_us)));
      decode_headers.Set("context_tokens", std::to_string(s.context));
      decode_headers.Set("generated_tokens", std::to_string(s.generated));
      decode_headers.Set("produced", std::to_string(s.produced));
      decode_headers.Set("ready_us", std::to_string(static_cast<std::int64_t>(vt)));
      decode_headers.Set("from", from);
      // Durable replay: a step redone after a restart whose successor was stored
      // before the crash publishes it again; the duplicate window keeps one chain.
      const std::string msg_id = durable ? "dec-" + seq_id + "-" + std::to_string(s.produced) : std::string();
      const inferq::EventView e{
          .subject = decode_subject,
          .tenant = tenant_names[s.who.tenant],
          // A running sequence is served ahead of new work in the lane (see the banner).
          .qos = inferq::Qos::kGold,
          // The next step continues this request's trace.
          .trace = s.msg.empty() ? inferq::TraceContext{} : s.msg.trace(),
          .model = o.model,
          .msg_id = msg_id,
          .seq_id = seq_id,
          .headers = &decode_headers};
      auto r = sh.engine->PublishView(e);
      if (!r.ok()) {
        std::fprintf(stderr, "replica %u: decode publish failed: %s\n", index,
                     std::string(r.status().message()).c_str());
        sh.fatal.store(1);
      }
      if (!r.ok() || !r->duplicate) ++expected;
    }
    auto ack = [&](inferq::Message& m) { step_acks.push_back(std::move(m)); };
    if (sh.replica_role && !s.decode && !finished) {
      std::lock_guard lock(sh.held_mu);
      sh.held.insert_or_assign(s.request, std::move(s.msg));
    } else {
      ack(s.msg);
    }
    if (sh.replica_role && s.decode && finished) {
      std::lock_guard lock(sh.held_mu);
      if (auto it = sh.held.find(s.request); it != sh.held.end()) {
        ack(it->second);
        sh.held.erase(it);
      }
    }
  };

  // Load reports for the topology score: every replica has the same capacity (qps:
  // sequences per trace second at a full batch), so the score tells them apart by
  // the time of its next decode step (rt, ms) and batch occupancy (cpu).
  const double full_step_us = o.decode_base_ms * 1000 + o.decode_us_per_seq * o.max_batch;
  auto report = [&] {
    // Sequences whose KV cache is here (running, or a decode step on its way back)
    // plus requests waiting for a slot.
    const double n = static_cast<double>(kv.size() + migrated.size() + future.size() + ready.size());
    (void)in.ReportLoad({.qps = o.max_batch * 1e6 / full_step_us,
                         .rt_ms = (o.decode_base_ms * 1000 + o.decode_us_per_seq * n) / 1000,
                         .hop = 0,
                         .cpu = std::min(1.0, n / o.max_batch)});
  };

  report();
  sh.reported.fetch_add(1, std::memory_order_release);
  while (!sh.done.load(std::memory_order_acquire)) {
    report();
    if (doomed && vt >= kill_at_us) {
      // Killed: stop without acking what this replica holds.
      sh.killed_at_wall_ns.store(SteadyNs(), std::memory_order_release);
      std::vector<Seq> lost;
      for (auto* v : {&active, &migrated}) std::move(v->begin(), v->end(), std::back_inserter(lost));
      for (auto* held : {&future, &ready}) {
        for (auto& [r, q] : *held) lost.push_back(std::move(q));
      }
      sh.killed_holding.store(lost.size(), std::memory_order_relaxed);
      // Keep the unacked messages alive until the end, as a crashed process would
      // never answer them; they are redelivered after ack_wait.
      std::lock_guard lock(sh.graveyard_mu);
      for (Seq& q : lost) sh.graveyard.push_back(std::move(q.msg));
      break;
    }
    // What this replica holds across steps is alive: restart its ack_wait timers
    // (requests waiting for a slot, decode steps waiting through a prefill). A
    // heartbeat every half ack_wait keeps each of them within it, as a JetStream
    // client sends its in-progress acks; without an ack_wait (--speed 0) nothing
    // expires and there is nothing to restart. It used to run at every step, over
    // everything held: at --speed 0, where a replica holds thousands of requests
    // that have not arrived in its trace time yet, half of the example's CPU.
    if (heartbeat_ns > 0 && SteadyNs() - last_heartbeat_ns >= heartbeat_ns) {
      last_heartbeat_ns = SteadyNs();
      for (auto* held : {&active, &migrated}) {
        for (Seq& q : *held) (void)q.msg.InProgress();
      }
      for (auto* held : {&future, &ready}) {
        for (auto& [r, q] : *held) (void)q.msg.InProgress();
      }
    }
    // Own decode events are in the lane already (Publish queues before returning);
    // if one is not there, the policy sent it elsewhere.
    while (expected > 0) {
      if (!pull(false)) expected = 0;
    }
    // Admission. First every request that arrived by now (vt) must be here: a busy
    // replica waits until the publisher is past vt and takes all its lane holds. An
    // idle replica blocks for its next event and, if that is a request from its
    // future, moves its clock to the earliest one. Then the requests that arrived by
    // vt join `order`, and it picks which to admit, up to the batch size.
    admitted.clear();
    auto drain = [&] {
      while (pull(false)) {
      }
    };
    if (active.empty() && migrated.empty() && ready.empty()) {
      if (future.empty()) {
        if (!pull(/*block=*/true)) continue;
        drain();
      }
      if (migrated.empty() && ready.empty() && !future.empty()) {
        vt = std::max(vt, future.begin()->second.arrival_us);
      }
    }
    sh.AwaitPublishedThrough(vt);
    drain();
    while (!future.empty() && future.begin()->second.arrival_us <= vt) {
      auto node = future.extract(future.begin());
      const Seq& s = node.mapped();
      std::optional<std::uint64_t> evicted;
      const inferq::QosPushResult pushed = order->Push(
          std::uint64_t{s.request}, {s.who.tier, tenant_names[s.who.tenant], 0, 1}, evicted);
      if (pushed != inferq::QosPushResult::kAccepted) {
        std::fprintf(stderr, "replica %u: admission queue refused request %llu\n", index,
                     static_cast<unsigned long long>(s.request));
        sh.fatal.store(1);
      }
      ready.insert(std::move(node));
    }
    while (active.size() + migrated.size() + admitted.size() < o.max_batch && !order->empty()) {
      auto node = ready.extract(*order->Pop());
      admitted.push_back(std::move(node.mapped()));
    }
    if (!admitted.empty() || !migrated.empty()) {
      // Prefill: new prompts, and for moved sequences prompt + generated tokens
      // (their KV cache stayed on the replica they came from).
      double prompt = 0;
      for (const Seq& s : admitted) prompt += s.context;
      for (const Seq& s : migrated) {
        prompt += s.context + s.produced;
        vt = std::max(vt, s.ready_us);
      }
      vt += o.prefill_base_ms * 1000 + o.prefill_us_per_token * prompt;
      sh.PaceTo(vt);
      for (auto* group : {&admitted, &migrated}) {
        for (Seq& s : *group) {
          kv.insert(s.request);
          emit(s);
        }
      }
      publish_tokens();
      for (auto* group : {&admitted, &migrated}) {
        for (Seq& s : *group) settle(s);
      }
      ack_step();
      migrated.clear();
      continue;
    }
    if (active.empty()) continue;
    vt += o.decode_base_ms * 1000 + o.decode_us_per_seq * static_cast<double>(active.size());
    sh.PaceTo(vt);
    for (Seq& s : active) emit(s);
    publish_tokens();
    for (Seq& s : active) settle(s);
    ack_step();
    active.clear();
  }
  sh.replicas_done.fetch_add(1, std::memory_order_release);
}

struct ClientResult {
  std::uint64_t tokens_delivered = 0;  // released by the ReorderBuffer: reached the user
  std::uint64_t duplicates = 0;        // dropped by the ReorderBuffer as duplicates
  // ...of which (durable replay): found among the tokens stored before this run;
  // copies of a token stored before this run (a step redone after the crash); and
  // copies of a token this run received (an ack_wait redelivery to a replica that
  // still held the step: a failure, as in any run).
  std::uint64_t duplicates_before = 0, duplicates_after_crash = 0, duplicates_in_run = 0;
  // --role client: copies from another replica process than the token's first copy
  // came from (a request run again after its replica died: at least once).
  std::uint64_t duplicates_rerun = 0;
  std::uint64_t out_of_order = 0;      // arrived ahead of a missing number (then held)
  std::size_t completed = 0;
  inferq::HistogramSnapshot e2e_us;  // TTFT and TBT: Shared::probe
  // Per tier (gold, silver, bronze): requests in the trace, first tokens within
  // the tier's TTFT SLA, TTFT.
  std::array<std::uint64_t, 3> tier_requests{}, tier_within_sla{};
  std::array<inferq::HistogramSnapshot, 3> tier_ttft_us;
  std::array<inferq::HistogramSnapshot, 3> tier_tbt_us;  // per tier: the CDFs of --json
};

// The user's side of the token streams. Every token goes through a ReorderBuffer
// keyed by seq_id (the request index): it releases each generation's tokens strictly
// in seq_no order and drops a number it released or holds already (kDuplicate). What
// it releases reaches the user, and is what the latency figures and completeness are
// taken from. Tokens come from the client's consumer, and in a durable replay first
// from the tokens stored before the run (RecoverReplay): one buffer sees the
// whole replay, so duplicates across a crash are found too. Sequences stay open to
// the end (max_sequences = the trace's requests), so a copy that comes after its
// generation completed is still a duplicate and never opens a new sequence.
class TokenReceiver {
 public:
  TokenReceiver(Shared& sh, const std::vector<TraceRequest>& trace)
      : sh_(sh), trace_(trace), req_(trace.size()), first_producer_(trace.size()), rb_(BufferOptions(trace)) {
    for (std::size_t i = 0; i < trace.size(); ++i) {
      ++r_.tier_requests[static_cast<std::size_t>(Assign(*sh.opt, i).tier)];
    }
  }

  // One token event. Fails the run (exit 1) on a malformed one, and on a result the
  // buffer's options rule out (overflow, too many sequences, late: no gap is ever
  // expired, so none is reported before the end).
  void Receive(const inferq::Event& e) {
    std::uint64_t id = 0;
    if (std::from_chars(e.seq_id.data(), e.seq_id.data() + e.seq_id.size(), id).ec !=
            std::errc() ||
        id >= trace_.size() || e.payload.size() != sizeof(TokenPayload)) {
      Fail("malformed token event on '" + e.subject + "'", 1);
    }
    if (e.seq_no >= trace_[id].generated_tokens) Fail("token seq_no beyond the generation", 1);
    TokenPayload p;
    std::memcpy(&p, e.payload.data(), sizeof p);
    // Which replica process made it (--role client; kNone in one process).
    std::int32_t producer = kNone;
    if (const auto r = e.headers.Get("replica")) {
      producer = producers_.try_emplace(std::string(*r), static_cast<std::int32_t>(producers_.size())).first->second;
    }
    // Per token: who sent its first copy.
    std::vector<std::int32_t>& firsts = first_producer_[id];
    if (firsts.empty()) firsts.assign(trace_[id].generated_tokens, kUnknown);
    std::int32_t& first = firsts[e.seq_no];
    if (first == kUnknown) first = producer;
    // Arrival times only matter to gap expiry, which the client does not use.
    const inferq::ReorderResult res =
        rb_.Offer(e.seq_id, e.seq_no, p, /*now_ns=*/0,
                  [&](std::string_view, std::uint64_t seq_no, TokenPayload&& q) { Deliver(id, seq_no, q); });
    switch (res) {
      case inferq::ReorderResult::kReleased:
        break;
      case inferq::ReorderResult::kDuplicate:  // dropped, counted by the buffer
        sh_.probe->Duplicates();
        if (!live_) {
          ++r_.duplicates_before;
        } else if (producer != first) {
          ++r_.duplicates_rerun;
        } else if (e.seq_no < req_[id].got_before) {
          ++r_.duplicates_after_crash;
        } else {
          ++r_.duplicates_in_run;
        }
        break;
      case inferq::ReorderResult::kBuffered:
        ++r_.out_of_order;
        sh_.probe->Reordered();
        break;
      default:
        Fail("token " + std::to_string(e.seq_no) + " of request " + std::to_string(id) +
                 ": reorder buffer says " + std::string(inferq::ReorderResultName(res)),
             1);
    }
  }

  std::size_t completed() const { return r_.completed; }
  // Ends the reading back of a durable replay's stored tokens: what comes from now
  // on is received live (tokens are released in order, so a generation's first
  // `got` numbers are the ones stored before this run).
  void EndReadBack() {
    for (PerRequest& pr : req_) pr.got_before = pr.got;
    live_ = true;
  }
  ClientResult Result() const {
    ClientResult r = r_;
    r.duplicates = rb_.Stats().duplicates;
    return r;
  }

 private:
  struct PerRequest {
    std::uint32_t got = 0;
    std::uint32_t got_before = 0;  // released while reading back the stored tokens
    std::int64_t last_us = 0;
  };

  static inferq::ReorderBufferOptions BufferOptions(const std::vector<TraceRequest>& trace) {
    inferq::ReorderBufferOptions o;
    o.max_sequences = std::max<std::size_t>(trace.size(), 1);
    std::uint32_t longest = 1;
    for (const TraceRequest& t : trace) longest = std::max(longest, t.generated_tokens);
    o.max_pending_per_sequence = longest;  // any number of a generation is accepted
    return o;
  }

  // Token seq_no of request id, released in order.
  void Deliver(std::uint64_t id, std::uint64_t seq_no, const TokenPayload& p) {
    PerRequest& pr = req_[id];
    const TraceRequest& t = trace_[id];
    ++pr.got;
    ++r_.tokens_delivered;
    sh_.tokens_received.fetch_add(1, std::memory_order_relaxed);
    // The probe follows the sequence in trace time (ns): it starts at the request's
    // arrival, and its first token is the TTFT.
    const std::string seq_id = std::to_string(id);
    if (seq_no == 0) {
      CheckProbe(sh_.probe->Start(seq_id, t.arrival_us * 1000, Assign(*sh_.opt, id).tier));
    }
    CheckProbe(sh_.probe->Token(seq_id, p.trace_us * 1000));
    if (seq_no == 0) {
      const auto ttft = static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.trace_us - t.arrival_us));
      const auto tier = static_cast<std::size_t>(Assign(*sh_.opt, id).tier);
      r_.tier_ttft_us[tier].Record(ttft);
      if (static_cast<double>(ttft) <= sh_.opt->sla_ms[tier] * 1000) ++r_.tier_within_sla[tier];
    } else {
      r_.tier_tbt_us[static_cast<std::size_t>(Assign(*sh_.opt, id).tier)].Record(
          static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.trace_us - pr.last_us)));
    }
    pr.last_us = p.trace_us;
    if (pr.got == t.generated_tokens) {
      CheckProbe(sh_.probe->Finish(seq_id));
      ++r_.completed;
      sh_.completed.fetch_add(1, std::memory_order_relaxed);
      r_.e2e_us.Record(static_cast<std::uint64_t>(std::max<std::int64_t>(0, p.trace_us - t.arrival_us)));
    }
  }

  static void CheckProbe(const absl::Status& s) {
    if (!s.ok()) Fail("token probe: " + std::string(s.message()), 1);
  }

  static constexpr std::int32_t kUnknown = -2;  // no copy of the token yet
  static constexpr std::int32_t kNone = -1;     // a token without a "replica" header

  Shared& sh_;
  const std::vector<TraceRequest>& trace_;
  std::vector<PerRequest> req_;
  // Per request and token number: who sent the token's first copy (allocated at the
  // request's first token).
  std::vector<std::vector<std::int32_t>> first_producer_;
  std::unordered_map<std::string, std::int32_t> producers_;
  inferq::ReorderBuffer<TokenPayload> rb_;
  ClientResult r_;
  bool live_ = false;  // false while RecoverReplay reads back the stored tokens
};

// Receives every token through `rx`, then acks it. A delivery of a stored message
// at or below `rebuilt_through` (a durable replay's tokens from before this run that
// the client had not acked) was read by the rebuild already: acked, passed over.
//
// When it gives up on what is missing (reported as lost): every local replica is
// gone; or nothing came for 30 s after the last publish, and, across processes
// (--role client), JetStream has also answered for 30 s more that it holds nothing
// for the replay (no request unfinished, no token untaken), or nothing came for
// 10 minutes. An outage of the NATS cluster, or its leaders elected again and again
// on a loaded machine, delays the tokens but never makes the client give up on work
// the replicas still hold (a run at load 9-12 gave up after 30 s with 1,020 tokens
// still retried by a replica).
void RunClient(Shared& sh, TokenReceiver& rx, inferq::Member tokens, std::uint64_t rebuilt_through) {
  const auto& trace = *sh.trace;
  constexpr auto kIdle = std::chrono::seconds(30);
  constexpr auto kClusterGiveUp = std::chrono::minutes(10);
  auto last_token = Clock::now();
  auto last_check = Clock::time_point{};
  // JetStream answered "nothing" since empty_since, when `empty` (a flag and a time,
  // not an optional: GCC 12 at -O3 warns that the optional's time may be uninitialized).
  bool empty = false;
  Clock::time_point empty_since{};
  // Tokens come in batches into this array (Member::NextBatch into a span: what the
  // lane holds, up to 64, no vector) and are acked together (inferq::AckBatch).
  std::array<inferq::Message, 64> batch;
  while (rx.completed() < trace.size()) {
    absl::StatusOr<std::size_t> m = tokens.NextBatch(batch, absl::ZeroDuration(), absl::Milliseconds(50));
    if (!m.ok()) {
      if (m.status().code() == absl::StatusCode::kCancelled) break;
      if (sh.local_replicas && sh.replicas_done.load(std::memory_order_acquire) == sh.opt->replicas) break;
      const auto now = Clock::now();
      if (!sh.all_published.load(std::memory_order_acquire) || now - last_token <= kIdle) continue;
      if (!sh.jetstream_in_flight) break;
      if (now - last_token > kClusterGiveUp) break;
      if (now - last_check >= std::chrono::seconds(2)) {
        last_check = now;
        absl::StatusOr<std::uint64_t> held = sh.jetstream_in_flight();
        if (held.ok() && *held == 0) {
          if (!empty) empty_since = now;
          empty = true;
          if (now - empty_since >= kIdle) break;
        } else {
          empty = false;
        }
      }
      continue;
    }
    last_token = Clock::now();
    empty = false;
    const std::span<inferq::Message> got = std::span(batch).first(*m);
    for (const inferq::Message& token : got) {
      if (token.stream_seq() <= rebuilt_through) {
        sh.client_redelivered.fetch_add(1, std::memory_order_relaxed);
      } else {
        rx.Receive(token.event());
      }
    }
    if (absl::Status st = inferq::AckBatch(got); !st.ok()) Fail("token ack failed: " + std::string(st.message()), 1);
  }
  sh.done.store(true, std::memory_order_release);
}

// What a durable replay's state directory held when this run began.
struct Resume {
  bool resumed = false;               // the streams held an earlier run's replay
  std::size_t requests_stored = 0;    // requests 0..n-1 are stored: publish from n on
  std::int64_t trace_us = 0;          // latest trace time stored: the clock goes on here
  std::uint64_t tokens_stored = 0;    // token messages in REPLIES, duplicates included
  std::uint64_t rebuilt_through = 0;  // REPLIES' last sequence before this run
  std::uint64_t tokens_delivered = 0; // of those, released to the user by the rebuild
  std::size_t completed = 0;          // requests complete among them
  double seconds = 0;                 // wall time the reading took
};

// Reads back what an earlier run stored (Engine::GetMessage), before anything of this
// run publishes: the newest stored request, from the newest message of REQUESTS back
// (past the decode steps stored after it: the publisher stores requests in index
// order, so the requests stored are a prefix of the trace); and every token of
// REPLIES in sequence order, through the client's receiver, so that its figures cover
// the whole replay. A sequence the stream no longer holds is passed over; any other
// read error fails the run.
Resume RecoverReplay(inferq::Engine& engine, TokenReceiver& rx, const std::vector<TraceRequest>& trace) {
  const auto start = Clock::now();
  Resume r;
  const inferq::EngineStats stats = engine.Stats();
  const inferq::StreamStats* requests = stats.stream("REQUESTS");
  const inferq::StreamStats* replies = stats.stream("REPLIES");
  auto get = [&](const char* stream, std::uint64_t seq) -> std::shared_ptr<const inferq::Event> {
    absl::StatusOr<std::shared_ptr<const inferq::Event>> e = engine.GetMessage(stream, seq);
    if (e.ok()) return *std::move(e);
    if (e.status().code() != absl::StatusCode::kNotFound) {
      Fail("reading back the replay in --state-dir: " + std::string(e.status().message()), 1);
    }
    return nullptr;
  };
  for (std::uint64_t seq = requests->last_seq; seq >= std::max<std::uint64_t>(requests->first_seq, 1);
       --seq) {
    const std::shared_ptr<const inferq::Event> e = get("REQUESTS", seq);
    if (e == nullptr) continue;
    if (e->subject.ends_with(".request")) {
      const std::uint64_t i = HeaderU64(*e, "request");
      if (i >= trace.size()) {
        Fail("--state-dir holds request " + std::to_string(i) + ", beyond the " +
                 std::to_string(trace.size()) + " of this replay",
             1);
      }
      r.requests_stored = i + 1;
      r.trace_us = std::max(r.trace_us, static_cast<std::int64_t>(HeaderU64(*e, "arrival_us")));
      break;
    }
    r.trace_us = std::max(r.trace_us, static_cast<std::int64_t>(HeaderU64(*e, "ready_us")));
  }
  for (std::uint64_t seq = std::max<std::uint64_t>(replies->first_seq, 1); seq <= replies->last_seq; ++seq) {
    const std::shared_ptr<const inferq::Event> e = get("REPLIES", seq);
    if (e == nullptr) continue;
    rx.Receive(*e);  // checks the payload's size
    TokenPayload p;
    std::memcpy(&p, e->payload.data(), sizeof p);
    r.trace_us = std::max(r.trace_us, p.trace_us);
    ++r.tokens_stored;
  }
  rx.EndReadBack();
  r.rebuilt_through = replies->last_seq;
  r.resumed = requests->last_seq > 0 || replies->last_seq > 0;
  const ClientResult so_far = rx.Result();
  r.tokens_delivered = so_far.tokens_delivered;
  r.completed = so_far.completed;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

std::string FormatDuration(double seconds) {
  const int s = static_cast<int>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

}  // namespace

#ifdef INFERQ_EXAMPLE_NATS
// --role replica: runs the replicas until SIGTERM or SIGINT (blocked in every thread
// since main began, taken here by sigtimedwait). Then it lets the tokens still in REPLIES reach NATS (10 s at most), closes the
// bridge, which naks in NATS the requests not finished (JetStream gives them to
// another replica process), and prints what this process did.
int RunReplicaProcess(Shared& sh, inferq::Engine& engine, const inferq::Consumer& replicas,
                      inferq::nats::NatsBridge& bridge, const sigset_t& stop_signals) {
  const Options& o = *sh.opt;
  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; i < o.replicas; ++i) {
    threads.emplace_back(RunReplica, std::ref(sh), *replicas.member(i), i);
  }
  std::fprintf(stderr, "inference_server replica %s: %u replicas ready, taking requests from JetStream stream %s\n",
               sh.producer.c_str(), o.replicas, inferq::example::kRequestsJetStream);
  int sig = 0;
  while (sig <= 0 && sh.fatal.load() == 0) {
    const timespec tick{0, 20'000'000};
    sig = sigtimedwait(&stop_signals, nullptr, &tick);
  }
  sh.done.store(true, std::memory_order_release);
  for (auto& t : threads) t.join();
  const auto until = Clock::now() + std::chrono::seconds(10);
  std::uint64_t unexported = 0;
  for (;;) {
    const inferq::EngineStats st = engine.Stats();
    unexported = st.stream("REPLIES")->messages;
    if (unexported == 0 || Clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::size_t unfinished = 0;
  {
    std::lock_guard lock(sh.held_mu);
    unfinished = sh.held.size();
  }
  bridge.Close(absl::Seconds(2));
  const inferq::nats::BridgeStats b = bridge.Stats();
  std::printf("inference_server replica %s: %s; %llu generations completed, %llu tokens made "
              "(%llu not exported), %zu requests unfinished (nak'ed in NATS for another replica)\n"
              "  nats: %llu requests imported (%llu JetStream had delivered before, to this or "
              "another process), %llu tokens exported "
              "(%llu failed publishes retried), %llu reconnects%s%s\n",
              sh.producer.c_str(),
              sig == SIGTERM ? "stopped by SIGTERM" : sig == SIGINT ? "stopped by SIGINT" : "a replica failed",
              static_cast<unsigned long long>(sh.generations_done.load()),
              static_cast<unsigned long long>(sh.tokens_emitted.load()),
              static_cast<unsigned long long>(unexported), unfinished,
              static_cast<unsigned long long>(b.imported), static_cast<unsigned long long>(b.import_redelivered),
              static_cast<unsigned long long>(b.exported), static_cast<unsigned long long>(b.export_failures),
              static_cast<unsigned long long>(b.reconnects), b.last_error.empty() ? "" : "; last error: ",
              b.last_error.c_str());
  return sh.fatal.load() == 0 && unexported == 0 ? 0 : 1;
}
#endif

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);
  const bool client_role = opt.role == "client";
  const bool replica_role = opt.role == "replica";
  // A replica process stops on SIGTERM or SIGINT, taken by sigtimedwait: blocked
  // before any thread starts, so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (replica_role) pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  if (!opt.json.empty()) {
    // Checked before the replay, without truncating: the file is written at the end.
    std::error_code ec;
    if (std::filesystem::equivalent(opt.json, opt.trace, ec)) {
      Fail("--json file '" + opt.json + "' is the trace file: it would be overwritten");
    }
    if (absl::Status s = inferq::example::CheckOutputPath(opt.json); !s.ok()) {
      Fail("--json: " + std::string(s.message()), 1);
    }
  }
  if (!opt.timeline.empty()) {
    std::error_code ec;
    if (std::filesystem::equivalent(opt.timeline, opt.trace, ec)) {
      Fail("--timeline file '" + opt.timeline + "' is the trace file: it would be overwritten");
    }
    if (opt.timeline == opt.json || std::filesystem::equivalent(opt.timeline, opt.json, ec)) {
      Fail("--timeline file '" + opt.timeline + "' is the --json file");
    }
    if (absl::Status s = inferq::example::CheckOutputPath(opt.timeline); !s.ok()) {
      Fail("--timeline: " + std::string(s.message()), 1);
    }
  }
  const bool durable = !opt.state_dir.empty();
  if (durable) {
    // A path that is not a directory is a bad value (2); one that cannot be made or
    // written, an I/O failure (1).
    if (absl::Status s = inferq::example::PrepareStateDir(opt.state_dir); !s.ok()) {
      const bool bad_value = s.code() == absl::StatusCode::kInvalidArgument;
      Fail((bad_value ? "--state-dir " : "--state-dir: ") + std::string(s.message()), bad_value ? 2 : 1);
    }
  }
  auto loaded = inferq::example::LoadTrace(opt.trace);
  if (!loaded.ok()) Fail(std::string(loaded.status().message()), 1);
  std::vector<TraceRequest> trace = *std::move(loaded);
  if (opt.limit > 0 && opt.limit < trace.size()) trace.resize(opt.limit);
  // --overload X: the same requests, X times as fast (every arrival time divided by
  // X, rounded to the µs; order kept).
  if (opt.overload != 1.0) {
    for (auto& t : trace) {
      const double scaled = static_cast<double>(t.arrival_us) / opt.overload;
      if (scaled > 9.0e15) {  // llround's result must fit; no trace spans 285 years
        Fail("trace '" + opt.trace + "': arrival " + std::to_string(t.arrival_us) +
                 " us divided by --overload is beyond any replay", 1);
      }
      t.arrival_us = std::llround(scaled);
    }
  }
  std::uint64_t tokens_total = 0;
  for (const auto& t : trace) tokens_total += t.generated_tokens;
  const double replay_seconds =
      opt.speed > 0 ? static_cast<double>(trace.back().arrival_us) / 1e6 / opt.speed : 0;
  if (replay_seconds > 366.0 * 24 * 3600) {
    char speed[32];
    std::snprintf(speed, sizeof speed, "%g", opt.speed);
    Fail("trace '" + opt.trace + "' spans " + std::to_string(trace.back().arrival_us / 1000000) +
         " s of arrivals" + (opt.overload != 1.0 ? " after --overload" : "") + "; at --speed " +
         speed + " the replay would take over a year", 1);
  }

  if (durable) {
    // The settings that fix what the replay stores; a resumed run must match them.
    auto num = [](double x) {  // the shortest text that reads back as x
      char b[32];
      return std::string(b, std::to_chars(b, b + sizeof b, x).ptr);
    };
    char fingerprint[64];
    std::snprintf(fingerprint, sizeof fingerprint, "%zu requests, fingerprint %016llx", trace.size(),
                  static_cast<unsigned long long>(inferq::example::TraceFingerprint(trace)));
    const inferq::example::ReplaySettings settings = {
        {"trace", fingerprint},
        {"--model", opt.model},
        {"--replicas", std::to_string(opt.replicas)},
        {"--max-batch", std::to_string(opt.max_batch)},
        {"--prefill-base-ms", num(opt.prefill_base_ms)},
        {"--prefill-us-per-token", num(opt.prefill_us_per_token)},
        {"--decode-base-ms", num(opt.decode_base_ms)},
        {"--decode-us-per-seq", num(opt.decode_us_per_seq)},
        {"--policy", opt.policy},
        {"--ack-wait-ms", num(opt.ack_wait_ms)},
        {"--tier-mix", std::to_string(opt.tier_mix[0]) + ":" + std::to_string(opt.tier_mix[1]) + ":" +
                           std::to_string(opt.tier_mix[2])},
        {"--tenants", std::to_string(opt.tenants)},
        {"--sla-ms", num(opt.sla_ms[0]) + ":" + num(opt.sla_ms[1]) + ":" + num(opt.sla_ms[2])},
        {"--max-deliver", std::to_string(opt.max_deliver)}};
    if (absl::Status s = inferq::example::CheckReplaySettings(opt.state_dir, settings); !s.ok()) {
      Fail(std::string(s.message()), s.code() == absl::StatusCode::kFailedPrecondition ? 2 : 1);
    }
  }

  inferq::EngineOptions engine_options;
#ifdef INFERQ_EXAMPLE_OTLP
  // --otlp-endpoint: the engine's spans go to the exporter, which sends them on its
  // own thread (declared before the engine, which holds it, and flushed at the end).
  std::shared_ptr<inferq::otlp::OtlpHttpExporter> exporter;
  if (!opt.otlp_endpoint.empty()) {
    auto e = inferq::otlp::OtlpHttpExporter::Create(
        {.endpoint = opt.otlp_endpoint, .service_name = "inference_server", .max_queue_spans = 1 << 16});
    if (!e.ok()) Fail("--otlp-endpoint: " + std::string(e.status().message()));
    exporter = *std::move(e);
    engine_options.trace = {.sink = exporter, .sample_ratio = opt.otlp_sample};
  }
#endif
  absl::StatusOr<std::unique_ptr<inferq::Engine>> created = inferq::Engine::Create(std::move(engine_options));
  if (!created.ok()) Fail(std::string(created.status().message()), 1);
  inferq::Engine& engine = **created;
  auto check = [](const absl::Status& s) {
    if (!s.ok()) Fail(std::string(s.message()), 1);
  };
  // Durable replay: each stream a file stream in its own directory of --state-dir
  // (see the banner). Limits retention, which file streams need, without limits:
  // everything stays, so the client can rebuild its figures from the stored tokens.
  // Sync kInterval every second: a publish (and an ack, in the consumers' ack logs)
  // returns once written to the OS, which a SIGKILL of the process cannot take back;
  // the fdatasync each second bounds what a power loss could take. kEveryCommit
  // would fdatasync every token for a durability the crash demo does not need.
  auto stored = [&](inferq::StreamConfig s) {
    if (durable) {
      s.storage = inferq::StorageType::kFile;
      s.directory = (std::filesystem::path(opt.state_dir) / s.name).string();
      s.retention = inferq::RetentionPolicy::kLimits;
      s.sync = inferq::SyncPolicy::kInterval;
      s.sync_window = absl::Seconds(1);
    }
    return s;
  };
  inferq::StreamConfig requests_stream{.name = "REQUESTS",
                                       .subjects = {"infer.*.request", "infer.*.decode"},
                                       .retention = inferq::RetentionPolicy::kInterest};
  // --role client: requests go to NATS only; --role replica: a work queue, whose
  // consumer's ack the bridge waits for before it acks a request to NATS.
  if (client_role) requests_stream.subjects = {"infer." + opt.model + ".request"};
  if (replica_role) requests_stream.retention = inferq::RetentionPolicy::kWorkQueue;
  // Request ids (req-<i>) and decode step ids (dec-<request>-<produced>) are kept
  // as long as the engine allows, so that a restart however late still finds them;
  // duplicate_window_max_entries (default 240,000) bounds the memory, forgetting the
  // oldest ids first, which a resumed run no longer publishes.
  if (durable) requests_stream.duplicate_window = inferq::kMaxDuration;
  check(engine.AddStream(stored(requests_stream)));
  // Dead letters of the replicas' consumer (an event given up after --max-deliver
  // deliveries) are kept here and counted in the summary.
  const std::string dead_subject = "infer.dead." + opt.model;
  if (!client_role) check(engine.AddStream(stored({.name = "DEAD", .subjects = {dead_subject}, .max_msgs = 100000})));
  check(engine.AddStream(stored({.name = "REPLIES",
                                 .subjects = {"infer.reply.>"},
                                 .retention = inferq::RetentionPolicy::kInterest})));
  // New requests are placed by --policy; every decode step follows its sequence.
  auto affinity = inferq::AffinityPolicy::Create(*inferq::MakeSelectionPolicy(opt.policy),
                                                 inferq::HashKey::SeqId());
  check(affinity.status());
  // Lanes hold the whole trace: a replica publishes its decode steps to its own lane,
  // and must never block on it (it is the one that drains it).
  inferq::ConsumerConfig replicas_cfg{.stream = "REQUESTS",
                                      .name = "replicas",
                                      .filter_subject = "infer." + opt.model + ".*",
                                      .members = opt.replicas,
                                      .lane_capacity = 65536};
  const inferq::AffinityPolicy* affinity_policy = affinity->get();
  replicas_cfg.selection = std::shared_ptr<inferq::SelectionPolicy>(*std::move(affinity));
  // A decode step held through a long prefill step is slow, not sick: no latency
  // outlier check; only ack_wait expiries and stalls count as failures.
  replicas_cfg.group.outlier.latency_factor = 0;
  // QoS lanes: requests by tier and tenant, decode steps of running sequences gold.
  replicas_cfg.qos = inferq::QosConfig{};
  replicas_cfg.max_deliver = opt.max_deliver;
  replicas_cfg.dead_letter_subject = dead_subject;
  // Pulls under the adaptive batcher. Baseline RTT (deliver -> ack of one event at
  // nominal load): one decode step of a full batch, decode_base_ms +
  // decode_us_per_seq * max_batch, in trace time, divided by --speed for wall time
  // (the engine measures acks in wall time); at --speed 0 the trace-time value.
  const double step_us = opt.decode_base_ms * 1000 + opt.decode_us_per_seq * opt.max_batch;
  replicas_cfg.batch = {
      .max_batch = opt.max_batch,
      .max_queue_delay = absl::ZeroDuration(),
      .adaptive = true,
      .baseline_rtt = std::max(absl::Nanoseconds(1),
                               absl::Microseconds(opt.speed > 0 ? step_us / opt.speed : step_us))};
  if (opt.speed > 0) {
    // Trace-time settings in wall time: ack_wait and the topology refresh (500 ms of
    // trace time) scale with the replay speed.
    replicas_cfg.ack_wait = absl::Microseconds(opt.ack_wait_ms * 1000 / opt.speed);
    replicas_cfg.group.refresh_interval =
        std::max(absl::Microseconds(100), absl::Microseconds(500'000 / opt.speed));
    replicas_cfg.group.outlier.consecutive_failures = 3;
    replicas_cfg.group.outlier.base_ejection_time = absl::Microseconds(60e6 / opt.speed);
    replicas_cfg.group.outlier.max_ejection_time = absl::Microseconds(600e6 / opt.speed);
    replicas_cfg.group.outlier.slow_start = absl::Microseconds(10e6 / opt.speed);
  }
  // Durable consumers start with everything stored the first time they are added
  // (a later run gets what they had not acked, whatever the policy).
  if (durable || replica_role) replicas_cfg.deliver = inferq::DeliverPolicy::kAll;
  // A replica process: its replicas are threads that do not die alone (a process
  // that dies hands its requests to the others through NATS), so no local ack_wait:
  // under load a busy machine would redeliver work a replica still holds, and the
  // copy would run twice.
  if (replica_role) replicas_cfg.ack_wait = absl::ZeroDuration();
  std::optional<inferq::Consumer> client;
  if (!replica_role) {
    auto c = engine.AddConsumer({.stream = "REPLIES",
                                 .name = "client",
                                 .deliver = durable ? inferq::DeliverPolicy::kAll : inferq::DeliverPolicy::kNew,
                                 .members = 1,
                                 .lane_capacity = 65536});
    check(c.status());
    client.emplace(*c);
  }

  inferq::TokenProbe token_probe(std::max<std::size_t>(trace.size(), 1));
  for (std::size_t t = 0; t < 3; ++t) {  // --sla-ms: the probe's SLA attainment per tier
    check(token_probe.SetTtftSla(static_cast<inferq::Qos>(t), static_cast<std::int64_t>(opt.sla_ms[t] * 1e6)));
  }
#ifdef INFERQ_EXAMPLE_PROMETHEUS
  // --metrics-port: /metrics on loopback while the replay runs (declared after the
  // engine and the probe: it stops serving before they go).
  std::unique_ptr<inferq::prometheus::MetricsServer> metrics;
  std::shared_ptr<CountedEngineCollector> scrapes;
  if (opt.metrics_port >= 0) {
    auto m = inferq::prometheus::MetricsServer::Start({.port = opt.metrics_port});
    if (!m.ok()) Fail("--metrics-port " + std::to_string(opt.metrics_port) + ": " + std::string(m.status().message()), 1);
    metrics = *std::move(m);
    scrapes = std::make_shared<CountedEngineCollector>(engine);
    metrics->Add(scrapes);
    if (!replica_role) {
      metrics->Add(std::make_shared<inferq::prometheus::TokenProbeCollector>(token_probe, "client"));
    }
    std::fprintf(stderr, "inference_server: metrics at %s\n", metrics->url().c_str());
  }
#endif

  Shared sh;
  sh.opt = &opt;
  sh.probe = &token_probe;
  sh.trace = &trace;
  sh.engine = &engine;
  sh.replica_role = replica_role;
  sh.local_replicas = !client_role;
#ifdef INFERQ_EXAMPLE_NATS
  std::unique_ptr<inferq::nats::NatsBridge> bridge;
  if (!opt.role.empty()) {
    const inferq::example::ClusterConfig cluster{
        .servers = opt.nats,
        .model = opt.model,
        .stream_replicas = opt.js_replicas,
        // What its replicas run in a batch: the rest wait in JetStream for whichever
        // process has room (1.5 batches per replica held more back, and the figures
        // were worse).
        .replica_room = static_cast<int>(
            std::min<std::uint64_t>(std::uint64_t{opt.replicas} * opt.max_batch, 1'000'000))};
    // The client empties the streams: a replay starts from nothing.
    check(inferq::example::EnsureReplayStreams(cluster, /*purge=*/client_role));
    if (client_role) {
      auto b = inferq::example::StartClientBridge(engine, cluster);
      check(b.status());
      bridge = *std::move(b);
      sh.jetstream_in_flight = [cluster] { return inferq::example::MessagesInJetStream(cluster); };
    } else {
      char host[256] = {};
      (void)gethostname(host, sizeof host - 1);
      sh.producer = "replica-" + std::string(host) + "-" + std::to_string(getpid());
      auto replicas = engine.AddConsumer(replicas_cfg);
      check(replicas.status());
      auto b = inferq::example::StartReplicaBridge(engine, cluster, sh.producer);
      check(b.status());
      bridge = *std::move(b);
      return RunReplicaProcess(sh, engine, *replicas, *bridge, stop_signals);
    }
  }
#endif
  TokenReceiver receiver(sh, trace);
  // Durable replay: what the state directory holds. Nothing runs yet that publishes.
  const Resume resume = durable ? RecoverReplay(engine, receiver, trace) : Resume{};
  if (!durable) receiver.EndReadBack();
  if (opt.crash_at_s >= 0 && opt.crash_at_s * 1e6 <= static_cast<double>(resume.trace_us)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "--crash-at '%g' is not after trace second %.3f, where the replay",
                  opt.crash_at_s, static_cast<double>(resume.trace_us) / 1e6);
    Fail(std::string(buf) + " in --state-dir '" + opt.state_dir + "' resumes");
  }
  // Added after the reading back: the requests and decode steps a resumed replay
  // gets again are queued on the replicas' lanes when the consumer is added, and a
  // lane nobody pulls from for ack_wait counts as a stalled replica.
  std::optional<inferq::Consumer> replicas;
  if (!client_role) {
    auto r = engine.AddConsumer(replicas_cfg);
    check(r.status());
    replicas.emplace(*r);
  }
  sh.published.store(resume.requests_stored);
  sh.all_published.store(resume.requests_stored == trace.size());
  sh.next_unpublished_us.store(resume.requests_stored < trace.size()
                                   ? trace[resume.requests_stored].arrival_us
                                   : INT64_MAX);
  sh.run_start = Clock::now();
  // A resumed replay's trace clock goes on at the latest trace time stored.
  sh.wall_start = sh.run_start;
  if (opt.speed > 0) {
    sh.wall_start -= std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::micro>(static_cast<double>(resume.trace_us) / opt.speed));
  }

  std::vector<std::thread> threads;
  for (std::uint32_t i = 0; replicas && i < opt.replicas; ++i) {
    threads.emplace_back(RunReplica, std::ref(sh), *replicas->member(i), i);
  }
  std::thread client_thread([&] { RunClient(sh, receiver, *client->member(0), resume.rebuilt_through); });

  // --crash-at T: SIGKILL at trace time T. Nothing is flushed or synced first: what
  // survives is what the streams' sync policy made durable (all that was written to
  // the OS), as after a real crash.
  std::thread crash_watch;
  if (opt.crash_at_s >= 0) {
    crash_watch = std::thread([&] {
      const auto at = sh.wall_start + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(opt.crash_at_s / opt.speed));
      while (!sh.done.load(std::memory_order_acquire)) {
        const auto now = Clock::now();
        if (now >= at) {
          std::fprintf(stderr,
                       "\ninference_server: --crash-at %g: SIGKILL at trace %s (%zu of %zu requests "
                       "published, %zu completed)\n",
                       opt.crash_at_s, FormatDuration(opt.crash_at_s).c_str(), sh.published.load(),
                       trace.size(), sh.completed.load());
          std::raise(SIGKILL);
        }
        std::this_thread::sleep_for(std::min<Clock::duration>(at - now, std::chrono::milliseconds(5)));
      }
    });
  }

  // With --kill-replica: when new work stops reaching the killed replica, and when
  // the work it held and had queued is back with the others (sampled every 1 ms).
  std::atomic<std::int64_t> last_new_work_ns{0}, moved_done_ns{0}, ejected_ns{0};
  std::thread kill_watch;
  if (opt.kill_replica >= 0) {
    kill_watch = std::thread([&] {
      const inferq::Member k = *replicas->member(static_cast<std::uint32_t>(opt.kill_replica));
      std::size_t last_queued = 0;
      while (!sh.done.load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (sh.killed_at_wall_ns.load(std::memory_order_acquire) == 0) continue;
        const std::size_t q = k.queued();
        if (q > last_queued && ejected_ns.load() == 0) last_new_work_ns.store(SteadyNs());
        last_queued = q;
        if (ejected_ns.load() == 0) {
          const inferq::EngineStats st = engine.Stats();
          const inferq::ConsumerStats* cs = st.consumer("REQUESTS", "replicas");
          if (cs != nullptr &&
              cs->group.members[static_cast<std::size_t>(opt.kill_replica)].health ==
                  inferq::MemberHealth::kEjected) {
            ejected_ns.store(SteadyNs());
          }
        }
        if (moved_done_ns.load() == 0 && q == 0) {
          const inferq::EngineStats st = engine.Stats();
          const inferq::ConsumerStats* cs = st.consumer("REQUESTS", "replicas");
          if (cs != nullptr && cs->ack_timeouts >= sh.killed_holding.load()) {
            moved_done_ns.store(SteadyNs());
          }
        }
      }
    });
  }

  // Progress on stderr, once a second.
  std::atomic<bool> stop_progress{false};
  const bool tty = isatty(STDERR_FILENO) != 0;
  const double trace_seconds = static_cast<double>(trace.back().arrival_us) / 1e6;
  // --timeline: opened here (checked writable before the replay), a row per 100 ms.
  std::ofstream timeline;
  if (!opt.timeline.empty()) {
    timeline.open(opt.timeline);
    if (!timeline) Fail("cannot write --timeline file '" + opt.timeline + "'", 1);
    timeline << "wall_s,trace_s,published,completed,tokens,queued\n";
  }
  auto timeline_row = [&] {
    if (!timeline.is_open()) return;
    const double wall = std::chrono::duration<double>(Clock::now() - sh.run_start).count();
    // Trace time now: the paced clock, or (--speed 0) the last request published.
    const std::size_t published = sh.published.load();
    const double trace_s =
        opt.speed > 0 ? std::chrono::duration<double>(Clock::now() - sh.wall_start).count() * opt.speed
                      : static_cast<double>(trace[std::max<std::size_t>(published, 1) - 1].arrival_us) / 1e6;
    std::uint64_t queued = 0;
    const inferq::EngineStats st = engine.Stats();
    if (const inferq::ConsumerStats* cs = st.consumer("REQUESTS", "replicas")) {
      for (const auto& m : cs->members) queued += m.queued;
    }
    char row[160];
    std::snprintf(row, sizeof row, "%.3f,%.3f,%zu,%zu,%llu,%llu\n", wall, trace_s, published, sh.completed.load(),
                  static_cast<unsigned long long>(sh.tokens_received.load()), static_cast<unsigned long long>(queued));
    timeline << row;
  };
  std::thread progress([&] {
    while (!stop_progress.load()) {
      for (int i = 0; i < 10 && !stop_progress.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        timeline_row();
      }
      const double wall = std::chrono::duration<double>(Clock::now() - sh.run_start).count();
      std::fprintf(stderr, "%s[%6.1f s] trace %s/%s  published %zu/%zu  completed %zu  tokens %llu/%llu%s",
                   tty ? "\r" : "", wall,
                   FormatDuration(static_cast<double>(trace[std::max<std::size_t>(sh.published.load(), 1) - 1].arrival_us) / 1e6).c_str(),
                   FormatDuration(trace_seconds).c_str(), sh.published.load(), trace.size(),
                   sh.completed.load(),
                   static_cast<unsigned long long>(sh.tokens_received.load()),
                   static_cast<unsigned long long>(tokens_total), tty ? "" : "\n");
      std::fflush(stderr);
    }
  });

  // Every replica has reported its load once before the first request is placed.
  while (sh.local_replicas && sh.reported.load(std::memory_order_acquire) < opt.replicas) std::this_thread::yield();
  // Trace time 0 in Unix ns, for replica processes (header replay_start_unix_ns).
  const std::int64_t replay_start_unix_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - sh.wall_start).count();

  // The client's publishing side: each request at its arrival time (in a resumed
  // durable replay, from the first request not stored yet).
  std::uint64_t duplicate_publishes = 0;  // found in the duplicate window: not stored again
  for (std::size_t i = resume.requests_stored; i < trace.size(); ++i) {
    const TraceRequest& t = trace[i];
    sh.PaceTo(static_cast<double>(t.arrival_us));
    inferq::Event e;
    e.subject = "infer." + opt.model + ".request";
    e.task_id = {0, i};
    // Across processes the id names the run too: JetStream's duplicate window (2
    // minutes) would drop a later run's req-<i> as a copy, even after a purge.
    e.msg_id = client_role ? "req-" + std::to_string(replay_start_unix_ns) + "-" + std::to_string(i)
                           : "req-" + std::to_string(i);
    e.seq_id = std::to_string(i);  // the affinity key of the generation
    const Assignment who = Assign(opt, i);
    e.tenant = "tenant-" + std::to_string(who.tenant);
    e.qos = who.tier;
    e.model = opt.model;
    e.created = absl::Now();
    e.headers.Set("request", std::to_string(i));
    e.headers.Set("arrival_us", std::to_string(t.arrival_us));
    e.headers.Set("context_tokens", std::to_string(t.context_tokens));
    e.headers.Set("generated_tokens", std::to_string(t.generated_tokens));
    if (client_role) e.headers.Set("replay_start_unix_ns", std::to_string(replay_start_unix_ns));
    auto ack = engine.Publish(std::move(e));
    if (!ack.ok()) Fail("publishing request " + std::to_string(i) + ": " + std::string(ack.status().message()), 1);
    if (ack->duplicate) ++duplicate_publishes;
    sh.published.fetch_add(1, std::memory_order_relaxed);
    sh.next_unpublished_us.store(i + 1 < trace.size() ? trace[i + 1].arrival_us : INT64_MAX,
                                 std::memory_order_release);
  }
  sh.all_published.store(true, std::memory_order_release);

  for (auto& t : threads) t.join();
  client_thread.join();
  stop_progress = true;
  progress.join();
  if (timeline.is_open()) {
    timeline_row();  // the end
    timeline.close();
    if (!timeline) Fail("writing --timeline file '" + opt.timeline + "' failed", 1);
  }
  if (kill_watch.joinable()) kill_watch.join();
  if (crash_watch.joinable()) crash_watch.join();
  if (tty) std::fprintf(stderr, "\n");
  const double wall = std::chrono::duration<double>(Clock::now() - sh.run_start).count();
  const ClientResult result = receiver.Result();
#ifdef INFERQ_EXAMPLE_NATS
  std::optional<inferq::nats::BridgeStats> nats_stats;
  if (bridge != nullptr) {
    bridge->Close();
    nats_stats = bridge->Stats();
  }
#endif

  const inferq::EngineStats stats = engine.Stats();
  const inferq::TokenProbeStats probe_stats = token_probe.Stats();
#ifdef INFERQ_EXAMPLE_PROMETHEUS
  const std::uint64_t scrapes_before_final = scrapes != nullptr ? scrapes->began() : 0;
#endif
  inferq::HistogramSnapshot engine_ns;
  for (const auto& c : stats.consumers) engine_ns.Merge(c.deliver_latency_ns);
  const std::uint64_t lost = tokens_total - result.tokens_delivered;

  auto ms = [](std::uint64_t us) { return static_cast<double>(us) / 1000.0; };
  auto us = [](std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; };
  std::printf("\ninferq inference_server: Azure LLM inference trace 2023 (conversation)\n");
  std::printf("  %zu requests over %s of trace, %s, speed %s, max batch %u\n\n",
              trace.size(), FormatDuration(trace_seconds).c_str(),
              client_role ? "replicas in the replica processes" : (std::to_string(opt.replicas) + " replicas").c_str(),
              opt.speed > 0 ? (std::to_string(static_cast<int>(opt.speed)) + "x").c_str()
                            : "as fast as possible",
              opt.max_batch);
  std::printf("  %-28s %12s %12s %12s\n", "", "p50", "p95", "p99");
  auto row = [](const char* name, double a, double b, double c) {
    std::printf("  %-28s %12.1f %12.1f %12.1f\n", name, a, b, c);
  };
  auto ms_ns = [](std::uint64_t ns) { return static_cast<double>(ns) / 1e6; };
  row("TTFT (ms, trace time)", ms_ns(probe_stats.ttft_ns.Percentile(0.5)), ms_ns(probe_stats.ttft_ns.Percentile(0.95)),
      ms_ns(probe_stats.ttft_ns.Percentile(0.99)));
  row("TBT (ms, trace time)", ms_ns(probe_stats.inter_token_ns.Percentile(0.5)),
      ms_ns(probe_stats.inter_token_ns.Percentile(0.95)), ms_ns(probe_stats.inter_token_ns.Percentile(0.99)));
  row("E2E (ms, trace time)", ms(result.e2e_us.Percentile(0.5)), ms(result.e2e_us.Percentile(0.95)), ms(result.e2e_us.Percentile(0.99)));
  row("engine publish->deliver (us)", us(engine_ns.Percentile(0.5)), us(engine_ns.Percentile(0.95)), us(engine_ns.Percentile(0.99)));
  std::printf("\n  requests   %zu total, %zu completed\n", trace.size(), result.completed);
  std::printf("  tokens     %llu total, %llu delivered, %llu lost, %llu duplicated, %llu out of order\n",
              static_cast<unsigned long long>(tokens_total),
              static_cast<unsigned long long>(result.tokens_delivered),
              static_cast<unsigned long long>(lost),
              static_cast<unsigned long long>(result.duplicates),
              static_cast<unsigned long long>(result.out_of_order));
  // This run's tokens (a resumed replay's rebuilt tokens took no replay time).
  std::printf("  wall       %.2f s, %.0f tokens/s, %.0f engine events/s\n", wall,
              static_cast<double>(result.tokens_delivered - resume.tokens_delivered) / wall,
              static_cast<double>(engine_ns.count()) / wall);
  // --role client: the replicas are other processes; their figures are in their
  // own summaries, and these show zeros.
  const inferq::ConsumerStats no_replicas{};
  const inferq::ConsumerStats* rs = stats.consumer("REQUESTS", "replicas");
  if (rs == nullptr) rs = &no_replicas;
#ifdef INFERQ_EXAMPLE_NATS
  if (nats_stats) {
    const inferq::nats::BridgeStats& b = *nats_stats;
    std::printf("  nats       %llu requests exported to JetStream stream %s, %llu tokens imported from %s "
                "(%llu delivered again, %llu dropped as copies), %llu reconnects\n",
                static_cast<unsigned long long>(b.exported), inferq::example::kRequestsJetStream,
                static_cast<unsigned long long>(b.imported), inferq::example::kTokensJetStream,
                static_cast<unsigned long long>(b.import_redelivered),
                static_cast<unsigned long long>(b.import_duplicates), static_cast<unsigned long long>(b.reconnects));
    std::printf("             %llu duplicate tokens from requests run again on another replica process "
                "(dropped by the reorder buffer), %llu within one replica's run\n",
                static_cast<unsigned long long>(result.duplicates_rerun),
                static_cast<unsigned long long>(result.duplicates_in_run));
  }
#endif
  std::string per_replica;
  for (const auto& m : rs->members) per_replica += " " + std::to_string(m.delivered);
  if (!client_role) {
    std::printf("  routing    affinity(seq_id) over %s; events per replica:%s\n", opt.policy.c_str(),
                per_replica.c_str());
    // redelivered counts messages delivered before (ack_wait expiries, naks); moved,
    // queued work taken off a stalled replica before it pulled it.
    std::printf("             %llu redelivered (%llu ack_wait expiries), %llu moved off a stalled "
                "replica, %llu ejections, %llu sequences moved to another replica\n",
                static_cast<unsigned long long>(rs->redelivered),
                static_cast<unsigned long long>(rs->ack_timeouts),
                static_cast<unsigned long long>(rs->moved),
                static_cast<unsigned long long>(rs->group.ejections),
                static_cast<unsigned long long>(affinity_policy->moves()));
    // KV-cache locality: a decode step placed on the replica holding its sequence
    // (affinity kept) finds its KV cache; one re-placed (moved) does not.
    const std::uint64_t kept = affinity_policy->kept(), moved = affinity_policy->moves();
    std::printf("  kv cache   %.1f%% hit rate: %llu steps on the replica holding their sequence, %llu moved\n",
                kept + moved == 0 ? 100.0 : 100.0 * static_cast<double>(kept) / static_cast<double>(kept + moved),
                static_cast<unsigned long long>(kept), static_cast<unsigned long long>(moved));
  }
#ifdef INFERQ_EXAMPLE_OTLP
  if (exporter != nullptr) {
    // What is still queued goes out now: at most 10 s, then Shutdown's 5 s
    // (OtlpExporterOptions::shutdown_timeout) for what is left. A collector that is
    // down or never answers does not fail the replay; the line says what was lost.
    const absl::Status flushed = exporter->ForceFlush(absl::Seconds(10));
    exporter->Shutdown();
    const inferq::otlp::OtlpExporterStats ts = exporter->stats();
    std::printf("  traces     %llu spans exported to %s (sample %g; %llu dropped, %llu failed)%s%s\n",
                static_cast<unsigned long long>(ts.exported), opt.otlp_endpoint.c_str(), opt.otlp_sample,
                static_cast<unsigned long long>(ts.dropped), static_cast<unsigned long long>(ts.failed),
                flushed.ok() ? "" : ": ", flushed.ok() ? "" : std::string(flushed.message()).c_str());
  }
#endif
  // QoS: SLA attainment per tier (first tokens within the tier's TTFT SLA, of all
  // the tier's requests), and what the scheduled lanes served (in the replicas'
  // engines: "-" in the client role).
  auto served = [&](std::size_t t) {
    return client_role ? std::string("-") : std::to_string(rs->qos_tiers[t].served);
  };
  std::printf("\n  %-8s %9s %9s %10s %12s %12s %12s\n", "tier", "requests", "TTFT SLA",
              "within", "TTFT p50", "TTFT p99", "lane served");
  for (std::size_t t = 0; t < 3; ++t) {
    const std::uint64_t n = result.tier_requests[t];
    if (n == 0) {  // no requests: no attainment to show
      std::printf("  %-8s %9llu %7.0f ms %10s %12s %12s %12s\n", kTierNames[t], 0ULL,
                  opt.sla_ms[t], "-", "-", "-", served(t).c_str());
      continue;
    }
    std::printf("  %-8s %9llu %7.0f ms %9.1f%% %9.1f ms %9.1f ms %12s\n", kTierNames[t],
                static_cast<unsigned long long>(n), opt.sla_ms[t],
                100.0 * static_cast<double>(result.tier_within_sla[t]) / static_cast<double>(n),
                ms(result.tier_ttft_us[t].Percentile(0.5)), ms(result.tier_ttft_us[t].Percentile(0.99)),
                served(t).c_str());
  }
  std::printf("  (tier mix %u:%u:%u over %u tenant%s, arrivals x%g; decode steps ride in gold)\n",
              opt.tier_mix[0], opt.tier_mix[1], opt.tier_mix[2], opt.tenants,
              opt.tenants == 1 ? "" : "s", opt.overload);
  std::string batch_sizes;
  for (std::size_t k = 0; k < inferq::kBatchSizeBuckets; ++k) {
    if (rs->batches_by_size[k] == 0) continue;
    // Power-of-two buckets, the last one cut at max_batch ("32", not "32-63").
    const std::uint64_t lo = std::uint64_t{1} << k;
    const std::uint64_t hi = std::min<std::uint64_t>((std::uint64_t{2} << k) - 1, opt.max_batch);
    batch_sizes += " " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi)) +
                   ":" + std::to_string(rs->batches_by_size[k]);
  }
  const inferq::StreamStats* dead = stats.stream("DEAD");
  if (!client_role) {
    std::printf("  batches    %llu pulls (adaptive batcher), by size:%s\n",
                static_cast<unsigned long long>(rs->batches), batch_sizes.c_str());
    std::printf("  delivery   %llu redelivered, %llu dead letters (%llu kept in stream DEAD), "
                "max deliver %lld\n",
                static_cast<unsigned long long>(rs->redelivered),
                static_cast<unsigned long long>(rs->dead_letters),
                static_cast<unsigned long long>(dead != nullptr ? dead->stored : 0),
                static_cast<long long>(opt.max_deliver));
  }
  const std::int64_t killed_ns = sh.killed_at_wall_ns.load();
  auto trace_s_after_kill = [&](std::int64_t ns) {
    return ns == 0 || killed_ns == 0 ? -1.0 : static_cast<double>(ns - killed_ns) / 1e9 * opt.speed;
  };
  if (opt.kill_replica >= 0) {
    if (killed_ns == 0) {
      std::printf("  kill       replica %lld was never killed (trace ended before %.1f s)\n",
                  static_cast<long long>(opt.kill_replica), opt.kill_at_s);
    } else {
      std::printf("  kill       replica %lld stopped at trace %.1f s holding %zu unacked events; after "
                  "(trace time) %.2f s it got its last new work before being ejected, %.2f s it was "
                  "ejected, %.2f s its work was back with the others\n",
                  static_cast<long long>(opt.kill_replica), opt.kill_at_s, sh.killed_holding.load(),
                  std::max(0.0, trace_s_after_kill(last_new_work_ns.load())),
                  trace_s_after_kill(ejected_ns.load()), trace_s_after_kill(moved_done_ns.load()));
    }
  }
  if (durable) {
    char resumed_at[64];
    std::snprintf(resumed_at, sizeof resumed_at, "resumed at trace %s (%.1f s)",
                  FormatDuration(static_cast<double>(resume.trace_us) / 1e6).c_str(),
                  static_cast<double>(resume.trace_us) / 1e6);
    std::printf("  durable    state dir '%s' (file streams, fdatasync every 1 s): %s\n",
                opt.state_dir.c_str(), resume.resumed ? resumed_at : "a new replay");
    if (resume.resumed) {
      std::printf("             before this run %zu requests stored, %zu completed, %llu tokens stored "
                  "(read back in %.2f s)\n",
                  resume.requests_stored, resume.completed,
                  static_cast<unsigned long long>(resume.tokens_stored), resume.seconds);
    }
    std::printf("             %llu duplicate tokens dropped by the client's reorder buffer: %llu stored "
                "before this run, %llu of steps redone after the restart, %llu within this run\n",
                static_cast<unsigned long long>(result.duplicates),
                static_cast<unsigned long long>(result.duplicates_before),
                static_cast<unsigned long long>(result.duplicates_after_crash),
                static_cast<unsigned long long>(result.duplicates_in_run));
    std::printf("             events the replicas got again (attempt > 1) %llu, tokens the client got "
                "again %llu\n",
                static_cast<unsigned long long>(sh.redelivered_seen.load()),
                static_cast<unsigned long long>(sh.client_redelivered.load()));
    if (resume.resumed) {
      std::printf("             requests, tokens, latency and tiers cover the whole replay; engine "
                  "latency, routing, batches and delivery this run\n");
    }
    if (opt.crash_at_s >= 0) {
      std::printf("             --crash-at %g not reached: the replay ended first\n", opt.crash_at_s);
    }
  }

  if (!opt.json.empty()) {
    std::ofstream j(opt.json);
    if (!j) Fail("cannot write --json file '" + opt.json + "'", 1);
    auto pct = [](const inferq::HistogramSnapshot& h, double scale) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "{\"p50\": %.3f, \"p95\": %.3f, \"p99\": %.3f}",
                    static_cast<double>(h.Percentile(0.5)) / scale,
                    static_cast<double>(h.Percentile(0.95)) / scale,
                    static_cast<double>(h.Percentile(0.99)) / scale);
      return std::string(buf);
    };
    j << "{\n"
      << "  \"requests_total\": " << trace.size() << ",\n"
      << "  \"requests_completed\": " << result.completed << ",\n"
      << "  \"tokens_total\": " << tokens_total << ",\n"
      << "  \"tokens_delivered\": " << result.tokens_delivered << ",\n"
      << "  \"tokens_out_of_order\": " << result.out_of_order << ",\n"
      << "  \"tokens_lost\": " << lost << ",\n"
      << "  \"duplicates\": " << result.duplicates << ",\n"
      << "  \"duplicates_rerun\": " << result.duplicates_rerun << ",\n"
      << "  \"duplicates_in_run\": " << result.duplicates_in_run << ",\n"
      << "  \"role\": \"" << (opt.role.empty() ? "one process" : opt.role) << "\",\n"
      << "  \"ttft_ms\": " << pct(probe_stats.ttft_ns, 1e6) << ",\n"
      << "  \"tbt_ms\": " << pct(probe_stats.inter_token_ns, 1e6) << ",\n"
      << "  \"e2e_ms\": " << pct(result.e2e_us, 1000) << ",\n"
      << "  \"engine_latency_us\": " << pct(engine_ns, 1000) << ",\n";
    // Routing, batching and delivery happen in the replicas' engines: the client role
    // has none of them to report; it reports what crossed NATS instead.
    if (!client_role) {
      j << "  \"policy\": \"" << opt.policy << "\",\n"
        << "  \"redelivered\": " << rs->redelivered << ",\n"
        << "  \"ejections\": " << rs->group.ejections << ",\n"
        << "  \"affinity_moves\": " << affinity_policy->moves() << ",\n"
        << "  \"affinity_kept\": " << affinity_policy->kept() << ",\n"
        << "  \"dead_letters\": " << rs->dead_letters << ",\n";
    }
#ifdef INFERQ_EXAMPLE_NATS
    if (nats_stats) {
      const inferq::nats::BridgeStats& b = *nats_stats;
      j << "  \"nats\": {\"requests_exported\": " << b.exported << ", \"tokens_imported\": " << b.imported
        << ", \"tokens_delivered_again\": " << b.import_redelivered
        << ", \"tokens_dropped_as_copies\": " << b.import_duplicates << ", \"reconnects\": " << b.reconnects
        << ", \"failed_publishes_retried\": " << b.export_failures << "},\n";
    }
#endif
    j << "  \"overload\": " << opt.overload << ",\n";
    // null for a tier without requests (nothing to attain).
    auto attainment = [](std::uint64_t n, std::uint64_t within) {
      if (n == 0) return std::string("null");
      char b[32];
      std::snprintf(b, sizeof b, "%.4f", static_cast<double>(within) / static_cast<double>(n));
      return std::string(b);
    };
    for (std::size_t t = 0; t < 3; ++t) {
      const std::uint64_t n = result.tier_requests[t];
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "  \"tier_%s\": {\"requests\": %llu, \"ttft_sla_ms\": %.3f, \"within_sla\": %llu, "
                    "\"sla_attainment\": %s, \"ttft_ms\": %s",
                    kTierNames[t], static_cast<unsigned long long>(n), opt.sla_ms[t],
                    static_cast<unsigned long long>(result.tier_within_sla[t]),
                    attainment(n, result.tier_within_sla[t]).c_str(),
                    pct(result.tier_ttft_us[t], 1000).c_str());
      j << buf;
      // CDFs for plots (scripts/plot_replay.py): the value (trace ms) at each
      // percentile 1..100.
      auto cdf = [](const inferq::HistogramSnapshot& h) {
        std::string out = "[";
        for (int q = 1; q <= 100; ++q) {
          char v[32];
          std::snprintf(v, sizeof v, "%s%.3f", q > 1 ? ", " : "", static_cast<double>(h.Percentile(q / 100.0)) / 1000);
          out += v;
        }
        return out + "]";
      };
      j << ", \"ttft_cdf_ms\": " << cdf(result.tier_ttft_us[t]) << ", \"tbt_cdf_ms\": " << cdf(result.tier_tbt_us[t]);
      if (!client_role) j << ", \"lane_served\": " << rs->qos_tiers[t].served;
      j << "},\n";
    }
    // Batch sizes depend on how much the lane held at each pull: real time.
    if (!client_role) {
      j << "  \"batches_by_size\": [";
      for (std::size_t k = 0; k < inferq::kBatchSizeBuckets; ++k) j << (k ? ", " : "") << rs->batches_by_size[k];
      j << "],\n";
    }
    if (opt.kill_replica >= 0) {
      j << "  \"kill\": {\"replica\": " << opt.kill_replica << ", \"at_s\": " << opt.kill_at_s
        << ", \"killed\": " << (killed_ns != 0 ? "true" : "false")
        << ", \"held\": " << sh.killed_holding.load()
        << ", \"last_new_work_after_s\": " << std::max(0.0, trace_s_after_kill(last_new_work_ns.load()))
        << ", \"ejected_after_s\": " << trace_s_after_kill(ejected_ns.load())
        << ", \"work_back_after_s\": " << trace_s_after_kill(moved_done_ns.load()) << "},\n";
    }
    if (durable) {
      j << "  \"duplicate_tokens_dropped\": " << result.duplicates << ",\n"
        << "  \"durable\": {\"state_dir\": " << inferq::example::JsonString(opt.state_dir)
        << ", \"resumed\": " << (resume.resumed ? "true" : "false")
        << ", \"resumed_at_s\": " << static_cast<double>(resume.trace_us) / 1e6
        << ", \"requests_stored_before\": " << resume.requests_stored
        << ", \"requests_completed_before\": " << resume.completed
        << ", \"tokens_stored_before\": " << resume.tokens_stored
        << ", \"duplicates_before\": " << result.duplicates_before
        << ", \"duplicates_after_crash\": " << result.duplicates_after_crash
        << ", \"duplicates_in_run\": " << result.duplicates_in_run
        << ", \"read_back_seconds\": " << resume.seconds
        << ", \"replica_redeliveries\": " << sh.redelivered_seen.load()
        << ", \"client_redeliveries\": " << sh.client_redelivered.load()
        << ", \"duplicate_request_publishes\": " << duplicate_publishes << "},\n";
    }
    j
      << "  \"wall_seconds\": " << wall << "\n"
      << "}\n";
    j.close();  // flushes: a full disk shows only here
    if (!j) Fail("writing --json file '" + opt.json + "' failed", 1);
  }
  // After a crash (a resumed replay), a step the replicas had not settled is redone
  // and the tokens it had produced come again: at least once delivery, the copies
  // dropped by the client's buffer. A copy of a token this run received is a defect
  // (an ack_wait redelivery to a replica that still held the step), as in any run.
  // Across processes (--role client), a token published again after a failover may
  // arrive ahead of one retried: the reorder buffer holds it, and what reaches the
  // user is in order all the same; copies from a request run again elsewhere are
  // at least once (duplicates_rerun). Neither fails the run.
  const bool ok = sh.fatal.load() == 0 && result.completed == trace.size() && lost == 0 &&
                  result.duplicates_in_run == 0 && (client_role || result.out_of_order == 0);
#ifdef INFERQ_EXAMPLE_PROMETHEUS
  if (scrapes != nullptr && opt.metrics_hold_s > 0) {
    const auto until = Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(opt.metrics_hold_s * 1e6));
    while (scrapes->began() < scrapes_before_final + 2 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (scrapes->began() < scrapes_before_final + 2) {
      std::fprintf(stderr, "inference_server: --metrics-hold %g: no scraper took the final figures\n",
                   opt.metrics_hold_s);
    }
  }
#endif
  return ok ? 0 : 1;
}
