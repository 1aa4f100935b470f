/// @file inferq/sched/token_probe.hpp
///
/// TokenProbe: token-level figures of generation streams where they are received,
/// per sequence (seq_id): the time to first token from the request's start, the gaps
/// between consecutive tokens (inter-token latency, TBT), and what putting the tokens
/// back in order saw: tokens that came ahead of a missing one (reordered), numbers
/// reported missing (gaps), copies dropped (duplicates). The receiver calls it beside
/// its ReorderBuffer (reorder_buffer.hpp), with the tokens the buffer releases.
///
/// Usage:
/// @code
///   inferq::TokenProbe probe;
///   probe.Start("req-42", request_sent_ns);      // the request went out
///   probe.Token("req-42", now_ns);               // each token, in order: the first is TTFT
///   probe.Finish("req-42");                      // the generation is complete
///   inferq::TokenProbeStats s = probe.Stats();   // s.ttft_ns.Percentile(0.99)
/// @endcode
///
/// SLA attainment per QoS tier, where the host has TTFT targets: SetTtftSla(tier, ns)
/// and Start(seq_id, start_ns, tier); Stats().tiers[t] counts the tier's first tokens
/// and those within its target.
///
/// Times are ns of the caller's clock (a replay may give trace time); a token earlier
/// than its sequence's start or previous token counts as 0 ns.
///
/// Memory: one entry (the seq_id and two times) per open sequence, at most
/// `max_sequences`; Finish removes it.
///
/// Thread safety: every method may be called from any thread at once (a mutex over
/// the open sequences; the histograms are concurrent recorders).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inferq/base/histogram.hpp"
#include "inferq/event/event.hpp"
#include "inferq/sched/qos_scheduler.hpp"  // kQosTiers

namespace inferq {

/// First tokens of one QoS tier's sequences (those started with a tier).
struct TokenTierStats {
  std::int64_t ttft_sla_ns = 0;      ///< the tier's target (SetTtftSla); 0 = none
  std::uint64_t first_tokens = 0;    ///< sequences of the tier that got a first token
  std::uint64_t within_sla = 0;      ///< of those, TTFT <= ttft_sla_ns (0 without a target)
};

/// A TokenProbe's histograms and counters (TokenProbe::Stats).
struct TokenProbeStats {
  HistogramSnapshot ttft_ns;         ///< request start -> first token, per sequence
  HistogramSnapshot inter_token_ns;  ///< token -> next token of the same sequence
  std::uint64_t sequences_started = 0;   ///< successful Start calls
  std::uint64_t sequences_finished = 0;  ///< successful Finish calls
  std::uint64_t sequences_open = 0;  ///< started, not finished
  std::uint64_t tokens = 0;          ///< Token calls
  std::uint64_t reordered = 0;       ///< Reordered: tokens that came ahead of a missing one
  std::uint64_t missing = 0;         ///< Missing: numbers reported missing (never came)
  std::uint64_t duplicates = 0;      ///< Duplicates: copies dropped
  std::array<TokenTierStats, kQosTiers> tiers{};  ///< indexed by Qos
};

/// Token-level figures of generation streams, per sequence (see the file comment).
class TokenProbe {
 public:
  /// A probe that keeps at most `max_sequences` sequences open at once.
  explicit TokenProbe(std::size_t max_sequences = std::size_t{1} << 20) : max_sequences_(max_sequences) {}
  TokenProbe(const TokenProbe&) = delete;
  TokenProbe& operator=(const TokenProbe&) = delete;

