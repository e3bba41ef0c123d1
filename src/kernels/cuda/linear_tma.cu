// Streaming linear layers for a few to 128 rows on Hopper (cuda_ops.h: linear_tma_forward): the
// batched decode steps' projections, bound by reading each weight byte once.
//
// y^T = W x^T on wgmma with the weight tile as operand A (64 weight rows, one consumer warpgroup)
// and the batch rows as operand B (N = BM, 16 to 128 rows, zero-padded by TMA past M). Both tiles arrive by TMA in 64-wide k steps (128-byte rows,
// 128-byte swizzle) into a ring of shared-memory stages that complete on mbarriers. A producer warp
// refills a stage as soon as the consumer warpgroups' wgmmas on it have completed (an "empty"
// mbarrier per stage), so the ring keeps kStages tiles in flight per block; two blocks share an SM.
// The consumers' accumulators are the 64 x BM tile of y^T. Every block reads all BM batch rows of its
// k range, so at many rows the batch tiles outweigh the weight tiles; tiles of 128 or 256 weight rows
// (two or four consumer warpgroups), which cut that traffic, were slower in every projection at 32
// to 128 rows (docs/perf-notes.md, 2026-12-05; the code is in the history, commit c2cefd5).
//
// The batch tiles multicast over a cluster of adjacent weight tiles (each batch byte crossing from L2
// once per group) were no faster at any row count, alone or in the step (docs/perf-notes.md,
// 2026-12-05; the code is in the history, commit 4ba0ef8).
//
// Few-tile matrices (the attention projections, the long-K down projection) split K over a cluster
// of up to 8 blocks; the blocks' tiles meet in shared memory and each block finishes a share of the
// outputs, adding the ranks' partial sums in rank order through distributed shared memory: no
// atomics, so results are deterministic and a replayed graph is bit-exact.
//
// Epilogues: store (y in its dtype), add into the f32 residual, or SwiGLU. For SwiGLU a tile's
// weight rows are its gate rows and the up rows of the same outputs, half and half (two TMA boxes
// per stage).
//
// Programmatic dependent launch: the kernel is launched with the programmatic stream
// serialization attribute, loads its first weight tiles, and only then waits for the grid before
// it (whose output x is); so a projection's weight stream starts while the previous kernel drains.
#include <cooperative_groups.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/tensor_map.h"

namespace kiln::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace hopper;

constexpr int kBK = 64;        // k per stage: one 128-byte swizzled row per tile row
constexpr int kWgRows = 64;    // weight rows of a tile: one consumer warpgroup (wgmma M)
constexpr int kMaxSplits = 8;  // portable cluster size

// BM batch rows (wgmma N) against a consumer warpgroup of 64 weight rows. Two blocks share an SM
// (registers: 64 accumulators a thread at 128 rows).
template <int BM>
struct Geometry {
  static constexpr int kBlocksPerSm = 2;
  static constexpr int kStageBudget = 192 * 1024 / kBlocksPerSm;  // shared-memory bytes of the stage ring
  static constexpr int kConsumers = 128;
  static constexpr int kConsumerWarps = kConsumers / 32;
  static constexpr int kThreads = kConsumers + 32;  // and a producer warp
  static constexpr int kBW = kWgRows;               // weight rows per tile
  static constexpr int kWBytes = kBW * kBK * 2;
  static constexpr int kXBytes = BM * kBK * 2;
  static constexpr int kStageBytes = kWBytes + kXBytes;  // a multiple of 1024 (BM % 8 == 0)
  static constexpr int kStages = std::clamp(kStageBudget / kStageBytes, 2, 8);
  static constexpr int kRedStride = BM + 4;  // floats per weight row of the reduction tile
  static constexpr int kRedBytes = kBW * kRedStride * 4;
  static constexpr int kSmem = std::max(kStages * kStageBytes, kRedBytes) + 1024;  // + alignment slack
};

