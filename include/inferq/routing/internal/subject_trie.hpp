/// @file inferq/routing/internal/subject_trie.hpp  (not API: used by subject_index.hpp)
///
/// SubjectTrie: the part of SubjectIndex<V> that does not depend on the value type.
/// It maps subject patterns to sets of value *slots* (dense 32-bit ids that
/// SubjectIndex<V> gives its distinct values) and answers "which slots have a pattern
/// matching this literal subject", in the order the slots were acquired.
///
/// Layout (chosen so that a match walks one cache line per token, and so that 10^6
/// subscriptions fit in about 150 bytes each, values included; see bench_routing):
///  1. A node is named by a 32-bit id (the root is id 0; ids of freed nodes are
///     reused). Its data is 16 bytes: its id, its value list for patterns ending at it
///     (`terminal`), its value list for patterns ending in `>` right after it (`tail`:
///     '>' is always the last token, so it needs no node of its own), and `meta`: the
///     number of its literal children, plus kStarBit when it has a `*` child.
///  2. Every node but the root lives in one open-addressing hash table, keyed by
///     (parent id, token id), with its data inline in the 24-byte slot: finding a child
///     and reading it is one probe, usually one cache line. The `*` edge is the key
///     (parent, kStarToken), so `*` and literal edges are separate: a `*` child is
///     never found by a literal token and the reverse.
///  3. The table is a ProbeTable (internal/probe_table.hpp: linear probing, at most
///     70% full, backward-shift deletion).
///  4. Token text is interned once in a TokenTable (token -> id, below) with a count
///     of the edges using it; an id whose count drops to 0 is erased and reused.
///  5. A value list is one 32-bit word: kEmptyList, a single slot (bit 31 clear), or
///     bit 31 set and the index of a vector in `lists_` holding two or more slots. A
///     vector's slots are sorted by their ordinal, with no duplicates.
///  6. Every acquired slot gets the next ordinal (a 64-bit counter that never goes
///     back), so ordinals give "order of first insertion" even when slots are reused.
///  7. A node that holds no values and no children is removed, with its edge, by
///     Erase, so the trie holds no dead branches.
///
/// Thread safety: const methods may run on any number of threads at once; a non-const
/// method needs exclusive access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "inferq/routing/internal/probe_table.hpp"

namespace inferq::routing_internal {

inline constexpr std::uint32_t kNoId = 0xffffffffu;

/// TokenTable: interned tokens, text -> 32-bit id, with a count of references per id.
/// A slot keeps the token's length n and two 64-bit words that, for n <= 16, are the
/// token's bytes themselves and cover all of them (bytes [0, 8) and [n - 8, n) for
/// n >= 8; [0, 4) and [n - 4, n) for 4 <= n < 8; bytes 0, n / 2 and n - 1 below), so
/// that finding a short token compares two words and reads no text elsewhere; for a
/// longer token the words are two hashes and the text is compared too (kept in
/// `long_text_`). Tokens of a subject are short: "infer", "llama-3-70b", "tenant-42".
class TokenTable {
 public:
  /// The id of `token`, or kNoId when it is not interned.
  std::uint32_t Find(std::string_view token) const;
  /// The id of `token` with one more reference, interning it if new.
  std::uint32_t Ref(std::string_view token);
  /// Drops a reference to `token`, whose id is `id`; erases it at 0 references.
  void Unref(std::string_view token, std::uint32_t id);
  std::size_t size() const { return table_.size(); }
  /// Ids ever handed out (the next new id).
  std::size_t id_limit() const { return refs_.size(); }
  std::size_t free_ids() const { return free_ids_.size(); }
  std::size_t MemoryBytes() const;

 private:
  struct Slot {
    std::uint64_t a;
    std::uint64_t b;
    std::uint32_t len;
    std::uint32_t id;  ///< kNoId: empty
  };
  static_assert(sizeof(Slot) == 24, "a token slot is three 64-bit words");
  struct Traits {
    static Slot Empty() { return Slot{0, 0, 0, kNoId}; }
    static bool IsEmpty(const Slot& s) { return s.id == kNoId; }
    static std::uint64_t Hash(const Slot& s) { return HashOf(s.a, s.b, s.len); }
  };
  static std::uint64_t HashOf(std::uint64_t a, std::uint64_t b, std::uint32_t len) {
    return Mix64((a * 0x9e3779b97f4a7c15ull) ^ b ^ (std::uint64_t{len} << 56));
  }
  static Slot KeyOf(std::string_view token);
  const Slot* FindSlot(std::string_view token, const Slot& key) const;

  ProbeTable<Slot, Traits> table_;
  absl::flat_hash_map<std::uint32_t, std::string> long_text_;  ///< tokens over 16 bytes
  std::vector<std::uint32_t> refs_;  ///< by id
  std::vector<std::uint32_t> free_ids_;
};

/// Heap bytes of an absl flat hash table at its capacity: one slot and one control
/// byte per bucket, plus the cloned control bytes of one group (raw_hash_set.h).
template <class Table>
std::size_t HashTableBytes(const Table& t) {
  if (t.capacity() == 0) return 0;
  return t.capacity() * (sizeof(typename Table::value_type) + 1) + 16;
}

/// Slots of the values matching one subject, in order of their first insertion.
using SlotBuffer = absl::InlinedVector<std::uint32_t, 16>;

class SubjectTrie {
 public:
  static constexpr std::uint32_t kNone = kNoId;
  /// Slots are < 2^31 (bit 31 of a value list tells a slot from a list index).
  static constexpr std::uint32_t kMaxSlots = 0x7fffffffu;

