// The op families of kiln's models, each with a CPU twin (kernels/cpu/) and a CUDA twin
// (kernels/cuda/). Every entry point dispatches on the device of its tensors, which must all live on
// the backend's device (index arrays included). CPU ops compute in f32; CUDA ops take f32 or bf16
// activations (f16 where noted) and accumulate in f32.
//
// Layouts: training will use dense [B, S, ...] tensors; inference uses packed 3-D tensors where the
// tokens of all requests in one step are concatenated: [T, heads, head_dim] with int32 indptr
// arrays telling which rows belong to which request. Row-wise ops below take any leading shape and
// treat the tensor as [rows, last_dim].
//
// Argument checking: shapes and dtypes are checked with KILN_ASSERT (a mismatch is a bug in the
// caller); user-facing validation (ids within the vocabulary, ...) happens above this layer.
// Backward passes will sit beside each forward as <op>_backward with the same conventions.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/paged_kv.h"
#include "kernels/sampling.h"

namespace kiln::ops {

// out[t, :] = table[ids[t], :]
// ids: [T] i32, table: [V, H], out: [T, H] (out.dtype may differ from table.dtype: converted).
void embedding_forward(Backend& be, Tensor out, Tensor table, Tensor ids);

// y = x / sqrt(mean(x^2) + eps) * w over the last dimension, f32 math.
// x: [..., H], w: [H], y: same shape as x (may alias x). Per-head q/k norm is this op on
// [T, heads, head_dim] with w: [head_dim].
void rmsnorm_forward(Backend& be, Tensor y, Tensor x, Tensor w, float eps);

// residual = residual_in + x; y = rmsnorm(residual) * w. residual, x, y: [..., H]; w: [H].
// residual_in (same shape and dtype as residual) defaults to residual itself (residual += x); given,
// the sum goes to a new tensor and residual_in is kept (training keeps every layer's input).
// Fuses the transformer's residual add with the next norm (one pass over memory).
// x may also be [S, ..., H]: S partial products (linear_k_split_forward), summed in f32 in order
// s = 0, 1, ..., S - 1 and then added to residual_in (one rounding to residual's dtype).
void add_rmsnorm_forward(Backend& be, Tensor y, Tensor residual, Tensor x, Tensor w, float eps,
                         Tensor residual_in = {});

// A projection split along K into S parts whose f32 products a consumer adds up
// (add_rmsnorm_forward): partials[s] = x[:, s K/S : (s + 1) K/S] @ w[:, s K/S : (s + 1) K/S]^T.
// x: [M, K], w: [N, K] (x's dtype), partials: [S, M, N] f32, K % S == 0. The decode step runs the
// MLP's down projection so: the split-K reduction, the residual add and the next norm in one kernel.
void linear_k_split_forward(Backend& be, Tensor partials, Tensor x, Tensor w);
// The parts the decode step splits an [M, K] x [N, K]^T projection into for that (0: it is not
// split; at most kMaxKSplitParts). The CPU backend never splits (its products are not split-K).
constexpr int32_t kMaxKSplitParts = 4;
int32_t linear_k_split_parts(Backend& be, int64_t M, int64_t N, int64_t K, DType w_dtype);

// Rotary embedding in place, Hugging Face "rotate half" convention: for pair i < D/2 of each head,
//   (x[i], x[i + D/2]) <- (x[i] c - x[i + D/2] s, x[i + D/2] c + x[i] s),  angle = pos * inv_freq[i]
// computed in f32 (cos/sin of pos*inv_freq, multiplied by attention_scaling).
// x: [T, heads, D], positions: [T] i32, inv_freq: [D/2] f32 (already scaled per rope type).
void rope_forward(Backend& be, Tensor x, Tensor positions, Tensor inv_freq, float attention_scaling);

// Linear layer: y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N] if bias.data != nullptr).
// CPU: f32 through OpenBLAS. CUDA: bf16/f16 x and w with f32 accumulation through cuBLASLt;
// y may be bf16 or f32 (logits). bias has y's dtype or f32.
void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, Tensor bias = {});

