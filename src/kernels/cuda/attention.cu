// CUDA causal grouped-query attention over a packed batch with keys/values in a paged cache
// (kiln::cuda::attention_forward; semantics in kernels/ops.h, the paged view in kernels/paged_kv.h).
//
// Math: for request b, query row i (0 <= i < q_len) and query head h,
//   pos = kv_len - q_len + i,  s_j = scale * <q[i,h], k[j, h / (Hq/Hkv)]>  for keys j = 0..pos,
//   out[i,h] = sum_j softmax(s)_j v[j, h / (Hq/Hkv)],
// with q [T,Hq,D] rows q_indptr[b].., and key j of request b at pool row (of k/v [S,Hkv,D])
//   row(b, j) = page_indices[page_indptr[b] + j / page_size] * page_size + j % page_size,
// i.e. paged_kv_slot() of kernels/paged_kv.h, kv_len = paged_kv_len() (a request with no pages has
// none). Every page size >= 1 works; j / page_size is a multiply-high and shifts by host-computed
// constants (PageDivisor: a plain shift for a power of two). The page table is read once per key
// of a K/V tile (prefill), once per 16-key step (decode; per row only in steps that cross a page
// boundary or on pages of fewer than 16 keys) or once per page (generic), never per element.
// The softmax is computed online in f32 in the log2 domain (s * scale * log2 e, ex2.approx);
// products on tensor cores take bf16/f16 operands with f32 accumulation; P is rounded to the input
// type for the PV product, except in the (memory-bound) decode kernel, where bf16 P is carried as
// hi + lo parts.
//
// Three kernel families, picked on the host from the bounds (never from device data):
//  1. Decode / short queries (bf16/f16, D in {64,128}, max_q_len * G <= 64 where G = Hq/Hkv):
//     split-KV "flash decoding". The rows of one kv head's query group are packed as
//     R = i * G + (h % G) and cut in tiles of 16 rows (one mma M tile), so K/V are read once per
//     GQA group. Grid (splits, Hkv * row_tiles, B), 4 warps per block. Each block takes one
//     contiguous key range of its split; its warps take interleaved 16-key steps (starting at
//     multiples of 16), loading K/V rows straight from global memory into registers (16-byte
//     loads, two steps in flight for D=64) in a layout that feeds mma.sync m16n8k16 without
//     shared memory (the head dimension is permuted consistently for the QK product and the
//     output dimension for the PV product). The warps' (m, l, acc) are merged through shared
//     memory; with one split the block writes `out`, otherwise it writes (acc/l, lse) to scratch
//     and a combine kernel merges the splits (one block per (row, head); its warps sum
//     interleaved splits).
//     Paging: a warp reads the page id of its next step's first key one step ahead; a step that
//     lies in one page (every step when the page size is a multiple of 16) is 16 consecutive pool
//     rows from there, as cheap as a contiguous cache; a step across a page boundary or on pages
//     of fewer than 16 keys looks each of its rows up (a page-table read per row).
//     Splits: num_splits = clamp(S, 1, ceil(max_kv_len / 64)), S the count (from floor(W / base)
//     to 2W / base) that fills whole waves best, base = B * Hkv * row_tiles, W = SMs * resident decode
//     blocks per SM (occupancy query: 3 for D=64, 2 for D=128); each block at least 64 keys. Each block computes its key
//     range on the device from the true lengths: active = min(num_splits, ceil(n_keys / 64)),
//     steps = ceil(n_keys / 16), ceil(steps / active) steps per split, so a graph captured with
//     large bounds still spreads a short context over the splits, and gives bit-identical results
//     to an eager call with tighter max_kv_len (splits past `active` are empty: lse = -inf, o = 0,
//     and add exact zeros in the combine). Scratch: B*max_q_len*Hq*max_splits*(D+1) floats
//     (max_splits: the split count without the max_kv_len cap), independent of max_kv_len.
//  2. Prefill (bf16/f16, D in {64,128}, longer query runs): FlashAttention-2 style. Grid
//     (ceil(max_q_len / BM), Hq, B) with the heaviest (last) query tiles launched first; block of
//     4 warps, BM = 128 (D=64, two 16-row M tiles per warp) or 64 (D=128) query rows, BN = 64 keys
//     per tile; Q/K/V tiles in XOR-swizzled shared memory filled by cp.async (K/V double
//     buffered, rows past the end zero-filled), ldmatrix(.trans) fragments, mma.sync m16n8k16.
//     Key tiles past the block's last query position are skipped; only tiles that cross the
//     diagonal (or the end of the keys) are masked.
//     That is variant 0 (the fallback off sm_90). On sm_90a Hopper one wgmma kernel (2b, for
//     D=64 and D=128) serves variants 1 and 2: a warpgroup per 64 query rows, S = Q K^T with both
//     operands from shared-memory descriptors, O += P V with P from registers and V as an
//     MN-major descriptor, K/V double buffered. Variant 1: 1 warpgroup (BM=64), 128-key tiles for
//     D=64 (64 for D=128); variant 2: 2 warpgroups sharing the K/V tiles (BM=128), 64-key tiles.
//     Paging (every variant, TileRows): the pool rows of each K/V tile's keys are put in shared
//     memory ahead of its copies, one page-table read per key (thread r of the block for key r of
//     the tile, its latency hidden behind a tile of compute); the cp.async copies read their row
//     there, so a tile costs the same for every page size and for keys scattered over any pages.
//     Defaults from the H200 measurements (causal bf16, ms per call; figures in
//     kernels/cuda/attention_internal.h): D=64 -> 1 (fastest at every length: L=30000 6.99 ms vs
//     9.18 for 0), D=128 -> 2 (L=8192 1.17 ms vs 1.36 for 1 and 2.10 for 0). The environment
//     variable KILN_ATTN_PREFILL_VARIANT=N (read once per backend) overrides the default for both
//     head sizes; tests/benchmarks: CudaBackend::set_attention_prefill_variant.
//  3. Generic (any even D <= 256, f32/bf16/f16, or unaligned pointers): one warp per (query row,
//     head), online softmax over keys one at a time, walking the request's pages (one page-table
//     read per page). Slow; for correctness on other shapes.
// Every launch goes on the backend's stream; no host synchronisation and no allocation other than
// be.scratch(), so the decode path can be captured in a CUDA graph (size scratch before capture).
// Blocks beyond a request's true q_len (from the device indptr) exit early, before reading the page
// arrays: a padding request (no queries, no pages) computes nothing and rows of q/out that belong
// to no request are not touched. Device facts (wgmma support, occupancy, raised shared-memory
// limits) and the environment's variant live in the backend (AttentionState), not in statics.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <type_traits>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/paged_kv.h"

namespace kiln::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 128;  // 4 warps for every kernel here
constexpr int kWarps = kThreads / 32;

// ------------------------------------------------------------------------------------------------
// Small device helpers.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; zero-fills the destination when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// 2^x on the SFU, subnormal results flushed to zero (weights that small do not matter); 2^-inf = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}


// Pairs of elements as float2 (generic kernel).
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// ------------------------------------------------------------------------------------------------
// The paged view (kernels/paged_kv.h) as the kernels take it: a kernel argument by value.
//
// Key j of request b is pool row paged_kv_slot(indices, indptr[b], size, j)
//   = indices[indptr[b] + j / size] * size + j % size.
// The division by the page size is a multiply-high, an add and a shift by constants computed on the
// host (PageDivisor below), exact for every page size >= 1 and every 0 <= j < 2^31; for a power of
// two it is j >> log2(size). Pool rows fit in int32 (the host checks that the pool has < 2^31 rows),
// so rows are int32 and become 64-bit element offsets when multiplied by the row stride Hkv * D.
struct PagedArgs {
  const int* indptr;   // page_indptr [B + 1]
  const int* indices;  // page_indices
  const int* last;     // last_page_len [B]
  int size;            // page_size >= 1
  uint32_t magic;      // j / size == (umulhi(j, magic) + j) >> shift
  int shift;
};

// Request b's keys: its page ids are indices[first ..] in position order (`indices` stays the
// kernel argument, so it costs no register).
struct PagedKeys {
  const int* indices;
  int first;  // indptr[b]
  int size;
  uint32_t magic;
  int shift;

  // Page (within the request) of key j.
  __device__ __forceinline__ int page(int j) const {
    const uint32_t u = static_cast<uint32_t>(j);
    return static_cast<int>((__umulhi(u, magic) + u) >> shift);
  }
  // Pool row of key j < kv_len (reads the page table): paged_kv_slot(...) of kernels/paged_kv.h.
  __device__ __forceinline__ int row(int j) const {
    const int p = page(j);
    return page_id(p) * size + (j - p * size);
  }
  // Pool page holding the request's page p.
  __device__ __forceinline__ int page_id(int p) const { return __ldg(indices + first + p); }
};

// Element offset of pool row `row` (0 <= row < 2^31) in rows of `stride` elements: one 32 x 32 ->
// 64-bit multiply.
__device__ __forceinline__ int64_t row_offset(int row, int stride) {
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(row)) * static_cast<uint32_t>(stride));
}

