// Small-batch linear layers with their neighbours fused (ops.h: norm_linear_forward,
// norm_linear_swiglu_forward, linear_residual_forward, norm_linear_qkv_rope_forward): the decode path,
// where a step's few rows make every projection a matrix-vector product bound by reading the weights
// once.
//
// y^T = W x^T on tensor cores: W [N, K] (row-major) is mma's A operand, 16 weight rows per tile; the
// batch rows of x [M, K] are its B operand, MT n8 tiles (M <= 8 MT). The k dimension is permuted
// identically on both sides so that every thread loads 16 contiguous bytes per row: within a 32-wide
// k chunk, thread (g = lane / 4, t = lane % 4) loads elements [8t, 8t + 8) of weight rows g and g + 8
// and of batch row g; words 0-1 feed the chunk's first k16 product and words 2-3 its second (mma's k
// slots {2t, 2t+1, 2t+8, 2t+9} of both operands then hold the same physical k).
//
// Block: kWarps warps over the same RG x 16 weight rows (SwiGLU: 16 or 32 gate rows and the up rows
// of the same outputs), each warp a contiguous range of K (SwiGLU: every eighth 32-wide chunk);
// weight loads run a chunk group ahead in a register double buffer and bypass L1 (the batch rows,
// re-read by every block, stay in it); at most 128 registers, two blocks per SM. Long-K narrow
// matrices (down: fewer row tiles than two per SM) split K over a cluster of two blocks. The warps'
// partial sums meet in shared memory; a cluster's blocks store their sums into every rank's shared
// memory (distributed shared memory; only once every rank is known to have started: a relaxed
// cluster arrive at the kernel's start, its wait before the first remote store) and meet at one
// barrier, after which each reads only its own (measured on an H100: the down projection 10.35 ->
// 9.68 us a layer at two rows against remote loads between two barriers; docs/perf-notes.md).
// Always added in a fixed order: no atomics, so results are deterministic and a replayed graph is
// bit-exact.
// Epilogue per output: times the batch row's 1 / rms when normed, plus bias, then stored, added to
// the f32 residual, or SwiGLU; or, for q/k/v, rounded, rotated and written to q and the KV cache
// (rope_row says how the rows pair).
// Norm prologue: x is the f32 residual stream; each thread multiplies its x chunk by the norm weight
// and rounds it to the weight dtype, and sums x^2 of its chunks; the block adds those up at the end.
// Launched programmatically (programmatic_launch.cuh): the first two stages' weight loads are issued
// before the wait for the kernel that wrote x, so they overlap that kernel's tail (q/k/v: the rest of
// the warp's weight bytes are prefetched into L2 there too).
// A single row (one request's decode step) goes to the warp-per-row kernel of fused_linear_rows.cu
// instead (same epilogues): measured faster there, slower from two rows (docs/perf-notes.md).
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/cuda/fused_linear.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;
using fused::Epilogue;
using fused::RopeOut;
using fused::RopeTarget;
using fused::rope_target;
using fused::store_qkv_rope;
using T = __nv_bfloat16;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// The qkv_rope epilogue's weight rows: block b holds dims 8 jj + r (r < 8) of head b / (D / 16),
// jj = b % (D / 16), in its tile rows r, and their rotation partners D / 2 further in rows r + 8, so
// that the rows g and g + 8 a thread sums are a pair of the rotation.
__device__ __forceinline__ int rope_row(int block, int r, int D) {
  const int per_head = D / 16, head = block / per_head, jj = block % per_head;
  return head * D + 8 * jj + (r & 7) + (r >= 8 ? D / 2 : 0);
}

// MT: n8 batch tiles; RG: 16-row weight groups per block (SwiGLU: RG/2 gate groups, then the RG/2
// up groups of the same outputs); KS: blocks of a cluster splitting K, their sums added through
// distributed shared memory. U: k chunks per pipeline stage (more bytes in flight where registers
// allow).
template <int MT, int RG, bool kNorm>
struct Tile {
  static constexpr int U = RG * MT >= 4 ? 1 : RG * MT == 2 ? (kNorm ? 1 : 2) : (kNorm ? 2 : 4);
  using XWord = std::conditional_t<kNorm, float4, uint4>;
  static constexpr int XW = kNorm ? 2 : 1;  // XWords per thread per chunk and batch tile
  struct Stage {
    uint4 w[U][RG][2];        // weight rows g and g + 8 of each row group
    XWord x[U][MT][XW];       // batch row tile * 8 + g
    uint4 nw[kNorm ? U : 1];  // norm weights of the chunk (kNorm)
  };
};

