// schema_rollout: rolling out a new FlatBuffers schema version behind a shadow member.
//
// How to run:
//   cmake --preset dev && cmake --build build/dev -j2 --target schema_rollout
//   ./build/dev/examples/schema_rollout/schema_rollout [--events N] [--mirror F] [--trace PATH]
// Exit status 0 when every invariant held, 1 when one failed (it says which), 2 for a
// bad flag.
//
// The story (a shadow rollout of a new schema version):
//  1. A producer writes InferRequest events with schema v1 (subject "infer.request",
//     Event::schema_id / schema_version set from the registry). v2, which appends
//     slo_ms with a default, is registered under BACKWARD. The consumer group has a
//     primary member, which decodes with v1, and a shadow member (WeightedShadowPolicy)
//     that receives a mirrored copy of each event and decodes it with v2 through the
//     schema reader: v1 payloads read as v2 get slo_ms's default. The shadow's results
//     are kept apart and compared with the primary's: every field both versions have
//     must decode to the same value.
//  2. The switch: the primary reads v2, the producer writes v2.
//  3. A breaking v3 (prompt_tokens changes type) is refused by the registry's
//     compatibility check, with the checker's reason.
// Requests (prompt and output sizes) come from the Azure LLM inference trace 2023
// bundled in examples/data (CC-BY-4.0; attribution in examples/data/README.md).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <flatbuffers/idl.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/engine/engine.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/schema/registry.hpp"
#include "inferq/schema/schema_reader.hpp"
#include "inferq/version.hpp"
#include "trace.hpp"

namespace {

constexpr const char* kSubject = "infer.request";

constexpr const char* kSchemaV1 = R"(namespace rollout;
table InferRequest {
  request_id:ulong;
  model:string;
  prompt_tokens:int;
  max_new_tokens:int = 128;
}
root_type InferRequest;
)";

// v1 plus slo_ms (the request's latency objective) appended with a default:
// BACKWARD compatible (a v2 reader reads v1 data).
constexpr const char* kSchemaV2 = R"(namespace rollout;
table InferRequest {
  request_id:ulong;
  model:string;
  prompt_tokens:int;
  max_new_tokens:int = 128;
  slo_ms:uint = 30000;
}
root_type InferRequest;
)";

// Breaking: prompt_tokens becomes a long (8 bytes where v2 readers expect 4).
constexpr const char* kSchemaV3 = R"(namespace rollout;
table InferRequest {
  request_id:ulong;
  model:string;
  prompt_tokens:long;
  max_new_tokens:int = 128;
  slo_ms:uint = 30000;
}
root_type InferRequest;
)";

constexpr std::uint32_t kSloDefaultMs = 30000;

struct Options {
  std::size_t events = 2000;
  double mirror = 1.0;
  std::string trace = INFERQ_DEFAULT_TRACE;
};

constexpr char kUsage[] =
    "usage: schema_rollout [--events N] [--mirror F] [--trace PATH]   (--flag=VALUE too)\n"
    "  --events N    requests replayed from the trace, 2..1000000 (default 2000)\n"
    "  --mirror F    share of traffic mirrored to the shadow reader, (0, 1] (default 1)\n"
    "  --trace PATH  Azure LLM trace CSV, plain or .zst (default: the bundled trace)\n"
    "  --help, -h    this text\n"
    "  --version     the inferq version\n"
    "exit status: 0 every check passed; 1 a check failed; 2 bad usage.\n";

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr, "schema_rollout: %s\n%s", error.c_str(), kUsage);
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--version") {
      std::printf("schema_rollout (inferq %s)\n", INFERQ_VERSION_STRING);
      std::exit(0);
    }
    if (flag != "--events" && flag != "--mirror" && flag != "--trace" &&
        !flag.starts_with("--events=") && !flag.starts_with("--mirror=") &&
        !flag.starts_with("--trace=")) {
      Usage("unknown flag '" + flag + "'");
    }
    std::string v;
    if (const std::size_t eq = flag.find('='); eq != std::string::npos) {
      v = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 >= argc) {
      Usage(flag + " needs a value");
    } else {
      v = argv[++i];
    }
    // from_chars: no leading space or '+', and '-5' is a number (out of range), where
    // strtoull accepted " 5" and "+5" and turned "-184..." into a huge value.
    const char* first = v.data();
    const char* last = v.data() + v.size();
    if (flag == "--events") {
      long long n = 0;
      const auto [end, ec] = std::from_chars(first, last, n);
      if (v.empty() || end != last || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
        Usage("--events '" + v + "' is not an integer (expected 2..1000000)");
      }
      if (ec == std::errc::result_out_of_range || n < 2 || n > 1000000) {
        Usage("--events '" + v + "' is outside 2..1000000");
      }
      o.events = static_cast<std::size_t>(n);
    } else if (flag == "--mirror") {
      double f = 0;
      const auto [end, ec] = std::from_chars(first, last, f);
      if (v.empty() || end != last || ec != std::errc() || !(f > 0 && f <= 1)) {
        Usage("--mirror '" + v + "' is not a fraction in (0, 1]");
      }
      o.mirror = f;
    } else if (flag == "--trace") {
      o.trace = v;
    } else {
      Usage("unknown flag '" + flag + "'");
    }
  }
  return o;
}

