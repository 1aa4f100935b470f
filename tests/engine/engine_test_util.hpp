// Helpers shared by the engine's test files: building events, reading stats,
// draining a member, and an engine on a manual clock with a dead-letter stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/engine/engine.hpp"

namespace inferq::engine_test {

inline std::string Msg(const absl::Status& s) { return std::string(s.message()); }

inline Event Ev(std::string subject, std::string msg_id = "", std::string seq_id = "") {
  Event e;
  e.subject = std::move(subject);
  e.msg_id = std::move(msg_id);
  e.seq_id = std::move(seq_id);
  return e;
}

// An event on work.a with a tier, tenant and priority (QoS lanes).
inline Event Tiered(std::string id, Qos tier, std::string tenant, std::int32_t priority = 0) {
  Event e = Ev("work.a", std::move(id));
  e.qos = tier;
  e.tenant = std::move(tenant);
  e.priority = priority;
  return e;
}

inline ConsumerStats CS(const Engine& engine, std::string_view stream, std::string_view name) {
  const EngineStats st = engine.Stats();
  const ConsumerStats* c = st.consumer(stream, name);
  REQUIRE(c != nullptr);
  return *c;
}

inline StreamStats SS(const Engine& engine, std::string_view name) {
  const EngineStats st = engine.Stats();
  REQUIRE(st.stream(name) != nullptr);
  return *st.stream(name);
}

// A header's value, or "<absent>".
inline std::string H(const Event& e, std::string_view name) {
  auto v = e.headers.Get(name);
  return v ? std::string(*v) : std::string("<absent>");
}

// Polls `done` (real time) until it holds or 30 s pass; whether it held. For work
// that engine threads finish after a call returns (a handler after Close).
template <class Pred>
bool Eventually(Pred done) {
  for (int i = 0; i < 30'000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

// Drains a member without waiting; returns the msg_ids (acks each when asked).
inline std::vector<std::string> Drain(Member& m, bool ack = true) {
  std::vector<std::string> got;
  for (;;) {
    auto r = m.Next(absl::ZeroDuration());
    if (!r.ok()) break;
    got.push_back(r->event().msg_id);
    if (ack) REQUIRE(r->Ack().ok());
  }
  return got;
}

// An engine on a manual clock (manual timers) with stream S (work.>) and a
// dead-letter stream DLQ (dead.>) read by `dlq`.
struct Fixture {
  ManualClock clock{1'000'000'000};
  std::unique_ptr<Engine> owned_engine =
      Engine::Create({.clock = &clock, .manual_timers = true}).value();
  Engine& engine = *owned_engine;
  Member dlq = Init();
  Member Init() {
    REQUIRE(engine.AddStream({.name = "S", .subjects = {"work.>"}}).ok());
    REQUIRE(engine.AddStream({.name = "DLQ", .subjects = {"dead.>"}}).ok());
    auto d = engine.AddConsumer({.stream = "DLQ", .name = "dlq", .lane_capacity = 1 << 16});
    REQUIRE(d.ok());
    return *d->member(0);
  }
  // Adds a consumer of S (name "c" unless given) and returns its member 0.
  Member Add(ConsumerConfig cc) {
    cc.stream = "S";
    if (cc.name.empty()) cc.name = "c";
    auto c = engine.AddConsumer(cc);
    REQUIRE(c.ok());
    return *c->member(0);
  }
};

}  // namespace inferq::engine_test
