// File: src/engine/settle.cpp
//
// Settlement: Message (Ack, Nak, Term, InProgress and the one Settle they share),
// and SettleWithoutAck for a message done for a consumer without an ack.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq {
namespace engine_internal {

// Message `h` is done for consumer `c` (acked, or given up: dead-lettered, dropped by
// drop-oldest): under interest and work-queue retention the stream stops waiting for
// this consumer, and removes the message when no other one is waited for. A file
// work queue records the removal in its removed log (StreamState::AckOut): the tx of
// that record, or 0 when there is none; its error when it cannot.
absl::StatusOr<std::uint64_t> RetireOnSettle(ConsumerState& c, StoredMessage& h) {
  StreamState* stream = h.stream;
  const RetentionPolicy retention = stream->config.retention;
  if (c.config.ack != AckPolicy::kExplicit || retention == RetentionPolicy::kLimits) return 0;
  if (stream->removed_log != nullptr) return stream->AckOut(h.seq);
  if (h.pending_acks.fetch_sub(1, std::memory_order_acq_rel) == 1) stream->Retire(h, kDone);
  return 0;
}

// The AckBatch running on this thread (nullptr: none). A settle defers to it only
// an ack of a delivery of its consumer member (AckRun::consumer, member).
thread_local AckRun* t_ack_run = nullptr;

void SettleWithoutAck(ConsumerState& c, StoredMessage& h) {
  // A failed removed log leaves the message in the work queue (it was dead-lettered or
  // dropped); the log's failure fails later acks too, which report it.
  (void)RetireOnSettle(c, h);
}

}  // namespace engine_internal

// ---------------------------------------------------------------------------------
// Message

Message::Message() noexcept = default;
Message::Message(Message&& o) noexcept
    : msg_(std::move(o.msg_)),
      consumer_(o.consumer_),
      deliver_ns_(o.deliver_ns_),
      member_(o.member_),
      attempt_(o.attempt_),
      prior_(o.prior_),
      ack_tx_(o.ack_tx_),
      out_tx_(o.out_tx_),
      shadow_(o.shadow_),
      cursor_done_owed_(std::exchange(o.cursor_done_owed_, false)),
      cursor_pin_(std::exchange(o.cursor_pin_, nullptr)),
      cursor_entry_(std::exchange(o.cursor_entry_, nullptr)),
      span_id_(o.span_id_),
      batch_(o.batch_),
      acked_(o.acked_.load(std::memory_order_relaxed)) {}
