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
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inferq/base/adaptive_mutex.hpp"
#include "inferq/base/cache_line.hpp"
#include "inferq/base/owned_stats.hpp"
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
  // The event's msg_id hash when the duplicate window looked it up, for Append's
  // insert of the same id: one hash per publish.
  std::optional<std::size_t> msg_id_hash;
};

// kFile: what a file stream keeps in memory of one stored message; its event is in
// the log at location().
struct IndexEntry {
  std::uint64_t seq = 0;
  std::int64_t publish_ns = 0;  // engine clock
  std::uint64_t bytes = 0;      // Event::StoredSize
  std::uint64_t segment = 0;    // StreamLog::Location, unpacked so that `removed`
  std::uint64_t offset = 0;     // fits in its padding
  std::uint32_t length = 0;
  // 1: removed from the middle of the stream (Engine::PurgeStream,
  // max_msgs_per_subject) but not yet dropped from the index (PopRemovedFront,
  // CompactIndex). Its message is out of the live counts.
  std::uint32_t removed = 0;
  static IndexEntry Of(std::uint64_t seq, std::int64_t publish_ns, std::uint64_t bytes,
                       const StreamLog::Location& at) {
    return IndexEntry{seq, publish_ns, bytes, at.segment, at.offset, at.bytes, 0};
  }
  StreamLog::Location location() const { return {segment, offset, length}; }
};
static_assert(sizeof(IndexEntry) == 48, "an index entry is 48 bytes (StreamConfig::storage)");

// StreamConfig::max_msgs_per_subject: the sequences stored under one subject, oldest
// first from `head`. Sequences of messages removed otherwise (limits, max_age,
// purges) stay until they are popped: every such removal takes a subject's oldest
// messages first, so the ones left behind are always a prefix, and popping the
// oldest (a no-op for one already gone) keeps the newest max_msgs_per_subject.
struct SubjectSeqs {
  absl::InlinedVector<std::uint64_t, 2> seqs;
  std::size_t head = 0;
  std::size_t size() const { return seqs.size() - head; }
  std::uint64_t front() const { return seqs[head]; }
  std::uint64_t back() const { return seqs.back(); }
  void push_back(std::uint64_t seq) { seqs.push_back(seq); }
  void pop_front() {
    if (++head > 8 && head * 2 > seqs.size()) {
      seqs.erase(seqs.begin(), seqs.begin() + static_cast<std::ptrdiff_t>(head));
      head = 0;
    }
  }
};

// A set of sequences held as disjoint ranges [first, end): a file stream's
// sequences removed from the middle. A work queue acks mostly in order, so the
// removals above a message that waits merge into a range or a few: memory follows
// the gaps (the messages still held), not the messages that passed through.
class SeqRanges {
 public:
  bool empty() const { return ranges_.empty(); }
  std::size_t ranges() const { return ranges_.size(); }
  bool contains(std::uint64_t seq) const {
    auto it = ranges_.upper_bound(seq);  // the first range starting above seq
    if (it == ranges_.begin()) return false;
    --it;
    return seq < it->second;
  }
  void insert(std::uint64_t seq) {
    auto next = ranges_.upper_bound(seq);
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (seq < prev->second) return;  // held already
      if (prev->second == seq) {       // extends the range before it
        prev->second = seq + 1;
        if (next != ranges_.end() && next->first == seq + 1) {
          prev->second = next->second;
          ranges_.erase(next);
        }
        return;
      }
    }
    if (next != ranges_.end() && next->first == seq + 1) {  // extends the one after it
      const std::uint64_t end = next->second;
      ranges_.erase(next);
      ranges_.emplace(seq, end);
      return;
    }
    ranges_.emplace(seq, seq + 1);
  }
  // Drops every sequence below `first`.
  void erase_below(std::uint64_t first) {
    while (!ranges_.empty() && ranges_.begin()->first < first) {
      auto it = ranges_.begin();
      const std::uint64_t end = it->second;
      ranges_.erase(it);
      if (end > first) {
        ranges_.emplace(first, end);
        break;
      }
    }
  }

 private:
  absl::btree_map<std::uint64_t, std::uint64_t> ranges_;  // first -> end
};

// Why a message leaves a stream from the middle, for the counts it goes to:
// StreamStats::discarded, purged, acked_out.
enum class Removal { kLimit, kPurge, kAck };

// Engine::PurgeStream's request, checked (InvalidArgument otherwise): `filter` empty
// or a parsed pattern; at most one of `sequence` and `keep` set.
struct Purge {
  std::optional<SubjectPattern> filter;
  std::uint64_t sequence = 0;  // remove only sequences below it (0: no bound)
  std::uint64_t keep = 0;      // keep the newest `keep` that match (0: none)
  // kFile: the stream's last sequence when the purge was made; a replay at recovery
  // applies it to the messages up to there only.
  std::uint64_t last_seq = 0;
  // kFile work queue: the last record of the removed log when the purge was made; a
  // replay applies the acks up to it first.
  std::uint64_t removed_tx = 0;
};

