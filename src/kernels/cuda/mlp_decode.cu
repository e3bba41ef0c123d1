// The MLP of a decode step in one persistent kernel on Hopper (cuda_ops.h: mlp_residual_forward):
// residual [M, H] (f32) += SwiGLU(x @ w_gate_up^T) @ w_down^T for M <= 64 rows, x the normed rows.
//
// Why one kernel: as separate projections (cuBLASLt or kiln's streaming kernels) the gate/up and down
// weights (85% of a layer's bytes) stream at 2.3-2.9 TB/s, each kernel paying its ramp and drain,
// plus the SwiGLU kernel and the down projection's split-K reduction between them. Here one block per
// SM walks a fixed list of work, its weight tiles streaming through one deep ring of shared memory
// from the first instruction: the down projection's weights do not depend on the gate/up results,
// so they are loaded while the gate/up tiles of other blocks are still being computed.
//
// Work of block b (G blocks, one per SM):
//  phase 1: gate/up tiles t = b, b + G, ... of 64 weight rows (32 gate rows and the 32 up rows of
//    the same outputs) over all of H; each tile's epilogue writes SwiGLU of its 32 outputs for every
//    row into act [M, I] and raises the tile's flag.
//  phase 2: one share of the down projection: output tile t2 (64 outputs) over a contiguous range
//    of I (the G blocks spread over the H / 64 tiles, a tile's k range cut into parts); the partial
//    tile goes to scratch, and the block that completes a tile's last part (a counter per tile) adds
//    the parts in part order into the residual: deterministic, no float atomics.
// Every stage of the ring holds a weight tile (64 rows x 64 k, by TMA, 128-byte swizzle) and the
// x tile of the same k (BM rows x 64 k): x for phase 1, act for phase 2. Two producer warps: one
// issues the weight loads (never waiting on other blocks), the other the x loads, waiting in phase
// 2 for the flags of the act tiles it reads (written by other blocks: the flags are release /
// acquire at device scope, with proxy fences for TMA). The consumer warpgroup runs wgmma on each
// stage (A: weights, B: x) and the epilogues. The last block to finish clears the flags for the
// next call: the sync buffer is zero between calls (calls on one stream).
//
// The blocks must all be resident at once (phase 2 waits on phase 1 of other blocks): the grid is
// one block per SM and the ring fills an SM's shared memory, so no second block fits beside one.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

using namespace hopper;

constexpr int kGroups = 2;  // consumer warpgroups, taking alternate stages
constexpr int kConsumers = 128 * kGroups;
constexpr int kThreads = kConsumers + 64;  // and two producer warps (weights, x)
constexpr int kBK = 64;                    // k per stage
constexpr int kBW = 64;                    // weight rows per tile (wgmma M)
constexpr int kMaxStages = 32;
constexpr int kBlocksPerSm = 2;
constexpr int kSmemLimit = 227 * 1024 / kBlocksPerSm;  // shared memory of a block (sm_90: 227 KB per SM)

template <int BM>
struct MlpGeometry {
  static constexpr int kWBytes = kBW * kBK * 2;
  static constexpr int kXBytes = BM * kBK * 2;  // a multiple of 1024
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kRedStride = BM + 4;  // floats per weight row of the epilogue tile
  static constexpr int kRedBytes = kBW * kRedStride * 4;
  static constexpr int kStatic = 2 * kMaxStages * 8 + 64;  // the barriers and flags (static shared)
  static constexpr int kStages =
      std::min(kMaxStages, (kSmemLimit - kStatic - 1024 - kRedBytes) / kStageBytes);
  static constexpr int kSmem = kStages * kStageBytes + kRedBytes + 1024;  // + alignment slack
};

