// inference_server --role replica against a JetStream cluster that is still forming:
// its streams have 3 replicas, and until the meta leader knows three peers JetStream
// answers "no suitable peers for placement" (error 10005). The smallest input of a CI
// failure: cluster_demo's first replica process gave up after 20 attempts (10 s) on
// a loaded machine. It now retries such errors for 30 s; any other error is final,
// but for the "stream not found" an older nats-server answers to a creation racing
// another one (the last case).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <nats/nats.h>

#include "../adapters/nats_server.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Polls until `log` holds `text` or `pid` exits or `limit` passes; true when found.
bool WaitForText(const std::string& log, const std::string& text, pid_t pid, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (inferq_test::ReadText(log).find(text) != std::string::npos) return true;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return inferq_test::ReadText(log).find(text) != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

TEST_CASE("a replica process waits for a forming JetStream cluster to place its streams") {
  inferq_test::TempDir dir;
  inferq_test::NatsCluster cluster(dir.path(), 3);
  // Two of three: a meta leader is elected (a quorum), but a stream of 3 replicas
  // has nowhere to go.
  REQUIRE(cluster.server(0).Start());
  REQUIRE(cluster.server(1).Start());
  const std::string urls = cluster.server(0).url() + "," + cluster.server(1).url();
  const std::string log = (dir.path() / "replica.log").string();
  pid_t replica = inferq_test::Spawn({INFERQ_INFERENCE_SERVER, "--role", "replica", "--replicas", "1", "--nats", urls,
                                      "--js-replicas", "3", "--limit", "1", "--speed", "1000"},
                                     log);
  REQUIRE(replica > 0);
  // 15 s without a third peer: the replica used to give up after 20 attempts, 10.5 s
  // here (the first ones wait for the meta leader); it now tries for 30 s.
  std::this_thread::sleep_for(std::chrono::seconds(15));
  int status = 0;
  const bool exited = ::waitpid(replica, &status, WNOHANG) == replica;
  INFO(inferq_test::ReadText(log));
  CHECK_FALSE(exited);
  if (exited) replica = -1;
  REQUIRE(cluster.server(2).Start());
  if (replica > 0) {
    CHECK(WaitForText(log, "1 replicas ready", replica, std::chrono::seconds(60)));
    inferq_test::SignalAndReap(replica, SIGTERM);
  }
}

namespace {

// Runs a replica process against `nats_url` asking for `js_replicas`; waits at most
// 20 s (shorter than the 30 s of retries) for it to exit. Returns its output; sets
// *exit_code to its exit code, or -1 when it did not exit (it is killed then).
std::string RunReplica(const inferq_test::TempDir& dir, const std::string& nats_url, const std::string& js_replicas,
                       int* exit_code) {
  const std::string log = (dir.path() / "replica.log").string();
  pid_t replica = inferq_test::Spawn({INFERQ_INFERENCE_SERVER, "--role", "replica", "--replicas", "1", "--nats",
                                      nats_url, "--js-replicas", js_replicas, "--limit", "1", "--speed", "1000"},
                                     log);
  const auto until = Clock::now() + std::chrono::seconds(20);
  int status = 0;
  bool exited = false;
  while (replica > 0 && !(exited = ::waitpid(replica, &status, WNOHANG) == replica) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) inferq_test::SignalAndReap(replica, SIGKILL);
  *exit_code = exited && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return inferq_test::ReadText(log);
}

}  // namespace

TEST_CASE("a replica process gives up at once on a JetStream error that waiting does not cure") {
  inferq_test::TempDir dir;
  SECTION("replicas on a server that is not clustered (10074)") {
    inferq_test::NatsServer server(dir.path());
    REQUIRE(server.Start());
    int code = 0;
    const std::string out = RunReplica(dir, server.url(), "3", &code);
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find("JetStream stream 'INFER_REQUESTS' (infer.llama2-70b.request, work queue, 3 replicas): ") !=
          std::string::npos);
    CHECK(out.find("(JetStream error 10074)") != std::string::npos);
  }
  SECTION("a server without JetStream (10076, with no responders)") {
    inferq_test::NatsServer server(dir.path(), {}, /*jetstream=*/false);
    REQUIRE(server.Start());
    int code = 0;
    const std::string out = RunReplica(dir, server.url(), "1", &code);
    INFO(out);
    CHECK(code == 1);
    CHECK(out.find("(JetStream error 10076)") != std::string::npos);
  }
}

