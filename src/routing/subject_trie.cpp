#include "inferq/routing/internal/subject_trie.hpp"

#include <algorithm>

namespace inferq::routing_internal {
namespace {

// The white space of subject.cpp: ' ' and \t \n \v \f \r (9..13).
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

using Tokens = absl::InlinedVector<std::string_view, 16>;

// Debian's Abseil has its own absl::string_view; its string hash tables look up by it.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Splits a literal subject into its tokens; false for an invalid one (empty, an empty
// token, white space, a `*` or `>` token), the rules of ValidateSubject.
bool Tokenize(std::string_view s, Tokens* out) {
  if (s.empty()) return false;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      const std::size_t len = i - start;
      if (len == 0) return false;
      if (len == 1 && (s[start] == '*' || s[start] == '>')) return false;
      out->push_back(s.substr(start, len));
      start = i + 1;
    } else if (IsSpace(s[i])) {
      return false;
    }
  }
  return true;
}

// Calls f(token, is_last) for each token of a valid pattern.
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

SubjectTrie::SubjectTrie() { nodes_.emplace_back(); }

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

std::uint32_t SubjectTrie::NewNode() {
  if (!free_nodes_.empty()) {
    const std::uint32_t n = free_nodes_.back();
    free_nodes_.pop_back();
    return n;
  }
  nodes_.emplace_back();
  return static_cast<std::uint32_t>(nodes_.size() - 1);
}

void SubjectTrie::FreeNode(std::uint32_t node) {
  nodes_[node] = Node{};
  free_nodes_.push_back(node);
}

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
    if (token_refs_.size() >= kNone) return kNone;
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

void SubjectTrie::AppendList(std::uint32_t list, Candidates* out) const {
  if (list == kEmptyList) return;
  if ((list & kListBit) == 0) {
    out->push_back(Candidate{slot_ordinal_[list], list});
    return;
  }
  for (const std::uint32_t s : lists_[list & ~kListBit]) {
    out->push_back(Candidate{slot_ordinal_[s], s});
  }
}

SubjectTrie::AddResult SubjectTrie::Add(std::string_view pattern, std::uint32_t slot) {
  // At most one new node and one new token per token of the pattern; refuse up front
  // so that a full trie is left unchanged. (2^32 - 1 nodes take 64 GiB.)
  const std::size_t n = TokenCount(pattern);
  if (nodes_.size() + n >= kNone && free_nodes_.size() < n) return AddResult::kFull;
  if (token_refs_.size() + n >= kNone && free_tokens_.size() < n) return AddResult::kFull;
  if (lists_.size() + 1 >= kListBit && free_lists_.empty()) return AddResult::kFull;

  std::uint32_t node = kRoot;
  std::uint32_t* list = nullptr;
  ForEachToken(pattern, [&](std::string_view tok, bool last) {
    if (tok == ">") {  // only ever the last token
      list = &nodes_[node].tail;
      return false;
    }
    if (tok == "*") {
      if (nodes_[node].star == kNone) {
        const std::uint32_t child = NewNode();
        nodes_[node].star = child;
      }
      node = nodes_[node].star;
    } else {
      const std::uint32_t found = FindToken(tok);
      const auto it = found == kNone ? edges_.end() : edges_.find(EdgeKey{node, found});
      if (it != edges_.end()) {
        node = it->child;
      } else {
        const std::uint32_t id = RefToken(tok);
        const std::uint32_t child = NewNode();
        edges_.insert(Edge{node, id, child});
        ++nodes_[node].literal_children;
        node = child;
      }
    }
    if (last) list = &nodes_[node].terminal;
    return true;
  });
  return ListInsert(list, slot) ? AddResult::kAdded : AddResult::kAlreadyPresent;
}

bool SubjectTrie::Erase(std::string_view pattern, std::uint32_t slot) {
  struct Step {
    std::uint32_t parent;
    std::uint32_t child;
    std::uint32_t token;  // kNone for the `*` edge
    std::string_view text;
  };
  absl::InlinedVector<Step, 16> path;
  std::uint32_t node = kRoot;
  std::uint32_t* list = nullptr;
  ForEachToken(pattern, [&](std::string_view tok, bool last) {
    if (tok == ">") {
      list = &nodes_[node].tail;
      return false;
    }
    std::uint32_t child = kNone;
    std::uint32_t id = kNone;
    if (tok == "*") {
      child = nodes_[node].star;
    } else if (id = FindToken(tok); id != kNone) {
      if (const auto it = edges_.find(EdgeKey{node, id}); it != edges_.end()) {
        child = it->child;
      }
    }
    if (child == kNone) return false;  // no such path: list stays null
    path.push_back(Step{node, child, id, tok});
    node = child;
    if (last) list = &nodes_[node].terminal;
    return true;
  });
  if (list == nullptr || !ListErase(list, slot)) return false;
  for (auto step = path.rbegin(); step != path.rend(); ++step) {
    if (!IsEmpty(nodes_[step->child])) break;
    if (step->token == kNone) {
      nodes_[step->parent].star = kNone;
    } else {
      edges_.erase(edges_.find(EdgeKey{step->parent, step->token}));
      --nodes_[step->parent].literal_children;
      UnrefToken(step->text, step->token);
    }
    FreeNode(step->child);
  }
  return true;
}

bool SubjectTrie::Collect(std::string_view subject, SlotBuffer* slots) const {
  Tokens tokens;
  if (!Tokenize(subject, &tokens)) return false;
  // The frontier: the nodes whose path matches the tokens so far. Each node has one
  // path from the root, so a node is in the frontier at most once.
  absl::InlinedVector<std::uint32_t, 16> frontier{kRoot};
  absl::InlinedVector<std::uint32_t, 16> next;
  Candidates candidates;
  std::size_t lists = 0;
  for (const std::string_view tok : tokens) {
    next.clear();
    std::uint32_t id = kNone;
    bool looked_up = false;
    for (const std::uint32_t n : frontier) {
      const Node& node = nodes_[n];
      if (node.tail != kEmptyList) {  // `>` takes this token and all after it
        AppendList(node.tail, &candidates);
        ++lists;
      }
      if (node.literal_children != 0) {
        if (!looked_up) {
          id = FindToken(tok);
          looked_up = true;
        }
        if (id != kNone) {
          if (const auto it = edges_.find(EdgeKey{n, id}); it != edges_.end()) {
            next.push_back(it->child);
          }
        }
      }
      if (node.star != kNone) next.push_back(node.star);
    }
    frontier.swap(next);
    if (frontier.empty()) break;
  }
  for (const std::uint32_t n : frontier) {  // empty when the loop broke early
    if (nodes_[n].terminal != kEmptyList) {
      AppendList(nodes_[n].terminal, &candidates);
      ++lists;
    }
  }
  if (lists > 1) {  // one list is sorted and free of duplicates already
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.ordinal < b.ordinal; });
    candidates.erase(std::unique(candidates.begin(), candidates.end(),
                                 [](const Candidate& a, const Candidate& b) {
                                   return a.slot == b.slot;
                                 }),
                     candidates.end());
  }
  for (const Candidate& c : candidates) slots->push_back(c.slot);
  return true;
}

std::size_t SubjectTrie::MemoryBytes() const {
  std::size_t bytes = nodes_.capacity() * sizeof(Node) +
                      free_nodes_.capacity() * sizeof(std::uint32_t) +
                      HashTableBytes(edges_) + HashTableBytes(tokens_) +
                      token_refs_.capacity() * sizeof(std::uint32_t) +
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
