// Internal hooks of the CUDA attention kernels (kernels/cuda/attention*.cu), for tests and
// benchmarks only; the model code goes through ops::attention_forward.
//
// The prefill (tensor-core, long query runs) path has three compiled variants (D = 64 / 128):
//   0  mma.sync m16n8k16, 4 warps x 32 query rows (D=128: 4 x 16), 64-key tiles, Q in registers
//      (the original kernel; the reference the others are checked against, and the fallback on
//      devices without wgmma, i.e. anything but sm_90)
//   1  Hopper wgmma, 1 warpgroup (BM=64), 128-key tiles (D=128: 64-key tiles), S wait -> softmax
//      -> PV wait per tile; overlap only across resident blocks (3 per SM for D=64, 2 for D=128)
//   2  the same wgmma kernel with 2 warpgroups sharing the K/V tiles (BM=128), 64-key tiles,
//      2 blocks per SM
// Defaults: D=64 -> 1, D=128 -> 2, the fastest measured on the H200 (bench_attention, causal bf16,
// ms per call, 2026-11-30; docs/perf-notes.md):
//   D=64 (Hq=24, Hkv=4)       v0      v1      v2
//     L=1024               .0337   .0194   .0273
//     L=8192               .7966   .5639   .5996
//     L=30000              9.092   6.561   6.633
//     q8192 / kv30000      4.431   3.156   3.209
//   D=128 (Hq=32, Hkv=8)
//     L=1024               .0564   .0408   .0403
//     L=8192               2.089   1.353   1.170
//     q2048 / kv8192       .941    .604    .511
// The environment variable KILN_ATTN_PREFILL_VARIANT=N (read once per backend, on its first call)
// overrides the default for both head sizes; CudaBackend::set_attention_prefill_variant() overrides
// both.
//
// Keys and values are read through the paged view (kernels/paged_kv.h) by every variant: the
// pool rows of each K/V tile's keys are put in shared memory ahead of the tile's copies (one
// page-table read per key, by one thread, its latency hidden behind a tile of compute), and each
// cp.async row copy reads its row there: one shared-memory load per copied row, whatever the page
// size. The figures above were measured with the contiguous kernels (before paging); the paged
// ones are to be measured (bench_attention --page-size N, 0 for one page).
//
// Per-backend state: the attention kernels keep what they learn about a device (wgmma support,
// raised shared-memory limits, occupancy, the environment's variant) in
// CudaBackend::attention_state(), never in function-local statics, so a backend on another GPU
// gets its own. The training kernels (attention_train.cu) share the two helpers below.
#pragma once

#include "backend/cuda_backend.h"

namespace kiln::cuda {

constexpr int kPrefillVariantCount = 3;

// The variant prefill calls with head dimension D run with on `be` (the backend's override if set,
// else the environment, else the default for D). Tests and benchmarks pick one with
// CudaBackend::set_attention_prefill_variant().
int prefill_variant_for_head_dim(CudaBackend& be, int head_dim);
// Short description of variant v.
const char* prefill_variant_name(int v);

// Whether be's device runs the sm_90a wgmma kernels (compute capability 9.0).
bool attention_device_has_wgmma(CudaBackend& be);
// Raises `kernel`'s dynamic shared-memory limit to `bytes` on be's device (once per backend and
// kernel; nothing for bytes <= 48 KiB).
void attention_allow_smem(CudaBackend& be, const void* kernel, int bytes);

}  // namespace kiln::cuda
