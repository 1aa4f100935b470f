// File: src/adapters/nats/mapping.cpp
//
// Event <-> NATS message (inferq/adapters/nats/mapping.hpp).
#include "inferq/adapters/nats/mapping.hpp"

#include <array>
#include <cstdint>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "inferq/event/tensor_event.hpp"
#include "inferq/event/traceparent.hpp"
#include "inferq/routing/subject.hpp"

namespace inferq::nats {
namespace {

constexpr std::array<std::string_view, 11> kDTypeNames = {
    "unknown", "bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64"};
constexpr std::string_view kBytesName = "bytes";

// The names of the table: a user header may not take one.
constexpr std::array<std::string_view, 22> kMappedHeaders = {
    kMsgIdHeader,   kTraceparentHeader, kTaskIdHeader,  kSemanticTagHeader,  kTenantHeader,
    kQosHeader,     kPriorityHeader,    kModelHeader,   kModelVersionHeader, kSchemaIdHeader,
    kSchemaVersionHeader, kSeqIdHeader, kSeqNoHeader,   kCreatedHeader,      kDeadlineHeader,
    kTtlHeader,     kAttemptHeader,     kShapeHeader,   kDtypeHeader,        kCodecHeader,
    kDictionaryIdHeader, kOriginHeader};

bool Mapped(std::string_view name) {
  for (std::string_view m : kMappedHeaders) {
    if (m == name) return true;
  }
  return false;
}

std::string Quoted(std::string_view s) {
  std::string out = "'";
  out.append(s.substr(0, 128));
  if (s.size() > 128) out += "...";
  return out + "'";
}

absl::Status CheckName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("an empty header name cannot travel in NATS");
  for (char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 32 || u >= 127 || c == ':') {
      return absl::InvalidArgumentError("header name " + Quoted(name) +
                                        " cannot travel in NATS (a control character, space, ':' "
                                        "or non-ASCII byte)");
    }
  }
  return absl::OkStatus();
}

// A header value libnats 3.4.1 carries as it is. Refused: CR or LF (they end the
// header line); NUL (libnats takes C strings: the rest would be cut off silently);
// an empty value (its parser then reads the next header line as the value: found by
// an adversarial review, an empty header swallowed Inferq-Origin); white space at
// either end (trimmed on the way).
absl::Status CheckValue(std::string_view name, std::string_view value) {
  std::string_view why;
  if (value.find_first_of("\r\n") != std::string_view::npos) {
    why = "a CR or LF";
  } else if (value.find('\0') != std::string_view::npos) {
    why = "a NUL byte";
  } else if (value.empty()) {
    why = "no characters";
  } else if (value.front() == ' ' || value.front() == '\t' || value.back() == ' ' || value.back() == '\t') {
    why = "white space at an end";
  }
  if (!why.empty()) {
    return absl::InvalidArgumentError("header " + Quoted(name) + " has a value with " + std::string(why) +
                                      ", which cannot travel in NATS: " + Quoted(value));
  }
  return absl::OkStatus();
}

// NATS subjects are text: a control byte (a NUL above all, which libnats would cut
// the subject at) cannot travel.
absl::Status CheckSubjectBytes(std::string_view what, std::string_view subject) {
  for (char c : subject) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 32 || u == 127) {
      return absl::InvalidArgumentError(std::string(what) + " " + Quoted(subject) +
                                        " has a control byte, which cannot travel in NATS");
    }
  }
  return absl::OkStatus();
}

// JetStream's own headers (Nats-Rollup purges a stream, Nats-Expected-* make the
// publish fail): an event header by such a name would act on the broker. The bridge
// sets Nats-Msg-Id itself, from Event::msg_id.
bool NatsControlHeader(std::string_view name) {
  // Debian's Abseil has its own string_view type.
  return absl::StartsWithIgnoreCase(absl::string_view(name.data(), name.size()), "Nats-");
}

std::string Hex64(std::uint64_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = kHex[v & 0xf];
  return s;
}

absl::Status BadValue(std::string_view name, std::string_view value, std::string_view why) {
  return absl::InvalidArgumentError("NATS header " + Quoted(name) + " has value " + Quoted(value) +
                                    ": " + std::string(why));
}

