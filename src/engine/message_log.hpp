// File: src/engine/message_log.hpp (not API)
//
// MessageLog<T>: a stream's messages as a sequence-indexed, segmented log. Sequence
// s lives in slot s % S of the segment that covers [s - s % S, s - s % S + S), where
// S = 2^segment_bits; the slot holds the message itself (a T constructed in place),
// so storing a message allocates nothing but, once per S messages, a segment (taken
// from the log's free list when one is there). Publishers claim sequences with one
// atomic add and publish each by a release store of its number into its slot (LMAX
// Disruptor's multi-producer sequencer); readers find a slot by arithmetic and see it
// published when the slot's number equals their sequence. Retention is arithmetic
// too: TrimBefore(s) drops every segment wholly below s, Remove(s) marks one message
// removed, and a segment whose messages are all removed goes at once. A dropped
// segment is recycled whole when the last reader lets go of it.
//
//   MessageLog<Msg> log(/*segment_bits=*/10, /*first_seq=*/1);
//   const std::uint64_t s = log.Claim(1);       // any thread
//   log.Publish(s, Msg{...});                   // the claimer, once per claimed seq
//   MessageLog<Msg>::Ref r;
//   if (log.Read(s, r) == LogRead::kReady) Use(*r);   // any thread; r pins the segment
//
// Thread safety: every member may be called from any number of threads at once,
// except the constructor and destructor. A Ref may move between threads.
//
// Invariants:
//  1. next_ is the next sequence to claim. Claim(n) takes [next_, next_ + n) with one
//     fetch_add; each claimed sequence is published exactly once by its claimer
//     (Publish), which constructs the T, then stores the sequence into the slot's
//     `seq` with release. A reader acquires `seq` before it reads the T. A slot's
//     `seq` is 0 while unpublished (sequences start at 1).
//  2. Directory: the segment of index i = s >> segment_bits is found in leaf
//     (i >> kLeafBits) % kTopSlots at entry i % kLeafSlots. An entry holds nullptr (not
//     yet made), the Segment* (live: its `index` is i), or the tombstone 2i + 1 (gone:
//     trimmed or all removed). Entries of a leaf are reused by the segments 2^(kLeafBits
//     + kTopBits) indexes later, so the live span (from the oldest live segment to
//     next_) must stay below 2^(kLeafBits + kTopBits) segments (kMaxLiveSegments):
//     Claim refuses a claim past it (it returns 0).
//  3. A segment is made by the first publisher of one of its sequences: it takes a
//     segment from the free list (or allocates one), sets `index`, `refs` = 1 (the
//     directory's reference) and its slots empty, and installs it with a release CAS
//     from nullptr; a loser of that race gives its segment back unused. An installed
//     segment's fields are visible to whoever acquires its entry.
//  4. `refs` counts the directory's reference (while installed) and one per pin (a
//     Ref, or a reader's cached segment). A pin is taken only from refs > 0 (CAS), so
//     a segment whose count reached 0 (recycled, or on the free list) is never
//     revived; a pin taken on a segment that has since been reused for another index
//     is detected by its `index` and given back. The thread that drops refs to 0
//     destroys the published T's, clears the slots and puts the segment on the free
//     list, under free_mu_ (once per segment, not per message).
//  5. Unlinking replaces the entry (by CAS from the Segment*) with the tombstone and
//     drops the directory's reference; exactly one thread wins that CAS. TrimBefore
//     unlinks every segment wholly below its argument (and records it in first_);
//     Remove unlinks a segment when its removed count reaches its slot count.
//  6. Memory: segments are type-stable. One whose count reaches 0 goes to the free list
//     and is reused by the next segment made; it is freed only with the log, because
//     a reader may still hold its address from the directory (between its load of the
//     entry and its pin, inv. 4). So the log takes the high-water mark of its live
//     and pinned segments, no more.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "inferq/base/cache_line.hpp"

