// CUDA twins of the fused cross-entropy op and the optimizer updates (kernels/cuda/loss_optim.cu)
// against their CPU twins (kernels/cpu/loss_optim.cpp) on random inputs; both sides start from the
// same storage-rounded values.
//   * Cross entropy: V = 128256 (the Llama 3 vocabulary, the training shape) and odd V = 1001 (rows
//     at every alignment: scalar head, vectors, scalar tail), R = 64, f32 and bf16 logits, label
//     smoothing, ignored rows, grad_scale, write_grad = false, and a view offset by a few elements.
//     Losses and logprobs within 1e-5 absolute (~1e-6 of the log-sum-exp, ~12 here). Gradients
//     elementwise: the GPU's softmax probability p carries an f32 exponent (|x log2 e - lse log2 e|
//     up to ~40, rounded to half an ulp: <= 2.6e-6 relative in p), so
//       |gpu - cpu| <= u * |cpu| + 4e-6 * (|cpu| + grad_scale * (ls / V + (1 - ls) [v == t]))
//     with u the storage rounding (2^-23 for f32, one bf16 ulp 2^-7 for bf16), plus 1e-37 for
//     probabilities below 2^-126 that the GPU flushes to zero.
//     The reinforcement-learning options (logit_scale 0.7 / 1.3, row_scales of random signs and
//     magnitudes, entropies) under the same bounds, grad_scale replaced by |grad_scale * row_scale *
//     logit_scale| in the gradient bound and entropies within 1e-5 like the losses; and exact
//     identities of the CUDA twin alone: row scales of 1 change no bit, and logit_scale = 2 on x
//     gives the bits of logit_scale = 1 on 2x (a gradient exactly doubled).
//   * AdamW over N = 10,000,003 (a float4 body and an odd tail) with an odd decay_end, several steps,
//     bf16 compute copy; and an unaligned view (scalar kernel) with an f16 copy. The CUDA twin performs
//     the CPU twin's f32 operations with explicitly rounded intrinsics, so params, exp_avg and
//     exp_avg_sq agree bit for bit (checked, besides the 1e-6 relative bound), and the compute copy
//     equals the CPU's f32 result rounded.
//   * SGD likewise (bit for bit); sum_squares on 50M elements (both sides accumulate in double: 1e-12
//     relative), an unaligned view, tiny and empty vectors, NaN and inf giving a non-finite result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_train_ops.h"
#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

// A device copy of `host` whose data pointer is `offset` elements into a larger buffer (not 16-byte
// aligned for offsets that are not multiples of 16 bytes).
struct OffsetTensor {
  TensorBuffer storage;
  Tensor view;
};
OffsetTensor upload_offset(Backend& be, Tensor host, int64_t offset) {
  const int64_t n = host.numel();
  OffsetTensor o;
  o.storage = device_empty(be, Shape{n + offset}, host.dtype);
  o.view = o.storage.view().rows(offset, n + offset).view(host.shape);
  be.copy(o.view, host);
  return o;
}

std::vector<uint8_t> bytes_of(Backend& be, Tensor t) {
  TensorBuffer h = to_host(be, t);
  return std::vector<uint8_t>(h.ptr<uint8_t>(), h.ptr<uint8_t>() + t.nbytes());
}

// Number of elements whose f32 bit patterns differ.
int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  KILN_ASSERT(a.size() == b.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// |a - b| <= rtol * |b| everywhere (NaN fails); reports the first few violations.
void expect_rel_close(const std::vector<float>& a, const std::vector<float>& b, double rtol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t failures = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(err <= rtol * std::fabs(static_cast<double>(b[i]))) && ++failures <= 5)
      ADD_FAILURE() << what << " index " << i << ": gpu " << a[i] << ", cpu " << b[i];
  }
  EXPECT_EQ(failures, 0) << what;
}

// ---- Cross entropy ------------------------------------------------------------------------------

