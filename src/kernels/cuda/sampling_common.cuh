// Internal to the CUDA sampler (kernels/cuda/sampling.cu, sampling_logprobs.cu): the block shape,
// the order of (value, index) pairs with its warp and block argmax, and the log-prob launch.
#pragma once

#include <cstdint>

#include "backend/cuda_backend.h"
#include "kernels/sampling_math.h"

namespace kiln::cuda::sampler {

constexpr int kThreads = sampling::kBlockThreads;  // one block per row
constexpr unsigned kFull = 0xffffffffu;

struct ArgMax {
  float v;
  int32_t i;
};
// a comes before b in the order (value descending, ties by lower index).
__device__ __forceinline__ bool before(ArgMax a, ArgMax b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) { return before(b, a) ? b : a; }

__device__ __forceinline__ ArgMax warp_argmax(ArgMax x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    x = better(x, ArgMax{__shfl_xor_sync(kFull, x.v, o), __shfl_xor_sync(kFull, x.i, o)});
  return x;
}
// Every thread of a kThreads block gets the first element of the order among the block's x.
// smem: 32 entries, reusable by the next call.
__device__ __forceinline__ ArgMax block_argmax(ArgMax x, ArgMax* smem) {
  static_assert(kThreads == 1024, "one entry per warp fills a warp");
  x = warp_argmax(x);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  return warp_argmax(smem[lane]);
}

// The log-probabilities of the rows of `s` that ask (after the tokens are written), with the
// top-N candidates in each row's part of the workspace (sampling::row_workspace_bytes).
void launch_logprobs(CudaBackend& be, const ops::SamplingBatch& s, char* workspace, int64_t row_bytes);

}  // namespace kiln::cuda::sampler
