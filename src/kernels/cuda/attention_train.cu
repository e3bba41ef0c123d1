// CUDA dense masked training attention (kiln::cuda::attention_train_forward / _backward; semantics
// in kernels/train_ops.h, CPU twin in kernels/cpu/attention_train.cpp).
//
// Shapes: q [B, Hq, S, D]; k, v [B, Hkv, S, D]; out, dout [B, S, Hq, D]; lse [B, Hq, S] f32;
// segment_ids [B, S] i32 or absent; dq [B, Hq, S, D]; dk, dv [B, Hkv, S, D]. Query head h reads
// kv head h / G (G = Hq / Hkv). Query i sees key j iff (!causal || j <= i) and, with segment ids,
// seg[j] == seg[i] >= 0. The S x S score matrix is never stored in device memory.
//
// Math (sl = scale * log2 e; softmax in the log2 domain with ex2.approx):
//   forward  s_ij = sl * q_i.k_j, m_i = max_j s_ij, l_i = sum_j 2^(s_ij - m_i),
//            out_i = sum_j 2^(s_ij - m_i) v_j / l_i,  lse_i = (m_i + log2 l_i) * ln 2
//            (a query that sees nothing: out = 0, lse = -inf);
//   backward lse2_i = lse_i * log2 e (+inf for a query that sees nothing, so P = 0 there),
//            delta_i = dout_i . out_i, P_ij = 2^(s_ij - lse2_i), dP_ij = dout_i . v_j,
//            dS_ij = P_ij (dP_ij - delta_i), dq_i = scale sum_j dS_ij k_j,
//            dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dout_i (sums over the G query heads
//            of a kv head for dk, dv).
//
// Files: this one has the entry points, the input checks, the segment summaries, the backward prep
// and dQ conversion kernels and the choice of path; attention_train_bwd.cu the wgmma backward main
// kernel; attention_train_generic.cu the generic kernels; attention_train_internal.h what they
// share. The fast path's forward kernel is the inference prefill's (attention_ws.cu).
//
// Fast path (bf16, D = 64 or 128, 16-byte aligned tensors, a device with wgmma: sm_90a Hopper),
// tensor-core variants (3 is the default; KILN_ATTN_TRAIN_VARIANT=1 or 3, read on every call,
// selects one):
//  1 wgmma:
//  * Forward: the inference prefill's warp-specialised kernel (attention_ws.cu, variant 3 of
//    attention.cu) in its dense layout: Q and K/V tiles by TMA from q, k, v viewed as
//    [B * H * S, D], the segment mask and tile skipping beside the causal one, lse out.
//  * Backward main kernel: one template, attn_train_bwd_wg_kernel<BwdWgCfg<D, NWG, kMinBlocks>>,
//    here in its 2-warpgroup configuration (BwdWg2Cfg<D>, 1 block per SM): 128 keys per block (64
//    per warpgroup: dK, dV in registers), 64 queries per step: S^T = K Q^T and dP^T = V dO^T (keys
//    as M), P^T / dS^T in registers feed dV += P^T dO and dK += dS^T Q as register A operands;
//    dS^T is stored transposed with stmatrix for dQ_w = dS_w K_w; the two warpgroups' dQ partials
//    are summed through shared memory and added to the f32 accumulator with 16-byte vector atomics
//    in a permuted, fully coalesced layout (undone by the tiled convert kernel).
//  3 is variant 1 with, for D = 64, the backward kernel in its one-warpgroup configuration
//    (BwdWg1Cfg: 64 keys per block, 3 blocks per SM so that one block's tensor-core work overlaps
//    another's elementwise work; dV, dK, dQ in one commit group, no dQ exchange). For D = 128
//    variants 1 and 3 are the same.
//  Common to both: tiles past the block's last query (causal) are never visited; tile pairs whose
//  segment-id ranges cannot meet are skipped; only tiles that cross the diagonal, the end of the
//  sequence or a segment boundary are masked elementwise. The backward runs three kernels:
//  (1) prep: one warp per query row computes delta = rowsum(dout * out), lse2, and zeroes the f32
//  dQ accumulator (scratch, [B, Hq, S_pad, D]); (2) the main kernel, whose Q / dO / lse2 / delta
//  tiles of the next query block are prefetched (cp.async, double buffered) while the current one
//  computes; (3) convert: dq = scale * accumulator in q's dtype, one block per 64-query tile
//  (coalesced reads of the permuted layout, transposed through shared memory).
//  Removed after measurement on the H200 (bench_attention_train, causal bf16, backward ms; D=64:
//  B 8 x S 2048, Hq 32 / Hkv 8; D=128: B 4 x S 4096): variant 0 (mma.sync m16n8k16,
//  FlashAttention-2 style forward and backward kernels, the fallback for GPUs without wgmma, which
//  kiln, built for sm_90a only, never ran by default; D=64 2.07 ms vs 1: 1.79 and 3: 1.24, D=128
//  7.37 vs 1: 4.79 and 3: 4.72), variant 2 (variant 1 with the elementwise work overlapped with the
//  tensor cores: S^T / dP^T in separate commit groups, dV issued before dS^T; D=64 1.81 ms vs 1:
//  1.79, D=128 4.78 vs 4.79) and variant 4 (the one-warpgroup D=64 backward at 2 blocks per SM
//  with each step's dQ atomics deferred past the next step's S^T / dP^T; D=64 1.32 ms vs 3: 1.24;
//  for D=128 it ran variant 3's kernels). The numbers 0, 2 and 4 are not reused.
//  Segment skipping uses per-32-token granule summaries computed by a small kernel: (min id, max
//  id) over the non-padding tokens and whether any padding occurs. A tile pair whose id ranges do
//  not intersect cannot see each other; one where both sides are a single id with no padding needs
//  no segment mask.
// Generic path (f32 / f16 / bf16, any even D <= 256, unaligned tensors, and every call on a device
// without wgmma): one warp per query row (forward; dq) or per key row (dk, dv), online softmax
// over keys one at a time, f32 math. Slow; for correctness on other shapes (the CPU twin is the
// f32 reference).
// Every launch is on the backend's stream; scratch comes from the backend's caching allocator.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_segments.cuh"
#include "kernels/cuda/attention_train_internal.h"
#include "kernels/cuda/cuda_train_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace attn_train {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ------------------------------------------------------------------------------------------------
// Segment-id summaries: per (b, granule of 32 tokens) int4 {min id, max id, has padding, 0} over the
// non-padding tokens (min = INT_MAX, max = -1 when there are none).

