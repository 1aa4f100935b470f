// File: src/engine/engine_impl.hpp (not API)
//
// Engine::Impl, the state behind the Engine facade (streams, consumers, memory by
// NUMA node, the timer thread, request/reply, the dead-letter outbox, flow control),
// and FunctionState, one registered function. Included by the engine's .cpp files
// only.
//
// Thread safety: each field says what guards it (config_mu, calls_mu, timer_mu,
// outbox_mu, or an atomic).
#pragma once

#include <atomic>
#include <condition_variable>
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "consumer_state.hpp"
#include "delivery.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/engine/lifecycle.hpp"
#include "inferq/event/codec.hpp"
#include "inferq/memory/topology.hpp"
#include "inferq/routing/subject.hpp"
#include "inferq/sched/flow_control.hpp"
#include "inferq/sched/timer_wheel.hpp"
#include "node_pools.hpp"
#include "route_index.hpp"
#include "stream_state.hpp"
#include "cursor.hpp"
#include "per_thread_counters.hpp"

namespace inferq {

namespace engine_internal {

// A registered function (Engine::RegisterFunction): calls wait in `backlog` (ids, in
// arrival order) until its queue takes them (Engine::Call never waits); one thread at
// a time flushes it (Engine::FlushCalls).
struct FunctionState {
  std::string id;
  std::vector<SubjectPattern> subjects;  // what calls may be published on; fixed
  CallAdmission admit;                   // FunctionOptions::admit; fixed
  StreamState* stream = nullptr;         // "FN_<id>", where its calls are published; fixed
  std::mutex mu;
  std::deque<std::uint64_t> backlog;  // guarded by mu
  std::atomic<bool> has_backlog{false};
  std::atomic<bool> flushing{false};  // a thread is in FlushCallsOnce
  std::atomic<std::uint64_t> flush_requests{0};
};

}  // namespace engine_internal

using engine_internal::ConsumerState;
using engine_internal::Handle;
using engine_internal::Lane;
using engine_internal::StoredMessage;
using engine_internal::StreamState;

struct Engine::Impl final : engine_internal::ConsumerHost {
  Engine* engine = nullptr;  // the facade that owns this (set by its constructor)

  const Clock* clock;
  // Every stream's subject patterns: Match gives the capturing streams in creation
  // order, each once. Publish never waits for AddStream (Left-Right, route_index.hpp);
  // AddStream changes it under config_mu.
  engine_internal::RouteIndex<StreamState*> routes;
  std::atomic<bool> closed{false};
  // EngineOptions::trace: null when no sink is set (tracing off).
  std::unique_ptr<engine_internal::Tracer> tracer;

  // Memory by NUMA node. Declared before the streams and consumers so that it is
  // destroyed after them (their records and lanes hold blocks of these pools).
  Topology topology;
  std::vector<std::string> node_binding;                    // per node, for Stats
  std::vector<std::unique_ptr<engine_internal::NodePools>> node_pools;

  engine_internal::NodePools& PoolsFor(int node) {
    if (node < 0 || static_cast<std::size_t>(node) >= node_pools.size()) {
      node = node_pools.size() == 1 ? 0 : topology.CurrentNode();
    }
    return *node_pools[static_cast<std::size_t>(node)];
  }

  // Engine::AddStatsSource: the attached sources, in the order added. Stats() runs
  // them under stats_sources_mu (config_mu let go), so that RemoveStatsSource waits for
  // a source still running.
  struct StatsSourceEntry {
    std::uint64_t id;
    std::string name;
    Engine::StatsSource fn;
  };
  std::mutex stats_sources_mu;
  std::vector<StatsSourceEntry> stats_sources;  // guarded by stats_sources_mu
  std::uint64_t next_stats_source = 1;           // guarded by stats_sources_mu
  std::mutex config_mu;  // serializes AddStream / AddConsumer / Close
  std::vector<std::unique_ptr<StreamState>> streams;         // guarded by config_mu
  absl::flat_hash_map<std::string, StreamState*> stream_by_name;  // guarded by config_mu
  std::vector<std::unique_ptr<ConsumerState>> consumers;     // guarded by config_mu
  // Consumers DeleteConsumer removed: kept until the engine goes, since Consumer,
  // Member and Message handles (and a timer run's snapshot) still point to them.
  // Guarded by config_mu.
  std::vector<std::unique_ptr<ConsumerState>> deleted_consumers;
  // Streams DeleteStream removed, for the same reason (Messages, consumers, a
  // publish that routed to it before, the outbox). Guarded by config_mu.
  std::vector<std::unique_ptr<StreamState>> deleted_streams;
  // File streams being recovered by AddStream (outside config_mu): their normal
  // directories and names, so that a nested one added meanwhile is refused before
  // either writes a file. Guarded by config_mu.
  std::vector<std::pair<std::filesystem::path, std::string>> opening_dirs;