// A request's keys; reads indptr[b] only (a request with no pages has kv_len 0 and its page table
// is never read).
__device__ __forceinline__ PagedKeys request_keys(const PagedArgs& kv, int b) {
  return PagedKeys{kv.indices, kv.indptr[b], kv.size, kv.magic, kv.shift};
}
__device__ __forceinline__ int request_kv_len(const PagedArgs& kv, int b) {
  return paged_kv_len(kv.indptr, kv.last, kv.size, b);
}

// ------------------------------------------------------------------------------------------------
// 1. Decode / short-query split-KV kernel.
//
// Fragment layouts (g = lane / 4, t = lane % 4; mma m16n8k16 A row-major, B "col", C 16x8):
//  QK: S[16 rows x 16 keys] as two n8 tiles; n tile nt holds keys key0 + nt*8 + n. Thread (g,t)
//      loads K rows key0+g and key0+8+g, the 16-byte chunks at dims c*32 + t*8 (c < D/32). K-step
//      j (j < D/16) uses words (j%2)*2, (j%2)*2+1 of chunk j/2 as b0, b1; Q's A fragment uses the
//      same dims (rows g, g+8), so the head dimension is permuted identically on both sides.
//  PV: P is S's C fragment reused as the A fragment (k = key). Output n tile i, column n maps to
//      dim (i/8)*64 + n*8 + i%8, so thread (g,t) needs V at dims vc*64 + g*8 + [0,8) (one 16-byte
//      chunk vc < D/64) of keys key0 + 2t, 2t+1, 2t+8, 2t+9; b0/b1 pair two keys per dim via
//      byte_perm. Thread (g,t) then owns out rows g, g+8 at dims (i/8)*64 + (2t+e)*8 + i%8.
template <int D>
struct DecodeFrag {
  uint4 k[2][D / 32];  // K rows key0+g, key0+8+g
  uint4 v[4][D / 64];  // V rows key0+2t, +2t+1, +2t+8, +2t+9
};

constexpr int kDecodeMinKeysPerSplit = 64;

// Register budget: D=64 fits 3 blocks per SM (<= 170 registers), D=128 2 blocks (no spills).
template <int D>
constexpr int decode_min_blocks() {
  return D <= 64 ? 3 : 2;
}

template <typename T, int D, bool kPingPong>
__global__ void __launch_bounds__(kThreads, decode_min_blocks<D>())
    attn_decode_kernel(T* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_lse,
                       const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                       const int* __restrict__ q_indptr, PagedArgs kv, int Hq, int Hkv, int G, int max_q_len,
                       int num_splits, float sl) {
  constexpr int KC = D / 32;  // K chunks per row per thread
  constexpr int VC = D / 64;  // V chunks per row per thread
  constexpr int NT = D / 8;   // PV n tiles
  constexpr int KS = D / 16;  // QK k steps
  constexpr int kPad = 4;
  __shared__ __align__(16) float sm_acc[kWarps][16][D + kPad];
  __shared__ float sm_m[kWarps][16];
  __shared__ float sm_l[kWarps][16];

  const int split = blockIdx.x;
  const int kvh = blockIdx.y % Hkv;
  const int rt = blockIdx.y / Hkv;
  const int b = blockIdx.z;
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  const int rows = q_len * G;
  const int r0 = rt * 16;
  if (r0 >= rows) return;  // every block of a request without queries (padding) exits here
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);

  const int delta = kv_len - q_len;  // position of query i is delta + i
  const int i_max = min(q_len - 1, (r0 + 15) / G);
  const int n_keys = max(0, min(kv_len, delta + i_max + 1));
  // The key partition depends only on n_keys and min(num_splits, ceil(n_keys / 64)), so calls whose
  // bounds differ only in max_kv_len (eager vs. a graph captured for a larger context) split alike
  // and give bit-identical results.
  const int steps_total = (n_keys + 15) / 16;
  const int active_splits = min(num_splits, max(1, (n_keys + kDecodeMinKeysPerSplit - 1) / kDecodeMinKeysPerSplit));
  const int steps_per_split = (steps_total + active_splits - 1) / active_splits;
  const int key_begin = split * steps_per_split * 16;
  const int key_end = min(n_keys, key_begin + steps_per_split * 16);
  const int n_steps = key_end > key_begin ? (key_end - key_begin + 15) / 16 : 0;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int kv_stride = Hkv * D;  // elements per pool row (row * kv_stride: one widening multiply)

  // This thread's query rows (tile rows g and g+8), their key limits, and Q's A fragments.
  int lim[2];
  uint4 qv[2][KC];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int R = r0 + g + 8 * hf;
    const int i = R / G;
    const int hq = kvh * G + (R - i * G);
    const bool valid = R < rows;
    lim[hf] = valid ? min(key_end, delta + i + 1) : 0;
    const T* qrow = q + (static_cast<int64_t>(q_start + (valid ? i : 0)) * Hq + hq) * D + t * 8;
#pragma unroll
    for (int c = 0; c < KC; ++c) qv[hf][c] = valid ? ldg_stream(qrow + c * 32) : make_uint4(0, 0, 0, 0);
  }
  uint32_t qa[KS][4];
#pragma unroll
  for (int j = 0; j < KS; ++j) {
    const int c = j / 2, w = (j % 2) * 2;
    qa[j][0] = word(qv[0][c], w);
    qa[j][1] = word(qv[1][c], w);
    qa[j][2] = word(qv[0][c], w + 1);
    qa[j][3] = word(qv[1][c], w + 1);
  }

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  const T* kbase = k_cache + static_cast<int64_t>(kvh) * D;
  const T* vbase = v_cache + static_cast<int64_t>(kvh) * D;

  // Page id of the first key of this warp's next step, read one step ahead (steps are loaded in
  // the order warp, warp + 4, ...), so that the page-table latency hides behind a step of compute.
  int next_pid = 0;
  auto prefetch_page = [&](int step) {
    if (step < n_steps) next_pid = keys.page_id(keys.page(key_begin + step * 16));
  };
  prefetch_page(warp);

  // Keys key0 .. key0 + 15 of a step (key0 is a multiple of 16). When they lie in one page (always
  // when the page size is a multiple of 16) they are consecutive pool rows from that page's row of
  // key0; otherwise (small pages, or a step across a page boundary) each row is looked up, keys
  // past the step's range as the last key of the range (in bounds; nothing is loaded for them), so
  // that no lookup depends on a per-lane branch.
  auto load = [&](DecodeFrag<D>& f, int step) {
    const int key0 = key_begin + step * 16;
    const int p0 = keys.page(key0);
    const int in0 = key0 - p0 * keys.size;
    const int row0 = next_pid * keys.size + in0;
    prefetch_page(step + kWarps);
    int krow[2], vrow[4];  // pool rows of this thread's K rows (key0 + g + 8 hf) and V rows
    if (in0 + 16 <= keys.size) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) krow[hf] = row0 + g + 8 * hf;
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) vrow[kq] = row0 + 2 * t + (kq & 1) + (kq >> 1) * 8;
    } else {
      const int last = key_end - 1;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) krow[hf] = keys.row(min(key0 + g + 8 * hf, last));
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) vrow[kq] = keys.row(min(key0 + 2 * t + (kq & 1) + (kq >> 1) * 8, last));
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const bool ok = key0 + g + 8 * hf < key_end;
      const T* p = kbase + row_offset(krow[hf], kv_stride) + t * 8;