// Shapes and the fixed work partition, the same arithmetic on every thread.
struct MlpShape {
  int M, H, I;
  int k1;  // k tiles of phase 1 (H / 64)
  int t1;  // gate/up tiles (I / 32)
  int k2;  // k tiles of phase 2 (I / 64)
  int t2;  // down tiles (H / 64)
  int base_parts, extra;  // tile t of phase 2 has base_parts + (t < extra) parts
  __device__ int parts(int t) const { return base_parts + (t < extra ? 1 : 0); }
};

// Sync buffer layout (i32): flags [t1] (act tile ready), counters [t2] (parts done), done [1].
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Generic-proxy global writes ordered with async-proxy (TMA) accesses.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

template <int BM>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    mlp_decode_kernel(const __grid_constant__ CUtensorMap gu_map, const __grid_constant__ CUtensorMap down_map,
                      const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap act_map,
                      __nv_bfloat16* __restrict__ act, float* __restrict__ residual, float* __restrict__ partials,
                      int* __restrict__ sync, MlpShape sh) {
  using G = MlpGeometry<BM>;
  constexpr int kStages = G::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];   // stage loaded (two arrivals: weights, x)
  __shared__ __align__(8) uint64_t empty[kStages];  // stage read (one arrival per consumer warp)
  __shared__ int last_part;                         // phase 2: this block completed its tile
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  float* red = reinterpret_cast<float*>(smem + kStages * G::kStageBytes);
  int* flags = sync;
  int* counters = sync + sh.t1;
  int* done = counters + sh.t2;

  const int tid = threadIdx.x;
  const int b = blockIdx.x, nblocks = gridDim.x;
  const int n1 = b < sh.t1 ? (sh.t1 - 1 - b) / nblocks + 1 : 0;  // this block's gate/up tiles
  // This block's phase-2 units: u = b, b + G, ... over (part p, tile t) = (u / t2, u % t2).
  const int units2 = sh.base_parts * sh.t2 + sh.extra;
  auto unit_range = [&](int u, int& t, int& kt0, int& nk) {
    t = u % sh.t2;
    const int p = u / sh.t2, np = sh.parts(t);
    kt0 = static_cast<int>(static_cast<int64_t>(p) * sh.k2 / np);
    nk = static_cast<int>(static_cast<int64_t>(p + 1) * sh.k2 / np) - kt0;
  };
  const int half = sh.I;  // first up row of w_gate_up

  if (tid == 0) {
#pragma unroll 1
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 2);
      mbar_init(&empty[s], 4);  // the warps of the warpgroup that took the stage
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (tid >= kConsumers) {
    const bool weights = tid == kConsumers, xs = tid == kConsumers + 32;
    if (!weights && !xs) return;
    // Both producers walk the same stage sequence: phase 1's tiles (k1 stages each), then phase 2's
    // units. Stage i goes to slot i % kStages once the consumers released its previous use.
    if (xs) grid_dependency_wait();  // x is the previous kernel's output
    int i = 0;
    auto slot_free = [&](int s) {
      if (i >= kStages) mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
    };
    for (int j = 0; j < n1; ++j) {
      const int t = b + j * nblocks;
      for (int kt = 0; kt < sh.k1; ++kt, ++i) {
        const int s = i % kStages;
        uint8_t* st = smem + s * G::kStageBytes;
        slot_free(s);
        if (weights) {
          mbar_arrive_expect_tx(&full[s], G::kWBytes);
          tma_load_2d(st, &gu_map, kt * kBK, t * 32, &full[s]);
          tma_load_2d(st + G::kWBytes / 2, &gu_map, kt * kBK, half + t * 32, &full[s]);
        } else {
          mbar_arrive_expect_tx(&full[s], G::kXBytes);
          tma_load_2d(st + G::kWBytes, &x_map, kt * kBK, 0, &full[s]);
        }
      }
    }
    // Phase 2: the x producer first waits for every act tile its units read (written by other
    // blocks' phase 1), then fences once (generic-proxy writes read by TMA), then loads.
    if (xs) {
      for (int u = b; u < units2; u += nblocks) {
        int t, kt0, nk;
        unit_range(u, t, kt0, nk);
        for (int f = 2 * kt0; f < min(2 * (kt0 + nk), sh.t1); ++f)
          while (load_acquire(&flags[f]) == 0) __nanosleep(64);
      }
      fence_proxy_async_global();
    }
    for (int u = b; u < units2; u += nblocks) {
      int t, kt0, nk;
      unit_range(u, t, kt0, nk);
      for (int kk = 0; kk < nk; ++kk, ++i) {
        const int s = i % kStages, kt = kt0 + kk;
        uint8_t* st = smem + s * G::kStageBytes;
        slot_free(s);
        if (weights) {
          mbar_arrive_expect_tx(&full[s], G::kWBytes);
          tma_load_2d(st, &down_map, kt * kBK, t * kBW, &full[s]);
        } else {
          mbar_arrive_expect_tx(&full[s], G::kXBytes);
          tma_load_2d(st + G::kWBytes, &act_map, kt * kBK, 0, &full[s]);
        }
      }
    }
    return;
  }

  // Consumer warpgroups: group wg takes the stages i with i % kGroups == wg, its accumulators summed
  // with the other group's at the end of each unit (in group order).
  grid_dependency_wait();
  const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  float acc[BM / 2];
  int i = 0;
  // Stages [i, i + n) into red (from zero); each stage released once its wgmmas completed (one
  // stage of the group stays in flight).
  auto run_stages = [&](int n) {
#pragma unroll
    for (int a = 0; a < BM / 2; ++a) acc[a] = 0.0f;
    int prev = -1;  // this group's stage in flight
    for (int kk = 0; kk < n; ++kk) {
      const int idx = i + kk;
      if (idx % kGroups != wg) continue;
      const int s = idx % kStages;
      mbar_wait(&full[s], (idx / kStages) & 1);
      const uint32_t wa = smem_u32(smem + s * G::kStageBytes), xa = wa + G::kWBytes;
      wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < kBK / 16; ++k16)
        WgmmaSS<BM>::run(acc, sw128_desc(wa + k16 * 32), sw128_desc(xa + k16 * 32));
      wgmma_commit();
      if (prev >= 0) {
        wgmma_wait<1>();
        fence_regs(acc);
        if (lane == 0) mbar_arrive(&empty[prev]);
      }
      prev = s;
    }
    wgmma_wait<0>();
    fence_regs(acc);
    if (prev >= 0 && lane == 0) mbar_arrive(&empty[prev]);
    i += n;
    // The tile to shared memory: red[r][m] = y^T of weight row r, batch row m (group 0 stores,
    // then group 1 adds).
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) {
      if (wg == grp) {
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) {
          const int r = 16 * warp + g, m = 8 * j + 2 * tq;
          float2* lo = reinterpret_cast<float2*>(&red[r * G::kRedStride + m]);
          float2* hi = reinterpret_cast<float2*>(&red[(r + 8) * G::kRedStride + m]);
          if (grp == 0) {
            *lo = make_float2(acc[4 * j], acc[4 * j + 1]);
            *hi = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
          } else {
            *lo = make_float2(lo->x + acc[4 * j], lo->y + acc[4 * j + 1]);
            *hi = make_float2(hi->x + acc[4 * j + 2], hi->y + acc[4 * j + 3]);
          }
        }
      }
      named_sync(1, kConsumers);
    }
  };

  // Phase 1: SwiGLU of each gate/up tile's 32 outputs into act, then the tile's flag.
  for (int j = 0; j < n1; ++j) {
    const int t = b + j * nblocks;
    run_stages(sh.k1);
    for (int idx = tid; idx < 32 * sh.M; idx += kConsumers) {
      const int m = idx / 32, o = idx % 32;
      const float gate = red[o * G::kRedStride + m], up = red[(32 + o) * G::kRedStride + m];
      act[static_cast<int64_t>(m) * sh.I + t * 32 + o] = __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up);
    }
    fence_proxy_async_global();  // these writes are read by other blocks' TMA
    __threadfence();
    named_sync(1, kConsumers);  // every thread's writes are done (and red may be reused)
    if (tid == 0) store_release(&flags[t], 1);
  }

  // Phase 2: partial down tiles; the block completing a tile adds its parts into the residual.
  for (int u = b; u < units2; u += nblocks) {
    int t, kt0, nk;
    unit_range(u, t, kt0, nk);
    run_stages(nk);
    const int p = u / sh.t2, np = sh.parts(t);
    float* mine = partials + (static_cast<int64_t>(t) * (sh.base_parts + 1) + p) * kBW * BM;
    for (int idx = tid; idx < kBW * sh.M; idx += kConsumers) {
      const int m = idx / kBW, o = idx % kBW;
      mine[m * kBW + o] = red[o * G::kRedStride + m];
    }
    __threadfence();
    named_sync(1, kConsumers);
    if (tid == 0) last_part = atomicAdd(&counters[t], 1) == np - 1;
    named_sync(1, kConsumers);
    if (last_part) {
      __threadfence();  // the other parts' writes, seen after their counter increments
      // Each thread sums kBatch outputs at once (their part loads and the residual loads in flight
      // together: the sum sits at the end of every block's critical path).
      constexpr int kBatch = 4;
      const float* tile_parts = partials + static_cast<int64_t>(t) * (sh.base_parts + 1) * kBW * BM;
      for (int base = tid; base < kBW * sh.M; base += kBatch * kConsumers) {
        float sum[kBatch], res[kBatch];
#pragma unroll
        for (int e = 0; e < kBatch; ++e) {
          const int idx = base + e * kConsumers;
          sum[e] = 0.0f;
          res[e] = idx < kBW * sh.M ? residual[static_cast<int64_t>(idx / kBW) * sh.H + t * kBW + idx % kBW] : 0.0f;
        }
        for (int q = 0; q < np; ++q)
#pragma unroll
          for (int e = 0; e < kBatch; ++e) {
            const int idx = base + e * kConsumers;
            if (idx < kBW * sh.M) sum[e] += __ldcg(tile_parts + q * kBW * BM + idx);
          }
#pragma unroll
        for (int e = 0; e < kBatch; ++e) {
          const int idx = base + e * kConsumers;
          if (idx < kBW * sh.M) residual[static_cast<int64_t>(idx / kBW) * sh.H + t * kBW + idx % kBW] = res[e] + sum[e];
        }
      }
      if (tid == 0) counters[t] = 0;
    }
    named_sync(1, kConsumers);  // red is rewritten by the next unit
  }

  // The last block to finish clears the flags (every block's reads of them are done).
  if (tid == 0) {
    __threadfence();
    if (atomicAdd(done, 1) == nblocks - 1) {
      for (int f = 0; f < sh.t1; ++f) flags[f] = 0;
      *done = 0;
      __threadfence();
    }
  }
}

