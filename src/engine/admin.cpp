// File: src/engine/admin.cpp
//
// Changes to a stream after it was added (engine/engine.hpp): UpdateStream (its
// limits) and PurgeStream (removing messages by subject, sequence or count), both
// under the stream's mutex, never under config_mu (which Close needs to wake a
// publisher blocked on a full lane, while that publisher holds the stream's mutex);
// the removal itself is StreamState's (stream_store.cpp). And DeleteConsumer and
// DeleteStream, which unlist under config_mu, close the consumers' lanes, and only
// then take the stream's mutex.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq {

namespace {

// The first field other than the limits in which `next` differs from `now` (empty:
// none).
std::string ChangedFixedField(const StreamConfig& now, const StreamConfig& next) {
  if (now.subjects != next.subjects) return "subjects";
  if (now.retention != next.retention) return "retention";
  if (now.duplicate_window != next.duplicate_window) return "duplicate_window";
  if (now.duplicate_window_max_entries != next.duplicate_window_max_entries) {
    return "duplicate_window_max_entries";
  }
  if (now.storage != next.storage) return "storage";
  if (now.directory != next.directory) return "directory";
  if (now.sync != next.sync) return "sync";
  if (now.sync_window != next.sync_window) return "sync_window";
  if (now.segment_bytes != next.segment_bytes) return "segment_bytes";
  if (now.file_system != next.file_system) return "file_system";
  return {};
}

}  // namespace

