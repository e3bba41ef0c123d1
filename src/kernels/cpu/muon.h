// The CPU twin of ops::muon_step (kernels/train_ops.h): f32 throughout, Newton-Schulz as OpenBLAS
// sgemm calls. Declared apart from cpu_train_ops.h so that the Muon kernels live in their own files.
#pragma once

#include <vector>

#include "kernels/train_ops.h"

namespace kiln::cpu {

void muon_step(Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<ops::MuonMatrix>& matrices, const ops::MuonStep& s);

}  // namespace kiln::cpu