// StreamState::mu: spins a little before it sleeps (base/adaptive_mutex.hpp).
// Publishers hold it for a short critical section; several publishers of one stream
// (the replicas of the main example) would otherwise put each other to sleep and pay
// a futex wake on every contended unlock. Inline, its uncontended pair costs about a
// tenth of glibc's adaptive pthread mutex's calls, which it replaced.
using StreamMutex = AdaptiveMutex;

struct StreamCursors;  // cursor.hpp

struct StreamState {
  StreamConfig config;
  // The log its cursor consumers read (cursor.hpp); null until the first one is
  // added. Appended to under mu.
  std::shared_ptr<StreamCursors> cursors;
  // `cursors` once made (it stays while the stream lives), for Stats, which does not
  // take mu.
  std::atomic<const StreamCursors*> cursors_made{nullptr};
  ~StreamState();
  // kFile: config.directory made absolute and normal once, when the stream was added
  // (a later chdir does not move it).
  std::filesystem::path normal_dir;
  std::vector<SubjectPattern> patterns;
  const Clock* clock = nullptr;
  // 16 hex digits naming this life of the stream: a file stream's log id (the same
  // after a restart, new once its directory is made again), a memory stream's random
  // at AddStream. Lifecycle ids carry it (LifecycleId), so that a sequence numbered
  // again from 1 (a memory stream in the next process, a stream deleted and added
  // again) never names the record of an earlier message. Constant once added.
  std::string incarnation;

