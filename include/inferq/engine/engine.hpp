/// @file inferq/engine/engine.hpp
///
/// Engine: streams, consumers and delivery inside one process.
///
/// A *stream* captures every published event whose subject matches one of its subject
/// patterns, numbers it (sequence from 1) and keeps it under its limits. A *consumer*
/// of a stream is a group of *members*; each member has a lane (an MpmcRing of event
/// handles) and pulls from it with Next / NextBatch. Every captured event that matches
/// a consumer's filter and predicate goes to one member of that consumer, chosen by
/// its selection policy (plus a shadow copy with WeightedShadowPolicy), so N consumers
/// of a stream each see the stream once, split over their members.
/// The payload is never copied: all deliveries share one Event.
///
/// Usage:
/// @code
///   absl::StatusOr<std::unique_ptr<inferq::Engine>> engine = inferq::Engine::Create();
///   (*engine)->AddStream({.name = "REQUESTS", .subjects = {"infer.*.request"}});
///   auto replicas = (*engine)->AddConsumer(
///       {.stream = "REQUESTS", .name = "replicas", .members = 4});
///   inferq::Event e;  e.subject = "infer.llama.request";
///   absl::StatusOr<inferq::PublishAck> ack = (*engine)->Publish(std::move(e));
///   // on replica thread i:
///   auto batch = replicas->member(i)->NextBatch(8, absl::Milliseconds(2));
///   for (inferq::Message& m : *batch) { ...; m.Ack(); }
/// @endcode
///
/// Semantics in this version (later versions deepen them):
///  - Retention kLimits keeps messages until a limit removes the oldest; kInterest
///    also removes a message once every explicit-ack consumer that received it has
///    acked it (a message no consumer matches is not kept at all).
///  - Limits: max_msgs, max_bytes (Event::StoredSize), max_age, max_msg_size. With
///    discard kOld the oldest messages make room (and are skipped if still queued in a
///    lane: a consumer never receives a message its stream has discarded); with kNew
///    the publish is rejected for that stream.
///  - max_age is applied when the stream is written, when a member pulls an event,
///    and by the engine's timer (at least every max_age / 8), so an idle stream
///    empties too.
///  - A consumer receives the stored messages its ConsumerConfig::deliver policy
///    picks (JetStream's DeliverPolicy; "new" by default: none), then the events
///    published after it was added; per stream, every member sees events in
///    sequence order.
///  - Memory: each stream's record of an event (the first stream's record holds the
///    Event that all deliveries share, in the same block) comes from FixedPools of the NUMA node of the first lane that will drain the event
///    (ConsumerConfig::member_nodes; else the publisher's node), with chunks from a
///    NumaArena bound to that node. Payload Buffers come from process-wide pools. In
///    steady state publish -> deliver -> ack allocates nothing from the general heap
///    (a test counts operator new), given subjects and strings short enough for the
///    small-string buffer and no header map growth.
///  - A full lane applies the consumer's OverflowPolicy: block (Publish waits until
///    the member pulls: backpressure; TryPublish refuses instead), reject, or
///    drop-oldest.
///  - Selection: each consumer has a SelectionPolicy (routing/selection.hpp; round
///    robin by default) and a MemberGroup that tracks each member's outstanding work
///    (queued + delivered, not yet acked), ack latency and health. A policy runs under
///    its consumer's own select lock, one Select at a time per consumer: a publish
///    takes that lock inside the stream's mutex, a redelivery or a move off a stalled
///    member takes only that lock. WeightedShadowPolicy's mirrored copies go to
///    shadow members; their acks count for the member's health only, never for the
///    message.
///  - Redelivery (ack_wait > 0): a delivery not acked within ack_wait, or nak'ed, is
///    a failure of its member and goes to a member chosen by the policy (not the same
///    one when another is eligible). A member that has work queued but pulled nothing
///    for ack_wait is stalled: its queued work is moved to other members, each item a
///    failure. The policy picks a redelivery or a move with the failed member shown
///    as ineligible (MemberGroup::Select's `avoid`), so an AffinityPolicy key moves
///    with it and the rest of its sequence follows, ejected member or not. Timers run on a
///    background thread (EngineOptions::manual_timers = false) or when RunTimers is
///    called. The first ack of any delivery of a message settles it (an old member's
///    late ack included; a copy still queued is then skipped); delivery is at least
///    once. Redelivery never takes the stream's mutex, so a nak or a timer run never
///    waits for a publisher blocked on a full lane.
///  - Giving up (JetStream semantics): backoff lists the ack wait per delivery;
///    max_deliver bounds the deliveries of one message; Term ends one at once. A
///    message given up goes to the consumer's dead_letter_subject with headers naming
///    the reason and delivery count (kDeadLetterReasonHeader ...). max_ack_pending
///    bounds the deliveries out, unacknowledged, per consumer.
///  - Scheduling: ConsumerConfig::batch forms NextBatch(timeout) batches (Triton's
///    dynamic batcher, adaptive window); ConsumerConfig::qos makes each lane a QoS
///    scheduler (tiers, DRR between tenants); queue_timeout / Event::ttl / deadline
///    expire queued events on a timer wheel (reject -> dead letter, or delay);
///    StreamConfig::duplicate_window drops re-published msg_ids; flow control's
///    throttle rides on every PublishAck.
///  - Function-in-flight: RegisterFunction serves a handler on engine threads;
///    Call returns a future completed by the reply, the error, or the timeout.
///  - Payload codecs: an event is stored as published (Event::codec,
///    dictionary_id). A consumer declares the codecs it accepts
///    (ConsumerConfig::accept_codecs; default: any, so it gets the payload as
///    stored). When a consumer does not accept the stored codec, Message::event()
///    gives it the event with its payload converted to its first accepted codec
///    (EngineOptions::codecs: zstd level, dictionaries). Publish converts once per
///    target codec, not once per consumer: one converted Event is shared by every
///    stream and consumer that needs that codec (EngineStats::codec_conversions counts
///    them). Conversion runs on the publishing thread before the event is stored,
///    outside the streams' mutexes (held only to read their consumers), only for
///    streams with a consumer that declares accept_codecs, and for the consumers
///    whose filter and predicate
///    match the event (both evaluated on the event as stored: a JSON content
///    predicate does not match a compressed payload). An empty payload is never
///    converted (it is the same in every codec). Limits count the payload as stored.
///
/// Errors (absl::Status): InvalidArgument for bad names, subjects, patterns and
/// configuration values (the message names the value); AlreadyExists for a duplicate
/// stream or consumer; NotFound for an unknown stream or a subject no stream captures;
/// ResourceExhausted when every capturing stream rejected a publish by its limits or
/// a full lane (overflow reject, TryPublish); InvalidArgument or FailedPrecondition
/// when a consumer needs the payload in another codec and it cannot be converted
/// (see Engine::Publish); DeadlineExceeded when Next found
/// nothing in time (or max_ack_pending left no slot); FailedPrecondition for a
/// second settle of one delivery; Cancelled after Close().
///
/// Thread safety: every method may be called from any thread at once. Publish takes
/// the mutex of each capturing stream (never a global lock) and reads the streams'
/// subject index without waiting for AddStream (a Left-Right pair of indexes: memory
/// linear in the streams' patterns). Consumer, Member and Message refer into the Engine, which
/// must outlive them. A Member should be drained by one thread at a time for per-
/// member order, but any number of threads may call Next on it safely.
///
/// The engine's types are split over five headers, all included by this one:
/// engine/config.hpp (StreamConfig, ConsumerConfig), engine/message.hpp (Message,
/// Member, Consumer, dead-letter headers), engine/stats.hpp (EngineStats and its
/// parts), engine/trace.hpp (Span, TraceSink, TraceOptions), and this one (Engine, EngineOptions, PublishAck, function-in-flight types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/base/clock.hpp"
#include "inferq/engine/config.hpp"
#include "inferq/engine/message.hpp"
#include "inferq/engine/stats.hpp"
#include "inferq/engine/trace.hpp"
#include "inferq/event/codec.hpp"
#include "inferq/event/event.hpp"
#include "inferq/event/event_view.hpp"
#include "inferq/memory/buffer.hpp"
#include "inferq/memory/topology.hpp"
#include "inferq/sched/flow_control.hpp"

