// A TraceSink (inferq/engine/trace.hpp) for tests: keeps every span it is given.
#pragma once

#include <mutex>
#include <utility>
#include <vector>

#include "inferq/engine/trace.hpp"

namespace inferq_test {

class SpanRecorder final : public inferq::TraceSink {
 public:
  void Export(inferq::Span&& span) noexcept override {
    std::lock_guard lock(mu_);
    spans_.push_back(std::move(span));
  }
  // Every span so far, and forgets them.
  std::vector<inferq::Span> Take() {
    std::lock_guard lock(mu_);
    return std::exchange(spans_, {});
  }
  // The spans of `stage` so far (kept).
  std::vector<inferq::Span> Of(inferq::SpanStage stage) const {
    std::lock_guard lock(mu_);
    std::vector<inferq::Span> out;
    for (const inferq::Span& s : spans_) {
      if (s.stage == stage) out.push_back(s);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<inferq::Span> spans_;
};

}  // namespace inferq_test
