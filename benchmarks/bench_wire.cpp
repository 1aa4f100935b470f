// bench_wire: the TensorEvent wire format (include/inferq/event/tensor_event.hpp) and
// its zstd payload codec (include/inferq/event/codec.hpp), with their peers in the
// same run.
//
// Implementations (the <impl> of BM_<What>/<impl>/<config>):
//   tensor_event     inferq::Encode / inferq::Decode (FlatBuffers, Verifier on decode,
//                    payload raw or compressed with inferq::ZstdCompress).
//   memcpy_frame     the floor: the same Event written field after field with memcpy
//                    into one exact-size allocation (host byte order, length-prefixed
//                    strings, no schema, no evolution), read back with bounds and enum
//                    checks only; the payload compressed with the same
//                    inferq::ZstdCompress / ZstdDecompress. What is left between it and
//                    tensor_event is the cost of FlatBuffers and its verification.
//   memcpy_frame_zctx  memcpy_frame with libzstd called directly through one
//                    ZSTD_CCtx / ZSTD_DCtx kept across calls (zstd codecs only): the
//                    floor for a compressed event.
//   zstd_codec       inferq::ZstdCompress / ZstdDecompress alone on the payload (no
//                    framing), as Encode uses them: the calling thread's libzstd
//                    contexts, reset to defaults at every call (until commit 7a56628
//                    a new context per call).
//   zstd_ctx_reused  libzstd directly with one ZSTD_CCtx / ZSTD_DCtx kept across calls
//                    (ZSTD_compressCCtx / ZSTD_decompressDCtx), no reset: the floor
//                    for zstd_codec.
// No other serializer is installed on the machine of record (Debian 12 has only the
// runtime libraries of protobuf and libcbor there, no headers or compilers).
//
// Benchmarks:
//   BM_Encode/<impl>/codec:<none|zstd1|zstd3>/payload:<64|1024|65536>
//   BM_Decode/...    same configurations. One event with the metadata of an LLM
//                    request (subject, tenant, model, ids, times, shape, 2 headers)
//                    and a float32 payload of the given bytes (the tensor data below).
//                    Counter wire_bytes: the encoded size.
//   BM_Compress/<impl>/data:<tokens|float32>/level:<1|3>
//   BM_Decompress/... same. Each event's payload compressed on its own, as Encode does.
//                    bytes_per_second counts uncompressed payload bytes; counter ratio =
//                    payload bytes / compressed bytes over the whole data set; for
//                    tensor_event, wire_ratio = wire bytes with codec none / with zstd.
//
// Data:
//   tokens   One event per request of the first 2,000 requests of the Azure LLM
//            inference trace 2023 (conversation service; examples/data/README.md has
//            the source and the CC-BY-4.0 attribution): the payload is the request's
//            prompt as int32 token ids, ContextTokens of them (mean about 1,155).
//            ONLY THE COUNTS ARE REAL: the trace has no prompts and no ids. The ids are
//            synthetic, drawn independently per token (seeded by the request's
//            index) from a Zipf distribution (exponent 1.0) over a 128,256-token
//            vocabulary (Llama 3's size), ranks mapped to ids by a fixed random
//            permutation. Real prompts repeat phrases and, in a conversation service,
//            whole earlier turns and system prompts; independent draws have none of
//            that, so the ratio here is a lower bound for real token streams.
//   float32  64 events of shape [16, 1024] float32 (64 KiB each), like the hidden
//            states of 16 tokens of a 1,024-wide model: x[t][d] = a_d * sin(2 pi
//            (t0 + t) / p_d + phi_d) + 0.02 * n, with per-channel amplitude a_d in
//            [0.1, 1), period p_d in [4, 512) tokens and phase phi_d, and n a standard
//            normal draw; everything from fixed seeds. The noise fills the low mantissa
//            bits as real activations do; without it the data would compress far
//            better than any real tensor.
//
// Dictionary figures (zstd with a trained dictionary) come from the dictionary branch,
// which adds that API; its cases belong in this binary next to the ones above.
//
// The trace is the bundled examples/data/AzureLLMInferenceTrace_conv.csv.zst unless
// the environment variable INFERQ_TRACE names another copy (plain or zstd).
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <benchmark/benchmark.h>

