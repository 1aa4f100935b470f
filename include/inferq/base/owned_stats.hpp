/// @file inferq/base/owned_stats.hpp
///
/// OwnedCounter and OwnedHistogram (on ThreadOwner): counts and histograms that one thread writes
/// almost always but any thread may write, such as the statistics of a consumer
/// member that one thread pulls and acks (another thread may pull it too, a timer
/// thread may expire its deliveries). The first thread to write one owns it and
/// writes its owned part with plain loads and stores: no locked instruction, where an
/// atomic add costs a `lock`-prefixed one (about 20 cycles, more when another core
/// reads the line). Any other thread writes a shared part with atomic adds. A read
/// adds the parts. The idea is biased locking's (Kawachiya, Koseki and Onodera,
/// "Lock Reservation", OOPSLA 2002): make the common owner's path free of atomics,
/// and let others pay.
///
/// Usage:
/// @code
///   inferq::OwnedCounter out;
///   out.Add(1);   // on the member's thread: a load and a store
///   out.Add(-1);  // on another thread: an atomic add
///   std::int64_t n = out.Load();
/// @endcode
///
/// Invariants:
///  1. `owner_` changes once, from null to a thread's token, by compare-and-swap; only
///     the thread of that token writes the owned part, so its load-then-store is exact.
///  2. A thread's token is the address of a thread-local object, unique among the
///     threads alive at once. A thread that ended left the owned part as it was; a
///     later thread that gets the same address writes it after that end (thread
///     creation and join order it), so there is one writer at a time.
///  3. An OwnedHistogram's shared part is made by the first thread that records and is
///     not the owner, installed by compare-and-swap (release; readers load it with
///     acquire) and freed with the histogram: a histogram that one thread writes has
///     no second 15 KiB.
///
/// Thread safety: Add and Record from any threads at once; reads from any thread (a
/// read racing a write may leave that write out, as an atomic counter's would).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <span>

#include "inferq/base/histogram.hpp"

namespace inferq {

/// Which thread owns something that one thread uses almost always: the first thread
/// that asks (invariants 1 and 2). The owner may then use a part of it that no other
/// thread touches (a counter's plain stores, a member's cached log reader).
class ThreadOwner {
 public:
  /// True when the calling thread owns it, making it the owner when nobody is yet.
  bool IsMine() {
    const void* me = ThisThreadToken();
    // relaxed: only the thread whose token this is uses the owned part; nothing
    // else is published through `owner_`.
    const void* cur = owner_.load(std::memory_order_relaxed);
    if (cur == me) [[likely]] return true;
    return cur == nullptr && owner_.compare_exchange_strong(cur, me, std::memory_order_relaxed);
  }

 private:
  /// The calling thread's token (invariant 2).
  static const void* ThisThreadToken() {
    thread_local const char token = 0;
    return &token;
  }
  std::atomic<const void*> owner_{nullptr};
};

/// A signed count: Add(+n) and Add(-n) from any threads.
class OwnedCounter {
 public:
  /// Adds `n`. `order`: std::memory_order_relaxed (a statistic) or
  /// std::memory_order_release (what this thread wrote before is seen by a reader
  /// whose acquire Load sees the addition), as an atomic add's order would be.
  void Add(std::int64_t n, std::memory_order order = std::memory_order_relaxed) {
    // Each order a constant: an order known only at run time is compiled as
    // seq_cst, and a seq_cst store is a locked exchange on x86-64.
    const bool release = order != std::memory_order_relaxed;
    if (owner_.IsMine()) {
      const std::int64_t v = owned_.load(std::memory_order_relaxed) + n;
      if (release) {
        owned_.store(v, std::memory_order_release);
      } else {
        owned_.store(v, std::memory_order_relaxed);
      }
      return;
    }
    if (release) {
      shared_.fetch_add(n, std::memory_order_release);
    } else {
      shared_.fetch_add(n, std::memory_order_relaxed);
    }
  }
  /// The count. `order`: std::memory_order_relaxed or std::memory_order_acquire
  /// (pairs with a release Add, for each part).
  std::int64_t Load(std::memory_order order = std::memory_order_relaxed) const {
    if (order == std::memory_order_relaxed) {
      return shared_.load(std::memory_order_relaxed) + owned_.load(std::memory_order_relaxed);
    }
    return shared_.load(std::memory_order_acquire) + owned_.load(std::memory_order_acquire);
  }