// A client whose tokens are slow to come (an outage, a cluster electing leaders again
// and again under load) gave up after 30 s without a token and reported as lost what
// the replicas were still retrying (issue: "1020 lost" after a 3-second outage at load
// 9-12). It now gives up only once JetStream has also said for 30 s that it holds
// nothing for the replay. Here the one request waits in INFER_REQUESTS for a replica
// that starts only after 40 s without a token: the client must still be there.
TEST_CASE("the client does not give up on a request JetStream still holds") {
  inferq_test::TempDir dir;
  inferq_test::NatsServer server(dir.path());
  REQUIRE(server.Start());
  const std::string client_log = (dir.path() / "client.log").string();
  pid_t client = inferq_test::Spawn({INFERQ_INFERENCE_SERVER, "--role", "client", "--replicas", "1", "--nats",
                                     server.url(), "--limit", "1", "--speed", "1000"},
                                    client_log);
  REQUIRE(client > 0);
  std::this_thread::sleep_for(std::chrono::seconds(40));
  int status = 0;
  const bool gave_up = ::waitpid(client, &status, WNOHANG) == client;
  INFO(inferq_test::ReadText(client_log));
  CHECK_FALSE(gave_up);
  if (gave_up) client = -1;
  const std::string replica_log = (dir.path() / "replica.log").string();
  pid_t replica = inferq_test::Spawn({INFERQ_INFERENCE_SERVER, "--role", "replica", "--replicas", "1", "--nats",
                                      server.url(), "--limit", "1", "--speed", "1000"},
                                     replica_log);
  REQUIRE(replica > 0);
  if (client > 0) {
    // The request completes: the client exits 0 (waited for at most 120 s).
    const auto until = Clock::now() + std::chrono::seconds(120);
    bool exited = false;
    while (!(exited = ::waitpid(client, &status, WNOHANG) == client) && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    INFO(inferq_test::ReadText(client_log));
    REQUIRE(exited);
    client = -1;
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(inferq_test::ReadText(client_log).find("requests   1 total, 1 completed") != std::string::npos);
  }
  if (client > 0) inferq_test::SignalAndReap(client, SIGKILL);
  inferq_test::SignalAndReap(replica, SIGTERM);
}

namespace {

// Answers JetStream's stream-creation requests on a server without JetStream, as
// nats-server 2.9 answered one that raced another creation of the same stream:
// "stream not found" (10059) for the first `not_found` requests of each stream, then
// the stream's info. Counts the requests per stream.
struct FakeStreamCreation {
  int not_found = 0;
  std::mutex mu;
  std::map<std::string, int> requests;  // stream name -> creation requests seen

  static void OnRequest(natsConnection* nc, natsSubscription*, natsMsg* msg, void* self_ptr) {
    auto* self = static_cast<FakeStreamCreation*>(self_ptr);
    const std::string subject = natsMsg_GetSubject(msg);
    const std::string name = subject.substr(subject.rfind('.') + 1);
    int seen = 0;
    {
      std::lock_guard<std::mutex> lock(self->mu);
      seen = ++self->requests[name];
    }
    const std::string body =
        seen <= self->not_found
            ? R"({"type":"io.nats.jetstream.api.v1.stream_create_response",)"
              R"("error":{"code":404,"err_code":10059,"description":"stream not found"}})"
            : R"({"type":"io.nats.jetstream.api.v1.stream_create_response","config":{"name":")" + name +
                  R"(","retention":"workqueue","storage":"file","num_replicas":3},)"
                  R"("created":"2026-12-06T00:00:00Z","state":{"messages":0,"bytes":0}})";
    if (natsMsg_GetReply(msg) != nullptr) {
      natsConnection_PublishString(nc, natsMsg_GetReply(msg), body.c_str());
    }
    natsMsg_Destroy(msg);
  }
  int RequestsFor(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = requests.find(name);
    return it == requests.end() ? 0 : it->second;
  }
};

}  // namespace

// A CI failure: cluster_demo's replica processes create INFER_REQUESTS at the same
// moment, and nats-server 2.9 answered one of them "stream not found" (10059); the
// replica took it as final ("replica process 0 did not start"). The smallest input:
// that answer, twice, to a replica's creation of each stream. The replica must ask
// again and go on to INFER_TOKENS, and it must not print 10059.
TEST_CASE("a replica process asks again when a stream's creation answers 'stream not found'") {
  inferq_test::TempDir dir;
  inferq_test::NatsServer server(dir.path(), {}, /*jetstream=*/false);
  REQUIRE(server.Start());
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, server.url().c_str()) == NATS_OK);
  FakeStreamCreation fake;
  fake.not_found = 2;
  natsSubscription* sub = nullptr;
  REQUIRE(natsConnection_Subscribe(&sub, nc, "$JS.API.STREAM.CREATE.*", FakeStreamCreation::OnRequest, &fake) ==
          NATS_OK);
  REQUIRE(natsConnection_Flush(nc) == NATS_OK);
  const std::string log = (dir.path() / "replica.log").string();
  pid_t replica = inferq_test::Spawn({INFERQ_INFERENCE_SERVER, "--role", "replica", "--replicas", "1", "--nats",
                                      server.url(), "--js-replicas", "3", "--limit", "1", "--speed", "1000"},
                                     log);
  REQUIRE(replica > 0);
  // Each stream: two refusals 250 ms apart, then its info (at most 60 s, a loaded
  // machine; about 1 s idle).
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (fake.RequestsFor("INFER_TOKENS") < 3 && Clock::now() < until) {
    int status = 0;
    if (::waitpid(replica, &status, WNOHANG) == replica) {
      replica = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string out = inferq_test::ReadText(log);
  INFO(out);
  CHECK(fake.RequestsFor("INFER_REQUESTS") == 3);
  CHECK(fake.RequestsFor("INFER_TOKENS") == 3);
  CHECK(out.find("10059") == std::string::npos);
  if (replica > 0) inferq_test::SignalAndReap(replica, SIGKILL);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
}