  /// Opens sequence `seq_id`, whose request started at `start_ns`. InvalidArgument for
  /// an empty seq_id, AlreadyExists for one open already (as ReorderBuffer::Start),
  /// ResourceExhausted when max_sequences are open. Nothing changes on an error.
  absl::Status Start(std::string_view seq_id, std::int64_t start_ns) {
    return Open(seq_id, start_ns, kNoTier);
  }
  /// As Start, for a request of QoS tier `tier`: its first token counts for the tier's
  /// SLA attainment. InvalidArgument also for a tier that is not a Qos value.
  absl::Status Start(std::string_view seq_id, std::int64_t start_ns, Qos tier) {
    const auto t = static_cast<std::size_t>(tier);
    if (t >= kQosTiers) {
      return absl::InvalidArgumentError("TokenProbe::Start '" + std::string(seq_id) + "': tier " +
                                        std::to_string(t) + " is not a QoS tier");
    }
    return Open(seq_id, start_ns, static_cast<std::uint8_t>(t));
  }
  /// The host's time-to-first-token target for `tier`, ns (0 = none): a first token
  /// within it counts as within the SLA (TokenTierStats). Applies to first tokens from
  /// now on. InvalidArgument for a negative target or a tier that is not a Qos value.
  absl::Status SetTtftSla(Qos tier, std::int64_t sla_ns) {
    const auto t = static_cast<std::size_t>(tier);
    if (t >= kQosTiers || sla_ns < 0) {
      return absl::InvalidArgumentError("TokenProbe::SetTtftSla: tier " + std::to_string(t) + " target " +
                                        std::to_string(sla_ns) + " ns is invalid (a QoS tier, a target >= 0)");
    }
    tier_sla_ns_[t].store(sla_ns, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  /// A token of `seq_id`, delivered in order at `now_ns`: the first records the time to
  /// first token (now - start), each later one its gap since the previous token.
  /// NotFound for a sequence that is not open.
  absl::Status Token(std::string_view seq_id, std::int64_t now_ns) {
    std::int64_t since;
    bool first;
    std::uint8_t tier;
    {
      std::lock_guard lock(mu_);
      auto it = open_.find(Key(seq_id));
      if (it == open_.end()) {
        return absl::NotFoundError("TokenProbe::Token '" + std::string(seq_id) + "': the sequence is not open");
      }
      OpenSequence& o = it->second;
      first = !o.had_token;
      since = first ? o.start_ns : o.last_ns;
      o.last_ns = now_ns;
      o.had_token = true;
      tier = o.tier;
    }
    const auto d = static_cast<std::uint64_t>(now_ns > since ? now_ns - since : 0);
    (first ? ttft_ns_ : inter_token_ns_).Record(d);
    if (first && tier != kNoTier) {
      tier_first_[tier].fetch_add(1, std::memory_order_relaxed);
      const std::int64_t sla = tier_sla_ns_[tier].load(std::memory_order_relaxed);
      // release, paired with Stats' acquire: a snapshot that counts this first token
      // within the SLA counts it among the first tokens too (within <= first).
      if (sla > 0 && d <= static_cast<std::uint64_t>(sla)) tier_within_[tier].fetch_add(1, std::memory_order_release);
    }
    tokens_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  /// Closes `seq_id`. NotFound for a sequence that is not open.
  absl::Status Finish(std::string_view seq_id) {
    std::lock_guard lock(mu_);
    auto it = open_.find(Key(seq_id));
    if (it == open_.end()) {
      return absl::NotFoundError("TokenProbe::Finish '" + std::string(seq_id) + "': the sequence is not open");
    }
    open_.erase(it);
    finished_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  /// What the reorder buffer saw (ReorderResult kBuffered, a reported gap's size,
  /// kDuplicate).
  ///@{
  void Reordered(std::uint64_t n = 1) { reordered_.fetch_add(n, std::memory_order_relaxed); }
  void Missing(std::uint64_t n) { missing_.fetch_add(n, std::memory_order_relaxed); }
  void Duplicates(std::uint64_t n = 1) { duplicates_.fetch_add(n, std::memory_order_relaxed); }
  ///@}

  /// A snapshot of the histograms and counters.
  TokenProbeStats Stats() const {
    TokenProbeStats s;
    s.ttft_ns = ttft_ns_.Snapshot();
    s.inter_token_ns = inter_token_ns_.Snapshot();
    s.sequences_started = started_.load(std::memory_order_relaxed);
    s.sequences_finished = finished_.load(std::memory_order_relaxed);
    {
      std::lock_guard lock(mu_);
      s.sequences_open = open_.size();
    }
    s.tokens = tokens_.load(std::memory_order_relaxed);
    s.reordered = reordered_.load(std::memory_order_relaxed);
    s.missing = missing_.load(std::memory_order_relaxed);
    s.duplicates = duplicates_.load(std::memory_order_relaxed);
    for (std::size_t t = 0; t < kQosTiers; ++t) {
      s.tiers[t].ttft_sla_ns = tier_sla_ns_[t].load(std::memory_order_relaxed);
      // within first (acquire), then first: see Token (found by the adversarial review:
      // a snapshot could show more within the SLA than first tokens).
      s.tiers[t].within_sla = tier_within_[t].load(std::memory_order_acquire);
      s.tiers[t].first_tokens = tier_first_[t].load(std::memory_order_relaxed);
    }
    return s;
  }

 private:
  /// Start's body; `tier` is kNoTier or a Qos value (the public Starts check it).
  absl::Status Open(std::string_view seq_id, std::int64_t start_ns, std::uint8_t tier) {
    if (seq_id.empty()) return absl::InvalidArgumentError("TokenProbe::Start: empty seq_id");
    std::lock_guard lock(mu_);
    if (open_.size() >= max_sequences_ && !open_.contains(Key(seq_id))) {
      return absl::ResourceExhaustedError("TokenProbe::Start '" + std::string(seq_id) + "': " +
                                          std::to_string(max_sequences_) + " sequences are open already");
    }
    auto [it, inserted] = open_.try_emplace(std::string(seq_id), OpenSequence{start_ns, 0, false, tier});
    if (!inserted) {
      return absl::AlreadyExistsError("TokenProbe::Start '" + std::string(seq_id) + "': the sequence is open already");
    }
    started_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  /// Debian's Abseil has its own string_view, which the map's lookups take.
  static absl::string_view Key(std::string_view s) { return absl::string_view(s.data(), s.size()); }
  static constexpr std::uint8_t kNoTier = 0xFF;
  struct OpenSequence {
    std::int64_t start_ns;
    std::int64_t last_ns;
    bool had_token;
    std::uint8_t tier;  ///< kNoTier: started without one
  };
  const std::size_t max_sequences_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, OpenSequence> open_;  ///< guarded by mu_
  Histogram ttft_ns_, inter_token_ns_;
  std::atomic<std::uint64_t> started_{0}, finished_{0}, tokens_{0}, reordered_{0}, missing_{0}, duplicates_{0};
  std::array<std::atomic<std::int64_t>, kQosTiers> tier_sla_ns_{};
  std::array<std::atomic<std::uint64_t>, kQosTiers> tier_first_{}, tier_within_{};
};

}  // namespace inferq
