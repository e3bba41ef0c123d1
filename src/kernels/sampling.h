// Token sampling for a batch of requests, each row with its own parameters, in one call that never
// allocates, never copies to the host and never synchronises: the parameters live on the device (a
// fixed buffer the engine rewrites each step), so sampled decode steps are captured in CUDA graphs.
// CPU twin (kernels/cpu/sampling.cpp) and CUDA twin (kernels/cuda/sampling.cu) follow one algorithm,
// stated in full in the CPU twin's header comment, with the arithmetic of kernels/sampling_math.h:
// both give the same token for the same inputs. The whole vocabulary is never sorted: cuts are
// found by histograms (radix selection), masses are exact fixed-point integer sums.
//
// Per row b (logits [B, V] f32, the model's raw output):
//   penalties (from the row's token counts, see below) -> greedy argmax, or temperature, top-k,
//   top-p, min-p, and a draw with u = rng::uniform(seed, position). The sampled token depends only
//   on the row's logits, parameters, counts, seed and position: never on the other rows.
//   Log-probabilities (when asked) are of the raw logits (temperature 1, no penalties): the chosen
//   token's, and the top-N alternatives (descending, ties by lower index). A row may instead ask
//   for the chosen token's "behaviour" log-probability (logprobs == kLogprobsSampled): the log of
//   the probability the draw gave it, under the distribution it was drawn from (penalties,
//   temperature, top-k, top-p and min-p applied), as reinforcement learning needs; 0 where the
//   token was not drawn (greedy, no finite maximum, nothing kept). Its top-N stay raw.
//
// Valid parameters (the engine checks them; the op only reads them on the device): temperature
// finite (<= 0: greedy); top_p in (0, 1]; min_p in [0, 1]; repetition_penalty > 0 and finite;
// frequency/presence penalties finite; top_logprobs in [0, kMaxTopLogprobs]; counts_row -1 or a row
// of `counts`, distinct across the rows of one call; position >= 0. Out of range values give
// defined but meaningless tokens (never an out-of-bounds access).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace kiln::ops {

constexpr int32_t kMaxTopLogprobs = 20;  // top-N alternatives per token, as the OpenAI API allows
constexpr int32_t kMaxLogitBias = 1024;  // logit biases per request (adjust_logits)

// SamplingRow::logprobs values.
constexpr int32_t kLogprobsOff = 0;
constexpr int32_t kLogprobsRaw = 1;      // log p(token) of the raw logits
constexpr int32_t kLogprobsSampled = 2;  // log of the probability the sampler drew the token with

// One row's parameters as stored on the device (plain 4-byte words: an i32 tensor [B, kSamplingRowWords]
// reinterpreted). Defaults switch every feature off.
struct SamplingRow {
  float temperature = 0.0f;         // <= 0: greedy (argmax of the penalised logits, lowest index on ties)
  int32_t top_k = 0;                // <= 0: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off; keeps p >= min_p * max p
  float repetition_penalty = 1.0f;  // tokens of prompt or output: logit > 0 ? logit / r : logit * r
  float frequency_penalty = 0.0f;   // logit -= f * (count in output)
  float presence_penalty = 0.0f;    // logit -= p * (count in output > 0)
  int32_t logprobs = 0;             // write the chosen token's log-probability: kLogprobsRaw (1): of
                                    //   the raw logits; kLogprobsSampled (2): log(w_token / M), the
                                    //   probability the draw gave it after penalties, temperature and
                                    //   cuts (0 for a greedy row, a row without a finite maximum or one
                                    //   that kept nothing: a point mass); other nonzero values: raw
  int32_t top_logprobs = 0;         // 0 .. kMaxTopLogprobs alternatives (also writes logprobs[b])
  int32_t counts_row = -1;          // row of the token-count table (penalties), -1: none
  uint32_t seed_lo = 0, seed_hi = 0;  // the request's seed
  int32_t position = 0;             // absolute position of the token being drawn (prompt + output so far)
  int32_t mask_offset = -1;         // >= 0: the row's token mask starts at this word of adjust_logits'
                                    //   mask_words (constrained decoding); -1: none
  int32_t bias_offset = -1;         // >= 0: the row's logit biases start at this word of adjust_logits'
  int32_t bias_count = 0;           //   mask_words: bias_count (token id, f32 bias) word pairs; -1: none
};
constexpr int64_t kSamplingRowWords = sizeof(SamplingRow) / 4;
static_assert(sizeof(SamplingRow) % 4 == 0);