Message& Message::operator=(Message&& o) noexcept {
  if (this == &o) return *this;
  Release();
  msg_ = std::move(o.msg_);
  consumer_ = o.consumer_;
  deliver_ns_ = o.deliver_ns_;
  member_ = o.member_;
  attempt_ = o.attempt_;
  prior_ = o.prior_;
  ack_tx_ = o.ack_tx_;
  out_tx_ = o.out_tx_;
  shadow_ = o.shadow_;
  cursor_done_owed_ = std::exchange(o.cursor_done_owed_, false);
  cursor_pin_ = std::exchange(o.cursor_pin_, nullptr);
  cursor_entry_ = std::exchange(o.cursor_entry_, nullptr);
  span_id_ = o.span_id_;
  batch_ = o.batch_;
  acked_.store(o.acked_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return *this;
}
Message::~Message() { Release(); }

void Message::Release() noexcept {
  if (msg_ == nullptr) return;
  // Dropped unsettled. (relaxed: settling a Message while another thread destroys it
  // is a data race by contract, so only this thread's or a handed-over settle is here.)
  // (Out of line: Release's common path, a settled Message, stays small enough to inline.)
  auto unsettled = [this]() __attribute__((noinline, cold)) {
    ConsumerState& c = *consumer_;
    if ((!c.tracked || cursor_entry_ != nullptr) && c.deleted.load(std::memory_order_acquire)) {
      // A deleted untracked consumer's delivery lets go of the stream (DeleteConsumer
      // left it to the member; found by the adversarial helper). (A cursor consumer's,
      // tracked or not, lets go of its log entry so too: DeleteConsumer's sweep leaves
      // deliveries out with members to them.)
      if (!acked_.exchange(true, std::memory_order_acq_rel)) {
        if (cursor_entry_ != nullptr) {
          engine_internal::CursorLetGo(c, *cursor_entry_, msg_->seq);
        } else {
          engine_internal::ReleaseInterest(c, *msg_);
        }
      }
    } else if (cursor_entry_ != nullptr && !c.tracked) {
      // An untracked cursor consumer's delivery never comes again: its message stays
      // in the stream (as a lane consumer's does), but the cursor is done with it, so
      // that no overflow map holds it and no log segment is kept for it (found by the
      // adversarial review: one segment, 600 KB, per delivery dropped so).
      acked_.store(true, std::memory_order_relaxed);
      if (c.cursor->cursor.Drop(msg_->seq)) {
        if (cursor_entry_->in_place && cursor_pin_ != nullptr) {
          cursor_done_owed_ = true;  // with the Message's own count, below
        } else {
          engine_internal::CursorDone(*cursor_entry_);
        }
      }
    }
  };
  if (consumer_ != nullptr && !shadow_ && !acked_.load(std::memory_order_relaxed)) [[unlikely]] unsettled();
  if (cursor_pin_ != nullptr) {
    // (msg_ owns nothing for an entry that holds its record, and is not read after.)
    engine_internal::CursorUnpin(*consumer_, *cursor_entry_, cursor_pin_, cursor_done_owed_);
    cursor_done_owed_ = false;
    cursor_pin_ = nullptr;
    cursor_entry_ = nullptr;
  }
#ifndef NDEBUG
  consumer_->live_messages.fetch_sub(1, std::memory_order_relaxed);
#endif
  msg_.reset();
}

const Event& Message::event() const {
  const Event& e = *msg_->event;
  if (consumer_ == nullptr || consumer_->Accepts(e.codec)) return e;
  // Converted at publish; null only for an empty payload (never converted).
  const std::shared_ptr<const Event>& converted =
      msg_->converted[static_cast<std::size_t>(consumer_->convert_to)];
  return converted != nullptr ? *converted : e;
}
TraceContext Message::trace() const {
  TraceContext t = msg_->event->trace;
  if (!engine_internal::IsZero(span_id_)) t.span_id = span_id_;
  return t;
}
std::uint64_t Message::stream_seq() const { return msg_ ? msg_->seq : 0; }
std::int64_t Message::publish_time_ns() const { return msg_ ? msg_->publish_ns : 0; }

absl::Status Message::Deleted(std::string_view verb) const {
  return absl::FailedPreconditionError("cannot " + std::string(verb) + " message " +
                                       std::to_string(msg_->seq) + ": consumer '" +
                                       consumer_->config.name + "' of stream '" +
                                       consumer_->config.stream + "' was deleted");
}

absl::Status Message::Ack() {
  absl::Status st = Settle(Settlement::kAck, 0, {});
  // A memory stream's message can come again only in this process, whose pending
  // entry stops that: its lifecycle record is done with. (A file stream's waits for
  // a durable ack: AckSync, or the next AddConsumer.)
  if (st.ok() && consumer_->config.lifecycle != nullptr && msg_->stream->log == nullptr) {
    ForgetLifecycleRecord();
  }
  return st;
}

void Message::ForgetLifecycleRecord() {
  Lifecycle* lc = consumer_->config.lifecycle;
  if (lc == nullptr || shadow_) return;
  // Best effort: a failed commit leaves the record for the next AddConsumer.
  (void)lc->Forget(engine_internal::LifecycleId(*consumer_, msg_->seq));
}

absl::Status AckBatch(std::span<Message> messages) {
  engine_internal::AckRun run;
  struct Scope {  // flushes and restores also when a lifecycle's callback throws
    engine_internal::AckRun* run;
    engine_internal::AckRun* outer;
    ~Scope() {
      run->Flush();
      engine_internal::t_ack_run = outer;
    }
  } scope{&run, std::exchange(engine_internal::t_ack_run, &run)};
  absl::Status first;
  std::size_t first_at = 0;
  std::size_t failed = 0;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    Message& m = messages[i];
    if (m.consumer_ != nullptr && m.msg_ != nullptr &&
        (run.consumer != m.consumer_ || run.member != m.member_)) {
      run.Flush();
      run.consumer = m.consumer_;
      run.member = m.member_;
      run.now = m.consumer_->clock->NowNanos();
    }
    absl::Status st = m.Ack();
    if (st.ok()) continue;
    if (failed++ == 0) {
      first = std::move(st);
      first_at = i;
    }
  }
  if (failed == 0) return absl::OkStatus();
  return absl::Status(first.code(), std::string(first.message()) + " (message " +
                                        std::to_string(first_at) + " of the batch; " +
                                        std::to_string(failed) + " of its " +
                                        std::to_string(messages.size()) + " acks failed)");
}

