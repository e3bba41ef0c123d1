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
// Fast path (bf16, D = 64 or 128, 16-byte aligned tensors), tensor-core variants (3 is the default
// on sm_90a Hopper, 0 elsewhere; KILN_ATTN_TRAIN_VARIANT=0, 1 or 3, read on every call, selects one):
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
//  0 mma.sync m16n8k16 (any sm_80+ GPU; the fallback), FlashAttention-2 style: tiles in shared
//    memory with rows padded to D + 8 elements (conflict-free ldmatrix), fragments by
//    ldmatrix(.trans).
//  * Forward: grid (ceil(S / BM), Hq, B), heaviest (last) query tiles first; 4 warps, each owning
//    16 * MT query rows (D=64: MT=2, BM=128; D=128: MT=1, BM=64), BN=64 keys per K/V tile, K/V
//    double buffered. Q fragments stay in registers; S = Q K^T, online softmax, O += P V with P
//    reused from S's accumulator registers as the A operand.
//  * Backward main kernel: grid (ceil(S / BN), Hkv, B), key block 0 (the heaviest under causal)
//    first; 8 warps, BN = 128 keys per block, each warp owning 16 keys whose dK, dV accumulate in
//    registers over every query block (BM = 64 for D=64, 32 for D=128) of every query head of the
//    group. Per query block: S^T = K Q^T and dP^T = V dO^T (keys as the M dimension, so P^T and
//    dS^T come out in the accumulator layout that is the A operand of dV += P^T dO and
//    dK += dS^T Q), dS^T is written to shared memory (bf16) and dQ_partial = dS K is added into the
//    row-major f32 accumulator with f32x2 atomics.
//  Common to all: tiles past the block's last query (causal) are never visited; tile pairs whose
//  segment-id ranges cannot meet are skipped; only tiles that cross the diagonal, the end of the
//  sequence or a segment boundary are masked elementwise. The backward runs three kernels:
//  (1) prep: one warp per query row computes delta = rowsum(dout * out), lse2, and zeroes the f32
//  dQ accumulator (scratch, [B, Hq, S_pad, D]); (2) the main kernel, whose Q / dO / lse2 / delta
//  tiles of the next query block are prefetched (cp.async, double buffered) while the current one
//  computes; (3) convert: dq = scale * accumulator in q's dtype (wgmma variants: one block per
//  64-query tile, coalesced reads of the permuted layout, transposed through shared memory).
//  Removed after measurement on the H200 (bench_attention_train, causal bf16, backward ms; D=64:
//  B 8 x S 2048, Hq 32 / Hkv 8; D=128: B 4 x S 4096): variant 2 (variant 1 with the elementwise
//  work overlapped with the tensor cores: S^T / dP^T in separate commit groups, dV issued before
//  dS^T; D=64 1.81 ms vs 1: 1.79, D=128 4.78 vs 4.79) and variant 4 (the one-warpgroup D=64
//  backward at 2 blocks per SM with each step's dQ atomics deferred past the next step's S^T /
//  dP^T; D=64 1.32 ms vs 3: 1.24; for D=128 it ran variant 3's kernels). The numbers 2 and 4 are
//  not reused.
//  Segment skipping uses per-32-token granule summaries computed by a small kernel: (min id, max
//  id) over the non-padding tokens and whether any padding occurs. A tile pair whose id ranges do
//  not intersect cannot see each other; one where both sides are a single id with no padding needs
//  no segment mask.
// Generic path (f32 / f16 / bf16, any even D <= 256, unaligned tensors): one warp per query row
// (forward; dq) or per key row (dk, dv), online softmax over keys one at a time, f32 math. Slow;
// for correctness on other shapes (the CPU twin is the f32 reference).
// Every launch is on the backend's stream; scratch comes from the backend's caching allocator.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/attention_segments.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cuda_train_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"

namespace kiln::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kSeqPad = 128;     // S_pad: the lse2 / delta / dQ scratch rows, a multiple of every BM

// ------------------------------------------------------------------------------------------------
// Device helpers.

