// The combine pass of the split-KV decode kernel (attention_decode.cu): the splits' partial
// outputs weighted by their log-sum-exps, per query row and head.
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/hopper_util.cuh"

namespace kiln::cuda::attn {
namespace {

// Merges the splits of the decode kernel: one block per (request, query row, head); warp w sums
// splits w, w+4, ... (independent loads in flight), then the warps' sums are added.
// Launched after the decode kernel has finished, not programmatically: early, its blocks sat
// resident under the decode kernel and, by letting their own dependents launch at once, let the
// o projection and the kernels after it start their weight streams under the decode kernel too,
// competing with its reads of the cache. Measured (bench_decode_step, ms per step, one call, two
// alternations): astrai-1b 1K B = 1 / 2 / 4 / 8 / 16 / 24 0.918 / 0.953 / 1.027 / 1.039 / 1.337 /
// 1.500 programmatic against 0.912 / 0.924 / 0.968 / 1.027 / 1.315 / 1.477 plain, 30K B = 1 / 4 / 8
// 1.192 / 1.800 / 2.387 against 1.128 / 1.751 / 2.346; llama-1b 1K B = 2 / 4 / 8 0.965 / 0.991 /
// 1.027 against 0.948 / 0.970 / 1.017, 30K equal within 0.6%. Its launch_dependents still lets the
// o projection, launched programmatically, start under it; its wait returns at once.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_combine_kernel(T* __restrict__ out, const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        const int* __restrict__ q_indptr, int Hq, int max_q_len, int num_splits) {
  constexpr int PER = D / 32;  // dims per lane
  __shared__ float sm_w[kDecodeMaxSplits];
  __shared__ __align__(16) float sm_o[kWarps][D];
  __shared__ float sm_red[2][kWarps];
  hopper::launch_dependents();
  hopper::grid_dependency_wait();
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
  // The partial outputs of this warp's first kPrefetch splits are loaded before their weights are
  // known (they do not depend on them), so that their latency overlaps the lse loads and reductions
  // (same sums in the same order; measured in one call, B=1 at 1K: astrai-1b 1.025 -> 1.007 ms per
  // step, llama-1b 0.941 -> 0.930; B=8 at 30K 0.5% slower).
  constexpr int kPrefetch = 8;
  using Part = std::conditional_t<PER == 2, float2, float4>;
  Part pre[kPrefetch];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int s = warp + k * kWarps;
    pre[k] = s < num_splits ? *reinterpret_cast<const Part*>(part_o + (base + s) * D + lane * PER) : Part{};
  }

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
  auto accumulate = [&](float w, const Part& v) {  // empty splits hold zeros in part_o: no branch
    if constexpr (PER == 2) {
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
    } else {
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
      o[2] = fmaf(w, v.z, o[2]);
      o[3] = fmaf(w, v.w, o[3]);
    }
  };
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int s = warp + k * kWarps;
    if (s < num_splits) accumulate(sm_w[s], pre[k]);
  }
#pragma unroll(PER == 2 ? 8 : 4)
  for (int s = warp + kPrefetch * kWarps; s < num_splits; s += kWarps)
    accumulate(sm_w[s], *reinterpret_cast<const Part*>(part_o + (base + s) * D + lane * PER));
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

}  // namespace

template <typename T>
void launch_decode_combine(CudaBackend& be, T* out, const float* part_o, const float* part_lse, const int* q_indptr,
                           int B, int max_q_len, int Hq, int D, int splits) {
  KILN_ASSERT(splits >= 1 && splits <= kDecodeMaxSplits && (D == 64 || D == 128));
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(B) * max_q_len * Hq);
  // A plain launch: its blocks start once the decode kernel has finished (attn_combine_kernel says
  // why not earlier).
  auto kernel = D == 64 ? attn_combine_kernel<T, 64> : attn_combine_kernel<T, 128>;
  kernel<<<blocks, kThreads, 0, be.stream()>>>(out, part_o, part_lse, q_indptr, Hq, max_q_len, splits);
  CUDA_CHECK(cudaGetLastError());
}

template void launch_decode_combine<__nv_bfloat16>(CudaBackend&, __nv_bfloat16*, const float*, const float*,
                                                   const int*, int, int, int, int, int);
template void launch_decode_combine<__half>(CudaBackend&, __half*, const float*, const float*, const int*, int, int,
                                            int, int, int);

}  // namespace kiln::cuda::attn
