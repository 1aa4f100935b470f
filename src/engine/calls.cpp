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
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"

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
  const std::string subject = "fn." + id;
  if (absl::Status s = AddStream({.name = stream, .subjects = {subject},
                                  .retention = RetentionPolicy::kInterest});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AddStream({.name = stream + "_DLQ", .subjects = {subject + ".dead"},
                                  .max_msgs = 10'000});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Consumer> consumer =
      AddConsumer({.stream = stream,
                   .name = "handler",
                   .members = options.workers,
                   .lane_capacity = options.queue_capacity,
                   .max_deliver = options.max_deliver,
                   .dead_letter_subject = subject + ".dead"});
  if (!consumer.ok()) return consumer.status();
  ConsumerState* state = consumer->state_;
  // The call's own timer enforces its timeout, queued or running: the consumer does
  // not also expire it by the event's ttl.
  state->enforce_event_ttl = false;
  Impl* impl = impl_.get();
  state->on_dead_letter = [impl, id](const Event& e, std::uint32_t attempt, std::string_view reason) {
    const std::uint64_t call = CallIdOf(e);
    absl::Status error;
    {
      std::lock_guard lock(impl->calls_mu);
      auto it = impl->calls.find(call);
      if (it == impl->calls.end()) return;
      const absl::Status& last = it->second.last_error;
      const std::string why = "function '" + id + "' failed after " + std::to_string(attempt) +
                              (attempt == 1 ? " try" : " tries") + " (" + std::string(reason) + ")";
      error = last.ok() ? absl::InternalError(why)
                        : absl::Status(last.code(), why + ": " + std::string(last.message()));
    }
    // Moved, not copied: the caller's thread then holds the only reference to the
    // message it reads, and frees it (see tests/tsan_suppressions.cpp).
    impl->CompleteCall(call, std::move(error));
  };
  std::lock_guard lock(impl_->config_mu);
  impl_->functions.push_back(std::make_unique<Impl::Function>());
  Impl::Function* fn = impl_->functions.back().get();
  fn->id = id;
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
      it->second.last_error = reply.status();
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
  std::promise<absl::StatusOr<Buffer>> promise;
  std::future<absl::StatusOr<Buffer>> future = promise.get_future();
  const std::string fn(fn_id);
  if (timeout <= absl::ZeroDuration() || timeout > kMaxDuration) {
    promise.set_value(absl::InvalidArgumentError("call to function " + QuoteValue(fn) +
                                                 ": timeout " + absl::FormatDuration(timeout) +
                                                 " is invalid (> 0 and up to 365 days)"));
    return future;
  }
  Impl::Function* function;
  {
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) {
      promise.set_value(absl::CancelledError("engine is closed"));
      return future;
    }
    function = impl_->FindFunction(fn);
    if (function == nullptr) {
      promise.set_value(absl::NotFoundError("function " + QuoteValue(fn) + " is not registered"));
      return future;
    }
  }
  const std::int64_t deadline =
      engine_internal::SatAdd(impl_->clock->NowNanos(), absl::ToInt64Nanoseconds(timeout));
  std::uint64_t id;
  {
    std::lock_guard lock(impl_->calls_mu);
    id = impl_->next_call++;
    Impl::CallState& call = impl_->calls[id];
    call.promise = std::move(promise);
    call.fn = fn;
    call.payload = payload;
    call.timeout = timeout;
    call.timer = impl_->call_wheel->Schedule(deadline, id);
    impl_->has_calls.store(true, std::memory_order_release);
  }
  impl_->WakeTimer(deadline);
  // Behind the calls already waiting for room, then published if there is room now.
  {
    std::lock_guard lock(function->mu);
    function->backlog.push_back(id);
    function->has_backlog.store(true, std::memory_order_release);
  }
  FlushCalls(*function);
  return future;
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
        e.subject = "fn." + fn.id;
        e.msg_id = "call-" + std::to_string(id);
        e.ttl = it->second.timeout;
        e.headers.Set(std::string(kCallIdHeader), std::to_string(id));
        e.payload = it->second.payload;  // shares the Buffer
      }
    }
    absl::Status failed;
    if (open) {
      absl::StatusOr<PublishAck> ack = Publish(std::move(e), PublishMode::kCall);
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
