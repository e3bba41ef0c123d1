// Internal hooks of the CUDA attention kernels (kernels/cuda/attention.cu), for tests and
// benchmarks only; the model code goes through ops::attention_forward.
//
// The prefill (tensor-core, long query runs) path has several compiled variants (D = 64 / 128):
//   0  mma.sync m16n8k16, 4 warps x 32 query rows (D=128: 4 x 16), 64-key tiles, Q in registers
//      (the original kernel; the reference the others are checked against, and the fallback on
//      devices without wgmma, i.e. anything but sm_90)
//   1  Hopper wgmma, 1 warpgroup (BM=64), 128-key tiles (D=128: 64-key tiles), S wait -> softmax
//      -> PV wait per tile; overlap only across resident blocks (3 per SM for D=64)
//   2  wgmma, 2 warpgroups sharing the K/V tiles (BM=128), 64-key tiles
//      (D=64: variants 1 and 2 run the dedicated D=64 kernel, identical to the first measured
//      wgmma kernels; D=128 runs the D-generic kernel)
//   3  wgmma software-pipelined FA3-style inside the warpgroup (S(t+1) and P(t) V(t) run on the
//      tensor cores while the softmax of tile t+1 runs), same tiles / shared memory as 1
//   4  as 3 with 2 warpgroups (BM=128), 64-key tiles (the tiles of 2)
//   5  D=64: variant 1's shapes on the D-generic kernel (fully unrolled loads; fewer instructions
//      per key tile than 1's kernel, not yet measured); D=128: the same kernel as 1
// Defaults: variant 1 (D=64 and D=128). The environment variable KILN_ATTN_PREFILL_VARIANT=N
// (read once, on the first call) overrides the default for both head sizes;
// set_prefill_variant_for_testing() overrides both.
#pragma once

namespace kiln::cuda {

constexpr int kPrefillVariantCount = 6;

// The variant that prefill calls with head dimension D use now (override if set, else the
// environment, else the default for D).
int prefill_variant_for_head_dim(int head_dim);
// prefill_variant_for_head_dim(64).
int prefill_variant();
// v in [0, kPrefillVariantCount): use variant v from now on; v < 0: back to the default.
void set_prefill_variant_for_testing(int v);
// Short description of variant v.
const char* prefill_variant_name(int v);

}  // namespace kiln::cuda
