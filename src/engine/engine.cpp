// File: src/engine/engine.cpp
//
// The Engine facade: Create, the destructor, AddStream, AddConsumer, SetReward and
// Close. The parts of the engine are in the files named for them (publish.cpp,
// delivery.cpp, settle.cpp, pull.cpp, timers.cpp, calls.cpp, stats.cpp,
// dead_letter.cpp; state in consumer_state.hpp, stream_state.hpp, engine_impl.hpp).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <new>
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

// One arena per real NUMA node for the whole process: mimalloc 2.0.9 cannot take an
// arena back and holds at most 64, so engines share them. nullptr when none can be
// made (built without mimalloc); `why` then says so.
NumaArena* ProcessArena(const Topology& topology, int node_index, std::string* why) {
  static std::mutex mu;
  static std::vector<std::pair<int, std::unique_ptr<NumaArena>>> arenas;
  const int os_index = topology.nodes()[static_cast<std::size_t>(node_index)].index;
  std::lock_guard lock(mu);
  for (auto& [idx, arena] : arenas) {
    if (idx == os_index) {
      *why = arena->Stats().binding;
      return arena.get();
    }
  }
  // Address space only (MAP_NORESERVE): pages are used as the pools grow. When it is
  // used up, the pools take chunks from operator new (FixedPoolStats says so).
  absl::StatusOr<std::unique_ptr<NumaArena>> arena =
      NumaArena::Create(topology, node_index, std::size_t{16} << 30);
  if (!arena.ok()) {
    *why = "no arena (" + std::string(arena.status().message()) + "): operator new";
    return nullptr;
  }
  *why = (*arena)->Stats().binding;
  arenas.emplace_back(os_index, *std::move(arena));
  return arenas.back().second.get();
}

}  // namespace

