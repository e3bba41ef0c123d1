// What a launch per projection can reach at one batch row, without kiln's kernels: the astrai-1b
// projections (q/k/v 2048x1536, o 1536x1536, gate/up 13824x1536, down 1536x6912) over 24 layers'
// weights, each a plain GEMV (one warp per weight row, all of a warp's loads for its R rows issued
// before the programmatic wait, the row in shared memory, a shuffle sum; no norm, no epilogue),
// graph-replayed with and without programmatic dependent launch. Compare with `bench_linear --rows 1`
// in the same run. Prints one JSON object per line: us per layer and TB/s of the weights for a plain
// read of every matrix, each kind alone (24 launches), the chain of the four (96 launches), gate/up
// at other rows per warp / warps per block, the load pattern (rows per warp load instruction), and
// fixed grids walking the rows.
// Usage: bench_gemv_floor (no arguments; Hopper or later for programmatic launch).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/mma_util.cuh"  // ldg_stream

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

using T = __nv_bfloat16;

using kiln::cuda::ldg_stream;

__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// A warp's R weight rows from row r0 (K = 256 * CH: lane l the 16-byte chunks l, l + 32, ...; rows
// past N as zeros), all CH * R loads in flight.
template <int CH, int R>
__device__ __forceinline__ void load_rows(uint4 (&d)[R][CH], const T* __restrict__ w, int r0, int N, int lane) {
  constexpr int K = 256 * CH;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int c = 0; c < CH; ++c)
      d[r][c] = r0 + r < N ? ldg_stream(w + static_cast<int64_t>(r0 + r) * K + (c * 32 + lane) * 8)
                           : make_uint4(0, 0, 0, 0);
}

// After the programmatic wait (when pdl): the batch row into shared memory.
template <int CH, int WARPS>
__device__ __forceinline__ void stage_row(uint4* xs, const T* __restrict__ x, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = threadIdx.x; i < 32 * CH; i += WARPS * 32) xs[i] = reinterpret_cast<const uint4*>(x)[i];
  __syncthreads();
}

// y[r0 + r] = the warp's rows dotted with the staged row, summed over the lanes.
template <int CH, int R>
__device__ __forceinline__ void store_sums(T* __restrict__ y, const uint4 (&d)[R][CH], const uint4* xs, int r0, int N,
                                           int lane) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) s += dot8(d[r][c], xs[c * 32 + lane]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && r0 + r < N) y[r0 + r] = __float2bfloat16(s);
  }
}

// y[n] = W[n, :] . x, K = 256 * CH. Each warp: R rows at a time, all CH * R loads in flight.
template <int CH, int R, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gemv(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                                                   int N, int pdl) {
  __shared__ uint4 xs[32 * CH];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * WARPS + warp) * R;
  uint4 wv[R][CH];
  load_rows<CH, R>(wv, w, row0, N, lane);
  stage_row<CH, WARPS>(xs, x, pdl);
  store_sums<CH, R>(y, wv, xs, row0, N, lane);
}

// The same GEMV with a fixed grid (blocks per SM x SMs); each warp walks its rows R at a time with the
// next group's loads issued before the current group's sums (register double buffer).
template <int CH, int R, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gemv_persist(T* __restrict__ y, const T* __restrict__ x,
                                                           const T* __restrict__ w, int N, int pdl) {
  __shared__ uint4 xs[32 * CH];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int stride = gridDim.x * WARPS * R;
  int row0 = (blockIdx.x * WARPS + warp) * R;
  uint4 wv[2][R][CH];
  load_rows<CH, R>(wv[0], w, row0, N, lane);
  stage_row<CH, WARPS>(xs, x, pdl);
  while (row0 < N) {
    if (row0 + stride < N) load_rows<CH, R>(wv[1], w, row0 + stride, N, lane);
    store_sums<CH, R>(y, wv[0], xs, row0, N, lane);
    row0 += stride;
    if (row0 >= N) break;
    if (row0 + stride < N) load_rows<CH, R>(wv[0], w, row0 + stride, N, lane);
    store_sums<CH, R>(y, wv[1], xs, row0, N, lane);
    row0 += stride;
  }
}

// The load pattern alone (K = 1536, 8 weight rows a warp, all 48 loads a lane in flight before the
// wait): each warp load instruction covers RPI rows of 512 / RPI contiguous bytes (1: one row of 512
// bytes, lanes l the chunks l, l + 32, ..; 8: eight rows of 64 bytes, the layout of the tensor-core
// small-batch kernel's mma fragments, lanes 4g + t rows g at chunks 4c + t).
template <int RPI, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gemv_pattern(T* __restrict__ y, const T* __restrict__ x,
                                                           const T* __restrict__ w, int N, int pdl) {
  constexpr int K = 1536, LPR = 32 / RPI, G = 8 / RPI, C = K / 8 / LPR;
  __shared__ uint4 xs[K / 8];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rr = lane / LPR, pos = lane % LPR;
  const int row_base = (blockIdx.x * WARPS + warp) * 8;
  uint4 wv[G][C];
#pragma unroll
  for (int j = 0; j < G; ++j)
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int row = row_base + j * RPI + rr;
      wv[j][c] = row < N ? ldg_stream(w + static_cast<int64_t>(row) * K + (c * LPR + pos) * 8) : make_uint4(0, 0, 0, 0);
    }
  stage_row<K / 256, WARPS>(xs, x, pdl);