namespace inferq::engine_internal {

// What MessageLog::Read found at a sequence.
enum class LogRead : std::uint8_t {
  kReady,   // published and not removed: the Ref holds it
  kNotYet,  // not claimed yet, or claimed and not yet published
  kGone,    // trimmed or removed (or before the log's first sequence)
};

template <class T>
class MessageLog {
  static_assert(std::is_nothrow_destructible_v<T>, "MessageLog<T> needs a nothrow destructor");

 public:
  static constexpr unsigned kLeafBits = 12;  // segment entries per directory leaf: 4,096
  static constexpr unsigned kTopBits = 10;   // leaves in the directory ring: 1,024
  static constexpr std::uint64_t kMaxLiveSegments = std::uint64_t{1} << (kLeafBits + kTopBits);

 private:
  struct Slot {
    std::atomic<std::uint64_t> seq{0};  // 0: unpublished; else the sequence (inv. 1)
    alignas(T) unsigned char storage[sizeof(T)];
    T* ptr() { return std::launder(reinterpret_cast<T*>(storage)); }
  };
  struct Segment {
    explicit Segment(std::size_t slots)
        : slot(new Slot[slots]), removed_bits(new std::atomic<std::uint64_t>[(slots + 63) / 64]) {
      for (std::size_t w = 0; w < (slots + 63) / 64; ++w) removed_bits[w].store(0, std::memory_order_relaxed);
    }
    std::uint64_t index = 0;               // which segment of the log (inv. 2)
    alignas(kCacheLineSize) std::atomic<std::int64_t> refs{0};  // inv. 4
    std::atomic<std::uint32_t> removed{0};  // slots marked removed
    std::unique_ptr<Slot[]> slot;
    std::unique_ptr<std::atomic<std::uint64_t>[]> removed_bits;
  };
  struct Leaf {
    std::atomic<std::uintptr_t> entry[std::size_t{1} << kLeafBits] = {};
  };

 public:
  // A pin on one published message's segment: the message stays readable, and its
  // memory unchanged, for as long as the Ref holds it. Move-only.
  class Ref {
   public:
    Ref() = default;
    Ref(Ref&& o) noexcept : log_(o.log_), seg_(o.seg_), value_(o.value_), seq_(o.seq_) {
      o.seg_ = nullptr;
      o.value_ = nullptr;
    }
    Ref& operator=(Ref&& o) noexcept {
      if (this != &o) {
        reset();
        log_ = o.log_;
        seg_ = o.seg_;
        value_ = o.value_;
        seq_ = o.seq_;
        o.seg_ = nullptr;
        o.value_ = nullptr;
      }
      return *this;
    }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    ~Ref() { reset(); }
    // Gives the pin up (no-op when empty).
    void reset() {
      if (seg_ != nullptr) log_->Unpin(seg_);
      seg_ = nullptr;
      value_ = nullptr;
    }
    explicit operator bool() const { return value_ != nullptr; }
    T& operator*() const { return *value_; }
    T* operator->() const { return value_; }
    std::uint64_t seq() const { return seq_; }
    // Another pin on the same message (one more reference on its segment).
    Ref Share() const {
      Ref r;
      if (seg_ != nullptr) {
        seg_->refs.fetch_add(1, std::memory_order_relaxed);  // already > 0: we hold one
        r.log_ = log_;
        r.seg_ = seg_;
        r.value_ = value_;
        r.seq_ = seq_;
      }
      return r;
    }

   private:
    friend class MessageLog;
    MessageLog* log_ = nullptr;
    Segment* seg_ = nullptr;
    T* value_ = nullptr;
    std::uint64_t seq_ = 0;
  };

  // `segment_bits`: 2^segment_bits slots a segment, 1..20. `first_seq` >= 1: the
  // first sequence Claim hands out. Throws std::invalid_argument otherwise.
  MessageLog(unsigned segment_bits, std::uint64_t first_seq)
      : bits_(segment_bits), slots_(std::size_t{1} << (segment_bits > 20 ? 0 : segment_bits)) {
    if (segment_bits < 1 || segment_bits > 20) {
      throw std::invalid_argument("MessageLog segment_bits must be 1..20, got " + std::to_string(segment_bits));
    }
    if (first_seq == 0) throw std::invalid_argument("MessageLog first_seq must be >= 1, got 0");
    next_.store(first_seq, std::memory_order_relaxed);
    first_.store(first_seq, std::memory_order_relaxed);
  }
  MessageLog(const MessageLog&) = delete;
  MessageLog& operator=(const MessageLog&) = delete;