// Small-batch linear layers with their neighbours fused: the decode path of the transformer, where
// a step's few rows make each projection a matrix-vector product bound by reading the weights.
// w: [N, K]; x: [M, K] viewed from [..., K]; bias: [N] or absent.
//   norm_linear_forward:        y[M, N] = rmsnorm(x; norm_w, eps) @ w^T + bias
//   norm_linear_swiglu_forward: out[M, I] = silu(g) * u, [g | u] = rmsnorm(x) @ w^T + bias, w: [2I, K]
//   linear_swiglu_forward:      out[M, I] = silu(g) * u, [g | u] = x @ w^T + bias, w: [2I, K]
//   linear_residual_forward:    residual[M, N] += x @ w^T + bias   (residual f32)
// rmsnorm(x) here is r * (x * norm_w) with r = 1 / sqrt(mean(x^2) + eps) applied to the product's
// f32 result: y = r * ((x * norm_w) @ w^T). The normed input x is the f32 residual stream (at most
// kNormLinearMaxRows rows); the other x has w's dtype (at most kFusedLinearMaxRows rows). CUDA:
// kiln's own kernels, deterministic (no atomics): up to 32 rows tensor cores over the batch rows
// with the norm folded in (bf16/f16 weights, x * norm_w rounded to w's dtype, K a multiple of 32);
// on Hopper, bf16, a TMA weight stream into wgmma (K a multiple of 8); 16-byte aligned bases; y
// bf16/f16/f32. CPU: f32.
constexpr int32_t kFusedLinearMaxRows = 128;
constexpr int32_t kNormLinearMaxRows = 32;
enum class FusedLinear { norm, norm_swiglu, swiglu, residual };
// Whether the fused layer of `kind` takes M rows of width K with weights of w_dtype on this backend.
bool fused_linear_valid(Backend& be, FusedLinear kind, int64_t M, int64_t K, DType w_dtype);
// Whether the fused layer of `kind` is valid and, by measurement, faster than the separate ops
// (cuBLASLt and the norm / SwiGLU / add kernels) for M rows, N outputs (SwiGLU: I) of width K. The
// CPU answers with validity, so that its twin runs wherever the CUDA path might.
bool fused_linear_preferred(Backend& be, FusedLinear kind, int64_t M, int64_t N, int64_t K, DType w_dtype);
void norm_linear_forward(Backend& be, Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias = {});
void norm_linear_swiglu_forward(Backend& be, Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor bias = {});
void linear_swiglu_forward(Backend& be, Tensor out, Tensor x, Tensor w, Tensor bias = {});
void linear_residual_forward(Backend& be, Tensor residual, Tensor x, Tensor w, Tensor bias = {});

// A greedy decode step's vocabulary head: norm_linear_forward(logits, x, norm_w, eps, w) and, fused
// in, each row's greedy token: tokens[m] (i32) = the first index of the largest logits[m] as stored
// (NaN as -inf), the token ops::sample gives a greedy row without counts. scratch:
// kArgmaxScratchWords i32 words on the device, zero before the first call; every call leaves them
// zero, so a captured step replays. _preferred: where the fused head is the better choice (CUDA:
// one row, on the warp-per-row kernel, whose last block picks the token instead of the sampler's
// argmax kernel; CPU: wherever norm_linear is); elsewhere the head, then ops::sample.
constexpr int64_t kArgmaxScratchWords = 4;
bool norm_linear_argmax_preferred(Backend& be, int64_t M, int64_t N, int64_t K, DType w_dtype);
void norm_linear_argmax_forward(Backend& be, Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor scratch);

// One decode step of one request (one token, its logits) as a single persistent kernel: the
// embedding of ids[0], every layer (RMSNorm, q/k/v, the rotation and the KV write at slots[0],
// attention over the request's pages, o into the residual stream, RMSNorm, gate/up with SwiGLU,
// down into the residual stream), the final norm and the head into logits [V] (f32), and with
// `token` the greedy token (the first index of the largest logit; NaN as -inf). CUDA only
// (kernels/cuda/decode_step_kernel.cu; an experiment beside the layered forward, which is its
// reference); _supported says which models and devices. sync: kDecodeStepSyncWords(L) i32 words on
// the device, zero before the first call; every call leaves them zero (a captured step replays).
struct DecodeStepLayer {
  Tensor input_norm, qkv_proj, o_proj, post_norm, gate_up_proj, down_proj;  // bf16, no biases
  Tensor k_cache, v_cache;                                                  // [slots, Hkv, D]
};
struct DecodeStepArgs {
  const DecodeStepLayer* layers = nullptr;
  int32_t num_layers = 0;
  Tensor embed, final_norm, head;            // [V, H], [H], [V, H]
  Tensor ids, positions, slots;              // [1] i32 each
  PagedKV kv;                                // the request's pages (one request)
  int32_t max_kv_len = 0;                    // the context bound the step is run (or captured) for
  Tensor inv_freq;                           // [D / 2] f32
  float rope_scaling = 1.0f, eps = 0.0f, attn_scale = 0.0f;
  Tensor x, q, attn, act;                    // workspace: [H] f32, [Hq * D], [Hq * D], [I] bf16
  Tensor logits, token;                      // [V] f32; [1] i32 or absent
  Tensor sync;                               // kDecodeStepSyncWords(num_layers) i32
  // Optional, for profiling: i64 [blocks, 6 * num_layers + 1, 2], per block and step (the layers'
  // six, then the head) the device time (ns, %globaltimer) its wait for the step before ended and
  // its part of the step ended (blocks: the SM count).
  Tensor trace;
};
constexpr int64_t kDecodeStepSyncWords(int64_t num_layers) { return 2 + 6 * num_layers + 1; }
constexpr int64_t kDecodeStepTraceBlocks = 512;
bool decode_step_kernel_supported(Backend& be, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                                  int64_t num_layers, DType dtype);
void decode_step_kernel_forward(Backend& be, const DecodeStepArgs& a);

