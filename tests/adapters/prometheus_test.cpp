// The Prometheus exposition (inferq::prometheus): the engine's and a StateStore's
// figures with their exact values, histogram buckets, the HTTP endpoint, bad options,
// promtool's check of the exposition, and the README's table of every metric.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "http_get.hpp"
#include "inferq/adapters/prometheus/engine_collector.hpp"
#include "inferq/adapters/prometheus/metrics_server.hpp"
#include "inferq/engine/engine.hpp"
#include "inferq/state/state_store.hpp"
#include "nats_server.hpp"  // TempDir

using inferq::prometheus::EngineCollector;
using inferq::prometheus::ExpositionText;
using inferq::prometheus::MetricsServer;
using inferq::prometheus::StateStoreCollector;

namespace {

inferq::Event Ev(std::string subject, std::string id = "") {
  inferq::Event e;
  e.subject = std::move(subject);
  e.msg_id = std::move(id);
  return e;
}

// "name{labels}" -> value, from the text exposition's sample lines.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

// The value of `series` in `text`, or "<absent>".
std::string Value(const std::string& text, const std::string& series) {
  const auto s = Samples(text);
  const auto it = s.find(series);
  return it == s.end() ? "<absent>" : it->second;
}

// Families (names) in an exposition.
std::set<std::string> FamilyNames(const std::string& text) {
  std::set<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) out.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return out;
}

// Runs `promtool check metrics` on `text`: its exit status and output.
std::pair<int, std::string> Promtool(const std::string& text) {
  inferq_test::TempDir dir;
  const std::string in = dir.path().string() + "/metrics.txt";
  const std::string out = dir.path().string() + "/promtool.out";
  std::ofstream(in) << text;
  const std::string cmd = std::string(INFERQ_PROMTOOL) + " check metrics < " + in + " > " + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream o(out);
  std::stringstream ss;
  ss << o.rdbuf();
  return {WEXITSTATUS(rc), ss.str()};
}

// A StateStore in `dir`.
std::unique_ptr<inferq::StateStore> OpenStore(const inferq_test::TempDir& dir) {
  inferq::StateStoreOptions o;
  o.dir = dir.path().string() + "/state";
  auto store = inferq::StateStore::Open(o);
  REQUIRE(store.ok());
  return *std::move(store);
}

// An engine with every kind of figure: a stream, a QoS consumer of two members,
// flow control, and a stats source.
struct FullEngine {
  std::unique_ptr<inferq::Engine> engine = inferq::Engine::Create(
      {.flow_control = inferq::FlowControlConfig{.memory_budget_bytes = 1 << 20,
                                                  .latency_sla = absl::Milliseconds(50)}}).value();
  FullEngine() {
    REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
    REQUIRE(engine->AddConsumer({.stream = "S", .name = "c", .members = 2, .qos = inferq::QosConfig{}}).ok());
    REQUIRE(engine
                ->AddStatsSource("nats_bridge.site-a",
                                 [](inferq::ComponentStats& out) {
                                   out.values = {{"connected", 1}, {"exported_total", 7}};
                                 })
                .ok());
  }
};

// A slow loris: sends "GET /metrics HTTP/1.1\r\n" at once, then the rest of its
// request head one byte every 0.9 s (41 s in all) from its own thread, until the
// server answers or closes. `order` numbers events across clients and the test.
class SlowClient {
 public:
  static constexpr std::string_view kRequestLine = "GET /metrics HTTP/1.1\r\n";
  static constexpr std::string_view kRest = "Host: 127.0.0.1\r\nX-Slow: 0123456789abcdefghijklm\r\n\r\n";

  SlowClient(int port, std::atomic<int>& order) : order_(order) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::send(fd_, kRequestLine.data(), kRequestLine.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(kRequestLine.size()));
    thread_ = std::thread([this] { Run(); });
  }
  ~SlowClient() {
    Join();
    ::close(fd_);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  std::atomic<std::size_t> header_bytes_sent{0};
  // Set by its thread, read after Join.
  bool sent_whole_head = false;
  std::string response;  // what the server sent before closing
  int answered_at = 0;   // its number in `order` when the server answered or closed

 private:
  void Run() {
    for (std::size_t i = 0; i < kRest.size(); ++i) {
      if (::send(fd_, kRest.data() + i, 1, MSG_NOSIGNAL) != 1) break;  // reset: read what came
      header_bytes_sent.store(i + 1);
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 900) != 0) break;  // an answer, or the server closed
      if (i + 1 == kRest.size()) sent_whole_head = true;
    }
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      response.append(buf, static_cast<std::size_t>(n));
    }
    answered_at = ++order_;
  }

  std::atomic<int>& order_;
  int fd_ = -1;
  std::thread thread_;
};