 private:
  ThreadOwner owner_;
  std::atomic<std::int64_t> owned_{0};
  std::atomic<std::int64_t> shared_{0};
};

/// A Histogram (base/histogram.hpp) with an owned and a shared part. Never throws:
/// should the shared part's 15 KiB not be had (std::bad_alloc), a value another
/// thread records is counted without its bucket, and snapshots count such values at
/// their mean.
class OwnedHistogram {
 public:
  OwnedHistogram() = default;
  OwnedHistogram(const OwnedHistogram&) = delete;
  OwnedHistogram& operator=(const OwnedHistogram&) = delete;
  ~OwnedHistogram() { delete shared_.load(std::memory_order_acquire); }

  /// As Histogram::Record.
  [[gnu::always_inline]] void Record(std::uint64_t v) {
    if (owner_.IsMine()) {
      owned_.RecordSingleWriter(v);
    } else if (Histogram* h = Shared(); h != nullptr) [[likely]] {
      h->Record(v);
    } else {
      Unbucketed(v, 1);
    }
  }
  /// As Histogram::RecordMany.
  void RecordMany(std::span<const std::uint64_t> values) {
    if (owner_.IsMine()) {
      for (const std::uint64_t v : values) owned_.RecordSingleWriter(v);
    } else if (Histogram* h = Shared(); h != nullptr) [[likely]] {
      h->RecordMany(values);
    } else {
      std::uint64_t sum = 0;
      for (const std::uint64_t v : values) sum += v;
      Unbucketed(sum, values.size());
    }
  }

  /// Both parts merged, as Histogram::Snapshot.
  HistogramSnapshot Snapshot() const {
    HistogramSnapshot s = owned_.Snapshot();
    if (const Histogram* h = shared_.load(std::memory_order_acquire); h != nullptr) s.Merge(h->Snapshot());
    // relaxed: statistics.
    if (const std::uint64_t n = unbucketed_count_.load(std::memory_order_relaxed); n > 0) {
      s.Record(unbucketed_sum_.load(std::memory_order_relaxed) / n, n);
    }
    return s;
  }
  /// The values recorded, each once whichever part it went to (Histogram::count).
  std::uint64_t count() const {
    const Histogram* h = shared_.load(std::memory_order_acquire);
    return owned_.count() + (h != nullptr ? h->count() : 0) + unbucketed_count_.load(std::memory_order_relaxed);
  }

 private:
  /// The shared part, made on first use; nullptr when it cannot be made.
  Histogram* Shared() {
    // acquire: pairs with the release of the compare-and-swap that installed it.
    Histogram* h = shared_.load(std::memory_order_acquire);
    if (h != nullptr) [[likely]] return h;
    std::unique_ptr<Histogram> made;
    try {
      made = std::make_unique<Histogram>();
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
    if (shared_.compare_exchange_strong(h, made.get(), std::memory_order_acq_rel)) return made.release();
    return h;  // another thread installed one first (invariant 3)
  }
  void Unbucketed(std::uint64_t sum, std::uint64_t n) {
    // relaxed: statistics.
    unbucketed_sum_.fetch_add(sum, std::memory_order_relaxed);
    unbucketed_count_.fetch_add(n, std::memory_order_relaxed);
  }

  ThreadOwner owner_;
  Histogram owned_;
  std::atomic<Histogram*> shared_{nullptr};
  std::atomic<std::uint64_t> unbucketed_count_{0};
  std::atomic<std::uint64_t> unbucketed_sum_{0};
};

}  // namespace inferq