  std::atomic<std::uint64_t> unrouted{0}, rejected{0}, invalid{0};
  // Counts taken on every publish, per thread (no locked instruction):
  // [kRouteCacheHit]: publishes whose subject this thread's route cache held
  // (RouteIndex::MatchCached); [kRouteCacheMiss]: those that searched the subject
  // index (EngineStats::route_cache_hits, route_cache_misses); [kPublished]:
  // EngineStats::published.
  enum PublishCount : std::size_t { kRouteCacheHit, kRouteCacheMiss, kPublished };
  engine_internal::PerThreadCounters<3> publish_counts;
  // Payload conversion (EngineOptions::codecs); compress_dictionary points into
  // codecs.dictionaries (nullptr = none).
  EngineCodecOptions codecs;
  const ZstdDictionary* compress_dictionary = nullptr;
  std::atomic<std::uint64_t> codec_conversions{0};

  // `event` with its payload in codec `target` for consumer `consumer` (named in the
  // error). FailedPrecondition when the payload's dictionary is missing, else
  // InvalidArgument (see Engine::Publish).
  absl::StatusOr<std::shared_ptr<const Event>> Convert(const Event& event, PayloadCodec target,
                                                       const ConsumerState& consumer) {
    absl::StatusOr<CodedPayload> p = TranscodePayload(
        event, target,
        {.zstd_level = codecs.zstd_level,
         .dictionary = compress_dictionary,
         .dictionaries = codecs.dictionaries.get(),
         .max_payload_bytes = codecs.max_payload_bytes});
    if (!p.ok()) {
      const auto name = [](PayloadCodec c) { return c == PayloadCodec::kNone ? "none" : "zstd"; };
      std::string msg = "consumer '" + consumer.config.name + "' of stream '" +
                        consumer.config.stream + "' needs the payload of subject " +
                        QuoteValue(event.subject) + " as " + name(target) + ", but converting it from " +
                        name(event.codec) +
                        (event.dictionary_id != 0
                             ? " (dictionary " + std::to_string(event.dictionary_id) + ")"
                             : std::string()) +
                        " failed: " + std::string(p.status().message());
      return p.status().code() == absl::StatusCode::kNotFound
                 ? absl::FailedPreconditionError(std::move(msg))
                 : absl::InvalidArgumentError(std::move(msg));
    }
    auto out = std::make_shared<Event>(event);
    out->payload = std::move(p->bytes);
    out->codec = p->codec;
    out->dictionary_id = p->dictionary_id;
    codec_conversions.fetch_add(1, std::memory_order_relaxed);
    return std::shared_ptr<const Event>(std::move(out));
  }
  std::unique_ptr<DualChannelController> flow;  // EngineOptions::flow_control; may be null
  // Dead letters whose stream's mutex was taken (Publish kInternal never waits).
  std::mutex outbox_mu;
  std::deque<std::pair<StreamState*, Event>> outbox;  // guarded by outbox_mu
  // (has_outbox, set when outbox is not empty, is ConsumerHost's.)
  Lifecycle* lifecycle = nullptr;

