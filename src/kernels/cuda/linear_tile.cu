// Many-row linear layers on Hopper with a fused epilogue (cuda_ops.h: linear_tile_swiglu_forward):
// the prefill's gate/up projection with SwiGLU in its epilogue, so the [T, 2I] gate/up product never
// reaches memory and the separate SwiGLU pass (reading it back and writing [T, I]) goes away.
//
// A persistent kernel, one block an SM, three warpgroups. Warpgroup 0 is the producer (register
// budget lowered; one thread issues the TMA loads); warpgroups 1 and 2 are the consumers, 64 x rows
// each. A tile is 128 x rows (wgmma operand A, K-major) by 256 weight rows (operand B, K-major): the
// 128 gate rows of 128 outputs and the 128 up rows of the same outputs, two TMA boxes, so each
// consumer thread holds an output's gate and up sums in accumulators d[i] and d[64 + i] (the wgmma
// m64n256 layout: n8 tile j in d[4j .. 4j + 3]). 64-wide k steps of both operands (48 KB) fill a
// ring of kStages stages in shared memory (128-byte swizzle), each completing on an mbarrier; a
// stage is refilled once both consumers' wgmmas on it have completed. The producer runs ahead into
// the block's next tile while the consumers finish the last one (SwiGLU in f32 on the unrounded
// sums, as the small-batch kernels do, and bf16 stores from registers), so the stores overlap loads.
// Tiles are walked in groups of kGroupM row tiles, weight tiles within a group, so the blocks working
// at one time share a few x tiles and a band of the weights in L2. No atomics: deterministic.
//
// Written without a GPU (eighteenth session: no device could be started); off by default
// (KILN_LINEAR_TILE below) until its test (CudaFusedKernels.TileSwigluMatchesCpu) has passed and
// bench_ops has measured it against cuBLASLt + the SwiGLU pass (break-even: docs/perf-notes.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

using namespace hopper;

constexpr int kBK = 64;                          // k per stage: one 128-byte swizzled row per tile row
constexpr int kBM = 128;                         // x rows a tile: two consumer warpgroups of 64
constexpr int kOuts = 128;                       // outputs a tile (gate and up rows: wgmma N = 256)
constexpr int kStages = 4;
constexpr int kXBytes = kBM * kBK * 2;           // 16 KB
constexpr int kWBytes = 2 * kOuts * kBK * 2;     // 32 KB
constexpr int kStageBytes = kXBytes + kWBytes;   // a multiple of 1024
constexpr int kThreads = 384;                    // producer + two consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment slack
constexpr int kGroupM = 8;                       // row tiles a group of the walk
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * (kProducerRegs + 2 * kConsumerRegs) <= 65536, "register budget");

// Unit u of the walk: unit row tile mu (kMc row tiles, one a cluster block), output tile nt. Units go
// in groups of `group` unit rows, output tiles within a group.
struct TileWalk {
  int m_units, n_tiles, group;
  __device__ __forceinline__ void unit(int u, int& mu, int& nt) const {
    const int per_group = group * n_tiles, first = (u / per_group) * group;
    const int rows = min(m_units - first, group), r = u % per_group;
    mu = first + r % rows;
    nt = r / rows;
  }
};

