#include "inferq/state/state_store.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "inferq/base/error.hpp"
#include "inferq/base/histogram.hpp"
#include "log_format.hpp"
#include "log_options.hpp"
#include "recovery.hpp"

namespace inferq {

using namespace state_internal;  // NOLINT: private implementation file

namespace {

std::string DurationText(absl::Duration d) { return absl::FormatDuration(d); }

absl::Status ValidateOptions(const StateStoreOptions& o) {
  if (auto st = ValidateLogOptions("StateStoreOptions", o.dir, o.sync, o.group_commit_window,
                                   o.recovery, o.segment_bytes);
      !st.ok()) {
    return st;
  }
  const int mode = static_cast<int>(o.checkpoint_mode);
  if (mode < 0 || mode > static_cast<int>(CheckpointMode::kFull)) {
    return absl::InvalidArgumentError("StateStoreOptions.checkpoint_mode " + std::to_string(mode) +
                                      " is not a CheckpointMode");
  }
  if (o.checkpoint_interval < absl::ZeroDuration() || o.checkpoint_interval > absl::Hours(24 * 30)) {
    return absl::InvalidArgumentError("StateStoreOptions.checkpoint_interval " +
                                      DurationText(o.checkpoint_interval) +
                                      " is outside 0 (never) to 720h");
  }
  if (o.max_incremental_chain < 1) {
    return absl::InvalidArgumentError("StateStoreOptions.max_incremental_chain " +
                                      std::to_string(o.max_incremental_chain) + " is below 1");
  }
  return absl::OkStatus();
}

std::chrono::nanoseconds ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// A writer's open of a directory it may not write (a read-only mount, EROFS; or no
// permission, EACCES/EPERM): kPermissionDenied naming the directory, and the way
// to read it anyway. Other errors are returned as they are.
absl::Status NotWritable(const std::string& dir, absl::Status st) {
  if (st.code() != absl::StatusCode::kPermissionDenied) return st;
  return absl::PermissionDeniedError("state directory " + QuoteValue(dir) +
                                     " is not writable (read_only = true opens it for reading): " +
                                     std::string(st.message()));
}

}  // namespace

// ---------------------------------------------------------------------------------
// Locks, always taken in this order when nested:
//   ckpt_mu_ -> mu_,  ckpt_mu_ -> state_mu_,  ckpt_mu_ -> io_mu_,  io_mu_ -> mu_.
// A commit takes mu_ only to get its tx_id and queue its changes (LevelDB's writer
// queue). One leader at a time then, for a batch of queued commits:
//   (no lock)  encodes the records in tx_id order (EncodeBatch; state_mu_ shared
//              for create/update lookups)
//   io_mu_     writes them and syncs per the policy
//   state_mu_  applies them to the in-memory state
//   mu_        publishes durable_tx_ and wakes each committer on its own condvar
// ---------------------------------------------------------------------------------
class StateStore::Impl {
 public:
  explicit Impl(StateStoreOptions o) : opt_(std::move(o)), fs_(opt_.file_system) {}

  ~Impl() {
    {
      std::unique_lock lock(mu_);
      stopping_ = true;
      cv_.wait(lock, [&] { return !leader_active_ && in_flight_ == 0 && !verifying_; });
      maint_cv_.notify_all();
    }
    if (maintenance_.joinable()) maintenance_.join();
    std::lock_guard io(io_mu_);
    if (file_) {
      if (opt_.sync == SyncPolicy::kInterval && unsynced_bytes_ > 0 && failed_.ok()) {
        (void)file_->Sync();  // a clean close keeps the interval's promise early
      }
      (void)file_->Close();
    }
  }

  absl::Status Start(Recovered r, double recovery_ms) {
    store_id_ = r.store_id;
    if (store_id_ == 0 && !opt_.read_only) {
      // A new directory: give it its identity before any other file.
      store_id_ = RandomSalt();
      const std::string tmp = JoinPath(opt_.dir, "IDENTITY.tmp");
      (void)fs_->Remove(tmp);
      auto f = fs_->Create(tmp);
      if (!f.ok()) return f.status();
      absl::Status st = (*f)->WriteAt(0, EncodeIdentity(store_id_));
      if (st.ok()) st = (*f)->Sync();
      if (absl::Status cl = (*f)->Close(); st.ok()) st = cl;
      if (st.ok()) st = fs_->Rename(tmp, JoinPath(opt_.dir, "IDENTITY"));
      if (st.ok()) st = fs_->SyncDir(opt_.dir);
      if (!st.ok()) {
        (void)fs_->Remove(tmp);  // a failed Open (a full disk) leaves nothing half made
        return st;
      }
    }
    state_ = std::move(r.state);
    applied_tx_ = r.last_tx;
    durable_tx_.store(r.last_tx);
    applied_hash_ = durable_hash_ = head_hash_ = r.last_hash;
    next_tx_ = r.last_tx + 1;
    for (const auto& c : r.checkpoints) {
      if (c.tx <= r.base_tx) ckpts_.push_back(c);
    }
    if (!ckpts_.empty()) last_ckpt_tx_ = ckpts_.back().tx;
    for (auto it = ckpts_.rbegin(); it != ckpts_.rend(); ++it) {
      if (it->kind == CheckpointKind::kFull) break;
      ++incremental_chain_;
    }
    stats_.recovered_checkpoints = r.checkpoints_loaded;
    stats_.recovered_log_records = r.records_replayed;
    stats_.torn_tail_bytes = r.torn_tail_bytes;
    stats_.recovery_ms = recovery_ms;
    // Keys the log changed after the newest checkpoint go into the next incremental
    // one (before the log that holds them may be retired).
    dirty_ = std::move(r.changed_since_base);
    segments_ = std::move(r.segments);
    if (opt_.read_only) return absl::OkStatus();

    if (!segments_.empty()) {
      SegmentFile& tail = segments_.back();
      if (tail.salt == 0) {
        return absl::InternalError("recovery did not read the last segment " +
                                   QuoteValue(tail.name));
      }
      // Appends go after the last valid record; a torn tail is zeroed first, so no
      // byte of it can be read back after the records written over it.
      auto f = fs_->OpenForWrite(JoinPath(opt_.dir, tail.name));
      if (!f.ok()) return f.status();
      file_ = std::move(*f);
      if (tail.dirty_end > tail.bytes) {
        if (auto st = WriteZeros(tail.bytes, tail.dirty_end - tail.bytes); !st.ok()) return st;
        if (auto st = file_->Sync(); !st.ok()) return st;
      }
      salt_ = tail.salt;
      segment_bytes_ = tail.bytes;
      allocated_ = std::max(tail.file_bytes, tail.dirty_end);
    } else {
      salt_ = RandomSalt();
      if (auto st = CreateSegment(next_tx_, salt_); !st.ok()) return st;
      segment_bytes_ = kSegmentHeaderBytes;
    }
    last_ckpt_time_ = std::chrono::steady_clock::now();
    maintenance_ = std::thread([this] { MaintenanceLoop(); });
    return absl::OkStatus();
  }

