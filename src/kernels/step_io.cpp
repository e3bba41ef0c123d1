#include "kernels/step_io.h"

#include <algorithm>
#include <cstring>

#ifdef KILN_WITH_CUDA
#include "backend/cuda_backend.h"
#endif

namespace kiln {
#ifdef KILN_WITH_CUDA
namespace cuda {  // kernels/cuda/step_io.cu
void stage_step_inputs(CudaBackend& be, Tensor dst, Tensor host, int64_t expected_words, int64_t ids_begin,
                       int64_t ids_count, Tensor prev_tokens);
void publish_step_outputs(CudaBackend& be, Tensor host, Tensor src);
}  // namespace cuda
#endif

namespace ops {

void stage_step_inputs(Backend& be, Tensor dst, Tensor host, int64_t expected_words, int64_t ids_begin,
                       int64_t ids_count, Tensor prev_tokens) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda())
    return cuda::stage_step_inputs(static_cast<CudaBackend&>(be), dst, host, expected_words, ids_begin, ids_count,
                                   prev_tokens);
#endif
  (void)expected_words;  // a hint for the device's reads
  // The CPU twin: host memory on both sides.
  KILN_ASSERT(be.device().is_cpu() && dst.device.is_cpu() && host.device.is_cpu() && prev_tokens.device.is_cpu());
  KILN_ASSERT(dst.dtype == DType::i32 && host.dtype == DType::i32 && prev_tokens.dtype == DType::i32);
  KILN_ASSERT(host.numel() > 0 && dst.numel() >= host.numel());
  KILN_ASSERT(ids_begin >= 0 && ids_count >= 0 && ids_begin + ids_count <= host.numel());
  const int32_t* src = host.ptr<const int32_t>();
  int32_t* out = dst.ptr<int32_t>();
  const int64_t n = std::clamp<int64_t>(src[0], 0, host.numel());
  std::memcpy(out, src, static_cast<size_t>(n) * 4);
  const int32_t* prev = prev_tokens.ptr<const int32_t>();
  for (int64_t w = ids_begin; w < std::min(n, ids_begin + ids_count); ++w) {
    if (out[w] >= 0) continue;
    const int64_t r = -1 - static_cast<int64_t>(out[w]);
    out[w] = r < prev_tokens.numel() ? prev[r] : 0;
  }
}

void publish_step_outputs(Backend& be, Tensor host, Tensor src) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::publish_step_outputs(static_cast<CudaBackend&>(be), host, src);
#endif
  KILN_ASSERT(be.device().is_cpu() && host.device.is_cpu() && src.device.is_cpu() && host.numel() == src.numel());
  KILN_ASSERT(dtype_size(host.dtype) == 4 && dtype_size(src.dtype) == 4);
  if (host.numel() > 0) std::memcpy(host.data, src.data, static_cast<size_t>(host.numel()) * 4);
}

}  // namespace ops
}  // namespace kiln
