/// @file inferq/ring/spsc_ring.hpp
///
/// SpscRing<T, Wait>: a bounded FIFO ring for exactly one producer thread and one
/// consumer thread, with the names of MpmcRing. Cheaper than MpmcRing: no CAS, and
/// each side keeps a cached copy of the other side's index so that it reads the
/// shared one only when the cached value says full/empty (Erik Rigtorp's SPSCQueue).
///
/// Usage:
/// @code
///   inferq::SpscRing<Token> ring(4096);
///   // producer thread:            // consumer thread:
///   ring.push(tok);                Token t; while (ring.pop(t)) { ... }
///   ring.close();
/// @endcode
///
/// Thread safety: at most one thread at a time in the producer calls (try_push,
/// try_emplace, push, push_for) and at most one in the consumer calls (try_pop,
/// pop, pop_for); close(), closed(), size_approx() and capacity() from any thread.
///
/// Invariants:
///  1. head_ (written by the producer, and by close() for bit 63) and tail_ (written
///     by the consumer) count items pushed and popped; 63 bits never wrap in practice
///     (2^63 items). Items live in slots [tail_, head_) modulo capacity.
///  2. The producer writes a slot, then publishes head_ + 1 with a release (or, see
///     kPublish, seq_cst) CAS; the consumer acquires head_ before reading the slot.
///     Symmetrically for tail_, with a store.
///  3. Each side's cached copy of the other index is only ever behind the real value,
///     so it can make a call see the ring fuller/emptier than it is (then the real
///     index is reloaded), never the opposite.
///  4. Bit 63 of head_ is the closed flag, set by close() with an atomic OR. The
///     producer constructs the item, then publishes head_ + 1 with a CAS that fails if
///     the bit appeared; so no push succeeds after close() unseen by the consumer,
///     which fails only when the bit is set and it has caught up with head_.
///
/// try_push fails only when the ring is full or closed, try_pop only when it is empty.
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "inferq/base/cache_line.hpp"
#include "inferq/ring/internal/event_count.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace inferq {

/// A bounded FIFO ring of T for one producer thread and one consumer thread, waiting
/// as `Wait` says (see the file comment).
template <class T, class Wait = HybridWait>
class SpscRing {
  static_assert(std::is_nothrow_move_constructible_v<T>,
                "SpscRing<T> needs a nothrow move constructor");
  static_assert(std::is_nothrow_move_assignable_v<T>,
                "SpscRing<T> needs a nothrow move assignment");
  static_assert(std::is_nothrow_destructible_v<T>, "SpscRing<T> needs a nothrow destructor");

 public:
  using value_type = T;  ///< the item type

  /// Capacity in items, rounded up to a power of two. Throws std::invalid_argument for
  /// 0 or for more than 2^40 items.
  explicit SpscRing(std::size_t capacity)
      : capacity_(ring_internal::RingCapacity("SpscRing", capacity, 1)) {
    mask_ = capacity_ - 1;
    slots_ = std::make_unique<Slot[]>(capacity_);
  }
  SpscRing(const SpscRing&) = delete;
  SpscRing& operator=(const SpscRing&) = delete;
  ~SpscRing() {
    const std::uint64_t h = head_.load(std::memory_order_relaxed) & ~kClosedBit;
    for (std::uint64_t t = tail_.load(std::memory_order_relaxed); t != h; ++t) {
      slots_[t & mask_].ptr()->~T();
    }
  }

  /// False when full or closed; `v` is then untouched.
  bool try_push(T&& v) {
    return Push([&](T& unpublished) { v = std::move(unpublished); }, std::move(v));
  }
  /// As try_push(T&&), with a copy of `v`.
  bool try_push(const T& v) { return try_emplace(v); }

  /// False when full or closed. When close() races with this call, arguments already
  /// forwarded into the item are lost with it (try_push(T&&) gives the item back).
  template <class... A>
  bool try_emplace(A&&... a) {
    return Push([](T&) {}, std::forward<A>(a)...);
  }

  /// False when the ring is empty; on true the item is moved to `out`.
  bool try_pop(T& out) {
    const std::uint64_t t = tail_.load(std::memory_order_relaxed);  // ours
    if (t == head_cache_) {
      // acquire: sees the item (invariant 2); the closed bit is not a count.
      head_cache_ = head_.load(kObserve) & ~kClosedBit;
      if (t == head_cache_) return false;
    }
    T* p = slots_[t & mask_].ptr();
    out = std::move(*p);
    p->~T();
    tail_.store(t + 1, kPublish);
    if constexpr (Wait::kSleeps) not_full_.NotifyOne();
    return true;
  }

