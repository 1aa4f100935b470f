/// @file inferq/engine/config.hpp
///
/// StreamConfig and ConsumerConfig: what Engine::AddStream and Engine::AddConsumer
/// take, the policy enums they use, and their Validate checks.
///
/// Usage:
/// @code
///   inferq::StreamConfig s{.name = "REQUESTS", .subjects = {"infer.*.request"}};
///   inferq::ConsumerConfig c{.stream = "REQUESTS", .name = "replicas", .members = 4};
///   if (absl::Status st = inferq::ConsumerConfig::Validate(c); !st.ok()) { ... }
///   engine->AddStream(s);
///   engine->AddConsumer(c);
/// @endcode
///
/// Validate checks a configuration alone: names (base/limits.hpp ValidateName),
/// patterns, ranges (timer durations up to kMaxDuration, 365 days; a stream's
/// max_age is any finite duration) and combinations of
/// fields. AddStream / AddConsumer call it first, then check what needs the engine:
/// the stream exists, the name is free, the filter overlaps the stream's subjects,
/// member_nodes are nodes of the engine's topology, the selection policy object is
/// not another consumer's.
///
/// Thread safety: plain values; Validate is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inferq/event/codec.hpp"
#include "inferq/routing/predicate.hpp"
#include "inferq/routing/selection.hpp"
#include "inferq/sched/batcher.hpp"
#include "inferq/sched/qos_scheduler.hpp"
#include "inferq/state/state_store.hpp"

