/// @file inferq/engine/trace.hpp
///
/// Spans of the engine's stages, reported to a TraceSink (EngineOptions::trace): the
/// engine's side of OpenTelemetry tracing. The engine makes the spans; a sink sends
/// them on (adapters/otlp/otlp_exporter.hpp: OTLP/HTTP JSON) or records them (tests).
///
/// Usage:
/// @code
///   class Printer final : public inferq::TraceSink {
///     void Export(inferq::Span&& s) noexcept override { ... copy it to a queue ... }
///   };
///   inferq::EngineOptions o;
///   o.trace = {.sink = std::make_shared<Printer>(), .sample_ratio = 0.01};
///   auto engine = inferq::Engine::Create(std::move(o));
/// @endcode
///
/// The stages of one event, with their parent (W3C Trace Context ids; Event::trace):
/// @code{.unparsed}
///   publish      the Publish call, from its start until it returns (file streams:
///                after the sync policy is met). Parent: the span in the event's trace
///                as published (its `traceparent`), if any. The stored event's trace
///                then names this span: every later stage is its descendant, and a
///                bridge exporting the event carries this span as the next hop's parent.
///   queue_wait   from the store to the first delivery of the message to a consumer's
///                member (the pull that takes it). Parent: publish. Redeliveries have
///                no queue_wait span: their deliver span says which delivery it was.
///   deliver      one delivery, from the pull to its settle (the member's work).
///                Parent: publish. Message::trace() names it, so that the member's
///                own spans (and a reply it publishes) are its children.
///   ack, nak,    the settle call (Message::Ack, AckSync, Nak, Term; AckSync's span
///   term         ends after the ack log's sync and carries its error). Parent: deliver.
///   dead_letter  a message given up (max_deliver, term, expired) and sent to the
///                consumer's dead-letter subject, or lost for want of one. Parent:
///                deliver when a settle gave it up, else publish. The dead letter's
///                own publish is then traced as a child of this span.
/// @endcode
///
/// Sampling (OpenTelemetry's ParentBased(TraceIdRatioBased) sampler): an event
/// published with a trace context (a non-zero trace-id) keeps its sampled flag (bit 0
/// of TraceContext::flags); one without gets a new random trace-id, sampled when its
/// last 8 bytes, read big-endian, are below sample_ratio * 2^64. Only sampled events
/// get publish, queue_wait, deliver and settle spans, but errors are always recorded:
/// a Publish that returns an error (except TryPublish's WouldBlock refusal, which is
/// backpressure), a settle that returns one, and every dead letter. (An unsampled
/// publish reads no clock: its error span is instant, at the publish's end.) Ids come
/// from SplitMix64 sequences: per thread from a random seed, or one per engine from
/// TraceOptions::id_seed. With no sink the
/// engine neither changes Event::trace nor makes any span: its cost is one branch per
/// publish, pull and settle.
///
/// Thread safety: the engine calls Export from any of its threads and from the
/// threads that publish, pull and settle, several at once. Export must not block
/// (queue the span and return) and must not call the engine.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "inferq/event/event.hpp"

