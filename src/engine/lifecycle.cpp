#include "inferq/engine/lifecycle.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <utility>

#include <charconv>
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "lifecycle_records.hpp"

namespace inferq {

using lifecycle_internal::DecodeMessage;
using lifecycle_internal::DecodeModel;
using lifecycle_internal::EncodeMessage;
using lifecycle_internal::EncodeModel;
using lifecycle_internal::Malformed;
using lifecycle_internal::ValidatePrefix;
using lifecycle_internal::ValidateReason;

namespace {

enum MessageOp { kStart = 0, kComplete = 1, kExpire = 2, kForget = 3, kRequeue = 4 };

std::int64_t TimeoutNs(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return INT64_MAX;
  return absl::ToInt64Nanoseconds(d);  // saturates
}

// now - start >= timeout, without overflow (a start later than now is age 0).
bool TimedOut(std::int64_t now, std::int64_t start, std::int64_t timeout_ns) {
  if (timeout_ns == INT64_MAX) return false;
  if (start >= now) return timeout_ns <= 0;
  std::int64_t age = 0;
  if (__builtin_sub_overflow(now, start, &age)) return true;  // older than any timeout
  return age >= timeout_ns;
}

bool Live(MessageState s) { return s == MessageState::kPending || s == MessageState::kProcessing; }

// The invariant: may a message in `ms` be on a model in `mo`?
bool Allowed(MessageState ms, ModelState mo) {
  if (ms == MessageState::kPending) return mo != ModelState::kEvicted;
  if (ms == MessageState::kProcessing) return mo == ModelState::kInference;
  return true;
}

std::string ModelIs(std::string_view model, ModelState s) {
  return "model " + QuoteValue(model) + (s == ModelState::kEvicted ? " is " : " is in ") +
         std::string(ModelStateName(s));
}
std::string MessageIs(std::string_view id, MessageState s) {
  return "message " + QuoteValue(id) + " is " + std::string(MessageStateName(s));
}
absl::Status UnknownModel(std::string_view model) {
  return absl::NotFoundError("model " + QuoteValue(model) + " is unknown");
}
absl::Status UnknownMessage(std::string_view id) {
  return absl::NotFoundError("message " + QuoteValue(id) + " is unknown");
}

}  // namespace

std::string_view ModelStateName(ModelState s) {
  switch (s) {
    case ModelState::kWarmup: return "warmup";
    case ModelState::kInference: return "inference";
    case ModelState::kEvicted: return "evicted";
  }
  return "invalid";
}

std::string_view MessageStateName(MessageState s) {
  switch (s) {
    case MessageState::kPending: return "pending";
    case MessageState::kProcessing: return "processing";
    case MessageState::kCompleted: return "completed";
    case MessageState::kExpired: return "expired";
  }
  return "invalid";
}

Lifecycle::Lifecycle(StateStore* store, LifecycleOptions options)
    : store_(store),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : SteadyClock::Default()),
      warmup_timeout_ns_(TimeoutNs(options_.warmup_timeout)),
      inference_timeout_ns_(TimeoutNs(options_.inference_timeout)) {}

Lifecycle::~Lifecycle() = default;

absl::StatusOr<std::unique_ptr<Lifecycle>> Lifecycle::Open(StateStore* store,
                                                           LifecycleOptions options) {
  if (store == nullptr) return absl::InvalidArgumentError("Lifecycle::Open: store is null");
  if (options.warmup_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("LifecycleOptions.warmup_timeout " +
                                      absl::FormatDuration(options.warmup_timeout) +
                                      " must be > 0");
  }
  if (options.inference_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("LifecycleOptions.inference_timeout " +
                                      absl::FormatDuration(options.inference_timeout) +
                                      " must be > 0");
  }
  if (auto st = ValidatePrefix(options.key_prefix); !st.ok()) return st;
  std::unique_ptr<Lifecycle> lc(new Lifecycle(store, std::move(options)));
  if (auto st = lc->Load(); !st.ok()) return st;
  return lc;
}