template <int MT, int RG, int KS, bool kNorm, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads, 2)
    fused_linear_kernel(void* __restrict__ y, DType y_dt, const void* __restrict__ x, const T* __restrict__ w,
                        const T* __restrict__ norm_w, const void* __restrict__ bias, DType b_dt, int M, int N, int K,
                        float eps, RopeOut rope) {
  using L = Tile<MT, RG, kNorm>;
  constexpr int U = L::U;
  constexpr int kRows = RG * 16;
  constexpr int kCols = MT * 8;
  constexpr int OG = kEpi == Epilogue::swiglu ? RG / 2 : RG;  // output row groups
  __shared__ float red[kWarps][kRows][kCols + 1];
  __shared__ float red_ss[kWarps][kCols];
  // Block sums over the warps, one slot per rank of the cluster: every rank writes its sums into its
  // own slot of every rank's buffer (distributed shared memory), so after one cluster barrier each
  // rank adds the slots in rank order from its own shared memory.
  __shared__ float part[KS][kRows][kCols + 1];
  __shared__ float part_ss[KS][kCols];

  hopper::launch_dependents();  // the next kernel's weight stream may start under this one's tail
  if constexpr (KS > 1) hopper::cluster_arrive_relaxed();  // this block has started (waited for below)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int rank = KS > 1 ? static_cast<int>(cg::this_cluster().block_rank()) : 0;
  const int out_rows = kEpi == Epilogue::swiglu ? N / 2 : N;
  const int n0 = blockIdx.x * 16 * OG;  // first output of the block

  // Weight row pointers of this thread (rows g, g + 8 of each group) and whether they exist.
  const T* wrow[RG][2];
  bool wok[RG][2];
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool up = kEpi == Epilogue::swiglu && rg >= OG;
      const int j = kEpi == Epilogue::qkv_rope ? rope_row(blockIdx.x, g + 8 * h, rope.D)
                                               : n0 + (up ? rg - OG : rg) * 16 + g + 8 * h;
      wok[rg][h] = j < out_rows;
      const int row = (up ? out_rows : 0) + (wok[rg][h] ? j : 0);
      wrow[rg][h] = w + static_cast<int64_t>(row) * K + t * 8;
    }
  bool xok[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xok[mt] = mt * 8 + g < M;

  // This warp's contiguous range of 32-wide k chunks: the rank's share of K, split over the warps.
  const int chunks = K / 32;
  const int per_rank = (chunks + KS - 1) / KS;
  const int r_begin = min(chunks, rank * per_rank), r_end = min(chunks, r_begin + per_rank);
  // Gate/up: the warps take the rank's chunks in turn (warp w: chunks w, w + 8, ...), so that at any
  // moment the block's warps read adjacent 64-byte pieces of the same weight rows (512 contiguous
  // bytes a row, as the one-row kernel's warp loads). Measured on an H100 (bench_linear, us a layer
  // at 2 / 8 rows): 18.2 / 18.2 -> 16.2 / 16.7, where q/k/v, o and down were 0.05-0.16 slower so
  // (docs/perf-notes.md, twenty-first session); they keep a contiguous range of chunks a warp. The
  // loop runs over the warp's chunks by position.
  constexpr bool kInterleave = kEpi == Epilogue::swiglu;
  const int per_warp = (r_end - r_begin + kWarps - 1) / kWarps;
  const int w_begin = min(r_end, r_begin + warp * per_warp);
  const int c_end = kInterleave ? max(0, (r_end - r_begin - warp + kWarps - 1) / kWarps)
                                : min(r_end, w_begin + per_warp) - w_begin;
  auto chunk_of = [&](int i) { return kInterleave ? r_begin + warp + i * kWarps : w_begin + i; };

  float acc[RG][MT][4];
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[rg][mt][0] = acc[rg][mt][1] = acc[rg][mt][2] = acc[rg][mt][3] = 0.0f;
  float ss[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) ss[mt] = 0.0f;

  using Stage = typename L::Stage;
  // Weights (and norm weights) of chunks [c0, c0 + U): launch-invariant, so the first two stages
  // are issued before the wait for the previous kernel.
  auto load_w = [&](Stage& s, int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;  // warp-uniform
      const int k = chunk_of(c) * 32;
#pragma unroll
      for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int h = 0; h < 2; ++h) s.w[u][rg][h] = wok[rg][h] ? ldg_stream(wrow[rg][h] + k) : make_uint4(0, 0, 0, 0);
      if constexpr (kNorm) s.nw[u] = *reinterpret_cast<const uint4*>(norm_w + k + t * 8);
    }
  };
  // The batch rows of the same chunks (written by the previous kernel).
  auto load_x = [&](Stage& s, int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;  // warp-uniform
      const int k = chunk_of(c) * 32;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int64_t off = static_cast<int64_t>(mt * 8 + g) * K + k + t * 8;
        if constexpr (kNorm) {
          const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + off);
          s.x[u][mt][0] = xok[mt] ? p[0] : make_float4(0, 0, 0, 0);
          s.x[u][mt][1] = xok[mt] ? p[1] : make_float4(0, 0, 0, 0);
        } else {
          s.x[u][mt][0] = xok[mt] ? *reinterpret_cast<const uint4*>(static_cast<const T*>(x) + off) : make_uint4(0, 0, 0, 0);
        }
      }
    }
  };

  auto compute = [&](const Stage& s, int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u >= c_end) break;  // warp-uniform
      uint32_t b[MT][4];  // words of batch row tile * 8 + g at k [8t, 8t + 8)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kNorm) {
          const float xs[8] = {s.x[u][mt][0].x, s.x[u][mt][0].y, s.x[u][mt][0].z, s.x[u][mt][0].w,
                               s.x[u][mt][1].x, s.x[u][mt][1].y, s.x[u][mt][1].z, s.x[u][mt][1].w};
          const T* nv = reinterpret_cast<const T*>(&s.nw[u]);
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            ss[mt] += xs[e] * xs[e] + xs[e + 1] * xs[e + 1];
            b[mt][e / 2] = Mma<T>::pack(xs[e] * __bfloat162float(nv[e]), xs[e + 1] * __bfloat162float(nv[e + 1]));
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) b[mt][e] = word(s.x[u][mt][0], e);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) {
          const uint32_t a[4] = {word(s.w[u][rg][0], 2 * half), word(s.w[u][rg][1], 2 * half),
                                 word(s.w[u][rg][0], 2 * half + 1), word(s.w[u][rg][1], 2 * half + 1)};
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) Mma<T>::mma(acc[rg][mt], a, b[mt][2 * half], b[mt][2 * half + 1]);
        }
    }
  };

  Stage s0, s1;
  load_w(s0, 0);
  load_w(s1, U);
  // q/k/v: this thread's epilogue pair (batch row m = idx / 8, rotation pair p = idx % 8; at most
  // one a thread) and its target, found before the wait (rope_target).
  const int rope_idx = threadIdx.x + rank * kThreads;
  const bool rope_pair = kEpi == Epilogue::qkv_rope && rope_idx < kCols * 8 && rope_idx / 8 < M;
  RopeTarget target;
  if constexpr (kEpi == Epilogue::qkv_rope) {
    static_assert(kCols * 8 <= kThreads, "one epilogue pair a thread at most");
    if (rope_pair) target = rope_target(rope, rope_idx / 8, rope_row(blockIdx.x, rope_idx % 8, rope.D));
  }
  // q/k/v: the warp's later chunks of its weight rows into L2 as well before the wait, so that its
  // loads after the wait hit L2. Measured on an H100 (docs/perf-notes.md, nineteenth session): the
  // step 1.093 / 1.185 -> 1.086 / 1.177 ms at 2 / 8 rows (bench_decode_step, 1K). The same prefetch
  // on every epilogue (bench_linear, us a layer at 2 / 8 rows): normed q/k/v with the store epilogue
  // 4.60 / 4.84 -> 4.25 / 4.45, gate/up slower (18.05 / 18.11 -> 19.03 / 19.25), o and down unchanged.
  if constexpr (kEpi == Epilogue::qkv_rope) {
    if (t == 0 && 2 * U < c_end) {
      const uint32_t bytes = static_cast<uint32_t>(c_end - 2 * U) * 64u;
#pragma unroll
      for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (wok[rg][h]) hopper::prefetch_l2(wrow[rg][h] + chunk_of(2 * U) * 32, bytes);
    }
  }
  hopper::grid_dependency_wait();
  load_x(s0, 0);
  load_x(s1, U);
  for (int c = 0; c < c_end; c += 2 * U) {
    compute(s0, c);
    load_w(s0, c + 2 * U);
    load_x(s0, c + 2 * U);
    compute(s1, c + U);
    load_w(s1, c + 3 * U);
    load_x(s1, c + 3 * U);
  }

  // Partial sums to shared memory: acc[rg][mt] = rows rg*16 + g (+8), columns mt*8 + 2t (+1).
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      red[warp][rg * 16 + g][mt * 8 + 2 * t] = acc[rg][mt][0];
      red[warp][rg * 16 + g][mt * 8 + 2 * t + 1] = acc[rg][mt][1];
      red[warp][rg * 16 + g + 8][mt * 8 + 2 * t] = acc[rg][mt][2];
      red[warp][rg * 16 + g + 8][mt * 8 + 2 * t + 1] = acc[rg][mt][3];
    }
  if constexpr (kNorm) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float v = ss[mt];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) red_ss[warp][mt * 8 + g] = v;
    }
  }
  __syncthreads();
  if constexpr (KS > 1) hopper::cluster_wait();  // every rank has started: its shared memory may be written
  // Stores this block's sum into its slot of every rank's buffer (remote stores: no round trip).
  auto publish = [&](float* slot, float v) {
    if constexpr (KS == 1) {
      *slot = v;
    } else {
#pragma unroll
      for (int r = 0; r < KS; ++r) *cg::this_cluster().map_shared_rank(slot, r) = v;
    }
  };
  for (int idx = threadIdx.x; idx < kRows * kCols; idx += kThreads) {
    const int n = idx / kCols, m = idx % kCols;
    float sum = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += red[wi][n][m];
    publish(&part[rank][n][m], sum);
  }
  if (kNorm && threadIdx.x < kCols) {
    float sum = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += red_ss[wi][threadIdx.x];
    publish(&part_ss[rank][threadIdx.x], sum);
  }
  // One barrier: every rank's stores are visible to all (release / acquire at cluster scope), and no
  // block touches another's shared memory after it, so each may finish and exit on its own. Each
  // rank finishes a share of the outputs, adding the ranks' sums in rank order.
  if constexpr (KS > 1) cg::this_cluster().sync();
  else __syncthreads();
  // The sum over the ranks of slot offset `offset` of `buffer` (part or part_ss, slot 0).
  auto total = [&](const float* buffer, int slot_elems, int offset) {
    if constexpr (KS == 1) return buffer[offset];
    float v = 0.0f;
#pragma unroll
    for (int r = 0; r < KS; ++r) v += buffer[r * slot_elems + offset];
    return v;
  };
  constexpr int kPartElems = kRows * (kCols + 1);

  if constexpr (kEpi == Epilogue::qkv_rope) {
    // One thread per (batch row m, rotation pair p).
    if (rope_pair) {
      const int m = rope_idx / 8, p = rope_idx % 8;
      const float scale = kNorm ? 1.0f / sqrtf(total(&part_ss[0][0], kCols, m) / static_cast<float>(K) + eps) : 1.0f;
      const int f0 = rope_row(blockIdx.x, p, rope.D);
      store_qkv_rope(rope, target, m, f0, total(&part[0][0][0], kPartElems, p * (kCols + 1) + m) * scale,
                     total(&part[0][0][0], kPartElems, (p + 8) * (kCols + 1) + m) * scale, bias, b_dt);
    }
    return;
  }

  // One thread per (batch row m, output j of the block): outputs j fastest for contiguous stores.
  constexpr int kOuts = 16 * OG;
  for (int idx = threadIdx.x + rank * kThreads; idx < kCols * kOuts; idx += KS * kThreads) {
    const int m = idx / kOuts, jl = idx % kOuts, j = n0 + jl;
    if (m >= M || j >= out_rows) continue;
    const float scale = kNorm ? 1.0f / sqrtf(total(&part_ss[0][0], kCols, m) / static_cast<float>(K) + eps) : 1.0f;
    constexpr int kParts = kEpi == Epilogue::swiglu ? 2 : 1;
    float v[kParts];
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      v[p] = total(&part[0][0][0], kPartElems, (p * kOuts + jl) * (kCols + 1) + m) * scale;
      if (bias) v[p] += detail::load1(bias, p * out_rows + j, b_dt);
    }
    const int64_t o = static_cast<int64_t>(m) * out_rows + j;
    if constexpr (kEpi == Epilogue::store) {
      detail::store1(y, o, y_dt, v[0]);
    } else if constexpr (kEpi == Epilogue::add_residual) {
      float* r = static_cast<float*>(y) + o;
      *r = *r + v[0];
    } else {
      detail::store1(y, o, y_dt, v[0] / (1.0f + expf(-v[0])) * v[kParts - 1]);
    }
  }
}