// Sends `request` to 127.0.0.1:`port`, shuts the sending side, and returns all that
// comes back until the server closes (10 s per read at most).
std::string Exchange(int port, const std::string& request) {
  const int fd = inferq_test::ConnectLoopback(port);
  REQUIRE(fd >= 0);
  std::string out;
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    ::shutdown(fd, SHUT_WR);
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

// Waits (at most 30 s) until every client has sent its request line and a byte of
// its headers.
bool AllTrickling(const std::vector<std::unique_ptr<SlowClient>>& clients) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (const auto& c : clients) {
    while (c->header_bytes_sent.load() == 0) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return true;
}

}  // namespace

TEST_CASE("the engine's counts appear with their exact values") {
  auto engine = inferq::Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}, .duplicate_window = absl::Minutes(1)}).ok());
  auto c = engine->AddConsumer({.stream = "S", .name = "c", .ack_wait = absl::Seconds(30)});
  REQUIRE(c.ok());
  for (const char* id : {"1", "2", "3", "4"}) REQUIRE(engine->Publish(Ev("work.a", id)).ok());
  REQUIRE(engine->Publish(Ev("work.a", "4")).ok());  // a duplicate-window hit
  CHECK(engine->Publish(Ev("nowhere.a")).status().code() == absl::StatusCode::kNotFound);
  CHECK(engine->Publish(Ev("work..a")).status().code() == absl::StatusCode::kInvalidArgument);
  inferq::Member m = *c->member(0);
  auto batch = m.NextBatch(3, absl::ZeroDuration(), absl::ZeroDuration());
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 3);
  REQUIRE((*batch)[0].Ack().ok());
  REQUIRE((*batch)[1].Ack().ok());
  REQUIRE((*batch)[2].Nak().ok());

  const EngineCollector collector(*engine);
  const std::string text = ExpositionText(collector);
  const std::string sc = "{stream=\"S\",consumer=\"c\"}";
  CHECK(Value(text, "inferq_published_total") == "4");
  CHECK(Value(text, "inferq_publish_refused_total{reason=\"unrouted\"}") == "1");
  CHECK(Value(text, "inferq_publish_refused_total{reason=\"invalid\"}") == "1");
  CHECK(Value(text, "inferq_publish_refused_total{reason=\"rejected\"}") == "0");
  // Six publishes on this thread: work.a routed once from the index, then from the
  // cache four times; nowhere.a searched (and not cached: nothing captures it);
  // work..a searched too (an invalid subject is found nowhere).
  CHECK(Value(text, "inferq_route_cache_hits_total") == "4");
  CHECK(Value(text, "inferq_route_cache_misses_total") == "3");
  // Two of the three misses searched the index and walked its trie (work.a, nowhere.a);
  // work..a was refused as invalid before any search.
  CHECK(Value(text, "inferq_subject_index_cache_hits_total") == "0");
  CHECK(Value(text, "inferq_subject_index_cache_misses_total") == "2");
  CHECK(Value(text, "inferq_stream_messages{stream=\"S\"}") == "4");
  CHECK(Value(text, "inferq_stream_stored_total{stream=\"S\"}") == "4");
  CHECK(Value(text, "inferq_stream_duplicates_total{stream=\"S\"}") == "1");
  CHECK(Value(text, "inferq_stream_last_sequence{stream=\"S\"}") == "4");
  CHECK(Value(text, "inferq_consumer_delivered_total" + sc) == "3");
  CHECK(Value(text, "inferq_consumer_acked_total" + sc) == "2");
  CHECK(Value(text, "inferq_consumer_naks_total" + sc) == "1");
  // Message 4 waits, and the nak'ed one is queued again: lag 2; nothing out now.
  CHECK(Value(text, "inferq_consumer_num_pending" + sc) == "2");
  CHECK(Value(text, "inferq_consumer_ack_pending" + sc) == "0");
  CHECK(Value(text, "inferq_member_delivered_total{stream=\"S\",consumer=\"c\",member=\"0\"}") == "3");
  CHECK(Value(text, "inferq_member_queued{stream=\"S\",consumer=\"c\",member=\"0\"}") == "2");
  // One batch of 3: in the le="3" bucket, not in le="1".
  CHECK(Value(text, "inferq_consumer_batch_size_count" + sc) == "1");
  CHECK(Value(text, "inferq_consumer_batch_size_sum" + sc) == "3");
  CHECK(Value(text, "inferq_consumer_batch_size_bucket{stream=\"S\",consumer=\"c\",le=\"1\"}") == "0");
  CHECK(Value(text, "inferq_consumer_batch_size_bucket{stream=\"S\",consumer=\"c\",le=\"3\"}") == "1");
  CHECK(Value(text, "inferq_consumer_batch_size_bucket{stream=\"S\",consumer=\"c\",le=\"+Inf\"}") == "1");
  CHECK(Value(text, "inferq_consumer_ack_latency_seconds_count" + sc) == "2");
  CHECK(Value(text, "inferq_consumer_deliver_latency_seconds_count" + sc) == "3");
  // Without QoS lanes, flow control or a stats source, their families are left out.
  const std::set<std::string> names = FamilyNames(text);
  CHECK(names.count("inferq_consumer_tier_served_total") == 0);
  CHECK(names.count("inferq_flow_throttle") == 0);
}

