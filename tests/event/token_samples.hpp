// Test helper: deterministic token-id payloads and a zstd dictionary trained on them,
// shared by the codec, TensorEvent and engine codec tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "inferq/event/codec.hpp"

namespace inferq_test {

// Token-id arrays like an LLM request's: JSON of 20..80 ids from a skewed vocabulary.
// Deterministic (mt19937's raw output is specified by the standard).
inline std::vector<std::string> TokenSamples(std::uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::string s = "{\"model\":\"llama-3-8b\",\"tokens\":[";
    const int len = 20 + static_cast<int>(rng() % 61);
    for (int t = 0; t < len; ++t) {
      // Skewed: most ids from a small set, some from the full vocabulary.
      const std::uint32_t id = rng() % 4 != 0 ? 100 + rng() % 64 : rng() % 32000;
      if (t != 0) s += ',';
      s += std::to_string(id);
    }
    s += "]}";
    out.push_back(std::move(s));
  }
  return out;
}

// An 8 KiB dictionary trained on 2000 samples of seed `seed`.
inline std::shared_ptr<const inferq::ZstdDictionary> TrainOrDie(std::uint32_t seed) {
  auto d = inferq::ZstdDictionary::Train(TokenSamples(seed, 2000), 8 << 10);
  REQUIRE(d.ok());
  return *d;
}

}  // namespace inferq_test