template <int MT, int RG, int KS, bool kNorm, Epilogue kEpi>
void launch_kernel(const CudaBackend& be, int row_blocks, void* y, DType y_dt, const void* x, const T* w,
                   const T* norm_w, const void* bias, DType b_dt, int M, int N, int K, float eps, const RopeOut& rope) {
  detail::launch_programmatic(be, fused_linear_kernel<MT, RG, KS, kNorm, kEpi>,
                              dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(KS)), dim3(kThreads), 0,
                              dim3(1, static_cast<unsigned>(KS)), y, y_dt, x, w, norm_w, bias, b_dt, M, N, K, eps, rope);
}

// Blocks of a cluster splitting K: two for long-K matrices that fill fewer than two blocks per SM
// (the down projection: 96 row tiles, K = 6912), else one. Measured (bench_ops, 1 to 32 rows): the
// down projection took 10.7 / 12.4 / 12.1 us at 1 row with 2 / 1 / 4 splits; o and q/k/v (K = 1536)
// were fastest unsplit; 3 or 4 splits never won.
int k_splits(int row_blocks, int K, int sm_count) {
  return row_blocks < 2 * sm_count && K / 32 / kWarps >= 16 ? 2 : 1;
}

template <int MT, bool kNorm, Epilogue kEpi>
void launch_for_tiles(CudaBackend& be, void* y, DType y_dt, const void* x, const T* w, const T* norm_w,
                      const void* bias, DType b_dt, int M, int N, int K, float eps, const RopeOut& rope) {
  const int out_rows = kEpi == Epilogue::swiglu ? N / 2 : N;
  const int tiles16 = (out_rows + 15) / 16;
  constexpr int RG = kEpi == Epilogue::swiglu ? 2 : 1;
  // SwiGLU at one batch tile: two gate and two up row groups per block where that still gives
  // every SM a block, so the matrix streams in one wave of blocks instead of two that each pay a
  // block's ramp and drain. Measured (graph-replayed, astrai-1b: 6912 outputs, 432 or 216 blocks on
  // 132 SMs of two slots): gate/up 16.8 -> 14.7 us per layer at one row (bench_linear); decode
  // step B=1 1.002 -> 0.947 ms, B=8 1.161 -> 1.068 (bench_decode_step, 1K); llama-1b (8192
  // outputs: 512 or 256 blocks) B=1 0.945 both, B=8 1.083 -> 1.046.
  if constexpr (kEpi == Epilogue::swiglu && MT == 1) {
    const int wide_blocks = (tiles16 + 1) / 2;
    if (wide_blocks >= be.multiprocessor_count())
      return launch_kernel<MT, 4, 1, kNorm, kEpi>(be, wide_blocks, y, y_dt, x, w, norm_w, bias, b_dt, M, N, K, eps,
                                                  rope);
  }
  auto run = [&](auto ks) {
    launch_kernel<MT, RG, decltype(ks)::value, kNorm, kEpi>(be, tiles16, y, y_dt, x, w, norm_w, bias, b_dt, M, N,
                                                            K, eps, rope);
  };
  if (k_splits(tiles16, K, be.multiprocessor_count()) == 1) run(std::integral_constant<int, 1>{});
  else run(std::integral_constant<int, 2>{});
}

