// File: src/adapters/nats/bridge.cpp
//
// NatsBridge (inferq/adapters/nats/bridge.hpp) on libnats (nats.c 3.4).
//
// Lock order: Impl::mu_ (the export and import lists, the last error) before an
// Export's mu (its messages in flight). libnats' callbacks take an Export's mu or
// Impl::error_mu_ alone.
#include "inferq/adapters/nats/bridge.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <tuple>
#include <utility>

#include <nats/nats.h>

#include "absl/base/thread_annotations.h"
#include "fetch.hpp"
#include "retry.hpp"
#include "absl/container/flat_hash_map.h"
#include "inferq/base/limits.hpp"
#include "inferq/routing/subject.hpp"

namespace inferq::nats {
namespace {

std::int64_t Millis(absl::Duration d) {
  return std::max<std::int64_t>(1, absl::ToInt64Milliseconds(d));
}

// The client's text for `s`, with its last error's details when it has them.
std::string NatsError(natsStatus s) {
  std::string out = natsStatus_GetText(s);
  natsStatus last = NATS_OK;
  const char* detail = nats_GetLastError(&last);
  if (detail != nullptr && *detail != '\0' && out != detail) out += std::string(": ") + detail;
  return out;
}

std::string JetStreamError(natsStatus s, jsErrCode code) {
  std::string out = NatsError(s);
  if (code != 0) out += " (JetStream error code " + std::to_string(static_cast<int>(code)) + ")";
  return out;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// 1..128 characters of [A-Za-z0-9_-], and '.' too when `dots` (an origin; JetStream
// refuses '.' in stream and consumer names).
absl::Status CheckName(std::string_view what, std::string_view name, bool dots) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(std::string(what) + " '" + std::string(name.substr(0, 128)) +
                                      "' must be 1..128 characters");
  }
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || (dots && c == '.'))) {
      return absl::InvalidArgumentError(std::string(what) + " '" + std::string(name) + "' may hold only " +
                                        (dots ? "[A-Za-z0-9_.-]" : "[A-Za-z0-9_-]"));
    }
  }
  return absl::OkStatus();
}

std::string Dur(absl::Duration d) { return absl::FormatDuration(d); }

// True when a JetStream request failed as requests fail while a cluster forms, elects
// its meta or stream leaders, or places replicas: a timeout, no responders (nothing
// answers the API subject yet), no suitable peers for placement (10005), the system
// temporarily unavailable (10008), not the leader (10009). A server or account
// without JetStream answers no-responders with 10076 or 10039: final.
bool ClusterForming(natsStatus s, jsErrCode code) {
  if (code == JSNotEnabledErr || code == JSNotEnabledForAccountErr) return false;
  return s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || code == JSClusterNoPeersErr ||
         code == JSClusterNotAvailErr || code == JSClusterNotLeaderErr;
}

// The longest NATS subject the bridge sends. A server closes a connection whose
// protocol line ("HPUB <subject> <reply> <sizes>") is longer than its
// max_control_line (4 KiB by default), and the client then gives the connection up
// for good; the margin leaves room for the reply inbox and the sizes.
constexpr std::size_t kMaxNatsSubjectBytes = 3840;
// The header block JetStream stores at most (nats-server refuses a larger one with
// "header size exceeds maximum allowed of 64k": every retry would fail alike).
constexpr std::size_t kMaxJetStreamHeaderBytes = 65535;
// ImportConfig::ack_wait and retry_delay at most: finite, so that the deadlines the
// import computes from them (now + ack_wait / 2) cannot overflow.
constexpr absl::Duration kMaxImportWait = absl::Hours(24 * 7);

std::string DefaultOrigin() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "host");
  std::string out;
  for (const char* p = host; *p != '\0'; ++p) {
    const char c = *p;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    out.push_back(ok ? c : '_');
  }
  out = out.substr(0, 100) + "-" + std::to_string(::getpid());
  return out;
}

// The headers of `m` in order of their names' first appearance; a name with several
// values keeps the first.
std::vector<std::pair<std::string, std::string>> HeadersOf(natsMsg* m) {
  std::vector<std::pair<std::string, std::string>> out;
  const char** keys = nullptr;
  int count = 0;
  if (natsMsgHeader_Keys(m, &keys, &count) != NATS_OK || keys == nullptr) return out;
  for (int i = 0; i < count; ++i) {
    const char* value = nullptr;
    if (natsMsgHeader_Get(m, keys[i], &value) == NATS_OK && value != nullptr) {
      out.emplace_back(keys[i], value);
    }
  }
  std::free(static_cast<void*>(keys));
  return out;
}

struct NatsMsgDeleter {
  void operator()(natsMsg* m) const { natsMsg_Destroy(m); }
};
using NatsMsgPtr = std::unique_ptr<natsMsg, NatsMsgDeleter>;

// A NATS message for `w`, or the client's error.
absl::StatusOr<NatsMsgPtr> MakeNatsMsg(const WireMessage& w) {
  natsMsg* raw = nullptr;
  const auto* data = reinterpret_cast<const char*>(w.payload.data());
  natsStatus s = natsMsg_Create(&raw, w.subject.c_str(), nullptr, data, static_cast<int>(w.payload.size()));
  if (s != NATS_OK) return absl::InternalError("natsMsg_Create for '" + w.subject + "': " + NatsError(s));
  NatsMsgPtr m(raw);
  for (const auto& [k, v] : w.headers) {
    if (s = natsMsgHeader_Add(m.get(), k.c_str(), v.c_str()); s != NATS_OK) {
      return absl::InternalError("natsMsgHeader_Add '" + k + "': " + NatsError(s));
    }
  }
  return m;
}

}  // namespace