// 4-byte global->shared copy; zero-fills when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// c += a (16x16, row) * b (16x8, col), bf16 operands, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to a packed bf16 pair, `lo` in the low 16 bits.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// dst[0..2) += v, one vector atomic (sm_90) on 8-byte-aligned global memory.
__device__ __forceinline__ void atomic_add2(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

// Fragment addressing (m16n8k16; g = lane / 4, t = lane % 4). Tiles are row-major in shared memory
// with a row stride of `ld` elements; `r0`/`c0` are the tile's first row / element column.
//  A fragment (16x16) of a row-major X[m][k] (rows m0.., columns k0..):         frag_a
//  two B fragments (n-tiles n0, n0 + 8; k0..k0+15) of X[n][k] (B[k][n] = X[n][k]): frag_b_nk
//  two B fragments of a row-major X[k][n] (B[k][n] = X[k][n]):                    frag_b_kn (.trans)
//  A fragment of X[k][m] (A[m][k] = X[k][m]):                                     frag_a_km (.trans)
__device__ __forceinline__ uint32_t addr_a(const bf16* X, int ld, int m0, int k0, int lane) {
  return smem_u32(X + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0 + (lane >> 4) * 8);
}
__device__ __forceinline__ uint32_t addr_b_nk(const bf16* X, int ld, int n0, int k0, int lane) {
  return smem_u32(X + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}
__device__ __forceinline__ uint32_t addr_b_kn(const bf16* X, int ld, int k0, int n0, int lane) {
  return smem_u32(X + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}
__device__ __forceinline__ uint32_t addr_a_km(const bf16* X, int ld, int k0, int m0, int lane) {
  return smem_u32(X + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8);
}

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

// Step schedule of a backward block of BN keys from kb0, shared by the backward kernels: the steps
// (hi, qb) visit, for each query head hi of the kv head's group of G, the BM-row query blocks qb
// that can see the keys (from the diagonal block under causal; blocks whose segment ranges cannot
// meet the keys' are skipped). hi == G: no step left.
template <int BN, int BM>
struct BwdSchedule {
  bool use_seg;
  const int4* rng_row;  // the batch row's granule summaries (use_seg)
  int4 k_rng;           // the key block's summary (use_seg)
  int kb0, S, G, causal, n_qb, qb_begin;

  __device__ __forceinline__ BwdSchedule(bool use_seg_, const int4* rng_row_, int kb0_, int S_, int G_, int causal_)
      : use_seg(use_seg_),
        rng_row(rng_row_),
        k_rng(use_seg_ ? seg_union(rng_row_, kb0_, min(S_, kb0_ + BN)) : make_int4(0, 0, 0, 0)),
        kb0(kb0_),
        S(S_),
        G(G_),
        causal(causal_),
        n_qb((S_ + BM - 1) / BM),
        qb_begin(causal_ ? kb0_ / BM : 0) {}
  __device__ __forceinline__ bool qb_ok(int qb) const {
    return !use_seg || seg_meet(seg_union(rng_row, qb * BM, min(S, qb * BM + BM)), k_rng);
  }
  // The step after (hi, qb).
  __device__ __forceinline__ void advance(int& hi, int& qb) const {
    ++qb;
    while (true) {
      while (qb < n_qb && !qb_ok(qb)) ++qb;
      if (qb < n_qb) return;
      if (++hi >= G) return;
      qb = qb_begin;
    }
  }
  // The first step.
  __device__ __forceinline__ void first(int& hi, int& qb) const {
    hi = 0;
    qb = qb_begin - 1;
    advance(hi, qb);
  }
  // Which masks the step at query row q0 needs: seg_mask, the elementwise segment mask; need_mask,
  // any elementwise mask (keys past S, the diagonal, segments).
  __device__ __forceinline__ void masks(int q0, bool& seg_mask, bool& need_mask) const {
    seg_mask = false;
    if (use_seg) seg_mask = !seg_same(seg_union(rng_row, q0, min(S, q0 + BM)), k_rng);
    need_mask = kb0 + BN > S || (causal && kb0 + BN - 1 > q0) || seg_mask;
  }
};

// Segment ids of rows r0 and r0 + 8 (-1: past S or no segment ids).
__device__ __forceinline__ void seg_ids2(int (&sid)[2], const int* seg_row, bool use_seg, int r0, int S) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = r0 + 8 * hf;
    sid[hf] = (use_seg && r < S) ? seg_row[r] : -1;
  }
}

// cp.async of a backward step's lse2, delta (rows padded to S_pad, holding +inf / 0 past S, so no
// bound is needed; `stat` is row q0 of the query head) and query segment ids into stage buf.
// kOneRowPerThread (BM <= NT): thread tid < BM loads row tid; otherwise rows tid, tid + NT, ...
// (The same rows, but the two forms compile differently and each kernel or configuration keeps
// the one it was measured with: nvcc 13.0 does not fold the strided loop when NT >= BM, which
// costs the kernels that use it 200-290 SASS instructions, run once per step.)
template <int BM, int NT, bool kOneRowPerThread>
__device__ __forceinline__ void load_step_stats(float* sLse2, float* sDelta, int* sSegQ, int buf, const float* lse2,
                                                const float* delta, int64_t stat, const int* seg_row, bool use_seg,
                                                int q0, int S, int tid) {
  auto row = [&](int i) {
    cp_async4(smem_u32(sLse2 + buf * BM + i), lse2 + stat + i, true);
    cp_async4(smem_u32(sDelta + buf * BM + i), delta + stat + i, true);
    if (use_seg) cp_async4(smem_u32(sSegQ + buf * BM + i), seg_row + min(q0 + i, S - 1), q0 + i < S);
  };
  if constexpr (kOneRowPerThread) {
    static_assert(BM <= NT, "one row per thread");
    if (tid < BM) row(tid);
  } else {
    for (int i = tid; i < BM; i += NT) row(i);
  }
}

// ------------------------------------------------------------------------------------------------
// Forward kernel (bf16, mma.sync). NW warps, each owning MT 16-row M tiles (BM = NW * 16 * MT
// query rows per block); BN keys per double-buffered K/V tile.

template <int D, int MT, int BN, int NW>
struct FwdCfg {
  static constexpr int kThreads = NW * 32;
  static constexpr int BM = NW * 16 * MT;
  static constexpr int LD = D + 8;  // padded row stride (elements)
  static constexpr int NC = D / 8;  // 16-byte chunks per row
  static constexpr int kSmemBytes = (BM * LD + 4 * BN * LD) * 2 + 2 * BN * 4;  // Q, K[2], V[2], seg[2]
  static_assert(D % 16 == 0 && BN % 16 == 0 && BM % kSegGranule == 0 && BN % kSegGranule == 0, "tiles");
};

template <int D, int MT, int BN, int NW>
__global__ void __launch_bounds__(NW * 32, 2)
    attn_train_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                          const bf16* __restrict__ k, const bf16* __restrict__ v, const int* __restrict__ seg,
                          const int4* __restrict__ seg_ranges, int Hq, int Hkv, int S, int n_gran, int num_qtiles,
                          int causal, float sl) {
  using Cfg = FwdCfg<D, MT, BN, NW>;
  constexpr int NT = Cfg::kThreads;
  constexpr int BM = Cfg::BM;
  constexpr int LD = Cfg::LD;
  constexpr int NC = Cfg::NC;
  constexpr int KS = D / 16;  // k steps of QK^T
  constexpr int SN = BN / 8;  // n tiles of S
  constexpr int DN = D / 8;   // n tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);     // [BM][LD]
  bf16* sK = sQ + BM * LD;                           // [2][BN][LD]
  bf16* sV = sK + 2 * BN * LD;                       // [2][BN][LD]
  int* sSegK = reinterpret_cast<int*>(sV + 2 * BN * LD);  // [2][BN]

  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x);  // heaviest tiles first
  const int row0 = qt * BM;
  const int kvh = h / (Hq / Hkv);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;

  const bf16* q_base = q + static_cast<int64_t>(b * Hq + h) * S * D;
  const bf16* k_base = k + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const bf16* v_base = v + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const bool use_seg = seg != nullptr;
  const int* seg_row = use_seg ? seg + static_cast<int64_t>(b) * S : nullptr;
  const int4* rng_row = use_seg ? seg_ranges + static_cast<int64_t>(b) * n_gran : nullptr;

  const int row_end = min(S, row0 + BM);
  const int kt_end = causal ? (row_end + BN - 1) / BN : (S + BN - 1) / BN;
  const int4 q_rng = use_seg ? seg_union(rng_row, row0, row_end) : make_int4(0, 0, 0, 0);
  auto tile_ok = [&](int kt) { return !use_seg || seg_meet(q_rng, seg_union(rng_row, kt * BN, min(S, kt * BN + BN))); };
  auto next_tile = [&](int kt) {
    while (kt < kt_end && !tile_ok(kt)) ++kt;
    return kt;
  };

  // Q tile (rows past S zero-filled).
  for (int idx = tid; idx < BM * NC; idx += NT) {
    const int r = idx / NC, c = idx % NC;
    const bool ok = row0 + r < S;
    cp_async16(smem_u32(sQ + r * LD + c * 8), ok ? q_base + static_cast<int64_t>(row0 + r) * D + c * 8 : q_base, ok);
  }
  auto load_kv = [&](int kt, int buf) {
    bf16* dk = sK + buf * BN * LD;
    bf16* dv = sV + buf * BN * LD;
    for (int idx = tid; idx < BN * NC; idx += NT) {
      const int r = idx / NC, c = idx % NC;
      const int key = kt * BN + r;
      const bool ok = key < S;
      const int64_t off = ok ? static_cast<int64_t>(key) * D + c * 8 : 0;
      cp_async16(smem_u32(dk + r * LD + c * 8), k_base + off, ok);
      cp_async16(smem_u32(dv + r * LD + c * 8), v_base + off, ok);
    }
    if (use_seg) {
      for (int i = tid; i < BN; i += NT) {
        const int key = kt * BN + i;
        cp_async4(smem_u32(sSegK + buf * BN + i), seg_row + (key < S ? key : 0), key < S);
      }
    }
  };

  int kt = next_tile(0);
  if (kt < kt_end) load_kv(kt, 0);
  cp_async_commit();

  const int warp_row0 = warp * 16 * MT;  // first tile row of this warp
  // Segment ids of this thread's rows (rows past S: -1, everything masked).
  int sq[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = row0 + warp_row0 + mt * 16 + g + 8 * hf;
      sq[mt][hf] = (use_seg && row < S) ? seg_row[row] : -1;
    }

  float acc[MT][DN][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  uint32_t qf[MT][KS][4];
  bool q_loaded = false;

  int buf = 0;
  while (kt < kt_end) {
    const int kt_next = next_tile(kt + 1);
    if (kt_next < kt_end) load_kv(kt_next, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (!q_loaded) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) ldmatrix_x4(qf[mt][kk], addr_a(sQ, LD, warp_row0 + mt * 16, kk * 16, lane));
      q_loaded = true;
    }
    const bf16* cK = sK + buf * BN * LD;
    const bf16* cV = sV + buf * BN * LD;
    const int* cSeg = sSegK + buf * BN;
    const int key0 = kt * BN;

    // S = Q K^T
    float s[MT][SN][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < SN; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int np = 0; np < SN / 2; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, addr_b_nk(cK, LD, np * 16, kk * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(s[mt][2 * np], qf[mt][kk], bk[0], bk[1]);
          mma_bf16(s[mt][2 * np + 1], qf[mt][kk], bk[2], bk[3]);
        }
      }

    // Elementwise mask where the tile crosses the diagonal, the end of the keys or a segment edge.
    const bool seg_mask = use_seg && !seg_same(q_rng, seg_union(rng_row, key0, min(S, key0 + BN)));
    if (key0 + BN > S || (causal && key0 + BN - 1 > row0) || seg_mask) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + warp_row0 + mt * 16 + g + (e >> 1) * 8;
            const int kl = nt * 8 + 2 * t + (e & 1);
            const int key = key0 + kl;
            const int sr = sq[mt][e >> 1];
            const bool masked = key >= S || (causal && key > row) || (seg_mask && (sr < 0 || cSeg[kl] != sr));
            if (masked) s[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax (log2 domain).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][hf], mx * sl);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(m[mt][hf] - m_use);
        m[mt][hf] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * hf + e], sl, -m_use));
            s[mt][nt][2 * hf + e] = p;
            sum += p;
          }
        l[mt][hf] = l[mt][hf] * alpha + sum;
#pragma unroll
        for (int dn = 0; dn < DN; ++dn) {
          acc[mt][dn][2 * hf] *= alpha;
          acc[mt][dn][2 * hf + 1] *= alpha;
        }
      }

    // O += P V (P stays in registers: S's C fragments are the A fragments of the PV product).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, addr_b_kn(cV, LD, kk * 16, dp * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(acc[mt][2 * dp], pa[mt], bv[0], bv[1]);
          mma_bf16(acc[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with this stage before it is refilled
    kt = kt_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  // Epilogue: normalise, store out rows < S and their lse.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lsum = l[mt][hf];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = row0 + warp_row0 + mt * 16 + g + hf * 8;
      if (row >= S) continue;
      bf16* dst = out + (static_cast<int64_t>(b * S + row) * Hq + h) * D + t * 2;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn)
        *reinterpret_cast<uint32_t*>(dst + dn * 8) = pack_bf16(acc[mt][dn][2 * hf] * inv, acc[mt][dn][2 * hf + 1] * inv);
      if (t == 0)
        lse[static_cast<int64_t>(b * Hq + h) * S + row] = lsum > 0.0f ? (m[mt][hf] + log2f(lsum)) * kLn2 : -INFINITY;
    }
}

// ------------------------------------------------------------------------------------------------
// Backward prep: one warp per padded query row p = (b * Hq + h) * S_pad + i:
//   delta[p] = dout_i . out_i, lse2[p] = lse_i * log2 e (+inf for -inf), rows i >= S: 0 and +inf;
//   dq_acc[p, :] = 0 when dq_acc is given.

