// File: src/engine/engine.cpp
//
// The Engine facade: Create, the destructor, AddStream, AddConsumer, SetReward and
// Close. The parts of the engine are in the files named for them (publish.cpp,
// delivery.cpp, settle.cpp, pull.cpp, timers.cpp, calls.cpp, stats.cpp,
// dead_letter.cpp; state in consumer_state.hpp, stream_state.hpp, engine_impl.hpp).
#include <algorithm>
#include <charconv>
#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <random>
#include <thread>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "engine_impl.hpp"
#include "inferq/base/error.hpp"
#include "inferq/base/limits.hpp"
#include "inferq/engine/engine.hpp"

namespace inferq {

namespace {

// 16 lowercase hex digits (StreamState::incarnation).
std::string Hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// One arena per real NUMA node for the whole process: mimalloc 2.0.9 cannot take an
// arena back and holds at most 64, so engines share them. nullptr when none can be
// made (built without mimalloc); `why` then says so.
NumaArena* ProcessArena(const Topology& topology, int node_index, std::string* why) {
  // Never destroyed: pools in engines still running while std::exit destroys statics
  // keep using the arenas' memory.
  static std::mutex mu;
  static auto& arenas = *new std::vector<std::pair<int, std::unique_ptr<NumaArena>>>();
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

// Defined with the ack logs below.
absl::Status DropStaleAckRecords(const StreamState& stream);

namespace {

// `dir` made absolute and normal, symbolic links of its existing part resolved, so
// that two spellings of one directory compare equal.
std::filesystem::path NormalDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(dir, ec), ec);
  if (ec) p = std::filesystem::absolute(dir, ec);
  p = p.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" as "a/b"
  return p;
}

// `inner` is `outer` or lies under it.
bool Within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

// A file stream's directory must not hold, or lie in, another file stream's of the
// same engine: the one inside would take the other's files (its consumers' ack logs
// live in <directory>/consumers/<name>) for its own; nor hold or lie in one that
// another AddStream call is recovering (`opening`). InvalidArgument naming both.
// Requires config_mu.
absl::Status CheckDirectoryApart(
    const StreamConfig& config, const std::filesystem::path& mine,
    const std::vector<std::unique_ptr<StreamState>>& streams,
    const std::vector<std::pair<std::filesystem::path, std::string>>& opening) {
  auto check = [&](const std::filesystem::path& theirs, const std::string& their_dir,
                   const std::string& their_name) {
    if (!Within(mine, theirs) && !Within(theirs, mine)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "stream '" + config.name + "': directory " + QuoteValue(config.directory) +
        (mine == theirs ? " is" : Within(mine, theirs) ? " lies in" : " holds") +
        " the directory " + QuoteValue(their_dir) + " of stream '" + their_name +
        "' (each file stream needs a directory of its own, apart from the others)");
  };
  for (const auto& other : streams) {
    if (other->config.storage != StorageType::kFile) continue;
    if (absl::Status st = check(other->normal_dir, other->config.directory, other->config.name);
        !st.ok()) {
      return st;
    }
  }
  for (const auto& [dir, name] : opening) {
    if (absl::Status st = check(dir, dir.string(), name); !st.ok()) return st;
  }
  return absl::OkStatus();
}

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
  const double ratio = options.trace.sample_ratio;
  if (!(ratio >= 0.0 && ratio <= 1.0)) {  // NaN fails both
    return absl::InvalidArgumentError("EngineOptions::trace.sample_ratio " + absl::StrCat(ratio) +
                                      " is outside 0..1");
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
  if (options.trace.sink != nullptr) {
    impl_->tracer = std::make_unique<engine_internal::Tracer>(options.trace, impl_->clock);
  }
  impl_->manual_timers = options.manual_timers;
  if (const char* v = std::getenv("INFERQ_CURSOR_CONSUMERS"); v != nullptr && std::string_view(v) == "1") {
    impl_->cursor_consumers = true;
  }
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
  // File streams record where their front stands, so that a restart under higher
  // limits does not bring back what max_msgs, max_bytes or max_age removed.
  for (const auto& s : impl_->streams) {
    if (s->log == nullptr) continue;
    std::lock_guard lock(s->mu);
    s->RecordFloor(/*force=*/true);
  }
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
  for (const auto* list : {&impl_->consumers, &impl_->deleted_consumers}) {
    for (const auto& c : *list) {
      const std::int64_t live = c->live_messages.load(std::memory_order_acquire);
      if (live == 0) continue;
      std::fprintf(stderr,
                   "inferq: Engine destroyed while %lld Message(s) of consumer '%s' of stream "
                   "'%s' are alive; destroy every Message before its Engine "
                   "(inferq/engine/engine.hpp: the Engine must outlive them)\n",
                   static_cast<long long>(live), c->config.name.c_str(), c->config.stream.c_str());
      std::abort();
    }
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
  state->first_seq.store(state->keeps_index ? 1 : 0, std::memory_order_relaxed);
  state->max_age_ns.store(absl::ToInt64Nanoseconds(config.max_age), std::memory_order_relaxed);
  state->clock = impl_->clock;
  if (config.duplicate_window > absl::ZeroDuration()) {
    state->dedup = std::make_unique<DuplicateWindow>(config.duplicate_window,
                                                     config.duplicate_window_max_entries);
  }

  // A file stream's directory is reserved while it is recovered (opening_dirs), and
  // the reservation ends with this call, whatever it returns.
  struct Reservation {
    Reservation() = default;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Engine::Impl* impl = nullptr;
    const StreamState* stream = nullptr;
    ~Reservation() {
      if (impl == nullptr) return;
      std::lock_guard lock(impl->config_mu);
      auto& v = impl->opening_dirs;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (it->first == stream->normal_dir && it->second == stream->config.name) {
          v.erase(it);
          break;
        }
      }
    }
  } reservation;
  if (config.storage == StorageType::kFile) {
    state->normal_dir = NormalDir(config.directory);
    {
      std::lock_guard lock(impl_->config_mu);
      if (impl_->closed.load()) return absl::CancelledError("engine is closed");
      if (impl_->FindStream(config.name) != nullptr) {
        return absl::AlreadyExistsError("stream '" + config.name + "' already exists");
      }
      if (absl::Status st =
              CheckDirectoryApart(config, state->normal_dir, impl_->streams, impl_->opening_dirs);
          !st.ok()) {
        return st;
      }
      impl_->opening_dirs.emplace_back(state->normal_dir, config.name);
      reservation.impl = impl_.get();  // (fields set: an assigned temporary would release it)
      reservation.stream = state.get();
    }
    // Recovery reads the directory outside config_mu (it may take a while).
    state->dictionaries = impl_->codecs.dictionaries.get();
    StreamLogOptions lo;
    lo.dir = config.directory;
    lo.sync = config.sync;
    lo.group_commit_window = config.sync_window;
    lo.segment_bytes = config.segment_bytes;
    lo.file_system = config.file_system;
    const std::int64_t now_ns = impl_->clock->NowNanos();
    const std::int64_t wall_ns = absl::ToUnixNanos(absl::Now());
    StreamState* s = state.get();
    s->fs = config.file_system ? config.file_system : PosixFileSystem();
    s->recovering = true;
    absl::StatusOr<std::unique_ptr<StreamLog>> log =
        StreamLog::Open(lo, [&](const StreamLog::Entry& e) {
          return s->RecoverOne(e.tx, e.location, e.value, now_ns, wall_ns);
        });
    if (!log.ok()) {
      // Recovery's own errors (RecoverOne) name the stream already.
      const std::string prefix = "stream '" + config.name + "': ";
      std::string msg(log.status().message());
      if (msg.rfind(prefix, 0) != 0) msg = prefix + msg;
      return absl::Status(log.status().code(), std::move(msg));
    }
    state->log = *std::move(log);
    if (absl::Status st = state->FinishRecovery(now_ns, wall_ns); !st.ok()) return st;
    if (absl::Status st = DropStaleAckRecords(*state); !st.ok()) return st;
  }

  std::lock_guard lock(impl_->config_mu);
  if (impl_->closed.load()) return absl::CancelledError("engine is closed");
  if (impl_->FindStream(config.name) != nullptr) {
    return absl::AlreadyExistsError("stream '" + config.name + "' already exists");
  }
  if (state->log != nullptr) {
    state->incarnation = Hex16(state->log->store_id());
  } else {
    std::random_device rd;
    state->incarnation =
        Hex16((std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(absl::ToUnixNanos(absl::Now())));
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
  if (config.max_age > absl::ZeroDuration()) {
    // max_age is enforced by the timer too, not only when the stream is written: a
    // run at least every max_age / 8, within 1 ms .. 1 s.
    impl_->RunTimersEvery(std::clamp<std::int64_t>(absl::ToInt64Nanoseconds(config.max_age) / 8,
                                                   1'000'000, 1'000'000'000));
  }
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

// Rewrites the ack log `log` of a durable consumer, just replayed (`records` records,
// `r` what they say), as its state alone when the history is much longer: the
// floor raised over the acks that follow it without a gap ("S <floor>"), then an "A"
// for each ack above it and a "D" for each delivery not acked. The state goes into
// new segments, is fdatasync'ed, and only then are the older segments removed, so a
// crash at any point leaves a log that replays to the same state (each record
// restates what the older ones said). Without this, every restart would add a "D"
// per redelivered message to a history that each later restart replays in full
// (JetStream's consumer store likewise keeps a state snapshot, not the history).
// Records of sequences beyond the stream's last message (`last_seq`) speak of
// messages the stream no longer has (a tail lost in a power cut under a weak sync
// policy): they are dropped, and the log is rewritten at once, since the stream
// gives those sequences to its next publishes. For the same reason a floor past
// last_seq is lowered to it, and the floor never rises past it.
absl::Status CompactAckLog(ConsumerState::Resume& r, StreamLog& log, std::uint64_t records,
                           std::uint64_t last_seq) {
  if (!r.started) return absl::OkStatus();
  bool stale =
      absl::erase_if(r.acked, [&](std::uint64_t seq) { return seq > last_seq; }) +
          absl::erase_if(r.delivered, [&](const auto& kv) { return kv.first > last_seq; }) >
      0;
  if (r.floor > last_seq) {  // a start after messages the stream lost (kNew's, say)
    r.floor = last_seq;
    stale = true;
  }
  while (r.floor < last_seq && r.acked.erase(r.floor + 1) == 1) ++r.floor;
  absl::erase_if(r.acked, [&](std::uint64_t seq) { return seq <= r.floor; });
  absl::erase_if(r.delivered, [&](const auto& kv) { return kv.first <= r.floor; });
  const std::uint64_t live = 1 + r.acked.size() + r.delivered.size();
  if (!stale && records <= 2 * live + 1024) return absl::OkStatus();
  if (absl::Status st = log.Rotate(); !st.ok()) return st;
  const std::uint64_t first = log.last_tx() + 1;
  std::vector<std::uint64_t> acked(r.acked.begin(), r.acked.end());
  std::sort(acked.begin(), acked.end());
  std::vector<std::pair<std::uint64_t, std::uint32_t>> delivered(r.delivered.begin(),
                                                                  r.delivered.end());
  std::sort(delivered.begin(), delivered.end());
  if (auto e = log.Append("S " + std::to_string(r.floor)); !e.ok()) return e.status();
  for (std::uint64_t seq : acked) {
    if (auto e = log.Append("A " + std::to_string(seq)); !e.ok()) return e.status();
  }
  for (const auto& [seq, n] : delivered) {
    if (auto e = log.Append("D " + std::to_string(seq) + " " + std::to_string(n)); !e.ok()) {
      return e.status();
    }
  }
  // Rotate fdatasyncs what it ends whatever the sync policy: the state is on disk
  // before the history it replaces goes.
  if (absl::Status st = log.Rotate(); !st.ok()) return st;
  return log.RetireBefore(first);
}

// The ack log of consumer `name` of file stream `stream`: opened, its records read
// into `r` (`*records`: how many). Its errors name the log; the caller adds the
// consumer.
absl::StatusOr<std::unique_ptr<StreamLog>> ReadAckLog(const StreamState& stream,
                                                      const std::string& name,
                                                      ConsumerState::Resume& r,
                                                      std::uint64_t* records) {
  StreamLogOptions lo;
  lo.dir = stream.config.directory + "/consumers/" + name;
  lo.sync = stream.config.sync;
  lo.group_commit_window = stream.config.sync_window;
  lo.segment_bytes = stream.config.segment_bytes;
  lo.file_system = stream.config.file_system;
  auto parse = [&](const StreamLog::Entry& e) -> absl::Status {
    const std::string_view v = e.value;
    std::uint64_t a = 0, b = 0;
    const char* p = v.data() + std::min<std::size_t>(2, v.size());
    const char* end = v.data() + v.size();
    auto num = [&](std::uint64_t& out) {
      auto [q, ec] = std::from_chars(p, end, out);
      const bool ok = ec == std::errc() && q != p;
      p = q < end && *q == ' ' ? q + 1 : q;
      return ok;
    };
    const bool ok = v.size() >= 3 && v[1] == ' ' && num(a) &&
                    (v[0] != 'D' || num(b)) && p == end;
    if (!ok || (v[0] != 'S' && v[0] != 'A' && v[0] != 'D')) {
      return absl::DataLossError("ack log " + QuoteValue(lo.dir) + " record " +
                                 std::to_string(e.tx) +
                                 " is not an ack log record: " + QuoteValue(v.substr(0, 64)));
    }
    if (v[0] == 'D' && b > UINT32_MAX) {
      return absl::DataLossError("ack log " + QuoteValue(lo.dir) + " record " +
                                 std::to_string(e.tx) + " counts " + std::to_string(b) +
                                 " deliveries of message " + std::to_string(a) + " (at most " +
                                 std::to_string(UINT32_MAX) + ")");
    }
    ++*records;
    if (v[0] == 'S') {
      r.started = true;
      r.floor = std::max(r.floor, a);
    } else if (v[0] == 'A') {
      r.acked.insert(a);
      r.delivered.erase(a);
    } else if (!r.acked.contains(a)) {
      r.delivered[a] = static_cast<std::uint32_t>(b);
    }
    return absl::OkStatus();
  };
  return StreamLog::Open(lo, parse);
}

}  // namespace

// At a file stream's recovery: every consumer's ack log in its directory, added in
// this run or not, without its records of sequences beyond the recovered last
// message (CompactAckLog). A consumer added only in a later run would otherwise
// take the acks of a tail a power cut took for acks of the publishes that reused
// those sequences in between, and never deliver them. Errors name the consumer.
absl::Status DropStaleAckRecords(const StreamState& stream) {
  const std::string dir = stream.config.directory + "/consumers";
  absl::StatusOr<std::vector<std::string>> names = stream.fs->List(dir);
  if (!names.ok()) return absl::OkStatus();  // no consumer yet
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    if (name.rfind(".deleted-", 0) == 0) {
      // What Engine::DeleteConsumer could not remove (no consumer name starts with '.').
      std::error_code ec;
      std::filesystem::remove_all(dir + "/" + name, ec);
      continue;
    }
    ConsumerState::Resume r;
    std::uint64_t records = 0;
    absl::StatusOr<std::unique_ptr<StreamLog>> log = ReadAckLog(stream, name, r, &records);
    absl::Status st = log.ok() ? CompactAckLog(r, **log, records, stream.recovered_next_seq - 1)
                               : log.status();
    if (!st.ok()) {
      return absl::Status(st.code(), "stream '" + stream.config.name + "': consumer '" + name +
                                         "': " + std::string(st.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

// A consumer of a file stream: opens its ack log and reads where it stands
// (ConsumerState::ack_log, resume), compacting it when its history is long.
absl::Status OpenAckLog(const StreamState& stream, ConsumerState& c) {
  const std::string dir = stream.config.directory + "/consumers/" + c.config.name;
  std::uint64_t records = 0;
  auto fail = [&](const absl::Status& st, std::string_view doing) {
    return absl::Status(st.code(), "consumer '" + c.config.name + "' of stream '" +
                                       stream.config.name + "': " + std::string(doing) +
                                       std::string(st.message()));
  };
  absl::StatusOr<std::unique_ptr<StreamLog>> log = ReadAckLog(stream, c.config.name, c.resume, &records);
  if (!log.ok()) return fail(log.status(), "");
  c.ack_log = *std::move(log);
  // Not next_seq (guarded by stream.mu, and moved by this run's publishes, whose
  // sequences the lost tail's records would hide): a consumer's ack log is opened
  // once per run, so what lies beyond the recovered last message is stale.
  if (absl::Status st = CompactAckLog(c.resume, *c.ack_log, records, stream.recovered_next_seq - 1);
      !st.ok()) {
    c.ack_log.reset();
    return fail(st, "compacting its ack log: ");
  }
  if (!c.resume.started) {
    // A new consumer: a provisional start, fdatasync'ed before the consumer exists,
    // so that a log that cannot be written fails AddConsumer (nothing changed) and
    // a power loss never loses where it started. QueueStoredMessages then writes the
    // exact start under the stream's mutex, not synced: if that record is lost the
    // provisional one stands, which is never above it (replay keeps the highest "S"),
    // so a restart delivers more, never less. kNew starts after the newest message
    // (last_seq, an atomic: config_mu never waits for stream.mu; relaxed is enough,
    // since a value this thread reads was stored before its own later attach under
    // stream.mu, so it is at most the exact floor); the others may take any stored
    // message, so 0.
    const std::uint64_t floor = c.config.deliver == DeliverPolicy::kNew
                                    ? stream.last_seq.load(std::memory_order_relaxed)
                                    : 0;
    absl::StatusOr<StreamLog::Entry> e = c.ack_log->Append("S " + std::to_string(floor));
    absl::Status st = e.ok() ? c.ack_log->Sync(e->tx) : e.status();
    if (!st.ok()) {
      c.ack_log.reset();
      // A record whose fdatasync failed may still be in the file: a later add would
      // resume from it. A log with no record before this one holds nothing else, so
      // it goes whole (if that fails too, a later add takes more, never less).
      if (records == 0) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
      return fail(st, "writing its start to its ack log: ");
    }
  }
  return absl::OkStatus();
}

// kLast and kLastPerSubject on a file stream read back the stored messages they
// choose among (for the filter, the predicate and the subject). ScanForLast does
// that before the consumer is attached, outside the stream's mutex, in stretches of
// index entries copied under it, up to the stream's next sequence when it starts
// (end_seq); QueueStoredFromLog then reads, under the mutex, only what was stored
// after that. (A message removed between the scan and the attach is not delivered,
// and its subject's older one is not taken instead.)
struct LastScan {
  std::uint64_t end_seq = 0;            // 0: no scan ran
  std::optional<std::uint64_t> last;    // kLast: the newest match below end_seq
  absl::flat_hash_map<std::string, std::uint64_t> last_of_subject;  // kLastPerSubject
  std::string failed;                   // a stored message that cannot be read back
};

// Index entries copied per hold of the stream's mutex by ScanForLast.
constexpr std::size_t kScanStretch = 4096;

// The stored message of `e` when consumer `c`'s filter and predicate take it;
// nullptr when they do not, when the stream let it go since `e` was copied (its
// segment retired), or when it cannot be read back (`*failed` says why).
engine_internal::Handle MatchStored(const StreamState& stream, const ConsumerState& c,
                                    const engine_internal::IndexEntry& e, std::string* failed) {
  absl::StatusOr<engine_internal::Handle> h = stream.LoadFromLog(e);
  if (!h.ok()) {
    if (h.status().code() == absl::StatusCode::kNotFound && stream.DiscardedSeq(e.seq)) {
      return nullptr;
    }
    *failed = "stored message " + std::to_string(e.seq) + " cannot be read back (" +
              std::string(h.status().message()) + ")";
    return nullptr;
  }
  const Event& ev = *(*h)->event;
  if (c.filter && !c.filter->Matches(ev.subject)) return nullptr;
  if (!c.config.predicate.is_trivial() && !c.config.predicate.Matches(ev)) return nullptr;
  return *std::move(h);
}

void ScanForLast(StreamState& stream, const ConsumerState& c, LastScan& scan) {
  const bool newest_only = c.config.deliver == DeliverPolicy::kLast;
  {
    std::lock_guard lock(stream.mu);
    scan.end_seq = stream.next_seq;
  }
  // kLast: entries below `bound`, newest first; kLastPerSubject: from `bound` on.
  std::uint64_t bound = newest_only ? scan.end_seq : 0;
  std::vector<engine_internal::IndexEntry> stretch;
  for (;;) {
    stretch.clear();
    {
      std::lock_guard lock(stream.mu);
      if (stream.deleted) return;  // AddConsumer finds it deleted under the mutex
      if (newest_only) {
        const std::size_t hi = stream.IndexPosition(bound);
        const std::size_t lo = hi > kScanStretch ? hi - kScanStretch : 0;
        for (std::size_t k = hi; k > lo; --k) stretch.push_back(stream.index.at(k - 1));
      } else {
        for (std::size_t k = stream.IndexPosition(bound);
             k < stream.index.size() && stretch.size() < kScanStretch; ++k) {
          if (stream.index.at(k).seq >= scan.end_seq) break;
          stretch.push_back(stream.index.at(k));
        }
      }
    }
    if (stretch.empty()) return;
    for (const engine_internal::IndexEntry& e : stretch) {
      if (e.removed != 0) continue;
      engine_internal::Handle h = MatchStored(stream, c, e, &scan.failed);
      if (!scan.failed.empty()) return;
      if (h == nullptr) continue;
      if (newest_only) {
        scan.last = e.seq;
        return;
      }
      scan.last_of_subject[h->event->subject] = e.seq;
    }
    // kLast's stretch runs newest to oldest: its last entry is the oldest.
    bound = newest_only ? stretch.back().seq : stretch.back().seq + 1;
  }
}

// QueueStoredMessages for a file stream, whose stored events are in its log: opens
// the consumer's backlog (ConsumerState::Backlog), which RetryParked reads a chunk at
// a time as lanes take its messages (FillFromBacklog). What the start position
// chooses by sequence and publish time (kAll, kByStartSequence, kByStartTime) is
// decided without reading the log; kLast and kLastPerSubject take what ScanForLast
// chose (`scan`) and read back (LoadFromLog) only what was stored after it, and keep
// only the sequences chosen; a restart reads back the messages given up before it
// (given_up_at_start). One that cannot be read fails the consumer
// (ConsumerState::Fail; every consumer of a file stream is durable): never a silent
// gap in what it delivers. Requires stream.mu.
void QueueStoredFromLog(StreamState& stream, ConsumerState& c, LastScan& scan) {
  using engine_internal::Handle;
  using engine_internal::IndexEntry;
  const ConsumerConfig& cfg = c.config;
  const bool resume = c.ack_log != nullptr && c.resume.started;
  ConsumerState::Backlog b;
  b.end_seq = stream.next_seq;
  if (!resume && cfg.deliver == DeliverPolicy::kByStartTime) {
    const absl::Duration ago = absl::Now() - cfg.start_time;
    b.start_ns = engine_internal::SatSub(c.clock->NowNanos(), absl::ToInt64Nanoseconds(ago));
  }
  if (!resume && cfg.deliver == DeliverPolicy::kByStartSequence) c.start_after = cfg.start_seq - 1;
  if (resume) c.start_after = c.resume.floor;
  b.next_seq = c.start_after + 1;
  std::string failed = std::move(scan.failed);
  auto matching = [&](const IndexEntry& e) { return MatchStored(stream, c, e, &failed); };
  if (resume) {
    // Delivered max_deliver times before the restart, never acked: AddConsumer
    // dead-letters them; the backlog skips them.
    for (const auto& [seq, attempts] : c.resume.delivered) {
      if (seq <= c.resume.floor || c.resume.acked.contains(seq) || !c.LastAttempt(attempts)) {
        continue;
      }
      const std::size_t pos = stream.IndexPosition(seq);
      if (pos == stream.index.size() || stream.index.at(pos).seq != seq ||
          stream.index.at(pos).removed != 0) {
        continue;
      }
      Handle h = matching(stream.index.at(pos));
      if (!failed.empty()) break;
      if (h != nullptr) c.given_up_at_start.emplace_back(std::move(h), attempts);
    }
    std::sort(c.given_up_at_start.begin(), c.given_up_at_start.end(),
              [](const auto& x, const auto& y) { return x.first->seq < y.first->seq; });
    b.resume = std::move(c.resume);
    c.resume = {};
  } else if (cfg.deliver == DeliverPolicy::kLast) {
    // What was stored after the scan, from the newest back (the first match is the
    // one); else the scan's.
    b.only.emplace();
    for (std::size_t k = stream.index.size(); k > 0 && failed.empty(); --k) {
      const IndexEntry& e = stream.index.at(k - 1);
      if (e.seq < scan.end_seq) break;
      if (e.removed != 0) continue;
      if (matching(e) != nullptr) {
        b.only->insert(e.seq);
        break;
      }
    }
    if (b.only->empty() && scan.last.has_value()) b.only->insert(*scan.last);
  } else if (cfg.deliver == DeliverPolicy::kLastPerSubject) {
    absl::flat_hash_map<std::string, std::uint64_t> last_of_subject =
        std::move(scan.last_of_subject);
    for (std::size_t k = stream.IndexPosition(scan.end_seq);
         k < stream.index.size() && failed.empty(); ++k) {
      const IndexEntry& e = stream.index.at(k);
      if (e.removed != 0) continue;
      if (Handle h = matching(e); h != nullptr) last_of_subject[h->event->subject] = e.seq;
    }
    b.only.emplace();
    for (const auto& [subject, seq] : last_of_subject) b.only->insert(seq);
  }
  if (!failed.empty()) {
    c.Fail(std::move(failed));
    c.resume = {};
    c.given_up_at_start.clear();
    return;
  }
  if (b.only.has_value()) {
    std::uint64_t first = b.end_seq;
    for (std::uint64_t seq : *b.only) first = std::min(first, seq);
    b.next_seq = std::max(b.next_seq, first);
  }
  // Whether the start policy takes stored message `e` (below end_seq).
  auto chosen = [&](const IndexEntry& e) {
    if (e.removed != 0 || e.seq < b.next_seq) return false;
    return b.only.has_value() ? b.only->contains(e.seq) : e.publish_ns >= b.start_ns;
  };
  if (c.ack_log != nullptr && !resume) {
    // Where it starts, durably: the floor below the first message the start policy
    // takes, and an ack record for each stored message after it that the policy
    // passes over (kLast, kLastPerSubject, an older publish time), so that a restart
    // does not deliver them. (The filter and the predicate apply again then.)
    std::uint64_t first = b.end_seq;
    const std::size_t from = stream.IndexPosition(b.next_seq);
    for (std::size_t k = from; k < stream.index.size(); ++k) {
      if (chosen(stream.index.at(k))) {
        first = stream.index.at(k).seq;
        break;
      }
    }
    std::uint64_t floor = first - 1;
    if (cfg.deliver == DeliverPolicy::kByStartSequence) floor = std::max(floor, cfg.start_seq - 1);
    (void)c.Record("S " + std::to_string(floor));
    for (std::size_t k = from; k < stream.index.size(); ++k) {
      const IndexEntry& e = stream.index.at(k);
      if (e.seq > first && e.removed == 0 && !chosen(e)) (void)c.Record("A " + std::to_string(e.seq));
    }
  }
  if (b.next_seq >= stream.next_seq) return;  // nothing stored to read
  c.backlog_next_seq.store(b.next_seq, std::memory_order_relaxed);
  c.backlog = std::move(b);
  c.reading_backlog.store(true, std::memory_order_release);
  std::lock_guard lock(c.pending_mu);
  c.catching_up.store(true, std::memory_order_release);
  c.has_parked.store(true, std::memory_order_release);
}

// The stored messages consumer `c` starts with (ConsumerConfig::deliver), parked in
// sequence order: lanes take them as they have room (RetryParked), and until the
// last is queued the events published meanwhile are parked behind them
// (EnqueueTargets), so every member sees the stream's order. A file stream's come
// from its log (QueueStoredFromLog; `scan`: ScanForLast's). Requires stream.mu.
void QueueStoredMessages(StreamState& stream, ConsumerState& c, LastScan& scan) {
  const ConsumerConfig& cfg = c.config;
  if (stream.log != nullptr) {
    if (cfg.deliver == DeliverPolicy::kNew && !(c.ack_log != nullptr && c.resume.started)) {
      if (c.ack_log != nullptr) (void)c.Record("S " + std::to_string(stream.next_seq - 1));
      return;
    }
    return QueueStoredFromLog(stream, c, scan);
  }
  if (cfg.deliver == DeliverPolicy::kNew) return;
  std::int64_t start_ns = INT64_MIN;
  if (cfg.deliver == DeliverPolicy::kByStartTime) {
    // Publish times are on the engine clock: the start time maps onto it by its
    // distance from now.
    const absl::Duration ago = absl::Now() - cfg.start_time;
    start_ns = engine_internal::SatSub(c.clock->NowNanos(), absl::ToInt64Nanoseconds(ago));
  }
  if (cfg.deliver == DeliverPolicy::kByStartSequence) c.start_after = cfg.start_seq - 1;
  std::vector<engine_internal::Handle> chosen;
  absl::flat_hash_map<std::string, std::size_t> last_of_subject;
  stream.messages.for_each([&](const engine_internal::Handle& h) {
    if (h->state.load(std::memory_order_acquire) != engine_internal::kLive) return;
    const Event& ev = *h->event;
    if (c.filter && !c.filter->Matches(ev.subject)) return;
    if (!cfg.predicate.is_trivial() && !cfg.predicate.Matches(ev)) return;
    switch (cfg.deliver) {
      case DeliverPolicy::kByStartSequence:
        if (h->seq < cfg.start_seq) return;
        break;
      case DeliverPolicy::kByStartTime:
        if (h->publish_ns < start_ns) return;
        break;
      case DeliverPolicy::kLast:
        chosen.clear();
        break;
      case DeliverPolicy::kLastPerSubject: {
        auto [it, fresh] = last_of_subject.try_emplace(ev.subject, chosen.size());
        if (!fresh) {
          chosen[it->second] = nullptr;  // an older one of the subject: dropped below
          it->second = chosen.size();
        }
        break;
      }
      default:
        break;
    }
    chosen.push_back(h);
  });
  const bool interest = stream.config.retention != RetentionPolicy::kLimits &&
                        cfg.ack == AckPolicy::kExplicit;
  std::lock_guard lock(c.pending_mu);
  for (engine_internal::Handle& h : chosen) {
    if (h == nullptr) continue;
    if (interest) h->pending_acks.fetch_add(1, std::memory_order_acq_rel);
    c.parked.push_back(engine_internal::Delivery{std::move(h), 1, false});
  }
  if (!c.parked.empty()) {
    c.catching_up.store(true, std::memory_order_release);
    c.has_parked.store(true, std::memory_order_release);
  }
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
  state->tracer = impl_->tracer.get();
  state->replay_start_ns = impl_->clock->NowNanos();  // ReplayPolicy::kOriginal

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
    if (stream->config.retention == RetentionPolicy::kWorkQueue) {
      // JetStream's work-queue rules: each message is for one consumer, which takes
      // every message waiting for it and removes each by its ack.
      const std::string where = "consumer '" + config.name + "' of work-queue stream '" +
                                config.stream + "': ";
      if (config.ack != AckPolicy::kExplicit) {
        return absl::InvalidArgumentError(where + "needs ack policy explicit");
      }
      if (config.deliver != DeliverPolicy::kAll) {
        return absl::InvalidArgumentError(where + "needs deliver policy all");
      }
    }
    for (const auto& c : impl_->consumers) {
      if (c->stream == stream && c->config.name == config.name) {
        return absl::AlreadyExistsError("consumer '" + config.name + "' of stream '" +
                                        config.stream + "' already exists");
      }
      if (c->stream == stream && stream->config.retention == RetentionPolicy::kWorkQueue &&
          (!c->filter || !state->filter || c->filter->Overlaps(*state->filter))) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "' of work-queue stream '" + config.stream +
            "': its filter " + QuoteValue(config.filter_subject) +
            " overlaps the filter " + QuoteValue(c->config.filter_subject) + " of consumer '" +
            c->config.name + "' (each message of a work queue is for one consumer)");
      }
      if (config.selection != nullptr && c->policy == config.selection) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "': its selection policy object is already used by "
            "consumer '" + c->config.name + "' of stream '" + c->config.stream +
            "' (policies keep per-group state: give each consumer its own)");
      }
      if (config.lifecycle != nullptr && c->config.lifecycle == config.lifecycle) {
        return absl::InvalidArgumentError(
            "consumer '" + config.name + "': its lifecycle is already used by consumer '" +
            c->config.name + "' of stream '" + c->config.stream +
            "' (its ids are per stream sequence: give each consumer its own)");
      }
    }
    if (absl::Status s = AddLanes(*state, config); !s.ok()) return s;
    if (stream->log != nullptr) {
      if (absl::Status s = OpenAckLog(*stream, *state); !s.ok()) return s;
    }
    state->stream = stream;
    state->lifecycle_prefix = config.stream + "/" + config.name + "/" + stream->incarnation + "/";
    raw = state.get();
    impl_->consumers.push_back(std::move(state));
    impl_->consumer_count.store(impl_->consumers.size(), std::memory_order_relaxed);
    // Every consumer may need timers: queue timeouts and event ttl apply to all,
    // delayed naks to explicit-ack ones.
    // ack_wait expiries need a run every quarter ack wait; delayed naks ask for their
    // own wake-up (WakeTimer), so untracked consumers need no short interval.
    impl_->RunTimersEvery(
        raw->tracked ? std::clamp<std::int64_t>(raw->AckWaitFor(1) / 4, 1'000'000, 100'000'000)
                     : 100'000'000);
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
  if (config.lifecycle != nullptr) engine_internal::RetireLifecycleRecords(*stream, *raw);
  LastScan scan;
  if (stream->log != nullptr && !(raw->ack_log != nullptr && raw->resume.started) &&
      (config.deliver == DeliverPolicy::kLast || config.deliver == DeliverPolicy::kLastPerSubject)) {
    ScanForLast(*stream, *raw, scan);  // outside the stream's mutex
  }
  {
    std::lock_guard stream_lock(stream->mu);
    if (impl_->cursor_consumers && engine_internal::CursorEligible(*stream, *raw)) {
      engine_internal::AttachCursor(*stream, *raw);  // starts at the stream's next sequence
      // A Close since the consumer was listed closed its lanes, not this cursor.
      if (impl_->closed.load(std::memory_order_seq_cst)) engine_internal::CloseCursor(*raw);
    } else {
      QueueStoredMessages(*stream, *raw, scan);
    }
    stream->consumers.push_back(raw);
    stream->ConsumersChanged();
    if (!config.accept_codecs.empty()) {
      stream->codec_restricted.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // Given up: delivered max_deliver times before a restart, never acked. Not under
  // the stream's mutex (a dead letter is a publish).
  for (auto& [h, deliveries] : raw->given_up_at_start) {
    engine_internal::DeadLetter(*raw, h, deliveries, "max_deliver",
                                "delivered " + std::to_string(deliveries) +
                                    " times before a restart");
  }
  raw->given_up_at_start = {};
  // The stored messages it starts with, as lanes take them.
  engine_internal::RetryParked(*raw, /*wait=*/true);
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
    impl_->closed.store(true, std::memory_order_seq_cst);  // and Cursor(): see ConsumerState::Cursor
    for (auto& c : impl_->consumers) {
      for (auto& lane : c->lanes) lane->ring.close();
      if (c->Cursor()) engine_internal::CloseCursor(*c);
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