// Row scales of random signs and magnitudes (|s| from 1e-2 to 10), one exactly 0.
std::vector<float> random_row_scales(int64_t R, uint64_t seed) {
  TensorBuffer mag = random_ints(Shape{R}, -200, 101, seed), sign = random_ints(Shape{R}, 0, 2, seed + 1);
  std::vector<float> s(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    s[r] = static_cast<float>((sign.ptr<int32_t>()[r] ? -1.0 : 1.0) * std::pow(10.0, mag.ptr<int32_t>()[r] / 100.0));
  if (R > 3) s[3] = 0.0f;
  return s;
}

TensorBuffer host_floats(const std::vector<float>& v) {
  TensorBuffer t = host_empty(Shape{static_cast<int64_t>(v.size())}, DType::f32);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

// The RL options of one check: logit_scale, and whether row scales / entropies are passed.
struct CeRl {
  float logit_scale = 1.0f;
  bool row_scales = false;
  bool entropies = false;
};

void check_cross_entropy(Backend& be, int64_t R, int64_t V, DType dt, float ls, float gs, bool write_grad,
                         int64_t offset, uint64_t seed, CeRl rl = {}) {
  SCOPED_TRACE("R=" + std::to_string(R) + " V=" + std::to_string(V) + " " + dtype_name(dt) + " ls=" +
               std::to_string(ls) + " gs=" + std::to_string(gs) + " write_grad=" + std::to_string(write_grad) +
               " offset=" + std::to_string(offset) + " logit_scale=" + std::to_string(rl.logit_scale) +
               " row_scales=" + std::to_string(rl.row_scales) + " entropies=" + std::to_string(rl.entropies));
  TensorBuffer logits = random_host(Shape{R, V}, dt, seed, 2.0f);
  TensorBuffer tg = random_ints(Shape{R}, 0, static_cast<int32_t>(V), seed + 1);
  std::vector<int32_t> targets(tg.ptr<int32_t>(), tg.ptr<int32_t>() + R);
  for (int64_t r = 0; r < R; r += 7) targets[r] = -100;  // ignored rows
  targets[1] = 0;
  targets[2] = static_cast<int32_t>(V - 1);
  TensorBuffer tgt = host_ints(targets);
  const std::vector<float> scales = rl.row_scales ? random_row_scales(R, seed + 2) : std::vector<float>(R, 1.0f);
  TensorBuffer h_scales = host_floats(scales);

  ops::CrossEntropyOptions o;
  o.label_smoothing = ls;
  o.grad_scale = gs;
  o.write_grad = write_grad;
  o.logit_scale = rl.logit_scale;

  // CPU twin, in place on a host copy.
  TensorBuffer cpu_logits = host_copy(logits);
  TensorBuffer cpu_loss = host_empty(Shape{R}, DType::f32), cpu_logp = host_empty(Shape{R}, DType::f32);
  TensorBuffer cpu_ent = host_empty(Shape{R}, DType::f32);
  ops::CrossEntropyOptions cpu_o = o;
  if (rl.row_scales) cpu_o.row_scales = h_scales;
  if (rl.entropies) cpu_o.entropies = cpu_ent;
  cpu::cross_entropy_forward_backward(cpu_logits, cpu_loss, cpu_logp, tgt, cpu_o);

  OffsetTensor d_logits = upload_offset(be, logits, offset);
  TensorBuffer d_tgt = upload(be, tgt);
  TensorBuffer d_loss = device_empty(be, Shape{R}, DType::f32), d_logp = device_empty(be, Shape{R}, DType::f32);
  TensorBuffer d_ent = device_empty(be, Shape{R}, DType::f32), d_scales = upload(be, h_scales);
  ops::CrossEntropyOptions gpu_o = o;
  if (rl.row_scales) gpu_o.row_scales = d_scales;
  if (rl.entropies) gpu_o.entropies = d_ent;
  ops::cross_entropy_forward_backward(be, d_logits.view, d_loss, d_logp, d_tgt, gpu_o);

  const std::vector<float> loss = to_f32(be, d_loss), logp = to_f32(be, d_logp);
  const std::vector<float> ref_loss = to_f32(be, cpu_loss), ref_logp = to_f32(be, cpu_logp);
  std::vector<float> ent, ref_ent;
  if (rl.entropies) {
    ent = to_f32(be, d_ent);
    ref_ent = to_f32(be, cpu_ent);
  }
  for (int64_t r = 0; r < R; ++r) {
    EXPECT_NEAR(loss[r], ref_loss[r], 1e-5) << "row " << r;
    EXPECT_NEAR(logp[r], ref_logp[r], 1e-5) << "row " << r;
    if (rl.entropies) {
      EXPECT_NEAR(ent[r], ref_ent[r], 1e-5) << "entropy row " << r;
    }
    if (targets[r] < 0) {
      EXPECT_EQ(loss[r], 0.0f) << "row " << r;
      EXPECT_EQ(logp[r], 0.0f) << "row " << r;
      if (rl.entropies) {
        EXPECT_EQ(ent[r], 0.0f) << "entropy row " << r;
      }
    }
  }

  if (!write_grad) {
    EXPECT_EQ(bytes_of(be, d_logits.view), std::vector<uint8_t>(logits.ptr<uint8_t>(),
                                                                 logits.ptr<uint8_t>() + logits.view().nbytes()));
    return;
  }
  const std::vector<float> grad = to_f32(be, d_logits.view), ref = to_f32(be, cpu_logits);
  const double u = dt == DType::f32 ? std::ldexp(1.0, -23) : std::ldexp(1.0, -7);
  const double smooth = static_cast<double>(ls) / static_cast<double>(V), hot = 1.0 - ls;
  int64_t failures = 0;
  for (int64_t r = 0; r < R; ++r) {
    // The row's gradient factor (grad_scale alone without the RL options).
    const double k = std::fabs(static_cast<double>(gs) * scales[r] * rl.logit_scale);
    for (int64_t v = 0; v < V; ++v) {
      const int64_t i = r * V + v;
      const double b = ref[i];
      const double scale = targets[r] < 0 ? 0.0 : k * (smooth + (v == targets[r] ? hot : 0.0));
      // 1e-37: the GPU flushes probabilities below 2^-126 to zero.
      const double tol = u * std::fabs(b) + 4e-6 * (std::fabs(b) + scale) + 1e-37;
      if (!(std::fabs(static_cast<double>(grad[i]) - b) <= tol) && ++failures <= 5)
        ADD_FAILURE() << "grad row " << r << " v " << v << ": gpu " << grad[i] << ", cpu " << b;
    }
  }
  EXPECT_EQ(failures, 0);
  EXPECT_CLOSE(grad, ref, dt == DType::f32 ? 1e-5 : 1e-2);
}

TEST(LossOptimGpu, CrossEntropyMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1;
  for (int64_t V : {128256, 1001}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      for (float ls : {0.0f, 0.1f}) {
        check_cross_entropy(*be, 64, V, dt, ls, 1.0f / 64, true, 0, seed);
        seed += 2;
      }
      check_cross_entropy(*be, 64, V, dt, 0.1f, 1.0f, false, 0, seed);
      seed += 2;
      // Rows that start off the 16-byte grid (scalar head), in place.
      check_cross_entropy(*be, 13, V, dt, 0.0f, 0.5f, true, 3, seed);
      seed += 2;
    }
  }
  // Small and degenerate widths: a row shorter than one vector, V = 1.
  for (int64_t V : {1, 5, 8, 9, 17}) {
    check_cross_entropy(*be, 33, V, DType::bf16, 0.1f, 1.0f, true, 1, seed);
    check_cross_entropy(*be, 33, V, DType::f32, 0.0f, 2.0f, true, 0, seed + 2);
    seed += 4;
  }
}

// The RL options against the CPU twin: both logit scales, row scales and entropies alone and
// together, at the training shape and an odd V (scalar head and tail), both dtypes, with label
// smoothing, without the gradient, and off the 16-byte grid.
TEST(LossOptimGpu, CrossEntropyRlOptionsMatchCpu) {
  KILN_REQUIRE_GPU(be);
  uint64_t seed = 1001;
  for (int64_t V : {128256, 1001}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      for (float c : {0.7f, 1.3f}) {
        check_cross_entropy(*be, 64, V, dt, 0.0f, 1.0f / 64, true, 0, seed, CeRl{c, true, true});
        check_cross_entropy(*be, 64, V, dt, 0.1f, 1.0f / 64, true, 0, seed + 3, CeRl{c, false, true});
        check_cross_entropy(*be, 64, V, dt, 0.1f, 0.5f, true, 0, seed + 6, CeRl{c, true, false});
        check_cross_entropy(*be, 64, V, dt, 0.1f, 1.0f, false, 0, seed + 9, CeRl{c, true, true});
        check_cross_entropy(*be, 13, V, dt, 0.0f, 0.5f, true, 3, seed + 12, CeRl{c, true, true});
        seed += 15;
      }
      // logit_scale 1 with entropies / row scales.
      check_cross_entropy(*be, 64, V, dt, 0.1f, 1.0f / 64, true, 0, seed, CeRl{1.0f, true, true});
      check_cross_entropy(*be, 64, V, dt, 0.0f, 1.0f, true, 0, seed + 3, CeRl{1.0f, false, true});
      seed += 6;
    }
  }
  for (int64_t V : {1, 5, 8, 9, 17}) {
    check_cross_entropy(*be, 33, V, DType::bf16, 0.1f, 1.0f, true, 1, seed, CeRl{1.3f, true, true});
    check_cross_entropy(*be, 33, V, DType::f32, 0.0f, 2.0f, true, 0, seed + 3, CeRl{0.7f, true, true});
    seed += 6;
  }
}

