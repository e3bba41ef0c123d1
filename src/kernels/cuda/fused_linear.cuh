// What the two small-batch linear kernels share (fused_linear.cu: tensor-core tiles of 16 weight rows
// for 2 to 32 batch rows; fused_linear_rows.cu: one warp per weight row for a single batch row):
// the epilogues and where the q/k/v epilogue writes. Internal to the CUDA kernels.
#pragma once

#include <cstdint>

#include "backend/cuda_backend.h"
#include "core/dtype.h"

namespace kiln::cuda::fused {

enum class Epilogue { store, add_residual, swiglu, qkv_rope };

// Where the qkv_rope epilogue puts the attention block's inputs (ops.h: norm_linear_qkv_rope_forward):
// q [M, Hq, D], the key and value caches [S, Hkv, D] at each row's slot (a negative slot: not
// written), all of dtype dt; the rotation's positions [M] and frequencies [D / 2].
struct RopeOut {
  void* q = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  DType dt = DType::bf16;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const float* inv_freq = nullptr;
  float scaling = 1.0f;
  int Hq = 0, Hkv = 0, D = 0;
};

// One projection's operands: y (epilogue store / swiglu: [M, outputs] of y_dt; add_residual: the f32
// residual [M, N]); x [M, K] (f32 residual rows when normed, else of the weight dtype); w [N, K]
// bf16; norm weights [K] when normed; bias [N] of b_dt or null.
struct LinearArgs {
  void* y = nullptr;
  DType y_dt = DType::bf16;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* norm_w = nullptr;
  const void* bias = nullptr;
  DType b_dt = DType::bf16;
  int M = 0, N = 0, K = 0;
  float eps = 0.0f;
};

// The warp-per-row kernel (fused_linear_rows.cu) takes one row (M == 1) of K % 8 == 0 elements, the row
// in 40 KB of shared memory (K <= 20480); wider rows take the tensor-core kernel.
bool rows_kernel_valid(int64_t M, int64_t K);
void rows_kernel_launch(CudaBackend& be, Epilogue epi, bool norm, const LinearArgs& a, const RopeOut& rope);

}  // namespace kiln::cuda::fused