struct NatsBridge::Impl {
  struct Export {
    Impl* impl = nullptr;
    ExportConfig cfg;
    std::optional<Consumer> consumer;
    jsCtx* js = nullptr;
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    // Published to JetStream, waiting for the PubAck, by the natsMsg handed to the
    // client (the AckHandler gets that pointer back).
    absl::flat_hash_map<natsMsg*, Message> in_flight ABSL_GUARDED_BY(mu);
    // Set by the export's thread once it called js_PublishMsgAsync: libnats 3.4.1's
    // js_PublishAsyncGetPendingList crashes on a context that never published
    // asynchronously (its table of pending messages is made by the first publish).
    bool published = false;
    // The message inside js_PublishMsgAsync now. libnats 3.4.1 registers a message
    // for its PubAck before it writes it out, and a PubAck timeout (MaxWait) can call
    // OnPubAck while the write still reads the message (a publish waits for the
    // connection's lock during a reconnect): OnPubAck then leaves the message to the
    // publishing thread to destroy (found by ThreadSanitizer, a use after free).
    natsMsg* publishing ABSL_GUARDED_BY(mu) = nullptr;
    bool destroy_after_publish ABSL_GUARDED_BY(mu) = false;
    // The export's thread waits on `cv` for room (in_flight at max_in_flight) and is
    // woken once in_flight is down to resume_at(), not at every PubAck: a wake-up per
    // PubAck cost a context switch per message (bench_bridge, perf).
    bool waiting ABSL_GUARDED_BY(mu) = false;
    std::size_t resume_at() const { return cfg.max_in_flight - 1 - cfg.max_in_flight / 4; }
    // Under `mu`, after in_flight shrank: wakes a waiting export thread when due.
    void NoteRoom() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      if (waiting && in_flight.size() <= resume_at()) cv.notify_all();
    }
  };
  struct Import {
    ImportConfig cfg;
    natsSubscription* sub = nullptr;
    std::thread thread;
    // ImportAck::kConsumed: messages stored in cfg.ack_stream under `seq` and not yet
    // consumed there, oldest first; the NATS message is acked once the stream no
    // longer holds `seq`, and stays here (`consumed`) until JetStream confirmed that
    // ack. Only the import's thread touches them.
    struct Held {
      natsMsg* msg;
      std::uint64_t seq;
      // Not consumed: the next in-progress. Consumed: the next try of the ack.
      std::chrono::steady_clock::time_point next_progress;
      std::string msg_id;  // of the local message at `seq`, to tell a stream added again
      bool consumed = false;
    };
    std::vector<Held> held;
    bool warned_unsettled = false;  // last_error said once that a message was acked when stored
  };

  Impl(Engine& e, BridgeOptions o) : engine(e), options(std::move(o)) {}

  Engine& engine;
  BridgeOptions options;
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;  // imports and stream lookups
  std::atomic<bool> stopping{false};
  std::optional<std::uint64_t> stats_source;  // Engine::AddStatsSource's id
  // "<origin>.<random 64-bit hex>.": the Nats-Msg-Id the export gives an event without
  // a msg_id begins with it (then "<stream>.<sequence>").
  std::string msg_id_prefix;

  std::mutex close_mu;  // held through Close: a second Close returns when the first is done
  std::mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> closing{false};  // Close has begun (OnClosed tells our close from the server's)
  std::vector<std::unique_ptr<Export>> exports ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Import>> imports ABSL_GUARDED_BY(mu);

  std::atomic<bool> connected{false};
  std::atomic<std::uint64_t> disconnects{0}, reconnects{0};
  std::atomic<std::uint64_t> exported{0}, export_pending{0}, export_failures{0}, export_duplicates{0},
      export_loops{0}, export_invalid{0};
  std::atomic<std::uint64_t> imported{0}, import_redelivered{0}, import_duplicates{0},
      import_refused{0}, import_invalid{0}, import_loops{0}, fetch_errors{0}, import_held{0};
  std::mutex closed_cb_mu;
  std::condition_variable closed_cb_cv;
  bool closed_cb_ran ABSL_GUARDED_BY(closed_cb_mu) = false;
  mutable std::mutex error_mu;
  std::string last_error ABSL_GUARDED_BY(error_mu);
  std::string connected_url ABSL_GUARDED_BY(error_mu);  // the server's, as connected last
  // The server's latest asynchronous errors (a permission violation names the
  // subject), at most 16, so that a publish that fails can say why.
  std::deque<std::string> async_errors ABSL_GUARDED_BY(error_mu);

  void Error(std::string what) {
    std::lock_guard l(error_mu);
    last_error = std::move(what);
  }
  // The latest asynchronous error of the server that names `subject` in quotes, as
  // a permission violation does ("Permissions Violation for Publish to "a.b""), or "".
  std::string AsyncErrorAbout(std::string_view subject) const {
    const std::string quoted = "\"" + std::string(subject) + "\"";
    std::lock_guard l(error_mu);
    for (auto it = async_errors.rbegin(); it != async_errors.rend(); ++it) {
      if (it->find(quoted) != std::string::npos) return *it;
    }
    return {};
  }

  // ---- connection callbacks (libnats threads) ----
  static void OnDisconnected(natsConnection*, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    self->connected.store(false);
    self->disconnects.fetch_add(1);
  }
  static void OnReconnected(natsConnection* nc, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    self->NoteUrl(nc);
    self->connected.store(true);
    self->reconnects.fetch_add(1);
  }
  void NoteUrl(natsConnection* c) {
    char buf[512] = {};
    if (natsConnection_GetConnectedUrl(c, buf, sizeof buf) != NATS_OK) buf[0] = '\0';
    std::lock_guard l(error_mu);
    connected_url = buf;
  }
  // The last callback of a connection; libnats runs it on its own thread after
  // natsConnection_Close returned, so Close waits for it before the Impl goes.
  static void OnClosed(natsConnection* nc, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    self->connected.store(false);
    if (!self->closing.load()) {
      const char* text = nullptr;
      const natsStatus st = natsConnection_GetLastError(nc, &text);
      self->Error(std::string("the NATS connection was closed and is not reconnected: ") +
                  natsStatus_GetText(st) + (text != nullptr && *text != '\0' ? std::string(": ") + text : ""));
    }
    std::lock_guard l(self->closed_cb_mu);
    self->closed_cb_ran = true;
    self->closed_cb_cv.notify_all();
  }
  static void OnAsyncError(natsConnection* nc, natsSubscription*, natsStatus err, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    const char* text = nullptr;
    std::string detail = natsStatus_GetText(err);
    if (natsConnection_GetLastError(nc, &text) != NATS_OK && text != nullptr && *text != '\0') {
      detail += std::string(": ") + text;
    }
    {
      std::lock_guard l(self->error_mu);
      self->async_errors.push_back(text != nullptr ? std::string(text) : detail);
      if (self->async_errors.size() > 16) self->async_errors.pop_front();
    }
    self->Error("NATS reported an asynchronous error: " + detail);
  }

  absl::Status Connect() {
    const ConnectionOptions& c = options.connection;
    natsOptions* o = nullptr;
    natsStatus s = natsOptions_Create(&o);
    if (s != NATS_OK) return absl::InternalError("natsOptions_Create: " + NatsError(s));
    std::unique_ptr<natsOptions, void (*)(natsOptions*)> opts(o, natsOptions_Destroy);
    std::vector<const char*> urls;
    for (const auto& u : c.servers) urls.push_back(u.c_str());
    auto check = [&](natsStatus st, std::string_view what) -> absl::Status {
      if (st == NATS_OK) return absl::OkStatus();
      return absl::InvalidArgumentError("NATS connection option " + std::string(what) + ": " + NatsError(st));
    };
    absl::Status st = check(natsOptions_SetServers(o, urls.data(), static_cast<int>(urls.size())),
                            "servers '" + Joined(c.servers) + "'");
    if (st.ok()) st = check(natsOptions_SetName(o, c.name.c_str()), "name");
    if (st.ok()) st = check(natsOptions_SetTimeout(o, Millis(c.connect_timeout)), "connect_timeout");
    if (st.ok()) st = check(natsOptions_SetMaxReconnect(o, c.max_reconnect), "max_reconnect");
    if (st.ok()) st = check(natsOptions_SetReconnectWait(o, Millis(c.reconnect_wait)), "reconnect_wait");
    if (st.ok()) st = check(natsOptions_SetReconnectBufSize(o, c.reconnect_buffer_bytes), "reconnect_buffer_bytes");
    if (st.ok()) st = check(natsOptions_SetDisconnectedCB(o, &Impl::OnDisconnected, this), "callbacks");
    if (st.ok()) st = check(natsOptions_SetReconnectedCB(o, &Impl::OnReconnected, this), "callbacks");
    if (st.ok()) st = check(natsOptions_SetClosedCB(o, &Impl::OnClosed, this), "callbacks");
    if (st.ok()) st = check(natsOptions_SetErrorHandler(o, &Impl::OnAsyncError, this), "callbacks");
    if (st.ok() && !c.user.empty()) {
      st = check(natsOptions_SetUserInfo(o, c.user.c_str(), c.password.c_str()), "user");
    }
    if (st.ok() && !c.token.empty()) st = check(natsOptions_SetToken(o, c.token.c_str()), "token");
    if (st.ok() && !c.credentials_file.empty()) {
      // libnats reads the file only when it connects, and then names it as a failure
      // to connect: read it here, as the TLS files are.
      if (std::ifstream creds(c.credentials_file); !creds.good()) {
        const int e = errno;
        return absl::InvalidArgumentError("NATS connection option credentials_file '" + c.credentials_file +
                                          "': cannot be read: " + std::strerror(e));
      }
      st = check(natsOptions_SetUserCredentialsFromFiles(o, c.credentials_file.c_str(), nullptr),
                 "credentials_file '" + c.credentials_file + "'");
    }
    if (st.ok() && c.tls.enabled) {
      st = check(natsOptions_SetSecure(o, true), "tls");
      if (st.ok() && !c.tls.ca_file.empty()) {
        st = check(natsOptions_LoadCATrustedCertificates(o, c.tls.ca_file.c_str()),
                   "tls.ca_file '" + c.tls.ca_file + "'");
      }
      if (st.ok() && !c.tls.cert_file.empty()) {
        st = check(natsOptions_LoadCertificatesChain(o, c.tls.cert_file.c_str(), c.tls.key_file.c_str()),
                   "tls.cert_file '" + c.tls.cert_file + "' / tls.key_file '" + c.tls.key_file + "'");
      }
      if (st.ok() && !c.tls.expected_hostname.empty()) {
        st = check(natsOptions_SetExpectedHostname(o, c.tls.expected_hostname.c_str()),
                   "tls.expected_hostname");
      }
    }
    if (!st.ok()) return st;
    // No server reachable: tried again for connect_wait (a cluster restarting or out
    // of reach as this process starts); any other error is final at once.
    const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(c.connect_wait);
    const auto pause = std::max<std::chrono::steady_clock::duration>(absl::ToChronoNanoseconds(c.reconnect_wait),
                                                                     std::chrono::milliseconds(100));
    for (int tries = 1;; ++tries) {
      s = natsConnection_Connect(&nc, o);
      if (s == NATS_OK) break;
      nc = nullptr;
      const auto now = std::chrono::steady_clock::now();
      if (s != NATS_NO_SERVER || now >= give_up) {
        std::string how;
        if (c.connect_wait > absl::ZeroDuration()) {
          how = s == NATS_NO_SERVER ? " (tried " + std::to_string(tries) + " times for " + Dur(c.connect_wait) +
                                          ", ConnectionOptions.connect_wait)"
                                    : "";
        }
        return absl::UnavailableError("cannot connect to NATS at '" + Joined(c.servers) + "': " + NatsError(s) +
                                      how);
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, give_up - now));
    }
    NoteUrl(nc);
    connected.store(true);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = Millis(c.jetstream_timeout);
    if (s = natsConnection_JetStream(&js, nc, &jo); s != NATS_OK) {
      return absl::InternalError("natsConnection_JetStream: " + NatsError(s));
    }
    return absl::OkStatus();
  }

  // ---- export ----

  static void OnPubAck(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto* ex = static_cast<Export*>(closure);
    Impl* self = ex->impl;
    // Read before the lock: once destroy_after_publish is set, the publishing thread
    // may destroy `msg` (found by ThreadSanitizer: the subject was read after that).
    const std::string nats_subject = pa == nullptr ? std::string(natsMsg_GetSubject(msg)) : std::string();
    std::optional<Message> m;
    bool destroy = true;
    {
      std::lock_guard l(ex->mu);
      auto node = ex->in_flight.extract(msg);
      if (!node.empty()) {
        m = std::move(node.mapped());
        self->export_pending.fetch_sub(1);  // under `mu`: never above max_in_flight
        ex->NoteRoom();
      }
      if (msg == ex->publishing) {
        ex->destroy_after_publish = true;
        destroy = false;
      }
    }
    if (m) {
      if (pa != nullptr) {
        if (pa->Duplicate) self->export_duplicates.fetch_add(1);
        (void)m->Ack();
        self->exported.fetch_add(1);
      } else {
        std::string why = pae != nullptr && pae->ErrText != nullptr ? pae->ErrText
                          : pae != nullptr ? natsStatus_GetText(pae->Err) : "no PubAck";
        if (std::string server = self->AsyncErrorAbout(nats_subject); !server.empty()) {
          why += " (the server reported: " + server + ")";
        }
        self->Error("export of '" + m->event().subject + "' (stream " + ex->cfg.consumer.stream +
                    " sequence " + std::to_string(m->stream_seq()) + ") to JetStream failed: " + why);
        (void)m->Nak(internal::ExportRetryDelay(ex->cfg.retry_delay, m->attempt()));
        self->export_failures.fetch_add(1);
      }
    }
    if (destroy) natsMsg_Destroy(msg);
  }

  // The NATS message for local message `m`, or nullopt when `m` was settled here
  // (a loop, or an event the mapping refuses).
  std::optional<NatsMsgPtr> Prepare(Export& ex, Message& m) {
    const Event& e = m.event();
    if (e.headers.Has(kOriginHeader)) {
      (void)m.Ack();
      export_loops.fetch_add(1);
      return std::nullopt;
    }
    absl::StatusOr<WireMessage> w = [&]() -> absl::StatusOr<WireMessage> {
      auto subject = AddSubjectPrefix(ex.cfg.subject_prefix, e.subject);
      if (!subject.ok()) return subject.status();
      if (subject->size() > kMaxNatsSubjectBytes) {
        return absl::InvalidArgumentError("NATS subject of " + std::to_string(subject->size()) +
                                          " bytes is longer than the bridge sends (" +
                                          std::to_string(kMaxNatsSubjectBytes) +
                                          "; a server closes a connection over its max_control_line)");
      }
      auto wire = ToWire(e, *subject, ex.cfg.format, options.origin);
      if (!wire.ok()) return wire.status();
      if (e.msg_id.empty()) {
        // Without a msg_id a retried publish whose first try did arrive would be
        // stored twice: the bridge names it itself, for JetStream's duplicate window.
        // The nonce makes it this bridge's own (a restarted memory stream numbers
        // its messages from 1 again).
        wire->headers.insert(wire->headers.begin(),
                             {std::string(kMsgIdHeader), msg_id_prefix + ex.cfg.consumer.stream + "." +
                                                             std::to_string(m.stream_seq())});
      }
      std::size_t header_bytes = 12;  // "NATS/1.0\r\n" ... "\r\n"
      for (const auto& [k, v] : wire->headers) header_bytes += k.size() + v.size() + 4;
      if (ex.cfg.jetstream && header_bytes > kMaxJetStreamHeaderBytes) {
        return absl::InvalidArgumentError("headers of " + std::to_string(header_bytes) +
                                          " bytes are more than JetStream stores (" +
                                          std::to_string(kMaxJetStreamHeaderBytes) + ")");
      }
      const std::size_t bytes = wire->payload.size() + header_bytes;
      const std::int64_t max_payload = natsConnection_GetMaxPayload(nc);
      if (max_payload > 0 && bytes > static_cast<std::size_t>(max_payload)) {
        return absl::InvalidArgumentError("message of " + std::to_string(bytes) +
                                          " bytes (payload and headers) is larger than the server's "
                                          "max_payload of " + std::to_string(max_payload));
      }
      return wire;
    }();
    absl::StatusOr<NatsMsgPtr> nm = w.ok() ? MakeNatsMsg(*w) : absl::StatusOr<NatsMsgPtr>(w.status());
    if (!nm.ok()) {
      Error("export of '" + e.subject + "' refused: " + std::string(nm.status().message()));
      if (nm.status().code() == absl::StatusCode::kInvalidArgument) {
        (void)m.Term("NATS bridge: " + std::string(nm.status().message()));
        export_invalid.fetch_add(1);
      } else {
        (void)m.Nak(internal::ExportRetryDelay(ex.cfg.retry_delay, m.attempt()));
        export_failures.fetch_add(1);
      }
      return std::nullopt;
    }
    return std::move(*nm);
  }

  void PublishJetStream(Export& ex, Message m) {
    std::optional<NatsMsgPtr> nm = Prepare(ex, m);
    if (!nm) return;
    {
      std::unique_lock l(ex.mu);
      if (ex.in_flight.size() >= ex.cfg.max_in_flight) {
        ex.waiting = true;
        ex.cv.wait(l, [&] { return ex.in_flight.size() <= ex.resume_at() || stopping.load(); });
        ex.waiting = false;
      }
      if (stopping.load()) {
        l.unlock();
        (void)m.Nak();
        return;
      }
      export_pending.fetch_add(1);  // before OnPubAck can take it off
      ex.in_flight.emplace(nm->get(), std::move(m));
      ex.publishing = nm->get();
      ex.destroy_after_publish = false;
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = Millis(ex.cfg.ack_timeout);
    natsMsg* raw = nm->release();
    natsMsg* key = raw;
    ex.published = true;
    const natsStatus s = js_PublishMsgAsync(ex.js, &raw, &po);
    bool destroy_now = false;
    std::optional<Message> back;
    {
      std::lock_guard l(ex.mu);
      ex.publishing = nullptr;
      destroy_now = ex.destroy_after_publish;  // OnPubAck ran: the client is done with it
      if (s != NATS_OK && !destroy_now) {
        auto node = ex.in_flight.extract(key);
        if (!node.empty()) back = std::move(node.mapped());
      }
    }
    if (destroy_now) {
      natsMsg_Destroy(key);
      return;
    }
    if (s == NATS_OK) return;  // the client owns it now; OnPubAck settles it
    if (raw != nullptr) natsMsg_Destroy(raw);
    if (back) {
      export_pending.fetch_sub(1);
      Error("export to JetStream failed: js_PublishMsgAsync: " + NatsError(s));
      (void)back->Nak(internal::ExportRetryDelay(ex.cfg.retry_delay, back->attempt()));
      export_failures.fetch_add(1);
    }
  }

  void PublishCore(Export& ex, std::span<Message> batch) {
    // The messages sent, moved to the front of `batch` in order: acked together
    // (AckBatch) once the flush succeeded.
    std::size_t sent_count = 0;
    natsStatus s = NATS_OK;
    for (Message& m : batch) {
      std::optional<NatsMsgPtr> nm = Prepare(ex, m);
      if (!nm) continue;
      if (s == NATS_OK) s = natsConnection_PublishMsg(nc, nm->get());
      if (&batch[sent_count] != &m) batch[sent_count] = std::move(m);
      ++sent_count;
    }
    const std::span<Message> sent = batch.first(sent_count);
    if (sent.empty()) return;
    // The flush in slices of at most 100 ms, so that Close is not held for ack_timeout.
    const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(ex.cfg.ack_timeout);
    while (s == NATS_OK) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0 || stopping.load()) {
        s = NATS_TIMEOUT;
        break;
      }
      const natsStatus f = natsConnection_FlushTimeout(nc, std::min<std::int64_t>(100, left.count()));
      if (f == NATS_OK) break;
      if (f != NATS_TIMEOUT) s = f;
    }
    if (s == NATS_OK) {
      (void)AckBatch(sent);  // a failure: a message settled meanwhile (deleted consumer)
      exported.fetch_add(sent.size());
    } else {
      for (Message& m : sent) {
        (void)m.Nak(internal::ExportRetryDelay(ex.cfg.retry_delay, m.attempt()));
        export_failures.fetch_add(1);
      }
    }
    if (s != NATS_OK) Error("export to core NATS failed: " + NatsError(s));
  }

  void RunExport(Export& ex) {
    absl::StatusOr<Member> member = ex.consumer->member(0);
    if (!member.ok()) return;
    // Up to 64 messages a pull, into this array (NextBatch into a span: no vector).
    std::array<Message, 64> slots;
    while (!stopping.load()) {
      absl::StatusOr<std::size_t> n = member->NextBatch(slots, absl::ZeroDuration(), absl::Milliseconds(100));
      if (!n.ok()) {
        if (n.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
        if (n.status().code() == absl::StatusCode::kCancelled) return;  // the engine closed
        Error("export consumer '" + ex.cfg.consumer.name + "': " + std::string(n.status().message()));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      const std::span<Message> batch = std::span(slots).first(*n);
      if (ex.cfg.jetstream) {
        for (Message& m : batch) PublishJetStream(ex, std::move(m));
      } else {
        PublishCore(ex, batch);
      }
      // Given up now, not when the next pull overwrites them: a Message holds its
      // stored event (and a deleted consumer's interest) while it lives.
      for (Message& m : batch) m = Message();
    }
  }

  // ---- import ----

  // What became of an import's publish into the engine.
  enum class Local { kStored, kBusy, kRefused, kInvalid };
  struct LocalResult {
    Local what;
    std::string why;
    bool duplicate = false;
    std::uint32_t streams = 0;  // streams that stored it or found it a duplicate
    std::uint64_t seq = 0;      // PublishAck::seq
  };

  // A fetched message on its way into the engine, with what mapping it again (for a
  // retry of a busy publish) needs.
  struct Incoming {
    natsMsg* msg = nullptr;
    std::unique_ptr<jsMsgMetaData, void (*)(jsMsgMetaData*)> meta{nullptr, jsMsgMetaData_Destroy};
    std::vector<std::pair<std::string, std::string>> headers;
    std::string subject;  // the local subject
    std::string msg_id;   // ImportAck::kConsumed: the event's, to follow it in ack_stream
  };

  // What TryPublish's result `r` means for an import: nullopt when it found only
  // busy lanes (a full lane of a consumer with overflow block: PublishAck::streams_busy,
  // WouldBlock), so that trying again later may store it. A stream that refuses by
  // its limits or a kReject lane makes it kRefused, also when other streams stored the
  // event (their duplicate window drops the redelivery). kInvalid for an event the
  // engine finds invalid.
  static std::optional<LocalResult> Outcome(const absl::StatusOr<PublishAck>& r) {
    if (r.ok()) {
      if (r->streams_rejected == 0) {
        return LocalResult{Local::kStored, {}, r->streams_stored == 0 && r->duplicate,
                           r->streams_stored + r->streams_duplicate, r->seq};
      }
      if (r->streams_busy < r->streams_rejected) {
        return LocalResult{Local::kRefused,
                           std::to_string(r->streams_rejected - r->streams_busy) +
                               " of the capturing streams refused it (a limit or a full lane with overflow "
                               "reject) while " + std::to_string(r->streams_stored) + " stored it"};
      }
      return std::nullopt;
    }
    if (WouldBlock(r.status())) return std::nullopt;
    switch (r.status().code()) {
      case absl::StatusCode::kResourceExhausted:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kCancelled:
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kFailedPrecondition:
        return LocalResult{Local::kRefused, std::string(r.status().message())};
      default:
        return LocalResult{Local::kInvalid, std::string(r.status().message())};
    }
  }

  // The rest of an import's publish whose first try (`first`, from TryPublishBatch)
  // found only busy lanes: tries again (TryPublish, never blocking the bridge's
  // Close) with the event mapped anew from the NATS message, at most until `give_up`
  // or Close: kBusy then.
  LocalResult RetryBusy(Import& im, const Incoming& in, std::chrono::steady_clock::time_point give_up) {
    auto pause = std::chrono::microseconds(100);
    for (;;) {
      if (stopping.load() || std::chrono::steady_clock::now() >= give_up) {
        return {Local::kBusy, "a lane it must go to stayed full (overflow block)"};
      }
      // Held messages stay in progress in NATS while this waits.
      if (!im.held.empty()) ProgressHeld(im);
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
      absl::StatusOr<Event> again = Map(im, in);
      if (!again.ok()) return {Local::kInvalid, std::string(again.status().message())};
      if (std::optional<LocalResult> r = Outcome(engine.TryPublish(std::move(*again)))) return *r;
    }
  }

  // ImportAck::kConsumed, after `event` (from NATS message `m`) was stored: keeps `m`
  // un-acked until cfg.ack_stream no longer holds it (SettleHeld), and takes it from
  // the fetched list's ownership (true). False, with last_error saying why, when the
  // stored message cannot be followed there: another stream stored it too, or the
  // message at PublishAck::seq in ack_stream is not this event; the caller acks it.
  bool Hold(Import& im, natsMsg* m, const std::string& msg_id, const LocalResult& r) {
    std::string why;
    if (r.streams != 1) {
      why = std::to_string(r.streams) + " local streams stored it";
    } else {
      absl::StatusOr<std::shared_ptr<const Event>> got = engine.GetMessage(im.cfg.ack_stream, r.seq);
      if (got.ok() && (*got)->msg_id != msg_id) {
        why = "another stream stored it (ack_stream '" + im.cfg.ack_stream + "' holds '" + (*got)->msg_id +
              "' at sequence " + std::to_string(r.seq) + ")";
      } else if (!got.ok() && got.status().code() != absl::StatusCode::kNotFound) {
        why = std::string(got.status().message());  // OutOfRange: ack_stream did not store it
      }
      // NotFound: consumed already (or stored elsewhere and the sequence is free in
      // ack_stream; the ack is right either way: it was stored). Held until the next
      // SettleHeld, which acks it.
    }
    if (!why.empty()) {
      if (!im.warned_unsettled) {
        im.warned_unsettled = true;
        Error("import of '" + std::string(natsMsg_GetSubject(m)) + "' (ImportAck::kConsumed): " + why +
              ", so it was acked to NATS once stored");
      }
      return false;
    }
    // A redelivery of a message held already (the local duplicate window dropped the
    // copy, and PublishAck::seq is the original's): the newer delivery replaces the
    // older, which NATS no longer tracks; counted once.
    for (Import::Held& h : im.held) {
      if (h.seq == r.seq) {
        natsMsg_Destroy(h.msg);
        h.msg = m;
        // Consumed: the ack goes to the newer delivery, at once.
        h.next_progress = std::chrono::steady_clock::now() + (h.consumed ? std::chrono::steady_clock::duration{} : Progress(im));
        return true;
      }
    }
    im.held.push_back({m, r.seq, std::chrono::steady_clock::now() + Progress(im), msg_id});
    import_held.fetch_add(1);
    return true;
  }

  // Tells JetStream that the held messages whose time has come are in progress.
  void ProgressHeld(Import& im) {
    const auto now = std::chrono::steady_clock::now();
    for (Import::Held& h : im.held) {
      if (!h.consumed && now >= h.next_progress) {
        (void)natsMsg_InProgress(h.msg, nullptr);
        h.next_progress = now + Progress(im);
      }
    }
  }

  static std::chrono::steady_clock::duration Progress(const Import& im) {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        absl::ToChronoNanoseconds(im.cfg.ack_wait / 3));
  }

  // The ack of held message `h`, consumed locally, confirmed by JetStream
  // (natsMsg_AckSync, waiting at most 1 s or jetstream_timeout). An ack sent without
  // a reply is lost when it reaches no consumer leader: sent while the connection is
  // down, or flushed on reconnecting to servers that restarted and have not elected
  // the consumer's leader yet. JetStream then delivered the finished work again
  // after ack_wait, to another process, which did it twice (the cluster example's
  // outage). False, with last_error saying so, while it is not confirmed.
  bool AckConfirmed(Import& im, Import::Held& h) {
    natsStatus s = NATS_NOT_YET_CONNECTED;
    jsErrCode code = static_cast<jsErrCode>(0);
    if (connected.load()) {
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.Wait = std::min<std::int64_t>(1000, Millis(options.connection.jetstream_timeout));
      s = natsMsg_AckSync(h.msg, &jo, &code);
    }
    if (s == NATS_OK) return true;
    Error("ack of '" + std::string(natsMsg_GetSubject(h.msg)) + "' (consumed from ack_stream '" + im.cfg.ack_stream +
          "' sequence " + std::to_string(h.seq) + ") to JetStream not confirmed: " + JetStreamError(s, code) +
          "; tried again every 250 ms");
    return false;
  }

  // Acks to NATS the held messages that cfg.ack_stream no longer holds (its consumer
  // acked them, or a dead letter, a limit or a purge removed them), each until
  // JetStream confirms it (AckConfirmed, tried again every 250 ms; while one fails,
  // the others wait for the next pass), and tells JetStream the others are in
  // progress every ack_wait / 3. When the stream itself is gone (deleted), what it
  // held was never consumed: it is nak'ed, for another process or a later import.
  void SettleHeld(Import& im) {
    const auto now = std::chrono::steady_clock::now();
    const auto retry_at = now + std::chrono::milliseconds(250);
    bool ack_failed = false;  // this pass: the others wait for the next
    const auto ack = [&](Import::Held& h) {
      if (!ack_failed && AckConfirmed(im, h)) return true;
      ack_failed = true;
      h.consumed = true;
      h.next_progress = retry_at;
      return false;
    };
    std::size_t kept = 0;
    for (Import::Held& h : im.held) {
      if (h.consumed) {
        if (now >= h.next_progress && ack(h)) {
          import_held.fetch_sub(1);
          natsMsg_Destroy(h.msg);
          continue;
        }
        im.held[kept++] = h;
        continue;
      }
      absl::StatusOr<std::shared_ptr<const Event>> got = engine.GetMessage(im.cfg.ack_stream, h.seq);
      if (got.ok() && (*got)->msg_id != h.msg_id) {
        // ack_stream was deleted and added again, and the new one holds another
        // message at this sequence (found by an adversarial review): not consumed.
        import_held.fetch_sub(1);
        Error("import into ack_stream '" + im.cfg.ack_stream + "' (ImportAck::kConsumed): its sequence " +
              std::to_string(h.seq) + " holds '" + (*got)->msg_id + "', not the held '" + h.msg_id +
              "' (the stream was added again); the held message is nak'ed in NATS");
        (void)natsMsg_Nak(h.msg, nullptr);
        natsMsg_Destroy(h.msg);
        continue;
      }
      // NotFound: the stream gave out the sequence and removed it ("holds no
      // message"): consumed; or the stream does not exist (any more). OutOfRange: it
      // never gave the sequence out, so it is another stream of the same name
      // (deleted and added again; found by an adversarial review: the held messages
      // were acked although nobody consumed them).
      if (!got.ok() && (got.status().code() == absl::StatusCode::kNotFound ||
                        got.status().code() == absl::StatusCode::kOutOfRange)) {
        const bool consumed = got.status().code() == absl::StatusCode::kNotFound &&
                              got.status().message().find("holds no message") != absl::string_view::npos;
        if (consumed && !ack(h)) {
          im.held[kept++] = h;
          continue;
        }
        import_held.fetch_sub(1);
        if (!consumed) {
          Error("import into ack_stream '" + im.cfg.ack_stream + "' (ImportAck::kConsumed): " +
                std::string(got.status().message()) + "; what it held is nak'ed in NATS");
          (void)natsMsg_Nak(h.msg, nullptr);
        }
        natsMsg_Destroy(h.msg);
        continue;
      }
      if (now >= h.next_progress) {
        (void)natsMsg_InProgress(h.msg, nullptr);
        h.next_progress = now + Progress(im);
      }
      im.held[kept++] = h;
    }
    im.held.resize(kept);
  }

  // The event of fetched message `in`: again for each retry of a busy publish (the
  // engine takes it).
  absl::StatusOr<Event> Map(const Import& im, const Incoming& in) const {
    const auto* data = reinterpret_cast<const std::byte*>(natsMsg_GetData(in.msg));
    const auto size = static_cast<std::size_t>(std::max(0, natsMsg_GetDataLength(in.msg)));
    absl::StatusOr<Event> event =
        FromWire(in.subject, in.headers, std::span<const std::byte>(data, size), im.cfg.format);
    if (!event.ok()) return event;
    if (event->msg_id.empty() && in.meta != nullptr) {
      event->msg_id = std::string(in.meta->Stream) + ":" + std::to_string(in.meta->Sequence.Stream);
    }
    // What an import brought in is never exported again (ExportConfig): mark it
    // when its publisher did not.
    if (!event->headers.Has(kOriginHeader)) event->headers.Set(std::string(kOriginHeader), "nats:" + im.cfg.stream);
    return event;
  }

  // Reads fetched message `m` and maps it to its event. Nullopt when it was settled
  // here: its own export coming back (a loop: acked) or one the mapping refuses
  // (termed).
  std::optional<std::pair<Incoming, Event>> Admit(Import& im, natsMsg* m) {
    Incoming in;
    in.msg = m;
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, m) == NATS_OK && meta != nullptr) {
      in.meta.reset(meta);
      if (meta->NumDelivered > 1) import_redelivered.fetch_add(1);
    }
    in.headers = HeadersOf(m);
    for (const auto& [k, v] : in.headers) {
      if (k == kOriginHeader && v == options.origin) {
        import_loops.fetch_add(1);
        (void)natsMsg_Ack(m, nullptr);
        return std::nullopt;
      }
    }
    auto subject = ReplaceSubjectPrefix(natsMsg_GetSubject(m), im.cfg.strip_prefix, im.cfg.add_prefix);
    if (!subject.ok()) {
      Invalid(im, m, subject.status());
      return std::nullopt;
    }
    in.subject = std::move(*subject);
    absl::StatusOr<Event> event = Map(im, in);
    if (!event.ok()) {
      Invalid(im, m, event.status());
      return std::nullopt;
    }
    if (im.cfg.ack == ImportAck::kConsumed) in.msg_id = event->msg_id;
    return std::pair<Incoming, Event>(std::move(in), std::move(*event));
  }

  void Invalid(Import& im, natsMsg* m, const absl::Status& st) {
    Error("import of '" + std::string(natsMsg_GetSubject(m)) + "' from JetStream stream '" + im.cfg.stream +
          "' refused: " + std::string(st.message()));
    import_invalid.fetch_add(1);  // counted before NATS hears of it, like `imported`
    (void)natsMsg_Term(m, nullptr);
  }

  // Settles fetched message `in` in NATS by what its local publish did. True when
  // it is held (ImportAck::kConsumed): the caller must not destroy it.
  bool Finish(Import& im, const Incoming& in, const LocalResult& r) {
    natsMsg* m = in.msg;
    switch (r.what) {
      case Local::kStored:
        // Counted before the ack: whoever sees the ack in NATS sees the count.
        if (r.duplicate) import_duplicates.fetch_add(1);
        imported.fetch_add(1);
        if (im.cfg.ack == ImportAck::kConsumed && Hold(im, m, in.msg_id, r)) return true;
        (void)natsMsg_Ack(m, nullptr);
        return false;
      case Local::kBusy:
      case Local::kRefused:
        Error("import of '" + std::string(natsMsg_GetSubject(m)) + "' into the engine: " + r.why + "; nak'ed");
        import_refused.fetch_add(1);
        (void)natsMsg_NakWithDelay(m, Millis(im.cfg.retry_delay), nullptr);
        return false;
      case Local::kInvalid:
        Invalid(im, m, absl::InvalidArgumentError(r.why));
        return false;
    }
    return false;
  }

  // Publishes the fetched messages `list` into the engine in order, as one
  // TryPublishBatch while they are all stored (a puller of the local stream is woken
  // once for the batch, not per message: bench_bridge), and settles each in NATS.
  // A message that meets only busy lanes is tried again until `give_up` (one time for
  // the whole batch, so that its last message waits no longer in NATS, un-acked and
  // without in-progress, than the first) before the ones after it are tried; they
  // overtake it only when it is nak'ed (refused, or busy past give_up) and comes
  // again from JetStream.
  void HandleFetched(Import& im, natsMsgList& list, std::chrono::steady_clock::time_point give_up) {
    std::vector<Incoming> ins;
    std::vector<Event> events;
    std::vector<int> index;  // of ins[k] in list
    ins.reserve(static_cast<std::size_t>(list.Count));
    events.reserve(static_cast<std::size_t>(list.Count));
    for (int i = 0; i < list.Count; ++i) {
      if (stopping.load()) {
        (void)natsMsg_Nak(list.Msgs[i], nullptr);
        continue;
      }
      if (auto a = Admit(im, list.Msgs[i])) {
        ins.push_back(std::move(a->first));
        events.push_back(std::move(a->second));
        index.push_back(i);
      }
    }
    std::size_t next = 0;
    while (next < events.size()) {
      if (stopping.load()) {
        for (; next < ins.size(); ++next) (void)natsMsg_Nak(ins[next].msg, nullptr);
        break;
      }
      if (!im.held.empty()) ProgressHeld(im);
      std::vector<absl::StatusOr<PublishAck>> results =
          engine.TryPublishBatch(std::span<Event>(events).subspan(next));
      for (std::size_t k = 0; k < results.size(); ++k, ++next) {
        std::optional<LocalResult> r = Outcome(results[k]);
        if (!r) r = RetryBusy(im, ins[next], give_up);
        if (Finish(im, ins[next], *r)) list.Msgs[index[next]] = nullptr;  // held: not destroyed with the list
      }
    }
  }

  void RunImport(Import& im) {
    while (!stopping.load()) {
      if (!im.held.empty()) SettleHeld(im);
      // Under max_held, only what there is room for (none: wait for a settle).
      int batch = im.cfg.fetch_batch;
      if (im.cfg.max_held > 0) {
        batch = std::min(batch, im.cfg.max_held - static_cast<int>(im.held.size()));
        if (batch <= 0) {
          // No room. A message that an expired pull left queued here gets no
          // in-progress: give it back at once, for a process with room.
          int queued = 0;
          if (natsSubscription_GetPending(im.sub, &queued, nullptr) == NATS_OK && queued > 0) {
            natsMsgList back{};
            jsErrCode code = static_cast<jsErrCode>(0);
            if (internal::FetchQueuedFirst(&back, im.sub, 1, 5, &code) == NATS_OK) {
              for (int i = 0; i < back.Count; ++i) (void)natsMsg_Nak(back.Msgs[i], nullptr);
              natsMsgList_Destroy(&back);
            }
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          continue;
        }
      }
      natsMsgList list{};
      jsErrCode code = static_cast<jsErrCode>(0);
      // Held messages are looked at every 5 ms while there are some. Not
      // natsSubscription_Fetch: libnats 3.4.1's can overflow (fetch.hpp).
      const natsStatus s = internal::FetchQueuedFirst(&list, im.sub, batch, im.held.empty() ? 200 : 5, &code);
      if (s == NATS_TIMEOUT) continue;
      if (s != NATS_OK) {
        if (stopping.load()) break;
        fetch_errors.fetch_add(1);
        Error("fetch from JetStream consumer '" + im.cfg.durable + "' of stream '" + im.cfg.stream +
              "': " + JetStreamError(s, code));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      const auto give_up = std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               absl::ToChronoNanoseconds(im.cfg.ack_wait / 2));
      HandleFetched(im, list, give_up);
      natsMsgList_Destroy(&list);
    }
    // Closing: what was consumed meanwhile is acked, the rest nak'ed, so that
    // JetStream delivers it again (here after a restart, or to another process). A
    // consumed message whose ack JetStream does not confirm now is not nak'ed: it is
    // done, and comes again only when the ack was lost (after ack_wait).
    if (!im.held.empty()) {
      SettleHeld(im);
      bool confirming = true;  // until one fails: Close waits for one timeout at most
      for (Import::Held& h : im.held) {
        if (!h.consumed) {
          (void)natsMsg_Nak(h.msg, nullptr);
        } else if (!confirming || !(confirming = AckConfirmed(im, h))) {
          (void)natsMsg_Ack(h.msg, nullptr);  // unconfirmed: may still arrive
        }
        natsMsg_Destroy(h.msg);
        import_held.fetch_sub(1);
      }
      im.held.clear();
      (void)natsConnection_FlushTimeout(nc, 1000);
    }
  }

  BridgeStats Snapshot() const {
    BridgeStats s;
    s.connected = connected.load();
    s.disconnects = disconnects.load();
    s.reconnects = reconnects.load();
    s.exported = exported.load();
    s.export_pending = export_pending.load();
    s.export_failures = export_failures.load();
    s.export_duplicates = export_duplicates.load();
    s.export_loops = export_loops.load();
    s.export_invalid = export_invalid.load();
    s.imported = imported.load();
    s.import_redelivered = import_redelivered.load();
    s.import_duplicates = import_duplicates.load();
    s.import_refused = import_refused.load();
    s.import_invalid = import_invalid.load();
    s.import_loops = import_loops.load();
    s.import_held = import_held.load();
    s.fetch_errors = fetch_errors.load();
    std::lock_guard l(error_mu);
    s.last_error = last_error;
    s.connected_url = connected_url;
    return s;
  }

  // The engine's view (EngineStats::components, "nats_bridge.<origin>").
  void FillComponent(ComponentStats& out) const {
    const BridgeStats s = Snapshot();
    auto d = [](std::uint64_t v) { return static_cast<double>(v); };
    out.values = {{"connected", s.connected ? 1.0 : 0.0},
                  {"disconnects_total", d(s.disconnects)},
                  {"reconnects_total", d(s.reconnects)},
                  {"exported_total", d(s.exported)},
                  {"export_pending", d(s.export_pending)},
                  {"export_failures_total", d(s.export_failures)},
                  {"export_duplicates_total", d(s.export_duplicates)},
                  {"export_loops_total", d(s.export_loops)},
                  {"export_invalid_total", d(s.export_invalid)},
                  {"imported_total", d(s.imported)},
                  {"import_redelivered_total", d(s.import_redelivered)},
                  {"import_duplicates_total", d(s.import_duplicates)},
                  {"import_refused_total", d(s.import_refused)},
                  {"import_invalid_total", d(s.import_invalid)},
                  {"import_loops_total", d(s.import_loops)},
                  {"import_held", d(s.import_held)},
                  {"fetch_errors_total", d(s.fetch_errors)}};
    out.detail = s.last_error;
  }

  void Close(absl::Duration drain) {
    std::lock_guard whole(close_mu);
    std::vector<std::unique_ptr<Export>> exs;
    std::vector<std::unique_ptr<Import>> ims;
    {
      std::lock_guard l(mu);
      if (closed) return;
      closed = true;
      exs = std::move(exports);
      ims = std::move(imports);
    }
    closing.store(true);
    if (stats_source) (void)engine.RemoveStatsSource(*stats_source);
    stopping.store(true);
    for (auto& ex : exs) {
      {
        std::lock_guard l(ex->mu);  // so that a waiter sees `stopping`
      }
      ex->cv.notify_all();
    }
    for (auto& ex : exs) {
      if (ex->thread.joinable()) ex->thread.join();
    }
    for (auto& im : ims) {
      if (im->thread.joinable()) im->thread.join();
    }
    for (auto& ex : exs) {
      if (ex->js == nullptr) continue;
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = Millis(drain);
      (void)js_PublishAsyncComplete(ex->js, &po);
      natsMsgList pending{};
      if (ex->published && js_PublishAsyncGetPendingList(&pending, ex->js) == NATS_OK) {
        for (int i = 0; i < pending.Count; ++i) {
          std::optional<Message> m;
          {
            std::lock_guard l(ex->mu);
            auto node = ex->in_flight.extract(pending.Msgs[i]);
            if (!node.empty()) m = std::move(node.mapped());
          }
          if (m) {
            (void)m->Nak();
            export_pending.fetch_sub(1);
          }
        }
        natsMsgList_Destroy(&pending);
      }
      jsCtx_Destroy(ex->js);
      ex->js = nullptr;
      std::lock_guard l(ex->mu);
      for (auto& [k, m] : ex->in_flight) {
        (void)m.Nak();
        export_pending.fetch_sub(1);
      }
      ex->in_flight.clear();
    }
    for (auto& im : ims) {
      if (im->sub != nullptr) natsSubscription_Destroy(im->sub);  // the durable consumer stays
    }
    if (js != nullptr) jsCtx_Destroy(js);
    js = nullptr;
    if (nc != nullptr) {
      natsConnection_Close(nc);
      {
        std::unique_lock l(closed_cb_mu);
        closed_cb_cv.wait(l, [&] { return closed_cb_ran; });
      }
      natsConnection_Destroy(nc);
      nc = nullptr;
    }
  }
};

