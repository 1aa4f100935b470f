// File: src/engine/stream_state.hpp (not API)
//
// StreamState: one stream's messages (in sequence order), its consumers, limits,
// duplicate window and counters, and the operations on them that need its mutex
// (TrimFront, CompactIfSparse, MakeRoom, and the store's Admit and Append; the
// refusals' messages in stream_store.cpp).
//
// Where the messages are: a memory stream holds each one's record (StoredMessage,
// with its event) in `messages`. A file stream holds only an IndexEntry per message
// in `index` (sequence, publish time, size, where its record is in the log): its
// events live in the log, and in memory only while deliveries hold them (a lane, a
// pending ack, a catch-up), so a stream of any size takes 48 bytes per message.
// What reads a file stream's stored events reads them back from the log
// (LoadFromLog).
//
// Thread safety: `mu` guards the messages, the sequence, the consumer list and the
// duplicate window; the counters are atomics read by Stats() without it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "inferq/base/cache_line.hpp"
#include "consumer_state.hpp"
#include "handle_queue.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/sched/duplicate_window.hpp"
#include "inferq/state/stream_log.hpp"

namespace inferq {
namespace engine_internal {

// What StreamState::Admit decided for one event: a duplicate (its original
// sequence), a refusal by a limit, or neither (the event may be stored).
struct Admission {
  std::optional<std::uint64_t> duplicate_of;
  absl::Status refusal;
};

// kFile: what a file stream keeps in memory of one stored message; its event is in
// the log at `location`.
struct IndexEntry {
  std::uint64_t seq = 0;
  std::int64_t publish_ns = 0;  // engine clock
  std::uint64_t bytes = 0;      // Event::StoredSize
  StreamLog::Location location;
};

struct StreamState {
  StreamConfig config;
  // kFile: config.directory made absolute and normal once, when the stream was added
  // (a later chdir does not move it).
  std::filesystem::path normal_dir;
  std::vector<SubjectPattern> patterns;
  const Clock* clock = nullptr;

  std::mutex mu;
  // The stored messages, in ascending seq, when the stream needs them at hand
  // (KeepsIndex); otherwise empty, and a message lives as long as its deliveries.
  // kFile: always empty; `index` holds the stored messages instead.
  HandleQueue<Handle> messages;             // guarded by mu
  bool keeps_index = true;                  // KeepsIndex(config), set before first use
  // kFile: one entry per stored message, in ascending seq (no gaps but for what
  // limits removed from the front).
  HandleQueue<IndexEntry> index;            // guarded by mu
  // kFile: the sequence of the oldest message kept (next_seq when none): a delivery
  // of a message below it is of one the stream discarded (Discarded). Written under
  // mu with release; read by deliveries without it. A memory stream leaves it at 1
  // (its records carry their own state).
  std::atomic<std::uint64_t> first_kept{1};
  // kFile: where AppendToLog put the message Append stores next. Guarded by mu.
  StreamLog::Location appended_at;
  std::uint64_t next_seq = 1;               // guarded by mu
  // next_seq when recovery ended (FinishRecovery), before the stream was visible;
  // constant after, so read without mu. A durable consumer's ack-log records beyond
  // it speak of a tail the log lost (OpenAckLog), not of this run's publishes.
  std::uint64_t recovered_next_seq = 1;
  std::vector<ConsumerState*> consumers;    // guarded by mu
  // Consumers with a non-empty accept_codecs (Publish's conversion pre-pass,
  // Engine::Impl::ConvertBeforeStore, runs only for streams that have one). Written
  // under mu; relaxed reads outside it.
  std::atomic<std::uint32_t> codec_restricted{0};

