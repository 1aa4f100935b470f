// File: src/engine/dead_letter.cpp
//
// The one builder of dead letters: a copy of the event with the reason headers
// (kDeadLetterReasonHeader ...), published to the consumer's dead_letter_subject
// through its ConsumerHost (Engine::Publish, PublishMode::kInternal).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"
#include "absl/time/time.h"

namespace inferq {
namespace engine_internal {

namespace {

// Reports the dead_letter span of message `h` and returns its context (sampled), the
// trace of the dead letter published next.
TraceContext TraceDeadLetter(ConsumerState& c, const StoredMessage& h, std::uint32_t attempt,
                             std::string_view reason, std::string_view description,
                             const SpanId& via) {
  Tracer& tracer = *c.tracer;
  const Event& ev = *h.event;
  Span s;
  s.stage = SpanStage::kDeadLetter;
  s.context = ev.trace;
  if (!HasTrace(s.context)) {  // stored before tracing was on (a file stream's past)
    s.context.trace_id = tracer.NewTraceId();
    s.context.flags = 0;
  }
  s.context.span_id = tracer.NewSpanId();
  s.parent_span_id = IsZero(via) ? ev.trace.span_id : via;
  s.destination = c.config.dead_letter_subject;
  s.stream = c.config.stream;
  s.consumer = c.config.name;
  s.stream_seq = h.seq;
  s.delivery_count = attempt;
  s.message_id = SpanText(ev.msg_id);
  s.body_size = ev.payload.size();
  s.error_type = std::string(reason);
  s.error_message = SpanText(description);
  TraceContext next = s.context;
  next.flags |= 1U;
  const std::int64_t now = tracer.NowNanos();
  tracer.Emit(std::move(s), now, now);
  return next;
}

}  // namespace

// Gives message `h` up after delivery `attempt`: a copy goes to the consumer's
// dead-letter subject with the reason headers (kDeadLetterReasonHeader, ...).
void DeadLetter(ConsumerState& c, const Handle& h, std::uint32_t attempt,
                std::string_view reason, std::string_view description, const SpanId& via,
                bool settle) {
  // Expired in the consumer's lifecycle first: a crash before the ack record below
  // delivers it again, and the delivery finds it Expired and terminates it (a second
  // dead letter, as at-least-once allows), never Processing forever.
  if (c.config.lifecycle != nullptr) {
    const std::string id = LifecycleId(c, h->seq);
    (void)c.config.lifecycle->Expire(id, LifecycleReason(reason, description));
    // A memory stream's message never comes again: its record is done with (a file
    // stream's goes at the next AddConsumer, once the ack record below is read back).
    if (h->stream->log == nullptr) (void)c.config.lifecycle->Forget(id);
  }
  if (settle) SettleWithoutAck(c, *h);
  // A durable consumer records it done, so a restart does not deliver it again
  // (Term's record is written by Message::Settle, before this).
  if (c.ack_log != nullptr && reason != "term") (void)c.Record("A " + std::to_string(h->seq));
  if (c.on_dead_letter && !c.on_dead_letter(*h->event, attempt, reason)) return;
  c.counts.dead_letters.fetch_add(1, std::memory_order_relaxed);
  // Recorded whether the event was sampled or not (engine/trace.hpp).
  TraceContext dead_letter_trace{};
  if (c.tracer != nullptr) [[unlikely]] dead_letter_trace = TraceDeadLetter(c, *h, attempt, reason, description, via);
  if (c.config.dead_letter_subject.empty() || c.host == nullptr) {
    c.counts.dead_letters_lost.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Event e = *h->event;  // shares the payload Buffer
  e.headers.Set(std::string(kOriginalSubjectHeader), std::move(e.subject));
  e.subject = c.config.dead_letter_subject;
  e.headers.Set(std::string(kDeadLetterReasonHeader), std::string(reason));
  if (!description.empty()) {
    e.headers.Set(std::string(kDeadLetterDescriptionHeader), std::string(description));
  }
  e.headers.Set(std::string(kDeliveryCountHeader), std::to_string(attempt));
  e.headers.Set(std::string(kStreamHeader), c.config.stream);
  e.headers.Set(std::string(kConsumerHeader), c.config.name);
  e.headers.Set(std::string(kStreamSeqHeader), std::to_string(h->seq));
  // A dead letter is a new message: the original's expiry no longer applies (it
  // would expire again in the dead-letter consumer's lane); it is kept as information.
  if (e.ttl > absl::ZeroDuration()) {
    e.headers.Set(std::string(kOriginalTtlHeader), std::to_string(absl::ToInt64Nanoseconds(e.ttl)));
    e.ttl = absl::ZeroDuration();
  }
  if (e.deadline != absl::InfiniteFuture()) {
    e.headers.Set(std::string(kOriginalDeadlineHeader),
                  absl::FormatTime(absl::RFC3339_full, e.deadline, absl::UTCTimeZone()));
    e.deadline = absl::InfiniteFuture();
  }
  e.attempt = attempt;
  // Traced: the dead letter's publish is a child of the dead_letter span, sampled.
  if (c.tracer != nullptr) e.trace = dead_letter_trace;
  if (!c.host->PublishDeadLetter(std::move(e)).ok()) {
    c.counts.dead_letters_lost.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace engine_internal



}  // namespace inferq