absl::Status Engine::UpdateStream(const StreamConfig& config) {
  if (absl::Status s = StreamConfig::Validate(config); !s.ok()) return s;
  StreamState* s;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    s = impl_->FindStream(config.name);
  }
  if (s == nullptr) {
    return absl::NotFoundError("stream " + QuoteValue(config.name) + " does not exist");
  }
  // Fixed after AddStream: read without the stream's mutex.
  if (std::string field = ChangedFixedField(s->config, config); !field.empty()) {
    return absl::InvalidArgumentError(
        "stream '" + config.name + "': " + field +
        " cannot be changed by UpdateStream (only max_msgs, max_bytes, max_age, "
        "max_msg_size, max_msgs_per_subject and discard can)");
  }
  if (StreamState::KeepsIndex(config) != s->keeps_index) {
    return absl::FailedPreconditionError(
        "stream '" + config.name + "': under interest retention this update would make the "
        "stream " + (s->keeps_index ? "stop" : "start") +
        " keeping an index of its messages (max_age, a discard-old max_msgs or max_bytes, "
        "max_msgs_per_subject), which an existing stream cannot change");
  }
  {
    std::lock_guard lock(s->mu);
    if (s->deleted) return absl::NotFoundError("stream '" + config.name + "' was deleted");
    s->DrainRemoved();
    if (s->is_file() && (config.max_msgs_per_subject > 0 || config.max_msgs > 0 ||
                         config.max_bytes > 0 || config.max_age > absl::ZeroDuration())) {
      // Its removals and front trims are recorded from now on (a restart must not
      // bring them back).
      if (absl::Status st = s->OpenRemovedLog(/*force=*/true); !st.ok()) return st;
    }
    const bool rebuild = config.max_msgs_per_subject > 0 &&
                         config.max_msgs_per_subject != s->config.max_msgs_per_subject;
    std::vector<std::pair<std::string, std::uint64_t>> held;
    if (rebuild) {
      absl::StatusOr<std::vector<std::pair<std::string, std::uint64_t>>> read = s->HeldSubjects();
      if (!read.ok()) return read.status();
      held = *std::move(read);
    }
    StreamConfig& cfg = s->config;
    cfg.max_msgs = config.max_msgs;
    cfg.max_bytes = config.max_bytes;
    cfg.max_age = config.max_age;
    cfg.max_msg_size = config.max_msg_size;
    cfg.discard = config.discard;
    const bool subjects_kept = cfg.max_msgs_per_subject == config.max_msgs_per_subject;
    cfg.max_msgs_per_subject = config.max_msgs_per_subject;
    s->max_age_ns.store(absl::ToInt64Nanoseconds(config.max_age), std::memory_order_relaxed);
    s->ApplyLimits(impl_->clock->NowNanos(), subjects_kept ? nullptr : &held);
  }
  if (config.max_age > absl::ZeroDuration()) {
    std::lock_guard lock(impl_->config_mu);
    // As AddStream: the timer runs at least every max_age / 8, within 1 ms .. 1 s.
    impl_->RunTimersEvery(std::clamp<std::int64_t>(absl::ToInt64Nanoseconds(config.max_age) / 8,
                                                   1'000'000, 1'000'000'000));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> Engine::PurgeStream(std::string_view stream,
                                                  const PurgeRequest& request) {
  engine_internal::Purge p;
  if (!request.subject.empty()) {
    absl::StatusOr<SubjectPattern> filter = SubjectPattern::Parse(request.subject);
    if (!filter.ok()) {
      return absl::InvalidArgumentError("purge of stream " + QuoteValue(stream) + ": subject " +
                                        std::string(filter.status().message()));
    }
    p.filter = *std::move(filter);
  }
  if (request.sequence != 0 && request.keep != 0) {
    return absl::InvalidArgumentError(
        "purge of stream " + QuoteValue(stream) + ": sequence " +
        std::to_string(request.sequence) + " and keep " + std::to_string(request.keep) +
        " cannot be used together");
  }
  p.sequence = request.sequence;
  p.keep = request.keep;
  StreamState* s;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    s = impl_->FindStream(stream);
  }
  if (s == nullptr) return absl::NotFoundError("stream " + QuoteValue(stream) + " does not exist");
  if (!s->keeps_index) {
    return absl::FailedPreconditionError(
        "stream '" + s->config.name + "' keeps no index of its messages (interest retention "
        "without max_age, a discard-old limit or max_msgs_per_subject), so none can be "
        "purged");
  }
  std::lock_guard lock(s->mu);
  if (s->deleted) return absl::NotFoundError("stream '" + s->config.name + "' was deleted");
  s->DrainRemoved(&p.removed_tx);  // the acks so far count before the purge, at recovery too
  p.last_seq = s->next_seq - 1;
  absl::StatusOr<std::vector<std::uint64_t>> victims = s->PurgeVictims(
      p, [&](std::size_t i, std::uint64_t) -> absl::StatusOr<std::string> {
        if (s->log != nullptr) return s->SubjectFromLog(s->index.at(i));
        return s->messages.at(i)->event->subject;
      });
  if (!victims.ok()) return victims.status();
  if (victims->empty()) return 0;
  absl::Status not_durable;
  if (s->log != nullptr) {
    // The purges the log's records are still subject to, then this one: an older
    // purge whose messages have all left the log is dropped (the newest is kept for
    // the sequence it carries, which the log may no longer hold).
    const std::uint64_t first_tx = s->log->Stats().first_tx;
    std::vector<engine_internal::Purge> next;
    for (const engine_internal::Purge& old : s->purges) {
      if (first_tx != 0 && old.last_seq >= first_tx) next.push_back(old);
    }
    next.push_back(p);
    // The log first, as far as its sync policy promises: the purges file must not
    // name records a power cut could take from the log (recovery clamps what it
    // names to the log's last record for the policies that promise nothing).
    if (absl::Status st = s->log->Sync(p.last_seq); !st.ok()) {
      return absl::Status(st.code(), "stream '" + s->config.name +
                                         "': syncing its log before a purge: " +
                                         std::string(st.message()));
    }
    // And the removed log up to removed_tx: a keep-N purge replayed over acks a power
    // cut took would count them as held and remove messages that are still unacked.
    if (s->removed_log != nullptr && p.removed_tx != 0) {
      if (absl::Status st = s->removed_log->Sync(p.removed_tx); !st.ok()) {
        return absl::Status(st.code(), "stream '" + s->config.name +
                                           "': syncing its removed log before a purge: " +
                                           std::string(st.message()));
      }
    }
    bool renamed = false;
    not_durable = s->WritePurges(next, &renamed);
    // Not written: nothing changes. Written but its directory not synced: a restart
    // applies it, so this process does too, and says it may not survive a power loss.
    if (!renamed) return not_durable;
    s->purges = std::move(next);
  }
  for (std::uint64_t seq : *victims) s->RemoveSeq(seq, engine_internal::Removal::kPurge);
  s->AfterRemovals();
  if (s->log != nullptr) s->RetireLog();
  if (!not_durable.ok()) {
    return absl::Status(not_durable.code(),
                        "purged " + std::to_string(victims->size()) +
                            " message(s), but the purge may not survive a power loss: " +
                            std::string(not_durable.message()));
  }
  return victims->size();
}


// ---- DeleteConsumer. ----

namespace engine_internal {

void ReleaseInterest(ConsumerState& c, StoredMessage& h) {
  StreamState* stream = h.stream;
  if (c.config.ack != AckPolicy::kExplicit ||
      stream->config.retention == RetentionPolicy::kLimits) {
    return;
  }
  // A work queue keeps the message (live with no consumer counted) for the next
  // consumer, which counts itself again when it takes it (QueueStoredMessages).
  if (h.pending_acks.fetch_sub(1, std::memory_order_acq_rel) == 1 &&
      stream->config.retention == RetentionPolicy::kInterest) {
    stream->Retire(h, kDone);
  }
}

}  // namespace engine_internal

namespace {

using engine_internal::ConsumerState;
using engine_internal::StreamState;

// Removes a consumer's or stream's directory `dir` (symbolic links resolved by the
// caller): renamed out of the way first, to ".deleted-<name>-<n>" beside it with an
// <n> that names nothing there yet (that path may be anything of anyone's: found by
// the adversarial helper, who put another stream's directory there), then removed,
// so that a later consumer or stream of the name never recovers half of it. "" or
// the error's text.
std::string RemoveDirectory(const std::filesystem::path& dir) {
  static std::atomic<std::uint64_t> serial{0};
  std::error_code ec;
  std::filesystem::path gone;
  do {
    gone = dir.parent_path() / (".deleted-" + dir.filename().string() + "-" +
                                std::to_string(::getpid()) + "-" +
                                std::to_string(serial.fetch_add(1)));
  } while (std::filesystem::exists(std::filesystem::symlink_status(gone, ec)));
  std::filesystem::rename(dir, gone, ec);
  if (ec == std::errc::no_such_file_or_directory) return "";
  if (!ec) std::filesystem::remove_all(gone, ec);
  return ec ? ec.message() : "";
}

// The rest of a deletion, for consumer `c` of stream `s`, already marked deleted and
// moved off Impl::consumers under config_mu: the stream queues nothing more for it,
// its lanes close (waiting pulls return Cancelled), and what it still holds lets go
// of the stream: queued deliveries (a first delivery whose queue timeout
// dead-lettered it already was settled then), redeliveries parked or scheduled, and
// (tracked consumers) every delivery not acked, out with a member or not; an
// untracked consumer's deliveries out with a member let go when the member settles
// them (Message::Settle).
void Retire(ConsumerState& c, StreamState& s) {
  using engine_internal::ConsumerTimer;
  using engine_internal::Delivery;
  // The lanes close first: a publisher blocked on a full lane of this consumer
  // holds the stream's mutex, and lets go of it only when its push fails.
  for (auto& lane : c.lanes) lane->ring.close();
  if (c.Cursor()) engine_internal::CloseCursor(c);
  {
    std::lock_guard slot_lock(c.slot_mu);
    c.closing.store(true, std::memory_order_release);
  }
  c.slot_cv.notify_all();
  {
    std::lock_guard lock(s.mu);
    std::erase(s.consumers, &c);
    s.ConsumersChanged();
    // Under the mutex: no publish adds to what it lets go of meanwhile.
    if (c.Cursor()) engine_internal::ReleaseCursorInterest(c);
  }
  std::vector<Delivery> queued;
  for (auto& lane : c.lanes) {
    Delivery d;
    while (lane->ring.try_pop(d)) queued.push_back(std::move(d));
  }
  std::vector<engine_internal::Handle> release;
  {
    std::lock_guard lock(c.pending_mu);
    c.retired = true;  // what is parked, scheduled or tracked from now on lets go at once
    for (Delivery& d : c.parked) queued.push_back(std::move(d));
    c.parked.clear();
    c.has_parked.store(false, std::memory_order_release);
    for (Delivery& d : queued) {
      if (d.shadow) continue;
      if (d.attempt == 1) {
        auto w = c.waiting.find(d.h->seq);
        if (w != c.waiting.end() && w->second.state == ConsumerState::kExpired) continue;
      }
      if (c.tracked && d.attempt > 1) continue;  // its pending entry, below
      release.push_back(std::move(d.h));
    }
    // What a queue timeout gave up stays marked, without its record: a first
    // delivery of it in a thread's hands lets go of nothing (LetGoDeleted).
    for (auto it = c.waiting.begin(); it != c.waiting.end();) {
      if (it->second.state == ConsumerState::kExpired) {
        it->second.h.reset();
        ++it;
      } else {
        c.waiting.erase(it++);
      }
    }
    for (auto& [seq, p] : c.pending) release.push_back(std::move(p.h));
    c.pending.clear();
    c.wheel->Advance(INT64_MAX, [&](ConsumerTimer&& t, std::int64_t) {
      if (t.kind == ConsumerTimer::kRedeliver && !c.tracked && t.h != nullptr) {
        release.push_back(std::move(t.h));
      }
    });
  }
  for (engine_internal::Handle& h : release) engine_internal::ReleaseInterest(c, *h);
  if (c.ack_log != nullptr) {
    std::lock_guard lock(c.record_mu);
    c.records_closed = true;  // before its directory goes (Record)
  }
}

}  // namespace

absl::Status Engine::DeleteConsumer(std::string_view stream, std::string_view name) {
  ConsumerState* c = nullptr;
  StreamState* s = nullptr;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    s = impl_->FindStream(stream);
    if (s == nullptr) return absl::NotFoundError("stream " + QuoteValue(stream) + " does not exist");
    auto it = std::find_if(impl_->consumers.begin(), impl_->consumers.end(), [&](const auto& p) {
      return p->stream == s && p->config.name == name;
    });
    if (it == impl_->consumers.end()) {
      return absl::NotFoundError("consumer " + QuoteValue(name) + " of stream " +
                                 QuoteValue(stream) + " does not exist");
    }
    c = it->get();
    if (c->on_dead_letter) {
      return absl::FailedPreconditionError(
          "consumer " + QuoteValue(name) + " of stream " + QuoteValue(stream) +
          " serves a registered function (Engine::RegisterFunction); it is not deleted alone");
    }
    // Kept alive (handles, Messages and the timer thread's snapshot point to it);
    // no longer listed, so its name is free and no run of the timers takes it.
    c->deleted.store(true, std::memory_order_release);
    impl_->deleted_consumers.push_back(std::move(*it));
    impl_->consumers.erase(it);
    impl_->consumer_count.store(impl_->consumers.size(), std::memory_order_relaxed);
  }
  Retire(*c, *s);
  engine_internal::AwaitTimerRun(*c);
  if (c->Cursor()) engine_internal::ReleaseCursorReaders(*c);
  engine_internal::ForgetConsumerRecords(*c);
  if (c->ack_log == nullptr) return absl::OkStatus();
  const std::string consumers = s->config.directory + "/consumers/";
  const std::string error = RemoveDirectory(s->normal_dir / "consumers" / std::string(name));
  if (!error.empty()) {
    return absl::InternalError("consumer " + QuoteValue(name) + " of stream " +
                               QuoteValue(stream) + " is deleted, but its ack log " +
                               QuoteValue(consumers + std::string(name)) +
                               " could not be removed: " + error);
  }
  return absl::OkStatus();
}