template <typename T>
absl::StatusOr<T> ReadInt(std::string_view name, std::string_view value) {
  using Wide = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
  Wide v{};
  // SimpleAtoi accepts surrounding white space and '+'; the wire form is plain digits.
  const bool plain = !value.empty() && (value[0] == '-' || (value[0] >= '0' && value[0] <= '9')) &&
                     (value.back() >= '0' && value.back() <= '9');
  if (!plain || !absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &v) ||
      v < static_cast<Wide>(std::numeric_limits<T>::min()) ||
      v > static_cast<Wide>(std::numeric_limits<T>::max())) {
    return BadValue(name, value, std::string("not a decimal ") +
                                     (std::is_signed_v<T> ? "signed" : "unsigned") + " " +
                                     std::to_string(sizeof(T) * 8) + "-bit integer");
  }
  return static_cast<T>(v);
}

absl::StatusOr<Uuid> ReadUuid(std::string_view name, std::string_view value) {
  if (value.size() != 32) return BadValue(name, value, "not 32 lowercase hex digits");
  Uuid u;
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = value[i];
    std::uint64_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<std::uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<std::uint64_t>(c - 'a' + 10);
    } else {
      return BadValue(name, value, "not 32 lowercase hex digits");
    }
    std::uint64_t& half = i < 16 ? u.hi : u.lo;
    half = half << 4 | d;
  }
  return u;
}

// Reads one header of the table into `e`; false when `name` is not in the table.
absl::StatusOr<bool> ReadMapped(std::string_view name, std::string_view value, Event& e) {
  auto set_int = [&](auto& field) -> absl::Status {
    auto v = ReadInt<std::remove_reference_t<decltype(field)>>(name, value);
    if (!v.ok()) return v.status();
    field = *v;
    return absl::OkStatus();
  };
  absl::Status st;
  if (name == kMsgIdHeader) {
    e.msg_id = std::string(value);
  } else if (name == kTraceparentHeader) {
    auto t = ParseTraceparent(value);
    if (!t.ok()) return BadValue(name, value, std::string(t.status().message()));
    e.trace = *t;
  } else if (name == kTaskIdHeader) {
    auto u = ReadUuid(name, value);
    if (!u.ok()) return u.status();
    e.task_id = *u;
  } else if (name == kSemanticTagHeader) {
    e.semantic_tag = std::string(value);
  } else if (name == kTenantHeader) {
    e.tenant = std::string(value);
  } else if (name == kQosHeader) {
    if (value == "gold") {
      e.qos = Qos::kGold;
    } else if (value == "silver") {
      e.qos = Qos::kSilver;
    } else if (value == "bronze") {
      e.qos = Qos::kBronze;
    } else {
      return BadValue(name, value, "not gold, silver or bronze");
    }
  } else if (name == kPriorityHeader) {
    st = set_int(e.priority);
  } else if (name == kModelHeader) {
    e.model = std::string(value);
  } else if (name == kModelVersionHeader) {
    e.model_version = std::string(value);
  } else if (name == kSchemaIdHeader) {
    st = set_int(e.schema_id);
  } else if (name == kSchemaVersionHeader) {
    st = set_int(e.schema_version);
  } else if (name == kSeqIdHeader) {
    e.seq_id = std::string(value);
  } else if (name == kSeqNoHeader) {
    st = set_int(e.seq_no);
  } else if (name == kCreatedHeader || name == kDeadlineHeader) {
    auto ns = ReadInt<std::int64_t>(name, value);
    if (!ns.ok()) return ns.status();
    (name == kCreatedHeader ? e.created : e.deadline) = absl::FromUnixNanos(*ns);
  } else if (name == kTtlHeader) {
    auto ns = ReadInt<std::int64_t>(name, value);
    if (!ns.ok()) return ns.status();
    if (*ns < 0) return BadValue(name, value, "a negative time to live");
    e.ttl = *ns == std::numeric_limits<std::int64_t>::max() ? absl::InfiniteDuration()
                                                            : absl::Nanoseconds(*ns);
  } else if (name == kAttemptHeader) {
    st = set_int(e.attempt);
  } else if (name == kShapeHeader) {
    e.shape.clear();
    for (absl::string_view dim : absl::StrSplit(absl::string_view(value.data(), value.size()), ',')) {
      auto d = ReadInt<std::int64_t>(name, std::string_view(dim.data(), dim.size()));
      if (!d.ok()) return BadValue(name, value, "not comma-separated decimal int64 dims");
      e.shape.push_back(*d);
    }
  } else if (name == kDtypeHeader) {
    bool found = false;
    for (std::size_t i = 0; i < kDTypeNames.size(); ++i) {
      if (kDTypeNames[i] == value) {
        e.dtype = static_cast<DType>(i);
        found = true;
      }
    }
    if (value == kBytesName) {
      e.dtype = DType::kBytes;
      found = true;
    }
    if (!found) return BadValue(name, value, "not a dtype inferq knows");
  } else if (name == kCodecHeader) {
    if (value == "zstd") {
      e.codec = PayloadCodec::kZstd;
    } else if (value == "none") {
      e.codec = PayloadCodec::kNone;
    } else {
      return BadValue(name, value, "not none or zstd");
    }
  } else if (name == kDictionaryIdHeader) {
    st = set_int(e.dictionary_id);
  } else {
    return false;
  }
  if (!st.ok()) return st;
  return true;
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  if (dtype == DType::kBytes) return kBytesName;
  return i < kDTypeNames.size() ? kDTypeNames[i] : kDTypeNames[0];
}