__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const bf16* p) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p)); }
__device__ __forceinline__ float2 load2(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

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
// Backward main kernel (bf16, mma.sync). NW warps, BN = 16 * NW keys per block (warp w owns keys
// 16w .. 16w + 15), BM query rows per step. kKVRegs: the warp's K and V A fragments stay in
// registers (D=64), else they are re-read from shared memory each step.

template <int D, int BM, int NW, bool kKVRegs>
struct BwdCfg {
  static constexpr int kThreads = NW * 32;
  static constexpr int BN = 16 * NW;
  static constexpr int LD = D + 8;    // padded row stride of the [rows][D] tiles
  static constexpr int LDS = BM + 8;  // padded row stride of dS^T [BN][BM]
  static constexpr int NC = D / 8;
  static constexpr int MQ = BM / 16;  // dQ: query m tiles
  static constexpr int NQ = NW / MQ;  // dQ: warps per m tile (split of D)
  static constexpr int DW = D / NQ;   // dQ: dims per warp
  static constexpr int kSmemBytes = (2 * BN * LD + 4 * BM * LD + BN * LDS) * 2 + 3 * 2 * BM * 4;
  static_assert(D % 16 == 0 && BM % 16 == 0 && NW % MQ == 0 && DW % 16 == 0, "dQ warp split");
  static_assert(kSeqPad % BM == 0 && BN % kSegGranule == 0 && BM % kSegGranule == 0, "tiles");
};

template <int D, int BM, int NW, bool kKVRegs>
__global__ void __launch_bounds__(NW * 32, 1)
    attn_train_bwd_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ dq_acc,
                          const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                          const bf16* __restrict__ dout, const float* __restrict__ lse2,
                          const float* __restrict__ delta, const int* __restrict__ seg,
                          const int4* __restrict__ seg_ranges, int Hq, int Hkv, int S, int S_pad, int n_gran,
                          int causal, float sl, float scale) {
  using Cfg = BwdCfg<D, BM, NW, kKVRegs>;
  constexpr int NT = Cfg::kThreads;
  constexpr int BN = Cfg::BN;
  constexpr int LD = Cfg::LD;
  constexpr int LDS = Cfg::LDS;
  constexpr int NC = Cfg::NC;
  constexpr int MQ = Cfg::MQ;
  constexpr int DW = Cfg::DW;
  constexpr int KS = D / 16;   // k steps over D (S^T, dP^T)
  constexpr int QN = BM / 8;   // n tiles over queries (S^T, dP^T)
  constexpr int DN = D / 8;    // n tiles over D (dK, dV)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // [BN][LD]
  bf16* sV = sK + BN * LD;                        // [BN][LD]
  bf16* sQ = sV + BN * LD;                        // [2][BM][LD]
  bf16* sdO = sQ + 2 * BM * LD;                   // [2][BM][LD]
  bf16* sdS = sdO + 2 * BM * LD;                  // [BN][LDS]: dS^T, keys x queries
  float* sLse2 = reinterpret_cast<float*>(sdS + BN * LDS);  // [2][BM]
  float* sDelta = sLse2 + 2 * BM;                            // [2][BM]
  int* sSegQ = reinterpret_cast<int*>(sDelta + 2 * BM);      // [2][BM]

  const int kb0 = static_cast<int>(blockIdx.x) * BN;  // key block 0 (heaviest under causal) first
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int G = Hq / Hkv;
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int kw0 = warp * 16;  // this warp's first key row in the block

  const int64_t kv_off = static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const bool use_seg = seg != nullptr;
  const int* seg_row = use_seg ? seg + static_cast<int64_t>(b) * S : nullptr;
  const int4* rng_row = use_seg ? seg_ranges + static_cast<int64_t>(b) * n_gran : nullptr;

  // K and V of the block (rows past S zero-filled; they are masked below).
  for (int idx = tid; idx < BN * NC; idx += NT) {
    const int r = idx / NC, c = idx % NC;
    const bool ok = kb0 + r < S;
    const int64_t off = kv_off + (ok ? static_cast<int64_t>(kb0 + r) * D + c * 8 : 0);
    cp_async16(smem_u32(sK + r * LD + c * 8), k + off, ok);
    cp_async16(smem_u32(sV + r * LD + c * 8), v + off, ok);
  }

  const BwdSchedule<BN, BM> sched(use_seg, rng_row, kb0, S, G, causal);
  auto load_q = [&](int hi, int qb, int buf) {
    const int h = kvh * G + hi;
    const int q0 = qb * BM;
    const bf16* q_base = q + static_cast<int64_t>(b * Hq + h) * S * D;
    bf16* dQs = sQ + buf * BM * LD;
    bf16* dOs = sdO + buf * BM * LD;
    for (int idx = tid; idx < BM * NC; idx += NT) {
      const int r = idx / NC, c = idx % NC;
      const int row = q0 + r;
      const bool ok = row < S;
      cp_async16(smem_u32(dQs + r * LD + c * 8), ok ? q_base + static_cast<int64_t>(row) * D + c * 8 : q_base, ok);
      cp_async16(smem_u32(dOs + r * LD + c * 8),
                 ok ? dout + (static_cast<int64_t>(b * S + row) * Hq + h) * D + c * 8 : dout, ok);
    }
    load_step_stats<BM, NT, false>(sLse2, sDelta, sSegQ, buf, lse2, delta, static_cast<int64_t>(b * Hq + h) * S_pad + q0,
                                   seg_row, use_seg, q0, S, tid);
  };

  int hi, qb;
  sched.first(hi, qb);
  if (hi < G) load_q(hi, qb, 0);
  cp_async_commit();

  // This thread's key rows (accumulator rows g and g + 8 of the warp's 16) and their segment ids.
  int sk[2];
  seg_ids2(sk, seg_row, use_seg, kb0 + kw0 + g, S);

  float dk_acc[DN][4], dv_acc[DN][4];
#pragma unroll
  for (int n = 0; n < DN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  uint32_t kf[kKVRegs ? KS : 1][4], vf[kKVRegs ? KS : 1][4];
  bool kv_loaded = false;

  int buf = 0;
  while (hi < G) {
    int nhi = hi, nqb = qb;
    sched.advance(nhi, nqb);
    cp_async_wait<0>();
    __syncthreads();  // this step's tiles landed; the previous step is done with the other stage and sdS
    if (nhi < G) load_q(nhi, nqb, buf ^ 1);
    cp_async_commit();
    if constexpr (kKVRegs) {
      if (!kv_loaded) {
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          ldmatrix_x4(kf[kk], addr_a(sK, LD, kw0, kk * 16, lane));
          ldmatrix_x4(vf[kk], addr_a(sV, LD, kw0, kk * 16, lane));
        }
        kv_loaded = true;
      }
    }
    const int h = kvh * G + hi;
    const int q0 = qb * BM;
    const bf16* cQ = sQ + buf * BM * LD;
    const bf16* cdO = sdO + buf * BM * LD;
    const float* cL = sLse2 + buf * BM;
    const float* cDl = sDelta + buf * BM;
    const int* cSq = sSegQ + buf * BM;

    // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys x BM queries.
    float st[QN][4], dpt[QN][4];
#pragma unroll
    for (int n = 0; n < QN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t ka[4], va[4];
      if constexpr (kKVRegs) {
#pragma unroll
        for (int x = 0; x < 4; ++x) ka[x] = kf[kk][x], va[x] = vf[kk][x];
      } else {
        ldmatrix_x4(ka, addr_a(sK, LD, kw0, kk * 16, lane));
        ldmatrix_x4(va, addr_a(sV, LD, kw0, kk * 16, lane));
      }
#pragma unroll
      for (int np = 0; np < QN / 2; ++np) {
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, addr_b_nk(cQ, LD, np * 16, kk * 16, lane));
        mma_bf16(st[2 * np], ka, bq[0], bq[1]);
        mma_bf16(st[2 * np + 1], ka, bq[2], bq[3]);
        ldmatrix_x4(bo, addr_b_nk(cdO, LD, np * 16, kk * 16, lane));
        mma_bf16(dpt[2 * np], va, bo[0], bo[1]);
        mma_bf16(dpt[2 * np + 1], va, bo[2], bo[3]);
      }
    }

    // P^T = 2^(s sl - lse2) (masked: 0) and dS^T = P^T (dP^T - delta), in place.
    // Accumulator element (n, e): key kw0 + g + 8 (e >> 1), query n * 8 + 2t + (e & 1) of the block.
    bool seg_mask, need_mask;
    sched.masks(q0, seg_mask, need_mask);
#pragma unroll
    for (int n = 0; n < QN; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = n * 8 + 2 * t + (e & 1);
        float p = fast_exp2(fmaf(st[n][e], sl, -cL[ql]));
        if (need_mask) {
          const int key = kb0 + kw0 + g + 8 * (e >> 1);
          const bool masked = key >= S || (causal && key > q0 + ql) || (seg_mask && sk[e >> 1] != cSq[ql]);
          if (masked) p = 0.0f;
        }
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - cDl[ql]);
      }

    // dV += P^T dO and dK += dS^T Q (k = the BM queries; P^T, dS^T reused as A fragments), and
    // dS^T to shared memory for dQ.
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {
      uint32_t pa[4], da[4];
      pa[0] = pack_bf16(st[2 * kk][0], st[2 * kk][1]);
      pa[1] = pack_bf16(st[2 * kk][2], st[2 * kk][3]);
      pa[2] = pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]);
      pa[3] = pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3]);
      da[0] = pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]);
      da[1] = pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]);
      da[2] = pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
      da[3] = pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
      // da[0]: key row g, queries kk*16 + 2t..; da[1]: row g + 8; da[2], da[3]: queries + 8.
      bf16* ds_row = sdS + (kw0 + g) * LDS + kk * 16 + 2 * t;
      *reinterpret_cast<uint32_t*>(ds_row) = da[0];
      *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS) = da[1];
      *reinterpret_cast<uint32_t*>(ds_row + 8) = da[2];
      *reinterpret_cast<uint32_t*>(ds_row + 8 * LDS + 8) = da[3];
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, addr_b_kn(cdO, LD, kk * 16, dp * 16, lane));
        mma_bf16(dv_acc[2 * dp], pa, bo[0], bo[1]);
        mma_bf16(dv_acc[2 * dp + 1], pa, bo[2], bo[3]);
        ldmatrix_x4_trans(bq, addr_b_kn(cQ, LD, kk * 16, dp * 16, lane));
        mma_bf16(dk_acc[2 * dp], da, bq[0], bq[1]);
        mma_bf16(dk_acc[2 * dp + 1], da, bq[2], bq[3]);
      }
    }
    __syncthreads();  // dS^T complete

    // dQ (BM x D) += dS K: warp (mq, nq) computes query rows mq*16.. and dims nq*DW.., k = the BN keys.
    {
      const int mq = warp % MQ, nq = warp / MQ;
      float dqa[DW / 8][4];
#pragma unroll
      for (int n = 0; n < DW / 8; ++n) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, addr_a_km(sdS, LDS, kk * 16, mq * 16, lane));