constexpr int64_t kMaxRows = ops::kNormLinearMaxRows;  // this kernel's batch rows (4 n8 tiles)

bool kernel_valid(int64_t M, int64_t K, DType w_dtype) {
  return M >= 1 && M <= kMaxRows && K % 32 == 0 && K > 0 && K < (int64_t(1) << 30) && w_dtype == DType::bf16;
}

template <bool kNorm, Epilogue kEpi>
void launch(CudaBackend& be, Tensor y, Tensor x, Tensor w, Tensor norm_w, Tensor bias, float eps,
            const RopeOut& rope = {}) {
  detail::check_float(be, y);
  detail::check_float(be, x);
  detail::check_float(be, w);
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0);
  KILN_ASSERT(kernel_valid(M, K, w.dtype));
  KILN_ASSERT(w.ndim() == 2 && w.size(1) == K && N < (int64_t(1) << 30));
  KILN_ASSERT(x.dtype == (kNorm ? DType::f32 : w.dtype));
  KILN_ASSERT(y.numel() == M * (kEpi == Epilogue::swiglu ? N / 2 : N));
  if (kEpi == Epilogue::swiglu) KILN_ASSERT(N % 2 == 0);
  if (kEpi == Epilogue::add_residual) KILN_ASSERT(y.dtype == DType::f32);
  if (kNorm) KILN_ASSERT(norm_w.dtype == w.dtype && norm_w.numel() == K);
  if (bias.data) KILN_ASSERT(bias.numel() == N);
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(w.data) && (!kNorm || detail::aligned16(norm_w.data)));
  if (N == 0) return;
  const T* wt = static_cast<const T*>(w.data);
  const T* nt = static_cast<const T*>(norm_w.data);
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  if (fused::rows_kernel_valid(M, K)) {  // one row: the warp-per-row kernel (fused_linear_rows.cu)
    const fused::LinearArgs a{.y = y.data, .y_dt = y.dtype, .x = x.data, .w = wt, .norm_w = nt, .bias = bias.data,
                              .b_dt = bias.dtype, .M = m, .N = n, .K = k, .eps = eps};
    return fused::rows_kernel_launch(be, kEpi, kNorm, a, rope);
  }
  if (M <= 8)
    launch_for_tiles<1, kNorm, kEpi>(be, y.data, y.dtype, x.data, wt, nt, bias.data, bias.dtype, m, n, k, eps, rope);
  else if (M <= 16)
    launch_for_tiles<2, kNorm, kEpi>(be, y.data, y.dtype, x.data, wt, nt, bias.data, bias.dtype, m, n, k, eps, rope);
  else
    launch_for_tiles<4, kNorm, kEpi>(be, y.data, y.dtype, x.data, wt, nt, bias.data, bias.dtype, m, n, k, eps, rope);
}