#pragma unroll
      for (int c = 0; c < KC; ++c) f.k[hf][c] = ok ? ldg_stream(p + c * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int kq = 0; kq < 4; ++kq) {
      const bool ok = key0 + 2 * t + (kq & 1) + (kq >> 1) * 8 < key_end;
      const T* p = vbase + row_offset(vrow[kq], kv_stride) + g * 8;
#pragma unroll
      for (int c = 0; c < VC; ++c) f.v[kq][c] = ok ? ldg_stream(p + c * 64) : make_uint4(0, 0, 0, 0);
    }
  };

  auto compute = [&](const DecodeFrag<D>& f, int step) {
    const int key0 = key_begin + step * 16;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int c = j / 2, w = (j % 2) * 2;
      Mma<T>::mma(s[0], qa[j], word(f.k[0][c], w), word(f.k[0][c], w + 1));
      Mma<T>::mma(s[1], qa[j], word(f.k[1][c], w), word(f.k[1][c], w + 1));
    }
    // Mask keys at or past each row's limit (causal position and end of this split).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * t + (e & 1);
        if (key >= lim[e >> 1]) s[nt][e] = -INFINITY;
      }
      // Online softmax (rows g: elements 0,1; row g+8: elements 2,3).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx * sl);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = fast_exp2(m[hf] - m_use);
      m[hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(s[nt][2 * hf + e], sl, -m_use));
          s[nt][2 * hf + e] = p;
          sum += p;
        }
      l[hf] = l[hf] * alpha + sum;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        acc[i][2 * hf] *= alpha;
        acc[i][2 * hf + 1] *= alpha;
      }
    }
    const uint32_t pa[4] = {Mma<T>::pack(s[0][0], s[0][1]), Mma<T>::pack(s[0][2], s[0][3]),
                            Mma<T>::pack(s[1][0], s[1][1]), Mma<T>::pack(s[1][2], s[1][3])};
    // bf16 keeps 8 bits of P; decode is bound by memory, not by the tensor cores, so P is carried
    // as hi + lo (the rounding error, rounded again) in two products: ~16 bits, at no visible cost.
    constexpr bool kSplitP = std::is_same_v<T, __nv_bfloat16>;
    uint32_t pl[4] = {0, 0, 0, 0};
    if constexpr (kSplitP) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float* src = &s[w >> 1][(w & 1) * 2];
        const float hi_first = __uint_as_float(pa[w] << 16), hi_second = __uint_as_float(pa[w] & 0xffff0000u);
        pl[w] = Mma<T>::pack(src[0] - hi_first, src[1] - hi_second);
      }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int vc = i / 8, wi = (i % 8) / 2;
      const uint32_t sel = (i & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(word(f.v[0][vc], wi), word(f.v[1][vc], wi), sel);
      const uint32_t b1 = __byte_perm(word(f.v[2][vc], wi), word(f.v[3][vc], wi), sel);
      Mma<T>::mma(acc[i], pa, b0, b1);
      if constexpr (kSplitP) Mma<T>::mma(acc[i], pl, b0, b1);
    }
  };

  if constexpr (kPingPong) {
    // Two register buffers: the loads of the next step are in flight while this one computes.
    DecodeFrag<D> fa, fb;
    int st = warp;
    if (st < n_steps) load(fa, st);
    while (st < n_steps) {
      const int st2 = st + kWarps;
      if (st2 < n_steps) load(fb, st2);
      compute(fa, st);
      if (st2 >= n_steps) break;
      const int st3 = st2 + kWarps;
      if (st3 < n_steps) load(fa, st3);
      compute(fb, st2);
      st = st3;
    }
  } else {
    for (int st = warp; st < n_steps; st += kWarps) {
      DecodeFrag<D> fa;
      load(fa, st);
      compute(fa, st);
    }
  }

  // Merge the four warps' states through shared memory.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1);
      const int dim = (i / 8) * 64 + (2 * t + (e & 1)) * 8 + (i % 8);
      sm_acc[warp][row][dim] = acc[i][e];
    }
  if (t == 0) {
    sm_m[warp][g] = m[0];
    sm_m[warp][g + 8] = m[1];
    sm_l[warp][g] = l[0];
    sm_l[warp][g + 8] = l[1];
  }
  __syncthreads();

  constexpr int kDimsPerThread = D / 8;  // 16 rows x 8 threads
  const int r = tid >> 3;
  const int d0 = (tid & 7) * kDimsPerThread;
  const int R = r0 + r;
  if (R >= rows) return;
  const int i = R / G;
  const int hq = kvh * G + (R - i * G);
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][r]);
  float wt[kWarps];
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = sm_m[w][r];
    wt[w] = mw == -INFINITY ? 0.0f : fast_exp2(mw - M);
    L += wt[w] * sm_l[w][r];
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float o[kDimsPerThread];
#pragma unroll
  for (int d = 0; d < kDimsPerThread; d += 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 a = *reinterpret_cast<const float4*>(&sm_acc[w][r][d0 + d]);
      sum.x += wt[w] * a.x;
      sum.y += wt[w] * a.y;
      sum.z += wt[w] * a.z;
      sum.w += wt[w] * a.w;
    }
    o[d] = sum.x * inv;
    o[d + 1] = sum.y * inv;
    o[d + 2] = sum.z * inv;
    o[d + 3] = sum.w * inv;
  }
  if (num_splits == 1) {
    T* dst = out + (static_cast<int64_t>(q_start + i) * Hq + hq) * D + d0;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 8) {
      uint4 v;
      v.x = Mma<T>::pack(o[d], o[d + 1]);
      v.y = Mma<T>::pack(o[d + 2], o[d + 3]);
      v.z = Mma<T>::pack(o[d + 4], o[d + 5]);
      v.w = Mma<T>::pack(o[d + 6], o[d + 7]);
      *reinterpret_cast<uint4*>(dst + d) = v;
    }
  } else {
    const int64_t idx = ((static_cast<int64_t>(b) * max_q_len + i) * Hq + hq) * num_splits + split;
    float* dst = part_o + idx * D + d0;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 4)
      *reinterpret_cast<float4*>(dst + d) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
    if ((tid & 7) == 0) part_lse[idx] = L > 0.0f ? M + log2f(L) : -INFINITY;
  }
}

constexpr int kDecodeMaxSplits = 256;

// Merges the splits of the decode kernel: one block per (request, query row, head); warp w sums
// splits w, w+4, ... (independent loads in flight), then the warps' sums are added.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_combine_kernel(T* __restrict__ out, const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        const int* __restrict__ q_indptr, int Hq, int max_q_len, int num_splits) {
  constexpr int PER = D / 32;  // dims per lane
  __shared__ float sm_w[kDecodeMaxSplits];
  __shared__ __align__(16) float sm_o[kWarps][D];
  __shared__ float sm_red[2][kWarps];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t p = blockIdx.x;  // (b * max_q_len + i) * Hq + h
  const int h = static_cast<int>(p % Hq);
  const int64_t bi = p / Hq;
  const int i = static_cast<int>(bi % max_q_len);
  const int b = static_cast<int>(bi / max_q_len);
  const int q_start = q_indptr[b];
  if (i >= q_indptr[b + 1] - q_start) return;  // uniform over the block
  const int64_t base = p * num_splits;

  float mx = -INFINITY;
  for (int s = tid; s < num_splits; s += kThreads) {
    const float v = part_lse[base + s];
    sm_w[s] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) sm_red[0][warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(sm_red[0][0], sm_red[0][1]), fmaxf(sm_red[0][2], sm_red[0][3]));
  float den = 0.0f;
  for (int s = tid; s < num_splits; s += kThreads) {
    const float v = sm_w[s];
    // Empty splits (lse = -inf) weigh 0; the largest weighs exactly 1, so a single active split
    // passes through unchanged (bit-identical to the one-split direct write).
    const float w = (v == -INFINITY) ? 0.0f : (v == mx ? 1.0f : exp2f(v - mx));
    sm_w[s] = w;
    den += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
  if (lane == 0) sm_red[1][warp] = den;
  __syncthreads();
  den = sm_red[1][0] + sm_red[1][1] + sm_red[1][2] + sm_red[1][3];

  float o[PER];
#pragma unroll
  for (int d = 0; d < PER; ++d) o[d] = 0.0f;
#pragma unroll(PER == 2 ? 8 : 4)
  for (int s = warp; s < num_splits; s += kWarps) {
    const float w = sm_w[s];  // empty splits hold zeros in part_o, so no branch is needed
    const float* src = part_o + (base + s) * D + lane * PER;
    if constexpr (PER == 2) {
      const float2 v = *reinterpret_cast<const float2*>(src);
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
    } else {
      const float4 v = *reinterpret_cast<const float4*>(src);
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
      o[2] = fmaf(w, v.z, o[2]);
      o[3] = fmaf(w, v.w, o[3]);
    }
  }
#pragma unroll
  for (int d = 0; d < PER; ++d) sm_o[warp][lane * PER + d] = o[d];
  __syncthreads();
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  T* dst = out + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
  for (int d = 2 * tid; d < D; d += 2 * kThreads) {
    const float a = sm_o[0][d] + sm_o[1][d] + sm_o[2][d] + sm_o[3][d];
    const float c = sm_o[0][d + 1] + sm_o[1][d + 1] + sm_o[2][d + 1] + sm_o[3][d + 1];
    store2(dst + d, a * inv, c * inv);
  }
}

// ------------------------------------------------------------------------------------------------
// 2. Prefill kernels (FlashAttention-2 style, tensor cores). Three variants are compiled; the
// host picks one per call (see launch_prefill_variant below and kernels/cuda/attention_internal.h).

// 2a. mma.sync kernel. NW warps, each owning MT 16-row M tiles (BM = NW * 16 * MT query rows per
// block), BN keys per K/V tile (double buffered). kQRegs: Q fragments are loaded into registers
// once (else re-read from shared memory every tile, which frees registers for BN = 128). kLazy:
// the accumulator rescale is skipped when no row of the warp changed its running max.
template <int D, int MT, int BN, int NW>
struct PrefillCfg {
  static constexpr int kThreads = NW * 32;
  static constexpr int kBM = NW * 16 * MT;  // query rows per block
  static constexpr int kChunks = D / 8;     // 16-byte chunks per row
  // Q + double-buffered K and V, + the two K/V tiles' pool rows (TileRows).
  static constexpr int kSmemBytes = (kBM * D + 4 * BN * D) * 2 + 2 * BN * 4;
};

