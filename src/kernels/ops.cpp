#include "kernels/ops.h"

#include "kernels/rng.h"
#include "kernels/sampling_math.h"

#include "kernels/cpu/cpu_ops.h"
#ifdef KILN_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace kiln::ops {
namespace {
#ifdef KILN_WITH_CUDA
CudaBackend& cuda_backend(Backend& be) { return static_cast<CudaBackend&>(be); }
#endif
}  // namespace

void embedding_forward(Backend& be, Tensor out, Tensor table, Tensor ids) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::embedding_forward(cuda_backend(be), out, table, ids);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::embedding_forward(out, table, ids);
}

void rmsnorm_forward(Backend& be, Tensor y, Tensor x, Tensor w, float eps) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::rmsnorm_forward(cuda_backend(be), y, x, w, eps);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::rmsnorm_forward(y, x, w, eps);
}

void add_rmsnorm_forward(Backend& be, Tensor y, Tensor residual, Tensor x, Tensor w, float eps, Tensor residual_in) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::add_rmsnorm_forward(cuda_backend(be), y, residual, x, w, eps, residual_in);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::add_rmsnorm_forward(y, residual, x, w, eps, residual_in);
}

void linear_k_split_forward(Backend& be, Tensor partials, Tensor x, Tensor w) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::linear_k_split_forward(cuda_backend(be), partials, x, w);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::linear_k_split_forward(partials, x, w);
}

int32_t linear_k_split_parts(Backend& be, int64_t M, int64_t N, int64_t K, DType w_dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::linear_k_split_parts(M, N, K, w_dtype);
#endif
  (void)be, (void)M, (void)N, (void)K, (void)w_dtype;
  return 0;
}

void rope_forward(Backend& be, Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::rope_forward(cuda_backend(be), x, positions, inv_freq, attention_scaling);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::rope_forward(x, positions, inv_freq, attention_scaling);
}

void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::linear_forward(cuda_backend(be), y, x, w, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  if (be.batch_invariant()) return cpu::linear_forward_row_invariant(y, x, w, bias);
  cpu::linear_forward(y, x, w, bias);
}

bool fused_linear_valid(Backend& be, FusedLinear kind, int64_t M, int64_t K, DType w_dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::fused_linear_valid(cuda_backend(be), kind, M, K, w_dtype);
#endif
  (void)w_dtype;
  const bool normed = kind == FusedLinear::norm || kind == FusedLinear::norm_swiglu;
  return be.device().is_cpu() && M >= 1 && M <= (normed ? kNormLinearMaxRows : kFusedLinearMaxRows) && K > 0;
}

bool fused_linear_preferred(Backend& be, FusedLinear kind, int64_t M, int64_t N, int64_t K, DType w_dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::fused_linear_preferred(cuda_backend(be), kind, M, N, K, w_dtype);
#endif
  (void)N;
  return fused_linear_valid(be, kind, M, K, w_dtype);
}

void norm_linear_forward(Backend& be, Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::norm_linear_forward(cuda_backend(be), y, x, norm_w, eps, w, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::norm_linear_forward(y, x, norm_w, eps, w, bias);
}

void norm_linear_swiglu_forward(Backend& be, Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::norm_linear_swiglu_forward(cuda_backend(be), out, x, norm_w, eps, w, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::norm_linear_swiglu_forward(out, x, norm_w, eps, w, bias);
}

bool norm_linear_argmax_preferred(Backend& be, int64_t M, int64_t N, int64_t K, DType w_dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::norm_linear_argmax_preferred(cuda_backend(be), M, N, K, w_dtype);
#endif
  return fused_linear_preferred(be, FusedLinear::norm, M, N, K, w_dtype);
}

void norm_linear_argmax_forward(Backend& be, Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor scratch) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::norm_linear_argmax_forward(cuda_backend(be), logits, tokens, x, norm_w, eps, w, scratch);
#endif
  KILN_ASSERT(be.device().is_cpu());
  (void)scratch;
  cpu::norm_linear_argmax_forward(logits, tokens, x, norm_w, eps, w);
}

bool decode_step_kernel_supported(Backend& be, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                                  int64_t num_layers, DType dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::decode_step_kernel_supported(cuda_backend(be), H, Hq, Hkv, D, I, num_layers, dtype);
#endif
  (void)be, (void)H, (void)Hq, (void)Hkv, (void)D, (void)I, (void)num_layers, (void)dtype;
  return false;
}

void decode_step_kernel_forward(Backend& be, const DecodeStepArgs& a) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::decode_step_kernel_forward(cuda_backend(be), a);
#endif
  (void)a;
  KILN_ASSERT(false && "decode_step_kernel_forward: CUDA only (ask decode_step_kernel_supported)");
}

