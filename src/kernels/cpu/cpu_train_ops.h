// CPU twins of the training ops in kernels/train_ops.h: f32 math on host memory, written for
// clarity (they are the reference the CUDA kernels are tested against). Same semantics and shapes.
#pragma once

#include "kernels/train_ops.h"

namespace kiln::cpu {

void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy);
void swiglu_backward(Tensor d_gate_up, Tensor dout, Tensor gate_up);
void embedding_backward(Tensor dtable, Tensor dy, Tensor ids);
void bias_backward(Tensor db, Tensor dy);
void qkv_split_rope_forward(Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                            float attention_scaling, Tensor q_norm, Tensor k_norm, float eps);
void qkv_split_rope_backward(Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv, Tensor qkv,
                             Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                             float eps);
void attention_train_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal,
                             float scale);
void attention_train_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                              Tensor lse, Tensor segment_ids, bool causal, float scale);
void cross_entropy_forward_backward(Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const ops::CrossEntropyOptions& o);
void adamw_step(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const ops::AdamWStep& s);
void sgd_step(Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay, float grad_scale,
              int64_t decay_end);
double sum_squares(Tensor x);

}  // namespace kiln::cpu
