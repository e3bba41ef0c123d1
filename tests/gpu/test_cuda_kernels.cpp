// Every CUDA op of kernels/cuda/cuda_ops.h (except attention) against its CPU twin on random inputs,
// for several shapes including odd ones (unvectorisable rows, unaligned views), in f32 and bf16
// (f16 where cheap). Both sides start from the same storage-rounded inputs; tolerances are relative
// L2 errors: ~1e-5 for f32 outputs, 1e-2 for bf16 outputs. Index-like results (embedding rows, KV
// writes, casts, greedy tokens) must match exactly. The sampler has its own tests
// (test_sampler_gpu.cpp). GemmFallbackKernel forces gemm.cu's SIMT fallback (KILN_GEMM_FALLBACK=1);
// DecodeOpsGraphCaptureAndNoAllocation replays a captured CUDA graph of the decode-path ops and
// checks that it allocates nothing. The step's own transfers (kernels/step_io.h) are checked last:
// against the CPU twin, and for their ordering against the step's first attention kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "kernels/step_io.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr DType kF32 = DType::f32;
constexpr DType kBF16 = DType::bf16;
constexpr DType kF16 = DType::f16;

double tol_for(DType out) { return out == kF32 ? 1e-5 : 1e-2; }

std::string name(DType dt) { return dtype_name(dt); }

std::vector<int32_t> host_i32(Backend& be, Tensor t) {
  TensorBuffer h = to_host(be, t);
  return std::vector<int32_t>(h.ptr<int32_t>(), h.ptr<int32_t>() + h.numel());
}

// A device tensor whose data pointer is offset by `offset` elements inside a larger buffer: not
// 16-byte (nor 256-byte) aligned, to exercise the scalar paths and the cuBLASLt alignment handling.
struct OffsetTensor {
  TensorBuffer storage;
  Tensor view;
};
OffsetTensor upload_offset(Backend& be, Tensor host, int64_t offset) {
  const int64_t n = host.numel();
  OffsetTensor o;
  o.storage = device_empty(be, Shape{n + offset}, host.dtype);
  Tensor dst = o.storage.view().rows(offset, n + offset).view(host.shape);
  be.copy(dst, host);
  o.view = dst;
  return o;
}

// ---------------------------------------------------------------------------------------------

TEST(CudaKernels, Embedding) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1;
  for (auto [V, H] : std::vector<std::pair<int64_t, int64_t>>{{1003, 37}, {1003, 1536}, {100000, 64}}) {
    for (DType table_dt : {kF32, kBF16}) {
      TensorBuffer table = random_host(Shape{V, H}, table_dt, seed++);
      TensorBuffer d_table = upload(*be, table);
      for (DType out_dt : {kF32, kBF16, kF16}) {
        for (int64_t T : {1, 3, 17, 300}) {
          SCOPED_TRACE("V=" + std::to_string(V) + " H=" + std::to_string(H) + " T=" + std::to_string(T) + " " +
                       name(table_dt) + "->" + name(out_dt));
          TensorBuffer ids = random_ints(Shape{T}, 0, static_cast<int32_t>(V), seed++);
          TensorBuffer d_ids = upload(*be, ids);
          TensorBuffer out = host_empty(Shape{T, H}, out_dt);
          cpu::embedding_forward(out, table, ids);
          TensorBuffer d_out = device_empty(*be, Shape{T, H}, out_dt);
          ops::embedding_forward(*be, d_out, d_table, d_ids);
          EXPECT_EQ(max_abs_diff(to_f32(*be, d_out), to_f32(*be, out)), 0.0);
        }
      }
    }
  }
}

TEST(CudaKernels, RmsNorm) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 100;
  for (int64_t H : {37, 128, 1001, 1536, 4096, 9000, 9001}) {
    for (int64_t rows : {1, 3, 17, 300}) {
      for (DType dt : {kF32, kBF16}) {
        for (DType w_dt : {kF32, kBF16}) {
          SCOPED_TRACE("H=" + std::to_string(H) + " rows=" + std::to_string(rows) + " x/y " + name(dt) + " w " +
                       name(w_dt));
          TensorBuffer x = random_host(Shape{rows, H}, dt, seed++, 2.0f);
          TensorBuffer w = random_host(Shape{H}, w_dt, seed++);
          TensorBuffer y = host_empty(Shape{rows, H}, dt);
          cpu::rmsnorm_forward(y, x, w, 1e-6f);
          TensorBuffer d_x = upload(*be, x), d_w = upload(*be, w);
          TensorBuffer d_y = device_empty(*be, Shape{rows, H}, dt);
          ops::rmsnorm_forward(*be, d_y, d_x, d_w, 1e-6f);
          EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), tol_for(dt));
          // In place (y aliases x).
          ops::rmsnorm_forward(*be, d_x, d_x, d_w, 1e-6f);
          EXPECT_CLOSE(to_f32(*be, d_x), to_f32(*be, y), tol_for(dt));
        }
      }
    }
  }
  // Mixed dtypes and a q/k-norm shape [T, heads, head_dim] with an unaligned view.
  TensorBuffer x = random_host(Shape{17, 12, 128}, kBF16, 7);
  TensorBuffer w = random_host(Shape{128}, kF32, 8);
  TensorBuffer y = host_empty(Shape{17, 12, 128}, kF32);
  cpu::rmsnorm_forward(y, x, w, 1e-5f);
  OffsetTensor d_x = upload_offset(*be, x, 3);
  TensorBuffer d_w = upload(*be, w);
  TensorBuffer d_y = device_empty(*be, Shape{17, 12, 128}, kF32);
  ops::rmsnorm_forward(*be, d_y, d_x.view, d_w, 1e-5f);
  EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-5);
}