namespace inferq {

class Lifecycle;

namespace engine_internal {
struct StreamState;
struct StoredMessage;
struct FunctionState;
/// A file stream that stored a publish: its log's sequence to sync, and the removed
/// log's tx of what max_msgs_per_subject took out for it (0: nothing).
struct SyncPoint {
  StreamState* stream = nullptr;
  std::uint64_t seq = 0;
  std::uint64_t removed_tx = 0;
};
}  // namespace engine_internal

/// The payload (absl::Status::GetPayload) on a TryPublish refusal from streams that
/// were all busy, not full by their limits or kReject lanes (PublishAck::streams_busy):
/// trying again later, or Publish, would store it. WouldBlock(status) tests for it.
inline constexpr char kWouldBlockPayload[] = "type.inferq.dev/would_block";
/// True when `status` is ResourceExhausted carrying kWouldBlockPayload.
inline bool WouldBlock(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kWouldBlockPayload).has_value();
}

/// Longest Event::msg_id Publish accepts, in bytes (InvalidArgument above it): ids are
/// kept in duplicate windows, so their size is bounded.
inline constexpr std::size_t kMaxMsgIdBytes = 1024;

/// A function served on engine threads (Engine::RegisterFunction). Gets the call
/// event (its subject, payload and headers as the caller made them; ttl = the call's
/// time limit) and returns the reply payload or an error; an error (or an exception,
/// taken as kInternal) fails this try. An error is a reply too: its payloads
/// (absl::Status::SetPayload, e.g. the bytes of a tool's error report) reach the
/// caller with the last try's error. Runs on one of the function's worker threads;
/// may block. Close() does not wait for a running handler, ~Engine does: what a
/// handler uses must outlive the Engine.
using FunctionHandler = std::function<absl::StatusOr<Buffer>(const Event& call)>;

/// Checks a call before it is queued (FunctionOptions::admit): OK admits it; an error
/// refuses it (an exception refuses it as Internal). Runs on the caller's thread,
/// inside StartCall and within the call's time limit; must not call the engine. It
/// sees the call as made, before the engine adds kCallIdHeader.
using CallAdmission = std::function<absl::Status(const Event& call)>;