template <int BM, TmaEpilogue kEpi>
__global__ void __launch_bounds__(Geometry<BM>::kThreads, Geometry<BM>::kBlocksPerSm)
    linear_tma_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                      void* __restrict__ y, DType y_dt, const void* __restrict__ bias, DType b_dt, int M, int N,
                      int K) {
  using G = Geometry<BM>;
  constexpr int kStages = G::kStages;
  constexpr int kConsumers = G::kConsumers;
  constexpr bool kSwiglu = kEpi == TmaEpilogue::swiglu;
  constexpr int kOuts = kSwiglu ? G::kBW / 2 : G::kBW;  // outputs per tile
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t full[kStages];   // stage s loaded (TMA transactions)
  __shared__ __align__(8) uint64_t empty[kStages];  // stage s read (one arrival per consumer warp)
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  const int tid = threadIdx.x;
  const int splits = gridDim.y, rank = blockIdx.y;
  const int out_rows = kSwiglu ? N / 2 : N;
  const int o0 = blockIdx.x * kOuts;  // first output of the tile

  // This rank's k tiles.
  const int k_tiles = (K + kBK - 1) / kBK;
  const int per_rank = (k_tiles + splits - 1) / splits;
  const int kt0 = min(k_tiles, rank * per_rank);
  const int n_k = min(k_tiles, kt0 + per_rank) - kt0;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], G::kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
  if (tid >= kConsumers) {
    // Producer warp, one lane: stage s is refilled once the consumers have released it (their
    // wgmmas on it completed). The weights do not depend on the previous kernel: the first stages'
    // weight loads are issued before waiting for it, then their x.
    if (tid == kConsumers) {
      auto load_w = [&](int s, int kt) {
        uint8_t* dst = smem + s * G::kStageBytes;
        mbar_arrive_expect_tx(&full[s], G::kStageBytes);
        if constexpr (kSwiglu) {
          tma_load_2d(dst, &w_map, kt * kBK, o0, &full[s]);
          tma_load_2d(dst + G::kWBytes / 2, &w_map, kt * kBK, out_rows + o0, &full[s]);
        } else {
          tma_load_2d(dst, &w_map, kt * kBK, o0, &full[s]);
        }
      };
      auto load_x = [&](int s, int kt) {
        tma_load_2d(smem + s * G::kStageBytes + G::kWBytes, &x_map, kt * kBK, 0, &full[s]);
      };
      const int prologue = min(kStages, n_k);
      for (int s = 0; s < prologue; ++s) load_w(s, kt0 + s);
      grid_dependency_wait();
      for (int s = 0; s < prologue; ++s) load_x(s, kt0 + s);
      for (int i = kStages; i < n_k; ++i) {
        const int s = i % kStages;
        mbar_wait(&empty[s], ((i / kStages) - 1) & 1);
        load_w(s, kt0 + i);
        load_x(s, kt0 + i);
      }
    } else {
      grid_dependency_wait();
    }
  } else {
    // The consumer warpgroup: one wgmma group per stage, the previous stage released as soon as its
    // group has completed (one group stays in flight).
    grid_dependency_wait();
    const int lane = tid % 32;
    auto release = [&](int s) {
      if (lane == 0) mbar_arrive(&empty[s]);
    };
    for (int i = 0; i < n_k; ++i) {
      const int s = i % kStages;
      mbar_wait(&full[s], (i / kStages) & 1);
      const uint32_t stage = smem_u32(smem + s * G::kStageBytes);
      const uint32_t wa = stage, xa = stage + G::kWBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) WgmmaSS<BM>::run(acc, sw128_desc(wa + kk * 32), sw128_desc(xa + kk * 32));
      wgmma_commit();
      wgmma_wait<1>();
      fence_regs(acc);
      if (i > 0) release((i - 1) % kStages);
    }
    wgmma_wait<0>();
    fence_regs(acc);
  }
  launch_dependents();
  __syncthreads();  // every load issued has been consumed: the stages are free

  // The tile to shared memory: red[r][m] = y^T of weight row r (of the tile), batch row m; rows
  // 16-byte aligned.
  float* red = reinterpret_cast<float*>(smem);
  if (tid < kConsumers) {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const int r = 16 * warp + g, m = 8 * j + 2 * t;
      *reinterpret_cast<float2*>(&red[r * G::kRedStride + m]) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(&red[(r + 8) * G::kRedStride + m]) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  if (splits > 1) cg::this_cluster().sync();
  else __syncthreads();

  // Output groups of 4 batch rows x 1 output, outputs fastest (consecutive threads: consecutive
  // outputs, so shared-memory reads avoid bank conflicts and stores are contiguous). A thread takes
  // kChunk groups kConsumers apart and issues all their shared-memory loads (the cluster's ranks, in
  // rank order) and residual loads before any store, so that their latencies overlap.
  constexpr int kGroups = BM / 4 * kOuts;
  constexpr int kChunk = 4, kStep = kChunk * kConsumers;
  const int m_groups = (M + 3) / 4;
  for (int base = rank * kStep + tid; tid < kConsumers && base < kGroups; base += splits * kStep) {
    float4 v[kChunk], u[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int idx = base + c * kConsumers, jl = idx % kOuts, mq = idx / kOuts;
      v[c] = u[c] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (mq >= m_groups) continue;
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q) {  // unrolled: the ranks' loads are in flight together
        if (q >= splits) break;
        const float* src = splits == 1 ? red : cg::this_cluster().map_shared_rank(red, q);
        const float4 a = *reinterpret_cast<const float4*>(&src[jl * G::kRedStride + 4 * mq]);
        v[c].x += a.x, v[c].y += a.y, v[c].z += a.z, v[c].w += a.w;
        if constexpr (kSwiglu) {
          const float4 b = *reinterpret_cast<const float4*>(&src[(kOuts + jl) * G::kRedStride + 4 * mq]);
          u[c].x += b.x, u[c].y += b.y, u[c].z += b.z, u[c].w += b.w;
        }
      }
    }
    float res[kChunk][4];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int idx = base + c * kConsumers, jl = idx % kOuts, mq = idx / kOuts, j = o0 + jl;
      const bool ok = mq < m_groups && j < out_rows;
      const float bv = ok && bias ? detail::load1(bias, j, b_dt) : 0.0f;
      const float bu = kSwiglu && ok && bias ? detail::load1(bias, out_rows + j, b_dt) : 0.0f;
      const float vs[4] = {v[c].x, v[c].y, v[c].z, v[c].w}, us[4] = {u[c].x, u[c].y, u[c].z, u[c].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 4 * mq + e;
        float val = vs[e] + bv;
        if constexpr (kEpi == TmaEpilogue::add_residual) {
          if (ok && m < M) val += static_cast<const float*>(y)[static_cast<int64_t>(m) * out_rows + j];
        } else if constexpr (kSwiglu) {
          const float up = us[e] + bu;
          val = val / (1.0f + expf(-val)) * up;
        }
        res[c][e] = val;
      }
    }
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const int idx = base + c * kConsumers, jl = idx % kOuts, mq = idx / kOuts, j = o0 + jl;
      if (mq >= m_groups || j >= out_rows) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 4 * mq + e;
        if (m >= M) break;
        const int64_t o = static_cast<int64_t>(m) * out_rows + j;
        if constexpr (kEpi == TmaEpilogue::add_residual) static_cast<float*>(y)[o] = res[c][e];
        else detail::store1(y, o, y_dt, res[c][e]);
      }
    }
  }
  if (splits > 1) cg::this_cluster().sync();  // keep this block's tile alive until every rank has read it
}

}  // namespace