CUtensorMap tile_map(const void* base, int64_t rows, int64_t cols, int box_rows) {
  return bf16_tile_map(base, rows, cols, box_rows, kBK, CU_TENSOR_MAP_SWIZZLE_128B);
}

template <int BM>
void launch_bm(CudaBackend& be, float* residual, const void* x, const void* w_gu, const void* w_down,
               __nv_bfloat16* act, int* sync, int M, int H, int I) {
  using G = MlpGeometry<BM>;
  const int sms = be.multiprocessor_count() * kBlocksPerSm;  // (the grid: every block resident at once)
  MlpShape sh{};
  sh.M = M, sh.H = H, sh.I = I;
  sh.k1 = H / kBK, sh.t1 = I / 32, sh.k2 = I / kBK, sh.t2 = H / kBW;
  if (sms >= sh.t2) {
    sh.base_parts = sms / sh.t2, sh.extra = sms % sh.t2;
  } else {
    sh.base_parts = 1, sh.extra = 0;
  }
  // Partial tiles: up to base_parts + 1 per down tile, [64 outputs x BM rows] each.
  const int64_t part_floats = static_cast<int64_t>(sh.t2) * (sh.base_parts + 1) * kBW * BM;
  float* partials = static_cast<float*>(be.scratch(part_floats * 4));
  const CUtensorMap gu_map = tile_map(w_gu, 2 * static_cast<int64_t>(I), H, 32);
  const CUtensorMap down_map = tile_map(w_down, H, I, kBW);
  const CUtensorMap x_map = tile_map(x, M, H, BM);
  const CUtensorMap act_map = tile_map(act, M, I, BM);
  auto kernel = mlp_decode_kernel<BM>;
  attention_allow_smem(be, reinterpret_cast<const void*>(kernel), G::kSmem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sms));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = G::kSmem;
  cfg.stream = detail::stream_of(be);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = be.programmatic_launch() ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, gu_map, down_map, x_map, act_map, act, residual, partials, sync, sh));
}

}  // namespace

