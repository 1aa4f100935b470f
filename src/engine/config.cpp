// StreamConfig::Validate and ConsumerConfig::Validate: the checks of a configuration
// alone (engine/config.hpp). Engine::AddStream and Engine::AddConsumer call them first,
// then check what needs the engine: the stream exists, the name is free, the
// filter overlaps the stream's subjects, member_nodes are nodes of the topology, the
// selection policy object is not another consumer's.
#include "inferq/engine/config.hpp"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/sched/duplicate_window.hpp"

namespace inferq {
namespace {

absl::Status ValidateLimit(const std::string& stream, const char* field, std::int64_t v) {
  if (v == -1 || v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError("stream '" + stream + "': " + field + " " +
                                    std::to_string(v) +
                                    " is invalid (use -1 for no limit or a positive value)");
}

// Members, lane capacity and their product, member_nodes count.
absl::Status ValidateLanes(const ConsumerConfig& config) {
  if (config.members == 0 || config.members > 4096) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': members " +
                                      std::to_string(config.members) +
                                      " is outside 1..4096");
  }
  if (config.lane_capacity == 0 || config.lane_capacity > ConsumerConfig::kMaxLaneSlots) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': lane_capacity " +
                                      std::to_string(config.lane_capacity) +
                                      " is outside 1.." + std::to_string(ConsumerConfig::kMaxLaneSlots));
  }
  // Lanes hold capacity rounded up to a power of two; bound the whole group.
  const std::size_t slots = std::bit_ceil(config.lane_capacity) * config.members;
  if (slots > ConsumerConfig::kMaxLaneSlots) {
    return absl::InvalidArgumentError(
        "consumer '" + config.name + "': members " + std::to_string(config.members) +
        " x lane_capacity " + std::to_string(config.lane_capacity) + " = " +
        std::to_string(slots) + " lane slots (after rounding up to powers of two) exceed " +
        std::to_string(ConsumerConfig::kMaxLaneSlots));
  }
  if (!config.member_nodes.empty() && config.member_nodes.size() != config.members) {
    return absl::InvalidArgumentError(
        "consumer '" + config.name + "': member_nodes has " +
        std::to_string(config.member_nodes.size()) + " entries for " +
        std::to_string(config.members) + " members");
  }
  return absl::OkStatus();
}

// accept_codecs: each a PayloadCodec, none repeated.
absl::Status ValidateCodecs(const ConsumerConfig& config) {
  for (std::size_t i = 0; i < config.accept_codecs.size(); ++i) {
    const PayloadCodec c = config.accept_codecs[i];
    if (c != PayloadCodec::kNone && c != PayloadCodec::kZstd) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': accept_codecs[" +
                                        std::to_string(i) + "] = " +
                                        std::to_string(static_cast<int>(c)) +
                                        " is not a PayloadCodec (0 none, 1 zstd)");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (config.accept_codecs[j] == c) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "': accept_codecs[" + std::to_string(i) + "] = " +
            std::to_string(static_cast<int>(c)) + " repeats accept_codecs[" +
            std::to_string(j) + "]");
      }
    }
  }
  return absl::OkStatus();
}

// Ack policy, group options, ack_wait, backoff, max_deliver, max_ack_pending, what
// needs explicit acks, dead_letter_subject.
absl::Status ValidateAcks(const ConsumerConfig& config) {
  if (config.ack != AckPolicy::kExplicit && config.ack != AckPolicy::kNone) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': ack policy " +
                                      std::to_string(static_cast<int>(config.ack)) +
                                      " is not a valid AckPolicy");
  }
  if (absl::Status s = MemberGroup::Validate(config.members, config.group); !s.ok()) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': " + std::string(s.message()));
  }
  if (config.ack_wait < absl::ZeroDuration() || config.ack_wait > kMaxDuration) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': ack_wait " +
                                      absl::FormatDuration(config.ack_wait) +
                                      " is invalid (zero for none, or up to 365 days)");
  }
  if (config.backoff.size() > 64) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': backoff has " +
                                      std::to_string(config.backoff.size()) +
                                      " entries; at most 64 are allowed");
  }
  for (std::size_t i = 0; i < config.backoff.size(); ++i) {
    const absl::Duration b = config.backoff[i];
    if (b <= absl::ZeroDuration() || b > kMaxDuration) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': backoff[" +
                                        std::to_string(i) + "] = " + absl::FormatDuration(b) +
                                        " is invalid (each entry > 0 and at most 365 days)");
    }
  }
  for (auto [field, v] : {std::pair{"max_deliver", config.max_deliver},
                          std::pair{"max_ack_pending", config.max_ack_pending}}) {
    if (v != -1 && v < 1) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': " + field + " " +
                                        std::to_string(v) +
                                        " is invalid (use -1 for no limit or a value >= 1)");
    }
  }
  if (config.ack == AckPolicy::kNone) {
    // Each of these would be ignored without acks: refuse, naming the first one set.
    std::string field;
    if (config.ack_wait > absl::ZeroDuration()) {
      field = "ack_wait " + absl::FormatDuration(config.ack_wait);
    } else if (!config.backoff.empty()) {
      field = "backoff";
    } else if (config.max_deliver != -1) {
      field = "max_deliver " + std::to_string(config.max_deliver);
    } else if (config.max_ack_pending != -1) {
      field = "max_ack_pending " + std::to_string(config.max_ack_pending);
    } else if (!config.dead_letter_subject.empty()) {
      field = "dead_letter_subject " + QuoteValue(config.dead_letter_subject);
    } else if (config.lifecycle != nullptr) {
      field = "lifecycle";
    }
    if (!field.empty()) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': " + field +
                                        " needs explicit acks (ack policy is none)");
    }
  }
  if (!config.dead_letter_subject.empty()) {
    if (absl::Status s = ValidateSubject(config.dead_letter_subject); !s.ok()) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': dead_letter_subject: " +
                                        std::string(s.message()));
    }
  }
  return absl::OkStatus();
}

