// Internal hooks of the CUDA attention kernels (kernels/cuda/attention*.cu), for tests and
// benchmarks only; the model code goes through ops::attention_forward.
//
// The prefill (tensor-core, long query runs) path has four compiled variants (D = 64 / 128):
//   0  mma.sync m16n8k16, 4 warps x 32 query rows (D=128: 4 x 16), 64-key tiles, Q in registers
//      (the original kernel; the reference the others are checked against, and the fallback on
//      devices without wgmma, i.e. anything but sm_90)
//   1  Hopper wgmma, 1 warpgroup (BM=64), 128-key tiles (D=128: 64-key tiles), S wait -> softmax
//      -> PV wait per tile; overlap only across resident blocks (3 per SM for D=64, 2 for D=128)
//   2  the same wgmma kernel with 2 warpgroups sharing the K/V tiles (BM=128), 64-key tiles,
//      2 blocks per SM
//   3  warp-specialised (FlashAttention-3's structure): a producer warpgroup loading Q by TMA and
//      K/V by TMA (pages of >= 64 rows, one contiguous page) or cp.async (smaller pages) into a
//      ring of stages, consumer warpgroups with raised register budgets (D=64: 3, BM=192; D=128:
//      2, BM=128), 128-key tiles, the next tile's S wgmma and the previous tile's PV wgmma in
//      flight during the softmax, ping-pong of the consumer warpgroups at the tensor cores
// Defaults (prefill_default_variant), from the H200 measurements (bench_attention, causal bf16,
// 2026-12-02, one call, ms per call; docs/perf-notes.md):
//   D=64 (Hq=24, Hkv=4), 16-row pages   v0      v1      v2      v3
//     L=8192                         .809    .620    .633    .527
//     L=30000                        9.273   7.460   7.079   5.843
//     q8192 / kv30000                4.494   3.530   3.439   2.749
//   D=128 (Hq=32, Hkv=8), 16-row pages
//     L=8192                         2.070   1.503   1.139   1.237
//     L=16384                        7.804   5.666   4.076   4.491
//   D=128, one contiguous page (K/V by TMA)
//     L=16384                        7.811   5.543   4.066   3.387
//     q2048 / kv8192                 .945    .680    .508    .406
//   (short prefills, an earlier call: D=64 L=1024 .035 / .023 / .030 / .028)
// so D=64 takes 3 when its grid fills two waves of the SMs (1 below), D=128 takes 3 when the page
// size takes TMA boxes (2 otherwise: with 16-row pages variant 3 copies K/V with cp.async and is
// slower). The environment variable KILN_ATTN_PREFILL_VARIANT=N (read once per backend, on its
// first call) overrides the default for every call; CudaBackend::set_attention_prefill_variant()
// overrides both.
//
// Keys and values are read through the paged view (kernels/paged_kv.h) by every variant: the
// pool rows of each K/V tile's keys are put in shared memory ahead of the tile's copies (one
// page-table read per key, by one thread, its latency hidden behind a tile of compute), and each
// cp.async row copy reads its row there: one shared-memory load per copied row, whatever the page
// size; variant 3's TMA path looks up one page per box of rows instead.
//
// Per-backend state: the attention kernels keep what they learn about a device (wgmma support,
// raised shared-memory limits, occupancy, the environment's variant) in
// CudaBackend::attention_state(), never in function-local statics, so a backend on another GPU
// gets its own. The training kernels (attention_train*.cu) share the two helpers below.
#pragma once

#include "backend/cuda_backend.h"

namespace kiln::cuda {

constexpr int kPrefillVariantCount = 4;

// The variant every prefill call on `be` runs with (the backend's override if set, else the
// environment's), -1 if none: then each call takes prefill_default_variant(). Tests and benchmarks
// pick one with CudaBackend::set_attention_prefill_variant().
int prefill_variant_override(CudaBackend& be);
// The default variant of a prefill call (head dimension 64 or 128, the paged view's page size, the
// call's bounds): 0 without wgmma; D=128: 3 when the page size takes TMA boxes (a multiple of 64,
// or one contiguous page), else 2; D=64: 3 when its grid fills two waves of the SMs, else 1.
int prefill_default_variant(CudaBackend& be, int head_dim, int page_size, int max_q_len, int Hq, int B);
// Short description of variant v.
const char* prefill_variant_name(int v);

// Whether be's device runs the sm_90a wgmma kernels (compute capability 9.0).
bool attention_device_has_wgmma(CudaBackend& be);
// Raises `kernel`'s dynamic shared-memory limit to `bytes` on be's device (once per backend and
// kernel; nothing for bytes <= 48 KiB).
void attention_allow_smem(CudaBackend& be, const void* kernel, int bytes);

}  // namespace kiln::cuda
