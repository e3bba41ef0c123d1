// TrainModel: the decoder-only causal LM (Llama, Mistral, Qwen2, Qwen3 — the same architecture as
// model/transformer.h) with a backward pass, over dense micro-batches of B rows x S tokens.
//
// Forward per layer, x the f32 residual stream, tokens as [B*S, ...] rows:
//   n1 = rmsnorm(x) ; qkv = n1 Wqkv^T (+b) ; q, k, v = split + q/k norm + rope -> [B, H, S, D]
//   a  = attention(q, k, v; causal + documents + padding) -> [B*S, Hq*D] ; x' = x + a Wo^T (+b)
//   n2 = rmsnorm(x') ; gu = n2 Wgu^T (+b) ; m = swiglu(gu) ; x'' = x' + m Wdown^T (+b)
// then the final norm and the output head fused with the cross-entropy: only rows with a target
// are gathered, and their logits exist only a chunk of rows at a time (in the compute dtype), are
// turned into d loss / d logits in place and immediately fed to the two backward GEMMs.
//
// Activation memory: by default every activation the backward reads is kept, L layers' worth.
// With TrainModelOptions::recompute the forward keeps only each layer's input x (f32 [T, H]) and
// one layer's activations (a workspace the layers share, left holding the last layer's); the
// backward, from the last layer down, recomputes layer l's activations from x[l] into that
// workspace (the last layer's are already there) and then runs the layer's backward. The
// recomputation calls the same per-layer forward (layer_forward) with the same inputs, so the
// gradients are the same bits as without it (on CUDA up to the f32 atomics of the embedding and
// attention-dQ backward kernels, whose order may vary from run to run with or without it).
// target_logprobs always uses the shared workspace (it reads nothing back).
//
// Precision: on the CPU everything is f32. On CUDA the GEMMs, attention and activations run in
// bf16 from the parameters' bf16 compute copy, with f32 accumulation; the residual stream, the
// loss, the norm statistics and all parameter gradients are f32 (ParameterSet: f32 master weights).
//
// Ownership: owns its ParameterSet; activations are allocated per call (through the backend's
// caching allocator on CUDA) and released when the call returns.
// Thread safety: none; one thread drives a TrainModel and its backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "train/parameters.h"

namespace kiln {

// One dense micro-batch in host memory. Row b holds its tokens at [b*S, b*S + S); rows shorter
// than S are padded at the end (segment -1, target -100).
struct HostBatch {
  int32_t batch = 0, seq_len = 0;     // B, S
  std::vector<int32_t> ids;           // [B*S]
  std::vector<int32_t> positions;     // [B*S] rotary positions
  std::vector<int32_t> segments;      // [B*S] document index within the row, -1 = padding; empty: one
                                      //       document per row and no padding (plain causal mask)
  std::vector<int32_t> targets;       // [B*S] the token position t is trained to predict; -100: none
  int64_t tokens() const;             // non-padding tokens
  int64_t labelled() const;           // targets >= 0
};

// A HostBatch on the model's device, with the labelled rows gathered.
struct DeviceBatch {
  int32_t batch = 0, seq_len = 0;
  TensorBuffer ids, positions, segments;  // [B*S] i32 (segments absent for plain causal rows)
  TensorBuffer target_rows, targets;      // [R] i32: rows (of B*S) with a target, and that target
  int64_t labelled = 0;                   // R
};

struct TrainModelOptions {
  std::string no_decay = kDefaultNoDecay;  // see ParameterSet::create
  float label_smoothing = 0.0f;
  uint64_t random_seed = 0;  // for TrainModel::random
  // Keep only the layers' inputs and recompute each layer's activations in the backward: one more
  // forward of every layer but the last (about a third more layer work) for one layer's activations
  // instead of L layers'.
  bool recompute = false;
  // The parameters' flat layout splits into this many equal shards (ZeRO over as many ranks).
  int32_t parameter_shards = 1;
};

// RL objectives (rl/losses.h) are functions of the labelled rows' log-probabilities. Given log
// p(target) of every labelled row (row order of DeviceBatch::target_rows) under softmax(logits *
// logit_scale), and each row's entropy when asked, a TokenLoss returns the micro-batch's loss and
// d loss / d logprob per row.
struct TokenLossValue {
  double loss = 0.0;
  std::vector<float> dloss_dlogprob;  // [labelled]
};
using TokenLoss = std::function<Result<TokenLossValue>(const std::vector<float>& logprobs,
                                                       const std::vector<float>& entropies)>;
struct TokenScoreOptions {
  float logit_scale = 1.0f;  // 1 / sampling temperature
  bool entropies = false;    // also each labelled row's entropy of softmax(logits * logit_scale)
};
struct TokenScores {
  std::vector<float> logprobs, entropies;  // [labelled] (entropies when asked)
};

// Wall-clock milliseconds of the last forward_backward's phases (when profile_phases is set).
struct PhaseTimes {
  double forward_ms = 0, head_ms = 0, backward_ms = 0;
};

class TrainModel {
 public:
  // config.json and safetensors weights of `model_dir` (any float dtype) as f32 master weights.
  static Result<std::unique_ptr<TrainModel>> load(Backend& be, const std::string& model_dir,
                                                  const TrainModelOptions& options);
  // Seeded random weights (N(0, 0.02) matrices, unit norms, zero biases), e.g. for benchmarks.
  static Result<std::unique_ptr<TrainModel>> random(Backend& be, const ModelConfig& config,
                                                    const TrainModelOptions& options);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return be_; }
  ParameterSet& params() { return params_; }
  const ParameterSet& params() const { return params_; }