std::string Lifecycle::ModelKey(std::string_view model) const {
  return options_.key_prefix + ".model." + std::string(model);
}
std::string Lifecycle::MessageKey(std::string_view msg_id) const {
  return options_.key_prefix + ".msg." + std::string(msg_id);
}

void Lifecycle::CountModel(ModelState s, int delta) {
  std::uint64_t* c = s == ModelState::kWarmup      ? &stats_.models_warmup
                     : s == ModelState::kInference ? &stats_.models_inference
                                                   : &stats_.models_evicted;
  *c += static_cast<std::uint64_t>(static_cast<std::int64_t>(delta));
}

void Lifecycle::CountMessage(MessageState s, int delta) {
  std::uint64_t* c = s == MessageState::kPending      ? &stats_.messages_pending
                     : s == MessageState::kProcessing ? &stats_.messages_processing
                     : s == MessageState::kCompleted  ? &stats_.messages_completed
                                                      : &stats_.messages_expired;
  *c += static_cast<std::uint64_t>(static_cast<std::int64_t>(delta));
}

absl::Status Lifecycle::Load() {
  std::vector<std::pair<std::string, std::string>> records;
  const std::string scan = options_.key_prefix + ".";
  store_->Scan(scan, [&](std::string_view k, std::string_view v) {
    records.emplace_back(std::string(k), std::string(v));
  });
  const std::string model_prefix = scan + "model.";
  const std::string msg_prefix = scan + "msg.";
  const std::int64_t now = Now();
  std::lock_guard lock(mu_);
  // Models first: messages are checked against them.
  std::vector<std::pair<std::string_view, std::string_view>> msgs;
  for (const auto& [k, v] : records) {
    std::string_view key = k;
    if (key.rfind(model_prefix, 0) == 0) {
      const std::string_view name = key.substr(model_prefix.size());
      if (!ValidateId("model", name).ok()) {
        return absl::DataLossError("lifecycle key " + QuoteValue(key) + " has a bad model name");
      }
      auto slot = std::make_unique<Slot>();
      if (auto st = DecodeModel(key, v, &slot->info); !st.ok()) return st;
      slot->exists = true;
      slot->timer_start_ns = std::min(slot->info.since_ns, now);
      CountModel(slot->info.state, 1);
      slots_.emplace(std::string(name), std::move(slot));
    } else if (key.rfind(msg_prefix, 0) == 0) {
      msgs.emplace_back(key, v);
    } else {
      return absl::DataLossError("lifecycle key " + QuoteValue(key) +
                                 " is neither a model nor a message record");
    }
  }
  for (const auto& [key, v] : msgs) {
    const std::string_view id = key.substr(msg_prefix.size());
    if (!ValidateId("msg_id", id).ok()) {
      return absl::DataLossError("lifecycle key " + QuoteValue(key) + " has a bad msg_id");
    }
    MessageRec rec;
    if (auto st = DecodeMessage(key, v, &rec.info); !st.ok()) return st;
    auto it = slots_.find(rec.info.model);
    if (it == slots_.end() && !Live(rec.info.state)) {
      // A finished message may outlive nothing of its model but the name; give the
      // name a slot so that every message's model has one.
      it = slots_.emplace(rec.info.model, std::make_unique<Slot>()).first;
    }
    if (Live(rec.info.state)) {
      if (it == slots_.end()) {
        return absl::DataLossError("lifecycle key " + QuoteValue(key) + " is " +
                                   std::string(MessageStateName(rec.info.state)) +
                                   " on model " + QuoteValue(rec.info.model) +
                                   ", which has no record");
      }
      if (!Allowed(rec.info.state, it->second->info.state)) {
        const ModelState ms = it->second->info.state;
        return absl::DataLossError(
            "lifecycle key " + QuoteValue(key) + " is " +
            std::string(MessageStateName(rec.info.state)) + " on model " +
            QuoteValue(rec.info.model) + ", which is " +
            (ms == ModelState::kEvicted ? "" : "in ") + std::string(ModelStateName(ms)) +
            " (broken invariant)");
      }
      it->second->live.insert(std::string(id));
    }
    rec.timer_start_ns = std::min(rec.info.since_ns, now);
    CountMessage(rec.info.state, 1);
    messages_.emplace(std::string(id), std::move(rec));
  }
  return absl::OkStatus();
}