  // ---- commit ----

  absl::StatusOr<std::uint64_t> Commit(std::vector<Transaction::Change>& changes) {
    if (changes.empty()) {
      return absl::InvalidArgumentError("transaction has no changes to commit");
    }
    std::uint64_t payload = 8 + 32 + 4;
    for (const auto& c : changes) {
      payload += 9 + c.key.size() + c.value.size();
      if (c.key.empty() || c.key.size() > kMaxKeyBytes) {
        return absl::InvalidArgumentError(
            "key " + QuoteValue(c.key.substr(0, 80)) + " has " + std::to_string(c.key.size()) +
            " bytes; keys have 1 to " + std::to_string(kMaxKeyBytes));
      }
      if (c.value.size() > kMaxValueBytes) {
        return absl::InvalidArgumentError("value of key " + QuoteValue(c.key.substr(0, 80)) +
                                          " has " + std::to_string(c.value.size()) +
                                          " bytes, more than " + std::to_string(kMaxValueBytes));
      }
    }
    if (payload > kMaxPayloadBytes) {
      return absl::InvalidArgumentError(
          "transaction of " + std::to_string(changes.size()) + " changes encodes to " +
          std::to_string(payload) + " bytes, more than the " + std::to_string(kMaxPayloadBytes) +
          "-byte record limit");
    }
    std::unique_lock lock(mu_);
    if (opt_.read_only) {
      return absl::FailedPreconditionError("state store " + QuoteValue(opt_.dir) +
                                           " was opened read-only");
    }
    if (!failed_.ok()) return FailedError();

    // Only the order is decided here (the tx_id); the leader encodes the records,
    // in that order, outside this lock (LevelDB's writer queue does the same).
    Pending p;
    p.tx = next_tx_++;
    p.changes = std::move(changes);
    const std::uint64_t my_tx = p.tx;
    Waiter w;
    p.waiter = &w;
    pending_.push_back(std::move(p));

    // The first to queue with no leader leads; a finishing leader hands the lead to
    // the owner of the oldest queued record. Everyone else sleeps on their own
    // condition variable until their record's batch is done: no thundering herd.
    if (!leader_active_ && !verifying_ && verify_requested_ == 0) w.lead = true;
    while (!w.done) {
      if (w.lead) {
        w.lead = false;
        LeadOneBatch(lock);
      } else {
        w.cv.wait(lock);
      }
    }
    if (!w.status.ok()) return w.status;
    ++stats_.commits;
    return my_tx;
  }

  // ---- reads ----

  std::optional<std::string> Get(std::string_view key) const {
    std::shared_lock s(state_mu_);
    auto it = state_.find(absl::string_view(key.data(), key.size()));
    if (it == state_.end()) return std::nullopt;
    return it->second;
  }

  void Scan(std::string_view prefix,
            absl::FunctionRef<void(std::string_view, std::string_view)> fn) const {
    std::shared_lock s(state_mu_);
    for (auto it = state_.lower_bound(absl::string_view(prefix.data(), prefix.size()));
         it != state_.end(); ++it) {
      if (std::string_view(it->first).substr(0, prefix.size()) != prefix) break;
      fn(it->first, it->second);
    }
  }

  std::uint64_t last_tx_id() const { return durable_tx_.load(std::memory_order_acquire); }

  StateStoreStats Stats() const {
    StateStoreStats s;
    {
      std::lock_guard lock(mu_);
      s = stats_;
      s.failed = !failed_.ok();
    }
    s.last_tx_id = last_tx_id();
    {
      std::shared_lock st(state_mu_);
      s.keys = state_.size();
    }
    {
      std::lock_guard io(io_mu_);
      s.segments = segments_.size();
    }
    {
      std::lock_guard c(ckpt_mu_);
      s.last_checkpoint_tx = last_ckpt_tx_;
      s.last_checkpoint_bytes = ckpts_.empty() ? 0 : ckpts_.back().bytes;
      s.checkpoints_full = ckpt_full_written_;
      s.checkpoints_incremental = ckpt_incr_written_;
    }
    return s;
  }

  // ---- checkpoints ----

  absl::Status Checkpoint() {
    std::lock_guard c(ckpt_mu_);
    return CheckpointLocked();
  }

  // ---- verification ----