#pragma unroll
        for (int dp = 0; dp < DW / 16; ++dp) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, addr_b_kn(sK, LD, kk * 16, nq * DW + dp * 16, lane));
          mma_bf16(dqa[2 * dp], a, bk[0], bk[1]);
          mma_bf16(dqa[2 * dp + 1], a, bk[2], bk[3]);
        }
      }
      float* dq_rows = dq_acc + (static_cast<int64_t>(b * Hq + h) * S_pad + q0) * D + nq * DW + 2 * t;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mq * 16 + g + 8 * hf;
        if (q0 + r < S) {
#pragma unroll
          for (int n = 0; n < DW / 8; ++n) atomic_add2(dq_rows + r * D + n * 8, dqa[n][2 * hf], dqa[n][2 * hf + 1]);
        }
      }
    }
    hi = nhi;
    qb = nqb;
    buf ^= 1;
  }
  cp_async_wait<0>();

  // dK (scaled) and dV of the warp's keys; keys no query sees get zeros.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = kb0 + kw0 + g + 8 * hf;
    if (key >= S) continue;
    const int64_t off = kv_off + static_cast<int64_t>(key) * D + 2 * t;
#pragma unroll
    for (int n = 0; n < DN; ++n) {
      *reinterpret_cast<uint32_t*>(dk + off + n * 8) = pack_bf16(dk_acc[n][2 * hf] * scale, dk_acc[n][2 * hf + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + n * 8) = pack_bf16(dv_acc[n][2 * hf], dv_acc[n][2 * hf + 1]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Hopper wgmma kernels (sm_90a; bf16, D = 64 or 128). Tiles are stored as D / 64 column blocks of
// [rows][64] with 128-byte rows and the hardware 128-byte swizzle (16-byte chunk ^= row % 8 inside
// 1024-byte atoms): the canonical wgmma SW128 layout, read K-major or MN-major ("transposed") by
// shared-memory descriptors. Descriptors and fences come from kernels/cuda/hopper_util.cuh; the
// asm wrappers and the fence discipline are those of the inference prefill kernels
// (kernels/cuda/attention_wgmma.cuh, measured on the H200):
// K-major operands advance 32 bytes per 16-wide k step inside a column block, then jump to the next
// block; MN-major operands advance 16 rows (2048 bytes) per k step, their column blocks one
// leading-byte-offset apart. Accumulators: per warp the mma.sync C layout (n8 tile j in registers
// 4j .. 4j + 3: rows 16 * warp + g and + 8, columns 8j + 2t, + 1).

using WgmmaBf16 = attn::Wgmma<bf16>;  // the wrappers shared with the prefill kernels (attention_wgmma.cuh)

using hopper::fence_proxy_async;
using hopper::fence_regs;
using hopper::wgmma_commit;
using hopper::wgmma_desc;
using hopper::wgmma_fence;
using hopper::wgmma_wait;
// Pins register A operands in program order relative to the (volatile) wgmma wait: not reused
// before the wgmmas that read them have completed.
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// Barrier of the 128 threads of one warpgroup (ids 1, 2; id 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
// Four 8x8 b16 matrices from registers to shared memory, transposed: lane l gives the address of
// row l % 8 of matrix l / 8; register j of thread (g, t) holds row g, columns 2t, 2t + 1 of matrix
// j, stored as column g, rows 2t, 2t + 1.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
// dst[0..4) += v (16-byte aligned global f32), one vector reduction.
__device__ __forceinline__ void red_add4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), make_float4(a, b, c, d));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
  atomicAdd(dst + 2, c);
  atomicAdd(dst + 3, d);
#endif
}

using attn::wg_off;  // the tile layout of the wgmma kernels (attention_wgmma.cuh)

// cp.async of `rows` rows (row0 + r < limit, else zero-filled) of a [.., D] row-major global matrix
// (row stride `stride` elements) into a wg_off<ROWS> tile. Thread tid copies chunk tid % (D / 8) of
// rows tid / (D / 8) + i * RS (RS = NT / (D / 8), a multiple of 8: one swizzle pattern per thread).
template <int D, int ROWS, int NT>
__device__ __forceinline__ void wg_load_rows(bf16* tile, const bf16* base, int64_t stride, int row0, int limit,
                                             int tid) {
  constexpr int NC = D / 8;
  constexpr int RS = NT / NC;
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "load mapping");
  const int r0 = tid / NC, c = tid % NC;
  const uint32_t d0 = smem_u32(tile + wg_off<ROWS>(r0, c));
  const bf16* src = base + static_cast<int64_t>(row0 + r0) * stride + c * 8;
#pragma unroll
  for (int i = 0; i < ROWS / RS; ++i) {
    const bool ok = row0 + r0 + i * RS < limit;
    cp_async16(d0 + i * RS * 128, ok ? src + i * RS * stride : base, ok);
  }
}

// ------------------------------------------------------------------------------------------------
// Pieces of the wgmma backward kernel (both configurations). A warpgroup owns 64 keys; per step of
// BM = 64 queries its S^T / dP^T accumulators are [64 keys][BM queries] in the mma.sync C layout:
// element 4j + e of thread (warp, g, t) of the warpgroup is key 16 warp + g + 8 (e >> 1), query
// 8j + 2t + (e & 1).

// cp.async of the step at query head h, rows q0.. into stage buf: Q and dO (wg_off<BM> tiles, rows
// past S zero-filled), lse2, delta and the query segment ids.
template <int D, int BM, int NT, bool kOneRowPerThread>
__device__ __forceinline__ void wg_bwd_load_step(bf16* sQ, bf16* sdO, float* sLse2, float* sDelta, int* sSegQ, int buf,
                                                 const bf16* q, const bf16* dout, const float* lse2,
                                                 const float* delta, const int* seg_row, bool use_seg, int b, int h,
                                                 int Hq, int S, int S_pad, int q0, int tid) {
  wg_load_rows<D, BM, NT>(sQ + buf * (BM * D), q + static_cast<int64_t>(b * Hq + h) * S * D, D, q0, S, tid);
  wg_load_rows<D, BM, NT>(sdO + buf * (BM * D), dout + static_cast<int64_t>(b) * S * Hq * D + static_cast<int64_t>(h) * D,
                          static_cast<int64_t>(Hq) * D, q0, S, tid);
  load_step_stats<BM, NT, kOneRowPerThread>(sLse2, sDelta, sSegQ, buf, lse2, delta,
                                            static_cast<int64_t>(b * Hq + h) * S_pad + q0, seg_row, use_seg, q0, S,
                                            tid);
}

// Issues acc[64 keys][BM queries] (=) A B^T over k = D, both operands K-major: A the 64 rows at
// a_rows of a wg_off<AROWS> tile (K or V), B the wg_off<BM> tile at b_rows (Q or dO).
template <int D, int AROWS, int BM>
__device__ __forceinline__ void wg_mma_keys_queries(float (&acc)[BM / 2], uint32_t a_rows, uint32_t b_rows) {
  static_assert(BM == 64, "one m64n64 wgmma per k step");
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t aoff = (kk >> 2) * (AROWS * 128) + (kk & 3) * 32, boff = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
    WgmmaBf16::ss64(acc, wgmma_desc(a_rows + aoff, 16, 1024), wgmma_desc(b_rows + boff, 16, 1024), kk);
  }
}

// Issues acc[64 keys][D] += A B over k = BM queries: A register fragments (P^T or dS^T), B the
// wg_off<BM> tile at b_addr (dO or Q), MN-major.
template <int D, int BM>
__device__ __forceinline__ void wg_mma_rs_queries(float (&acc)[D / 2], const uint32_t (&a)[BM / 16][4],
                                                  uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < BM / 16; ++kk) {
    const uint64_t bd = wgmma_desc(b_addr + kk * 16 * 128, BM * 128, 1024);
    if constexpr (D == 128)
      WgmmaBf16::rs128_mn(acc, a[kk], bd);
    else
      WgmmaBf16::rs64_mn(acc, a[kk], bd);
  }
}

// Issues dq[64 queries][D] (=) dS K over k = the warpgroup's 64 keys: dS the wg_off<64> tile
// [queries][keys] at ds_addr (K-major), K the 64 rows at k_rows of a wg_off<KROWS> tile (MN-major).
template <int D, int KROWS>
__device__ __forceinline__ void wg_mma_dq(float (&dq)[D / 2], uint32_t ds_addr, uint32_t k_rows) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t a = wgmma_desc(ds_addr + kk * 32, 16, 1024);
    const uint64_t bk = wgmma_desc(k_rows + kk * 16 * 128, KROWS * 128, 1024);
    if constexpr (D == 128)
      WgmmaBf16::ss128_mn(dq, a, bk, kk);
    else
      WgmmaBf16::ss64_mn(dq, a, bk, kk);
  }
}

// P^T = 2^(S^T sl - lse2) in place; with need_mask, 0 where the key is past S, above the diagonal
// or in another segment (key_r: the thread's first key row, kb0 + kw0; sk: the segment ids of rows
// key_r and key_r + 8).
template <int BM>
__device__ __forceinline__ void wg_bwd_probs(float (&st)[BM / 2], const float* cL, float sl, bool need_mask,
                                             bool seg_mask, int key_r, int q0, int S, int causal,
                                             const int (&sk)[2], const int* cSq, int t) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ql = 8 * j + 2 * t + (e & 1);
      float p = fast_exp2(fmaf(st[4 * j + e], sl, -cL[ql]));
      if (need_mask) {
        const int key = key_r + 8 * (e >> 1);
        const bool masked = key >= S || (causal && key > q0 + ql) || (seg_mask && sk[e >> 1] != cSq[ql]);
        if (masked) p = 0.0f;
      }
      st[4 * j + e] = p;
    }
}

