// File: inferq/routing/internal/subject_trie.hpp  (not API: used by subject_index.hpp)
//
// SubjectTrie: the part of SubjectIndex<V> that does not depend on the value type.
// It maps subject patterns to sets of value *slots* (dense 32-bit ids that
// SubjectIndex<V> gives its distinct values) and answers "which slots have a pattern
// matching this literal subject", in the order the slots were acquired.
//
// Layout (chosen to hold 10^6 subscriptions compactly, see Stats in subject_index.hpp):
//  1. Nodes live in one vector and are named by their index; node 0 is the root and
//     is never freed. A freed node goes on a free list and is reused.
//  2. A node holds its `*` edge (a node index), its value list for patterns that end
//     at it (`terminal`), its value list for patterns that end in `>` right after it
//     (`tail`: '>' is always the last token, so it needs no node of its own), and the
//     number of its literal children: 16 bytes in all.
//  3. Literal edges are not stored per node but in one hash set of
//     {parent, token id, child} (12 bytes a slot), keyed by (parent, token id).
//     Token text is interned once in `tokens_` (token -> id), with a count of the
//     edges using it; an id whose count drops to 0 is erased and reused.
//  4. A value list is one 32-bit word: kEmptyList, a single slot (bit 31 clear), or
//     bit 31 set and the index of a vector in `lists_` holding two or more slots. A
//     vector's slots are sorted by their ordinal, with no duplicates.
//  5. Every acquired slot gets the next ordinal (a 64-bit counter that never goes
//     back), so ordinals give "order of first insertion" even when slots are reused.
//  6. A node that holds no values, no `*` edge and no literal child is removed, with
//     its edge, by Erase, so the trie holds no dead branches.
//
// Thread safety: const methods may run on any number of threads at once; a non-const
// method needs exclusive access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"

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

  SubjectTrie();

  // A fresh slot with the next ordinal, or kNone when kMaxSlots slots are in use.
  std::uint32_t AcquireSlot();
  // Returns `slot` for reuse; it must be in no value list.
  void ReleaseSlot(std::uint32_t slot);

  // Adds `slot` to the value list of `pattern`, which must be a valid pattern
  // (SubjectPattern::Parse accepted it). kAlreadyPresent leaves the trie unchanged;
  // kFull when 2^32 - 1 nodes or tokens would be needed (nothing is changed then).
  AddResult Add(std::string_view pattern, std::uint32_t slot);
  // Removes `slot` from the value list of the valid `pattern`; false when it is not
  // there. Prunes the nodes left empty (invariant 6).
  bool Erase(std::string_view pattern, std::uint32_t slot);

  // Appends to *slots the slots whose patterns match the literal subject `subject`,
  // each once, by ordinal. False (and nothing appended) for an invalid subject: an
  // empty token, white space, or a `*` or `>` token. Allocates only when the
  // subject has more than 16 tokens or the match more than 16 candidates.
  bool Collect(std::string_view subject, SlotBuffer* slots) const;

  std::size_t node_count() const { return nodes_.size() - free_nodes_.size(); }
  std::size_t token_count() const { return tokens_.size(); }
  // Heap bytes held by the trie (vectors and hash tables at their capacity, token
  // text beyond the small-string buffer); malloc's own overhead is not counted.
  std::size_t MemoryBytes() const;

 private:
  static constexpr std::uint32_t kRoot = 0;
  static constexpr std::uint32_t kEmptyList = 0xffffffffu;
  static constexpr std::uint32_t kListBit = 0x80000000u;

  struct Node {
    std::uint32_t star = kNone;            // child by the `*` edge
    std::uint32_t terminal = kEmptyList;   // patterns ending here
    std::uint32_t tail = kEmptyList;       // patterns ending here + ".>"
    std::uint32_t literal_children = 0;    // edges from this node in edges_
  };
  static_assert(sizeof(Node) == 16, "a trie node is four 32-bit words");

  struct Edge {
    std::uint32_t parent;
    std::uint32_t token;
    std::uint32_t child;
  };
  static_assert(sizeof(Edge) == 12, "an edge slot is three 32-bit words");
  struct EdgeKey {
    std::uint32_t parent;
    std::uint32_t token;
  };
  struct EdgeHash {
    using is_transparent = void;
    static std::size_t Of(std::uint32_t parent, std::uint32_t token) {
      return absl::Hash<std::uint64_t>{}((std::uint64_t{parent} << 32) | token);
    }
    std::size_t operator()(const Edge& e) const { return Of(e.parent, e.token); }
    std::size_t operator()(const EdgeKey& k) const { return Of(k.parent, k.token); }
  };
  struct EdgeEq {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const {
      return a.parent == b.parent && a.token == b.token;
    }
  };

  struct Candidate {
    std::uint64_t ordinal;
    std::uint32_t slot;
  };
  using Candidates = absl::InlinedVector<Candidate, 16>;

  std::uint32_t NewNode();
  void FreeNode(std::uint32_t node);
  bool IsEmpty(const Node& n) const {
    return n.star == kNone && n.terminal == kEmptyList && n.tail == kEmptyList &&
           n.literal_children == 0;
  }
  // The token's id, or kNone when no edge uses it.
  std::uint32_t FindToken(std::string_view token) const;
  // The token's id (interned if new) with one more edge counted; kNone when full.
  std::uint32_t RefToken(std::string_view token);
  void UnrefToken(std::string_view token, std::uint32_t id);

  bool ListInsert(std::uint32_t* list, std::uint32_t slot);
  bool ListErase(std::uint32_t* list, std::uint32_t slot);
  void AppendList(std::uint32_t list, Candidates* out) const;

  std::vector<Node> nodes_;
  std::vector<std::uint32_t> free_nodes_;
  absl::flat_hash_set<Edge, EdgeHash, EdgeEq> edges_;
  absl::flat_hash_map<std::string, std::uint32_t> tokens_;
  std::vector<std::uint32_t> token_refs_;     // by token id: edges using it
  std::vector<std::uint32_t> free_tokens_;
  std::vector<std::vector<std::uint32_t>> lists_;   // value lists of 2+ slots
  std::vector<std::uint32_t> free_lists_;
  std::vector<std::uint64_t> slot_ordinal_;   // by slot
  std::vector<std::uint32_t> free_slots_;
  std::uint64_t next_ordinal_ = 0;
};

}  // namespace inferq::routing_internal