  absl::Status VerifyChain() const {
    if (opt_.read_only) return VerifyReadOnlyCut();
    std::lock_guard c(ckpt_mu_);  // no checkpoint retires files meanwhile
    std::uint64_t tx;
    Hash hash;
    {
      std::unique_lock lock(mu_);
      ++verify_requested_;  // a finishing leader hands nothing on
      cv_.wait(lock, [&] { return !leader_active_ && in_flight_ == 0 && !verifying_; });
      --verify_requested_;
      verifying_ = true;  // no new batch is written until we are done
      tx = durable_tx_.load();
      hash = durable_hash_;
    }
    RecoverOptions ro;
    ro.strict = true;
    ro.build_state = false;
    ro.check_all_checkpoints = true;
    auto r = Recover(*fs_, opt_.dir, ro);
    {
      std::lock_guard lock(mu_);
      verifying_ = false;
      if (verify_requested_ == 0) {
        // Commits queued meanwhile: hand them the lead (writer bookkeeping, not
        // visible state, hence the const_cast in this const member).
        auto* self = const_cast<Impl*>(this);
        if (failed_.ok()) {
          self->HandOffLead();
        } else {
          self->FailPending();
        }
      }
      cv_.notify_all();
    }
    if (!r.ok()) return r.status();
    if (r->last_tx != tx || r->last_hash != hash) {
      return absl::DataLossError("the files of " + QuoteValue(opt_.dir) + " end at tx_id " +
                                 std::to_string(r->last_tx) + " (hash " +
                                 HashHex(r->last_hash).substr(0, 16) +
                                 "...) but the store has committed up to tx_id " +
                                 std::to_string(tx) + " (hash " + HashHex(hash).substr(0, 16) +
                                 "...)");
    }
    return absl::OkStatus();
  }

  // A read-only store holds the cut of the files it read at Open, while a writer
  // (in another process, say) may have committed, checkpointed and retired files
  // since. The files must still hold that cut — the chain intact up to the tx_id it
  // read, with the same record there — and be intact after it, up to a torn tail,
  // which is the writer's write under way. Retired files and a listing taken
  // mid-swap are read again (RecoverReadOnly).
  absl::Status VerifyReadOnlyCut() const {
    const std::uint64_t tx = durable_tx_.load(std::memory_order_acquire);
    Hash hash;
    {
      std::lock_guard lock(mu_);
      hash = durable_hash_;
    }
    RecoverOptions ro;
    ro.strict = true;
    ro.build_state = false;
    ro.check_all_checkpoints = true;
    ro.snapshot_tx = tx;
    auto r = RecoverReadOnly(*fs_, opt_.dir, ro);
    if (!r.ok()) return r.status();
    if (r->last_tx < tx) {
      return absl::DataLossError("the files of " + QuoteValue(opt_.dir) + " end at tx_id " +
                                 std::to_string(r->last_tx) + " (hash " +
                                 HashHex(r->last_hash).substr(0, 16) +
                                 "...) but the store read up to tx_id " + std::to_string(tx) +
                                 " (hash " + HashHex(hash).substr(0, 16) + "...) when it was opened");
    }
    if (r->snapshot_hash && *r->snapshot_hash != hash) {
      return absl::DataLossError("the files of " + QuoteValue(opt_.dir) + " hold another record at tx_id " +
                                 std::to_string(tx) + " (hash " +
                                 HashHex(*r->snapshot_hash).substr(0, 16) +
                                 "...) than the store read when it was opened (hash " +
                                 HashHex(hash).substr(0, 16) + "...)");
    }
    return absl::OkStatus();
  }

 private:
  // A committer waiting for its record's batch (on its own stack). Fields under mu_.
  struct Waiter {
    std::condition_variable cv;
    bool lead = false;  // this thread is to lead the next batch
    bool done = false;
    absl::Status status;
    // Each waiter gets its own copy of an error (not a shared reference): the
    // reference count of absl::Status lives in libabsl, which ThreadSanitizer does
    // not see, so a Status shared across threads reads as a data race there.
    void Finish(const absl::Status& st) {
      status = st.ok() ? absl::OkStatus() : absl::Status(st.code(), st.message());
      done = true;
      cv.notify_one();
    }
  };

  struct Pending {
    Waiter* waiter = nullptr;
    std::uint64_t tx = 0;
    std::vector<Transaction::Change> changes;  // until encoded
    std::string bytes;      // the frame
    Hash hash{};
    std::vector<Op> ops;
    std::uint64_t new_segment_salt = 0;  // nonzero: this record starts a new segment
  };

  absl::Status FailedError() const {
    return absl::FailedPreconditionError("state store " + QuoteValue(opt_.dir) +
                                         " is in the failed state after: " +
                                         std::string(failed_.message()));
  }

  // Called with io_mu_ held (or before any other thread runs).
  absl::Status CreateSegment(std::uint64_t first_tx, std::uint64_t salt) {
    const std::string name = SegmentName(first_tx);
    auto f = fs_->Create(JoinPath(opt_.dir, name));
    if (!f.ok()) return f.status();
    file_ = std::move(*f);
    allocated_ = kSegmentHeaderBytes;
    if (auto st = file_->WriteAt(0, EncodeSegmentHeader(store_id_, salt, first_tx)); !st.ok()) {
      return st;
    }
    if (auto st = Preallocate(kSegmentHeaderBytes + 1); !st.ok()) return st;
    if (auto st = file_->Sync(); !st.ok()) return st;
    if (auto st = fs_->SyncDir(opt_.dir); !st.ok()) return st;
    segments_.push_back(
        SegmentFile{name, first_tx, salt, kSegmentHeaderBytes, allocated_, kSegmentHeaderBytes});
    unsynced_bytes_ = 0;
    return absl::OkStatus();
  }

