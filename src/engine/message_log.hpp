// File: src/engine/message_log.hpp (not API)
//
// MessageLog<T>: a stream's messages as a sequence-indexed, segmented log. Sequence
// s lives in slot s % S of the segment that covers [s - s % S, s - s % S + S), where
// S = 2^segment_bits; the slot holds the message itself (a T constructed in place),
// so storing a message allocates nothing but, once per S messages, a segment (taken
// from the log's free list when one is there). Publishers claim sequences with one
// atomic read-modify-write and publish each by a release store of its number into its
// slot (LMAX Disruptor's multi-producer sequencer); readers find a slot by arithmetic
// and see it published when the slot's number equals their sequence. Retention is
// arithmetic too: TrimBefore(s) drops every segment wholly below s, Remove(s) marks
// one message removed, a segment whose messages are all removed goes at once, and
// UnlinkSegment(i) drops one segment of the middle that its owner is done with. A
// dropped segment is recycled whole when the last reader lets go of it.
//
//   MessageLog<Msg> log(/*segment_bits=*/10, /*first_seq=*/1);
//   const std::uint64_t s = log.Claim(1);       // any thread
//   log.Publish(s, Msg{...});                   // the claimer, once per claimed seq
//   MessageLog<Msg>::Reader reader(log);        // one per reading thread
//   MessageLog<Msg>::Ref r;
//   if (reader.Read(s, r) == LogRead::kReady) Use(*r);  // r pins the message
//
// Thread safety: every member of the log may be called from any number of threads
// at once, except the constructor and destructor. A Ref may move between threads; a
// Reader is used by one thread at a time. Neither may outlive the log.
//
// Invariants:
//  1. next_ is the next sequence to claim; Claim(n) takes [next_, next_ + n) with one
//     CAS (ClaimExclusive, for a log with one claimer at a time: a load and a
//     store). Each claimed sequence is published exactly once by its claimer
//     (Publish), which constructs the T and then stores the sequence into the
//     slot's `seq` with release; a reader acquires `seq` before it reads the T. A
//     slot's `seq` is 0 while unpublished (sequences start at 1), and
//     seq | kAbandoned when its T's constructor threw (readers see it gone).
//  2. Directory: the segment of index i = s >> segment_bits is found in leaf
//     (i >> kLeafBits) % 2^top_bits at entry i % 2^kLeafBits. An entry holds 0 (not
//     made), the Segment* (installed: its `index` is i), or the tombstone 2i + 1
//     (gone). An entry is reused by the segment live_span() = 2^(kLeafBits + top_bits) indexes
//     later, so what it holds is read by its age: an older index's tombstone reads
//     as empty, a newer index's segment or tombstone as "i is long gone". The live
//     span, from the oldest segment not unlinked to next_, stays below
//     live_span(): Claim refuses a claim past it.
//  3. Segments are made by Claim, before it claims (EnsureMade), so that Publish
//     never allocates: it takes a segment from the free list (or allocates one), sets
//     `index`, then `refs` = 1 (the directory's reference) with release, and installs
//     it with a CAS (release) from what it read as empty. A loser drops its
//     reference as a pin would (a reader may have pinned it from a stale address).
//     A reader pins an entry's segment, then checks that the entry still holds it
//     and that its `index` is the one it wants (`index` is atomic: a stale pinner
//     may read it while a new owner writes it).
//  4. No publisher pins: a segment is unlinked (its entry made a tombstone, by CAS:
//     exactly one thread wins) only when every slot in it is published or abandoned
//     (TrimBefore and UnlinkSegment scan them; Remove counts a removal of each), so a publisher
//     writes into an installed segment that cannot go before its store. A publisher
//     that finds its tombstone, or a later index's entry, stores nothing: TrimBefore
//     passed its sequence before the segment was made.
//  5. `refs` counts the directory's reference (while installed) and one per pin (a
//     Ref, or a Reader's cached segment). A pin is taken only from refs > 0 (CAS), so
//     a segment whose count reached 0 is never revived; a pin taken on a segment
//     since reused is detected (inv. 3) and given back. The thread that drops refs
//     to 0 destroys the published T's, clears the slots and puts the segment on the
//     free list.
//  6. Memory: segments are type-stable. One whose count reaches 0 goes to the free
//     list and is reused by the next segment made; it is freed only with the log,
//     because a reader may still hold its address from the directory (between its
//     load of the entry and its pin, inv. 5). So the log takes the high-water mark of
//     its installed and pinned segments, no more.
//  7. unlinked_ is a segment index below which every entry is a tombstone (or was
//     made one by the TrimBefore that moved unlinked_); TrimBefore retries from there
//     the segments it could not unlink yet (a publish in flight).
#pragma once

