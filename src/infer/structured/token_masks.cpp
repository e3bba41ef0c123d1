#include "infer/structured/token_masks.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kiln::structured {
namespace {

void set_bit(std::vector<uint32_t>& mask, int32_t t) { mask[t >> 5] |= uint32_t(1) << (t & 31); }

// Whether a plain JSON string (no escape or UTF-8 sequence open) takes `bytes` whole; *code_points:
// the characters they begin.
bool plain_string_bytes(const std::string& bytes, int32_t* code_points) {
  uint8_t pending = 0;
  int32_t cps = 0;
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    if (pending > 0) {
      if (!utf8_continue(b, pending)) return false;
      continue;
    }
    if (b == '"' || b == '\\' || b < 0x20 || (b >= 0x80 && !utf8_lead(b, pending))) return false;
    ++cps;
  }
  *code_points = cps;
  return !bytes.empty();
}

}  // namespace

void TokenVocabulary::Trie::insert(const std::string& bytes, int32_t id, std::vector<int32_t>& next_token) {
  int32_t at = 0;
  for (char c : bytes) {
    const uint8_t b = static_cast<uint8_t>(c);
    int32_t child = nodes[at].first_child;
    while (child >= 0 && nodes[child].byte != b) child = nodes[child].next_sibling;
    if (child < 0) {
      Node n;
      n.byte = b;
      n.next_sibling = nodes[at].first_child;
      nodes.push_back(n);
      child = static_cast<int32_t>(nodes.size() - 1);
      nodes[at].first_child = child;
    }
    at = child;
  }
  next_token[id] = nodes[at].first_token;
  nodes[at].first_token = id;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::build(const Tokenizer& tokenizer, int32_t vocab) {
  auto v = std::make_shared<TokenVocabulary>();
  v->vocab_ = vocab;
  v->next_token_.assign(static_cast<size_t>(vocab), -1);
  v->plain_mask_.assign(static_cast<size_t>(v->words()), 0);
  const int32_t n = std::min(vocab, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    const std::optional<std::string> bytes = tokenizer.token_bytes(id);
    if (!bytes || bytes->empty()) continue;
    v->trie_.insert(*bytes, id, v->next_token_);
    int32_t cps = 0;
    if (plain_string_bytes(*bytes, &cps)) {
      set_bit(v->plain_mask_, id);
      v->plain_code_points_.emplace_back(id, cps);
    }
  }
  // A non-plain token is in both tries: the second chains its tokens through links of its own.
  std::vector<int32_t> links(static_cast<size_t>(vocab), -1);
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id) || (v->plain_mask_[id >> 5] >> (id & 31) & 1)) continue;
    const std::optional<std::string> bytes = tokenizer.token_bytes(id);
    if (bytes && !bytes->empty()) v->non_plain_.insert(*bytes, id, links);
  }
  v->non_plain_links_ = std::move(links);
  return v;
}

void TokenMasker::walk(const JsonMatcher& m, const TokenVocabulary::Trie& trie, int32_t node,
                       const std::vector<Stack>& states, std::vector<uint32_t>& mask) const {
  const std::vector<int32_t>& links = &trie == &vocab_->trie_ ? vocab_->next_token_ : vocab_->non_plain_links_;
  std::vector<Stack> next;
  for (int32_t child = trie.nodes[node].first_child; child >= 0; child = trie.nodes[child].next_sibling) {
    next.clear();
    m.step(states, trie.nodes[child].byte, next);
    if (next.empty()) continue;
    for (int32_t t = trie.nodes[child].first_token; t >= 0; t = links[t]) set_bit(mask, t);
    walk(m, trie, child, next, mask);
  }
}

const std::vector<uint32_t>& TokenMasker::stack_mask(const JsonMatcher& m, const Stack& s) {
  const JsonSchema* schema = &m.schema();
  std::string key(reinterpret_cast<const char*>(&schema), sizeof(schema));
  key += m.stack_key(s);
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    ++hits_;
    lru_.splice(lru_.end(), lru_, it->second.lru);
    return it->second.mask;
  }
  ++misses_;
  std::vector<uint32_t> mask(static_cast<size_t>(vocab_->words()), 0);
  int32_t room = 0;
  if (m.in_plain_string(s, &room)) {
    if (room == std::numeric_limits<int32_t>::max()) {
      mask = vocab_->plain_mask_;
    } else {
      for (const auto& [t, cps] : vocab_->plain_code_points_)
        if (cps <= room) set_bit(mask, t);
    }
    walk(m, vocab_->non_plain_, 0, {s}, mask);
  } else {
    walk(m, vocab_->trie_, 0, {s}, mask);
  }
  if (cache_.size() >= max_cached_) {  // forget the least recently used
    cache_.erase(lru_.front());
    lru_.pop_front();
  }
  lru_.push_back(key);
  Entry& e = cache_[key];
  e.schema = m.shared_schema();
  e.mask = std::move(mask);
  e.lru = std::prev(lru_.end());
  return e.mask;
}

void TokenMasker::allowed(const JsonMatcher& m, const std::vector<int32_t>& end_ids, uint32_t* mask) {
  const int32_t words = vocab_->words();
  std::memset(mask, 0, static_cast<size_t>(words) * 4);
  for (const Stack& s : m.stacks()) {
    const std::vector<uint32_t>& sm = stack_mask(m, s);
    for (int32_t w = 0; w < words; ++w) mask[w] |= sm[w];
  }
  if (m.can_end())
    for (int32_t t : end_ids)
      if (t >= 0 && t < vocab_->vocab()) mask[t >> 5] |= uint32_t(1) << (t & 31);
}

}  // namespace kiln::structured