  // Zero-fills the segment ahead of the writes, a chunk at a time, so that a commit
  // overwrites blocks the file already has: its fdatasync then flushes the data
  // alone, not a new file size (the reason SQLite reuses its WAL file and RocksDB
  // can recycle log files). Recovery reads zeros after the last record as the
  // clean end of the log. Called with io_mu_ held.
  absl::Status Preallocate(std::uint64_t end) {
    if (end <= allocated_) return absl::OkStatus();
    const std::uint64_t chunk = PreallocChunk();
    const std::uint64_t target = (end + chunk - 1) / chunk * chunk;
    if (auto st = WriteZeros(allocated_, target - allocated_); !st.ok()) return st;
    allocated_ = target;
    return absl::OkStatus();
  }
  std::uint64_t PreallocChunk() const {
    return std::min<std::uint64_t>(std::uint64_t{1} << 20, opt_.segment_bytes);
  }
  absl::Status WriteZeros(std::uint64_t offset, std::uint64_t n) {
    // Never destroyed: a log thread may still write while std::exit destroys statics.
    static const std::string& zeros = *new std::string(std::size_t{1} << 20, '\0');
    while (n > 0) {
      const std::uint64_t k = std::min<std::uint64_t>(n, zeros.size());
      if (auto st = file_->WriteAt(offset, std::string_view(zeros).substr(0, k)); !st.ok()) return st;
      offset += k;
      n -= k;
    }
    return absl::OkStatus();
  }

  // One leader at a time writes batches of queued records, syncs per the policy,
  // applies them, publishes durable_tx_ and wakes their committers. It goes on with
  // the next batch while records are queued, up to kMaxLeadRounds batches, and then
  // hands the lead to the owner of the oldest queued record: a leader that is
  // running already costs nothing to keep, while waking a sleeping one costs a
  // scheduling delay (measured ~0.4 ms with 64 committers on 2 vCPUs, longer than
  // the fdatasync). Called with `lock` (mu_) held; returns with it held.
  static constexpr int kMaxLeadRounds = 8;

  void LeadOneBatch(std::unique_lock<std::mutex>& lock) {
    leader_active_ = true;
    for (int round = 0; round < kMaxLeadRounds; ++round) {
      if (!failed_.ok()) {
        FailPending();
        break;
      }
      if (pending_.empty() || (round > 0 && verify_requested_ > 0)) break;
      if (!WriteOneBatch(lock)) break;
    }
    leader_active_ = false;
    if (failed_.ok()) {
      HandOffLead();
    } else {
      FailPending();
    }
    cv_.notify_all();  // VerifyChain and the destructor wait for no batch in flight
  }

  // One batch; false when its write failed (the store is then failed).
  bool WriteOneBatch(std::unique_lock<std::mutex>& lock) {
    if (opt_.sync == SyncPolicy::kGroupCommit && opt_.group_commit_window > absl::ZeroDuration()) {
      lock.unlock();
      std::this_thread::sleep_for(ToChrono(opt_.group_commit_window));
      lock.lock();
    }
    std::deque<Pending> batch;
    if (opt_.sync == SyncPolicy::kEveryCommit) {
      batch.push_back(std::move(pending_.front()));
      pending_.pop_front();
    } else {
      batch.swap(pending_);
    }
    ++in_flight_;
    lock.unlock();

    EncodeBatch(batch);
    absl::Status st = WriteBatch(batch);
    std::uint64_t bytes = 0;
    for (const auto& p : batch) bytes += p.bytes.size();
    if (st.ok()) {
      // Applied before the committers return: they read their own writes.
      std::unique_lock s(state_mu_);
      for (const auto& p : batch) {
        for (const Op& op : p.ops) {
          if (op.op == OpCode::kDelete) {
            state_.erase(op.key);
          } else {
            state_.insert_or_assign(op.key, op.value);
          }
          dirty_.insert(op.key);
        }
      }
      applied_tx_ = batch.back().tx;
      applied_hash_ = batch.back().hash;
      log_bytes_since_ckpt_.fetch_add(bytes);
    }
    lock.lock();
    --in_flight_;
    if (!st.ok()) {
      if (failed_.ok()) failed_ = st;
      for (auto& p : batch) p.waiter->Finish(st);  // their own write failed: the I/O error
      FailPending();                               // the later ones: the failed state
      return false;
    }
    durable_tx_.store(batch.back().tx, std::memory_order_release);
    durable_hash_ = batch.back().hash;
    stats_.log_bytes += bytes;
    if (opt_.checkpoint_log_bytes != 0 && log_bytes_since_ckpt_ >= opt_.checkpoint_log_bytes) {
      maint_cv_.notify_one();
    }
    for (auto& p : batch) p.waiter->Finish(absl::OkStatus());
    return true;
  }

  // The leader's part of a commit, in tx_id order and outside mu_: op codes
  // (create/update from the state as the earlier records leave it), the chain hash,
  // segment rotation, the frame bytes. Only the current leader runs it; the lead
  // passes through mu_.
  void EncodeBatch(std::deque<Pending>& batch) {
    std::shared_lock s(state_mu_);
    for (auto it = writer_view_.begin(); it != writer_view_.end();) {
      if (it->second.second <= applied_tx_) {
        writer_view_.erase(it++);  // state_ has it now
      } else {
        ++it;
      }
    }
    for (Pending& p : batch) {
      Record rec;
      rec.tx_id = p.tx;
      rec.prev_hash = head_hash_;
      rec.ops.reserve(p.changes.size());
      for (auto& c : p.changes) {
        bool exists;
        if (auto v = writer_view_.find(c.key); v != writer_view_.end()) {
          exists = v->second.first;
        } else {
          exists = state_.contains(absl::string_view(c.key.data(), c.key.size()));
        }
        const OpCode code = c.del ? OpCode::kDelete : exists ? OpCode::kUpdate : OpCode::kCreate;
        writer_view_[c.key] = {!c.del, p.tx};
        rec.ops.push_back(Op{code, std::move(c.key), std::move(c.value)});
      }
      p.changes.clear();
      if (segment_bytes_ >= opt_.segment_bytes) {
        p.new_segment_salt = RandomSalt();
        salt_ = p.new_segment_salt;
        segment_bytes_ = kSegmentHeaderBytes;
      }
      head_hash_ = AppendFrame(p.bytes, salt_, rec);
      p.hash = head_hash_;
      segment_bytes_ += p.bytes.size();
      p.ops = std::move(rec.ops);
    }
  }