namespace inferq {

/// Numbered as OpenTelemetry's SpanKind (opentelemetry-proto trace.proto).
enum class SpanKind : std::uint8_t {
  kInternal = 1,  ///< SPAN_KIND_INTERNAL
  kServer = 2,    ///< SPAN_KIND_SERVER
  kClient = 3,    ///< SPAN_KIND_CLIENT: a pull or a settle
  kProducer = 4,  ///< SPAN_KIND_PRODUCER: a send
  kConsumer = 5,  ///< SPAN_KIND_CONSUMER: a delivery's processing
};

/// The stage of an event a Span covers (see the file comment).
enum class SpanStage : std::uint8_t {
  kPublish,     ///< "publish": the Publish call
  kQueueWait,   ///< "queue_wait": store -> first delivery
  kDeliver,     ///< "deliver": one delivery, pull -> settle
  kAck,         ///< "ack": an Ack or AckSync call
  kNak,         ///< "nak": a Nak call
  kTerm,        ///< "term": a Term call
  kDeadLetter,  ///< "dead_letter": a message given up
};

/// "publish", "queue_wait", "deliver", "ack", "nak", "term", "dead_letter": the
/// span's messaging.operation.name.
std::string_view StageName(SpanStage stage);
/// OpenTelemetry's messaging.operation.type of the stage (semantic conventions 1.27
/// and later): "send" (publish, dead_letter), "receive" (queue_wait), "process"
/// (deliver), "settle" (ack, nak, term).
std::string_view OperationType(SpanStage stage);
/// The SpanKind those conventions give the operation type: send PRODUCER, receive
/// CLIENT (a pull), process CONSUMER, settle CLIENT.
SpanKind KindOf(SpanStage stage);

/// One finished span. Times are Unix epoch nanoseconds (the engine clock's reading
/// plus the wall-clock offset taken when the engine was created, so durations are
/// the engine clock's).
struct Span {
  SpanStage stage = SpanStage::kPublish;  ///< the stage the span covers
  /// trace_id, span_id (this span's) and flags (bit 0: sampled; clear on an error or
  /// dead-letter span of an unsampled trace).
  TraceContext context{};
  std::array<std::uint8_t, 8> parent_span_id{};  ///< all zero: a root span
  std::int64_t start_unix_ns = 0;  ///< start, Unix epoch ns
  std::int64_t end_unix_ns = 0;    ///< end, Unix epoch ns
  /// messaging.destination.name: the event's subject (publish, queue_wait, deliver,
  /// settles) or the dead-letter subject (dead_letter; empty when the consumer has none).
  std::string destination{};
  std::string stream{};    ///< the stream (empty for publish: it may store into several)
  std::string consumer{};  ///< messaging.consumer.group.name (empty for publish)
  std::uint32_t member = 0;          ///< the member (lane) of a delivery and its settle
  std::uint64_t stream_seq = 0;      ///< publish: the PublishAck's seq; 0 if none
  std::uint32_t delivery_count = 0;  ///< Message::attempt() of a delivery, settle or dead letter
  /// messaging.batch.message_count: the batch a deliver's message came in
  /// (NextBatch), 0 for Next.
  std::uint32_t batch_message_count = 0;
  std::string message_id{};  ///< messaging.message.id: Event::msg_id (may be empty)
  std::uint64_t body_size = 0;  ///< messaging.message.body.size: payload bytes as stored
  /// error.type: empty = OK. An absl::StatusCode name ("RESOURCE_EXHAUSTED") for an
  /// error returned by the call, "nak" or "term" for a deliver ended that way, the
  /// reason ("max_deliver", "term", "expired") for a dead letter.
  std::string error_type{};
  std::string error_message{};  ///< the status message, or the dead letter's description
  // (destination, message_id and error_message keep at most their first 1,024 bytes,
  // then "...": a refused event may carry a subject of any size.)
};

/// Receives the engine's finished spans. See the file comment for the contract.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  /// Takes one finished span; must not block or call the engine. Any thread.
  virtual void Export(Span&& span) noexcept = 0;
};

/// Whether and how an Engine traces (EngineOptions::trace).
struct TraceOptions {
  std::shared_ptr<TraceSink> sink{};  ///< nullptr = tracing off
  /// Share of new traces sampled, 0..1 (Engine::Create: InvalidArgument naming the
  /// value outside it, NaN included).
  double sample_ratio = 1.0;
  /// Seed of the engine's trace and span ids: 0 = a sequence per thread, seeded from
  /// std::random_device; else one sequence for the engine from this seed, so that a
  /// single-threaded run's ids, and its sampling, repeat (tests).
  std::uint64_t id_seed = 0;
};

}  // namespace inferq