// kMc blocks a cluster (1 or 2) share each weight tile: the kMc blocks of a cluster take kMc
// adjacent row tiles with the same output tile, and block r loads the weight boxes r, r + kMc, ..
// (of gate, up) multicast into every block of the cluster, so each weight byte crosses from L2 once
// per kMc row tiles. A stage is then refilled only once the consumers of every block of the cluster
// have released it (each consumer warp arrives on the "empty" barrier of each block), and a block
// leaves only once its last stages are released everywhere (no peer still writes into its shared
// memory or arrives on its barriers). Same sums in the same order for every kMc: identical bits.
//
// kFastExp (a measurement switch, KILN_LINEAR_TILE_FAST_EXP=1): SwiGLU with __expf and __fdividef
// instead of expf and a division, in case the epilogue, during which both consumers leave the tensor
// cores idle, is what keeps the kernel below cuBLASLt + the SwiGLU pass.
template <int kMc, bool kFastExp>
__global__ void __launch_bounds__(kThreads, 1)
    linear_tile_swiglu_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                              __nv_bfloat16* __restrict__ y, const void* __restrict__ bias, DType b_dt, int M, int I,
                              int K) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];   // stage s loaded (TMA transactions)
  __shared__ __align__(8) uint64_t empty[kStages];  // stage s read (one arrival per consumer warp of the cluster)
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tid = threadIdx.x;
  const int rank = static_cast<int>(blockIdx.x) % kMc, cluster = static_cast<int>(blockIdx.x) / kMc;
  const int clusters = static_cast<int>(gridDim.x) / kMc;
  const int m_tiles = (M + kBM - 1) / kBM;
  const TileWalk walk{(m_tiles + kMc - 1) / kMc, (I + kOuts - 1) / kOuts, kGroupM / kMc};
  const int units = walk.m_units * walk.n_tiles;
  const int k_tiles = (K + kBK - 1) / kBK;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps * kMc);
    }
    mbar_fence_init();
  }
  // The barriers exist before a peer multicasts into them or arrives on them.
  if constexpr (kMc > 1) cluster_sync_all();
  else __syncthreads();

  if (tid < 128) {
    regs_dec<kProducerRegs>();
    if (tid != 0) return;
    int it = 0;  // the block's k steps so far, over its tiles
    for (int u = cluster; u < units; u += clusters) {
      int mu, nt;
      walk.unit(u, mu, nt);
      // A block past the last row tile loads the last one's rows (its stores are masked off).
      const int x_row = min(mu * kMc + rank, m_tiles - 1) * kBM;
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        if (it >= kStages) mbar_wait(&empty[s], ((it / kStages) - 1) & 1);
        uint8_t* stage = smem + s * kStageBytes;
        mbar_arrive_expect_tx(&full[s], kStageBytes);
        tma_load_2d(stage, &x_map, kt * kBK, x_row, &full[s]);
        // The weight boxes: gate rows, then the up rows of the same outputs.
#pragma unroll
        for (int b = rank; b < 2; b += kMc) {
          uint8_t* dst = stage + kXBytes + b * (kWBytes / 2);
          const int w_row = b * I + nt * kOuts;
          if constexpr (kMc == 1) tma_load_2d(dst, &w_map, kt * kBK, w_row, &full[s]);
          else tma_load_2d_multicast(dst, &w_map, kt * kBK, w_row, &full[s], static_cast<uint16_t>((1u << kMc) - 1));
        }
      }
    }
    // The tail: every stage released by every block of the cluster before this block may leave.
    if constexpr (kMc > 1)
      for (int j = max(0, it - kStages); j < it; ++j) mbar_wait(&empty[j % kStages], (j / kStages) & 1);
    return;
  }

  regs_inc<kConsumerRegs>();
  const int wg = tid / 128 - 1, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  auto release = [&](int s) {
    if constexpr (kMc == 1) {
      if (lane == 0) mbar_arrive(&empty[s]);
    } else {
      if (lane < kMc) mbar_arrive_cluster(&empty[s], static_cast<uint32_t>(lane));
    }
  };
  float acc[128];
  int it = 0;
  for (int u = cluster; u < units; u += clusters) {
    int mu, nt;
    walk.unit(u, mu, nt);
    const int mt = mu * kMc + rank;
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], (it / kStages) & 1);
      const uint32_t stage = smem_u32(smem + s * kStageBytes);
      const uint32_t xa = stage + wg * 64 * kBK * 2, wa = stage + kXBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) WgmmaSS<256>::run(acc, sw128_desc(xa + kk * 32), sw128_desc(wa + kk * 32));
      wgmma_commit();
      wgmma_wait<1>();  // the previous stage's group has completed: release it
      fence_regs(acc);
      if (kt > 0) release((it - 1) % kStages);
    }
    wgmma_wait<0>();
    fence_regs(acc);
    release((it - 1) % kStages);
    if (mt >= m_tiles) continue;

    // Epilogue: thread (warp, g, t4) holds rows 16 warp + g (+ 8) of its warpgroup's 64, outputs
    // 8j + 2 t4 (+ 1) of the tile's 128 (gate in acc[4j ..], up in acc[64 + 4j ..]).
    const int row0 = mt * kBM + 64 * wg + 16 * warp + g;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int o = nt * kOuts + 8 * j + 2 * t4;
      if (o >= I) break;
      const bool pair = o + 1 < I && I % 2 == 0;
      float bg[2] = {0.0f, 0.0f}, bu[2] = {0.0f, 0.0f};
      if (bias) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (o + e < I) bg[e] = detail::load1(bias, o + e, b_dt), bu[e] = detail::load1(bias, I + o + e, b_dt);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row0 + 8 * h;
        if (m >= M) continue;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float gate = acc[4 * j + 2 * h + e] + bg[e], up = acc[64 + 4 * j + 2 * h + e] + bu[e];
          if constexpr (kFastExp) v[e] = __fdividef(gate, 1.0f + __expf(-gate)) * up;
          else v[e] = gate / (1.0f + expf(-gate)) * up;
        }
        __nv_bfloat16* dst = y + static_cast<int64_t>(m) * I + o;
        if (pair) {
          *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v[0], v[1]);
        } else {
          dst[0] = __float2bfloat16_rn(v[0]);
          if (o + 1 < I) dst[1] = __float2bfloat16_rn(v[1]);
        }
      }
    }
  }
}

