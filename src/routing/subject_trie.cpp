#include "inferq/routing/internal/subject_trie.hpp"

#include <algorithm>
#include <cstring>

namespace inferq::routing_internal {
namespace {

// The white space of subject.cpp: ' ' and \t \n \v \f \r (9..13).
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

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

}  // namespace

// ---- TokenTable ------------------------------------------------------------------

namespace {
std::uint64_t Load64(const char* p) {
  std::uint64_t x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
std::uint32_t Load32(const char* p) {
  std::uint32_t x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
}  // namespace

TokenTable::Slot TokenTable::KeyOf(std::string_view token) {
  const char* p = token.data();
  const std::size_t n = token.size();
  Slot key{0, 0, static_cast<std::uint32_t>(n), 0};
  if (n >= 8 && n <= 16) {  // [0, 8) and [n - 8, n) cover the token
    key.a = Load64(p);
    key.b = Load64(p + n - 8);
  } else if (n >= 4 && n < 8) {  // [0, 4) and [n - 4, n)
    key.a = Load32(p);
    key.b = Load32(p + n - 4);
  } else if (n > 0 && n < 4) {  // bytes 0, n / 2 and n - 1
    key.a = static_cast<unsigned char>(p[0]) |
            std::uint64_t{static_cast<unsigned char>(p[n / 2])} << 8 |
            std::uint64_t{static_cast<unsigned char>(p[n - 1])} << 16;
  } else if (n > 16) {  // two hashes of 8-byte words; the text is compared as well
    std::uint64_t h1 = 0x243f6a8885a308d3ull ^ n;
    std::uint64_t h2 = 0x13198a2e03707344ull;
    for (std::size_t i = 0; i < n; i += 8) {
      const std::uint64_t w = Load64(p + (i + 8 <= n ? i : n - 8));
      h1 = Mix64(h1 ^ w);
      h2 = (h2 + w) * 0x9e3779b97f4a7c15ull;
      h2 ^= h2 >> 29;
    }
    key.a = h1;
    key.b = h2;
  }
  return key;
}

const TokenTable::Slot* TokenTable::FindSlot(std::string_view token, const Slot& key) const {
  return table_.Find(HashOf(key.a, key.b, key.len), [&](const Slot& s) {
    if (s.a != key.a || s.b != key.b || s.len != key.len) return false;
    if (key.len <= 16) return true;  // the words are the text
    return std::string_view(long_text_.find(s.id)->second) == token;
  });
}

std::uint32_t TokenTable::Find(std::string_view token) const {
  const Slot* s = FindSlot(token, KeyOf(token));
  return s == nullptr ? kNoId : s->id;
}

std::uint32_t TokenTable::Ref(std::string_view token) {
  const Slot key = KeyOf(token);
  if (const Slot* s = FindSlot(token, key)) {
    ++refs_[s->id];
    return s->id;
  }
  std::uint32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(refs_.size());
    refs_.push_back(0);
  }
  refs_[id] = 1;
  if (token.size() > 16) long_text_.emplace(id, std::string(token));
  table_.Insert(Slot{key.a, key.b, key.len, id});
  return id;
}

void TokenTable::Unref(std::string_view token, std::uint32_t id) {
  if (--refs_[id] != 0) return;
  table_.Erase(FindSlot(token, KeyOf(token)));
  if (token.size() > 16) long_text_.erase(id);
  free_ids_.push_back(id);
}

std::size_t TokenTable::MemoryBytes() const {
  std::size_t bytes = table_.MemoryBytes() + HashTableBytes(long_text_) +
                      refs_.capacity() * sizeof(std::uint32_t) +
                      free_ids_.capacity() * sizeof(std::uint32_t);
  for (const auto& [id, text] : long_text_) bytes += text.capacity() + 1;
  return bytes;
}

// ---- SubjectTrie ------------------------------------------------------------------

std::uint32_t SubjectTrie::NewId() {
  if (!free_ids_.empty()) {
    const std::uint32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  return next_id_++;
}

// ---- tokens, slots, value lists ---------------------------------------------------

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
  if (tokens_.id_limit() + n >= kMaxIds && tokens_.free_ids() < n) return AddResult::kFull;
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
    std::uint32_t token = star ? kStarToken : tokens_.Find(tok);
    if (const Entry* e = token == kNone ? nullptr : Find(id, token)) {
      key = Key{id, token};
      id = e->node.id;
      return true;
    }
    if (!star) token = tokens_.Ref(tok);
    const std::uint32_t child = NewId();
    Data(key)->meta += star ? kStarBit : 1;  // before Insert moves entries
    nodes_.Insert(Entry{id, token, NodeData{child, kEmptyList, kEmptyList, 0}});
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
    const std::uint32_t token = tok == "*" ? kStarToken : tokens_.Find(tok);
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
    const Entry* e = Find(path[i].key.parent, path[i].key.token);
    const NodeData& d = e->node;
    if (d.terminal != kEmptyList || d.tail != kEmptyList || d.meta != 0) break;
    free_ids_.push_back(d.id);
    nodes_.Erase(e);
    const bool star = path[i].key.token == kStarToken;
    Data(i == 0 ? Key{kNone, 0} : path[i - 1].key)->meta -= star ? kStarBit : 1;
    if (!star) tokens_.Unref(path[i].text, path[i].key.token);
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
    tokens.push_back(tokens_.Find(subject.substr(pos, len)));
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
  std::size_t bytes = nodes_.MemoryBytes() + free_ids_.capacity() * sizeof(std::uint32_t) +
                      tokens_.MemoryBytes() +
                      lists_.capacity() * sizeof(std::vector<std::uint32_t>) +
                      free_lists_.capacity() * sizeof(std::uint32_t) +
                      slot_ordinal_.capacity() * sizeof(std::uint64_t) +
                      free_slots_.capacity() * sizeof(std::uint32_t);
  for (const auto& v : lists_) bytes += v.capacity() * sizeof(std::uint32_t);
  return bytes;
}

}  // namespace inferq::routing_internal
