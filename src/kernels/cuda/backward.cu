// TEMPORARY STUB (replaced by the real implementation).
#include "kernels/cuda/cuda_train_ops.h"

namespace kiln::cuda {

void rmsnorm_backward(CudaBackend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx) {
  KILN_ASSERT(false && "rmsnorm_backward: not implemented yet");
}
void swiglu_backward(CudaBackend& be, Tensor d_gate_up, Tensor dout, Tensor gate_up) {
  KILN_ASSERT(false && "swiglu_backward: not implemented yet");
}
void embedding_backward(CudaBackend& be, Tensor dtable, Tensor dy, Tensor ids) {
  KILN_ASSERT(false && "embedding_backward: not implemented yet");
}
void bias_backward(CudaBackend& be, Tensor db, Tensor dy) {
  KILN_ASSERT(false && "bias_backward: not implemented yet");
}
void qkv_split_rope_forward(CudaBackend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
  KILN_ASSERT(false && "qkv_split_rope_forward: not implemented yet");
}
void qkv_split_rope_backward(CudaBackend& be, Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv, Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
  KILN_ASSERT(false && "qkv_split_rope_backward: not implemented yet");
}

}  // namespace kiln::cuda