/// How Engine::RegisterFunction serves a function.
struct FunctionOptions {
  std::uint32_t workers = 1;          ///< threads running the handler, 1..256
  std::size_t queue_capacity = 1024;  ///< calls queued per worker, 1..2^20
  std::int64_t max_deliver = 1;       ///< tries per call (a failed try is retried), 1..100
  /// The subjects (patterns allowed, e.g. "agent.tool.uber.>") calls of this function
  /// are published on; one function can so serve a family of tools, its handler
  /// telling them apart by the call's subject. Empty: {"fn.<fn_id>"}. At most 4096,
  /// each a valid pattern that cannot match a dead-letter subject of a function
  /// ("fn.*.dead"); InvalidArgument naming the first that breaks a rule.
  std::vector<std::string> subjects{};
  /// When set, StartCall refuses a call it returns an error for, before anything is
  /// queued: the call ends InvalidArgument ("call N to function 'F' on 'S' refused:
  /// <the error's message>") and goes to the function's dead-letter subject with
  /// reason "refused" and the message as its description; no handler runs.
  CallAdmission admit{};
};

/// A call in flight (Engine::StartCall): its id, for CancelCall, and the reply.
struct PendingCall {
  std::uint64_t id = 0;  ///< 0 when the call was refused by StartCall's own checks
  std::future<absl::StatusOr<Buffer>> reply;  ///< the reply payload, or the call's error
};

/// What a publish did: the streams that stored the event, where, and flow control's
/// advice to the producer.
struct PublishAck {
  std::uint64_t seq = 0;              ///< sequence in the first stream that stored it
  std::uint32_t streams_stored = 0;   ///< streams that stored the event
  /// Capturing streams that refused it: limits, a full lane, a failed payload
  /// conversion, no memory (as StreamStats::rejected).
  std::uint32_t streams_rejected = 0;
  /// Of streams_rejected: those TryPublish refused only because it does not wait (a
  /// full lane of a consumer with OverflowPolicy::kBlock, or the stream held by a
  /// Publish blocked on one): Publish would have stored the event there. 0 for Publish.
  std::uint32_t streams_busy = 0;
  std::uint32_t deliveries = 0;       ///< lanes the event was queued on
  /// The event's msg_id was accepted within a capturing stream's duplicate window:
  /// that stream (streams_duplicate counts them) did not store it again. Another
  /// capturing stream may have stored it (streams_stored). `seq` is the original
  /// sequence when the first capturing stream found the duplicate.
  bool duplicate = false;
  std::uint32_t streams_duplicate = 0;  ///< capturing streams that found it a duplicate
  /// EngineOptions::flow_control: min(1, 0.6·bp + 0.4·rt), 0 = full speed, 1 = stop
  /// (a producer slows down by this fraction), and 1 + 0.3·reward (Engine::SetReward),
  /// a factor for the producer's own weights. 0 and 1 without flow control.
  ///@{
  double throttle = 0;
  double weight_scale = 1;
  ///@}
};

/// What Engine::PublishBatch did with its events.
struct PublishBatchResult {
  /// Events published, from the front of the batch (each stored, or acknowledged as
  /// a duplicate, as Publish would have).
  std::size_t published = 0;
  /// OK when every event was published; otherwise Publish's error for
  /// events[published], which was not published (nor any event after it).
  absl::Status status;
};

/// What Engine::PublishAsync returns (JetStream's PubAckFuture): the event is stored
/// and queued already; Wait() returns its PublishAck once the sync policy of every
/// file stream that stored it is met (at once for memory streams, kNone and
/// kInterval), or the error Publish would have returned. A publisher that keeps many
/// in flight and waits for them in order shares fdatasyncs between them under
/// kGroupCommit and kEveryCommit (the first Wait syncs everything written by then),
/// which one synchronous Publish at a time cannot.
/// @code
///   std::vector<inferq::PublishAckFuture> window;
///   for (auto& e : events) window.push_back(*engine->PublishAsync(std::move(e)));
///   for (auto& f : window) if (auto ack = f.Wait(); !ack.ok()) ...;
/// @endcode
/// Not thread-safe: one thread waits on a future. Wait may be called once; a second
/// call returns FailedPrecondition. The Engine must outlive it.
class PublishAckFuture {
 public:
  PublishAckFuture() = default;
  /// Movable, not copyable.
  ///@{
  PublishAckFuture(PublishAckFuture&&) noexcept = default;
  PublishAckFuture& operator=(PublishAckFuture&&) noexcept = default;
  ///@}
  /// The PublishAck once the event is durable as the sync policies say, or the error
  /// (see the class comment); FailedPrecondition for a second call or a
  /// default-constructed future.
  absl::StatusOr<PublishAck> Wait();

 private:
  friend class Engine;
  absl::StatusOr<PublishAck> ack_ = absl::FailedPreconditionError("an empty PublishAckFuture");
  std::vector<engine_internal::SyncPoint> syncs_;
  bool waited_ = false;
};

/// What Engine::PurgeStream removes (JetStream's purge request): the messages that
/// match `subject`, all of them, or those below `sequence`, or all but the newest
/// `keep`. At most one of `sequence` and `keep` may be set.
struct PurgeRequest {
  std::string subject{};       ///< a subject pattern; empty = every message
  std::uint64_t sequence = 0;  ///< only sequences below it (not including it); 0 = any
  std::uint64_t keep = 0;      ///< keep the newest `keep` that match; 0 = none
};

/// How the engine converts payloads for consumers (ConsumerConfig::accept_codecs).
struct EngineCodecOptions {
  /// zstd level, 1..22, of conversions to kZstd without a dictionary.
  int zstd_level = 3;
  /// Dictionaries that payloads published with Event::dictionary_id != 0 are
  /// decompressed with (nullptr = none: such a payload cannot be converted).
  std::shared_ptr<const ZstdDictionaries> dictionaries{};
  /// Conversions to kZstd compress with this dictionary of `dictionaries` (at the
  /// dictionary's level); 0 = none.
  std::uint32_t compress_dictionary_id = 0;
  /// Largest payload, in bytes after decompression, a conversion produces (a guard
  /// against decompression bombs).
  std::size_t max_payload_bytes = std::size_t{256} << 20;
};