// dS^T = P^T (dP^T - delta), in place in dpt.
template <int BM>
__device__ __forceinline__ void wg_bwd_dsT(float (&dpt)[BM / 2], const float (&st)[BM / 2], const float* cDl, int t) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ql = 8 * j + 2 * t + (e & 1);
      dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - cDl[ql]);
    }
}

// Accumulators to bf16 register A fragments, one per 16-wide k step.
template <int KS>
__device__ __forceinline__ void pack_a_frags(uint32_t (&a)[KS][4], const float (&x)[KS * 8]) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kk][i] = pack_bf16(x[8 * kk + 2 * i], x[8 * kk + 2 * i + 1]);
}

// dS^T (A fragments) -> the warpgroup's dS tile [BM queries][64 keys] (wg_off<BM>), by stmatrix.trans:
// matrix jm of k step kk holds keys 16 warp + 8 (jm & 1) .., queries 16 kk + 8 (jm >> 1) ..; lane l
// addresses query row 16 kk + 8 (jm >> 1) + l % 8.
template <int BM>
__device__ __forceinline__ void wg_store_dsT(uint32_t ds_addr, const uint32_t (&da)[BM / 16][4], int warp, int lane) {
#pragma unroll
  for (int kk = 0; kk < BM / 16; ++kk) {
    const int jm = lane >> 3;
    const int q_row = 16 * kk + 8 * (jm >> 1) + (lane & 7);
    stmatrix_x4_trans(ds_addr + wg_off<BM>(q_row, warp * 2 + (jm & 1)) * 2, da[kk]);
  }
}

// The f32 dQ accumulator tile of query head h, queries q0 .. q0 + 63 (rows padded to S_pad). Its
// layout is permuted: [D / 8][128][4], element (n8 tile j, warpgroup thread wt, e) = register 4j + e
// of thread wt's dQ accumulator, so that a warp's 16-byte atomics cover 512 contiguous bytes
// (attn_train_dq_convert_tiles_kernel maps it back).
template <int D>
__device__ __forceinline__ float* dq_acc_tile(float* dq_acc, int b, int h, int Hq, int S_pad, int q0) {
  return dq_acc + (static_cast<int64_t>(b * Hq + h) * S_pad + q0) * D;
}
// Adds n8 tile j of thread wt's dQ registers (a, b, c, d = registers 4j .. 4j + 3) into the tile.
__device__ __forceinline__ void dq_tile_add(float* tile, int j, int wt, float a, float b, float c, float d) {
  red_add4(tile + j * 512 + wt * 4, a, b, c, d);
}

// dK (scaled) and dV of keys key_r and key_r + 8 (rows past S skipped; keys no query sees hold 0).
template <int D>
__device__ __forceinline__ void wg_store_dkdv(bf16* dk, bf16* dv, const float (&dk_acc)[D / 2],
                                              const float (&dv_acc)[D / 2], int64_t kv_off, int key_r, int S, int t,
                                              float scale) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = key_r + 8 * hf;
    if (key >= S) continue;
    const int64_t off = kv_off + static_cast<int64_t>(key) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dk + off + j * 8) =
          pack_bf16(dk_acc[4 * j + 2 * hf] * scale, dk_acc[4 * j + 2 * hf + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv + off + j * 8) = pack_bf16(dv_acc[4 * j + 2 * hf], dv_acc[4 * j + 2 * hf + 1]);
    }
  }
}

// Backward (wgmma): one kernel template for both configurations, BwdWgCfg<D, NWG, kMinBlocks>.
// A block is NWG warpgroups owning BN = 64 NWG keys (warpgroup w: keys 64w .. 64w + 63, whose dK,
// dV accumulate in registers over every step); BM = 64 queries per step. Per step, in each
// warpgroup:
//   S^T = K_w Q^T, dP^T = V_w dO^T   (wgmma SS, M = the 64 keys, N = the 64 queries, K-major)
//   P^T = 2^(S^T sl - lse2), dS^T = P^T (dP^T - delta) in the accumulators (masked where needed);
//   dS^T stored transposed (stmatrix.trans) as dS_w [64 queries][64 keys], a K-major tile;
//   dV += P^T dO, dK += dS^T Q      (wgmma RS: P^T, dS^T as register A operands, dO / Q MN-major)
//   dQ_w = dS_w K_w                  (wgmma SS, K MN-major): the warpgroup's partial over its keys,
//   added into the f32 dQ accumulator with 16-byte vector atomics in the permuted layout of
//   dq_acc_tile.
// NWG = 2 (BwdWg2Cfg<D>: D = 64 or 128, 1 block per SM; variant 1, and variant 3 for D = 128): dV
// and dK are two commit groups, dQ_w a third once the warpgroup's dS tile is complete. The two
// partials are summed through shared memory (wg_bwd_dq_exchange_add), then each warpgroup adds its
// half. Grid (key blocks, Hkv, B).
// NWG = 1 (BwdWg1Cfg: D = 64 only, 3 blocks per SM; variant 3). The 2-warpgroup configuration runs
// 1 block per SM in lock step (two __syncthreads per step), so for D = 64, where a step's math is
// small next to its elementwise work and synchronisation, the tensor cores idle while both
// warpgroups compute P / dS, exchange dQ and issue atomics. With one warpgroup per block several
// blocks share an SM (at most 168 registers), so one block's tensor-core work overlaps another's
// elementwise work, the way the D = 64 forward does. dV, dK and dQ_p = dS K are one commit group,
// no dQ exchange. Blocks are ordered heaviest key block first over the whole grid (grid
// (Hkv, B, key blocks)). Versus 2 warpgroups the dQ atomics and the Q / dO tile loads per FLOP
// double (64 keys per block instead of 128).
// Under causal, key block 0 (the heaviest) comes first in both grids.
template <int D_, int NWG_, int kMinBlocks_>
struct BwdWgCfg {
  static constexpr int D = D_;
  static constexpr int NWG = NWG_;                // warpgroups per block
  static constexpr int kMinBlocks = kMinBlocks_;  // blocks per SM (launch bounds)
  static constexpr int NT = NWG * 128;
  static constexpr int BN = NWG * 64;  // keys per block
  static constexpr int BM = 64;        // queries per step
  static constexpr int SD = BM / 2;    // S^T / dP^T accumulators per thread
  static constexpr int OD = D / 2;     // dK / dV / dQ accumulators per thread
  static constexpr int XH = OD / 2;    // dQ registers handed to the other warpgroup (NWG = 2)
  static constexpr int kKV = BN * D;
  static constexpr int kQ = BM * D;
  static constexpr int kDS = 64 * 64;                     // one warpgroup's dS tile
  static constexpr int kX = NWG == 2 ? 2 * XH * 128 : 0;  // the dQ exchange (f32)
  // Key blocks on grid z (slowest: heaviest blocks first over the whole grid), else on grid x.
  static constexpr bool kKeyBlocksOnZ = NWG == 1;
  // The step statistics' load form each configuration was measured with (see load_step_stats).
  static constexpr bool kOneRowStats = NWG == 1;
  // K, V, two Q and two dO stages, dS per warpgroup (bf16); the dQ exchange (f32); lse2, delta,
  // query segment ids (two stages each); + slack for the 1024-byte alignment.
  static constexpr int kSmemBytes = (2 * kKV + 4 * kQ + NWG * kDS) * 2 + kX * 4 + 3 * 2 * BM * 4 + 1024;
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(NWG == 2 || (NWG == 1 && D == 64), "2 warpgroups (D = 64, 128) or 1 warpgroup (D = 64)");
};
template <int D>
using BwdWg2Cfg = BwdWgCfg<D, 2, 1>;
using BwdWg1Cfg = BwdWgCfg<64, 1, 3>;

// NWG = 2: sums the two warpgroups' dQ partials [64 queries][D] and adds warpgroup wg's half into
// the tile. Warpgroup w owns registers [w * XH, (w + 1) * XH) and hands the other half to the other
// warpgroup through sX ([2 warpgroups][XH][128] f32). Register indices stay compile-time constants:
// one branch per warpgroup. Contains a __syncthreads.
template <int XH>
__device__ __forceinline__ void wg_bwd_dq_exchange_add(float* tile, float* sX, const float (&dq)[2 * XH], int wg,
                                                       int wt) {
  auto exchange = [&](auto own_tag) {
    constexpr int kOwn = decltype(own_tag)::value, kOther = 1 - kOwn;
    float* give = sX + kOwn * XH * 128;
#pragma unroll
    for (int i = 0; i < XH; ++i) give[i * 128 + wt] = dq[kOther * XH + i];
    __syncthreads();
    const float* take = sX + kOther * XH * 128;
#pragma unroll
    for (int i = 0; i < XH; i += 4) {
      constexpr int kBase = kOwn * XH;
      const int r = kBase + i;  // = 4 j: n8 tile j of the accumulator
      dq_tile_add(tile, r / 4, wt, dq[r] + take[i * 128 + wt], dq[r + 1] + take[(i + 1) * 128 + wt],
                  dq[r + 2] + take[(i + 2) * 128 + wt], dq[r + 3] + take[(i + 3) * 128 + wt]);
    }
  };
  if (wg == 0)
    exchange(std::integral_constant<int, 0>());
  else
    exchange(std::integral_constant<int, 1>());
}