  // With mu_ held: the owner of the oldest queued record leads next, unless a
  // VerifyChain waits (it hands the lead on when done).
  void HandOffLead() {
    if (pending_.empty() || verify_requested_ > 0 || verifying_ || leader_active_) return;
    leader_active_ = true;  // reserved for the thread woken here
    Waiter* next = pending_.front().waiter;
    next->lead = true;
    next->cv.notify_one();
  }

  // With mu_ held, in the failed state: every queued commit fails.
  void FailPending() {
    const absl::Status st = FailedError();
    for (auto& p : pending_) p.waiter->Finish(st);
    pending_.clear();
  }

  // With mu_ held: enter the failed state (first error wins) and fail what is queued
  // unless a leader will (it checks at its start and end).
  void SetFailed(const absl::Status& st) {
    if (failed_.ok()) failed_ = st;
    if (!leader_active_) FailPending();
    cv_.notify_all();
  }

  absl::Status WriteBatch(const std::deque<Pending>& batch) {
    std::lock_guard io(io_mu_);
    std::string run;  // consecutive records of one segment, written with one call
    auto flush = [&]() -> absl::Status {
      if (run.empty()) return absl::OkStatus();
      SegmentFile& seg = segments_.back();
      if (auto st = Preallocate(seg.bytes + run.size()); !st.ok()) return st;
      absl::Status st = file_->WriteAt(seg.bytes, run);
      unsynced_bytes_ += run.size();
      seg.bytes += run.size();
      run.clear();
      return st;
    };
    for (const Pending& p : batch) {
      if (p.new_segment_salt != 0) {
        if (auto st = flush(); !st.ok()) return st;
        // The old segment is complete: make it durable before starting the next.
        if (auto st = SyncLog(); !st.ok()) return st;
        if (auto st = file_->Close(); !st.ok()) return st;
        if (auto st = CreateSegment(p.tx, p.new_segment_salt); !st.ok()) return st;
      }
      run += p.bytes;
    }
    if (auto st = flush(); !st.ok()) return st;
    if (opt_.sync == SyncPolicy::kEveryCommit || opt_.sync == SyncPolicy::kGroupCommit) {
      if (auto st = SyncLog(); !st.ok()) return st;
      unsynced_bytes_ = 0;
    }
    return absl::OkStatus();
  }

  void MaintenanceLoop() {
    using Clock = std::chrono::steady_clock;
    auto next_sync = Clock::now() + ToChrono(opt_.group_commit_window);
    std::unique_lock lock(mu_);
    while (!stopping_) {
      auto wake = Clock::time_point::max();
      if (opt_.sync == SyncPolicy::kInterval) wake = std::min(wake, next_sync);
      if (opt_.checkpoint_interval > absl::ZeroDuration()) {
        wake = std::min(wake, last_ckpt_time_ + ToChrono(opt_.checkpoint_interval));
      }
      const bool by_size = opt_.checkpoint_log_bytes != 0 &&
                           log_bytes_since_ckpt_ >= opt_.checkpoint_log_bytes;
      if (!by_size) {
        if (wake == Clock::time_point::max()) {
          maint_cv_.wait(lock);
        } else {
          maint_cv_.wait_until(lock, wake);
        }
      }
      if (stopping_ || !failed_.ok()) {
        if (!failed_.ok()) maint_cv_.wait(lock, [&] { return stopping_; });
        break;
      }
      const auto now = Clock::now();
      if (opt_.sync == SyncPolicy::kInterval && now >= next_sync) {
        next_sync = now + ToChrono(opt_.group_commit_window);
        lock.unlock();
        absl::Status st;
        {
          std::lock_guard io(io_mu_);
          if (unsynced_bytes_ > 0) {
            st = SyncLog();
            if (st.ok()) unsynced_bytes_ = 0;
          }
        }
        lock.lock();
        if (!st.ok()) SetFailed(st);
      }
      const bool due_by_time = opt_.checkpoint_interval > absl::ZeroDuration() &&
                               now >= last_ckpt_time_ + ToChrono(opt_.checkpoint_interval);
      const bool due_by_size = opt_.checkpoint_log_bytes != 0 &&
                               log_bytes_since_ckpt_ >= opt_.checkpoint_log_bytes;
      if (due_by_time || due_by_size) {
        lock.unlock();
        {
          std::lock_guard c(ckpt_mu_);
          (void)CheckpointLocked();  // a failure sets the failed state
        }
        lock.lock();
      }
    }
  }

  // A checkpoint, timed (checkpoint_ns_) when it is written. Requires ckpt_mu_.
  absl::Status CheckpointLocked() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::uint64_t written = ckpt_full_written_ + ckpt_incr_written_;
    absl::Status st = WriteCheckpointLocked();
    if (ckpt_full_written_ + ckpt_incr_written_ != written) {
      checkpoint_ns_.Record(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
    }
    return st;
  }

