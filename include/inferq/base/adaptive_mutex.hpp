/// @file inferq/base/adaptive_mutex.hpp
///
/// AdaptiveMutex: a mutex for short critical sections on hot paths. Uncontended, a
/// lock is one compare-and-swap and an unlock one exchange, both inline (a
/// pthread_mutex_t pair costs about 60 instructions through libc's calls). A thread
/// that finds it held spins a little, as glibc's PTHREAD_MUTEX_ADAPTIVE_NP does,
/// then sleeps on a futex, so a holder that is preempted costs no core. Not
/// recursive, not fair (a thread that arrives while the owner unlocks may take it
/// before a sleeper that was woken).
///
/// The algorithm is the third mutex of Ulrich Drepper's "Futexes Are Tricky" (2011):
/// the word is 0 (unlocked), 1 (locked, nobody asleep) or 2 (locked, someone may be
/// asleep); unlock wakes one sleeper only when it takes the word from 2.
///
/// Usage:
/// @code
///   inferq::AdaptiveMutex mu;
///   { std::lock_guard lock(mu); ++shared_count; }
/// @endcode
///
/// Thread safety: lock, try_lock and unlock from any threads (Lockable). ThreadSanitizer
/// sees the mutex through its atomics (acquire on lock, release on unlock), so it
/// checks the data the mutex guards; it does not report lock-order inversions of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace inferq {

/// A futex mutex for short critical sections (see the file comment). Lockable.
class AdaptiveMutex {
 public:
  AdaptiveMutex() = default;
  AdaptiveMutex(const AdaptiveMutex&) = delete;
  AdaptiveMutex& operator=(const AdaptiveMutex&) = delete;

  /// Takes the mutex: at once when it is free, else after a brief spin or a sleep on
  /// the futex until an unlock wakes this thread. Not recursive (a second lock by the
  /// holder never returns).
  void lock() {
    std::uint32_t expected = kUnlocked;
    // acquire: what the previous holder wrote before its unlock (release) is seen.
    if (word_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                      std::memory_order_relaxed)) [[likely]] {
      return;
    }
    LockSlow();
  }

  /// Takes the mutex if it is free; false (never waiting) when another thread holds it.
  bool try_lock() {
    std::uint32_t expected = kUnlocked;
    return word_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }

  /// Lets the mutex go, waking one sleeping thread if any may sleep. Only the holder
  /// may call it.
  void unlock() {
    // release: the critical section's writes before the next holder's acquire. An
    // exchange (not a store) so that a sleeper's announcement (2) is never missed.
    if (word_.exchange(kUnlocked, std::memory_order_release) == kContended) [[unlikely]] {
      Wake();
    }
  }

 private:
  static constexpr std::uint32_t kUnlocked = 0;
  static constexpr std::uint32_t kLocked = 1;     // nobody asleep
  static constexpr std::uint32_t kContended = 2;  // someone may be asleep
  /// Tries before sleeping: about glibc's default adaptive spin count.
  static constexpr int kSpins = 100;

  void LockSlow() {
    for (int i = 0; i < kSpins; ++i) {
      Pause();
      // Read first: a compare-and-swap on a held word only moves its cache line.
      if (word_.load(std::memory_order_relaxed) == kUnlocked) {
        std::uint32_t expected = kUnlocked;
        if (word_.compare_exchange_weak(expected, kLocked, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
          return;
        }
      }
    }
    // From here on this thread takes the word as kContended: it cannot tell whether
    // others sleep, so its unlock must wake one (Drepper's mutex 3).
    while (word_.exchange(kContended, std::memory_order_acquire) != kUnlocked) {
      Sleep();
    }
  }

  /// Sleeps while the word is kContended (returns at once when it changed).
  void Sleep() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, kContended,
            nullptr, nullptr, 0);
#else
    word_.wait(kContended, std::memory_order_relaxed);
#endif
  }

  void Wake() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
#else
    word_.notify_one();
#endif
  }

  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#else
    std::this_thread::yield();
#endif
  }

  std::atomic<std::uint32_t> word_{kUnlocked};
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                    std::atomic<std::uint32_t>::is_always_lock_free,
                "the futex word is the atomic's own 32 bits");
};

}  // namespace inferq
