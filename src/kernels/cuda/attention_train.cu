// TEMPORARY STUB (replaced by the real implementation).
#include "kernels/cuda/cuda_train_ops.h"

namespace kiln::cuda {

void attention_train_forward(CudaBackend& be, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal, float scale) {
  KILN_ASSERT(false && "attention_train_forward: not implemented yet");
}
void attention_train_backward(CudaBackend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor segment_ids, bool causal, float scale) {
  KILN_ASSERT(false && "attention_train_backward: not implemented yet");
}

}  // namespace kiln::cuda
