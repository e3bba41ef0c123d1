// Optimizer: AdamW (torch.optim.AdamW semantics) or plain SGD over a ParameterSet's flat buffers,
// with global gradient-norm clipping (torch.nn.utils.clip_grad_norm_: coefficient
// clip / (norm + 1e-6), applied only when below 1). One kernel updates every parameter and
// refreshes the bf16 compute copy.
//
// Ownership: owns the AdamW moments ([N] f32 each, zero-initialised); refers to the ParameterSet,
// which must outlive it. Thread safety: none.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "train/parameters.h"

namespace kiln {

struct OptimizerOptions {
  enum class Kind { adamw, sgd };
  Kind kind = Kind::adamw;
  float lr = 1e-5f;  // the base learning rate (a schedule scales it per step)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  float clip_norm = 0.0f;  // 0: no clipping (negative or non-finite: refused by create)
};

struct OptimizerStepInfo {
  double grad_norm = 0.0;   // global L2 norm of the gradients before clipping
  float clip_coef = 1.0f;   // the factor the gradients were scaled by
};

class Optimizer {
 public:
  static Result<Optimizer> create(Backend& be, ParameterSet& params, const OptimizerOptions& options);

  // Reads the gradients, clips, updates the parameters at learning rate `lr` and zeroes the
  // gradients. Fails (parameters untouched, gradients zeroed) when the gradient norm is not finite.
  Result<OptimizerStepInfo> step(float lr);
  // Zeroes the accumulated gradients without an update.
  void discard_gradients();

  // Checkpointing: the optimizer's state as named f32 tensors on its backend (views of the buffers
  // it owns; a checkpoint reads them and a resume writes into them), and the count of applied steps
  // (AdamW's bias correction).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  int64_t steps_taken() const { return step_; }
  void restore_steps_taken(int64_t steps) { step_ = steps; }

 private:
  Optimizer(Backend& be, ParameterSet& params, const OptimizerOptions& options)
      : be_(&be), params_(&params), options_(options) {}

  Backend* be_;
  ParameterSet* params_;
  OptimizerOptions options_;
  TensorBuffer m_, v_;  // AdamW moments [N] f32
  int64_t step_ = 0;
};

}  // namespace kiln
