#include "kernels/train_ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/adamw_scalars.h"
#include "kernels/cpu/cpu_train_ops.h"
#include "kernels/cpu/muon.h"
#ifdef KILN_WITH_CUDA
#include "kernels/cuda/cuda_train_ops.h"
#include "kernels/cuda/muon.h"
#endif

namespace kiln::ops {
namespace {
#ifdef KILN_WITH_CUDA
CudaBackend& cuda_backend(Backend& be) { return static_cast<CudaBackend&>(be); }
#endif
}  // namespace

void rmsnorm_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::rmsnorm_backward(cuda_backend(be), dx, dw, dy, x, w, eps, accumulate_dx, dx_copy);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::rmsnorm_backward(dx, dw, dy, x, w, eps, accumulate_dx, dx_copy);
}

void swiglu_backward(Backend& be, Tensor d_gate_up, Tensor dout, Tensor gate_up) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::swiglu_backward(cuda_backend(be), d_gate_up, dout, gate_up);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::swiglu_backward(d_gate_up, dout, gate_up);
}

void embedding_backward(Backend& be, Tensor dtable, Tensor dy, Tensor ids) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::embedding_backward(cuda_backend(be), dtable, dy, ids);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::embedding_backward(dtable, dy, ids);
}

void bias_backward(Backend& be, Tensor db, Tensor dy) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::bias_backward(cuda_backend(be), db, dy);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::bias_backward(db, dy);
}

void qkv_split_rope_forward(Backend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::qkv_split_rope_forward(cuda_backend(be), q, k, v, qkv, positions, inv_freq, attention_scaling, q_norm, k_norm, eps);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::qkv_split_rope_forward(q, k, v, qkv, positions, inv_freq, attention_scaling, q_norm, k_norm, eps);
}

void qkv_split_rope_backward(Backend& be, Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv, Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::qkv_split_rope_backward(cuda_backend(be), d_qkv, dq_norm, dk_norm, dq, dk, dv, qkv, positions, inv_freq, attention_scaling, q_norm, k_norm, eps);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::qkv_split_rope_backward(d_qkv, dq_norm, dk_norm, dq, dk, dv, qkv, positions, inv_freq, attention_scaling, q_norm, k_norm, eps);
}

void attention_train_forward(Backend& be, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal, float scale) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::attention_train_forward(cuda_backend(be), out, lse, q, k, v, segment_ids, causal, scale);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::attention_train_forward(out, lse, q, k, v, segment_ids, causal, scale);
}

void attention_train_backward(Backend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor segment_ids, bool causal, float scale) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::attention_train_backward(cuda_backend(be), dq, dk, dv, dout, q, k, v, out, lse, segment_ids, causal, scale);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::attention_train_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_ids, causal, scale);
}

void cross_entropy_forward_backward(Backend& be, Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const CrossEntropyOptions& o) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::cross_entropy_forward_backward(cuda_backend(be), logits, losses, logprobs, targets, o);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::cross_entropy_forward_backward(logits, losses, logprobs, targets, o);
}

void adamw_step(Backend& be, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWStep& s) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::adamw_step(cuda_backend(be), params, grads, m, v, params_lowp, s);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::adamw_step(params, grads, m, v, params_lowp, s);
}

void sgd_step(Backend& be, Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay, float grad_scale, int64_t decay_end) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::sgd_step(cuda_backend(be), params, grads, params_lowp, lr, weight_decay, grad_scale, decay_end);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::sgd_step(params, grads, params_lowp, lr, weight_decay, grad_scale, decay_end);
}

void muon_step(Backend& be, Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<MuonMatrix>& matrices, const MuonStep& s) {
  const int64_t M = params.numel();
  KILN_ASSERT(params.dtype == DType::f32 && grads.dtype == DType::f32 && momentum.dtype == DType::f32);
  KILN_ASSERT(grads.numel() == M && momentum.numel() == M);
  KILN_ASSERT(params_lowp.data == nullptr || (params_lowp.numel() == M && params_lowp.dtype != DType::f32));
  KILN_ASSERT(s.ns_steps >= 0 && s.ns_steps < 100);
  int64_t end = 0;
  for (const MuonMatrix& m : matrices) {
    KILN_ASSERT(m.rows > 0 && m.cols > 0 && m.offset >= end && m.offset + m.rows * m.cols <= M);
    end = m.offset + m.rows * m.cols;
  }
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::muon_step(cuda_backend(be), params, grads, momentum, params_lowp, matrices, s);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::muon_step(params, grads, momentum, params_lowp, matrices, s);
}

namespace detail {

MuonScalars muon_scalars(const MuonStep& s) {
  const double mom = widen_decimal(s.momentum), lr = widen_decimal(s.lr), wd = widen_decimal(s.weight_decay);
  MuonScalars c;
  c.grad_scale = s.grad_scale;
  c.buf_weight = static_cast<float>(1.0 - mom);
  c.nesterov_weight = static_cast<float>(mom);
  c.nesterov = s.nesterov;
  c.decay = static_cast<float>(1.0 - lr * wd);
  c.ns_a = static_cast<float>(widen_decimal(s.ns_a));
  c.ns_b = static_cast<float>(widen_decimal(s.ns_b));
  c.ns_c = static_cast<float>(widen_decimal(s.ns_c));
  c.eps = static_cast<float>(widen_decimal(s.eps));
  c.ns_steps = s.ns_steps;
  return c;
}

float muon_neg_adjusted_lr(const MuonStep& s, int64_t rows, int64_t cols) {
  const double lr = widen_decimal(s.lr), A = static_cast<double>(rows), B = static_cast<double>(cols);
  const double ratio = s.adjust_lr == MuonAdjustLr::original ? std::sqrt(std::max(1.0, A / B))
                                                             : 0.2 * std::sqrt(std::max(A, B));
  return static_cast<float>(-(lr * ratio));
}

}  // namespace detail

double sum_squares(Backend& be, Tensor x) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::sum_squares(cuda_backend(be), x);
#endif
  KILN_ASSERT(be.device().is_cpu());
  return cpu::sum_squares(x);
}

}  // namespace kiln::ops