namespace inferq {

class Lifecycle;  // engine/lifecycle.hpp

/// What a stream at a limit does with a publish (StreamConfig::discard): kOld removes
/// its oldest messages to make room, kNew refuses the publish.
enum class DiscardPolicy { kOld, kNew };
/// When a stream lets a message go: see StreamConfig::retention.
enum class RetentionPolicy { kLimits, kInterest, kWorkQueue };
/// Whether members settle what they get: kExplicit (Message::Ack, Nak, Term) or kNone
/// (a delivery is settled when it is handed out).
enum class AckPolicy { kExplicit, kNone };
/// Where a stream keeps its messages. kMemory: in the process only. kFile: also in a
/// segmented log in StreamConfig::directory (state/stream_log.hpp: the Delta-State
/// Log's frames, checksums and torn-tail rules), recovered when a stream of that
/// directory is added again, in this process or the next.
enum class StorageType { kMemory, kFile };
/// Which stored messages a new consumer starts with (JetStream's DeliverPolicy).
///  - kNew              none: only what is published after it was added
///  - kAll              every message the stream holds, then the new ones
///  - kLast             the newest message it matches, then the new ones
///  - kLastPerSubject   the newest message of each subject it matches, in sequence order
///  - kByStartSequence  the messages from ConsumerConfig::start_seq on
///  - kByStartTime      the messages stored at or after ConsumerConfig::start_time;
///                      as in JetStream, a start_time after the newest message (even
///                      one in the future) starts after it: every message published
///                      from then on comes, whatever its publish time
///
/// Stored messages are queued for it in sequence order before any message published
/// after it was added.
enum class DeliverPolicy { kNew, kAll, kLast, kLastPerSubject, kByStartSequence, kByStartTime };
/// How fast a consumer gets the stored messages it starts with (JetStream's
/// ReplayPolicy). kInstant: as fast as its lanes take them. kOriginal: at the pace
/// they were published: the k-th comes (publish time of k - publish time of the
/// first) after the consumer was added, on the engine clock (its timer wakes for
/// each), e.g. for a shadow consumer that checks a new model on yesterday's traffic.
/// Events published while it replays queue behind the replay, paced the same way.
enum class ReplayPolicy { kInstant, kOriginal };
/// What Publish does when the lane chosen for a consumer is full.
///  - kBlock       wait until the member pulls (backpressure on the publisher);
///                 TryPublish refuses instead (ResourceExhausted, nothing stored).
///  - kReject      refuse the publish for that stream: ResourceExhausted naming the
///                 consumer and member; nothing is stored in that stream.
///  - kDropOldest  drop the oldest delivery queued on that lane to make room (counted in
///                 ConsumerStats::dropped; the dropped delivery is settled, not redelivered).
enum class OverflowPolicy { kBlock, kReject, kDropOldest };

/// What a consumer does with an event whose queue timeout passed before a member took
/// it (Triton's timeout_action): kReject gives it up (dead letter, reason "expired");
/// kDelay keeps it, behind what was queued when it expired (it is moved to the back
/// of its lane once).
enum class TimeoutAction { kReject, kDelay };

/// A stream: its subjects, limits, retention, duplicate window and storage
/// (Engine::AddStream).
struct StreamConfig {
  std::string name{};                 ///< 1..64 of [A-Za-z0-9_-], unique in the engine
  std::vector<std::string> subjects{};  ///< subject patterns; at least one
  std::int64_t max_msgs = -1;         ///< messages kept; -1 = no limit, else > 0
  std::int64_t max_bytes = -1;        ///< bytes kept (Event::StoredSize); -1 or > 0
  /// Zero = no limit; else any positive finite duration (not capped at 365 days).
  /// Negative or infinite is InvalidArgument. Messages older than max_age are
  /// removed when the stream is written and by the engine's timer, which then runs
  /// at least every max_age / 8 (within 1 ms .. 1 s; with manual_timers, at each
  /// RunTimers), so an idle stream empties too; queued deliveries of a removed
  /// message are skipped.
  absl::Duration max_age = absl::ZeroDuration();
  std::int64_t max_msg_size = -1;     ///< bytes per message; -1 or > 0
  /// Messages kept per subject (JetStream's MaxMsgsPerSubject; 1 = the last value of
  /// each subject): a publish on a subject that holds this many removes its oldest,
  /// counted in StreamStats::discarded. -1 = no limit, else > 0. Each subject that
  /// holds messages costs an entry in memory (its name and 8 bytes per message). A
  /// file stream records each removal in `<directory>/removed` (so a later run with a
  /// higher limit, or none, does not bring it back) and rebuilds the entries at
  /// recovery from its records' subjects.
  std::int64_t max_msgs_per_subject = -1;
  DiscardPolicy discard = DiscardPolicy::kOld;  ///< at a limit: drop the oldest, or refuse
  /// kLimits keeps messages until a limit removes them. kInterest keeps a message
  /// until every consumer that took it has acked it (or, with AckPolicy::kNone, had it
  /// queued); its memory goes when the last delivery ends (the last Message is
  /// destroyed), except that a stream with max_age, with max_msgs_per_subject, or
  /// with max_msgs or max_bytes under discard old keeps an index of its messages and
  /// frees one only when a later publish (with max_age, also the timer) trims it
  /// from the front. An interest stream with none of these keeps no index:
  /// Engine::GetMessage and PurgeStream refuse it (FailedPrecondition), and
  /// StreamStats::first_seq is 0. Every other stream keeps one.
  /// kWorkQueue (JetStream's WorkQueuePolicy) keeps a message until the one consumer
  /// whose filter matches it acks it (or gives it up: a dead letter, drop-oldest),
  /// and keeps a message no consumer matches until one is added: each consumer of a
  /// work queue must ack explicitly, start with DeliverPolicy::kAll, and have a
  /// filter no other consumer's overlaps (AddConsumer refuses it otherwise). A file
  /// stream records each ack that removes a message in `<directory>/removed` (a log of
  /// its own, under the stream's sync policy), so an acked message never comes back
  /// after a restart, whichever consumer is added first.
  RetentionPolicy retention = RetentionPolicy::kLimits;
  /// Duplicate window (JetStream's): a publish whose Event::msg_id (exact bytes) this
  /// stream accepted less than this long ago is acknowledged with the original
  /// sequence and PublishAck::duplicate, and not stored again. The window runs from
  /// the first acceptance; duplicates do not extend it. Zero = off; at most 365 days.
  /// Events with an empty msg_id are never duplicates. A file stream keeps the whole
  /// window across restarts, whether or not its messages are still stored: the ids of
  /// messages whose log segment goes (a work queue's acks, limits, purges) are first
  /// saved in `<directory>/dedup`, under the stream's sync policy, and that log drops
  /// them once their window ended.
  absl::Duration duplicate_window = absl::Minutes(2);
  /// Most ids the duplicate window holds, 1..2^26. When a new id would exceed it, the
  /// oldest id is forgotten before its window ends (a later publish with it is stored
  /// again) and StreamStats::duplicate_window_evicted counts it. The default holds
  /// 2,000 distinct ids a second over the default 2-minute window; at about 100 bytes
  /// an id (short ids; a longer id adds its length) that is 24 MiB per stream.
  std::size_t duplicate_window_max_entries = 240'000;