absl::Status Lifecycle::BeginWarmup(std::string_view model) {
  if (auto st = ValidateId("model", model); !st.ok()) return st;
  Slot* slot;
  {
    std::lock_guard lock(mu_);
    auto& s = slots_[std::string(model)];
    if (!s) s = std::make_unique<Slot>();
    slot = s.get();
  }
  std::lock_guard tx_lock(slot->tx_mu);
  ModelInfo next;
  {
    std::lock_guard lock(mu_);
    if (slot->exists && slot->info.state != ModelState::kEvicted) {
      return absl::FailedPreconditionError(ModelIs(model, slot->info.state) +
                                           "; BeginWarmup needs it new or evicted");
    }
    next.state = ModelState::kWarmup;
    next.since_ns = Now();
    next.generation = (slot->exists ? slot->info.generation : 0) + 1;
  }
  auto tx = store_->Begin();
  tx.Put(ModelKey(model), EncodeModel(next));
  auto r = tx.Commit();
  std::lock_guard lock(mu_);
  if (!r.ok()) {
    ++stats_.failed_commits;
    return r.status();
  }
  if (slot->exists) CountModel(slot->info.state, -1);
  CountModel(next.state, 1);
  slot->exists = true;
  slot->info = std::move(next);
  slot->timer_start_ns = slot->info.since_ns;
  ++stats_.transactions;
  ++stats_.transitions;
  return absl::OkStatus();
}

absl::StatusOr<Lifecycle::Slot*> Lifecycle::FindSlot(std::string_view model) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(model);
  if (it == slots_.end()) return UnknownModel(model);
  return it->second.get();
}

