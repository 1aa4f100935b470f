/// @file inferq/engine/lifecycle.hpp
///
/// Lifecycle: the durable state machines of models and of the messages they serve,
/// kept in a StateStore so that model state and message
/// state never disagree, not even after a crash.
///
/// @code{.unparsed}
///   model:    (new) --BeginWarmup--> Warmup --ModelReady--> Inference
///             Warmup | Inference --Evict(reason)--> Evicted --BeginWarmup--> Warmup
///   message:  (new) --Enqueue--> Pending --StartProcessing--> Processing
///             Processing --Requeue--> Pending
///             Processing --Complete--> Completed
///             Pending | Processing --Expire(reason)--> Expired
///             Completed | Expired --Forget--> (gone; the id may be enqueued again)
/// @endcode
///
/// Invariant (checked at Open, by Verify, and by the tests after every crash): a
/// Pending message's model is in Warmup or Inference; a Processing message's model
/// is in Inference. Every transition is exactly one StateStore transaction, and the
/// consequences that keep the invariant go into that same transaction: Evict writes
/// the model as Evicted and every Pending/Processing message of the model as Expired
/// (reason "model evicted") in one commit. Nothing else changes the state: timeouts
/// are applied when RunTimeouts() is called (the engine's timer calls it):
///   - a model in Warmup for `warmup_timeout` or longer is evicted ("warmup timeout"),
///     with its messages expired ("model evicted");
///   - a message Processing for `inference_timeout` or longer is expired
///     ("inference timeout").
///
/// Pending messages have no timeout here: a message's TTL is the stream's business,
/// which calls Expire. Completed and Expired records are kept until Forget(msg_id)
/// deletes them (the host calls Forget once it no longer needs the outcome); model
/// records are kept for good (a model can warm up again after an eviction). The
/// engine moves a consumer's deliveries through a Lifecycle when the consumer has
/// one (ConsumerConfig::lifecycle: deliveries, acks, naks and dead letters make the
/// transitions, and the engine forgets the records it no longer needs), and
/// EngineOptions::lifecycle has its timer call RunTimeouts.
///
/// Usage:
/// @code
///   inferq::LifecycleOptions o;                       // 30 s warmup, 120 s inference
///   auto lc = inferq::Lifecycle::Open(store.get(), o);  // rebuilds from the store
///   (*lc)->BeginWarmup("llama-3-8b");
///   (*lc)->Enqueue("req-17", "llama-3-8b");            // Pending (model warming up)
///   (*lc)->ModelReady("llama-3-8b");
///   (*lc)->StartProcessing("req-17");                 // needs the model in Inference
///   (*lc)->Complete("req-17");
///   (*lc)->Forget("req-17");
///   auto expired = (*lc)->RunTimeouts();               // on a timer
/// @endcode
///
/// Store keys and values (text, one space between fields; the last field, the
/// reason, is the rest of the value and may contain spaces; times are ns of the
/// lifecycle's Clock, signed decimal):
/// @code{.unparsed}
///   <prefix>.model.<model>  "v1 <state> <since_ns> <generation> <reason>"
///       state: warmup | inference | evicted; since_ns: when it entered the state;
///       generation: how many times it began a warmup (1 on the first);
///       reason: empty unless evicted, then not empty.
///   <prefix>.msg.<msg_id>   "v1 <state> <model> <enqueued_ns> <since_ns> <reason>"
///       state: pending | processing | completed | expired; reason: empty unless
///       expired, then not empty.
/// e.g. "v1 evicted 30000000000 1 warmup timeout",
///      "v1 expired llama 5 30000000000 model evicted".
/// @endcode
/// Open refuses (kDataLoss, naming the key) a malformed value, an unknown key under
/// `<prefix>.`, a message whose model has no record, and a record set that breaks
/// the invariant. One Lifecycle per prefix of a store; prefixes must not nest
/// ("a" and "a.b") since Open reads every key under `<prefix>.`.
///
/// Time: the clock is monotonic but its origin may differ between processes (the
/// steady clock restarts at boot). A record loaded at Open whose since_ns is later
/// than the clock's now starts its timeout at Open; its reported since_ns stays what
/// was committed. The states after a restart are what was committed: the caller
/// decides what to do about models its new process does not hold (e.g. Evict them).
///
/// Thread safety: every member may be called from many threads at once. Transitions
/// that touch one model (the model's own and those of its messages) run one at a
/// time, holding that model's mutex across their Commit; transitions of different
/// models commit concurrently (so kGroupCommit can share fdatasyncs). The lifecycle's
/// own map mutex is never held across a Commit. Queries see every transition whose
/// Commit returned and was applied; a transition that fails changes nothing, in
/// memory or in the store. The StateStore must outlive the Lifecycle.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "inferq/base/clock.hpp"
#include "inferq/state/state_store.hpp"

