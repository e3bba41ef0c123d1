// Training rows of RL steps: each sequence (a prompt and one completion) becomes one row of a dense
// micro-batch, padded to the micro-batch's longest row, with targets only on the completion's
// tokens, so the micro-batch's labelled rows are the completions' tokens, sequence after sequence.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "train/train_model.h"

namespace kiln::rl {

struct SequenceRef {
  const std::vector<int32_t>* prompt = nullptr;
  const std::vector<int32_t>* completion = nullptr;
};

// One micro-batch of the sequences, in order. A completion's token i is predicted at position
// prompt.size() - 1 + i.
HostBatch sequence_batch(const std::vector<SequenceRef>& sequences);

}  // namespace kiln::rl