// Pool rows of the prefill kernels' K/V tiles, in shared memory: rows[(tile & 1) * BN + r] is the
// row of key tile * BN + r of the request (meaningless past n_keys, where nothing is copied).
// Each key's page is looked up once, by thread tid < BN for key tile * BN + tid (not by each of the
// threads that copy a chunk of its row): fetch() reads the page id from the page table (global) at
// the top of the iteration that computes tile - 2, store() writes the row at its end, so the
// page-table latency hides behind a tile of compute; a barrier separates the store from the copies
// of iteration tile - 1 that read it. The two slots alternate: rows of tile t + 2 overwrite those
// of tile t, whose copies were issued an iteration earlier. The copies then cost one shared-memory
// load per row whatever the page size (pages of BN keys or more, contiguous caches included, could
// skip it, but the load costs about what the address arithmetic of consecutive rows would).
template <int BN>
struct TileRows {
  int* rows;    // [2][BN] in shared memory
  int pid = 0;  // page id of this thread's key in the fetched tile

  __device__ __forceinline__ void fetch(const PagedKeys& keys, int tile, int n_keys, int tid) {
    const int key = tile * BN + tid;
    pid = (tid < BN && key < n_keys) ? keys.page_id(keys.page(key)) : 0;
  }
  __device__ __forceinline__ void store(const PagedKeys& keys, int tile, int tid) const {
    if (tid < BN) {
      const int key = tile * BN + tid;
      rows[(tile & 1) * BN + tid] = pid * keys.size + (key - keys.page(key) * keys.size);
    }
  }
};

// Element offset of 16-byte chunk c of row r in a swizzled [rows][D] tile (conflict-free ldmatrix).
// For D = 64 this is exactly the hardware 128-byte swizzle (chunk ^= row % 8 within 1024-byte
// atoms), the layout of the wgmma tiles (wg_off below).
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

template <typename T, int D, int MT, int BN, int NW, bool kQRegs, bool kLazy>
__global__ void __launch_bounds__(NW * 32, (NW == 8 && D > 64) ? 1 : 2)
    attn_prefill_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                        const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv, int Hq,
                        int Hkv, int G, int num_qtiles, float sl) {
  using Cfg = PrefillCfg<D, MT, BN, NW>;
  constexpr int NT = Cfg::kThreads;
  constexpr int BM = Cfg::kBM;
  constexpr int NC = Cfg::kChunks;
  constexpr int KS = D / 16;  // k steps of QK
  constexpr int SN = BN / 8;  // n tiles of S
  constexpr int DN = D / 8;   // n tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;      // [2][BN][D]
  T* sV = sK + 2 * BN * D;  // [2][BN][D]
  static_assert(BN <= NT, "one thread per tile row in TileRows");
  TileRows<BN> tile_rows{reinterpret_cast<int*>(sV + 2 * BN * D)};

  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x);  // heaviest tiles first
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  const int row0 = qt * BM;
  if (row0 >= q_len) return;  // every block of a request without queries (padding) exits here
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);
  const int kvh = h / G;
  const int delta = kv_len - q_len;  // position of query i is delta + i
  const int row_end = min(q_len, row0 + BM);
  const int n_keys = max(0, min(kv_len, delta + row_end));
  const int n_tiles = (n_keys + BN - 1) / BN;
  const int first_masked = delta + row0 + 1;  // keys >= this are masked for some row of the block

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int64_t q_stride = static_cast<int64_t>(Hq) * D;
  const T* q_base = q + (static_cast<int64_t>(q_start) * Hq + h) * D;
  const T* k_base = k_cache + static_cast<int64_t>(kvh) * D;
  const T* v_base = v_cache + static_cast<int64_t>(kvh) * D;

  // Q tile.
  for (int idx = tid; idx < BM * NC; idx += NT) {
    const int r = idx / NC, c = idx % NC;
    const bool ok = row0 + r < q_len;
    const T* src = q_base + (ok ? static_cast<int64_t>(row0 + r) * q_stride + c * 8 : 0);
    cp_async16(smem_u32(sQ + swz<D>(r, c)), src, ok);
  }
  // K/V tile copies: thread tid copies 16-byte chunk c = tid % NC of tile rows tr0 + i * RS (RS a
  // multiple of 8, so the swizzle term and the chunk are the same for every i), from the pool rows
  // in tile_rows: per copied row one shared-memory load and one widening multiply-add per address.
  constexpr int RS = NT / NC;
  static_assert(NT % NC == 0 && RS % 8 == 0 && BN % RS == 0, "K/V load mapping");
  const int tr0 = tid / NC, tc = tid % NC;
  const int kv_row = Hkv * D;                // elements per pool row
  const T* k_chunk = k_base + tc * 8;        // this thread's chunk of pool row 0
  const T* v_chunk = v_base + tc * 8;
  auto load_kv = [&](int tile, int buf) {
    const uint32_t dk = smem_u32(sK + buf * BN * D + swz<D>(tr0, tc));
    const uint32_t dv = smem_u32(sV + buf * BN * D + swz<D>(tr0, tc));
    constexpr uint32_t kRowStep = RS * D * sizeof(T);  // bytes between a thread's rows in the tile
    const int key0 = tile * BN;
    const int* rows = tile_rows.rows + (tile & 1) * BN + tr0;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = key0 + tr0 + i * RS < n_keys;
      const int row = ok ? rows[i * RS] : 0;
      cp_async16(dk + i * kRowStep, k_chunk + row_offset(row, kv_row), ok);
      cp_async16(dv + i * kRowStep, v_chunk + row_offset(row, kv_row), ok);
    }
  };
  // Pool rows of the first two tiles, then the first K/V tile.
  for (int tile = 0; tile < 2 && tile < n_tiles; ++tile) {
    tile_rows.fetch(keys, tile, n_keys, tid);
    tile_rows.store(keys, tile, tid);
  }
  __syncthreads();
  if (n_tiles > 0) load_kv(0, 0);
  cp_async_commit();

  float acc[MT][DN][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  uint32_t qf[kQRegs ? MT : 1][kQRegs ? KS : 1][4];

  const int warp_row0 = warp * 16 * MT;  // first tile row of this warp
  auto q_frag = [&](uint32_t (&r4)[4], int mt, int kk) {
    const int r = warp_row0 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int c = 2 * kk + (lane >> 4);
    ldmatrix_x4(r4, smem_u32(sQ + swz<D>(r, c)));
  };
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) load_kv(tile + 1, (tile + 1) & 1);
    if (tile + 2 < n_tiles) tile_rows.fetch(keys, tile + 2, n_keys, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kQRegs) {
      if (tile == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) q_frag(qf[mt][kk], mt, kk);
      }
    }
    const T* cK = sK + (tile & 1) * BN * D;
    const T* cV = sV + (tile & 1) * BN * D;

    // S = Q K^T
    float s[MT][SN][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < SN; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t qs[kQRegs ? 1 : MT][4];
      if constexpr (!kQRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) q_frag(qs[mt], mt, kk);
      }