namespace {

// What Engine::Create refuses (see engine.hpp).
absl::Status ValidateOptions(const EngineOptions& options) {
  const EngineCodecOptions& c = options.codecs;
  if (c.zstd_level < 1 || c.zstd_level > 22) {
    return absl::InvalidArgumentError("EngineOptions::codecs.zstd_level " +
                                      std::to_string(c.zstd_level) + " is outside 1..22");
  }
  if (c.max_payload_bytes == 0) {
    return absl::InvalidArgumentError("EngineOptions::codecs.max_payload_bytes is 0");
  }
  if (c.compress_dictionary_id != 0 &&
      (c.dictionaries == nullptr || c.dictionaries->Find(c.compress_dictionary_id) == nullptr)) {
    return absl::InvalidArgumentError("EngineOptions::codecs.compress_dictionary_id " +
                                      std::to_string(c.compress_dictionary_id) +
                                      " is not in codecs.dictionaries");
  }
  if (options.flow_control) {
    if (absl::Status s = DualChannelController::Validate(*options.flow_control); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  // Checked first: a refusal leaves nothing started.
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return std::unique_ptr<Engine>(new Engine(std::move(options)));
}

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->engine = this;
  impl_->codecs = options.codecs;
  if (options.codecs.compress_dictionary_id != 0) {  // found: Create checked it
    impl_->compress_dictionary =
        options.codecs.dictionaries->Find(options.codecs.compress_dictionary_id);
  }
  impl_->clock = options.clock ? options.clock : SteadyClock::Default();
  impl_->manual_timers = options.manual_timers;
  impl_->call_wheel = std::make_unique<TimerWheel<std::uint64_t>>(impl_->clock->NowNanos());
  if (options.flow_control) {
    // Cannot throw: Create checked the config.
    impl_->flow = std::make_unique<DualChannelController>(*options.flow_control);
  }
  impl_->lifecycle = options.lifecycle;
  if (impl_->flow != nullptr || impl_->lifecycle != nullptr) {
    impl_->StartTimer([this] { RunTimers(); });
  }
  if (options.topology != nullptr) {
    impl_->topology = *options.topology;
  } else if (absl::StatusOr<Topology> t = Topology::Detect(); t.ok()) {
    impl_->topology = *std::move(t);
  } else {
    impl_->topology = *Topology::Synthetic("numa:1 pu:1");  // hwloc failed: one node
  }
  for (std::size_t i = 0; i < impl_->topology.node_count(); ++i) {
    std::string why = "synthetic topology: operator new";
    NumaArena* arena = impl_->topology.synthetic()
                           ? nullptr
                           : ProcessArena(impl_->topology, static_cast<int>(i), &why);
    impl_->node_binding.push_back(why);
    impl_->node_pools.push_back(std::make_unique<engine_internal::NodePools>(arena));
  }
}

Engine::~Engine() {
  Close();
  // Function workers finish the handler they are in (Close does not wait for them).
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(impl_->config_mu);
    workers.swap(impl_->function_workers);
  }
  for (std::thread& w : workers) {
    if (w.get_id() == std::this_thread::get_id()) {
      w.detach();  // destroyed from inside its own handler: nothing else can wait for it
    } else {
      w.join();
    }
  }
#ifndef NDEBUG
  // A Message still alive would free its handle into pools destroyed below.
  for (const auto& c : impl_->consumers) {
    const std::int64_t live = c->live_messages.load(std::memory_order_acquire);
    if (live == 0) continue;
    std::fprintf(stderr,
                 "inferq: Engine destroyed while %lld Message(s) of consumer '%s' of stream "
                 "'%s' are alive; destroy every Message before its Engine "
                 "(inferq/engine/engine.hpp: the Engine must outlive them)\n",
                 static_cast<long long>(live), c->config.name.c_str(), c->config.stream.c_str());
    std::abort();
  }
#endif
}

absl::Status Engine::AddStream(const StreamConfig& config) {
  if (absl::Status s = StreamConfig::Validate(config); !s.ok()) return s;
  auto state = std::make_unique<StreamState>();
  for (const std::string& subject : config.subjects) {
    // Cannot fail: Validate parsed every pattern.
    state->patterns.push_back(*SubjectPattern::Parse(subject));
  }
  state->config = config;
  state->keeps_index = StreamState::KeepsIndex(config);
  state->clock = impl_->clock;
  if (config.duplicate_window > absl::ZeroDuration()) {
    state->dedup = std::make_unique<DuplicateWindow>(config.duplicate_window,
                                                     config.duplicate_window_max_entries);
  }

  std::lock_guard lock(impl_->config_mu);
  if (impl_->closed.load()) return absl::CancelledError("engine is closed");
  if (impl_->FindStream(config.name) != nullptr) {
    return absl::AlreadyExistsError("stream '" + config.name + "' already exists");
  }
  StreamState* raw = state.get();
  impl_->stream_by_name.emplace(config.name, raw);
  impl_->streams.push_back(std::move(state));
  // A publisher that finds the stream in the index sees it fully built (the index's
  // switch is seq_cst, after this thread built it).
  impl_->routes.Change([raw](SubjectIndex<StreamState*>& index) {
    for (const SubjectPattern& p : raw->patterns) {
      // Cannot fail: the patterns parsed above, and (pattern, stream) pairs repeat
      // only when a stream lists a pattern twice, which changes nothing.
      (void)index.Insert(p.text(), raw);
    }
    return 0;
  });
  return absl::OkStatus();
}

namespace {

// A consumer's state from its config (checked by ConsumerConfig::Validate): filter,
// selection, group, ack tracking, batchers, timers. Without lanes (AddLanes) and
// without the engine's callbacks.
absl::StatusOr<std::unique_ptr<ConsumerState>> NewConsumerState(const ConsumerConfig& config,
                                                                const Clock* clock) {
  auto state = std::make_unique<ConsumerState>();
  if (!config.filter_subject.empty()) {
    // Cannot fail: Validate parsed it.
    state->filter = *SubjectPattern::Parse(config.filter_subject);
  }
  state->config = config;
  state->clock = clock;
  state->policy = config.selection ? config.selection : std::make_shared<RoundRobinPolicy>();
  state->config.selection = nullptr;  // the consumer's policy is state->policy
  {
    absl::StatusOr<std::unique_ptr<MemberGroup>> g =
        MemberGroup::Create(config.members, config.group, clock);
    if (!g.ok()) return g.status();
    state->group = *std::move(g);
  }
  state->ack_wait_ns = absl::ToInt64Nanoseconds(config.ack_wait);
  for (absl::Duration b : config.backoff) state->backoff_ns.push_back(absl::ToInt64Nanoseconds(b));
  state->tracked = (state->ack_wait_ns > 0 || !state->backoff_ns.empty()) &&
                   config.ack == AckPolicy::kExplicit;
  for (std::uint32_t i = 0; i < config.members; ++i) {
    state->batchers.push_back(*Batcher::Create(config.batch));
  }
  state->queue_timeout_ns = absl::ToInt64Nanoseconds(config.queue_timeout);
  state->wheel = std::make_unique<TimerWheel<engine_internal::ConsumerTimer>>(clock->NowNanos());
  state->max_deliver = config.max_deliver;
  if (!config.accept_codecs.empty()) {
    state->accept_mask = 0;
    for (PayloadCodec c : config.accept_codecs) state->accept_mask |= 1u << static_cast<unsigned>(c);
    state->convert_to = config.accept_codecs.front();
  }
  state->max_ack_pending = config.max_ack_pending;
  return state;
}

// The member lanes of a new consumer, each for the node of its member_nodes entry: a
// ring, or a QoS scheduler. ResourceExhausted when they do not fit in memory.
absl::Status AddLanes(ConsumerState& state, const ConsumerConfig& config) {
  // Lanes hold capacity rounded up to a power of two (Validate bounded the total).
  const std::size_t slots = std::bit_ceil(config.lane_capacity) * config.members;
  try {
    for (std::uint32_t i = 0; i < config.members; ++i) {
      const int node = config.member_nodes.empty() ? -1 : config.member_nodes[i];
      if (!config.qos) {
        state.lanes.push_back(std::make_unique<Lane>(config.lane_capacity, node));
        continue;
      }
      QosConfig qc = *config.qos;
      qc.capacity = static_cast<std::uint32_t>(config.lane_capacity);
      ConsumerState* cs = &state;
      state.lanes.push_back(std::make_unique<Lane>(
          *QosScheduler<engine_internal::Delivery>::Create(qc),
          [cs, i](engine_internal::Delivery& d) { engine_internal::DropQueued(*cs, i, d, true); },
          node));
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("consumer '" + config.name +
                                        "': out of memory allocating " +
                                        std::to_string(slots) + " lane slots");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Consumer> Engine::AddConsumer(const ConsumerConfig& config) {
  if (absl::Status s = ConsumerConfig::Validate(config); !s.ok()) return s;
  for (std::size_t i = 0; i < config.member_nodes.size(); ++i) {
    const int n = config.member_nodes[i];
    if (n < 0 || static_cast<std::size_t>(n) >= impl_->topology.node_count()) {
      return absl::InvalidArgumentError(
          "consumer '" + config.name + "': member_nodes[" + std::to_string(i) + "] = " +
          std::to_string(n) + " is not a node of this machine (0.." +
          std::to_string(impl_->topology.node_count() - 1) + ")");
    }
  }
  absl::StatusOr<std::unique_ptr<ConsumerState>> made = NewConsumerState(config, impl_->clock);
  if (!made.ok()) return made.status();
  std::unique_ptr<ConsumerState> state = *std::move(made);
  state->host = impl_.get();

  StreamState* stream = nullptr;
  ConsumerState* raw = nullptr;
  {
    // Check and reserve the name under config_mu only: never wait for a stream's
    // mutex while holding it (a publisher blocked on a full lane holds that mutex,
    // and Close() needs config_mu to release it).
    std::lock_guard lock(impl_->config_mu);
    if (impl_->closed.load()) return absl::CancelledError("engine is closed");
    stream = impl_->FindStream(config.stream);
    if (stream == nullptr) {
      return absl::NotFoundError("consumer '" + config.name + "': stream " +
                                 QuoteValue(config.stream) + " does not exist");
    }
    if (state->filter &&
        std::none_of(stream->patterns.begin(), stream->patterns.end(),
                     [&](const SubjectPattern& p) { return p.Overlaps(*state->filter); })) {
      std::string subjects;
      for (const SubjectPattern& p : stream->patterns) {
        subjects += (subjects.empty() ? "" : ", ") + QuoteValue(p.text());
      }
      return absl::InvalidArgumentError("consumer '" + config.name + "': filter_subject " +
                                        QuoteValue(config.filter_subject) +
                                        " matches no subject of stream '" + config.stream +
                                        "' (subjects " + subjects + ")");
    }
    for (const auto& c : impl_->consumers) {
      if (c->stream == stream && c->config.name == config.name) {
        return absl::AlreadyExistsError("consumer '" + config.name + "' of stream '" +
                                        config.stream + "' already exists");
      }
      if (config.selection != nullptr && c->policy == config.selection) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "': its selection policy object is already used by "
            "consumer '" + c->config.name + "' of stream '" + c->config.stream +
            "' (policies keep per-group state: give each consumer its own)");
      }
    }
    if (absl::Status s = AddLanes(*state, config); !s.ok()) return s;
    state->stream = stream;
    raw = state.get();
    impl_->consumers.push_back(std::move(state));
    impl_->consumer_count.store(impl_->consumers.size(), std::memory_order_relaxed);
    // Every consumer may need timers: queue timeouts and event ttl apply to all,
    // delayed naks to explicit-ack ones.
    if (!impl_->manual_timers) {
      // ack_wait expiries need a run every quarter ack wait; delayed naks ask for
      // their own wake-up (WakeTimer), so untracked consumers need no short interval.
      const std::int64_t interval =
          raw->tracked ? std::clamp<std::int64_t>(raw->AckWaitFor(1) / 4, 1'000'000, 100'000'000)
                       : 100'000'000;
      {
        std::lock_guard tl(impl_->timer_mu);
        impl_->timer_interval_ns = std::min(impl_->timer_interval_ns, interval);
      }
      impl_->timer_cv.notify_all();
      impl_->StartTimer([this] { RunTimers(); });
    }
  }
  {
    // RunTimers' scratch list of consumers grows here, not on the timer thread (a
    // timer run in steady state allocates nothing). Not under config_mu: RunTimers
    // takes run_timers_mu first.
    std::lock_guard run_lock(impl_->run_timers_mu);
    impl_->timer_consumers.reserve(impl_->consumer_count.load(std::memory_order_relaxed));
  }
  // Now the publishers of the stream start queueing for it. This waits for a
  // publisher blocked on a full lane of another consumer; Close() releases it.
  std::lock_guard stream_lock(stream->mu);
  stream->consumers.push_back(raw);
  if (!config.accept_codecs.empty()) {
    stream->codec_restricted.fetch_add(1, std::memory_order_relaxed);
  }
  return Consumer(raw);
}

absl::Status Engine::SetReward(double reward) {
  if (impl_->flow == nullptr) {
    return absl::FailedPreconditionError("SetReward: the engine has no flow control "
                                         "(EngineOptions::flow_control)");
  }
  return impl_->flow->SetReward(reward);
}

void Engine::Close() {
  {
    std::lock_guard lock(impl_->config_mu);
    impl_->closed.store(true, std::memory_order_release);
    for (auto& c : impl_->consumers) {
      for (auto& lane : c->lanes) lane->ring.close();
      {
        std::lock_guard slot_lock(c->slot_mu);
        c->closing.store(true, std::memory_order_release);
      }
      c->slot_cv.notify_all();
    }
  }
  {
    std::lock_guard tl(impl_->timer_mu);
    impl_->timer_stop = true;
  }
  impl_->timer_cv.notify_all();
  if (impl_->timer.joinable() && impl_->timer.get_id() != std::this_thread::get_id()) {
    impl_->timer.join();
  }
  // Every call still open fails now. Function workers are not joined here: one may
  // be in a handler that blocks; it finds its call gone when the handler returns,
  // drains its closed lane and ends (~Engine joins it).
  absl::flat_hash_map<std::uint64_t, Impl::CallState> open;
  {
    std::lock_guard lock(impl_->calls_mu);
    open.swap(impl_->calls);
  }
  for (auto& [id, call] : open) {
    call.promise.set_value(absl::CancelledError("engine closed before call " + std::to_string(id) +
                                                " to function '" + call.fn + "' completed"));
  }
}

}  // namespace inferq