NatsBridge::NatsBridge(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NatsBridge::~NatsBridge() { Close(); }

void NatsBridge::Close(absl::Duration drain) { impl_->Close(drain); }

const std::string& NatsBridge::origin() const { return impl_->options.origin; }

absl::StatusOr<std::unique_ptr<NatsBridge>> NatsBridge::Connect(Engine& engine, BridgeOptions options) {
  const ConnectionOptions& c = options.connection;
  if (c.servers.empty()) return absl::InvalidArgumentError("BridgeOptions.connection.servers is empty");
  for (std::size_t i = 0; i < c.servers.size(); ++i) {
    if (c.servers[i].empty() || c.servers[i].find_first_of(std::string_view(" \t\r\n,\0", 6)) != std::string::npos) {
      return absl::InvalidArgumentError("BridgeOptions.connection.servers[" + std::to_string(i) + "] '" +
                                        c.servers[i] + "' is not a server URL (empty, or white space, a comma "
                                        "or a NUL in it)");
    }
  }
  // libnats 3.4.1 writes the name into its CONNECT line's JSON without escaping it.
  for (char ch : c.name) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 32 || u == 127 || ch == '"' || ch == '\\') {
      return absl::InvalidArgumentError("BridgeOptions.connection.name '" + c.name +
                                        "' has a control character, '\"' or '\\', which libnats sends unescaped");
    }
  }
  const int credentials = (!c.user.empty() ? 1 : 0) + (!c.token.empty() ? 1 : 0) +
                          (!c.credentials_file.empty() ? 1 : 0);
  if (credentials > 1) {
    return absl::InvalidArgumentError(
        "BridgeOptions.connection: set at most one of user/password, token and credentials_file");
  }
  if (!c.password.empty() && c.user.empty()) {
    return absl::InvalidArgumentError("BridgeOptions.connection.password is set without a user");
  }
  if (c.reconnect_buffer_bytes < 0) {
    return absl::InvalidArgumentError("BridgeOptions.connection.reconnect_buffer_bytes " +
                                      std::to_string(c.reconnect_buffer_bytes) + " is negative");
  }
  if (c.connect_timeout <= absl::ZeroDuration() || c.reconnect_wait < absl::ZeroDuration() ||
      c.jetstream_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "BridgeOptions.connection: connect_timeout (" + Dur(c.connect_timeout) + ") and jetstream_timeout (" +
        Dur(c.jetstream_timeout) + ") must be positive and reconnect_wait (" + Dur(c.reconnect_wait) +
        ") not negative");
  }
  // Every duration up to kMaxDuration: an infinite one would overflow the deadlines
  // computed from it (steady_clock::now() + the duration).
  for (const auto& [name, d] : {std::pair<const char*, absl::Duration>{"connect_timeout", c.connect_timeout},
                                {"reconnect_wait", c.reconnect_wait},
                                {"jetstream_timeout", c.jetstream_timeout},
                                {"jetstream_forming_wait", c.jetstream_forming_wait},
                                {"connect_wait", c.connect_wait}}) {
    if (d < absl::ZeroDuration() || d > kMaxDuration) {
      return absl::InvalidArgumentError(std::string("BridgeOptions.connection.") + name + " " + Dur(d) +
                                        " is not in 0..365 days (kMaxDuration)");
    }
  }
  if (options.origin.empty()) options.origin = DefaultOrigin();
  if (auto st = CheckName("BridgeOptions.origin", options.origin, /*dots=*/true); !st.ok()) return st;
  auto impl = std::make_unique<Impl>(engine, std::move(options));
  {
    std::random_device rd;
    const std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(nonce));
    impl->msg_id_prefix = impl->options.origin + "." + hex + ".";
  }
  if (auto st = impl->Connect(); !st.ok()) {
    impl->Close(absl::ZeroDuration());
    return st;
  }
  Impl* raw = impl.get();
  auto id = engine.AddStatsSource("nats_bridge." + raw->options.origin,
                                  [raw](ComponentStats& out) { raw->FillComponent(out); });
  if (!id.ok()) {
    impl->Close(absl::ZeroDuration());
    return id.status();
  }
  impl->stats_source = *id;
  return std::unique_ptr<NatsBridge>(new NatsBridge(std::move(impl)));
}