  // Timers (ack_wait, stalled members): a background thread unless manual_timers.
  bool manual_timers = false;
  // Consumers that CursorEligible takes become cursor consumers (cursor.hpp):
  // INFERQ_CURSOR_CONSUMERS=1 in the environment at Create, while the engine-core
  // redesign is under way.
  bool cursor_consumers = false;
  std::mutex timer_mu;
  std::condition_variable timer_cv;
  bool timer_stop = false;                       // guarded by timer_mu
  std::int64_t timer_interval_ns = 100'000'000;  // guarded by timer_mu
  // An earlier run some timer asked for (steady ns). Lowered without the lock (a
  // publish with a queue timeout must not take a global lock); a lowering notifies
  // under timer_mu, so the thread cannot miss it between its check and its wait.
  std::atomic<std::int64_t> timer_wake_steady_ns{INT64_MAX};
  std::thread timer;                             // started under config_mu
  std::mutex run_timers_mu;                      // one RunTimers at a time
  std::vector<ConsumerState*> timer_consumers;   // RunTimers' scratch; run_timers_mu
  std::vector<StreamState*> timer_streams;       // RunTimers' scratch; run_timers_mu
  std::atomic<std::size_t> consumer_count{0};    // consumers.size(), readable without config_mu
  // Per lane, what the timer saw last: (delivered count, since when unchanged while
  // items were queued). Guarded by run_timers_mu.
  absl::flat_hash_map<const Lane*, std::pair<std::uint64_t, std::int64_t>> stall_marks;

  // Asks the timer thread to run at least every `interval_ns` (the interval only
  // shrinks) and starts it if it is not running. No-op with manual timers. Requires
  // config_mu (as StartTimer).
  void RunTimersEvery(std::int64_t interval_ns) {
    if (manual_timers) return;
    {
      std::lock_guard tl(timer_mu);
      timer_interval_ns = std::min(timer_interval_ns, interval_ns);
    }
    timer_cv.notify_all();
    StartTimer([e = engine] { e->RunTimers(); });
  }

  // Starts the timer thread (once): it runs `run` every timer_interval_ns, or
  // earlier when WakeTimer asks. Requires config_mu (or the constructor).
  void StartTimer(std::function<void()> run) {
    if (manual_timers || timer.joinable()) return;
    timer = std::thread([this, run = std::move(run)] {
      std::unique_lock tl(timer_mu);
      std::int64_t next_run = SteadyClock::Now() + timer_interval_ns;
      while (!timer_stop) {
        const std::int64_t until =
            std::min(next_run, timer_wake_steady_ns.load(std::memory_order_relaxed));
        const std::int64_t now = SteadyClock::Now();
        if (now < until) {
          timer_cv.wait_for(tl, std::chrono::nanoseconds(until - now));
          continue;  // woken early (a nearer wake-up, or stop): look again
        }
        timer_wake_steady_ns.store(INT64_MAX, std::memory_order_relaxed);
        tl.unlock();
        run();
        tl.lock();
        next_run = SteadyClock::Now() + timer_interval_ns;
      }
    });
  }

  // ConsumerHost: dead letters, timer wake-ups, the outbox.
  absl::Status PublishDeadLetter(Event e) override {
    return engine->Publish(std::move(e), PublishMode::kInternal).status();
  }
  void FlushOutbox() override { engine->FlushOutbox(); }
  // Asks the timer thread to run by `due_ns` (engine clock). No-op with manual timers.
  void WakeTimer(std::int64_t due_ns) override {
    if (manual_timers) return;
    const std::int64_t delta = std::max<std::int64_t>(0, engine_internal::SatSub(due_ns, clock->NowNanos()));
    const std::int64_t now = SteadyClock::Now();
    const std::int64_t at = delta > INT64_MAX - now ? INT64_MAX : now + delta;
    std::int64_t cur = timer_wake_steady_ns.load(std::memory_order_relaxed);
    do {
      if (at >= cur) return;
    } while (!timer_wake_steady_ns.compare_exchange_weak(cur, at, std::memory_order_relaxed));
    {
      std::lock_guard lock(timer_mu);
    }
    timer_cv.notify_all();
  }