template <typename Cfg>
__global__ void __launch_bounds__(Cfg::NT, Cfg::kMinBlocks)
    attn_train_bwd_wg_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, float* __restrict__ dq_acc,
                             const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                             const bf16* __restrict__ dout, const float* __restrict__ lse2,
                             const float* __restrict__ delta, const int* __restrict__ seg,
                             const int4* __restrict__ seg_ranges, int Hq, int Hkv, int S, int S_pad, int n_gran,
                             int causal, float sl, float scale) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D;
  constexpr int NWG = Cfg::NWG;
  constexpr int NT = Cfg::NT;
  constexpr int BN = Cfg::BN;
  constexpr int BM = Cfg::BM;
  constexpr int SD = Cfg::SD;
  constexpr int OD = Cfg::OD;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem_base = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  bf16* sK = reinterpret_cast<bf16*>(smem_base);  // wg_off<BN> tile
  bf16* sV = sK + Cfg::kKV;                        // wg_off<BN> tile
  bf16* sQ = sV + Cfg::kKV;                        // [2] wg_off<BM> tiles
  bf16* sdO = sQ + 2 * Cfg::kQ;                    // [2] wg_off<BM> tiles
  bf16* sdS = sdO + 2 * Cfg::kQ;                   // [NWG] wg_off<64> tiles [64 queries][64 keys]
  float* sX = reinterpret_cast<float*>(sdS + NWG * Cfg::kDS);  // [2 warpgroups][XH][128] (NWG = 2; else empty)
  float* sLse2 = sX + Cfg::kX;                                 // [2][BM]
  float* sDelta = sLse2 + 2 * BM;                              // [2][BM]
  int* sSegQ = reinterpret_cast<int*>(sDelta + 2 * BM);        // [2][BM]

  // Grid (Hkv, B, key blocks) or (key blocks, Hkv, B); key block 0 (heaviest under causal) first.
  const int kvh = Cfg::kKeyBlocksOnZ ? blockIdx.x : blockIdx.y;
  const int b = Cfg::kKeyBlocksOnZ ? blockIdx.y : blockIdx.z;
  const int kb0 = static_cast<int>(Cfg::kKeyBlocksOnZ ? blockIdx.z : blockIdx.x) * BN;
  const int G = Hq / Hkv;
  const int tid = threadIdx.x;
  // The warpgroup, the thread within it and the warp within it (NWG = 1: the block).
  const int wg = NWG == 1 ? 0 : tid >> 7;
  const int wt = NWG == 1 ? tid : tid & 127;
  const int warp = NWG == 1 ? tid >> 5 : (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int kw0 = wg * 64 + warp * 16 + g;  // this thread's key rows in the block: kw0, kw0 + 8

  const int64_t kv_off = static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const bool use_seg = seg != nullptr;
  const int* seg_row = use_seg ? seg + static_cast<int64_t>(b) * S : nullptr;
  const int4* rng_row = use_seg ? seg_ranges + static_cast<int64_t>(b) * n_gran : nullptr;

  wg_load_rows<D, BN, NT>(sK, k + kv_off, D, kb0, S, tid);
  wg_load_rows<D, BN, NT>(sV, v + kv_off, D, kb0, S, tid);

  const BwdSchedule<BN, BM> sched(use_seg, rng_row, kb0, S, G, causal);
  auto load_q = [&](int hi, int qb, int buf) {
    wg_bwd_load_step<D, BM, NT, Cfg::kOneRowStats>(sQ, sdO, sLse2, sDelta, sSegQ, buf, q, dout, lse2, delta, seg_row,
                                                   use_seg, b, kvh * G + hi, Hq, S, S_pad, qb * BM, tid);
  };

  int hi, qb;
  sched.first(hi, qb);
  if (hi < G) load_q(hi, qb, 0);
  cp_async_commit();

  int sk[2];
  seg_ids2(sk, seg_row, use_seg, kb0 + kw0, S);
  float dk_acc[OD], dv_acc[OD];
#pragma unroll
  for (int i = 0; i < OD; ++i) dk_acc[i] = dv_acc[i] = 0.0f;
  const uint32_t k_rows = smem_u32(sK) + wg * 64 * 128;  // the warpgroup's 64 keys (per column block)
  const uint32_t v_rows = smem_u32(sV) + wg * 64 * 128;
  const uint32_t ds_addr = smem_u32(sdS + wg * Cfg::kDS);

  int buf = 0;
  while (hi < G) {
    int nhi = hi, nqb = qb;
    sched.advance(nhi, nqb);
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();  // this step's tiles landed; the previous step is done with the other stage, dS, sX
    if (nhi < G) load_q(nhi, nqb, buf ^ 1);
    cp_async_commit();

    const int h = kvh * G + hi;
    const int q0 = qb * BM;
    const uint32_t q_addr = smem_u32(sQ + buf * Cfg::kQ);
    const uint32_t do_addr = smem_u32(sdO + buf * Cfg::kQ);
    const float* cL = sLse2 + buf * BM;
    const float* cDl = sDelta + buf * BM;
    const int* cSq = sSegQ + buf * BM;

    // S^T = K_w Q^T and dP^T = V_w dO^T.
    float st[SD], dpt[SD];
#pragma unroll
    for (int i = 0; i < SD; ++i) st[i] = dpt[i] = 0.0f;
    wgmma_fence();
    wg_mma_keys_queries<D, BN, BM>(st, k_rows, q_addr);
    wg_mma_keys_queries<D, BN, BM>(dpt, v_rows, do_addr);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(st);
    fence_regs(dpt);

    // P^T and dS^T = P^T (dP^T - delta) in the accumulators, as A fragments; dS^T -> dS_w.
    bool seg_mask, need_mask;
    sched.masks(q0, seg_mask, need_mask);
    wg_bwd_probs<BM>(st, cL, sl, need_mask, seg_mask, kb0 + kw0, q0, S, causal, sk, cSq, t);
    uint32_t pa[BM / 16][4], da[BM / 16][4];
    pack_a_frags(pa, st);
    wg_bwd_dsT<BM>(dpt, st, cDl, t);
    pack_a_frags(da, dpt);
    wg_store_dsT<BM>(ds_addr, da, warp, lane);

    float dq[OD];
    if constexpr (NWG == 1) {
      fence_proxy_async();  // the stmatrix writes, visible to the dQ wgmma
      __syncthreads();      // the dS tile is complete (the block is one warpgroup)

      // dV += P^T dO, dK += dS^T Q, dQ_p = dS K: one commit group.
#pragma unroll
      for (int i = 0; i < OD; ++i) dq[i] = 0.0f;
      wgmma_fence();
      wg_mma_rs_queries<D, BM>(dv_acc, pa, do_addr);
      wg_mma_rs_queries<D, BM>(dk_acc, da, q_addr);
      wg_mma_dq<D, BN>(dq, ds_addr, k_rows);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dv_acc);
      fence_regs(dk_acc);
      fence_regs(pa);
      fence_regs(da);
      fence_regs(dq);

      float* tile = dq_acc_tile<D>(dq_acc, b, h, Hq, S_pad, q0);
#pragma unroll
      for (int j = 0; j < OD / 4; ++j) dq_tile_add(tile, j, wt, dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    } else {
      // dV += P^T dO, dK += dS^T Q.
      wgmma_fence();
      wg_mma_rs_queries<D, BM>(dv_acc, pa, do_addr);
      wgmma_commit();
      wgmma_fence();
      wg_mma_rs_queries<D, BM>(dk_acc, da, q_addr);
      wgmma_commit();
      fence_proxy_async();    // the stmatrix writes, visible to the dQ wgmma
      warpgroup_barrier(wg);  // the warpgroup's dS tile is complete
      wgmma_wait<0>();
      fence_regs(dv_acc);
      fence_regs(dk_acc);
      fence_regs(pa);
      fence_regs(da);

      // dQ_w = dS_w K_w.
#pragma unroll
      for (int i = 0; i < OD; ++i) dq[i] = 0.0f;
      wgmma_fence();
      wg_mma_dq<D, BN>(dq, ds_addr, k_rows);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(dq);

      wg_bwd_dq_exchange_add<Cfg::XH>(dq_acc_tile<D>(dq_acc, b, h, Hq, S_pad, q0), sX, dq, wg, wt);
    }
    hi = nhi;
    qb = nqb;
    buf ^= 1;
  }
  cp_async_wait<0>();
  wg_store_dkdv<D>(dk, dv, dk_acc, dv_acc, kv_off, kb0 + kw0, S, t, scale);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

// ------------------------------------------------------------------------------------------------
// dq[b, h, i, :] = scale * dq_acc (row-major [.., S_pad, D] accumulator: the mma.sync backward), in
// pairs.
template <typename T>
__global__ void attn_train_dq_convert_kernel(T* __restrict__ dq, const float* __restrict__ dq_acc, int64_t n_pairs,
                                             int S, int S_pad, int D, float scale) {
  const int half_d = D / 2;
  for (int64_t pidx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pidx < n_pairs;
       pidx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = pidx / half_d;  // (b * Hq + h) * S + i
    const int d = static_cast<int>(pidx % half_d) * 2;
    const int64_t bh = row / S;
    const int i = static_cast<int>(row % S);
    const float2 x = load2(dq_acc + (bh * S_pad + i) * D + d);
    store2(dq + row * D + d, x.x * scale, x.y * scale);
  }
}

// The conversion of the permuted accumulator of the wgmma backward kernels (dq_acc_tile), one block
// per (b, h, 64-query tile): the tile's accumulator is read as float4s (coalesced), transposed
// through shared memory, and written as full rows of dq (coalesced), with no 64-bit division per
// element.
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
// Generic kernels: any even D <= 256 (up to 4 pairs of dims per lane), f32/bf16/f16, f32 math.

constexpr int kGenericThreads = 128;
constexpr int kGenericWarps = kGenericThreads / 32;
constexpr int kMaxPairs = 4;

template <typename T>
__device__ __forceinline__ void load_row(float2 (&x)[kMaxPairs], const T* row, int pairs, int lane) {
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    x[kq] = pi < pairs ? load2(row + 2 * pi) : make_float2(0.f, 0.f);
  }
}
__device__ __forceinline__ float warp_dot(const float2 (&a)[kMaxPairs], const float2 (&b)[kMaxPairs]) {
  float s = 0.0f;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) s = fmaf(a[kq].x, b[kq].x, fmaf(a[kq].y, b[kq].y, s));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