TEST(CudaKernels, AddRmsNorm) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 200;
  for (int64_t H : {37, 1001, 1536, 9000}) {
    for (int64_t rows : {1, 3, 17, 300}) {
      for (DType dt : {kF32, kBF16}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " rows=" + std::to_string(rows) + " " + name(dt));
        TensorBuffer res = random_host(Shape{rows, H}, dt, seed++);
        TensorBuffer x = random_host(Shape{rows, H}, dt, seed++);
        TensorBuffer w = random_host(Shape{H}, kBF16, seed++);
        TensorBuffer d_res = upload(*be, res), d_x = upload(*be, x), d_w = upload(*be, w);
        TensorBuffer y = host_empty(Shape{rows, H}, dt);
        // Out of place first (the sum goes to a new tensor, the input is kept), then in place.
        TensorBuffer y2 = host_empty(Shape{rows, H}, dt), res2 = host_empty(Shape{rows, H}, dt);
        cpu::add_rmsnorm_forward(y2, res2, x, w, 1e-6f, res);
        TensorBuffer d_y2 = device_empty(*be, Shape{rows, H}, dt), d_res2 = device_empty(*be, Shape{rows, H}, dt);
        ops::add_rmsnorm_forward(*be, d_y2, d_res2, d_x, d_w, 1e-6f, d_res);
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_res2), to_f32(*be, res2)), 0.0);
        EXPECT_CLOSE(to_f32(*be, d_y2), to_f32(*be, y2), tol_for(dt));
        cpu::add_rmsnorm_forward(y, res, x, w, 1e-6f, Tensor{});
        TensorBuffer d_y = device_empty(*be, Shape{rows, H}, dt);
        ops::add_rmsnorm_forward(*be, d_y, d_res, d_x, d_w, 1e-6f);
        // The residual sum is one rounding of exact inputs: identical on both devices.
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_res), to_f32(*be, res)), 0.0);
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_res), to_f32(*be, d_res2)), 0.0);
        EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), tol_for(dt));
      }
    }
  }
}

TEST(CudaKernels, AddRmsNormOfPartialSums) {
  // The K-split down projection's reduction: S f32 partial products added in order into the f32
  // residual, then the norm (linear_k_split_forward's consumer), against the CPU twin.
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 250;
  for (int64_t H : {37, 1536, 2048}) {
    for (int64_t rows : {1, 9, 128}) {
      for (int64_t S : {2, 4}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " rows=" + std::to_string(rows) + " S=" + std::to_string(S));
        TensorBuffer res = random_host(Shape{rows, H}, kF32, seed++);
        TensorBuffer parts = random_host(Shape{S, rows, H}, kF32, seed++);
        TensorBuffer w = random_host(Shape{H}, kBF16, seed++);
        TensorBuffer d_res = upload(*be, res), d_parts = upload(*be, parts), d_w = upload(*be, w);
        TensorBuffer y = host_empty(Shape{rows, H}, kBF16);
        cpu::add_rmsnorm_forward(y, res, parts, w, 1e-5f, Tensor{});
        TensorBuffer d_y = device_empty(*be, Shape{rows, H}, kBF16);
        ops::add_rmsnorm_forward(*be, d_y, d_res, d_parts, d_w, 1e-5f);
        // The same f32 additions in the same order: identical residuals.
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_res), to_f32(*be, res)), 0.0);
        EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), tol_for(kBF16));
      }
    }
  }
}

TEST(CudaKernels, LinearKSplit) {
  // Strided-batched cuBLASLt over the K slices against the CPU twin, at the decode step's shapes
  // (astrai-1b's and llama-1b's down projections) and odd ones; and the slices sum to the product.
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 270;
  struct Case {
    int64_t M, N, K, S;
  };
  for (const Case& c : {Case{9, 1536, 6912, 4}, Case{32, 1536, 6912, 4}, Case{128, 1536, 6912, 4},
                        Case{64, 2048, 8192, 4}, Case{3, 40, 96, 3}, Case{17, 33, 64, 2}}) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 " S=" + std::to_string(c.S));
    TensorBuffer x = random_host(Shape{c.M, c.K}, kBF16, seed++);
    TensorBuffer w = random_host(Shape{c.N, c.K}, kBF16, seed++, 0.05f);
    TensorBuffer parts = host_empty(Shape{c.S, c.M, c.N}, kF32);
    cpu::linear_k_split_forward(parts, x, w);
    TensorBuffer d_x = upload(*be, x), d_w = upload(*be, w);
    TensorBuffer d_parts = device_empty(*be, Shape{c.S, c.M, c.N}, kF32);
    ops::linear_k_split_forward(*be, d_parts, d_x, d_w);
    EXPECT_CLOSE(to_f32(*be, d_parts), to_f32(*be, parts), 1e-5);
    // Sum of the parts against the whole product (f32 output).
    TensorBuffer whole = host_empty(Shape{c.M, c.N}, kF32);
    cpu::linear_forward(whole, x, w, Tensor{});
    const std::vector<float> p = to_f32(*be, d_parts);
    std::vector<float> sum(static_cast<size_t>(c.M * c.N), 0.0f);
    for (int64_t s = 0; s < c.S; ++s)
      for (int64_t i = 0; i < c.M * c.N; ++i) sum[i] += p[s * c.M * c.N + i];
    EXPECT_CLOSE(sum, to_f32(*be, whole), 1e-5);
  }
  EXPECT_EQ(ops::linear_k_split_parts(*be, 32, 1536, 6912, kBF16), 4);
  EXPECT_EQ(ops::linear_k_split_parts(*be, 32, 6912, 1536, kBF16), 0) << "only long-K projections split";
}