#include "absl/time/time.h"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/event/tensor_event.hpp"
#include "inferq/memory/buffer.hpp"
#include "inference_server/trace.hpp"

namespace {

using inferq::Buffer;
using inferq::Event;

// ---------------------------------------------------------------------------------
// Data

// Standard normal draw from mt19937_64's raw output (Box-Muller), so the data are
// the same with every standard library.
double Normal(std::mt19937_64& rng) {
  const auto unit = [&rng] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; };
  return std::sqrt(-2.0 * std::log(unit())) * std::cos(2.0 * std::numbers::pi * unit());
}

// `rows` x `cols` float32 values as described at the top, starting at token `t0`.
std::string Float32Tensor(int rows, int cols, int t0) {
  std::mt19937_64 channel_rng(42);  // the same channels for every tensor
  std::vector<double> amp(cols), period(cols), phase(cols);
  for (int d = 0; d < cols; ++d) {
    amp[d] = 0.1 + 0.9 * static_cast<double>(channel_rng() >> 11) * 0x1p-53;
    period[d] = 4.0 + 508.0 * static_cast<double>(channel_rng() >> 11) * 0x1p-53;
    phase[d] = 2.0 * std::numbers::pi * static_cast<double>(channel_rng() >> 11) * 0x1p-53;
  }
  std::mt19937_64 noise_rng(1000 + static_cast<std::uint64_t>(t0));
  std::vector<float> v(static_cast<std::size_t>(rows) * cols);
  for (int t = 0; t < rows; ++t) {
    for (int d = 0; d < cols; ++d) {
      v[static_cast<std::size_t>(t) * cols + d] = static_cast<float>(
          amp[d] * std::sin(2.0 * std::numbers::pi * (t0 + t) / period[d] + phase[d]) +
          0.02 * Normal(noise_rng));
    }
  }
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Token-id sampler: Zipf(1.0) ranks over the vocabulary, mapped to ids by a fixed
// permutation.
class TokenSampler {
 public:
  static constexpr std::uint32_t kVocab = 128'256;
  TokenSampler() : cdf_(kVocab), id_of_rank_(kVocab) {
    double sum = 0;
    for (std::uint32_t r = 0; r < kVocab; ++r) cdf_[r] = (sum += 1.0 / (r + 1.0));
    for (double& c : cdf_) c /= sum;
    std::iota(id_of_rank_.begin(), id_of_rank_.end(), 0u);
    std::mt19937_64 rng(7);
    for (std::uint32_t i = kVocab - 1; i > 0; --i) {  // Fisher-Yates on raw output
      std::swap(id_of_rank_[i], id_of_rank_[rng() % (i + 1)]);
    }
  }
  // `n` int32 token ids for request `index` (seeded by it).
  std::string Prompt(std::uint32_t n, std::uint64_t index) const {
    std::mt19937_64 rng(index);
    std::vector<std::int32_t> ids(n);
    for (auto& id : ids) {
      const double u = static_cast<double>(rng() >> 11) * 0x1p-53;
      const auto r = static_cast<std::uint32_t>(
          std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
      id = static_cast<std::int32_t>(id_of_rank_[std::min(r, kVocab - 1)]);
    }
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(std::int32_t));
  }

 private:
  std::vector<double> cdf_;
  std::vector<std::uint32_t> id_of_rank_;
};

// An event with the metadata of an LLM request and the given payload.
Event RequestEvent(std::string payload, std::vector<std::int64_t> shape, inferq::DType dtype,
                   std::uint64_t index) {
  Event e;
  e.subject = "infer.llama-3-8b.acme.request";
  e.task_id = {0x0123456789abcdefULL ^ index, 0xfedcba9876543210ULL + index};
  e.semantic_tag = "chat";
  e.tenant = "acme";
  e.qos = inferq::Qos::kGold;
  e.priority = 5;
  for (std::uint8_t i = 0; i < 16; ++i) e.trace.trace_id[i] = static_cast<std::uint8_t>(0xa0 + i + index);
  for (std::uint8_t i = 0; i < 8; ++i) e.trace.span_id[i] = static_cast<std::uint8_t>(0x10 + i);
  e.model = "llama-3-8b";
  e.model_version = "2024-05-01";
  e.schema_id = 42;
  e.schema_version = 1;
  e.msg_id = "req-" + std::to_string(1'000'000 + index);
  e.seq_id = "gen-" + std::to_string(1'000'000 + index);
  e.seq_no = index;
  e.created = absl::FromUnixNanos(1'700'092'800'000'000'000LL + static_cast<std::int64_t>(index) * 181'000'000);
  e.deadline = e.created + absl::Seconds(30);
  e.ttl = absl::Seconds(30);
  e.shape = std::move(shape);
  e.dtype = dtype;
  if (dtype == inferq::DType::kInt32) e.headers.Set("context_tokens", std::to_string(e.shape[0]));
  e.headers.Set("traceparent", "00-a0a1a2a3a4a5a6a7a8a9aaabacadaeaf-1011121314151617-01");
  e.payload = Buffer::FromString(payload);
  return e;
}

const std::vector<Event>& TokenEvents() {
  static const std::vector<Event> events = [] {
    const char* env = std::getenv("INFERQ_TRACE");
    const std::string path = env != nullptr ? env : INFERQ_BENCH_TRACE;
    auto trace = inferq::example::LoadTrace(path);
    if (!trace.ok()) {
      std::fprintf(stderr, "bench_wire: %s\n", std::string(trace.status().message()).c_str());
      std::exit(2);
    }
    const TokenSampler sampler;
    std::vector<Event> v;
    const std::size_t n = std::min<std::size_t>(2000, trace->size());
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t tokens = (*trace)[i].context_tokens;
      v.push_back(RequestEvent(sampler.Prompt(tokens, i), {static_cast<std::int64_t>(tokens)},
                               inferq::DType::kInt32, i));
    }
    return v;
  }();
  return events;
}