  // The live messages and bytes, counted per side and read as a difference
  // (LiveMsgs, LiveBytes), so that an ack on a member's core does not write a line
  // the publisher writes on every publish:
  //  1. added_msgs / added_bytes only grow, in Append, under mu.
  //  2. RetireCounts::msgs / bytes only grow, in Retire, by the thread whose state
  //     CAS retires the message: a publisher under mu (limits, max_age) or, under
  //     interest retention, the member whose ack was the last (settle.cpp). They
  //     have a cache line of their own.
  //  3. A message is retired only after its Append (its record reaches a retiring
  //     thread through mu or a lane), so retired <= added, and under mu the
  //     difference is exact but for retirements not yet visible (a count read
  //     relaxed, as the single live count was before).
  //  4. Publish reads the retired side only when a limit or CompactIfSparse needs
  //     the live count: a stream without max_msgs / max_bytes never reads it.
  // Read by Stats() without mu; written under mu, except (2).
  std::atomic<std::int64_t> added_msgs{0};
  std::atomic<std::int64_t> added_bytes{0};
  std::atomic<std::uint64_t> last_seq{0};
  std::atomic<std::uint64_t> stored{0};
  std::atomic<std::uint64_t> rejected{0};
  std::atomic<std::uint64_t> duplicates{0};
  std::atomic<std::uint64_t> dedup_evicted{0};  // DuplicateWindow::evicted(), copied under mu
  std::unique_ptr<DuplicateWindow> dedup;   // guarded by mu; nullptr = off
  // StorageType::kFile: the stream's log, whose tx_id of each message is its
  // sequence (invariant: the log holds message records only, appended under mu in
  // sequence order). Appended to under mu; Sync'ed by the publisher after mu.
  std::unique_ptr<StreamLog> log;
  const ZstdDictionaries* dictionaries = nullptr;  // for the log's encoding
  // Publishes waiting in a blocking push on a full lane while they hold mu. TryPublish
  // reads it to refuse instead of waiting for mu (it never waits for a lane).
  std::atomic<std::uint32_t> blocked_publishers{0};
  // What Retire counts (invariant 2), on a cache line of its own.
  struct alignas(kCacheLineSize) RetireCounts {
    std::atomic<std::int64_t> msgs{0};
    std::atomic<std::int64_t> bytes{0};
    std::atomic<std::uint64_t> discarded{0};
    std::atomic<std::uint64_t> acked_out{0};
  };
  RetireCounts retired;
  static_assert(sizeof(RetireCounts) == kCacheLineSize);

  // Live messages and bytes (invariant 3). Exact under mu but for retirements not yet
  // visible; Stats() reads them without mu and clamps them at 0. acquire: a message
  // whose retirement this load sees had its Append ordered before that retirement
  // (release, Retire), so the later load of the added count includes it: the
  // difference is never negative.
  std::int64_t LiveMsgs() const {
    const std::int64_t out = retired.msgs.load(std::memory_order_acquire);
    return added_msgs.load(std::memory_order_relaxed) - out;
  }
  std::int64_t LiveBytes() const {
    const std::int64_t out = retired.bytes.load(std::memory_order_acquire);
    return added_bytes.load(std::memory_order_relaxed) - out;
  }