  StreamMutex mu;
  // The stored messages, in ascending seq, when the stream needs them at hand
  // (KeepsIndex); otherwise empty, and a message lives as long as its deliveries.
  // kFile: always empty; `index` holds the stored messages instead.
  HandleQueue<Handle> messages;             // guarded by mu
  bool keeps_index = true;                  // KeepsIndex(config), set before first use
  // kFile: one entry per stored message, in ascending seq (no gaps but for what
  // limits removed from the front).
  HandleQueue<IndexEntry> index;            // guarded by mu
  // kFile: the position in `index` of the first entry whose sequence is `seq` or
  // above (index.size() when none is); binary search. Requires mu.
  std::size_t IndexPosition(std::uint64_t seq) const {
    std::size_t lo = 0;
    std::size_t hi = index.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (index.at(mid).seq < seq) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
  // kFile: the sequence of the oldest message kept (next_seq when none): a delivery
  // of a message below it is of one the stream discarded (Discarded). Written under
  // mu with release; read by deliveries without it. A memory stream leaves it at 1
  // (its records carry their own state).
  std::atomic<std::uint64_t> first_kept{1};
  // kFile: where AppendToLog put the message Append stores next. Guarded by mu.
  StreamLog::Location appended_at;
  std::uint64_t next_seq = 1;               // guarded by mu
  // The oldest sequence the stream may still hold (next_seq when it holds none),
  // for StreamStats::first_seq: a file stream's first_kept; a memory stream's
  // front record, written under mu when the front changes (NoteFront). 0 for a
  // memory stream that keeps no index.
  std::atomic<std::uint64_t> first_seq{1};
  // config.max_age in ns (0: none), for Expired, which deliveries call without mu
  // (Engine::UpdateStream changes it under mu).
  std::atomic<std::int64_t> max_age_ns{0};
  // kFile: sequences at or above first_kept removed from the middle (purges,
  // max_msgs_per_subject), so that deliveries of them are skipped (Discarded).
  // removed_count mirrors removed_seqs.ranges(): a stream that never removed from
  // the middle costs a delivery one relaxed load, not a lock. Lock order: mu, then
  // removed_mu.
  std::atomic<std::size_t> removed_count{0};
  mutable std::mutex removed_mu;
  SeqRanges removed_seqs;  // guarded by removed_mu
  std::size_t removed_in_index = 0;             // kFile: index entries flagged; mu
  // config.max_msgs_per_subject > 0: each subject's sequences. Guarded by mu.
  absl::flat_hash_map<std::string, SubjectSeqs> per_subject;
  // kFile: the purges the log's records are still subject to (Engine::PurgeStream;
  // replayed at recovery), oldest first, as the stream directory's "purges" file
  // holds them. Guarded by mu.
  std::vector<Purge> purges;
  // kFile recovery only: the subject of each index entry (same positions), when a
  // replayed purge filters by subject or max_msgs_per_subject needs them; cleared
  // by FinishRecovery. And the purges not yet replayed (from `purges`), and the
  // last sequence whose msg_id the purges file's duplicate-window snapshot covers.
  // kFile work queue: the removed log (<directory>/removed): one record per message a
  // consumer's ack removed, its value the sequence (8 bytes, little-endian).
  // Appended under removed_mu (AckOut), so that its last tx and what DrainRemoved
  // takes agree.
  std::unique_ptr<StreamLog> removed_log;
  std::uint64_t limit_records = 0;  // kLimit records appended (RetireRemovedLog now and then); mu
  // The removed log's tx of the newest kLimit record (0: none yet); mu. A publisher
  // whose Append moved it syncs the removed log that far with its message.
  std::uint64_t limit_removed_tx = 0;
  // The front trims of max_msgs, max_bytes and max_age: the removed log's newest
  // floor record ('f' <seq>: every message below seq is gone) says this much; mu.
  // RecordFloor appends one when the front has moved 64 past it, and at the
  // engine's end; recovery removes what a floor record says is gone (at most 63
  // trims are lost to a crash: those messages come back only if the limits were
  // raised). `recovered_floor`: the highest floor the removed log held.
  std::uint64_t floor_recorded = 0;
  std::uint64_t recovered_floor = 0;
  std::vector<std::uint64_t> removed_pending;  // guarded by removed_mu: for DrainRemoved
  std::atomic<bool> has_removed_pending{false};
  // Per segment of the removed log, oldest first: its last record's tx and the
  // largest sequence the records up to it name, to retire its segments (one entry
  // per segment, not per record: a message that waits keeps every segment after it,
  // and their entries must not grow with each ack). Guarded by removed_mu.
  struct RemovedSegment {
    std::uint64_t segment;  // StreamLog::Location::segment
    std::uint64_t tx;
    std::uint64_t max_seq;
  };
  std::deque<RemovedSegment> removed_max;
  // Notes record `tx` of the removed log, at `at`, with the running maximum
  // `max_seq`. Requires removed_mu (or recovery).
  void NoteRemovedRecord(const StreamLog::Location& at, std::uint64_t tx, std::uint64_t max_seq) {
    if (!removed_max.empty() && removed_max.back().segment == at.segment) {
      removed_max.back().tx = tx;
      removed_max.back().max_seq = max_seq;
    } else {
      removed_max.push_back({at.segment, tx, max_seq});
    }
  }
  std::uint64_t RemovedMaxSeq() const {
    return removed_max.empty() ? 0 : removed_max.back().max_seq;
  }
  // Recovery: the removed log's records (tx, seq), applied in step with the purges.
  struct RecoveredRemoval {
    std::uint64_t tx;
    std::uint64_t seq;
    Removal why;
  };
  std::vector<RecoveredRemoval> recovery_removed;
  std::size_t recovery_next_removed = 0;
  bool recovering = false;  // kFile: from AddStream's log Open to FinishRecovery
  bool purges_loaded = false;  // kFile: LoadPurges ran (at the first record, or at the end)
  std::vector<std::string> recovery_subjects;
  std::size_t recovery_next_purge = 0;
  std::uint64_t dedup_snapshot_seq = 0;
  // Recovery: the duplicate-window ids read from the dedup log and an older purges
  // file, (seq, wall ns of acceptance, id); inserted by LoadDedupLog.
  struct SavedId {
    std::uint64_t seq;
    std::int64_t wall_ns;
    std::string id;
  };
  std::vector<SavedId> recovery_dedup;
  // kFile with a duplicate window: <directory>/dedup, the ids of the window whose
  // message records left the stream's log (their segment was retired: a work
  // queue's acks, limits, purges), so that a restart keeps the whole window, not
  // only the ids of the records still in the log (nats-server#3272). A record per
  // save (of up to 1 MiB) holds its ids one after another, (seq u64 | wall-clock ns
  // of acceptance i64 | msg_id length u32 | msg_id), little-endian, written by
  // SaveDedupBelow before RetireLog removes the segments that held them.
  // Opened at the first save, or at recovery when the directory has one. Guarded by
  // mu.
  std::unique_ptr<StreamLog> dedup_log;
  // The ids of every sequence below it are in the dedup log (or expired, or were
  // never in the window); mu.
  std::uint64_t dedup_saved_below = 0;
  // The dedup log's records by save: (last tx, newest acceptance of the save on the
  // engine clock), oldest first, to retire its segments once all their ids expired;
  // mu.
  std::deque<std::pair<std::uint64_t, std::int64_t>> dedup_saves;
  // next_seq when recovery ended (FinishRecovery), before the stream was visible;
  // constant after, so read without mu. A durable consumer's ack-log records beyond
  // it speak of a tail the log lost (OpenAckLog), not of this run's publishes.
  std::uint64_t recovered_next_seq = 1;
  std::vector<ConsumerState*> consumers;    // guarded by mu
  // Changes (to a value no stream had before) whenever `consumers` does
  // (ConsumersChanged): a filter mask computed at another version is stale. Guarded
  // by mu.
  std::uint64_t consumers_version = NewConsumersVersion();
  // The consumers a filter mask covers: consumers[k] for k below this is bit k.
  static constexpr std::size_t kMaskedConsumers = 64;
  // Bit k set: consumers[k] takes events of `subject` by its filter (it has none, or
  // it matches). Requires mu.
  std::uint64_t FilterMask(std::string_view subject) const {
    std::uint64_t mask = 0;
    const std::size_t n = std::min(consumers.size(), kMaskedConsumers);
    for (std::size_t k = 0; k < n; ++k) {
      const ConsumerState* c = consumers[k];
      if (!c->filter || c->filter->Matches(subject)) mask |= std::uint64_t{1} << k;
    }
    return mask;
  }
  // Call after every change of `consumers`. Requires mu.
  void ConsumersChanged() { consumers_version = NewConsumersVersion(); }
  // Unique across the process's streams (from 1), so that a stream made at the
  // address of a deleted one never matches a mask computed for the other.
  static std::uint64_t NewConsumersVersion() {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);  // relaxed: unique only
  }
  bool deleted = false;                     // Engine::DeleteStream ran; guarded by mu
  // Consumers with a non-empty accept_codecs (Publish's conversion pre-pass,
  // Engine::Impl::ConvertBeforeStore, runs only for streams that have one). Written
  // under mu; relaxed reads outside it.
  std::atomic<std::uint32_t> codec_restricted{0};

