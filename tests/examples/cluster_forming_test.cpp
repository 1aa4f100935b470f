// inference_server --role replica against a JetStream cluster that is still forming:
// its streams have 3 replicas, and until the meta leader knows three peers JetStream
// answers "no suitable peers for placement" (error 10005). The smallest input of a CI
// failure: cluster_demo's first replica process gave up after 20 attempts (10 s) on
// a loaded machine. It now retries such errors for 30 s; any other error is final.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

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
