// TEMPORARY STUB (replaced by the real implementation).
#include "kernels/cpu/cpu_train_ops.h"

namespace kiln::cpu {

void attention_train_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids, bool causal, float scale) {
  KILN_ASSERT(false && "attention_train_forward: not implemented yet");
}
void attention_train_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor segment_ids, bool causal, float scale) {
  KILN_ASSERT(false && "attention_train_backward: not implemented yet");
}

}  // namespace kiln::cpu