  // The live messages and bytes, counted per side and read as a difference
  // (LiveMsgs, LiveBytes), so that an ack on a member's core does not write a line
  // the publisher writes on every publish:
  //  1. added_msgs / added_bytes only grow, in Append, under mu (BumpUnderMu: one
  //     writer, so no locked instruction).
  //  2. RetireCounts::msgs / bytes only grow, in Retire, by the thread whose state
  //     CAS retires the message: a publisher under mu (limits, max_age) or, under
  //     interest retention, the member whose ack was the last (settle.cpp). They
  //     have a cache line of their own, and are OwnedCounters: the thread that
  //     retires first (the acking member, most often the only one) adds without a
  //     locked instruction; each part's release pairs with a reader's acquire.
  //  3. A message is retired only after its Append (its record reaches a retiring
  //     thread through mu or a lane), so retired <= added, and under mu the
  //     difference is exact but for retirements not yet visible (a count read
  //     relaxed, as the single live count was before).
  //  4. Publish reads the retired side only when a limit or CompactIfSparse needs
  //     the live count: a stream without max_msgs / max_bytes never reads it.
  //  5. Each retired message has one reason: discarded (limits, max_age), purged,
  //     or acked out (an ack's retirement). The first two are counted, before msgs
  //     (release); acked out is the rest, AckedOut(), which saves an ack a locked
  //     instruction. AckedOut loads msgs first (acquire), so every reason counted
  //     for a message it includes is seen: the result is never above the true count.
  // Read by Stats() without mu; written under mu, except (2).
  // Adds `n` to a counter that only mu's holder writes (added_msgs, added_bytes,
  // stored): readers load it relaxed without mu and see each value whole.
  // `order`: release for added_msgs / added_bytes (LiveSnapshot).
  template <class T>
  static void BumpUnderMu(std::atomic<T>& counter, std::type_identity_t<T> n,
                          std::memory_order order = std::memory_order_relaxed) {
    counter.store(counter.load(std::memory_order_relaxed) + n, order);
  }
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
  std::shared_ptr<FileSystem> fs;  // kFile: config.file_system, or PosixFileSystem()
  const ZstdDictionaries* dictionaries = nullptr;  // for the log's encoding
  // Publishes waiting in a blocking push on a full lane while they hold mu. TryPublish
  // reads it to refuse instead of waiting for mu (it never waits for a lane).
  std::atomic<std::uint32_t> blocked_publishers{0};
  // What Retire counts (invariant 2), on a cache line of its own.
  struct alignas(kCacheLineSize) RetireCounts {
    OwnedCounter msgs;
    OwnedCounter bytes;
    std::atomic<std::uint64_t> discarded{0};
    std::atomic<std::uint64_t> purged{0};
  };
  RetireCounts retired;
  static_assert(sizeof(RetireCounts) == kCacheLineSize);