  enum class AddResult { kAdded, kAlreadyPresent, kFull };

  SubjectTrie() = default;
  SubjectTrie(SubjectTrie&&) = default;
  SubjectTrie& operator=(SubjectTrie&&) = default;

  /// A fresh slot with the next ordinal, or kNone when kMaxSlots slots are in use.
  std::uint32_t AcquireSlot();
  /// Returns `slot` for reuse; it must be in no value list.
  void ReleaseSlot(std::uint32_t slot);

  /// Adds `slot` to the value list of `pattern`, which must be a valid pattern
  /// (SubjectPattern::Parse accepted it). kAlreadyPresent leaves the trie unchanged;
  /// kFull when the ids of nodes or tokens (2^32 - 16) or of value lists (2^31 - 1)
  /// would run out (nothing is changed then).
  AddResult Add(std::string_view pattern, std::uint32_t slot);
  /// Removes `slot` from the value list of the valid `pattern`; false when it is not
  /// there. Prunes the nodes left empty (invariant 7).
  bool Erase(std::string_view pattern, std::uint32_t slot);

  /// Appends to *slots the slots whose patterns match the literal subject `subject`,
  /// each once, by ordinal. False (and nothing appended) for an invalid subject: an
  /// empty token, white space, or a `*` or `>` token. Allocates only when the subject
  /// has more than 16 tokens, more than 16 nodes match one prefix, or more than 16
  /// value lists or values match.
  bool Collect(std::string_view subject, SlotBuffer* slots) const;

  /// Nodes, the root included.
  std::size_t node_count() const { return nodes_.size() + 1; }
  std::size_t token_count() const { return tokens_.size(); }
  /// Heap bytes held by the trie (tables and vectors at their capacity, token text
  /// beyond the small-string buffer); malloc's own overhead is not counted.
  std::size_t MemoryBytes() const;

 private:
  static constexpr std::uint32_t kEmptyList = 0xffffffffu;
  static constexpr std::uint32_t kListBit = 0x80000000u;
  static constexpr std::uint32_t kStarBit = 0x80000000u;     ///< in meta
  static constexpr std::uint32_t kStarToken = 0xfffffffeu;   ///< token id of `*` edges
  static constexpr std::uint32_t kMaxIds = 0xfffffff0u;      ///< node and token ids

  struct NodeData {
    std::uint32_t id = 0;
    std::uint32_t terminal = kEmptyList;  ///< patterns ending here
    std::uint32_t tail = kEmptyList;      ///< patterns ending here + ".>"
    std::uint32_t meta = 0;               ///< literal children | kStarBit
  };
  struct Entry {
    std::uint32_t parent;  ///< kNone: empty slot
    std::uint32_t token;   ///< token id, or kStarToken
    NodeData node;
  };
  static_assert(sizeof(Entry) == 24, "a node slot is six 32-bit words");
  static std::uint64_t HashOf(std::uint32_t parent, std::uint32_t token) {
    return Mix64((std::uint64_t{parent} << 32) | token);
  }
  struct EntryTraits {
    static Entry Empty() { return Entry{kNone, 0, NodeData{}}; }
    static bool IsEmpty(const Entry& e) { return e.parent == kNone; }
    static std::uint64_t Hash(const Entry& e) { return HashOf(e.parent, e.token); }
  };

  const Entry* Find(std::uint32_t parent, std::uint32_t token) const {
    return nodes_.Find(HashOf(parent, token), [parent, token](const Entry& e) {
      return e.parent == parent && e.token == token;
    });
  }

  /// Key (parent, token) of a node on a path; parent == kNone for the root.
  struct Key {
    std::uint32_t parent;
    std::uint32_t token;
  };
  NodeData* Data(Key k) {
    return k.parent == kNone ? &root_ : &const_cast<Entry*>(Find(k.parent, k.token))->node;
  }

  std::uint32_t NewId();

  bool ListInsert(std::uint32_t* list, std::uint32_t slot);
  bool ListErase(std::uint32_t* list, std::uint32_t slot);

  NodeData root_;
  ProbeTable<Entry, EntryTraits> nodes_;  ///< every node but the root
  std::uint32_t next_id_ = 1;
  std::vector<std::uint32_t> free_ids_;
  TokenTable tokens_;
  std::vector<std::vector<std::uint32_t>> lists_;  ///< value lists of 2+ slots
  std::vector<std::uint32_t> free_lists_;
  std::vector<std::uint64_t> slot_ordinal_;  ///< by slot
  std::vector<std::uint32_t> free_slots_;
  std::uint64_t next_ordinal_ = 0;
};

}  // namespace inferq::routing_internal