// Exact identities of the CUDA twin: row scales of 1 give the bits of no row scales (the plain
// op's path), and logit_scale = 2 (hi and lo exactly doubled) on x gives the bits of logit_scale = 1
// on 2x for loss, logprob and entropy, with the gradient exactly doubled.
TEST(LossOptimGpu, CrossEntropyRlOptionsExactIdentities) {
  KILN_REQUIRE_GPU(be);
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t R = 24, V = 50021;
    TensorBuffer logits = random_host(Shape{R, V}, dt, 77, 2.0f);
    const std::vector<float> x = to_f32(*be, logits);
    std::vector<float> x2(x);
    for (float& e : x2) e *= 2.0f;
    TensorBuffer logits2 = host_empty(Shape{R, V}, dt);
    cpu::detail::store_f32(logits2, 0, R * V, x2.data());
    TensorBuffer tg = random_ints(Shape{R}, 0, static_cast<int32_t>(V), 78);
    std::vector<int32_t> targets(tg.ptr<int32_t>(), tg.ptr<int32_t>() + R);
    targets[5] = -100;
    TensorBuffer d_tgt = upload(*be, host_ints(targets));
    TensorBuffer d_ones = upload(*be, host_floats(std::vector<float>(R, 1.0f)));

    struct Out {
      std::vector<float> loss, logp, ent, grad;
    };
    auto run = [&](Tensor host_logits, float c, bool ones, bool entropies) {
      TensorBuffer d = upload(*be, host_logits);
      TensorBuffer loss = device_empty(*be, Shape{R}, DType::f32), logp = device_empty(*be, Shape{R}, DType::f32);
      TensorBuffer ent = device_empty(*be, Shape{R}, DType::f32);
      ops::CrossEntropyOptions o;
      o.label_smoothing = 0.1f;
      o.grad_scale = 0.3f;
      o.write_grad = true;
      o.logit_scale = c;
      if (ones) o.row_scales = d_ones;
      if (entropies) o.entropies = ent;
      ops::cross_entropy_forward_backward(*be, d, loss, logp, d_tgt, o);
      Out out{to_f32(*be, loss), to_f32(*be, logp), {}, to_f32(*be, d)};
      if (entropies) out.ent = to_f32(*be, ent);
      return out;
    };
    const Out plain = run(logits, 1.0f, false, false), ones = run(logits, 1.0f, true, false);
    EXPECT_EQ(bit_mismatches(plain.loss, ones.loss), 0);
    EXPECT_EQ(bit_mismatches(plain.logp, ones.logp), 0);
    EXPECT_EQ(bit_mismatches(plain.grad, ones.grad), 0);
    for (bool entropies : {false, true}) {
      SCOPED_TRACE("entropies=" + std::to_string(entropies));
      const Out scaled = run(logits, 2.0f, false, entropies), doubled = run(logits2, 1.0f, false, entropies);
      EXPECT_EQ(bit_mismatches(scaled.loss, doubled.loss), 0);
      EXPECT_EQ(bit_mismatches(scaled.logp, doubled.logp), 0);
      EXPECT_EQ(bit_mismatches(scaled.ent, doubled.ent), 0);
      std::vector<float> twice(doubled.grad);
      for (float& g : twice) g *= 2.0f;
      EXPECT_EQ(bit_mismatches(scaled.grad, twice), 0);
    }
  }
}