/// How an Engine runs: its clock, topology, timers, flow control, lifecycle, payload
/// conversion and tracing (Engine::Create).
struct EngineOptions {
  /// Clock for publish timestamps, max_age, latency statistics, span times, and every
  /// timer the engine runs: consumers' ack_wait and backoff, delayed naks,
  /// queue_timeout and Event::ttl, stalled members, the member groups' ejection times,
  /// ReplayPolicy::kOriginal's pacing, NextBatch's max_queue_delay, and function call
  /// timeouts (Engine::Call, StartCall); nullptr = the steady clock. Waiting (Next
  /// timeouts) always uses real time, and Event::deadline, a call's deadline and
  /// DeliverPolicy::kByStartTime are wall-clock times (absl::Now), mapped onto this
  /// clock by their distance from now. A Lifecycle's timeouts run on its own clock
  /// (LifecycleOptions::clock).
  const Clock* clock = nullptr;
  /// The machine's NUMA layout; nullptr = Topology::Detect(). A synthetic topology
  /// (tests) gets one set of pools per pretend node, from operator new.
  const Topology* topology = nullptr;
  /// True: no background timer thread; what RunTimers() does (ack_wait expiries,
  /// delayed naks, queue and call timeouts, stalled members, ...) is done only when it
  /// is called (tests with a ManualClock).
  bool manual_timers = false;
  /// Dual-channel flow control (sched/flow_control.hpp): the memory
  /// channel is the bytes all streams keep, the response-time channel the highest
  /// recent publish -> deliver delay of any lane (an EWMA, alpha 1/8, per lane). The
  /// timer updates them; every PublishAck carries the throttle and weight scale.
  /// nullopt = off (throttle 0, weight scale 1). Values DualChannelController::Validate
  /// refuses make Engine::Create return its InvalidArgument.
  std::optional<FlowControlConfig> flow_control{};
  /// When set, the engine's timer also calls lifecycle->RunTimeouts() (warmup and
  /// inference timeouts of engine/lifecycle.hpp). Must outlive the Engine.
  Lifecycle* lifecycle = nullptr;
  /// Payload conversion for consumers' accept_codecs. Engine::Create returns
  /// InvalidArgument (naming the value) for a zstd_level outside 1..22, a
  /// max_payload_bytes of 0, or a compress_dictionary_id not in `dictionaries`.
  EngineCodecOptions codecs{};
  /// Spans of each stage (publish, queue wait, delivery, settle, dead letter) to
  /// trace.sink, sampled by trace.sample_ratio (engine/trace.hpp). No sink = off:
  /// events keep their trace as published and no span is made.
  TraceOptions trace{};
};

/// Streams, consumers and delivery inside one process (see the file comment).
class Engine {
 public:
  /// Checks `options` and starts an engine. Its timer thread starts here when flow
  /// control or a lifecycle needs one, else at the first AddConsumer (never with
  /// manual_timers). InvalidArgument naming the field and value for a
  /// codecs.zstd_level outside 1..22, a codecs.max_payload_bytes of 0, a
  /// codecs.compress_dictionary_id not in codecs.dictionaries, a flow_control
  /// that DualChannelController::Validate refuses, or a trace.sample_ratio outside
  /// 0..1 (NaN included).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options = {});
  ~Engine();  ///< Close()s, then frees everything
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// InvalidArgument for a bad name, no subjects, a bad pattern, or a bad limit
  /// (StreamConfig::Validate, checked first); AlreadyExists for a taken name;
  /// Cancelled after Close(). A file stream (StorageType::kFile): InvalidArgument for
  /// a directory that holds or lies in another file stream's of this engine (also
  /// one being added meanwhile); its log's errors (FailedPrecondition for a
  /// directory open elsewhere, DataLoss for damage), naming the stream.
  absl::Status AddStream(const StreamConfig& config);

  /// Changes a stream's limits: max_msgs, max_bytes, max_age, max_msg_size,
  /// max_msgs_per_subject and discard take `config`'s values, and what the new
  /// limits no longer allow is removed at once (the oldest first; per subject for
  /// max_msgs_per_subject), as a limit removes it (StreamStats::discarded; queued
  /// deliveries of it are skipped). Every other field must equal the stream's.
  /// InvalidArgument for what StreamConfig::Validate refuses, and naming the field
  /// for a change of any other field; NotFound for an unknown stream;
  /// FailedPrecondition when an interest-retention stream would start or stop
  /// keeping an index of its messages (see StreamConfig::retention); Cancelled after
  /// Close(). A file stream's limits are not kept in its directory: the next
  /// AddStream's config sets them again. What the update removed stays removed after
  /// a restart (also a crash), whatever the next run's limits: max_msgs_per_subject's
  /// removals and the new front of max_msgs, max_bytes or max_age are recorded in
  /// `<directory>/removed` before UpdateStream returns. Raising max_msgs_per_subject on a file
  /// stream, or setting it, reads every record the stream holds back from the log;
  /// a record that cannot be read fails the update (DataLoss naming it) and changes
  /// nothing. Waits for the stream's mutex (a publisher blocked on a full lane of
  /// the stream holds it).
  absl::Status UpdateStream(const StreamConfig& config);

