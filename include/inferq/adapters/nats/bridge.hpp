/// @file inferq/adapters/nats/bridge.hpp
///
/// NatsBridge: moves events between an Engine and a NATS or NATS JetStream cluster
/// (libnats, the nats.c client), so that work outgrows one process without inferq
/// growing a cluster of its own.
///  - Export: a local consumer that the bridge adds pulls the events it matches and
///    publishes them to NATS: to JetStream (js_PublishMsgAsync; the local message is
///    acked only once JetStream's PubAck arrives) or to core NATS subjects (acked
///    locally once a flush shows the server has them). A publish that fails, or whose
///    PubAck does not come within ExportConfig::ack_timeout, is nak'ed locally and
///    redelivered by the engine (after retry_delay, doubled at each further failure
///    of the message up to 16 x): nothing acknowledged locally is lost on the way,
///    and during an outage the local lanes fill (backpressure) instead of dropping.
///    At most ExportConfig::max_in_flight publishes await their PubAck.
///  - Import: a durable JetStream pull consumer that the bridge creates (or binds to)
///    fetches messages and publishes each fetched batch into the engine
///    (Engine::TryPublishBatch: a puller asleep on a local lane is woken once per
///    batch, not per message, and the messages keep their order); a message
///    is acked to NATS only after every local stream that captures it stored it,
///    which on a file stream is after the stream's sync policy is met. While a stream
///    is only busy (a full lane of a consumer with overflow block: WouldBlock,
///    PublishAck::streams_busy) the import tries again and fetches nothing more, for
///    at most half of ImportConfig::ack_wait, so the import goes as fast as the local
///    lanes drain; then, or at once when a stream refuses it by its limits or a
///    kReject lane, it is nak'ed with ImportConfig::retry_delay and JetStream delivers
///    it again (streams that stored it drop the copy by msg_id in their duplicate
///    window; one without a window stores it again). An imported event carries
///    Inferq-Origin (its publisher's, or "nats:<stream>"), so no export sends it back.
///    With ImportAck::kConsumed the NATS ack waits further, until the local consumer
///    of a work-queue stream acked the message: processes that share a durable then
///    share the work at least once, and a process that dies hands its unfinished
///    work to the others (JetStream redelivers it after ack_wait).
///
/// Subjects, attributes and payloads are mapped as adapters/nats/mapping.hpp says.
/// Delivery across the bridge is at least once: a redelivered NATS message whose
/// msg_id (Nats-Msg-Id, or "<stream>:<sequence>" of JetStream when it has none) is
/// still in the local stream's duplicate window is not stored twice, and JetStream's
/// own duplicate window drops an export retried with the same Nats-Msg-Id (an event
/// without msg_id is sent with "<origin>.<this bridge's random nonce>.<stream>.<seq>").
/// An event that can never cross (a header NATS cannot carry, a NATS subject over
/// 3,840 bytes, which would make the server close the connection, a message over the
/// server's max_payload) is terminated locally with the reason (export_invalid).
///
/// Usage:
/// @code
///   inferq::nats::BridgeOptions o;
///   o.connection.servers = {"nats://127.0.0.1:4222"};
///   auto bridge = inferq::nats::NatsBridge::Connect(*engine, o);
///   (*bridge)->AddExport({.consumer = {.stream = "TOKENS", .name = "to-nats"},
///                         .subject_prefix = "site-a"});
///   (*bridge)->AddImport({.stream = "REQUESTS", .durable = "site-a",
///                         .filter_subject = "site-b.infer.>", .strip_prefix = "site-b"});
/// @endcode
///
/// Thread safety: every method may be called from any thread. The bridge runs one
/// thread per export and per import, and libnats' own threads call its callbacks.
/// The Engine must outlive the bridge; destroy (or Close) the bridge first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/adapters/nats/mapping.hpp"
#include "inferq/engine/engine.hpp"

/// The NATS bridge, CMake target inferq::nats: NatsBridge (bridge.hpp) and how events
/// cross to NATS (mapping.hpp).
namespace inferq::nats {

/// TLS to the servers (natsOptions_SetSecure and friends). The server's certificate
/// is always verified, against `ca_file` when set, else the system's CAs.
struct TlsOptions {
  bool enabled = false;             ///< connect with TLS
  std::string ca_file{};            ///< PEM CA certificates that sign the servers' certificates
  std::string cert_file{};          ///< PEM client certificate (with key_file), optional
  std::string key_file{};           ///< PEM private key of cert_file
  std::string expected_hostname{};  ///< the name the certificate must carry; empty: the URL's host
};

/// How a NatsBridge connects: servers, credentials, TLS, timeouts and reconnects.
struct ConnectionOptions {
  /// URLs of the cluster's servers ("nats://host:port", "tls://host:port"); at least
  /// one, none empty or holding white space, a comma or a NUL. The client fails over
  /// between them and learns the others from the cluster.
  std::vector<std::string> servers{};
  /// The connection's name, as servers report it; no control character, double quote
  /// or backslash (libnats sends it unescaped).
  std::string name = "inferq-bridge";
  /// Credentials: at most one of user/password (a password only with a user), token
  /// and credentials_file (a `.creds` file holding a user JWT and its NKey seed).
  ///@{
  std::string user{};
  std::string password{};
  std::string token{};
  std::string credentials_file{};
  ///@}
  TlsOptions tls{};  ///< TLS to the servers
  /// libnats' connect timeout; > 0 and at most 365 days.
  absl::Duration connect_timeout = absl::Seconds(2);
  /// Reconnects after a lost connection: -1 = without end.
  int max_reconnect = -1;
  /// Pause between reconnect attempts; 0 .. 365 days.
  absl::Duration reconnect_wait = absl::Milliseconds(200);
  /// Bytes the client buffers while reconnecting; a publish that finds it full fails
  /// (and the export naks and retries it). Not negative.
  int reconnect_buffer_bytes = 8 << 20;
  /// JetStream API requests (stream and consumer lookups, consumer creation); > 0 and
  /// at most 365 days.
  absl::Duration jetstream_timeout = absl::Seconds(5);
  /// How long AddImport tries its JetStream requests again (every 250 ms, each with
  /// jetstream_timeout) while they fail as they do in a cluster that is forming or
  /// electing its leaders: a timeout, no responders, JetStream errors 10005 (no
  /// suitable peers for placement), 10008 (temporarily unavailable) and 10009 (not the
  /// leader). Any other error is final at once; so is JetStream not enabled (10076,
  /// 10039). Zero: one try; 0 .. 365 days. The error after the last try names this
  /// time. Close waits for an AddImport that is retrying.
  absl::Duration jetstream_forming_wait = absl::ZeroDuration();
  /// How long Connect tries again (every reconnect_wait, at least every 100 ms) while
  /// no server accepts a connection (libnats' NATS_NO_SERVER: the servers down,
  /// restarting or out of reach as the process starts). Any other failure (TLS,
  /// authorization) is final at once. Zero: one try; 0 .. 365 days. The Unavailable
  /// error after the last try names this time and the number of tries.
  absl::Duration connect_wait = absl::ZeroDuration();
};

/// What NatsBridge::Connect takes.
struct BridgeOptions {
  ConnectionOptions connection{};  ///< how to reach the servers
  /// This bridge's id in Inferq-Origin (mapping.hpp): unique per site or process;
  /// empty: "<hostname>-<pid>". 1..128 characters of [A-Za-z0-9_.-].
  std::string origin{};
};

/// One export: a local consumer whose events the bridge publishes to NATS
/// (NatsBridge::AddExport).
struct ExportConfig {
  /// The local consumer the bridge adds and pulls from: its stream, name, filter,
  /// predicates, ack_wait, max_ack_pending, max_deliver, dead letters. It must use
  /// explicit acks; members and selection are the bridge's (1 member).
  ConsumerConfig consumer{};
  /// NATS subject = "<subject_prefix>.<local subject>" (empty: the local subject);
  /// the prefix leaves room for a subject under the 3,840 bytes the bridge sends.
  std::string subject_prefix{};
  /// True: publish to JetStream (a stream there must capture the subjects; the local
  /// ack waits for the PubAck). False: core NATS (the local ack waits for a flush).
  bool jetstream = true;
  PayloadFormat format = PayloadFormat::kRaw;  ///< how events travel (mapping.hpp)
  /// Publishes awaiting their PubAck at most, 1..65536.
  std::size_t max_in_flight = 1024;
  /// A PubAck not received within this time fails the publish (it is nak'ed locally
  /// and tried again: JetStream drops the copy by Nats-Msg-Id if the first arrived).
  /// Positive, at most 365 days (kMaxDuration).
  absl::Duration ack_timeout = absl::Seconds(5);
  /// How long a failed publish waits before the engine redelivers it, doubled for
  /// each further delivery of the same message (Message::attempt), up to 16 x
  /// retry_delay: an outage is met with backoff, not with every message in flight
  /// published again every retry_delay. Not negative, at most 365 days
  /// (kMaxDuration); the doubled delay stops at 365 days too.
  absl::Duration retry_delay = absl::Milliseconds(200);
};

/// When an import acks a message to NATS (ImportConfig::ack).
///  - kStored: once every local stream that captures it stored it (on a file stream,
///    once the stream's sync policy is met). From then on the process answers for it.
///  - kConsumed: once ImportConfig::ack_stream no longer holds it, that is once the
///    local consumer of that work-queue stream acked it (or its dead-letter handling,
///    a limit or a purge removed it; a deleted stream's messages are nak'ed instead,
///    also when a stream of the same name was added again, unless that one has given
///    out the held sequences itself and removed them). That ack waits for JetStream's
///    confirmation (natsMsg_AckSync, at most 1 s or jetstream_timeout: a round trip
///    per consumed message on the import's thread) and is sent again every 250 ms
///    until it comes: an ack sent while the connection is down, or
///    to restarted servers that have not elected the consumer's leader yet, reaches
///    no one, and JetStream would deliver the finished work again after ack_wait
///    (import_held counts the message until then; Close sends an unconfirmed one
///    once more and does not nak it). Until the local ack the bridge tells
///    JetStream every ack_wait / 3 that the message is in progress
///    (natsMsg_InProgress), and Close naks it. When the process dies first,
///    JetStream delivers it again after ack_wait, to another process importing
///    through the same durable: the work is done at least once across processes, as
///    by a JetStream worker that acks when its work is done. The import looks the
///    held messages up in ack_stream (Engine::GetMessage), which waits while a
///    Publish is blocked on a full lane of that stream: for that time no in-progress
///    goes out (JetStream may deliver the work to another process after ack_wait)
///    and Close waits with it. Let a lane of ack_stream's consumer drain, or publish
///    into it with TryPublish.
enum class ImportAck { kStored, kConsumed };

/// One import: a durable JetStream pull consumer whose messages the bridge publishes
/// into the engine (NatsBridge::AddImport).
struct ImportConfig {
  std::string stream{};          ///< the JetStream stream to read (it must exist)
  std::string durable{};         ///< the durable pull consumer's name (created if missing)
  /// NATS subject filter; empty: the whole stream (the durable is created without a
  /// filter; one that exists must have none).
  std::string filter_subject{};
  /// Local subject = the NATS subject with `strip_prefix` replaced by `add_prefix`
  /// (mapping.hpp, ReplaceSubjectPrefix). Each empty or a valid literal subject; a
  /// strip_prefix must lead filter_subject ("<strip_prefix>." and a further token).
  ///@{
  std::string strip_prefix{};
  std::string add_prefix{};
  ///@}
  PayloadFormat format = PayloadFormat::kRaw;  ///< how events travel (mapping.hpp)
  int fetch_batch = 64;          ///< messages per fetch, 1..4096
  /// The JetStream consumer's AckWait (created consumers only; > 0) and how long a
  /// message the engine refused waits before JetStream redelivers it (not negative);
  /// each at most 7 days (168 h).
  ///@{
  absl::Duration ack_wait = absl::Seconds(30);
  absl::Duration retry_delay = absl::Milliseconds(200);
  ///@}
  ImportAck ack = ImportAck::kStored;  ///< when a message is acked to NATS
  /// kConsumed: the local stream whose consumer's ack settles an imported message. It
  /// must exist with RetentionPolicy::kWorkQueue and be the only local stream that
  /// captures the imported subjects: a message another stream also stored (or that
  /// this one did not store) is acked once stored, as under kStored, and last_error
  /// names it. Empty under kStored.
  std::string ack_stream{};
  /// The JetStream consumer's MaxAckPending (created consumers only): messages
  /// delivered and not yet acked, at most, over every process that imports through
  /// the durable; 0 = the server's default (1,000 for nats-server 2.9). Under
  /// kConsumed it bounds the work the importing processes hold. 0..1,000,000.
  int max_ack_pending = 0;
  /// kConsumed: messages this import holds at most (stored locally and not consumed
  /// yet); it fetches only while it holds fewer, as a worker pulls when it has room,
  /// so that processes sharing a durable share the work by their room. 0 = no bound
  /// of its own (max_ack_pending bounds them all). 0..1,000,000; 0 under kStored.
  int max_held = 0;
};

/// The bridge's figures. The engine's Stats() carries them too, as the component
/// "nats_bridge.<origin>" (EngineStats::components): the gauges "connected" (0 or 1),
/// "export_pending" and "import_held" under their own names, each other number below
/// as a counter "<name>_total" ("exported_total", "reconnects_total", ...), and
/// last_error as its detail; connected_url is in Stats() only.
struct BridgeStats {
  bool connected = false;            ///< connected to a server now
  std::string connected_url{};       ///< the server connected to last (after a failover: the new one)
  std::uint64_t disconnects = 0;     ///< connections lost
  std::uint64_t reconnects = 0;      ///< connections made again after a loss
  // Export.
  std::uint64_t exported = 0;        ///< acked by NATS (PubAck or flush), then acked locally
  std::uint64_t export_pending = 0;  ///< published, waiting for the PubAck
  std::uint64_t export_failures = 0; ///< failed publishes and PubAck errors/timeouts (nak'ed locally)
  std::uint64_t export_duplicates = 0;  ///< PubAcks JetStream marked duplicate
  std::uint64_t export_loops = 0;    ///< imported events not sent back (acked locally)
  std::uint64_t export_invalid = 0;  ///< events the mapping refused (terminated locally)
  // Import.
  std::uint64_t imported = 0;        ///< accepted by the engine, then acked to NATS
  std::uint64_t import_redelivered = 0;  ///< messages NATS delivered more than once
  std::uint64_t import_duplicates = 0;   ///< dropped by the local duplicate window
  std::uint64_t import_refused = 0;  ///< the engine refused (nak'ed with retry_delay)
  std::uint64_t import_invalid = 0;  ///< could not be mapped or stored (terminated in NATS)
  std::uint64_t import_loops = 0;    ///< this bridge's own exports (acked, not stored)
  /// ImportAck::kConsumed: stored locally, not consumed yet: held un-acked in NATS (now).
  std::uint64_t import_held = 0;
  std::uint64_t fetch_errors = 0;    ///< fetches that failed other than by timing out
  std::string last_error{};          ///< the latest error from NATS or the engine, with context
};

/// Moves events between an Engine and a NATS or JetStream cluster (see the file
/// comment).
class NatsBridge {
 public:
  /// Connects to `options.connection.servers` and attaches the bridge's figures to
  /// `engine`'s Stats() (Engine::AddStatsSource, "nats_bridge.<origin>").
  /// InvalidArgument naming the field for bad options: no server; a server URL that
  /// is empty or holds white space, a comma or a NUL; a name with a control
  /// character, double quote or backslash; two kinds of credentials, or a password
  /// without a user; a negative reconnect_buffer_bytes; a connect_timeout or
  /// jetstream_timeout that is not positive, a negative reconnect_wait or
  /// jetstream_forming_wait, or any of the four over 365 days; a bad origin (1..128
  /// of [A-Za-z0-9_.-]); an option libnats refuses (its error: TLS or credentials
  /// files that cannot be read, ...). AlreadyExists when a bridge of the same origin
  /// is attached to the engine; Unavailable with the client's error when no server
  /// can be reached, the TLS handshake fails or the credentials are refused;
  /// Internal when libnats cannot make its options or JetStream context.
  static absl::StatusOr<std::unique_ptr<NatsBridge>> Connect(Engine& engine, BridgeOptions options);

  /// Adds the export's local consumer and starts forwarding. InvalidArgument for a
  /// max_in_flight outside 1..65536, an ack_timeout not positive or over 365 days, a
  /// retry_delay negative or over 365 days, a consumer without AckPolicy::kExplicit, or a
  /// subject_prefix that is not a valid literal subject or leaves no room under the
  /// 3,840 bytes; AddConsumer's errors; FailedPrecondition after Close; Internal when
  /// libnats cannot make the export's JetStream context.
  absl::Status AddExport(ExportConfig config);

  /// Looks up the JetStream stream, creates or binds the durable pull consumer and
  /// starts importing. InvalidArgument for a bad stream or durable name (1..128 of
  /// [A-Za-z0-9_-]); a fetch_batch outside 1..4096; an ack_wait not positive or a
  /// retry_delay negative, or either over 7 days; a filter_subject that is not a
  /// valid pattern; a strip_prefix that is not a valid literal subject or does not
  /// lead filter_subject (the filter must start with "<strip_prefix>." and a further
  /// token); a bad add_prefix; a max_ack_pending or max_held outside 0..1,000,000; a
  /// max_held other than 0 or an ack_stream set under kStored; under kConsumed, an
  /// ack_stream that is not a stream of the engine or not a work-queue stream.
  /// NotFound when the JetStream stream does not exist; FailedPrecondition after
  /// Close, or when filter_subject is empty and the durable exists with a filter;
  /// Unavailable with the JetStream error otherwise (after
  /// ConnectionOptions::jetstream_forming_wait for the errors of a forming cluster),
  /// also when binding to a durable that exists with another filter or configuration
  /// fails (libnats' error).
  absl::Status AddImport(ImportConfig config);

  /// A snapshot of the figures.
  BridgeStats Stats() const;

  /// Stops every export and import: waits up to `drain` for the PubAcks still due,
  /// naks locally what is still unacknowledged (the engine keeps it for the export's
  /// consumer, which stays in the engine: a later AddExport of a bridge under the same
  /// consumer name fails AlreadyExists, Engine::DeleteConsumer removes it; on a file
  /// stream the consumer's unacked messages come again after a restart), leaves the
  /// imports' durable JetStream consumers on the servers (a later import under the
  /// same durable name resumes them), naks to NATS what kConsumed imports still hold
  /// (JetStream delivers it again, here after a restart or to another process), and
  /// closes the connection. Idempotent; the
  /// destructor calls it.
  void Close(absl::Duration drain = absl::Seconds(2));
  ~NatsBridge();

  /// This bridge's id in Inferq-Origin: BridgeOptions::origin, or its default.
  const std::string& origin() const;

 private:
  struct Impl;
  explicit NatsBridge(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferq::nats