  // Validates (ids and targets within the vocabulary, positions below the context length,
  // sizes) and copies a batch to the device.
  Result<DeviceBatch> upload(const HostBatch& batch) const;

  // Forward and backward over one micro-batch: the gradients (params().grad) += grad_scale * d(sum of the
  // token losses) / d params. Returns the sum of the token losses (label smoothing included).
  // With grad_scale = 1 / (labelled tokens of the whole optimizer step) the gradients are those of
  // Hugging Face's mean loss, accumulated over micro-batches.
  Result<double> forward_backward(const DeviceBatch& batch, float grad_scale);

  // Forward only: log p(target) for each labelled row, in row order (for DPO / GRPO and scoring).
  Result<std::vector<float>> target_logprobs(const DeviceBatch& batch);
  Result<TokenScores> target_scores(const DeviceBatch& batch, const TokenScoreOptions& options);

  // Forward and backward of a loss of the labelled rows' log-probabilities: the forward, the
  // output head once for the log-probabilities (and entropies), `loss` on the host, the head again
  // with each row's gradient scaled by its d loss / d logprob, the backward: the gradients +=
  // d loss / d params. Label smoothing does not apply. Returns the loss and the scores it saw.
  Result<double> forward_backward_token_loss(const DeviceBatch& batch, const TokenLoss& loss,
                                             const TokenScoreOptions& options, TokenScores* scores = nullptr);

  // Benchmarks: synchronise between the phases of forward_backward and record their times.
  void set_profile_phases(bool on) { profile_phases_ = on; }
  // Called in the backward pass as soon as layer l's parameter gradients are complete (layers
  // L-1 down to 0), for the data-parallel trainer to start their reduction while the backward goes
  // on; an error stops the pass. Empty: none.
  void set_layer_gradient_hook(std::function<Status(int64_t layer)> hook) { layer_hook_ = std::move(hook); }
  const PhaseTimes& last_phase_times() const { return phase_times_; }

 private:
  TrainModel(Backend& be, ModelConfig config, ParameterSet params, const TrainModelOptions& options);
  Status init_rope();
  struct LayerActivations;
  struct Activations;
  // keep_layers: every layer's activations (for the backward without recomputation); otherwise one
  // workspace the layers share.
  Status forward(const DeviceBatch& batch, Activations& act, bool keep_layers);
  // Layer l's forward from a.n1 (its normed input, already written) and x_in (the residual stream
  // entering it, [T, H] f32) through a.mlp. Given x_out, also x_out = x_mid + down(mlp) fused with the
  // next norm: n_next = rmsnorm(x_out) * next_norm. proj: [T, H] compute-dtype scratch.
  void layer_forward(int64_t l, const DeviceBatch& batch, LayerActivations& a, Tensor x_in, Tensor proj,
                     Tensor x_out, Tensor n_next, Tensor next_norm);
  // The two entry points without their error boundary (an op running out of memory throws).
  Result<double> forward_backward_unchecked(const DeviceBatch& batch, float grad_scale);
  // The output head over the labelled rows: losses, log-probabilities (and entropies) into
  // `scores`, and with `backward` the gradients into act.d_final and the head's weight gradient.
  struct HeadPass {
    float grad_scale = 1.0f;
    bool backward = false;
    float logit_scale = 1.0f;
    float label_smoothing = 0.0f;
    Tensor row_scales;  // optional [R] f32 on the device
    bool entropies = false;
  };
  Result<double> head_loss(const DeviceBatch& batch, Activations& act, const HeadPass& pass, TokenScores* scores);
  Result<double> forward_backward_token_loss_unchecked(const DeviceBatch& batch, const TokenLoss& loss,
                                                       const TokenScoreOptions& options, TokenScores* scores);
  Status backward(const DeviceBatch& batch, Activations& act);

  Backend& be_;
  ModelConfig config_;
  ParameterSet params_;
  TrainModelOptions options_;
  TensorBuffer inv_freq_;  // [D/2] f32
  float rope_attention_scaling_ = 1.0f;
  bool profile_phases_ = false;
  PhaseTimes phase_times_;
  std::function<Status(int64_t)> layer_hook_;
};

}  // namespace kiln