  // Destroys every published message. No Ref may outlive the log.
  ~MessageLog() {
    for (auto& leaf : top_) {
      Leaf* l = leaf.load(std::memory_order_relaxed);
      if (l == nullptr) continue;
      for (auto& e : l->entry) {
        const std::uintptr_t v = e.load(std::memory_order_relaxed);
        if (IsSegment(v)) {
          DestroyMessages(*reinterpret_cast<Segment*>(v));
          delete reinterpret_cast<Segment*>(v);
        }
      }
      delete l;
    }
    for (Segment* s : free_) delete s;
  }

  // Claims `n` >= 1 consecutive sequences; returns the first, or 0 when the claim
  // would take the log past kMaxLiveSegments from its oldest live segment (inv. 2),
  // claiming nothing. Each claimed sequence must then be published (Publish).
  std::uint64_t Claim(std::uint32_t n) {
    std::uint64_t s = next_.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t last = s + n - 1;
      // (A claim may start below first_: TrimBefore passed next_ meanwhile. Its
      // publishes then find their sequences gone.)
      if ((last >> bits_) >= (first_.load(std::memory_order_acquire) >> bits_) + kMaxLiveSegments) return 0;
      // relaxed: the claim publishes nothing; each slot's seq does (inv. 1).
      if (next_.compare_exchange_weak(s, s + n, std::memory_order_relaxed)) return s;
    }
  }

  // Constructs the message of claimed sequence `seq` from `a...` and publishes it.
  // False, constructing nothing (`a...` untouched), when TrimBefore has passed `seq`
  // already (a limit dropped it while its publisher was slow: it is gone as if stored
  // and dropped at once). Throws std::bad_alloc, and what T's constructor throws
  // (the slot then stays unpublished: readers see kNotYet there until TrimBefore
  // passes it).
  template <class... A>
  bool Publish(std::uint64_t seq, A&&... a) {
    Segment* seg = PinForPublish(seq);  // pinned: not recycled while we write (inv. 4)
    if (seg == nullptr) return false;
    struct Unpinner {
      MessageLog* log;
      Segment* seg;
      ~Unpinner() { log->Unpin(seg); }
    } unpin{this, seg};
    Slot& slot = seg->slot[seq & (slots_ - 1)];
    ::new (static_cast<void*>(slot.storage)) T(std::forward<A>(a)...);
    // release: a reader that acquires seq sees the constructed T (inv. 1).
    slot.seq.store(seq, std::memory_order_release);
    return true;
  }

  // Pins the message of `seq` into `out` when it is published and not removed.
  LogRead Read(std::uint64_t seq, Ref& out) {
    out.reset();
    const std::uint64_t index = seq >> bits_;
    for (;;) {
      if (seq < first_.load(std::memory_order_acquire)) return LogRead::kGone;
      const std::uintptr_t v = EntryFor(index).load(std::memory_order_acquire);
      if (v == Tombstone(index)) return LogRead::kGone;
      if (!IsSegment(v)) {  // not made yet (or a stale tombstone: inv. 2)
        return seq < first_.load(std::memory_order_acquire) ? LogRead::kGone : LogRead::kNotYet;
      }
      Segment* seg = reinterpret_cast<Segment*>(v);
      if (!TryPin(seg)) continue;  // recycled meanwhile: look again
      if (seg->index != index) {   // reused for another index (inv. 4)
        Unpin(seg);
        continue;
      }
      Slot& slot = seg->slot[seq & (slots_ - 1)];
      // acquire: pairs with Publish's release store (inv. 1).
      if (slot.seq.load(std::memory_order_acquire) != seq) {
        Unpin(seg);
        return seq < first_.load(std::memory_order_acquire) ? LogRead::kGone : LogRead::kNotYet;
      }
      if (IsRemoved(*seg, seq)) {
        Unpin(seg);
        return LogRead::kGone;
      }
      out.log_ = this;
      out.seg_ = seg;
      out.value_ = slot.ptr();
      out.seq_ = seq;
      return LogRead::kReady;
    }
  }