  /// Blocking push: waits while the ring is full. False once the ring is closed
  /// (`v` then untouched).
  bool push(T&& v) { return push_until(std::move(v), kNoDeadline); }
  /// As push(T&&), with a copy of `v`.
  bool push(const T& v) { return push_until(v, kNoDeadline); }
  /// Push that waits at most `timeout`. False on timeout or when closed.
  template <class Rep, class Period>
  bool push_for(T&& v, std::chrono::duration<Rep, Period> timeout) {
    return push_until(std::move(v), DeadlineAfter(timeout));
  }
  /// Blocking pop: waits while the ring is empty. False once the ring is closed and
  /// every item pushed before close() has been popped.
  bool pop(T& out) { return pop_until(out, kNoDeadline); }
  /// Pop that waits at most `timeout`. False on timeout, or when closed and drained.
  template <class Rep, class Period>
  bool pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    return pop_until(out, DeadlineAfter(timeout));
  }

  /// Closes the ring: later pushes fail, pops drain what is left and then fail; a
  /// blocked producer or consumer wakes. Idempotent.
  void close() {
    head_.fetch_or(kClosedBit, std::memory_order_seq_cst);
    not_empty_.NotifyAll();
    not_full_.NotifyAll();
  }
  /// True once close() was called.
  bool closed() const { return (head_.load(std::memory_order_seq_cst) & kClosedBit) != 0; }

  /// Items pushed and not yet popped; exact when neither side is in a call.
  std::size_t size_approx() const {
    const std::uint64_t t = tail_.load(std::memory_order_acquire);
    const std::uint64_t h = head_.load(std::memory_order_acquire) & ~kClosedBit;
    return h > t ? static_cast<std::size_t>(h - t) : 0;
  }
  /// Capacity in items: the constructor's, rounded up to a power of two.
  std::size_t capacity() const { return capacity_; }

 private:
  static constexpr std::uint64_t kClosedBit = std::uint64_t{1} << 63;
  /// Publication and observation (invariant 2). With a Wait that sleeps, head_ and
  /// tail_ are published seq_cst instead: each is the change a sleeping waiter's
  /// re-check reads, and the notify after it relies on that order instead of a fence
  /// (internal/event_count.hpp, invariant 2). On x86 the CAS on head_ costs the same
  /// either way; the store of tail_ becomes an exchange (a locked instruction, about
  /// what the fence it replaces cost).
  static constexpr std::memory_order kPublish =
      Wait::kSleeps ? std::memory_order_seq_cst : std::memory_order_release;
  static constexpr std::memory_order kObserve = std::memory_order_acquire;

  /// Constructs the item in the next slot, then publishes it with a CAS on head_ that
  /// fails only if close() set the closed bit meanwhile (invariant 4); then the item
  /// is handed to `restore` and destroyed.
  template <class Restore, class... A>
  bool Push(Restore&& restore, A&&... a) {
    const std::uint64_t h = head_.load(std::memory_order_relaxed);  // ours but the bit
    if (h & kClosedBit) return false;
    if (h - tail_cache_ == capacity_) {
      // acquire: the consumer's reads of the slot finished before it moved tail_.
      tail_cache_ = tail_.load(kObserve);
      if (h - tail_cache_ == capacity_) return false;
    }
    T* p = ::new (static_cast<void*>(slots_[h & mask_].storage)) T(std::forward<A>(a)...);
    std::uint64_t expected = h;
    // release (at least): publishes the item (invariant 2).
    if (!head_.compare_exchange_strong(expected, h + 1, kPublish,
                                       std::memory_order_relaxed)) {
      restore(*p);
      p->~T();
      return false;
    }
    if constexpr (Wait::kSleeps) not_empty_.NotifyOne();
    return true;
  }

  struct Slot {
    alignas(T) unsigned char storage[sizeof(T)];
    T* ptr() { return std::launder(reinterpret_cast<T*>(storage)); }
  };


  template <class U>
  bool push_until(U&& v, std::int64_t deadline_ns) {
    if constexpr (!std::is_nothrow_constructible_v<T, U&&>) {
      if (closed()) return false;
      T copy(std::forward<U>(v));
      return push_until(std::move(copy), deadline_ns);
    } else {
      // If close() lands between constructing the item and publishing it, an rvalue
      // `v` gets its item back (as try_push(T&&) does): on false it is untouched.
      auto attempt = [&] {
        if constexpr (std::is_same_v<U, T> && !std::is_lvalue_reference_v<U>) {
          return Push([&](T& unpublished) { v = std::move(unpublished); }, std::move(v));
        } else {
          return Push([](T&) {}, std::forward<U>(v));
        }
      };
      if (attempt()) return true;
      // One producer: no other waiter to pass a wake-up on to.
      return ring_internal::WaitUntil<Wait>(not_full_, deadline_ns, attempt,
                                            [&] { return closed(); }, [] { return false; });
    }
  }

  bool pop_until(T& out, std::int64_t deadline_ns) {
    if (try_pop(out)) return true;
    return ring_internal::WaitUntil<Wait>(
        not_empty_, deadline_ns, [&] { return try_pop(out); }, [&] {
          // Closed and caught up: every push that succeeded published before the
          // closed bit was set (invariant 4).
          const std::uint64_t h = head_.load(std::memory_order_seq_cst);
          return (h & kClosedBit) && tail_.load(std::memory_order_relaxed) == (h & ~kClosedBit);
        },
        [] { return false; });  // one consumer: no other waiter to pass a wake-up on to
  }

  /// Producer line: its index and its cache of the consumer's.
  alignas(kCacheLineSize) std::atomic<std::uint64_t> head_{0};
  std::uint64_t tail_cache_ = 0;
  /// Consumer line.
  alignas(kCacheLineSize) std::atomic<std::uint64_t> tail_{0};
  std::uint64_t head_cache_ = 0;
  alignas(kCacheLineSize) ring_internal::EventCount not_empty_;
  alignas(kCacheLineSize) ring_internal::EventCount not_full_;
  alignas(kCacheLineSize) std::size_t capacity_ = 0;
  std::uint64_t mask_ = 0;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace inferq