  /// Removes the messages `request` selects from stream `stream` (JetStream's
  /// purge) and returns how many it removed (StreamStats::purged counts them).
  /// Queued deliveries of a removed message are skipped; one a member holds may
  /// still be acked. The stream's sequence goes on, and so does its duplicate
  /// window: a msg_id accepted within it is still a duplicate after the purge, also
  /// after a restart of a file stream. A file stream records the purge in its
  /// directory's "purges" file (written, fdatasync'ed and renamed into place before
  /// anything is removed) and recovery applies it again, so that a purged message
  /// never comes back; a purge by subject reads each message's subject back from
  /// the log. InvalidArgument for a subject that is not a valid pattern or both
  /// `sequence` and `keep` set (naming them); NotFound for an unknown stream;
  /// FailedPrecondition for a stream that keeps no index of its messages (as
  /// GetMessage); a file stream's I/O errors (writing the purges file; DataLoss for
  /// a record whose subject cannot be read), naming the stream, and nothing is
  /// removed then, except when only the fsync of the directory failed after the
  /// file was renamed into place: then the purge is made (a restart would apply
  /// it) and the error says "purged N message(s), but the purge may not survive a
  /// power loss: ..."; Cancelled after Close(). Waits for the stream's mutex.
  absl::StatusOr<std::uint64_t> PurgeStream(std::string_view stream,
                                            const PurgeRequest& request = {});

  /// InvalidArgument for what ConsumerConfig::Validate refuses (checked first: a bad
  /// name, filter, member count, lane capacity, group options, an accept_codecs
  /// entry that is not a PayloadCodec or is repeated, a negative or too long
  /// ack_wait, a setting that needs explicit acks (ack_wait, backoff, max_deliver,
  /// max_ack_pending, dead_letter_subject) with AckPolicy::kNone (the message names
  /// the field), a selection policy built for another group size), and for a
  /// filter_subject that no subject of the stream can match, a member_nodes entry
  /// that is not a node of EngineOptions::topology, or a selection policy already
  /// used by another consumer; NotFound for an unknown stream; AlreadyExists for a
  /// taken name; Cancelled after Close(). A consumer of a file stream (durable): the
  /// error of its ack log (opening, replaying, compacting it, or writing and
  /// fdatasyncing a new consumer's start), naming the consumer; nothing is added
  /// then. A message its ack log says was delivered max_deliver times is
  /// dead-lettered ("max_deliver") instead of queued. If the exact start (written
  /// under the stream's mutex, after the synced provisional one) fails, the consumer
  /// is added failed: its pulls return FailedPrecondition naming the failure.
  absl::StatusOr<Consumer> AddConsumer(const ConsumerConfig& config);

  /// Deletes consumer `name` of stream `stream` (JetStream's consumer delete). From
  /// its return:
  /// - the stream queues nothing more for it, and what was queued is dropped: a Next
  ///   or NextBatch of its members (one waiting too) returns Cancelled ("consumer
  ///   'c' of stream 'S' was deleted");
  /// - a Message it delivered can no longer be settled: Ack, AckSync, Nak and Term
  ///   return FailedPrecondition naming the consumer;
  /// - interest retention stops waiting for its acks (a message no other consumer
  ///   waits for goes), also for what a run of the timers had in hand (the call
  ///   waits for that run), except a Message of a consumer without ack_wait that
  ///   is out with a member, which lets go when it is settled or destroyed, and what
  ///   a call of its members still running holds, which lets go before it returns; a work
  ///   queue keeps its unacked messages for the next consumer; it is no longer in
  ///   EngineStats;
  /// - a durable consumer's ack log (`<directory>/consumers/<name>`) is gone, so a
  ///   consumer added under the name later starts afresh.
  ///
  /// Its Consumer and Member handles stay valid (their calls fail as above): the
  /// engine keeps the consumer's small state until it is destroyed, not its queued
  /// messages. NotFound for an unknown stream or consumer; FailedPrecondition for the
  /// consumer of a registered function; Cancelled after Close(). A file stream's
  /// error removing the ack log, naming it: the consumer is deleted all the same,
  /// and the next recovery of the stream removes what is left.
  absl::Status DeleteConsumer(std::string_view stream, std::string_view name);

  /// Deletes stream `name` and its consumers (JetStream's stream delete). From its
  /// return no publish stores into it (one racing the delete gets NotFound "stream
  /// 'S' was deleted", or is routed as if the stream never existed), its consumers
  /// are deleted as by DeleteConsumer, its messages are gone (a Message out with a
  /// member keeps its own event), and a file stream's directory is removed, so that
  /// a stream added later over it starts empty. The engine keeps the stream's small
  /// state until it is destroyed, not its messages. NotFound for an unknown stream;
  /// FailedPrecondition for the stream of a registered function ("FN_<id>",
  /// "FN_<id>_DLQ"); Cancelled after Close(). The error removing the directory,
  /// naming it: the stream is deleted all the same. Waits for the stream's mutex.
  absl::Status DeleteStream(std::string_view name);