  // Engine::Call: open calls by id, their timeouts, and the functions' workers.
  struct CallState {
    std::promise<absl::StatusOr<Buffer>> promise;
    std::string fn;
    Event call;                   // as the caller made it (subject resolved)
    absl::Duration timeout;
    std::uint32_t attempts = 0;   // tries started
    bool running = false;         // a worker is in the handler
    absl::Status last_error;      // of the last failed try
    TimerId timer{};              // its timeout in call_wheel
  };
  std::mutex calls_mu;
  absl::flat_hash_map<std::uint64_t, CallState> calls;        // guarded by calls_mu
  std::uint64_t next_call = 1;                                 // guarded by calls_mu
  std::unique_ptr<TimerWheel<std::uint64_t>> call_wheel;       // guarded by calls_mu
  std::atomic<bool> has_calls{false};
  using Function = engine_internal::FunctionState;
  std::vector<std::unique_ptr<Function>> functions;            // guarded by config_mu
  // The functions' worker threads; Close leaves them to finish their handler, and
  // ~Engine joins them.
  std::vector<std::thread> function_workers;                   // guarded by config_mu
  absl::flat_hash_map<std::string, Function*> function_by_id;  // guarded by config_mu
  Function* FindFunction(std::string_view id) {  // requires config_mu; O(1) (Call uses it)
    auto it = function_by_id.find(absl::string_view(id.data(), id.size()));
    return it == function_by_id.end() ? nullptr : it->second;
  }

  // Completes call `id` with `result` if it is still open; false when it was not.
  bool CompleteCall(std::uint64_t id, absl::StatusOr<Buffer> result) {
    std::lock_guard lock(calls_mu);
    auto it = calls.find(id);
    if (it == calls.end()) return false;
    it->second.promise.set_value(std::move(result));
    call_wheel->Cancel(it->second.timer);
    calls.erase(it);
    return true;
  }

  // Requires config_mu. O(1): one stream per tenant or model is a normal layout.
  StreamState* FindStream(std::string_view name) {
    auto it = stream_by_name.find(absl::string_view(name.data(), name.size()));
    return it == stream_by_name.end() ? nullptr : it->second;
  }

