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

Result<Optimizer> Optimizer::create(Backend& be, ParameterSet& params, const OptimizerOptions& options,
                                    Collectives* shard_over) {
  if (!(options.lr >= 0.0f) || !std::isfinite(options.lr)) return invalid_argument("--lr must be a finite value >= 0");
  if (!(options.beta1 >= 0.0f && options.beta1 < 1.0f) || !(options.beta2 >= 0.0f && options.beta2 < 1.0f))
    return invalid_argument("--betas must both be in [0, 1)");
  if (!(options.eps > 0.0f) || !std::isfinite(options.eps)) return invalid_argument("--eps must be a finite value > 0");
  if (!(options.weight_decay >= 0.0f) || !std::isfinite(options.weight_decay))
    return invalid_argument("--weight-decay must be a finite value >= 0");
  if (!(options.clip_norm >= 0.0f) || !std::isfinite(options.clip_norm))
    return invalid_argument("--clip-norm must be a finite value > 0 (0 or absent: no clipping)");
  if (options.kind == OptimizerOptions::Kind::muon) KILN_RETURN_IF_ERROR(check_muon_options(options));
  if (shard_over && shard_over->size() <= 1) shard_over = nullptr;
  Optimizer opt(be, params, options, shard_over);
  opt.own_end_ = params.size();
  if (shard_over) {
    if (options.kind == OptimizerOptions::Kind::muon)
      return invalid_argument("Muon's Newton-Schulz iteration needs whole matrices, so its state is not sharded: "
                              "use --zero 0 with --optimizer muon");
    if (params.shards() != shard_over->size())
      return invalid_argument("the parameters are laid out for " + std::to_string(params.shards()) +
                              " shards, the run has " + std::to_string(shard_over->size()) + " ranks");
    opt.own_begin_ = params.shard_size() * shard_over->rank();
    opt.own_end_ = opt.own_begin_ + params.shard_size();
    if (params.master_sharded() && (params.master_begin() != opt.own_begin_ || params.master_end() != opt.own_end_))
      return invalid_argument("the master weights this rank holds are not its optimizer shard");
  }
  if (options.kind == OptimizerOptions::Kind::adamw || options.kind == OptimizerOptions::Kind::muon) {
    const int64_t muon_n =
        options.kind == OptimizerOptions::Kind::muon ? params.matrix_end() - params.matrix_begin() : 0;
    const int64_t n = opt.own_end_ - opt.own_begin_ - muon_n;
    KILN_ASSIGN_OR_RETURN(opt.m_, empty(be, {n}, DType::f32));
    KILN_ASSIGN_OR_RETURN(opt.v_, empty(be, {n}, DType::f32));
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

std::vector<OptimizerState> Optimizer::state_tensors() const {
  std::vector<OptimizerState> out;
  const int64_t muon_n = momentum_.allocated() ? momentum_.view().numel() : 0;
  // AdamW's moments: this rank's range of the flat layout (with Muon, never sharded, the compact
  // layout without the block matrices).
  const int64_t adamw_space = params_->size() - muon_n;
  if (m_.allocated()) out.push_back({"adamw.exp_avg", m_.view(), own_begin_, adamw_space});
  if (v_.allocated()) out.push_back({"adamw.exp_avg_sq", v_.view(), own_begin_, adamw_space});
  if (momentum_.allocated()) out.push_back({"muon.momentum_buffer", momentum_.view(), 0, muon_n});
  return out;
}

Tensor Optimizer::master_rows(int64_t begin, int64_t end) const {
  KILN_ASSERT(params_->master_begin() <= begin && end <= params_->master_end());
  return params_->master().rows(begin - params_->master_begin(), end - params_->master_begin());
}

Status Optimizer::gather_updated_weights() {
  if (!shard_over_) return Status::Ok();
  // With mixed precision the model reads the compute copy (the master weights may be sharded);
  // on the CPU it reads the master weights, which are whole.
  const Tensor weights = params_->mixed_precision() ? params_->compute() : params_->master();
  return shard_over_->all_gather(*be_, weights.rows(own_begin_, own_end_), weights);
}

void Optimizer::discard_gradients() { params_->zero_grads(*be_); }

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
  ops::adamw_step(*be_, master_rows(begin, end), params_->grad_rows(begin, end),
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
  ops::muon_step(*be_, master_rows(mb, me), params_->grad_rows(mb, me), momentum_, lowp,
                 muon_matrices_, s);
}

Result<OptimizerStepInfo> Optimizer::step(float lr) {
  OptimizerStepInfo info;
  const Tensor grads = params_->grad_rows(own_begin_, own_end_);
  double squares = ops::sum_squares(*be_, grads);
  if (shard_over_) {
    Status summed = shard_over_->sum(&squares, 1);
    if (!summed.ok()) {
      discard_gradients();
      return summed;
    }
  }
  info.grad_norm = std::sqrt(squares);
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
  if (options_.kind == OptimizerOptions::Kind::adamw) {
    adamw_range(own_begin_, own_end_, 0, params_->decay_end(), lr, info.clip_coef);
  } else if (options_.kind == OptimizerOptions::Kind::muon) {
    muon_update(lr, info.clip_coef);
  } else {
    const Tensor lowp = params_->mixed_precision() ? params_->compute().rows(own_begin_, own_end_) : Tensor{};
    ops::sgd_step(*be_, master_rows(own_begin_, own_end_), grads, lowp, lr, options_.weight_decay, info.clip_coef,
                  params_->decay_end() - own_begin_);
  }
  params_->zero_accumulated_grads(*be_);
  KILN_RETURN_IF_ERROR(gather_updated_weights());
  KILN_RETURN_IF_ERROR(be_->synchronize());
  return info;
}

}  // namespace kiln
