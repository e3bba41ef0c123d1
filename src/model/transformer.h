// Transformer: the decoder-only causal language models kiln loads from Hugging Face checkpoints
// (Llama, Mistral, Qwen2 with q/k/v biases, Qwen3 with q/k norms), holding its weights on one
// backend in the compute dtype (f32 on the CPU, bf16 on CUDA).
//
// forward() runs one packed batch (the inference layout): the tokens of all requests in a step are
// concatenated into T rows; every request's new keys/values are written into its KV cache slots and
// its queries attend causally to its whole cached context. Prefill (many tokens of one request),
// decode (one token each of many requests) and mixed steps are the same call.
//
// Weights: the model's tensor table (model/tensor_table.h) in the compute dtype, either owned by the
// Transformer (load, random) or borrowed from elsewhere (borrow: e.g. a trainer's compute copy, so
// an engine serves the trainer's current weights without a copy).
// Ownership: KVCache owns the cache memory; ForwardWorkspace owns
// the per-step activations, allocated once for a token budget and reused (so a decode step
// allocates nothing and can be captured in a CUDA graph).
// Thread safety: none; one thread drives a Transformer and its backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/tensor_table.h"

namespace kiln {

// Views of one layer's weights (borrowed from the model's tensor table; absent ones empty).
struct LayerWeights {
  Tensor input_norm;     // [H]
  Tensor qkv_proj;       // [(Hq + 2 Hkv) * D, H]: q, k, v rows (one GEMM for all three)
  Tensor qkv_bias;       // [(Hq + 2 Hkv) * D] (Qwen2 / attention_bias)
  Tensor q_norm, k_norm; // [D] (Qwen3)
  Tensor o_proj;         // [H, Hq*D]
  Tensor o_bias;         // [H] (attention_bias on Llama-style configs)
  Tensor post_norm;      // [H]
  Tensor gate_up_proj;   // [2I, H]: gate rows then up rows (one GEMM for both)
  Tensor gate_up_bias;   // [2I] (mlp_bias)
  Tensor down_proj;      // [H, I]
  Tensor down_bias;      // [H] (mlp_bias)
};

// Per-layer key/value storage of `slots` token slots: k, v [slots, Hkv, D] in the compute dtype,
// addressed through a paged view (kernels/paged_kv.h).
struct KVCache {
  int32_t slots = 0;
  std::vector<TensorBuffer> k, v;  // one per layer
};

// One packed step. Every tensor lives on the model's device; index arrays are i32.
struct ForwardBatch {
  Tensor ids;        // [T]    token ids
  Tensor positions;  // [T]    position of each token in its sequence
  Tensor slots;      // [T]    KV-cache slot each token's key/value is written to (< 0: padding, none)
  Tensor q_indptr;   // [B+1]  request b's tokens are rows q_indptr[b] .. q_indptr[b+1]
  PagedKV kv;        // request b's context (cached prefix + this step's tokens) in the cache's pages
  Tensor logit_rows; // [R]    rows of T whose logits are wanted (e.g. the last token of each request)
  ops::AttentionBounds bounds;  // host-side bounds: B, longest query run, longest context
  // Optional [B+1]: request b contributes last_rows_indptr[b+1] - last_rows_indptr[b] = 0 or 1 rows.
  // When given, logit_rows must be exactly the last row of each request that contributes one (in
  // request order), and the final layer runs its attention output, MLP and norm for those rows only:
  // the other rows' final hidden states feed nothing (their keys/values are still cached).
  Tensor last_rows_indptr;
  // logit_rows is every row in order ([0, T), R == T; a decode step's): the head reads the final
  // rows where they are instead of gathering them.
  bool logits_of_every_row = false;
  // Optional [R] i32: the greedy token of each logit row (the first index of its largest logit), picked
  // by the head's kernel; only where Transformer::head_takes_greedy says the head does. The logits
  // are written too.
  Tensor greedy_tokens;
};

// Activations for up to `max_tokens` rows and `max_logit_rows` logits rows, in the compute dtype
// except the residual stream (f32) and the logits (f32).
struct ForwardWorkspace {
  int64_t max_tokens = 0, max_logit_rows = 0;
  TensorBuffer hidden, residual, normed, qkv, q, attn, proj, gate_up, act, gathered, logits;
  TensorBuffer last_q, last_residual;  // [R, Hq*D], [R, H] f32: the final layer's trimmed rows
  // The down projection's K-split f32 products, [ops::kMaxKSplitParts * min(T, 128) * H], where the
  // backend splits it (ops::linear_k_split_parts): steps of up to 128 rows add them up in the next
  // norm.
  TensorBuffer down_partials;
  // The step's rotary (cos, sin) pairs, [T, head_dim / 2, 2] f32, where the backend's
  // qkv_rope_cache_write reads them (ops::qkv_rope_reads_table): computed once for every layer.
  TensorBuffer rope_table;
  // ops::norm_linear_argmax_forward's scratch (kArgmaxScratchWords i32, zero between steps).
  TensorBuffer argmax_scratch;
  // ops::decode_step_kernel_forward's counters (kDecodeStepSyncWords i32, zero between steps), where
  // the model runs one-request decode steps on it (Transformer::uses_decode_step_kernel).
  TensorBuffer decode_step_sync;
  // With KILN_DECODE_STEP_TRACE=1 as well: its per-block step times (ops::DecodeStepArgs::trace, for
  // up to kDecodeStepTraceBlocks blocks), for profiling.
  TensorBuffer decode_step_trace;
};

struct ModelLoadOptions {
  bool random_weights = false;  // build from config.json alone with seeded random weights
  uint64_t seed = 0;
};

class Transformer {
 public:
  // Loads config.json and the safetensors weights (or random ones) of `model_dir` onto `backend`.
  static Result<std::unique_ptr<Transformer>> load(Backend& backend, const std::string& model_dir,
                                                   const ModelLoadOptions& options = {});
  // Builds a model of `config` with seeded random weights (model/tensor_table.h randomize_weights:
  // the same model TrainModel::random builds from the same config and seed).
  static Result<std::unique_ptr<Transformer>> random(Backend& backend, const ModelConfig& config, uint64_t seed);
  // Runs on weights owned elsewhere: every tensor of the config's table, in the backend's compute
  // dtype (f32 on the CPU, bf16 on CUDA), kept alive and unchanged while this model runs.
  static Result<std::unique_ptr<Transformer>> borrow(Backend& backend, const ModelConfig& config,
                                                     const ModelWeights& weights);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  DType compute_dtype() const { return dtype_; }
  int64_t parameter_count() const { return parameter_count_; }
  const ModelWeights& weights() const { return weights_; }