// The attention block's input stage fused into its projection, for decode steps:
// norm_linear_forward(qkv, x, norm_w, eps, w, bias) then qkv_rope_cache_write(q_out, k_cache, v_cache,
// qkv, positions, slots, inv_freq, attention_scaling) without q/k norms, with the same arithmetic
// (the projection rounded to q_out's dtype, then rotated in f32). q_out, k_cache and v_cache share
// one dtype; w: [(Hq + 2 Hkv) * D, K]. qkv [M, (Hq + 2 Hkv) * D] is scratch: the CPU twin computes
// the projection there, the CUDA kernel writes q, k and v from its accumulators and leaves it alone
// (each thread holds a rotation pair: weight rows d and d + D/2 of a head share a tile, D % 16 == 0).
// _preferred: valid and, by measurement, the better choice (CPU: wherever norm_linear is).
bool norm_linear_qkv_rope_preferred(Backend& be, int64_t M, int64_t N, int64_t K, int64_t head_dim, DType w_dtype);
void norm_linear_qkv_rope_forward(Backend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor x,
                                  Tensor norm_w, float eps, Tensor w, Tensor bias, Tensor positions, Tensor slots,
                                  Tensor inv_freq, float attention_scaling);

// General matrix product for the backward passes: C = alpha * op(A) @ op(B) + beta * C, row-major,
// op(X) = X^T when trans_X. A: [M, K] (or [K, M]), B: [K, N] (or [N, K]), C: [M, N].
void gemm(Backend& be, Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta);

// y[m, n] += bias[n]. y: [M, N], bias: [N].
void bias_add_forward(Backend& be, Tensor y, Tensor bias);

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, I + i], silu(g) = g / (1 + exp(-g)).
// gate_up: [T, 2I] (the gate and up projections concatenated per row), out: [T, I].
void swiglu_forward(Backend& be, Tensor out, Tensor gate_up);

// Row-wise softmax / log-softmax over the last dimension in f32. x: [..., V], y: f32 same shape.
void softmax_forward(Backend& be, Tensor y, Tensor x);
void log_softmax_forward(Backend& be, Tensor y, Tensor x);

// dst = src converted elementwise (f32, bf16, f16). Same element count.
void cast(Backend& be, Tensor dst, Tensor src);

// a += b elementwise (same shape; b may be f32 when a is bf16).
void add_inplace(Backend& be, Tensor a, Tensor b);

// Fills t (f32/bf16/f16) with N(0, std^2) from a counter-based generator keyed by (seed, index):
// the same seed gives the same values on every device up to the storage rounding.
void fill_normal(Backend& be, Tensor t, float std, uint64_t seed);
// Fills t (f32/bf16/f16) with a constant.
void fill_constant(Backend& be, Tensor t, float value);

// Padding rule for the unused rows of a captured (bucket-sized) batch, the same in both twins: a
// token row whose slot is negative writes no key/value (kv_cache_write, qkv_rope_cache_write); a
// request whose query run is empty (q_indptr[b] == q_indptr[b + 1]) and that has no pages computes
// nothing; rows of q/out that belong to no request are left untouched. So a batch padded with rows
// of slot -1 and empty requests computes, for its real rows, exactly what the unpadded batch does.

// Writes this step's keys/values into the cache: k_cache[slots[t]] = k[t], same for v.
// k, v: [T, Hkv, D], k_cache, v_cache: [S, Hkv, D], slots: [T] i32 (slot < S; negative: skipped).
void kv_cache_write(Backend& be, Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots);