absl::Status NatsBridge::AddExport(ExportConfig config) {
  Impl& im = *impl_;
  if (config.max_in_flight < 1 || config.max_in_flight > 65536) {
    return absl::InvalidArgumentError("ExportConfig.max_in_flight " + std::to_string(config.max_in_flight) +
                                      " is not in 1..65536");
  }
  if (config.ack_timeout <= absl::ZeroDuration() || config.retry_delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ExportConfig: ack_timeout (" + Dur(config.ack_timeout) +
                                      ") must be positive and retry_delay (" + Dur(config.retry_delay) +
                                      ") not negative");
  }
  if (config.consumer.ack != AckPolicy::kExplicit) {
    return absl::InvalidArgumentError("ExportConfig.consumer '" + config.consumer.name +
                                      "' must use AckPolicy::kExplicit: the bridge acks a message only "
                                      "once NATS has it");
  }
  if (auto p = AddSubjectPrefix(config.subject_prefix, "x"); !p.ok()) return p.status();
  if (config.subject_prefix.size() + 2 > kMaxNatsSubjectBytes) {
    return absl::InvalidArgumentError("ExportConfig.subject_prefix of " + std::to_string(config.subject_prefix.size()) +
                                      " bytes leaves no room for a subject under the " +
                                      std::to_string(kMaxNatsSubjectBytes) + " bytes the bridge sends");
  }
  if (config.ack_timeout > kMaxDuration || config.retry_delay > kMaxDuration) {
    return absl::InvalidArgumentError("ExportConfig: ack_timeout (" + Dur(config.ack_timeout) + ") and retry_delay (" +
                                      Dur(config.retry_delay) + ") must be at most 365 days (kMaxDuration)");
  }
  config.consumer.members = 1;
  std::lock_guard l(im.mu);
  if (im.closed) return absl::FailedPreconditionError("the NATS bridge is closed");
  auto ex = std::make_unique<Impl::Export>();
  ex->impl = &im;
  ex->cfg = config;
  if (config.jetstream) {
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = Millis(im.options.connection.jetstream_timeout);
    jo.PublishAsync.MaxPending = static_cast<int64_t>(config.max_in_flight);
    jo.PublishAsync.AckHandler = &Impl::OnPubAck;
    jo.PublishAsync.AckHandlerClosure = ex.get();
    if (natsStatus s = natsConnection_JetStream(&ex->js, im.nc, &jo); s != NATS_OK) {
      return absl::InternalError("natsConnection_JetStream: " + NatsError(s));
    }
  }
  absl::StatusOr<Consumer> c = im.engine.AddConsumer(config.consumer);
  if (!c.ok()) {
    if (ex->js != nullptr) jsCtx_Destroy(ex->js);
    return c.status();
  }
  ex->consumer = *c;
  Impl::Export* raw = ex.get();
  ex->thread = std::thread([&im, raw] { im.RunExport(*raw); });
  im.exports.push_back(std::move(ex));
  return absl::OkStatus();
}