const std::vector<Event>& Float32Events() {
  static const std::vector<Event> events = [] {
    std::vector<Event> v;
    for (int i = 0; i < 64; ++i) {
      v.push_back(RequestEvent(Float32Tensor(16, 1024, 16 * i), {16, 1024},
                               inferq::DType::kFloat32, static_cast<std::uint64_t>(i)));
    }
    return v;
  }();
  return events;
}

// ---------------------------------------------------------------------------------
// memcpy_frame: the floor peer.

// Scalars in one block, written and read with a single memcpy (host byte order).
struct FixedPart {
  std::uint64_t task_hi, task_lo;
  std::uint8_t trace_id[16];
  std::uint8_t span_id[8];
  std::int64_t created_ns, deadline_ns, ttl_ns;
  std::uint64_t seq_no, uncompressed_size;
  std::uint32_t schema_id, schema_version, attempt;
  std::int32_t priority;
  std::uint8_t qos, dtype, codec, pad[5];
};
static_assert(sizeof(FixedPart) == 104);  // no padding but pad[]

std::int64_t TimeNs(absl::Time t) {
  if (t == absl::InfinitePast()) return std::numeric_limits<std::int64_t>::min();
  if (t == absl::InfiniteFuture()) return std::numeric_limits<std::int64_t>::max();
  return absl::ToUnixNanos(t);
}
absl::Time FromNs(std::int64_t ns) {
  if (ns == std::numeric_limits<std::int64_t>::min()) return absl::InfinitePast();
  if (ns == std::numeric_limits<std::int64_t>::max()) return absl::InfiniteFuture();
  return absl::FromUnixNanos(ns);
}

// One exact-size allocation, left uninitialized (std::string would zero it first).
struct Frame {
  std::unique_ptr<char[]> bytes;
  std::size_t size = 0;
  std::string_view view() const { return {bytes.get(), size}; }
};

