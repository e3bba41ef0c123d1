// What the CUDA training attention files share (the design is described at the top of
// attention_train.cu): attention_train.cu (entry points, input checks, segment summaries, backward
// prep, dQ conversion, the choice of path), attention_train_bwd.cu (the wgmma backward main kernel)
// and attention_train_generic.cu (the generic per-row kernels). It holds the call's sizes, the
// constants and device helpers used in more than one of them, and the launchers each file exports.
// Included by those files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "core/tensor.h"
#include "kernels/cuda/attention_kernels.cuh"

namespace kiln::cuda::attn_train {

using bf16 = __nv_bfloat16;

// The backward's lse2 / delta / dQ-accumulator scratch rows per query head, S_pad, are S rounded up
// to a multiple of kSeqPad, itself a multiple of the backward kernel's and the dQ conversion's
// 64-query blocks.
constexpr int kSeqPad = 128;
// Pairs of dims per lane of the generic kernels: they take any even D <= 2 * 32 * kMaxPairs.
constexpr int kMaxPairs = 4;

// The sizes of a call: q [B, Hq, S, D]; k, v [B, Hkv, S, D].
struct Geometry {
  int B = 0, Hq = 0, Hkv = 0, S = 0, D = 0;
};

// Pairs of elements as float2 (backward prep, dQ conversion, generic kernels): the inference
// attention kernels' helpers.
using attn::load2;
using attn::store2;

// attention_train_bwd.cu: the wgmma backward main kernel (bf16, D = 64 or 128, a device with wgmma)
// for tensor-core variant 1 or 3: dk, dv, and dQ added into the zeroed f32 accumulator dq_acc
// ([B, Hq, S_pad, D], in the permuted layout that attn_train_dq_convert_tiles_kernel undoes).
void launch_bwd_wgmma(CudaBackend& be, const Geometry& g, int variant, Tensor dk, Tensor dv, float* dq_acc, Tensor q,
                      Tensor k, Tensor v, Tensor dout, const float* lse2, const float* delta, const int* seg,
                      const int4* ranges, int n_gran, int S_pad, bool causal, float sl, float scale);

// attention_train_generic.cu: the generic path in q's dtype (f32, bf16 or f16). The forward writes
// out and lse; the backward dq, dk and dv from the prep kernel's lse2 and delta.
void launch_fwd_generic(CudaBackend& be, const Geometry& g, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                        const int* seg, bool causal, float sl);
void launch_bwd_generic(CudaBackend& be, const Geometry& g, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                        Tensor k, Tensor v, const float* lse2, const float* delta, const int* seg, int S_pad,
                        bool causal, float sl, float scale);

}  // namespace kiln::cuda::attn_train
