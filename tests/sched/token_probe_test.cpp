#include "inferq/sched/token_probe.hpp"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using inferq::TokenProbe;

TEST_CASE("time to first token and inter-token gaps per sequence") {
  TokenProbe p;
  REQUIRE(p.Start("a", 1'000).ok());
  REQUIRE(p.Start("b", 2'000).ok());
  REQUIRE(p.Token("a", 1'050).ok());  // TTFT 50
  REQUIRE(p.Token("b", 2'030).ok());  // TTFT 30
  REQUIRE(p.Token("a", 1'060).ok());  // gap 10
  REQUIRE(p.Token("a", 1'061).ok());  // gap 1
  REQUIRE(p.Token("b", 2'020).ok());  // earlier than the previous token: 0
  REQUIRE(p.Finish("a").ok());
  const inferq::TokenProbeStats s = p.Stats();
  CHECK(s.ttft_ns.count() == 2);
  CHECK(s.ttft_ns.min() == 30);
  CHECK(s.ttft_ns.max() == 50);
  CHECK(s.inter_token_ns.count() == 3);
  CHECK(s.inter_token_ns.sum() == 11);
  CHECK(s.tokens == 5);
  CHECK(s.sequences_started == 2);
  CHECK(s.sequences_finished == 1);
  CHECK(s.sequences_open == 1);
}

TEST_CASE("the reorder buffer's counts are kept as given") {
  TokenProbe p;
  p.Reordered();
  p.Reordered(2);
  p.Missing(4);
  p.Duplicates();
  const auto s = p.Stats();
  CHECK(s.reordered == 3);
  CHECK(s.missing == 4);
  CHECK(s.duplicates == 1);
}

TEST_CASE("bad calls are refused, naming the sequence, and change nothing") {
  TokenProbe p(/*max_sequences=*/1);
  CHECK(p.Start("", 0).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(p.Start("a", 0).ok());
  absl::Status st = p.Start("a", 5);
  CHECK(st.code() == absl::StatusCode::kAlreadyExists);
  CHECK(st.message() == "TokenProbe::Start 'a': the sequence is open already");
  st = p.Start("b", 0);
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(st.message() == "TokenProbe::Start 'b': 1 sequences are open already");
  st = p.Token("b", 1);
  CHECK(st.code() == absl::StatusCode::kNotFound);
  CHECK(st.message() == "TokenProbe::Token 'b': the sequence is not open");
  CHECK(p.Finish("b").code() == absl::StatusCode::kNotFound);
  REQUIRE(p.Token("a", 7).ok());  // the start was kept at 0, not moved to 5
  const auto s = p.Stats();
  CHECK(s.ttft_ns.max() == 7);
  CHECK(s.sequences_started == 1);
  CHECK(s.tokens == 1);
  REQUIRE(p.Finish("a").ok());
  CHECK(p.Start("b", 0).ok());  // room again
}

TEST_CASE("sequences on several threads at once: every token counted once") {
  constexpr int kThreads = 4, kSeqs = 200, kTokens = 20;
  TokenProbe p;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int s = 0; s < kSeqs; ++s) {
        const std::string id = std::to_string(t) + "." + std::to_string(s);
        REQUIRE(p.Start(id, 0).ok());
        for (int k = 1; k <= kTokens; ++k) REQUIRE(p.Token(id, k * 10).ok());
        REQUIRE(p.Finish(id).ok());
        (void)p.Stats();
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto s = p.Stats();
  CHECK(s.sequences_started == kThreads * kSeqs);
  CHECK(s.sequences_finished == kThreads * kSeqs);
  CHECK(s.sequences_open == 0);
  CHECK(s.tokens == kThreads * kSeqs * kTokens);
  CHECK(s.ttft_ns.count() == kThreads * kSeqs);
  CHECK(s.ttft_ns.sum() == 10u * kThreads * kSeqs);
  CHECK(s.inter_token_ns.count() == kThreads * kSeqs * (kTokens - 1));
  CHECK(s.inter_token_ns.sum() == 10u * kThreads * kSeqs * (kTokens - 1));
}

TEST_CASE("SLA attainment per tier: first tokens within the tier's TTFT target") {
  inferq::TokenProbe probe;
  REQUIRE(probe.SetTtftSla(inferq::Qos::kGold, 2'000'000).ok());    // 2 ms
  REQUIRE(probe.SetTtftSla(inferq::Qos::kBronze, 10'000'000).ok()); // 10 ms
  REQUIRE(probe.Start("g1", 0, inferq::Qos::kGold).ok());
  REQUIRE(probe.Start("g2", 0, inferq::Qos::kGold).ok());
  REQUIRE(probe.Start("s1", 0, inferq::Qos::kSilver).ok());
  REQUIRE(probe.Start("b1", 0, inferq::Qos::kBronze).ok());
  REQUIRE(probe.Start("untiered", 0).ok());
  REQUIRE(probe.Token("g1", 2'000'000).ok());   // exactly at the target: within
  REQUIRE(probe.Token("g1", 9'000'000).ok());   // a later token does not count
  REQUIRE(probe.Token("g2", 2'000'001).ok());   // 1 ns late
  REQUIRE(probe.Token("s1", 1).ok());           // silver has no target
  REQUIRE(probe.Token("untiered", 1).ok());
  const inferq::TokenProbeStats s = probe.Stats();
  CHECK(s.tiers[0].ttft_sla_ns == 2'000'000);
  CHECK(s.tiers[0].first_tokens == 2);
  CHECK(s.tiers[0].within_sla == 1);
  CHECK(s.tiers[1].ttft_sla_ns == 0);
  CHECK(s.tiers[1].first_tokens == 1);
  CHECK(s.tiers[1].within_sla == 0);
  CHECK(s.tiers[2].ttft_sla_ns == 10'000'000);
  CHECK(s.tiers[2].first_tokens == 0);  // b1 has no token yet
  CHECK(s.ttft_ns.count() == 4);
}

TEST_CASE("bad SLA calls are refused and change nothing") {
  inferq::TokenProbe probe;
  absl::Status st = probe.SetTtftSla(inferq::Qos::kGold, -1);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()) ==
        "TokenProbe::SetTtftSla: tier 0 target -1 ns is invalid (a QoS tier, a target >= 0)");
  st = probe.SetTtftSla(static_cast<inferq::Qos>(3), 5);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  st = probe.Start("x", 0, static_cast<inferq::Qos>(7));
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()) == "TokenProbe::Start 'x': tier 7 is not a QoS tier");
  const inferq::TokenProbeStats s = probe.Stats();
  CHECK(s.sequences_started == 0);
  CHECK(s.tiers[0].ttft_sla_ns == 0);
}

TEST_CASE("a snapshot never shows more first tokens within the SLA than first tokens") {
  // Found by the adversarial review: within_sla > first_tokens in 3 of 220k reads.
  inferq::TokenProbe probe;
  REQUIRE(probe.SetTtftSla(inferq::Qos::kGold, 1'000'000'000).ok());
  constexpr int kThreads = 2, kEach = 20'000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const inferq::TokenProbeStats s = probe.Stats();
      REQUIRE(s.tiers[0].within_sla <= s.tiers[0].first_tokens);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string id = std::to_string(t) + "-" + std::to_string(i);
        REQUIRE(probe.Start(id, 0, inferq::Qos::kGold).ok());
        REQUIRE(probe.Token(id, 1).ok());
        REQUIRE(probe.Finish(id).ok());
      }
    });
  }
  for (auto& w : writers) w.join();
  done.store(true);
  reader.join();
  const inferq::TokenProbeStats s = probe.Stats();
  CHECK(s.tiers[0].first_tokens == kThreads * kEach);
  CHECK(s.tiers[0].within_sla == kThreads * kEach);
}
