/// @file inferq/routing/internal/probe_table.hpp  (not API: used by subject_trie.hpp)
///
/// ProbeTable<Slot, Traits>: an open-addressing hash table with linear probing, the
/// slots stored inline (no separate control bytes), so that a lookup that hits reads
/// one cache line in the common case. The subject trie keeps its nodes and its
/// interned tokens in two of these.
///
/// Traits provides:
///   static Slot Empty();                    an empty slot
///   static bool IsEmpty(const Slot&);
///   static std::uint64_t Hash(const Slot&); of a stored slot's key; lookups pass the
///                                           same hash of the key they look for.
/// Invariants:
///  1. The capacity is 0 or a power of two; the high log2(capacity) bits of a key's
///     hash are its home slot.
///  2. The table is never more than 70% full (Insert doubles it first), so every run
///     of occupied slots ends at an empty one and a lookup ends.
///  3. Every entry is in the run that starts at or before its home slot and reaches
///     it: no empty slot lies cyclically between an entry's home and its position.
///     Erase keeps this without tombstones by shifting later entries of the run back
///     (Knuth, TAOCP vol. 3, 6.4, Algorithm R).
///  4. A table of 2 MiB or more is 2 MiB aligned, its size rounded up to 2 MiB, and on
///     Linux advised to use transparent huge pages (madvise MADV_HUGEPAGE; the kernel
///     may decline). A match touches one random slot per token: with 4 KiB pages each
///     such touch of a large table is also a TLB miss and a page-table walk.
///
/// Thread safety: const methods may run on any number of threads at once; a non-const
/// method needs exclusive access. Insert and Erase move entries: pointers to slots
/// are valid only until the next Insert or Erase.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace inferq::routing_internal {

/// splitmix64's finalizer (Steele, Lea, Flood: "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): every input bit flips about half the output bits, so
/// the high bits are a good home slot even for small consecutive integer keys.
inline std::uint64_t Mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/// Storage for ProbeTable (invariant 4).
class SlotStorage {
 public:
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;

  SlotStorage() = default;
  explicit SlotStorage(std::size_t bytes) : bytes_(Rounded(bytes)) {
    if (bytes_ >= kHugePage) {
      data_ = ::operator new(bytes_, std::align_val_t{kHugePage});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      madvise(data_, bytes_, MADV_HUGEPAGE);  // a hint: failure leaves 4 KiB pages
#endif
    } else {
      data_ = ::operator new(bytes_);
    }
  }
  SlotStorage(SlotStorage&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  SlotStorage& operator=(SlotStorage&& other) noexcept {
    SlotStorage(std::move(other)).Swap(*this);
    return *this;
  }
  ~SlotStorage() {
    if (data_ == nullptr) return;
    if (bytes_ >= kHugePage) {
      ::operator delete(data_, std::align_val_t{kHugePage});
    } else {
      ::operator delete(data_);
    }
  }
  void Swap(SlotStorage& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  static std::size_t Rounded(std::size_t bytes) {
    return bytes >= kHugePage ? (bytes + kHugePage - 1) / kHugePage * kHugePage : bytes;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

template <class Slot, class Traits>
class ProbeTable {
  static_assert(std::is_trivially_copyable_v<Slot> && std::is_trivially_destructible_v<Slot>,
                "slots live in raw storage and are moved by copying");

 public:
  ProbeTable() = default;
  ProbeTable(ProbeTable&& other) noexcept { *this = std::move(other); }
  ProbeTable& operator=(ProbeTable&& other) noexcept {
    storage_ = std::move(other.storage_);
    slots_ = std::exchange(other.slots_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    shift_ = std::exchange(other.shift_, 64);
    return *this;
  }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  std::size_t MemoryBytes() const { return storage_.bytes(); }

  /// The slot for which eq(slot) holds, probing from the home of `hash`; nullptr when
  /// there is none. eq is called on occupied slots only.
  template <class Eq>
  const Slot* Find(std::uint64_t hash, Eq&& eq) const {
    if (size_ == 0) return nullptr;
    const std::size_t mask = capacity_ - 1;
    for (std::size_t i = hash >> shift_;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (Traits::IsEmpty(s)) return nullptr;  // invariant 2: a run ends
      if (eq(s)) return &s;
    }
  }

  /// Stores `slot`, whose key must be absent. Returns where it is.
  Slot* Insert(const Slot& slot) {
    if ((size_ + 1) * 10 > capacity_ * 7) Rehash(capacity_ == 0 ? 16 : capacity_ * 2);
    Slot* s = Place(slot);
    ++size_;
    return s;
  }

  /// Removes the entry at `slot` (a pointer from Find or Insert).
  void Erase(const Slot* slot) {
    const std::size_t mask = capacity_ - 1;
    std::size_t hole = static_cast<std::size_t>(slot - slots_);
    for (std::size_t j = (hole + 1) & mask; !Traits::IsEmpty(slots_[j]); j = (j + 1) & mask) {
      const std::size_t home = Traits::Hash(slots_[j]) >> shift_;
      // The entry at j may move back into the hole when the hole lies on its probe
      // path [home, j]: its distance from home is at least the hole's distance to j.
      if (((j - home) & mask) >= ((j - hole) & mask)) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Traits::Empty();
    --size_;
  }

 private:
  Slot* Place(const Slot& slot) {
    const std::size_t mask = capacity_ - 1;
    std::size_t i = Traits::Hash(slot) >> shift_;
    while (!Traits::IsEmpty(slots_[i])) i = (i + 1) & mask;
    slots_[i] = slot;
    return &slots_[i];
  }

  void Rehash(std::size_t capacity) {
    SlotStorage old_storage(capacity * sizeof(Slot));
    old_storage.Swap(storage_);
    const Slot* const old = slots_;
    const std::size_t old_capacity = capacity_;
    slots_ = static_cast<Slot*>(storage_.data());
    for (std::size_t i = 0; i < capacity; ++i) new (&slots_[i]) Slot(Traits::Empty());
    capacity_ = capacity;
    shift_ = 64 - std::countr_zero(capacity);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (!Traits::IsEmpty(old[i])) Place(old[i]);
    }
  }

  SlotStorage storage_;
  Slot* slots_ = nullptr;  ///< storage_.data()
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
  int shift_ = 64;  ///< 64 - log2(capacity_); unused while capacity_ is 0
};

}  // namespace inferq::routing_internal
