// File: src/engine/lifecycle_records.cpp
//
// The lifecycle's record format (lifecycle_records.hpp).
#include "lifecycle_records.hpp"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"

namespace inferq {
namespace lifecycle_internal {
namespace {

constexpr std::size_t kMaxReason = 256;
constexpr std::size_t kMaxPrefix = 64;


}  // namespace

absl::Status ValidateReason(std::string_view reason) {
  bool ok = !reason.empty() && reason.size() <= kMaxReason;
  for (char c : reason) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u > 0x7e) ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError("reason " + QuoteValue(reason) +
                                    " must be 1 to 256 printable ASCII characters "
                                    "(0x20 to 0x7e)");
}

absl::Status ValidatePrefix(std::string_view p) {
  bool ok = !p.empty() && p.size() <= kMaxPrefix && p.front() != '.' && p.back() != '.' &&
            p.find("..") == std::string_view::npos;
  for (char c : p) {
    const bool good = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!good) ok = false;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "LifecycleOptions.key_prefix " + QuoteValue(p) +
      " must be 1 to 64 characters of A-Z a-z 0-9 _ - . (no '.' first, last or doubled)");
}

bool SplitFields(std::string_view v, std::size_t n, std::vector<std::string_view>* f) {
  f->clear();
  while (f->size() + 1 < n) {
    const std::size_t sp = v.find(' ');
    if (sp == std::string_view::npos) return false;
    f->push_back(v.substr(0, sp));
    v.remove_prefix(sp + 1);
  }
  f->push_back(v);
  return true;
}

std::string EncodeModel(const ModelInfo& m) {
  std::string out(kVersion);
  out += ' ';
  out += ModelStateName(m.state);
  out += ' ' + std::to_string(m.since_ns) + ' ' + std::to_string(m.generation) + ' ';
  out += m.reason;
  return out;
}

std::string EncodeMessage(const MessageInfo& m) {
  std::string out(kVersion);
  out += ' ';
  out += MessageStateName(m.state);
  out += ' ' + m.model + ' ' + std::to_string(m.enqueued_ns) + ' ' +
         std::to_string(m.since_ns) + ' ';
  out += m.reason;
  return out;
}

bool ParseModelState(std::string_view s, ModelState* out) {
  for (ModelState m : {ModelState::kWarmup, ModelState::kInference, ModelState::kEvicted}) {
    if (s == ModelStateName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

bool ParseMessageState(std::string_view s, MessageState* out) {
  for (MessageState m : {MessageState::kPending, MessageState::kProcessing,
                         MessageState::kCompleted, MessageState::kExpired}) {
    if (s == MessageStateName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

absl::Status Malformed(std::string_view key, std::string_view value, std::string_view what) {
  std::string shown(value.substr(0, 300));
  return absl::DataLossError("lifecycle key " + QuoteValue(key) + " has a malformed value " +
                             QuoteValue(shown) + (value.size() > 300 ? "..." : "") + ": " +
                             std::string(what));
}

absl::Status DecodeModel(std::string_view key, std::string_view v, ModelInfo* m) {
  std::vector<std::string_view> f;
  if (!SplitFields(v, 5, &f)) return Malformed(key, v, "expected 5 fields");
  if (f[0] != kVersion) return Malformed(key, v, "unknown version");
  if (!ParseModelState(f[1], &m->state)) return Malformed(key, v, "unknown model state");
  if (!ParseInt(f[2], &m->since_ns)) return Malformed(key, v, "bad since_ns");
  if (!ParseInt(f[3], &m->generation) || m->generation == 0) {
    return Malformed(key, v, "bad generation");
  }
  m->reason = std::string(f[4]);
  if ((m->state == ModelState::kEvicted) != !m->reason.empty() ||
      (!m->reason.empty() && !ValidateReason(m->reason).ok())) {
    return Malformed(key, v, "a reason must be given exactly when evicted");
  }
  return absl::OkStatus();
}

absl::Status DecodeMessage(std::string_view key, std::string_view v, MessageInfo* m) {
  std::vector<std::string_view> f;
  if (!SplitFields(v, 6, &f)) return Malformed(key, v, "expected 6 fields");
  if (f[0] != kVersion) return Malformed(key, v, "unknown version");
  if (!ParseMessageState(f[1], &m->state)) return Malformed(key, v, "unknown message state");
  if (!ValidateId("model", f[2]).ok()) return Malformed(key, v, "bad model name");
  m->model = std::string(f[2]);
  if (!ParseInt(f[3], &m->enqueued_ns)) return Malformed(key, v, "bad enqueued_ns");
  if (!ParseInt(f[4], &m->since_ns)) return Malformed(key, v, "bad since_ns");
  m->reason = std::string(f[5]);
  if ((m->state == MessageState::kExpired) != !m->reason.empty() ||
      (!m->reason.empty() && !ValidateReason(m->reason).ok())) {
    return Malformed(key, v, "a reason must be given exactly when expired");
  }
  return absl::OkStatus();
}

}  // namespace lifecycle_internal
}  // namespace inferq