// A producer of one schema version. It builds each payload with that version's
// schema through FlatBuffers' JSON parser (a real producer would use the code flatc
// generates for its version; this keeps both versions in one program).
class Producer {
 public:
  Producer(const char* fbs, inferq::SchemaRef ref) : ref_(ref) {
    if (!parser_.Parse(fbs)) Fail("producer schema does not parse: " + parser_.error_);
  }
  std::uint32_t version() const { return ref_.version; }

  inferq::Event Make(std::uint64_t request_id, const inferq::example::TraceRequest& r) {
    std::string json = "{request_id: " + std::to_string(request_id) +
                       ", model: \"llama-2-70b\", prompt_tokens: " +
                       std::to_string(r.context_tokens) +
                       ", max_new_tokens: " + std::to_string(r.generated_tokens);
    if (ref_.version >= 2) json += ", slo_ms: " + std::to_string(SloMs(r));
    json += "}";
    if (!parser_.ParseJson(json.c_str())) Fail("cannot build " + json + ": " + parser_.error_);
    inferq::Event e;
    e.subject = kSubject;
    e.schema_id = static_cast<std::uint32_t>(ref_.id);
    e.schema_version = ref_.version;
    e.payload = inferq::Buffer::Copy(std::as_bytes(std::span<const std::uint8_t>(
        parser_.builder_.GetBufferPointer(), parser_.builder_.GetSize())));
    return e;
  }

  // What a v2 producer sets: a budget of 2 s plus 25 ms per generated token.
  static std::uint32_t SloMs(const inferq::example::TraceRequest& r) {
    return 2000 + 25 * r.generated_tokens;
  }

  [[noreturn]] static void Fail(const std::string& what) {
    std::fprintf(stderr, "schema_rollout: %s\n", what.c_str());
    std::exit(1);
  }

 private:
  flatbuffers::Parser parser_;
  inferq::SchemaRef ref_;
};

// Invariants: each failure is printed and makes the exit status 1.
int g_failures = 0;
void Expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++g_failures;
  }
}

template <class T>
T Must(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Producer::Fail(std::string(what) + ": " + v.status().ToString());
  return *std::move(v);
}

struct PhaseCounts {
  std::size_t published = 0;
  std::size_t primary = 0;        // decoded by the primary member
  std::size_t shadow = 0;         // decoded by the shadow member
  std::size_t compared = 0;       // events both decoded
  std::size_t mismatches = 0;     // a field both versions have decoded differently
  std::size_t wrong_values = 0;   // a decoded value differs from what was published
  std::size_t defaults = 0;       // shadow fields the writer's version lacks (defaults)
  std::size_t decode_errors = 0;
};

// The expected value of `field` for request `r` written with `writer_version`.
inferq::Value Expected(const std::string& field, std::uint64_t id,
                       const inferq::example::TraceRequest& r, std::uint32_t writer_version) {
  if (field == "request_id") return inferq::Value::Uint(id);
  if (field == "model") return inferq::Value::String("llama-2-70b");
  if (field == "prompt_tokens") return inferq::Value::Int(r.context_tokens);
  if (field == "max_new_tokens") return inferq::Value::Int(r.generated_tokens);
  if (field == "slo_ms") {
    return inferq::Value::Uint(writer_version >= 2 ? Producer::SloMs(r) : kSloDefaultMs);
  }
  return inferq::Value();
}