TEST_CASE("latency histograms: cumulative buckets in seconds, exact at a bucket bound") {
  inferq::EngineStats s;
  inferq::ConsumerStats c;
  c.stream = "S";
  c.name = "c";
  c.deliver_latency_ns.Record(500, 3);        // 0.5 µs
  c.deliver_latency_ns.Record(2'000'000, 1);  // 2 ms
  s.consumers.push_back(c);
  const auto families = EngineCollector::Families(s);
  const ::prometheus::MetricFamily* f = nullptr;
  for (const auto& fam : families) {
    if (fam.name == "inferq_consumer_deliver_latency_seconds") f = &fam;
  }
  REQUIRE(f != nullptr);
  CHECK(f->type == ::prometheus::MetricType::Histogram);
  REQUIRE(f->metric.size() == 1);
  const auto& h = f->metric[0].histogram;
  CHECK(h.sample_count == 4);
  CHECK(h.sample_sum == Approx(2'001'500e-9));
  REQUIRE(h.bucket.size() == inferq::prometheus::kLatencyBuckets.size() + 1);
  std::map<double, std::uint64_t> le;
  for (const auto& b : h.bucket) le[b.upper_bound] = b.cumulative_count;
  CHECK(le[1e-6] == 3);
  CHECK(le[1e-3] == 3);
  CHECK(le[2.5e-3] == 4);
  CHECK(le[10.0] == 4);
  CHECK(le[std::numeric_limits<double>::infinity()] == 4);
}

TEST_CASE("components become families by kind, with their source as a label") {
  FullEngine f;
  const std::string text = ExpositionText(EngineCollector(*f.engine));
  CHECK(Value(text, "inferq_nats_bridge_connected{source=\"site-a\"}") == "1");
  CHECK(Value(text, "inferq_nats_bridge_exported_total{source=\"site-a\"}") == "7");
  CHECK(text.find("# TYPE inferq_nats_bridge_exported_total counter") != std::string::npos);
  CHECK(text.find("# TYPE inferq_nats_bridge_connected gauge") != std::string::npos);
  CHECK(Value(text, "inferq_flow_throttle") == "0");
  CHECK(Value(text, "inferq_consumer_tier_served_total{stream=\"S\",consumer=\"c\",tier=\"gold\"}") == "0");
}

