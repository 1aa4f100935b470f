// File: tests/ring/ring_test_util.hpp
//
// What the ring tests share: a wait strategy that sleeps at once, and a watchdog
// that turns a lost wake-up into a failed test instead of a hung one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace inferq::ring_test {

// Every blocking call that does not succeed at once goes straight to sleep: no
// active phase (kMaxActive 0), so each hand-off runs the sleep/notify protocol of
// internal/event_count.hpp (invariants 1-3) and races with the notifier's check.
struct SleepAtOnce {
  static constexpr int kSpins = 0;
  static constexpr long kActiveNs = 0;
  static constexpr int kMaxActive = 0;
  static constexpr bool kProcessBudget = false;
  static constexpr bool kSleeps = true;
};

// Closes `rings` when `progress` stops moving for 10 s, and says so: a lost
// wake-up then fails the test instead of hanging it. Not a timing assertion: any
// working run moves on within microseconds.
template <class... Rings>
class Watchdog {
 public:
  Watchdog(const std::atomic<std::uint64_t>& progress, Rings&... rings)
      : thread_([this, &progress, &rings...] {
          std::uint64_t last = progress.load();
          int idle_s = 0;
          while (!done_.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (++ticks_ % 100 != 0) continue;
            const std::uint64_t now = progress.load();
            idle_s = now == last ? idle_s + 1 : 0;
            last = now;
            if (idle_s == 10) {
              stalled_ = true;
              (rings.close(), ...);
              return;
            }
          }
        }) {}
  ~Watchdog() { Stop(); }
  void Stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool stalled() const { return stalled_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> stalled_{false};
  int ticks_ = 0;
  std::thread thread_;
};

}  // namespace inferq::ring_test