// Publishes requests[first, last) with `producer`; the primary decodes with
// `primary_reader`, the shadow with `shadow_reader`; compares.
PhaseCounts RunPhase(inferq::Engine& engine, inferq::Member& primary, inferq::Member& shadow,
                     Producer& producer, const inferq::SchemaReader& primary_reader,
                     const inferq::SchemaReader& shadow_reader,
                     const std::vector<inferq::example::TraceRequest>& requests,
                     std::size_t first, std::size_t last) {
  PhaseCounts c;
  for (std::size_t i = first; i < last; ++i) {
    const std::uint64_t id = i + 1;
    Must(engine.Publish(producer.Make(id, requests[i])), "publish");
    ++c.published;

    // The primary: every event, decoded with the version it reads.
    inferq::Message m = Must(primary.Next(absl::Seconds(5)), "primary Next");
    Expect(!m.shadow(), "the primary received a shadow copy");
    absl::StatusOr<inferq::Record> mine = primary_reader.Read(m.event());
    if (!m.Ack().ok()) Producer::Fail("primary Ack failed");
    if (!mine.ok()) {
      ++c.decode_errors;
      std::printf("primary decode error: %s\n", mine.status().ToString().c_str());
      continue;
    }
    ++c.primary;
    for (const inferq::RecordField& f : mine->fields()) {
      if (!(f.value == Expected(f.name, id, requests[i], m.event().schema_version))) {
        ++c.wrong_values;
      }
    }

    // The shadow: a mirrored copy of some events; its results are kept apart (here:
    // compared, never acted on) and its ack settles nothing for the message.
    absl::StatusOr<inferq::Message> s = shadow.Next(absl::ZeroDuration());
    if (!s.ok()) continue;  // not mirrored (--mirror below 1)
    Expect(s->shadow(), "the shadow member received a primary delivery");
    absl::StatusOr<inferq::Record> theirs = shadow_reader.Read(s->event());
    if (!s->Ack().ok()) Producer::Fail("shadow Ack failed");
    if (!theirs.ok()) {
      ++c.decode_errors;
      std::printf("shadow decode error: %s\n", theirs.status().ToString().c_str());
      continue;
    }
    ++c.shadow;
    ++c.compared;
    c.defaults += static_cast<std::size_t>(std::count_if(
        theirs->fields().begin(), theirs->fields().end(), [](const inferq::RecordField& f) {
          return f.origin == inferq::FieldOrigin::kNotInWriter;
        }));
    bool same = true;
    for (const inferq::RecordField& f : mine->fields()) {
      const inferq::RecordField* g = theirs->Find(f.name);
      if (g == nullptr || !(g->value == f.value)) same = false;
    }
    for (const inferq::RecordField& f : theirs->fields()) {
      if (!(f.value == Expected(f.name, id, requests[i], s->event().schema_version))) {
        same = false;
      }
    }
    if (!same) ++c.mismatches;
  }
  return c;
}

