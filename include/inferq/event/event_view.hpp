/// @file inferq/event/event_view.hpp
///
/// EventView: an Event's fields as views of the caller's memory, for a publish that
/// builds nothing of its own (Engine::PublishView(const EventView&),
/// Engine::PublishViewBatch(std::span<const EventView>)). The engine copies what it
/// stores straight into the message it keeps: the strings once, the payload bytes
/// once into a pooled Buffer (or, with `shared_payload`, not at all), where a
/// publish of an Event moves the whole Event into the message (and into Publish's
/// parameter first, from a named Event) and destroys the moved-from ones.
/// Every field has the meaning and the default of the Event field of the same name
/// (event/event.hpp).
///
/// Usage:
/// @code
///   const std::string body = R"({"prompt":"..."})";
///   inferq::EventView v;
///   v.subject = "infer.llama.request";
///   v.payload = std::as_bytes(std::span(body));   // copied once, into the stored message
///   v.tenant = "acme";
///   absl::StatusOr<inferq::PublishAck> ack = engine->PublishView(v);
/// @endcode
///
/// Thread safety: a plain value type of views. What it views must stay valid and
/// unchanged until the call that reads it returns; nothing keeps a view afterwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "inferq/event/event.hpp"
#include "inferq/memory/buffer.hpp"

namespace inferq {

/// An Event as views (see the file comment). Defaults are Event's.
struct EventView {
  std::string_view subject{};  ///< literal subject (Event::subject)
  /// The payload's bytes, copied once into a Buffer of the process's pools (Buffer::Copy).
  std::span<const std::byte> payload{};
  /// A payload to share instead of copying `payload` (one reference count taken);
  /// `payload` must then be empty. nullptr: use `payload`.
  const Buffer* shared_payload = nullptr;
  Uuid task_id{};                       ///< Event::task_id
  std::string_view semantic_tag{};      ///< Event::semantic_tag
  std::string_view tenant{};            ///< Event::tenant
  Qos qos = Qos::kSilver;             ///< Event::qos
  std::int32_t priority = 0;          ///< Event::priority
  TraceContext trace{};                 ///< Event::trace
  std::string_view model{};             ///< Event::model
  std::string_view model_version{};     ///< Event::model_version
  std::uint32_t schema_id = 0;        ///< Event::schema_id
  std::uint32_t schema_version = 0;   ///< Event::schema_version
  std::string_view msg_id{};            ///< Event::msg_id (the duplicate window's key)
  std::string_view seq_id{};            ///< Event::seq_id
  std::uint64_t seq_no = 0;           ///< Event::seq_no
  absl::Time created = absl::InfinitePast();    ///< Event::created
  absl::Time deadline = absl::InfiniteFuture();  ///< Event::deadline
  absl::Duration ttl = absl::ZeroDuration();     ///< Event::ttl
  std::uint32_t attempt = 0;          ///< Event::attempt
  std::span<const std::int64_t> shape{};  ///< Event::shape
  DType dtype = DType::kUnknown;      ///< Event::dtype
  const Headers* headers = nullptr;   ///< copied into Event::headers; nullptr: none
  PayloadCodec codec = PayloadCodec::kNone;  ///< Event::codec
  std::uint32_t dictionary_id = 0;    ///< Event::dictionary_id

  /// OK, or InvalidArgument when the view cannot be read as one event: both
  /// `payload` (n bytes) and `shared_payload` are set. What an Event itself may not
  /// hold (a bad subject, ttl, codec...) is the publish's to refuse, as for an Event.
  absl::Status Validate() const {
    if (shared_payload != nullptr && !payload.empty()) {
      return absl::InvalidArgumentError(
          "EventView for subject '" + std::string(subject) + "' has both a payload of " +
          std::to_string(payload.size()) + " bytes and a shared_payload: set one of them");
    }
    return absl::OkStatus();
  }

  /// Writes every field into `e`, also into a used Event: a field the view leaves
  /// empty is cleared there, so nothing of an earlier event (a msg_id, a tenant,
  /// headers) is left behind. Validate() first: with both payloads set the shared
  /// one wins. Throws std::bad_alloc when memory runs out.
  void CopyTo(Event& e) const { Copy</*kClear=*/true>(e); }

  /// CopyTo for an Event that is default-constructed (the engine's new records,
  /// ToEvent): fields the view leaves empty are not touched, which saves a store or
  /// a call per field. Into a used Event, use CopyTo.
  void CopyToNew(Event& fresh) const { Copy</*kClear=*/false>(fresh); }

  /// A new Event holding copies of every field (CopyTo).
  Event ToEvent() const {
    Event e;
    CopyToNew(e);
    return e;
  }

 private:
  // kClear: clear the fields the view leaves empty (CopyTo); else leave them.
  template <bool kClear>
  void Copy(Event& e) const {
    auto set = [](std::string& to, std::string_view from) {
      if (!from.empty()) {
        to.assign(from);
      } else if constexpr (kClear) {
        to.clear();
      }
    };
    e.subject.assign(subject);
    e.task_id = task_id;
    set(e.semantic_tag, semantic_tag);
    set(e.tenant, tenant);
    e.qos = qos;
    e.priority = priority;
    e.trace = trace;
    set(e.model, model);
    set(e.model_version, model_version);
    e.schema_id = schema_id;
    e.schema_version = schema_version;
    set(e.msg_id, msg_id);
    set(e.seq_id, seq_id);
    e.seq_no = seq_no;
    e.created = created;
    e.deadline = deadline;
    e.ttl = ttl;
    e.attempt = attempt;
    if (!shape.empty()) {
      e.shape.assign(shape.begin(), shape.end());
    } else if constexpr (kClear) {
      e.shape.clear();
    }
    e.dtype = dtype;
    if (headers != nullptr) {
      e.headers = *headers;
    } else if constexpr (kClear) {
      if (!e.headers.empty()) e.headers = Headers();
    }
    e.payload = shared_payload != nullptr ? *shared_payload : Buffer::Copy(payload);
    e.codec = codec;
    e.dictionary_id = dictionary_id;
  }
};

}  // namespace inferq
