// File: src/engine/ack_window.hpp (not API)
//
// AckWindow: which of a consumer's stream sequences are settled, as one bit each in a
// ring of W = 32 * 2^k bits, with an ack floor below which everything is settled (the
// ack floor of Kafka's committed offset and JetStream's consumer ack floor). A
// consumer sets a sequence's bit when it is done with it: acked, terminated, skipped
// by its filter, or handed to the consumer's overflow map (a straggler held past the
// window, a message in progress or to be redelivered: the map then owns it). The
// first TrySet of a bit wins, so an ack racing a redelivery timer is decided by one
// CAS. The floor moves over whole words of ones.
//
//   AckWindow w(/*word_bits=*/7, /*start=*/1);  // W = 4,096 sequences
//   if (w.Fits(seq)) deliver(seq);              // seq < floor() + W
//   if (w.TrySet(seq)) { /* this call settled it */ }
//   w.floor();                                  // every sequence below is settled
//
// Thread safety: every member may be called from any number of threads at once,
// except the constructor.
//
// Invariants:
//  1. A word is a lap tag (high 32 bits) and the settle bits of 32 sequences (low 32
//     bits). Sequences [b, b + 32) (b a multiple of 32) use word (b / 32) % N (N =
//     2^word_bits words, W = 32 N bits) while its tag is Lap(b) = b / W (mod 2^32);
//     bit i is sequence b + i.
//  2. floor_ is a multiple of 32; every sequence below it is settled. The words of
//     [floor_, floor_ + W) carry those sequences' laps.
//  3. TrySet(s) is a CAS loop on s's word: it sets the bit only while the tag is
//     Lap(s), so a call delayed past the word's reuse finds the next lap's tag and
//     sets nothing (s was settled: the word only moves on when full). True for the
//     call that changed the bit: the first settle wins.
//  4. The floor moves only over a full word of its lap: a CAS from {Lap(f), all ones}
//     to {Lap(f) + 1, none} (exactly one thread wins; the word now waits for the
//     sequences W later), then a release store of floor_ + 32.
//  5. Sequences below `start` are settled at construction.
//  6. No full word is left behind the floor: the thread that fills word b reads the
//     floor after its CAS, and the thread that moves the floor up to b reads word b
//     after its store; all four are seq_cst, so at least one of them sees the other
//     (the store-buffer pattern) and advances. A full word's Advance stops at the
//     first word that is not full.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "inferq/base/cache_line.hpp"

namespace inferq::engine_internal {

class AckWindow {
 public:
  static constexpr std::uint64_t kWordSeqs = 32;  // sequences a word (inv. 1)

  // `word_bits`: 2^word_bits words of 32 sequences, 0..20. `start`: the first
  // sequence to track; those below are settled. Throws std::invalid_argument for
  // word_bits > 20.
  AckWindow(unsigned word_bits, std::uint64_t start)
      : bits_(word_bits > 20 ? 0 : word_bits),
        words_count_(std::size_t{1} << bits_),
        words_(new std::atomic<std::uint64_t>[words_count_]) {
    if (word_bits > 20) {
      throw std::invalid_argument("AckWindow word_bits must be 0..20, got " + std::to_string(word_bits));
    }
    const std::uint64_t base = start & ~(kWordSeqs - 1);
    floor_.store(base, std::memory_order_relaxed);
    for (std::uint64_t b = base; b < base + capacity(); b += kWordSeqs) {
      Word(b).store(Tag(b), std::memory_order_relaxed);
    }
    if (start > base) {
      Word(base).store(Tag(base) | ((std::uint64_t{1} << (start - base)) - 1), std::memory_order_relaxed);
    }
  }
  AckWindow(const AckWindow&) = delete;
  AckWindow& operator=(const AckWindow&) = delete;

  // Sequences in the window: W.
  std::uint64_t capacity() const { return words_count_ * kWordSeqs; }

  // The ack floor, a multiple of 32: every sequence below is settled (inv. 2).
  std::uint64_t floor() const { return floor_.load(std::memory_order_acquire); }