absl::StatusOr<std::string> AddSubjectPrefix(std::string_view prefix, std::string_view subject) {
  if (prefix.empty()) {
    if (auto st = CheckSubjectBytes("subject", subject); !st.ok()) return st;
    return std::string(subject);
  }
  if (auto st = CheckSubjectBytes("subject prefix", prefix); !st.ok()) return st;
  if (auto st = CheckSubjectBytes("subject", subject); !st.ok()) return st;
  if (!IsValidSubject(prefix) || prefix.find_first_of("*>") != std::string_view::npos) {
    return absl::InvalidArgumentError("subject prefix " + Quoted(prefix) +
                                      " is not a valid literal subject");
  }
  std::string out = std::string(prefix) + "." + std::string(subject);
  if (!IsValidSubject(out)) {
    return absl::InvalidArgumentError("subject " + Quoted(out) + " (prefix " + Quoted(prefix) +
                                      " and subject " + Quoted(subject) + ") is not a valid subject");
  }
  return out;
}

absl::StatusOr<std::string> ReplaceSubjectPrefix(std::string_view subject, std::string_view strip,
                                                 std::string_view add) {
  std::string_view rest = subject;
  if (!strip.empty()) {
    if (subject.size() <= strip.size() + 1 || subject.substr(0, strip.size()) != strip ||
        subject[strip.size()] != '.') {
      return absl::InvalidArgumentError("subject " + Quoted(subject) + " does not start with prefix " +
                                        Quoted(strip) + " and a further token");
    }
    rest = subject.substr(strip.size() + 1);
  }
  return AddSubjectPrefix(add, rest);
}