absl::Status Message::AckSync() {
  engine_internal::Tracer* tracer = msg_ != nullptr ? consumer_->tracer : nullptr;
  const std::int64_t start = tracer != nullptr ? tracer->NowNanos() : 0;
  const bool sampled = !engine_internal::IsZero(span_id_);
  absl::Status st = Settle(Settlement::kAck, 0, {}, /*through_lifecycle=*/true);
  const bool settled = st.ok();
  if (settled) st = SyncAck();
  if (st.ok()) ForgetLifecycleRecord();  // the ack is durable
  // The ack span ends after the sync, and carries its error (found by the adversarial
  // review: it was reported OK before the sync failed).
  if (tracer != nullptr) [[unlikely]] TraceSettle(*tracer, Settlement::kAck, start, sampled, settled, st, {});
  return st;
}

absl::Status Message::SyncAck() {
  if (ack_tx_ != 0) {
    if (absl::Status st = consumer_->ack_log->Sync(ack_tx_); !st.ok()) {
      consumer_->FailAckLog(st);
      return absl::Status(st.code(), "ack of message " + std::to_string(msg_->seq) +
                                         " by consumer '" + consumer_->config.name +
                                         "' is not durable: " + std::string(st.message()));
    }
  }
  if (out_tx_ != 0) {  // a file work queue's removal of the message
    if (absl::Status st = msg_->stream->removed_log->Sync(out_tx_); !st.ok()) {
      return absl::Status(st.code(), "ack of message " + std::to_string(msg_->seq) +
                                         " by consumer '" + consumer_->config.name +
                                         "' is durable, but its removal from the work queue "
                                         "is not: " + std::string(st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Message::Nak(absl::Duration delay) {
  if (delay < absl::ZeroDuration() || delay > kMaxDuration) {
    return absl::InvalidArgumentError("Nak delay " + absl::FormatDuration(delay) +
                                      " is invalid (zero for at once, or up to 365 days)");
  }
  return Settle(Settlement::kNak, absl::ToInt64Nanoseconds(delay), {});
}

absl::Status Message::Term(std::string_view description) {
  return Settle(Settlement::kTerm, 0, description);
}

absl::Status Message::InProgress() {
  if (msg_ == nullptr) return absl::FailedPreconditionError("cannot mark an empty Message in progress");
  ConsumerState& c = *consumer_;
  if (c.deleted.load(std::memory_order_acquire)) return Deleted("mark in progress");
  if (c.config.ack == AckPolicy::kNone) {
    return absl::FailedPreconditionError("consumer '" + c.config.name + "' of stream '" +
                                         c.config.stream + "' has ack policy none");
  }
  if (acked_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) + " of stream '" +
                                         c.config.stream + "' was already settled by consumer '" +
                                         c.config.name + "'");
  }
  if (c.cursor != nullptr) {  // a no-op unless this delivery is out and the newest
    (void)c.cursor->cursor.InProgress(msg_->seq, attempt_, c.clock->NowNanos());
    return absl::OkStatus();
  }
  if (!c.tracked || shadow_) return absl::OkStatus();
  const std::int64_t deadline =
      engine_internal::SatAdd(c.clock->NowNanos(), c.AckWaitFor(attempt_));
  std::lock_guard lock(c.pending_mu);
  auto it = c.pending.find(msg_->seq);
  if (it == c.pending.end() || it->second.attempt != attempt_) return absl::OkStatus();  // already redelivered
  if (it->second.deadline_ns == deadline) return absl::OkStatus();  // that timer is set already
  c.ExtendAckWait(msg_->seq, it->second, deadline);
  return absl::OkStatus();
}

absl::Status Message::Settle(Settlement how, std::int64_t delay_ns, std::string_view description) {
  engine_internal::Tracer* tracer = msg_ != nullptr ? consumer_->tracer : nullptr;
  if (tracer == nullptr) [[likely]] return Settle(how, delay_ns, description, /*through_lifecycle=*/true);
  const std::int64_t start = tracer->NowNanos();
  const bool sampled = !engine_internal::IsZero(span_id_);
  absl::Status st = Settle(how, delay_ns, description, /*through_lifecycle=*/true);
  TraceSettle(*tracer, how, start, sampled, st.ok(), st, description);
  return st;
}

void Message::TraceSettle(engine_internal::Tracer& tracer, Settlement how, std::int64_t start, bool sampled,
                          bool settled, const absl::Status& st, std::string_view description) {
  if (!sampled && st.ok()) return;  // errors are recorded whether sampled or not
  const ConsumerState& c = *consumer_;
  const Event& ev = *msg_->event;
  const std::int64_t end = tracer.NowNanos();
  auto base = [&](SpanStage stage) {
    Span s;
    s.stage = stage;
    s.context = ev.trace;
    s.destination = engine_internal::SpanText(ev.subject);
    s.stream = c.config.stream;
    s.consumer = c.config.name;
    s.member = member_;
    s.stream_seq = msg_->seq;
    s.delivery_count = attempt();
    s.message_id = engine_internal::SpanText(ev.msg_id);
    s.body_size = ev.payload.size();
    return s;
  };
  const SpanStage stage = how == Settlement::kAck   ? SpanStage::kAck
                          : how == Settlement::kNak ? SpanStage::kNak
                                                    : SpanStage::kTerm;
  if (sampled && settled) {  // a settle that failed may be tried again: one deliver span
    Span d = base(SpanStage::kDeliver);
    d.context.span_id = span_id_;
    d.parent_span_id = ev.trace.span_id;
    d.batch_message_count = batch_;
    if (how != Settlement::kAck) d.error_type = std::string(StageName(stage));
    tracer.Emit(std::move(d), deliver_ns_, start);
  }
  Span settle = base(stage);
  settle.context.span_id = tracer.NewSpanId();
  settle.parent_span_id = sampled ? span_id_ : ev.trace.span_id;
  if (!st.ok()) {
    settle.error_type = absl::StatusCodeToString(st.code());
    settle.error_message = engine_internal::StatusText(st);
  } else if (how == Settlement::kTerm) {
    settle.error_message = engine_internal::SpanText(description);
  }
  tracer.Emit(std::move(settle), start, end);
}

absl::Status Message::Settle(Settlement how, std::int64_t delay_ns, std::string_view description,
                             bool through_lifecycle) {
  const char* verb = how == Settlement::kAck ? "ack" : how == Settlement::kNak ? "nak" : "term";
  if (msg_ == nullptr) {
    return absl::FailedPreconditionError(std::string("cannot ") + verb + " an empty Message");
  }
  ConsumerState& c = *consumer_;
  const ConsumerConfig& cfg = c.config;
  if (c.deleted.load(std::memory_order_acquire)) {
    // DeleteConsumer let go of a tracked consumer's deliveries; an untracked one's
    // let go here, once.
    if (!acked_.exchange(true, std::memory_order_acq_rel) && (!c.tracked || cursor_entry_ != nullptr) &&
        !shadow_) {
      if (cursor_entry_ != nullptr) {
        engine_internal::CursorLetGo(c, *cursor_entry_, msg_->seq);
      } else {
        engine_internal::ReleaseInterest(c, *msg_);
      }
    }
    return Deleted(verb);
  }
  if (cfg.ack == AckPolicy::kNone) {
    return absl::FailedPreconditionError("consumer '" + cfg.name + "' of stream '" +
                                         cfg.stream + "' has ack policy none");
  }
  if (how != Settlement::kAck && shadow_) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) +
                                         " is a shadow copy for consumer '" + cfg.name +
                                         "'; shadow copies are acked, not " + verb + "'ed");
  }
  // One settle wins, whichever threads race (acq_rel: the winner's effects on the
  // message are ordered after any earlier settle attempt's reads).
  if (acked_.exchange(true, std::memory_order_acq_rel)) {
    return absl::FailedPreconditionError("message " + std::to_string(msg_->seq) +
                                         " of stream '" + cfg.stream +
                                         "' was already settled (ack, nak or term) by consumer '" +
                                         cfg.name + "'");
  }
  if (through_lifecycle && cfg.lifecycle != nullptr && !shadow_) {
    // The lifecycle's transition first (a crash after it delivers the message again,
    // and the delivery step settles it as the lifecycle says).
    Lifecycle& lc = *cfg.lifecycle;
    const std::string id = engine_internal::LifecycleId(c, msg_->seq);
    if (how == Settlement::kAck) {
      if (absl::Status st = lc.Complete(id); !st.ok()) {
        absl::StatusOr<MessageInfo> info = lc.GetMessage(id);
        if (info.ok() && info->state == MessageState::kExpired) {
          acked_.store(false, std::memory_order_release);
          const std::string why = "lifecycle: expired (" + info->reason + ")";
          (void)Settle(Settlement::kTerm, 0, why, /*through_lifecycle=*/false);
          return absl::FailedPreconditionError(
              "ack of message " + std::to_string(msg_->seq) + " by consumer '" + cfg.name +
              "': the message expired in its lifecycle (" + info->reason +
              "), so it was terminated, not acked");
        }
        // NotFound: Completed and retired (ForgetLifecycleRecord) by the ack of
        // another delivery of it: this one's ack goes on, as a late ack.
        const bool retired = !info.ok() && info.status().code() == absl::StatusCode::kNotFound;
        if (!retired && (!info.ok() || info->state != MessageState::kCompleted)) {
          acked_.store(false, std::memory_order_release);  // not settled: may be tried again
          return absl::Status(st.code(), "ack of message " + std::to_string(msg_->seq) +
                                             " by consumer '" + cfg.name +
                                             "' not made: its lifecycle's Complete failed: " +
                                             std::string(st.message()));
        }
        // Completed already (a delivery of it acked before): the ack goes on.
      }
    } else if (how == Settlement::kNak && !c.LastAttempt(attempt_ + prior_)) {
      // Best effort: left Processing, its next delivery goes on Processing.
      (void)lc.Requeue(id);
    }
    // Term, and a nak of the last delivery: the dead letter expires it (DeadLetter).
  }
  // Durable consumer: the ack (or term) is in its ack log, written to the OS,
  // before anything changes; a failed write leaves the delivery unsettled. A tracked
  // consumer's term is recorded below, under pending_mu, once it is known to be of
  // the delivery that decides: a term of one a newer delivery superseded changes
  // nothing, and recorded it would end the message at the next restart while the
  // newer delivery is out (found by the adversarial review).
  auto record = [&]() -> absl::Status {
    absl::StatusOr<std::uint64_t> tx = c.Record("A " + std::to_string(msg_->seq));
    if (!tx.ok()) {
      acked_.store(false, std::memory_order_release);
      return absl::Status(tx.status().code(), std::string(verb) + " of message " +
                                                  std::to_string(msg_->seq) + " by consumer '" +
                                                  cfg.name + "' not recorded: " +
                                                  std::string(tx.status().message()));
    }
    ack_tx_ = *tx;
    return absl::OkStatus();
  };
  const bool durable = c.ack_log != nullptr && !shadow_ && how != Settlement::kNak;
  const bool record_under_pending = c.tracked && how == Settlement::kTerm;
  if (durable && !record_under_pending) {
    if (absl::Status st = record(); !st.ok()) return st;
  }
  // An ack inside an AckBatch of this consumer member leaves the shared parts to
  // its run (engine_internal::AckRun).
  engine_internal::AckRun* run = engine_internal::t_ack_run;
  if (run != nullptr && (how != Settlement::kAck || shadow_ || run->consumer != &c ||
                         run->member != member_)) {
    run = nullptr;
  }
  const std::int64_t now = run != nullptr ? run->now : c.clock->NowNanos();
  const std::int64_t latency = std::max<std::int64_t>(0, engine_internal::SatSub(now, deliver_ns_));
  if (shadow_) {
    c.group->OnDone(member_, Outcome::kSuccess, latency, now);
    c.counts.shadow_acked.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  if (how == Settlement::kNak) c.counts.naks.fetch_add(1, std::memory_order_relaxed);
  if (how == Settlement::kTerm) c.counts.terminated.fetch_add(1, std::memory_order_relaxed);
  if (c.cursor != nullptr) return SettleCursor(how, delay_ns, description, now, latency, run);
  if (c.tracked) {
    std::unique_lock lock(c.pending_mu);
    auto it = c.pending.find(msg_->seq);
    if (it == c.pending.end()) {
      // Settled by another delivery of the same message: the first ack won, and
      // this delivery's work was already accounted for when it timed out.
      c.counts.late_acks.fetch_add(how == Settlement::kAck ? 1 : 0, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (it->second.attempt != attempt_) {
      // An older delivery that timed out answers while a newer one is queued or
      // out: the first ack wins. A queued copy is skipped when pulled; one that is
      // out is dropped from its member's load and its later ack is a no-op. A nak or
      // term of the old delivery changes nothing: the newer one decides.
      if (how != Settlement::kAck) return absl::OkStatus();
      if (it->second.member != kNoMember) {
        c.group->OnDone(it->second.member, Outcome::kDropped, 0);
        c.Unsettle();
      }
      c.wheel->Cancel(it->second.timer);  // the newer delivery's ack wait or redelivery
      c.pending.erase(it);
      c.ForgetPrior(msg_->seq);
    } else {
      if (durable && record_under_pending) {
        if (absl::Status st = record(); !st.ok()) return st;
      }
      if (run != nullptr) {
        ++run->unsettled;
      } else {
        c.Unsettle();
      }
      c.wheel->Cancel(it->second.timer);  // this delivery's ack wait
      it->second.timer = TimerId{};
      if (how != Settlement::kAck) {
        if (how == Settlement::kTerm || c.LastAttempt(attempt_ + prior_)) {
          c.pending.erase(it);
          c.ForgetPrior(msg_->seq);
          lock.unlock();
          c.group->OnDone(member_, how == Settlement::kTerm ? Outcome::kDropped : Outcome::kFailure,
                          latency);
          engine_internal::DeadLetter(c, msg_, attempt_ + prior_,
                                      how == Settlement::kTerm ? "term" : "max_deliver",
                                      how == Settlement::kTerm ? description : "nak", span_id_);
          return absl::OkStatus();
        }
        // Queued again for the next attempt; an ack of this delivery still wins.
        it->second.member = kNoMember;
        it->second.attempt = attempt_ + 1;
        it->second.deadline_ns = INT64_MAX;
        if (delay_ns > 0) {
          const std::int64_t due = engine_internal::SatAdd(now, delay_ns);
          it->second.timer = c.Schedule(
              due, {engine_internal::ConsumerTimer::kRedeliver, attempt_ + 1, msg_->seq, msg_});
          lock.unlock();
          c.group->OnDone(member_, Outcome::kFailure, latency, now);
          c.host->WakeTimer(due);
          return absl::OkStatus();
        }
        lock.unlock();
        c.group->OnDone(member_, Outcome::kFailure, latency, now);
        engine_internal::Redeliver(c, {msg_, attempt_ + 1, false}, member_);
        return absl::OkStatus();
      }
      c.pending.erase(it);
      c.ForgetPrior(msg_->seq);
      if (run != nullptr) {
        run->latencies.push_back(latency);
      } else {
        c.group->OnDone(member_, Outcome::kSuccess, latency, now);
      }
    }
  } else {
    if (run != nullptr) {
      ++run->unsettled;
    } else {
      c.Unsettle();
    }
    if (attempt_ + prior_ > 1) c.redelivered_out.fetch_sub(1, std::memory_order_relaxed);
    auto forget_prior = [&] {
      if (!c.has_prior.load(std::memory_order_acquire)) return;
      std::lock_guard lock(c.pending_mu);
      c.ForgetPrior(msg_->seq);
    };
    if (how != Settlement::kAck) {
      c.group->OnDone(member_, how == Settlement::kTerm ? Outcome::kDropped : Outcome::kFailure,
                      latency);
      if (how == Settlement::kTerm || c.LastAttempt(attempt_ + prior_)) {
        forget_prior();
        engine_internal::DeadLetter(c, msg_, attempt_ + prior_,
                                    how == Settlement::kTerm ? "term" : "max_deliver",
                                    how == Settlement::kTerm ? description : "nak", span_id_);
        return absl::OkStatus();
      }
      if (delay_ns > 0) {
        const std::int64_t due = engine_internal::SatAdd(now, delay_ns);
        bool retired;
        {
          std::lock_guard lock(c.pending_mu);
          retired = c.retired;
          if (!retired) {
            (void)c.Schedule(due, {engine_internal::ConsumerTimer::kRedeliver, attempt_ + 1,
                                   msg_->seq, msg_});
          }
        }
        if (retired) {  // deleted meanwhile: no timer run would take it
          engine_internal::ReleaseInterest(c, *msg_);
          return absl::OkStatus();
        }
        c.host->WakeTimer(due);
        return absl::OkStatus();
      }
      engine_internal::Redeliver(c, {msg_, attempt_ + 1, false}, member_);
      return absl::OkStatus();
    }
    forget_prior();
    if (run != nullptr) {
      run->latencies.push_back(latency);
    } else {
      c.group->OnDone(member_, Outcome::kSuccess, latency, now);
    }
  }
  if (run != nullptr) {  // and the acked count
    run->recorded.push_back(static_cast<std::uint64_t>(latency));
  } else {
    c.ack_latency_ns.Record(static_cast<std::uint64_t>(latency));
  }
  if (c.config.batch.adaptive) c.batchers[member_]->ObserveRtt(latency);
  absl::StatusOr<std::uint64_t> out = engine_internal::RetireOnSettle(c, *msg_);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        "ack of message " + std::to_string(msg_->seq) + " by consumer '" +
                            cfg.name + "' recorded, but its removal from the work queue was "
                            "not (it stays in the stream): " +
                            std::string(out.status().message()));
  }
  out_tx_ = *out;
  return absl::OkStatus();
}

}  // namespace inferq
