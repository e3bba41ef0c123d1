// Internal hooks of the CUDA attention kernels (kernels/cuda/attention.cu), for tests and
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
// Defaults: D=64 -> 1, D=128 -> 2. H200 measurements, causal bf16, ms per call, before the
// variants were pruned (old numbering: v1 and v2 = today's variants 1 and 2 for D=128, but for
// D=64 they ran a deleted D=64-only wgmma kernel; v3/v4 = deleted software-pipelined versions of
// v1/v2; v5 = today's variant 1 for D=64, and the same kernel as v1 for D=128):
//   D=64 (Hq=24, Hkv=4)      v0     v1     v2     v3     v4     v5
//     L=1024              .0340  .0218  .0309  .0203  .0301  .0194
//     L=8192              .8067  .6302  .6792  .6109  .6499  .5642
//     L=30000             9.176  7.319  7.559  7.212  7.168  6.987
//     q8192 / kv30000     4.435  3.527  3.682  3.467  3.421  3.157
//   D=128 (Hq=32, Hkv=8)
//     L=1024              .0567  .0410  .0407  .0437  .0460  .0412
//     L=8192              2.098  1.356  1.171  1.451  1.396  1.360
//     q2048 / kv8192      .941   .604   .513   .647   .613   .607
// So variant 1 (old v5) is the fastest D=64 kernel at every length, and variant 2 (old v2) the
// fastest D=128 kernel for long runs (at L=1024, within 1% of variant 1). Variant 2 at D=64 now
// runs the D-generic kernel (old v2 ran the deleted D=64-only kernel), a shape not measured on
// it yet. The environment variable KILN_ATTN_PREFILL_VARIANT=N (read once, on the
// first call) overrides the default for both head sizes; set_prefill_variant_for_testing()
// overrides both.
#pragma once

namespace kiln::cuda {

constexpr int kPrefillVariantCount = 3;

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