__global__ void seg_ranges_kernel(int4* __restrict__ ranges, const int* __restrict__ seg, int B, int S, int n_gran) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(B) * n_gran) return;
  const int b = static_cast<int>(idx / n_gran), gi = static_cast<int>(idx % n_gran);
  int lo = INT_MAX, hi = -1, pad = 0;
  const int end = min(S, (gi + 1) * kSegGranule);
  for (int s = gi * kSegGranule; s < end; ++s) {
    const int v = seg[static_cast<int64_t>(b) * S + s];
    if (v < 0) {
      pad = 1;
    } else {
      lo = min(lo, v);
      hi = max(hi, v);
    }
  }
  ranges[idx] = make_int4(lo, hi, pad, 0);
}

// ------------------------------------------------------------------------------------------------
// Backward prep: one warp per padded query row p = (b * Hq + h) * S_pad + i:
//   delta[p] = dout_i . out_i, lse2[p] = lse_i * log2 e (+inf for -inf), rows i >= S: 0 and +inf;
//   dq_acc[p, :] = 0 when dq_acc is given.

template <typename T>
__global__ void __launch_bounds__(256)
    attn_train_bwd_prep_kernel(float* __restrict__ delta, float* __restrict__ lse2, float* __restrict__ dq_acc,
                               const T* __restrict__ out, const T* __restrict__ dout, const float* __restrict__ lse,
                               int B, int Hq, int S, int S_pad, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hq * S_pad) return;
  const int i = static_cast<int>(p % S_pad);
  const int64_t bh = p / S_pad;
  const int h = static_cast<int>(bh % Hq);
  const int b = static_cast<int>(bh / Hq);
  float dot = 0.0f;
  float l2 = INFINITY;
  if (i < S) {
    const int64_t row = (static_cast<int64_t>(b) * S + i) * Hq + h;
    const T* o = out + row * D;
    const T* d = dout + row * D;
    for (int e = 2 * lane; e < D; e += 64) {
      const float2 x = load2(o + e), y = load2(d + e);
      dot = fmaf(x.x, y.x, fmaf(x.y, y.y, dot));
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float L = lse[bh * S + i];
    l2 = L == -INFINITY ? INFINITY : L * kLog2e;
  }
  if (lane == 0) {
    delta[p] = dot;
    lse2[p] = l2;
  }
  if (dq_acc != nullptr) {
    float* z = dq_acc + p * D;
    for (int e = 2 * lane; e < D; e += 64) store2(z + e, 0.0f, 0.0f);
  }
}

