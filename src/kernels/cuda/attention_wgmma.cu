// The Hopper wgmma prefill kernels (family 2, variants 1 and 2 of attention.cu's description).
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/hopper_util.cuh"

namespace kiln::cuda::attn {
namespace {

using hopper::fence_proxy_async;
using hopper::fence_regs;
using hopper::wgmma_commit;
using hopper::wgmma_desc;
using hopper::wgmma_fence;
using hopper::wgmma_wait;

// Hopper wgmma kernels (bf16/f16, D = 64 or 128; sm_90a). A warpgroup (4 warps) owns 64 query
// rows. Q, K and V tiles are stored as D / 64 column blocks of [rows][64 dims] with 128-byte rows
// and the hardware 128-byte swizzle (16-byte chunk ^= row % 8 inside 1024-byte atoms of 8 rows;
// for D = 64 exactly the swz<64> layout above): the canonical wgmma SW128 layout, K-major for Q
// (A) and K (B) of S = Q K^T, MN-major for V (B of O = P V, "transposed" B). Per 16-wide k step
// the K-major descriptors advance 32 bytes inside the 128-byte rows (then to the next column
// block); the MN-major V descriptor advances 16 key rows (2048 bytes) and steps between the
// 64-dim column blocks by its leading byte offset. S and O live in wgmma accumulator registers
// (per warp: the mma.sync C layout, n8 tile j in registers 4j..4j+3); P is packed from S into the
// register A operand of the PV wgmma.
template <typename T>
struct Wgmma;

// (generated wrappers: one asm statement per wgmma shape)
template <>
struct Wgmma<__nv_bfloat16> {
  // D[64x64] (+)= A[64x16] (smem, K-major) * B[16x64] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x128] (+)= A[64x16] (smem, K-major) * B[16x128] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x64] += A[64x16] (registers, per warp the mma.sync m16n8k16 A layout) * B[16x64] (smem, MN-major).
  static __device__ __forceinline__ void rs64_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
  // D[64x128] += A[64x16] (registers) * B[16x128] (smem, MN-major).
  static __device__ __forceinline__ void rs128_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
};

template <>
struct Wgmma<__half> {
  // D[64x64] (+)= A[64x16] (smem, K-major) * B[16x64] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x128] (+)= A[64x16] (smem, K-major) * B[16x128] (smem, K-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss128(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x64] += A[64x16] (registers, per warp the mma.sync m16n8k16 A layout) * B[16x64] (smem, MN-major).
  static __device__ __forceinline__ void rs64_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
  // D[64x128] += A[64x16] (registers) * B[16x128] (smem, MN-major).
  static __device__ __forceinline__ void rs128_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
};

// Masked online-softmax step, in place, on a wgmma S accumulator (64 x BN; this thread: rows
// wrow0 and wrow0 + 8, n8 tile j in s[4j..4j+3]): s becomes P (f32, relative to the new running
// max), m and l are updated and alpha gets the rescale factors of the two rows for O.
template <int BN>
__device__ __forceinline__ void wg_softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           int key0, int first_masked, int wrow0, int delta, int kv_len, int lane,
                                           float sl) {
  if (key0 + BN > first_masked || key0 + BN > kv_len) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wrow0 + (e >> 1) * 8;
        const int key = key0 + j * 8 + (lane & 3) * 2 + (e & 1);
        if (key > delta + row || key >= kv_len) s[4 * j + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hf], mx * sl);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[hf] = fast_exp2(m[hf] - m_use);
    m[hf] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[4 * j + 2 * hf + e], sl, -m_use));
        s[4 * j + 2 * hf + e] = p;
        sum += p;
      }
    l[hf] = l[hf] * alpha[hf] + sum;
  }
}

// P (f32, the softmaxed S accumulator) packed as the register A operands of the BN / 16 PV k steps.
template <typename T, int BN>
__device__ __forceinline__ void wg_pack_p(const float (&s)[BN / 2], uint32_t (&pa)[BN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O *= alpha (per row), skipped when no row of the warp changed its max (then alpha == 1 exactly).
template <int N>
__device__ __forceinline__ void wg_rescale(float (&o)[N], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, (alpha[0] != 1.0f) | (alpha[1] != 1.0f))) {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
  }
}

