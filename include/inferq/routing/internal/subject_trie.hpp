// File: inferq/routing/internal/subject_trie.hpp  (not API: used by subject_index.hpp)
//
// SubjectTrie: the part of SubjectIndex<V> that does not depend on the value type.
// It maps subject patterns to sets of value *slots* (dense 32-bit ids that
// SubjectIndex<V> gives its distinct values) and answers "which slots have a pattern
// matching this literal subject", in the order the slots were acquired.
//
// Layout (chosen so that a match walks one cache line per token, and so that 10^6
// subscriptions fit in about 150 bytes each, values included; see bench_routing):
//  1. A node is named by a 32-bit id (the root is id 0; ids of freed nodes are
//     reused). Its data is 16 bytes: its id, its value list for patterns ending at it
//     (`terminal`), its value list for patterns ending in `>` right after it (`tail`:
//     '>' is always the last token, so it needs no node of its own), and `meta`: the
//     number of its literal children, plus kStarBit when it has a `*` child.
//  2. Every node but the root lives in one open-addressing hash table, keyed by
//     (parent id, token id), with its data inline in the 24-byte slot: finding a child
//     and reading it is one probe, usually one cache line. The `*` edge is the key
//     (parent, kStarToken), so `*` and literal edges are separate: a `*` child is
//     never found by a literal token and the reverse.
//  3. The table probes linearly from the key's home slot; it is never more than 70%
//     full (it doubles before that), so every probe sequence ends at an empty slot.
//     Deletion shifts later entries of the run back (no tombstones): every entry stays
//     reachable from its home slot without crossing an empty slot.
//  4. Token text is interned once in `tokens_` (token -> id) with a count of the edges
//     using it; an id whose count drops to 0 is erased and reused.
//  5. A value list is one 32-bit word: kEmptyList, a single slot (bit 31 clear), or
//     bit 31 set and the index of a vector in `lists_` holding two or more slots. A
//     vector's slots are sorted by their ordinal, with no duplicates.
//  6. Every acquired slot gets the next ordinal (a 64-bit counter that never goes
//     back), so ordinals give "order of first insertion" even when slots are reused.
//  7. A node that holds no values and no children is removed, with its edge, by
//     Erase, so the trie holds no dead branches.
//
// Thread safety: const methods may run on any number of threads at once; a non-const
// method needs exclusive access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"

namespace inferq::routing_internal {

// Heap bytes of an absl flat hash table at its capacity: one slot and one control
// byte per bucket, plus the cloned control bytes of one group (raw_hash_set.h).
template <class Table>
std::size_t HashTableBytes(const Table& t) {
  if (t.capacity() == 0) return 0;
  return t.capacity() * (sizeof(typename Table::value_type) + 1) + 16;
}

// Slots of the values matching one subject, in order of their first insertion.
using SlotBuffer = absl::InlinedVector<std::uint32_t, 16>;

class SubjectTrie {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;
  // Slots are < 2^31 (bit 31 of a value list tells a slot from a list index).
  static constexpr std::uint32_t kMaxSlots = 0x7fffffffu;

  enum class AddResult { kAdded, kAlreadyPresent, kFull };

  SubjectTrie() = default;
  SubjectTrie(SubjectTrie&&) noexcept = default;
  SubjectTrie& operator=(SubjectTrie&&) noexcept = default;

  // A fresh slot with the next ordinal, or kNone when kMaxSlots slots are in use.
  std::uint32_t AcquireSlot();
  // Returns `slot` for reuse; it must be in no value list.
  void ReleaseSlot(std::uint32_t slot);

  // Adds `slot` to the value list of `pattern`, which must be a valid pattern
  // (SubjectPattern::Parse accepted it). kAlreadyPresent leaves the trie unchanged;
  // kFull when 2^32 - 2 nodes or tokens would be needed (nothing is changed then).
  AddResult Add(std::string_view pattern, std::uint32_t slot);
  // Removes `slot` from the value list of the valid `pattern`; false when it is not
  // there. Prunes the nodes left empty (invariant 7).
  bool Erase(std::string_view pattern, std::uint32_t slot);

