// Scoring: the log-probability of every token of a sequence given its prefix (prompt
// log-probabilities), in chunked forwards over one contiguous KV page. Not generation: it runs the
// model directly rather than through the engine.
// Thread safety: none; one thread drives the model.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/transformer.h"

namespace kiln {

struct ScoreResult {
  // logprobs[t-1] = log p(ids[t] | ids[0..t-1]) for t = 1 .. n-1
  std::vector<float> logprobs;
  // top[t-1] = the k most likely tokens at position t, (id, logprob) in descending order
  std::vector<std::vector<std::pair<int32_t, float>>> top;
};

// Prompt log-probabilities of `ids` under `model`, in forwards of `chunk` tokens.
Result<ScoreResult> score(const Transformer& model, const std::vector<int32_t>& ids, int32_t top_k,
                          int32_t chunk = 2048);

// Checks that every id is in [0, vocab); an error naming the first bad id and its index.
Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what);

}  // namespace kiln
