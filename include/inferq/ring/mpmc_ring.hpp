/// @file inferq/ring/mpmc_ring.hpp
///
/// MpmcRing<T, Wait>: a bounded multi-producer multi-consumer FIFO ring. Lanes of the
/// engine are MpmcRings; so can be any hand-off between threads.
///
/// Usage:
/// @code
///   inferq::MpmcRing<Job> ring(1024);        // capacity: a power of two, at least 2
///   ring.try_push(Job{...});                 // false only when full or closed
///   Job j;
///   if (ring.pop(j)) { ... }                 // waits; false once closed and drained
///   std::array<Job, 16> out;
///   std::size_t n = ring.try_pop_bulk(std::span(out));   // up to 16 at once
///   ring.close();                            // wakes every waiter
/// @endcode
///
/// Thread safety: every member function may be called from any number of threads at
/// once, except the constructor and destructor.
///
/// Algorithm: Dmitry Vyukov's bounded MPMC queue (slot sequence numbers), with
/// tickets and sequences counted modulo 2^63 and the closed flag in bit 63 of the
/// producers' ticket. Producers draw tickets from `head_`, consumers from `tail_`;
/// ticket t uses slot t % capacity.
/// Invariants (all arithmetic modulo 2^63):
///  1. A slot's `seq` is t when it is free for the producer of ticket t, t + 1 when it
///     holds that producer's item, and t + capacity once the item was taken (= free for
///     the producer of ticket t + capacity).
///  2. A ticket is claimed by a successful CAS on head_/tail_; only its owner touches
///     the slot's storage until it publishes the next `seq` with a release store, and
///     the next owner acquires that store before touching the storage. The CAS
///     publishes no data, the slot's seq does; it is seq_cst (kClaim) only because
///     the wake-up protocol pairs with it (internal/event_count.hpp, invariants 2
///     and 3), relaxed for a Wait that never sleeps.
///  3. A bulk call claims n consecutive tickets with one CAS, after seeing all n slots
///     ready; a ready slot stays ready until its ticket is claimed, so the claim holds.
///  4. Bit 63 of head_ is the closed flag, set by close() with one atomic OR: a push
///     either claimed its ticket before close() or fails, so no push succeeds after
///     close() and then goes unseen by the consumers draining the ring.
///  5. Because capacity divides 2^63, slot index and sequence stay consistent when the
///     63-bit tickets wrap (after 2^63 operations; a test starts near the wrap).
///  6. With no operation running, items live exactly in the slots of tickets
///     [tail_, head_); the destructor destroys those.
///  7. Layout: slots of at most half a cache line are packed k to a line in ticket
///     order (slot t % capacity), as xenium's and rigtorp's rings lay them out: a
///     producer that runs ahead of its consumer fills a line with k items before it
///     moves on, and the consumer takes k items per line it pulls over, so the two
///     sides move one line per k items rather than one per item. A ring of 8-byte
///     items takes 16 bytes a slot. (An earlier layout put consecutive tickets on
///     different lines, AtomicQueue's index remapping; it moved a line per item and
///     cost 0.6-0.7x of the packed layout's throughput on an Intel Xeon VM:
///     BENCHMARKS.md, "The ring's slot layout".)
///
/// try_ operations fail only when the ring is full (try_push), empty (try_pop) or
/// closed (try_push) at the moment they read the opposite ticket. When the next slot
/// is still being emptied by a consumer that claimed it (try_push), or filled by a
/// producer that claimed it (try_pop), the call waits for that thread to finish
/// rather than fail: a few instructions unless that thread was preempted. Bulk calls
/// return how many items moved, 0 exactly when a single try_ would have failed.
///
/// Waiting (push, pop, push_for, pop_for) follows `Wait` (inferq/ring/wait_strategy.hpp):
/// by default spin, yield for up to 15 µs, then sleep on a futex; close() wakes every
/// waiter.
///
/// Requirements on T: nothrow move construction, move assignment and destruction (a
/// throwing move after a ticket is claimed would leave a hole no one can fill). T may
/// be move-only. A copy or other construction that may throw is done before a ticket
/// is claimed.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "inferq/base/cache_line.hpp"
#include "inferq/ring/internal/event_count.hpp"
#include "inferq/ring/wait_strategy.hpp"