TEST_CASE("an affinity policy's counts give the KV-cache hit rate") {
  auto engine = inferq::Engine::Create().value();
  REQUIRE(engine->AddStream({.name = "S", .subjects = {"work.>"}}).ok());
  auto affinity = inferq::AffinityPolicy::Create(std::make_unique<inferq::RoundRobinPolicy>(),
                                                 inferq::HashKey::SeqId());
  REQUIRE(affinity.ok());
  inferq::ConsumerConfig cc{.stream = "S", .name = "c", .members = 2};
  cc.selection = std::shared_ptr<inferq::SelectionPolicy>(*std::move(affinity));
  REQUIRE(engine->AddConsumer(cc).ok());
  for (const char* seq : {"a", "b", "a", "a", "b"}) {
    inferq::Event e = Ev("work.a");
    e.seq_id = seq;
    REQUIRE(engine->Publish(std::move(e)).ok());
  }
  const std::string text = ExpositionText(EngineCollector(*engine));
  const std::string sc = "{stream=\"S\",consumer=\"c\"}";
  CHECK(Value(text, "inferq_consumer_policy_affinity_new_total" + sc) == "2");
  CHECK(Value(text, "inferq_consumer_policy_affinity_kept_total" + sc) == "3");
  CHECK(Value(text, "inferq_consumer_policy_affinity_moved_total" + sc) == "0");
}

