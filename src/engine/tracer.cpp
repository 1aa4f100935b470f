// File: src/engine/tracer.cpp
//
// Tracer: ids, sampling and the publish span (tracer.hpp); the stage names of
// engine/trace.hpp.
#include "tracer.hpp"

#include <random>
#include <utility>

#include "absl/time/clock.h"
#include "inferq/engine/engine.hpp"

namespace inferq {

std::string_view StageName(SpanStage stage) {
  switch (stage) {
    case SpanStage::kPublish: return "publish";
    case SpanStage::kQueueWait: return "queue_wait";
    case SpanStage::kDeliver: return "deliver";
    case SpanStage::kAck: return "ack";
    case SpanStage::kNak: return "nak";
    case SpanStage::kTerm: return "term";
    case SpanStage::kDeadLetter: return "dead_letter";
  }
  return "unknown";
}

std::string_view OperationType(SpanStage stage) {
  switch (stage) {
    case SpanStage::kPublish:
    case SpanStage::kDeadLetter: return "send";
    case SpanStage::kQueueWait: return "receive";
    case SpanStage::kDeliver: return "process";
    case SpanStage::kAck:
    case SpanStage::kNak:
    case SpanStage::kTerm: return "settle";
  }
  return "unknown";
}

SpanKind KindOf(SpanStage stage) {
  switch (stage) {
    case SpanStage::kPublish:
    case SpanStage::kDeadLetter: return SpanKind::kProducer;
    case SpanStage::kDeliver: return SpanKind::kConsumer;
    case SpanStage::kQueueWait:
    case SpanStage::kAck:
    case SpanStage::kNak:
    case SpanStage::kTerm: return SpanKind::kClient;
  }
  return SpanKind::kInternal;
}

namespace engine_internal {

Tracer::Tracer(const TraceOptions& options, const Clock* clock)
    : sink_(options.sink),
      clock_(clock),
      unix_offset_ns_(absl::GetCurrentTimeNanos() - clock->NowNanos()),
      threshold_(options.sample_ratio >= 1.0
                     ? ~std::uint64_t{0}
                     : static_cast<std::uint64_t>(options.sample_ratio * 18446744073709551616.0)),
      sample_all_(options.sample_ratio >= 1.0),
      fixed_seed_(options.id_seed != 0),
      seed_(options.id_seed) {}

std::uint64_t Tracer::RandomSeed() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}

SpanId Tracer::NewSpanId() {
  SpanId id{};
  do {
    const std::uint64_t v = Next();
    for (int i = 0; i < 8; ++i) id[i] = static_cast<std::uint8_t>(v >> (56 - 8 * i));
  } while (IsZero(id));  // the W3C specification forbids an all-zero id
  return id;
}

std::array<std::uint8_t, 16> Tracer::NewTraceId() {
  std::array<std::uint8_t, 16> id{};
  const std::uint64_t hi = Next();
  std::uint64_t lo = Next();
  if (hi == 0 && lo == 0) lo = 1;
  for (int i = 0; i < 8; ++i) {
    id[i] = static_cast<std::uint8_t>(hi >> (56 - 8 * i));
    id[8 + i] = static_cast<std::uint8_t>(lo >> (56 - 8 * i));
  }
  return id;
}

void Tracer::BeginPublish(Event& event, PublishScope& scope) {
  if (HasTrace(event.trace)) {  // ParentBased: the parent decided
    scope.parent = event.trace.span_id;
  } else {
    event.trace.trace_id = NewTraceId();
    std::uint64_t low = 0;
    for (int i = 8; i < 16; ++i) low = (low << 8) | event.trace.trace_id[i];
    const bool sampled = sample_all_ || low < threshold_;
    event.trace.flags = static_cast<std::uint8_t>((event.trace.flags & ~1U) | (sampled ? 1U : 0U));
  }
  event.trace.span_id = NewSpanId();
  scope.context = event.trace;
  if (!Sampled(event.trace)) return;
  scope.start_ns = clock_->NowNanos();
  scope.subject = SpanText(event.subject);
  scope.msg_id = SpanText(event.msg_id);
  scope.body_size = event.payload.size();
}

void Tracer::EndPublish(PublishScope& scope, const Event& event, const absl::StatusOr<PublishAck>& result) {
  const bool sampled = Sampled(scope.context);
  const bool error = !result.ok() && !WouldBlock(result.status());
  if (!sampled && !error) return;
  Span s;
  s.stage = SpanStage::kPublish;
  s.context = scope.context;
  s.parent_span_id = scope.parent;
  if (sampled) {
    s.destination = std::move(scope.subject);
    s.message_id = std::move(scope.msg_id);
    s.body_size = scope.body_size;
  } else {
    s.destination = SpanText(event.subject);
    s.message_id = SpanText(event.msg_id);
    s.body_size = event.payload.size();
  }
  if (result.ok()) {
    s.stream_seq = result->seq;
  } else {
    s.error_type = absl::StatusCodeToString(result.status().code());
    s.error_message = StatusText(result.status());
  }
  const std::int64_t end = clock_->NowNanos();
  Emit(std::move(s), sampled ? scope.start_ns : end, end);
}

void Tracer::Emit(Span&& span, std::int64_t start_ns, std::int64_t end_ns) {
  span.start_unix_ns = start_ns + unix_offset_ns_;
  span.end_unix_ns = end_ns + unix_offset_ns_;
  sink_->Export(std::move(span));
}

}  // namespace engine_internal
}  // namespace inferq