  // Live messages and bytes (invariant 3). Exact under mu but for retirements not yet
  // visible; Stats() reads them without mu and clamps them at 0. acquire: a message
  // whose retirement this load sees had its Append ordered before that retirement
  // (release, Retire), so the later load of the added count includes it: the
  // difference is never negative.
  std::int64_t LiveMsgs() const {
    const std::int64_t out = retired.msgs.Load(std::memory_order_acquire);
    return added_msgs.load(std::memory_order_relaxed) - out;
  }
  // StreamStats::acked_out (invariant 5): a lower bound while retirements race the
  // read, exact once they are visible.
  std::uint64_t AckedOut() const {
    const auto msgs = static_cast<std::uint64_t>(retired.msgs.Load(std::memory_order_acquire));
    const std::uint64_t other = retired.discarded.load(std::memory_order_relaxed) +
                                retired.purged.load(std::memory_order_relaxed);
    return msgs > other ? msgs - other : 0;
  }
  std::int64_t LiveBytes() const {
    const std::int64_t out = retired.bytes.Load(std::memory_order_acquire);
    return added_bytes.load(std::memory_order_relaxed) - out;
  }
  // Live messages and bytes as they were at one instant, for a reader without mu
  // (Stats). LiveMsgs alone is not: it reads the retired side first, so a discard
  // old (retire the oldest, then append) that runs between its two loads shows one
  // message over max_msgs. Here the added side is read first (acquire, pairing with
  // Append's release store), so every retirement made before an append it sees is
  // seen too (never over a limit: MakeRoom retires before Append adds), and it is
  // read again after the retired side: when it did not move, no append ran between,
  // and since a retirement follows its message's append (invariant 3) the difference
  // is exact at that instant. Tries `kTries` times while publishers keep appending,
  // then keeps the last reading (never over a limit, at worst below the truth,
  // clamped at 0).
  struct Live {
    std::int64_t msgs = 0;
    std::int64_t bytes = 0;
  };
  Live LiveSnapshot() const {
    constexpr int kTries = 4;
    Live out;
    std::int64_t msgs = added_msgs.load(std::memory_order_acquire);
    std::int64_t bytes = added_bytes.load(std::memory_order_acquire);
    for (int i = 0; i < kTries; ++i) {
      const std::int64_t gone_msgs = retired.msgs.Load(std::memory_order_acquire);
      const std::int64_t gone_bytes = retired.bytes.Load(std::memory_order_acquire);
      out = {std::max<std::int64_t>(0, msgs - gone_msgs), std::max<std::int64_t>(0, bytes - gone_bytes)};
      const std::int64_t msgs_again = added_msgs.load(std::memory_order_acquire);
      const std::int64_t bytes_again = added_bytes.load(std::memory_order_acquire);
      if (msgs_again == msgs && bytes_again == bytes) break;
      msgs = msgs_again;
      bytes = bytes_again;
    }
    return out;
  }

  // kFile (the log may not be open yet: recovery).
  bool is_file() const { return config.storage == StorageType::kFile; }

  // Locks mu for a publish that must not wait: spins (yielding) while a publisher
  // holds mu for its short critical section; false, with mu not held, when the
  // holder is blocked on a full lane.
  bool LockUnlessBlocked(std::unique_lock<StreamMutex>& lock) {
    while (!lock.try_lock()) {
      // acquire: pairs with the increment the blocked publisher makes before waiting.
      if (blocked_publishers.load(std::memory_order_acquire) > 0) return false;
      std::this_thread::yield();
    }
    return true;
  }

  // Moves a live message to `to` (kDiscarded or kDone) exactly once; the winner
  // takes it out of the live counts.
  // `purge`: removed by Engine::PurgeStream (StreamStats::purged), not by a limit.
  bool Retire(StoredMessage& m, MsgState to, bool purge = false) {
    std::uint8_t expected = kLive;
    if (!m.state.compare_exchange_strong(expected, to, std::memory_order_acq_rel)) return false;
    // release: pairs with LiveMsgs / LiveBytes (invariant 3).
    // The reason's count first (invariant 5), then the live counts.
    if (to != kDone) (purge ? retired.purged : retired.discarded).fetch_add(1, std::memory_order_relaxed);
    retired.msgs.Add(1, std::memory_order_release);
    retired.bytes.Add(static_cast<std::int64_t>(m.bytes), std::memory_order_release);
    return true;
  }

  // kFile: takes the message of index entry `e` (being removed by a limit, max_age,
  // a purge or a work queue's ack, as `why` says) out of the live counts. The stream
  // is the only one that retires a file stream's messages, under mu. Requires mu.
  void RetireEntry(const IndexEntry& e, Removal why = Removal::kLimit) {
    if (e.removed != 0) return;  // out of the counts already
    // The reason's count first (invariant 5), then the live counts.
    if (why != Removal::kAck) {
      (why == Removal::kPurge ? retired.purged : retired.discarded).fetch_add(1, std::memory_order_relaxed);
    }
    retired.msgs.Add(1, std::memory_order_release);  // pairs with LiveMsgs
    retired.bytes.Add(static_cast<std::int64_t>(e.bytes), std::memory_order_release);
  }
  // kFile: drops the front entry of the index, counting it out unless it was
  // removed already. Requires mu.
  void PopIndexFront() {
    if (index.front().removed != 0) {
      --removed_in_index;
    } else {
      RetireEntry(index.front());
    }
    index.pop_front();
  }
  // kFile: first_kept (and first_seq) after the front of the index changed; drops
  // the removed sequences below it. Requires mu.
  void PublishFirstKept() {
    while (!index.empty() && index.front().removed != 0) PopIndexFront();
    const std::uint64_t first = index.empty() ? next_seq : index.front().seq;
    // release: a delivery that reads the new value sees the stream's state before it.
    first_kept.store(first, std::memory_order_release);
    first_seq.store(first, std::memory_order_relaxed);
    if (removed_count.load(std::memory_order_relaxed) != 0) {
      std::lock_guard lock(removed_mu);
      removed_seqs.erase_below(first);
      removed_count.store(removed_seqs.ranges(), std::memory_order_release);
    }
  }
  // Memory: first_seq after the front of `messages` changed. Requires mu.
  void NoteFront() {
    if (!keeps_index) return;
    first_seq.store(messages.empty() ? next_seq : messages.front()->seq, std::memory_order_relaxed);
  }
  // Whether `m` is a message the stream discarded (a limit, max_age or a purge): its
  // queued deliveries are skipped. Memory streams mark the record (Retire); a file
  // stream's records are copies read back from the log, so it is the sequence that
  // tells: below first_kept, or removed from the middle.
  //
  // The removed set is read before first_kept: PublishFirstKept raises first_kept,
  // then erases the set below it, so a reader that finds a sequence gone from the
  // set (or the count 0 after that erase; acquire, paired with its release) reads
  // the raised first_kept. Read the other way round, an old first_kept and an
  // emptied set would let a removed message through (found by the adversarial
  // helper).
  bool Discarded(const StoredMessage& m) const {
    if (m.state.load(std::memory_order_acquire) == kDiscarded) return true;
    return DiscardedSeq(m.seq);
  }
  // The same for the message of sequence `seq`, without a record in hand.
  bool DiscardedSeq(std::uint64_t seq) const {
    // acquire: pairs with the release stores of the count (RemoveSeq, RecordRemoval,
    // PublishFirstKept).
    if (removed_count.load(std::memory_order_acquire) != 0) {
      std::lock_guard lock(removed_mu);
      if (removed_seqs.contains(seq)) return true;
    }
    return seq < first_kept.load(std::memory_order_acquire);
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
    if (config.retention != RetentionPolicy::kInterest) return true;  // limits, work queue
    if (config.max_msgs_per_subject > 0) return true;
    if (config.max_age > absl::ZeroDuration()) return true;
    return config.discard == DiscardPolicy::kOld && (config.max_msgs > 0 || config.max_bytes > 0);
  }