absl::Status Lifecycle::ModelReady(std::string_view model) {
  if (auto st = ValidateId("model", model); !st.ok()) return st;
  absl::StatusOr<Slot*> found = FindSlot(model);
  if (!found.ok()) return found.status();
  Slot* slot = *found;
  std::lock_guard tx_lock(slot->tx_mu);
  ModelInfo next;
  {
    std::lock_guard lock(mu_);
    if (!slot->exists) return UnknownModel(model);
    if (slot->info.state != ModelState::kWarmup) {
      return absl::FailedPreconditionError(ModelIs(model, slot->info.state) +
                                           "; ModelReady needs warmup");
    }
    next = slot->info;
    next.state = ModelState::kInference;
    next.since_ns = Now();
  }
  auto tx = store_->Begin();
  tx.Put(ModelKey(model), EncodeModel(next));
  auto r = tx.Commit();
  std::lock_guard lock(mu_);
  if (!r.ok()) {
    ++stats_.failed_commits;
    return r.status();
  }
  CountModel(slot->info.state, -1);
  CountModel(next.state, 1);
  slot->info = std::move(next);
  slot->timer_start_ns = slot->info.since_ns;
  ++stats_.transactions;
  ++stats_.transitions;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Lifecycle::Evict(std::string_view model,
                                                          std::string_view reason) {
  if (auto st = ValidateId("model", model); !st.ok()) return st;
  if (auto st = ValidateReason(reason); !st.ok()) return st;
  std::vector<std::string> expired;
  auto r = EvictImpl(model, reason, /*if_timed_out=*/false, &expired);
  if (!r.ok()) return r.status();
  return expired;
}

absl::StatusOr<bool> Lifecycle::EvictImpl(std::string_view model, std::string_view reason,
                                          bool if_timed_out, std::vector<std::string>* expired) {
  static constexpr std::string_view kModelEvicted = "model evicted";
  absl::StatusOr<Slot*> found = FindSlot(model);
  if (!found.ok()) return found.status();
  Slot* slot = *found;
  std::lock_guard tx_lock(slot->tx_mu);
  ModelInfo next;
  std::vector<std::pair<std::string, MessageInfo>> msgs;  // sorted by id
  std::int64_t now;
  {
    std::lock_guard lock(mu_);
    if (!slot->exists) return UnknownModel(model);
    now = Now();
    if (if_timed_out) {
      if (slot->info.state != ModelState::kWarmup ||
          !TimedOut(now, slot->timer_start_ns, warmup_timeout_ns_)) {
        return false;
      }
    } else if (slot->info.state == ModelState::kEvicted) {
      return absl::FailedPreconditionError(ModelIs(model, slot->info.state) +
                                           "; Evict needs warmup or inference");
    }
    next = slot->info;
    next.state = ModelState::kEvicted;
    next.since_ns = now;
    next.reason = std::string(reason);
    for (const std::string& id : slot->live) {
      MessageInfo m = messages_.at(id).info;
      m.state = MessageState::kExpired;
      m.since_ns = now;
      m.reason = std::string(kModelEvicted);
      msgs.emplace_back(id, std::move(m));
    }
  }
  std::sort(msgs.begin(), msgs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  auto tx = store_->Begin();
  tx.Put(ModelKey(model), EncodeModel(next));
  for (const auto& [id, m] : msgs) tx.Put(MessageKey(id), EncodeMessage(m));
  auto r = tx.Commit();
  std::lock_guard lock(mu_);
  if (!r.ok()) {
    ++stats_.failed_commits;
    return r.status();
  }
  CountModel(slot->info.state, -1);
  CountModel(next.state, 1);
  slot->info = std::move(next);
  slot->timer_start_ns = now;
  ++stats_.evictions_by_reason[std::string(reason)];
  for (auto& [id, m] : msgs) {
    MessageRec& rec = messages_.at(id);
    CountMessage(rec.info.state, -1);
    CountMessage(m.state, 1);
    rec.info = std::move(m);
    rec.timer_start_ns = now;
    expired->push_back(id);
  }
  if (!msgs.empty()) stats_.expirations_by_reason[std::string(kModelEvicted)] += msgs.size();
  slot->live.clear();
  ++stats_.transactions;
  stats_.transitions += 1 + msgs.size();
  return true;
}

absl::Status Lifecycle::Enqueue(std::string_view msg_id, std::string_view model) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  if (auto st = ValidateId("model", model); !st.ok()) return st;
  // Checked under mu_, both before taking the model's tx_mu (to fail fast) and
  // after (the state may have changed while waiting).
  auto check = [&](Slot* slot) -> absl::Status {
    if (auto it = messages_.find(msg_id); it != messages_.end()) {
      return absl::AlreadyExistsError(MessageIs(msg_id, it->second.info.state) + " on model " +
                                      QuoteValue(it->second.info.model) +
                                      "; Enqueue needs a new msg_id");
    }
    if (enqueuing_.contains(msg_id)) {
      return absl::AlreadyExistsError("message " + QuoteValue(msg_id) +
                                      " is being enqueued by another call");
    }
    if (slot == nullptr || !slot->exists) return UnknownModel(model);
    if (slot->info.state == ModelState::kEvicted) {
      return absl::FailedPreconditionError(ModelIs(model, slot->info.state) +
                                           "; Enqueue needs it in warmup or inference");
    }
    return absl::OkStatus();
  };
  Slot* slot = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = slots_.find(model);
    if (it != slots_.end()) slot = it->second.get();
    if (auto st = check(slot); !st.ok()) return st;
  }
  std::lock_guard tx_lock(slot->tx_mu);
  MessageRec rec;
  {
    std::lock_guard lock(mu_);
    if (auto st = check(slot); !st.ok()) return st;
    enqueuing_.insert(std::string(msg_id));
    rec.info.state = MessageState::kPending;
    rec.info.model = std::string(model);
    rec.info.enqueued_ns = rec.info.since_ns = rec.timer_start_ns = Now();
  }
  auto tx = store_->Begin();
  tx.Put(MessageKey(msg_id), EncodeMessage(rec.info));
  auto r = tx.Commit();
  std::lock_guard lock(mu_);
  enqueuing_.erase(enqueuing_.find(msg_id));
  if (!r.ok()) {
    ++stats_.failed_commits;
    return r.status();
  }
  CountMessage(rec.info.state, 1);
  slot->live.insert(std::string(msg_id));
  messages_.emplace(std::string(msg_id), std::move(rec));
  ++stats_.transactions;
  ++stats_.transitions;
  return absl::OkStatus();
}

