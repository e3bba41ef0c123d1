// Generator: prompt-in, tokens-out generation for one sequence over a contiguous KV cache, and
// scoring (prompt log-probabilities). The seed of the inference engine: the paged, continuously
// batched engine replaces the single-sequence cache later, but keeps this step shape (packed
// inputs, one forward per step, sampling on the device, CUDA-graph replay of the decode step).
//
// Decode steps on CUDA are captured once per context-length bucket (a power of two) and replayed:
// the step inputs (positions, slots, indptr arrays) are copied into recorded device buffers, the
// token fed to the next step is the sampler's output buffer itself, so a step moves 4 bytes back to
// the host and allocates nothing.
// Thread safety: none; one thread drives a Generator.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/transformer.h"

namespace kiln {

struct GenerateOptions {
  int32_t max_new_tokens = 16;
  ops::SamplingRow sampling;          // temperature 0 = greedy; `position` is filled per token
  std::vector<int32_t> stop_ids;      // stop after emitting one of these (it is included)
  bool use_graphs = true;             // replay captured decode steps where the backend can
};

struct GenerateResult {
  std::vector<int32_t> tokens;        // generated ids (not the prompt)
  std::string finish_reason;          // "length" or "stop"
};

// Receives each new token as soon as it is sampled; return false to stop early.
using TokenCallback = std::function<bool(int32_t token)>;
// Receives the f32 logits [vocab] (host copy) that produced each new token; for tests.
using LogitsCallback = std::function<void(const float* logits, int64_t vocab)>;

class Generator {
 public:
  // A generator for sequences of up to `max_context` tokens (prompt + generated).
  static Result<std::unique_ptr<Generator>> create(const Transformer& model, int32_t max_context);

  Result<GenerateResult> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                  const TokenCallback& on_token = nullptr,
                                  const LogitsCallback& on_logits = nullptr);

  // Runs the prompt through the model (in chunks of the workspace's token budget), leaves it in
  // the cache and samples the first new token (last_token()).
  Status prefill(const std::vector<int32_t>& prompt);
  // One decode step after prefill()/decode_step(): feeds the last sampled token, samples the next.
  Status decode_step();
  int32_t context_length() const { return length_; }
  int32_t last_token() const { return last_token_; }

 private:
  Generator(const Transformer& model, int32_t max_context) : model_(model), max_context_(max_context) {}
  Status init();
  // Copies positions/slots/indptr (and ids unless they come from the sampler's buffer) for a step
  // of new tokens at context `length_` to the device.
  void stage_inputs(const std::vector<int32_t>& ids, bool ids_from_device);
  ForwardBatch batch_for(int32_t n_new, bool ids_from_device, int32_t kv_bound);
  Status sample_and_fetch();

  const Transformer& model_;
  Backend& be() const { return model_.backend(); }
  int32_t max_context_;
  int32_t length_ = 0;         // tokens in the cache
  int32_t last_token_ = -1;
  ops::SamplingRow sampling_;
  LogitsCallback on_logits_;
  KVCache cache_;
  ForwardWorkspace ws_;
  // The packed step inputs (layout in generator.cpp: pack_step) on the device and their host twin.
  TensorBuffer inputs_dev_, inputs_host_;
  TensorBuffer token_dev_;     // [1] i32: the sampled token, fed back as the next step's id
  TensorBuffer sampling_host_, sampling_dev_;  // [1, kSamplingRowWords] i32: the sampler's row
  TensorBuffer sampling_ws_;   // the sampler's workspace
  Tensor logits_;              // [1, vocab] f32 view of the last forward's logits
  std::map<int32_t, std::unique_ptr<CapturedWork>> decode_graphs_;  // by context bucket
  bool use_graphs_ = true;
};

struct ScoreResult {
  // logprobs[t-1] = log p(ids[t] | ids[0..t-1]) for t = 1 .. n-1
  std::vector<float> logprobs;
  // top[t-1] = the k most likely tokens at position t, (id, logprob) in descending order
  std::vector<std::vector<std::pair<int32_t, float>>> top;
};

// Prompt log-probabilities of `ids` under `model`, in one forward (chunked by `chunk` tokens).
Result<ScoreResult> score(const Transformer& model, const std::vector<int32_t>& ids, int32_t top_k,
                          int32_t chunk = 2048);

// Checks that every id is in [0, vocab); an error naming the first bad id and its index.
Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, const char* what);

}  // namespace kiln