// Element offset of 16-byte chunk c of row r in a wgmma tile of ROWS rows x D dims: D / 64
// column blocks of [ROWS][64] (128-byte rows, 128-byte swizzle inside 1024-byte atoms of 8 rows).
// For D = 64 this equals swz<64>.
template <int ROWS>
__device__ __forceinline__ int wg_off(int r, int c) {
  return (c >> 3) * (ROWS * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

// Shared state and helpers of the wgmma kernels: block geometry, cp.async tile loads, the S and
// PV wgmma issue, and the epilogue.
template <typename T, int D, int BN, int NWG>
struct WgTile {
  static constexpr int NC = D / 8;  // 16-byte chunks per row
  static constexpr int NT = NWG * 128;
  static constexpr int BM = NWG * 64;
  static constexpr int SD = BN / 2;  // S accumulators per thread
  static constexpr int OD = D / 2;   // O accumulators per thread
  static constexpr int kTileElems = BN * D;
  // Q + two K and two V stages + the two K/V tiles' pool rows (TileRows, after the tiles so that
  // these stay 1024-byte aligned), + slack for the 1024-byte alignment.
  static constexpr int kSmemBytes = (BM * D + 4 * BN * D) * 2 + 2 * BN * 4 + 1024;

  T* sQ;
  T* sK;  // [2][BN x D tile]
  T* sV;  // [2][BN x D tile]
  const int* rows;  // [2][BN] pool rows of the K/V tiles (TileRows)
  const T* q_base;
  const T* k_base;  // kv head kvh of pool row 0, at this thread's 16-byte chunk tid % NC (load_kv)
  const T* v_base;
  PagedKeys keys;
  int64_t q_stride;
  int kv_stride;  // Hkv * D
  int row0, q_len, n_keys, tid;

  // cp.async tile loads. Thread tid always copies 16-byte chunk c = tid % NC of rows
  // tid / NC + i * RS (RS = NT / NC, a multiple of 8, so the swizzle term row % 8 and the chunk's
  // column block are the same for all i): fully unrolled loops whose per-row work is one
  // predicate, one address add and the copy. (A `for (idx = tid; idx < rows * NC; idx += NT)`
  // loop with the index math per row, run separately for K and V, cost these issue-bound
  // kernels ~200 integer instructions per key tile, ~20% of the time at D = 64.)
  static constexpr int RS = NT / NC;
  static_assert(RS % 8 == 0 && BN % RS == 0 && BM % RS == 0, "load mapping");

  __device__ __forceinline__ void load_q() const {
    const int r0 = tid / NC, c = tid % NC;
    const uint32_t d0 = smem_u32(sQ + wg_off<BM>(r0, c));
    const T* src = q_base + static_cast<int64_t>(row0 + r0) * q_stride + c * 8;
#pragma unroll
    for (int i = 0; i < BM / RS; ++i) {
      const bool ok = row0 + r0 + i * RS < q_len;
      cp_async16(d0 + i * RS * 128, ok ? src + i * RS * q_stride : q_base, ok);
    }
  }
  // K and V tile `tile` into stage buf (rows past n_keys zero-filled), from the pool rows in
  // `rows`: per copied row one shared-memory load and one widening multiply-add per address
  // (k_base and v_base already include this thread's chunk).
  __device__ __forceinline__ void load_kv(int tile, int buf) const {
    const int r0 = tid / NC;
    const uint32_t off0 = static_cast<uint32_t>(wg_off<BN>(r0, tid % NC) * sizeof(T));  // bytes
    const uint32_t dk = smem_u32(sK + buf * kTileElems) + off0;
    const uint32_t dv = smem_u32(sV + buf * kTileElems) + off0;
    const int key0 = tile * BN;
    const int* tr = rows + (tile & 1) * BN + r0;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = key0 + r0 + i * RS < n_keys;
      const int row = ok ? tr[i * RS] : 0;
      cp_async16(dk + i * RS * 128, k_base + row_offset(row, kv_stride), ok);
      cp_async16(dv + i * RS * 128, v_base + row_offset(row, kv_stride), ok);
    }
  }

  // S = Q_wg K^T (D / 16 k steps; K-major descriptors advance 32 bytes per step inside a 64-dim
  // column block, then jump to the next block).
  __device__ __forceinline__ void issue_s(float (&s)[SD], uint32_t q_addr, int buf) const {
    const uint32_t k_addr = smem_u32(sK + buf * kTileElems);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da = wgmma_desc(q_addr + (kk >> 2) * (BM * 128) + (kk & 3) * 32, 16, 1024);
      const uint64_t db = wgmma_desc(k_addr + (kk >> 2) * (BN * 128) + (kk & 3) * 32, 16, 1024);
      if constexpr (BN == 128)
        Wgmma<T>::ss128(s, da, db, kk);
      else
        Wgmma<T>::ss64(s, da, db, kk);
    }
  }
  // O += P V (BN / 16 k steps of 16 keys; V MN-major: 16 key rows = 2048 bytes per step, the
  // 64-dim column blocks BN * 128 bytes apart (leading byte offset), 8-key atoms 1024 bytes apart).
  __device__ __forceinline__ void issue_pv(float (&o)[OD], const uint32_t (&pa)[BN / 16][4], int buf) const {
    const uint32_t v_addr = smem_u32(sV + buf * kTileElems);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t dv = wgmma_desc(v_addr + kk * 16 * 128, BN * 128, 1024);
      if constexpr (D == 128)
        Wgmma<T>::rs128_mn(o, pa[kk], dv);
      else
        Wgmma<T>::rs64_mn(o, pa[kk], dv);
    }
  }
};