absl::Status Lifecycle::StartProcessing(std::string_view msg_id) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  return MessageTransition(msg_id, kStart, {}, false).status();
}

absl::Status Lifecycle::Requeue(std::string_view msg_id) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  return MessageTransition(msg_id, kRequeue, {}, false).status();
}

absl::Status Lifecycle::Complete(std::string_view msg_id) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  return MessageTransition(msg_id, kComplete, {}, false).status();
}

absl::Status Lifecycle::Expire(std::string_view msg_id, std::string_view reason) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  if (auto st = ValidateReason(reason); !st.ok()) return st;
  return MessageTransition(msg_id, kExpire, reason, false).status();
}

absl::Status Lifecycle::Forget(std::string_view msg_id) {
  if (auto st = ValidateId("msg_id", msg_id); !st.ok()) return st;
  return MessageTransition(msg_id, kForget, {}, false).status();
}

absl::StatusOr<bool> Lifecycle::MessageTransition(std::string_view msg_id, int op,
                                                  std::string_view reason, bool if_timed_out) {
  for (;;) {
    Slot* slot;
    {
      std::lock_guard lock(mu_);
      auto it = messages_.find(msg_id);
      if (it == messages_.end()) {
        if (if_timed_out) return false;
        return UnknownMessage(msg_id);
      }
      slot = slots_.at(it->second.info.model).get();
    }
    std::lock_guard tx_lock(slot->tx_mu);
    MessageInfo next;
    std::int64_t now;
    {
      std::lock_guard lock(mu_);
      auto it = messages_.find(msg_id);
      if (it == messages_.end()) {
        if (if_timed_out) return false;
        return UnknownMessage(msg_id);
      }
      const MessageRec& rec = it->second;
      // Forgotten and enqueued again on another model while we waited: that model's
      // mutex is the one to hold.
      if (slots_.at(rec.info.model).get() != slot) continue;
      const MessageState cur = rec.info.state;
      now = Now();
      if (if_timed_out) {
        if (cur != MessageState::kProcessing ||
            !TimedOut(now, rec.timer_start_ns, inference_timeout_ns_)) {
          return false;
        }
      }
      next = rec.info;
      next.since_ns = now;
      switch (op) {
        case kStart:
          if (cur != MessageState::kPending) {
            return absl::FailedPreconditionError(MessageIs(msg_id, cur) +
                                                 "; StartProcessing needs pending");
          }
          if (slot->info.state != ModelState::kInference) {
            return absl::FailedPreconditionError(
                ModelIs(rec.info.model, slot->info.state) + "; StartProcessing of message " +
                QuoteValue(msg_id) + " needs it in inference");
          }
          next.state = MessageState::kProcessing;
          break;
        case kRequeue:
          // Its model is in Inference (a Processing message's always is), which a
          // Pending message allows too.
          if (cur != MessageState::kProcessing) {
            return absl::FailedPreconditionError(MessageIs(msg_id, cur) +
                                                 "; Requeue needs processing");
          }
          next.state = MessageState::kPending;
          break;
        case kComplete:
          if (cur != MessageState::kProcessing) {
            return absl::FailedPreconditionError(MessageIs(msg_id, cur) +
                                                 "; Complete needs processing");
          }
          next.state = MessageState::kCompleted;
          break;
        case kExpire:
          if (!Live(cur)) {
            return absl::FailedPreconditionError(MessageIs(msg_id, cur) +
                                                 "; Expire needs pending or processing");
          }
          next.state = MessageState::kExpired;
          next.reason = std::string(reason);
          break;
        case kForget:
          if (Live(cur)) {
            return absl::FailedPreconditionError(MessageIs(msg_id, cur) +
                                                 "; Forget needs completed or expired");
          }
          break;
      }
    }
    auto tx = store_->Begin();
    if (op == kForget) {
      tx.Delete(MessageKey(msg_id));
    } else {
      tx.Put(MessageKey(msg_id), EncodeMessage(next));
    }
    auto r = tx.Commit();
    std::lock_guard lock(mu_);
    if (!r.ok()) {
      ++stats_.failed_commits;
      return r.status();
    }
    auto it = messages_.find(msg_id);
    MessageRec& rec = it->second;
    CountMessage(rec.info.state, -1);
    ++stats_.transactions;
    if (op == kForget) {
      messages_.erase(it);
      ++stats_.forgotten;
      return true;
    }
    CountMessage(next.state, 1);
    if (!Live(next.state)) slot->live.erase(slot->live.find(msg_id));
    if (next.state == MessageState::kExpired) ++stats_.expirations_by_reason[next.reason];
    rec.info = std::move(next);
    rec.timer_start_ns = now;
    ++stats_.transitions;
    return true;
  }
}

