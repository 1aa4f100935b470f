// The main example with --otlp-endpoint: its spans reach a receiver the test starts
// on a loopback port, as OTLP JSON, every stage of a request's trace linked to its
// publish.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "../adapters/http_receiver.hpp"
#include "rapidjson/document.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("inference_server --otlp-endpoint sends the replay's spans to the collector") {
  inferq_test::HttpReceiver receiver;
  char dir_template[] = "/tmp/inferq_otlp_example_XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string out_path = std::string(dir_template) + "/out.txt";
  const std::string cmd = std::string(INFERQ_INFERENCE_SERVER) + " --limit 20 --speed 0 --otlp-endpoint " +
                          receiver.url("/v1/traces") + " --otlp-sample 1 > " + out_path + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = ReadFile(out_path);
  std::remove(out_path.c_str());
  ::rmdir(dir_template);
  INFO(out);
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  std::map<std::string, int> by_op;
  std::map<std::string, std::string> op_of;      // span id -> operation name
  std::map<std::string, std::string> parent_of;  // span id -> parent span id
  std::size_t spans = 0;
  std::set<std::string> traces;
  std::size_t roots = 0;  // publish spans without a parent: the client's requests
  for (const auto& r : receiver.requests()) {
    CHECK(r.target == "/v1/traces");
    rapidjson::Document doc;
    REQUIRE_FALSE(doc.Parse(r.body.c_str()).HasParseError());
    const auto& rs = doc["resourceSpans"][0];
    CHECK(std::string(rs["resource"]["attributes"][0]["value"]["stringValue"].GetString()) == "inference_server");
    for (const auto& s : rs["scopeSpans"][0]["spans"].GetArray()) {
      std::string op;
      for (const auto& a : s["attributes"].GetArray()) {
        if (std::string(a["key"].GetString()) == "messaging.operation.name") op = a["value"]["stringValue"].GetString();
      }
      ++by_op[op];
      ++spans;
      op_of[s["spanId"].GetString()] = op;
      traces.insert(s["traceId"].GetString());
      if (op == "publish" && !s.HasMember("parentSpanId")) ++roots;
      parent_of[s["spanId"].GetString()] = s.HasMember("parentSpanId") ? s["parentSpanId"].GetString() : "";
    }
  }
  // The summary's count is what the receiver got.
  CHECK(out.find("  traces     " + std::to_string(spans) + " spans exported to " + receiver.url("/v1/traces") +
                 " (sample 1; 0 dropped, 0 failed)") != std::string::npos);
  // 20 requests: each a publish delivered to a replica and acked, and its tokens and
  // decode steps likewise (at least one of each per request).
  CHECK(by_op["publish"] >= 40);
  CHECK(by_op["deliver"] >= 40);
  CHECK(by_op["queue_wait"] >= 40);
  CHECK(by_op["ack"] == by_op["deliver"] - by_op["nak"] - by_op["term"]);
  // One trace per request: its tokens and decode steps are published as children of
  // the delivery being worked on (Message::trace()).
  CHECK(traces.size() == 20);
  CHECK(roots == 20);
  // Every queue wait and delivery hangs off a publish the receiver got; every ack off
  // a delivery; every other publish off a delivery.
  for (const auto& [id, op] : op_of) {
    if (op == "publish" && parent_of[id].empty()) continue;  // a request
    INFO(op << " " << id);
    const auto parent = op_of.find(parent_of[id]);
    REQUIRE(parent != op_of.end());
    CHECK(parent->second == (op == "ack" || op == "publish" ? "deliver" : "publish"));
  }
}

TEST_CASE("inference_server with a collector that never answers ends soon after the replay") {
  // Found by the adversarial review: the exporter's destructor went on retrying every
  // queued batch (minutes to hours). Now: a 10 s flush, then 5 s of shutdown.
  inferq_test::HttpReceiver receiver;
  receiver.Close();  // reads requests, never answers
  char dir_template[] = "/tmp/inferq_otlp_example_XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string out_path = std::string(dir_template) + "/out.txt";
  const std::string cmd = "timeout 120 " + std::string(INFERQ_INFERENCE_SERVER) +
                          " --limit 20 --speed 0 --otlp-endpoint " + receiver.url("/v1/traces") +
                          " --otlp-sample 1 > " + out_path + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = ReadFile(out_path);
  std::remove(out_path.c_str());
  ::rmdir(dir_template);
  receiver.Open();
  INFO(out);
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 0);  // 124 would be timeout's: still running after 120 s
  CHECK(out.find("  traces     0 spans exported to " + receiver.url("/v1/traces")) != std::string::npos);
  CHECK(out.find("not sent to " + receiver.url("/v1/traces") + " within 10s") != std::string::npos);
}
