// TEMPORARY STUB (replaced by the real implementation).
#include "kernels/cuda/cuda_train_ops.h"

namespace kiln::cuda {

void cross_entropy_forward_backward(CudaBackend& be, Tensor logits, Tensor losses, Tensor logprobs, Tensor targets, float label_smoothing, float grad_scale, bool write_grad) {
  KILN_ASSERT(false && "cross_entropy_forward_backward: not implemented yet");
}
void adamw_step(CudaBackend& be, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const ops::AdamWStep& s) {
  KILN_ASSERT(false && "adamw_step: not implemented yet");
}
void sgd_step(CudaBackend& be, Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay, float grad_scale, int64_t decay_end) {
  KILN_ASSERT(false && "sgd_step: not implemented yet");
}
double sum_squares(CudaBackend& be, Tensor x) {
  KILN_ASSERT(false && "sum_squares: not implemented yet");
  return 0;
}

}  // namespace kiln::cuda
