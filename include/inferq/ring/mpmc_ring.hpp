// File: inferq/ring/mpmc_ring.hpp
//
// MpmcRing<T>: a bounded, lock-free, multi-producer multi-consumer FIFO ring.
// Lanes of the engine are MpmcRings; so can be any hand-off between threads.
//
// Usage:
//   inferq::MpmcRing<Job> ring(1024);        // capacity rounded up to a power of two
//   ring.try_push(Job{...});                 // false when full or closed
//   Job j;
//   if (ring.pop(j)) { ... }                 // waits; false once closed and drained
//   ring.close();                            // wakes every waiter
//
// Thread safety: every member function may be called from any number of threads at
// once, except the constructor and destructor.
//
// Algorithm: the turn-sequenced ring of Dmitry Vyukov's bounded MPMC queue in the
// form of Erik Rigtorp's MPMCQueue: producers draw tickets from `head_`, consumers
// from `tail_`; ticket t uses slot t % capacity in "turn" t / capacity.
// Invariants:
//  1. A slot's `turn` is 2*r when it is free for the producer of turn r, 2*r + 1 when
//     it holds the item of turn r, and 2*(r + 1) once that item was taken.
//  2. A ticket is claimed by a successful CAS on head_/tail_; only its owner touches
//     the slot's storage until it publishes the next turn with a release store, and
//     the next owner acquires that store before touching the storage. The CAS itself
//     can be relaxed: it publishes no data, the slot's turn does.
//  3. Tickets are 63-bit and never wrap in practice (2^63 operations); bit 63 of
//     head_ is the closed flag, set by close() with one atomic OR, so every push
//     either claimed its ticket before close() or fails — there is no push that
//     succeeds after close() and is never popped.
//  4. Items live only in slots whose turn is odd; the destructor destroys exactly
//     those.
//
// When a try_ operation fails although the ring is neither full nor empty
// (the only cases):
//  - try_push fails while size_approx() < capacity() when the slot of the next
//    ticket is still being emptied by a consumer that claimed it but has not yet
//    moved the item out;
//  - try_pop fails while size_approx() > 0 when the slot of the next ticket was
//    claimed by a producer that has not finished constructing the item (items of
//    later tickets wait behind it: the ring stays FIFO).
// Both windows last a few instructions unless the claiming thread is preempted.
//
// Waiting (push, pop, push_for, pop_for): spin ~128 pauses, yield 8 times, then sleep
// on an event count (a futex on Linux, the primitive of std::atomic::wait; see
// internal/event_count.hpp). An idle waiter burns no CPU; close() wakes them all.
//
// Requirements on T: nothrow move construction, move assignment and destruction
// (a throwing move after a ticket is claimed would leave a hole no one can fill).
// T may be move-only. Copying or constructing from other arguments may throw: such
// a T is built before a ticket is claimed.
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

namespace inferq {

template <class T>
class MpmcRing {
  static_assert(std::is_nothrow_move_constructible_v<T>,
                "MpmcRing<T> needs a nothrow move constructor");
  static_assert(std::is_nothrow_move_assignable_v<T>,
                "MpmcRing<T> needs a nothrow move assignment");
  static_assert(std::is_nothrow_destructible_v<T>, "MpmcRing<T> needs a nothrow destructor");

 public:
  using value_type = T;

  // Capacity in items, rounded up to a power of two. Throws std::invalid_argument for
  // 0 or for more than 2^40 items.
  explicit MpmcRing(std::size_t capacity) {
    if (capacity == 0) throw std::invalid_argument("MpmcRing capacity must be > 0, got 0");
    if (capacity > (std::size_t{1} << 40)) {
      throw std::invalid_argument("MpmcRing capacity " + std::to_string(capacity) +
                                  " is larger than 2^40");
    }
    capacity_ = std::bit_ceil(capacity);
    shift_ = static_cast<unsigned>(std::countr_zero(capacity_));
    slots_ = std::make_unique<Slot[]>(capacity_);
  }

  MpmcRing(const MpmcRing&) = delete;
  MpmcRing& operator=(const MpmcRing&) = delete;