// Measured on the H200 against cuBLASLt plus the separate norm / SwiGLU kernels (bench_linear:
// the decode projections of the astrai-1b shape over 24 layers' weights, captured in a CUDA graph
// like a decode step; us per layer at 1 / 8 / 16 / 32 rows): q/k/v 5.1 / 5.3 / 7.4 / 8.6 against
// 6.9 / 6.9 / 7.0 / 7.0; o 4.1 / 4.3 / 5.0 / 5.9 against 6.2 / 5.1 / 5.1 / 5.1; gate/up + SwiGLU
// 16.7 / 16.8 / 19.1 / 44.8 against 16.7 / 16.5 / 17.0 / 17.5; down 8.9 / 9.3 / 11.3 / 13.6
// against 9.9 / 10.0 / 10.1 / 10.3; the vocabulary head 109 against 79 at one row. (Timed as
// separate launches instead, cuBLASLt pays ~5 us more per call and the fused kernel looked better
// up to 32 rows.) This kernel takes the rows where it is not slower.
bool kernel_preferred(CudaBackend& be, ops::FusedLinear kind, int64_t M, int64_t N, int64_t K, DType w_dtype) {
  if (!kernel_valid(M, K, w_dtype)) return false;
  const bool wide = N >= 32 * static_cast<int64_t>(be.multiprocessor_count()) * 16;
  switch (kind) {
    // A vocabulary head (wide) only at one row, on the warp-per-row kernel with the norm folded in:
    // H100, 106 us against cuBLASLt's 110-116 without the norm kernel, the step 0.01-0.02 ms faster
    // (docs/perf-notes.md, sixteenth session). From two rows the head stays on cuBLASLt: the tensor-core
    // tiles measured slower for it (the figures above).
    // Up to 16 rows every other projection, chosen by the step rather than by each projection: on an
    // H100 (twenty-first session) the step at B = 12 / 16 took 1.482 / 1.484 ms with q/k/v, gate/up
    // and down here too against 1.550 / 1.524 with them on cuBLASLt and the separate norm, SwiGLU and
    // rotary kernels (only o was here), although at 16 rows gate/up and down alone are 0.3 / 1.0 us
    // slower here (bench_linear): the kernels they replace cost more.
    case ops::FusedLinear::norm: return (!wide || fused::rows_kernel_valid(M, K)) && M <= 16;
    case ops::FusedLinear::norm_swiglu:
    case ops::FusedLinear::swiglu:
    case ops::FusedLinear::residual: return M <= 16;
  }
  return false;
}