// libzstd contexts kept across calls (memcpy_frame_zctx); the benchmarks run on one
// thread.
ZSTD_CCtx* ReusedCCtx() {
  static const std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> c(ZSTD_createCCtx(), &ZSTD_freeCCtx);
  return c.get();
}
ZSTD_DCtx* ReusedDCtx() {
  static const std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> d(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  return d.get();
}

// zstd_level 0: payload stored raw. reuse_ctx: compress through ReusedCCtx() instead
// of inferq::ZstdCompress.
Frame FrameEncode(const Event& e, int zstd_level, bool reuse_ctx = false) {
  std::string compressed;
  std::string_view payload = e.payload.view();
  if (zstd_level > 0 && !payload.empty()) {
    if (reuse_ctx) {
      compressed.resize(ZSTD_compressBound(payload.size()));
      const std::size_t n = ZSTD_compressCCtx(ReusedCCtx(), compressed.data(), compressed.size(),
                                              payload.data(), payload.size(), zstd_level);
      if (ZSTD_isError(n)) std::abort();
      compressed.resize(n);
    } else {
      compressed = *inferq::ZstdCompress(payload, zstd_level);
    }
    payload = compressed;
  }
  const std::string* strings[] = {&e.subject, &e.semantic_tag, &e.tenant, &e.model,
                                  &e.model_version, &e.msg_id, &e.seq_id};
  std::size_t size = sizeof(FixedPart) + 4 + e.shape.size() * 8 + 4 + 4 + payload.size();
  for (const std::string* s : strings) size += 4 + s->size();
  for (const auto& [k, v] : e.headers) size += 8 + k.size() + v.size();

  FixedPart f{};
  f.task_hi = e.task_id.hi;
  f.task_lo = e.task_id.lo;
  std::memcpy(f.trace_id, e.trace.trace_id.data(), 16);
  std::memcpy(f.span_id, e.trace.span_id.data(), 8);
  f.created_ns = TimeNs(e.created);
  f.deadline_ns = TimeNs(e.deadline);
  f.ttl_ns = e.ttl == absl::InfiniteDuration() ? std::numeric_limits<std::int64_t>::max()
                                                : absl::ToInt64Nanoseconds(e.ttl);
  f.seq_no = e.seq_no;
  f.uncompressed_size = compressed.empty() ? 0 : e.payload.size();
  f.schema_id = e.schema_id;
  f.schema_version = e.schema_version;
  f.attempt = e.attempt;
  f.priority = e.priority;
  f.qos = static_cast<std::uint8_t>(e.qos);
  f.dtype = static_cast<std::uint8_t>(e.dtype);
  f.codec = compressed.empty() ? 0 : 1;

  Frame out{std::unique_ptr<char[]>(new char[size]), size};
  {
    char* p = out.bytes.get();
    const auto put = [&p](const void* src, std::size_t n) {
      std::memcpy(p, src, n);
      p += n;
    };
    const auto put_len = [&put](std::size_t n) {
      const auto n32 = static_cast<std::uint32_t>(n);
      put(&n32, 4);
    };
    put(&f, sizeof f);
    for (const std::string* s : strings) {
      put_len(s->size());
      put(s->data(), s->size());
    }
    put_len(e.shape.size());
    put(e.shape.data(), e.shape.size() * 8);
    put_len(e.headers.size());
    for (const auto& [k, v] : e.headers) {
      put_len(k.size());
      put(k.data(), k.size());
      put_len(v.size());
      put(v.data(), v.size());
    }
    put_len(payload.size());
    put(payload.data(), payload.size());
  }
  return out;
}

// Returns false on a truncated or malformed frame. reuse_ctx: decompress through
// ReusedDCtx() instead of inferq::ZstdDecompress.
bool FrameDecode(std::string_view in, Event& e, bool reuse_ctx = false) {
  const char* p = in.data();
  const char* const end = p + in.size();
  const auto get = [&](void* dst, std::size_t n) {
    if (static_cast<std::size_t>(end - p) < n) return false;
    std::memcpy(dst, p, n);
    p += n;
    return true;
  };
  const auto get_len = [&](std::uint32_t& n) { return get(&n, 4); };
  const auto get_string = [&](std::string& s) {
    std::uint32_t n;
    if (!get_len(n) || static_cast<std::size_t>(end - p) < n) return false;
    s.assign(p, n);
    p += n;
    return true;
  };
  FixedPart f;
  if (!get(&f, sizeof f) || f.qos > 2 || f.dtype > 11 || f.codec > 1 || f.ttl_ns < 0) return false;
  e.task_id = {f.task_hi, f.task_lo};
  std::memcpy(e.trace.trace_id.data(), f.trace_id, 16);
  std::memcpy(e.trace.span_id.data(), f.span_id, 8);
  e.created = FromNs(f.created_ns);
  e.deadline = FromNs(f.deadline_ns);
  e.ttl = f.ttl_ns == std::numeric_limits<std::int64_t>::max() ? absl::InfiniteDuration()
                                                               : absl::Nanoseconds(f.ttl_ns);
  e.seq_no = f.seq_no;
  e.schema_id = f.schema_id;
  e.schema_version = f.schema_version;
  e.attempt = f.attempt;
  e.priority = f.priority;
  e.qos = static_cast<inferq::Qos>(f.qos);
  e.dtype = static_cast<inferq::DType>(f.dtype);
  for (std::string* s : {&e.subject, &e.semantic_tag, &e.tenant, &e.model, &e.model_version,
                         &e.msg_id, &e.seq_id}) {
    if (!get_string(*s)) return false;
  }
  std::uint32_t n;
  if (!get_len(n) || static_cast<std::size_t>(end - p) / 8 < n) return false;
  e.shape.resize(n);
  get(e.shape.data(), std::size_t{n} * 8);
  if (!get_len(n)) return false;
  for (std::uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!get_string(k) || !get_string(v)) return false;
    e.headers.Set(std::move(k), std::move(v));
  }
  if (!get_len(n) || static_cast<std::size_t>(end - p) != n) return false;
  const std::string_view stored(p, n);
  if (f.codec == 0) {
    e.payload = Buffer::FromString(stored);
  } else if (reuse_ctx) {
    std::string raw(f.uncompressed_size, '\0');
    const std::size_t got =
        ZSTD_decompressDCtx(ReusedDCtx(), raw.data(), raw.size(), stored.data(), stored.size());
    if (ZSTD_isError(got) || got != f.uncompressed_size) return false;
    e.payload = Buffer::FromString(raw);
  } else {
    auto raw = inferq::ZstdDecompress(stored, f.uncompressed_size);
    if (!raw.ok() || raw->size() != f.uncompressed_size) return false;
    e.payload = Buffer::FromString(*raw);
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Encode / Decode of one event.

enum class Impl { kTensorEvent, kMemcpyFrame, kMemcpyFrameZctx };

Event SizedEvent(std::size_t payload_bytes) {
  const int floats = static_cast<int>(payload_bytes / sizeof(float));
  const int cols = std::min(floats, 1024);
  return RequestEvent(Float32Tensor(floats / cols, cols, 0), {floats / cols, cols},
                      inferq::DType::kFloat32, 1);
}

void Fail(benchmark::State& state, const char* what) {
  state.SkipWithError(what);
}

void BM_Encode(benchmark::State& state, Impl impl, int level, std::size_t payload_bytes) {
  const Event e = SizedEvent(payload_bytes);
  const inferq::EncodeOptions opts{
      .codec = level > 0 ? inferq::PayloadCodec::kZstd : inferq::PayloadCodec::kNone,
      .zstd_level = level > 0 ? level : 3};
  std::size_t wire_bytes = 0;
  for (auto _ : state) {
    if (impl == Impl::kTensorEvent) {
      absl::StatusOr<Buffer> wire = inferq::Encode(e, opts);
      if (!wire.ok()) return Fail(state, "Encode failed");
      wire_bytes = wire->size();
      benchmark::DoNotOptimize(wire->data());
    } else {
      Frame wire = FrameEncode(e, level, impl == Impl::kMemcpyFrameZctx);
      wire_bytes = wire.size;
      benchmark::DoNotOptimize(wire.bytes.get());
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(payload_bytes));
  state.counters["wire_bytes"] = static_cast<double>(wire_bytes);
}

void BM_Decode(benchmark::State& state, Impl impl, int level, std::size_t payload_bytes) {
  const Event e = SizedEvent(payload_bytes);
  const inferq::EncodeOptions opts{
      .codec = level > 0 ? inferq::PayloadCodec::kZstd : inferq::PayloadCodec::kNone,
      .zstd_level = level > 0 ? level : 3};
  const Buffer wire = *inferq::Encode(e, opts);
  const Frame frame = FrameEncode(e, level, impl == Impl::kMemcpyFrameZctx);
  for (auto _ : state) {
    if (impl == Impl::kTensorEvent) {
      absl::StatusOr<Event> back = inferq::Decode(wire.span());
      if (!back.ok() || back->payload.size() != payload_bytes) return Fail(state, "Decode failed");
      benchmark::DoNotOptimize(back->payload.data());
    } else {
      Event back;
      if (!FrameDecode(frame.view(), back, impl == Impl::kMemcpyFrameZctx) || back.payload.size() != payload_bytes) {
        return Fail(state, "FrameDecode failed");
      }
      benchmark::DoNotOptimize(back.payload.data());
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(payload_bytes));
  state.counters["wire_bytes"] =
      static_cast<double>(impl == Impl::kTensorEvent ? wire.size() : frame.size);
}

// ---------------------------------------------------------------------------------
// Compression of a data set, event by event.

enum class Codec { kTensorEvent, kTensorEventDict, kZstdCodec, kZstdCtxReused };

// A trained zstd dictionary (ZDICT, 16 KiB) per data set and level, from the payloads
// of the odd-numbered events; "heldout_ratio" counters measure on the even-numbered
// ones only, which the dictionary never saw.
struct TrainedDictionary {
  std::shared_ptr<const inferq::ZstdDictionary> dict;
  inferq::ZstdDictionaries set;
};
const TrainedDictionary& DictionaryFor(const std::vector<Event>& events, int level) {
  static std::map<std::pair<const void*, int>, std::unique_ptr<TrainedDictionary>> cache;
  auto& slot = cache[{&events, level}];
  if (!slot) {
    std::vector<std::string> samples;
    for (std::size_t i = 1; i < events.size(); i += 2) samples.emplace_back(events[i].payload.view());
    auto dict = inferq::ZstdDictionary::Train(samples, 16384, level);
    if (!dict.ok()) {
      std::fprintf(stderr, "bench_wire: %s\n", std::string(dict.status().message()).c_str());
      std::exit(2);
    }
    slot = std::make_unique<TrainedDictionary>();
    slot->dict = *dict;
    if (!slot->set.Add(slot->dict).ok()) std::exit(2);
  }
  return *slot;
}

std::size_t PayloadBytes(const std::vector<Event>& events) {
  std::size_t n = 0;
  for (const Event& e : events) n += e.payload.size();
  return n;
}

void BM_Compress(benchmark::State& state, Codec codec, const std::vector<Event>* (*data)(),
                 int level) {
  const std::vector<Event>& events = *data();
  const std::size_t raw = PayloadBytes(events);
  std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), &ZSTD_freeCCtx);
  std::string scratch;
  std::size_t compressed = 0, wire_raw = 0, wire_zstd = 0;
  for (auto _ : state) {
    compressed = 0;
    for (const Event& e : events) {
      switch (codec) {
        case Codec::kTensorEvent: {
          absl::StatusOr<Buffer> wire =
              inferq::Encode(e, {.codec = inferq::PayloadCodec::kZstd, .zstd_level = level});
          if (!wire.ok()) return Fail(state, "Encode failed");
          compressed += wire->size();
          break;
        }
        case Codec::kTensorEventDict: {
          absl::StatusOr<Buffer> wire = inferq::Encode(
              e, {.codec = inferq::PayloadCodec::kZstd, .zstd_level = level,
                  .dictionary = DictionaryFor(events, level).dict.get()});
          if (!wire.ok()) return Fail(state, "Encode with a dictionary failed");
          compressed += wire->size();
          break;
        }
        case Codec::kZstdCodec: {
          absl::StatusOr<std::string> z = inferq::ZstdCompress(e.payload.view(), level);
          if (!z.ok()) return Fail(state, "ZstdCompress failed");
          compressed += z->size();
          break;
        }
        case Codec::kZstdCtxReused: {
          scratch.resize(ZSTD_compressBound(e.payload.size()));
          const std::size_t n = ZSTD_compressCCtx(cctx.get(), scratch.data(), scratch.size(),
                                                  e.payload.data(), e.payload.size(), level);
          if (ZSTD_isError(n)) return Fail(state, "ZSTD_compressCCtx failed");
          compressed += n;
          break;
        }
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(events.size()));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(raw));
  if (codec == Codec::kTensorEvent) {
    wire_zstd = compressed;
    for (const Event& e : events) wire_raw += inferq::Encode(e)->size();
    state.counters["wire_ratio"] = static_cast<double>(wire_raw) / static_cast<double>(wire_zstd);
    // Payload-only ratio from the codec, for the same events and level.
    std::size_t payload_z = 0;
    for (const Event& e : events) payload_z += inferq::ZstdCompress(e.payload.view(), level)->size();
    state.counters["ratio"] = static_cast<double>(raw) / static_cast<double>(payload_z);
  } else if (codec == Codec::kTensorEventDict) {
    const inferq::ZstdDictionary& dict = *DictionaryFor(events, level).dict;
    std::size_t payload_z = 0, held_raw = 0, held_z = 0, held_nodict = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const std::size_t z = inferq::ZstdCompress(events[i].payload.view(), dict)->size();
      payload_z += z;
      if (i % 2 == 0) {
        held_raw += events[i].payload.size();
        held_z += z;
        held_nodict += inferq::ZstdCompress(events[i].payload.view(), level)->size();
      }
    }
    state.counters["ratio"] = static_cast<double>(raw) / static_cast<double>(payload_z);
    state.counters["heldout_ratio"] = static_cast<double>(held_raw) / static_cast<double>(held_z);
    state.counters["heldout_ratio_nodict"] =
        static_cast<double>(held_raw) / static_cast<double>(held_nodict);
  } else {
    state.counters["ratio"] = static_cast<double>(raw) / static_cast<double>(compressed);
  }
  state.counters["payload_bytes_mean"] = static_cast<double>(raw) / static_cast<double>(events.size());
}

void BM_Decompress(benchmark::State& state, Codec codec, const std::vector<Event>* (*data)(),
                   int level) {
  const std::vector<Event>& events = *data();
  const std::size_t raw = PayloadBytes(events);
  std::vector<Buffer> wires;
  std::vector<std::string> frames;
  std::size_t compressed = 0;
  const TrainedDictionary* dict =
      codec == Codec::kTensorEventDict ? &DictionaryFor(events, level) : nullptr;
  for (const Event& e : events) {
    wires.push_back(*inferq::Encode(e, {.codec = inferq::PayloadCodec::kZstd, .zstd_level = level,
                                        .dictionary = dict ? dict->dict.get() : nullptr}));
    frames.push_back(dict ? *inferq::ZstdCompress(e.payload.view(), *dict->dict)
                          : *inferq::ZstdCompress(e.payload.view(), level));
    compressed += frames.back().size();
  }
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), &ZSTD_freeDCtx);
  std::string out;
  for (auto _ : state) {
    for (std::size_t i = 0; i < events.size(); ++i) {
      const std::size_t want = events[i].payload.size();
      switch (codec) {
        case Codec::kTensorEvent: {
          absl::StatusOr<Event> back = inferq::Decode(wires[i].span());
          if (!back.ok() || back->payload.size() != want) return Fail(state, "Decode failed");
          benchmark::DoNotOptimize(back->payload.data());
          break;
        }
        case Codec::kTensorEventDict: {
          absl::StatusOr<Event> back = inferq::Decode(wires[i].span(), {.dictionaries = &dict->set});
          if (!back.ok() || back->payload.size() != want) return Fail(state, "Decode failed");
          benchmark::DoNotOptimize(back->payload.data());
          break;
        }
        case Codec::kZstdCodec: {
          absl::StatusOr<std::string> r = inferq::ZstdDecompress(frames[i], want);
          if (!r.ok() || r->size() != want) return Fail(state, "ZstdDecompress failed");
          benchmark::DoNotOptimize(r->data());
          break;
        }
        case Codec::kZstdCtxReused: {
          out.resize(want);
          const std::size_t n = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(),
                                                    frames[i].data(), frames[i].size());
          if (ZSTD_isError(n) || n != want) return Fail(state, "ZSTD_decompressDCtx failed");
          benchmark::DoNotOptimize(out.data());
          break;
        }
      }
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(events.size()));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(raw));
  state.counters["ratio"] = static_cast<double>(raw) / static_cast<double>(compressed);
}

