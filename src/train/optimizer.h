// Optimizer: AdamW (torch.optim.AdamW semantics), plain SGD, or Muon (torch.optim.Muon, PyTorch
// 2.9+) over a ParameterSet's flat buffers, with global gradient-norm clipping
// (torch.nn.utils.clip_grad_norm_: coefficient clip / (norm + 1e-6), applied only when below 1,
// to the gradients before either update).
//
// Muon updates the 2-D weight matrices of the transformer layers, each Hugging Face matrix on its
// own (q, k, v, o, gate, up, down), and AdamW (the same kernel and options as Kind::adamw) the
// rest: embeddings, lm_head, norms, biases. That is torch.optim.Muon on the block matrices plus
// torch.optim.AdamW on the other parameters, both with `lr`, `weight_decay` and the no-decay set.
// ParameterSet lays the block matrices out as one range, so AdamW runs on the two ranges around it.
// Precision: master weights, AdamW moments and the Muon momentum are f32 everywhere; Newton-Schulz
// runs in f32 on the CPU and as bf16 GEMMs with f32 accumulation on CUDA (as torch does); every
// update refreshes the bf16 compute copy.
// Where kiln's Muon departs from torch.optim.Muon (2.15 read): Newton-Schulz in f32 on the CPU
// (torch casts to bf16 on every device); stricter options (momentum in [0, 1) where torch takes any
// value >= 0, ns_steps >= 0, eps > 0 so that a zero gradient cannot give 0 / 0); no
// "spectral_unclamped" adjust_lr; the Frobenius norm summed in double; and the no-decay set is
// chosen per kiln tensor, so q, k and v (and gate, up) are decayed or exempt together.
//
// Sharded (ZeRO-1/2, data parallel): with `shard_over` naming a world of R > 1 ranks, rank r keeps
// the state of, and updates, only the flat elements [r * S, (r + 1) * S) (S = params.shard_size();
// the ParameterSet must have been made with R shards); its gradients there must already be summed
// over the ranks (the trainer's reduce-scatter). The gradient norm is summed over the ranks, so the
// clip and the non-finite check stay global, and after the update the updated shards are gathered
// into every rank's weights (the compute copy with mixed precision, else the master weights).
// AdamW and SGD shard; Muon's Newton-Schulz needs whole matrices, so Muon is not sharded.
//
// Ownership: owns the optimizer state (zero-initialised): AdamW moments over the parameters AdamW
// updates, the Muon momentum over the block-matrix range; refers to the ParameterSet and the
// collectives, which must outlive it. Thread safety: none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/status.h"
#include "kernels/train_ops.h"
#include "train/parameters.h"

namespace kiln {

struct OptimizerOptions {
  enum class Kind { adamw, sgd, muon };
  Kind kind = Kind::adamw;
  float lr = 1e-5f;  // the base learning rate (a schedule scales it per step)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // AdamW (also the AdamW part of Muon)
  float weight_decay = 0.0f;
  float clip_norm = 0.0f;  // 0: no clipping (negative or non-finite: refused by create)
  // Muon (torch.optim.Muon's defaults; adjust_lr original = torch's adjust_lr_fn=None).
  float muon_momentum = 0.95f;  // in [0, 1)
  bool muon_nesterov = true;
  int muon_ns_steps = 5;        // in [0, 100)
  float muon_ns_a = 3.4445f, muon_ns_b = -4.7750f, muon_ns_c = 2.0315f;
  float muon_eps = 1e-7f;       // > 0: the floor of the Frobenius norm Newton-Schulz divides by
  ops::MuonAdjustLr muon_adjust_lr = ops::MuonAdjustLr::original;
};

struct OptimizerStepInfo {
  double grad_norm = 0.0;   // global L2 norm of the gradients before clipping
  float clip_coef = 1.0f;   // the factor the gradients were scaled by
};

// One tensor of optimizer state: `values` are elements [begin, begin + values.numel()) of a state
// of `space` elements in all. AdamW's states live in the flat parameter layout (space N, sharded or
// not); Muon's in their own compact layouts (see state_tensors).
struct OptimizerState {
  std::string name;
  Tensor values;
  int64_t begin = 0, space = 0;
};

class Optimizer {
 public:
  // `shard_over`: null (or a world of one) for the whole state on this process, else see above.
  static Result<Optimizer> create(Backend& be, ParameterSet& params, const OptimizerOptions& options,
                                  Collectives* shard_over = nullptr);

  // Reads the gradients, clips, updates the parameters at learning rate `lr` and zeroes the
  // gradients. Fails (parameters untouched, gradients zeroed) when the gradient norm is not finite.
  Result<OptimizerStepInfo> step(float lr);
  // Zeroes the accumulated gradients without an update.
  void discard_gradients();

  // Checkpointing: the optimizer's state as named f32 tensors on its backend (views of the buffers
  // it owns; a checkpoint reads them and a resume writes into them), and the count of applied steps
  // (AdamW's bias correction). AdamW: "adamw.exp_avg", "adamw.exp_avg_sq" (space N; this rank's
  // shard when sharded); Muon: "adamw.exp_avg", "adamw.exp_avg_sq" over the parameters outside the
  // block-matrix range (the elements before it, then those after it) and "muon.momentum_buffer"
  // over that range. Padding is always at the end of a space, so a state saved with one padding
  // (rank count) reads into another by position. Together with the parameters they are the whole
  // state: a restored run repeats the same steps bit for bit.
  std::vector<OptimizerState> state_tensors() const;
  bool sharded() const { return own_end_ - own_begin_ != params_->size(); }
  // The flat elements this process updates: [0, N) unless sharded.
  int64_t own_begin() const { return own_begin_; }
  int64_t own_end() const { return own_end_; }
  int64_t steps_taken() const { return step_; }
  void restore_steps_taken(int64_t steps) { step_ = steps; }

 private:
  Optimizer(Backend& be, ParameterSet& params, const OptimizerOptions& options, Collectives* shard_over)
      : be_(&be), params_(&params), options_(options), shard_over_(shard_over) {}
  void adamw_range(int64_t begin, int64_t end, int64_t state_begin, int64_t decay_end, float lr, float grad_scale);
  void muon_update(float lr, float grad_scale);
  // Master weights of flat elements [begin, end) (inside the range this process holds).
  Tensor master_rows(int64_t begin, int64_t end) const;
  // Sharded: every rank's updated shard into every rank's weights.
  Status gather_updated_weights();

  Backend* be_;
  ParameterSet* params_;
  OptimizerOptions options_;
  Collectives* shard_over_;          // null unless sharded
  int64_t own_begin_ = 0, own_end_ = 0;
  TensorBuffer m_, v_;       // AdamW moments f32: [own range], or [N - muon range] for Muon
  TensorBuffer momentum_;    // Muon momentum f32: [matrix_end - matrix_begin]
  std::vector<ops::MuonMatrix> muon_matrices_;  // offsets relative to matrix_begin
  int64_t step_ = 0;
};

}  // namespace kiln