bool mlp_residual_valid(CudaBackend& be, int64_t M, int64_t H, int64_t I, DType dtype) {
  return attention_device_has_wgmma(be) && dtype == DType::bf16 && M >= 1 && M <= ops::kMlpMaxRows && H > 0 &&
         I > 0 && H % kBK == 0 && I % kBK == 0 && H < (int64_t(1) << 30) && I < (int64_t(1) << 30);
}

bool mlp_residual_preferred(CudaBackend& be, int64_t M, int64_t H, int64_t I, DType dtype) {
  const char* on = std::getenv("KILN_MLP");  // TEMPORARY measurement switch
  return mlp_residual_valid(be, M, H, I, dtype) && on && on[0] == '1';
}

void mlp_residual_forward(CudaBackend& be, Tensor residual, Tensor x, Tensor w_gate_up, Tensor w_down, Tensor act,
                          Tensor sync) {
  detail::check_float(be, residual);
  detail::check_float(be, x);
  const int64_t H = x.size(-1), M = x.numel() / std::max<int64_t>(H, 1), I = w_down.size(-1);
  KILN_ASSERT(mlp_residual_valid(be, M, H, I, w_down.dtype));
  KILN_ASSERT(residual.dtype == DType::f32 && residual.numel() == M * H);
  KILN_ASSERT(x.dtype == DType::bf16 && act.dtype == DType::bf16 && w_gate_up.dtype == DType::bf16);
  KILN_ASSERT(w_gate_up.ndim() == 2 && w_gate_up.size(0) == 2 * I && w_gate_up.size(1) == H);
  KILN_ASSERT(w_down.ndim() == 2 && w_down.size(0) == H && act.numel() == M * I);
  KILN_ASSERT(sync.dtype == DType::i32 && sync.numel() >= ops::mlp_sync_ints(H, I));
  KILN_ASSERT(ops::mlp_sync_ints(H, I) == I / 32 + H / kBW + 1);  // the kernel's layout
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(act.data) && detail::aligned16(w_gate_up.data) &&
              detail::aligned16(w_down.data));
  const int m = static_cast<int>(M), h = static_cast<int>(H), i = static_cast<int>(I);
  float* r = static_cast<float*>(residual.data);
  auto* a = static_cast<__nv_bfloat16*>(act.data);
  int* s = static_cast<int*>(sync.data);
  if (M <= 16) return launch_bm<16>(be, r, x.data, w_gate_up.data, w_down.data, a, s, m, h, i);
  if (M <= 32) return launch_bm<32>(be, r, x.data, w_gate_up.data, w_down.data, a, s, m, h, i);
  launch_bm<64>(be, r, x.data, w_gate_up.data, w_down.data, a, s, m, h, i);
}

}  // namespace kiln::cuda