  /// Stores `event` in every stream that captures its subject and queues it for each
  /// of their matching consumers. InvalidArgument for an invalid subject, ttl or qos,
  /// a msg_id longer than kMaxMsgIdBytes,
  /// an Event::codec that is not a PayloadCodec, or codec kNone with a dictionary_id;
  /// NotFound when no stream captures it; ResourceExhausted (or InvalidArgument for
  /// max_msg_size) when every capturing stream refused it, with the first refusal's
  /// reason; Cancelled after Close(). Partial refusals are counted in the ack.
  /// A Publish that Close() interrupts (one blocked on a full lane with overflow
  /// block) may have stored the event already: it returns Cancelled "engine closed
  /// during publish: stored as sequence N but not queued for K consumer(s)", and
  /// the event counts in EngineStats::published and the stream's stats.
  /// A file stream (StreamConfig::storage) returns its log's error: the write's
  /// (nothing stored there), or the fdatasync's, "stream 'S': message stored as
  /// sequence N is not durable: ..." (the message is stored and queued; it survives a
  /// crash of the process, perhaps not a power loss: publish it again with the same
  /// msg_id after a restart if it must survive one); either fails the stream's log,
  /// and later publishes to it are refused (FailedPrecondition quoting the first
  /// error).
  /// Payload conversion (ConsumerConfig::accept_codecs) is done before anything is
  /// stored; when it fails nothing is stored and Publish returns FailedPrecondition
  /// if the payload's dictionary is not in EngineOptions::codecs.dictionaries (the
  /// message names the id), else InvalidArgument (a corrupt or truncated zstd
  /// payload, a frame naming another dictionary than dictionary_id, a payload over
  /// codecs.max_payload_bytes), naming the consumer and the codecs. Two exceptions
  /// convert under the stream's mutex instead, and a failure there makes that stream
  /// alone refuse the event (counted in PublishAck::streams_rejected, like a limit):
  /// a consumer added while the publish runs, and dead letters (which never wait for
  /// a stream's mutex). The conversion is made before the duplicate window is
  /// checked, so a duplicate that needs one is converted (and counted) in vain.
  absl::StatusOr<PublishAck> Publish(Event event);

  /// Publish that never waits: a full lane of a consumer with OverflowPolicy::kBlock
  /// refuses the publish for that stream as kReject does (ResourceExhausted naming the
  /// consumer and member; nothing stored there), and so does a stream whose mutex a
  /// Publish blocked on a full lane holds (ResourceExhausted: "a Publish is blocked
  /// on a full lane"). Such streams count in PublishAck::streams_busy; when every
  /// capturing stream refused and all of them were busy, the ResourceExhausted carries
  /// kWouldBlockPayload (WouldBlock(status) is true): the caller may try again. It may spin (yielding) while another publisher holds a
  /// stream's mutex for its short critical section, never for a lane to drain.
  /// Otherwise as Publish.
  absl::StatusOr<PublishAck> TryPublish(Event event);

  /// TryPublish of each of `events` in order, with the wake-ups of sleeping pullers
  /// held back to the end: a lane that received k of the events wakes up to k
  /// pullers asleep on it once, not once per event (one futex wake, and one context
  /// switch of the puller, for a burst such as a batch a bridge fetched). A puller
  /// that is awake, or about to sleep, sees each event as soon as it is queued. An
  /// event stored in a file stream whose sync policy the publish waits for wakes
  /// the pullers of everything queued so far before that wait.
  /// Stops after the first event that is not stored in every stream capturing it (an
  /// error, or PublishAck::streams_rejected > 0), so that nothing after a refused
  /// event overtakes it: one result per event tried, in order, every one but the last
  /// an OK PublishAck with streams_rejected == 0. The events after the last one tried
  /// are left as they were (the tried ones are moved from). Empty for no events.
  std::vector<absl::StatusOr<PublishAck>> TryPublishBatch(std::span<Event> events);

  /// Publishes each of `events` in order as Publish does (waiting as it waits; each
  /// event is moved from), with what consecutive events share done once: events
  /// that go to the same one memory stream in a row are stored under one hold of its
  /// mutex, and the wake-ups of sleeping pullers are held back until the run ends (or
  /// until the batch would wait for a full lane: a publisher never waits for a
  /// puller it did not wake), as TryPublishBatch holds them. Stops at the first
  /// event Publish would return an error for: `published` events were published
  /// (their PublishAcks in acks[0, published) when `acks` is given), `status` is the
  /// error of events[published] (OK when all were), and the events after it are
  /// left as they were. InvalidArgument, with nothing published, when `acks` is
  /// neither empty nor at least events.size() long.
  /// @code
  ///   std::vector<inferq::Event> tokens = ...;   // one decode step's tokens
  ///   inferq::PublishBatchResult r = engine->PublishBatch(tokens);
  ///   if (!r.status.ok()) ...;                   // tokens[r.published] failed
  /// @endcode
  PublishBatchResult PublishBatch(std::span<Event> events, std::span<PublishAck> acks = {});

  /// Publish of an event given as views (event/event_view.hpp): the engine copies
  /// the fields straight into the message it stores, once, where Publish(Event)
  /// moves an Event into the message (and into its parameter first, from a named
  /// one), then destroys the moved-from Events (BENCHMARKS.md has what that saves:
  /// under 100 instructions per event). The same checks, errors,
  /// waiting and results as Publish(Event); and InvalidArgument, with nothing
  /// stored, for a view that sets both `payload` and `shared_payload`
  /// (EventView::Validate). Nothing refers to the viewed memory after it returns.
  /// ResourceExhausted when memory for the copy runs out. (A name of its own, not an
  /// overload of Publish: Event and EventView are both aggregates, so
  /// `Publish({.subject = ...})` or `PublishBatch({})` would be ambiguous.)
  absl::StatusOr<PublishAck> PublishView(const EventView& view);

