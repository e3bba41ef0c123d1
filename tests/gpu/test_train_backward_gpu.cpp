// CUDA backward passes and the training attention-input stage (kernels/cuda/backward.cu) against
// their CPU twins (kernels/cpu/backward.cpp) on random inputs: f32 and bf16 activations, odd sizes
// (scalar paths), unaligned views, every register-cache variant of rmsnorm_backward (warp and block
// per row, rows longer than the cache), many rows for the weight-gradient reductions.
// Both sides read the same storage-rounded inputs. Tolerances (relative L2 error):
//   * activation gradients: 1e-5 for f32 outputs, 1e-2 for bf16 outputs (a last-bit rounding flip);
//   * f32 weight gradients (dw, db, dtable, dq_norm, dk_norm), bf16 inputs included: 1e-5. The bf16
//     inputs are exact in f32 and neither side rounds to bf16 on the way to a weight gradient; what
//     differs is f32 (CUDA) against double (CPU) row statistics and summation order, ~1e-7 relative
//     per term, so the sums agree to ~1e-6 even over thousands of rows (the start values are
//     random, of the size of one term).
// Weight gradients are also checked to be bitwise reproducible (no atomics in their reductions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/ops.h"
#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

constexpr DType kF32 = DType::f32;
constexpr DType kBF16 = DType::bf16;
constexpr double kWeightGradTol = 1e-5;

double tol_for(DType out) { return out == kF32 ? 1e-5 : 1e-2; }

// A device copy of `host` starting `offset` elements into a larger buffer (offset 1: not 16-byte
// aligned, so the kernels take their scalar paths).
struct DeviceTensor {
  TensorBuffer storage;
  Tensor view;
};
DeviceTensor upload_at(Backend& be, Tensor host, int64_t offset) {
  DeviceTensor d;
  d.storage = device_empty(be, Shape{host.numel() + offset}, host.dtype);
  d.view = d.storage.view().rows(offset, host.numel() + offset).view(host.shape);
  be.copy(d.view, host);
  return d;
}

std::string dt_name(DType dt) { return dtype_name(dt); }

// ---- rmsnorm ------------------------------------------------------------------------------------

struct RmsCase {
  int64_t rows, H;
};

TEST(TrainBackwardGpu, RmsnormBackward) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  const float eps = 1e-6f;
  uint64_t seed = 1000;
  // Warp per row (H <= 1024): scalar, 1 and 4 vectors per lane; block per row: 1, 2 and 4 vectors per
  // thread, rows longer than the register cache (8200 vectorised, 2051 scalar); many rows.
  const std::vector<RmsCase> cases = {{1, 7},     {5, 129},   {37, 256},  {64, 1024}, {300, 1536},
                                      {17, 4096}, {9, 8192},  {6, 8200},  {7, 2051},  {3000, 2048}};
  for (const RmsCase& c : cases) {
    for (DType dt : {kF32, kBF16}) {
      for (int64_t offset : {0, 1}) {
        if (offset && c.rows * c.H > 1'000'000) continue;
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE("rows=" + std::to_string(c.rows) + " H=" + std::to_string(c.H) + " " + dt_name(dt) +
                       " offset=" + std::to_string(offset) + " accumulate=" + std::to_string(accumulate));
          TensorBuffer x = random_host({c.rows, c.H}, dt, seed++), dy = random_host({c.rows, c.H}, dt, seed++);
          TensorBuffer w = random_host({c.H}, dt, seed++, 0.5f), dx0 = random_host({c.rows, c.H}, dt, seed++);
          TensorBuffer dw0 = random_host({c.H}, kF32, seed++);
          // CPU reference.
          TensorBuffer dx_ref = host_copy(dx0), dw_ref = host_copy(dw0);
          ops::rmsnorm_backward(*cpu, dx_ref, dw_ref, dy, x, w, eps, accumulate);
          // CUDA.
          DeviceTensor gx = upload_at(*be, x, offset), gdy = upload_at(*be, dy, offset), gw = upload_at(*be, w, offset);
          DeviceTensor gdx = upload_at(*be, dx0, offset);
          TensorBuffer gdw = upload(*be, dw0);
          ops::rmsnorm_backward(*be, gdx.view, gdw, gdy.view, gx.view, gw.view, eps, accumulate);
          ASSERT_TRUE(be->synchronize().ok());
          EXPECT_CLOSE(to_f32(*be, gdx.view), to_f32(*cpu, dx_ref), tol_for(dt));
          EXPECT_CLOSE(to_f32(*be, gdw), to_f32(*cpu, dw_ref), kWeightGradTol);
        }
      }
    }
  }
}

// The bf16 copy of an f32 dx written in the same pass: exactly dx rounded, dx itself unchanged.
TEST(TrainBackwardGpu, RmsnormBackwardWritesTheDxCopy) {
  KILN_REQUIRE_GPU(be);
  for (int64_t H : {2048, 1001, 512}) {
    SCOPED_TRACE("H=" + std::to_string(H));
    const int64_t rows = 300;
    TensorBuffer x = random_host({rows, H}, kF32, 71), dy = random_host({rows, H}, kF32, 72);
    TensorBuffer w = random_host({H}, kF32, 73, 0.5f), dx0 = random_host({rows, H}, kF32, 74);
    TensorBuffer gx = upload(*be, x), gdy = upload(*be, dy), gw = upload(*be, w);
    TensorBuffer plain = upload(*be, dx0), with_copy = upload(*be, dx0);
    Result<TensorBuffer> copy = empty(*be, {rows, H}, kBF16);
    ASSERT_TRUE(copy.ok());
    ops::rmsnorm_backward(*be, plain, Tensor{}, gdy, gx, gw, 1e-6f, true);
    ops::rmsnorm_backward(*be, with_copy, Tensor{}, gdy, gx, gw, 1e-6f, true, *copy);
    const std::vector<float> a = to_f32(*be, plain), b = to_f32(*be, with_copy), c = to_f32(*be, *copy);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i], b[i]) << i;
      ASSERT_EQ(c[i], bf16_to_f32(f32_to_bf16(b[i]))) << i;
    }
  }
}

TEST(TrainBackwardGpu, RmsnormBackwardInPlaceAndDeterministic) {
  KILN_REQUIRE_GPU(be);
  const int64_t rows = 3000, H = 2048;
  TensorBuffer x = random_host({rows, H}, kBF16, 21), dy = random_host({rows, H}, kBF16, 22);
  TensorBuffer w = random_host({H}, kBF16, 23);
  TensorBuffer gx = upload(*be, x), gdy = upload(*be, dy), gw = upload(*be, w);
  TensorBuffer gdx = device_empty(*be, {rows, H}, kBF16);
  TensorBuffer dw_a = device_empty(*be, {H}, kF32), dw_b = device_empty(*be, {H}, kF32);
  be->zero(dw_a);
  be->zero(dw_b);
  ops::rmsnorm_backward(*be, gdx, dw_a, gdy, gx, gw, 1e-5f, false);
  // dx written over dy: the same dx, and the same dw bit for bit.
  ops::rmsnorm_backward(*be, gdy, dw_b, gdy, gx, gw, 1e-5f, false);
  ASSERT_TRUE(be->synchronize().ok());
  TensorBuffer a = to_host(*be, gdx), b = to_host(*be, gdy);
  EXPECT_EQ(std::memcmp(a.view().data, b.view().data, static_cast<size_t>(a.view().nbytes())), 0);
  TensorBuffer wa = to_host(*be, dw_a), wb = to_host(*be, dw_b);
  EXPECT_EQ(std::memcmp(wa.view().data, wb.view().data, static_cast<size_t>(H * 4)), 0);
}

// ---- swiglu -------------------------------------------------------------------------------------

TEST(TrainBackwardGpu, SwigluBackward) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  uint64_t seed = 2000;
  for (auto [T, I] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 5}, {17, 33}, {64, 1024}, {300, 2816}}) {
    for (DType dt : {kF32, kBF16}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " I=" + std::to_string(I) + " " + dt_name(dt) +
                     " offset=" + std::to_string(offset));
        TensorBuffer gu = random_host({T, 2 * I}, dt, seed++, 2.0f), d = random_host({T, I}, dt, seed++);
        TensorBuffer ref = host_empty({T, 2 * I}, dt);
        ops::swiglu_backward(*cpu, ref, d, gu);
        DeviceTensor ggu = upload_at(*be, gu, offset), gd = upload_at(*be, d, offset);
        TensorBuffer out = device_empty(*be, {T, 2 * I}, dt);
        ops::swiglu_backward(*be, out, gd.view, ggu.view);
        // In place over gate_up.
        ops::swiglu_backward(*be, ggu.view, gd.view, ggu.view);
        ASSERT_TRUE(be->synchronize().ok());
        const std::vector<float> want = to_f32(*cpu, ref);
        EXPECT_CLOSE(to_f32(*be, out), want, tol_for(dt));
        EXPECT_CLOSE(to_f32(*be, ggu.view), want, tol_for(dt));
      }
    }
  }
}

// ---- embedding, bias ----------------------------------------------------------------------------

TEST(TrainBackwardGpu, EmbeddingBackwardRepeatedIds) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  uint64_t seed = 3000;
  for (auto [V, H] : std::vector<std::pair<int64_t, int64_t>>{{1003, 37}, {1003, 64}, {50, 1536}}) {
    for (DType dt : {kF32, kBF16}) {
      for (int64_t T : {1, 17, 700}) {
        SCOPED_TRACE("V=" + std::to_string(V) + " H=" + std::to_string(H) + " T=" + std::to_string(T) + " " +
                     dt_name(dt));
        TensorBuffer ids = random_ints({T}, 0, static_cast<int32_t>(std::min<int64_t>(V, 40)), seed++);  // repeats
        TensorBuffer dy = random_host({T, H}, dt, seed++), table0 = random_host({V, H}, kF32, seed++);
        TensorBuffer ref = host_copy(table0);
        ops::embedding_backward(*cpu, ref, dy, ids);
        TensorBuffer gtable = upload(*be, table0), gdy = upload(*be, dy), gids = upload(*be, ids);
        ops::embedding_backward(*be, gtable, gdy, gids);
        ASSERT_TRUE(be->synchronize().ok());
        EXPECT_CLOSE(to_f32(*be, gtable), to_f32(*cpu, ref), kWeightGradTol);
      }
    }
  }
}

TEST(TrainBackwardGpu, BiasBackward) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  uint64_t seed = 4000;
  for (auto [M, N] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 3}, {1000, 37}, {3000, 2560}, {20000, 8}}) {
    for (DType dt : {kF32, kBF16}) {
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " " + dt_name(dt) +
                     " offset=" + std::to_string(offset));
        TensorBuffer dy = random_host({M, N}, dt, seed++), db0 = random_host({N}, kF32, seed++);
        TensorBuffer ref = host_copy(db0);
        ops::bias_backward(*cpu, ref, dy);
        DeviceTensor gdy = upload_at(*be, dy, offset);
        TensorBuffer gdb = upload(*be, db0), gdb2 = upload(*be, db0);
        ops::bias_backward(*be, gdb, gdy.view);
        ops::bias_backward(*be, gdb2, gdy.view);
        ASSERT_TRUE(be->synchronize().ok());
        EXPECT_CLOSE(to_f32(*be, gdb), to_f32(*cpu, ref), kWeightGradTol);
        TensorBuffer a = to_host(*be, gdb), b = to_host(*be, gdb2);
        EXPECT_EQ(std::memcmp(a.view().data, b.view().data, static_cast<size_t>(N * 4)), 0) << "not reproducible";
      }
    }
  }
}

// ---- qkv_split_rope -----------------------------------------------------------------------------

struct QkvCase {
  int64_t B, S, Hq, Hkv, D;
  bool norms;
};

std::string qkv_name(const QkvCase& c, DType dt) {
  return "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " Hq=" + std::to_string(c.Hq) +
         " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " norms=" + std::to_string(c.norms) + " " +
         dt_name(dt);
}

const std::vector<QkvCase>& qkv_cases() {
  static const std::vector<QkvCase> cases = {
      {2, 37, 16, 4, 128, true}, {1, 5, 3, 1, 10, false}, {3, 17, 8, 8, 64, true},
      {1, 3, 2, 1, 256, true},   {2, 9, 4, 2, 128, false}, {4, 512, 16, 8, 128, true},  // more tokens than blocks
  };
  return cases;
}

struct QkvInputs {
  TensorBuffer qkv, positions, inv_freq, q_norm, k_norm;
};

QkvInputs make_inputs(const QkvCase& c, DType dt, uint64_t seed) {
  const int64_t T = c.B * c.S, W = (c.Hq + 2 * c.Hkv) * c.D;
  QkvInputs in;
  in.qkv = random_host({T, W}, dt, seed);
  in.positions = random_ints({T}, 0, 40000, seed + 1);
  in.q_norm = random_host({c.D}, dt, seed + 2);
  in.k_norm = random_host({c.D}, dt, seed + 3);
  in.inv_freq = host_empty({c.D / 2}, kF32);
  for (int64_t i = 0; i < c.D / 2; ++i)
    in.inv_freq.ptr<float>()[i] = static_cast<float>(std::pow(1e6, -2.0 * static_cast<double>(i) / c.D));
  return in;
}

TEST(TrainBackwardGpu, QkvSplitRopeForward) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  uint64_t seed = 5000;
  const float scaling = 1.1f, eps = 1e-6f;
  for (const QkvCase& c : qkv_cases()) {
    for (DType dt : {kF32, kBF16}) {
      SCOPED_TRACE(qkv_name(c, dt));
      QkvInputs in = make_inputs(c, dt, seed);
      seed += 10;
      const Shape qs{c.B, c.Hq, c.S, c.D}, ks{c.B, c.Hkv, c.S, c.D};
      TensorBuffer q = host_empty(qs, dt), k = host_empty(ks, dt), v = host_empty(ks, dt);
      ops::qkv_split_rope_forward(*cpu, q, k, v, in.qkv, in.positions, in.inv_freq, scaling,
                                  c.norms ? in.q_norm.view() : Tensor{}, c.norms ? in.k_norm.view() : Tensor{}, eps);
      TensorBuffer gqkv = upload(*be, in.qkv), gpos = upload(*be, in.positions), ginv = upload(*be, in.inv_freq);
      TensorBuffer gqn = upload(*be, in.q_norm), gkn = upload(*be, in.k_norm);
      TensorBuffer gq = device_empty(*be, qs, dt), gk = device_empty(*be, ks, dt), gv = device_empty(*be, ks, dt);
      ops::qkv_split_rope_forward(*be, gq, gk, gv, gqkv, gpos, ginv, scaling, c.norms ? gqn.view() : Tensor{},
                                  c.norms ? gkn.view() : Tensor{}, eps);
      ASSERT_TRUE(be->synchronize().ok());
      EXPECT_CLOSE(to_f32(*be, gq), to_f32(*cpu, q), tol_for(dt));
      EXPECT_CLOSE(to_f32(*be, gk), to_f32(*cpu, k), tol_for(dt));
      EXPECT_EQ(to_f32(*be, gv), to_f32(*cpu, v));  // a copy
    }
  }
}

TEST(TrainBackwardGpu, QkvSplitRopeBackward) {
  KILN_REQUIRE_GPU(be);
  auto cpu = make_cpu_backend();
  uint64_t seed = 6000;
  const float scaling = 1.1f, eps = 1e-6f;
  for (const QkvCase& c : qkv_cases()) {
    for (DType dt : {kF32, kBF16}) {
      SCOPED_TRACE(qkv_name(c, dt));
      QkvInputs in = make_inputs(c, dt, seed);
      const int64_t T = c.B * c.S, W = (c.Hq + 2 * c.Hkv) * c.D;
      const Shape qs{c.B, c.Hq, c.S, c.D}, ks{c.B, c.Hkv, c.S, c.D};
      TensorBuffer dq = random_host(qs, dt, seed + 5), dk = random_host(ks, dt, seed + 6), dv = random_host(ks, dt, seed + 7);
      TensorBuffer dqn0 = random_host({c.D}, kF32, seed + 8), dkn0 = random_host({c.D}, kF32, seed + 9);
      seed += 10;
      const Tensor qn = c.norms ? in.q_norm.view() : Tensor{}, kn = c.norms ? in.k_norm.view() : Tensor{};
      TensorBuffer d_qkv = host_empty({T, W}, dt), dqn = host_copy(dqn0), dkn = host_copy(dkn0);
      ops::qkv_split_rope_backward(*cpu, d_qkv, c.norms ? dqn.view() : Tensor{}, c.norms ? dkn.view() : Tensor{}, dq, dk,
                                   dv, in.qkv, in.positions, in.inv_freq, scaling, qn, kn, eps);

      TensorBuffer gqkv = upload(*be, in.qkv), gpos = upload(*be, in.positions), ginv = upload(*be, in.inv_freq);
      TensorBuffer gqn = upload(*be, in.q_norm), gkn = upload(*be, in.k_norm);
      TensorBuffer gdq = upload(*be, dq), gdk = upload(*be, dk), gdv = upload(*be, dv);
      TensorBuffer gdqn = upload(*be, dqn0), gdkn = upload(*be, dkn0);
      TensorBuffer gd_qkv = device_empty(*be, {T, W}, dt);
      ops::qkv_split_rope_backward(*be, gd_qkv, c.norms ? gdqn.view() : Tensor{}, c.norms ? gdkn.view() : Tensor{},
                                   gdq, gdk, gdv, gqkv, gpos, ginv, scaling, c.norms ? gqn.view() : Tensor{},
                                   c.norms ? gkn.view() : Tensor{}, eps);
      ASSERT_TRUE(be->synchronize().ok());
      EXPECT_CLOSE(to_f32(*be, gd_qkv), to_f32(*cpu, d_qkv), tol_for(dt));
      if (c.norms) {
        EXPECT_CLOSE(to_f32(*be, gdqn), to_f32(*cpu, dqn), kWeightGradTol);
        EXPECT_CLOSE(to_f32(*be, gdkn), to_f32(*cpu, dkn), kWeightGradTol);
      } else {
        EXPECT_EQ(to_f32(*be, gdqn), to_f32(*cpu, dqn0));  // absent norms: untouched
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