  absl::Status WriteCheckpointLocked() {
    {
      std::lock_guard lock(mu_);
      if (opt_.read_only) {
        return absl::FailedPreconditionError("state store " + QuoteValue(opt_.dir) +
                                             " was opened read-only");
      }
      if (!failed_.ok()) return FailedError();
      last_ckpt_time_ = std::chrono::steady_clock::now();
    }
    state_internal::Checkpoint c;
    std::uint64_t log_bytes_at_snapshot;
    {
      std::unique_lock s(state_mu_);
      if (applied_tx_ == last_ckpt_tx_) return absl::OkStatus();  // nothing new
      log_bytes_at_snapshot = log_bytes_since_ckpt_.load();
      const bool full = opt_.checkpoint_mode == CheckpointMode::kFull || ckpts_.empty() ||
                        incremental_chain_ >= opt_.max_incremental_chain ||
                        IncrementalChainOutweighsFull();
      c.kind = full ? CheckpointKind::kFull : CheckpointKind::kIncremental;
      c.store_id = store_id_;
      c.tx = applied_tx_;
      c.base_tx = full ? 0 : last_ckpt_tx_;
      c.chain_hash = applied_hash_;
      if (full) {
        c.entries.reserve(state_.size());
        for (const auto& [k, v] : state_) c.entries.push_back(CheckpointEntry{false, k, v});
      } else {
        std::vector<std::string> keys(dirty_.begin(), dirty_.end());
        std::sort(keys.begin(), keys.end());
        c.entries.reserve(keys.size());
        for (auto& k : keys) {
          auto it = state_.find(k);
          if (it == state_.end()) {
            c.entries.push_back(CheckpointEntry{true, std::move(k), {}});
          } else {
            c.entries.push_back(CheckpointEntry{false, std::move(k), it->second});
          }
        }
      }
      dirty_.clear();
    }
    absl::Status st = WriteCheckpoint(c);
    if (!st.ok()) {
      std::lock_guard lock(mu_);
      SetFailed(st);
      return st;
    }
    log_bytes_since_ckpt_.fetch_sub(log_bytes_at_snapshot);
    if (c.kind == CheckpointKind::kFull) {
      incremental_chain_ = 0;
      ++ckpt_full_written_;
    } else {
      ++incremental_chain_;
      ++ckpt_incr_written_;
    }
    last_ckpt_tx_ = c.tx;
    return Retire();
  }

  // Recovery reads the full checkpoint and every incremental one after it: once
  // those add up to more bytes than the full one, a new full one is cheaper to read.
  bool IncrementalChainOutweighsFull() const {
    std::uint64_t incremental = 0;
    for (auto it = ckpts_.rbegin(); it != ckpts_.rend(); ++it) {
      if (it->kind == CheckpointKind::kFull) return it->bytes != 0 && incremental >= it->bytes;
      incremental += it->bytes;
    }
    return false;
  }

  absl::Status WriteCheckpoint(const state_internal::Checkpoint& c) {
    auto bytes = EncodeCheckpoint(c);
    if (!bytes.ok()) return bytes.status();
    const std::string name = CheckpointName(c.tx, c.kind);
    const std::string tmp = JoinPath(opt_.dir, name + ".tmp");
    // A temp file of an earlier process is removed at Open; within one process a
    // failed checkpoint fails the store, so none is left over here.
    auto f = fs_->Create(tmp);
    if (!f.ok()) return f.status();
    absl::Status st = (*f)->WriteAt(0, *bytes);
    if (st.ok()) st = (*f)->Sync();
    if (absl::Status cl = (*f)->Close(); st.ok()) st = cl;
    if (st.ok()) st = fs_->Rename(tmp, JoinPath(opt_.dir, name));
    if (st.ok()) st = fs_->SyncDir(opt_.dir);
    if (!st.ok()) {
      (void)fs_->Remove(tmp);
      return st;
    }
    ckpts_.push_back(CheckpointOnDisk{name, c.kind, c.tx, c.base_tx, bytes->size()});
    return absl::OkStatus();
  }

