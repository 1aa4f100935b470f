/// @file inferq/event/event.hpp
///
/// Event: the in-process message. First-class attributes are fields,
/// not entries buried in the payload, so that routing, scheduling and ordering read
/// them without parsing; anything else goes in `headers`. The payload is a Buffer:
/// refcounted and shared, never copied, between the consumers that receive the event.
///
/// Usage:
/// @code
///   inferq::Event e;
///   e.subject = "infer.llama.request";
///   e.tenant = "acme";
///   e.qos = inferq::Qos::kGold;
///   e.headers.Set("context_tokens", "374");
///   e.payload = inferq::Buffer::FromString(R"({"prompt":"..."})");
/// @endcode
///
/// Thread safety: a plain value type. The engine hands consumers a const Event that
/// many threads may read at once; nothing mutates it after Publish.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "inferq/memory/buffer.hpp"

namespace inferq {

/// Quality-of-service tier (sched/qos_scheduler.hpp). Lower value = served first.
enum class Qos : std::uint8_t { kGold = 0, kSilver = 1, kBronze = 2 };

/// Element type of a tensor payload.
enum class DType : std::uint8_t {
  kUnknown = 0, kBool, kInt8, kUint8, kInt16, kInt32, kInt64, kFloat16, kBFloat16,
  kFloat32, kFloat64, kBytes
};

/// How an event's payload is stored (event/codec.hpp; the wire enum Codec).
///  - kNone  raw bytes;
///  - kZstd  one or more zstd frames (RFC 8878), with the trained dictionary
///           Event::dictionary_id when that is not 0.
enum class PayloadCodec : std::uint8_t { kNone = 0, kZstd = 1 };
inline constexpr std::size_t kPayloadCodecs = 2;  ///< number of PayloadCodec values

/// A 128-bit identifier (a UUID's 16 bytes, big-endian halves).
struct Uuid {
  std::uint64_t hi = 0;  ///< bytes 0-7, big-endian
  std::uint64_t lo = 0;  ///< bytes 8-15, big-endian
  /// Equal when both halves are.
  friend bool operator==(const Uuid&, const Uuid&) = default;
};

/// W3C Trace Context identifiers (https://www.w3.org/TR/trace-context/): the
/// traceparent header's trace-id, parent-id (span_id) and trace-flags (bit 0:
/// sampled). All zero = no trace context. event/traceparent.hpp reads and writes the
/// header form.
struct TraceContext {
  std::array<std::uint8_t, 16> trace_id{};  ///< trace-id: the whole trace
  std::array<std::uint8_t, 8> span_id{};    ///< parent-id: the span this event belongs to
  std::uint8_t flags = 0;                   ///< trace-flags; bit 0: sampled
  /// Equal when every byte is.
  friend bool operator==(const TraceContext&, const TraceContext&) = default;
};

/// A small ordered map of header names to values. Names are exact (case-sensitive)
/// keys; Set replaces an existing value. Linear search: headers are few.
class Headers {
 public:
  /// Sets `name` to `value`: replaces the value of an existing entry (which keeps its
  /// place), else appends an entry.
  void Set(std::string name, std::string value) {
    for (auto& [k, v] : entries_) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    entries_.emplace_back(std::move(name), std::move(value));
  }
  /// The value of `name`, or nullopt when there is none. The view is valid until
  /// the Headers change.
  std::optional<std::string_view> Get(std::string_view name) const {
    for (const auto& [k, v] : entries_) {
      if (k == name) return std::string_view(v);
    }
    return std::nullopt;
  }
  /// True when there is an entry `name`.
  bool Has(std::string_view name) const { return Get(name).has_value(); }
  /// Removes the entry `name`; false when there was none.
  bool Erase(std::string_view name) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == name) {
        entries_.erase(it);
        return true;
      }
    }
    return false;
  }
  /// Number of entries.
  std::size_t size() const { return entries_.size(); }
  /// True without entries.
  bool empty() const { return entries_.empty(); }
  /// The (name, value) pairs, in the order they were first set.
  auto begin() const { return entries_.begin(); }
  /// End of the pairs begin() starts.
  auto end() const { return entries_.end(); }
  /// Bytes of all names and values (counted against a stream's max_bytes).
  std::size_t ByteSize() const {
    std::size_t n = 0;
    for (const auto& [k, v] : entries_) n += k.size() + v.size();
    return n;
  }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

/// The in-process message: first-class attributes as fields, anything else in
/// `headers`, and the payload (see the file comment).
struct Event {
  std::string subject;          ///< literal subject (see routing/subject.hpp)
  Uuid task_id;                 ///< the unit of work this event belongs to
  std::string semantic_tag;     ///< e.g. "summarize", "tool.search"
  std::string tenant;           ///< who pays / whose quota
  Qos qos = Qos::kSilver;       ///< tier for QoS scheduling (ConsumerConfig::qos)
  std::int32_t priority = 0;    ///< higher = more urgent within a tier
  TraceContext trace;           ///< W3C trace context; all zero = none (engine/trace.hpp)
  std::string model;            ///< the model the event is for (predicates, a lifecycle)
  std::string model_version;    ///< that model's version (predicates read it)
  std::uint32_t schema_id = 0;  ///< id of the payload's schema (SchemaReader::Read checks it)
  std::uint32_t schema_version = 0;  ///< version of that schema the payload was written with
  std::string msg_id;           ///< idempotency key for the duplicate window
  std::string seq_id;           ///< identifies one ordered sequence (e.g. one generation)
  std::uint64_t seq_no = 0;     ///< position in that sequence, from 0
  absl::Time created = absl::InfinitePast();   ///< wall time set by the producer
  /// Wall-clock deadline of the request; a consumer gives the event up if no member
  /// has taken it by then (ConsumerConfig::timeout_action). InfiniteFuture = none.
  absl::Time deadline = absl::InfiniteFuture();
  /// Time to live from publish, enforced like `deadline` (whichever comes first);
  /// zero = none; never negative. Engine::Call sets it to the call's timeout.
  absl::Duration ttl = absl::ZeroDuration();
  /// Deliveries so far, as the publisher says (e.g. a retry of its own). The engine
  /// does not change it on redelivery (Message::attempt() counts this consumer's
  /// deliveries); on a dead-letter copy it is the delivery that gave the message up.
  std::uint32_t attempt = 0;
  std::vector<std::int64_t> shape;  ///< tensor dims of the payload, if it is a tensor
  DType dtype = DType::kUnknown;  ///< element type of a tensor payload
  Headers headers;              ///< every other attribute, by name
  Buffer payload;               ///< the bytes, shared (not copied) by every delivery
  /// How `payload` is stored now: raw, or zstd-compressed (with dictionary
  /// `dictionary_id` when not 0; 0 is required with kNone). An attribute, so a
  /// consumer can negotiate: ask for raw bytes or accept compressed ones
  /// (ConsumerConfig::accept_codecs). StoredSize counts the payload as stored.
  PayloadCodec codec = PayloadCodec::kNone;
  std::uint32_t dictionary_id = 0;  ///< zstd dictionary of a kZstd payload; 0 = none

  /// Bytes counted against a stream's max_bytes and max_msg_size: subject, header
  /// names and values, and payload.
  std::size_t StoredSize() const {
    return subject.size() + headers.ByteSize() + payload.size();
  }
};

}  // namespace inferq