absl::StatusOr<TimeoutReport> Lifecycle::RunTimeouts() {
  std::vector<std::string> models, msgs;
  {
    std::lock_guard lock(mu_);
    const std::int64_t now = Now();
    for (const auto& [name, slot] : slots_) {
      if (slot->exists && slot->info.state == ModelState::kWarmup &&
          TimedOut(now, slot->timer_start_ns, warmup_timeout_ns_)) {
        models.push_back(name);
      }
    }
    for (const auto& [id, rec] : messages_) {
      if (rec.info.state == MessageState::kProcessing &&
          TimedOut(now, rec.timer_start_ns, inference_timeout_ns_)) {
        msgs.push_back(id);
      }
    }
  }
  std::sort(models.begin(), models.end());
  std::sort(msgs.begin(), msgs.end());
  TimeoutReport report;
  for (const std::string& m : models) {
    std::vector<std::string> expired;
    auto r = EvictImpl(m, "warmup timeout", /*if_timed_out=*/true, &expired);
    if (!r.ok()) return r.status();
    if (*r) {
      report.evicted_models.push_back(m);
      for (auto& id : expired) report.expired_messages.push_back(std::move(id));
    }
  }
  for (const std::string& id : msgs) {
    auto r = MessageTransition(id, kExpire, "inference timeout", /*if_timed_out=*/true);
    if (!r.ok()) return r.status();
    if (*r) report.expired_messages.push_back(id);
  }
  return report;
}

absl::StatusOr<ModelInfo> Lifecycle::GetModel(std::string_view model) const {
  std::lock_guard lock(mu_);
  auto it = slots_.find(model);
  if (it == slots_.end() || !it->second->exists) return UnknownModel(model);
  ModelInfo info = it->second->info;
  info.live_messages = it->second->live.size();
  return info;
}

absl::StatusOr<MessageInfo> Lifecycle::GetMessage(std::string_view msg_id) const {
  std::lock_guard lock(mu_);
  auto it = messages_.find(msg_id);
  if (it == messages_.end()) return UnknownMessage(msg_id);
  return it->second.info;
}

std::vector<std::pair<std::string, MessageInfo>> Lifecycle::Messages(
    std::string_view id_prefix) const {
  std::vector<std::pair<std::string, MessageInfo>> out;
  std::lock_guard lock(mu_);
  for (auto it = messages_.lower_bound(id_prefix);
       it != messages_.end() && std::string_view(it->first).substr(0, id_prefix.size()) == id_prefix;
       ++it) {
    out.emplace_back(it->first, it->second.info);
  }
  return out;
}