template <typename T, int D>
__device__ __forceinline__ void wg_store(T* __restrict__ out, const float (&o)[D / 2], const float (&l)[2], int wrow0,
                                         int q_start, int q_len, int Hq, int h, int lane) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lsum = l[hf];
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
    lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int row = wrow0 + hf * 8;
    if (row >= q_len) continue;
    T* dst = out + (static_cast<int64_t>(q_start + row) * Hq + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8) = Mma<T>::pack(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
  }
}

// Common prologue of the wgmma kernels: block geometry from q_indptr and the paged view (blocks
// past the request's queries return).
#define KILN_WG_SETUP(Tile)                                                                                    \
  extern __shared__ unsigned char smem_wg[];                                                                  \
  unsigned char* smem_base = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);                       \
  const int b = blockIdx.z;                                                                                   \
  const int h = blockIdx.y;                                                                                   \
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x); /* heaviest tiles first */                    \
  const int q_start = q_indptr[b];                                                                            \
  const int q_len = q_indptr[b + 1] - q_start;                                                                \
  const int row0 = qt * Tile::BM;                                                                             \
  if (row0 >= q_len) return; /* every block of a request without queries (padding) exits here */              \
  const int kv_len = request_kv_len(kv, b);                                                                   \
  const int kvh = h / G;                                                                                      \
  const int delta = kv_len - q_len;                                                                           \
  const int row_end = min(q_len, row0 + Tile::BM);                                                            \
  const int n_keys = max(0, min(kv_len, delta + row_end));                                                    \
  const int n_tiles = (n_keys + BN - 1) / BN;                                                                 \
  const int first_masked = delta + row0 + 1;                                                                  \
  const int tid = threadIdx.x;                                                                                \
  const int wg = tid >> 7;                                                                                    \
  const int warp = (tid >> 5) & 3;                                                                            \
  const int lane = tid & 31;                                                                                  \
  Tile t_;                                                                                                    \
  t_.sQ = reinterpret_cast<T*>(smem_base);                                                                    \
  t_.sK = t_.sQ + Tile::BM * D;                                                                               \
  t_.sV = t_.sK + 2 * Tile::kTileElems;                                                                       \
  TileRows<BN> tile_rows{reinterpret_cast<int*>(t_.sV + 2 * Tile::kTileElems)};                               \
  t_.rows = tile_rows.rows;                                                                                   \
  t_.q_stride = static_cast<int64_t>(Hq) * D;                                                                 \
  t_.kv_stride = Hkv * D;                                                                                     \
  t_.q_base = q + (static_cast<int64_t>(q_start) * Hq + h) * D;                                               \
  t_.k_base = k_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.v_base = v_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.keys = request_keys(kv, b);                                                                              \
  t_.row0 = row0;                                                                                             \
  t_.q_len = q_len;                                                                                           \
  t_.n_keys = n_keys;                                                                                         \
  t_.tid = tid;                                                                                               \
  const int wrow0 = row0 + wg * 64 + warp * 16 + (lane >> 2); /* this thread's rows: wrow0, wrow0 + 8 */      \
  const uint32_t q_addr = smem_u32(t_.sQ) + wg * 64 * 128; /* this warpgroup's 64 rows (per column block) */

