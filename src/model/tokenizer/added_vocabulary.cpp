// Added tokens (tokenizer.json "added_tokens"), matched before the model runs exactly like
// tokenizers' AddedVocabulary: a leftmost-longest trie over the non-normalized tokens on the raw
// text, then one over the normalized tokens on each normalized piece; single_word, lstrip and rstrip
// as there. Immutable after init(); thread-safe.
#include "model/tokenizer/components.h"

namespace kiln::tok {

void AddedVocabulary::Trie::add(std::string_view s, int32_t index) {
  if (s.empty()) return;
  first_byte[static_cast<unsigned char>(s[0])] = true;
  int32_t node = 0;
  for (unsigned char c : s) {
    int32_t child = -1;
    for (auto [b, n] : nodes[static_cast<size_t>(node)].next)
      if (b == c) { child = n; break; }
    if (child < 0) {
      child = static_cast<int32_t>(nodes.size());
      nodes[static_cast<size_t>(node)].next.emplace_back(c, child);
      nodes.emplace_back();
    }
    node = child;
  }
  if (nodes[static_cast<size_t>(node)].token < 0) nodes[static_cast<size_t>(node)].token = index;
}

void AddedVocabulary::init(std::vector<AddedToken> tokens, const Normalizer* normalizer) {
  tokens_ = std::move(tokens);
  for (auto& t : tokens_) {
    t.decoded = t.content;
    if (t.normalized && normalizer) normalizer->normalize(t.decoded);  // as tokenizers' id_to_token
  }
  // tokenizers builds its tries from the special tokens first, then the others (each in file order).
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t k = 0; k < tokens_.size(); ++k) {
      const AddedToken& t = tokens_[k];
      if (t.special != (pass == 0)) continue;
      if (t.normalized) {
        normalized_trie_.add(t.decoded, static_cast<int32_t>(k));
      } else {
        raw_trie_.add(t.content, static_cast<int32_t>(k));
      }
    }
  }
}

namespace {
// The last character of s, or 0 when s is empty.
char32_t last_cp(std::string_view s) {
  if (s.empty()) return 0;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return next_cp(s, k);
}
bool ends_with_word(std::string_view s) { return !s.empty() && is_word_character(last_cp(s)); }
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return is_word_character(next_cp(s, i));
}
// Start of the run of whitespace that ends s.
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t k = end - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t j = k;
    if (!is_whitespace(next_cp(s, j))) break;
    end = k;
  }
  return end;
}
// Length of the run of whitespace that starts s.
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_whitespace(next_cp(s, j))) break;
    i = j;
  }
  return i;
}
}  // namespace

void AddedVocabulary::find_matches(std::string_view s, const Trie& trie, std::vector<Match>& out) const {
  out.clear();
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    // Leftmost-longest: the first position with any match, and its longest match.
    size_t mstart = 0, mstop = 0;
    int32_t mtok = -1;
    for (size_t i = pos; i < s.size(); ++i) {
      if (!trie.first_byte[static_cast<unsigned char>(s[i])]) continue;
      int32_t node = 0;
      for (size_t k = i; k < s.size(); ++k) {
        int32_t child = -1;
        for (auto [b, n] : trie.nodes[static_cast<size_t>(node)].next)
          if (b == static_cast<unsigned char>(s[k])) { child = n; break; }
        if (child < 0) break;
        node = child;
        if (trie.nodes[static_cast<size_t>(node)].token >= 0) {
          mtok = trie.nodes[static_cast<size_t>(node)].token;
          mstart = i;
          mstop = k + 1;
        }
      }
      if (mtok >= 0) break;
    }
    if (mtok < 0) break;
    pos = mstop;
    const AddedToken& t = tokens_[static_cast<size_t>(mtok)];
    size_t start = mstart, stop = mstop;
    if (t.single_word) {
      bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(space_leftmost_at_end(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += space_rightmost_at_start(s.substr(stop));
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({mtok, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
}

void AddedVocabulary::extract_and_normalize(std::string_view text, const Normalizer* normalizer,
                                            std::vector<Piece>& out) const {
  out.clear();
  std::vector<Match> raw, norm;
  if (raw_trie_.empty()) raw.push_back({-1, 0, text.size()});
  else find_matches(text, raw_trie_, raw);
  for (const Match& r : raw) {
    if (r.token >= 0) {
      out.push_back({tokens_[static_cast<size_t>(r.token)].id, {}, false});
      continue;
    }
    std::string piece(text.substr(r.start, r.stop - r.start));
    if (normalizer) normalizer->normalize(piece);
    bool at_start = r.start == 0;
    if (piece.empty()) continue;
    if (normalized_trie_.empty()) {
      out.push_back({-1, std::move(piece), at_start});
      continue;
    }
    find_matches(piece, normalized_trie_, norm);
    for (const Match& n : norm) {
      if (n.token >= 0) out.push_back({tokens_[static_cast<size_t>(n.token)].id, {}, false});
      else if (n.stop > n.start) out.push_back({-1, piece.substr(n.start, n.stop - n.start), at_start && n.start == 0});
    }
  }
}

Status AddedVocabulary::extract_and_normalize_aligned(std::string_view text, const Normalizer* normalizer,
                                                     std::vector<Piece>& out) const {
  out.clear();
  std::vector<Match> raw, norm;
  if (raw_trie_.empty()) raw.push_back({-1, 0, text.size()});
  else find_matches(text, raw_trie_, raw);
  for (const Match& r : raw) {
    if (r.token >= 0) {  // matched on the input itself: its span is the match (with lstrip/rstrip)
      Piece p;
      p.token = tokens_[static_cast<size_t>(r.token)].id;
      p.span = {static_cast<uint32_t>(r.start), static_cast<uint32_t>(r.stop)};
      out.push_back(std::move(p));
      continue;
    }
    std::string piece(text.substr(r.start, r.stop - r.start));
    Alignment al;
    identity_alignment(piece, static_cast<uint32_t>(r.start), al);
    if (normalizer) KILN_RETURN_IF_ERROR(normalizer->normalize_aligned(piece, al));
    bool at_start = r.start == 0;
    if (piece.empty()) continue;
    if (normalized_trie_.empty()) {
      out.push_back({-1, std::move(piece), at_start, std::move(al), {}});
      continue;
    }
    find_matches(piece, normalized_trie_, norm);
    for (const Match& n : norm) {
      if (n.stop <= n.start) continue;
      Piece p;
      if (n.token >= 0) {
        p.token = tokens_[static_cast<size_t>(n.token)].id;
        p.span = {al[n.start].begin, al[n.stop - 1].end};
      } else {
        p.text = piece.substr(n.start, n.stop - n.start);
        p.at_start = at_start && n.start == 0;
        p.align.assign(al.begin() + static_cast<std::ptrdiff_t>(n.start), al.begin() + static_cast<std::ptrdiff_t>(n.stop));
      }
      out.push_back(std::move(p));
    }
  }
  return Status::Ok();
}

}  // namespace kiln::tok