// ---- Optimizers -----------------------------------------------------------------------------------

void check_adamw(Backend& be, int64_t N, int64_t decay_end, DType lowp_dt, int64_t offset, int steps) {
  SCOPED_TRACE("N=" + std::to_string(N) + " decay_end=" + std::to_string(decay_end) + " lowp=" +
               dtype_name(lowp_dt) + " offset=" + std::to_string(offset));
  TensorBuffer p = random_host(Shape{N}, DType::f32, 10, 0.1f);
  TensorBuffer m = host_empty(Shape{N}, DType::f32), v = host_empty(Shape{N}, DType::f32);
  std::memset(m.ptr<void>(), 0, static_cast<size_t>(m.view().nbytes()));
  std::memset(v.ptr<void>(), 0, static_cast<size_t>(v.view().nbytes()));
  TensorBuffer lowp = host_empty(Shape{N}, lowp_dt);
  OffsetTensor dp = upload_offset(be, p, offset), dm = upload_offset(be, m, offset), dv = upload_offset(be, v, offset);
  OffsetTensor dlowp = upload_offset(be, lowp, offset);

  ops::AdamWStep h;
  h.lr = 1e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.grad_scale = 0.7f;
  h.decay_end = decay_end;
  for (int step = 1; step <= steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    h.step = step;
    TensorBuffer g = random_host(Shape{N}, DType::f32, 100 + static_cast<uint64_t>(step), 0.01f);
    g.ptr<float>()[N / 2] = 0.0f;
    OffsetTensor dg = upload_offset(be, g, offset);
    cpu::adamw_step(p, g, m, v, lowp, h);
    ops::adamw_step(be, dp.view, dg.view, dm.view, dv.view, dlowp.view, h);

    const std::vector<float> gp = to_f32(be, dp.view), cp = to_f32(be, p);
    const std::vector<float> gm = to_f32(be, dm.view), cm = to_f32(be, m);
    const std::vector<float> gv = to_f32(be, dv.view), cv = to_f32(be, v);
    expect_rel_close(gp, cp, 1e-6, "params");
    expect_rel_close(gv, cv, 1e-6, "exp_avg_sq");
    EXPECT_EQ(bit_mismatches(gp, cp), 0) << "params not bit-identical to the CPU twin";
    EXPECT_EQ(bit_mismatches(gm, cm), 0) << "exp_avg not bit-identical to the CPU twin";
    EXPECT_EQ(bit_mismatches(gv, cv), 0) << "exp_avg_sq not bit-identical to the CPU twin";
    // The compute copy is the CPU's f32 result rounded (the CPU twin rounds the same way).
    const std::vector<float> glow = to_f32(be, dlowp.view);
    int64_t bad = 0;
    for (int64_t i = 0; i < N; ++i) {
      const float want = lowp_dt == DType::bf16 ? bf16_to_f32(f32_to_bf16(cp[i])) : f16_to_f32(f32_to_f16(cp[i]));
      bad += glow[i] != want;
    }
    EXPECT_EQ(bad, 0) << "compute copy differs from the rounded CPU params";
  }
}

