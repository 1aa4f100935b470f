#include "inferq/routing/internal/subject_trie.hpp"

#include <algorithm>
#include <bit>

namespace inferq::routing_internal {
namespace {

// The white space of subject.cpp: ' ' and \t \n \v \f \r (9..13).
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// Debian's Abseil has its own absl::string_view; its string hash tables look up by it.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Calls f(token, is_last) for each token of a valid pattern, until f returns false.
template <class F>
void ForEachToken(std::string_view pattern, F&& f) {
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = pattern.find('.', start);
    if (dot == std::string_view::npos) {
      f(pattern.substr(start), true);
      return;
    }
    if (!f(pattern.substr(start, dot - start), false)) return;
    start = dot + 1;
  }
}

std::size_t TokenCount(std::string_view pattern) {
  return static_cast<std::size_t>(std::count(pattern.begin(), pattern.end(), '.')) + 1;
}

constexpr std::size_t kMinCapacity = 16;

}  // namespace

// ---- the node table (invariants 2 and 3) -----------------------------------------

std::size_t SubjectTrie::Home(std::uint32_t parent, std::uint32_t token) const {
  // The finalizer of splitmix64 (Steele, Lea, Flood: "Fast splittable pseudorandom
  // number generators", OOPSLA 2014): ids are small consecutive integers, and the
  // high bits of the mixed key pick the slot.
  std::uint64_t x = (std::uint64_t{parent} << 32) | token;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<std::size_t>(x >> shift_);
}

const SubjectTrie::Entry* SubjectTrie::Find(std::uint32_t parent, std::uint32_t token) const {
  if (size_ == 0) return nullptr;
  const std::size_t mask = capacity_ - 1;
  for (std::size_t i = Home(parent, token);; i = (i + 1) & mask) {
    const Entry& e = table_[i];
    if (e.parent == parent && e.token == token) return &e;
    if (e.parent == kNone) return nullptr;  // ends every run: the table is < 70% full
  }
}

void SubjectTrie::Rehash(std::size_t capacity) {
  std::unique_ptr<Entry[]> old = std::move(table_);
  const std::size_t old_capacity = capacity_;
  table_ = std::make_unique<Entry[]>(capacity);
  capacity_ = capacity;
  shift_ = 64 - std::countr_zero(capacity);
  for (std::size_t i = 0; i < capacity; ++i) table_[i].parent = kNone;
  const std::size_t mask = capacity_ - 1;
  for (std::size_t i = 0; i < old_capacity; ++i) {
    if (old[i].parent == kNone) continue;
    std::size_t j = Home(old[i].parent, old[i].token);
    while (table_[j].parent != kNone) j = (j + 1) & mask;
    table_[j] = old[i];
  }
}

void SubjectTrie::InsertEntry(const Entry& e) {
  // Grow before the table would be more than 70% full.
  if ((size_ + 1) * 10 > capacity_ * 7) {
    Rehash(capacity_ == 0 ? kMinCapacity : capacity_ * 2);
  }
  const std::size_t mask = capacity_ - 1;
  std::size_t i = Home(e.parent, e.token);
  while (table_[i].parent != kNone) i = (i + 1) & mask;
  table_[i] = e;
  ++size_;
}

void SubjectTrie::EraseEntry(Entry* e) {
  // Backward-shift deletion (Knuth, TAOCP vol. 3, 6.4, Algorithm R): move back each
  // later entry of the run whose home is not cyclically in (hole, its position], so
  // that no entry is separated from its home by the new empty slot.
  const std::size_t mask = capacity_ - 1;
  std::size_t hole = static_cast<std::size_t>(e - table_.get());
  for (std::size_t j = (hole + 1) & mask; table_[j].parent != kNone; j = (j + 1) & mask) {
    const std::size_t home = Home(table_[j].parent, table_[j].token);
    // Distance travelled from home to j vs from hole to j, modulo the capacity.
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      table_[hole] = table_[j];
      hole = j;
    }
  }
  table_[hole].parent = kNone;
  --size_;
}

std::uint32_t SubjectTrie::NewId() {
  if (!free_ids_.empty()) {
    const std::uint32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  return next_id_++;
}

// ---- tokens, slots, value lists ---------------------------------------------------

std::uint32_t SubjectTrie::FindToken(std::string_view token) const {
  const auto it = tokens_.find(AsAbsl(token));
  return it == tokens_.end() ? kNone : it->second;
}

std::uint32_t SubjectTrie::RefToken(std::string_view token) {
  if (const auto it = tokens_.find(AsAbsl(token)); it != tokens_.end()) {
    ++token_refs_[it->second];
    return it->second;
  }
  std::uint32_t id;
  if (!free_tokens_.empty()) {
    id = free_tokens_.back();
    free_tokens_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(token_refs_.size());
    token_refs_.push_back(0);
  }
  tokens_.emplace(std::string(token), id);
  token_refs_[id] = 1;
  return id;
}

void SubjectTrie::UnrefToken(std::string_view token, std::uint32_t id) {
  if (--token_refs_[id] != 0) return;
  tokens_.erase(tokens_.find(AsAbsl(token)));
  free_tokens_.push_back(id);
}

std::uint32_t SubjectTrie::AcquireSlot() {
  std::uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (slot_ordinal_.size() >= kMaxSlots) return kNone;
    slot = static_cast<std::uint32_t>(slot_ordinal_.size());
    slot_ordinal_.push_back(0);
  }
  slot_ordinal_[slot] = next_ordinal_++;
  return slot;
}