// The device buffers of one sampling call. `tokens` and the log-prob outputs have B rows.
struct SamplingBatch {
  Tensor logits;        // [B, V] f32, read only
  Tensor params;        // [B, kSamplingRowWords] i32 (SamplingRow per row)
  Tensor counts;        // [rows, V] i32 token counts or empty when no row has penalties: per
                        //   request row, (occurrences of v among its generated tokens) plus
                        //   kPromptBit when v occurs in its prompt. The call adds the sampled
                        //   token of every row with counts_row >= 0 (+1), so counts stay current.
  Tensor tokens;        // [B] i32 out
  Tensor logprobs;      // [B] f32 out (rows that ask; others untouched); may be empty if none ask
  Tensor top_ids;       // [B, kMaxTopLogprobs] i32 out; may be empty if none ask
  Tensor top_logprobs;  // [B, kMaxTopLogprobs] f32 out
  Tensor workspace;     // sampling_workspace_bytes(B, V) bytes (u8 / any dtype), scratch
  // Host-side: false when every row is greedy without penalties or log-probs (only the argmax
  // kernel runs; it still counts the token in counts rows). A graph captured with `full` true
  // serves every parameter mix.
  bool full = true;
};
constexpr int32_t kPromptBit = 1 << 30;

// The request seed of a row, as one 64-bit value.
inline uint64_t sampling_seed(const SamplingRow& r) { return uint64_t(r.seed_lo) | (uint64_t(r.seed_hi) << 32); }
inline void set_sampling_seed(SamplingRow& r, uint64_t seed) {
  r.seed_lo = static_cast<uint32_t>(seed);
  r.seed_hi = static_cast<uint32_t>(seed >> 32);
}

// Scratch bytes a call with up to `batch` rows of `vocab` logits needs (about 8 * vocab per row).
int64_t sampling_workspace_bytes(int64_t batch, int64_t vocab);

// tokens[b] = the token of row b; then counts[counts_row][token] += 1 for rows with counts_row >= 0
// (when `counts` is given). Log-probabilities go to rows that ask (logprobs != 0 or top_logprobs > 0)
// when the output tensors are given: logprobs[b] = log p(token), top_ids/top_logprobs[b][0 .. N) the
// N = top_logprobs most likely tokens (slots past V hold id -1, log-prob -inf); other entries are
// left untouched. A row whose raw logits have no finite maximum reports 0 for the tokens equal to it
// and -inf for the others. With logprobs == kLogprobsSampled, logprobs[b] is instead the behaviour
// log-probability: (float)(log((double)w_token) - log((double)M)) with the token's fixed-point kept
// weight w_token and the kept mass M of the draw (the CPU twin's step 9), 0 when there was no draw
// (greedy, no finite maximum, M == 0); its top-N are still of the raw logits. The twins compute it
// from the same integers with one double log each, so they differ at most by the rounding of log.
// V in [1, 2^23); `workspace` is needed only when `full` is true.
void sample(Backend& be, const SamplingBatch& batch);

// Rebuilds one request's counts row: zero, then kPromptBit for every prompt id and +1 for every
// output id (ids outside [0, V) are ignored). counts_row: [V] i32 (a row of the table); prompt,
// output: [n] i32 on the device (may be empty).
void reset_token_counts(Backend& be, Tensor counts_row, Tensor prompt, Tensor output);

// A request's constraints on its logits, before sample(), so every later step (penalties, cuts, raw
// and behaviour log-probabilities, top-N) sees the adjusted distribution. For each row b whose
// params give mask_offset >= 0 (constrained decoding): logits[b][v] = -inf for every token v whose
// bit (v % 32 of word mask_offset + v / 32 of mask_words) is clear; set bits are untouched. Then,
// for rows with bias_offset >= 0 (a request's logit_bias): for each of the bias_count word pairs
// (id, bits of an f32 bias) from word bias_offset, logits[b][id] += bias where id is in [0, V) and
// not masked out (a masked token stays -inf); the ids of a row are distinct. Other rows are
// untouched. logits: [B, V] f32 (written in place); params: [B, kSamplingRowWords] i32; mask_words:
// [n] i32 (words past n read as 0).
void adjust_logits(Backend& be, Tensor logits, Tensor params, Tensor mask_words);

// The uniform draw of sample(): u in [0, 1) from (seed, position), the same on every device.
double sampling_uniform(uint64_t seed, uint64_t position);

}  // namespace kiln::ops
