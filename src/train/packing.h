// Packing documents into training rows of at most seq_len tokens.
//
// Documents longer than seq_len are first split into seq_len-token pieces (the last one shorter);
// the first token of every piece stops being a target, since nothing before it is in its row.
// Packed: best-fit-decreasing — pieces in decreasing length (ties in input order), each put into
// the open row with the least room that still fits it, or a new row — then the rows put in a seeded
// order, so that a sequential pass does not see long documents first. Unpacked (--no-pack): one
// piece per row, in input order. The result depends only on the input order and the seed.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "train/shards.h"

namespace kiln {

struct PackedRows {
  std::vector<TokenDocument> pieces;       // documents after splitting
  std::vector<std::vector<int32_t>> rows;  // per row: indices into pieces, in row order
  int64_t tokens = 0;                      // sum of piece lengths
  int64_t split_documents = 0;             // documents that were longer than seq_len
  // tokens / (rows * seq_len): the fraction of the row capacity that holds data.
  double efficiency(int32_t seq_len) const {
    return rows.empty() ? 0.0 : static_cast<double>(tokens) / (static_cast<double>(rows.size()) * seq_len);
  }
};

// Consumes `documents` (each non-empty). seq_len > 0.
PackedRows pack_documents(std::vector<TokenDocument> documents, int32_t seq_len, bool pack, uint64_t seed);

}  // namespace kiln