void SubjectTrie::ReleaseSlot(std::uint32_t slot) { free_slots_.push_back(slot); }

bool SubjectTrie::ListInsert(std::uint32_t* list, std::uint32_t slot) {
  if (*list == kEmptyList) {
    *list = slot;
    return true;
  }
  const std::uint64_t ordinal = slot_ordinal_[slot];
  if ((*list & kListBit) == 0) {
    const std::uint32_t other = *list;
    if (other == slot) return false;
    std::uint32_t index;
    if (!free_lists_.empty()) {
      index = free_lists_.back();
      free_lists_.pop_back();
    } else {
      index = static_cast<std::uint32_t>(lists_.size());
      lists_.emplace_back();
    }
    std::vector<std::uint32_t>& v = lists_[index];
    if (slot_ordinal_[other] < ordinal) {
      v = {other, slot};
    } else {
      v = {slot, other};
    }
    *list = kListBit | index;
    return true;
  }
  std::vector<std::uint32_t>& v = lists_[*list & ~kListBit];
  const auto pos = std::lower_bound(v.begin(), v.end(), ordinal,
                                    [this](std::uint32_t s, std::uint64_t o) {
                                      return slot_ordinal_[s] < o;
                                    });
  if (pos != v.end() && *pos == slot) return false;
  v.insert(pos, slot);
  return true;
}

bool SubjectTrie::ListErase(std::uint32_t* list, std::uint32_t slot) {
  if (*list == kEmptyList) return false;
  if ((*list & kListBit) == 0) {
    if (*list != slot) return false;
    *list = kEmptyList;
    return true;
  }
  const std::uint32_t index = *list & ~kListBit;
  std::vector<std::uint32_t>& v = lists_[index];
  const std::uint64_t ordinal = slot_ordinal_[slot];
  const auto pos = std::lower_bound(v.begin(), v.end(), ordinal,
                                    [this](std::uint32_t s, std::uint64_t o) {
                                      return slot_ordinal_[s] < o;
                                    });
  if (pos == v.end() || *pos != slot) return false;
  v.erase(pos);
  if (v.size() == 1) {
    *list = v[0];
    std::vector<std::uint32_t>().swap(v);
    free_lists_.push_back(index);
  }
  return true;
}

// ---- Add, Erase, Collect ----------------------------------------------------------

SubjectTrie::AddResult SubjectTrie::Add(std::string_view pattern, std::uint32_t slot) {
  // At most one new node and one new token per token of the pattern; refuse up front
  // so that a full trie is left unchanged. (kMaxIds nodes take 96 GiB.)
  const std::size_t n = TokenCount(pattern);
  if (next_id_ + n >= kMaxIds && free_ids_.size() < n) return AddResult::kFull;
  if (token_refs_.size() + n >= kMaxIds && free_tokens_.size() < n) return AddResult::kFull;
  if (lists_.size() + 1 >= kListBit && free_lists_.empty()) return AddResult::kFull;

  Key key{kNone, 0};  // the root
  std::uint32_t id = 0;
  bool tail = false;
  ForEachToken(pattern, [&](std::string_view tok, bool) {
    if (tok == ">") {  // only ever the last token
      tail = true;
      return false;
    }
    const bool star = tok == "*";
    std::uint32_t token = star ? kStarToken : FindToken(tok);
    if (const Entry* e = token == kNone ? nullptr : Find(id, token)) {
      key = Key{id, token};
      id = e->node.id;
      return true;
    }
    if (!star) token = RefToken(tok);
    const std::uint32_t child = NewId();
    Data(key)->meta += star ? kStarBit : 1;  // before InsertEntry moves entries
    InsertEntry(Entry{id, token, NodeData{child, kEmptyList, kEmptyList, 0}});
    key = Key{id, token};
    id = child;
    return true;
  });
  NodeData* node = Data(key);
  return ListInsert(tail ? &node->tail : &node->terminal, slot) ? AddResult::kAdded
                                                                 : AddResult::kAlreadyPresent;
}