// KILN_LINEAR_TILE: 0 keeps the prefill's gate/up on cuBLASLt and the SwiGLU pass; 1 or 2 takes the
// tile GEMM with that multicast. Unset: kDefaultSetting, 0 until the kernel has run on a GPU and
// been measured against cuBLASLt + SwiGLU (docs/perf-notes.md, eighteenth session). Read once per
// process: a measurement switch, not device state.
constexpr int kDefaultSetting = 0;

int tile_setting() {
  static const int setting = [] {
    const char* env = std::getenv("KILN_LINEAR_TILE");
    if (env == nullptr || *env == '\0') return kDefaultSetting;
    const std::string_view v(env);
    if (v == "0" || v == "1" || v == "2") return v[0] - '0';
    std::fprintf(stderr, "kiln: ignoring KILN_LINEAR_TILE=%s (want 0, 1 or 2)\n", env);
    return kDefaultSetting;
  }();
  return setting;
}

bool tile_fast_exp() {
  static const bool fast = [] {
    const char* env = std::getenv("KILN_LINEAR_TILE_FAST_EXP");
    return env != nullptr && std::string_view(env) == "1";
  }();
  return fast;
}

template <int kMc, bool kFastExp>
void launch(CudaBackend& be, const CUtensorMap& x_map, const CUtensorMap& w_map, void* y, const void* bias, DType b_dt,
            int M, int I, int K) {
  auto kernel = linear_tile_swiglu_kernel<kMc, kFastExp>;
  // As many clusters as fit at once (a GPC's odd SM cannot hold a cluster of two: a grid of half the
  // SMs' count could leave one cluster for a second wave, doubling the time).
  const int resident = kernel_max_active_clusters(be, reinterpret_cast<const void*>(kernel), kMc, kThreads, kSmem);
  const int64_t units = (((M + kBM - 1) / kBM + kMc - 1) / kMc) * ((I + kOuts - 1) / kOuts);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(kMc * std::min<int64_t>(units, resident)));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = detail::stream_of(be);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kMc;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, x_map, w_map, static_cast<__nv_bfloat16*>(y), bias, b_dt, M, I, K));
}

}  // namespace

bool linear_tile_swiglu_valid(CudaBackend& be, int64_t M, int64_t I, int64_t K, DType dtype) {
  return attention_device_has_wgmma(be) && dtype == DType::bf16 && M >= 1 && I >= 1 && K > 0 && K % 8 == 0 &&
         M < (int64_t(1) << 31) && 2 * I < (int64_t(1) << 31) && K < (int64_t(1) << 31);
}

// Switched on, the tile kernel replaces cuBLASLt's gate/up and the SwiGLU pass from
// kLinearTileMinRows rows (below, the small-batch kernels take the rows). The row count where it
// starts to pay is still to be measured (bench_ops --tokens N, entry gate_up_swiglu_fused).
bool linear_tile_swiglu_preferred(CudaBackend& be, int64_t M, int64_t I, int64_t K, DType dtype) {
  return tile_setting() != 0 && M >= kLinearTileMinRows && linear_tile_swiglu_valid(be, M, I, K, dtype);
}

void linear_tile_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor w, Tensor bias, int multicast) {
  detail::check_float(be, out);
  detail::check_float(be, x);
  detail::check_float(be, w);
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0), I = N / 2;
  KILN_ASSERT(linear_tile_swiglu_valid(be, M, I, K, w.dtype) && x.dtype == w.dtype && out.dtype == w.dtype);
  KILN_ASSERT(w.ndim() == 2 && w.size(1) == K && N % 2 == 0 && out.numel() == M * I);
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(w.data) && reinterpret_cast<uintptr_t>(out.data) % 4 == 0);
  if (bias.data) {
    detail::check_float(be, bias);
    KILN_ASSERT(bias.numel() == N);
  }
  const CUtensorMap x_map = bf16_tile_map(x.data, M, K, kBM, kBK, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap w_map = bf16_tile_map(w.data, N, K, kOuts, kBK, CU_TENSOR_MAP_SWIZZLE_128B);
  KILN_ASSERT(((M + kBM - 1) / kBM) * ((I + kOuts - 1) / kOuts) < (int64_t(1) << 31));  // tiles
  if (multicast <= 0) multicast = tile_setting() > 0 ? tile_setting() : 1;
  KILN_ASSERT(multicast == 1 || multicast == 2);
  const int m = static_cast<int>(M), i = static_cast<int>(I), k = static_cast<int>(K);
  const bool fast = tile_fast_exp();
  if (multicast == 2 && fast) launch<2, true>(be, x_map, w_map, out.data, bias.data, bias.dtype, m, i, k);
  else if (multicast == 2) launch<2, false>(be, x_map, w_map, out.data, bias.data, bias.dtype, m, i, k);
  else if (fast) launch<1, true>(be, x_map, w_map, out.data, bias.data, bias.dtype, m, i, k);
  else launch<1, false>(be, x_map, w_map, out.data, bias.data, bias.dtype, m, i, k);
}

}  // namespace kiln::cuda