  // Destroys the items still inside (invariant 4). No other thread may use the ring.
  ~MpmcRing() {
    for (std::size_t i = 0; i < capacity_; ++i) {
      if (slots_[i].turn.load(std::memory_order_relaxed) & 1) slots_[i].ptr()->~T();
    }
  }

  // Non-blocking. False when the ring is full or closed (see the header comment for
  // the one case where it fails although not full). On false `v` is untouched.
  bool try_push(T&& v) { return try_emplace(std::move(v)); }
  bool try_push(const T& v) { return try_emplace(v); }

  // Constructs the item in its slot. When T is not nothrow-constructible from `a...`
  // a temporary T is built first and moved in (see "Requirements on T").
  template <class... A>
  bool try_emplace(A&&... a) {
    if constexpr (std::is_nothrow_constructible_v<T, A&&...>) {
      return try_emplace_nothrow(std::forward<A>(a)...);
    } else {
      if (closed()) return false;
      T tmp(std::forward<A>(a)...);
      return try_emplace_nothrow(std::move(tmp));
    }
  }

  // Non-blocking. False when the ring is empty (see the header comment for the one
  // case where it fails although not empty). On true the item is moved into `out`.
  bool try_pop(T& out) {
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[t & (capacity_ - 1)];
      const std::uint64_t full = 2 * (t >> shift_) + 1;
      // acquire: pairs with the producer's release store of `full` (invariant 2).
      if (s.turn.load(std::memory_order_acquire) == full) {
        if (tail_.compare_exchange_strong(t, t + 1, std::memory_order_relaxed)) {
          T* p = s.ptr();
          out = std::move(*p);
          p->~T();
          // release: the next producer of this slot sees it empty (invariant 2).
          s.turn.store(full + 1, std::memory_order_release);
          not_full_.NotifyAll();
          return true;
        }
        // CAS failure reloaded t; try the new ticket.
      } else {
        const std::uint64_t prev = t;
        t = tail_.load(std::memory_order_relaxed);
        if (t == prev) return false;
      }
    }
  }

  // Blocking push: waits while the ring is full. False once the ring is closed
  // (`v` then untouched).
  bool push(T&& v) { return push_until(std::move(v), ring_internal::kNoDeadline); }
  bool push(const T& v) { return push_until(v, ring_internal::kNoDeadline); }

  // Push that waits at most `timeout`. False on timeout or when closed.
  template <class Rep, class Period>
  bool push_for(T&& v, std::chrono::duration<Rep, Period> timeout) {
    return push_until(std::move(v), DeadlineAfter(timeout));
  }
  template <class Rep, class Period>
  bool push_for(const T& v, std::chrono::duration<Rep, Period> timeout) {
    return push_until(v, DeadlineAfter(timeout));
  }

  // Blocking pop: waits while the ring is empty. False once the ring is closed and
  // every item pushed before close() has been popped.
  bool pop(T& out) { return pop_until(out, ring_internal::kNoDeadline); }

