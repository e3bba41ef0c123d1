#include "train/optimizer.h"

#include <cmath>

#include "kernels/train_ops.h"

namespace kiln {
namespace {

Status check_muon_options(const OptimizerOptions& o) {
  if (!(o.muon_momentum >= 0.0f && o.muon_momentum < 1.0f))
    return invalid_argument("--muon-momentum must be in [0, 1) (got " + std::to_string(o.muon_momentum) + ")");
  if (o.muon_ns_steps < 0 || o.muon_ns_steps >= 100)
    return invalid_argument("the Muon Newton-Schulz step count must be in [0, 100) (got " +
                            std::to_string(o.muon_ns_steps) + ")");
  if (!std::isfinite(o.muon_ns_a) || !std::isfinite(o.muon_ns_b) || !std::isfinite(o.muon_ns_c))
    return invalid_argument("the Muon Newton-Schulz coefficients must be finite");
  if (!(o.muon_eps > 0.0f) || !std::isfinite(o.muon_eps))
    return invalid_argument("the Muon eps must be a finite value > 0 (got " + std::to_string(o.muon_eps) + ")");
  if (o.muon_adjust_lr != ops::MuonAdjustLr::original && o.muon_adjust_lr != ops::MuonAdjustLr::match_rms_adamw)
    return invalid_argument("--muon-adjust-lr must be original or match_rms_adamw");
  return Status::Ok();
}

}  // namespace

Result<Optimizer> Optimizer::create(Backend& be, ParameterSet& params, const OptimizerOptions& options) {
  if (!(options.lr >= 0.0f) || !std::isfinite(options.lr)) return invalid_argument("--lr must be a finite value >= 0");
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f) || !(options.beta2 >= 0.0f && options.beta2 < 1.0f))
    return invalid_argument("--betas must both be in [0, 1)");
  if (!(options.eps > 0.0f) || !std::isfinite(options.eps)) return invalid_argument("--eps must be a finite value > 0");
  if (!(options.weight_decay >= 0.0f) || !std::isfinite(options.weight_decay))
    return invalid_argument("--weight-decay must be a finite value >= 0");
  if (!(options.clip_norm >= 0.0f) || !std::isfinite(options.clip_norm))
    return invalid_argument("--clip-norm must be a finite value > 0 (0 or absent: no clipping)");
  if (options.kind == OptimizerOptions::Kind::muon) KILN_RETURN_IF_ERROR(check_muon_options(options));
  Optimizer opt(be, params, options);
  if (options.kind == OptimizerOptions::Kind::adamw || options.kind == OptimizerOptions::Kind::muon) {
    const int64_t muon_n =
        options.kind == OptimizerOptions::Kind::muon ? params.matrix_end() - params.matrix_begin() : 0;
    KILN_ASSIGN_OR_RETURN(opt.m_, empty(be, {params.size() - muon_n}, DType::f32));
    KILN_ASSIGN_OR_RETURN(opt.v_, empty(be, {params.size() - muon_n}, DType::f32));
    be.zero(opt.m_);
    be.zero(opt.v_);
    if (options.kind == OptimizerOptions::Kind::muon) {
      KILN_ASSIGN_OR_RETURN(opt.momentum_, empty(be, {muon_n}, DType::f32));
      be.zero(opt.momentum_);
      for (const ParameterMatrix& m : params.block_matrices())
        opt.muon_matrices_.push_back({m.offset - params.matrix_begin(), m.rows, m.cols, m.decayed});
    }
  }
  return opt;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  if (m_.allocated()) out.emplace_back("adamw.exp_avg", m_.view());
  if (v_.allocated()) out.emplace_back("adamw.exp_avg_sq", v_.view());
  if (momentum_.allocated()) out.emplace_back("muon.momentum_buffer", momentum_.view());
  return out;
}

void Optimizer::discard_gradients() { be_->zero(params_->grads()); }

// AdamW over parameters [begin, end) with moments from state_begin; decay_end is absolute.
void Optimizer::adamw_range(int64_t begin, int64_t end, int64_t state_begin, int64_t decay_end, float lr,
                            float grad_scale) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  ops::AdamWStep s;
  s.lr = lr;
  s.beta1 = options_.beta1;
  s.beta2 = options_.beta2;
  s.eps = options_.eps;
  s.weight_decay = options_.weight_decay;
  s.step = step_;
  s.grad_scale = grad_scale;
  s.decay_end = decay_end - begin;
  const Tensor lowp = params_->mixed_precision() ? params_->compute().rows(begin, end) : Tensor{};
  ops::adamw_step(*be_, params_->master().rows(begin, end), params_->grads().rows(begin, end),
                  m_.view().rows(state_begin, state_begin + n), v_.view().rows(state_begin, state_begin + n), lowp, s);
}

// Kind::muon: AdamW before and after the block-matrix range, Muon inside it.
void Optimizer::muon_update(float lr, float grad_scale) {
  const int64_t mb = params_->matrix_begin(), me = params_->matrix_end(), N = params_->size();
  // [0, mb) is all decayed and [me, N) all exempt (ParameterSet's order).
  adamw_range(0, mb, 0, mb, lr, grad_scale);
  adamw_range(me, N, mb, me, lr, grad_scale);
  if (me == mb) return;
  ops::MuonStep s;
  s.lr = lr;
  s.weight_decay = options_.weight_decay;
  s.momentum = options_.muon_momentum;
  s.nesterov = options_.muon_nesterov;
  s.ns_steps = options_.muon_ns_steps;
  s.ns_a = options_.muon_ns_a;
  s.ns_b = options_.muon_ns_b;
  s.ns_c = options_.muon_ns_c;
  s.eps = options_.muon_eps;
  s.adjust_lr = options_.muon_adjust_lr;
  s.grad_scale = grad_scale;
  const Tensor lowp = params_->mixed_precision() ? params_->compute().rows(mb, me) : Tensor{};
  ops::muon_step(*be_, params_->master().rows(mb, me), params_->grads().rows(mb, me), momentum_, lowp,
                 muon_matrices_, s);
}

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
    adamw_range(0, params_->size(), 0, params_->decay_end(), lr, info.clip_coef);
  } else if (options_.kind == OptimizerOptions::Kind::muon) {
    muon_update(lr, info.clip_coef);
  } else {
    ops::sgd_step(*be_, params_->master(), params_->grads(), lowp, lr, options_.weight_decay, info.clip_coef,
                  params_->decay_end());
  }
  be_->zero(params_->grads());
  KILN_RETURN_IF_ERROR(be_->synchronize());
  return info;
}

}  // namespace kiln