namespace inferq {

/// A model's state (see the file comment).
enum class ModelState { kWarmup, kInference, kEvicted };
/// A message's state (see the file comment).
enum class MessageState { kPending, kProcessing, kCompleted, kExpired };

/// "warmup", "inference", "evicted" / "pending", "processing", "completed",
/// "expired": the words of the store encoding and of error messages.
///@{
std::string_view ModelStateName(ModelState s);
std::string_view MessageStateName(MessageState s);
///@}

/// A Lifecycle's timeouts, store keys and clock; checked by Lifecycle::Open.
struct LifecycleOptions {
  /// How long a model may stay in Warmup; RunTimeouts evicts it at this age or later.
  /// Must be > 0; absl::InfiniteDuration() turns the timeout off.
  absl::Duration warmup_timeout = absl::Seconds(30);
  /// How long a message may stay Processing; RunTimeouts expires it at this age or
  /// later. Must be > 0; absl::InfiniteDuration() turns the timeout off.
  absl::Duration inference_timeout = absl::Seconds(120);
  /// Keys are "<key_prefix>.model.<model>" and "<key_prefix>.msg.<msg_id>".
  /// 1 to 64 characters of A-Z a-z 0-9 _ - and '.' (not first, last, or doubled).
  std::string key_prefix = "lifecycle";
  /// Source of the since_ns/enqueued_ns times and of the timeouts (nullptr:
  /// SteadyClock::Default()). Must outlive the Lifecycle.
  const Clock* clock = nullptr;
};

/// A model's record (Lifecycle::GetModel).
struct ModelInfo {
  ModelState state = ModelState::kWarmup;  ///< its state
  std::int64_t since_ns = 0;       ///< clock time it entered `state`
  std::uint64_t generation = 0;    ///< BeginWarmup calls committed for it (≥ 1)
  std::string reason;              ///< why it was evicted; empty unless kEvicted
  std::uint64_t live_messages = 0; ///< its messages now Pending or Processing
};

/// A message's record (Lifecycle::GetMessage, Lifecycle::Messages).
struct MessageInfo {
  MessageState state = MessageState::kPending;  ///< its state
  std::string model;             ///< the model it was enqueued on
  std::int64_t enqueued_ns = 0;  ///< clock time of Enqueue
  std::int64_t since_ns = 0;     ///< clock time it entered `state`
  std::string reason;            ///< why it expired; empty unless kExpired
};

/// What one RunTimeouts call changed, each list in the order the transitions
/// committed.
struct TimeoutReport {
  std::vector<std::string> evicted_models;     ///< reason "warmup timeout"
  /// Every message it moved to Expired: "inference timeout" ones and those of the
  /// evicted models ("model evicted").
  std::vector<std::string> expired_messages;
};

/// Counts now (per state) and since Open (the rest).
struct LifecycleStats {
  std::uint64_t models_warmup = 0;        ///< models in Warmup now
  std::uint64_t models_inference = 0;     ///< models in Inference now
  std::uint64_t models_evicted = 0;       ///< models Evicted now
  std::uint64_t messages_pending = 0;     ///< messages Pending now
  std::uint64_t messages_processing = 0;  ///< messages Processing now
  std::uint64_t messages_completed = 0;   ///< messages Completed now (not yet forgotten)
  std::uint64_t messages_expired = 0;     ///< messages Expired now (not yet forgotten)
  std::uint64_t transactions = 0;     ///< committed since Open (transitions + forgets)
  std::uint64_t transitions = 0;      ///< state changes of models and messages since Open
                                      ///< (an Evict with 3 live messages counts 4)
  std::uint64_t forgotten = 0;        ///< messages deleted by Forget since Open
  std::uint64_t failed_commits = 0;   ///< transitions the store refused since Open
  std::map<std::string, std::uint64_t> evictions_by_reason;    ///< models, since Open
  std::map<std::string, std::uint64_t> expirations_by_reason;  ///< messages, since Open
};

/// The durable state machines of models and of the messages they serve, kept in a
/// StateStore (see the file comment).
class Lifecycle {
 public:
  /// Validates `options` and rebuilds the state from `store` (a Scan of
  /// "<key_prefix>."). Errors: kInvalidArgument for a null store or a bad option
  /// (naming the field and value); kDataLoss naming the key for a malformed or
  /// unknown record or a broken invariant (see the file comment).
  static absl::StatusOr<std::unique_ptr<Lifecycle>> Open(StateStore* store,
                                                         LifecycleOptions options);

  ~Lifecycle();
  Lifecycle(const Lifecycle&) = delete;
  Lifecycle& operator=(const Lifecycle&) = delete;

  /// @name Transitions
  /// Every transition below is one StateStore transaction. Errors, common to all:
  /// kInvalidArgument for a model name or msg_id that is not 1 to 256 visible ASCII
  /// characters (0x21 to 0x7e; base/limits.hpp ValidateId), or a reason that is not 1 to 256 printable ASCII
  /// characters (0x20 to 0x7e); kNotFound for an unknown model or message;
  /// kFailedPrecondition when the current state does not allow the transition (the
  /// message names the model or message and its state, e.g.
  /// "message 'r1' is pending; Complete needs processing"); the store's own error
  /// when Commit fails (then nothing changed, in memory or in the store). Enqueue
  /// adds kAlreadyExists naming the msg_id (see there).
  ///@{