  // Pop that waits at most `timeout`. False on timeout, or when closed and drained.
  template <class Rep, class Period>
  bool pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    return pop_until(out, DeadlineAfter(timeout));
  }

  // Pop with an absolute deadline in ns of std::chrono::steady_clock.
  bool pop_until(T& out, std::int64_t deadline_ns) {
    if (try_pop(out)) return true;
    if (deadline_ns != ring_internal::kNoDeadline &&
        ring_internal::MonotonicNowNs() >= deadline_ns) {
      return false;
    }
    return ring_internal::WaitUntil(
        not_empty_, deadline_ns, [&] { return try_pop(out); }, [&] { return drained(); });
  }

  // Closes the ring: later pushes fail, pops drain what is left and then fail; every
  // blocked producer and consumer wakes. Idempotent.
  void close() {
    head_.fetch_or(kClosedBit, std::memory_order_acq_rel);
    not_empty_.NotifyAll();
    not_full_.NotifyAll();
  }

  bool closed() const { return (head_.load(std::memory_order_acquire) & kClosedBit) != 0; }

  // Items pushed and not yet popped, including ones in flight; exact when no
  // operation is running.
  std::size_t size_approx() const {
    const std::uint64_t t = tail_.load(std::memory_order_acquire);
    const std::uint64_t h = head_.load(std::memory_order_acquire) & ~kClosedBit;
    if (h <= t) return 0;
    const std::uint64_t n = h - t;
    return n > capacity_ ? capacity_ : static_cast<std::size_t>(n);
  }

  std::size_t capacity() const { return capacity_; }

 private:
  static constexpr std::uint64_t kClosedBit = std::uint64_t{1} << 63;

  struct alignas(kCacheLineSize) Slot {
    std::atomic<std::uint64_t> turn{0};
    alignas(T) unsigned char storage[sizeof(T)];
    T* ptr() { return std::launder(reinterpret_cast<T*>(storage)); }
  };

  // Saturating: a timeout too long for int64 nanoseconds (hours::max(), ...) means
  // no deadline. Converted through double so that no duration_cast can overflow;
  // below 2^53 ns (104 days) the conversion is exact.
  template <class Rep, class Period>
  static std::int64_t DeadlineAfter(std::chrono::duration<Rep, Period> timeout) {
    const std::int64_t now = ring_internal::MonotonicNowNs();
    const double ns = std::chrono::duration<double, std::nano>(timeout).count();
    if (!(ns > 0)) return now;  // also NaN
    if (ns >= static_cast<double>(ring_internal::kNoDeadline - now)) {
      return ring_internal::kNoDeadline;
    }
    return now + static_cast<std::int64_t>(ns);
  }

  template <class... A>
  bool try_emplace_nothrow(A&&... a) {
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      if (h & kClosedBit) return false;
      Slot& s = slots_[h & (capacity_ - 1)];
      const std::uint64_t empty = 2 * (h >> shift_);
      // acquire: pairs with the consumer's release store of `empty` (invariant 2).
      if (s.turn.load(std::memory_order_acquire) == empty) {
        if (head_.compare_exchange_strong(h, h + 1, std::memory_order_relaxed)) {
          ::new (static_cast<void*>(s.storage)) T(std::forward<A>(a)...);
          // release: the consumer of this turn sees the constructed item.
          s.turn.store(empty + 1, std::memory_order_release);
          not_empty_.NotifyAll();
          return true;
        }
      } else {
        const std::uint64_t prev = h;
        h = head_.load(std::memory_order_relaxed);
        if (h == prev) return false;
      }
    }
  }

  template <class U>
  bool push_until(U&& v, std::int64_t deadline_ns) {
    if constexpr (!std::is_nothrow_constructible_v<T, U&&>) {
      // A copy that may throw is made once, here, not on every retry.
      if (closed()) return false;
      return push_until(T(std::forward<U>(v)), deadline_ns);
    }
    if (try_emplace(std::forward<U>(v))) return true;
    // try_emplace constructs from `v` only after claiming a ticket, so a failed
    // attempt leaves `v` intact and it can be retried.
    return ring_internal::WaitUntil(
        not_full_, deadline_ns, [&] { return try_emplace(std::forward<U>(v)); },
        [&] { return closed(); });
  }

  // Closed, and every ticket claimed before close() has been popped.
  bool drained() const {
    const std::uint64_t h = head_.load(std::memory_order_acquire);
    if (!(h & kClosedBit)) return false;
    return tail_.load(std::memory_order_acquire) >= (h & ~kClosedBit);
  }

  // Producers' and consumers' tickets on separate lines (no false sharing between
  // the two sides); the rest is read-only after construction.
  alignas(kCacheLineSize) std::atomic<std::uint64_t> head_{0};
  alignas(kCacheLineSize) std::atomic<std::uint64_t> tail_{0};
  alignas(kCacheLineSize) ring_internal::EventCount not_empty_;
  alignas(kCacheLineSize) ring_internal::EventCount not_full_;
  alignas(kCacheLineSize) std::size_t capacity_ = 0;
  unsigned shift_ = 0;
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace inferq