#include <algorithm>
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

// What a MessageLog read found at a sequence.
enum class LogRead : std::uint8_t {
  kReady,   // published and not removed: the Ref holds it
  kNotYet,  // not claimed yet, or claimed and not yet published
  kGone,    // trimmed, removed, abandoned, or before the log's first sequence
};

template <class T>
class MessageLog {
  static_assert(std::is_nothrow_destructible_v<T>, "MessageLog<T> needs a nothrow destructor");

 public:
  static constexpr unsigned kLeafBits = 12;  // segment entries per directory leaf: 4,096
  static constexpr unsigned kDefaultTopBits = 10;  // leaves in the directory ring: 1,024
  static constexpr std::uint32_t kMaxClaim = 1u << 16;  // sequences one Claim takes at most

 private:
  static constexpr std::uint64_t kAbandoned = std::uint64_t{1} << 63;
  struct Slot {
    std::atomic<std::uint64_t> seq{0};  // inv. 1
    alignas(T) unsigned char storage[sizeof(T)];
    T* ptr() { return std::launder(reinterpret_cast<T*>(storage)); }
  };
  struct Segment {
    explicit Segment(std::size_t slots)
        : slot(new Slot[slots]), removed_bits(new std::atomic<std::uint64_t>[(slots + 63) / 64]) {
      for (std::size_t w = 0; w < (slots + 63) / 64; ++w) removed_bits[w].store(0, std::memory_order_relaxed);
    }
    std::atomic<std::uint64_t> index{0};                        // inv. 2
    alignas(kCacheLineSize) std::atomic<std::int64_t> refs{0};  // inv. 5
    std::atomic<std::uint32_t> removed{0};                      // slots marked removed
    std::unique_ptr<Slot[]> slot;
    std::unique_ptr<std::atomic<std::uint64_t>[]> removed_bits;
  };
  struct Leaf {
    std::atomic<std::uintptr_t> entry[std::size_t{1} << kLeafBits] = {};
  };

