#include "cluster.hpp"

#include <nats/nats.h>

#include <chrono>
#include <thread>

namespace inferq::example {
namespace {

std::string ServerList(const std::vector<std::string>& servers) {
  std::string out;
  for (const std::string& s : servers) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string JsError(natsStatus s, jsErrCode code) {
  std::string out = natsStatus_GetText(s);
  if (const char* last = nats_GetLastError(nullptr); last != nullptr && *last != '\0') out += std::string(": ") + last;
  if (code != 0) out += " (JetStream error " + std::to_string(static_cast<int>(code)) + ")";
  return out;
}

// True when a JetStream request failed as it does while a cluster forms: see
// EnsureStream. The bridge's AddImport retries the same errors
// (ConnectionOptions::jetstream_forming_wait).
bool Forming(natsStatus st, jsErrCode err) {
  if (err == JSNotEnabledErr || err == JSNotEnabledForAccountErr) return false;
  return st == NATS_TIMEOUT || st == NATS_NO_RESPONDERS || err == JSClusterNoPeersErr ||
         err == JSClusterNotAvailErr || err == JSClusterNotLeaderErr;
}

// One stream: created when missing, then (with `purge`) emptied.
absl::Status EnsureStream(jsCtx* js, const char* name, const std::string& subject, int replicas, bool purge) {
  jsStreamConfig c;
  jsStreamConfig_Init(&c);
  const char* subjects[] = {subject.c_str()};
  c.Name = name;
  c.Subjects = subjects;
  c.SubjectsLen = 1;
  c.Retention = js_WorkQueuePolicy;
  c.Storage = js_FileStorage;
  c.Replicas = replicas;
  jsStreamInfo* si = nullptr;
  jsErrCode code = static_cast<jsErrCode>(0);
  // Two processes may create it at once: the server answers the second with the
  // stream when the configurations are the same.
  // A cluster that has just started elects its meta leader (until then requests time
  // out, or find no responders, or the system is unavailable), then learns its peers
  // (until then a replicated stream finds "no suitable peers for placement"): those
  // are retried for kFormingWait (30 s), as a loaded machine took more than the 10 s
  // of 20 attempts (CI), and so is the purge. Any other error is final.
  // A server without JetStream answers no-responders too, with JSNotEnabledErr:
  // final. So is 10005 from a formed cluster with fewer servers than `replicas`; it
  // cannot be told from a forming one, so it fails after kFormingWait, and the
  // message names that cause.
  // nats-server before 2.10.2 may answer a creation that races another one for the
  // same stream with "stream not found" (10059; fixed there by waiting for the
  // stream the assignment names, nats-server pull request 4600): a creation cannot
  // mean it otherwise, so it is retried as the forming errors are. So is a purge of
  // the stream just created (its meta layer may not have applied it yet).
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(kFormingWait);
  bool waited = false;  // the last error was a forming one, retried until give_up
  const auto retry = [&](const auto& request) {
    for (;;) {
      code = static_cast<jsErrCode>(0);
      const natsStatus st = request();
      if (st == NATS_OK || code == JSStreamNameExistErr || !(Forming(st, code) || code == JSStreamNotFoundErr)) {
        return st;
      }
      if (std::chrono::steady_clock::now() >= give_up) {
        waited = true;
        return st;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  };
  const auto how_long = [&] {
    return waited ? " (retried for " + absl::FormatDuration(kFormingWait) + " while the cluster formed)" : "";
  };
  natsStatus s = retry([&] {
    if (si != nullptr) jsStreamInfo_Destroy(si);
    si = nullptr;
    return js_AddStream(&si, js, &c, nullptr, &code);
  });
  if (si != nullptr) jsStreamInfo_Destroy(si);
  if (s != NATS_OK) {
    std::string why = JsError(s, code) + how_long();
    if (code == JSClusterNoPeersErr) {
      why += ": are there fewer than " + std::to_string(replicas) +
             " JetStream servers in the cluster? (--js-replicas)";
    }
    return absl::FailedPreconditionError("JetStream stream '" + std::string(name) + "' (" + subject + ", work queue, " +
                                         std::to_string(replicas) + " replicas): " + why);
  }
  if (purge) {
    // The stream's leader may still be elected (a stream that existed before).
    waited = false;
    s = retry([&] { return js_PurgeStream(js, name, nullptr, &code); });
    if (s != NATS_OK) {
      return absl::UnavailableError("purging JetStream stream '" + std::string(name) + "': " + JsError(s, code) +
                                    how_long());
    }
  }
  return absl::OkStatus();
}

nats::BridgeOptions Options(const ClusterConfig& config, std::string origin, std::string name) {
  nats::BridgeOptions o;
  o.connection.servers = config.servers;
  o.connection.name = std::move(name);
  o.connection.reconnect_wait = absl::Milliseconds(100);
  o.connection.reconnect_buffer_bytes = 32 << 20;
  // The durable consumers are created (or looked up) while the cluster may still
  // form, as the streams are (a CI run: "JetStream pull consumer 'replicas' ...
  // Timeout" after one try).
  o.connection.jetstream_forming_wait = kFormingWait;
  // A process that starts while every server is out of reach (the demo's --outage
  // under load, a cluster restarting) waits for one as long, instead of failing.
  o.connection.connect_wait = kFormingWait;
  o.origin = std::move(origin);
  return o;
}

}  // namespace

namespace {

// A connection to the cluster's servers and its JetStream context, for one short
// task; `status` says whether it is usable. While no server is reachable, the
// connection is tried again every 250 ms for `connect_wait`.
struct JetStreamSession {
  natsOptions* opts = nullptr;
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  absl::Status status;
  JetStreamSession(const ClusterConfig& config, absl::Duration connect_wait) {
    std::vector<const char*> urls;
    for (const std::string& s : config.servers) urls.push_back(s.c_str());
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetServers(opts, urls.data(), static_cast<int>(urls.size()));
    if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 2000);
    const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(connect_wait);
    while (s == NATS_OK) {
      s = natsConnection_Connect(&nc, opts);
      if (s != NATS_NO_SERVER || std::chrono::steady_clock::now() >= give_up) break;
      nc = nullptr;
      s = NATS_OK;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    if (s == NATS_OK) s = natsConnection_JetStream(&js, nc, nullptr);
    if (s != NATS_OK) {
      status = absl::UnavailableError("cannot reach NATS at '" + ServerList(config.servers) + "': " +
                                      JsError(s, static_cast<jsErrCode>(0)));
    }
  }
  ~JetStreamSession() {
    if (js != nullptr) jsCtx_Destroy(js);
    if (nc != nullptr) natsConnection_Destroy(nc);
    if (opts != nullptr) natsOptions_Destroy(opts);
  }
  JetStreamSession(const JetStreamSession&) = delete;
  JetStreamSession& operator=(const JetStreamSession&) = delete;
};

}  // namespace

absl::Status EnsureReplayStreams(const ClusterConfig& config, bool purge) {
  JetStreamSession session(config, kFormingWait);
  if (!session.status.ok()) return session.status;
  absl::Status out =
      EnsureStream(session.js, kRequestsJetStream, "infer." + config.model + ".request", config.stream_replicas, purge);
  if (out.ok()) out = EnsureStream(session.js, kTokensJetStream, "infer.reply.>", config.stream_replicas, purge);
  return out;
}

absl::StatusOr<std::uint64_t> MessagesInJetStream(const ClusterConfig& config) {
  JetStreamSession session(config, absl::ZeroDuration());  // one try: the caller asks again
  if (!session.status.ok()) return session.status;
  std::uint64_t held = 0;
  for (const char* name : {kRequestsJetStream, kTokensJetStream}) {
    jsStreamInfo* si = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetStreamInfo(&si, session.js, name, nullptr, &code);
    if (s == NATS_OK && si != nullptr) held += si->State.Msgs;
    if (si != nullptr) jsStreamInfo_Destroy(si);
    if (s != NATS_OK) {
      return absl::UnavailableError("JetStream stream '" + std::string(name) + "': " + JsError(s, code));
    }
  }
  return held;
}

absl::StatusOr<std::unique_ptr<nats::NatsBridge>> StartClientBridge(Engine& engine, const ClusterConfig& config) {
  auto bridge = nats::NatsBridge::Connect(engine, Options(config, "", "inference_server client"));
  if (!bridge.ok()) return bridge.status();
  // Requests: acked locally once INFER_REQUESTS stored them (PubAck).
  if (auto st = (*bridge)->AddExport({.consumer = {.stream = "REQUESTS",
                                                   .name = "to-nats",
                                                   .deliver = DeliverPolicy::kAll,
                                                   .lane_capacity = 65536,
                                                   .ack_wait = absl::Seconds(30)}});
      !st.ok()) {
    return st;
  }
  // Tokens: acked to NATS once the local REPLIES stored them; a redelivery is dropped
  // by REPLIES' duplicate window (the replicas' exports give every token a
  // Nats-Msg-Id).
  if (auto st = (*bridge)->AddImport({.stream = kTokensJetStream,
                                      .durable = "client",
                                      .filter_subject = "infer.reply.>",
                                      .fetch_batch = 512,
                                      .max_ack_pending = 65536});
      !st.ok()) {
    return st;
  }
  return bridge;
}

absl::StatusOr<std::unique_ptr<nats::NatsBridge>> StartReplicaBridge(Engine& engine, const ClusterConfig& config,
                                                                     const std::string& origin) {
  auto bridge = nats::NatsBridge::Connect(engine, Options(config, origin, "inference_server " + origin));
  if (!bridge.ok()) return bridge.status();
  if (auto st = (*bridge)->AddExport({.consumer = {.stream = "REPLIES",
                                                   .name = "to-nats",
                                                   .deliver = DeliverPolicy::kAll,
                                                   .lane_capacity = 65536,
                                                   .ack_wait = absl::Seconds(30)},
                                      .max_in_flight = 4096});
      !st.ok()) {
    return st;
  }
  // Small fetches: the replicas share the requests as they come.
  if (auto st = (*bridge)->AddImport({.stream = kRequestsJetStream,
                                      .durable = "replicas",
                                      .filter_subject = "infer." + config.model + ".request",
                                      .fetch_batch = 2,
                                      .ack_wait = kJetStreamAckWait,
                                      .ack = nats::ImportAck::kConsumed,
                                      .ack_stream = "REQUESTS",
                                      .max_ack_pending = 20000,
                                      .max_held = config.replica_room});
      !st.ok()) {
    return st;
  }
  return bridge;
}

}  // namespace inferq::example