#pragma unroll
      for (int np = 0; np < SN / 2; ++np) {
        uint32_t bk[4];
        const int r = np * 16 + (lane & 7) + (lane >> 4) * 8;
        const int c = 2 * kk + ((lane >> 3) & 1);
        ldmatrix_x4(bk, smem_u32(cK + swz<D>(r, c)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&qa)[4] = kQRegs ? qf[kQRegs ? mt : 0][kQRegs ? kk : 0] : qs[kQRegs ? 0 : mt];
          Mma<T>::mma(s[mt][2 * np], qa, bk[0], bk[1]);
          Mma<T>::mma(s[mt][2 * np + 1], qa, bk[2], bk[3]);
        }
      }
    }

    // Mask tiles that cross the diagonal or the end of the keys.
    const int key0 = tile * BN;
    if (key0 + BN > first_masked || key0 + BN > kv_len) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + warp_row0 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
            const int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
            if (key > delta + row || key >= kv_len) s[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax.
    float alpha[MT][2];
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
        alpha[mt][hf] = fast_exp2(m[mt][hf] - m_use);
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
        l[mt][hf] = l[mt][hf] * alpha[mt][hf] + sum;
      }
    bool rescale = true;
    if constexpr (kLazy) {
      bool changed = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) changed |= (alpha[mt][0] != 1.0f) | (alpha[mt][1] != 1.0f);
      rescale = __any_sync(0xffffffffu, changed);
    }
    if (rescale) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dn = 0; dn < DN; ++dn) {
          acc[mt][dn][0] *= alpha[mt][0];
          acc[mt][dn][1] *= alpha[mt][0];
          acc[mt][dn][2] *= alpha[mt][1];
          acc[mt][dn][3] *= alpha[mt][1];
        }
    }

    // O += P V (P stays in registers: S's C fragments are the A fragments of the PV product).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int c = 2 * dp + (lane >> 4);
        ldmatrix_x4_trans(bv, smem_u32(cV + swz<D>(r, c)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::mma(acc[mt][2 * dp], pa[mt], bv[0], bv[1]);
          Mma<T>::mma(acc[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
    if (tile + 2 < n_tiles) tile_rows.store(keys, tile + 2, tid);
    __syncthreads();  // everyone is done with this buffer before it is refilled (and sees the rows)
  }
  cp_async_wait<0>();

  // Epilogue: normalise and store (rows past q_len are not written).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lsum = l[mt][hf];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = row0 + warp_row0 + mt * 16 + (lane >> 2) + hf * 8;
      if (row >= q_len) continue;
      T* dst = out + (static_cast<int64_t>(q_start + row) * Hq + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn)
        *reinterpret_cast<uint32_t*>(dst + dn * 8) =
            Mma<T>::pack(acc[mt][dn][2 * hf] * inv, acc[mt][dn][2 * hf + 1] * inv);
    }
}

// Hopper wgmma kernels (bf16/f16, D = 64 or 128; sm_90a). A warpgroup (4 warps) owns 64 query
// rows. Q, K and V tiles are stored as D / 64 column blocks of [rows][64 dims] with 128-byte rows
// and the hardware 128-byte swizzle (16-byte chunk ^= row % 8 inside 1024-byte atoms of 8 rows;
// for D = 64 exactly the swz<64> layout above): the canonical wgmma SW128 layout, K-major for Q
// (A) and K (B) of S = Q K^T, MN-major for V (B of O = P V, "transposed" B). Per 16-wide k step
// the K-major descriptors advance 32 bytes inside the 128-byte rows (then to the next column
// block); the MN-major V descriptor advances 16 key rows (2048 bytes) and steps between the
// 64-dim column blocks by its leading byte offset. S and O live in wgmma accumulator registers
// (per warp: the mma.sync C layout, n8 tile j in registers 4j..4j+3); P is packed from S into the
// register A operand of the PV wgmma.
template <typename T>
struct Wgmma;

// (generated wrappers: one asm statement per wgmma shape)
template <>
struct Wgmma<__nv_bfloat16> {
  // D[64x64] (+)= A[64x16] (smem, K-major) * B[16x64] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x128] (+)= A[64x16] (smem, K-major) * B[16x128] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x64] += A[64x16] (registers, per warp the mma.sync m16n8k16 A layout) * B[16x64] (smem, MN-major).
  static __device__ __forceinline__ void rs64_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
  // D[64x128] += A[64x16] (registers) * B[16x128] (smem, MN-major).
  static __device__ __forceinline__ void rs128_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
};

template <>
struct Wgmma<__half> {
  // D[64x64] (+)= A[64x16] (smem, K-major) * B[16x64] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x128] (+)= A[64x16] (smem, K-major) * B[16x128] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x64] += A[64x16] (registers, per warp the mma.sync m16n8k16 A layout) * B[16x64] (smem, MN-major).
  static __device__ __forceinline__ void rs64_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
  // D[64x128] += A[64x16] (registers) * B[16x128] (smem, MN-major).
  static __device__ __forceinline__ void rs128_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
};

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63), base offset 0
// (every tile starts on a 1024-byte boundary). Offsets in bytes.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins accumulator registers in program order relative to the (volatile) wgmma wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Masked online-softmax step, in place, on a wgmma S accumulator (64 x BN; this thread: rows
// wrow0 and wrow0 + 8, n8 tile j in s[4j..4j+3]): s becomes P (f32, relative to the new running
// max), m and l are updated and alpha gets the rescale factors of the two rows for O.
template <int BN>
__device__ __forceinline__ void wg_softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           int key0, int first_masked, int wrow0, int delta, int kv_len, int lane,
                                           float sl) {
  if (key0 + BN > first_masked || key0 + BN > kv_len) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wrow0 + (e >> 1) * 8;
        const int key = key0 + j * 8 + (lane & 3) * 2 + (e & 1);
        if (key > delta + row || key >= kv_len) s[4 * j + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hf], mx * sl);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[hf] = fast_exp2(m[hf] - m_use);
    m[hf] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[4 * j + 2 * hf + e], sl, -m_use));
        s[4 * j + 2 * hf + e] = p;
        sum += p;
      }
    l[hf] = l[hf] * alpha[hf] + sum;
  }
}

// P (f32, the softmaxed S accumulator) packed as the register A operands of the BN / 16 PV k steps.
template <typename T, int BN>
__device__ __forceinline__ void wg_pack_p(const float (&s)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O *= alpha (per row), skipped when no row of the warp changed its max (then alpha == 1 exactly).
template <int N>
__device__ __forceinline__ void wg_rescale(float (&o)[N], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, (alpha[0] != 1.0f) | (alpha[1] != 1.0f))) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
}

// Element offset of 16-byte chunk c of row r in a wgmma tile of ROWS rows x D dims: D / 64
// column blocks of [ROWS][64] (128-byte rows, 128-byte swizzle inside 1024-byte atoms of 8 rows).
// For D = 64 this equals swz<64>.
template <int ROWS>
__device__ __forceinline__ int wg_off(int r, int c) {
  return (c >> 3) * (ROWS * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// Shared state and helpers of the wgmma kernels: block geometry, cp.async tile loads, the S and
// PV wgmma issue, and the epilogue.
template <typename T, int D, int BN, int NWG>
struct WgTile {
  static constexpr int NC = D / 8;  // 16-byte chunks per row
  static constexpr int NT = NWG * 128;
  static constexpr int BM = NWG * 64;
  static constexpr int SD = BN / 2;  // S accumulators per thread
  static constexpr int OD = D / 2;   // O accumulators per thread
  static constexpr int kTileElems = BN * D;
  // Q + two K and two V stages + the two K/V tiles' pool rows (TileRows, after the tiles so that
  // these stay 1024-byte aligned), + slack for the 1024-byte alignment.
  static constexpr int kSmemBytes = (BM * D + 4 * BN * D) * 2 + 2 * BN * 4 + 1024;

  T* sQ;
  T* sK;  // [2][BN x D tile]
  T* sV;  // [2][BN x D tile]
  const int* rows;  // [2][BN] pool rows of the K/V tiles (TileRows)
  const T* q_base;
  const T* k_base;  // kv head kvh of pool row 0, at this thread's 16-byte chunk tid % NC (load_kv)
  const T* v_base;
  PagedKeys keys;
  int64_t q_stride;
  int kv_stride;  // Hkv * D
  int row0, q_len, n_keys, tid;

  // cp.async tile loads. Thread tid always copies 16-byte chunk c = tid % NC of rows
  // tid / NC + i * RS (RS = NT / NC, a multiple of 8, so the swizzle term row % 8 and the chunk's
  // column block are the same for all i): fully unrolled loops whose per-row work is one
  // predicate, one address add and the copy. (A `for (idx = tid; idx < rows * NC; idx += NT)`
  // loop with the index math per row, run separately for K and V, cost these issue-bound
  // kernels ~200 integer instructions per key tile, ~20% of the time at D = 64.)
  static constexpr int RS = NT / NC;
  static_assert(RS % 8 == 0 && BN % RS == 0 && BM % RS == 0, "load mapping");

  __device__ __forceinline__ void load_q() const {
    const int r0 = tid / NC, c = tid % NC;
    const uint32_t d0 = smem_u32(sQ + wg_off<BM>(r0, c));
    const T* src = q_base + static_cast<int64_t>(row0 + r0) * q_stride + c * 8;
#pragma unroll
    for (int i = 0; i < BM / RS; ++i) {
      const bool ok = row0 + r0 + i * RS < q_len;
      cp_async16(d0 + i * RS * 128, ok ? src + i * RS * q_stride : q_base, ok);
    }
  }
  // K and V tile `tile` into stage buf (rows past n_keys zero-filled), from the pool rows in
  // `rows`: per copied row one shared-memory load and one widening multiply-add per address
  // (k_base and v_base already include this thread's chunk).
  __device__ __forceinline__ void load_kv(int tile, int buf) const {
    const int r0 = tid / NC;
    const uint32_t off0 = static_cast<uint32_t>(wg_off<BN>(r0, tid % NC) * sizeof(T));  // bytes
    const uint32_t dk = smem_u32(sK + buf * kTileElems) + off0;
    const uint32_t dv = smem_u32(sV + buf * kTileElems) + off0;
    const int key0 = tile * BN;
    const int* tr = rows + (tile & 1) * BN + r0;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = key0 + r0 + i * RS < n_keys;
      const int row = ok ? tr[i * RS] : 0;
      cp_async16(dk + i * RS * 128, k_base + row_offset(row, kv_stride), ok);
      cp_async16(dv + i * RS * 128, v_base + row_offset(row, kv_stride), ok);
    }
  }

  // S = Q_wg K^T (D / 16 k steps; K-major descriptors advance 32 bytes per step inside a 64-dim
  // column block, then jump to the next block).
  __device__ __forceinline__ void issue_s(float (&s)[SD], uint32_t q_addr, int buf) const {
    const uint32_t k_addr = smem_u32(sK + buf * kTileElems);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da = wgmma_desc(q_addr + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024);
      const uint64_t db = wgmma_desc(k_addr + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
      if constexpr (BN == 128)
        Wgmma<T>::ss128(s, da, db, kk);
      else
        Wgmma<T>::ss64(s, da, db, kk);
    }
  }
  // O += P V (BN / 16 k steps of 16 keys; V MN-major: 16 key rows = 2048 bytes per step, the
  // 64-dim column blocks BN * 128 bytes apart (leading byte offset), 8-key atoms 1024 bytes apart).
  __device__ __forceinline__ void issue_pv(float (&o)[OD], const uint32_t (&pa)[BN / 16][4], int buf) const {
    const uint32_t v_addr = smem_u32(sV + buf * kTileElems);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t dv = wgmma_desc(v_addr + kk * 16 * 128, BN * 128, 1024);
      if constexpr (D == 128)
        Wgmma<T>::rs128_mn(o, pa[kk], dv);
      else
        Wgmma<T>::rs64_mn(o, pa[kk], dv);
    }
  }
};