// cuTensorMapEncodeTiled from the driver (through the runtime: no link against libcuda).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    KILN_ASSERT(q == cudaDriverEntryPointSuccess && p != nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMap bf16_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols,
                          CUtensorMapSwizzle swizzle, int64_t row_stride) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_stride < 0 ? cols : row_stride) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                          strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  KILN_ASSERT(r == CUDA_SUCCESS);
  return map;
}

namespace {

// Tensor map of a row-major bf16 matrix [rows, cols] read in boxes of box_rows x 64 columns, with
// the 128-byte swizzle.
CUtensorMap tile_map(const void* base, int64_t rows, int64_t cols, int box_rows) {
  return bf16_tile_map(base, rows, cols, box_rows, kBK, CU_TENSOR_MAP_SWIZZLE_128B);
}

// Blocks of a cluster splitting K (1, 2, 4 or 8): doubled while the grid has fewer blocks than a
// third of the SMs or a block more than 32 k tiles, keeping at least two k tiles per block.
// Measured (bench_linear, 1 to 128 rows): o and q/k/v (24 k tiles, 24 and 32 tiles) fastest with 2,
// the down projection (108 k tiles, 24 tiles) with 4 (8 at one row: 9.3 against 10.0 us), gate/up
// (216 tiles) with 1.
int choose_splits(int tiles, int k_tiles, int sm_count) {
  int s = 1;
  while (s < kMaxSplits && (tiles * s * 3 < sm_count || k_tiles > 32 * s) && k_tiles / (2 * s) >= 2) s *= 2;
  return s;
}

int batch_tile_rows(int M) { return M <= 16 ? 16 : M <= 32 ? 32 : M <= 64 ? 64 : 128; }

}  // namespace