  // Locks mu for a publish that must not wait: spins (yielding) while a publisher
  // holds mu for its short critical section; false, with mu not held, when the
  // holder is blocked on a full lane.
  bool LockUnlessBlocked(std::unique_lock<std::mutex>& lock) {
    while (!lock.try_lock()) {
      // acquire: pairs with the increment the blocked publisher makes before waiting.
      if (blocked_publishers.load(std::memory_order_acquire) > 0) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Moves a live message to `to` (kDiscarded or kDone) exactly once; the winner
  // takes it out of the live counts.
  bool Retire(StoredMessage& m, MsgState to) {
    std::uint8_t expected = kLive;
    if (!m.state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) return false;
    // release: pairs with LiveMsgs / LiveBytes (invariant 3).
    retired.msgs.fetch_add(1, std::memory_order_release);
    retired.bytes.fetch_add(static_cast<std::int64_t>(m.bytes), std::memory_order_release);
    (to == kDiscarded ? retired.discarded : retired.acked_out)
        .fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // kFile: takes the message of index entry `e` (being removed by a limit or
  // max_age) out of the live counts. The stream is the only one that retires a file
  // stream's messages, under mu. Requires mu.
  void RetireEntry(const IndexEntry& e) {
    retired.msgs.fetch_add(1, std::memory_order_release);  // pairs with LiveMsgs
    retired.bytes.fetch_add(static_cast<std::int64_t>(e.bytes), std::memory_order_release);
    retired.discarded.fetch_add(1, std::memory_order_relaxed);
  }
  // kFile: first_kept after the front of the index changed. Requires mu.
  void PublishFirstKept() {
    // release: a delivery that reads the new value sees the stream's state before it.
    first_kept.store(index.empty() ? next_seq : index.front().seq, std::memory_order_release);
  }
  // Whether `m` is a message the stream discarded (a limit or max_age): its queued
  // deliveries are skipped. Memory streams mark the record (Retire); a file stream's
  // records are copies read back from the log, so it is the sequence that tells.
  bool Discarded(const StoredMessage& m) const {
    return m.state.load(std::memory_order_acquire) == kDiscarded ||
           m.seq < first_kept.load(std::memory_order_acquire);
  }

  // Whether a stream of `config` must hold its messages in `messages`: under limits
  // retention they are what the stream keeps; under interest retention only a limit
  // that removes live messages from the front reads them (max_age in TrimFront;
  // max_msgs or max_bytes with discard old in MakeRoom). Without one, holding them
  // only delays freeing each record until a later publish trims it, and that trim
  // reads lines the acking member wrote last (its state and reference count): a
  // cache miss per event on the publisher, a quarter of its samples in BM_EndToEnd
  // (BENCHMARKS.md, fourth round). The live counts and discard new's refusals do not
  // read `messages` (invariant 3).
  static bool KeepsIndex(const StreamConfig& config) {
    if (config.retention == RetentionPolicy::kLimits) return true;
    if (config.max_age > absl::ZeroDuration()) return true;
    return config.discard == DiscardPolicy::kOld && (config.max_msgs > 0 || config.max_bytes > 0);
  }

  bool Expired(std::int64_t publish_ns, std::int64_t now_ns) const {
    return config.max_age > absl::ZeroDuration() &&
           now_ns - publish_ns > absl::ToInt64Nanoseconds(config.max_age);
  }
  bool Expired(const StoredMessage& m, std::int64_t now_ns) const {
    return Expired(m.publish_ns, now_ns);
  }

  // Drops retired messages and enforces max_age at the front. Requires mu.
  void TrimFront(std::int64_t now_ns) {
    if (log != nullptr) {
      if (index.empty() || !Expired(index.front().publish_ns, now_ns)) return;
      do {
        RetireEntry(index.front());
        index.pop_front();
      } while (!index.empty() && Expired(index.front().publish_ns, now_ns));
      PublishFirstKept();
      return;
    }
    while (!messages.empty()) {
      StoredMessage& m = *messages.front();
      if (m.state.load(std::memory_order_acquire) == kLive) {
        if (!Expired(m, now_ns)) break;
        Retire(m, kDiscarded);
      }
      messages.pop_front();
    }
  }

  // Interest retention retires messages out of order (acks), and TrimFront only
  // drops them from the front: one old unacked message would pin every later,
  // already acked one. When retired entries outnumber live ones, drop them all:
  // amortized O(1) per publish, and memory stays within twice the live messages.
  // Requires mu.
  void CompactIfSparse() {
    if (messages.size() < 64) return;  // the live count only when needed (invariant 4)
    const auto live = static_cast<std::size_t>(std::max<std::int64_t>(0, LiveMsgs()));
    if (messages.size() <= 2 * live) return;
    messages.erase_if([](const Handle& h) {
      return h->state.load(std::memory_order_acquire) != kLive;
    });
  }

  // Discard-old: removes the oldest live messages until `bytes_needed` more bytes and
  // one more message fit. Requires mu.
  void MakeRoom(std::uint64_t bytes_needed) {
    auto over = [&] {  // the live counts only for a limit that is set (invariant 4)
      return (config.max_msgs > 0 && LiveMsgs() + 1 > config.max_msgs) ||
             (config.max_bytes > 0 &&
              LiveBytes() + static_cast<std::int64_t>(bytes_needed) > config.max_bytes);
    };
    if (log != nullptr) {
      if (!over()) return;
      while (!index.empty() && over()) {
        RetireEntry(index.front());
        index.pop_front();
      }
      PublishFirstKept();
      return;
    }
    while (over() && !messages.empty()) {
      Retire(*messages.front(), kDiscarded);
      messages.pop_front();
    }
  }

  // The stream store's admit call, at `now` for an event of `bytes`
  // (Event::StoredSize): trims the front (max_age), then finds a duplicate (when
  // `check_duplicates`; dead letters are not checked) or a limit that refuses it
  // (CheckLimits). Changes nothing else. Requires mu. Always inline, with Append:
  // both run on every publish, a call per step cost more than some steps
  // (BENCHMARKS.md, "The engine's data path in instructions"), and GCC kept both out
  // of PublishToStream when they were only `inline`.
  [[gnu::always_inline]] Admission Admit(const Event& incoming, std::uint64_t bytes,
                                         std::int64_t now, bool check_duplicates) {
    TrimFront(now);
    CompactIfSparse();
    Admission a;
    if (dedup != nullptr && !incoming.msg_id.empty() && check_duplicates) {
      dedup->Expire(now);
      if (std::optional<std::uint64_t> original = dedup->Find(incoming.msg_id, now)) {
        a.duplicate_of = original;
        return a;
      }
    }
    if (config.max_msg_size > 0 || config.discard == DiscardPolicy::kNew || config.max_bytes > 0) {
      a.refusal = CheckLimits(bytes);
    }
    return a;
  }
  // The limits that refuse an event of `bytes` (stream_store.cpp): max_msg_size
  // (InvalidArgument), discard new or max_bytes (ResourceExhausted), naming the
  // stream; OK when none does. Requires mu.
  absl::Status CheckLimits(std::uint64_t bytes) const;
  // kFile: appends `ev` (to be stored as sequence next_seq) to the log, written to the
  // OS when it returns, and notes where (appended_at) for Append; the caller syncs it
  // after letting go of mu. The log's error (naming the stream) when it cannot, and
  // then nothing is stored. Requires mu.
  absl::Status AppendToLog(const Event& ev, std::uint64_t bytes);
  // kFile: the stored message of `e` read back from the log, as a new record for
  // deliveries (its state kLive, its stream this). kNotFound when its segment was
  // retired, kDataLoss when the log's bytes there are not its record (naming the
  // stream, the directory and the sequence). Thread-safe (the log is): mu need not be
  // held, but `e` must be a copy when it is not.
  absl::StatusOr<Handle> LoadFromLog(const IndexEntry& e) const;
  // kFile: removes the log segments that hold only messages limits have removed.
  // Requires mu.
  void RetireLog();
  // kFile recovery, before the stream is published to the engine: RecoverOne puts
  // the message of log record `tx` (at `location`) back in `index` with its
  // sequence, publish time (mapped onto the engine clock: `now_ns` on it is
  // `wall_now_ns`) and, when it is still inside the duplicate window, its msg_id
  // there; the event itself is not decoded. FinishRecovery then applies the limits.
  absl::Status RecoverOne(std::uint64_t tx, const StreamLog::Location& location,
                          std::string_view value, std::int64_t now_ns, std::int64_t wall_now_ns);
  void FinishRecovery(std::int64_t now_ns);
  // Stores an admitted event as `record` (allocated by the caller): discard old
  // makes room, the record gets the next sequence, the counters and (when
  // `record_duplicate`) the duplicate window learn it, and it is kept unless interest
  // retention has nobody to wait for. The caller has set the record's event and
  // conversions. Requires mu.
  [[gnu::always_inline]] void Append(const std::shared_ptr<StoredMessage>& record,
                                     std::int64_t now, std::uint64_t bytes,
                                     std::uint32_t explicit_acks, bool record_duplicate) {
    if (config.discard == DiscardPolicy::kOld) MakeRoom(bytes);
    record->stream = this;
    record->seq = next_seq++;
    record->publish_ns = now;
    record->bytes = bytes;
    record->pending_acks.store(explicit_acks, std::memory_order_relaxed);

    // relaxed: written under mu (invariant 1); a retiring thread gets the record, and
    // so this ordering, through mu or a lane.
    added_msgs.fetch_add(1, std::memory_order_relaxed);
    added_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    stored.fetch_add(1, std::memory_order_relaxed);
    last_seq.store(record->seq, std::memory_order_relaxed);
    if (dedup != nullptr && !record->event->msg_id.empty() && record_duplicate) {
      dedup->Insert(record->event->msg_id, record->seq, now);
      dedup_evicted.store(dedup->evicted(), std::memory_order_relaxed);
    }
    if (log != nullptr) {  // kFile: limits retention only (StreamConfig::Validate)
      index.push_back(IndexEntry{record->seq, now, bytes, appended_at});
    } else if (config.retention == RetentionPolicy::kInterest && explicit_acks == 0) {
      // Nobody will ack it: under interest retention it is done once queued.
      Retire(*record, kDone);
    } else if (keeps_index) {
      messages.push_back(record);
    }
  }
};

}  // namespace engine_internal
}  // namespace inferq