  // The publish pipeline (publish.cpp), one named step per function:
  // CheckEvent -> Route -> ConvertBeforeStore, then for each capturing stream
  // PublishToStream: LockForPublish -> StreamState::Admit -> SelectTargets ->
  // CheckLanes -> ConvertUnderLock -> AllocateRecord -> StreamState::Append ->
  // EnqueueTargets; FinishPublish makes the PublishAck. publish.cpp, the only file that
  // calls them, defines them `inline`, so that the compiler may fold the steps into
  // Publish's body: as separate calls they cost more than some of the steps
  // (BENCHMARKS.md, "The engine's data path in instructions").
  // How one publish behaves, from its Engine::PublishMode.
  struct PublishFlags {
    bool wait = false;            // kWait: waits for a stream's mutex and a full lane
    bool no_wait = false;         // kTry, kCall: refuses instead of waiting
    bool internal = false;        // kInternal: a dead letter (see PublishMode)
    bool counted = true;          // counted in EngineStats (not internal)
    bool count_refusals = true;   // refusals counted (not kCall)
  };
  // One consumer member that takes the event (plus shadow copies).
  struct Target {
    ConsumerState* consumer;
    std::uint32_t member;
    bool shadow;
  };
  using Targets = absl::InlinedVector<Target, 8>;
  using Converted = engine_internal::ConvertedEvents;
  // A capturing stream, with the mask of its consumers whose filter matches the
  // subject as this thread's route cache holds it (RouteIndex invariant 5).
  using CapturingStream = engine_internal::RouteIndex<StreamState*>::Route;
  using Capturing = absl::InlinedVector<CapturingStream, 4>;
  // The event being published: as given until the first stream's record takes it
  // (moved into StoredMessage::own); `first` is that record when more streams follow,
  // whose records point at its event.
  struct PublishedEvent {
    Event& event;
    std::shared_ptr<StoredMessage> first;
    std::uint64_t bytes;            // Event::StoredSize
    std::int64_t event_limit_ns;    // its own queue limit (EventLimitNs)
    // The stream being published to is the last capturing one: its record takes the
    // conversions instead of copying them, and `first` need not be kept.
    bool last = false;
    // The caller's record that `event` lives in, made before the publish (a view's:
    // MakeRecord); nullptr: none. The first stream that stores the event takes the
    // record from there (AllocateRecord, TakePremade), so the event is never moved.
    // Once it is taken, `event` is valid only while a record holds it: nothing reads
    // `event` after the last stream's PublishToStream.
    std::shared_ptr<StoredMessage>* premade = nullptr;
    // Valid until the first record takes the event (AllocateRecord), and after it
    // only when `first` was kept (more streams follow).
    const Event& current() const { return first ? *first->event : event; }
  };
  // What the streams did with one publish so far.
  struct PublishTally {
    PublishAck ack;
    std::uint32_t deferred = 0;     // internal publishes left for FlushOutbox
    absl::Status first_refusal;
    std::uint32_t undelivered = 0;  // queueing failed because the engine closed
    // File streams that stored the event: their log and its sequence there, and the
    // removed log's tx of what max_msgs_per_subject took out for it (0: nothing),
    // synced (StreamLog::Sync) after every stream's mutex is let go.
    absl::InlinedVector<engine_internal::SyncPoint, 2> syncs;
  };
  static PublishFlags FlagsOf(PublishMode mode);
  static void Count(std::atomic<std::uint64_t>& counter, const PublishFlags& flags);
  // InvalidArgument for an invalid subject, msg_id, ttl, qos or codec (Engine::Publish).
  // check_subject false: the subject was checked when this thread first routed it.
  static absl::Status CheckEvent(const Event& event, bool check_subject);
  // CheckEvent(event, true), callable outside publish.cpp (StartCall).
  static absl::Status ValidateEvent(const Event& event);
  // The event's own queue limit (ttl, deadline), ns from publish; INT64_MAX = none.
  [[gnu::always_inline]] static std::int64_t EventLimitNs(const Event& event);
  // The streams that capture `subject` (only `only` when set); false when none does.
  // matched: *capturing already holds the subject's streams (RouteIndex::MatchCached).
  bool Route(std::string_view subject, StreamState* only, bool matched, Capturing* capturing);
  // Converts the payload for every consumer of the capturing streams that does not
  // accept its codec, once per target codec, before anything is stored.
  // Whether ConvertBeforeStore may have work: a payload, not internal, and a
  // capturing stream with a consumer that restricts codecs. Inline, so that most
  // publishes (no such consumer) skip the call and its Status.
  static bool MayConvert(const Event& event, const Capturing& capturing, const PublishFlags& flags) {
    if (event.payload.empty() || flags.internal) return false;
    for (const CapturingStream& route : capturing) {
      // relaxed: as in ConvertBeforeStore.
      if (route.value->codec_restricted.load(std::memory_order_relaxed) != 0) return true;
    }
    return false;
  }
  absl::Status ConvertBeforeStore(const Event& event, const Capturing& capturing,
                                  const PublishFlags& flags, Converted* converted);
  // Admits, selects and enqueues the event in one stream (`route.value`), or records
  // why not.
  void PublishToStream(const CapturingStream& route, PublishedEvent& pe, Converted& converted,
                       const PublishFlags& flags, PublishTally& tally);
  // PublishToStream's work once the stream's mutex is held (and still held when it
  // returns): Engine::PublishBatch calls it for a run of events into one stream
  // under one lock. Requires route.value->mu.
  void PublishLocked(const CapturingStream& route, PublishedEvent& pe, Converted& converted,
                     const PublishFlags& flags, PublishTally& tally);
  // Takes the stream's mutex as `flags` allow; false when the stream refused (a
  // blocked stream and a publish that must not wait) or deferred (a dead letter,
  // FlushOutbox) the event.
  bool LockForPublish(StreamState& stream, std::unique_lock<engine_internal::StreamMutex>& lock,
                      const Event& incoming, const PublishFlags& flags, PublishTally& tally);
  // A refusal of the event by `stream`: counted in its stats when `count`.
  // `busy`: refused only because TryPublish does not wait (a full lane of a consumer
  // with overflow block, or the stream held by a blocked publisher): counted in
  // PublishAck::streams_busy too.
  static void Refuse(StreamState& stream, absl::Status why, bool count, PublishTally& tally,
                     bool busy = false);
  // Cursor consumers are not selected: each that takes `ev` is a bit of
  // *cursor_targets (CursorState::bit), counted in *explicit_acks.
  // The members of the stream's matching consumers that take `ev` (their selection
  // policies, under the stream's mutex, at `now` of the engine clock). Which
  // consumers' filters match comes from `route`'s mask when it was computed at the
  // stream's present consumers_version, else from StreamState::FilterMask, given back
  // to the route cache (NoteFilters) for the next publish. Requires stream.mu.
  void SelectTargets(StreamState& stream, const CapturingStream& route, const Event& ev,
                     std::int64_t now, Targets* targets, std::uint32_t* explicit_acks,
                     std::uint64_t* cursor_targets);
  // ResourceExhausted naming the lane when a target's full lane refuses the publish
  // (kReject, or kBlock for a publish that must not wait).
  // `busy` is set when the refusal is a kBlock lane that a TryPublish does not wait for.
  static absl::Status CheckLanes(const StreamConfig& cfg, const Event& ev,
                                 const Targets& targets, const PublishFlags& flags, bool* busy);
  // The conversions ConvertBeforeStore did not make (a consumer added since, a dead
  // letter). Requires stream.mu.
  absl::Status ConvertUnderLock(const Event& ev, const Targets& targets, Converted* converted);
  // The stream's record of the event (holding it, moved from pe.event, for the first
  // stream; pointing at the first record's event for later ones), from the pools of
  // the first target's node; nullptr, with nothing moved, when out of memory.
  static std::shared_ptr<StoredMessage> TakePremade(PublishedEvent& pe);
  std::shared_ptr<StoredMessage> AllocateRecord(StreamState& stream, PublishedEvent& pe,
                                                const Targets& targets);
  // Places the first delivery of `stored` on each target's lane, applying overflow
  // policies; returns the explicit-ack deliveries that could not be queued (closed).
  // With one target, the delivery takes `stored` (a reference count neither taken
  // nor dropped) and `stored` is left empty once it is queued or parked; it holds
  // the record again when the delivery was not (the caller must not read the record
  // otherwise: a member may have acked and let go of it).
  std::uint32_t EnqueueTargets(StreamState& stream, std::shared_ptr<StoredMessage>& stored,
                               const Targets& targets, std::int64_t now,
                               std::int64_t event_limit_ns, const PublishFlags& flags,
                               PublishTally& tally);
  absl::StatusOr<PublishAck> FinishPublish(PublishTally& tally, const PublishFlags& flags);

