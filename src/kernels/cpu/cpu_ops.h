// CPU twins of the ops in kernels/ops.h: f32 math on host memory (inputs may be f32, bf16 or f16;
// outputs f32 unless noted). Same semantics and shapes as ops.h; no backend argument. These are the
// reference the CUDA kernels are tested against, so clarity beats speed, except for the GEMM
// (OpenBLAS) and attention (threaded over heads).
#pragma once

#include <vector>

#include "kernels/ops.h"

namespace kiln::cpu {

void embedding_forward(Tensor out, Tensor table, Tensor ids);
void rmsnorm_forward(Tensor y, Tensor x, Tensor w, float eps);
void add_rmsnorm_forward(Tensor y, Tensor residual, Tensor x, Tensor w, float eps, Tensor residual_in);
void linear_k_split_forward(Tensor partials, Tensor x, Tensor w);
void rope_forward(Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling);
void linear_forward(Tensor y, Tensor x, Tensor w, Tensor bias);
void linear_forward_row_invariant(Tensor y, Tensor x, Tensor w, Tensor bias);
void norm_linear_forward(Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias);
void norm_linear_swiglu_forward(Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias);
void norm_linear_argmax_forward(Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps, Tensor w);
void linear_swiglu_forward(Tensor out, Tensor x, Tensor w, Tensor bias);
void linear_residual_forward(Tensor residual, Tensor x, Tensor w, Tensor bias);
void gemm(Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta);
void bias_add_forward(Tensor y, Tensor bias);
void swiglu_forward(Tensor out, Tensor gate_up);
void softmax_forward(Tensor y, Tensor x);
void log_softmax_forward(Tensor y, Tensor x);
void cast(Tensor dst, Tensor src);
void add_inplace(Tensor a, Tensor b);
void fill_normal(Tensor t, float std, uint64_t seed);
void fill_constant(Tensor t, float value);
void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots);
void qkv_rope_cache_write(Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions, Tensor slots,
                          Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps);
void rope_cos_sin_table(Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling);
void attention_forward(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr, const PagedKV& kv,
                       ops::AttentionBounds bounds, float scale);
void sample(const ops::SamplingBatch& batch);
void reset_token_counts(Tensor counts_row, Tensor prompt, Tensor output);
void adjust_logits(Tensor logits, Tensor params, Tensor mask_words);
void stage_step_inputs(Tensor dst, Tensor host, int64_t ids_begin, int64_t ids_count, Tensor prev_tokens);

}  // namespace kiln::cpu