TmaLaunch linear_tma_launch(CudaBackend& be, TmaEpilogue epilogue, int64_t M, int64_t N, int64_t K, int k_splits) {
  const int bm = batch_tile_rows(static_cast<int>(M));
  const int box_rows = epilogue == TmaEpilogue::swiglu ? kWgRows / 2 : kWgRows;  // outputs per tile
  const int64_t out_rows = epilogue == TmaEpilogue::swiglu ? N / 2 : N;
  TmaLaunch l;
  l.batch_rows = bm;
  l.tiles = static_cast<int>((out_rows + box_rows - 1) / box_rows);
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
  l.splits = std::clamp(k_splits > 0 ? k_splits : choose_splits(l.tiles, k_tiles, be.multiprocessor_count()), 1,
                        kMaxSplits);
  return l;
}

namespace {

template <int BM, TmaEpilogue kEpi>
void launch_bm(CudaBackend& be, void* y, DType y_dt, const void* x, const void* w, const void* bias, DType b_dt,
               int M, int N, int K, const TmaLaunch& l) {
  using G = Geometry<BM>;
  constexpr int kBoxRows = kEpi == TmaEpilogue::swiglu ? G::kBW / 2 : G::kBW;  // weight rows per TMA box
  const CUtensorMap w_map = tile_map(w, N, K, kBoxRows);
  const CUtensorMap x_map = tile_map(x, M, K, BM);
  auto kernel = linear_tma_kernel<BM, kEpi>;
  attention_allow_smem(be, reinterpret_cast<const void*>(kernel), G::kSmem);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(l.tiles), static_cast<unsigned>(l.splits));
  cfg.blockDim = dim3(G::kThreads);
  cfg.dynamicSmemBytes = G::kSmem;
  cfg.stream = detail::stream_of(be);
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = static_cast<unsigned>(l.splits);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = be.programmatic_launch() ? 2 : 1;  // programmatic_launch.cuh
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, w_map, x_map, y, y_dt, bias, b_dt, M, N, K));
}