absl::StatusOr<WireMessage> ToWire(const Event& event, std::string_view subject, PayloadFormat format,
                                   std::string_view origin) {
  WireMessage w;
  w.subject = std::string(subject);
  auto add = [&](std::string_view name, std::string value) -> absl::Status {
    if (auto st = CheckValue(name, value); !st.ok()) return st;
    w.headers.emplace_back(std::string(name), std::move(value));
    return absl::OkStatus();
  };
  absl::Status st;
  auto put = [&](std::string_view name, std::string value) {
    if (st.ok()) st = add(name, std::move(value));
  };
  if (!event.msg_id.empty()) put(kMsgIdHeader, event.msg_id);
  if (std::string tp = FormatTraceparent(event.trace); !tp.empty()) put(kTraceparentHeader, std::move(tp));
  if (!origin.empty()) put(kOriginHeader, std::string(origin));
  if (format == PayloadFormat::kTensorEvent) {
    if (!st.ok()) return st;
    auto bytes = Encode(event);
    if (!bytes.ok()) return bytes.status();
    w.payload = std::move(*bytes);
    return w;
  }
  if (event.task_id != Uuid{}) put(kTaskIdHeader, Hex64(event.task_id.hi) + Hex64(event.task_id.lo));
  if (!event.semantic_tag.empty()) put(kSemanticTagHeader, event.semantic_tag);
  if (!event.tenant.empty()) put(kTenantHeader, event.tenant);
  if (event.qos == Qos::kGold) put(kQosHeader, "gold");
  if (event.qos == Qos::kBronze) put(kQosHeader, "bronze");
  if (event.qos != Qos::kGold && event.qos != Qos::kSilver && event.qos != Qos::kBronze) {
    return absl::InvalidArgumentError("event qos " + std::to_string(static_cast<int>(event.qos)) +
                                      " is not gold, silver or bronze");
  }
  if (event.priority != 0) put(kPriorityHeader, std::to_string(event.priority));
  if (!event.model.empty()) put(kModelHeader, event.model);
  if (!event.model_version.empty()) put(kModelVersionHeader, event.model_version);
  if (event.schema_id != 0) put(kSchemaIdHeader, std::to_string(event.schema_id));
  if (event.schema_version != 0) put(kSchemaVersionHeader, std::to_string(event.schema_version));
  if (!event.seq_id.empty()) put(kSeqIdHeader, event.seq_id);
  if (!event.seq_id.empty() || event.seq_no != 0) put(kSeqNoHeader, std::to_string(event.seq_no));
  if (event.created != absl::InfinitePast()) put(kCreatedHeader, std::to_string(absl::ToUnixNanos(event.created)));
  if (event.deadline != absl::InfiniteFuture()) {
    put(kDeadlineHeader, std::to_string(absl::ToUnixNanos(event.deadline)));
  }
  if (event.ttl != absl::ZeroDuration()) {
    put(kTtlHeader, std::to_string(event.ttl == absl::InfiniteDuration()
                                       ? std::numeric_limits<std::int64_t>::max()
                                       : absl::ToInt64Nanoseconds(event.ttl)));
  }
  if (event.attempt != 0) put(kAttemptHeader, std::to_string(event.attempt));
  if (!event.shape.empty()) {
    std::string dims;
    for (std::int64_t d : event.shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    put(kShapeHeader, std::move(dims));
  }
  if (event.dtype != DType::kUnknown) put(kDtypeHeader, std::string(DTypeName(event.dtype)));
  if (event.codec == PayloadCodec::kZstd) put(kCodecHeader, "zstd");
  if (event.dictionary_id != 0) put(kDictionaryIdHeader, std::to_string(event.dictionary_id));
  for (const auto& [name, value] : event.headers) {
    if (!st.ok()) break;
    if (Mapped(name)) {
      return absl::InvalidArgumentError("event header " + Quoted(name) +
                                        " takes the name of a mapped attribute; rename it to cross "
                                        "to NATS");
    }
    if (NatsControlHeader(name)) {
      return absl::InvalidArgumentError("event header " + Quoted(name) +
                                        " is in JetStream's own Nats-* namespace, where it would act on "
                                        "the broker; rename it to cross to NATS");
    }
    if (st = CheckName(name); st.ok()) put(name, value);
  }
  if (!st.ok()) return st;
  w.payload = event.payload;
  return w;
}

absl::StatusOr<Event> FromWire(std::string_view subject,
                               std::span<const std::pair<std::string, std::string>> headers,
                               std::span<const std::byte> payload, PayloadFormat format) {
  Event e;
  if (format == PayloadFormat::kTensorEvent) {
    auto decoded = Decode(payload);
    if (!decoded.ok()) return decoded.status();
    e = std::move(*decoded);
    for (const auto& [name, value] : headers) {
      if (name == kOriginHeader) {
        e.headers.Set(name, value);
      } else if (name == kMsgIdHeader && e.msg_id.empty()) {
        e.msg_id = value;
      } else if (name == kTraceparentHeader && e.trace == TraceContext{}) {
        auto t = ParseTraceparent(value);
        if (!t.ok()) return BadValue(name, value, std::string(t.status().message()));
        e.trace = *t;
      }
    }
    e.subject = std::string(subject);
    return e;
  }
  e.subject = std::string(subject);
  for (const auto& [name, value] : headers) {
    auto mapped = ReadMapped(name, value, e);
    if (!mapped.ok()) return mapped.status();
    if (!*mapped) e.headers.Set(name, value);
  }
  e.payload = Buffer::Copy(payload);
  return e;
}

}  // namespace inferq::nats