template <typename T, int D>
__device__ __forceinline__ void wg_store(T* __restrict__ out, const float (&o)[D / 2], const float (&l)[2], int wrow0,
                                         int q_start, int q_len, int Hq, int h, int lane) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lsum = l[hf];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int row = wrow0 + hf * 8;
    if (row >= q_len) continue;
    T* dst = out + (static_cast<int64_t>(q_start + row) * Hq + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8) = Mma<T>::pack(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
  }
}

// Common prologue of the wgmma kernels: block geometry from q_indptr and the paged view (blocks
// past the request's queries return).
#define KILN_WG_SETUP(Tile)                                                                                    \
  extern __shared__ unsigned char smem_wg[];                                                                  \
  unsigned char* smem_base = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);                       \
  const int b = blockIdx.z;                                                                                   \
  const int h = blockIdx.y;                                                                                   \
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x); /* heaviest tiles first */                    \
  const int q_start = q_indptr[b];                                                                            \
  const int q_len = q_indptr[b + 1] - q_start;                                                                \
  const int row0 = qt * Tile::BM;                                                                             \
  if (row0 >= q_len) return; /* every block of a request without queries (padding) exits here */              \
  const int kv_len = request_kv_len(kv, b);                                                                   \
  const int kvh = h / G;                                                                                      \
  const int delta = kv_len - q_len;                                                                           \
  const int row_end = min(q_len, row0 + Tile::BM);                                                            \
  const int n_keys = max(0, min(kv_len, delta + row_end));                                                    \
  const int n_tiles = (n_keys + BN - 1) / BN;                                                                 \
  const int first_masked = delta + row0 + 1;                                                                  \
  const int tid = threadIdx.x;                                                                                \
  const int wg = tid >> 7;                                                                                    \
  const int warp = (tid >> 5) & 3;                                                                            \
  const int lane = tid & 31;                                                                                  \
  Tile t_;                                                                                                    \
  t_.sQ = reinterpret_cast<T*>(smem_base);                                                                    \
  t_.sK = t_.sQ + Tile::BM * D;                                                                               \
  t_.sV = t_.sK + 2 * Tile::kTileElems;                                                                       \
  TileRows<BN> tile_rows{reinterpret_cast<int*>(t_.sV + 2 * Tile::kTileElems)};                               \
  t_.rows = tile_rows.rows;                                                                                   \
  t_.q_stride = static_cast<int64_t>(Hq) * D;                                                                 \
  t_.kv_stride = Hkv * D;                                                                                     \
  t_.q_base = q + (static_cast<int64_t>(q_start) * Hq + h) * D;                                               \
  t_.k_base = k_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.v_base = v_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.keys = request_keys(kv, b);                                                                              \
  t_.row0 = row0;                                                                                             \
  t_.q_len = q_len;                                                                                           \
  t_.n_keys = n_keys;                                                                                         \
  t_.tid = tid;                                                                                               \
  const int wrow0 = row0 + wg * 64 + warp * 16 + (lane >> 2); /* this thread's rows: wrow0, wrow0 + 8 */      \
  const uint32_t q_addr = smem_u32(t_.sQ) + wg * 64 * 128; /* this warpgroup's 64 rows (per column block) */

// 2b. Plain wgmma kernel (bf16/f16, D = 64 or 128). NWG warpgroups of 4 warps, each owning 64
// query rows (BM = 64 * NWG), BN keys per K/V tile, K/V double buffered (shared by the
// warpgroups). Per key tile: wait for the tile's cp.async group, fence.proxy.async (cp.async
// writes are generic-proxy, wgmma reads are async-proxy), barrier, prefetch the next tile into
// the other stage (its readers finished: every warpgroup waits for its wgmmas before the
// barrier) and read the page ids of tile + 2 (TileRows), S wgmma -> wait -> masked online
// softmax -> PV wgmma -> wait, then store tile + 2's pool rows. The tensor cores overlap the
// softmax only across the resident blocks of an SM.
template <typename T, int D, int BN, int NWG, int kMinBlocks>
__global__ void __launch_bounds__(NWG * 128, kMinBlocks)
    attn_prefill_wgmma_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv,
                              int Hq, int Hkv, int G, int num_qtiles, float sl) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = WgTile<T, D, BN, NWG>;
  KILN_WG_SETUP(Tile)
  static_assert(BN <= Tile::NT, "one thread per tile row in TileRows");
  t_.load_q();
  // Pool rows of the first two tiles, then the first K/V tile.
  for (int tile = 0; tile < 2 && tile < n_tiles; ++tile) {
    tile_rows.fetch(t_.keys, tile, n_keys, tid);
    tile_rows.store(t_.keys, tile, tid);
  }
  __syncthreads();
  if (n_tiles > 0) t_.load_kv(0, 0);
  cp_async_commit();

  float o[Tile::OD], s[Tile::SD];
#pragma unroll
  for (int i = 0; i < Tile::OD; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::SD; ++i) s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (tile + 1 < n_tiles) t_.load_kv(tile + 1, (tile + 1) & 1);
    if (tile + 2 < n_tiles) tile_rows.fetch(t_.keys, tile + 2, n_keys, tid);
    cp_async_commit();

    wgmma_fence();
    t_.issue_s(s, q_addr, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    float alpha[2];
    uint32_t pa[BN / 16][4];
    wg_softmax<BN>(s, m, l, alpha, tile * BN, first_masked, wrow0, delta, kv_len, lane, sl);
    wg_pack_p<T, BN>(s, pa);
    wg_rescale(o, alpha);

    wgmma_fence();
    t_.issue_pv(o, pa, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    // Rows of tile + 2 into the slot of this tile's (already issued) copies; the barrier at the
    // top of the next iteration publishes them before load_kv(tile + 2) reads them.
    if (tile + 2 < n_tiles) tile_rows.store(t_.keys, tile + 2, tid);
  }
  cp_async_wait<0>();
  wg_store<T, D>(out, o, l, wrow0, q_start, q_len, Hq, h, lane);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

#undef KILN_WG_SETUP

// ------------------------------------------------------------------------------------------------
// 3. Generic kernel: one warp per (request, query row, head); any even D <= 256.

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_generic_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                        const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv, int B,
                        int Hq, int Hkv, int G, int D, int max_q_len, float sl) {
  constexpr int kMaxPairs = 4;  // 4 pairs x 32 lanes = 256 dims
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * max_q_len * Hq) return;
  const int h = static_cast<int>(p % Hq);
  const int64_t bi = p / Hq;
  const int i = static_cast<int>(bi % max_q_len);
  const int b = static_cast<int>(bi / max_q_len);
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  if (i >= q_len) return;  // also every warp of a request without queries (padding)
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);
  const int n = max(0, min(kv_len, kv_len - q_len + i + 1));
  const int kvh = h / G;
  const int pairs = D / 2;

  const T* qrow = q + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
  float2 qv[kMaxPairs], acc[kMaxPairs];
#pragma unroll
  for (int k = 0; k < kMaxPairs; ++k) {
    const int pi = lane + 32 * k;
    qv[k] = pi < pairs ? load2(qrow + 2 * pi) : make_float2(0.f, 0.f);
    acc[k] = make_float2(0.f, 0.f);
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t kv_stride = static_cast<int64_t>(Hkv) * D;
  const T* kbase = k_cache + static_cast<int64_t>(kvh) * D;
  const T* vbase = v_cache + static_cast<int64_t>(kvh) * D;
  // One key: online-softmax update with pool row `row`.
  auto attend = [&](int64_t row) {
    const T* krow = kbase + row * kv_stride;
    const T* vrow = vbase + row * kv_stride;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int pi = lane + 32 * k;
      if (pi < pairs) {
        const float2 kk = load2(krow + 2 * pi);
        dot = fmaf(qv[k].x, kk.x, fmaf(qv[k].y, kk.y, dot));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * sl;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new);
    const float pj = exp2f(s - m_new);
    l = l * alpha + pj;
    m = m_new;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int pi = lane + 32 * k;
      if (pi < pairs) {
        const float2 vv = load2(vrow + 2 * pi);
        acc[k].x = fmaf(pj, vv.x, acc[k].x * alpha);
        acc[k].y = fmaf(pj, vv.y, acc[k].y * alpha);
      }
    }
  };
  // Keys 0 .. n - 1 page by page: page p holds keys p * size .. in consecutive pool rows from
  // pages[p] * size (one page-table read per page, for every page size).
  const int n_pages = n > 0 ? keys.page(n - 1) + 1 : 0;
  for (int p = 0; p < n_pages; ++p) {
    const int64_t page_row = static_cast<int64_t>(keys.page_id(p)) * keys.size;
    const int in_page = min(keys.size, n - p * keys.size);
    for (int jj = 0; jj < in_page; ++jj) attend(page_row + jj);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = out + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
#pragma unroll
  for (int k = 0; k < kMaxPairs; ++k) {
    const int pi = lane + 32 * k;
    if (pi < pairs) store2(orow + 2 * pi, acc[k].x * inv, acc[k].y * inv);
  }
}