bool SubjectTrie::Erase(std::string_view pattern, std::uint32_t slot) {
  struct Step {
    Key key;                // of the node reached by this step
    std::string_view text;  // its token ("*" for a star edge)
  };
  absl::InlinedVector<Step, 16> path;
  std::uint32_t id = 0;
  bool tail = false;
  bool found = true;
  ForEachToken(pattern, [&](std::string_view tok, bool) {
    if (tok == ">") {
      tail = true;
      return false;
    }
    const std::uint32_t token = tok == "*" ? kStarToken : FindToken(tok);
    const Entry* e = token == kNone ? nullptr : Find(id, token);
    if (e == nullptr) {
      found = false;
      return false;
    }
    path.push_back(Step{Key{id, token}, tok});
    id = e->node.id;
    return true;
  });
  if (!found) return false;
  NodeData* node = Data(path.empty() ? Key{kNone, 0} : path.back().key);
  if (!ListErase(tail ? &node->tail : &node->terminal, slot)) return false;
  for (std::size_t i = path.size(); i-- > 0;) {
    Entry* e = Find(path[i].key.parent, path[i].key.token);
    const NodeData& d = e->node;
    if (d.terminal != kEmptyList || d.tail != kEmptyList || d.meta != 0) break;
    free_ids_.push_back(d.id);
    EraseEntry(e);
    const bool star = path[i].key.token == kStarToken;
    Data(i == 0 ? Key{kNone, 0} : path[i - 1].key)->meta -= star ? kStarBit : 1;
    if (!star) UnrefToken(path[i].text, path[i].key.token);
  }
  return true;
}

bool SubjectTrie::Collect(std::string_view subject, SlotBuffer* slots) const {
  // First pass: check the subject (an invalid one matches nothing) and look up the id
  // of each token. The lookups depend on the subject only, so their cache misses
  // overlap instead of waiting for the walk of the levels before them.
  const std::size_t size = subject.size();
  if (size == 0) return false;
  absl::InlinedVector<std::uint32_t, 16> tokens;  // kNone: no edge has that token
  const char* const s = subject.data();
  for (std::size_t pos = 0;;) {
    std::size_t end = pos;
    while (end < size && s[end] != '.') {
      if (IsSpace(s[end])) return false;
      ++end;
    }
    const std::size_t len = end - pos;
    if (len == 0) return false;
    if (len == 1 && (s[pos] == '*' || s[pos] == '>')) return false;
    tokens.push_back(FindToken(subject.substr(pos, len)));
    if (end == size) break;
    pos = end + 1;  // "a." ends with an empty token: the next round returns false
  }
  // Second pass: move the frontier (the nodes whose path matches the tokens so far)
  // one token at a time. Each node has one path from the root, so a node is in the
  // frontier at most once.
  absl::InlinedVector<const NodeData*, 16> buffers[2];
  buffers[0].push_back(&root_);
  int current = 0;
  absl::InlinedVector<std::uint32_t, 16> lists;  // value lists that matched
  for (const std::uint32_t token : tokens) {
    const auto& frontier = buffers[current];
    auto& next = buffers[current ^ 1];
    next.clear();
    for (const NodeData* node : frontier) {
      if (node->tail != kEmptyList) lists.push_back(node->tail);  // `>` takes the rest
      if (token != kNone && (node->meta & ~kStarBit) != 0) {
        if (const Entry* e = Find(node->id, token)) next.push_back(&e->node);
      }
      if ((node->meta & kStarBit) != 0) next.push_back(&Find(node->id, kStarToken)->node);
    }
    current ^= 1;
    if (next.empty()) break;
  }
  for (const NodeData* node : buffers[current]) {
    if (node->terminal != kEmptyList) lists.push_back(node->terminal);
  }
  if (lists.empty()) return true;
  if (lists.size() == 1) {  // sorted and free of duplicates already: no ordinal needed
    const std::uint32_t list = lists[0];
    if ((list & kListBit) == 0) {
      slots->push_back(list);
    } else {
      const std::vector<std::uint32_t>& v = lists_[list & ~kListBit];
      slots->insert(slots->end(), v.begin(), v.end());
    }
    return true;
  }
  struct Candidate {
    std::uint64_t ordinal;
    std::uint32_t slot;
  };
  absl::InlinedVector<Candidate, 16> candidates;
  for (const std::uint32_t list : lists) {
    if ((list & kListBit) == 0) {
      candidates.push_back(Candidate{slot_ordinal_[list], list});
    } else {
      for (const std::uint32_t slot : lists_[list & ~kListBit]) {
        candidates.push_back(Candidate{slot_ordinal_[slot], slot});
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.ordinal < b.ordinal; });
  std::uint32_t last = kNone;
  for (const Candidate& c : candidates) {
    if (c.slot != last) slots->push_back(c.slot);  // equal slots are adjacent
    last = c.slot;
  }
  return true;
}

std::size_t SubjectTrie::MemoryBytes() const {
  std::size_t bytes = capacity_ * sizeof(Entry) + free_ids_.capacity() * sizeof(std::uint32_t) +
                      HashTableBytes(tokens_) + token_refs_.capacity() * sizeof(std::uint32_t) +
                      free_tokens_.capacity() * sizeof(std::uint32_t) +
                      lists_.capacity() * sizeof(std::vector<std::uint32_t>) +
                      free_lists_.capacity() * sizeof(std::uint32_t) +
                      slot_ordinal_.capacity() * sizeof(std::uint64_t) +
                      free_slots_.capacity() * sizeof(std::uint32_t);
  const std::size_t small_string = std::string().capacity();  // held inline
  for (const auto& [text, id] : tokens_) {
    if (text.capacity() > small_string) bytes += text.capacity() + 1;
  }
  for (const auto& v : lists_) bytes += v.capacity() * sizeof(std::uint32_t);
  return bytes;
}

}  // namespace inferq::routing_internal
