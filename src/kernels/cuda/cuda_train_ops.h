// CUDA twins of the training ops in kernels/train_ops.h, launched on the backend's stream (only
// sum_squares synchronises). Same semantics and shapes; scratch comes from the backend.
#pragma once

#include "backend/cuda_backend.h"
#include "kernels/train_ops.h"

namespace kiln::cuda {

void rmsnorm_backward(CudaBackend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy);
void swiglu_backward(CudaBackend& be, Tensor d_gate_up, Tensor dout, Tensor gate_up);
void embedding_backward(CudaBackend& be, Tensor dtable, Tensor dy, Tensor ids);
void bias_backward(CudaBackend& be, Tensor db, Tensor dy);
void qkv_split_rope_forward(CudaBackend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                            float attention_scaling, Tensor q_norm, Tensor k_norm, float eps);
void qkv_split_rope_backward(CudaBackend& be, Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv, Tensor qkv,
                             Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                             float eps);
void attention_train_forward(CudaBackend& be, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal,
                             float scale);
void attention_train_backward(CudaBackend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                              Tensor lse, Tensor segment_ids, bool causal, float scale);
void cross_entropy_forward_backward(CudaBackend& be, Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const ops::CrossEntropyOptions& o);
void adamw_step(CudaBackend& be, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const ops::AdamWStep& s);
void sgd_step(CudaBackend& be, Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay, float grad_scale,
              int64_t decay_end);
double sum_squares(CudaBackend& be, Tensor x);

namespace detail {
// out[c] += sum over g < G of partial[g * stride + c] for c < ncols, in double in a fixed order: the
// deterministic reduction of per-block weight-gradient partial rows (backward.cu; qkv_train.cu).
void column_sum_add(CudaBackend& be, float* out, const float* partial, int64_t G, int64_t ncols, int64_t stride);
}  // namespace detail

}  // namespace kiln::cuda
