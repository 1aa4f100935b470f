// File: src/engine/tracer.hpp
//
// The engine's side of tracing (engine/trace.hpp): ids, the sampling decision and
// the spans of each stage, handed to EngineOptions::trace.sink. One Tracer per
// engine, made only when a sink is set; the stages call it through a pointer that is
// null otherwise, so tracing off costs one branch.
//
// Thread safety: every method may be called from any thread at once. Ids come from
// SplitMix64 sequences: one per thread (thread-local state), or one for the engine
// (an atomic counter) with TraceOptions::id_seed.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inferq/base/clock.hpp"
#include "inferq/engine/trace.hpp"
#include "inferq/event/event.hpp"

namespace inferq {
struct PublishAck;
namespace engine_internal {

using SpanId = std::array<std::uint8_t, 8>;

inline bool IsZero(const SpanId& id) {
  for (std::uint8_t b : id) {
    if (b != 0) return false;
  }
  return true;
}
inline bool HasTrace(const TraceContext& t) {
  for (std::uint8_t b : t.trace_id) {
    if (b != 0) return true;
  }
  return false;
}
inline bool Sampled(const TraceContext& t) { return (t.flags & 1U) != 0; }

// Span strings come from events and status messages, whose size the engine does not
// bound (a refused publish may carry an 8 MB subject): a span keeps at most the first
// kMaxSpanTextBytes of each, then "...".
inline constexpr std::size_t kMaxSpanTextBytes = 1024;
inline std::string SpanText(std::string_view s) {
  if (s.size() <= kMaxSpanTextBytes) return std::string(s);
  std::string out(s.substr(0, kMaxSpanTextBytes));
  out += "...";
  return out;
}
// A status's message, bounded as SpanText (Debian's Abseil has its own string_view).
inline std::string StatusText(const absl::Status& st) {
  const absl::string_view m = st.message();
  return SpanText(std::string_view(m.data(), m.size()));
}

class Tracer {
 public:
  // `options.sink` is not null; `options.sample_ratio` in [0, 1] (Create checked).
  Tracer(const TraceOptions& options, const Clock* clock);

  // What a traced publish remembers between its start and its end.
  struct PublishScope {
    TraceContext context{};  // the publish span's
    SpanId parent{};
    // Sampled only (an unsampled publish reads no clock and copies nothing; its error
    // span, if any, is instant and reads the event as the failed publish left it).
    std::int64_t start_ns = 0;  // engine clock
    std::string subject;
    std::string msg_id;
    std::uint64_t body_size = 0;
  };
  // Decides sampling and gives `event` the publish span's context (a new trace-id
  // when it had none; a new span id, parented to the one it had).
  void BeginPublish(Event& event, PublishScope& scope);
  // Reports the publish span when sampled, or when `result` is an error other than
  // WouldBlock. `event`: the event Publish was given (after a failed publish it still
  // holds its subject: a refused event is not stored).
  void EndPublish(PublishScope& scope, const Event& event, const absl::StatusOr<PublishAck>& result);

  // A new span id for a delivery of a sampled event (Message::trace), or zero.
  SpanId DeliverSpanId(const TraceContext& event_trace) {
    return Sampled(event_trace) ? NewSpanId() : SpanId{};
  }

  // Emits `span` with its times converted from the engine clock.
  void Emit(Span&& span, std::int64_t start_ns, std::int64_t end_ns);

  SpanId NewSpanId();
  std::array<std::uint8_t, 16> NewTraceId();
  std::int64_t NowNanos() const { return clock_->NowNanos(); }

 private:
  // SplitMix64's output function (Steele, Lea, Flood: "Fast splittable pseudorandom
  // number generators", OOPSLA 2014): a bijection that mixes consecutive inputs well.
  static std::uint64_t Mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  static constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
  // The next random 64 bits. With TraceOptions::id_seed, one sequence for the engine
  // (an atomic counter: repeatable in a single-threaded run); else a sequence per
  // thread from a random seed, with no shared cache line on the publish path.
  std::uint64_t Next() {
    if (fixed_seed_) return Mix(seed_ + counter_.fetch_add(kGolden, std::memory_order_relaxed));
    thread_local std::uint64_t state = RandomSeed();
    state += kGolden;
    return Mix(state);
  }
  static std::uint64_t RandomSeed();

  std::shared_ptr<TraceSink> sink_;
  const Clock* clock_;
  std::int64_t unix_offset_ns_;  // Unix ns minus the engine clock's ns, at creation
  // TraceIdRatioBased: sampled when the trace-id's last 8 bytes (big-endian) are
  // below this; sample_all_ for a ratio of 1 (2^64 does not fit).
  std::uint64_t threshold_;
  bool sample_all_;
  bool fixed_seed_;
  std::uint64_t seed_;
  std::atomic<std::uint64_t> counter_{0};
};

}  // namespace engine_internal
}  // namespace inferq