#pragma unroll
  for (int j = 0; j < G; ++j) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c) s += dot8(wv[j][c], xs[c * LPR + pos]);
#pragma unroll
    for (int o = LPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const int row = row_base + j * RPI + rr;
    if (pos == 0 && row < N) y[row] = __float2bfloat16(s);
  }
}

// Reads n uint4 (grid-stride), one sum per block: the plain DRAM read rate.
__global__ void read_all(const uint4* __restrict__ p, int64_t n, float* out) {
  float s = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint4 v = p[i];
    s += __uint_as_float(v.x) + __uint_as_float(v.w);
  }
  if (s == 1.2345f) out[0] = s;
}

// kernel<<<blocks, threads>>>(y, x, w, N, pdl) on st, with programmatic stream serialization when pdl.
void launch_on(cudaStream_t st, void (*kernel)(T*, const T*, const T*, int, int), int blocks, int threads, T* y,
               const T* x, const T* w, int N, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, kernel, y, x, w, N, pdl ? 1 : 0));
}

// gemv over all N rows in one grid.
template <int CH, int R, int WARPS>
void launch(cudaStream_t st, T* y, const T* x, const T* w, int N, bool pdl) {
  launch_on(st, gemv<CH, R, WARPS>, (N + WARPS * R - 1) / (WARPS * R), WARPS * 32, y, x, w, N, pdl);
}

// gemv_persist on a grid of `blocks`.
template <int CH, int R, int WARPS>
void launch_persist(cudaStream_t st, T* y, const T* x, const T* w, int N, int blocks, bool pdl) {
  launch_on(st, gemv_persist<CH, R, WARPS>, blocks, WARPS * 32, y, x, w, N, pdl);
}

struct Kind {
  const char* name;
  int N, K;
};