  /// (new) | Evicted -> Warmup; the generation goes up by one.
  absl::Status BeginWarmup(std::string_view model);
  /// Warmup -> Inference.
  absl::Status ModelReady(std::string_view model);
  /// Warmup | Inference -> Evicted with `reason`; in the same transaction every
  /// Pending/Processing message of the model -> Expired ("model evicted"). Returns
  /// the ids of those messages, sorted.
  absl::StatusOr<std::vector<std::string>> Evict(std::string_view model,
                                                 std::string_view reason);

  /// (new) -> Pending on `model`, which must be in Warmup or Inference
  /// (kFailedPrecondition otherwise, kNotFound when it has no record).
  /// kAlreadyExists when `msg_id` has a record (in any state: Forget it first; e.g.
  /// "message 'r1' is completed on model 'm'; Enqueue needs a new msg_id") or is being
  /// enqueued by another thread ("message 'r1' is being enqueued by another call").
  absl::Status Enqueue(std::string_view msg_id, std::string_view model);
  /// Pending -> Processing; its model must be in Inference.
  absl::Status StartProcessing(std::string_view msg_id);
  /// Processing -> Pending (a delivery that failed and is to be delivered again).
  absl::Status Requeue(std::string_view msg_id);
  /// Processing -> Completed.
  absl::Status Complete(std::string_view msg_id);
  /// Pending | Processing -> Expired with `reason`.
  absl::Status Expire(std::string_view msg_id, std::string_view reason);
  /// Completed | Expired -> record deleted.
  absl::Status Forget(std::string_view msg_id);
  ///@}

  /// Applies the timeouts at the clock's now: evicts models in Warmup for
  /// warmup_timeout or longer (their messages expire with them), then expires
  /// messages Processing for inference_timeout or longer; one transaction each. A
  /// record whose state changed meanwhile is skipped. On a failed Commit returns its
  /// error; what this call committed before it stays committed.
  absl::StatusOr<TimeoutReport> RunTimeouts();

  /// The record of `model` or `msg_id` as committed now.
  /// kNotFound ("model 'x' is unknown" / "message 'x' is unknown") when absent.
  ///@{
  absl::StatusOr<ModelInfo> GetModel(std::string_view model) const;
  absl::StatusOr<MessageInfo> GetMessage(std::string_view msg_id) const;
  ///@}
  /// The messages whose id starts with `id_prefix` (every message for an empty one),
  /// sorted by id, as committed now.
  std::vector<std::pair<std::string, MessageInfo>> Messages(std::string_view id_prefix = {}) const;
  /// A snapshot of the counts.
  LifecycleStats Stats() const;

  /// Checks the invariant on the in-memory state and that the store holds exactly
  /// the in-memory records under "<key_prefix>.", for every model (and its
  /// messages) that existed when it started; waits for their transitions in
  /// flight. kInternal naming the first disagreement. For tests and operators.
  absl::Status Verify() const;

 private:
  struct MessageRec {
    MessageInfo info;
    std::int64_t timer_start_ns = 0;  ///< since_ns, or Open's now (see "Time")
  };
  struct Slot {                // one per model name ever seen; never removed
    std::mutex tx_mu;          ///< held across every Commit touching this model
    bool exists = false;       ///< guarded by mu_ (false: no record yet)
    ModelInfo info;            ///< guarded by mu_ (live_messages unused: see live)
    std::int64_t timer_start_ns = 0;         ///< guarded by mu_
    std::set<std::string, std::less<>> live;   ///< guarded by mu_: Pending/Processing ids
  };

  Lifecycle(StateStore* store, LifecycleOptions options);
  absl::Status Load();
  std::string ModelKey(std::string_view model) const;
  std::string MessageKey(std::string_view msg_id) const;
  std::int64_t Now() const { return clock_->NowNanos(); }
  /// The slot of `model` (NotFound naming it when never seen); takes mu_ briefly.
  absl::StatusOr<Slot*> FindSlot(std::string_view model);
  /// Evict/Expire, with `if_timed_out` set only by RunTimeouts: then a record that is
  /// no longer in the state, or not yet timed out, is skipped (returns false).
  absl::StatusOr<bool> EvictImpl(std::string_view model, std::string_view reason,
                                 bool if_timed_out, std::vector<std::string>* expired);
  absl::StatusOr<bool> MessageTransition(std::string_view msg_id, int op,
                                         std::string_view reason, bool if_timed_out);
  void CountMessage(MessageState s, int delta);
  void CountModel(ModelState s, int delta);

  StateStore* const store_;
  const LifecycleOptions options_;
  const Clock* const clock_;
  const std::int64_t warmup_timeout_ns_;     ///< INT64_MAX: never
  const std::int64_t inference_timeout_ns_;  ///< INT64_MAX: never

  mutable std::mutex mu_;  ///< guards the maps and stats below; never held across Commit
  std::map<std::string, std::unique_ptr<Slot>, std::less<>> slots_;
  std::map<std::string, MessageRec, std::less<>> messages_;
  std::set<std::string, std::less<>> enqueuing_;  ///< ids whose Enqueue is committing
  LifecycleStats stats_;
};

}  // namespace inferq