  bool Expired(std::int64_t publish_ns, std::int64_t now_ns) const {
    const std::int64_t max_age = max_age_ns.load(std::memory_order_relaxed);
    return max_age > 0 && SatSub(now_ns, publish_ns) > max_age;
  }
  bool Expired(const StoredMessage& m, std::int64_t now_ns) const {
    return Expired(m.publish_ns, now_ns);
  }

  // Drops retired messages and enforces max_age at the front. Requires mu.
  void TrimFront(std::int64_t now_ns) {
    if (log != nullptr) {
      if (index.empty() || !Expired(index.front().publish_ns, now_ns)) return;
      do {
        PopIndexFront();
      } while (!index.empty() && Expired(index.front().publish_ns, now_ns));
      PublishFirstKept();
      return;
    }
    bool popped = false;
    while (!messages.empty()) {
      StoredMessage& m = *messages.front();
      if (m.state.load(std::memory_order_acquire) == kLive) {
        if (!Expired(m, now_ns)) break;
        Retire(m, kDiscarded);
      }
      messages.pop_front();
      popped = true;
    }
    if (popped) NoteFront();
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
      while (!index.empty() && over()) PopIndexFront();
      PublishFirstKept();
      return;
    }
    if (!over()) return;
    while (over() && !messages.empty()) {
      Retire(*messages.front(), kDiscarded);
      messages.pop_front();
    }
    // Removed from the middle before (a purge, max_msgs_per_subject): not held.
    while (!messages.empty() && messages.front()->state.load(std::memory_order_acquire) != kLive) {
      messages.pop_front();
    }
    NoteFront();
  }

  // Removes the message stored as `seq` from wherever it is in the stream (a purge,
  // max_msgs_per_subject, a file work queue's ack: `why`); false when the stream does
  // not hold it (never stored, or removed already). Call AfterRemovals once done.
  // Requires mu.
  bool RemoveSeq(std::uint64_t seq, Removal why);
  // kFile work queue: message `seq` was acked (or given up) by its consumer: records
  // it in the removed log (written to the OS; its tx is returned for AckSync), makes
  // deliveries skip it at once (removed_seqs) and leaves it for DrainRemoved to take
  // out of the index. The removed log's error (naming the stream) when it cannot.
  // Any thread; takes removed_mu, never mu (an acking member must not wait for a
  // publisher blocked on a full lane).
  absl::StatusOr<std::uint64_t> AckOut(std::uint64_t seq);
  // kFile: appends a floor record when the front of the index has moved at least 64
  // past the last one (`force`: at all). Best effort, not synced: a lost record
  // brings back trimmed messages only under higher limits. Requires mu.
  void RecordFloor(bool force);
  // kFile, at recovery: when the removed log holds records of sequences above `last`
  // (the stream log's last record: a power cut took the tail they spoke of, and the
  // next publishes reuse those sequences), appends and syncs a void record ('v',
  // `last`) that cancels them at every later recovery. Its error names the log.
  absl::Status VoidRemovalsAbove(std::uint64_t last);
  // kFile: appends the removal of `seq` (`why`: kAck or kLimit) to the removed log,
  // under removed_mu; with `pending`, also as AckOut does (removed_seqs,
  // removed_pending). The record's tx, or the log's error naming the stream. Any
  // thread.
  absl::StatusOr<std::uint64_t> RecordRemoval(std::uint64_t seq, Removal why, bool pending);
  // kFile work queue: takes the messages AckOut removed out of the index and the
  // counts, and retires the removed log's segments that speak only of messages no
  // longer in the stream's log; *removed_tx (when given) gets the removed log's last
  // record, every ack up to which is drained. Requires mu.
  void DrainRemoved(std::uint64_t* removed_tx = nullptr);
  // kFile: retires the removed log's segments whose records all speak of messages
  // below the stream log's first record. Requires mu.
  void RetireRemovedLog();
  // After RemoveSeq: drops removed entries from the front (first_seq, first_kept)
  // and compacts the index when removed entries outnumber the rest. Requires mu.
  void AfterRemovals();
  // Whether the stream holds a message stored as `seq`. Requires mu.
  bool Holds(std::uint64_t seq) const;
  // max_msgs_per_subject: records `seq` under `subject` and removes the subject's
  // oldest messages beyond the limit. Requires mu.
  void LimitSubject(std::string_view subject, std::uint64_t seq);
  // Drops the per-subject lists of subjects that hold no message. Requires mu.
  void PruneSubjects();
  // The sequences `p` removes, ascending: live messages that match its filter, below
  // its sequence bound, but for the newest p.keep of them. `subject_at(i, seq)` gives
  // the subject of the i-th message of the index (kFile) or `messages` (memory);
  // its error (a record that cannot be read back) is returned as is. Requires mu.
  absl::StatusOr<std::vector<std::uint64_t>> PurgeVictims(
      const Purge& p,
      absl::FunctionRef<absl::StatusOr<std::string>(std::size_t, std::uint64_t)> subject_at) const;
  // kFile: the subject of a stored message, read back from the log (the record's
  // header since record version 3; an older record's event is decoded). Errors as
  // LoadFromLog. Thread-safe as LoadFromLog.
  absl::StatusOr<std::string> SubjectFromLog(const IndexEntry& e) const;
  // kFile: writes the "purges" file of the stream's directory with `purges`,
  // atomically (a temporary file, fdatasync, rename, fsync of the directory). The
  // file system's error, naming the stream and the file; *renamed tells whether the
  // new file took the old one's place (only the directory's fsync failed). Requires
  // mu.
  absl::Status WritePurges(const std::vector<Purge>& purges, bool* renamed);
  // kFile recovery, once the log holds the directory's lock (RecoverOne or
  // FinishRecovery, whichever runs first): reads the "purges" file (none: no
  // purges) into `purges`, and the duplicate-window ids an older version wrote
  // there into `recovery_dedup`. DataLoss naming the file when it is damaged.
  absl::Status LoadPurges();
  // kFile recovery, after LoadPurges: reads the dedup log (<directory>/dedup) into
  // `recovery_dedup` and puts the ids still inside the window at `now_ns` /
  // `wall_now_ns` into it, oldest first; RecoverOne then adds the ids of the records
  // above dedup_snapshot_seq. DataLoss naming the log when a record is damaged.
  absl::Status LoadDedupLog(std::int64_t now_ns, std::int64_t wall_now_ns);
  // kFile with a duplicate window: appends to the dedup log the ids of the window
  // accepted under sequences in [dedup_saved_below, below) and syncs them per the
  // stream's sync policy, so that they outlive the log segments about to be
  // retired; then retires the dedup log's segments whose ids have all expired.
  // False (the caller keeps the segments) when the dedup log cannot be written.
  // Requires mu.
  bool SaveDedupBelow(std::uint64_t below);
  // kFile: the options of side log <directory>/<name> ("removed", "dedup"): the
  // stream's sync policy, segments of at most 4 MiB.
  StreamLogOptions SideLogOptions(std::string_view name) const;
  // The subject and sequence of every message held, in sequence order (a file
  // stream's read back with SubjectFromLog, whose error it returns). Requires mu.
  absl::StatusOr<std::vector<std::pair<std::string, std::uint64_t>>> HeldSubjects() const;
  // Memory and file: the stream's limits after Engine::UpdateStream set them in
  // `config` (and max_age_ns): trims what they no longer allow (max_age, max_msgs,
  // max_bytes from the front; max_msgs_per_subject per subject, its lists rebuilt
  // from `held`, HeldSubjects read before the change, unless it is nullptr: the
  // limit did not change). Requires mu.
  void ApplyLimits(std::int64_t now_ns,
                   const std::vector<std::pair<std::string, std::uint64_t>>* held);
  // kFile recovery: whether RecoverOne must note each record's subject (a purge
  // still to replay filters by subject, or max_msgs_per_subject is set), and one
  // purge replayed on the messages recovered so far.
  bool NeedsRecoverySubjects() const;
  absl::Status ReplayPurge(const Purge& p);
  // kFile recovery: removes the removed log's messages of its records up to
  // `up_to_tx` not yet replayed.
  void ReplayRemoved(std::uint64_t up_to_tx);
  // kFile: opens <directory>/removed (its records into recovery_removed) when the
  // stream records removals (a work queue, max_msgs_per_subject), when it did under
  // an earlier config (the directory exists), or with `force`. Its errors, naming the
  // stream and the log. At recovery, or under mu.
  absl::Status OpenRemovedLog(bool force = false);

  // The stream store's admit call, at `now` for an event of `bytes`
  // (Event::StoredSize): trims the front (max_age), then finds a duplicate (when
  // `check_duplicates`; dead letters are not checked) or a limit that refuses it
  // (CheckLimits). Changes nothing else. Requires mu. Always inline, with Append:
  // both run on every publish, a call per step cost more than some steps
  // (BENCHMARKS.md, "The engine's data path in instructions"), and GCC kept both out
  // of PublishToStream when they were only `inline`.
  [[gnu::always_inline]] Admission Admit(const Event& incoming, std::uint64_t bytes,
                                         std::int64_t now, bool check_duplicates) {
    // relaxed: a stale false leaves the drain to the next publish or timer run.
    if (has_removed_pending.load(std::memory_order_relaxed)) DrainRemoved();
    Admission a;
    if (deleted) [[unlikely]] {  // a publish that routed to it before DeleteStream
      a.refusal = absl::NotFoundError("stream '" + config.name + "' was deleted");
      return a;
    }
    if (removed_log != nullptr && removed_log->failed()) {
      // A removal that cannot be recorded could come back after a restart.
      a.refusal = absl::FailedPreconditionError(
          "stream '" + config.name + "': its removed log failed earlier (" +
          std::string(removed_log->failure().message()) + "); it takes no more messages");
      return a;
    }
    TrimFront(now);
    CompactIfSparse();
    if (dedup != nullptr && !incoming.msg_id.empty() && check_duplicates) {
      dedup->Expire(now);
      const DuplicateWindow::HashedId id = DuplicateWindow::Hashed(incoming.msg_id);
      a.msg_id_hash = id.hash;
      if (std::optional<std::uint64_t> original = dedup->Find(id, now)) {
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
  // The purges file's replay can fail (a record whose subject cannot be read).
  absl::Status FinishRecovery(std::int64_t now_ns, std::int64_t wall_now_ns);
  // Stores an admitted event as `record` (allocated by the caller): discard old
  // makes room, the record gets the next sequence, the counters and (when
  // `record_duplicate`) the duplicate window learn it, and it is kept unless interest
  // retention has nobody to wait for (`admitted`: Admit's answer for the event, whose
  // msg_id hash the window's insert reuses). The caller has set the record's event
  // and conversions. Requires mu.
  [[gnu::always_inline]] void Append(const std::shared_ptr<StoredMessage>& record,
                                     std::int64_t now, std::uint64_t bytes,
                                     std::uint32_t explicit_acks, bool record_duplicate,
                                     const Admission& admitted) {
    if (config.discard == DiscardPolicy::kOld) MakeRoom(bytes);
    record->stream = this;
    record->seq = next_seq++;
    record->publish_ns = now;
    record->bytes = bytes;
    record->pending_acks.store(explicit_acks, std::memory_order_relaxed);

    // relaxed: written under mu (invariant 1); a retiring thread gets the record, and
    // so this ordering, through mu or a lane. One writer at a time (mu), so a load and
    // a store, not a locked read-modify-write.
    // release: pairs with LiveSnapshot (MakeRoom's retirements are seen with it).
    BumpUnderMu(added_msgs, 1, std::memory_order_release);
    BumpUnderMu(added_bytes, static_cast<std::int64_t>(bytes), std::memory_order_release);
    BumpUnderMu(stored, 1);
    last_seq.store(record->seq, std::memory_order_relaxed);
    if (dedup != nullptr && !record->event->msg_id.empty() && record_duplicate) {
      const std::string& id = record->event->msg_id;
      if (admitted.msg_id_hash) {  // Admit hashed this id (the record holds the same bytes)
        dedup->Insert(DuplicateWindow::HashedId{id, *admitted.msg_id_hash}, record->seq, now);
      } else {
        dedup->Insert(id, record->seq, now);
      }
      dedup_evicted.store(dedup->evicted(), std::memory_order_relaxed);
    }
    if (log != nullptr) {  // kFile: limits retention only (StreamConfig::Validate)
      index.push_back(IndexEntry::Of(record->seq, now, bytes, appended_at));
    } else if (config.retention == RetentionPolicy::kInterest && explicit_acks == 0) {
      // Nobody will ack it: under interest retention it is done once queued. (A work
      // queue keeps it until a consumer takes it.)
      Retire(*record, kDone);
    } else if (keeps_index) {
      if (messages.empty()) first_seq.store(record->seq, std::memory_order_relaxed);
      messages.push_back(record);
    }
    if (config.max_msgs_per_subject > 0) LimitSubject(record->event->subject, record->seq);
  }
};

}  // namespace engine_internal
}  // namespace inferq