  /// PublishBatch of events given as views: as PublishBatch(std::span<Event>), each
  /// event copied as PublishView(const EventView&) copies it. `views` is left as it was.
  PublishBatchResult PublishViewBatch(std::span<const EventView> views, std::span<PublishAck> acks = {});

  /// Publish without waiting for file streams' sync policies (JetStream's
  /// PublishAsync): stores and queues `event` as Publish does, waiting as Publish
  /// for room and mutexes, and returns once it is written to the OS; the future's
  /// Wait() returns the PublishAck when it is durable by the policies (see
  /// PublishAckFuture). Errors that Publish returns before the sync (bad input,
  /// refusals, a failed write) are returned here; an fdatasync's is returned by Wait.
  absl::StatusOr<PublishAckFuture> PublishAsync(Event event);

  /// Function-in-flight. RegisterFunction serves `fn_id` on
  /// `options.workers` engine threads: it adds stream "FN_<fn_id>" (subjects
  /// options.subjects, default "fn.<fn_id>"), its consumer "handler" (least loaded
  /// over the workers, max_deliver from the options, dead letters to
  /// "fn.<fn_id>.dead"), and stream "FN_<fn_id>_DLQ" on that subject (the last 10,000
  /// dead letters). A call is published into its function's stream alone: another
  /// stream whose subjects match, or another function serving the same subject, never
  /// sees it. fn_id: 1..48 of [A-Za-z0-9_-]. InvalidArgument for a bad
  /// id or option (naming it); AlreadyExists when registered; Cancelled after Close().
  absl::Status RegisterFunction(std::string_view fn_id, FunctionHandler handler,
                                FunctionOptions options = {});
  /// Calls `fn_id` with `payload`: publishes the call event (subject "fn.<fn_id>",
  /// ttl = `timeout`, header kCallIdHeader) and returns a future of the reply
  /// payload. The future gets: the handler's reply; or, when every try failed, the
  /// last try's error (its code, the message prefixed with the function and tries);
  /// or DeadlineExceeded when `timeout` passed first (queued or running; a reply
  /// that comes later is dropped). Failures and timeouts also land in the
  /// function's dead-letter subject (kDeadLetterReasonHeader "max_deliver" or
  /// "expired"; "refused" for a call FunctionOptions::admit refuses).
  /// InvalidArgument for a timeout not in (0, 365 days]; NotFound for an
  /// unknown function; Cancelled when the engine closes first. The timeout runs on
  /// the engine clock and its timers (RunTimers with manual_timers).
  /// Call never waits for room: a call that finds its function's queue full (every
  /// worker's queue_capacity taken) waits off the caller's thread, in arrival order,
  /// for room, at most until its timeout; then its future ends DeadlineExceeded
  /// ("queued", 0 tries) and the handler never sees it. FunctionOptions::admit runs
  /// on the caller's thread, inside the call's time limit. Call never throws.
  std::future<absl::StatusOr<Buffer>> Call(std::string_view fn_id, Buffer payload,
                                           absl::Duration timeout);

  /// Call with the whole call event and a handle: publishes `call` (subject,
  /// payload, headers, tenant and the other attributes as given) as the call of
  /// `fn_id`. `call.subject` must be one the function serves (empty: its first
  /// subject, which must then be literal); InvalidArgument naming both otherwise. The
  /// call's time limit is call.ttl (> 0, up to 365 days) or call.deadline (wall
  /// clock), whichever ends first; InvalidArgument when neither is set, and
  /// DeadlineExceeded at once when the deadline has passed. FunctionOptions::admit
  /// runs next (a refusal ends the call InvalidArgument, see there). Otherwise as
  /// Call, whose errors the reply gets in the same cases; PendingCall::id is 0 only
  /// for the errors found before the call got an id (bad arguments, unknown
  /// function, closed engine, and what Publish would refuse: a bad qos, codec or
  /// msg_id).
  PendingCall StartCall(std::string_view fn_id, Event call);
  /// Cancels call `id` (an agent whose user went away): its reply ends Cancelled
  /// ("call N to function 'F' cancelled: <reason>"), a queued copy is dropped
  /// unrun when a worker reaches it, and a running handler's result is dropped (the
  /// handler is not interrupted). Nothing goes to the dead-letter subject: the caller
  /// asked. NotFound when no call `id` is open (it ended, or never was).
  absl::Status CancelCall(std::uint64_t id, std::string_view reason = "cancelled by the caller");

  /// Closes every lane: blocked publishers and pullers wake; pulls drain what is
  /// queued and then return Cancelled; later publishes return Cancelled. A pull of a
  /// consumer at max_ack_pending returns Cancelled at once (a closed engine hands out
  /// no more than its limit, and waiting for acks that may never come would keep
  /// workers from ending), naming how many events are still queued; once acks bring
  /// the consumer under its limit, pulls drain those as well. Open calls
  /// (Engine::Call) end Cancelled before Close returns. Close does not wait for
  /// function handlers still running: their late results are dropped, and ~Engine
  /// waits for them to return (a handler must not block forever). Idempotent.
  void Close();

  /// Runs due timers now: removes the messages older than their stream's max_age,
  /// redelivers deliveries whose ack_wait expired, moves work off stalled members,
  /// releases delayed naks, updates flow control and the lifecycle's timeouts. The
  /// background thread calls it every min over explicit-ack consumers of (first
  /// ack_wait / 4), clamped to 1 ms .. 100 ms, and over streams with max_age of
  /// (max_age / 8), clamped to 1 ms .. 1 s, or every 100 ms when there is none (the
  /// interval only shrinks as consumers and streams are added); a delayed nak wakes
  /// it early. With manual_timers, tests call it.
  void RunTimers();