const std::vector<Event>* TokenData() { return &TokenEvents(); }
const std::vector<Event>* Float32Data() { return &Float32Events(); }

void RegisterAll() {
  struct CodecCfg { const char* name; int level; };
  const CodecCfg codecs[] = {{"none", 0}, {"zstd1", 1}, {"zstd3", 3}};
  for (const char* what : {"BM_Encode", "BM_Decode"}) {
    const bool encode = std::string_view(what) == "BM_Encode";
    for (auto [impl, impl_name] : {std::pair{Impl::kTensorEvent, "tensor_event"},
                                   std::pair{Impl::kMemcpyFrame, "memcpy_frame"},
                                   std::pair{Impl::kMemcpyFrameZctx, "memcpy_frame_zctx"}}) {
      for (const CodecCfg& c : codecs) {
        if (impl == Impl::kMemcpyFrameZctx && c.level == 0) continue;  // same as memcpy_frame
        for (std::size_t bytes : {std::size_t{64}, std::size_t{1024}, std::size_t{65536}}) {
          const std::string name = std::string(what) + "/" + impl_name + "/codec:" + c.name +
                                   "/payload:" + std::to_string(bytes);
          const int level = c.level;
          const Impl i = impl;
          benchmark::RegisterBenchmark(name.c_str(), [encode, i, level, bytes](benchmark::State& s) {
            if (encode) {
              BM_Encode(s, i, level, bytes);
            } else {
              BM_Decode(s, i, level, bytes);
            }
          });
        }
      }
    }
  }
  for (const char* what : {"BM_Compress", "BM_Decompress"}) {
    const bool compress = std::string_view(what) == "BM_Compress";
    for (auto [codec, codec_name] : {std::pair{Codec::kTensorEvent, "tensor_event"},
                                     std::pair{Codec::kTensorEventDict, "tensor_event_dict"},
                                     std::pair{Codec::kZstdCodec, "zstd_codec"},
                                     std::pair{Codec::kZstdCtxReused, "zstd_ctx_reused"}}) {
      for (auto [data, data_name] : {std::pair{&TokenData, "tokens"},
                                     std::pair{&Float32Data, "float32"}}) {
        for (int level : {1, 3}) {
          const std::string name = std::string(what) + "/" + codec_name + "/data:" + data_name +
                                   "/level:" + std::to_string(level);
          const Codec c = codec;
          const auto d = data;
          benchmark::RegisterBenchmark(name.c_str(), [compress, c, d, level](benchmark::State& s) {
            if (compress) {
              BM_Compress(s, c, d, level);
            } else {
              BM_Decompress(s, c, d, level);
            }
          })->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