// ------------------------------------------------------------------------------------------------
// Host side.

// Division by the page size for 0 <= j < 2^31 (PagedArgs): with l = ceil(log2(size)) and
// magic = floor(2^32 * (2^l - size) / size) + 1 (< 2^32), j / size == (umulhi(j, magic) + j) >> l
// (division by an invariant integer, Granlund & Montgomery 1994; for j < 2^31 the sum fits in 32
// bits). A power of two has magic 1, and umulhi(j, 1) = 0: a plain shift by log2(size).
struct PageDivisor {
  uint32_t magic;
  int shift;
};

PageDivisor page_divisor(int32_t size) {
  KILN_ASSERT(size >= 1);
  int l = 0;
  while ((int64_t{1} << l) < size) ++l;
  const uint64_t num = (uint64_t{1} << 32) * ((uint64_t{1} << l) - static_cast<uint64_t>(size));  // < 2^63
  const uint64_t magic = num / static_cast<uint64_t>(size) + 1;
  KILN_ASSERT(magic <= 0xffffffffull);
  return PageDivisor{static_cast<uint32_t>(magic), l};
}

// Per-backend state (CudaBackend::attention_state()), created on the first call on that backend:
// facts of its device and what was done to the kernels there. Kernel attributes and occupancy are
// per device, so none of this lives in function-local statics (which would tie it to whichever
// GPU ran first). attention_train.cu shares it (kernels/cuda/attention_internal.h).
struct AttentionState {
  int device = 0;
  bool has_wgmma = false;                    // sm_90: the wgmma kernels are built for sm_90a only
  int env_prefill_variant = -1;              // KILN_ATTN_PREFILL_VARIANT, -1 if unset or invalid
  std::map<const void*, int> smem_limit;     // kernel -> dynamic shared-memory limit set on the device
  std::map<const void*, int> blocks_per_sm;  // decode kernel -> resident blocks per SM
};

// The environment's prefill variant, -1 if none (read when a backend's state is created).
int read_env_prefill_variant() {
  const char* e = std::getenv("KILN_ATTN_PREFILL_VARIANT");
  if (e == nullptr || *e == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(e, &end, 10);
  if (*end != '\0' || n < 0 || n >= kPrefillVariantCount) {
    std::fprintf(stderr, "kiln: ignoring KILN_ATTN_PREFILL_VARIANT=%s (want 0..%d)\n", e, kPrefillVariantCount - 1);
    return -1;
  }
  return static_cast<int>(n);
}

AttentionState& state_of(CudaBackend& be) {
  std::shared_ptr<void>& slot = be.attention_state();
  if (!slot) {
    auto* st = new AttentionState;
    st->device = be.device().index;
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device));
    st->has_wgmma = major == 9 && minor == 0;
    st->env_prefill_variant = read_env_prefill_variant();
    slot = std::shared_ptr<void>(st, [](void* p) { delete static_cast<AttentionState*>(p); });
  }
  return *static_cast<AttentionState*>(slot.get());
}

// Runs f with `device` current (cudaFuncSetAttribute and the occupancy query act on the current
// device), then restores the previous one.
template <typename F>
void with_device(int device, F&& f) {
  int cur = 0;
  CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) CUDA_CHECK(cudaSetDevice(device));
  f();
  if (cur != device) CUDA_CHECK(cudaSetDevice(cur));
}

template <typename Kernel>
const void* kernel_key(Kernel* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

// Resident blocks per SM of a decode kernel on the backend's device (queried once per backend).
int decode_blocks_per_sm(CudaBackend& be, const void* kernel) {
  AttentionState& st = state_of(be);
  auto it = st.blocks_per_sm.find(kernel);
  if (it != st.blocks_per_sm.end()) return it->second;
  int n = 0;
  with_device(st.device, [&] { CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0)); });
  n = std::max(n, 1);
  st.blocks_per_sm.emplace(kernel, n);
  return n;
}

struct Args {
  void* out;
  const void* q;
  const void* k;
  const void* v;
  const int* q_indptr;
  PagedArgs kv;
  int B, Hq, Hkv, G, D, max_q_len, max_kv_len;
  float sl;  // scale * log2(e)
};

constexpr int kDecodeMaxRowTiles = 4;  // decode path while max_q_len * G <= 64
// Splits so that the decode grid fills whole waves of resident blocks, within two waves: from
// floor(W / base) (at least 1) up to 2W / base, the count whose last wave is fullest (fewest splits
// on ties). B=32 (base 128, W 396): 3 splits, one full wave, where ceil(W / base) = 4 made 1.3
// waves; B=64: 3 (1.94 waves). Grids of two waves and more keep one split: the combine pass costs
// more there than the last wave's idle slots (measured: three splits at B=256 took 10% longer).
// Without the length cap this is the most any max_kv_len can ask for (used to size the scratch).
int decode_max_splits(int base_blocks, int sm_count, int blocks_per_sm) {
  const int target = blocks_per_sm * std::max(sm_count, 1);
  const int lo = std::clamp(target / base_blocks, 1, kDecodeMaxSplits);
  const int hi = std::clamp(2 * target / base_blocks, lo, kDecodeMaxSplits);
  int best = lo;
  double best_eff = 0.0;
  for (int s = lo; s <= hi; ++s) {
    const double waves = static_cast<double>(base_blocks) * s / target;
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 0.02) best = s, best_eff = eff;
  }
  return best;
}

int decode_num_splits(int max_splits, int max_kv_len) {
  const int by_len = std::max(1, (max_kv_len + kDecodeMinKeysPerSplit - 1) / kDecodeMinKeysPerSplit);
  return std::clamp(by_len, 1, max_splits);
}

template <typename T, int D>
void launch_decode(CudaBackend& be, const Args& a) {
  cudaStream_t stream = be.stream();
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const int base_blocks = a.B * a.Hkv * row_tiles;
  constexpr bool kPingPong = D <= 64;
  auto kernel = attn_decode_kernel<T, D, kPingPong>;
  const int blocks_per_sm = decode_blocks_per_sm(be, kernel_key(kernel));
  const int max_splits = decode_max_splits(base_blocks, be.multiprocessor_count(), blocks_per_sm);
  const int splits = decode_num_splits(max_splits, a.max_kv_len);
  float* part_o = nullptr;
  float* part_lse = nullptr;
  if (splits > 1) {
    // Sized for max_splits, not splits: the scratch request does not depend on max_kv_len, so
    // graphs captured for different context buckets never make the scratch grow (and move).
    const int64_t n_part = static_cast<int64_t>(a.B) * a.max_q_len * a.Hq * max_splits;
    const int64_t bytes = n_part * D * 4 + n_part * 4;
    char* scratch = static_cast<char*>(be.scratch(bytes));
    part_o = reinterpret_cast<float*>(scratch);
    part_lse = reinterpret_cast<float*>(scratch + n_part * D * 4);
  }
  dim3 grid(splits, a.Hkv * row_tiles, a.B);
  kernel<<<grid, kThreads, 0, stream>>>(static_cast<T*>(a.out), part_o, part_lse, static_cast<const T*>(a.q),
                                        static_cast<const T*>(a.k), static_cast<const T*>(a.v), a.q_indptr, a.kv, a.Hq,
                                        a.Hkv, a.G, a.max_q_len, splits, a.sl);
  CUDA_CHECK(cudaGetLastError());
  if (splits > 1) {
    const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.B) * a.max_q_len * a.Hq);
    attn_combine_kernel<T, D><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(a.out), part_o, part_lse, a.q_indptr,
                                                               a.Hq, a.max_q_len, splits);
    CUDA_CHECK(cudaGetLastError());
  }
}

// Prefill variants (see kernels/cuda/attention_internal.h; figures there). Defaults from the H200
// measurements: D=64 -> 1 (1 warpgroup, 128-key tiles; fastest at every length, L=30000 causal
// 6.99 ms vs 9.18 ms for 0), D=128 -> 2 (2 warpgroups, 64-key tiles; L=8192 causal 1.17 ms vs
// 1.36 ms for 1 and 2.10 ms for 0).
// D=128 without an explicit choice (environment / test override) uses kDefaultPrefillVariantD128.
constexpr int kDefaultPrefillVariant = 1;
constexpr int kDefaultPrefillVariantD128 = 2;
static_assert(kDefaultPrefillVariant >= 0 && kDefaultPrefillVariant < kPrefillVariantCount);
static_assert(kDefaultPrefillVariantD128 >= 0 && kDefaultPrefillVariantD128 < kPrefillVariantCount);