bool norm_linear_qkv_rope_preferred(Backend& be, int64_t M, int64_t N, int64_t K, int64_t head_dim, DType w_dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::norm_linear_qkv_rope_preferred(cuda_backend(be), M, N, K, head_dim, w_dtype);
#endif
  return fused_linear_preferred(be, FusedLinear::norm, M, N, K, w_dtype) && head_dim > 0 && head_dim % 2 == 0 &&
         N % head_dim == 0;
}

void norm_linear_qkv_rope_forward(Backend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor x,
                                  Tensor norm_w, float eps, Tensor w, Tensor bias, Tensor positions, Tensor slots,
                                  Tensor inv_freq, float attention_scaling) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::norm_linear_qkv_rope_forward(cuda_backend(be), q_out, k_cache, v_cache, qkv, x, norm_w, eps, w, bias,
                                              positions, slots, inv_freq, attention_scaling);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::norm_linear_forward(qkv, x, norm_w, eps, w, bias);
  qkv_rope_cache_write(be, q_out, k_cache, v_cache, qkv, positions, slots, inv_freq, attention_scaling, Tensor{},
                       Tensor{}, eps);
}

void linear_residual_forward(Backend& be, Tensor residual, Tensor x, Tensor w, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::linear_residual_forward(cuda_backend(be), residual, x, w, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::linear_residual_forward(residual, x, w, bias);
}

void linear_swiglu_forward(Backend& be, Tensor out, Tensor x, Tensor w, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::linear_swiglu_forward(cuda_backend(be), out, x, w, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::linear_swiglu_forward(out, x, w, bias);
}

void gemm(Backend& be, Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::gemm(cuda_backend(be), c, a, trans_a, b, trans_b, alpha, beta);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::gemm(c, a, trans_a, b, trans_b, alpha, beta);
}

void bias_add_forward(Backend& be, Tensor y, Tensor bias) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::bias_add_forward(cuda_backend(be), y, bias);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::bias_add_forward(y, bias);
}

void swiglu_forward(Backend& be, Tensor out, Tensor gate_up) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::swiglu_forward(cuda_backend(be), out, gate_up);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::swiglu_forward(out, gate_up);
}

void softmax_forward(Backend& be, Tensor y, Tensor x) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::softmax_forward(cuda_backend(be), y, x);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::softmax_forward(y, x);
}

void log_softmax_forward(Backend& be, Tensor y, Tensor x) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::log_softmax_forward(cuda_backend(be), y, x);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::log_softmax_forward(y, x);
}

void cast(Backend& be, Tensor dst, Tensor src) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::cast(cuda_backend(be), dst, src);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::cast(dst, src);
}

void add_inplace(Backend& be, Tensor a, Tensor b) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::add_inplace(cuda_backend(be), a, b);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::add_inplace(a, b);
}

void fill_normal(Backend& be, Tensor t, float std, uint64_t seed) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::fill_normal(cuda_backend(be), t, std, seed);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::fill_normal(t, std, seed);
}

void fill_constant(Backend& be, Tensor t, float value) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::fill_constant(cuda_backend(be), t, value);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::fill_constant(t, value);
}

void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::kv_cache_write(cuda_backend(be), k_cache, v_cache, k, v, slots);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::kv_cache_write(k_cache, v_cache, k, v, slots);
}

void qkv_rope_cache_write(Backend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions,
                          Tensor slots, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                          float eps, Tensor cos_sin) {
  if (cos_sin.data) {
    KILN_ASSERT(cos_sin.dtype == DType::f32 && cos_sin.ndim() == 3 && cos_sin.size(0) == q_out.size(0) &&
                cos_sin.size(1) == q_out.size(2) / 2 && cos_sin.size(2) == 2);
  }
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::qkv_rope_cache_write(cuda_backend(be), q_out, k_cache, v_cache, qkv, positions, slots, inv_freq,
                                      attention_scaling, q_norm, k_norm, eps, cos_sin);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::qkv_rope_cache_write(q_out, k_cache, v_cache, qkv, positions, slots, inv_freq, attention_scaling, q_norm, k_norm,
                            eps);
}

void rope_cos_sin_table(Backend& be, Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::rope_cos_sin_table(cuda_backend(be), table, positions, inv_freq, attention_scaling);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::rope_cos_sin_table(table, positions, inv_freq, attention_scaling);
}

bool qkv_rope_reads_table(Backend& be, int64_t T) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) {
    // Prefill steps. Measured (bench_engine single-request prefill, astrai-1b, H200, two alternations
    // in one call): 8K 37.67 / 37.38 ms with the table against 37.97 / 38.16 without, 30K 247.1 /
    // 246.2 against 249.3 / 249.9. Decode steps keep computing their few pairs in place (a table
    // would cost a launch there).
    return T > kFusedLinearMaxRows;
  }
#endif
  (void)be, (void)T;
  return false;
}

void attention_forward(Backend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr,
                       const PagedKV& kv, AttentionBounds bounds, float scale) {
  KILN_ASSERT(kv.page_size > 0);
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::attention_forward(cuda_backend(be), out, q, k_cache, v_cache, q_indptr, kv, bounds, scale);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::attention_forward(out, q, k_cache, v_cache, q_indptr, kv, bounds, scale);
}