// 2b. Plain wgmma kernel (bf16/f16, D = 64 or 128). NWG warpgroups of 4 warps, each owning 64
// query rows (BM = 64 * NWG), BN keys per K/V tile, K/V double buffered (shared by the
// warpgroups). Per key tile: wait for the tile's cp.async group, fence.proxy.async (cp.async
// writes are generic-proxy, wgmma reads are async-proxy), barrier, prefetch the next tile into
// the other stage (its readers finished: every warpgroup waits for its wgmmas before the
// barrier) and read the page ids of tile + 2 (TileRows), S wgmma -> wait -> masked online
// softmax -> PV wgmma -> wait, then store tile + 2's pool rows. The tensor cores overlap the
// softmax only across the resident blocks of an SM.
template <typename T, int D, int BN, int NWG, int kMinBlocks>
__global__ void __launch_bounds__(NWG * 128, kMinBlocks)
    attn_prefill_wgmma_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv,
                              int Hq, int Hkv, int G, int num_qtiles, float sl) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = WgTile<T, D, BN, NWG>;
  KILN_WG_SETUP(Tile)
  static_assert(BN <= Tile::NT, "one thread per tile row in TileRows");
  t_.load_q();
  // Pool rows of the first two tiles, then the first K/V tile.
  for (int tile = 0; tile < 2 && tile < n_tiles; ++tile) {
    tile_rows.fetch(t_.keys, tile, n_keys, tid);
    tile_rows.store(t_.keys, tile, tid);
  }
  __syncthreads();
  if (n_tiles > 0) t_.load_kv(0, 0);
  cp_async_commit();

  float o[Tile::OD], s[Tile::SD];
#pragma unroll
  for (int i = 0; i < Tile::OD; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::SD; ++i) s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (tile + 1 < n_tiles) t_.load_kv(tile + 1, (tile + 1) & 1);
    if (tile + 2 < n_tiles) tile_rows.fetch(t_.keys, tile + 2, n_keys, tid);
    cp_async_commit();

    wgmma_fence();
    t_.issue_s(s, q_addr, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    float alpha[2];
    uint32_t pa[BN / 16][4];
    wg_softmax<BN>(s, m, l, alpha, tile * BN, first_masked, wrow0, delta, kv_len, lane, sl);
    wg_pack_p<T, BN>(s, pa);
    wg_rescale(o, alpha);

    wgmma_fence();
    t_.issue_pv(o, pa, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    // Rows of tile + 2 into the slot of this tile's (already issued) copies; the barrier at the
    // top of the next iteration publishes them before load_kv(tile + 2) reads them.
    if (tile + 2 < n_tiles) tile_rows.store(t_.keys, tile + 2, tid);
  }
  cp_async_wait<0>();
  wg_store<T, D>(out, o, l, wrow0, q_start, q_len, Hq, h, lane);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

#undef KILN_WG_SETUP

template <typename T, int D, int BN, int NWG, int kMinBlocks>
void launch_wgmma_tile(CudaBackend& be, const Args& a) {
  using Tile = WgTile<T, D, BN, NWG>;
  auto kernel = attn_prefill_wgmma_kernel<T, D, BN, NWG, kMinBlocks>;
  constexpr int smem = Tile::kSmemBytes;
  static_assert((smem + 1024) * kMinBlocks <= 228 * 1024, "shared memory per SM (1 KiB reserved per block)");
  attention_allow_smem(be, kernel_key(kernel), smem);
  const int num_qtiles = (a.max_q_len + Tile::BM - 1) / Tile::BM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, Tile::NT, smem, be.stream()>>>(static_cast<T*>(a.out), static_cast<const T*>(a.q),
                                                static_cast<const T*>(a.k), static_cast<const T*>(a.v), a.q_indptr,
                                                a.kv, a.Hq, a.Hkv, a.G, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void launch_prefill_wgmma(CudaBackend& be, const Args& a, int variant) {
  if (a.D == 64) {
    if (variant == 1)  // 1 warpgroup, 128-key tiles, 3 blocks per SM
      return launch_wgmma_tile<T, 64, 128, 1, 3>(be, a);
    return launch_wgmma_tile<T, 64, 64, 2, 2>(be, a);  // 2 warpgroups, 64-key tiles, 2 blocks per SM
  }
  if (variant == 1)  // 1 warpgroup, 64-key tiles, 2 blocks per SM
    return launch_wgmma_tile<T, 128, 64, 1, 2>(be, a);
  return launch_wgmma_tile<T, 128, 64, 2, 2>(be, a);  // 2 warpgroups, 64-key tiles, 2 blocks per SM
}

template void launch_prefill_wgmma<__nv_bfloat16>(CudaBackend&, const Args&, int);
template void launch_prefill_wgmma<__half>(CudaBackend&, const Args&, int);

}  // namespace kiln::cuda::attn
