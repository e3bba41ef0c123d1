// The wgmma backward main kernel of the CUDA training attention (tensor-core variants 1 and 3; the
// design is described at the top of attention_train.cu): attn_train_bwd_wg_kernel in its two
// configurations, its step schedule and device pieces, and its launcher (launch_bwd_wgmma). The
// prep kernel before it and the dQ conversion after it are in attention_train.cu.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/attention_segments.cuh"
#include "kernels/cuda/attention_train_internal.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"

namespace kiln::cuda::attn_train {
namespace {

// ------------------------------------------------------------------------------------------------
// Device helpers.

// 4-byte global->shared copy; zero-fills when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

// Two floats to a packed bf16 pair, `lo` in the low 16 bits.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Step schedule of a backward block of BN keys from kb0: the steps (hi, qb) visit, for each query
// head hi of the kv head's group of G, the BM-row query blocks qb that can see the keys (from the
// diagonal block under causal; blocks whose segment ranges cannot meet the keys' are skipped).
// hi == G: no step left.
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
// (The same rows, but the two forms compile differently and each configuration keeps the one it
// was measured with: nvcc 13.0 does not fold the strided loop when NT >= BM, which costs the
// kernels that use it 200-290 SASS instructions, run once per step.)
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
using attn::wg_load_rows;

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
  wg_load_rows<bf16, D, BM, NT>(sQ + buf * (BM * D), q + static_cast<int64_t>(b * Hq + h) * S * D, D, q0, S, tid);
  wg_load_rows<bf16, D, BM, NT>(sdO + buf * (BM * D), dout + static_cast<int64_t>(b) * S * Hq * D + static_cast<int64_t>(h) * D,
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

  wg_load_rows<bf16, D, BN, NT>(sK, k + kv_off, D, kb0, S, tid);
  wg_load_rows<bf16, D, BN, NT>(sV, v + kv_off, D, kb0, S, tid);

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

// Raises the kernel's dynamic shared-memory limit on be's device (once per backend and kernel).
template <typename Kernel>
void allow_smem(CudaBackend& be, Kernel* kernel, int bytes) {
  attention_allow_smem(be, reinterpret_cast<const void*>(kernel), bytes);
}

// The wgmma backward kernel in configuration Cfg (BwdWg2Cfg<D> or BwdWg1Cfg).
template <typename Cfg>
void launch_bwd_wg(CudaBackend& be, const Geometry& g, Tensor dk, Tensor dv, float* dq_acc, Tensor q, Tensor k,
                   Tensor v, Tensor dout, const float* lse2, const float* delta, const int* seg, const int4* ranges,
                   int n_gran, int S_pad, bool causal, float sl, float scale) {
  static_assert(Cfg::kSmemBytes * Cfg::kMinBlocks <= 228 * 1024, "shared memory per SM");
  static_assert(kSeqPad % Cfg::BM == 0, "whole query blocks in the padded scratch rows");
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

}  // namespace

void launch_bwd_wgmma(CudaBackend& be, const Geometry& g, int variant, Tensor dk, Tensor dv, float* dq_acc, Tensor q,
                      Tensor k, Tensor v, Tensor dout, const float* lse2, const float* delta, const int* seg,
                      const int4* ranges, int n_gran, int S_pad, bool causal, float sl, float scale) {
  // Variant 3: the one-warpgroup kernel for D = 64 (key blocks on grid z, at most 65535).
  const bool wg1 = variant == 3 && g.D == 64 && (g.S + BwdWg1Cfg::BN - 1) / BwdWg1Cfg::BN <= 65535;
  if (wg1)
    launch_bwd_wg<BwdWg1Cfg>(be, g, dk, dv, dq_acc, q, k, v, dout, lse2, delta, seg, ranges, n_gran, S_pad, causal, sl,
                             scale);
  else if (g.D == 64)
    launch_bwd_wg<BwdWg2Cfg<64>>(be, g, dk, dv, dq_acc, q, k, v, dout, lse2, delta, seg, ranges, n_gran, S_pad, causal,
                                 sl, scale);
  else
    launch_bwd_wg<BwdWg2Cfg<128>>(be, g, dk, dv, dq_acc, q, k, v, dout, lse2, delta, seg, ranges, n_gran, S_pad,
                                  causal, sl, scale);
}

}  // namespace kiln::cuda::attn_train