  /// kFile: every accepted message is appended to the log in `directory` before the
  /// publish returns, and Publish returns only once `sync` is met for it:
  ///  - kEveryCommit, kGroupCommit  fdatasync'ed (survives a power loss); publishers
  ///                  waiting at once share one fdatasync; kGroupCommit first waits
  ///                  `sync_window` for more to join.
  ///  - kInterval     written to the OS (survives a crash of the process) and
  ///                  fdatasync'ed every `sync_window` (> 0).
  ///  - kNone         written to the OS only (survives a crash of the process).
  ///
  /// Adding the stream recovers what the directory holds: the messages with their
  /// sequences, publish times and duplicate window (the stream goes on numbering
  /// after the last one). The directory is opened by one stream at a time
  /// (FailedPrecondition naming the holder's pid, or "this process"), and in one
  /// engine it may not hold or lie in another file stream's (InvalidArgument naming both: a stream's
  /// durable consumers keep their ack logs in `<directory>/consumers/<name>`). kFile
  /// needs retention kLimits or kWorkQueue (InvalidArgument for kInterest, whose
  /// acks of several consumers per message are not yet kept across restarts). Memory: a file stream keeps 48 bytes per
  /// stored message (sequence, publish time, size, place in the log), not its event;
  /// the events are in memory only while deliveries hold them, and a consumer's start
  /// and Engine::GetMessage read them back from the log. Recovery reads each full
  /// segment once, checked by its seal's checksum (state/stream_log.hpp).
  StorageType storage = StorageType::kMemory;
  std::string directory{};            ///< kFile: the stream's own directory; else empty
  SyncPolicy sync = SyncPolicy::kEveryCommit;  ///< kFile: when a publish is durable (above)
  absl::Duration sync_window = absl::ZeroDuration();  ///< 0 .. 10 s; see `sync`
  std::uint64_t segment_bytes = std::uint64_t{64} << 20;  ///< kFile: 4096 .. 2^40
  /// kFile: the file layer (null: PosixFileSystem()); tests inject failures here.
  std::shared_ptr<FileSystem> file_system{};

