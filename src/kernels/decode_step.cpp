// Dispatch of the decode-step kernel (kernels/decode_step.h): CUDA only; elsewhere the transformer
// runs its separate ops, which are the kernel's reference.
#include "kernels/decode_step.h"

#ifdef KILN_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace kiln::ops {

bool decode_step_available(Backend& be, const DecodeStepShape& shape, DType dtype) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::decode_step_available(static_cast<CudaBackend&>(be), shape, dtype);
#endif
  (void)be, (void)shape, (void)dtype;
  return false;
}

bool decode_step_takes(int64_t T, int64_t R, const AttentionBounds& b) {
  return T >= 1 && T <= kDecodeStepMaxRows && R >= 1 && R <= kDecodeStepMaxRows && b.max_q_len == 1 && b.batch >= 1 &&
         b.batch <= kDecodeStepMaxRows && b.max_kv_len >= 1;
}

int64_t decode_step_scratch_bytes(Backend& be, const DecodeStepShape& shape) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::decode_step_scratch_bytes(static_cast<CudaBackend&>(be), shape);
#endif
  (void)be, (void)shape;
  return 0;
}

Result<TensorBuffer> decode_step_tensor_maps(Backend& be, const DecodeStepModel& model) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::decode_step_tensor_maps(static_cast<CudaBackend&>(be), model);
#endif
  (void)model;
  return unsupported("the decode-step kernel runs on CUDA only");
}

void decode_step_forward(Backend& be, const DecodeStepModel& model, const DecodeStepIo& io) {
#ifdef KILN_WITH_CUDA
  if (be.device().is_cuda()) return cuda::decode_step_forward(static_cast<CudaBackend&>(be), model, io);
#endif
  (void)model, (void)io;
  KILN_ASSERT(!"decode_step_forward: no kernel on this backend (check decode_step_takes)");
}

}  // namespace kiln::ops
