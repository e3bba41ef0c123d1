// The CUDA twin of ops::muon_step (kernels/train_ops.h): elementwise kernels for the momentum and
// the update, Newton-Schulz as bf16 cuBLASLt GEMMs with f32 accumulation, on the backend's stream.
// Declared apart from cuda_train_ops.h so that the Muon kernels live in their own files.
#pragma once

#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/train_ops.h"

namespace kiln::cuda {

void muon_step(CudaBackend& be, Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<ops::MuonMatrix>& matrices, const ops::MuonStep& s);

}  // namespace kiln::cuda