template <typename T, int D, int MT, int BN, int NW, bool kQRegs, bool kLazy>
void launch_prefill(CudaBackend& be, const Args& a) {
  using Cfg = PrefillCfg<D, MT, BN, NW>;
  auto kernel = attn_prefill_kernel<T, D, MT, BN, NW, kQRegs, kLazy>;
  constexpr int smem = Cfg::kSmemBytes;
  attention_allow_smem(be, kernel_key(kernel), smem);
  const int num_qtiles = (a.max_q_len + Cfg::kBM - 1) / Cfg::kBM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, Cfg::kThreads, smem, be.stream()>>>(static_cast<T*>(a.out), static_cast<const T*>(a.q),
                                                     static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                     a.q_indptr, a.kv, a.Hq, a.Hkv, a.G, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T, int D, int BN, int NWG, int kMinBlocks>
void launch_prefill_wgmma(CudaBackend& be, const Args& a) {
  using Tile = WgTile<T, D, BN, NWG>;
  auto kernel = attn_prefill_wgmma_kernel<T, D, BN, NWG, kMinBlocks>;
  constexpr int smem = Tile::kSmemBytes;
  static_assert((smem + 1024) * kMinBlocks <= 228 * 1024, "shared memory per SM (1 KiB reserved per block)");
  attention_allow_smem(be, kernel_key(kernel), smem);
  const int num_qtiles = (a.max_q_len + Tile::BM - 1) / Tile::BM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, Tile::NT, smem, be.stream()>>>(static_cast<T*>(a.out), static_cast<const T*>(a.q),
                                                static_cast<const T*>(a.k), static_cast<const T*>(a.v), a.q_indptr,
                                                a.kv, a.Hq, a.Hkv, a.G, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_generic(CudaBackend& be, const Args& a) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.max_q_len * a.Hq;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  attn_generic_kernel<T><<<blocks, kThreads, 0, be.stream()>>>(
      static_cast<T*>(a.out), static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      a.q_indptr, a.kv, a.B, a.Hq, a.Hkv, a.G, a.D, a.max_q_len, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_prefill_variant(CudaBackend& be, const Args& a, int variant) {
  if (variant != 0 && !state_of(be).has_wgmma) variant = 0;
  if (a.D == 64) {
    switch (variant) {
      case 1:  // 1 warpgroup, 128-key tiles, 3 blocks per SM (the previous variant 5)
        return launch_prefill_wgmma<T, 64, 128, 1, 3>(be, a);
      case 2:  // 2 warpgroups, 64-key tiles, 2 blocks per SM
        return launch_prefill_wgmma<T, 64, 64, 2, 2>(be, a);
      default:
        return launch_prefill<T, 64, 2, 64, 4, true, false>(be, a);
    }
  }
  switch (variant) {
    case 1:  // 1 warpgroup, 64-key tiles, 2 blocks per SM (the previous variants 1 and 5)
      return launch_prefill_wgmma<T, 128, 64, 1, 2>(be, a);
    case 2:  // 2 warpgroups, 64-key tiles, 2 blocks per SM (the previous variant 2)
      return launch_prefill_wgmma<T, 128, 64, 2, 2>(be, a);
    default:
      return launch_prefill<T, 128, 1, 64, 4, true, false>(be, a);
  }
}

template <typename T>
void launch_fast(CudaBackend& be, const Args& a) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const bool decode = row_tiles <= kDecodeMaxRowTiles;
  if (decode) {
    if (a.D == 64)
      launch_decode<T, 64>(be, a);
    else
      launch_decode<T, 128>(be, a);
    return;
  }
  launch_prefill_variant<T>(be, a, prefill_variant_for_head_dim(be, a.D));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool attention_device_has_wgmma(CudaBackend& be) { return state_of(be).has_wgmma; }

void attention_allow_smem(CudaBackend& be, const void* kernel, int bytes) {
  if (bytes <= 48 * 1024) return;
  AttentionState& st = state_of(be);
  int& limit = st.smem_limit[kernel];
  if (limit >= bytes) return;
  with_device(st.device,
              [&] { CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); });
  limit = bytes;
}

int prefill_variant_for_head_dim(CudaBackend& be, int head_dim) {
  const int v = be.attention_prefill_variant();
  if (v >= 0) {
    KILN_ASSERT(v < kPrefillVariantCount);
    return v;
  }
  const int e = state_of(be).env_prefill_variant;
  if (e >= 0) return e;
  return head_dim == 128 ? kDefaultPrefillVariantD128 : kDefaultPrefillVariant;
}

const char* prefill_variant_name(int v) {
  static const char* const kNames[kPrefillVariantCount] = {
      "mma.sync 4 warps, BN64, Q regs (fallback off sm_90; D=64 32 rows/warp, D=128 16)",
      "wgmma 1 WG BM64, BN128 (D=128: BN64)",
      "wgmma 2 WG BM128, BN64",
  };
  return v >= 0 && v < kPrefillVariantCount ? kNames[v] : "?";
}

void attention_forward(CudaBackend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr,
                       const PagedKV& paged, ops::AttentionBounds bounds, float scale) {
  KILN_ASSERT(q.ndim() == 3 && out.shape == q.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  KILN_ASSERT(k_cache.size(2) == q.size(2));
  KILN_ASSERT(q.dtype == out.dtype && q.dtype == k_cache.dtype && q.dtype == v_cache.dtype);
  KILN_ASSERT(q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f16);
  KILN_ASSERT(q_indptr.dtype == DType::i32 && paged.page_indptr.dtype == DType::i32 &&
              paged.page_indices.dtype == DType::i32 && paged.last_page_len.dtype == DType::i32);
  KILN_ASSERT(bounds.batch >= 0 && bounds.max_q_len >= 0 && bounds.max_kv_len >= 0);
  KILN_ASSERT(q_indptr.ndim() == 1 && q_indptr.numel() == bounds.batch + 1);
  KILN_ASSERT(paged.page_indptr.ndim() == 1 && paged.page_indptr.numel() == bounds.batch + 1);
  KILN_ASSERT(paged.page_indices.ndim() == 1 && paged.last_page_len.ndim() == 1 &&
              paged.last_page_len.numel() >= bounds.batch);
  KILN_ASSERT(paged.page_size >= 1);
  KILN_ASSERT(k_cache.size(0) <= INT32_MAX);  // pool rows are int32 in the kernels
  KILN_ASSERT(q.device.is_cuda() && out.device.is_cuda() && k_cache.device.is_cuda() && v_cache.device.is_cuda() &&
              q_indptr.device.is_cuda() && paged.page_indptr.device.is_cuda());
  KILN_ASSERT(paged.page_indices.numel() == 0 || paged.page_indices.device.is_cuda());
  KILN_ASSERT(paged.last_page_len.numel() == 0 || paged.last_page_len.device.is_cuda());
  const int64_t Hq = q.size(1), Hkv = k_cache.size(1), D = q.size(2);
  KILN_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  KILN_ASSERT(D > 0 && D % 2 == 0 && D <= 256);
  KILN_ASSERT(bounds.batch <= 65535 && Hq <= 65535);
  if (bounds.batch == 0 || bounds.max_q_len == 0 || q.size(0) == 0) return;

  Args a;
  a.out = out.data;
  a.q = q.data;
  a.k = k_cache.data;
  a.v = v_cache.data;
  a.q_indptr = q_indptr.ptr<int>();
  const PageDivisor div = page_divisor(paged.page_size);
  a.kv = PagedArgs{paged.page_indptr.ptr<int>(), paged.page_indices.ptr<int>(), paged.last_page_len.ptr<int>(),
                   paged.page_size, div.magic, div.shift};
  a.B = bounds.batch;
  a.Hq = static_cast<int>(Hq);
  a.Hkv = static_cast<int>(Hkv);
  a.G = static_cast<int>(Hq / Hkv);
  a.D = static_cast<int>(D);
  a.max_q_len = bounds.max_q_len;
  a.max_kv_len = bounds.max_kv_len;
  a.sl = scale * kLog2e;

  const bool fast = (q.dtype == DType::bf16 || q.dtype == DType::f16) && (D == 64 || D == 128) && aligned16(a.out) &&
                    aligned16(a.q) && aligned16(a.k) && aligned16(a.v);
  if (fast) {
    if (q.dtype == DType::bf16)
      launch_fast<__nv_bfloat16>(be, a);
    else
      launch_fast<__half>(be, a);
    return;
  }
  switch (q.dtype) {
    case DType::f32:
      launch_generic<float>(be, a);
      break;
    case DType::bf16:
      launch_generic<__nv_bfloat16>(be, a);
      break;
    case DType::f16:
      launch_generic<__half>(be, a);
      break;
    default:
      KILN_ASSERT(false);
  }
}

}  // namespace kiln::cuda
