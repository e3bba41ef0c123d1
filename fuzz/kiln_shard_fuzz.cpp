// Fuzz target (fuzz_common.h): the input is a kiln shard file (train/shards.h). Opening may fail
// with a Status; a shard that opens must be readable row by row, every row non-empty, its document
// starts inside it and beginning at 0, ids and mask as long as the row.
#include "fuzz_common.h"
#include "train/shards.h"

int kiln::fuzz::kiln_shard(const uint8_t* data, size_t size) {
  Result<Shard> shard = Shard::open(write_input("kiln_shard", data, size));
  if (!shard.ok()) return 0;
  int64_t tokens = 0, documents = 0;
  for (int64_t r = 0; r < shard->rows(); ++r) {
    const ShardRow row = shard->row(r);
    if (row.ids.empty() || row.ids.size() != row.mask.size()) invariant_failed("kiln_shard", "a row is empty or its mask differs in length");
    if (row.doc_starts.empty() || row.doc_starts[0] != 0) invariant_failed("kiln_shard", "a row does not start a document");
    for (size_t d = 1; d < row.doc_starts.size(); ++d)
      if (row.doc_starts[d] <= row.doc_starts[d - 1] || row.doc_starts[d] >= static_cast<int32_t>(row.ids.size()))
        invariant_failed("kiln_shard", "document starts out of order or outside the row");
    tokens += static_cast<int64_t>(row.ids.size());
    documents += static_cast<int64_t>(row.doc_starts.size());
  }
  if (tokens != shard->tokens() || documents != shard->documents()) invariant_failed("kiln_shard", "rows do not add up to the header");
  return 0;
}

KILN_FUZZ_ENTRY(kiln_shard)