// ------------------------------------------------------------------------------------------------
// dQ conversion: the permuted accumulator of the wgmma backward kernel (dq_acc_tile in
// attention_train_bwd.cu) to dq, one block per (b, h, 64-query tile): the tile's accumulator is
// read as float4s (coalesced), transposed through shared memory, and written as full rows of dq
// (coalesced), with no 64-bit division per element.
template <typename T, int D>
__global__ void __launch_bounds__(256)
    attn_train_dq_convert_tiles_kernel(T* __restrict__ dq, const float* __restrict__ dq_acc, int S, int S_pad,
                                       int n_tiles, float scale) {
  __shared__ float2 tile_s[64][D / 2 + 4];  // [query row][dim pair], rows 8 words apart mod 32 banks
  const int64_t bh = blockIdx.x / n_tiles;
  const int tile = static_cast<int>(blockIdx.x % n_tiles);
  const int row0 = tile * 64;
  const float4* src = reinterpret_cast<const float4*>(dq_acc + (bh * S_pad + row0) * D);
  // float4 idx = j * 128 + wt: rows 16 w + g and + 8, dims 8 j + 2 t, + 1 (wt = 32 w + 4 g + t).
  for (int idx = threadIdx.x; idx < D / 8 * 128; idx += 256) {
    const int j = idx >> 7, wt = idx & 127;
    const int r = 16 * (wt >> 5) + ((wt >> 2) & 7), pr = 4 * j + (wt & 3);
    const float4 x = src[idx];
    tile_s[r][pr] = make_float2(x.x, x.y);
    tile_s[r + 8][pr] = make_float2(x.z, x.w);
  }
  __syncthreads();
  const int rows = min(64, S - row0);
  T* dst = dq + (bh * S + row0) * D;
  for (int idx = threadIdx.x; idx < rows * (D / 2); idx += 256) {
    const int r = idx / (D / 2), pr = idx % (D / 2);
    const float2 x = tile_s[r][pr];
    store2(dst + static_cast<int64_t>(r) * D + 2 * pr, x.x * scale, x.y * scale);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

Geometry check_inputs(const CudaBackend& be, Tensor q, Tensor k, Tensor v, Tensor segment_ids) {
  detail::check_float(be, q);
  detail::check_float(be, k);
  detail::check_float(be, v);
  KILN_ASSERT(q.ndim() == 4 && k.ndim() == 4 && v.shape == k.shape);
  KILN_ASSERT(k.dtype == q.dtype && v.dtype == q.dtype);
  Geometry g;
  g.B = static_cast<int>(q.size(0));
  g.Hq = static_cast<int>(q.size(1));
  g.S = static_cast<int>(q.size(2));
  g.D = static_cast<int>(q.size(3));
  g.Hkv = static_cast<int>(k.size(1));
  KILN_ASSERT(k.size(0) == g.B && k.size(2) == g.S && k.size(3) == g.D);
  KILN_ASSERT(g.Hkv > 0 && g.Hq % g.Hkv == 0);
  KILN_ASSERT(g.D > 0 && g.D % 2 == 0 && g.D <= 2 * 32 * kMaxPairs);
  KILN_ASSERT(g.B <= 65535 && g.Hq <= 65535);
  KILN_ASSERT(q.size(2) < (int64_t{1} << 30));
  if (segment_ids.data != nullptr) {
    detail::check_i32(be, segment_ids);
    KILN_ASSERT(segment_ids.ndim() == 2 && segment_ids.size(0) == g.B && segment_ids.size(1) == g.S);
  }
  return g;
}

TensorBuffer device_scratch(CudaBackend& be, Shape shape, DType dtype) { return empty_for_op(be, shape, dtype); }

// Per-granule segment summaries [B, n_gran] (int4), or an absent buffer without segment ids.
TensorBuffer segment_ranges(CudaBackend& be, const Geometry& g, Tensor segment_ids, int* n_gran) {
  *n_gran = (g.S + kSegGranule - 1) / kSegGranule;
  if (segment_ids.data == nullptr) return TensorBuffer();
  TensorBuffer r = device_scratch(be, Shape{g.B, *n_gran, 4}, DType::i32);
  const int64_t n = static_cast<int64_t>(g.B) * *n_gran;
  seg_ranges_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, detail::stream_of(be)>>>(
      r.ptr<int4>(), segment_ids.ptr<const int>(), g.B, g.S, *n_gran);
  KILN_CUDA_CHECK_LAUNCH();
  return r;
}

// Tensor-core variants (the fast path, on devices with wgmma): 1 = wgmma, 3 = wgmma with the
// one-warpgroup D = 64 backward (for D = 128 the same as 1); both run the same forward. 0, 2 and 4
// were removed (see the top of the file). KILN_ATTN_TRAIN_VARIANT=1 or 3 (read on every call, for
// tests and benchmarks) overrides the default (other values are ignored).
// Measured on the H200 (bench_attention_train, causal bf16; backward incl. prep and dQ conversion):
// D = 64, B 8 x S 2048, Hq 32 / Hkv 8: variant 1 1.79 ms (192 TFLOP/s), 3 1.24 ms (278);
// D = 128, B 4 x S 4096: 1 4.79 ms, 3 4.72 ms (291) (1 then still used the untiled dQ conversion
// that 3 replaced).
constexpr int kDefaultTrainVariant = 3;

int train_variant() {
  const char* e = std::getenv("KILN_ATTN_TRAIN_VARIANT");
  if (e != nullptr && (e[0] == '1' || e[0] == '3') && e[1] == '\0') return e[0] - '0';
  return kDefaultTrainVariant;
}

// Whether a call takes the tensor-core path: bf16, D = 64 or 128, 16-byte aligned tensors, and a
// device with wgmma; every other call takes the generic path. The device facts (wgmma support,
// raised shared-memory limits) are per backend, shared with the inference attention kernels
// (kernels/cuda/attention_internal.h), not function-local statics.
bool fast_path(CudaBackend& be, const Geometry& g, DType dtype, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::bf16 || (g.D != 64 && g.D != 128)) return false;
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return attention_device_has_wgmma(be);
}

// The backward prep kernel in T (dq_acc null: no accumulator to zero).
template <typename T>
void launch_bwd_prep(CudaBackend& be, const Geometry& g, float* delta, float* lse2, float* dq_acc, Tensor out,
                     Tensor dout, Tensor lse, int S_pad) {
  const int64_t rows = static_cast<int64_t>(g.B) * g.Hq * S_pad;
  attn_train_bwd_prep_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, detail::stream_of(be)>>>(
      delta, lse2, dq_acc, out.ptr<const T>(), dout.ptr<const T>(), lse.ptr<const float>(), g.B, g.Hq, g.S, S_pad, g.D);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace attn_train

using namespace attn_train;

void attention_train_forward(CudaBackend& be, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids,
                             bool causal, float scale) {
  const Geometry g = check_inputs(be, q, k, v, segment_ids);
  detail::check_float(be, out);
  KILN_ASSERT(out.dtype == q.dtype && out.ndim() == 4 && out.size(0) == g.B && out.size(1) == g.S &&
              out.size(2) == g.Hq && out.size(3) == g.D);
  KILN_ASSERT(lse.dtype == DType::f32 && lse.ndim() == 3 && lse.size(0) == g.B && lse.size(1) == g.Hq &&
              lse.size(2) == g.S && (lse.numel() == 0 || lse.device == be.device()));
  if (q.numel() == 0) return;

  int n_gran = 0;
  TensorBuffer ranges = segment_ranges(be, g, segment_ids, &n_gran);
  const int* seg = segment_ids.data != nullptr ? segment_ids.ptr<const int>() : nullptr;
  const int4* rng = ranges.allocated() ? ranges.ptr<const int4>() : nullptr;
  const float sl = scale * kLog2e;

  if (fast_path(be, g, q.dtype, {out.data, q.data, k.data, v.data})) {
    KILN_ASSERT(static_cast<int64_t>(g.B) * g.Hq * g.S < (int64_t{1} << 31));  // TMA row coordinates
    const attn::DenseArgs a{out.data, lse.ptr<float>(), q.data, k.data, v.data, seg, rng,
                            g.B, g.Hq, g.Hkv, g.S, g.D, n_gran, causal, sl};
    return attn::launch_dense_ws(be, a);
  }
  launch_fwd_generic(be, g, out, lse, q, k, v, seg, causal, sl);
}

void attention_train_backward(CudaBackend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                              Tensor v, Tensor out, Tensor lse, Tensor segment_ids, bool causal, float scale) {
  const Geometry g = check_inputs(be, q, k, v, segment_ids);
  detail::check_float(be, dq);
  detail::check_float(be, dk);
  detail::check_float(be, dv);
  detail::check_float(be, dout);
  detail::check_float(be, out);
  KILN_ASSERT(dq.shape == q.shape && dk.shape == k.shape && dv.shape == k.shape);
  KILN_ASSERT(dq.dtype == q.dtype && dk.dtype == q.dtype && dv.dtype == q.dtype && dout.dtype == q.dtype &&
              out.dtype == q.dtype);
  KILN_ASSERT(dout.ndim() == 4 && dout.size(0) == g.B && dout.size(1) == g.S && dout.size(2) == g.Hq &&
              dout.size(3) == g.D && out.shape == dout.shape);
  KILN_ASSERT(lse.dtype == DType::f32 && lse.ndim() == 3 && lse.size(0) == g.B && lse.size(1) == g.Hq &&
              lse.size(2) == g.S && (lse.numel() == 0 || lse.device == be.device()));
  if (q.numel() == 0) return;

  const int S_pad = (g.S + kSeqPad - 1) / kSeqPad * kSeqPad;
  const int64_t stat_rows = static_cast<int64_t>(g.B) * g.Hq * S_pad;
  TensorBuffer stats = device_scratch(be, Shape{2, stat_rows}, DType::f32);  // delta, lse2
  float* delta = stats.ptr<float>();
  float* lse2 = delta + stat_rows;
  int n_gran = 0;
  TensorBuffer ranges = segment_ranges(be, g, segment_ids, &n_gran);
  const int* seg = segment_ids.data != nullptr ? segment_ids.ptr<const int>() : nullptr;
  const int4* rng = ranges.allocated() ? ranges.ptr<const int4>() : nullptr;
  const float sl = scale * kLog2e;

  if (fast_path(be, g, q.dtype, {dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data})) {
    TensorBuffer acc = device_scratch(be, Shape{stat_rows, g.D}, DType::f32);  // dQ accumulator [B, Hq, S_pad, D]
    launch_bwd_prep<bf16>(be, g, delta, lse2, acc.ptr<float>(), out, dout, lse, S_pad);
    launch_bwd_wgmma(be, g, train_variant(), dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran,
                     S_pad, causal, sl, scale);
    // One block per (b, h, 64-query tile); B * Hq * ceil(S / 64) > INT_MAX would need a dQ
    // accumulator of more than 2^37 rows (32 TiB for D = 64), which the scratch above cannot hold.
    const int n_tiles = (g.S + 63) / 64;
    const int64_t tile_blocks = static_cast<int64_t>(g.B) * g.Hq * n_tiles;
    KILN_ASSERT(tile_blocks <= INT_MAX);
    if (g.D == 64)
      attn_train_dq_convert_tiles_kernel<bf16, 64><<<static_cast<unsigned>(tile_blocks), 256, 0,
                                                     detail::stream_of(be)>>>(dq.ptr<bf16>(), acc.ptr<const float>(),
                                                                              g.S, S_pad, n_tiles, scale);
    else
      attn_train_dq_convert_tiles_kernel<bf16, 128><<<static_cast<unsigned>(tile_blocks), 256, 0,
                                                      detail::stream_of(be)>>>(dq.ptr<bf16>(), acc.ptr<const float>(),
                                                                               g.S, S_pad, n_tiles, scale);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (q.dtype) {
    case DType::f32: launch_bwd_prep<float>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad); break;
    case DType::bf16: launch_bwd_prep<bf16>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad); break;
    case DType::f16: launch_bwd_prep<__half>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad); break;
    default: KILN_ASSERT(false && "attention_train_backward: float tensors only");
  }
  launch_bwd_generic(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
}

}  // namespace kiln::cuda