TEST(CudaKernels, Rope) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 300;
  for (int64_t D : {64, 128, 18}) {
    TensorBuffer inv_freq = host_empty(Shape{D / 2}, kF32);
    for (int64_t i = 0; i < D / 2; ++i)
      inv_freq.ptr<float>()[i] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * static_cast<double>(i) / static_cast<double>(D)));
    TensorBuffer d_inv = upload(*be, inv_freq);
    for (int64_t heads : {1, 7}) {
      for (int64_t T : {1, 3, 17, 300}) {
        for (DType dt : {kF32, kBF16}) {
          for (float scaling : {1.0f, 0.8f}) {
            SCOPED_TRACE("D=" + std::to_string(D) + " heads=" + std::to_string(heads) + " T=" + std::to_string(T) +
                         " " + name(dt) + " scaling=" + std::to_string(scaling));
            TensorBuffer x = random_host(Shape{T, heads, D}, dt, seed++);
            TensorBuffer pos = random_ints(Shape{T}, 0, 32768, seed++);
            TensorBuffer d_x = upload(*be, x), d_pos = upload(*be, pos);
            cpu::rope_forward(x, pos, inv_freq, scaling);
            ops::rope_forward(*be, d_x, d_pos, d_inv, scaling);
            EXPECT_CLOSE(to_f32(*be, d_x), to_f32(*be, x), dt == kF32 ? 1e-6 : 1e-2);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

TEST(CudaKernels, LinearBf16) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 400;
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{1536, 2048}, {37, 1001}}) {
    TensorBuffer w = random_host(Shape{N, K}, kBF16, seed++, 1.0f / std::sqrt(static_cast<float>(K)));
    TensorBuffer d_w = upload(*be, w);
    for (int64_t M : {1, 3, 17, 300}) {
      TensorBuffer x = random_host(Shape{M, K}, kBF16, seed++);
      TensorBuffer d_x = upload(*be, x);
      for (DType y_dt : {kBF16, kF32}) {
        // bias: none, y's dtype (fused epilogue), f32 on a bf16 y (separate kernel).
        for (int bias_kind = 0; bias_kind < 3; ++bias_kind) {
          const DType b_dt = bias_kind == 1 ? y_dt : kF32;
          SCOPED_TRACE("M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) + " y " +
                       name(y_dt) + " bias " + std::to_string(bias_kind));
          TensorBuffer bias = random_host(Shape{N}, b_dt, seed++);
          TensorBuffer d_bias = upload(*be, bias);
          Tensor hb = bias_kind ? Tensor(bias) : Tensor{};
          Tensor db = bias_kind ? Tensor(d_bias) : Tensor{};
          TensorBuffer y = host_empty(Shape{M, N}, y_dt);
          cpu::linear_forward(y, x, w, hb);
          TensorBuffer d_y = device_empty(*be, Shape{M, N}, y_dt);
          ops::linear_forward(*be, d_y, d_x, d_w, db);
          EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), y_dt == kF32 ? 1e-4 : 1e-2);
          // Same call again (cached plan).
          ops::linear_forward(*be, d_y, d_x, d_w, db);
          EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), y_dt == kF32 ? 1e-4 : 1e-2);
        }
      }
    }
  }
}

TEST(CudaKernels, LinearOtherDtypesAndViews) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 500;
  // f32 inputs run in true f32 (no TF32): 1e-5.
  for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{{1, 37, 1001}, {17, 256, 512}, {300, 1001, 37}}) {
    SCOPED_TRACE("f32 M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
    TensorBuffer x = random_host(Shape{M, K}, kF32, seed++), w = random_host(Shape{N, K}, kF32, seed++);
    TensorBuffer bias = random_host(Shape{N}, kF32, seed++);
    TensorBuffer y = host_empty(Shape{M, N}, kF32);
    cpu::linear_forward(y, x, w, bias);
    TensorBuffer d_x = upload(*be, x), d_w = upload(*be, w), d_b = upload(*be, bias);
    TensorBuffer d_y = device_empty(*be, Shape{M, N}, kF32);
    ops::linear_forward(*be, d_y, d_x, d_w, d_b);
    EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-5);
  }
  // f16 inputs, f16 output; 3-D x.
  {
    TensorBuffer x = random_host(Shape{2, 9, 384}, kF16, seed++), w = random_host(Shape{640, 384}, kF16, seed++, 0.05f);
    TensorBuffer y = host_empty(Shape{2, 9, 640}, kF16);
    cpu::linear_forward(y, x, w, Tensor{});
    TensorBuffer d_x = upload(*be, x), d_w = upload(*be, w);
    TensorBuffer d_y = device_empty(*be, Shape{2, 9, 640}, kF16);
    ops::linear_forward(*be, d_y, d_x, d_w, Tensor{});
    EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-2);
  }
  // Unaligned views (2-byte-aligned operands, odd leading dimensions) in bf16.
  for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{{3, 37, 1001}, {17, 1536, 2048}}) {
    SCOPED_TRACE("views M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
    TensorBuffer x = random_host(Shape{M, K}, kBF16, seed++), w = random_host(Shape{N, K}, kBF16, seed++, 0.05f);
    TensorBuffer bias = random_host(Shape{N}, kBF16, seed++);
    TensorBuffer y = host_empty(Shape{M, N}, kBF16);
    cpu::linear_forward(y, x, w, bias);
    OffsetTensor d_x = upload_offset(*be, x, 1), d_w = upload_offset(*be, w, 3), d_b = upload_offset(*be, bias, 1);
    TensorBuffer y_store = device_empty(*be, Shape{M * N + 1}, kBF16);
    Tensor d_y = y_store.view().rows(1, M * N + 1).view(Shape{M, N});
    ops::linear_forward(*be, d_y, d_x.view, d_w.view, d_b.view);
    EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-2);
  }
}

TEST(CudaKernels, GemmAllTransposes) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 600;
  struct Types {
    DType ab, c;
  };
  for (Types t : {Types{kF32, kF32}, Types{kBF16, kBF16}, Types{kBF16, kF32}}) {
    for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{17, 33, 45}, {64, 128, 256}, {1, 1001, 37}}) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (float beta : {0.0f, 0.25f}) {
            SCOPED_TRACE("ab " + name(t.ab) + " c " + name(t.c) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                         " K=" + std::to_string(K) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                         " beta=" + std::to_string(beta));
            TensorBuffer a = random_host(ta ? Shape{K, M} : Shape{M, K}, t.ab, seed++);
            TensorBuffer b = random_host(tb ? Shape{N, K} : Shape{K, N}, t.ab, seed++);
            TensorBuffer c = random_host(Shape{M, N}, t.c, seed++);
            TensorBuffer d_a = upload(*be, a), d_b = upload(*be, b), d_c = upload(*be, c);
            cpu::gemm(c, a, ta, b, tb, 0.5f, beta);
            ops::gemm(*be, d_c, d_a, ta, d_b, tb, 0.5f, beta);
            const double tol = t.c == kBF16 ? 1e-2 : (t.ab == kF32 ? 1e-5 : 1e-4);
            EXPECT_CLOSE(to_f32(*be, d_c), to_f32(*be, c), tol);
          }
        }
      }
    }
  }
}

// The SIMT kernel gemm.cu falls back to where cuBLASLt has no algorithm, forced through
// KILN_GEMM_FALLBACK=1 on a fresh backend (plans are cached per backend).
TEST(CudaKernels, GemmFallbackKernel) {
  setenv("KILN_GEMM_FALLBACK", "1", 1);
  std::string skip_reason;
  std::unique_ptr<Backend> be = gpu_backend_or_null(&skip_reason);
  if (!be) {
    unsetenv("KILN_GEMM_FALLBACK");
    GTEST_SKIP() << skip_reason;
  }
  uint64_t seed = 650;
  for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{17, 33, 45}, {1, 1001, 37}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                     " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
        TensorBuffer a = random_host(ta ? Shape{K, M} : Shape{M, K}, kBF16, seed++);
        TensorBuffer b = random_host(tb ? Shape{N, K} : Shape{K, N}, kBF16, seed++);
        TensorBuffer c = random_host(Shape{M, N}, kF32, seed++);
        TensorBuffer d_a = upload(*be, a), d_b = upload(*be, b), d_c = upload(*be, c);
        cpu::gemm(c, a, ta, b, tb, 0.5f, 0.25f);
        ops::gemm(*be, d_c, d_a, ta, d_b, tb, 0.5f, 0.25f);
        EXPECT_CLOSE(to_f32(*be, d_c), to_f32(*be, c), 1e-5);
      }
    }
    TensorBuffer x = random_host(Shape{M, K}, kBF16, seed++), w = random_host(Shape{N, K}, kBF16, seed++);
    TensorBuffer bias = random_host(Shape{N}, kBF16, seed++);
    TensorBuffer y = host_empty(Shape{M, N}, kBF16);
    cpu::linear_forward(y, x, w, bias);
    TensorBuffer d_x = upload(*be, x), d_w = upload(*be, w), d_bias = upload(*be, bias);
    TensorBuffer d_y = device_empty(*be, Shape{M, N}, kBF16);
    ops::linear_forward(*be, d_y, d_x, d_w, d_bias);
    EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-2);
  }
  unsetenv("KILN_GEMM_FALLBACK");
}

// ---------------------------------------------------------------------------------------------

TEST(CudaKernels, Swiglu) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 700;
  // 37 and 1001: element by element; 3456 and 4096: chunks of 8, several per thread.
  for (int64_t I : {37, 1001, 3456, 4096}) {
    for (int64_t T : {1, 3, 17, 300}) {
      for (DType dt : {kF32, kBF16}) {
        SCOPED_TRACE("I=" + std::to_string(I) + " T=" + std::to_string(T) + " " + name(dt));
        TensorBuffer gu = random_host(Shape{T, 2 * I}, dt, seed++, 3.0f);
        TensorBuffer out = host_empty(Shape{T, I}, dt);
        cpu::swiglu_forward(out, gu);
        TensorBuffer d_gu = upload(*be, gu);
        TensorBuffer d_out = device_empty(*be, Shape{T, I}, dt);
        ops::swiglu_forward(*be, d_out, d_gu);
        EXPECT_CLOSE(to_f32(*be, d_out), to_f32(*be, out), tol_for(dt));
      }
    }
  }
}

TEST(CudaKernels, BiasAdd) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 800;
  for (auto [M, N] : std::vector<std::pair<int64_t, int64_t>>{{1, 37}, {17, 1001}, {300, 2048}}) {
    for (DType y_dt : {kF32, kBF16}) {
      for (DType b_dt : {kF32, kBF16}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " y " + name(y_dt) + " b " + name(b_dt));
        TensorBuffer y = random_host(Shape{M, N}, y_dt, seed++), bias = random_host(Shape{N}, b_dt, seed++);
        TensorBuffer d_y = upload(*be, y), d_b = upload(*be, bias);
        cpu::bias_add_forward(y, bias);
        ops::bias_add_forward(*be, d_y, d_b);
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_y), to_f32(*be, y)), 0.0);
      }
    }
  }
}

TEST(CudaKernels, AddInplace) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 900;
  struct Types {
    DType a, b;
  };
  for (int64_t n : {1, 7, 37, 1001, 100003, 1 << 20}) {
    for (Types t : {Types{kF32, kF32}, Types{kBF16, kF32}, Types{kBF16, kBF16}, Types{kF16, kF32}}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " " + name(t.a) + " += " + name(t.b) + " offset " + std::to_string(offset));
        TensorBuffer a = random_host(Shape{n}, t.a, seed++), b = random_host(Shape{n}, t.b, seed++);
        OffsetTensor d_a = upload_offset(*be, a, offset);
        TensorBuffer d_b = upload(*be, b);
        cpu::add_inplace(a, b);
        ops::add_inplace(*be, d_a.view, d_b);
        EXPECT_EQ(max_abs_diff(to_f32(*be, d_a.view), to_f32(*be, a)), 0.0);
      }
    }
  }
}

TEST(CudaKernels, Cast) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1000;
  for (int64_t n : {1, 13, 1001, 100003}) {
    for (DType src_dt : {kF32, kBF16, kF16}) {
      for (DType dst_dt : {kF32, kBF16, kF16}) {
        for (int64_t offset : {0, 1}) {
          SCOPED_TRACE("n=" + std::to_string(n) + " " + name(src_dt) + "->" + name(dst_dt) + " offset " +
                       std::to_string(offset));
          TensorBuffer src = random_host(Shape{n}, src_dt, seed++, 100.0f);
          OffsetTensor d_src = upload_offset(*be, src, offset);
          TensorBuffer dst = host_empty(Shape{n}, dst_dt);
          cpu::cast(dst, src);
          TensorBuffer d_dst = device_empty(*be, Shape{n}, dst_dt);
          ops::cast(*be, d_dst, d_src.view);
          EXPECT_EQ(max_abs_diff(to_f32(*be, d_dst), to_f32(*be, dst)), 0.0);
        }
      }
    }
  }
}

TEST(CudaKernels, FillConstantAndNormal) {
  KILN_REQUIRE_GPU(be);
  for (int64_t n : {1, 1001, 1 << 20, 3000017}) {
    for (DType dt : {kF32, kBF16, kF16}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " " + name(dt));
      TensorBuffer c = host_empty(Shape{n}, dt);
      cpu::fill_constant(c, 0.3f);
      TensorBuffer d_c = device_empty(*be, Shape{n}, dt);
      ops::fill_constant(*be, d_c, 0.3f);
      EXPECT_EQ(max_abs_diff(to_f32(*be, d_c), to_f32(*be, c)), 0.0);

      TensorBuffer r = host_empty(Shape{n}, dt);
      cpu::fill_normal(r, 0.02f, 1234);
      TensorBuffer d_r = device_empty(*be, Shape{n}, dt);
      ops::fill_normal(*be, d_r, 0.02f, 1234);
      const std::vector<float> got = to_f32(*be, d_r), want = to_f32(*be, r);
      EXPECT_CLOSE(got, want, dt == kF32 ? 1e-5 : 1e-2);
      if (n >= 1000000) {  // and it is a normal distribution with the right scale
        double s = 0, s2 = 0;
        for (float v : got) {
          s += v;
          s2 += static_cast<double>(v) * v;
        }
        const double mean = s / static_cast<double>(n), var = s2 / static_cast<double>(n) - mean * mean;
        EXPECT_NEAR(mean, 0.0, 1e-4);
        EXPECT_NEAR(std::sqrt(var), 0.02, 2e-4);
      }
    }
  }
}

TEST(CudaKernels, SoftmaxAndLogSoftmax) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1100;
  for (int64_t V : {37, 1003, 100000, 262144}) {
    for (int64_t rows : {1, 3, 17}) {
      for (DType dt : {kF32, kBF16}) {
        SCOPED_TRACE("V=" + std::to_string(V) + " rows=" + std::to_string(rows) + " " + name(dt));
        TensorBuffer x = random_host(Shape{rows, V}, dt, seed++, 4.0f);
        TensorBuffer d_x = upload(*be, x);
        TensorBuffer y = host_empty(Shape{rows, V}, kF32), ly = host_empty(Shape{rows, V}, kF32);
        cpu::softmax_forward(y, x);
        cpu::log_softmax_forward(ly, x);
        TensorBuffer d_y = device_empty(*be, Shape{rows, V}, kF32), d_ly = device_empty(*be, Shape{rows, V}, kF32);
        ops::softmax_forward(*be, d_y, d_x);
        ops::log_softmax_forward(*be, d_ly, d_x);
        EXPECT_CLOSE(to_f32(*be, d_y), to_f32(*be, y), 1e-5);
        EXPECT_CLOSE(to_f32(*be, d_ly), to_f32(*be, ly), 1e-5);
        if (dt == kF32) {  // in place
          ops::log_softmax_forward(*be, d_x, d_x);
          EXPECT_CLOSE(to_f32(*be, d_x), to_f32(*be, ly), 1e-5);
        }
      }
    }
  }
}

TEST(CudaKernels, KvCacheWrite) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1200;
  const int64_t S = 64;
  struct Types {
    DType cache, src;
  };
  for (int64_t D : {64, 18}) {
    for (int64_t Hkv : {1, 2}) {
      for (int64_t T : {1, 3, 17}) {
        for (Types t : {Types{kBF16, kBF16}, Types{kF32, kF32}, Types{kBF16, kF32}}) {
          SCOPED_TRACE("D=" + std::to_string(D) + " Hkv=" + std::to_string(Hkv) + " T=" + std::to_string(T) + " " +
                       name(t.cache) + "<-" + name(t.src));
          TensorBuffer kc = random_host(Shape{S, Hkv, D}, t.cache, seed++), vc = random_host(Shape{S, Hkv, D}, t.cache, seed++);
          TensorBuffer k = random_host(Shape{T, Hkv, D}, t.src, seed++), v = random_host(Shape{T, Hkv, D}, t.src, seed++);
          std::vector<int32_t> perm(S);
          std::iota(perm.begin(), perm.end(), 0);
          for (int64_t i = S - 1; i > 0; --i)  // seeded shuffle: distinct slots
            std::swap(perm[i], perm[static_cast<size_t>(rng::uniform(seed, static_cast<uint64_t>(i)) * (i + 1))]);
          ++seed;
          TensorBuffer slots = host_ints(std::vector<int32_t>(perm.begin(), perm.begin() + T));
          TensorBuffer d_kc = upload(*be, kc), d_vc = upload(*be, vc), d_k = upload(*be, k), d_v = upload(*be, v),
                       d_slots = upload(*be, slots);
          cpu::kv_cache_write(kc, vc, k, v, slots);
          ops::kv_cache_write(*be, d_kc, d_vc, d_k, d_v, d_slots);
          EXPECT_EQ(max_abs_diff(to_f32(*be, d_kc), to_f32(*be, kc)), 0.0);
          EXPECT_EQ(max_abs_diff(to_f32(*be, d_vc), to_f32(*be, vc)), 0.0);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

// The decode-path ops (norm, rope, KV write, linear, swiglu, greedy sampling) captured in a CUDA
// graph and replayed give the same bits as the eager run, and allocate nothing once warm.
TEST(CudaKernels, DecodeOpsGraphCaptureAndNoAllocation) {
  KILN_REQUIRE_GPU(be);
  CudaBackend& cb = static_cast<CudaBackend&>(*be);
  const int64_t H = 1536, I = 4096, V = 32000, heads = 12, D = 128, S = 64;
  uint64_t seed = 1600;
  TensorBuffer x = upload(*be, random_host(Shape{1, H}, kBF16, seed++));
  TensorBuffer res = upload(*be, random_host(Shape{1, H}, kBF16, seed++));
  TensorBuffer norm_w = upload(*be, random_host(Shape{H}, kBF16, seed++));
  TensorBuffer w_q = upload(*be, random_host(Shape{heads * D, H}, kBF16, seed++, 0.03f));
  TensorBuffer w_gu = upload(*be, random_host(Shape{2 * I, H}, kBF16, seed++, 0.03f));
  TensorBuffer w_out = upload(*be, random_host(Shape{V, I}, kBF16, seed++, 0.03f));
  TensorBuffer inv_freq_h = host_empty(Shape{D / 2}, kF32);
  for (int64_t i = 0; i < D / 2; ++i) inv_freq_h.ptr<float>()[i] = std::pow(10000.0f, -2.0f * i / D);
  TensorBuffer inv_freq = upload(*be, inv_freq_h);
  TensorBuffer pos = upload(*be, host_ints({1234}));
  TensorBuffer slots = upload(*be, host_ints({5}));
  TensorBuffer kc = device_empty(*be, Shape{S, heads, D}, kBF16), vc = device_empty(*be, Shape{S, heads, D}, kBF16);
  be->zero(kc);
  be->zero(vc);
  TensorBuffer h = device_empty(*be, Shape{1, H}, kBF16), q = device_empty(*be, Shape{1, heads * D}, kBF16);
  TensorBuffer gu = device_empty(*be, Shape{1, 2 * I}, kBF16), act = device_empty(*be, Shape{1, I}, kBF16);
  TensorBuffer logits = device_empty(*be, Shape{1, V}, kF32), tok = device_empty(*be, Shape{1}, DType::i32);
  const ops::SamplingRow greedy_row;  // defaults: greedy, no penalties, no counts
  TensorBuffer params_host = host_empty(Shape{1, ops::kSamplingRowWords}, DType::i32);
  std::memcpy(params_host.ptr<int32_t>(), &greedy_row, sizeof(greedy_row));
  TensorBuffer params = upload(*be, params_host);
  ops::SamplingBatch greedy;
  greedy.logits = logits;
  greedy.params = params;
  greedy.tokens = tok;
  greedy.full = false;

  auto step = [&] {
    ops::add_rmsnorm_forward(*be, h, res, x, norm_w, 1e-6f);
    ops::linear_forward(*be, q, h, w_q);
    Tensor q3 = q.view().view(Shape{1, heads, D});
    ops::rope_forward(*be, q3, pos, inv_freq, 1.0f);
    ops::kv_cache_write(*be, kc, vc, q3, q3, slots);
    ops::linear_forward(*be, gu, h, w_gu);
    ops::swiglu_forward(*be, act, gu);
    ops::linear_forward(*be, logits, act, w_out);
    ops::softmax_forward(*be, logits, logits);
    ops::sample(*be, greedy);
  };
  // Eager (warm-up: plans cached, scratch sized), keeping the residual as it was.
  TensorBuffer res0 = to_host(*be, res);
  step();
  ASSERT_TRUE(be->synchronize().ok());
  const std::vector<float> eager_logits = to_f32(*be, logits);
  const std::vector<int32_t> eager_tok = host_i32(*be, tok);
  be->copy(res, res0);

  const int64_t in_use = cb.allocator().bytes_in_use(), cached = cb.allocator().bytes_cached();
  const int64_t allocations = be->allocation_count();
  Result<std::unique_ptr<CapturedWork>> graph = be->capture(step);
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  EXPECT_EQ(cb.allocator().bytes_in_use(), in_use);
  EXPECT_EQ(cb.allocator().bytes_cached(), cached);
  be->zero(logits);
  be->zero(tok);
  (*graph)->replay();
  ASSERT_TRUE(be->synchronize().ok());
  const std::vector<float> graph_logits = to_f32(*be, logits);
  ASSERT_EQ(graph_logits.size(), eager_logits.size());
  EXPECT_EQ(0, std::memcmp(graph_logits.data(), eager_logits.data(), graph_logits.size() * sizeof(float)));
  EXPECT_EQ(host_i32(*be, tok), eager_tok);
  for (int r = 0; r < 3; ++r) (*graph)->replay();  // (the residual moves on; only allocations count here)
  ASSERT_TRUE(be->synchronize().ok());
  EXPECT_EQ(be->allocation_count(), allocations) << "capture or replay allocated device memory";
}

// stage_step_inputs / publish_step_outputs (kernels/step_io.h) against the CPU twin, eagerly and in a
// captured graph replayed after the pinned staging changed (the graph reads the staging and writes
// the outputs at every replay): word counts that are not multiples of 4, continued ids inside the
// ids range, negative words outside it, an index past prev_tokens.
TEST(CudaKernels, StepInputsAndOutputs) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  const int64_t words = 4096, ids_begin = 160, n_prev = 64;
  auto pinned = [&](int64_t n) {
    Result<TensorBuffer> r = pinned_host_empty(*be, Shape{n}, DType::i32);
    KILN_ASSERT(r.ok());
    return std::move(r).value();
  };
  TensorBuffer host = pinned(words), out = pinned(words);
  TensorBuffer prev_h = random_ints(Shape{n_prev}, 0, 100000, 31);
  TensorBuffer prev = upload(*be, prev_h);
  TensorBuffer dst = device_empty(*be, Shape{words}, DType::i32);
  TensorBuffer expect = host_empty(Shape{words}, DType::i32);
  uint64_t seed = 40;
  // Random words (some negative), n in word 0, every third id of the ids range continued.
  auto fill = [&](int64_t n, int64_t ids_count) {
    TensorBuffer r = random_ints(Shape{words}, -50, 1000000, seed++);
    int32_t* h = host.ptr<int32_t>();
    std::memcpy(h, r.ptr<int32_t>(), words * 4);
    h[0] = static_cast<int32_t>(n);
    for (int64_t i = 0; i < ids_count; i += 3) h[ids_begin + i] = -1 - static_cast<int32_t>((i * 7) % n_prev);
    if (ids_count > 1) h[ids_begin + 1] = -1 - static_cast<int32_t>(n_prev);
    // What the device buffer holds before (the words past n must stay) and what it should hold after.
    TensorBuffer before = random_ints(Shape{words}, 0, 1000, seed++);
    be->copy(dst, before);
    std::memcpy(expect.ptr<int32_t>(), before.ptr<int32_t>(), words * 4);
    ops::stage_step_inputs(*cpu, expect, host, n, ids_begin, ids_count, prev_h);
  };
  auto expect_words = [&](const std::vector<int32_t>& got) {
    ASSERT_EQ(got.size(), static_cast<size_t>(words));
    for (int64_t w = 0; w < words; ++w) ASSERT_EQ(got[w], expect.ptr<int32_t>()[w]) << "word " << w;
  };
  // expected_words (the words read ahead of n) at, below and above n.
  const std::vector<std::array<int64_t, 3>> eager = {{1, 0, 1}, {163, 3, 0}, {1029, 600, 4096}, {4096, 3936, 2000}};
  for (auto [n, ids_count, ahead] : eager) {
    SCOPED_TRACE("n=" + std::to_string(n) + " ids=" + std::to_string(ids_count) + " ahead=" + std::to_string(ahead));
    fill(n, ids_count);
    ops::stage_step_inputs(*be, dst, host, ahead, ids_begin, ids_count, prev);
    ops::publish_step_outputs(*be, out.view().rows(0, 1000), dst.view().rows(0, 1000));
    ASSERT_TRUE(be->synchronize().ok());
    expect_words(host_i32(*be, dst));
    EXPECT_EQ(0, std::memcmp(out.ptr<int32_t>(), expect.ptr<int32_t>(), 1000 * 4));
  }

  const int64_t ids_count = 200;
  auto step = [&] {
    ops::stage_step_inputs(*be, dst, host, 1000, ids_begin, ids_count, prev);
    ops::publish_step_outputs(*be, out, dst);
  };
  Result<std::unique_ptr<CapturedWork>> graph = be->capture(step);
  ASSERT_TRUE(graph.ok()) << graph.status().message();
  for (int64_t n : {777, 2050, 38}) {
    SCOPED_TRACE("replay, n=" + std::to_string(n));
    fill(n, ids_count);
    std::memset(out.ptr<int32_t>(), 0, words * 4);
    (*graph)->replay();
    ASSERT_TRUE(be->synchronize().ok());
    expect_words(host_i32(*be, dst));
    expect_words(std::vector<int32_t>(out.ptr<int32_t>(), out.ptr<int32_t>() + words));
  }
}

// The step's kernels read its inputs before their programmatic wait (the decode attention reads its
// page tables and issues its first K/V copies there), so stage_step_inputs must complete before the
// next kernel starts. Here the page tables come last in 4 MB of staging (read across PCIe), the
// device buffer holds stale tables of another valid context, and the decode attention follows at
// once: its output must be that of the fresh tables.
TEST(CudaKernels, StepInputsCompleteBeforeTheStepsKernelsStart) {
  KILN_REQUIRE_GPU(be);
  const int64_t Hq = 8, Hkv = 1, D = 64, kPage = 16, pages = 14, words = int64_t(1) << 20;
  uint64_t seed = 90;
  TensorBuffer kc = upload(*be, random_host(Shape{pages * kPage, Hkv, D}, kBF16, seed++));
  TensorBuffer vc = upload(*be, random_host(Shape{pages * kPage, Hkv, D}, kBF16, seed++));
  TensorBuffer q = upload(*be, random_host(Shape{1, Hq, D}, kBF16, seed++));
  // Tables from word `base`: q_indptr at 0, page_indptr at 2, the last page's length at 8, page ids at 12.
  const int64_t base = words - 32;
  auto tables = [](std::vector<int32_t> page_ids, int32_t last) {
    std::vector<int32_t> t = {0, 1, 0, static_cast<int32_t>(page_ids.size()), 0, 0, 0, 0, last, 0, 0, 0};
    t.insert(t.end(), page_ids.begin(), page_ids.end());
    return t;
  };
  const std::vector<int32_t> fresh = tables({3, 9, 1, 12, 5, 0, 7}, 4), stale = tables({10, 2, 8, 4, 11, 6, 13}, 16);
  Result<TensorBuffer> host_r = pinned_host_empty(*be, Shape{words}, DType::i32);
  ASSERT_TRUE(host_r.ok());
  TensorBuffer host = std::move(host_r).value();
  std::memset(host.ptr<int32_t>(), 0, words * 4);
  host.ptr<int32_t>()[0] = static_cast<int32_t>(words);
  std::copy(fresh.begin(), fresh.end(), host.ptr<int32_t>() + base);
  TensorBuffer prev = device_empty(*be, Shape{4}, DType::i32);
  be->zero(prev);
  const ops::AttentionBounds bounds{1, 1, 112};
  auto run = [&](Tensor t) {  // t: the device buffer holding the tables at `base`
    TensorBuffer out = device_empty(*be, Shape{1, Hq, D}, kBF16);
    const PagedKV kv{t.rows(base + 2, base + 4), t.rows(base + 12, base + 19), t.rows(base + 8, base + 9), kPage};
    ops::attention_forward(*be, out, q, kc, vc, t.rows(base, base + 2), kv, bounds, 0.125f);
    return out;
  };
  TensorBuffer ref_tables = device_empty(*be, Shape{words}, DType::i32);
  be->copy(ref_tables.view().rows(base, base + static_cast<int64_t>(fresh.size())), host_ints(fresh));
  const std::vector<float> want = to_f32(*be, run(ref_tables));
  TensorBuffer dst = device_empty(*be, Shape{words}, DType::i32);
  for (int rep = 0; rep < 5; ++rep) {
    be->copy(dst.view().rows(base, base + static_cast<int64_t>(stale.size())), host_ints(stale));
    ASSERT_TRUE(be->synchronize().ok());
    ops::stage_step_inputs(*be, dst, host, words, 0, 0, prev);
    TensorBuffer out = run(dst);
    EXPECT_EQ(to_f32(*be, out), want) << "repetition " << rep;
  }
}

}  // namespace
}  // namespace kiln::test