// Overflow, queue timeout, QoS, batch policy, selection policy group size.
absl::Status ValidateScheduling(const ConsumerConfig& config) {
  if (config.overflow != OverflowPolicy::kBlock && config.overflow != OverflowPolicy::kReject &&
      config.overflow != OverflowPolicy::kDropOldest) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': overflow policy " +
                                      std::to_string(static_cast<int>(config.overflow)) +
                                      " is not a valid OverflowPolicy");
  }
  if (config.queue_timeout < absl::ZeroDuration() || config.queue_timeout > kMaxDuration) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': queue_timeout " +
                                      absl::FormatDuration(config.queue_timeout) +
                                      " is invalid (zero for none, or up to 365 days)");
  }
  if (config.timeout_action != TimeoutAction::kReject &&
      config.timeout_action != TimeoutAction::kDelay) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': timeout action " +
                                      std::to_string(static_cast<int>(config.timeout_action)) +
                                      " is not a valid TimeoutAction");
  }
  if (config.qos && config.overflow == OverflowPolicy::kDropOldest) {
    return absl::InvalidArgumentError(
        "consumer '" + config.name + "': overflow drop-oldest needs a FIFO lane; with qos "
        "use reject, block, or QosConfig::preemption (a higher priority evicts the lowest)");
  }
  if (config.qos) {
    QosConfig qc = *config.qos;
    qc.capacity = static_cast<std::uint32_t>(std::min<std::size_t>(config.lane_capacity, 1u << 24));
    if (absl::Status s = QosConfig::Validate(qc); !s.ok()) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': " + std::string(s.message()));
    }
  }
  if (absl::Status s = BatchPolicy::Validate(config.batch); !s.ok()) {
    return absl::InvalidArgumentError("consumer '" + config.name + "': " + std::string(s.message()));
  }
  if (config.selection != nullptr) {
    if (absl::Status s = config.selection->CheckGroupSize(config.members); !s.ok()) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': " + std::string(s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::Status ValidateStorage(const StreamConfig& config) {
  const std::string where = "stream '" + config.name + "': ";
  const int storage = static_cast<int>(config.storage);
  if (storage < 0 || storage > static_cast<int>(StorageType::kFile)) {
    return absl::InvalidArgumentError(where + "storage " + std::to_string(storage) +
                                      " is not a StorageType (0 memory, 1 file)");
  }
  if (config.storage == StorageType::kMemory) {
    if (!config.directory.empty()) {
      return absl::InvalidArgumentError(where + "directory " + QuoteValue(config.directory) +
                                        " is set but storage is memory");
    }
    return absl::OkStatus();
  }
  if (config.directory.empty()) {
    return absl::InvalidArgumentError(where + "storage file needs a directory");
  }
  if (config.retention == RetentionPolicy::kInterest) {
    return absl::InvalidArgumentError(where + "storage file supports retention limits and "
                                      "work queue only (interest retention needs the acks of "
                                      "every consumer kept per message)");
  }
  const int sync = static_cast<int>(config.sync);
  if (sync < 0 || sync > static_cast<int>(SyncPolicy::kNone)) {
    return absl::InvalidArgumentError(where + "sync " + std::to_string(sync) +
                                      " is not a SyncPolicy (0 every commit, 1 group commit, "
                                      "2 interval, 3 none)");
  }
  if (config.sync_window < absl::ZeroDuration() || config.sync_window > absl::Seconds(10)) {
    return absl::InvalidArgumentError(where + "sync_window " +
                                      absl::FormatDuration(config.sync_window) +
                                      " is outside 0 .. 10s");
  }
  if (config.sync == SyncPolicy::kInterval && config.sync_window <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(where + "sync interval needs a sync_window > 0");
  }
  if (config.segment_bytes < 4096 || config.segment_bytes > (std::uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(where + "segment_bytes " +
                                      std::to_string(config.segment_bytes) +
                                      " is outside 4096 .. 2^40");
  }
  return absl::OkStatus();
}

absl::Status ValidateDeliver(const ConsumerConfig& config) {
  const std::string where = "consumer '" + config.name + "': ";
  const int d = static_cast<int>(config.deliver);
  if (d < 0 || d > static_cast<int>(DeliverPolicy::kByStartTime)) {
    return absl::InvalidArgumentError(where + "deliver policy " + std::to_string(d) +
                                      " is not a DeliverPolicy");
  }
  const int r = static_cast<int>(config.replay);
  if (r < 0 || r > static_cast<int>(ReplayPolicy::kOriginal)) {
    return absl::InvalidArgumentError(where + "replay policy " + std::to_string(r) +
                                      " is not a ReplayPolicy");
  }
  const bool by_seq = config.deliver == DeliverPolicy::kByStartSequence;
  if (by_seq && config.start_seq == 0) {
    return absl::InvalidArgumentError(where + "deliver by start sequence needs start_seq >= 1");
  }
  if (!by_seq && config.start_seq != 0) {
    return absl::InvalidArgumentError(where + "start_seq " + std::to_string(config.start_seq) +
                                      " is set but the deliver policy is not by start sequence");
  }
  const bool by_time = config.deliver == DeliverPolicy::kByStartTime;
  const bool finite = config.start_time != absl::InfinitePast() &&
                      config.start_time != absl::InfiniteFuture();
  if (by_time && !finite) {
    return absl::InvalidArgumentError(where + "deliver by start time needs a finite start_time");
  }
  if (!by_time && config.start_time != absl::InfinitePast()) {
    return absl::InvalidArgumentError(where + "start_time " +
                                      absl::FormatTime(absl::RFC3339_full, config.start_time,
                                                       absl::UTCTimeZone()) +
                                      " is set but the deliver policy is not by start time");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StreamConfig::Validate(const StreamConfig& config) {
  if (absl::Status s = ValidateName("stream", config.name); !s.ok()) return s;
  if (config.subjects.empty()) {
    return absl::InvalidArgumentError("stream '" + config.name + "' has no subjects");
  }
  for (const std::string& subject : config.subjects) {
    absl::StatusOr<SubjectPattern> p = SubjectPattern::Parse(subject);
    if (!p.ok()) {
      return absl::InvalidArgumentError("stream '" + config.name + "': " +
                                        std::string(p.status().message()));
    }
  }
  for (auto [field, v] : {std::pair{"max_msgs", config.max_msgs},
                          std::pair{"max_bytes", config.max_bytes},
                          std::pair{"max_msg_size", config.max_msg_size},
                          std::pair{"max_msgs_per_subject", config.max_msgs_per_subject}}) {
    if (absl::Status s = ValidateLimit(config.name, field, v); !s.ok()) return s;
  }
  if (config.max_age < absl::ZeroDuration() || config.max_age == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("stream '" + config.name + "': max_age " +
                                      absl::FormatDuration(config.max_age) +
                                      " is invalid (use zero for no limit or a positive, "
                                      "finite duration)");
  }
  if (config.discard != DiscardPolicy::kOld && config.discard != DiscardPolicy::kNew) {
    return absl::InvalidArgumentError("stream '" + config.name + "': discard policy " +
                                      std::to_string(static_cast<int>(config.discard)) +
                                      " is not a valid DiscardPolicy");
  }
  if (config.retention != RetentionPolicy::kLimits &&
      config.retention != RetentionPolicy::kInterest &&
      config.retention != RetentionPolicy::kWorkQueue) {
    return absl::InvalidArgumentError("stream '" + config.name + "': retention policy " +
                                      std::to_string(static_cast<int>(config.retention)) +
                                      " is not a valid RetentionPolicy");
  }
  if (config.duplicate_window < absl::ZeroDuration() ||
      config.duplicate_window > kMaxDuration) {
    return absl::InvalidArgumentError("stream '" + config.name + "': duplicate_window " +
                                      absl::FormatDuration(config.duplicate_window) +
                                      " is invalid (zero for off, or up to 365 days)");
  }
  if (config.duplicate_window_max_entries < 1 ||
      config.duplicate_window_max_entries > DuplicateWindow::kMaxEntries) {
    return absl::InvalidArgumentError("stream '" + config.name +
                                      "': duplicate_window_max_entries " +
                                      std::to_string(config.duplicate_window_max_entries) +
                                      " is outside 1.." +
                                      std::to_string(DuplicateWindow::kMaxEntries));
  }
  return ValidateStorage(config);
}

absl::Status ConsumerConfig::Validate(const ConsumerConfig& config) {
  if (absl::Status s = ValidateName("consumer", config.name); !s.ok()) return s;
  if (absl::Status s = ValidateDeliver(config); !s.ok()) return s;
  for (absl::Status (*check)(const ConsumerConfig&) :
       {ValidateLanes, ValidateCodecs, ValidateAcks, ValidateScheduling}) {
    if (absl::Status s = check(config); !s.ok()) return s;
  }
  if (!config.filter_subject.empty()) {
    absl::StatusOr<SubjectPattern> p = SubjectPattern::Parse(config.filter_subject);
    if (!p.ok()) {
      return absl::InvalidArgumentError("consumer '" + config.name + "': filter " +
                                        std::string(p.status().message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace inferq
