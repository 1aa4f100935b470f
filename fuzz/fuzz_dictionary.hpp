// The zstd dictionary the TensorEvent fuzz target and its seeds share: trained once,
// from deterministic token-id samples (mt19937's output is fixed by the standard), so
// the seed corpus's dictionary payloads decode in the fuzzer.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "inferq/event/codec.hpp"

namespace inferq_fuzz {

inline std::shared_ptr<const inferq::ZstdDictionary> FuzzDictionary() {
  static const std::shared_ptr<const inferq::ZstdDictionary> dict = [] {
    std::mt19937 rng(2024);
    std::vector<std::string> samples;
    for (int i = 0; i < 1000; ++i) {
      std::string s = "tokens";
      const int len = 8 + static_cast<int>(rng() % 40);
      for (int t = 0; t < len; ++t) s += " " + std::to_string(rng() % 4 != 0 ? 17 + rng() % 32 : rng() % 32000);
      samples.push_back(std::move(s));
    }
    auto d = inferq::ZstdDictionary::Train(samples, 2048, 1);
    if (!d.ok()) std::abort();
    return *d;
  }();
  return dict;
}

// A set holding FuzzDictionary().
inline const inferq::ZstdDictionaries& FuzzDictionaries() {
  static const inferq::ZstdDictionaries set = [] {
    inferq::ZstdDictionaries s;
    if (!s.Add(FuzzDictionary()).ok()) std::abort();
    return s;
  }();
  return set;
}

}  // namespace inferq_fuzz