absl::Status NatsBridge::AddImport(ImportConfig config) {
  Impl& im = *impl_;
  if (auto st = CheckName("ImportConfig.stream", config.stream, false); !st.ok()) return st;
  if (auto st = CheckName("ImportConfig.durable", config.durable, false); !st.ok()) return st;
  if (config.fetch_batch < 1 || config.fetch_batch > 4096) {
    return absl::InvalidArgumentError("ImportConfig.fetch_batch " + std::to_string(config.fetch_batch) +
                                      " is not in 1..4096");
  }
  if (config.ack_wait <= absl::ZeroDuration() || config.retry_delay < absl::ZeroDuration() ||
      config.ack_wait > kMaxImportWait || config.retry_delay > kMaxImportWait) {
    return absl::InvalidArgumentError("ImportConfig: ack_wait (" + Dur(config.ack_wait) +
                                      ") must be positive and retry_delay (" + Dur(config.retry_delay) +
                                      ") not negative, both at most " + Dur(kMaxImportWait));
  }
  if (!config.filter_subject.empty()) {
    if (auto pattern = SubjectPattern::Parse(config.filter_subject); !pattern.ok()) {
      return absl::InvalidArgumentError("ImportConfig.filter_subject '" + config.filter_subject +
                                        "': " + std::string(pattern.status().message()));
    }
  }
  if (!config.strip_prefix.empty()) {
    if (auto p = AddSubjectPrefix(config.strip_prefix, "x"); !p.ok()) return p.status();
    // Every subject the filter lets through must start with the prefix and a further
    // token, or each message would be refused (terminated) on arrival.
    const std::string lead = config.strip_prefix + ".";
    if (config.filter_subject.size() <= lead.size() || config.filter_subject.compare(0, lead.size(), lead) != 0) {
      return absl::InvalidArgumentError("ImportConfig.strip_prefix '" + config.strip_prefix +
                                        "' does not lead every subject of filter_subject '" +
                                        config.filter_subject + "' (the filter must start with '" + lead +
                                        "' and a further token)");
    }
  }
  if (auto p = AddSubjectPrefix(config.add_prefix, "x"); !p.ok()) return p.status();
  if (config.max_ack_pending < 0 || config.max_ack_pending > 1'000'000) {
    return absl::InvalidArgumentError("ImportConfig.max_ack_pending " + std::to_string(config.max_ack_pending) +
                                      " is not in 0..1000000");
  }
  if (config.max_held < 0 || config.max_held > 1'000'000) {
    return absl::InvalidArgumentError("ImportConfig.max_held " + std::to_string(config.max_held) +
                                      " is not in 0..1000000");
  }
  if (config.ack == ImportAck::kStored && config.max_held != 0) {
    return absl::InvalidArgumentError("ImportConfig.max_held " + std::to_string(config.max_held) +
                                      " is set, but ack is kStored (it bounds what ImportAck::kConsumed holds)");
  }
  if (config.ack == ImportAck::kStored && !config.ack_stream.empty()) {
    return absl::InvalidArgumentError("ImportConfig.ack_stream '" + config.ack_stream +
                                      "' is set, but ack is kStored (it names the stream of ImportAck::kConsumed)");
  }
  if (config.ack == ImportAck::kConsumed) {
    const EngineStats st = im.engine.Stats();
    const StreamStats* local = st.stream(config.ack_stream);
    if (local == nullptr) {
      return absl::InvalidArgumentError("ImportConfig.ack_stream '" + config.ack_stream +
                                        "' is not a stream of the engine (ImportAck::kConsumed needs one)");
    }
    if (local->retention != RetentionPolicy::kWorkQueue) {
      return absl::InvalidArgumentError("ImportConfig.ack_stream '" + config.ack_stream +
                                        "' does not have work-queue retention (ImportAck::kConsumed acks NATS "
                                        "when its consumer's ack removes the message)");
    }
  }
  std::lock_guard l(im.mu);
  if (im.closed) return absl::FailedPreconditionError("the NATS bridge is closed");
  // Each JetStream request below is tried again while it fails as requests fail in a
  // cluster that is forming or electing its leaders (ConnectionOptions::
  // jetstream_forming_wait), and an error that remains says how long it was tried.
  const absl::Duration forming_wait = im.options.connection.jetstream_forming_wait;
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(forming_wait);
  bool gave_up_forming = false;  // the last error was a forming one, retried until give_up
  const auto request = [&](const auto& call) {
    for (;;) {
      jsErrCode c = static_cast<jsErrCode>(0);
      const natsStatus st = call(&c);
      if (st == NATS_OK || !ClusterForming(st, c)) return std::pair<natsStatus, jsErrCode>(st, c);
      if (std::chrono::steady_clock::now() >= give_up || im.stopping.load()) {
        gave_up_forming = true;
        return std::pair<natsStatus, jsErrCode>(st, c);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  };
  const auto waited = [&] {
    if (!gave_up_forming) return std::string();
    return forming_wait > absl::ZeroDuration()
               ? " (a cluster still forming? retried for " + Dur(forming_wait) +
                     ", ConnectionOptions.jetstream_forming_wait)"
               : " (a cluster still forming? tried once: ConnectionOptions.jetstream_forming_wait is 0)";
  };
  natsStatus s = NATS_OK;
  jsErrCode code = static_cast<jsErrCode>(0);
  std::tie(s, code) = request([&](jsErrCode* c) {
    jsStreamInfo* si = nullptr;
    const natsStatus st = js_GetStreamInfo(&si, im.js, config.stream.c_str(), nullptr, c);
    if (si != nullptr) jsStreamInfo_Destroy(si);
    return st;
  });
  if (s == NATS_NOT_FOUND) {
    return absl::NotFoundError("JetStream stream '" + config.stream + "' does not exist");
  }
  if (s != NATS_OK) {
    return absl::UnavailableError("JetStream stream '" + config.stream + "': " + JetStreamError(s, code) +
                                  waited());
  }
  auto imp = std::make_unique<Impl::Import>();
  imp->cfg = config;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = imp->cfg.stream.c_str();
  so.ManualAck = true;
  so.Config.Durable = imp->cfg.durable.c_str();
  so.Config.AckPolicy = js_AckExplicit;
  so.Config.AckWait = absl::ToInt64Nanoseconds(config.ack_wait);
  so.Config.DeliverPolicy = js_DeliverAll;
  so.Config.MaxAckPending = config.max_ack_pending;
  const std::string consumer_name = "JetStream pull consumer '" + config.durable + "' on stream '" + config.stream +
                                    "' (filter '" + config.filter_subject + "')";
  if (config.filter_subject.empty()) {
    // The whole stream. libnats 3.4.1 subscribes without a subject only to a
    // consumer that exists (bound by stream and name): it is created here when
    // missing (JetStream answers a second creation with the same configuration with
    // the consumer), and one that exists must not filter, or the import would take
    // only part of the stream.
    std::string filter;
    std::tie(s, code) = request([&](jsErrCode* c) {
      jsConsumerInfo* ci = nullptr;
      natsStatus st = js_GetConsumerInfo(&ci, im.js, config.stream.c_str(), config.durable.c_str(), nullptr, c);
      if (st == NATS_NOT_FOUND) {
        *c = static_cast<jsErrCode>(0);
        st = js_AddConsumer(&ci, im.js, config.stream.c_str(), &so.Config, nullptr, c);
      }
      if (st == NATS_OK && ci != nullptr && ci->Config != nullptr && ci->Config->FilterSubject != nullptr) {
        filter = ci->Config->FilterSubject;
      }
      if (ci != nullptr) jsConsumerInfo_Destroy(ci);
      return st;
    });
    if (s != NATS_OK) return absl::UnavailableError(consumer_name + ": " + JetStreamError(s, code) + waited());
    if (!filter.empty()) {
      return absl::FailedPreconditionError(consumer_name + " exists with filter '" + filter +
                                           "': it does not deliver the whole stream (name a durable without "
                                           "a filter, or set ImportConfig.filter_subject to '" + filter + "')");
    }
    so.Consumer = imp->cfg.durable.c_str();
  }
  std::tie(s, code) = request([&](jsErrCode* c) {
    return js_PullSubscribe(&imp->sub, im.js, imp->cfg.filter_subject.empty() ? nullptr : imp->cfg.filter_subject.c_str(),
                            imp->cfg.durable.c_str(), nullptr, &so, c);
  });
  if (s != NATS_OK) return absl::UnavailableError(consumer_name + ": " + JetStreamError(s, code) + waited());
  Impl::Import* raw = imp.get();
  imp->thread = std::thread([&im, raw] { im.RunImport(*raw); });
  im.imports.push_back(std::move(imp));
  return absl::OkStatus();
}

BridgeStats NatsBridge::Stats() const { return impl_->Snapshot(); }

}  // namespace inferq::nats
