// File: src/engine/publish.cpp
//
// The publish pipeline (Engine::Publish): check the event, route it to the
// capturing streams, convert its payload for consumers that need another codec,
// admit it to each stream (limits, duplicate window), select a member of each
// matching consumer, and enqueue it on their lanes. FlushOutbox publishes the dead
// letters that found their stream's mutex taken.
#include <algorithm>
#include <bit>
#include <array>
#include <deque>
#include <new>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/cord.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/sched/timer_wheel.hpp"

namespace inferq {
namespace {

// ResourceExhausted for a view whose copy found no memory (MakeRecord).
absl::Status OutOfMemoryFor(const EventView& v) {
  return absl::ResourceExhaustedError("out of memory copying an event for subject " + QuoteValue(v.subject) +
                                      " (payload of " + std::to_string(v.payload.size()) + " bytes)");
}

}  // namespace

// Untraced, straight to PublishEvent: one call less per publish than through
// Publish(Event&&, mode), which checks the tracer again.
absl::StatusOr<PublishAck> Engine::Publish(Event event) {
  if (impl_->tracer == nullptr) [[likely]] return PublishEvent(std::move(event), PublishMode::kWait, nullptr, nullptr);
  return Publish(std::move(event), PublishMode::kWait);
}

absl::StatusOr<PublishAck> Engine::TryPublish(Event event) {
  if (impl_->tracer == nullptr) [[likely]] return PublishEvent(std::move(event), PublishMode::kTry, nullptr, nullptr);
  return Publish(std::move(event), PublishMode::kTry);
}

std::vector<absl::StatusOr<PublishAck>> Engine::TryPublishBatch(std::span<Event> events) {
  std::vector<absl::StatusOr<PublishAck>> results;
  results.reserve(events.size());
  engine_internal::DeferredWakes wakes;  // its destructor wakes, also when a callback throws
  struct Restore {
    engine_internal::DeferredWakes* outer;
    ~Restore() { engine_internal::t_deferred_wakes = outer; }
  } restore{std::exchange(engine_internal::t_deferred_wakes, &wakes)};
  for (Event& e : events) {
    results.push_back(TryPublish(std::move(e)));
    const absl::StatusOr<PublishAck>& r = results.back();
    if (!r.ok() || r->streams_rejected > 0) break;
  }
  return results;
}

PublishBatchResult Engine::PublishRun(std::span<Event> events, std::span<const EventView> views,
                                      std::span<PublishAck> acks) {
  const std::size_t count = views.empty() ? events.size() : views.size();
  PublishBatchResult result;
  if (!acks.empty() && acks.size() < count) {
    result.status = absl::InvalidArgumentError(
        "PublishBatch: acks holds " + std::to_string(acks.size()) + " PublishAcks for " +
        std::to_string(count) + " events (give none, or at least one per event)");
    return result;
  }
  engine_internal::DeferredWakes wakes;  // its destructor wakes, also when a callback throws
  struct Restore {
    engine_internal::DeferredWakes* outer;
    ~Restore() { engine_internal::t_deferred_wakes = outer; }
  } restore{std::exchange(engine_internal::t_deferred_wakes, &wakes)};
  // The run: the memory stream whose mutex this batch holds (nullptr: none).
  std::unique_lock<engine_internal::StreamMutex> lock;
  StreamState* held = nullptr;
  // The run's cursor log entries, released to their consumers once, before the
  // mutex goes (engine_internal::CursorRelease); also when a callback throws.
  engine_internal::CursorRelease release;
  struct ReleaseScope {
    engine_internal::CursorRelease* release;
    engine_internal::CursorRelease* outer;
    ~ReleaseScope() {
      if (release->stream != nullptr) engine_internal::FlushCursorRelease(*release);
      engine_internal::t_cursor_release = outer;
    }
  } release_scope{&release, std::exchange(engine_internal::t_cursor_release, &release)};
  // Ends the run, if any: lets go of its stream and wakes the pullers it held back.
  // Dead letters deferred to the outbox go out then too, waking their pullers at
  // once (not through `wakes`): nothing is held back when the batch next waits, for
  // another stream's mutex or a full lane (found by the adversarial review: the
  // outbox's quiet pushes filled a lane whose puller the next publish then waited
  // for).
  auto end_run = [&] {
    if (held != nullptr) {
      engine_internal::FlushCursorRelease(release);
      release.stream = nullptr;
      lock.unlock();
      held = nullptr;
    }
    wakes.Flush();
    if (impl_->has_outbox.load(std::memory_order_acquire)) {
      engine_internal::t_deferred_wakes = nullptr;
      FlushOutbox();  // no mutex held
      engine_internal::t_deferred_wakes = &wakes;
    }
  };
  const Impl::PublishFlags flags = Impl::FlagsOf(PublishMode::kWait);
  // A view's record, which holds `event` (assigned per view; always empty for Events,
  // which then pay no construction or destruction of it per event).
  std::shared_ptr<StoredMessage> premade;
  // An engine of cursor consumers makes a view's event here instead, to be moved
  // into its log entry (as PublishView does); reused, CopyTo clears what a view
  // leaves empty.
  Event scratch;
  for (; result.published < count; ++result.published) {
    Event* prepared;
    if (views.empty()) [[likely]] {
      prepared = &events[result.published];
    } else {
      // As PublishView checks a view: closed first, then the view itself.
      const EventView& v = views[result.published];
      if (impl_->closed.load(std::memory_order_acquire)) {
        result.status = RefuseView(v, absl::CancelledError("engine is closed"));
        break;
      }
      if (absl::Status s = v.Validate(); !s.ok()) {
        impl_->Count(impl_->invalid, flags);
        result.status = RefuseView(v, std::move(s));
        break;
      }
      if (impl_->cursor_consumers) {
        try {
          v.CopyTo(scratch);
        } catch (const std::bad_alloc&) {
          result.status = RefuseView(v, OutOfMemoryFor(v));
          break;
        }
        prepared = &scratch;
      } else {
        premade = MakeRecord(v);
        if (premade == nullptr) {
          result.status = RefuseView(v, OutOfMemoryFor(v));
          break;
        }
        prepared = &premade->own;
      }
    }
    Event& event = *prepared;
    absl::StatusOr<PublishAck> r;
    // One stream's run: an event this thread routed before (so its subject was
    // checked) to one memory stream, with no payload conversion and no tracing. The
    // rest goes through Publish, with no wake-up held back and no mutex held.
    Impl::Capturing capturing;
    const bool fast = impl_->tracer == nullptr && !impl_->closed.load(std::memory_order_acquire) &&
                      impl_->routes.MatchCached(event.subject, &capturing) && capturing.size() == 1 &&
                      capturing[0].value->log == nullptr &&
                      capturing[0].value->codec_restricted.load(std::memory_order_relaxed) == 0 &&
                      Impl::CheckEvent(event, false).ok();
    if (fast) {
      impl_->publish_counts.Add(Impl::kRouteCacheHit);
      StreamState* stream = capturing[0].value;
      if (held != stream) {
        end_run();
        lock = std::unique_lock<engine_internal::StreamMutex>(stream->mu);
        held = stream;
        if (stream->cursors != nullptr) release.stream = stream;
      }
      Impl::PublishTally tally;
      Impl::Converted converted{};
      Impl::PublishedEvent published{event, nullptr, event.StoredSize(), Impl::EventLimitNs(event)};
      published.last = true;
      published.premade = premade != nullptr ? &premade : nullptr;
      impl_->PublishLocked(capturing[0], published, converted, flags, tally);
      r = impl_->FinishPublish(tally, flags);
    } else {
      end_run();
      engine_internal::t_deferred_wakes = nullptr;
      if (premade == nullptr || impl_->tracer != nullptr) {
        r = Publish(std::move(event), PublishMode::kWait);
      } else {
        r = PublishEvent(std::move(event), PublishMode::kWait, nullptr, nullptr, &premade);
      }
      engine_internal::t_deferred_wakes = &wakes;
    }
    if (!r.ok()) {
      result.status = r.status();
      break;
    }
    if (!acks.empty()) acks[result.published] = *r;
  }
  end_run();
  return result;
}

PublishBatchResult Engine::PublishBatch(std::span<Event> events, std::span<PublishAck> acks) {
  return PublishRun(events, {}, acks);
}

PublishBatchResult Engine::PublishViewBatch(std::span<const EventView> views, std::span<PublishAck> acks) {
  return PublishRun({}, views, acks);
}

absl::StatusOr<PublishAck> Engine::PublishView(const EventView& view) {
  if (impl_->closed.load(std::memory_order_acquire)) {
    return RefuseView(view, absl::CancelledError("engine is closed"));
  }
  if (absl::Status s = view.Validate(); !s.ok()) {
    impl_->Count(impl_->invalid, Impl::FlagsOf(PublishMode::kWait));
    return RefuseView(view, std::move(s));
  }
  if (impl_->cursor_consumers) {
    // An engine of cursor consumers holds most records in their log entries
    // (ClaimInPlace): the event is made here, on the stack, and moved there (TakeEvent
    // moves only the fields the view set), with no record allocated.
    Event event;
    try {
      view.CopyToNew(event);
    } catch (const std::bad_alloc&) {
      return RefuseView(view, OutOfMemoryFor(view));
    }
    if (impl_->tracer != nullptr) return Publish(std::move(event), PublishMode::kWait);  // the traced path
    return PublishEvent(std::move(event), PublishMode::kWait, nullptr, nullptr);
  }
  // Lane consumers take a shared record: made once, here, from the view.
  std::shared_ptr<StoredMessage> rec = MakeRecord(view);
  if (rec == nullptr) return RefuseView(view, OutOfMemoryFor(view));
  if (impl_->tracer != nullptr) return Publish(std::move(rec->own), PublishMode::kWait);  // the traced path
  Event& event = rec->own;
  return PublishEvent(std::move(event), PublishMode::kWait, nullptr, nullptr, &rec);
}

absl::Status Engine::RefuseView(const EventView& view, absl::Status refusal) {
  engine_internal::Tracer* tracer = impl_->tracer.get();
  if (tracer == nullptr) return refusal;
  // Traced as a refused Publish(Event) is (an error span, sampled or not), with the
  // view's fields copied into an Event for it; with no memory for that, untraced.
  try {
    Event event = view.ToEvent();
    engine_internal::Tracer::PublishScope scope;
    tracer->BeginPublish(event, scope);
    absl::StatusOr<PublishAck> result = refusal;
    tracer->EndPublish(scope, event, result);
  } catch (const std::bad_alloc&) {
  }
  return refusal;
}

std::shared_ptr<StoredMessage> Engine::MakeRecord(const EventView& view) {
  // From the publisher's node's pools: the first lane's node is not known before the
  // event is routed (a publish of an Event allocates its record after).
  engine_internal::PoolAllocator<StoredMessage> alloc(&impl_->PoolsFor(-1));
  try {
    std::shared_ptr<StoredMessage> rec = std::allocate_shared<StoredMessage>(alloc);
    rec->event = &rec->own;
    view.CopyToNew(rec->own);
    return rec;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

absl::StatusOr<PublishAckFuture> Engine::PublishAsync(Event event) {
  PublishAckFuture f;
  f.ack_ = Publish(std::move(event), PublishMode::kWait, nullptr, &f.syncs_);
  if (!f.ack_.ok()) return f.ack_.status();
  return f;
}

absl::StatusOr<PublishAck> PublishAckFuture::Wait() {
  if (waited_) return absl::FailedPreconditionError("PublishAckFuture::Wait was called already");
  waited_ = true;
  if (absl::Status st = Engine::SyncStored(syncs_); !st.ok()) return st;
  return std::move(ack_);
}

absl::Status Engine::SyncStored(std::span<const engine_internal::SyncPoint> syncs) {
  for (const auto& [stream, seq, removed_tx] : syncs) {
    if (absl::Status st = stream->log->Sync(seq); !st.ok()) {
      return absl::Status(st.code(), "stream '" + stream->config.name +
                                         "': message stored as sequence " + std::to_string(seq) +
                                         " is not durable: " + std::string(st.message()));
    }
    // Then the removal of the subject's oldest message (max_msgs_per_subject), after
    // the message that replaced it: a power cut between the two leaves both, never
    // neither, and a restart under a higher limit does not bring the removed one back.
    if (removed_tx == 0) continue;
    if (absl::Status st = stream->removed_log->Sync(removed_tx); !st.ok()) {
      return absl::Status(st.code(), "stream '" + stream->config.name +
                                         "': message stored as sequence " + std::to_string(seq) +
                                         ", but the removal of an older message of its "
                                         "subject (max_msgs_per_subject) is not durable: " +
                                         std::string(st.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PublishAck> Engine::Publish(Event&& event, PublishMode mode, StreamState* only,
                                           std::vector<engine_internal::SyncPoint>* deferred) {
  engine_internal::Tracer* tracer = impl_->tracer.get();
  // An outbox flush (`only`) publishes a dead letter whose publish was traced when
  // it was deferred.
  if (tracer == nullptr || only != nullptr) [[likely]] {
    return PublishEvent(std::move(event), mode, only, deferred);
  }
  engine_internal::Tracer::PublishScope scope;
  tracer->BeginPublish(event, scope);
  absl::StatusOr<PublishAck> result = PublishEvent(std::move(event), mode, only, deferred);
  tracer->EndPublish(scope, event, result);
  return result;
}

absl::StatusOr<PublishAck> Engine::PublishEvent(Event&& event, PublishMode mode, StreamState* only,
                                                std::vector<engine_internal::SyncPoint>* deferred,
                                                std::shared_ptr<StoredMessage>* premade) {
  if (impl_->closed.load(std::memory_order_acquire)) {
    return absl::CancelledError("engine is closed");
  }
  const Impl::PublishFlags flags = Impl::FlagsOf(mode);
  // A subject this thread routed since the last AddStream was checked then
  // (RouteIndex::MatchCached): the check below skips it.
  Impl::Capturing capturing;
  const bool routed_before = impl_->routes.MatchCached(event.subject, &capturing);
  impl_->publish_counts.Add(routed_before ? Impl::kRouteCacheHit : Impl::kRouteCacheMiss);
  if (absl::Status s = Impl::CheckEvent(event, !routed_before); !s.ok()) {
    impl_->Count(impl_->invalid, flags);
    return s;
  }
  const std::int64_t event_limit_ns = Impl::EventLimitNs(event);
  // route: the capturing streams.
  if (!impl_->Route(event.subject, only, routed_before, &capturing)) {
    impl_->Count(impl_->unrouted, flags);
    return absl::NotFoundError("no stream captures subject " + QuoteValue(event.subject));
  }
  // convert: payloads for consumers that need another codec, before anything is stored.
  Impl::Converted converted{};
  if (Impl::MayConvert(event, capturing, flags)) {
    if (absl::Status s = impl_->ConvertBeforeStore(event, capturing, flags, &converted); !s.ok()) {
      impl_->Count(impl_->invalid, flags);
      return s;
    }
  }
  // admit -> select -> enqueue, stream by stream. One Event is shared by every stream
  // and every delivery, made when the first stream stores it, from the pools of the
  // node of the first lane that will drain it.
  Impl::PublishTally tally;
  Impl::PublishedEvent published{event, nullptr, event.StoredSize(), event_limit_ns};
  published.premade = premade != nullptr && *premade != nullptr ? premade : nullptr;
  // From here on `event` may live in `premade`, which the first stream to store it
  // takes: nothing below the loop reads `event`.
  for (std::size_t i = 0; i < capturing.size(); ++i) {
    published.last = i + 1 == capturing.size();
    impl_->PublishToStream(capturing[i], published, converted, flags, tally);
  }
  if (!flags.internal && impl_->has_outbox.load(std::memory_order_acquire)) {
    FlushOutbox();  // no stream mutex is held here
  }
  // File streams: the ack waits for each one's sync policy (no stream mutex held, so
  // publishers waiting at once share an fdatasync), or PublishAckFuture::Wait does.
  if (!tally.syncs.empty()) {
    if (deferred != nullptr) {
      deferred->assign(tally.syncs.begin(), tally.syncs.end());
    } else {
      // A TryPublishBatch's held wake-ups go out before this waits for the disk: a
      // puller must not sleep through the syncs of the whole batch (found by an
      // adversarial review: queue timeouts expired events an idle member waited for).
      if (engine_internal::DeferredWakes* wakes = engine_internal::t_deferred_wakes; wakes != nullptr) {
        wakes->Flush();
      }
      if (absl::Status st = SyncStored({tally.syncs.data(), tally.syncs.size()}); !st.ok()) return st;
    }
  }
  return impl_->FinishPublish(tally, flags);
}

inline Engine::Impl::PublishFlags Engine::Impl::FlagsOf(PublishMode mode) {
  PublishFlags f;
  f.wait = mode == PublishMode::kWait;
  // TryPublish and a call waiting for room never wait.
  f.no_wait = mode == PublishMode::kTry || mode == PublishMode::kCall;
  f.internal = mode == PublishMode::kInternal;
  // EngineStats counts the application's publishes only, not the engine's own dead
  // letters (counted per consumer).
  f.counted = !f.internal;
  // A call's refusal for want of room is not counted as a rejection: the call waits
  // and tries again (FlushCalls).
  f.count_refusals = mode != PublishMode::kCall;
  return f;
}

inline void Engine::Impl::Count(std::atomic<std::uint64_t>& counter, const PublishFlags& flags) {
  if (flags.counted) counter.fetch_add(1, std::memory_order_relaxed);
}

inline absl::Status Engine::Impl::CheckEvent(const Event& event, bool check_subject) {
  if (check_subject) {
    if (absl::Status s = ValidateSubject(event.subject); !s.ok()) return s;
  }
  if (event.msg_id.size() > kMaxMsgIdBytes) {
    return absl::InvalidArgumentError("event msg_id of " + std::to_string(event.msg_id.size()) +
                                      " bytes is longer than the limit of " +
                                      std::to_string(kMaxMsgIdBytes) + " bytes");
  }
  if (event.ttl < absl::ZeroDuration() || event.ttl > kMaxDuration) {
    return absl::InvalidArgumentError("event ttl " + absl::FormatDuration(event.ttl) +
                                      " is invalid (zero for none, or up to 365 days)");
  }
  if (static_cast<std::uint8_t>(event.qos) > static_cast<std::uint8_t>(Qos::kBronze)) {
    return absl::InvalidArgumentError("event qos " +
                                      std::to_string(static_cast<int>(event.qos)) +
                                      " is not a tier (0 gold, 1 silver, 2 bronze)");
  }
  if (event.codec != PayloadCodec::kNone && event.codec != PayloadCodec::kZstd) {
    return absl::InvalidArgumentError("event payload codec " +
                                      std::to_string(static_cast<int>(event.codec)) +
                                      " is not one of none (0), zstd (1)");
  }
  if (event.codec == PayloadCodec::kNone && event.dictionary_id != 0) {
    return absl::InvalidArgumentError("event payload has codec none but dictionary_id " +
                                      std::to_string(event.dictionary_id) + " (must be 0)");
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::ValidateEvent(const Event& event) { return CheckEvent(event, true); }

inline std::int64_t Engine::Impl::EventLimitNs(const Event& event) {
  std::int64_t limit_ns = INT64_MAX;
  if (event.ttl > absl::ZeroDuration()) limit_ns = absl::ToInt64Nanoseconds(event.ttl);
  if (event.deadline != absl::InfiniteFuture()) {
    limit_ns = std::min(
        limit_ns,
        std::max<std::int64_t>(0, absl::ToInt64Nanoseconds(event.deadline - absl::Now())));
  }
  return limit_ns;
}

inline bool Engine::Impl::Route(std::string_view subject, StreamState* only, bool matched,
                         Capturing* capturing) {
  if (!matched) routes.MatchAndCache(subject, capturing);
  if (only != nullptr) {
    auto it = std::find_if(capturing->begin(), capturing->end(),
                           [only](const CapturingStream& r) { return r.value == only; });
    if (it == capturing->end()) {
      capturing->clear();
    } else {
      const CapturingStream kept = *it;
      capturing->clear();
      capturing->push_back(kept);
    }
  }
  return !capturing->empty();
}

inline absl::Status Engine::Impl::ConvertBeforeStore(const Event& event,
                                              const Capturing& capturing,
                                              const PublishFlags& flags, Converted* converted) {
  // Once per target codec, shared by every stream and consumer. Made before anything
  // is stored and outside the streams' mutexes (held only to read each stream's
  // consumers), so that a payload that cannot be converted changes nothing. Internal
  // publishes (dead letters) never wait for a stream's mutex: theirs are made under
  // it (ConvertUnderLock).
  if (event.payload.empty() || flags.internal) return absl::OkStatus();
  for (const CapturingStream& route : capturing) {
    StreamState* stream = route.value;
    // relaxed: a consumer added concurrently is handled under the mutex (ConvertUnderLock).
    if (stream->codec_restricted.load(std::memory_order_relaxed) == 0) continue;
    std::array<const ConsumerState*, kPayloadCodecs> needs{};  // first consumer per codec
    {
      std::unique_lock lock(stream->mu, std::defer_lock);
      if (flags.no_wait) {
        // Held by a blocked publisher: the stream refuses in PublishToStream.
        if (!stream->LockUnlessBlocked(lock)) continue;
      } else {
        lock.lock();
      }
      for (const ConsumerState* c : stream->consumers) {
        const auto i = static_cast<std::size_t>(c->convert_to);
        if (c->Accepts(event.codec) || needs[i] != nullptr || (*converted)[i] != nullptr) continue;
        if (c->filter && !c->filter->Matches(event.subject)) continue;
        if (!c->config.predicate.is_trivial() && !c->config.predicate.Matches(event)) continue;
        needs[i] = c;
      }
    }
    for (std::size_t i = 0; i < kPayloadCodecs; ++i) {
      if (needs[i] == nullptr) continue;
      absl::StatusOr<std::shared_ptr<const Event>> r =
          Convert(event, static_cast<PayloadCodec>(i), *needs[i]);
      if (!r.ok()) return r.status();
      (*converted)[i] = *std::move(r);
    }
  }
  return absl::OkStatus();
}

inline void Engine::Impl::Refuse(StreamState& stream, absl::Status why, bool count,
                          PublishTally& tally, bool busy) {
  if (count) stream.rejected.fetch_add(1, std::memory_order_relaxed);
  ++tally.ack.streams_rejected;
  if (busy) ++tally.ack.streams_busy;
  if (tally.first_refusal.ok()) tally.first_refusal = std::move(why);
}

inline bool Engine::Impl::LockForPublish(StreamState& stream, std::unique_lock<engine_internal::StreamMutex>& lock,
                                  const Event& incoming, const PublishFlags& flags,
                                  PublishTally& tally) {
  if (flags.wait) {
    lock.lock();
    return true;
  }
  if (flags.no_wait) {
    if (stream.LockUnlessBlocked(lock)) return true;
    Refuse(stream,
           absl::ResourceExhaustedError(
               "stream '" + stream.config.name + "': a Publish is blocked on a full lane "
               "(overflow block) and holds the stream; TryPublish does not wait"),
           flags.count_refusals, tally, /*busy=*/true);
    return false;
  }
  if (lock.try_lock()) return true;
  // A dead letter never waits for a stream's mutex: its holder may be a publisher
  // blocked on a full lane that only the member publishing this dead letter (or the
  // timer thread) would drain. It is published into this stream later (FlushOutbox:
  // after the next publish, pull or timer run).
  {
    std::lock_guard outbox_lock(outbox_mu);
    outbox.emplace_back(&stream, Event(incoming));
    has_outbox.store(true, std::memory_order_release);
  }
  ++tally.deferred;
  return false;
}

inline void Engine::Impl::SelectTargets(StreamState& stream, const CapturingStream& route,
                                        const Event& ev, std::int64_t now, Targets* targets,
                                        std::uint32_t* explicit_acks, std::uint64_t* cursor_targets) {
  // Which consumers' filters match: the route cache's mask, computed once per
  // subject and consumer list, not a pattern match per consumer and event.
  std::uint64_t mask = route.filter_mask;
  if (route.filter_version != stream.consumers_version) [[unlikely]] {
    mask = stream.FilterMask(ev.subject);
    routes.NoteFilters(ev.subject, &stream, mask, stream.consumers_version);
  }
  // Under the stream's mutex: the consumer's selection policy picks the member, plus
  // a shadow copy (WeightedShadowPolicy).
  for (std::size_t k = 0; k < stream.consumers.size(); ++k) {
    ConsumerState* c = stream.consumers[k];
    if (k < StreamState::kMaskedConsumers ? (mask >> k & 1) == 0
                                          : c->filter && !c->filter->Matches(ev.subject)) {
      continue;
    }
    // relaxed: DeleteConsumer sets it before it closes the lanes and, later, takes
    // this mutex to unlist the consumer; a stale false meets a closed lane.
    if (c->deleted.load(std::memory_order_relaxed)) continue;
    if (stream.next_seq <= c->start_after) continue;  // before its start sequence
    if (!c->config.predicate.is_trivial() && !c->config.predicate.Matches(ev)) continue;
    if (c->cursor != nullptr) {  // read through the stream's cursor log (cursor.hpp)
      *cursor_targets |= c->cursor->bit;
      ++*explicit_acks;
      continue;
    }
    Selection sel;
    {
      std::lock_guard select_lock(c->select_mu);
      sel = c->group->Select(*c->policy, ev, now);
    }
    targets->push_back({c, sel.member, false});
    if (sel.mirror != kNoMember) targets->push_back({c, sel.mirror, true});
    if (c->config.ack == AckPolicy::kExplicit) ++*explicit_acks;
  }
}

inline absl::Status Engine::Impl::CheckLanes(const StreamConfig& cfg, const Event& ev,
                                      const Targets& targets, const PublishFlags& flags,
                                      bool* busy) {
  // kReject (and kBlock for a publish that must not wait) refuse the publish for this
  // stream before anything changes.
  for (const Target& t : targets) {
    if (t.consumer->ack_log_failed.load(std::memory_order_relaxed)) continue;  // skipped below
    // Reading its backlog: the message waits in the log, not on a lane (EnqueueTargets).
    if (!t.shadow && t.consumer->reading_backlog.load(std::memory_order_relaxed)) continue;
    const OverflowPolicy overflow = t.consumer->config.overflow;
    const bool refuses = overflow == OverflowPolicy::kReject ||
                         (overflow == OverflowPolicy::kBlock && flags.no_wait);
    Lane& lane = *t.consumer->lanes[t.member];
    if (!refuses || lane.ring.WouldAccept(QosKey::Of(ev))) continue;
    if (flags.count_refusals) t.consumer->counts.overflow_rejected.fetch_add(1, std::memory_order_relaxed);
    *busy = overflow == OverflowPolicy::kBlock;
    return absl::ResourceExhaustedError(
        "stream '" + cfg.name + "': lane of consumer '" + t.consumer->config.name +
        "' member " + std::to_string(t.member) + " is full (" +
        std::to_string(lane.ring.size_approx()) + " queued" +
        (lane.ring.scheduled() ? " or its tier at max_items" : "") + "; overflow " +
        (overflow == OverflowPolicy::kReject ? "reject" : "block, and TryPublish does not wait") +
        ")");
  }
  return absl::OkStatus();
}

inline absl::Status Engine::Impl::ConvertUnderLock(const Event& ev, const Targets& targets,
                                            Converted* converted) {
  // The conversions ConvertBeforeStore did not make: a consumer added since, or a
  // dead letter.
  if (ev.payload.empty()) return absl::OkStatus();
  for (const Target& t : targets) {
    const auto i = static_cast<std::size_t>(t.consumer->convert_to);
    if (t.consumer->Accepts(ev.codec) || (*converted)[i] != nullptr) continue;
    absl::StatusOr<std::shared_ptr<const Event>> r = Convert(ev, t.consumer->convert_to, *t.consumer);
    if (!r.ok()) return r.status();
    (*converted)[i] = *std::move(r);
  }
  return absl::OkStatus();
}

// A record, with allocate_shared's control block (a vtable pointer, two counts and
// the allocator), fits a block of the node's pool.
static_assert(sizeof(StoredMessage) + 3 * sizeof(void*) <= engine_internal::kRecordBlock,
              "a stream record with its control block must fit NodePools::records");

// The first stream to store a view's event takes the record the event is in.
[[gnu::noinline]] std::shared_ptr<StoredMessage> Engine::Impl::TakePremade(PublishedEvent& pe) {
  std::shared_ptr<StoredMessage> stored = std::move(*pe.premade);
  pe.premade = nullptr;
  if (!pe.last) pe.first = stored;
  return stored;
}

inline std::shared_ptr<StoredMessage> Engine::Impl::AllocateRecord(StreamState& stream,
                                                            PublishedEvent& pe,
                                                            const Targets& targets) {
  engine_internal::NodePools& pools = PoolsFor(
      targets.empty() ? -1 : targets.front().consumer->lanes[targets.front().member]->node);
  // Everything that can fail for want of memory happens before the stream changes
  // (before discard-old makes room), so a failure changes nothing.
  try {
    if (stream.log != nullptr) {
      stream.index.ReserveOne();
    } else if (stream.keeps_index) {
      stream.messages.ReserveOne();
    }
    if (pe.premade != nullptr) [[unlikely]] return TakePremade(pe);  // a view's record
    engine_internal::PoolAllocator<StoredMessage> alloc(&pools);
    if (pe.first == nullptr) {
      // Allocated, then constructed: a bad_alloc moves nothing.
      std::shared_ptr<StoredMessage> stored = std::allocate_shared<StoredMessage>(alloc, std::move(pe.event));
      // Later streams point at this record's event, also if this stream does not
      // store it after all (a failed append): the event lives on here.
      if (!pe.last) pe.first = stored;
      return stored;
    }
    std::shared_ptr<StoredMessage> stored = std::allocate_shared<StoredMessage>(alloc);
    stored->event = pe.first->event;
    stored->primary = pe.last ? std::move(pe.first) : pe.first;
    return stored;
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

inline std::uint32_t Engine::Impl::EnqueueTargets(StreamState& stream,
                                           std::shared_ptr<StoredMessage>& stored,
                                           const Targets& targets, std::int64_t now,
                                           std::int64_t event_limit_ns,
                                           const PublishFlags& flags, PublishTally& tally) {
  // Queued while holding the stream's mutex, so every member sees the stream's order.
  // A full lane blocks here: that is the backpressure on publishers.
  std::uint32_t undelivered_acks = 0;
  const std::uint64_t seq = stored->seq;
  // One target: its delivery takes the publisher's reference (two locked
  // instructions fewer per publish); what does not queue it gives it back.
  const bool hand_over = targets.size() == 1;
  for (const Target& t : targets) {
    ConsumerState* consumer = t.consumer;
    // A durable consumer whose ack log failed delivers no more (FailAckLog): it
    // gets nothing, so that its full lanes never hold publishers back. The message
    // is stored, not acked by it: after a restart it comes to it.
    if (consumer->ack_log_failed.load(std::memory_order_relaxed)) continue;
    if (!t.shadow && consumer->reading_backlog.load(std::memory_order_relaxed)) {
      // A file stream's consumer still reading its backlog (ConsumerState::Backlog)
      // reaches this message in the log, in order; nothing is queued or held for it
      // here (relaxed: the flag is written under the stream's mutex held here).
      ++tally.ack.deliveries;
      if (consumer->host != nullptr) consumer->host->WakeTimer(now);
      continue;
    }
    auto& ring = consumer->lanes[t.member]->ring;
    engine_internal::Delivery d{hand_over ? std::move(stored) : stored, 1, t.shadow};
    struct GiveBack {  // d's reference back to `stored` unless d was queued or parked
      engine_internal::Delivery& d;
      std::shared_ptr<StoredMessage>& stored;
      ~GiveBack() {
        if (d.h != nullptr && stored == nullptr) stored = std::move(d.h);
      }
    } give_back{d, stored};
    // A queue timeout is registered before the push, so that a fast pull finds it.
    std::int64_t expiry = INT64_MAX;
    if (!t.shadow) expiry = consumer->ExpiryFor(now, event_limit_ns);
    if (expiry != INT64_MAX) {
      {
        std::lock_guard wl(consumer->pending_mu);
        const TimerId id = consumer->Schedule(
            expiry, {engine_internal::ConsumerTimer::kQueueExpiry, 1, seq, nullptr});
        consumer->waiting.insert_or_assign(
            seq, ConsumerState::Waiting{d.h, expiry, id, ConsumerState::kQueued});
        consumer->has_waiting.store(true, std::memory_order_release);
      }
      WakeTimer(expiry);
    }
    if (!t.shadow && consumer->catching_up.load(std::memory_order_acquire)) {
      // The stored messages it started with wait parked: this one goes behind
      // them, so that it does not overtake them (RetryParked).
      std::unique_lock park_lock(consumer->pending_mu);
      if (!consumer->parked.empty() || consumer->catchup_in_hand) {
        consumer->parked.push_back(std::move(d));
        consumer->counts.parked.fetch_add(1, std::memory_order_relaxed);
        ++tally.ack.deliveries;
        park_lock.unlock();
        if (consumer->host != nullptr) consumer->host->WakeTimer(now);
        continue;
      }
    }
    const bool queued =
        engine_internal::PlaceOnLane(*consumer, d, t.member, engine_internal::Placement::kFirst,
                                     {flags.wait, &stream.blocked_publishers}) != kNoMember;
    if (!queued && !ring.closed() &&
        (consumer->config.overflow != OverflowPolicy::kBlock || !flags.wait)) {
      // Full although checked by CheckLanes (a redelivery took the room), or an
      // internal publish: park it; the next pull or timer run queues it.
      if (t.shadow) continue;
      std::lock_guard park_lock(consumer->pending_mu);
      if (consumer->retired) {  // deleted since it was selected: nothing would take it
        // (Its queue timeout, had it passed, let go of the message already.)
        if (!(expiry != INT64_MAX && engine_internal::ForgetWaiting(*consumer, seq)) &&
            consumer->config.ack == AckPolicy::kExplicit) {
          ++undelivered_acks;
        }
        continue;
      }
      consumer->parked.push_back(std::move(d));
      consumer->counts.parked.fetch_add(1, std::memory_order_relaxed);
      consumer->has_parked.store(true, std::memory_order_release);
      ++tally.ack.deliveries;
      continue;
    }
    if (queued) {
      ++tally.ack.deliveries;
      if (t.shadow) consumer->counts.mirrored.fetch_add(1, std::memory_order_relaxed);
    } else {  // closed while waiting: that consumer will never ack it
      if (t.shadow) continue;
      if (expiry != INT64_MAX) {
        // Its queue timeout, had it passed, let go of the message already.
        std::lock_guard wl(consumer->pending_mu);
        if (engine_internal::ForgetWaiting(*consumer, seq)) continue;
      }
      // A consumer deleted meanwhile (DeleteConsumer closes its lanes before it takes
      // the stream's mutex this publisher holds) simply no longer takes it.
      if (!consumer->deleted.load(std::memory_order_acquire)) ++tally.undelivered;
      if (consumer->config.ack == AckPolicy::kExplicit) ++undelivered_acks;
    }
  }
  return undelivered_acks;
}

inline void Engine::Impl::PublishToStream(const CapturingStream& route, PublishedEvent& pe,
                                          Converted& converted, const PublishFlags& flags,
                                          PublishTally& tally) {
  StreamState& stream = *route.value;
  std::unique_lock lock(stream.mu, std::defer_lock);
  if (!LockForPublish(stream, lock, pe.current(), flags, tally)) return;
  PublishLocked(route, pe, converted, flags, tally);
}

inline void Engine::Impl::PublishLocked(const CapturingStream& route, PublishedEvent& pe,
                                        Converted& converted, const PublishFlags& flags,
                                        PublishTally& tally) {
  StreamState& stream = *route.value;
  const StreamConfig& cfg = stream.config;
  const std::int64_t now = clock->NowNanos();
  const Event& ev = pe.current();
  // admit: limits and the duplicate window. Dead letters keep the original msg_id
  // (for correlation) but are not subject to the duplicate window: two consumers'
  // dead letters of one message, or a dead letter in the stream of its original, are
  // all kept.
  engine_internal::Admission admission = stream.Admit(ev, pe.bytes, now, !flags.internal);
  if (admission.duplicate_of) {
    stream.duplicates.fetch_add(1, std::memory_order_relaxed);
    if (tally.ack.streams_stored == 0 && tally.ack.streams_duplicate == 0) {
      tally.ack.seq = *admission.duplicate_of;
    }
    tally.ack.duplicate = true;
    ++tally.ack.streams_duplicate;
    return;
  }
  if (!admission.refusal.ok()) {
    Refuse(stream, std::move(admission.refusal), true, tally);
    return;
  }
  // select: the consumers that take this event, and which member of each.
  Targets targets;
  std::uint32_t explicit_acks = 0;
  std::uint64_t cursor_targets = 0;
  SelectTargets(stream, route, ev, now, &targets, &explicit_acks, &cursor_targets);
  // Full lanes refuse before anything changes. Internal publishes (dead letters) never
  // wait and never refuse: a full lane parks them (EnqueueTargets).
  if (!flags.internal && !targets.empty()) {
    bool busy = false;
    if (absl::Status full = CheckLanes(cfg, ev, targets, flags, &busy); !full.ok()) {
      Refuse(stream, std::move(full), flags.count_refusals, tally, busy);
      return;
    }
  }
  if (cursor_targets != 0 && !flags.internal && !flags.wait) {
    bool busy = false;
    if (absl::Status full = engine_internal::CursorRefuse(stream, cursor_targets, flags.count_refusals, &busy);
        !full.ok()) {
      Refuse(stream, std::move(full), flags.count_refusals, tally, busy);
      return;
    }
  }
  // A failed conversion refuses the event for this stream only, before it changes.
  if (absl::Status conversion = ConvertUnderLock(ev, targets, &converted); !conversion.ok()) {
    Refuse(stream, std::move(conversion), true, tally);
    return;
  }
  // A record that only cursor consumers of this one stream take, and that the stream
  // keeps no index of, lives in its log entry (ClaimInPlace): no allocation, no
  // reference count; `stored` then owns nothing.
  // (Should the log fail to allocate, the record is allocated as any other.)
  engine_internal::CursorEntry* in_place = nullptr;
  if (cursor_targets != 0 && pe.premade == nullptr && targets.empty() && !stream.keeps_index &&
      stream.log == nullptr && pe.last && pe.first == nullptr && !flags.internal) {
    in_place = engine_internal::ClaimInPlace(stream, std::move(pe.event));
  }
  std::shared_ptr<StoredMessage> stored = in_place != nullptr ? in_place->h : AllocateRecord(stream, pe, targets);
  if (stored == nullptr) {
    Refuse(stream,
           absl::ResourceExhaustedError("stream '" + cfg.name +
                                        "': out of memory storing a message of " +
                                        std::to_string(pe.bytes) + " bytes"),
           true, tally);
    return;
  }
  if (stream.log != nullptr) {
    // kFile: in the log (written to the OS) before the stream changes; a failed
    // append stores nothing.
    if (absl::Status w = stream.AppendToLog(*stored->event, pe.bytes); !w.ok()) {
      Refuse(stream, std::move(w), true, tally);
      return;
    }
    tally.syncs.push_back({&stream, stream.next_seq, 0});
  }
  if (pe.last) {  // nothing reads them after the last stream: no reference counts change
    stored->converted = std::move(converted);
  } else {
    stored->converted = converted;  // copies of shared_ptrs: no allocation
  }
  const std::uint64_t limit_removed_before = stream.limit_removed_tx;
  stream.Append(stored, now, pe.bytes, explicit_acks, !flags.internal, admission);
  if (stream.log != nullptr) {
    if (stream.limit_removed_tx != limit_removed_before) {
      tally.syncs.back().removed_tx = stream.limit_removed_tx;
    }
    stream.RetireLog();
  }
  // The cursor consumers' log: one entry for all of them, and one for every message
  // once the stream has the log (its sequences are the stream's).
  const std::uint64_t seq = stored->seq;
  if (stream.cursors != nullptr) {
    std::uint64_t closed = 0;
    if (cursor_targets != 0) engine_internal::CursorWaitRoom(stream, &cursor_targets, flags.internal, &closed);
    if (in_place == nullptr) engine_internal::PushToCursors(stream, stored, cursor_targets, now, pe.event_limit_ns);
    tally.ack.deliveries += engine_internal::ConsumerCount(cursor_targets);
    if (closed != 0) {
      // Closed while this publish waited for room: it will never ack the message (as
      // a lane closed under a blocked publisher).
      std::uint32_t gone = 0;
      for (ConsumerState* c : stream.consumers) {
        if (c->cursor == nullptr || (closed & c->cursor->bit) == 0) continue;
        ++gone;
        if (!c->deleted.load(std::memory_order_acquire)) ++tally.undelivered;
      }
      // A work queue's count drops too, as ReleaseInterest's does: the message stays
      // for the next consumer, which counts itself when it takes it.
      if (cfg.retention != RetentionPolicy::kLimits &&
          stored->pending_acks.fetch_sub(gone, std::memory_order_acq_rel) == gone &&
          cfg.retention == RetentionPolicy::kInterest) {
        stream.Retire(*stored, engine_internal::kDone);
      }
    }
    if (in_place != nullptr) {
      // The last read of the record: from here on an ack may destroy it.
      engine_internal::PushInPlace(stream, *in_place, seq, cursor_targets, now, pe.event_limit_ns);
      if (tally.ack.streams_stored == 0 && tally.ack.streams_duplicate == 0) tally.ack.seq = seq;
      ++tally.ack.streams_stored;
      return;
    }
  }
  // enqueue: one delivery per target lane. `stored` may be empty after it
  // (EnqueueTargets); it is not when undelivered_acks > 0.
  const std::uint32_t undelivered_acks =
      EnqueueTargets(stream, stored, targets, now, pe.event_limit_ns, flags, tally);
  // A work queue's count drops too (ReleaseInterest): the message stays for the next
  // consumer, which counts itself when it takes it; only interest retention retires it.
  if (undelivered_acks > 0 && cfg.retention != RetentionPolicy::kLimits &&
      stored->pending_acks.fetch_sub(undelivered_acks, std::memory_order_acq_rel) ==
          undelivered_acks &&
      cfg.retention == RetentionPolicy::kInterest) {
    stream.Retire(*stored, engine_internal::kDone);
  }
  if (tally.ack.streams_stored == 0 && tally.ack.streams_duplicate == 0) tally.ack.seq = seq;
  ++tally.ack.streams_stored;
}

inline absl::StatusOr<PublishAck> Engine::Impl::FinishPublish(PublishTally& tally,
                                                       const PublishFlags& flags) {
  PublishAck& ack = tally.ack;
  if (ack.streams_stored == 0 && ack.streams_duplicate == 0 && tally.deferred == 0) {
    if (flags.count_refusals) Count(rejected, flags);
    if (ack.streams_busy > 0 && ack.streams_busy == ack.streams_rejected) {
      absl::Status st = tally.first_refusal;
      st.SetPayload(kWouldBlockPayload, absl::Cord("1"));
      return st;
    }
    return tally.first_refusal;
  }
  if (ack.streams_stored > 0 && flags.counted) publish_counts.Add(kPublished);  // not a duplicate everywhere
  if (tally.undelivered > 0) {  // stored (and counted), but not queued for every consumer
    return absl::CancelledError("engine closed during publish: stored as sequence " +
                                std::to_string(ack.seq) + " but not queued for " +
                                std::to_string(tally.undelivered) + " consumer(s)");
  }
  if (flow != nullptr) {
    ack.throttle = flow->Throttle();
    ack.weight_scale = flow->WeightScale();
  }
  return ack;
}

void Engine::FlushOutbox() {
  std::deque<std::pair<StreamState*, Event>> items;
  {
    std::lock_guard lock(impl_->outbox_mu);
    items.swap(impl_->outbox);
    impl_->has_outbox.store(false, std::memory_order_release);
  }
  for (auto& [stream, e] : items) (void)Publish(std::move(e), PublishMode::kInternal, stream);
}

}  // namespace inferq
