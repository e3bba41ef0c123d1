#include "train/optimizer.h"

#include <cmath>

#include "kernels/train_ops.h"

namespace kiln {

Result<Optimizer> Optimizer::create(Backend& be, ParameterSet& params, const OptimizerOptions& options) {
  if (!(options.lr >= 0.0f) || !std::isfinite(options.lr)) return invalid_argument("--lr must be a finite value >= 0");
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f) || !(options.beta2 >= 0.0f && options.beta2 < 1.0f))
    return invalid_argument("--betas must both be in [0, 1)");
  if (!(options.eps > 0.0f) || !std::isfinite(options.eps)) return invalid_argument("--eps must be a finite value > 0");
  if (!(options.weight_decay >= 0.0f) || !std::isfinite(options.weight_decay))
    return invalid_argument("--weight-decay must be a finite value >= 0");
  if (!(options.clip_norm >= 0.0f) || !std::isfinite(options.clip_norm))
    return invalid_argument("--clip-norm must be a finite value > 0 (0 or absent: no clipping)");
  Optimizer opt(be, params, options);
  if (options.kind == OptimizerOptions::Kind::adamw) {
    KILN_ASSIGN_OR_RETURN(opt.m_, empty(be, {params.size()}, DType::f32));
    KILN_ASSIGN_OR_RETURN(opt.v_, empty(be, {params.size()}, DType::f32));
    be.zero(opt.m_);
    be.zero(opt.v_);
  }
  return opt;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (m_.allocated()) out.emplace_back("adamw.exp_avg", m_.view());
  if (v_.allocated()) out.emplace_back("adamw.exp_avg_sq", v_.view());
  return out;
}

void Optimizer::discard_gradients() { be_->zero(params_->grads()); }

Result<OptimizerStepInfo> Optimizer::step(float lr) {
  OptimizerStepInfo info;
  info.grad_norm = std::sqrt(ops::sum_squares(*be_, params_->grads()));
  if (!std::isfinite(info.grad_norm)) {
    discard_gradients();
    return invalid_argument("the gradient norm is not finite (" + std::to_string(info.grad_norm) + ")");
  }
  if (!(lr >= 0.0f) || !std::isfinite(lr)) return invalid_argument("the learning rate is not a finite value >= 0");
  if (options_.clip_norm > 0.0f) {
    const double coef = options_.clip_norm / (info.grad_norm + 1e-6);
    if (coef < 1.0) info.clip_coef = static_cast<float>(coef);
  }
  ++step_;
  const Tensor lowp = params_->mixed_precision() ? params_->compute() : Tensor{};
  if (options_.kind == OptimizerOptions::Kind::adamw) {
    ops::AdamWStep s;
    s.lr = lr;
    s.beta1 = options_.beta1;
    s.beta2 = options_.beta2;
    s.eps = options_.eps;
    s.weight_decay = options_.weight_decay;
    s.step = step_;
    s.grad_scale = info.clip_coef;
    s.decay_end = params_->decay_end();
    ops::adamw_step(*be_, params_->master(), params_->grads(), m_, v_, lowp, s);
  } else {
    ops::sgd_step(*be_, params_->master(), params_->grads(), lowp, lr, options_.weight_decay, info.clip_coef,
                  params_->decay_end());
  }
  be_->zero(params_->grads());
  KILN_RETURN_IF_ERROR(be_->synchronize());
  return info;
}

}  // namespace kiln