namespace inferq {

struct MpmcRingTestAccess;

/// A bounded multi-producer multi-consumer FIFO ring of T, waiting as `Wait` says
/// (see the file comment).
template <class T, class Wait = HybridWait>
class MpmcRing {
  static_assert(std::is_nothrow_move_constructible_v<T>,
                "MpmcRing<T> needs a nothrow move constructor");
  static_assert(std::is_nothrow_move_assignable_v<T>,
                "MpmcRing<T> needs a nothrow move assignment");
  static_assert(std::is_nothrow_destructible_v<T>, "MpmcRing<T> needs a nothrow destructor");

 public:
  using value_type = T;        ///< the item type
  using wait_strategy = Wait;  ///< how blocking calls wait (ring/wait_strategy.hpp)

  /// Capacity in items, rounded up to a power of two, at least 2 (with one slot the
  /// sequence "holds the item of ticket t" would equal "free for ticket t + 1").
  /// Throws std::invalid_argument for 0 or for more than 2^40 items.
  explicit MpmcRing(std::size_t capacity)
      : capacity_(ring_internal::RingCapacity("MpmcRing", capacity, 2)) {
    mask_ = capacity_ - 1;
    // Invariant 7: capacity / k lines (one line when the ring has fewer slots).
    lines_ = std::make_unique<Line[]>((capacity_ + kSlotsPerLine - 1) / kSlotsPerLine);
    for (std::size_t i = 0; i < capacity_; ++i) {
      SlotAt(i).seq.store(i, std::memory_order_relaxed);
    }
  }

  MpmcRing(const MpmcRing&) = delete;
  MpmcRing& operator=(const MpmcRing&) = delete;

  /// Destroys the items still inside (invariant 6). No other thread may use the ring.
  ~MpmcRing() {
    const std::uint64_t head = head_.load(std::memory_order_relaxed) & kTicketMask;
    for (std::uint64_t t = tail_.load(std::memory_order_relaxed); t != head;
         t = (t + 1) & kTicketMask) {
      SlotAt(t).ptr()->~T();
    }
  }

  /// Non-blocking. False when the ring is full or closed; on false `v` is untouched.
  bool try_push(T&& v) { return try_emplace(std::move(v)); }
  /// As try_push(T&&), with a copy of `v`.
  bool try_push(const T& v) { return try_emplace(v); }

  /// As try_push, but wakes no consumer asleep in pop: the caller owes the ring a
  /// wake_consumers() once it pushed what it had (a producer of a burst pays one
  /// futex wake for it instead of one per item). Until then a sleeping consumer
  /// sleeps on; one that is about to sleep sees the item (its re-check after
  /// announcing itself), so nothing is lost, only delayed.
  bool try_push_quiet(T&& v) { return try_emplace_nothrow<false>(std::move(v)); }
  /// Wakes up to `n` consumers asleep in pop (after try_push_quiet of n items).
  void wake_consumers(std::size_t n) {
    if constexpr (Wait::kSleeps) {
      if (n > 0) not_empty_.NotifyMany(n);
    }
  }

  /// Constructs the item in its slot. When T is not nothrow-constructible from `a...`
  /// a temporary T is built first and moved in (see "Requirements on T").
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

  /// Non-blocking. False when the ring is empty; on true the item is moved to `out`.
  bool try_pop(T& out) { return TryPop<true>(out); }

  /// As try_pop, but wakes no producer asleep in push: the caller owes the ring a
  /// wake_producers() once it popped what it takes now, and before it waits for
  /// anything (a consumer taking a batch pays one futex wake for it instead of one
  /// per item). Until then a sleeping producer sleeps on; one about to sleep sees the
  /// room (its re-check after announcing itself).
  bool try_pop_quiet(T& out) { return TryPop<true, false>(out); }
  /// Wakes up to `n` producers asleep in push (after n try_pop_quiet).
  void wake_producers(std::size_t n) {
    if constexpr (Wait::kSleeps) {
      if (n > 0) not_full_.NotifyMany(n);
    }
  }

  /// Moves up to `out.size()` items into `out` in FIFO order; returns how many.
  template <std::size_t Extent>
  std::size_t try_pop_bulk(std::span<T, Extent> out) {
    if (out.empty()) return 0;
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    for (;;) {
      std::size_t n = 0;
      while (n < out.size() &&
             SlotAt(t + n).seq.load(kObserve) == ((t + n + 1) & kTicketMask)) {
        ++n;
      }
      if (n == 0) return try_pop(out[0]) ? 1 : 0;
      if (tail_.compare_exchange_weak(t, (t + n) & kTicketMask, kClaim,
                                      std::memory_order_relaxed)) {
        for (std::size_t i = 0; i < n; ++i) {
          const std::uint64_t ti = (t + i) & kTicketMask;
          TakeFrom(SlotAt(ti), ti, out[i]);
        }
        if constexpr (Wait::kSleeps) not_full_.NotifyMany(n);  // n slots: n producers
        return n;
      }
    }
  }