void Report(const char* phase, const PhaseCounts& c) {
  std::printf("  published %zu, decoded by primary %zu, by shadow %zu, mismatches %zu, "
              "defaults applied %zu, wrong values %zu, decode errors %zu\n",
              c.published, c.primary, c.shadow, c.mismatches, c.defaults, c.wrong_values,
              c.decode_errors);
  const std::string p = phase;
  Expect(c.primary == c.published, p + ": the primary decoded " + std::to_string(c.primary) +
                                       " of " + std::to_string(c.published));
  Expect(c.mismatches == 0, p + ": " + std::to_string(c.mismatches) + " shadow mismatches");
  Expect(c.wrong_values == 0, p + ": " + std::to_string(c.wrong_values) + " wrong values");
  Expect(c.decode_errors == 0, p + ": " + std::to_string(c.decode_errors) + " decode errors");
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);
  std::vector<inferq::example::TraceRequest> requests =
      Must(inferq::example::LoadTrace(opt.trace), "load trace");
  if (requests.size() > opt.events) requests.resize(opt.events);
  if (requests.size() < 2) {  // each of the two phases needs an event
    std::fprintf(stderr, "schema_rollout: '%s' has %zu request(s); the rollout needs 2 or more\n",
                 opt.trace.c_str(), requests.size());
    return 1;
  }
  std::printf("schema_rollout: %zu requests from %s\n", requests.size(), opt.trace.c_str());

  // The registry: v1, then v2 under BACKWARD (the default mode, set explicitly).
  inferq::SchemaRegistry registry;
  if (!registry.SetCompatibility(kSubject, inferq::Compatibility::kBackward).ok()) return 1;
  const inferq::SchemaRef v1 = Must(registry.Register(kSubject, kSchemaV1), "register v1");
  const inferq::SchemaRef v2 = Must(registry.Register(kSubject, kSchemaV2), "register v2");
  std::printf("registry: %s v1 (id %llu), v2 (id %llu) under %s\n", kSubject,
              static_cast<unsigned long long>(v1.id), static_cast<unsigned long long>(v2.id),
              std::string(inferq::CompatibilityName(registry.GetCompatibility(kSubject))).c_str());
  const inferq::SchemaReader read_v1 = Must(registry.Reader(kSubject, 1), "reader v1");
  const inferq::SchemaReader read_v2 = Must(registry.Reader(kSubject, 2), "reader v2");

  // One consumer group: member 0 is the primary, member 1 the shadow, which gets a
  // mirrored copy of a fraction of the events.
  std::unique_ptr<inferq::Engine> owned_engine = Must(inferq::Engine::Create(), "engine");
  inferq::Engine& engine = *owned_engine;
  if (!engine.AddStream({.name = "REQUESTS", .subjects = {kSubject}}).ok()) return 1;
  auto policy = Must(inferq::WeightedShadowPolicy::Create(
                         2, {.weights = {1, 0}, .shadows = {1}, .mirror_fraction = opt.mirror}),
                     "shadow policy");
  const inferq::Consumer decoders = Must(
      engine.AddConsumer({.stream = "REQUESTS", .name = "decoders", .members = 2,
                          .selection = std::shared_ptr<inferq::SelectionPolicy>(std::move(policy))}),
      "add consumer");
  inferq::Member primary = Must(decoders.member(0), "member 0");
  inferq::Member shadow = Must(decoders.member(1), "member 1");

  const std::size_t half = requests.size() / 2;
  Producer producer_v1(kSchemaV1, v1);
  std::printf("phase 1: producer writes v1, primary reads v1, shadow reads v2 (mirror %.0f%%)\n",
              opt.mirror * 100);
  const PhaseCounts p1 =
      RunPhase(engine, primary, shadow, producer_v1, read_v1, read_v2, requests, 0, half);
  Report("phase 1", p1);
  // Every v1 event read as v2 lacks exactly slo_ms, which takes its default.
  Expect(p1.defaults == p1.shadow, "phase 1: " + std::to_string(p1.defaults) +
                                       " defaults applied for " + std::to_string(p1.shadow) +
                                       " shadow decodes");
  // Mirroring is random with probability --mirror, so the shadow may see nothing when
  // few copies are expected: the check runs only when 20 or more are (P(none) <= e^-20).
  if (opt.mirror * static_cast<double>(half) >= 20) {
    Expect(p1.shadow > 0, "phase 1: the shadow decoded nothing");
  }

  Producer producer_v2(kSchemaV2, v2);
  std::printf("phase 2 (the switch): producer writes v2, primary reads v2, shadow reads v2\n");
  const PhaseCounts p2 = RunPhase(engine, primary, shadow, producer_v2, read_v2, read_v2,
                                  requests, half, requests.size());
  Report("phase 2", p2);
  Expect(p2.defaults == 0, "phase 2: defaults applied to v2 events");

  // A breaking v3 never reaches the producers.
  std::printf("phase 3: registering v3 (prompt_tokens int -> long)\n");
  absl::StatusOr<inferq::SchemaRef> v3 = registry.Register(kSubject, kSchemaV3);
  if (v3.ok()) {
    Expect(false, "the registry accepted the breaking v3");
  } else {
    std::printf("  rejected (%s): %s\n", absl::StatusCodeToString(v3.status().code()).c_str(),
                std::string(v3.status().message()).c_str());
    Expect(v3.status().code() == absl::StatusCode::kFailedPrecondition,
           "v3 was refused with another code than FAILED_PRECONDITION");
  }
  Expect(registry.Versions(kSubject) == std::vector<std::uint32_t>{1, 2},
         "the subject has other versions than 1 and 2");

  const inferq::EngineStats stats = engine.Stats();
  const inferq::ConsumerStats* cs = stats.consumer("REQUESTS", "decoders");
  Expect(cs != nullptr, "no stats for consumer decoders");
  if (cs != nullptr) {
    std::printf("engine: consumer decoders (%s) acked %llu, mirrored %llu, shadow acked %llu\n",
                cs->policy.c_str(), static_cast<unsigned long long>(cs->acked),
                static_cast<unsigned long long>(cs->mirrored),
                static_cast<unsigned long long>(cs->shadow_acked));
    Expect(cs->acked == requests.size(), "acked differs from the requests published");
    Expect(cs->mirrored == p1.shadow + p2.shadow, "mirrored differs from the shadow decodes");
    Expect(cs->shadow_acked == cs->mirrored, "shadow acks differ from the mirrored copies");
  }
  engine.Close();
  if (g_failures != 0) {
    std::printf("%d invariant(s) failed\n", g_failures);
    return 1;
  }
  std::printf("OK: every invariant held\n");
  return 0;
}
