// Packing (see packing.h).
#include "train/packing.h"

#include <algorithm>
#include <map>

#include "train/shuffle.h"

namespace kiln {

PackedRows pack_documents(std::vector<TokenDocument> documents, int32_t seq_len, bool pack, uint64_t seed) {
  PackedRows out;
  for (TokenDocument& d : documents) {
    const int64_t n = static_cast<int64_t>(d.ids.size());
    out.tokens += n;
    d.mask[0] = 0;  // nothing before a document's first token in its row
    if (n <= seq_len) {
      out.pieces.push_back(std::move(d));
      continue;
    }
    ++out.split_documents;
    for (int64_t begin = 0; begin < n; begin += seq_len) {
      const int64_t end = std::min<int64_t>(n, begin + seq_len);
      TokenDocument piece;
      piece.ids.assign(d.ids.begin() + begin, d.ids.begin() + end);
      piece.mask.assign(d.mask.begin() + begin, d.mask.begin() + end);
      piece.mask[0] = 0;
      out.pieces.push_back(std::move(piece));
    }
    d = TokenDocument{};
  }
  const int32_t n_pieces = static_cast<int32_t>(out.pieces.size());
  if (!pack) {
    for (int32_t i = 0; i < n_pieces; ++i) out.rows.push_back({i});
    return out;
  }
  std::vector<int32_t> order(static_cast<size_t>(n_pieces));
  for (int32_t i = 0; i < n_pieces; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return out.pieces[a].ids.size() > out.pieces[b].ids.size();
  });
  std::multimap<int64_t, int32_t> room;  // free tokens -> row; equal keys in insertion order
  for (int32_t p : order) {
    const int64_t len = static_cast<int64_t>(out.pieces[p].ids.size());
    auto it = room.lower_bound(len);
    int32_t row = 0;
    int64_t left = 0;
    if (it == room.end()) {
      row = static_cast<int32_t>(out.rows.size());
      out.rows.emplace_back();
      left = seq_len - len;
    } else {
      row = it->second;
      left = it->first - len;
      room.erase(it);
    }
    out.rows[row].push_back(p);
    if (left > 0) room.emplace(left, row);
  }
  seeded_shuffle(out.rows, seed, /*stream=*/0x7061636bull);
  return out;
}

}  // namespace kiln