  /// Moves items from [first, last) into the ring in order until it is full; returns
  /// how many moved (the first ones). Requires a nothrow move from *first.
  template <class It>
  std::size_t try_push_bulk(It first, It last) {
    static_assert(std::is_nothrow_constructible_v<T, decltype(std::move(*first))>,
                  "try_push_bulk moves items in after claiming tickets");
    const auto want = static_cast<std::size_t>(std::distance(first, last));
    if (want == 0) return 0;
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      if (h & kClosedBit) return 0;
      std::size_t n = 0;
      while (n < want &&
             SlotAt(h + n).seq.load(kObserve) == ((h + n) & kTicketMask)) {
        ++n;
      }
      // Constructs from *first only after claiming a ticket, so a full ring leaves
      // the caller's item untouched even when it converts to T.
      if (n == 0) return try_emplace_nothrow(std::move(*first)) ? 1 : 0;
      if (head_.compare_exchange_weak(h, (h + n) & kTicketMask, kClaim,
                                      std::memory_order_relaxed)) {
        It it = first;
        for (std::size_t i = 0; i < n; ++i, ++it) {
          const std::uint64_t hi = (h + i) & kTicketMask;
          Slot& s = SlotAt(hi);
          ::new (static_cast<void*>(s.storage)) T(std::move(*it));
          s.seq.store((hi + 1) & kTicketMask, kPublish);
        }
        if constexpr (Wait::kSleeps) not_empty_.NotifyMany(n);  // n items: n consumers
        return n;
      }
    }
  }
  /// As try_push_bulk(first, last) over `items`.
  template <class U, std::size_t Extent>
  std::size_t try_push_bulk(std::span<U, Extent> items) {
    return try_push_bulk(items.begin(), items.end());
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
  /// As push_for(T&&, timeout), with a copy of `v`.
  template <class Rep, class Period>
  bool push_for(const T& v, std::chrono::duration<Rep, Period> timeout) {
    return push_until(v, DeadlineAfter(timeout));
  }

  /// Blocking pop: waits while the ring is empty. False once the ring is closed and
  /// every item pushed before close() has been popped.
  bool pop(T& out) { return pop_until(out, kNoDeadline); }

  /// Pop that waits at most `timeout`. False on timeout, or when closed and drained.
  template <class Rep, class Period>
  bool pop_for(T& out, std::chrono::duration<Rep, Period> timeout) {
    return pop_until(out, DeadlineAfter(timeout));
  }

  /// Pop with an absolute deadline in ns of inferq::SteadyClock (kNoDeadline: forever).
  bool pop_until(T& out, std::int64_t deadline_ns) {
    // Spins with the weak form first (TryPop), unannounced: a notifier that does not
    // see this waiter only wakes a sleeper it need not have (no wake-up is lost:
    // internal/event_count.hpp, invariant 4).
    if (TryPop<false>(out)) return true;
    if (deadline_ns != kNoDeadline &&
        ring_internal::MonotonicNowNs() >= deadline_ns) {
      return try_pop(out);  // a try: the exact form
    }
    if (ring_internal::PreSpin([&] { return TryPop<false>(out); })) return true;
    return ring_internal::WaitUntil<Wait>(
        not_empty_, deadline_ns, [&] { return TryPop<false>(out); }, [&] { return try_pop(out); },
        [&] { return drained(); }, [&] { return size_approx() != 0; });
  }

  /// Closes the ring: later pushes fail, pops drain what is left and then fail; every
  /// blocked producer and consumer wakes. Idempotent.
  void close() {
    // seq_cst: the change a sleeper's give_up() re-check reads (event_count.hpp, inv. 2).
    head_.fetch_or(kClosedBit, std::memory_order_seq_cst);
    not_empty_.NotifyAll();
    not_full_.NotifyAll();
  }

  /// True once close() was called.
  bool closed() const { return (head_.load(std::memory_order_seq_cst) & kClosedBit) != 0; }

  /// Items pushed and not yet popped, including ones in flight; exact when no
  /// operation is running.
  std::size_t size_approx() const {
    const std::uint64_t t = tail_.load(std::memory_order_acquire);
    const std::uint64_t h = head_.load(std::memory_order_acquire) & kTicketMask;
    const std::uint64_t n = (h - t) & kTicketMask;
    if (n > kTicketMask / 2) return 0;  // a consumer's claim seen before its producer's
    return n > capacity_ ? capacity_ : static_cast<std::size_t>(n);
  }

  /// Capacity in items: the constructor's, rounded up to a power of two (at least 2).
  std::size_t capacity() const { return capacity_; }

 private:
  friend struct MpmcRingTestAccess;
  static constexpr std::uint64_t kClosedBit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t kTicketMask = kClosedBit - 1;
  /// Slot publication and observation (invariant 2).
  static constexpr std::memory_order kPublish = std::memory_order_release;
  static constexpr std::memory_order kObserve = std::memory_order_acquire;
  /// A successful claim of tickets on head_/tail_ (and close()'s OR) is the change a
  /// sleeping waiter's re-check reads: seq_cst, so that the notify after it needs no
  /// fence (internal/event_count.hpp, invariant 2). On x86 a CAS is a locked
  /// instruction whatever its order, so this costs nothing there.
  static constexpr std::memory_order kClaim =
      Wait::kSleeps ? std::memory_order_seq_cst : std::memory_order_relaxed;

  /// A slot is the sequence and the item's storage. Small slots are packed k to a
  /// cache line in ticket order (invariant 7); a slot of more than half a line gets a
  /// line of its own.
  struct SlotFields {
    std::atomic<std::uint64_t> seq{0};
    alignas(T) unsigned char storage[sizeof(T)];
  };
  static constexpr std::size_t kSlotAlign =
      sizeof(SlotFields) > kCacheLineSize / 2 ? kCacheLineSize
                                              : std::bit_ceil(sizeof(SlotFields));
  struct alignas(kSlotAlign) Slot {
    std::atomic<std::uint64_t> seq{0};
    alignas(T) unsigned char storage[sizeof(T)];
    T* ptr() { return std::launder(reinterpret_cast<T*>(storage)); }
  };
  static constexpr std::size_t kSlotsPerLine =
      sizeof(Slot) >= kCacheLineSize ? 1 : kCacheLineSize / sizeof(Slot);
  static_assert(sizeof(Slot) % kCacheLineSize == 0 || kCacheLineSize % sizeof(Slot) == 0,
                "slots tile cache lines exactly");
  /// Slots are allocated a line at a time (aligned operator new[]), so no slot
  /// straddles two lines.
  struct alignas(kCacheLineSize) Line {
    Slot slot[kSlotsPerLine];
  };
  static_assert(sizeof(Line) == kSlotsPerLine * sizeof(Slot));

  /// Invariant 7: slot t % capacity, k to a line in ticket order. (k is a power of
  /// two: a slot's size divides the line's, asserted above.)
  Slot& SlotAt(std::uint64_t ticket) const {
    const std::uint64_t i = ticket & mask_;
    return lines_[i / kSlotsPerLine].slot[i % kSlotsPerLine];
  }

  /// a - b as a signed 63-bit number (tickets and sequences are mod 2^63).
  static std::int64_t Distance(std::uint64_t a, std::uint64_t b) {
    return static_cast<std::int64_t>(((a - b) & kTicketMask) << 1) >> 1;
  }

  /// try_pop (kExact), or the weak form the blocking pop spins with: it fails as
  /// soon as the next slot is not filled, without reading head_ to tell an empty
  /// ring from a producer in flight. A waiter re-checks with the exact form before it
  /// sleeps or gives up (pop_until), so the weak form only saves the consumer a read
  /// of the producers' line while it waits anyway: that read pulled head_ away from
  /// the producer on every empty try, and its next claim missed the cache (bench_rings
  /// BM_Throughput, the profile in BENCHMARKS.md).
  template <bool kExact, bool kNotify = true>
  bool TryPop(T& out) {
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = SlotAt(t);
      // acquire (at least): pairs with the producer's store of t + 1 (invariant 2).
      const std::int64_t diff = Distance(s.seq.load(kObserve), (t + 1) & kTicketMask);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(t, (t + 1) & kTicketMask, kClaim,
                                        std::memory_order_relaxed)) {
          TakeFrom(s, t, out);
          if constexpr (kNotify) NotifyNotFull();
          return true;
        }
      } else if (diff < 0) {
        if constexpr (!kExact) return false;
        // The slot still waits for the producer of ticket t. Empty, or that producer
        // is in flight? head_ says which.
        if ((head_.load(std::memory_order_acquire) & kTicketMask) == t) return false;
        ring_internal::CpuRelax();
        t = tail_.load(std::memory_order_relaxed);
      } else {
        t = tail_.load(std::memory_order_relaxed);  // another consumer took t
      }
    }
  }

  void TakeFrom(Slot& s, std::uint64_t ticket, T& out) {
    T* p = s.ptr();
    out = std::move(*p);
    p->~T();
    // release (at least): the producer of ticket + capacity sees the slot empty.
    s.seq.store((ticket + capacity_) & kTicketMask, kPublish);
  }

  void NotifyNotEmpty() {
    if constexpr (Wait::kSleeps) not_empty_.NotifyOne();
  }
  void NotifyNotFull() {
    if constexpr (Wait::kSleeps) not_full_.NotifyOne();
  }


  /// try_emplace (kExact), or the weak form the blocking push spins with: fails as
  /// soon as the next slot is not empty, without reading tail_ (as TryPop's).
  template <bool kNotify = true, bool kExact = true, class... A>
  bool try_emplace_nothrow(A&&... a) {
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      if (h & kClosedBit) return false;
      Slot& s = SlotAt(h);
      // acquire (at least): pairs with the consumer's store of h (invariant 2).
      const std::int64_t diff = Distance(s.seq.load(kObserve), h);
      if (diff == 0) {
        if (head_.compare_exchange_weak(h, (h + 1) & kTicketMask, kClaim,
                                        std::memory_order_relaxed)) {
          ::new (static_cast<void*>(s.storage)) T(std::forward<A>(a)...);
          // release (at least): the consumer of ticket h sees the constructed item.
          s.seq.store((h + 1) & kTicketMask, kPublish);
          if constexpr (kNotify) NotifyNotEmpty();
          return true;
        }
      } else if (diff < 0) {
        if constexpr (!kExact) return false;
        // The slot still holds the item of ticket h - capacity. Full, or is its
        // consumer in flight? tail_ says which.
        // (A negative distance means h went stale meanwhile: reload.)
        const std::int64_t used = Distance(h, tail_.load(std::memory_order_acquire));
        if (used >= static_cast<std::int64_t>(capacity_)) return false;
        ring_internal::CpuRelax();
        h = head_.load(std::memory_order_relaxed);
      } else {
        h = head_.load(std::memory_order_relaxed);  // another producer took h
      }
    }
  }

  template <class U>
  bool push_until(U&& v, std::int64_t deadline_ns) {
    if constexpr (!std::is_nothrow_constructible_v<T, U&&>) {
      // A copy that may throw is made once, here, not on every retry.
      if (closed()) return false;
      return push_until(T(std::forward<U>(v)), deadline_ns);
    } else {
      // try_emplace constructs from `v` only after claiming a ticket, so a failed
      // attempt leaves `v` intact and it can be retried. Weak tries first, as in
      // pop_until.
      if (try_emplace_nothrow<true, false>(std::forward<U>(v))) return true;
      if (deadline_ns != kNoDeadline &&
          ring_internal::MonotonicNowNs() >= deadline_ns) {
        return try_emplace_nothrow(std::forward<U>(v));  // a try: the exact form
      }
      if (ring_internal::PreSpin([&] { return try_emplace_nothrow<true, false>(std::forward<U>(v)); })) {
        return true;
      }
      return ring_internal::WaitUntil<Wait>(
          not_full_, deadline_ns, [&] { return try_emplace_nothrow<true, false>(std::forward<U>(v)); },
          [&] { return try_emplace_nothrow(std::forward<U>(v)); }, [&] { return closed(); },
          [&] { return size_approx() < capacity_; });
    }
  }

  /// Closed, and every ticket claimed before close() has been popped.
  bool drained() const {
    const std::uint64_t h = head_.load(std::memory_order_seq_cst);
    if (!(h & kClosedBit)) return false;
    return tail_.load(std::memory_order_acquire) == (h & kTicketMask);
  }

  /// Producers' and consumers' tickets on separate lines (no false sharing between
  /// the two sides); the rest is read-only after construction.
  alignas(kCacheLineSize) std::atomic<std::uint64_t> head_{0};
  alignas(kCacheLineSize) std::atomic<std::uint64_t> tail_{0};
  alignas(kCacheLineSize) ring_internal::EventCount not_empty_;
  alignas(kCacheLineSize) ring_internal::EventCount not_full_;
  alignas(kCacheLineSize) std::size_t capacity_ = 0;
  std::uint64_t mask_ = 0;
  std::unique_ptr<Line[]> lines_;
};

}  // namespace inferq
