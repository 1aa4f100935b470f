// engine_budget's view and view_batch32 workloads (see engine_budget.cpp): base and
// batch32 publishing EventViews (Engine::PublishView, PublishViewBatch).
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "inferq/engine/engine.hpp"

namespace {
constexpr std::size_t kPayloadBytes = 64;
constexpr int kBatch = 32;
}  // namespace

// Publishes n views (one at a time, or in batches of 32 when `batched`), pulling and
// acking each; counts the successes in *ok and what they should be in *want.
void RunViews(bool batched, long n, inferq::Engine& engine, inferq::Member& member, long* ok, long* want) {
  static const std::string view_payload(kPayloadBytes, 'x');
  auto make_view = [](long i) {
    inferq::EventView v;
    v.subject = "infer.m.req";
    v.seq_no = static_cast<std::uint64_t>(i);
    v.payload = std::as_bytes(std::span<const char>(view_payload.data(), view_payload.size()));
    return v;
  };
  if (batched) {
    std::vector<inferq::EventView> views(kBatch);
    std::array<inferq::Message, kBatch> batch;
    for (long i = 0; i < n; i += kBatch) {
      for (int k = 0; k < kBatch; ++k) views[k] = make_view(i + k);
      const inferq::PublishBatchResult r = engine.PublishViewBatch(views);
      if (r.status.ok()) *ok += static_cast<long>(r.published);
      absl::StatusOr<std::size_t> got = member.NextBatch(batch, absl::ZeroDuration(), absl::ZeroDuration());
      if (got.ok() && inferq::AckBatch(std::span<inferq::Message>(batch).first(*got)).ok()) *ok += *got;
    }
    *want = 2 * n;
  } else {
    for (long i = 0; i < n; ++i) {
      *ok += engine.PublishView(make_view(i)).ok();
      auto msg = member.Next(absl::ZeroDuration());
      *ok += msg.ok() && msg->Ack().ok();
    }
    *want = 2 * n;
  }
}