TEST(LossOptimGpu, AdamWMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  check_adamw(*be, 10'000'003, 4'999'999, DType::bf16, 0, 3);
  check_adamw(*be, 100'001, 33'333, DType::f16, 1, 2);  // unaligned: the scalar kernel
  check_adamw(*be, 7, 3, DType::bf16, 0, 2);             // one vector and a tail of 3
}

void check_sgd(Backend& be, int64_t N, int64_t decay_end, DType lowp_dt, int64_t offset) {
  SCOPED_TRACE("N=" + std::to_string(N) + " decay_end=" + std::to_string(decay_end) + " offset=" +
               std::to_string(offset));
  TensorBuffer p = random_host(Shape{N}, DType::f32, 20, 0.1f);
  TensorBuffer lowp = host_empty(Shape{N}, lowp_dt);
  OffsetTensor dp = upload_offset(be, p, offset), dlowp = upload_offset(be, lowp, offset);
  for (int step = 0; step < 2; ++step) {
    TensorBuffer g = random_host(Shape{N}, DType::f32, 30 + static_cast<uint64_t>(step), 0.01f);
    OffsetTensor dg = upload_offset(be, g, offset);
    cpu::sgd_step(p, g, lowp, 0.05f, 0.01f, 0.5f, decay_end);
    ops::sgd_step(be, dp.view, dg.view, dlowp.view, 0.05f, 0.01f, 0.5f, decay_end);
    const std::vector<float> gp = to_f32(be, dp.view), cp = to_f32(be, p);
    expect_rel_close(gp, cp, 1e-6, "params");
    EXPECT_EQ(bit_mismatches(gp, cp), 0) << "params not bit-identical to the CPU twin";
    EXPECT_EQ(bit_mismatches(to_f32(be, dlowp.view), to_f32(be, lowp)), 0) << "compute copy";
  }
  // Without a compute copy.
  TensorBuffer g = random_host(Shape{N}, DType::f32, 40, 0.01f);
  OffsetTensor dg = upload_offset(be, g, offset);
  cpu::sgd_step(p, g, Tensor{}, 0.1f, 0.0f, 1.0f, 0);
  ops::sgd_step(be, dp.view, dg.view, Tensor{}, 0.1f, 0.0f, 1.0f, 0);
  EXPECT_EQ(bit_mismatches(to_f32(be, dp.view), to_f32(be, p)), 0);
}

