// The ops of kernels/step_io.h, dispatched to their twins: kernels/cpu/step_io.cpp (stage_step_inputs;
// publishing is a plain copy there) and kernels/cuda/step_io.cu.
#include "kernels/step_io.h"

#include "kernels/cpu/cpu_ops.h"

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
  KILN_ASSERT(be.device().is_cpu());
  cpu::stage_step_inputs(dst, host, ids_begin, ids_count, prev_tokens);
}

void publish_step_outputs(Backend& be, Tensor host, Tensor src) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::publish_step_outputs(static_cast<CudaBackend&>(be), host, src);
#endif
  KILN_ASSERT(host.numel() == src.numel() && dtype_size(host.dtype) == 4 && dtype_size(src.dtype) == 4);
  be.copy(host, src);  // the CPU: host memory on both sides
}

}  // namespace ops
}  // namespace kiln
