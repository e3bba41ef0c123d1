// Pre-tokenized training data: JSONL files of {"input_ids": [...], "labels": [...],
// "position_ids": [...]} (labels and position_ids optional), validated against a model's config,
// and their assembly into dense micro-batches.
//
// Semantics (Hugging Face's): `labels` has the length of `input_ids` and position t is trained to
// predict labels[t + 1]; -100 masks a position. Without labels every next token counts, except
// across a document boundary. `position_ids` gives the rotary positions; wherever it is 0 (after
// the first token) a new document begins, and attention does not cross documents.
//
// Ownership: plain values. Thread safety: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "train/train_model.h"

namespace kiln {

struct TrainExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;        // empty: next-token labels
  std::vector<int32_t> position_ids;  // empty: 0 .. n-1, one document
  int64_t line = 0;                   // 1-based line in the source file, for messages
};

// Reads and validates every line; errors name the file and line: not JSON, not an object, missing
// or empty input_ids, non-integer entries, ids or labels outside the vocabulary (labels may be
// -100), length mismatches, negative positions, sequences longer than the context length.
// Blank lines are skipped.
Result<std::vector<TrainExample>> read_training_jsonl(const std::string& path, const ModelConfig& config);

// One dense micro-batch of these examples, padded at the end of each row to the longest.
HostBatch make_host_batch(const std::vector<const TrainExample*>& rows);

}  // namespace kiln