int main() {
  const int L = 24;
  const Kind kinds[4] = {{"qkv", 2048, 1536}, {"o", 1536, 1536}, {"gate_up", 13824, 1536}, {"down", 1536, 6912}};
  std::vector<T*> wts(4 * L);
  int64_t total = 0;
  for (int l = 0; l < L; ++l)
    for (int k = 0; k < 4; ++k) {
      const int64_t n = (int64_t)kinds[k].N * kinds[k].K;
      CK(cudaMalloc(&wts[4 * l + k], n * 2));
      CK(cudaMemset(wts[4 * l + k], 0x3c, n * 2));  // small finite bf16 values
      total += n * 2;
    }
  T *xa, *xb;
  CK(cudaMalloc(&xa, 16 * 6912 * 2));
  CK(cudaMalloc(&xb, 16 * 13824 * 2));
  CK(cudaMemset(xa, 0x3c, 16 * 6912 * 2));
  CK(cudaMemset(xb, 0x3c, 16 * 13824 * 2));
  float* dummy;
  CK(cudaMalloc(&dummy, 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"weights_mb\": %.1f}\n", prop.name, prop.multiProcessorCount,
              total / 1e6);

  auto time_graph = [&](auto&& body) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 25; ++r) {
      CK(cudaEventRecord(a, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(b, st));
      CK(cudaEventSynchronize(b));
      float m;
      CK(cudaEventElapsedTime(&m, a, b));
      if (r > 2) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms[ms.size() / 2] * 1e3;  // us
  };

  // The DRAM rate: one read of each layer's weights per kind (same bytes as the chain), 24 x 4 reads.
  {
    const double us = time_graph([&] {
      for (int i = 0; i < 4 * L; ++i) {
        const int k = i % 4;
        read_all<<<prop.multiProcessorCount * 4, 512, 0, st>>>(reinterpret_cast<const uint4*>(wts[i]),
                                                               (int64_t)kinds[k].N * kinds[k].K / 8, dummy);
      }
    });
    std::printf("{\"test\": \"read_all_per_matrix\", \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", us / L,
                total / us / 1e6);
  }
  // The projections, each kind alone and chained, with and without programmatic launch.
  auto run_kind = [&](int k, int l, bool pdl, const T* x, T* y) {
    T* w = wts[4 * l + k];
    switch (k) {
      case 0: return launch<6, 1, 8>(st, y, x, w, kinds[k].N, pdl);
      case 1: return launch<6, 1, 8>(st, y, x, w, kinds[k].N, pdl);
      case 2: return launch<6, 2, 8>(st, y, x, w, kinds[k].N, pdl);
      default: return launch<27, 1, 4>(st, y, x, w, kinds[k].N, pdl);
    }
  };
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (int k = 0; k < 4; ++k) {
      const double us = time_graph([&] {
        for (int l = 0; l < L; ++l) run_kind(k, l, pdl, xa, xb);
      });
      const double bytes = 2.0 * kinds[k].N * kinds[k].K;
      std::printf("{\"test\": \"%s\", \"pdl\": %d, \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", kinds[k].name, pdl,
                  us / L, bytes / (us / L) / 1e6);
    }
    const double us = time_graph([&] {
      for (int l = 0; l < L; ++l)
        for (int k = 0; k < 4; ++k) run_kind(k, l, pdl, k % 2 ? xb : xa, k % 2 ? xa : xb);
    });
    std::printf("{\"test\": \"chain\", \"pdl\": %d, \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", pdl, us / L,
                total / us / 1e6);
  }
  // Variants of gate/up: rows per warp and warps per block.
  for (int v = 0; v < 4; ++v) {
    const double us = time_graph([&] {
      for (int l = 0; l < L; ++l) {
        T* w = wts[4 * l + 2];
        if (v == 0) launch<6, 1, 8>(st, xb, xa, w, 13824, true);
        if (v == 1) launch<6, 4, 8>(st, xb, xa, w, 13824, true);
        if (v == 2) launch<6, 2, 4>(st, xb, xa, w, 13824, true);
        if (v == 3) launch<6, 4, 4>(st, xb, xa, w, 13824, true);
      }
    });
    std::printf("{\"test\": \"gate_up_variant\", \"v\": %d, \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", v, us / L,
                2.0 * 13824 * 1536 / (us / L) / 1e6);
  }

  // The load pattern: gate/up and q/k/v with 1, 4 and 8 rows per warp load instruction.
  for (int k : {2, 0}) {
    for (int rpi : {1, 4, 8}) {
      const int N = kinds[k].N, blocks = (N + 31) / 32;
      const double us = time_graph([&] {
        for (int l = 0; l < L; ++l) {
          T* w = wts[4 * l + k];
          if (rpi == 1) launch_on(st, gemv_pattern<1, 4>, blocks, 128, xb, xa, w, N, true);
          if (rpi == 4) launch_on(st, gemv_pattern<4, 4>, blocks, 128, xb, xa, w, N, true);
          if (rpi == 8) launch_on(st, gemv_pattern<8, 4>, blocks, 128, xb, xa, w, N, true);
        }
      });
      std::printf("{\"test\": \"load_pattern\", \"kind\": \"%s\", \"rows_per_load\": %d, \"us_per_layer\": %.2f, "
                  "\"tb_per_s\": %.3f}\n", kinds[k].name, rpi, us / L, 2.0 * N * 1536 / (us / L) / 1e6);
    }
  }

  // Fixed grids walking the rows, double-buffered: gate/up at 1 / 2 blocks per SM, then the chain.
  const int sms = prop.multiProcessorCount;
  for (int v = 0; v < 4; ++v) {
    const double us = time_graph([&] {
      for (int l = 0; l < L; ++l) {
        T* w = wts[4 * l + 2];
        if (v == 0) launch_persist<6, 1, 8>(st, xb, xa, w, 13824, sms, true);
        if (v == 1) launch_persist<6, 1, 8>(st, xb, xa, w, 13824, 2 * sms, true);
        if (v == 2) launch_persist<6, 2, 8>(st, xb, xa, w, 13824, sms, true);
        if (v == 3) launch_persist<6, 1, 16>(st, xb, xa, w, 13824, sms, true);
      }
    });
    std::printf("{\"test\": \"gate_up_persist\", \"v\": %d, \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", v, us / L,
                2.0 * 13824 * 1536 / (us / L) / 1e6);
  }
  {
    const double us = time_graph([&] {
      for (int l = 0; l < L; ++l) {
        launch_persist<6, 1, 8>(st, xb, xa, wts[4 * l], 2048, sms, true);
        launch_persist<6, 1, 8>(st, xa, xb, wts[4 * l + 1], 1536, sms, true);
        launch_persist<6, 1, 8>(st, xb, xa, wts[4 * l + 2], 13824, 2 * sms, true);
        launch<27, 1, 4>(st, xa, xb, wts[4 * l + 3], 1536, true);
      }
    });
    std::printf("{\"test\": \"chain_persist\", \"us_per_layer\": %.2f, \"tb_per_s\": %.3f}\n", us / L,
                total / us / 1e6);
  }
  return 0;
}
