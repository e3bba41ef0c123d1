// Internal hooks of the CUDA attention kernels (kernels/cuda/attention.cu), for tests and
// benchmarks only; the model code goes through ops::attention_forward.
//
// The prefill (tensor-core, long query runs) path has several compiled variants:
//   0  mma.sync m16n8k16, 4 warps x 32 query rows (D=128: 4 x 16), 64-key tiles, Q in registers
//      (the original kernel; the reference the others are checked against)
//   1  mma.sync, 4 warps x 32 rows, 128-key tiles, Q re-read from shared memory per tile, lazy
//      rescale (D=128: variant 0's tiles with lazy rescale)
//   2  mma.sync, 8 warps x 16 rows (BM=128), 64-key tiles, lazy rescale (D=128: Q from smem)
//   3  Hopper wgmma, 1 warpgroup (BM=64), 128-key tiles          (D=64 only; D=128 runs 0)
//   4  wgmma, 1 warpgroup (BM=64), 64-key tiles                    (D=64 only)
//   5  wgmma, 2 warpgroups sharing K/V tiles (BM=128), 128-key tiles (D=64 only)
//   6  wgmma, 2 warpgroups (BM=128), 64-key tiles                  (D=64 only)
//   7  wgmma software-pipelined (S of tile t+1 and P(t) V(t) on the tensor cores while the
//      softmax of tile t+1 runs), 1 warpgroup, 64-key tiles, 4 K/V stages (D=64 only)
//   8  as 7 with 128-key tiles, 3 stages                             (D=64 only)
//   9  as 7 with 2 warpgroups (BM=128)                               (D=64 only)
// The environment variable KILN_ATTN_PREFILL_VARIANT=N (read once, on the first call) sets the
// default; set_prefill_variant_for_testing() overrides it.
#pragma once

namespace kiln::cuda {

constexpr int kPrefillVariantCount = 10;

// The variant that prefill calls use now (override if set, else the environment/default).
int prefill_variant();
// v in [0, kPrefillVariantCount): use variant v from now on; v < 0: back to the default.
void set_prefill_variant_for_testing(int v);
// Short description of variant v.
const char* prefill_variant_name(int v);

}  // namespace kiln::cuda