  // Parts of the timer run (timers.cpp; Engine::RunTimers calls them in order).
  // Completes the calls whose timeout passed with DeadlineExceeded and returns their
  // dead letters, for the caller to publish.
  std::vector<Event> ExpireCalls();
  // The dead letter of call `id` (calls.cpp): subject "fn.<fn>.dead", the call's
  // payload and headers, the reason headers. Requires calls_mu when `call` is in
  // `calls`.
  static Event CallDeadLetter(std::uint64_t id, const CallState& call, std::string_view reason,
                              std::string description);
  // Feeds flow control the bytes the streams keep and the highest lane delay.
  void UpdateFlowControl(const std::vector<ConsumerState*>& consumers);
  // Moves queued work off the members of `c` that pulled nothing for its ack wait.
  void MoveOffStalledMembers(ConsumerState& c, std::int64_t now);
  // Asks the timer thread to wake for the earliest timer still pending.
  void WakeForNextTimer(const std::vector<ConsumerState*>& consumers);

  // One try of a call taken off its function's queue by a worker: runs the handler
  // and completes the call with its reply, or records its error and naks the message
  // (redelivered for another try, or dead-lettered after max_deliver). A message
  // that is no call, or whose call already ended, is acked.
  void ServeCall(Message& m, const FunctionHandler& handler);
};

// Inline here, not in settle.cpp: both pull paths call it per message.
inline void Message::Deliver(std::shared_ptr<engine_internal::StoredMessage> msg, ConsumerState* consumer,
                      std::uint32_t member, std::uint32_t attempt, std::int64_t now, bool shadow) {
  Release();
#ifndef NDEBUG
  consumer->live_messages.fetch_add(1, std::memory_order_relaxed);
#endif
  msg_ = std::move(msg);
  consumer_ = consumer;
  deliver_ns_ = now;
  member_ = member;
  attempt_ = attempt;
  prior_ = 0;
  ack_tx_ = 0;
  out_tx_ = 0;
  shadow_ = shadow;
  acked_.store(false, std::memory_order_relaxed);
  span_id_ = {};
  batch_ = 0;
}

}  // namespace inferq
