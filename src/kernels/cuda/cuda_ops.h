// CUDA twins of the ops in kernels/ops.h. Every launch goes on the backend's stream and returns
// without synchronising; no op allocates device memory except through the backend (scratch or the
// caching allocator), so the decode path can be captured in a CUDA graph. Same semantics and shapes
// as ops.h. One .cu file per op family under kernels/cuda/.
#pragma once

#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/ops.h"

namespace kiln::cuda {

void embedding_forward(CudaBackend& be, Tensor out, Tensor table, Tensor ids);
void rmsnorm_forward(CudaBackend& be, Tensor y, Tensor x, Tensor w, float eps);
void add_rmsnorm_forward(CudaBackend& be, Tensor y, Tensor residual, Tensor x, Tensor w, float eps, Tensor residual_in);
void rope_forward(CudaBackend& be, Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling);
void linear_forward(CudaBackend& be, Tensor y, Tensor x, Tensor w, Tensor bias);
void gemm(CudaBackend& be, Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta);
void linear_k_split_forward(CudaBackend& be, Tensor partials, Tensor x, Tensor w);
int32_t linear_k_split_parts(int64_t M, int64_t N, int64_t K, DType w_dtype);
void bias_add_forward(CudaBackend& be, Tensor y, Tensor bias);
bool fused_linear_valid(CudaBackend& be, ops::FusedLinear kind, int64_t M, int64_t K, DType w_dtype);
bool fused_linear_preferred(CudaBackend& be, ops::FusedLinear kind, int64_t M, int64_t N, int64_t K, DType w_dtype);
void norm_linear_forward(CudaBackend& be, Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias);
void norm_linear_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor bias);
void linear_residual_forward(CudaBackend& be, Tensor residual, Tensor x, Tensor w, Tensor bias);
// ops.h: decode_step_kernel_forward (decode_step_kernel.cu).
bool decode_step_kernel_supported(CudaBackend& be, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                                  int64_t num_layers, DType dtype);
void decode_step_kernel_forward(CudaBackend& be, const ops::DecodeStepArgs& a);
bool norm_linear_argmax_preferred(CudaBackend& be, int64_t M, int64_t N, int64_t K, DType w_dtype);
void norm_linear_argmax_forward(CudaBackend& be, Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps,
                                Tensor w, Tensor scratch);
bool norm_linear_qkv_rope_preferred(CudaBackend& be, int64_t M, int64_t N, int64_t K, int64_t D, DType w_dtype);
void norm_linear_qkv_rope_forward(CudaBackend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor x,
                                  Tensor norm_w, float eps, Tensor w, Tensor bias, Tensor positions, Tensor slots,
                                  Tensor inv_freq, float attention_scaling);
void linear_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor w, Tensor bias);
// The fused small-batch kernel itself (at most ops::kNormLinearMaxRows rows, K % 32 == 0), whatever
// the measured preference: for benchmarks and tests. y, x as the ops of `kind` take them.
void fused_linear_kernel_forward(CudaBackend& be, ops::FusedLinear kind, Tensor y, Tensor x, Tensor norm_w, float eps,
                                 Tensor w, Tensor bias);

// Streaming linear layers on Hopper for 1 .. kLinearTmaMaxRows rows (linear_tma.cu): TMA weight
// stream into wgmma, K split over a cluster for few-tile matrices, deterministic. x and w bf16, K a
// multiple of 8, 16-byte aligned bases. y = epilogue(x @ w^T + bias): stored in y's dtype, added
// into the f32 residual y, or SwiGLU of w = [gate; up] (y [M, N / 2]). k_splits 0 takes the rule's
// or chooses (linear_tma_launch says what runs).
constexpr int64_t kLinearTmaMaxRows = 128;
enum class TmaEpilogue { store, add_residual, swiglu };
bool linear_tma_valid(CudaBackend& be, int64_t M, int64_t K, DType dtype);
// Whether, by measurement, the streaming kernel beats what the op would run otherwise (cuBLASLt, or
// the fused small-batch kernel where that takes the shape) for M rows, N weight rows, width K. The
// environment's KILN_LINEAR_TMA replaces the measured rule, for measuring others (linear_tma.cu).
bool linear_tma_preferred(CudaBackend& be, TmaEpilogue epilogue, int64_t M, int64_t N, int64_t K, DType dtype);
void linear_tma_forward(CudaBackend& be, TmaEpilogue epilogue, Tensor y, Tensor x, Tensor w, Tensor bias,
                        int k_splits = 0);
// The launch linear_tma_forward makes of a shape with k_splits as given (0: chosen): the batch tile
// (16, 32, 64 or 128 rows), the weight tiles (grid x) and the K splits (grid y).
struct TmaLaunch {
  int batch_rows = 0, tiles = 0, splits = 1;
};
TmaLaunch linear_tma_launch(CudaBackend& be, TmaEpilogue epilogue, int64_t M, int64_t N, int64_t K, int k_splits);
void swiglu_forward(CudaBackend& be, Tensor out, Tensor gate_up);
void softmax_forward(CudaBackend& be, Tensor y, Tensor x);
void log_softmax_forward(CudaBackend& be, Tensor y, Tensor x);
void cast(CudaBackend& be, Tensor dst, Tensor src);
void add_inplace(CudaBackend& be, Tensor a, Tensor b);
void fill_normal(CudaBackend& be, Tensor t, float std, uint64_t seed);
void fill_constant(CudaBackend& be, Tensor t, float value);
void kv_cache_write(CudaBackend& be, Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots);
void qkv_rope_cache_write(CudaBackend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions, Tensor slots,
                          Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps, Tensor cos_sin);
void rope_cos_sin_table(CudaBackend& be, Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling);
void attention_forward(CudaBackend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr,
                       const PagedKV& kv, ops::AttentionBounds bounds, float scale);
// The decode kernel with its own input stage (ops.h: attention_decode_rope_forward); _supported: bf16
// or f16, head_dim 64 or 128, at most 16 query heads per KV head, at most one query per request;
// _preferred: supported and, by measurement, faster than the separate rotary kernel.
bool attention_decode_rope_supported(const Tensor& q, const Tensor& k_cache, ops::AttentionBounds bounds);
bool attention_decode_rope_preferred(const Tensor& q, const Tensor& k_cache, ops::AttentionBounds bounds);
void attention_decode_rope_forward(CudaBackend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor qkv,
                                   Tensor positions, Tensor slots, Tensor inv_freq, float attention_scaling,
                                   Tensor q_norm, Tensor k_norm, float eps, Tensor q_indptr, const PagedKV& kv,
                                   ops::AttentionBounds bounds, float scale);
void sample(CudaBackend& be, const ops::SamplingBatch& batch);
void reset_token_counts(CudaBackend& be, Tensor counts_row, Tensor prompt, Tensor output);
void adjust_logits(CudaBackend& be, Tensor logits, Tensor params, Tensor mask_words);

}  // namespace kiln::cuda