TEST_CASE("a token probe's figures appear with their exact values") {
  inferq::TokenProbe probe;
  REQUIRE(probe.Start("a", 0).ok());
  REQUIRE(probe.Token("a", 2'000'000).ok());  // TTFT 2 ms
  REQUIRE(probe.Token("a", 2'500'000).ok());  // 0.5 ms later
  probe.Reordered();
  REQUIRE(probe.SetTtftSla(inferq::Qos::kGold, 3'000'000).ok());
  REQUIRE(probe.Start("g", 0, inferq::Qos::kGold).ok());
  REQUIRE(probe.Token("g", 500'000).ok());  // TTFT 0.5 ms, within gold's 3 ms
  const std::string text = ExpositionText(inferq::prometheus::TokenProbeCollector(probe, "client"));
  const std::string l = "{probe=\"client\"}";
  const std::string gold = "{probe=\"client\",tier=\"gold\"}";
  CHECK(Value(text, "inferq_token_tier_first_tokens_total" + gold) == "1");
  CHECK(Value(text, "inferq_token_tier_within_sla_total" + gold) == "1");
  CHECK(Value(text, "inferq_token_tier_ttft_sla_seconds" + gold) == "0.003");
  CHECK(text.find("tier=\"silver\"") == std::string::npos);  // no target, no sequence
  CHECK(Value(text, "inferq_tokens_total" + l) == "3");
  CHECK(Value(text, "inferq_token_sequences_open" + l) == "2");
  CHECK(Value(text, "inferq_token_reordered_total" + l) == "1");
  CHECK(Value(text, "inferq_token_ttft_seconds_count" + l) == "2");
  CHECK(Value(text, "inferq_token_ttft_seconds_bucket{probe=\"client\",le=\"0.0005\"}") == "0");
  CHECK(Value(text, "inferq_token_ttft_seconds_bucket{probe=\"client\",le=\"0.001\"}") == "1");
  CHECK(Value(text, "inferq_token_ttft_seconds_bucket{probe=\"client\",le=\"0.0025\"}") == "2");
  CHECK(Value(text, "inferq_token_inter_token_seconds_count" + l) == "1");
  CHECK(Promtool(text).first == 0);
}

TEST_CASE("a StateStore's figures appear with their exact values") {
  inferq_test::TempDir dir;
  auto store = OpenStore(dir);
  for (int i = 0; i < 3; ++i) {
    auto tx = store->Begin();
    tx.Put("k." + std::to_string(i), "v");
    REQUIRE(tx.Commit().ok());
  }
  const std::string text = ExpositionText(StateStoreCollector(*store));
  CHECK(Value(text, "inferq_state_commits_total") == "3");
  CHECK(Value(text, "inferq_state_keys") == "3");
  CHECK(Value(text, "inferq_state_last_tx") == "3");
  CHECK(Value(text, "inferq_state_log_syncs_total") == "3");  // kEveryCommit
  CHECK(Value(text, "inferq_state_log_sync_seconds_count") == "3");
  CHECK(Value(text, "inferq_state_failed") == "0");
  CHECK(Value(text, "inferq_state_checkpoints_total{kind=\"full\"}") == "0");
  CHECK(Value(text, "inferq_state_checkpoint_seconds_count") == "0");
  REQUIRE(store->Checkpoint().ok());
  const std::string after = ExpositionText(StateStoreCollector(*store));
  CHECK(Value(after, "inferq_state_checkpoints_total{kind=\"full\"}") == "1");
  CHECK(Value(after, "inferq_state_checkpoint_seconds_count") == "1");
}

TEST_CASE("the metrics server serves the exposition over HTTP on a free loopback port") {
  FullEngine f;
  auto server = MetricsServer::Start({});
  REQUIRE(server.ok());
  REQUIRE((*server)->port() > 0);
  CHECK((*server)->url() == "http://127.0.0.1:" + std::to_string((*server)->port()) + "/metrics");
  (*server)->Add(std::make_shared<EngineCollector>(*f.engine));
  REQUIRE(f.engine->Publish(Ev("work.a")).ok());
  auto r = inferq_test::HttpGet((*server)->port(), "/metrics");
  REQUIRE(r.has_value());
  CHECK(r->status == 200);
  INFO(r->headers);
  CHECK(r->headers.find("Content-Type: text/plain") != std::string::npos);
  CHECK(Value(r->body, "inferq_published_total") == "1");
  CHECK(Value(r->body, "inferq_stream_messages{stream=\"S\"}") == "1");
  auto missing = inferq_test::HttpGet((*server)->port(), "/other");
  REQUIRE(missing.has_value());
  CHECK(missing->status == 404);
  // HEAD: the headers of a scrape, no body.
  const std::string head = Exchange((*server)->port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(head.size() == head.find("\r\n\r\n") + 4);
  CHECK(Exchange((*server)->port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
  CHECK(Exchange((*server)->port(), "GET /metrics\r\n\r\n").rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
  CHECK(Exchange((*server)->port(), "GET /metrics HTTP/1.1\r\nX: " + std::string(9000, 'a') + "\r\n\r\n")
            .rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0) == 0);
}

TEST_CASE("slow clients trickling their request heads do not hold up a scrape, and get 408") {
  // As many slow clients as the server has threads, and one more: each would have
  // held a thread until the 10 s request timeout (a scrape took 10.6 s).
  FullEngine f;
  auto server = MetricsServer::Start({});  // 2 threads, header_timeout 5 s
  REQUIRE(server.ok());
  (*server)->Add(std::make_shared<EngineCollector>(*f.engine));
  REQUIRE(f.engine->Publish(Ev("work.a")).ok());
  std::atomic<int> order{0};
  std::vector<std::unique_ptr<SlowClient>> slow;
  for (int i = 0; i < 3; ++i) slow.push_back(std::make_unique<SlowClient>((*server)->port(), order));
  REQUIRE(AllTrickling(slow));

  auto r = inferq_test::HttpGet((*server)->port(), "/metrics");
  const int scraped_at = ++order;
  REQUIRE(r.has_value());
  CHECK(r->status == 200);
  CHECK(Value(r->body, "inferq_published_total") == "1");
  CHECK(Value(r->body, "exposer_scrapes_total") == "0");  // counted after its own collection

  for (std::size_t i = 0; i < slow.size(); ++i) {
    slow[i]->Join();
    INFO("slow client " << i << " sent " << slow[i]->header_bytes_sent.load() << " header bytes; got: "
                        << slow[i]->response);
    CHECK(slow[i]->answered_at > scraped_at);  // still connected when the scrape was answered
    CHECK_FALSE(slow[i]->sent_whole_head);     // cut off by the deadline for the whole head
    CHECK(slow[i]->response.rfind("HTTP/1.1 408 Request Timeout\r\n", 0) == 0);
  }
}

TEST_CASE("when every connection is taken by a slow client, a scrape takes the oldest one's place") {
  FullEngine f;
  auto server = MetricsServer::Start({.threads = 1, .header_timeout = absl::Seconds(60), .max_connections = 2});
  REQUIRE(server.ok());
  (*server)->Add(std::make_shared<EngineCollector>(*f.engine));
  std::atomic<int> order{0};
  std::vector<std::unique_ptr<SlowClient>> slow;
  slow.push_back(std::make_unique<SlowClient>((*server)->port(), order));
  REQUIRE(AllTrickling(slow));
  slow.push_back(std::make_unique<SlowClient>((*server)->port(), order));
  REQUIRE(AllTrickling(slow));

  auto r = inferq_test::HttpGet((*server)->port(), "/metrics?format=text");  // the query is ignored
  const int scraped_at = ++order;
  REQUIRE(r.has_value());
  CHECK(r->status == 200);
  CHECK(Value(r->body, "inferq_published_total") == "0");
  slow[0]->Join();
  INFO("oldest got: " << slow[0]->response);
  CHECK(slow[0]->response.rfind("HTTP/1.1 408 Request Timeout\r\n", 0) == 0);
  CHECK_FALSE(slow[0]->sent_whole_head);
  // The other stays until the server goes (its head deadline is a minute away).
  server->reset();
  slow[1]->Join();
  CHECK(slow[1]->answered_at > scraped_at);
  CHECK(slow[1]->response.empty());
  CHECK_FALSE(slow[1]->sent_whole_head);
}

TEST_CASE("bad metrics server options are refused, naming the value") {
  using inferq::prometheus::MetricsServerOptions;
  auto bad = [](MetricsServerOptions o) { return MetricsServer::Start(std::move(o)).status(); };
  absl::Status st = bad({.port = 70000});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.port 70000 is outside 0..65535");
  st = bad({.address = "localhost"});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.address 'localhost' is not a dotted IPv4 address (such as 127.0.0.1 or 0.0.0.0)");
  st = bad({.path = "metrics"});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.path 'metrics' must start with '/' and hold no space or control character");
  st = bad({.path = "/a b"});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  st = bad({.threads = 0});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.threads 0 is outside 1..64");
  st = bad({.header_timeout = absl::ZeroDuration()});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.header_timeout 0 is outside (0, 60s]");
  st = bad({.response_timeout = absl::Minutes(11)});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.response_timeout 11m is outside (0, 10m]");
  st = bad({.max_connections = 0});
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(st.message() == "MetricsServerOptions.max_connections 0 is outside 1..4096");
  // A port in use: Unavailable, naming it.
  auto first = MetricsServer::Start({});
  REQUIRE(first.ok());
  const int port = (*first)->port();
  st = bad({.port = port});
  CHECK(st.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(st.message()).rfind("metrics server cannot listen on 127.0.0.1:" + std::to_string(port) + ": ", 0) ==
        0);
}

TEST_CASE("promtool check metrics passes on the exposition") {
  FullEngine f;
  REQUIRE(f.engine->Publish(Ev("work.a")).ok());
  inferq_test::TempDir dir;
  auto store = OpenStore(dir);
  const std::string text = ExpositionText(EngineCollector(*f.engine)) + ExpositionText(StateStoreCollector(*store));
  const auto [rc, out] = Promtool(text);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.empty());  // no lint finding either
  // And it finds a fault when there is one (the check can fail).
  const auto [bad_rc, bad_out] = Promtool("# TYPE x_total counter\nx_total{a=\"1\"} one\n");
  CHECK(bad_rc != 0);
}

TEST_CASE("the observability guide lists every metric family") {
  FullEngine f;
  REQUIRE(f.engine->Publish(Ev("work.a")).ok());
  inferq_test::TempDir dir;
  auto store = OpenStore(dir);
  std::ifstream readme(std::string(INFERQ_SOURCE_DIR) + "/docs/guide/observability.md");
  std::stringstream ss;
  ss << readme.rdbuf();
  const std::string text = ss.str();
  REQUIRE(!text.empty());
  std::set<std::string> names = FamilyNames(ExpositionText(EngineCollector(*f.engine)));
  for (const std::string& n : FamilyNames(ExpositionText(StateStoreCollector(*store)))) names.insert(n);
  inferq::TokenProbe probe;
  REQUIRE(probe.SetTtftSla(inferq::Qos::kGold, 1'000'000).ok());  // the per-tier SLA families
  for (const std::string& n : FamilyNames(ExpositionText(inferq::prometheus::TokenProbeCollector(probe)))) {
    names.insert(n);
  }
  CHECK(names.size() > 60);
  for (const std::string& n : names) {
    if (n.rfind("inferq_nats_bridge_", 0) == 0) continue;  // components: one row for the pattern
    if (n.rfind("inferq_consumer_policy_", 0) == 0) continue;  // a policy's counts: likewise
    INFO(n);
    CHECK(text.find("`" + n + "`") != std::string::npos);
  }
}