template <TmaEpilogue kEpi>
void launch(CudaBackend& be, void* y, DType y_dt, const void* x, const void* w, const void* bias, DType b_dt, int M,
            int N, int K, const TmaLaunch& l) {
  switch (l.batch_rows) {
    case 16: return launch_bm<16, kEpi>(be, y, y_dt, x, w, bias, b_dt, M, N, K, l);
    case 32: return launch_bm<32, kEpi>(be, y, y_dt, x, w, bias, b_dt, M, N, K, l);
    case 64: return launch_bm<64, kEpi>(be, y, y_dt, x, w, bias, b_dt, M, N, K, l);
    default: return launch_bm<128, kEpi>(be, y, y_dt, x, w, bias, b_dt, M, N, K, l);
  }
}

// Where the streaming kernel is preferred: for one epilogue, steps of [min_rows, max_rows] rows and
// widths K >= min_k (the down projection apart from o, say), with k_splits blocks splitting K (0:
// choose_splits).
struct TmaRange {
  TmaEpilogue epilogue;
  int min_rows, max_rows, k_splits, min_k = 0;
};

// Measured on the H200 (bench_linear, graph replay, astrai-1b shape over 24 layers' weights;
// docs/perf-notes.md): gate/up + SwiGLU after the norm kernel 17.2 against cuBLASLt's 18.1 us at 64
// rows (17.0 / 17.6 at 16 and 32, 20.8 / 20.1 at 128); every other projection is faster on
// cuBLASLt or the fused small-batch kernel. In the decode step (bench_decode_step, 1K, ms per
// step) taking it from 17 rows: B=32 1.475 against 1.489 from 33 rows; from 9 rows B=16 1.346
// against 1.347 (no gain), so 17.
constexpr TmaRange kMeasuredRanges[] = {{TmaEpilogue::swiglu, 17, 64, 0}};

const char* epilogue_name(TmaEpilogue e) {
  return e == TmaEpilogue::store ? "store" : e == TmaEpilogue::add_residual ? "residual" : "swiglu";
}

// KILN_LINEAR_TMA, for measuring other choices in the whole step: comma-separated
// `EPILOGUE=MIN-MAX[xSPLITS][kMIN_K]` (EPILOGUE store, residual or swiglu; SPLITS 1-8, default
// chosen; MIN_K: only widths of at least that), e.g. `swiglu=17-128,residual=65-128x4k4096`. An
// epilogue it names takes only its ranges (`store=0-0`: never); the others keep the measured ones.
// Malformed: ignored, with a message.
std::vector<TmaRange> read_env_ranges() {
  std::vector<TmaRange> out(std::begin(kMeasuredRanges), std::end(kMeasuredRanges));
  const char* env = std::getenv("KILN_LINEAR_TMA");
  if (env == nullptr || *env == '\0') return out;
  std::vector<TmaRange> given;
  bool named[3] = {false, false, false};
  std::string spec = env;
  for (size_t begin = 0; begin <= spec.size();) {
    const size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    char name[16] = {};
    int lo = 0, hi = 0, splits = 0, min_k = 0, used = 0, tail = 0;
    const int n = std::sscanf(item.c_str(), "%15[a-z]=%d-%d%n", name, &lo, &hi, &used);
    if (n == 3 && item[used] == 'x' && std::sscanf(item.c_str() + used, "x%d%n", &splits, &tail) == 1) used += tail;
    if (n == 3 && item[used] == 'k' && std::sscanf(item.c_str() + used, "k%d%n", &min_k, &tail) == 1) used += tail;
    TmaRange r{TmaEpilogue::store, lo, hi, splits, min_k};
    bool ok = n == 3 && used == static_cast<int>(item.size()) && lo <= hi && splits >= 0 && splits <= kMaxSplits &&
              min_k >= 0;
    if (ok && std::strcmp(name, "residual") == 0) r.epilogue = TmaEpilogue::add_residual;
    else if (ok && std::strcmp(name, "swiglu") == 0) r.epilogue = TmaEpilogue::swiglu;
    else ok = ok && std::strcmp(name, "store") == 0;
    if (!ok) {
      std::fprintf(stderr, "kiln: ignoring KILN_LINEAR_TMA=%s (want e.g. swiglu=17-128,store=65-128x4)\n", env);
      return out;
    }
    named[static_cast<int>(r.epilogue)] = true;
    given.push_back(r);
  }
  std::erase_if(out, [&](const TmaRange& r) { return named[static_cast<int>(r.epilogue)]; });
  out.insert(out.end(), given.begin(), given.end());
  for (const TmaRange& r : given)
    std::fprintf(stderr, "kiln: streaming linear kernel for %s at %d-%d rows and K >= %d, K split %d%s\n",
                 epilogue_name(r.epilogue), r.min_rows, r.max_rows, r.min_k, r.k_splits, r.k_splits ? "" : " (chosen)");
  return out;
}