// The streaming kernel (linear_tma.cu) for the unnormed kinds where it is the faster choice or
// the only one that takes the rows.
bool use_tma(CudaBackend& be, TmaEpilogue epi, int64_t M, int64_t N, int64_t K, DType w_dtype) {
  return linear_tma_valid(be, M, K, w_dtype) && (!kernel_valid(M, K, w_dtype) || linear_tma_preferred(be, epi, M, N, K, w_dtype));
}

}  // namespace

bool fused_linear_valid(CudaBackend& be, ops::FusedLinear kind, int64_t M, int64_t K, DType w_dtype) {
  const bool normed = kind == ops::FusedLinear::norm || kind == ops::FusedLinear::norm_swiglu;
  return kernel_valid(M, K, w_dtype) || (!normed && linear_tma_valid(be, M, K, w_dtype));
}

bool fused_linear_preferred(CudaBackend& be, ops::FusedLinear kind, int64_t M, int64_t N, int64_t K,
                            DType w_dtype) {
  switch (kind) {
    case ops::FusedLinear::norm:
    case ops::FusedLinear::norm_swiglu: return kernel_preferred(be, kind, M, N, K, w_dtype);
    case ops::FusedLinear::swiglu:
      return kernel_preferred(be, kind, M, N, K, w_dtype) ||
             linear_tma_preferred(be, TmaEpilogue::swiglu, M, 2 * N, K, w_dtype);
    case ops::FusedLinear::residual:
      return kernel_preferred(be, kind, M, N, K, w_dtype) ||
             linear_tma_preferred(be, TmaEpilogue::add_residual, M, N, K, w_dtype);
  }
  return false;
}

