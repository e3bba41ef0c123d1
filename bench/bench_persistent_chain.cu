// Probe for issue 13's one-row decode target: can ONE persistent kernel stream a layer's projections
// across their data dependencies faster than a launch per projection? (bench_gemv_floor's plain GEMV
// chain, one launch per projection with programmatic launch, reached 29.1 us a layer, 2.57 TB/s, on
// an H100: a launch per op pays its ramp, drain and dependency wait; B=1 at 0.65 ms on the H200 needs
// about 3.3 TB/s over the whole step.) Plain CUDA, none of kiln's kernels; nothing here is used by kiln.
//
// The chain, one batch row, f32 activations, astrai-1b's shapes over L = 24 layers of random bf16
// weights (74.7 MB a layer): per layer
//   op 0  y0 = Wqkv x                       (2048 x 1536)
//   op 1  x += Wo y0[0:1536]                (1536 x 1536; y0's first 1536 stand for the attention)
//   op 2  h = silu(Wg x) * (Wu x)           (2 x 6912 x 1536, gate rows then up rows)
//   op 3  x += Wd h                         (1536 x 6912)
// (no norms and no head; the attention only as its latency on the critical path, in two variants:
// 64 blocks busy 2 or 4 us between q/k/v and o, the rest waiting; what is measured is the weights'
// stream across the ops' dependencies).
//
// The kernel: one block per SM, all resident (cooperative launch). An op's outputs are cut in units of
// four weight rows (op 2: two outputs, their two gate and two up rows), each block a contiguous range
// of every op's units (within 3% of even on 132 SMs). A unit's weights stream through a ring of S
// shared-memory pages of 4 rows x 768 columns (6 KB) filled by 1-D bulk copies (TMA) that complete on
// the page's mbarrier: the producer warp walks the block's pages of all layers and ops in order and
// waits only for free pages, never for data, so the next ops' weights load while the consumers wait
// for the op before. The 12 consumer warps: before an op's first unit, thread 0 waits (acquire) for
// the previous op's counter to reach every block, then the input vector (K floats) is read from L2
// into shared memory; each page, thread t dots its 8 weights (row t / 96, columns 8 (t % 96)..) with
// the input; the rows of four units at a time are summed in a fixed order (warp shuffles, then three
// warps a row: one barrier for the four) and their epilogues store or add the outputs; after its last
// unit a block adds one to the op's counter (release). Counters grow by the grid size every launch
// (no reset between launches).
// Pages come from the row-major weights (four 1,536-byte copies a page) or from a copy of the weights
// tiled page by page (one 6,144-byte copy a page); "deps off" skips the counter waits (wrong
// results; the pure streaming rate of the same kernel).
//
// Checked against a plain kernel per op (one warp per output row) on the same weights: the relative
// error of x after the 24 layers. Prints one JSON object per line: us per layer and TB/s of the
// weights per variant (ring pages 8 / 16 / 32, layout, deps, attention stand-in), beside the plain
// chain's.
// Usage: bench_persistent_chain (no arguments; Hopper or later). Its device helpers (mbarriers, the
// bulk load) are kiln's hopper_util.cuh.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/hopper_util.cuh"  // mbarriers, the 1-D bulk load, the acquire load
#include "kernels/cuda/kernel_util.cuh"  // the bf16 x f32 dot product of the decode-step kernel

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e = (x);                                                                   \
    if (e != cudaSuccess) {                                                                \
      std::printf("{\"error\": \"%s at %s:%d\"}\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

using T = __nv_bfloat16;
using kiln::cuda::smem_u32;
using kiln::cuda::detail::dot_bf16x8_f32;
using kiln::cuda::hopper::bulk_load_1d;
using kiln::cuda::hopper::global_timer_ns;
using kiln::cuda::hopper::load_acquire_gpu;
using kiln::cuda::hopper::mbar_arrive;
using kiln::cuda::hopper::mbar_arrive_expect_tx;
using kiln::cuda::hopper::mbar_fence_init;
using kiln::cuda::hopper::mbar_init;
using kiln::cuda::hopper::mbar_wait;

constexpr int kL = 24, kH = 1536, kQkv = 2048, kI = 6912;
constexpr int kPageRows = 4, kPageCols = 768;              // a page: 4 weight rows x 768 columns
constexpr int kPageElems = kPageRows * kPageCols;          // 3072 bf16, 6 KB
constexpr int kThreadsPerRow = kPageCols / 8;              // 96: one 16-byte vector a thread a page
constexpr int kConsumers = kPageRows * kThreadsPerRow;     // 384 threads, 12 warps
constexpr int kConsumerWarps = kConsumers / 32;
constexpr int kThreads = kConsumers + 32;                  // and the producer warp
constexpr int kMaxSlots = 32;
constexpr int kUnitBatch = 4;  // units a consumer round reduces together (one barrier a round)
// A layer's steps: q/k/v, the attention stand-in, o, gate/up, down (weight ops 0, -, 1, 2, 3).
constexpr int kSteps = 5, kAttnStep = 1, kAttnBlocks = 64;

struct OpShape {
  int units, K, rows;  // units of 4 weight rows, the reduction length, the weight matrix's rows
};
__host__ __device__ constexpr OpShape op_shape(int op) {
  return op == 0   ? OpShape{kQkv / kPageRows, kH, kQkv}
         : op == 1 ? OpShape{kH / kPageRows, kH, kH}
         : op == 2 ? OpShape{kI / 2, kH, 2 * kI}
                   : OpShape{kH / kPageRows, kI, kH};
}
// The weight row of page row r (0..3) of unit u.
__host__ __device__ constexpr int unit_row(int op, int u, int r) {
  return op == 2 ? (r < 2 ? 2 * u + r : kI + 2 * u + r - 2) : kPageRows * u + r;
}
// Block b's units of an op: [first, last).
__host__ __device__ constexpr int unit_begin(int units, int b, int grid) {
  return static_cast<int>(static_cast<int64_t>(units) * b / grid);
}

struct Args {
  const T* w[4];      // row-major [L][rows][K]
  const T* tiles[4];  // tiled: [L][units][K / 768][4][768]
  float* x;           // [kH] the residual stream
  float* y0;          // [kQkv]
  float* h;           // [kI]
  unsigned* done;     // [L * kSteps] steps completed (grid blocks a launch)
  unsigned epoch;     // launches since the counters were zero, this one included
  int slots, tiled, deps;
  int attn_ns;        // > 0: the attention stand-in between q/k/v and o (below)
};

__device__ __forceinline__ void consumer_sync() { kiln::cuda::hopper::named_sync(1, kConsumers); }

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

__global__ void __launch_bounds__(kThreads, 1) chain_kernel(Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);                                       // [slots][4][768]
  float* xs = reinterpret_cast<float*>(smem + a.slots * kPageElems * 2);     // [K] the op's input
  __shared__ uint64_t full[kMaxSlots], empty[kMaxSlots];
  __shared__ float red[2][kUnitBatch][kConsumerWarps];
  const int tid = threadIdx.x, b = blockIdx.x, grid = gridDim.x;
  const int S = a.slots;
  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (tid >= kConsumers) {  // producer warp
    const int lane = tid - kConsumers;
    uint32_t n = 0;
    for (int l = 0; l < kL; ++l)
      for (int op = 0; op < 4; ++op) {
        const OpShape s = op_shape(op);
        const int pages = s.K / kPageCols;
        const int u1 = unit_begin(s.units, b + 1, grid);
        for (int u = unit_begin(s.units, b, grid); u < u1; ++u)
          for (int p = 0; p < pages; ++p, ++n) {
            const int slot = static_cast<int>(n % S);
            if (n >= static_cast<uint32_t>(S)) mbar_wait(&empty[slot], ((n / S) - 1) & 1);
            if (lane == 0) mbar_arrive_expect_tx(&full[slot], kPageElems * 2);
            __syncwarp();
            T* dst = ring + slot * kPageElems;
            if (a.tiled) {
              if (lane == 0) {
                const int64_t page = (static_cast<int64_t>(l) * s.units + u) * pages + p;
                bulk_load_1d(dst, a.tiles[op] + page * kPageElems, kPageElems * 2, &full[slot]);
              }
            } else if (lane < kPageRows) {
              const int64_t row = static_cast<int64_t>(l) * s.rows + unit_row(op, u, lane);
              bulk_load_1d(dst + lane * kPageCols, a.w[op] + row * s.K + p * kPageCols, kPageCols * 2, &full[slot]);
            }
          }
      }
    return;
  }

  // Consumers: thread tid holds page row r, columns 8 c .. 8 c + 7 of every page.
  const int warp = tid / 32, lane = tid % 32;
  const int r = tid / kThreadsPerRow, c = tid % kThreadsPerRow;
  uint32_t n = 0, batches = 0;
  int prev = -1;  // the counter of the step before
  for (int l = 0; l < kL; ++l)
    for (int step = 0; step < kSteps; ++step) {
      if (step == kAttnStep && a.attn_ns <= 0) continue;
      if (a.deps && tid == 0 && prev >= 0)
        while (load_acquire_gpu(a.done + prev) < a.epoch * static_cast<unsigned>(grid)) {
        }
      prev = l * kSteps + step;
      consumer_sync();
      if (step == kAttnStep) {  // the attention's latency on the critical path: blocks < 64 busy attn_ns
        if (tid == 0 && b < kAttnBlocks) {
          const uint64_t t0 = global_timer_ns();
          while (global_timer_ns() - t0 < static_cast<uint64_t>(a.attn_ns)) {
          }
        }
        consumer_sync();
        if (tid == 0) {
          __threadfence();
          atomicAdd(a.done + prev, 1u);
        }
        continue;
      }
      const int op = step == 0 ? 0 : step - 1;
      const OpShape s = op_shape(op);
      const int pages = s.K / kPageCols;
      const int u0 = unit_begin(s.units, b, grid), u1 = unit_begin(s.units, b + 1, grid);
      const float* in = op == 1 ? a.y0 : op == 3 ? a.h : a.x;
#pragma unroll 5  // K <= 6912: a thread's loads issued together, not one round trip each
      for (int i = tid * 4; i < s.K; i += kConsumers * 4)
        *reinterpret_cast<float4*>(xs + i) = __ldcg(reinterpret_cast<const float4*>(in + i));
      consumer_sync();
      for (int u = u0; u < u1; u += kUnitBatch, ++batches) {
        const int nb = min(kUnitBatch, u1 - u);  // units of this batch
        float acc[kUnitBatch];
#pragma unroll
        for (int j = 0; j < kUnitBatch; ++j) {
          acc[j] = 0.0f;
          if (j >= nb) continue;
          for (int p = 0; p < pages; ++p, ++n) {
            const int slot = static_cast<int>(n % S);
            mbar_wait(&full[slot], (n / S) & 1);
            const uint4 wv = *reinterpret_cast<const uint4*>(ring + slot * kPageElems + r * kPageCols + c * 8);
            acc[j] += dot_bf16x8_f32(wv, xs + p * kPageCols + c * 8);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
          for (int j = 0; j < kUnitBatch; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
        float (*rb)[kConsumerWarps] = red[batches & 1];
        if (lane == 0)
#pragma unroll
          for (int j = 0; j < kUnitBatch; ++j) rb[j][warp] = acc[j];
        consumer_sync();
        if (tid < kPageRows * nb) {  // row tid % 4 of unit u + tid / 4: the sum of its three warps
          const int j = tid / kPageRows, pr = tid % kPageRows, uj = u + j;
          const float v = (rb[j][3 * pr] + rb[j][3 * pr + 1]) + rb[j][3 * pr + 2];
          const int row = kPageRows * uj + pr;
          if (op == 0) {
            __stcg(a.y0 + row, v);
          } else if (op == 2) {
            if (pr < 2) {
              const float up = (rb[j][3 * (pr + 2)] + rb[j][3 * (pr + 2) + 1]) + rb[j][3 * (pr + 2) + 2];
              __stcg(a.h + 2 * uj + pr, silu_mul(v, up));
            }
          } else {
            __stcg(a.x + row, __ldcg(a.x + row) + v);
          }
        }
      }
      consumer_sync();  // every output of the op stored by this block
      if (tid == 0) {
        __threadfence();
        atomicAdd(a.done + prev, 1u);
      }
    }
}

// The plain chain: one launch per op, one warp per output (op 2: an output's gate and up rows).
__global__ void plain_op(int op, const T* __restrict__ w, float* x, float* y0, float* h) {
  const OpShape s = op_shape(op);
  const int outputs = op == 2 ? kI : s.rows;
  const int j = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= outputs) return;
  const float* in = op == 1 ? y0 : op == 3 ? h : x;
  auto dot = [&](int row) {
    float acc = 0.0f;
    for (int k = lane * 8; k < s.K; k += 256) {
      const uint4 wv = *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * s.K + k);
      acc += dot_bf16x8_f32(wv, in + k);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
  };
  const float v = dot(j);
  const float up = op == 2 ? dot(kI + j) : 0.0f;
  if (lane != 0) return;
  if (op == 0) y0[j] = v;
  else if (op == 2) h[j] = silu_mul(v, up);
  else x[j] += v;
}

// Uniform in [-scale, scale) from a hash of the index.
__global__ void fill_uniform(T* w, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t v = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    v ^= v >> 15;
    v *= 2246822519u;
    v ^= v >> 13;
    w[i] = __float2bfloat16((static_cast<float>(v >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
  }
}

// The tiled copy: page (l, u, p) = rows unit_row(op, u, 0..3), columns 768 p .. of layer l.
__global__ void tile_weights(int op, const T* __restrict__ w, T* __restrict__ tiles) {
  const OpShape s = op_shape(op);
  const int pages = s.K / kPageCols;
  const int64_t total = static_cast<int64_t>(kL) * s.units * pages * kPageElems / 8;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = v * 8, page = e / kPageElems;
    const int within = static_cast<int>(e % kPageElems), r = within / kPageCols, col = within % kPageCols;
    const int p = static_cast<int>(page % pages), u = static_cast<int>(page / pages % s.units);
    const int l = static_cast<int>(page / pages / s.units);
    const int64_t src = (static_cast<int64_t>(l) * s.rows + unit_row(op, u, r)) * s.K + p * kPageCols + col;
    *reinterpret_cast<uint4*>(tiles + e) = *reinterpret_cast<const uint4*>(w + src);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) return std::printf("{\"error\": \"needs Hopper (bulk copies)\"}\n"), 1;
  const int grid = prop.multiProcessorCount;
  int64_t weight_elems = 0, elems[4];
  for (int op = 0; op < 4; ++op) weight_elems += elems[op] = static_cast<int64_t>(kL) * op_shape(op).rows * op_shape(op).K;
  const double layer_bytes = 2.0 * static_cast<double>(weight_elems) / kL;
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"layer_mb\": %.2f, \"layers\": %d}\n", prop.name, grid,
              layer_bytes * 1e-6, kL);

  T *w[4], *tiles[4];
  for (int op = 0; op < 4; ++op) {
    CK(cudaMalloc(&w[op], elems[op] * sizeof(T)));
    CK(cudaMalloc(&tiles[op], elems[op] * sizeof(T)));
    fill_uniform<<<1024, 256>>>(w[op], elems[op], 1234u + 77u * op, 0.05f / std::sqrt(static_cast<float>(op_shape(op).K)));
    tile_weights<<<1024, 256>>>(op, w[op], tiles[op]);
  }
  CK(cudaGetLastError());
  float *x, *y0, *h, *x_ref;
  unsigned* done;
  CK(cudaMalloc(&x, kH * 4));
  CK(cudaMalloc(&x_ref, kH * 4));
  CK(cudaMalloc(&y0, kQkv * 4));
  CK(cudaMalloc(&h, kI * 4));
  CK(cudaMalloc(&done, kL * kSteps * sizeof(unsigned)));
  std::vector<float> x0(kH);
  for (int i = 0; i < kH; ++i) x0[i] = std::sin(0.37f * i) + 0.25f * std::cos(1.3f * i);
  auto reset_x = [&](float* dst) { CK(cudaMemcpy(dst, x0.data(), kH * 4, cudaMemcpyHostToDevice)); };

  // The plain chain: the reference result, and its time.
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto plain_chain = [&](float* xv) {
    for (int l = 0; l < kL; ++l)
      for (int op = 0; op < 4; ++op) {
        const OpShape s = op_shape(op);
        const int outputs = op == 2 ? kI : s.rows;
        plain_op<<<(outputs + 7) / 8, 256>>>(op, w[op] + static_cast<int64_t>(l) * s.rows * s.K, xv, y0, h);
      }
  };
  reset_x(x_ref);
  plain_chain(x_ref);
  CK(cudaDeviceSynchronize());
  std::vector<float> ref(kH);
  CK(cudaMemcpy(ref.data(), x_ref, kH * 4, cudaMemcpyDeviceToHost));
  const int iters = 20;
  {
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) plain_chain(x_ref);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1e3 * ms / iters / kL;
    std::printf("{\"test\": \"plain_chain\", \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", us, layer_bytes / us * 1e-6);
  }

  // One variant: its error after one launch from x0 (with dependencies), then iters launches timed.
  auto run_variant = [&](int slots, int tiled, int deps, int attn_ns) {
    const size_t smem = static_cast<size_t>(slots) * kPageElems * 2 + kI * 4;
    CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel, kThreads, smem));
    if (per_sm < 1) {
      std::printf("{\"test\": \"persistent\", \"slots\": %d, \"error\": \"does not fit an SM\"}\n", slots);
      return;
    }
    Args a{};
    for (int op = 0; op < 4; ++op) a.w[op] = w[op], a.tiles[op] = tiles[op];
    a.x = x, a.y0 = y0, a.h = h, a.done = done, a.slots = slots, a.tiled = tiled, a.deps = deps, a.attn_ns = attn_ns;
    CK(cudaMemset(done, 0, kL * kSteps * sizeof(unsigned)));
    unsigned epoch = 0;
    auto launch = [&] {
      a.epoch = ++epoch;
      void* params[] = {&a};
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(chain_kernel), dim3(grid), dim3(kThreads), params, smem,
                                     nullptr));
    };
    reset_x(x);
    launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> got(kH);
    CK(cudaMemcpy(got.data(), x, kH * 4, cudaMemcpyDeviceToHost));
    double err = 0, norm = 0;
    for (int i = 0; i < kH; ++i) {
      err = std::max(err, static_cast<double>(std::fabs(got[i] - ref[i])));
      norm = std::max(norm, static_cast<double>(std::fabs(ref[i])));
    }
    for (int i = 0; i < 2; ++i) launch();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1e3 * ms / iters / kL;
    std::printf(
        "{\"test\": \"persistent\", \"slots\": %d, \"layout\": \"%s\", \"deps\": %d, \"attn_ns\": %d, "
        "\"us_per_layer\": %.2f, \"tb_per_s\": %.3f, \"max_abs_err_over_max_abs\": %.2e}\n",
        slots, tiled ? "tiled" : "rows", deps, attn_ns, us, layer_bytes / us * 1e-6, deps ? err / norm : -1.0);
  };
  for (int slots : {8, 16, 32})
    for (int tiled : {0, 1})
      for (int deps : {1, 0}) run_variant(slots, tiled, deps, 0);
  // The attention's latency on the critical path (64 blocks busy between q/k/v and o; its bytes not
  // modelled): does the ring hide it?
  for (int attn_ns : {2000, 4000}) run_variant(32, 1, 1, attn_ns);
  return 0;
}