  /// InvalidArgument naming the stream and the field for a bad name, no subjects, a
  /// pattern that does not parse, or a value outside the range its field documents.
  static absl::Status Validate(const StreamConfig& config);
};

/// A consumer of a stream: its members, filter, selection, acks, redelivery and
/// scheduling (Engine::AddConsumer).
struct ConsumerConfig {
  std::string stream{};               ///< an existing stream
  std::string name{};                 ///< 1..64 of [A-Za-z0-9_-], unique in its stream
  /// Pattern; empty = every event of the stream. Must overlap one of the stream's
  /// subjects (SubjectPattern::Overlaps): a filter no captured subject can match is
  /// refused.
  std::string filter_subject{};
  /// Which stored messages it starts with (see DeliverPolicy); kNew by default.
  DeliverPolicy deliver = DeliverPolicy::kNew;
  ReplayPolicy replay = ReplayPolicy::kInstant;  ///< pace of the stored messages it starts with
  std::uint64_t start_seq = 0;        ///< kByStartSequence: >= 1; else 0
  absl::Time start_time = absl::InfinitePast();  ///< kByStartTime: finite; else unset
  /// Further condition on the event (headers, semantic tag, JSON content, JSON Schema;
  /// routing/predicate.hpp); default = none. Evaluated by the publishing thread
  /// under the stream's mutex for a new event; for the stored messages the consumer
  /// starts with (`deliver`), by AddConsumer's thread under that mutex on a memory
  /// stream, and on a file stream, which reads them back from its log, outside it by
  /// AddConsumer, a pull or the timer. A payload that is not JSON does not match.
  Predicate predicate{};
  std::uint32_t members = 1;          ///< lanes in the group, 1..4096
  std::size_t lane_capacity = 1024;   ///< items per lane, 1..2^24 (rounded up to 2^k, min 2)
  AckPolicy ack = AckPolicy::kExplicit;  ///< explicit acks, or none
  /// NUMA node (index into Topology::nodes()) of the thread that drains each member's
  /// lane: events queued for it are allocated from that node's pools. Empty = unknown
  /// (the publishing thread's node); else exactly `members` entries.
  std::vector<int> member_nodes{};
  /// Which member serves each event. nullptr = RoundRobinPolicy. One policy object
  /// per consumer: AddConsumer rejects a policy already used by another consumer.
  std::shared_ptr<SelectionPolicy> selection{};
  /// Outlier ejection and load-metric settings of the member group.
  GroupOptions group{};
  /// Redeliver a delivery not acked within this time (explicit ack only); zero =
  /// never; at most 365 days.
  absl::Duration ack_wait = absl::ZeroDuration();
  /// JetStream's BackOff: the ack wait of delivery k (1-based) is
  /// backoff[min(k, size) - 1], so redeliveries can wait longer each time; replaces
  /// ack_wait when not empty. Each entry > 0 and at most 365 days; at most 64 entries.
  std::vector<absl::Duration> backoff{};
  /// Deliveries of one message (first + redeliveries) before it is given up: when
  /// delivery max_deliver fails (nak or ack_wait expiry) the message goes to the
  /// dead-letter subject instead of being redelivered. -1 = no limit, else >= 1.
  /// Counted per message: a nak of one message never counts against its neighbours.
  std::int64_t max_deliver = -1;
  /// Deliveries handed out and not yet settled, over all members; a pull waits while
  /// the consumer is at this limit (JetStream's MaxAckPending). -1 = no limit, else
  /// >= 1. Explicit ack only.
  std::int64_t max_ack_pending = -1;
  /// Literal subject that dead letters are published to (see kDeadLetterReasonHeader);
  /// empty = dead letters are counted (ConsumerStats::dead_letters) and dropped. A
  /// dead letter is published without waiting: a full lane of its consumer keeps it
  /// parked until that lane has room.
  std::string dead_letter_subject{};
  OverflowPolicy overflow = OverflowPolicy::kBlock;  ///< what Publish does at a full lane
  /// Longest an event may wait in a lane for its first delivery (Triton's
  /// default_timeout_microseconds); zero = no default. An event's ttl or deadline
  /// can only lower it, never raise it (with no default they apply as given).
  /// Enforced by a timer wheel when it passes, not only when the event is pulled.
  /// At most 365 days.
  absl::Duration queue_timeout = absl::ZeroDuration();
  TimeoutAction timeout_action = TimeoutAction::kReject;  ///< an event whose queue timeout passed
  /// QoS tiers in each member's lane (sched/qos_scheduler.hpp): which queued event a
  /// pull gets next is decided by the tier's assured share, the tiers' weights and
  /// DRR between tenants (Event::qos, tenant, priority) instead of arrival order.
  /// nullopt = a FIFO lock-free ring. The lane holds lane_capacity events (the
  /// config's `capacity` is replaced by it); a scheduled lane takes a mutex.
  std::optional<QosConfig> qos{};
  /// Payload codecs this consumer accepts, in order of preference ("ask for raw,
  /// accept compressed"). Empty = any: every event is delivered with its
  /// payload as stored. Otherwise an event whose Event::codec is not in the list is
  /// delivered converted to accept_codecs[0]: to kNone by decompressing (the stored
  /// dictionary must be in EngineOptions::codecs.dictionaries), to kZstd by
  /// compressing (EngineOptions::codecs: level and dictionary). A consumer that
  /// accepts kZstd accepts it with any dictionary (it decompresses with its own set).
  /// Each entry a PayloadCodec, none repeated.
  std::vector<PayloadCodec> accept_codecs{};
  /// How Member::NextBatch(timeout) forms batches (sched/batcher.hpp): max_batch,
  /// max_queue_delay, preferred sizes, adaptive window. With `adaptive`, the observed
  /// round-trip time is each acked message's deliver -> ack time.
  BatchPolicy batch{};
  /// Moves each delivered message through `lifecycle` (engine/lifecycle.hpp), one
  /// StateStore transaction per transition, on the model its Event::model names, under
  /// the id `<stream>/<consumer>/<incarnation>/<stream sequence>` (the incarnation:
  /// StreamStats::incarnation, 16 hex digits naming this
  /// life of the stream, the same after a restart of a file stream, new for a memory
  /// stream in each process and for a stream deleted and added again, so an id never
  /// names an earlier message):
  /// - a delivery: Pending -> Processing (a first delivery enqueues it first, as
  ///   Pending, in a transaction of its own). One whose model is in Warmup stays
  ///   Pending and is put back for 50 ms (a nak with that delay: it counts as a
  ///   delivery against max_deliver). One that cannot be enqueued (no model, an
  ///   unknown or evicted one) is terminated: its dead letter's description names
  ///   the lifecycle's error. A redelivery of a Processing message (ack_wait
  ///   expired) stays Processing; one of a Completed message (its ack was lost in a
  ///   crash) is acked, of an Expired one terminated, without reaching a member;
  /// - Ack: -> Completed, before the ack is recorded. When the lifecycle expired it
  ///   meanwhile (inference timeout, its model evicted: Lifecycle::Evict expires all
  ///   of the model's Pending and Processing messages in its one transaction), Ack
  ///   terminates it instead and returns FailedPrecondition naming the expiry;
  /// - Nak (not the last delivery): Processing -> Pending;
  /// - a dead letter (Term, max_deliver, a queue timeout): -> Expired with the
  ///   dead letter's reason.
  ///
  /// The engine forgets (Lifecycle::Forget) a record no delivery can need again,
  /// expiring it first when it is live: a memory stream's once it is acked or
  /// dead-lettered; a file stream's once its ack is durable (AckSync), else when the
  /// consumer is next added (after a restart) and its ack log holds the ack; one whose
  /// message the stream removed (limits, max_age, a purge) when a delivery of it is
  /// skipped, or a file stream's at the next AddConsumer; every one of the consumer's
  /// at DeleteConsumer or DeleteStream; and, at AddConsumer, those of an earlier life
  /// of the stream (their messages are gone).
  /// nullptr = none. Explicit acks only; one Lifecycle per consumer (AddConsumer
  /// refuses one another consumer uses); must outlive the Engine.
  Lifecycle* lifecycle = nullptr;

  /// Lane slots (lane_capacity rounded up to a power of two, times members) one
  /// consumer may hold in all: 2^24, 64 bytes each (1 GiB).
  static constexpr std::size_t kMaxLaneSlots = std::size_t{1} << 24;

  /// InvalidArgument naming the consumer and the field for a bad name, filter
  /// pattern, member count, lane capacity (or members x lane slots over
  /// kMaxLaneSlots), member_nodes count, group options, accept_codecs entry (not a
  /// PayloadCodec, or repeated), policy enum value, ack_wait / backoff /
  /// queue_timeout outside their ranges, max_deliver / max_ack_pending below -1 or 0,
  /// a setting that needs explicit acks with AckPolicy::kNone, a bad
  /// dead_letter_subject, drop-oldest with qos, bad qos or batch settings, or a
  /// selection policy built for another group size.
  static absl::Status Validate(const ConsumerConfig& config);
};

}  // namespace inferq