void norm_linear_forward(CudaBackend& be, Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
  launch<true, Epilogue::store>(be, y, x, w, norm_w, bias, eps);
}

void norm_linear_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor bias) {
  launch<true, Epilogue::swiglu>(be, out, x, w, norm_w, bias, eps);
}

// The head's argmax where the head takes the warp-per-row kernel (one row): its last block picks
// the token (fused_linear_rows.cu) in place of the sampler's argmax kernel, one launch and one pass
// over the logits less.
bool norm_linear_argmax_preferred(CudaBackend& be, int64_t M, int64_t N, int64_t K, DType w_dtype) {
  return kernel_preferred(be, ops::FusedLinear::norm, M, N, K, w_dtype) && fused::rows_kernel_valid(M, K) && N > 0 &&
         N < (int64_t(1) << 30);
}

void norm_linear_argmax_forward(CudaBackend& be, Tensor logits, Tensor tokens, Tensor x, Tensor norm_w, float eps,
                                Tensor w, Tensor scratch) {
  detail::check_float(be, logits);
  detail::check_float(be, x);
  detail::check_float(be, w);
  detail::check_i32(be, tokens);
  detail::check_i32(be, scratch);
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0);
  KILN_ASSERT(fused::rows_kernel_valid(M, K) && w.dtype == DType::bf16 && w.ndim() == 2 && w.size(1) == K);
  KILN_ASSERT(N > 0 && N < (int64_t(1) << 30) && logits.numel() == N && tokens.numel() == 1);
  KILN_ASSERT(x.dtype == DType::f32 && norm_w.dtype == w.dtype && norm_w.numel() == K);
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(w.data) && detail::aligned16(norm_w.data));
  KILN_ASSERT(scratch.numel() >= ops::kArgmaxScratchWords && reinterpret_cast<uintptr_t>(scratch.data) % 8 == 0);
  const fused::LinearArgs a{.y = logits.data, .y_dt = logits.dtype, .x = x.data, .w = w.data, .norm_w = norm_w.data,
                            .M = 1, .N = static_cast<int>(N), .K = static_cast<int>(K), .eps = eps};
  fused::ArgmaxOut am;
  am.token = tokens.ptr<int32_t>();
  am.best = reinterpret_cast<unsigned long long*>(scratch.data);
  am.arrived = reinterpret_cast<unsigned int*>(scratch.ptr<int32_t>() + 2);
  fused::rows_kernel_argmax_launch(be, a, am);
}