absl::Status Engine::DeleteStream(std::string_view name) {
  StreamState* s = nullptr;
  std::vector<ConsumerState*> consumers;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    s = impl_->FindStream(name);
    if (s == nullptr) return absl::NotFoundError("stream " + QuoteValue(name) + " does not exist");
    for (const auto& f : impl_->functions) {
      if (name == "FN_" + f->id || name == "FN_" + f->id + "_DLQ") {
        return absl::FailedPreconditionError("stream " + QuoteValue(name) +
                                             " serves registered function '" + f->id +
                                             "' (Engine::RegisterFunction); it is not deleted alone");
      }
    }
    for (auto it = impl_->consumers.begin(); it != impl_->consumers.end();) {
      if ((*it)->stream != s) {
        ++it;
        continue;
      }
      (*it)->deleted.store(true, std::memory_order_release);
      consumers.push_back(it->get());
      impl_->deleted_consumers.push_back(std::move(*it));
      it = impl_->consumers.erase(it);
    }
    impl_->consumer_count.store(impl_->consumers.size(), std::memory_order_relaxed);
    // Publishes route around it from here on; one that found it before is refused
    // under its mutex (StreamState::deleted).
    impl_->routes.Change([s](SubjectIndex<StreamState*>& index) {
      for (const SubjectPattern& p : s->patterns) (void)index.Remove(p.text(), s);
      return 0;
    });
    impl_->stream_by_name.erase(std::string(name));
    auto it = std::find_if(impl_->streams.begin(), impl_->streams.end(),
                           [&](const auto& p) { return p.get() == s; });
    impl_->deleted_streams.push_back(std::move(*it));
    impl_->streams.erase(it);
    // Its directory stays reserved until its files are gone: an AddStream of it
    // meanwhile would recover what is being removed.
    if (s->is_file()) impl_->opening_dirs.emplace_back(s->normal_dir, s->config.name);
  }
  for (ConsumerState* c : consumers) {
    Retire(*c, *s);
    engine_internal::AwaitTimerRun(*c);
    if (c->Cursor()) engine_internal::ReleaseCursorReaders(*c);
    engine_internal::ForgetConsumerRecords(*c);
  }
  {
    std::lock_guard lock(s->mu);
    s->deleted = true;
    // Its messages go now (Messages out with members keep their own); the logs
    // stay open behind the state, unreachable, until the engine goes.
    s->messages = {};
    s->index = {};
    s->per_subject = {};
    s->dedup.reset();
  }
  if (!s->is_file()) return absl::OkStatus();
  const std::string error = RemoveDirectory(s->normal_dir);
  {
    std::lock_guard lock(impl_->config_mu);
    auto& v = impl_->opening_dirs;
    v.erase(std::find(v.begin(), v.end(), std::make_pair(s->normal_dir, s->config.name)));
  }
  if (!error.empty()) {
    return absl::InternalError("stream " + QuoteValue(name) + " is deleted, but its directory " +
                               QuoteValue(s->config.directory) + " could not be removed: " +
                               error);
  }
  return absl::OkStatus();
}

}  // namespace inferq