 public:
  // A pin on one published message: it stays readable, its memory unchanged, for as
  // long as the Ref holds it. Move-only; Share() makes another.
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
    // Gives the pin to the caller as an opaque token (the Ref is left empty), for a
    // holder that cannot keep a Ref; MessageLog::Unpin(token) gives it back.
    void* Detach() {
      void* token = seg_;
      seg_ = nullptr;
      value_ = nullptr;
      return token;
    }
    // Another pin on the same message: one relaxed increment of a count this Ref
    // holds above 0 (no CAS needed). Empty for an empty Ref.
    Ref Share() const {
      Ref r;
      if (seg_ != nullptr) {
        seg_->refs.fetch_add(1, std::memory_order_relaxed);
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

  // A reading thread's view of the log: it keeps the segment it last read pinned,
  // so that reading along a segment takes no read-modify-write but the Ref's own
  // (Share). Use it from one thread at a time.
  class Reader {
   public:
    explicit Reader(MessageLog& log) : log_(&log) {}
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;
    ~Reader() { Drop(); }

    // Pins the message of `seq` into `out` when it is published and not removed.
    LogRead Read(std::uint64_t seq, Ref& out) {
      out.reset();
      if (seq < log_->first_.load(std::memory_order_acquire)) return LogRead::kGone;
      const std::uint64_t index = seq >> log_->bits_;
      // A cached segment unlinked since still answers right: what TrimBefore passed is
      // below first_ (checked above), what Remove unlinked has every bit removed, what
      // UnlinkSegment took out its owner reads no more or reads as it was, and our pin
      // keeps it from reuse (inv. 5).
      if (seg_ == nullptr || seg_->index.load(std::memory_order_relaxed) != index) {
        Drop();
        const LogRead found = log_->PinSegment(index, seq, seg_);
        if (found != LogRead::kReady) return found;
      }
      Slot& slot = seg_->slot[seq & (log_->slots_ - 1)];
      // acquire: pairs with Publish's release store (inv. 1).
      const std::uint64_t published = slot.seq.load(std::memory_order_acquire);
      if (published != seq) {
        if (published == (seq | kAbandoned)) return LogRead::kGone;
        return seq < log_->first_.load(std::memory_order_acquire) ? LogRead::kGone : LogRead::kNotYet;
      }
      if (log_->IsRemoved(*seg_, seq)) return LogRead::kGone;
      seg_->refs.fetch_add(1, std::memory_order_relaxed);  // the Ref's pin; ours holds it > 0
      out.log_ = log_;
      out.seg_ = seg_;
      out.value_ = slot.ptr();
      out.seq_ = seq;
      return LogRead::kReady;
    }
    // The end of the run of sequences from `from` (at most `max_n` of them) that
    // need no publisher any more: published (removed or not), abandoned, or gone.
    // What a consumer may claim without waiting on a publisher still writing its slot
    // (the Disruptor's multi-producer availability scan): one acquire load per
    // sequence, the segments pinned as Read pins them. `from` itself when it is not
    // published yet.
    std::uint64_t ReadyEnd(std::uint64_t from, std::uint64_t max_n) {
      const std::uint64_t limit = from + std::min(max_n, ~std::uint64_t{0} - from);
      std::uint64_t s = from;
      while (s < limit) {
        const std::uint64_t first = log_->first_.load(std::memory_order_acquire);
        if (s < first) {  // trimmed: gone
          s = std::min(limit, first);
          continue;
        }
        const std::uint64_t index = s >> log_->bits_;
        const std::uint64_t segment_end = (index + 1) << log_->bits_;
        if (seg_ == nullptr || seg_->index.load(std::memory_order_relaxed) != index) {
          Drop();
          const LogRead found = log_->PinSegment(index, s, seg_);
          if (found == LogRead::kGone) {  // the whole segment is gone
            s = std::min(limit, segment_end);
            continue;
          }
          if (found == LogRead::kNotYet) return s;  // not made: nothing in it is published
        }
        for (; s < limit && s < segment_end; ++s) {
          // acquire: pairs with Publish's release store (inv. 1).
          const std::uint64_t published = seg_->slot[s & (log_->slots_ - 1)].seq.load(std::memory_order_acquire);
          if ((published & ~kAbandoned) != s) return s;
        }
      }
      return s;
    }

    // Lets the cached segment go (it may then be recycled).
    void Drop() {
      if (seg_ != nullptr) log_->Unpin(seg_);
      seg_ = nullptr;
    }

   private:
    MessageLog* log_;
    Segment* seg_ = nullptr;  // pinned while set
  };

  // `segment_bits`: 2^segment_bits slots a segment, 1..20. `first_seq`: the first
  // sequence Claim hands out, 1..2^62. `top_bits`: 2^top_bits directory leaves,
  // 0..10, so live_span() = 2^(12 + top_bits) segments (a test's small ring). Throws
  // std::invalid_argument naming the bad value.
  MessageLog(unsigned segment_bits, std::uint64_t first_seq, unsigned top_bits = kDefaultTopBits)
      : bits_(segment_bits),
        slots_(std::size_t{1} << (segment_bits > 20 ? 0 : segment_bits)),
        start_(first_seq),
        top_bits_(top_bits > kDefaultTopBits ? 0 : top_bits),
        top_(new std::atomic<Leaf*>[std::size_t{1} << top_bits_]) {
    if (segment_bits < 1 || segment_bits > 20) {
      throw std::invalid_argument("MessageLog segment_bits must be 1..20, got " + std::to_string(segment_bits));
    }
    if (first_seq == 0 || first_seq > (std::uint64_t{1} << 62)) {
      throw std::invalid_argument("MessageLog first_seq must be 1..2^62, got " + std::to_string(first_seq));
    }
    if (top_bits > kDefaultTopBits) {
      throw std::invalid_argument("MessageLog top_bits must be 0..10, got " + std::to_string(top_bits));
    }
    for (std::size_t t = 0; t < (std::size_t{1} << top_bits_); ++t) top_[t].store(nullptr, std::memory_order_relaxed);
    next_.store(first_seq, std::memory_order_relaxed);
    first_.store(first_seq, std::memory_order_relaxed);
    unlinked_.store(first_seq >> segment_bits, std::memory_order_relaxed);
  }
  MessageLog(const MessageLog&) = delete;
  MessageLog& operator=(const MessageLog&) = delete;

  // Destroys every published message. No Ref or Reader may outlive the log.
  ~MessageLog() {
    for (std::size_t t = 0; t < (std::size_t{1} << top_bits_); ++t) {
      Leaf* l = top_[t].load(std::memory_order_relaxed);
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

  // Claims `n` consecutive sequences, 1..kMaxClaim (std::invalid_argument
  // otherwise); returns the first, or 0 when the claim
  // would take the log live_span() past its oldest segment not unlinked (inv. 2),
  // claiming nothing. Makes the segments the claim needs first: throws
  // std::bad_alloc, claiming nothing. Each claimed sequence must then be published
  // (Publish).
  std::uint64_t Claim(std::uint32_t n) { return ClaimAs</*kExclusive=*/false>(n); }

  // Claim for the log's only claimer: the caller guarantees that no other thread
  // claims while this runs (the engine's stream mutex), so next_ moves by a load and a
  // store instead of a compare-and-swap, no locked instruction. Results and errors as
  // Claim.
  std::uint64_t ClaimExclusive(std::uint32_t n) { return ClaimAs</*kExclusive=*/true>(n); }

  // Constructs the message of claimed sequence `seq` from `a...` and publishes it;
  // allocates nothing. False, constructing nothing (`a...` untouched), when its
  // segment is gone already (TrimBefore passed `seq` before the claim made it: it is
  // gone as if stored and dropped at once). Throws what T's constructor throws (the
  // slot is then abandoned: readers see it gone).
  template <class... A>
  bool Publish(std::uint64_t seq, A&&... a) {
    return Emplace(seq, std::forward<A>(a)...) != nullptr;
  }

  // Publish that returns the message it made (nullptr: its segment was gone, nothing
  // made). The caller may go on writing what the log's readers do not read before
  // some later release of its own (the engine's cursor log: `end`); the message
  // lives until its segment is recycled, which needs it trimmed or removed first.
  template <class... A>
  T* Emplace(std::uint64_t seq, A&&... a) {
    Segment* seg = SegmentForPublish(seq);  // made by Claim; cannot go before our store (inv. 4)
    if (seg == nullptr) return nullptr;
    Slot& slot = seg->slot[seq & (slots_ - 1)];
    try {
      ::new (static_cast<void*>(slot.storage)) T(std::forward<A>(a)...);
    } catch (...) {
      slot.seq.store(seq | kAbandoned, std::memory_order_release);
      throw;
    }
    // release: a reader that acquires seq sees the constructed T (inv. 1).
    slot.seq.store(seq, std::memory_order_release);
    return slot.ptr();
  }

  // Pins the message of `seq` into `out` (a Reader of its own: one more pin and
  // unpin than a Reader along a segment takes).
  LogRead Read(std::uint64_t seq, Ref& out) {
    Reader reader(*this);
    return reader.Read(seq, out);
  }

  // Marks the published message `seq` removed: readers see kGone from now on (a Ref
  // already taken still reads it). When every slot of its segment is removed, the
  // segment is unlinked (inv. 4). True when this call removed it; false when it was
  // removed already, is gone, or is not published.
  bool Remove(std::uint64_t seq) {
    Ref r;
    if (Read(seq, r) != LogRead::kReady) return false;
    Segment* seg = r.seg_;
    const std::uint64_t i = seq & (slots_ - 1);
    const std::uint64_t bit = std::uint64_t{1} << (i & 63);
    // relaxed: the bit orders nothing else; a reader that misses it reads a message
    // that was live an instant before, as it would have without the race.
    if (seg->removed_bits[i >> 6].fetch_or(bit, std::memory_order_relaxed) & bit) return false;
    const std::uint64_t index = seg->index.load(std::memory_order_relaxed);
    if (seg->removed.fetch_add(1, std::memory_order_acq_rel) + 1 == SlotsInUse(index)) {
      Unlink(index, seg);
    }
    return true;
  }

  // Every sequence below min(`seq`, next()) is gone: readers see kGone there, and
  // the segments wholly below it are unlinked once each of their slots is published
  // or abandoned (one still being published is retried by the next TrimBefore:
  // inv. 7). No-op when that is <= first().
  void TrimBefore(std::uint64_t seq) {
    const std::uint64_t next = next_.load(std::memory_order_acquire);
    if (seq > next) seq = next;
    std::uint64_t f = first_.load(std::memory_order_relaxed);
    while (f < seq && !first_.compare_exchange_weak(f, seq, std::memory_order_acq_rel)) {
    }
    // Unlink what can go, from the oldest segment not yet unlinked.
    const std::uint64_t below = first_.load(std::memory_order_acquire) >> bits_;
    std::uint64_t from = unlinked_.load(std::memory_order_acquire);
    std::uint64_t index = from;
    for (; index < below; ++index) {
      std::atomic<std::uintptr_t>& e = EntryFor(index);
      std::uintptr_t v = e.load(std::memory_order_acquire);
      if (v == Tombstone(index)) continue;
      if (IsSegment(v)) {
        Segment* seg = reinterpret_cast<Segment*>(v);
        if (seg->index.load(std::memory_order_acquire) != index) break;  // cannot be (inv. 2)
        if (!AllDone(*seg)) break;       // a publish in flight: retried next time
        Unlink(index, seg);
        continue;
      }
      // Never made (nothing of it published yet): mark it gone, so that a late
      // publisher makes no segment (inv. 4). A publisher's CAS may win the race:
      // then the segment is there, and the next TrimBefore looks at it.
      if (!e.compare_exchange_strong(v, Tombstone(index), std::memory_order_acq_rel)) break;
    }
    while (from < index && !unlinked_.compare_exchange_weak(from, index, std::memory_order_acq_rel)) {
    }
  }

  // Unlinks segment `index` of the middle of the log, leaving first() where it is:
  // for an owner that knows no reader needs a sequence of it any more (the engine's
  // trim: every cursor is done with all of it) while older sequences stay. Readers
  // see kGone there from now on, but for a Reader whose cached pin holds the segment
  // (it still reads the messages as they were: inv. 5 keeps them). True when the
  // segment is gone now (this call, or before); false when it is not made yet or a
  // publish into it is in flight (inv. 4): try again later. `index` must lie from
  // the oldest segment not unlinked to the newest claimed (inv. 2).
  bool UnlinkSegment(std::uint64_t index) {
    std::atomic<std::uintptr_t>& e = EntryFor(index);
    const std::uintptr_t v = e.load(std::memory_order_acquire);
    if (v == Tombstone(index)) return true;
    if (!IsSegment(v)) return false;
    Segment* seg = reinterpret_cast<Segment*>(v);
    if (seg->index.load(std::memory_order_acquire) != index || !AllDone(*seg)) return false;
    Unlink(index, seg);
    return true;
  }

  // The next sequence Claim hands out.
  std::uint64_t next() const { return next_.load(std::memory_order_acquire); }
  // The lowest sequence not trimmed.
  std::uint64_t first() const { return first_.load(std::memory_order_acquire); }
  // Slots a segment.
  std::size_t segment_slots() const { return slots_; }
  // Bytes a segment takes: its header, its slots (each a T and its sequence) and its
  // removal bits.
  std::size_t segment_bytes() const {
    return sizeof(Segment) + slots_ * sizeof(Slot) + (slots_ + 63) / 64 * sizeof(std::atomic<std::uint64_t>);
  }
  // Segments the directory tells apart: the most from the oldest segment not
  // unlinked to the newest claimed (inv. 2).
  std::uint64_t live_span() const { return std::uint64_t{1} << (kLeafBits + top_bits_); }
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
  static bool IsSegment(std::uintptr_t v) { return v != 0 && (v & 1) == 0; }

  std::atomic<std::uintptr_t>& EntryFor(std::uint64_t index) {
    std::atomic<Leaf*>& top = top_[(index >> kLeafBits) & ((std::size_t{1} << top_bits_) - 1)];
    Leaf* leaf = top.load(std::memory_order_acquire);
    if (leaf == nullptr) {
      auto made = std::make_unique<Leaf>();
      if (top.compare_exchange_strong(leaf, made.get(), std::memory_order_acq_rel)) leaf = made.release();
      // else `leaf` holds the winner's
    }
    return leaf->entry[index & ((std::size_t{1} << kLeafBits) - 1)];
  }

  // Slots of segment `index` that sequences use: all but those below the log's
  // first sequence (never claimed).
  std::uint32_t SlotsInUse(std::uint64_t index) const {
    const std::uint64_t base = index << bits_;
    return static_cast<std::uint32_t>(start_ > base ? slots_ - std::min<std::uint64_t>(start_ - base, slots_) : slots_);
  }

  // Every slot of `seg` that a sequence uses is published or abandoned (inv. 4).
  bool AllDone(Segment& seg) const {
    const std::uint64_t base = seg.index.load(std::memory_order_relaxed) << bits_;
    for (std::size_t i = 0; i < slots_; ++i) {
      if (base + i < start_) continue;
      // acquire: the publisher's store is its last touch of the slot.
      if (seg.slot[i].seq.load(std::memory_order_acquire) == 0) return false;
    }
    return true;
  }

  // Pins the installed segment `index` into `out` (for a read of `seq`), or says
  // why there is none. Entries of other indexes (inv. 2) answer by their age: an
  // older one still there means `seq`'s segment is not made yet, a newer one that
  // it is long gone.
  LogRead PinSegment(std::uint64_t index, std::uint64_t seq, Segment*& out) {
    std::atomic<std::uintptr_t>& e = EntryFor(index);
    for (;;) {
      const std::uintptr_t v = e.load(std::memory_order_acquire);
      if (v == Tombstone(index)) return LogRead::kGone;
      if (v == 0 || (v & 1) != 0) {  // not made yet, or another index's tombstone
        if (v != 0 && (v >> 1) > index) return LogRead::kGone;
        return seq < first_.load(std::memory_order_acquire) ? LogRead::kGone : LogRead::kNotYet;
      }
      Segment* seg = reinterpret_cast<Segment*>(v);
      if (!TryPin(seg)) continue;  // recycled meanwhile: look again
      const std::uint64_t at = seg->index.load(std::memory_order_acquire);
      // Installed for `index` only if the entry still holds it once pinned: a
      // segment a publisher made and lost the install with (inv. 3) is not.
      if (at == index && e.load(std::memory_order_acquire) == v) {
        out = seg;
        return LogRead::kReady;
      }
      Unpin(seg);
      if (e.load(std::memory_order_acquire) != v) continue;  // the entry moved: look again
      if (at > index) return LogRead::kGone;                  // a later generation's
      return seq < first_.load(std::memory_order_acquire) ? LogRead::kGone : LogRead::kNotYet;
    }
  }

  // Claim and ClaimExclusive (kExclusive: next_ by a load and a store).
  template <bool kExclusive>
  std::uint64_t ClaimAs(std::uint32_t n) {
    if (n == 0 || n > kMaxClaim) {
      throw std::invalid_argument("MessageLog claim of " + std::to_string(n) + " sequences: 1.." +
                                  std::to_string(kMaxClaim));
    }
    std::uint64_t s = next_.load(std::memory_order_relaxed);
    for (;;) {
      // (A claim may start below first_ when TrimBefore passed next_ meanwhile; its
      // sequences are gone as soon as published.)
      if (((s + n - 1) >> bits_) >= unlinked_.load(std::memory_order_acquire) + live_span()) return 0;
      // The segments of [s, s + n), made before the claim (inv. 3): a Publish then
      // finds its segment made (or gone) and never allocates.
      for (std::uint64_t index = s >> bits_; index <= ((s + n - 1) >> bits_); ++index) EnsureMade(index);
      // relaxed: the claim publishes nothing; each slot's seq does (inv. 1).
      if constexpr (kExclusive) {
        next_.store(s + n, std::memory_order_relaxed);  // the only claimer: nothing to race
        return s;
      } else {
        if (next_.compare_exchange_weak(s, s + n, std::memory_order_relaxed)) return s;
      }
    }
  }

  // Makes segment `index` when its entry is empty (inv. 3): by Claim, before it
  // claims, so that a Publish never allocates. No-op when it is there or gone.
  // Throws std::bad_alloc.
  void EnsureMade(std::uint64_t index) {
    std::atomic<std::uintptr_t>& e = EntryFor(index);
    std::uintptr_t v = e.load(std::memory_order_acquire);
    while (v == 0 || ((v & 1) != 0 && (v >> 1) < index)) {  // empty, or an older tombstone
      Segment* made = TakeFree();
      made->index.store(index, std::memory_order_relaxed);
      // release: `index` (and the cleared slots) before a pinner's acquire (inv. 5).
      made->refs.store(1, std::memory_order_release);  // the directory's
      // release: the segment's fields before its entry (inv. 3).
      if (e.compare_exchange_strong(v, reinterpret_cast<std::uintptr_t>(made), std::memory_order_acq_rel)) return;
      // Lost to another maker (or a trim): drop our reference like a pin, so that a
      // reader that pinned it meanwhile (from a stale address) keeps its count.
      Unpin(made);
    }
  }

  // The installed segment of claimed sequence `seq` (Claim made it), or nullptr when
  // it is gone (TrimBefore marked it before it was made).
  Segment* SegmentForPublish(std::uint64_t seq) {
    const std::uint64_t index = seq >> bits_;
    std::atomic<std::uintptr_t>& e = EntryFor(index);
    const std::uintptr_t v = e.load(std::memory_order_acquire);
    if (!IsSegment(v)) return nullptr;  // our tombstone, or a later one
    // Our claimed slot is unpublished, so our segment, once installed, cannot be
    // unlinked (inv. 4): a segment here of our index is ours; one of another index is
    // a later generation's, after ours was marked gone before it was made.
    Segment* seg = reinterpret_cast<Segment*>(v);
    return seg->index.load(std::memory_order_acquire) == index ? seg : nullptr;
  }

  bool TryPin(Segment* seg) {
    std::int64_t n = seg->refs.load(std::memory_order_relaxed);
    while (n > 0) {
      // acquire: the pinned segment's index and slots as last published.
      if (seg->refs.compare_exchange_weak(n, n + 1, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    }
    return false;
  }

 public:
  // Gives back a pin Ref::Detach handed out (no-op for nullptr).
  void Unpin(void* token) {
    if (token != nullptr) Unpin(static_cast<Segment*>(token));
  }

 private:
  void Unpin(Segment* seg) {
    // acq_rel: the last one out sees every reader's use done before it recycles.
    if (seg->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Recycle(seg);
  }

  void Unlink(std::uint64_t index, Segment* seg) {
    std::uintptr_t expected = reinterpret_cast<std::uintptr_t>(seg);
    if (EntryFor(index).compare_exchange_strong(expected, Tombstone(index), std::memory_order_acq_rel)) {
      Unpin(seg);  // the directory's reference (inv. 4)
    }
  }

  void DestroyMessages(Segment& seg) {
    const std::uint64_t base = seg.index.load(std::memory_order_relaxed) << bits_;
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
    auto made = std::make_unique<Segment>(slots_);
    {
      // Room on the free list for every segment, so that GiveBack (from a Ref's
      // destructor) never allocates.
      std::lock_guard<std::mutex> lock(free_mu_);
      free_.reserve(allocated_.load(std::memory_order_relaxed) + 1);
      allocated_.fetch_add(1, std::memory_order_relaxed);
    }
    return made.release();
  }

  void GiveBack(Segment* seg) {
    std::lock_guard<std::mutex> lock(free_mu_);
    free_.push_back(seg);  // type-stable (inv. 6); never reallocates (TakeFree reserved)
  }

  bool IsRemoved(Segment& seg, std::uint64_t seq) const {
    const std::uint64_t i = seq & (slots_ - 1);
    return (seg.removed_bits[i >> 6].load(std::memory_order_relaxed) >> (i & 63)) & 1;
  }

  const unsigned bits_;
  const std::size_t slots_;
  const std::uint64_t start_;  // the first sequence ever claimed
  alignas(kCacheLineSize) std::atomic<std::uint64_t> next_{1};
  alignas(kCacheLineSize) std::atomic<std::uint64_t> first_{1};
  std::atomic<std::uint64_t> unlinked_{0};  // inv. 7
  std::atomic<std::size_t> allocated_{0};
  const unsigned top_bits_;
  std::unique_ptr<std::atomic<Leaf*>[]> top_;
  std::mutex free_mu_;
  std::vector<Segment*> free_;  // guarded by free_mu_
};

}  // namespace inferq::engine_internal