// The attention block's input stage, fused: splits the packed q/k/v projection, applies the
// optional per-head RMSNorm of q and k (Qwen3), rotary embedding to q and k, and writes q to
// `q_out` and k, v into the cache slots. Same arithmetic as rmsnorm_forward (rounded to the
// output dtype) followed by rope_forward and kv_cache_write, in one pass.
// qkv:     [T, (Hq + 2 Hkv) * D]  each row: Hq query heads, then Hkv key heads, then Hkv value heads
// q_out:   [T, Hq, D];  k_cache, v_cache: [S, Hkv, D];  positions, slots: [T] i32 (slot < 0: no write)
// inv_freq: [D/2] f32; q_norm, k_norm: [D] or absent (data == nullptr)
// cos_sin: absent, or rope_cos_sin_table's output for these positions, inv_freq and scaling (the
// CUDA kernel then reads its pairs instead of computing them; the CPU twin computes the same values).
void qkv_rope_cache_write(Backend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions,
                          Tensor slots, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm,
                          float eps, Tensor cos_sin = {});

// The rotary embedding's (cos, sin) pairs of a step's tokens, computed once for every layer's
// qkv_rope_cache_write: table[t, i] = (c, s) of positions[t] * inv_freq[i], times attention_scaling,
// with rope_forward's arithmetic. table: [T, D/2, 2] f32; positions: [T] i32; inv_freq: [D/2] f32.
void rope_cos_sin_table(Backend& be, Tensor table, Tensor positions, Tensor inv_freq, float attention_scaling);
// Whether qkv_rope_cache_write reads such a table on this backend for a step of T tokens. CUDA:
// steps past the decode sizes (prefill), where every layer would otherwise compute a double-precision
// cos and sin per head and pair; the CPU computes each token's pairs once per call anyway.
bool qkv_rope_reads_table(Backend& be, int64_t T);

// Host-side sizes of an attention call. The kernels read each request's true lengths from the
// device arrays; these bounds fix the launch shape (so a captured CUDA graph can be replayed for
// other lengths up to the bounds).
struct AttentionBounds {
  int32_t batch = 0;       // number of requests B (padding requests included)
  int32_t max_q_len = 0;   // longest query run of any request this step
  int32_t max_kv_len = 0;  // longest context (cached prefix + this step's tokens) of any request
};

// Causal grouped-query attention over a packed batch whose keys/values sit in a paged cache
// (kernels/paged_kv.h: key j of request b is pool row paged_kv_slot(...)).
// q:        [T, Hq, D]  request b's queries are rows q_indptr[b] .. q_indptr[b+1] (q_len of them)
// k_cache:  [S, Hkv, D] the pool; likewise v_cache. kv: request b's context of kv_len(b) >= q_len keys
// out:      [T, Hq, D]
// q_indptr: [B+1] i32. Query i of request b sits at position kv_len - q_len + i and attends to keys
// 0 .. that position: the queries are the last q_len tokens of the context (a cached prefix is the
// first kv_len - q_len). Query head h reads kv head h / (Hq / Hkv). softmax(scale * q k^T) v with f32
// accumulation; D is 64, 128 (CUDA fast paths) or any even value up to 256 (CPU, CUDA generic path).
void attention_forward(Backend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr,
                       const PagedKV& kv, AttentionBounds bounds, float scale);

// A decode step's attention with its input stage folded in: the same as qkv_rope_cache_write(q,
// k_cache, v_cache, qkv, positions, slots, inv_freq, attention_scaling, q_norm, k_norm, eps) then
// attention_forward(out, q, k_cache, v_cache, q_indptr, paged, bounds, scale), bit for bit, for
// steps whose requests have at most one query each (bounds.max_q_len <= 1; request b's query is
// token q_indptr[b] of qkv, positions and slots). q [T, Hq, D] is scratch: the CPU twin writes it,
// the CUDA kernel leaves it alone (each attention block rotates its own query heads, and the one
// whose share of the keys holds the new key writes it and the value), so no kernel runs between
// the projection and the attention. _preferred: the backend has that kernel for these shapes (CUDA:
// bf16 or f16, head_dim 64 or 128, at most 16 query heads per KV head) and it is the faster choice
// for these bounds (by measurement); elsewhere the call runs the two ops.
bool attention_decode_rope_preferred(Backend& be, Tensor q, Tensor k_cache, AttentionBounds bounds);
void attention_decode_rope_forward(Backend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor qkv,
                                   Tensor positions, Tensor slots, Tensor inv_freq, float attention_scaling,
                                   Tensor q_norm, Tensor k_norm, float eps, Tensor q_indptr, const PagedKV& paged,
                                   AttentionBounds bounds, float scale);

}  // namespace kiln::ops