  /// The message stored as sequence `seq` in stream `stream` (JetStream's get
  /// message by sequence): its event, shared with its deliveries, not copied; on a
  /// file stream read back from its log (a new copy, read after the stream's mutex
  /// is let go). NotFound naming the stream for an unknown stream, and naming both
  /// for a sequence it gave out and no longer holds (removed by a limit, max_age, a
  /// purge, or the acks of its retention); OutOfRange naming both and the stream's
  /// last sequence for a sequence past it (never given out: a stream deleted and
  /// added again under the same name starts again at 1); InvalidArgument for seq 0; FailedPrecondition
  /// for a stream that keeps no index of its messages (interest retention without
  /// max_age, without max_msgs_per_subject and without max_msgs or max_bytes under
  /// discard old: StreamConfig::retention); on a file
  /// stream, DataLoss naming the stream, its directory and the sequence when the
  /// log's bytes there are not the record (or the read's I/O error). Waits for the
  /// stream's mutex (a publisher blocked on a full lane of the stream holds it).
  absl::StatusOr<std::shared_ptr<const Event>> GetMessage(std::string_view stream,
                                                          std::uint64_t seq) const;

  /// A snapshot of the engine's figures, its streams' and consumers', and those of
  /// the attached sources (engine/stats.hpp). Any thread.
  EngineStats Stats() const;

  /// What fills a component's figures (AddStatsSource).
  using StatsSource = std::function<void(ComponentStats& out)>;
  /// Attaches a component's figures to Stats() (EngineStats::components): `source`
  /// fills the ComponentStats it is given (its name already set to `name`) each time
  /// a snapshot is taken, on the thread calling Stats(). It must be quick, must not
  /// call this engine's Stats(), and must not throw. Returns an id for
  /// RemoveStatsSource. InvalidArgument for an empty name or one over 256 bytes, or
  /// an empty function; AlreadyExists when a source of that name is attached.
  absl::StatusOr<std::uint64_t> AddStatsSource(std::string name, StatsSource source);
  /// Detaches source `id`; when it returns, the source is not running and is never
  /// called again. NotFound for an id not attached.
  absl::Status RemoveStatsSource(std::uint64_t id);

  /// The reward channel of flow control, in [-1, 1] (sched/flow_control.hpp).
  /// InvalidArgument outside it or NaN, and FailedPrecondition without
  /// EngineOptions::flow_control; nothing changes then.
  absl::Status SetReward(double reward);

 private:
  explicit Engine(EngineOptions options);  ///< `options` checked by Create
  struct Impl;
  // kWait: Publish; kTry: TryPublish; kCall: a call's event (FlushCalls: as kTry,
  // but a refusal for want of room is not counted, the call waits); kInternal: dead
  // letters (never waits, never refuses for a full lane: parks the delivery).
  friend class PublishAckFuture;  // SyncStored
  enum class PublishMode { kWait, kTry, kCall, kInternal };
  /// `only`: publish into that stream alone (a deferred dead letter, FlushOutbox).
  /// `deferred`: the file streams' syncs are left there (PublishAsync) instead of
  /// made before returning.
  absl::StatusOr<PublishAck> Publish(Event&& event, PublishMode mode,
                                     engine_internal::StreamState* only = nullptr,
                                     std::vector<engine_internal::SyncPoint>* deferred = nullptr);
  /// Publish's work, without its span (Publish makes it around this when tracing).
  /// `premade`: the record that `event` lives in (a view's publish made it first),
  /// which the first stream that stores the event takes from there instead of
  /// moving the event; nullptr: none.
  absl::StatusOr<PublishAck> PublishEvent(Event&& event, PublishMode mode,
                                          engine_internal::StreamState* only,
                                          std::vector<engine_internal::SyncPoint>* deferred,
                                          std::shared_ptr<engine_internal::StoredMessage>* premade = nullptr);
  /// PublishBatch's loop: over `events`, or when `views` is not empty over copies of
  /// those (PublishViewBatch). One loop for both, not a template: a second copy of
  /// it (and of the publish path it inlines) cost the Event batches ~80 instructions
  /// per event in GCC's inlining elsewhere (BENCHMARKS.md, sixth part).
  PublishBatchResult PublishRun(std::span<Event> events, std::span<const EventView> views,
                                std::span<PublishAck> acks);
  /// `refusal`, returned by PublishView or PublishViewBatch for `view` before the
  /// event reached Publish's path; traced as a refused Publish(Event) is.
  absl::Status RefuseView(const EventView& view, absl::Status refusal);
  /// A record holding a copy of `view`'s event (PublishView(const EventView&)); nullptr
  /// when memory ran out.
  std::shared_ptr<engine_internal::StoredMessage> MakeRecord(const EventView& view);
  /// Syncs each of `syncs` as its stream's policy says; the first error, naming the
  /// stream and the sequence.
  static absl::Status SyncStored(std::span<const engine_internal::SyncPoint> syncs);
  /// Publishes the dead letters that found their stream's mutex taken.
  void FlushOutbox();
  /// Publishes the calls of a function that wait for room in its queue, in order,
  /// until one finds it full (Engine::Call never waits).
  void FlushCalls(engine_internal::FunctionState& fn);
  void FlushCallsOnce(engine_internal::FunctionState& fn);  ///< by the one flusher
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq
