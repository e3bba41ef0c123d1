// Device building blocks of the Hopper wgmma attention kernels (attention_wgmma.cu: variants 1
// and 2; attention_ws.cu: the warp-specialised variant 3): the wgmma wrappers, the masked online
// softmax on a wgmma accumulator, P packing, O rescaling, the S and PV wgmma issue on 128-byte
// swizzled tiles, and the output store. Header-only device code; no state.
#pragma once

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/hopper_util.cuh"

namespace kiln::cuda::attn {

using hopper::fence_proxy_async;
using hopper::mbar_arrive;
using hopper::mbar_arrive_expect_tx;
using hopper::mbar_fence_init;
using hopper::mbar_init;
using hopper::mbar_wait;
using hopper::named_arrive;
using hopper::named_sync;
using hopper::regs_dec;
using hopper::regs_inc;
using hopper::tma_load_2d;
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
  // (ss*_mn, B MN-major from shared memory: bf16 only, the training backward's dQ = dS K.)
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
  // D[64x64] (+)= A[64x16] (smem, K-major) * B[16x64] (smem, MN-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss64_mn(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
  }
  // D[64x128] (+)= A[64x16] (smem, K-major) * B[16x128] (smem, MN-major); scale_d = 0: D = A*B.
  static __device__ __forceinline__ void ss128_mn(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 1;\n}\n"
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
  // D[64x72] += A[64x16] (registers) * B[16x72] (smem, MN-major).
  static __device__ __forceinline__ void rs72_mn(float (&d)[36], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
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
  // D[64x72] += A[64x16] (registers) * B[16x72] (smem, MN-major).
  static __device__ __forceinline__ void rs72_mn(float (&d)[36], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n72k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
  }
};

// wg_softmax's extra mask beside the causal and length ones: none (the segment ids of the dense
// training layout are attention_ws.cu's SegmentMask).
struct NoExtraMask {
  static constexpr bool on = false;
  __device__ __forceinline__ bool masked(int /*half*/, int /*key_in_tile*/) const { return false; }
};

// Masked online-softmax step, in place, on a wgmma S accumulator (64 x BN; this thread: rows
// wrow0 and wrow0 + 8, n8 tile j in s[4j..4j+3]): s becomes P (f32, relative to the new running
// max), m and l are updated and alpha gets the rescale factors of the two rows for O. The row max
// and sum run as four independent chains (a single chain of BN / 4 dependent adds is latency the
// few warps of a warp-specialised block cannot hide). (2^x of element pairs by ex2.approx.f16x2,
// halving the SFU work, was measured slower: D=64, L=30000 7.39 ms against 6.23.) Masks: key >
// delta + row (causal with an offset; delta >= kv_len: none), key >= kv_len, and the tile's `extra`
// mask when extra.on. kRowSum = false: l is left alone (the kernel gets the row sums from the PV
// wgmma instead: wg_issue_pv_rowsum).
template <int BN, bool kRowSum = true, typename Extra = NoExtraMask>
__device__ __forceinline__ void wg_softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                           int key0, int first_masked, int wrow0, int delta, int kv_len, int lane,
                                           float sl, const Extra& extra = {}) {
  if (key0 + BN > first_masked || key0 + BN > kv_len || extra.on) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wrow0 + (e >> 1) * 8;
        const int kl = j * 8 + (lane & 3) * 2 + (e & 1);
        const int key = key0 + kl;
        if (key > delta + row || key >= kv_len || extra.masked(e >> 1, kl)) s[4 * j + e] = -INFINITY;
      }
  }
  static_assert(BN % 32 == 0, "four chains of whole n8 tiles");
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) mc[j] = fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]);
#pragma unroll
    for (int j = 4; j < BN / 8; ++j) mc[j & 3] = fmaxf(mc[j & 3], fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
    float mx = fmaxf(fmaxf(mc[0], mc[1]), fmaxf(mc[2], mc[3]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hf], mx * sl);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    alpha[hf] = fast_exp2(m[hf] - m_use);
    m[hf] = m_new;
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      float& p0 = s[4 * j + 2 * hf];
      float& p1 = s[4 * j + 2 * hf + 1];
      p0 = fast_exp2(fmaf(p0, sl, -m_use));
      p1 = fast_exp2(fmaf(p1, sl, -m_use));
      if constexpr (kRowSum) sc[j & 3] += p0 + p1;
    }
    if constexpr (kRowSum) l[hf] = l[hf] * alpha[hf] + ((sc[0] + sc[1]) + (sc[2] + sc[3]));
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

// cp.async of `rows` rows (row0 + r < limit, else zero-filled) of a [.., D] row-major global matrix
// (row stride `stride` elements) into a wg_off<ROWS> tile. Thread tid copies chunk tid % (D / 8) of
// rows tid / (D / 8) + i * RS (RS = NT / (D / 8), a multiple of 8: one swizzle pattern per thread;
// the prefill's Q tile, the training backward's Q, dO, K and V tiles).
template <typename T, int D, int ROWS, int NT>
__device__ __forceinline__ void wg_load_rows(T* tile, const T* base, int64_t stride, int row0, int limit, int tid) {
  constexpr int NC = D / 8;
  constexpr int RS = NT / NC;
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "load mapping");
  const int r0 = tid / NC, c = tid % NC;
  const uint32_t d0 = smem_u32(tile + wg_off<ROWS>(r0, c));
  const T* src = base + static_cast<int64_t>(row0 + r0) * stride + c * 8;
#pragma unroll
  for (int i = 0; i < ROWS / RS; ++i) {
    const bool ok = row0 + r0 + i * RS < limit;
    cp_async16(d0 + i * RS * 128, ok ? src + i * RS * stride : base, ok);
  }
}

// A wgmma descriptor advanced by `offset` bytes (a multiple of 16): the start-address field (bits
// 0-13: the shared-memory address >> 4) of a tile below 256 KiB never carries, so the advance is one
// 32-bit add to the low word (instead of a descriptor built from the address at every k step).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t offset) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (offset >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// S = Q_wg K^T for a warpgroup's 64 query rows (D / 16 k steps; K-major descriptors advance 32
// bytes per step inside a 64-dim column block, then jump to the next block). q_addr: the
// warpgroup's first row in a Q tile of BM rows; k_addr: a K tile of BN rows.
template <typename T, int D, int BM, int BN>
__device__ __forceinline__ void wg_issue_s(float (&s)[BN / 2], uint32_t q_addr, uint32_t k_addr) {
  const uint64_t dq = wgmma_desc(q_addr, 16, 1024), dk = wgmma_desc(k_addr, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = desc_advance(dq, (kk >> 2) * (BM * 128) + (kk & 3) * 32);
    const uint64_t db = desc_advance(dk, (kk >> 2) * (BN * 128) + (kk & 3) * 32);
    if constexpr (BN == 128)
      Wgmma<T>::ss128(s, da, db, kk);
    else
      Wgmma<T>::ss64(s, da, db, kk);
  }
}
// O += P V (BN / 16 k steps of 16 keys; V MN-major: 16 key rows = 2048 bytes per step, the
// 64-dim column blocks BN * 128 bytes apart (leading byte offset), 8-key atoms 1024 bytes apart).
template <typename T, int D, int BN>
__device__ __forceinline__ void wg_issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BN / 16][4], uint32_t v_addr) {
  const uint64_t dv0 = wgmma_desc(v_addr, BN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    const uint64_t dv = desc_advance(dv0, kk * 16 * 128);
    if constexpr (D == 128)
      Wgmma<T>::rs128_mn(o, pa[kk], dv);
    else
      Wgmma<T>::rs64_mn(o, pa[kk], dv);
  }
}

// O += P [V | 1] for D = 64: the PV product with eight more columns read from a block of ones, so
// that O's last n8 tile (o[32..35]) accumulates the rows' sums of the bf16 P (the softmax then skips
// its sums: one add per score). The ones block (BN rows of 64 bf16 ones, 1024-byte aligned; being
// all ones, its swizzle does not matter) lies at ones_addr; the descriptor's leading byte offset
// reaches it from the stage's V tile.
template <typename T, int BN>
__device__ __forceinline__ void wg_issue_pv_rowsum(float (&o)[36], const uint32_t (&pa)[BN / 16][4], uint32_t v_addr,
                                                   uint32_t ones_addr) {
  const uint64_t dv0 = wgmma_desc(v_addr, ones_addr - v_addr, 1024);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) Wgmma<T>::rs72_mn(o, pa[kk], desc_advance(dv0, kk * 16 * 128));
}

// O / l of this thread's rows wrow0, wrow0 + 8 (those < q_len) to out [.., Hq, D] at token row
// q_start + row, head h; with lse_row, also the row's log-sum-exp (natural log: (m + log2 l) ln 2,
// -inf for a row that saw no key) at lse_row[row].
// With N = D / 2 + 4 accumulators the last n8 tile holds the rows' sums (wg_issue_pv_rowsum) and l
// is not read.
template <typename T, int D, int N = D / 2>
__device__ __forceinline__ void wg_store(T* __restrict__ out, const float (&o)[N], const float (&l)[2], int wrow0,
                                         int q_start, int q_len, int Hq, int h, int lane, const float* m = nullptr,
                                         float* __restrict__ lse_row = nullptr) {
  static_assert(N == D / 2 || N == D / 2 + 4, "O accumulators, with or without the row-sum tile");
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lsum;
    if constexpr (N == D / 2) {
      lsum = l[hf];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
    } else {
      lsum = o[D / 2 + 2 * hf];
    }
    const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    const int row = wrow0 + hf * 8;
    if (row >= q_len) continue;
    T* dst = out + (static_cast<int64_t>(q_start + row) * Hq + h) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8) = Mma<T>::pack(o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    if (lse_row != nullptr && (lane & 3) == 0)
      lse_row[row] = lsum > 0.0f ? (m[hf] + log2f(lsum)) * 0.6931471805599453f : -INFINITY;
  }
}

}  // namespace kiln::cuda::attn
