// File: src/engine/calls.cpp
//
// Function-in-flight: RegisterFunction, Call, and FlushCalls (the
// calls waiting for room in their function's queue).
#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <deque>
#include <future>
#include <thread>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/routing/subject.hpp"

namespace inferq {

namespace {

std::uint64_t CallIdOf(const Event& e) {
  std::optional<std::string_view> v = e.headers.Get(kCallIdHeader);
  std::uint64_t id = 0;
  if (!v || std::from_chars(v->data(), v->data() + v->size(), id).ec != std::errc()) return 0;
  return id;
}

// What RegisterFunction refuses before it changes anything: a bad id, an empty
// handler, options out of range (naming the value).
absl::Status ValidateFunction(const std::string& id, const FunctionHandler& handler,
                              const FunctionOptions& options) {
  if (id.empty() || id.size() > 48) {
    return absl::InvalidArgumentError("function id " + QuoteValue(id) +
                                      " must have 1 to 48 characters");
  }
  if (absl::Status s = ValidateName("function", id); !s.ok()) return s;
  if (!handler) {
    return absl::InvalidArgumentError("function '" + id + "' has an empty handler");
  }
  if (options.workers == 0 || options.workers > 256) {
    return absl::InvalidArgumentError("function '" + id + "': workers " +
                                      std::to_string(options.workers) + " is outside 1..256");
  }
  if (options.queue_capacity == 0 || options.queue_capacity > (std::size_t{1} << 20)) {
    return absl::InvalidArgumentError("function '" + id + "': queue_capacity " +
                                      std::to_string(options.queue_capacity) +
                                      " is outside 1..1048576");
  }
  if (options.max_deliver < 1 || options.max_deliver > 100) {
    return absl::InvalidArgumentError("function '" + id + "': max_deliver " +
                                      std::to_string(options.max_deliver) +
                                      " is outside 1..100");
  }
  if (options.subjects.size() > 4096) {
    return absl::InvalidArgumentError("function '" + id + "': " +
                                      std::to_string(options.subjects.size()) +
                                      " subjects, more than 4096");
  }
  static const SubjectPattern kDeadLetters = *SubjectPattern::Parse("fn.*.dead");
  for (const std::string& subject : options.subjects) {
    absl::StatusOr<SubjectPattern> p = SubjectPattern::Parse(subject);
    if (!p.ok()) {
      return absl::InvalidArgumentError("function '" + id + "': " + std::string(p.status().message()));
    }
    if (p->Overlaps(kDeadLetters)) {
      return absl::InvalidArgumentError("function '" + id + "': subject " + QuoteValue(subject) +
                                        " can match dead letters of functions (fn.*.dead)");
    }
  }
  // Everything that can fail is checked before anything is added: a refused
  // registration leaves no streams behind.
  const std::size_t slots = std::bit_ceil(options.queue_capacity) * options.workers;
  if (slots > ConsumerConfig::kMaxLaneSlots) {
    return absl::InvalidArgumentError(
        "function '" + id + "': workers " + std::to_string(options.workers) +
        " x queue_capacity " + std::to_string(options.queue_capacity) + " = " +
        std::to_string(slots) + " queue slots (after rounding up to powers of two) exceed " +
        std::to_string(ConsumerConfig::kMaxLaneSlots));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Engine::RegisterFunction(std::string_view fn_id, FunctionHandler handler,
                                      FunctionOptions options) {
  const std::string id(fn_id);
  if (absl::Status s = ValidateFunction(id, handler, options); !s.ok()) return s;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    if (impl_->FindFunction(id) != nullptr) {
      return absl::AlreadyExistsError("function '" + id + "' is already registered");
    }
    for (const std::string& name : {"FN_" + id, "FN_" + id + "_DLQ"}) {
      if (impl_->FindStream(name) != nullptr) {
        return absl::AlreadyExistsError("function '" + id + "': stream '" + name +
                                        "' already exists");
      }
    }
  }
  const std::string stream = "FN_" + id;
  const std::string subject = "fn." + id;  // of the dead letters; the default call subject
  std::vector<std::string> subjects = options.subjects;
  if (subjects.empty()) subjects.push_back(subject);
  if (absl::Status s = AddStream({.name = stream, .subjects = subjects,
                                  .retention = RetentionPolicy::kInterest});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AddStream({.name = stream + "_DLQ", .subjects = {subject + ".dead"},
                                  .max_msgs = 10'000});
      !s.ok()) {
    return s;
  }
  // Least loaded (power of two choices on queued + running calls): a call goes to
  // an idle worker, not behind one that is busy with a slow call.
  absl::StatusOr<std::unique_ptr<SelectionPolicy>> policy = MakeSelectionPolicy("least_loaded");
  if (!policy.ok()) return policy.status();
  ConsumerConfig handler_config{.stream = stream,
                                .name = "handler",
                                .members = options.workers,
                                .lane_capacity = options.queue_capacity,
                                .max_deliver = options.max_deliver,
                                .dead_letter_subject = subject + ".dead"};
  handler_config.selection = std::shared_ptr<SelectionPolicy>(*std::move(policy));
  absl::StatusOr<Consumer> consumer = AddConsumer(handler_config);
  if (!consumer.ok()) return consumer.status();
  ConsumerState* state = consumer->state_;
  // The call's own timer enforces its timeout, queued or running: the consumer does
  // not also expire it by the event's ttl.
  state->enforce_event_ttl = false;
  Impl* impl = impl_.get();
  // The call ends here unless it ended already: its timeout (which dead-lettered it
  // as "expired") or a CancelCall (no dead letter) came first. Exactly one of them
  // removes it from `calls`, under calls_mu, so a call has at most one dead letter.
  state->on_dead_letter = [impl, id](const Event& e, std::uint32_t attempt, std::string_view reason) {
    const std::uint64_t call = CallIdOf(e);
    absl::Status error;
    {
      std::lock_guard lock(impl->calls_mu);
      auto it = impl->calls.find(call);
      if (it == impl->calls.end()) return false;
      const absl::Status& last = it->second.last_error;
      const std::string why = "function '" + id + "' failed after " + std::to_string(attempt) +
                              (attempt == 1 ? " try" : " tries") + " (" + std::string(reason) + ")";
      error = last.ok() ? absl::InternalError(why)
                        : absl::Status(last.code(), why + ": " + std::string(last.message()));
      // The handler's error report (its payloads) reaches the caller, as deep copies:
      // a Cord copy would share its reference-counted bytes with last_error, and the
      // thread that drops the last reference would free them unordered (for TSan) with
      // the caller's read.
      last.ForEachPayload([&error](absl::string_view url, const absl::Cord& bytes) {
        error.SetPayload(url, absl::Cord(std::string(bytes)));
      });
    }
    // Moved, not copied: the caller's thread then holds the only reference to the
    // message it reads, and frees it (see tests/tsan_suppressions.cpp).
    return impl->CompleteCall(call, std::move(error));
  };
  std::lock_guard lock(impl_->config_mu);
  impl_->functions.push_back(std::make_unique<Impl::Function>());
  Impl::Function* fn = impl_->functions.back().get();
  fn->id = id;
  for (const std::string& p : subjects) fn->subjects.push_back(*SubjectPattern::Parse(p));
  fn->admit = std::move(options.admit);
  fn->stream = impl_->FindStream(stream);  // config_mu is held
  impl_->function_by_id.emplace(id, fn);
  for (std::uint32_t i = 0; i < options.workers; ++i) {
    impl_->function_workers.emplace_back([this, impl, fn, member = *consumer->member(i),
                                          handler]() mutable {
      for (;;) {
        absl::StatusOr<Message> m = member.Next(absl::InfiniteDuration());
        if (!m.ok()) {
          if (m.status().code() == absl::StatusCode::kCancelled) return;
          continue;
        }
        // This pull made room in the queue: calls waiting for it may go now.
        if (fn->has_backlog.load(std::memory_order_acquire)) FlushCalls(*fn);
        impl->ServeCall(*m, handler);
      }
    });
  }
  return absl::OkStatus();
}

void Engine::Impl::ServeCall(Message& m, const FunctionHandler& handler) {
  const std::uint64_t call = CallIdOf(m.event());
  {
    std::lock_guard calls_lock(calls_mu);
    auto it = calls.find(call);
    if (it == calls.end()) {  // timed out (or not a call): nothing to do
      (void)m.Ack();
      return;
    }
    it->second.running = true;
    ++it->second.attempts;
  }
  absl::StatusOr<Buffer> reply;
  try {
    reply = handler(m.event());
  } catch (const std::exception& e) {
    reply = absl::InternalError(std::string("handler threw: ") + e.what());
  } catch (...) {
    reply = absl::InternalError("handler threw a non-standard exception");
  }
  if (reply.ok()) {
    (void)m.Ack();  // first: a caller that sees the reply sees the call settled
    CompleteCall(call, std::move(reply));
    return;
  }
  bool open;
  {
    std::lock_guard calls_lock(calls_mu);
    auto it = calls.find(call);
    open = it != calls.end();
    if (open) {
      it->second.running = false;
      // Moved, not copied: once calls_mu is released this thread holds no reference
      // to the status, so the thread that reads it and drops the last reference is
      // ordered by calls_mu alone (see tests/tsan_suppressions.cpp for why a shared
      // absl::Status reference count is not enough for ThreadSanitizer).
      it->second.last_error = std::move(reply).status();
    }
  }
  if (!open) {  // timed out (already dead-lettered) or cancelled: no more tries
    (void)m.Ack();
    return;
  }
  (void)m.Nak();  // redelivered, or after max_deliver dead-lettered (on_dead_letter)
}

std::future<absl::StatusOr<Buffer>> Engine::Call(std::string_view fn_id, Buffer payload,
                                                 absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout > kMaxDuration) {
    std::promise<absl::StatusOr<Buffer>> promise;
    promise.set_value(absl::InvalidArgumentError("call to function " + QuoteValue(fn_id) +
                                                 ": timeout " + absl::FormatDuration(timeout) +
                                                 " is invalid (> 0 and up to 365 days)"));
    return promise.get_future();
  }
  Event call;
  call.payload = std::move(payload);
  call.ttl = timeout;
  return StartCall(fn_id, std::move(call)).reply;
}

Event Engine::Impl::CallDeadLetter(std::uint64_t id, const CallState& call,
                                   std::string_view reason, std::string description) {
  Event e = call.call;  // shares the payload Buffer; keeps the caller's headers
  e.headers.Set(std::string(kOriginalSubjectHeader), std::move(e.subject));
  e.subject = "fn." + call.fn + ".dead";
  e.msg_id = "call-" + std::to_string(id);
  e.attempt = call.attempts;
  e.ttl = absl::ZeroDuration();
  e.deadline = absl::InfiniteFuture();
  e.headers.Set(std::string(kCallIdHeader), std::to_string(id));
  e.headers.Set(std::string(kDeadLetterReasonHeader), std::string(reason));
  e.headers.Set(std::string(kDeadLetterDescriptionHeader), std::move(description));
  e.headers.Set(std::string(kDeliveryCountHeader), std::to_string(call.attempts));
  e.headers.Set(std::string(kOriginalTtlHeader),
                std::to_string(absl::ToInt64Nanoseconds(call.timeout)));
  return e;
}

PendingCall Engine::StartCall(std::string_view fn_id, Event call) {
  PendingCall pending;
  std::promise<absl::StatusOr<Buffer>> promise;
  pending.reply = promise.get_future();
  const std::string fn(fn_id);
  auto fail = [&](absl::Status s) {
    promise.set_value(std::move(s));
    return std::move(pending);
  };
  // The time limit: ttl, or what is left of the wall-clock deadline, whichever is
  // shorter.
  if (call.ttl < absl::ZeroDuration() || call.ttl > kMaxDuration) {
    return fail(absl::InvalidArgumentError("call to function " + QuoteValue(fn) + ": ttl " +
                                           absl::FormatDuration(call.ttl) +
                                           " is invalid (> 0 and up to 365 days)"));
  }
  absl::Duration timeout = call.ttl > absl::ZeroDuration() ? call.ttl : absl::InfiniteDuration();
  if (call.deadline != absl::InfiniteFuture()) {
    const absl::Duration left = call.deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return fail(absl::DeadlineExceededError(
          "call to function " + QuoteValue(fn) + ": its deadline " +
          absl::FormatTime(absl::RFC3339_full, call.deadline, absl::UTCTimeZone()) +
          " has passed"));
    }
    timeout = std::min(timeout, std::min(left, kMaxDuration));
  }
  if (timeout == absl::InfiniteDuration()) {
    return fail(absl::InvalidArgumentError("call to function " + QuoteValue(fn) +
                                           " has no time limit: set Event::ttl or "
                                           "Event::deadline"));
  }
  Impl::Function* function;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return fail(absl::CancelledError("engine is closed"));
    function = impl_->FindFunction(fn);
    if (function == nullptr) {
      return fail(absl::NotFoundError("function " + QuoteValue(fn) + " is not registered"));
    }
  }
  // The subject: one the function serves.
  if (call.subject.empty()) {
    if (!function->subjects.front().is_literal()) {
      return fail(absl::InvalidArgumentError(
          "call to function '" + fn + "' has no subject, and the function's first subject " +
          QuoteValue(function->subjects.front().text()) + " is a pattern"));
    }
    call.subject = function->subjects.front().text();
  } else if (std::none_of(function->subjects.begin(), function->subjects.end(),
                          [&](const SubjectPattern& p) { return p.Matches(call.subject); })) {
    return fail(absl::InvalidArgumentError("call to function '" + fn + "': subject " +
                                           QuoteValue(call.subject) +
                                           " is not one the function serves"));
  }
  call.ttl = timeout;
  // What Publish would refuse (qos, codec, msg_id, ...) is refused now, before the
  // call has an id.
  if (absl::Status s = Impl::ValidateEvent(call); !s.ok()) {
    return fail(absl::Status(s.code(), "call to function '" + fn + "': " + std::string(s.message())));
  }
  // The time limit runs from here: admission's own time counts against it.
  const std::int64_t deadline =
      engine_internal::SatAdd(impl_->clock->NowNanos(), absl::ToInt64Nanoseconds(timeout));
  // Admission, before the call is queued: a refusal is the call's end. An admit that
  // throws refuses the call as Internal (nothing escapes StartCall).
  absl::Status refusal;
  absl::StatusCode refusal_code = absl::StatusCode::kInvalidArgument;
  if (function->admit) {
    try {
      refusal = function->admit(call);
    } catch (const std::exception& e) {
      refusal = absl::InternalError(std::string("admit threw: ") + e.what());
      refusal_code = absl::StatusCode::kInternal;
    } catch (...) {
      refusal = absl::InternalError("admit threw a non-standard exception");
      refusal_code = absl::StatusCode::kInternal;
    }
    if (!refusal.ok() && refusal.message().empty()) {
      refusal = absl::Status(refusal.code(), "(admit gave no reason)");
    }
  }
  std::uint64_t id;
  std::optional<Event> dead_letter;
  // A limit that ran out during admission ends the call here, before any worker
  // could run it (the timer would race the worker for it).
  const bool expired = refusal.ok() && impl_->clock->NowNanos() >= deadline;
  {
    std::lock_guard lock(impl_->calls_mu);
    id = impl_->next_call++;
    pending.id = id;
    if (!refusal.ok() || expired) {
      Impl::CallState ended;
      ended.fn = fn;
      ended.call = call;
      ended.timeout = timeout;
      dead_letter = expired ? Impl::CallDeadLetter(id, ended, "expired", "call timeout during admission")
                            : Impl::CallDeadLetter(id, ended, "refused", std::string(refusal.message()));
    } else {
      Impl::CallState& state = impl_->calls[id];
      state.promise = std::move(promise);
      state.fn = fn;
      state.call = std::move(call);
      state.timeout = timeout;
      state.timer = impl_->call_wheel->Schedule(deadline, id);
      impl_->has_calls.store(true, std::memory_order_release);
    }
  }
  if (dead_letter) {
    const std::string subject(dead_letter->headers.Get(kOriginalSubjectHeader).value_or(""));
    if (expired) {
      promise.set_value(absl::DeadlineExceededError(
          "call " + std::to_string(id) + " to function '" + fn + "' timed out after " +
          absl::FormatDuration(timeout) + " (in admission, 0 tries)"));
    } else {
      promise.set_value(absl::Status(refusal_code, "call " + std::to_string(id) + " to function '" +
                                                       fn + "' on '" + subject +
                                                       "' refused: " + std::string(refusal.message())));
    }
    (void)Publish(*std::move(dead_letter), PublishMode::kInternal);
    return pending;
  }
  impl_->WakeTimer(deadline);
  // Behind the calls already waiting for room, then published if there is room now.
  {
    std::lock_guard lock(function->mu);
    function->backlog.push_back(id);
    function->has_backlog.store(true, std::memory_order_release);
  }
  FlushCalls(*function);
  return pending;
}

absl::Status Engine::CancelCall(std::uint64_t id, std::string_view reason) {
  std::lock_guard lock(impl_->calls_mu);
  auto it = impl_->calls.find(id);
  if (it == impl_->calls.end()) {
    return absl::NotFoundError("call " + std::to_string(id) +
                               " is not open (it ended, or no such call was made)");
  }
  // A queued copy finds no open call when a worker pulls it and is acked unrun
  // (ServeCall); a running handler's result finds none and is dropped.
  it->second.promise.set_value(absl::CancelledError("call " + std::to_string(id) +
                                                    " to function '" + it->second.fn +
                                                    "' cancelled: " + std::string(reason)));
  impl_->call_wheel->Cancel(it->second.timer);
  impl_->calls.erase(it);
  impl_->has_calls.store(!impl_->calls.empty(), std::memory_order_release);
  return absl::OkStatus();
}

void Engine::FlushCalls(engine_internal::FunctionState& fn) {
  // One flusher at a time keeps the arrival order. A thread that finds another
  // flushing leaves the work to it, but first counts a request: the flusher, once
  // done, flushes again when a request came meanwhile (a worker's pull may have made
  // room after the flusher found the queue full). All seq_cst: the request counted
  // before the claim attempt, the flag cleared before the requests are read.
  fn.flush_requests.fetch_add(1, std::memory_order_seq_cst);
  for (;;) {
    bool idle = false;
    if (!fn.flushing.compare_exchange_strong(idle, true, std::memory_order_seq_cst)) return;
    const std::uint64_t seen = fn.flush_requests.load(std::memory_order_seq_cst);
    FlushCallsOnce(fn);
    fn.flushing.store(false, std::memory_order_seq_cst);
    if (fn.flush_requests.load(std::memory_order_seq_cst) == seen) return;
  }
}

void Engine::FlushCallsOnce(engine_internal::FunctionState& fn) {
  for (;;) {
    std::uint64_t id;
    {
      std::lock_guard lock(fn.mu);
      if (fn.backlog.empty()) {
        fn.has_backlog.store(false, std::memory_order_release);
        return;
      }
      id = fn.backlog.front();  // only this thread pops
    }
    Event e;
    bool open;
    {
      std::lock_guard lock(impl_->calls_mu);
      auto it = impl_->calls.find(id);
      open = it != impl_->calls.end();
      if (open) {
        e = it->second.call;  // shares the payload Buffer
        e.msg_id = "call-" + std::to_string(id);
        e.ttl = it->second.timeout;
        e.deadline = absl::InfiniteFuture();  // the call's own timer enforces it
        e.headers.Set(std::string(kCallIdHeader), std::to_string(id));
      }
    }
    absl::Status failed;
    if (open) {
      // Into the function's own stream alone: another stream whose subjects match
      // (an audit log) or another function serving the same subject never sees it.
      absl::StatusOr<PublishAck> ack = Publish(std::move(e), PublishMode::kCall, fn.stream);
      // Full (the function's queue, or its stream held by a blocked Publish): it
      // stays first; the next pull of a worker or the next timer run retries.
      if (ack.status().code() == absl::StatusCode::kResourceExhausted &&
          !impl_->closed.load(std::memory_order_acquire)) {
        return;
      }
      failed = ack.status();
    }
    {
      std::lock_guard lock(fn.mu);
      fn.backlog.pop_front();
    }
    if (!failed.ok()) impl_->CompleteCall(id, std::move(failed));
  }
}

}  // namespace inferq
