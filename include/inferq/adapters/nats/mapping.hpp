/// @file inferq/adapters/nats/mapping.hpp
///
/// How an Event crosses to NATS and back: its subject with a prefix, its first-class
/// attributes as NATS headers, its payload as is or as an encoded TensorEvent. The
/// NATS bridge (adapters/nats/bridge.hpp) uses these functions in both directions;
/// they need no connection, so the mapping is tested alone.
///
/// The mapping, one header per attribute (absent when the attribute has its default):
///
/// @code{.unparsed}
///   Event field            NATS header             value on the wire
///   msg_id                 Nats-Msg-Id             as is (JetStream's duplicate window)
///   trace (+ flags)        traceparent             W3C, "00-<trace-id>-<span-id>-<flags>"
///   task_id                Inferq-Task-Id          32 lowercase hex digits (hi then lo)
///   semantic_tag           Inferq-Semantic-Tag     as is
///   tenant                 Inferq-Tenant           as is
///   qos                    Inferq-Qos              "gold" | "bronze" (absent: silver)
///   priority               Inferq-Priority         decimal int32
///   model                  Inferq-Model            as is
///   model_version          Inferq-Model-Version    as is
///   schema_id              Inferq-Schema-Id        decimal uint32
///   schema_version         Inferq-Schema-Version   decimal uint32
///   seq_id                 Inferq-Seq-Id           as is
///   seq_no                 Inferq-Seq-No           decimal uint64 (with seq_id, or when not 0)
///   created                Inferq-Created          decimal ns since the Unix epoch (UTC)
///   deadline               Inferq-Deadline         decimal ns since the Unix epoch (UTC)
///   ttl                    Inferq-Ttl              decimal ns (9223372036854775807: infinite)
///   attempt                Inferq-Attempt          decimal uint32
///   shape                  Inferq-Shape            comma-separated int64 dims ("2,3,4")
///   dtype                  Inferq-Dtype            "float32", "int64", ... (DTypeName)
///   codec                  Inferq-Codec            "zstd" (absent: none)
///   dictionary_id          Inferq-Dictionary-Id    decimal uint32
///   headers                (same names)            as is
///   (the bridge)           Inferq-Origin           the exporting bridge's origin id
/// @endcode
///
/// With PayloadFormat::kTensorEvent the payload is the whole event encoded
/// (event/tensor_event.hpp), and only Nats-Msg-Id, traceparent and Inferq-Origin are
/// set as headers (for the broker and for tracing); the NATS subject still decides
/// the local subject on import.
///
/// Thread safety: pure functions.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