  Result<KVCache> make_kv_cache(int32_t slots) const;
  Result<ForwardWorkspace> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const;

  // Runs the batch; writes logits [R, vocab] f32 into ws.logits rows 0..R-1 and returns that view.
  // Batches of at most ops::kFusedLinearMaxRows tokens (decode steps) run the fused small-batch
  // layers of kernels/ops.h where the backend has them (uses_fused_layers), others the separate ops.
  Tensor forward(const ForwardBatch& batch, KVCache& cache, ForwardWorkspace& ws) const;
  bool uses_fused_layers(int64_t tokens) const;
  // Whether forward() picks the greedy tokens itself (ForwardBatch::greedy_tokens) for a step of
  // `tokens` rows and `logit_rows` logit rows: where the head is ops::norm_linear_argmax_forward's
  // preferred case. Elsewhere the caller samples the logits.
  bool head_takes_greedy(int64_t tokens, int64_t logit_rows) const;
  // Whether a step of one request's one token runs as the single decode-step kernel
  // (ops::decode_step_kernel_forward; an experiment, on where KILN_DECODE_STEP_KERNEL=1 and the
  // backend takes the model).
  bool uses_decode_step_kernel(const ForwardBatch& batch) const;

 private:
  Transformer(Backend& backend, ModelConfig config);
  Status allocate_weights();
  // Resolves the per-layer views and the rotary tables once the table is filled in.
  Status bind_weights();
  // The K-split parts of the fused path's down projection for a step of T rows (0: not split; see
  // forward()).
  int32_t down_split_parts(int64_t tokens) const;
  // Whether the decode-step kernel takes this model on its backend and KILN_DECODE_STEP_KERNEL=1 asks
  // for it (read once, when the weights are bound).
  bool decode_step_kernel_wanted() const;
  // forward() of a one-request, one-token step on the decode-step kernel (transformer_decode_step.cpp).
  Tensor forward_decode_step(const ForwardBatch& batch, KVCache& cache, ForwardWorkspace& ws) const;

  Backend& backend_;
  ModelConfig config_;
  DType dtype_;
  ModelTensorLayout layout_;
  int64_t parameter_count_ = 0;
  std::vector<TensorBuffer> owned_;  // the weights, when this model owns them
  ModelWeights weights_;
  Tensor embed_tokens_;  // [V, H]
  Tensor final_norm_;    // [H]
  Tensor lm_head_;       // [V, H]; the embedding when tied
  DeviceRope rope_;
  std::vector<LayerWeights> layers_;
  bool decode_step_kernel_ = false;  // the model and backend take it, and KILN_DECODE_STEP_KERNEL=1
};

}  // namespace kiln
