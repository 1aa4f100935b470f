// Helpers of the NATS bridge's tests: a plain nats.c client for the tests' own
// checks (streams, counts, consumer state, publishing with headers), engines, bridge
// options, and waiting with a limit.
#pragma once

#include <nats/nats.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "inferq/adapters/nats/bridge.hpp"
#include "nats_server.hpp"

namespace inferq_test {

using namespace inferq;
using namespace inferq::nats;

inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

struct Client {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  explicit Client(const std::string& url) {
    REQUIRE(natsConnection_ConnectTo(&nc, url.c_str()) == NATS_OK);
    REQUIRE(natsConnection_JetStream(&js, nc, nullptr) == NATS_OK);
  }
  // Connects with `options` (credentials, TLS); the caller keeps and destroys them.
  explicit Client(natsOptions* options) {
    REQUIRE(natsConnection_Connect(&nc, options) == NATS_OK);
    REQUIRE(natsConnection_JetStream(&js, nc, nullptr) == NATS_OK);
  }
  ~Client() {
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
  }
  void AddStream(const char* name, const char* subject, int64_t max_msg_size = -1) {
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    const char* subjects[] = {subject};
    c.Name = name;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    if (max_msg_size > 0) c.MaxMsgSize = static_cast<int32_t>(max_msg_size);
    jsStreamInfo* si = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    REQUIRE(js_AddStream(&si, js, &c, nullptr, &err) == NATS_OK);
    jsStreamInfo_Destroy(si);
  }
  std::uint64_t Messages(const char* stream) {
    jsStreamInfo* si = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    if (js_GetStreamInfo(&si, js, stream, nullptr, &err) != NATS_OK) return 0;
    const std::uint64_t n = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    return n;
  }
  std::pair<std::int64_t, std::uint64_t> ConsumerState(const char* stream, const char* durable) {
    jsConsumerInfo* ci = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    if (js_GetConsumerInfo(&ci, js, stream, durable, nullptr, &err) != NATS_OK) return {-1, 0};
    std::pair<std::int64_t, std::uint64_t> out{ci->NumAckPending, ci->NumPending};
    jsConsumerInfo_Destroy(ci);
    return out;
  }
  void Publish(const std::string& subject, const std::string& data,
               const std::vector<std::pair<std::string, std::string>>& headers) {
    natsMsg* m = nullptr;
    REQUIRE(natsMsg_Create(&m, subject.c_str(), nullptr, data.data(), static_cast<int>(data.size())) == NATS_OK);
    for (const auto& [k, v] : headers) REQUIRE(natsMsgHeader_Add(m, k.c_str(), v.c_str()) == NATS_OK);
    jsPubAck* pa = nullptr;
    jsErrCode err = static_cast<jsErrCode>(0);
    REQUIRE(js_PublishMsg(&pa, js, m, nullptr, &err) == NATS_OK);
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
  }
  // Every message of `stream` from the start: subject, data and headers.
  std::vector<natsMsg*> ReadAll(const char* stream, std::uint64_t count) {
    std::vector<natsMsg*> out;
    for (std::uint64_t seq = 1; seq <= count; ++seq) {
      natsMsg* m = nullptr;
      jsErrCode err = static_cast<jsErrCode>(0);
      if (js_GetMsg(&m, js, stream, seq, nullptr, &err) == NATS_OK) out.push_back(m);
    }
    return out;
  }
  // The Nats-Msg-Ids of the first `count` messages of `stream`.
  std::set<std::string> Ids(const char* stream, std::uint64_t count) {
    std::set<std::string> ids;
    for (std::uint64_t seq = 1; seq <= count; ++seq) {
      natsMsg* m = nullptr;
      jsErrCode err = static_cast<jsErrCode>(0);
      if (js_GetMsg(&m, js, stream, seq, nullptr, &err) == NATS_OK) {
        const char* v = nullptr;
        if (natsMsgHeader_Get(m, "Nats-Msg-Id", &v) == NATS_OK) ids.insert(v);
        natsMsg_Destroy(m);
      }
    }
    return ids;
  }
};

inline std::unique_ptr<Engine> NewEngine() {
  auto e = Engine::Create();
  REQUIRE(e.ok());
  return std::move(*e);
}

inline BridgeOptions Options(const NatsServer& server, std::string origin) {
  BridgeOptions o;
  o.connection.servers = {server.url()};
  o.connection.reconnect_wait = absl::Milliseconds(50);
  o.origin = std::move(origin);
  return o;
}

// Event i: msg_id "m-<i>", tenant "acme", seq_id "s" with seq_no i, header "i", payload
// "payload-<i>".
inline Event Work(int i, std::string subject = "work.item") {
  Event e;
  e.subject = std::move(subject);
  e.msg_id = "m-" + std::to_string(i);
  e.tenant = "acme";
  e.seq_id = "s";
  e.seq_no = static_cast<std::uint64_t>(i);
  e.headers.Set("i", std::to_string(i));
  e.payload = Buffer::FromString("payload-" + std::to_string(i));
  return e;
}

inline std::uint64_t Acked(Engine& e, const char* stream, const char* consumer) {
  const EngineStats es = e.Stats();
  const ConsumerStats* c = es.consumer(stream, consumer);
  return c == nullptr ? 0 : c->acked;
}

inline int Drain(Consumer& c, absl::Duration wait = absl::Milliseconds(300)) {
  auto m = c.member(0);
  int n = 0;
  for (;;) {
    auto x = m->Next(wait);
    if (!x.ok()) return n;
    (void)x->Ack();
    ++n;
  }
}


// The fixture of a test against one nats-server of its own (TEST_CASE_METHOD): its
// temporary directory, the server (started), and a JetStream client of it.
struct OneServer {
  TempDir dir;
  NatsServer server{dir.path()};
  Client client;
  OneServer() : client(Started(server)) {}
  static std::string Started(NatsServer& s) {
    REQUIRE(s.Start());
    return s.url();
  }
};

}  // namespace inferq_test