// The range taking M rows of width K of this epilogue, or none. Read once per process: a measurement switch,
// not device state.
const TmaRange* preferred_range(TmaEpilogue epilogue, int64_t M, int64_t K) {
  static const std::vector<TmaRange> ranges = read_env_ranges();
  for (const TmaRange& r : ranges)
    if (r.epilogue == epilogue && M >= r.min_rows && M <= r.max_rows && K >= r.min_k) return &r;
  return nullptr;
}

}  // namespace

bool linear_tma_valid(CudaBackend& be, int64_t M, int64_t K, DType dtype) {
  return attention_device_has_wgmma(be) && dtype == DType::bf16 && M >= 1 && M <= kLinearTmaMaxRows && K > 0 &&
         K % 8 == 0 && K < (int64_t(1) << 31);
}

bool linear_tma_preferred(CudaBackend& be, TmaEpilogue epilogue, int64_t M, int64_t N, int64_t K, DType dtype) {
  (void)N;
  return linear_tma_valid(be, M, K, dtype) && preferred_range(epilogue, M, K) != nullptr;
}

void linear_tma_forward(CudaBackend& be, TmaEpilogue epilogue, Tensor y, Tensor x, Tensor w, Tensor bias,
                        int k_splits) {
  detail::check_float(be, y);
  detail::check_float(be, x);
  detail::check_float(be, w);
  const int64_t K = x.size(-1), M = x.numel() / std::max<int64_t>(K, 1), N = w.size(0);
  KILN_ASSERT(linear_tma_valid(be, M, K, w.dtype) && x.dtype == w.dtype);
  KILN_ASSERT(w.ndim() == 2 && w.size(1) == K && N < (int64_t(1) << 31));
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(w.data));
  const bool swiglu = epilogue == TmaEpilogue::swiglu;
  if (swiglu) KILN_ASSERT(N % 2 == 0);
  KILN_ASSERT(y.numel() == M * (swiglu ? N / 2 : N));
  if (epilogue == TmaEpilogue::add_residual) KILN_ASSERT(y.dtype == DType::f32);
  if (bias.data) {
    detail::check_float(be, bias);
    KILN_ASSERT(bias.numel() == N);
  }
  if (N == 0) return;
  if (const TmaRange* r = preferred_range(epilogue, M, K); r && k_splits <= 0) k_splits = r->k_splits;
  const TmaLaunch l = linear_tma_launch(be, epilogue, M, N, K, k_splits);
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  switch (epilogue) {
    case TmaEpilogue::store:
      return launch<TmaEpilogue::store>(be, y.data, y.dtype, x.data, w.data, bias.data, bias.dtype, m, n, k, l);
    case TmaEpilogue::add_residual:
      return launch<TmaEpilogue::add_residual>(be, y.data, y.dtype, x.data, w.data, bias.data, bias.dtype, m, n, k, l);
    case TmaEpilogue::swiglu:
      return launch<TmaEpilogue::swiglu>(be, y.data, y.dtype, x.data, w.data, bias.data, bias.dtype, m, n, k, l);
  }
}

}  // namespace kiln::cuda