// One warp per query row (b, h, i).
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_fwd_generic_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                                  const T* __restrict__ k, const T* __restrict__ v, const int* __restrict__ seg, int B,
                                  int Hq, int Hkv, int S, int D, int causal, float sl) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hq * S) return;
  const int i = static_cast<int>(p % S);
  const int64_t bh = p / S;
  const int h = static_cast<int>(bh % Hq);
  const int b = static_cast<int>(bh / Hq);
  const int kvh = h / (Hq / Hkv);
  const int pairs = D / 2;
  const int sq = seg ? seg[static_cast<int64_t>(b) * S + i] : 0;
  const int n_keys = (seg && sq < 0) ? 0 : (causal ? i + 1 : S);

  float2 qv[kMaxPairs], acc[kMaxPairs];
  load_row(qv, q + p * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) acc[kq] = make_float2(0.f, 0.f);
  float m = -INFINITY, l = 0.0f;
  const T* kb = k + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const T* vb = v + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  for (int j = 0; j < n_keys; ++j) {
    if (seg && seg[static_cast<int64_t>(b) * S + j] != sq) continue;
    float2 kv[kMaxPairs];
    load_row(kv, kb + static_cast<int64_t>(j) * D, pairs, lane);
    const float s = warp_dot(qv, kv) * sl;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new);
    const float pj = exp2f(s - m_new);
    l = l * alpha + pj;
    m = m_new;
    load_row(kv, vb + static_cast<int64_t>(j) * D, pairs, lane);
#pragma unroll
    for (int kq = 0; kq < kMaxPairs; ++kq) {
      acc[kq].x = fmaf(pj, kv[kq].x, acc[kq].x * alpha);
      acc[kq].y = fmaf(pj, kv[kq].y, acc[kq].y * alpha);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = out + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) store2(orow + 2 * pi, acc[kq].x * inv, acc[kq].y * inv);
  }
  if (lane == 0) lse[p] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
}

// dq: one warp per query row (b, h, i).
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_bwd_dq_generic_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                                     const T* __restrict__ v, const T* __restrict__ dout,
                                     const float* __restrict__ lse2, const float* __restrict__ delta,
                                     const int* __restrict__ seg, int B, int Hq, int Hkv, int S, int S_pad, int D,
                                     int causal, float sl, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hq * S) return;
  const int i = static_cast<int>(p % S);
  const int64_t bh = p / S;
  const int h = static_cast<int>(bh % Hq);
  const int b = static_cast<int>(bh / Hq);
  const int kvh = h / (Hq / Hkv);
  const int pairs = D / 2;
  const float L2 = lse2[bh * S_pad + i];
  const float dl = delta[bh * S_pad + i];
  const int sq = seg ? seg[static_cast<int64_t>(b) * S + i] : 0;
  const int n_keys = L2 == INFINITY ? 0 : (causal ? i + 1 : S);

  float2 qv[kMaxPairs], dov[kMaxPairs], acc[kMaxPairs];
  load_row(qv, q + p * D, pairs, lane);
  load_row(dov, dout + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) acc[kq] = make_float2(0.f, 0.f);
  const T* kb = k + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  const T* vb = v + static_cast<int64_t>(b * Hkv + kvh) * S * D;
  for (int j = 0; j < n_keys; ++j) {
    if (seg && seg[static_cast<int64_t>(b) * S + j] != sq) continue;
    float2 kv[kMaxPairs], vv[kMaxPairs];
    load_row(kv, kb + static_cast<int64_t>(j) * D, pairs, lane);
    load_row(vv, vb + static_cast<int64_t>(j) * D, pairs, lane);
    const float pj = exp2f(warp_dot(qv, kv) * sl - L2);
    const float ds = pj * (warp_dot(dov, vv) - dl);
#pragma unroll
    for (int kq = 0; kq < kMaxPairs; ++kq) {
      acc[kq].x = fmaf(ds, kv[kq].x, acc[kq].x);
      acc[kq].y = fmaf(ds, kv[kq].y, acc[kq].y);
    }
  }
  T* dst = dq + p * D;
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) store2(dst + 2 * pi, acc[kq].x * scale, acc[kq].y * scale);
  }
}

// dk, dv: one warp per key row (b, kvh, j), summing over the G query heads and the queries that see it.
template <typename T>
__global__ void __launch_bounds__(kGenericThreads)
    attn_train_bwd_dkdv_generic_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                                       const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                                       const float* __restrict__ lse2, const float* __restrict__ delta,
                                       const int* __restrict__ seg, int B, int Hq, int Hkv, int S, int S_pad, int D,
                                       int causal, float sl, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kGenericWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * Hkv * S) return;
  const int j = static_cast<int>(p % S);
  const int64_t bk = p / S;
  const int kvh = static_cast<int>(bk % Hkv);
  const int b = static_cast<int>(bk / Hkv);
  const int G = Hq / Hkv;
  const int pairs = D / 2;
  const int sk = seg ? seg[static_cast<int64_t>(b) * S + j] : 0;

  float2 kv[kMaxPairs], vv[kMaxPairs], dka[kMaxPairs], dva[kMaxPairs];
  load_row(kv, k + p * D, pairs, lane);
  load_row(vv, v + p * D, pairs, lane);
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) dka[kq] = dva[kq] = make_float2(0.f, 0.f);
  if (!seg || sk >= 0) {
    for (int hi = 0; hi < G; ++hi) {
      const int h = kvh * G + hi;
      const int64_t bh = static_cast<int64_t>(b) * Hq + h;
      for (int i = causal ? j : 0; i < S; ++i) {
        if (seg && seg[static_cast<int64_t>(b) * S + i] != sk) continue;
        const float L2 = lse2[bh * S_pad + i];
        if (L2 == INFINITY) continue;
        float2 qv[kMaxPairs], dov[kMaxPairs];
        load_row(qv, q + (bh * S + i) * D, pairs, lane);
        load_row(dov, dout + ((static_cast<int64_t>(b) * S + i) * Hq + h) * D, pairs, lane);
        const float pij = exp2f(warp_dot(qv, kv) * sl - L2);
        const float ds = pij * (warp_dot(dov, vv) - delta[bh * S_pad + i]);
#pragma unroll
        for (int kq = 0; kq < kMaxPairs; ++kq) {
          dka[kq].x = fmaf(ds, qv[kq].x, dka[kq].x);
          dka[kq].y = fmaf(ds, qv[kq].y, dka[kq].y);
          dva[kq].x = fmaf(pij, dov[kq].x, dva[kq].x);
          dva[kq].y = fmaf(pij, dov[kq].y, dva[kq].y);
        }
      }
    }
  }
