// The BPE model of tokenizer.json, merging exactly like tokenizers' Word::merge_all (a priority
// queue over (rank, position) on a linked list of symbols), with unk/fuse_unk, byte_fallback,
// continuing_subword_prefix, end_of_word_suffix and ignore_merges. Words shorter than 256 bytes are
// cached (bounded; guarded by a shared mutex), so the model is safe to use from several threads.
#include <queue>

#include "core/json_text.h"
#include "model/tokenizer/components.h"

namespace kiln::tok {

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& j, const std::string& source) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  if (!j.contains("vocab") || !j["vocab"].is_object())
    return config_error(source, "model BPE has no \"vocab\" object");
  int32_t max_id = -1;
  m->vocab_.reserve(j["vocab"].size());
  for (const auto& [k, v] : j["vocab"].items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTokenId)
      return config_error(source, "model vocab entry '" + k + "' has no valid id (0 to " + std::to_string(kMaxTokenId) + ")");
    int32_t id = v.get<int32_t>();
    m->vocab_[k] = id;
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [k, id] : m->vocab_) m->id_to_token_[static_cast<size_t>(id)] = k;

  auto opt_string = [&](const char* key) -> std::optional<std::string> {
    if (j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
    return std::nullopt;
  };
  m->unk_token_ = opt_string("unk_token");
  if (auto p = opt_string("continuing_subword_prefix")) { m->prefix_ = *p; m->has_prefix_ = true; }
  if (auto s = opt_string("end_of_word_suffix")) { m->suffix_ = *s; m->has_suffix_ = true; }
  m->fuse_unk_ = j.value("fuse_unk", false);
  m->byte_fallback_ = j.value("byte_fallback", false);
  m->ignore_merges_ = j.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto id = m->find(name);
    m->byte_ids_[b] = id ? *id : -1;
  }

  const Json& merges = j.value("merges", Json::array());
  m->merges_.reserve(merges.size() * 2);
  int32_t rank = 0;
  for (const auto& mj : merges) {
    std::string a, b;
    if (mj.is_string()) {
      std::string line = mj;
      size_t sp = line.find(' ');
      if (sp == std::string::npos) return config_error(source, "merge '" + line + "' is not of the form 'a b'");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0];
      b = mj[1];
    } else {
      return config_error(source, "a merge is neither \"a b\" nor [\"a\", \"b\"]: " + json_brief(mj));
    }
    auto ia = m->find(a), ib = m->find(b);
    if (!ia || !ib) return config_error(source, "merge token '" + (ia ? b : a) + "' is not in the vocab");
    // tokenizers drops prefix-length bytes from b whether or not b starts with the prefix.
    std::string merged = a + (m->has_prefix_ ? b.substr(std::min(b.size(), m->prefix_.size())) : b);
    auto inew = m->find(merged);
    if (!inew) return config_error(source, "merged token '" + merged + "' is not in the vocab");
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(*ia)) << 32) | static_cast<uint32_t>(*ib);
    m->merges_[key] = MergeValue{rank, *inew};
    ++rank;
  }
  return m;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = find(word)) { out.push_back(*id); return; }
  }
  bool cacheable = word.size() < kCacheMaxWord;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word<false>(word, out, nullptr);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + start, out.end()));
  }
}

void BpeModel::tokenize_with_lengths(std::string_view word, std::vector<int32_t>& out, std::vector<uint32_t>& lengths) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = find(word)) {
      out.push_back(*id);
      lengths.push_back(static_cast<uint32_t>(word.size()));
      return;
    }
  }
  merge_word<true>(word, out, &lengths);
}

// kLengths: also track each symbol's length in bytes of the word (tokenizers' Symbol::len: a
// character's length, 1 for a byte-fallback token, the fused characters for a fused unk).
template <bool kLengths>
void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out, std::vector<uint32_t>* lengths) const {
  struct Symbol { int32_t id; int32_t prev, next; bool alive; };
  std::vector<Symbol> sym;
  std::vector<uint32_t> len;  // kLengths: per symbol
  sym.reserve(w.size());
  if constexpr (kLengths) len.reserve(w.size());
  auto add = [&](int32_t id, uint32_t bytes) {
    int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if constexpr (kLengths) len.push_back(bytes);
    else (void)bytes;
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  };
  int32_t unk = -1;  // pending unknown id (fuse_unk extends it)
  uint32_t unk_len = 0;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t n = utf8_len(static_cast<unsigned char>(w[i]));
    bool is_first = i == 0, is_last = i + n >= w.size();
    std::string_view ch = w.substr(i, n);
    i += n;
    std::optional<int32_t> id;
    if ((has_prefix_ && !is_first) || (has_suffix_ && is_last)) {
      s.clear();
      if (has_prefix_ && !is_first) s += prefix_;
      s.append(ch);
      if (has_suffix_ && is_last) s += suffix_;
      id = find(s);
    } else {
      s.assign(ch);
      id = find(ch);
    }
    if (id) {
      if (unk >= 0) { add(unk, unk_len); unk = -1; }
      add(*id, static_cast<uint32_t>(n));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        // tokenizers pushes these without flushing a pending unk first; keep its order.
        for (unsigned char c : s) add(byte_ids_[c], 1);
        continue;
      }
    }
    if (unk_token_) {
      auto unk_id = find(*unk_token_);
      if (!unk_id) continue;  // tokenizers errors here; a vocab without its unk token drops the char
      if (unk >= 0 && fuse_unk_) { unk_len += static_cast<uint32_t>(n); continue; }
      if (unk >= 0) add(unk, unk_len);
      unk = *unk_id;
      unk_len = static_cast<uint32_t>(n);
    }
  }
  if (unk >= 0) add(unk, unk_len);

  struct Merge {
    int32_t pos, rank, new_id;
    bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  auto lookup = [&](int32_t a, int32_t b) -> const MergeValue* {
    auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  if (sym.size() > 1) {
    std::vector<Merge> storage;
    storage.reserve(sym.size() * 2);
    std::priority_queue<Merge, std::vector<Merge>> queue(std::less<Merge>(), std::move(storage));
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      if (auto* m = lookup(sym[k].id, sym[k + 1].id)) queue.push({static_cast<int32_t>(k), m->rank, m->new_id});
    }
    while (!queue.empty()) {
      Merge top = queue.top();
      queue.pop();
      Symbol& cur = sym[static_cast<size_t>(top.pos)];
      if (!cur.alive || cur.next == -1) continue;
      int32_t next_pos = cur.next;
      Symbol right = sym[static_cast<size_t>(next_pos)];
      auto* m = lookup(cur.id, right.id);
      if (!m || m->new_id != top.new_id) continue;
      cur.id = top.new_id;
      cur.next = right.next;
      if constexpr (kLengths) len[static_cast<size_t>(top.pos)] += len[static_cast<size_t>(next_pos)];
      sym[static_cast<size_t>(next_pos)].alive = false;
      if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
      if (cur.prev >= 0) {
        if (auto* pm = lookup(sym[static_cast<size_t>(cur.prev)].id, cur.id)) queue.push({cur.prev, pm->rank, pm->new_id});
      }
      if (cur.next >= 0) {
        if (auto* nm = lookup(cur.id, sym[static_cast<size_t>(cur.next)].id)) queue.push({top.pos, nm->rank, nm->new_id});
      }
    }
  }
  for (size_t k = 0; k < sym.size(); ++k) {
    if (!sym[k].alive) continue;
    out.push_back(sym[k].id);
    if constexpr (kLengths) lengths->push_back(len[k]);
  }
}

}  // namespace kiln::tok