  // The first unsettled sequence at or above floor() within the floor's word (a
  // snapshot; it may move on at once).
  std::uint64_t first_unsettled() const {
    const std::uint64_t f = floor();
    const std::uint64_t w = Word(f).load(std::memory_order_acquire);
    if ((w & kTagMask) != Tag(f)) return f + kWordSeqs;  // the word moved on meanwhile
    return f + static_cast<std::uint64_t>(std::countr_one(static_cast<std::uint32_t>(w)));
  }

  // True when `seq` may be set now: below floor() + W.
  bool Fits(std::uint64_t seq) const { return seq < floor() + capacity(); }

  // Settles `seq` (inv. 3): true when this call set its bit; false when it was set
  // already, is below the floor, or does not fit (then nothing changes).
  bool TrySet(std::uint64_t seq) {
    const std::uint64_t base = seq & ~(kWordSeqs - 1);
    return TrySetWord(base, std::uint64_t{1} << (seq - base)) != 0;
  }

  // Settles the sequences of `mask` (its low 32 bits) in the word that starts at
  // `base`, a multiple of 32: bit i is base + i. Returns the bits this call set
  // (none for a word below the floor or past the window). One CAS for up to 32.
  // Throws std::invalid_argument for a base that is not a multiple of 32.
  std::uint32_t TrySetWord(std::uint64_t base, std::uint64_t mask) {
    if ((base & (kWordSeqs - 1)) != 0) {
      throw std::invalid_argument("AckWindow word base " + std::to_string(base) + " is not a multiple of 32");
    }
    mask &= kBitsMask;
    const std::uint64_t f = floor();
    if (base < f || base >= f + capacity() || mask == 0) return 0;
    std::atomic<std::uint64_t>& word = Word(base);
    const std::uint64_t tag = Tag(base);
    std::uint64_t w = word.load(std::memory_order_acquire);
    for (;;) {
      if ((w & kTagMask) != tag) return 0;  // the word moved past base: all settled (inv. 3)
      const std::uint64_t set = mask & ~w;
      if (set == 0) return 0;
      // seq_cst, and the floor's load after it: a word that fills while the floor
      // moves up to it is seen by one of the two threads (inv. 6).
      if (word.compare_exchange_weak(w, w | set, std::memory_order_seq_cst, std::memory_order_acquire)) {
        if (((w | set) & kBitsMask) == kBitsMask && base == floor_.load(std::memory_order_seq_cst)) Advance();
        return static_cast<std::uint32_t>(set);
      }
    }
  }

  // True when `seq` is settled: below the floor, or its bit set.
  bool IsSet(std::uint64_t seq) const {
    const std::uint64_t f = floor();
    if (seq < f) return true;
    if (seq >= f + capacity()) return false;
    const std::uint64_t base = seq & ~(kWordSeqs - 1);
    const std::uint64_t w = Word(base).load(std::memory_order_acquire);
    if ((w & kTagMask) != Tag(base)) return true;  // moved on: it was full
    return (w >> (seq - base)) & 1;
  }

 private:
  static constexpr std::uint64_t kBitsMask = 0xffff'ffffULL;
  static constexpr std::uint64_t kTagMask = ~kBitsMask;

  std::atomic<std::uint64_t>& Word(std::uint64_t seq) const { return words_[(seq >> 5) & (words_count_ - 1)]; }
  // The lap tag of the word holding `seq` (inv. 1), in the high 32 bits.
  std::uint64_t Tag(std::uint64_t seq) const { return ((seq >> 5) >> bits_) << 32; }

  // Moves the floor over full words (inv. 4).
  void Advance() {
    for (;;) {
      const std::uint64_t f = floor();
      std::uint64_t full = Tag(f) | kBitsMask;
      // seq_cst: the re-tag before the floor's store, and that store before the next
      // word's read (inv. 6).
      if (!Word(f).compare_exchange_strong(full, Tag(f + capacity()), std::memory_order_seq_cst)) return;
      floor_.store(f + kWordSeqs, std::memory_order_seq_cst);
    }
  }

  const unsigned bits_;
  const std::size_t words_count_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> words_;
  alignas(kCacheLineSize) std::atomic<std::uint64_t> floor_{0};
};

}  // namespace inferq::engine_internal