bool norm_linear_qkv_rope_preferred(CudaBackend& be, int64_t M, int64_t N, int64_t K, int64_t D, DType w_dtype) {
  return kernel_preferred(be, ops::FusedLinear::norm, M, N, K, w_dtype) && D > 0 && D % 16 == 0 && N % D == 0;
}

void norm_linear_qkv_rope_forward(CudaBackend& be, Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor x,
                                  Tensor norm_w, float eps, Tensor w, Tensor bias, Tensor positions, Tensor slots,
                                  Tensor inv_freq, float attention_scaling) {
  detail::check_float(be, q_out);
  detail::check_i32(be, positions);
  detail::check_i32(be, slots);
  KILN_ASSERT(q_out.ndim() == 3 && k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  KILN_ASSERT(k_cache.dtype == q_out.dtype && v_cache.dtype == q_out.dtype);
  const int64_t M = q_out.size(0), Hq = q_out.size(1), D = q_out.size(2), Hkv = k_cache.size(1);
  KILN_ASSERT(D % 16 == 0 && k_cache.size(2) == D && w.size(0) == (Hq + 2 * Hkv) * D);
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == M && qkv.size(1) == w.size(0));
  KILN_ASSERT(positions.numel() == M && slots.numel() == M);
  KILN_ASSERT(inv_freq.dtype == DType::f32 && inv_freq.numel() == D / 2);
  RopeOut rope;
  rope.q = q_out.data;
  rope.k_cache = k_cache.data;
  rope.v_cache = v_cache.data;
  rope.dt = q_out.dtype;
  rope.positions = positions.ptr<const int32_t>();
  rope.slots = slots.ptr<const int32_t>();
  rope.inv_freq = inv_freq.ptr<const float>();
  rope.scaling = attention_scaling;
  rope.Hq = static_cast<int>(Hq);
  rope.Hkv = static_cast<int>(Hkv);
  rope.D = static_cast<int>(D);
  launch<true, Epilogue::qkv_rope>(be, qkv, x, w, norm_w, bias, eps, rope);
}

void linear_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor w, Tensor bias) {
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1);
  if (use_tma(be, TmaEpilogue::swiglu, M, w.size(0), K, w.dtype))
    return linear_tma_forward(be, TmaEpilogue::swiglu, out, x, w, bias);
  launch<false, Epilogue::swiglu>(be, out, x, w, Tensor{}, bias, 0.0f);
}

void fused_linear_kernel_forward(CudaBackend& be, ops::FusedLinear kind, Tensor y, Tensor x, Tensor norm_w, float eps,
                                 Tensor w, Tensor bias) {
  switch (kind) {
    case ops::FusedLinear::norm: return launch<true, Epilogue::store>(be, y, x, w, norm_w, bias, eps);
    case ops::FusedLinear::norm_swiglu: return launch<true, Epilogue::swiglu>(be, y, x, w, norm_w, bias, eps);
    case ops::FusedLinear::swiglu: return launch<false, Epilogue::swiglu>(be, y, x, w, Tensor{}, bias, 0.0f);
    case ops::FusedLinear::residual: return launch<false, Epilogue::add_residual>(be, y, x, w, Tensor{}, bias, 0.0f);
  }
}

void linear_residual_forward(CudaBackend& be, Tensor residual, Tensor x, Tensor w, Tensor bias) {
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1);
  if (use_tma(be, TmaEpilogue::add_residual, M, w.size(0), K, w.dtype))
    return linear_tma_forward(be, TmaEpilogue::add_residual, residual, x, w, bias);
  launch<false, Epilogue::add_residual>(be, residual, x, w, Tensor{}, bias, 0.0f);
}

}  // namespace kiln::cuda