namespace inferq::nats {

inline constexpr std::string_view kMsgIdHeader = "Nats-Msg-Id";                    ///< Event::msg_id
inline constexpr std::string_view kTraceparentHeader = "traceparent";              ///< Event::trace
inline constexpr std::string_view kTaskIdHeader = "Inferq-Task-Id";                ///< Event::task_id
inline constexpr std::string_view kSemanticTagHeader = "Inferq-Semantic-Tag";      ///< Event::semantic_tag
inline constexpr std::string_view kTenantHeader = "Inferq-Tenant";                 ///< Event::tenant
inline constexpr std::string_view kQosHeader = "Inferq-Qos";                       ///< Event::qos
inline constexpr std::string_view kPriorityHeader = "Inferq-Priority";             ///< Event::priority
inline constexpr std::string_view kModelHeader = "Inferq-Model";                   ///< Event::model
inline constexpr std::string_view kModelVersionHeader = "Inferq-Model-Version";    ///< Event::model_version
inline constexpr std::string_view kSchemaIdHeader = "Inferq-Schema-Id";            ///< Event::schema_id
inline constexpr std::string_view kSchemaVersionHeader = "Inferq-Schema-Version";  ///< Event::schema_version
inline constexpr std::string_view kSeqIdHeader = "Inferq-Seq-Id";                  ///< Event::seq_id
inline constexpr std::string_view kSeqNoHeader = "Inferq-Seq-No";                  ///< Event::seq_no
inline constexpr std::string_view kCreatedHeader = "Inferq-Created";               ///< Event::created
inline constexpr std::string_view kDeadlineHeader = "Inferq-Deadline";             ///< Event::deadline
inline constexpr std::string_view kTtlHeader = "Inferq-Ttl";                       ///< Event::ttl
inline constexpr std::string_view kAttemptHeader = "Inferq-Attempt";               ///< Event::attempt
inline constexpr std::string_view kShapeHeader = "Inferq-Shape";                   ///< Event::shape
inline constexpr std::string_view kDtypeHeader = "Inferq-Dtype";                   ///< Event::dtype
inline constexpr std::string_view kCodecHeader = "Inferq-Codec";                   ///< Event::codec
inline constexpr std::string_view kDictionaryIdHeader = "Inferq-Dictionary-Id";    ///< Event::dictionary_id
/// The id of the bridge that exported the event (BridgeOptions::origin). An import
/// skips what its own bridge exported, and an export never sends on what an import
/// brought in, so two sites that bridge the same subjects both ways do not loop.
inline constexpr std::string_view kOriginHeader = "Inferq-Origin";

/// How an event travels in a NATS message (ExportConfig::format, ImportConfig::format).
enum class PayloadFormat {
  kRaw,          ///< the payload's bytes as stored (Event::codec in Inferq-Codec)
  kTensorEvent,  ///< the whole event, encoded (event/tensor_event.hpp)
};

/// A NATS message without a connection: subject, headers in order, payload.
struct WireMessage {
  std::string subject;                                       ///< the NATS subject
  std::vector<std::pair<std::string, std::string>> headers;  ///< name, value
  Buffer payload;                                            ///< the message's body
};

/// "float32" for DType::kFloat32, ...; "unknown" for kUnknown.
std::string_view DTypeName(DType dtype);

/// `subject` under `prefix`: "<prefix>.<subject>", or `subject` when prefix is empty.
/// InvalidArgument naming the prefix when it is not a valid literal subject (no
/// wildcards), or naming the result when it is not one.
absl::StatusOr<std::string> AddSubjectPrefix(std::string_view prefix, std::string_view subject);

/// `subject` with its leading tokens `strip` replaced by `add` (either may be empty):
/// "site.a.infer.x" with strip "site.a", add "local" gives "local.infer.x".
/// InvalidArgument naming the subject when it does not start with `strip` followed by
/// a further token, or when the result is not a valid subject.
absl::StatusOr<std::string> ReplaceSubjectPrefix(std::string_view subject, std::string_view strip,
                                                 std::string_view add);

/// The NATS message for `event` on NATS subject `subject`, with `origin` in
/// Inferq-Origin (left out when empty). InvalidArgument naming the header when a user
/// header of the event uses a name of the table above or of JetStream's own `Nats-*`
/// headers (Nats-Rollup would purge the stream), or a header name or value cannot
/// travel in a NATS header unchanged through libnats 3.4.1 (an empty name, or one with
/// a control character, a space, ':' or a non-ASCII byte: a name crosses only as
/// printable ASCII, bytes 33..126 but ':', so "X-Grüße" is refused; a value with CR,
/// LF or NUL, an empty value, or one with white space at an end); the encoder's error
/// for kTensorEvent.
absl::StatusOr<WireMessage> ToWire(const Event& event, std::string_view subject,
                                   PayloadFormat format, std::string_view origin);

/// The event a NATS message on local subject `subject` carries (the subject already
/// mapped). Headers of the table above become the attributes, any other header stays a
/// header (Inferq-Origin too, so that the event is not exported again). InvalidArgument
/// naming the header and its value when one cannot be read (a number out of range, an
/// unknown qos, dtype or codec, a bad traceparent); the decoder's error for
/// kTensorEvent, whose own subject is replaced by `subject`.
absl::StatusOr<Event> FromWire(std::string_view subject,
                               std::span<const std::pair<std::string, std::string>> headers,
                               std::span<const std::byte> payload, PayloadFormat format);

}  // namespace inferq::nats