bool attention_decode_rope_preferred(Backend& be, Tensor q, Tensor k_cache, AttentionBounds bounds) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::attention_decode_rope_preferred(q, k_cache, bounds);
#endif
  (void)be, (void)q, (void)k_cache, (void)bounds;
  return false;
}

void attention_decode_rope_forward(Backend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor qkv,
                                   Tensor positions, Tensor slots, Tensor inv_freq, float attention_scaling,
                                   Tensor q_norm, Tensor k_norm, float eps, Tensor q_indptr, const PagedKV& kv,
                                   AttentionBounds bounds, float scale) {
  KILN_ASSERT(kv.page_size > 0 && bounds.max_q_len <= 1);
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda() && cuda::attention_decode_rope_supported(q, k_cache, bounds))
    return cuda::attention_decode_rope_forward(cuda_backend(be), out, q, k_cache, v_cache, qkv, positions, slots,
                                               inv_freq, attention_scaling, q_norm, k_norm, eps, q_indptr, kv, bounds,
                                               scale);
#endif
  qkv_rope_cache_write(be, q, k_cache, v_cache, qkv, positions, slots, inv_freq, attention_scaling, q_norm, k_norm,
                       eps);
  attention_forward(be, out, q, k_cache, v_cache, q_indptr, kv, bounds, scale);
}

namespace {

// Shapes and dtypes of a sampling call (what the host knows); per-row parameters are the engine's.
void check_sampling_batch(const SamplingBatch& s) {
  KILN_ASSERT(s.logits.dtype == DType::f32 && s.logits.ndim() == 2);
  const int64_t B = s.logits.size(0), V = s.logits.size(1);
  KILN_ASSERT(V >= 1 && V < sampling::kMaxVocab);
  KILN_ASSERT(s.params.dtype == DType::i32 && s.params.ndim() == 2 && s.params.size(0) == B &&
              s.params.size(1) == kSamplingRowWords);
  KILN_ASSERT(s.tokens.dtype == DType::i32 && s.tokens.ndim() == 1 && s.tokens.size(0) == B);
  using sampling::present;
  if (present(s.counts))
    KILN_ASSERT(s.counts.dtype == DType::i32 && s.counts.ndim() == 2 && s.counts.size(1) == V);
  if (present(s.logprobs))
    KILN_ASSERT(s.logprobs.dtype == DType::f32 && s.logprobs.ndim() == 1 && s.logprobs.size(0) == B);
  KILN_ASSERT(present(s.top_ids) == present(s.top_logprobs));
  if (present(s.top_ids)) {
    KILN_ASSERT(s.top_ids.dtype == DType::i32 && s.top_ids.ndim() == 2 && s.top_ids.size(0) == B &&
                s.top_ids.size(1) == kMaxTopLogprobs);
    KILN_ASSERT(s.top_logprobs.dtype == DType::f32 && s.top_logprobs.shape == s.top_ids.shape);
  }
  if (s.full) KILN_ASSERT(s.workspace.nbytes() >= sampling_workspace_bytes(B, V));
}

}  // namespace

int64_t sampling_workspace_bytes(int64_t batch, int64_t vocab) {
  return batch * sampling::row_workspace_bytes(vocab);
}

void sample(Backend& be, const SamplingBatch& batch) {
  check_sampling_batch(batch);
  if (batch.logits.size(0) == 0) return;
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::sample(cuda_backend(be), batch);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::sample(batch);
}

void adjust_logits(Backend& be, Tensor logits, Tensor params, Tensor mask_words) {
  KILN_ASSERT(logits.dtype == DType::f32 && logits.ndim() == 2);
  KILN_ASSERT(params.dtype == DType::i32 && params.ndim() == 2 && params.size(0) == logits.size(0) &&
              params.size(1) == kSamplingRowWords);
  KILN_ASSERT(mask_words.dtype == DType::i32 && mask_words.ndim() == 1);
  if (logits.numel() == 0) return;
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::adjust_logits(cuda_backend(be), logits, params, mask_words);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::adjust_logits(logits, params, mask_words);
}

void reset_token_counts(Backend& be, Tensor counts_row, Tensor prompt, Tensor output) {
  KILN_ASSERT(counts_row.dtype == DType::i32 && counts_row.ndim() == 1);
  for (const Tensor& ids : {prompt, output})
    KILN_ASSERT(!sampling::present(ids) || (ids.dtype == DType::i32 && ids.ndim() == 1));
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::reset_token_counts(cuda_backend(be), counts_row, prompt, output);
#endif
  KILN_ASSERT(be.device().is_cpu());
  cpu::reset_token_counts(counts_row, prompt, output);
}

double sampling_uniform(uint64_t seed, uint64_t position) { return rng::uniform(seed, position); }

}  // namespace kiln::ops
