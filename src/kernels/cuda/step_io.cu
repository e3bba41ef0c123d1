// A step's inputs and outputs between pinned host memory and the device, as kernels
// (kernels/step_io.h), so that a captured decode step carries its own transfers: no copy runs
// between two replays (only the step's events).
// Pinned host memory (cudaMallocHost) is mapped into the device's address space under unified
// addressing, so the kernels read and write it through the host pointer; reads cross PCIe (a round
// trip of about a microsecond), writes are posted.
#include "backend/cuda_backend.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 32;

// dst[w] = host[w] for w < n = host[0], four words a thread at a time (the last n % 4 singly); an
// id below zero in [ids_begin, ids_begin + ids_count) becomes prev_tokens[-1 - id]. Each thread's
// first four words (up to `expected`) are read together with word 0, so that a step of up to
// kMaxBlocks * kThreads * 4 words crosses PCIe once; the rest once n is known. The first kernel
// of a step, launched plainly (it overwrites what the step before read). It never lets its
// dependents launch early: the step's kernels read its outputs (page tables, indptr arrays) before
// their programmatic wait (attention_decode.cu), so none may start before it has completed; the
// fence makes its writes visible to them when it has.
__global__ void __launch_bounds__(kThreads)
    stage_inputs_kernel(int32_t* __restrict__ dst, const int32_t* __restrict__ host, int64_t capacity,
                        int64_t expected, int64_t ids_begin, int64_t ids_count, const int32_t* __restrict__ prev,
                        int64_t n_prev) {
  __shared__ int64_t n_words;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool early = q0 < min(expected, capacity) / 4;
  const int4 first = early ? reinterpret_cast<const int4*>(host)[q0] : make_int4(0, 0, 0, 0);
  if (threadIdx.x == 0) n_words = max(int64_t(0), min(static_cast<int64_t>(host[0]), capacity));
  __syncthreads();
  const int64_t n = n_words;
  auto resolve = [&](int64_t w, int32_t v) {
    if (v >= 0 || w < ids_begin || w >= ids_begin + ids_count) return v;
    const int64_t r = -1 - static_cast<int64_t>(v);
    return r < n_prev ? prev[r] : 0;
  };
  const int64_t groups = n / 4;
  for (int64_t q = q0; q < groups + (n % 4); q += static_cast<int64_t>(gridDim.x) * kThreads) {
    if (q < groups) {
      int4 v = q == q0 && early ? first : reinterpret_cast<const int4*>(host)[q];
      v.x = resolve(4 * q, v.x), v.y = resolve(4 * q + 1, v.y), v.z = resolve(4 * q + 2, v.z), v.w = resolve(4 * q + 3, v.w);
      reinterpret_cast<int4*>(dst)[q] = v;
    } else {
      const int64_t w = 4 * groups + (q - groups);
      dst[w] = resolve(w, host[w]);
    }
  }
  __threadfence();
}

// host[w] = src[w] for w < n. Launched programmatically: waits for the kernel that wrote src.
__global__ void __launch_bounds__(kThreads)
    publish_outputs_kernel(int32_t* __restrict__ host, const int32_t* __restrict__ src, int64_t n) {
  hopper::grid_dependency_wait();
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < n;
       w += static_cast<int64_t>(gridDim.x) * kThreads)
    host[w] = src[w];
}

}  // namespace

void stage_step_inputs(CudaBackend& be, Tensor dst, Tensor host, int64_t expected_words, int64_t ids_begin,
                       int64_t ids_count, Tensor prev_tokens) {
  detail::check_i32(be, dst);
  detail::check_i32(be, prev_tokens);
  KILN_ASSERT(host.dtype == DType::i32 && host.device.is_cpu() && host.data != nullptr);
  KILN_ASSERT(host.numel() % 4 == 0 && dst.numel() >= host.numel() && host.numel() > 0);
  KILN_ASSERT(detail::aligned16(host.data) && detail::aligned16(dst.data));
  KILN_ASSERT(ids_begin >= 0 && ids_count >= 0 && ids_begin + ids_count <= host.numel());
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, detail::ceil_div(host.numel() / 4, kThreads)));
  stage_inputs_kernel<<<blocks, kThreads, 0, detail::stream_of(be)>>>(
      dst.ptr<int32_t>(), host.ptr<const int32_t>(), host.numel(), expected_words, ids_begin, ids_count,
      prev_tokens.ptr<const int32_t>(), prev_tokens.numel());
  KILN_CUDA_CHECK_LAUNCH();
}

void publish_step_outputs(CudaBackend& be, Tensor host, Tensor src) {
  KILN_ASSERT(src.numel() == host.numel() && dtype_size(src.dtype) == 4 && dtype_size(host.dtype) == 4);
  KILN_ASSERT(src.device == be.device() && host.device.is_cpu() && host.data != nullptr);
  const int64_t n = src.numel();
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, detail::ceil_div(n, kThreads)));
  detail::launch_programmatic(be, publish_outputs_kernel, dim3(blocks), dim3(kThreads), 0, dim3(1),
                              static_cast<int32_t*>(host.data), static_cast<const int32_t*>(src.data), n);
}

}  // namespace kiln::cuda