  // Removes what recovery can no longer need, keeping enough that any one damaged
  // checkpoint file still leaves a way back: the newest full checkpoint F, every
  // checkpoint after it, the checkpoint P just before F with the full one its chain
  // starts from, and the log from P on. If F is damaged, recovery takes P's chain
  // and the log; if an incremental after F is damaged, the one before it and the
  // log. (Until there is a P, nothing is removed.)
  absl::Status Retire() {
    std::size_t f = ckpts_.size();
    while (f > 0 && ckpts_[f - 1].kind != CheckpointKind::kFull) --f;
    if (f <= 1) return absl::OkStatus();  // no full one, or nothing before it
    const std::size_t p = f - 2;          // index of P (F is at f - 1)
    const std::uint64_t p_tx = ckpts_[p].tx;
    std::size_t keep_from = p;
    while (keep_from > 0 && ckpts_[keep_from].kind != CheckpointKind::kFull) --keep_from;
    bool removed = false;
    for (std::size_t i = 0; i < keep_from; ++i) {
      if (auto st = fs_->Remove(JoinPath(opt_.dir, ckpts_[i].name)); !st.ok()) return Fail(st);
      removed = true;
    }
    ckpts_.erase(ckpts_.begin(), ckpts_.begin() + static_cast<std::ptrdiff_t>(keep_from));
    {
      std::lock_guard io(io_mu_);
      // Segment i holds [first_i, first_{i+1}); it goes once P covers all of it.
      std::size_t n = 0;
      while (n + 1 < segments_.size() && segments_[n + 1].first_tx - 1 <= p_tx) ++n;
      for (std::size_t i = 0; i < n; ++i) {
        if (auto st = fs_->Remove(JoinPath(opt_.dir, segments_[i].name)); !st.ok()) {
          return Fail(st);
        }
        removed = true;
      }
      segments_.erase(segments_.begin(), segments_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (removed) {
      if (auto st = fs_->SyncDir(opt_.dir); !st.ok()) return Fail(st);
    }
    return absl::OkStatus();
  }

  absl::Status Fail(absl::Status st) {
    std::lock_guard lock(mu_);
    SetFailed(st);
    return st;
  }

  StateStoreOptions opt_;
  std::shared_ptr<FileSystem> fs_;
  std::uint64_t store_id_ = 0;  // IDENTITY; set before any other thread runs

  // mu_: the queue of records and the writer's view.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // durable_tx_, failed_, leader_active_, verifying_
  std::condition_variable maint_cv_;
  std::uint64_t next_tx_ = 1;
  std::deque<Pending> pending_;
  // The leader's (see EncodeBatch): chain head, segment being filled, and whether a
  // key exists after the records encoded but not yet applied (key -> exists, tx).
  Hash head_hash_{};
  std::uint64_t salt_ = 0;
  std::uint64_t segment_bytes_ = 0;
  absl::flat_hash_map<std::string, std::pair<bool, std::uint64_t>> writer_view_;
  bool leader_active_ = false;  // a thread leads a batch (or is woken to)
  int in_flight_ = 0;           // batches taken and not yet published
  mutable bool verifying_ = false;
  mutable int verify_requested_ = 0;
  bool stopping_ = false;
  absl::Status failed_;
  std::atomic<std::uint64_t> durable_tx_{0};
  Hash durable_hash_{};
  std::atomic<std::uint64_t> log_bytes_since_ckpt_{0};  // applied, not yet checkpointed
  std::chrono::steady_clock::time_point last_ckpt_time_{};
  StateStoreStats stats_;

  // io_mu_: the open segment and the list of segments.
  mutable std::mutex io_mu_;
  std::unique_ptr<WritableFile> file_;
  std::vector<SegmentFile> segments_;
  std::uint64_t unsynced_bytes_ = 0;
  std::uint64_t allocated_ = 0;  // bytes of the open segment file, zero-filled ahead
  std::uint64_t stats_log_syncs_ = 0;
  Histogram log_sync_ns_;     // each fdatasync of the log that succeeded
  Histogram checkpoint_ns_;   // each checkpoint written (snapshot, write, retire)

  // fdatasync of the open segment, timed and counted. Requires io_mu_.
  absl::Status SyncLog() {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = file_->Sync();
    if (st.ok()) {
      ++stats_log_syncs_;
      log_sync_ns_.Record(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
    }
    return st;
  }

  // state_mu_: the applied state.
  mutable std::shared_mutex state_mu_;
  StateMap state_;
  absl::flat_hash_set<std::string> dirty_;  // keys changed since the last checkpoint
  std::uint64_t applied_tx_ = 0;
  Hash applied_hash_{};

  // ckpt_mu_: checkpoints on disk.
  mutable std::mutex ckpt_mu_;
  std::vector<CheckpointOnDisk> ckpts_;
  std::uint64_t last_ckpt_tx_ = 0;
  int incremental_chain_ = 0;
  std::uint64_t ckpt_full_written_ = 0, ckpt_incr_written_ = 0;

  std::thread maintenance_;

 public:
  std::unique_ptr<FileLock> dir_lock_;  // the LOCK file; ~Impl() has closed the log before

  std::uint64_t log_syncs() const {
    std::lock_guard io(io_mu_);
    return stats_log_syncs_;
  }
  HistogramSnapshot log_sync_ns() const { return log_sync_ns_.Snapshot(); }
  HistogramSnapshot checkpoint_ns() const { return checkpoint_ns_.Snapshot(); }
};

// ---------------------------------------------------------------------------------

Transaction& Transaction::Put(std::string_view key, std::string_view value) {
  changes_.push_back(Change{false, std::string(key), std::string(value)});
  return *this;
}

Transaction& Transaction::Delete(std::string_view key) {
  changes_.push_back(Change{true, std::string(key), {}});
  return *this;
}

absl::StatusOr<std::uint64_t> Transaction::Commit() {
  if (committed_) {
    return absl::FailedPreconditionError("transaction was already submitted (committed or failed)");
  }
  auto r = store_->CommitChanges(changes_);
  // Bad input changed nothing and may be corrected; otherwise the changes were
  // handed to the log (and are gone from here), successfully or not.
  if (r.ok() || r.status().code() != absl::StatusCode::kInvalidArgument) {
    committed_ = true;
    changes_.clear();
  }
  return r;
}

StateStore::StateStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateStore::~StateStore() = default;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(StateStoreOptions options) {
  if (auto st = ValidateOptions(options); !st.ok()) return st;
  if (!options.file_system) options.file_system = PosixFileSystem();
  FileSystem& fs = *options.file_system;
  std::unique_ptr<FileLock> lock;
  if (!options.read_only) {
    if (auto st = fs.CreateDir(options.dir); !st.ok()) return NotWritable(options.dir, st);
    // One writer per directory (RocksDB's LOCK file): a second store on the same
    // files would interleave records and break the chain.
    auto l = fs.Lock(JoinPath(options.dir, "LOCK"));
    if (!l.ok()) return NotWritable(options.dir, l.status());
    lock = std::move(*l);
  }
  const auto t0 = std::chrono::steady_clock::now();
  RecoverOptions ro;
  ro.strict = options.recovery == RecoveryMode::kStrict;
  ro.modify = !options.read_only;
  // A read-only open may run next to a writer and catch its files mid-change: it
  // lists and reads again (RecoverReadOnly).
  auto r = options.read_only ? RecoverReadOnly(fs, options.dir, ro) : Recover(fs, options.dir, ro);
  if (!r.ok()) return options.read_only ? r.status() : NotWritable(options.dir, r.status());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string dir = options.dir;  // for the error below; options is moved from
  const bool read_only = options.read_only;
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->dir_lock_ = std::move(lock);
  if (auto st = impl->Start(std::move(*r), ms); !st.ok()) {
    return read_only ? st : NotWritable(dir, st);
  }
  return std::unique_ptr<StateStore>(new StateStore(std::move(impl)));
}

absl::StatusOr<std::uint64_t> StateStore::CommitChanges(
    std::vector<Transaction::Change>& changes) {
  return impl_->Commit(changes);
}

std::optional<std::string> StateStore::Get(std::string_view key) const { return impl_->Get(key); }

void StateStore::ScanImpl(std::string_view prefix,
                          absl::FunctionRef<void(std::string_view, std::string_view)> fn) const {
  impl_->Scan(prefix, fn);
}

absl::Status StateStore::Checkpoint() { return impl_->Checkpoint(); }
absl::Status StateStore::VerifyChain() const { return impl_->VerifyChain(); }
std::uint64_t StateStore::last_tx_id() const { return impl_->last_tx_id(); }

StateStoreStats StateStore::Stats() const {
  StateStoreStats s = impl_->Stats();
  s.log_syncs = impl_->log_syncs();
  s.log_sync_ns = impl_->log_sync_ns();
  s.checkpoint_ns = impl_->checkpoint_ns();
  return s;
}

namespace {

// One pass of Inspect over `fs`, a PinnedDirectory: every part of the report is
// read from the same cut of the directory.
StateDirReport InspectPass(FileSystem& fs, const std::string& dir) {
  auto names = fs.List(dir);  // pinned: cannot fail
  std::sort(names->begin(), names->end());
  StateDirReport rep;
  for (const std::string& name : *names) {
    if (auto c = ParseCheckpointName(name)) {
      StateDirReport::CheckpointFile f;
      f.name = name;
      f.full = c->kind == CheckpointKind::kFull;
      f.tx = c->tx;
      auto bytes = fs.Read(JoinPath(dir, name));
      if (!bytes.ok()) {
        f.problem = std::string(bytes.status().message());
        f.unreadable = bytes.status().code() != absl::StatusCode::kDataLoss;
      } else {
        f.bytes = bytes->size();
        auto d = DecodeCheckpoint(*bytes);
        if (!d.ok()) {
          f.problem = std::string(d.status().message());
        } else {
          f.base_tx = d->base_tx;
          f.entries = d->entries.size();
        }
      }
      rep.checkpoints.push_back(std::move(f));
    } else if (ParseSegmentName(name)) {
      StateDirReport::Segment s;
      s.name = name;
      auto bytes = fs.Read(JoinPath(dir, name));
      if (!bytes.ok()) {
        s.problem = std::string(bytes.status().message());
        s.unreadable = bytes.status().code() != absl::StatusCode::kDataLoss;
        rep.segments.push_back(std::move(s));
        continue;
      }
      s.bytes = bytes->size();
      auto h = DecodeSegmentHeader(*bytes);
      if (!h.ok()) {
        s.problem = std::string(h.status().message());
        rep.segments.push_back(std::move(s));
        continue;
      }
      std::size_t off = kSegmentHeaderBytes;
      while (off < bytes->size()) {
        DecodedFrame f = DecodeFrame(*bytes, off, h->salt);
        if (f.status != FrameStatus::kOk) {
          const bool zeros = std::all_of(bytes->begin() + static_cast<std::ptrdiff_t>(off),
                                         bytes->end(), [](char c) { return c == '\0'; });
          if (!zeros) s.problem = f.why + " at offset " + std::to_string(off);
          break;
        }
        if (s.records == 0) s.first_tx = f.record.tx_id;
        s.last_tx = f.record.tx_id;
        ++s.records;
        off += f.size;
      }
      s.used_bytes = off;
      rep.segments.push_back(std::move(s));
    }
  }
  for (const auto& s : rep.segments) {
    if (s.records != 0 && (rep.first_tx == 0 || s.first_tx < rep.first_tx)) rep.first_tx = s.first_tx;
  }
  RecoverOptions strict;
  strict.strict = true;
  strict.build_state = false;
  strict.check_all_checkpoints = true;
  auto r = Recover(fs, dir, strict);
  rep.chain = r.status();
  RecoverOptions pit;
  pit.build_state = false;
  auto p = Recover(fs, dir, pit);
  rep.point_in_time = p.status();
  rep.last_tx = p.ok() ? p->last_tx : 0;
  return rep;
}

bool Clean(const StateDirReport& rep) {
  for (const auto& s : rep.segments) {
    if (!s.problem.empty()) return false;
  }
  for (const auto& c : rep.checkpoints) {
    if (!c.problem.empty()) return false;
  }
  return rep.chain.ok() && rep.point_in_time.ok();
}

}  // namespace

absl::StatusOr<StateDirReport> StateStore::Inspect(const std::string& dir,
                                                   std::shared_ptr<FileSystem> fs_ptr) {
  if (!fs_ptr) fs_ptr = PosixFileSystem();
  // Next to a live writer a pass can catch the directory mid-change (see
  // RecoverReadOnly); a report that shows a problem is taken again from a new
  // listing, and the last one is returned.
  // A pass that saw the very files of the one before (same names and bytes) would
  // report the same: the damage is real and the directory is not changing, so no
  // more passes are made (each reads every file).
  StateDirReport rep;
  std::optional<std::uint64_t> last_fingerprint;
  for (int pass = 0; pass < kReadOnlyPasses; ++pass) {
    WaitBeforePass(pass);
    auto pinned = PinnedDirectory::Make(*fs_ptr, dir);
    if (!pinned.ok()) return pinned.status();
    if (last_fingerprint == (*pinned)->fingerprint()) break;
    last_fingerprint = (*pinned)->fingerprint();
    rep = InspectPass(**pinned, dir);
    if (Clean(rep)) break;
  }
  return rep;
}

}  // namespace inferq