  // Marks the published message `seq` removed: readers see kGone from now on (a Ref
  // already taken still reads it). When every slot of its segment is removed, the
  // segment is unlinked (inv. 5). True when this call removed it; false when it was
  // removed already, trimmed, or not published.
  bool Remove(std::uint64_t seq) {
    Ref r;
    if (Read(seq, r) != LogRead::kReady) return false;
    Segment* seg = r.seg_;
    const std::uint64_t i = seq & (slots_ - 1);
    const std::uint64_t bit = std::uint64_t{1} << (i & 63);
    // relaxed: the bit orders nothing else; a reader that misses it reads a message
    // that was live an instant before, as it would have without the race.
    if (seg->removed_bits[i >> 6].fetch_or(bit, std::memory_order_relaxed) & bit) return false;
    if (seg->removed.fetch_add(1, std::memory_order_acq_rel) + 1 == slots_) Unlink(seg->index, seg);
    return true;
  }

  // Every sequence below `seq` is gone: segments wholly below it are unlinked; the
  // messages of the segment that holds seq - 1 stay readable until it goes whole
  // (Remove them to hide them). No-op when `seq` <= first().
  void TrimBefore(std::uint64_t seq) {
    std::uint64_t f = first_.load(std::memory_order_relaxed);
    while (f < seq && !first_.compare_exchange_weak(f, seq, std::memory_order_acq_rel)) {
    }
    if (f >= seq) return;
    // Segments [f >> bits, seq >> bits) are wholly below seq.
    for (std::uint64_t index = f >> bits_; index < (seq >> bits_); ++index) {
      std::atomic<std::uintptr_t>& e = EntryFor(index);
      std::uintptr_t v = e.load(std::memory_order_acquire);
      while (v != Tombstone(index)) {
        if (IsSegment(v)) {
          Segment* seg = reinterpret_cast<Segment*>(v);
          if (seg->index == index) Unlink(index, seg);
          break;
        }
        // Never made (its sequences were claimed and none published yet, or never
        // claimed): mark it gone, so that a late publisher makes no segment.
        if (e.compare_exchange_weak(v, Tombstone(index), std::memory_order_acq_rel)) break;
      }
    }
  }

  // The next sequence Claim hands out.
  std::uint64_t next() const { return next_.load(std::memory_order_acquire); }
  // The lowest sequence not trimmed.
  std::uint64_t first() const { return first_.load(std::memory_order_acquire); }
  // Slots a segment.
  std::size_t segment_slots() const { return slots_; }
  // Segments allocated: installed, pinned after unlinking, or on the free list
  // (inv. 6).
  std::size_t segments_allocated() const { return allocated_.load(std::memory_order_relaxed); }
  // Segments on the free list.
  std::size_t segments_free() {
    std::lock_guard<std::mutex> lock(free_mu_);
    return free_.size();
  }

 private:
  static std::uintptr_t Tombstone(std::uint64_t index) { return static_cast<std::uintptr_t>(2 * index + 1); }

  std::atomic<std::uintptr_t>& EntryFor(std::uint64_t index) {
    std::atomic<Leaf*>& top = top_[(index >> kLeafBits) & ((std::size_t{1} << kTopBits) - 1)];
    Leaf* leaf = top.load(std::memory_order_acquire);
    if (leaf == nullptr) {
      auto made = std::make_unique<Leaf>();
      if (top.compare_exchange_strong(leaf, made.get(), std::memory_order_acq_rel)) {
        leaf = made.release();
      }
      // else leaf holds the winner's
    }
    return leaf->entry[index & ((std::size_t{1} << kLeafBits) - 1)];
  }

  static bool IsSegment(std::uintptr_t v) { return v != 0 && (v & 1) == 0; }

