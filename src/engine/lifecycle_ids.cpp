// File: src/engine/lifecycle_ids.cpp
//
// The records a consumer's lifecycle (ConsumerConfig::lifecycle) keeps of the
// stream's messages, named "<stream>/<consumer>/<incarnation>/<seq>" (LifecycleId),
// and when the engine forgets them: no delivery can need a record once its message
// is settled for good (Message::Ack and AckSync, DeadLetter), was removed by the
// stream (ForgetDiscarded), belongs to an earlier life of the stream or of the
// consumer (RetireLifecycleRecords, as the consumer is added), or to a consumer
// deleted (ForgetConsumerRecords). Every call here is best effort: a commit that
// fails leaves its record for the next sweep.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "engine_impl.hpp"
#include "inferq/engine/lifecycle.hpp"

namespace inferq {
namespace engine_internal {

namespace {

bool Finished(const MessageInfo& info) {
  return info.state == MessageState::kCompleted || info.state == MessageState::kExpired;
}

// Expires (when live) and forgets record `id`.
void ExpireAndForget(Lifecycle& lc, const std::string& id, const MessageInfo& info,
                     const std::string& why) {
  if (!Finished(info)) (void)lc.Expire(id, why);
  (void)lc.Forget(id);
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

}  // namespace

void RetireLifecycleRecords(StreamState& stream, ConsumerState& c) {
  Lifecycle& lc = *c.config.lifecycle;
  // A file stream's messages below its first kept are gone for good.
  const std::uint64_t first = stream.log != nullptr ? stream.first_seq.load(std::memory_order_relaxed) : 0;
  const std::string stream_prefix = c.config.stream + "/";
  const std::string consumer_prefix = stream_prefix + c.config.name + "/";
  for (const auto& [id, info] : lc.Messages(stream_prefix)) {
    const std::string_view rest = std::string_view(id).substr(stream_prefix.size());
    // "<stream>/<seq>": the ids of a version without consumer and incarnation.
    const bool unversioned = AllDigits(rest);
    if (!unversioned && id.rfind(consumer_prefix, 0) != 0) continue;  // another consumer's
    if (id.rfind(c.lifecycle_prefix, 0) == 0) {
      std::uint64_t seq = 0;
      const char* begin = id.data() + c.lifecycle_prefix.size();
      const char* end = id.data() + id.size();
      const auto [p, ec] = std::from_chars(begin, end, seq);
      if (ec != std::errc() || p != end) continue;
      const bool acked = c.resume.started && (seq <= c.resume.floor || c.resume.acked.contains(seq));
      if (stream.log != nullptr && seq < first) {
        ExpireAndForget(lc, id, info, "its message was removed from stream '" + c.config.stream + "'");
      } else if (Finished(info) && acked) {
        (void)lc.Forget(id);
      }
      continue;
    }
    ExpireAndForget(lc, id, info,
                    "its message was lost with an earlier life of stream '" + c.config.stream + "'");
  }
}

void ForgetConsumerRecords(ConsumerState& c) {
  if (c.config.lifecycle == nullptr) return;
  Lifecycle& lc = *c.config.lifecycle;
  for (const auto& [id, info] : lc.Messages(c.lifecycle_prefix)) {
    ExpireAndForget(lc, id, info, "consumer '" + c.config.name + "' was deleted");
  }
}

void ForgetDiscarded(ConsumerState& c, std::uint64_t seq) {
  if (c.config.lifecycle == nullptr) return;
  Lifecycle& lc = *c.config.lifecycle;
  const std::string id = LifecycleId(c, seq);
  absl::StatusOr<MessageInfo> info = lc.GetMessage(id);
  if (!info.ok()) return;  // never delivered: no record
  ExpireAndForget(lc, id, *info, "its message was removed from stream '" + c.config.stream + "'");
}

}  // namespace engine_internal
}  // namespace inferq