  // Appends to *slots the slots whose patterns match the literal subject `subject`,
  // each once, by ordinal. False (and nothing appended) for an invalid subject: an
  // empty token, white space, or a `*` or `>` token. Allocates only when the subject
  // has more than 16 tokens, more than 16 nodes match one prefix, or more than 16
  // value lists or values match.
  bool Collect(std::string_view subject, SlotBuffer* slots) const;

  // Nodes, the root included.
  std::size_t node_count() const { return size_ + 1; }
  std::size_t token_count() const { return tokens_.size(); }
  // Heap bytes held by the trie (tables and vectors at their capacity, token text
  // beyond the small-string buffer); malloc's own overhead is not counted.
  std::size_t MemoryBytes() const;

 private:
  static constexpr std::uint32_t kEmptyList = 0xffffffffu;
  static constexpr std::uint32_t kListBit = 0x80000000u;
  static constexpr std::uint32_t kStarBit = 0x80000000u;     // in meta
  static constexpr std::uint32_t kStarToken = 0xfffffffeu;   // token id of `*` edges
  static constexpr std::uint32_t kMaxIds = 0xfffffff0u;      // node and token ids

  struct NodeData {
    std::uint32_t id = 0;
    std::uint32_t terminal = kEmptyList;  // patterns ending here
    std::uint32_t tail = kEmptyList;      // patterns ending here + ".>"
    std::uint32_t meta = 0;               // literal children | kStarBit
  };
  struct Entry {
    std::uint32_t parent;  // kNone: empty slot
    std::uint32_t token;   // token id, or kStarToken
    NodeData node;
  };
  static_assert(sizeof(Entry) == 24, "a table slot is six 32-bit words");

  // The table of invariants 2 and 3.
  const Entry* Find(std::uint32_t parent, std::uint32_t token) const;
  Entry* Find(std::uint32_t parent, std::uint32_t token) {
    return const_cast<Entry*>(static_cast<const SubjectTrie*>(this)->Find(parent, token));
  }
  void InsertEntry(const Entry& e);  // the key must be absent
  void EraseEntry(Entry* e);
  std::size_t Home(std::uint32_t parent, std::uint32_t token) const;
  void Rehash(std::size_t capacity);

  // Key (parent, token) of a node on a path; parent == kNone for the root.
  struct Key {
    std::uint32_t parent;
    std::uint32_t token;
  };
  NodeData* Data(Key k) { return k.parent == kNone ? &root_ : &Find(k.parent, k.token)->node; }

  std::uint32_t NewId();
  // The token's id, or kNone when no edge uses it.
  std::uint32_t FindToken(std::string_view token) const;
  // The token's id (interned if new) with one more edge counted.
  std::uint32_t RefToken(std::string_view token);
  void UnrefToken(std::string_view token, std::uint32_t id);

  bool ListInsert(std::uint32_t* list, std::uint32_t slot);
  bool ListErase(std::uint32_t* list, std::uint32_t slot);

  NodeData root_;
  std::unique_ptr<Entry[]> table_;
  std::size_t capacity_ = 0;  // 0 or a power of two
  std::size_t size_ = 0;      // entries in table_ = nodes other than the root
  int shift_ = 64;            // 64 - log2(capacity_)
  std::uint32_t next_id_ = 1;
  std::vector<std::uint32_t> free_ids_;
  absl::flat_hash_map<std::string, std::uint32_t> tokens_;
  std::vector<std::uint32_t> token_refs_;  // by token id: edges using it
  std::vector<std::uint32_t> free_tokens_;
  std::vector<std::vector<std::uint32_t>> lists_;  // value lists of 2+ slots
  std::vector<std::uint32_t> free_lists_;
  std::vector<std::uint64_t> slot_ordinal_;  // by slot
  std::vector<std::uint32_t> free_slots_;
  std::uint64_t next_ordinal_ = 0;
};

}  // namespace inferq::routing_internal