  // The segment of `seq`, made if need be (inv. 3) and pinned; nullptr when it is
  // gone (trimmed or all removed: a tombstone).
  Segment* PinForPublish(std::uint64_t seq) {
    const std::uint64_t index = seq >> bits_;
    std::atomic<std::uintptr_t>& e = EntryFor(index);
    std::uintptr_t v = e.load(std::memory_order_acquire);
    for (;;) {
      if (v == Tombstone(index)) return nullptr;
      if (IsSegment(v)) {
        Segment* seg = reinterpret_cast<Segment*>(v);
        if (TryPin(seg)) {
          if (seg->index == index) return seg;
          Unpin(seg);
        }
        v = e.load(std::memory_order_acquire);
        continue;
      }
      // Empty, or a stale tombstone of the index kMaxLiveSegments before (inv. 2).
      Segment* made = TakeFree();
      made->index = index;
      made->refs.store(2, std::memory_order_relaxed);  // the directory's and our pin
      // release: the segment's fields and cleared slots before its entry (inv. 3).
      if (e.compare_exchange_strong(v, reinterpret_cast<std::uintptr_t>(made), std::memory_order_acq_rel)) {
        return made;
      }
      made->refs.store(0, std::memory_order_relaxed);
      GiveBack(made);  // v now holds what won
    }
  }

  bool TryPin(Segment* seg) {
    std::int64_t n = seg->refs.load(std::memory_order_relaxed);
    while (n > 0) {
      // acquire: the pinned segment's index and slots as last published.
      if (seg->refs.compare_exchange_weak(n, n + 1, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    }
    return false;
  }

  void Unpin(Segment* seg) {
    // acq_rel: the last one out sees every reader's use done before it recycles.
    if (seg->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Recycle(seg);
  }

  void Unlink(std::uint64_t index, Segment* seg) {
    std::uintptr_t expected = reinterpret_cast<std::uintptr_t>(seg);
    if (EntryFor(index).compare_exchange_strong(expected, Tombstone(index), std::memory_order_acq_rel)) {
      Unpin(seg);  // the directory's reference (inv. 5)
    }
  }

  void DestroyMessages(Segment& seg) {
    const std::uint64_t base = seg.index << bits_;
    for (std::size_t i = 0; i < slots_; ++i) {
      Slot& slot = seg.slot[i];
      const std::uint64_t seq = slot.seq.load(std::memory_order_acquire);
      if (seq != 0 && seq == base + i) slot.ptr()->~T();  // published (inv. 1)
      slot.seq.store(0, std::memory_order_relaxed);
    }
    for (std::size_t w = 0; w < (slots_ + 63) / 64; ++w) seg.removed_bits[w].store(0, std::memory_order_relaxed);
    seg.removed.store(0, std::memory_order_relaxed);
  }

  void Recycle(Segment* seg) {
    DestroyMessages(*seg);
    GiveBack(seg);
  }

  Segment* TakeFree() {
    {
      std::lock_guard<std::mutex> lock(free_mu_);
      if (!free_.empty()) {
        Segment* s = free_.back();
        free_.pop_back();
        return s;
      }
    }
    allocated_.fetch_add(1, std::memory_order_relaxed);
    return new Segment(slots_);
  }

  void GiveBack(Segment* seg) {
    std::lock_guard<std::mutex> lock(free_mu_);
    free_.push_back(seg);  // type-stable (inv. 6)
  }

  bool IsRemoved(Segment& seg, std::uint64_t seq) const {
    const std::uint64_t i = seq & (slots_ - 1);
    return (seg.removed_bits[i >> 6].load(std::memory_order_relaxed) >> (i & 63)) & 1;
  }

  const unsigned bits_;
  const std::size_t slots_;
  alignas(kCacheLineSize) std::atomic<std::uint64_t> next_{1};
  alignas(kCacheLineSize) std::atomic<std::uint64_t> first_{1};
  std::atomic<std::size_t> allocated_{0};
  std::atomic<Leaf*> top_[std::size_t{1} << kTopBits] = {};
  std::mutex free_mu_;
  std::vector<Segment*> free_;  // guarded by free_mu_
};

}  // namespace inferq::engine_internal