LifecycleStats Lifecycle::Stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

absl::Status Lifecycle::Verify() const {
  // Hold every existing model's mutex (in name order), so that none of their
  // transitions is between its Commit and its update of memory.
  std::vector<std::pair<std::string, Slot*>> slots;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, slot] : slots_) slots.emplace_back(name, slot.get());
  }
  std::sort(slots.begin(), slots.end());
  std::vector<std::unique_lock<std::mutex>> held;
  held.reserve(slots.size());
  for (auto& [name, slot] : slots) held.emplace_back(slot->tx_mu);
  std::map<std::string, std::string> expected;  // key -> value
  std::set<std::string, std::less<>> covered;               // model names checked
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, slot] : slots) {
      covered.insert(name);
      if (slot->exists) expected[ModelKey(name)] = EncodeModel(slot->info);
      for (const std::string& id : slot->live) {
        auto it = messages_.find(id);
        if (it == messages_.end() || it->second.info.model != name ||
            !Live(it->second.info.state)) {
          return absl::InternalError("model " + QuoteValue(name) + " lists message " +
                                     QuoteValue(id) + " as live, but it is not");
        }
      }
    }
    for (const auto& [id, rec] : messages_) {
      if (!covered.contains(rec.info.model)) continue;
      const Slot* slot = slots_.at(rec.info.model).get();
      if (Live(rec.info.state)) {
        if (!slot->exists || !Allowed(rec.info.state, slot->info.state)) {
          return absl::InternalError(
              MessageIs(id, rec.info.state) + " on " +
              (slot->exists ? ModelIs(rec.info.model, slot->info.state)
                            : "model " + QuoteValue(rec.info.model) + " with no record"));
        }
        if (!slot->live.contains(id)) {
          return absl::InternalError(MessageIs(id, rec.info.state) + " but model " +
                                     QuoteValue(rec.info.model) + " does not list it");
        }
      }
      expected[MessageKey(id)] = EncodeMessage(rec.info);
    }
  }
  // The store, for the same models (a message record names its model in its value).
  const std::string scan = options_.key_prefix + ".";
  const std::string model_prefix = scan + "model.";
  const std::string msg_prefix = scan + "msg.";
  std::vector<std::pair<std::string, std::string>> stored;
  store_->Scan(scan, [&](std::string_view k, std::string_view v) {
    stored.emplace_back(std::string(k), std::string(v));
  });
  std::size_t matched = 0;
  for (const auto& [k, v] : stored) {
    std::string_view key = k;
    std::string model;
    if (key.rfind(model_prefix, 0) == 0) {
      model = std::string(key.substr(model_prefix.size()));
    } else if (key.rfind(msg_prefix, 0) == 0) {
      MessageInfo m;
      if (auto st = DecodeMessage(key, v, &m); !st.ok()) return absl::InternalError(st.message());
      model = m.model;
    } else {
      return absl::InternalError("store key " + QuoteValue(key) + " is not a lifecycle record");
    }
    if (!covered.contains(model)) continue;
    auto it = expected.find(k);
    if (it == expected.end()) {
      return absl::InternalError("store has " + QuoteValue(key) + " = " + QuoteValue(v) +
                                 ", memory has no such record");
    }
    if (it->second != v) {
      return absl::InternalError("store has " + QuoteValue(key) + " = " + QuoteValue(v) +
                                 ", memory has " + QuoteValue(it->second));
    }
    ++matched;
  }
  if (matched != expected.size()) {
    for (const auto& entry : expected) {  // not a structured binding: clang 14 cannot capture one
      const auto& key = entry.first;
      const bool found = std::any_of(stored.begin(), stored.end(),
                                     [&](const auto& kv) { return kv.first == key; });
      if (!found) {
        return absl::InternalError("memory has " + QuoteValue(key) + " = " +
                                   QuoteValue(entry.second) + ", the store has no such key");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace inferq