TEST(LossOptimGpu, SgdMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  check_sgd(*be, 10'000'003, 5'000'001, DType::bf16, 0);
  check_sgd(*be, 100'001, 777, DType::f16, 3);
}

TEST(LossOptimGpu, SumSquaresMatchesCpu) {
  KILN_REQUIRE_GPU(be);
  TensorBuffer x = random_host(Shape{50'000'000}, DType::f32, 50, 1.5f);
  TensorBuffer dx = upload(*be, x);
  const double ref = cpu::sum_squares(x);
  // Both sides sum 5e7 positive terms in double in different orders: each is within about
  // sqrt(n) * 2^-53 ~ 1e-12 relative of the exact sum (the first run saw 1.6e-12 between them),
  // bounded by n * 2^-53 ~ 6e-9. 1e-9 keeps three orders of magnitude below f32 accumulation.
  EXPECT_NEAR(ops::sum_squares(*be, dx), ref, 1e-9 * ref);

  // Unaligned view (scalar kernel) and small sizes.
  for (int64_t n : {0, 1, 3, 4, 5, 1001, 1'000'003}) {
    TensorBuffer y = random_host(Shape{n}, DType::f32, 60 + static_cast<uint64_t>(n), 2.0f);
    const double r = cpu::sum_squares(y);
    for (int64_t offset : {0, 1}) {
      OffsetTensor dy = upload_offset(*be, y, offset);
      EXPECT_NEAR(ops::sum_squares(*be, dy.view), r, 1e-12 * r) << "n=" << n << " offset=" << offset;
    }
  }

  x.ptr<float>()[12'345'678] = std::numeric_limits<float>::quiet_NaN();
  be->copy(dx, x);
  EXPECT_FALSE(std::isfinite(ops::sum_squares(*be, dx)));
  x.ptr<float>()[12'345'678] = -std::numeric_limits<float>::infinity();
  be->copy(dx, x);
  EXPECT_FALSE(std::isfinite(ops::sum_squares(*be, dx)));
}

}  // namespace
}  // namespace kiln::test