#pragma unroll
  for (int kq = 0; kq < kMaxPairs; ++kq) {
    const int pi = lane + 32 * kq;
    if (pi < pairs) {
      store2(dk + p * D + 2 * pi, dka[kq].x * scale, dka[kq].y * scale);
      store2(dv + p * D + 2 * pi, dva[kq].x, dva[kq].y);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

struct Geometry {
  int B = 0, Hq = 0, Hkv = 0, S = 0, D = 0;
};

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

// Tensor-core variants: 0 = mma.sync (any sm_80+ GPU), 1 = wgmma (sm_90a Hopper), 3 = wgmma with
// the one-warpgroup D = 64 backward (for D = 128 the same as 1); 2 and 4 were removed (see the top
// of the file). KILN_ATTN_TRAIN_VARIANT=0, 1 or 3 (read on every call, for tests and benchmarks)
// overrides the default (other values are ignored); 1 and 3 fall back to 0 on devices without wgmma.
// Measured on the H200 (bench_attention_train, causal bf16; backward incl. prep and dQ conversion):
// D = 64, B 8 x S 2048, Hq 32 / Hkv 8: variant 1 1.79 ms (192 TFLOP/s), 3 1.24 ms (278), 0 2.07 ms;
// D = 128, B 4 x S 4096: 1 4.79 ms, 3 4.72 ms (291), 0 7.37 (1 then still used the untiled dQ
// conversion that 3 replaced).
constexpr int kDefaultTrainVariant = 3;

// The device facts (wgmma support, raised shared-memory limits) are per backend, shared with the
// inference attention kernels (kernels/cuda/attention_internal.h), not function-local statics.
int train_variant(CudaBackend& be) {
  const char* e = std::getenv("KILN_ATTN_TRAIN_VARIANT");
  int want = kDefaultTrainVariant;
  if (e != nullptr && (e[0] == '0' || e[0] == '1' || e[0] == '3') && e[1] == '\0') want = e[0] - '0';
  return want >= 1 && attention_device_has_wgmma(be) ? want : 0;
}

bool fast_path(const Geometry& g, DType dtype, std::initializer_list<const void*> ptrs) {
  if (dtype != DType::bf16 || (g.D != 64 && g.D != 128)) return false;
  for (const void* p : ptrs)
    if (!detail::aligned16(p)) return false;
  return true;
}

// Raises the kernel's dynamic shared-memory limit on be's device (once per backend and kernel).
template <typename Kernel>
void allow_smem(CudaBackend& be, Kernel* kernel, int bytes) {
  attention_allow_smem(be, reinterpret_cast<const void*>(kernel), bytes);
}

template <int D, int MT, int BN, int NW>
void launch_fwd(CudaBackend& be, const Geometry& g, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                const int* seg, const int4* ranges, int n_gran, bool causal, float sl) {
  using Cfg = FwdCfg<D, MT, BN, NW>;
  auto kernel = attn_train_fwd_kernel<D, MT, BN, NW>;
  allow_smem(be, kernel, Cfg::kSmemBytes);
  const int num_qtiles = (g.S + Cfg::BM - 1) / Cfg::BM;
  dim3 grid(num_qtiles, g.Hq, g.B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, detail::stream_of(be)>>>(
      out.ptr<bf16>(), lse.ptr<float>(), q.ptr<const bf16>(), k.ptr<const bf16>(), v.ptr<const bf16>(), seg, ranges,
      g.Hq, g.Hkv, g.S, n_gran, num_qtiles, causal ? 1 : 0, sl);
  KILN_CUDA_CHECK_LAUNCH();
}

// The wgmma backward kernel in configuration Cfg (BwdWg2Cfg<D> or BwdWg1Cfg).
template <typename Cfg>
void launch_bwd_wg(CudaBackend& be, const Geometry& g, Tensor dk, Tensor dv, float* dq_acc, Tensor q, Tensor k,
                   Tensor v, Tensor dout, const float* lse2, const float* delta, const int* seg, const int4* ranges,
                   int n_gran, int S_pad, bool causal, float sl, float scale) {
  static_assert(Cfg::kSmemBytes * Cfg::kMinBlocks <= 228 * 1024, "shared memory per SM");
  auto kernel = attn_train_bwd_wg_kernel<Cfg>;
  allow_smem(be, kernel, Cfg::kSmemBytes);
  const int n_kb = (g.S + Cfg::BN - 1) / Cfg::BN;
  // Key blocks slowest (grid z: heaviest blocks first over the whole grid) or fastest (grid x).
  const dim3 grid = Cfg::kKeyBlocksOnZ ? dim3(g.Hkv, g.B, n_kb) : dim3(n_kb, g.Hkv, g.B);
  kernel<<<grid, Cfg::NT, Cfg::kSmemBytes, detail::stream_of(be)>>>(
      dk.ptr<bf16>(), dv.ptr<bf16>(), dq_acc, q.ptr<const bf16>(), k.ptr<const bf16>(), v.ptr<const bf16>(),
      dout.ptr<const bf16>(), lse2, delta, seg, ranges, g.Hq, g.Hkv, g.S, S_pad, n_gran, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
}

template <int D, int BM, int NW, bool kKVRegs>
void launch_bwd(CudaBackend& be, const Geometry& g, Tensor dk, Tensor dv, float* dq_acc, Tensor q, Tensor k, Tensor v,
                Tensor dout, const float* lse2, const float* delta, const int* seg, const int4* ranges, int n_gran,
                int S_pad, bool causal, float sl, float scale) {
  using Cfg = BwdCfg<D, BM, NW, kKVRegs>;
  auto kernel = attn_train_bwd_kernel<D, BM, NW, kKVRegs>;
  allow_smem(be, kernel, Cfg::kSmemBytes);
  dim3 grid((g.S + Cfg::BN - 1) / Cfg::BN, g.Hkv, g.B);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, detail::stream_of(be)>>>(
      dk.ptr<bf16>(), dv.ptr<bf16>(), dq_acc, q.ptr<const bf16>(), k.ptr<const bf16>(), v.ptr<const bf16>(),
      dout.ptr<const bf16>(), lse2, delta, seg, ranges, g.Hq, g.Hkv, g.S, S_pad, n_gran, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_fwd_generic(CudaBackend& be, const Geometry& g, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                        const int* seg, bool causal, float sl) {
  const int64_t rows = static_cast<int64_t>(g.B) * g.Hq * g.S;
  const unsigned blocks = static_cast<unsigned>((rows + kGenericWarps - 1) / kGenericWarps);
  attn_train_fwd_generic_kernel<T><<<blocks, kGenericThreads, 0, detail::stream_of(be)>>>(
      out.ptr<T>(), lse.ptr<float>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), seg, g.B, g.Hq, g.Hkv, g.S,
      g.D, causal ? 1 : 0, sl);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_bwd_prep(CudaBackend& be, const Geometry& g, float* delta, float* lse2, float* dq_acc, Tensor out,
                     Tensor dout, Tensor lse, int S_pad) {
  const int64_t rows = static_cast<int64_t>(g.B) * g.Hq * S_pad;
  attn_train_bwd_prep_kernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, detail::stream_of(be)>>>(
      delta, lse2, dq_acc, out.ptr<const T>(), dout.ptr<const T>(), lse.ptr<const float>(), g.B, g.Hq, g.S, S_pad, g.D);
  KILN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_bwd_generic(CudaBackend& be, const Geometry& g, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                        Tensor k, Tensor v, const float* lse2, const float* delta, const int* seg, int S_pad,
                        bool causal, float sl, float scale) {
  cudaStream_t stream = detail::stream_of(be);
  const int64_t q_rows = static_cast<int64_t>(g.B) * g.Hq * g.S;
  attn_train_bwd_dq_generic_kernel<T><<<static_cast<unsigned>((q_rows + kGenericWarps - 1) / kGenericWarps),
                                        kGenericThreads, 0, stream>>>(
      dq.ptr<T>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), dout.ptr<const T>(), lse2, delta, seg, g.B,
      g.Hq, g.Hkv, g.S, S_pad, g.D, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
  const int64_t k_rows = static_cast<int64_t>(g.B) * g.Hkv * g.S;
  attn_train_bwd_dkdv_generic_kernel<T><<<static_cast<unsigned>((k_rows + kGenericWarps - 1) / kGenericWarps),
                                          kGenericThreads, 0, stream>>>(
      dk.ptr<T>(), dv.ptr<T>(), q.ptr<const T>(), k.ptr<const T>(), v.ptr<const T>(), dout.ptr<const T>(), lse2, delta,
      seg, g.B, g.Hq, g.Hkv, g.S, S_pad, g.D, causal ? 1 : 0, sl, scale);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace

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

  if (fast_path(g, q.dtype, {out.data, q.data, k.data, v.data})) {
    if (train_variant(be) >= 1) {
      KILN_ASSERT(static_cast<int64_t>(g.B) * g.Hq * g.S < (int64_t{1} << 31));  // TMA row coordinates
      const attn::DenseArgs a{out.data, lse.ptr<float>(), q.data, k.data, v.data, seg, rng,
                              g.B, g.Hq, g.Hkv, g.S, g.D, n_gran, causal, sl};
      return attn::launch_dense_ws(be, a);
    }
    if (g.D == 64)
      launch_fwd<64, 2, 64, 4>(be, g, out, lse, q, k, v, seg, rng, n_gran, causal, sl);
    else
      launch_fwd<128, 1, 64, 4>(be, g, out, lse, q, k, v, seg, rng, n_gran, causal, sl);
    return;
  }
  switch (q.dtype) {
    case DType::f32: return launch_fwd_generic<float>(be, g, out, lse, q, k, v, seg, causal, sl);
    case DType::bf16: return launch_fwd_generic<bf16>(be, g, out, lse, q, k, v, seg, causal, sl);
    case DType::f16: return launch_fwd_generic<__half>(be, g, out, lse, q, k, v, seg, causal, sl);
    default: KILN_ASSERT(false && "attention_train_forward: float tensors only");
  }
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

  if (fast_path(g, q.dtype, {dq.data, dk.data, dv.data, dout.data, q.data, k.data, v.data, out.data})) {
    TensorBuffer acc = device_scratch(be, Shape{stat_rows, g.D}, DType::f32);  // dQ accumulator [B, Hq, S_pad, D]
    launch_bwd_prep<bf16>(be, g, delta, lse2, acc.ptr<float>(), out, dout, lse, S_pad);
    const int variant = train_variant(be);
    const bool wg = variant >= 1;
    // Variant 3: the one-warpgroup kernel for D = 64 (key blocks on grid z, at most 65535).
    const bool wg1 = variant == 3 && g.D == 64 && (g.S + BwdWg1Cfg::BN - 1) / BwdWg1Cfg::BN <= 65535;
    if (wg1) {
      launch_bwd_wg<BwdWg1Cfg>(be, g, dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran, S_pad,
                               causal, sl, scale);
    } else if (wg) {
      if (g.D == 64)
        launch_bwd_wg<BwdWg2Cfg<64>>(be, g, dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran,
                                     S_pad, causal, sl, scale);
      else
        launch_bwd_wg<BwdWg2Cfg<128>>(be, g, dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran,
                                      S_pad, causal, sl, scale);
    } else {
      if (g.D == 64)
        launch_bwd<64, 64, 8, true>(be, g, dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran,
                                    S_pad, causal, sl, scale);
      else
        launch_bwd<128, 32, 8, false>(be, g, dk, dv, acc.ptr<float>(), q, k, v, dout, lse2, delta, seg, rng, n_gran,
                                      S_pad, causal, sl, scale);
    }
    if (wg) {
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
    } else {
      const int64_t n_pairs = q.numel() / 2;
      attn_train_dq_convert_kernel<bf16><<<detail::grid_for(be, n_pairs, 256), 256, 0, detail::stream_of(be)>>>(
          dq.ptr<bf16>(), acc.ptr<const float>(), n_pairs, g.S, S_pad, g.D, scale);
    }
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (q.dtype) {
    case DType::f32:
      launch_bwd_prep<float>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad);
      return launch_bwd_generic<float>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    case DType::bf16:
      launch_bwd_prep<bf16>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad);
      return launch_bwd_generic<bf16>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    case DType::f16:
      launch_bwd_prep<__half>(be, g, delta, lse2, nullptr, out, dout, lse, S_pad);
      return launch_bwd_generic<__half>(be, g, dq, dk, dv, dout, q, k, v, lse2, delta, seg, S_pad, causal, sl, scale);
    default: KILN_ASSERT(false && "attention_train_backward: float tensors only");
  }
}

}  // namespace kiln::cuda
