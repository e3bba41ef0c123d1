// CPU twins of the fused cross-entropy op and the optimizer updates (kernels/cpu/loss_optim.cpp),
// called through kiln::ops with a CPU backend, against independent references written here:
//   * cross entropy: a direct double-precision log-softmax (loss, target log-prob, gradient), the
//     gradient against central finite differences of the op's own loss, label smoothing, ignored
//     rows, grad_scale, write_grad = false (logits untouched), bf16 logits;
//   * the reinforcement-learning options (logit_scale, row_scales, entropies) against the same
//     double reference extended to z = logit_scale * logits, the entropy and the scaled gradient,
//     for every combination with label smoothing and f32 / bf16 logits; a finite-difference check of
//     d(grad_scale * row_scale * loss) / d logits; exact identities (row scales of 1 and entropies
//     change no bit, logit_scale 2 equals logits doubled);
//   * AdamW: a double-precision transcription of torch.optim.AdamW over several steps with
//     decay_end inside the vector and grad_scale != 1, a hand-computed first step, the bf16/f16
//     compute copy (exactly the rounded f32 params);
//   * SGD: a double reference; sum_squares: a double sum, and NaN / inf giving a non-finite result.
// Tolerances come from the precision of each side: the op computes in f32 (storage rounding, about
// 6e-8 relative per operation), the references in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/train_ops.h"
#include "test_util.h"

namespace kiln::test {
namespace {

std::vector<float> host_values(Tensor t) { return cpu::detail::to_f32(t); }

// ---- Cross entropy reference -----------------------------------------------------------------------

struct CeReference {
  std::vector<double> loss, logprob, entropy, grad;  // [R], [R], [R], [R * V]
};

// Direct double implementation of torch.nn.functional.cross_entropy (reduction none, label smoothing)
// of z = logit_scale * x, the entropy -sum p log p of softmax(z), and the gradient with respect to x
// of grad_scale * row_scales[r] * loss[r] (row_scales empty: all 1). x: [R, V] as f32 values
// (already storage-rounded).
CeReference ce_reference(const std::vector<float>& x, const std::vector<int32_t>& targets, int64_t V, double ls,
                         double grad_scale, double logit_scale = 1.0, const std::vector<float>& row_scales = {}) {
  const int64_t R = static_cast<int64_t>(targets.size());
  CeReference ref;
  ref.loss.assign(R, 0.0);
  ref.logprob.assign(R, 0.0);
  ref.entropy.assign(R, 0.0);
  ref.grad.assign(R * V, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    const int32_t t = targets[r];
    if (t < 0) continue;
    std::vector<double> z(V);
    for (int64_t v = 0; v < V; ++v) z[v] = logit_scale * static_cast<double>(x[r * V + v]);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, z[v]);
    double sum_exp = 0.0;
    for (int64_t v = 0; v < V; ++v) sum_exp += std::exp(z[v] - m);
    std::vector<double> logp(V);
    for (int64_t v = 0; v < V; ++v) logp[v] = (z[v] - m) - std::log(sum_exp);
    double sum_logp = 0.0, entropy = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      sum_logp += logp[v];
      entropy -= std::exp(logp[v]) * logp[v];
    }
    ref.loss[r] = -(1.0 - ls) * logp[t] - ls / static_cast<double>(V) * sum_logp;
    ref.logprob[r] = logp[t];
    ref.entropy[r] = entropy;
    // d loss / d z = p - target distribution; d z / d x = logit_scale.
    const double k = grad_scale * (row_scales.empty() ? 1.0 : static_cast<double>(row_scales[r])) * logit_scale;
    for (int64_t v = 0; v < V; ++v) {
      const double target_dist = (v == t ? 1.0 - ls : 0.0) + ls / static_cast<double>(V);
      ref.grad[r * V + v] = k * (std::exp(logp[v]) - target_dist);
    }
  }
  return ref;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= atol + rtol * std::fabs(ref[i])) && ++failures <= 5)
      ADD_FAILURE() << what << " index " << i << ": got " << got[i] << ", reference " << ref[i] << " (err " << err
                    << ")";
  }
  EXPECT_EQ(failures, 0) << what;
}

struct CeRun {
  std::vector<float> loss, logprob, entropy, logits_after;  // entropy empty unless asked for
};

// The op on `logits` (in place) with options o; row_scales (empty: none) become o.row_scales, and
// with want_entropy the entropies are returned. Outputs start as 123 so that every row must be written.
CeRun run_ce_options(Backend& be, Tensor logits, const std::vector<int32_t>& targets, ops::CrossEntropyOptions o,
                     const std::vector<float>& row_scales, bool want_entropy) {
  const int64_t R = static_cast<int64_t>(targets.size());
  TensorBuffer tg = host_ints(targets);
  TensorBuffer loss = host_empty(Shape{R}, DType::f32), logprob = host_empty(Shape{R}, DType::f32);
  TensorBuffer entropy = host_empty(Shape{R}, DType::f32), scales = host_empty(Shape{R}, DType::f32);
  for (int64_t r = 0; r < R; ++r)
    loss.ptr<float>()[r] = logprob.ptr<float>()[r] = entropy.ptr<float>()[r] = 123.0f;  // must be overwritten
  if (!row_scales.empty()) {
    KILN_ASSERT(static_cast<int64_t>(row_scales.size()) == R);
    std::copy(row_scales.begin(), row_scales.end(), scales.ptr<float>());
    o.row_scales = scales;
  }
  if (want_entropy) o.entropies = entropy;
  ops::cross_entropy_forward_backward(be, logits, loss, logprob, tg, o);
  CeRun run{host_values(loss), host_values(logprob), {}, host_values(logits)};
  if (want_entropy) run.entropy = host_values(entropy);
  return run;
}

CeRun run_ce(Backend& be, Tensor logits, const std::vector<int32_t>& targets, float ls, float grad_scale,
             bool write_grad) {
  ops::CrossEntropyOptions o;
  o.label_smoothing = ls;
  o.grad_scale = grad_scale;
  o.write_grad = write_grad;
  return run_ce_options(be, logits, targets, o, {}, false);
}

TEST(LossOptimCpu, CrossEntropyMatchesDoubleReference) {
  auto be = make_cpu_backend();
  uint64_t seed = 11;
  for (int64_t V : {1, 2, 37, 1001, 32000}) {
    for (float ls : {0.0f, 0.1f}) {
      for (float gs : {1.0f, 0.125f}) {
        SCOPED_TRACE("V=" + std::to_string(V) + " ls=" + std::to_string(ls) + " gs=" + std::to_string(gs));
        const int64_t R = 6;
        TensorBuffer logits = random_host(Shape{R, V}, DType::f32, seed++, 3.0f);
        std::vector<float> x = host_values(logits);
        TensorBuffer tgt = random_ints(Shape{R}, 0, static_cast<int32_t>(V), seed++);
        std::vector<int32_t> targets(tgt.ptr<int32_t>(), tgt.ptr<int32_t>() + R);
        targets[2] = -100;  // ignored
        targets[4] = static_cast<int32_t>(V - 1);
        CeReference ref = ce_reference(x, targets, V, ls, gs);
        CeRun got = run_ce(*be, logits, targets, ls, gs, true);
        // f32 outputs of double computations: one rounding (6e-8 relative) plus the f32 inputs' exp.
        expect_close(got.loss, ref.loss, 1e-6, 1e-7, "loss");
        expect_close(got.logprob, ref.logprob, 1e-6, 1e-7, "logprob");
        expect_close(got.logits_after, ref.grad, 1e-6, 1e-9, "grad");
        EXPECT_EQ(got.loss[2], 0.0f);
        EXPECT_EQ(got.logprob[2], 0.0f);
        for (int64_t v = 0; v < V; ++v) EXPECT_EQ(got.logits_after[2 * V + v], 0.0f);
      }
    }
  }
}

// Known values: uniform logits give loss log(V) whatever the smoothing; logits (0, log 3) with
// target 1 give p = (1/4, 3/4).
TEST(LossOptimCpu, CrossEntropyHandComputed) {
  auto be = make_cpu_backend();
  TensorBuffer uniform = host_empty(Shape{1, 8}, DType::f32);
  for (int v = 0; v < 8; ++v) uniform.ptr<float>()[v] = 2.5f;
  CeRun u = run_ce(*be, uniform, {3}, 0.2f, 1.0f, true);
  EXPECT_NEAR(u.loss[0], std::log(8.0), 1e-6);
  EXPECT_NEAR(u.logprob[0], -std::log(8.0), 1e-6);
  EXPECT_NEAR(u.logits_after[3], 0.125 - 0.8 - 0.2 / 8, 1e-7);
  EXPECT_NEAR(u.logits_after[0], 0.125 - 0.2 / 8, 1e-7);

  TensorBuffer two = host_empty(Shape{1, 2}, DType::f32);
  two.ptr<float>()[0] = 0.0f;
  two.ptr<float>()[1] = static_cast<float>(std::log(3.0));
  CeRun t = run_ce(*be, two, {1}, 0.0f, 2.0f, true);
  EXPECT_NEAR(t.loss[0], -std::log(0.75), 1e-6);
  EXPECT_NEAR(t.logits_after[0], 2.0 * 0.25, 1e-6);
  EXPECT_NEAR(t.logits_after[1], 2.0 * (0.75 - 1.0), 1e-6);
}

// The gradient written in place is grad_scale * d(loss)/d(logits): central differences of the op's
// own loss (write_grad = false), h = 1e-2. Error budget: truncation h^2/6 * |f'''| < 2e-6, f32
// rounding of the loss (< 1e-6) / 2h < 5e-5; tolerance 1e-4 on d(loss)/dx.
TEST(LossOptimCpu, CrossEntropyGradientMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  const int64_t R = 4, V = 29;
  for (float ls : {0.0f, 0.1f, 0.3f}) {
    SCOPED_TRACE("ls=" + std::to_string(ls));
    const float gs = 0.5f;
    TensorBuffer logits = random_host(Shape{R, V}, DType::f32, 77 + static_cast<uint64_t>(ls * 10), 2.0f);
    const std::vector<int32_t> targets = {5, -100, 0, 28};
    std::vector<float> x = host_values(logits);

    TensorBuffer work = host_empty(Shape{R, V}, DType::f32);
    std::copy(x.begin(), x.end(), work.ptr<float>());
    CeRun analytic = run_ce(*be, work, targets, ls, gs, true);

    int failures = 0;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t v = 0; v < V; ++v) {
        const int64_t i = r * V + v;
        std::copy(x.begin(), x.end(), work.ptr<float>());
        const float xp = x[i] + 1e-2f, xm = x[i] - 1e-2f;
        work.ptr<float>()[i] = xp;
        const double lp = run_ce(*be, work, targets, ls, gs, false).loss[r];
        work.ptr<float>()[i] = xm;
        const double lm = run_ce(*be, work, targets, ls, gs, false).loss[r];
        const double fd = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
        const double got = analytic.logits_after[i] / gs;
        if (!(std::fabs(got - fd) <= 1e-4) && ++failures <= 5)
          ADD_FAILURE() << "row " << r << " v " << v << ": analytic " << got << ", finite difference " << fd;
      }
    }
    EXPECT_EQ(failures, 0);
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(analytic.logits_after[1 * V + v], 0.0f);  // ignored row
  }
}

TEST(LossOptimCpu, CrossEntropyWithoutGradLeavesLogits) {
  auto be = make_cpu_backend();
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t R = 5, V = 333;
    TensorBuffer logits = random_host(Shape{R, V}, dt, 5, 2.0f);
    const int64_t bytes = logits.view().nbytes();
    std::vector<uint8_t> before(logits.ptr<uint8_t>(), logits.ptr<uint8_t>() + bytes);
    const std::vector<int32_t> targets = {1, -1, 332, 0, -100};
    CeRun got = run_ce(*be, logits, targets, 0.1f, 3.0f, false);
    EXPECT_EQ(std::vector<uint8_t>(logits.ptr<uint8_t>(), logits.ptr<uint8_t>() + bytes), before);
    CeReference ref = ce_reference(cpu::detail::to_f32(logits), targets, V, 0.1, 3.0);
    expect_close(got.loss, ref.loss, 1e-6, 1e-7, "loss");
    expect_close(got.logprob, ref.logprob, 1e-6, 1e-7, "logprob");
  }
}

// bf16 logits: the math runs on the bf16 values; the gradient is stored rounded to bf16, so it may
// differ from the rounded double reference by one bf16 rounding (relative 2^-8).
TEST(LossOptimCpu, CrossEntropyBf16Logits) {
  auto be = make_cpu_backend();
  const int64_t R = 7, V = 5003;
  for (float ls : {0.0f, 0.1f}) {
    TensorBuffer logits = random_host(Shape{R, V}, DType::bf16, 99, 4.0f);
    std::vector<float> x = host_values(logits);
    const std::vector<int32_t> targets = {0, 17, -100, 5002, 2500, -5, 9};
    CeReference ref = ce_reference(x, targets, V, ls, 0.75);
    CeRun got = run_ce(*be, logits, targets, ls, 0.75f, true);
    expect_close(got.loss, ref.loss, 1e-6, 1e-7, "loss");
    expect_close(got.logprob, ref.logprob, 1e-6, 1e-7, "logprob");
    expect_close(got.logits_after, ref.grad, 1.0 / 256, 1e-30, "bf16 grad");
  }
}

// Row scales of random signs and magnitudes (|s| from 1e-2 to 10), one exactly 0.
std::vector<float> random_row_scales(int64_t R, uint64_t seed) {
  TensorBuffer mag = random_ints(Shape{R}, -200, 101, seed), sign = random_ints(Shape{R}, 0, 2, seed + 1);
  std::vector<float> s(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r)
    s[r] = static_cast<float>((sign.ptr<int32_t>()[r] ? -1.0 : 1.0) * std::pow(10.0, mag.ptr<int32_t>()[r] / 100.0));
  if (R > 3) s[3] = 0.0f;
  return s;
}

// Every combination of the RL options with label smoothing and both storage types, against the
// double reference. f32 logits: the op computes in double and rounds once (tolerance as in
// CrossEntropyMatchesDoubleReference); bf16 logits: the gradient is stored rounded to bf16 (2^-8).
TEST(LossOptimCpu, CrossEntropyRlOptionsMatchDoubleReference) {
  auto be = make_cpu_backend();
  uint64_t seed = 501;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t V : {1, 37, 1001}) {
      for (float c : {1.0f, 0.7f, 1.3f}) {
        for (bool with_scales : {false, true}) {
          for (bool with_entropy : {false, true}) {
            for (float ls : {0.0f, 0.1f}) {
              SCOPED_TRACE(std::string(dtype_name(dt)) + " V=" + std::to_string(V) + " c=" + std::to_string(c) +
                           " row_scales=" + std::to_string(with_scales) + " entropy=" +
                           std::to_string(with_entropy) + " ls=" + std::to_string(ls));
              const int64_t R = 7;
              TensorBuffer logits = random_host(Shape{R, V}, dt, seed++, 3.0f);
              const std::vector<float> x = host_values(logits);
              TensorBuffer tgt = random_ints(Shape{R}, 0, static_cast<int32_t>(V), seed++);
              std::vector<int32_t> targets(tgt.ptr<int32_t>(), tgt.ptr<int32_t>() + R);
              targets[2] = -100;  // ignored
              targets[5] = static_cast<int32_t>(V - 1);
              const std::vector<float> scales = with_scales ? random_row_scales(R, seed++) : std::vector<float>{};
              const float gs = 0.375f;
              CeReference ref = ce_reference(x, targets, V, ls, gs, c, scales);

              ops::CrossEntropyOptions o;
              o.label_smoothing = ls;
              o.grad_scale = gs;
              o.write_grad = true;
              o.logit_scale = c;
              CeRun got = run_ce_options(*be, logits, targets, o, scales, with_entropy);
              expect_close(got.loss, ref.loss, 1e-6, 1e-7, "loss");
              expect_close(got.logprob, ref.logprob, 1e-6, 1e-7, "logprob");
              if (with_entropy) expect_close(got.entropy, ref.entropy, 1e-6, 1e-7, "entropy");
              if (dt == DType::f32)
                expect_close(got.logits_after, ref.grad, 1e-6, 1e-9, "grad");
              else
                expect_close(got.logits_after, ref.grad, 1.0 / 256, 1e-30, "bf16 grad");
              EXPECT_EQ(got.loss[2], 0.0f);
              EXPECT_EQ(got.logprob[2], 0.0f);
              if (with_entropy) {
                EXPECT_EQ(got.entropy[2], 0.0f);
              }
              for (int64_t v = 0; v < V; ++v) EXPECT_EQ(got.logits_after[2 * V + v], 0.0f);
              if (with_scales) {  // row 3 has scale 0: a zero gradient row, its loss still the unscaled loss
                for (int64_t v = 0; v < V; ++v) EXPECT_EQ(got.logits_after[3 * V + v], 0.0f);
              }
            }
          }
        }
      }
    }
  }
}

// The gradient written with logit_scale and row_scales is d(grad_scale * row_scale * loss) / d logits:
// central differences of the op's own loss (write_grad = false, same logit_scale), h = 1e-2, V = 7.
// Error budget on d loss / dx as in CrossEntropyGradientMatchesFiniteDifferences, the third
// derivative grown by logit_scale^3 < 2.2: truncation < 5e-6, f32 rounding of the loss / 2h < 5e-5;
// tolerance 1e-4 times |grad_scale * row_scale|.
TEST(LossOptimCpu, CrossEntropyRlGradientMatchesFiniteDifferences) {
  auto be = make_cpu_backend();
  const int64_t R = 4, V = 7;
  const std::vector<float> scales = {0.5f, -2.0f, 3.0f, -0.25f};
  const std::vector<int32_t> targets = {3, 0, -100, 6};
  for (float c : {0.7f, 1.3f}) {
    for (float ls : {0.0f, 0.2f}) {
      SCOPED_TRACE("c=" + std::to_string(c) + " ls=" + std::to_string(ls));
      const float gs = 0.5f;
      TensorBuffer logits =
          random_host(Shape{R, V}, DType::f32, 91 + static_cast<uint64_t>(c * 10 + ls * 100), 2.0f);
      const std::vector<float> x = host_values(logits);
      ops::CrossEntropyOptions o;
      o.label_smoothing = ls;
      o.grad_scale = gs;
      o.logit_scale = c;

      TensorBuffer work = host_empty(Shape{R, V}, DType::f32);
      std::copy(x.begin(), x.end(), work.ptr<float>());
      o.write_grad = true;
      const CeRun analytic = run_ce_options(*be, work, targets, o, scales, true);
      o.write_grad = false;

      int failures = 0;
      for (int64_t r = 0; r < R; ++r) {
        const double k = static_cast<double>(gs) * scales[r];
        for (int64_t v = 0; v < V; ++v) {
          const int64_t i = r * V + v;
          std::copy(x.begin(), x.end(), work.ptr<float>());
          const float xp = x[i] + 1e-2f, xm = x[i] - 1e-2f;
          work.ptr<float>()[i] = xp;
          const double lp = run_ce_options(*be, work, targets, o, scales, false).loss[r];
          work.ptr<float>()[i] = xm;
          const double lm = run_ce_options(*be, work, targets, o, scales, false).loss[r];
          const double fd = k * (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
          const double got = analytic.logits_after[i];
          if (!(std::fabs(got - fd) <= 1e-4 * std::fabs(k)) && ++failures <= 5)
            ADD_FAILURE() << "row " << r << " v " << v << ": analytic " << got << ", finite difference " << fd;
        }
      }
      EXPECT_EQ(failures, 0);
      for (int64_t v = 0; v < V; ++v) EXPECT_EQ(analytic.logits_after[2 * V + v], 0.0f);  // ignored row
      EXPECT_EQ(analytic.entropy[2], 0.0f);
    }
  }
}

// Known entropies: uniform logits give log V at any logit_scale; logits (0, log 3) at logit_scale 1
// give p = (1/4, 3/4), and at logit_scale 2 p = (1/10, 9/10).
TEST(LossOptimCpu, CrossEntropyEntropyHandComputed) {
  auto be = make_cpu_backend();
  TensorBuffer uniform = host_empty(Shape{1, 8}, DType::f32);
  for (int v = 0; v < 8; ++v) uniform.ptr<float>()[v] = 2.5f;
  ops::CrossEntropyOptions o;
  o.logit_scale = 0.7f;
  EXPECT_NEAR(run_ce_options(*be, uniform, {3}, o, {}, true).entropy[0], std::log(8.0), 1e-6);

  auto two_entropy = [](double p) { return -(p * std::log(p) + (1 - p) * std::log(1 - p)); };
  TensorBuffer two = host_empty(Shape{1, 2}, DType::f32);
  two.ptr<float>()[0] = 0.0f;
  two.ptr<float>()[1] = static_cast<float>(std::log(3.0));
  o.logit_scale = 1.0f;
  CeRun a = run_ce_options(*be, two, {1}, o, {}, true);
  EXPECT_NEAR(a.entropy[0], two_entropy(0.25), 1e-6);
  EXPECT_NEAR(a.logprob[0], std::log(0.75), 1e-6);
  o.logit_scale = 2.0f;
  CeRun b = run_ce_options(*be, two, {1}, o, {}, true);
  EXPECT_NEAR(b.entropy[0], two_entropy(0.1), 1e-6);
  EXPECT_NEAR(b.logprob[0], std::log(0.9), 1e-6);
}

// Exact identities: asking for entropies or passing row scales of 1 changes no output bit (the
// plain op's arithmetic is kept), and logit_scale = 2 on x equals logit_scale = 1 on 2x (exact in
// every dtype) for loss, logprob and entropy, with the gradient exactly doubled.
TEST(LossOptimCpu, CrossEntropyRlOptionsExactIdentities) {
  auto be = make_cpu_backend();
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t R = 5, V = 517;
    TensorBuffer logits = random_host(Shape{R, V}, dt, 123, 3.0f);
    const std::vector<float> x = host_values(logits);
    const std::vector<int32_t> targets = {4, -100, 0, 516, 77};
    // A fresh copy of the logits times `factor` (1 or 2: exact).
    auto fresh = [&](float factor) {
      TensorBuffer b = host_empty(Shape{R, V}, dt);
      std::vector<float> v(x);
      for (float& e : v) e *= factor;
      cpu::detail::store_f32(b, 0, R * V, v.data());
      return b;
    };
    ops::CrossEntropyOptions o;
    o.label_smoothing = 0.1f;
    o.grad_scale = 0.3f;
    o.write_grad = true;
    TensorBuffer l0 = fresh(1.0f), l1 = fresh(1.0f), l2 = fresh(1.0f), l3 = fresh(2.0f);
    const CeRun plain = run_ce_options(*be, l0, targets, o, {}, false);
    const CeRun with_all = run_ce_options(*be, l1, targets, o, std::vector<float>(R, 1.0f), true);
    EXPECT_EQ(plain.loss, with_all.loss);
    EXPECT_EQ(plain.logprob, with_all.logprob);
    EXPECT_EQ(plain.logits_after, with_all.logits_after);

    o.logit_scale = 2.0f;
    const CeRun scaled = run_ce_options(*be, l2, targets, o, {}, true);
    o.logit_scale = 1.0f;
    const CeRun doubled = run_ce_options(*be, l3, targets, o, {}, true);
    EXPECT_EQ(scaled.loss, doubled.loss);
    EXPECT_EQ(scaled.logprob, doubled.logprob);
    EXPECT_EQ(scaled.entropy, doubled.entropy);
    std::vector<float> twice(doubled.logits_after);
    for (float& g : twice) g *= 2.0f;
    EXPECT_EQ(scaled.logits_after, twice);
  }
}

// ---- Optimizers -------------------------------------------------------------------------------------

struct AdamRef {
  std::vector<double> p, m, v;
  std::vector<double> m_abs;  // the first moment of |g|: the scale of exp_avg's rounding errors
};

// Hyperparameters as torch holds them: Python doubles written as decimals.
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t decay_end;
};

// torch.optim.AdamW in double: decoupled decay, bias-corrected moments.
void adamw_reference(AdamRef& s, const std::vector<float>& grads, const AdamHyper& h, int64_t step) {
  const double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
  for (size_t i = 0; i < s.p.size(); ++i) {
    const double g = static_cast<double>(grads[i]) * h.grad_scale;
    if (static_cast<int64_t>(i) < h.decay_end) s.p[i] *= 1.0 - lr * h.weight_decay;
    s.m[i] = b1 * s.m[i] + (1.0 - b1) * g;
    s.m_abs[i] = b1 * s.m_abs[i] + (1.0 - b1) * std::fabs(g);
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
    const double mhat = s.m[i] / (1.0 - std::pow(b1, static_cast<double>(step)));
    const double vhat = s.v[i] / (1.0 - std::pow(b2, static_cast<double>(step)));
    s.p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
  }
}

TEST(LossOptimCpu, AdamWMatchesDoubleReferenceOverSteps) {
  auto be = make_cpu_backend();
  const int64_t N = 1001;
  TensorBuffer params = random_host(Shape{N}, DType::f32, 3, 0.5f);
  TensorBuffer m = host_empty(Shape{N}, DType::f32), v = host_empty(Shape{N}, DType::f32);
  be->zero(m);
  be->zero(v);
  TensorBuffer lowp = host_empty(Shape{N}, DType::bf16);
  AdamRef ref;
  for (float x : host_values(params)) ref.p.push_back(x);
  ref.m.assign(N, 0.0);
  ref.v.assign(N, 0.0);
  ref.m_abs.assign(N, 0.0);

  // The op receives f32 hyperparameters; the reference uses the decimals as torch would.
  const AdamHyper hd{3e-3, 0.9, 0.95, 1e-8, 0.1, 0.37, 501};
  ops::AdamWStep h;
  h.lr = 3e-3f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.grad_scale = 0.37f;
  h.decay_end = 501;
  for (int64_t step = 1; step <= 6; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    h.step = step;
    TensorBuffer grads = random_host(Shape{N}, DType::f32, 1000 + static_cast<uint64_t>(step), 2.0f);
    grads.ptr<float>()[7] = 0.0f;  // a zero gradient: the update is then decay + momentum only
    std::vector<float> g = host_values(grads);
    ops::adamw_step(*be, params, grads, m, v, lowp, h);
    adamw_reference(ref, g, hd, step);
    // Each f32 element operation rounds at 6e-8 relative; after six steps the parameters stay within
    // 1e-6 relative (the update itself is ~lr, computed to ~1e-6 of itself).
    expect_close(host_values(params), ref.p, 1e-6, 1e-9, "params");
    // exp_avg sums gradients of both signs: its f32 error scales with the moment of |g|, not with
    // |exp_avg| (which cancels near a sign change).
    const std::vector<float> mv = host_values(m);
    for (int64_t i = 0; i < N; ++i)
      ASSERT_LE(std::fabs(mv[i] - ref.m[i]), 1e-6 * ref.m_abs[i]) << "exp_avg " << i << " " << mv[i] << " vs " << ref.m[i];
    expect_close(host_values(v), ref.v, 1e-6, 1e-15, "exp_avg_sq");
    // The compute copy is exactly the rounded f32 parameters.
    std::vector<float> p = host_values(params), lp = host_values(lowp);
    for (int64_t i = 0; i < N; ++i) ASSERT_EQ(lp[i], bf16_to_f32(f32_to_bf16(p[i]))) << i;
  }
}

// Step 1 moves every parameter by lr * sign(g) (bias correction makes m_hat / sqrt(v_hat) = sign(g))
// after the decoupled decay p * (1 - lr * wd); f16 compute copy.
TEST(LossOptimCpu, AdamWFirstStepHandComputed) {
  auto be = make_cpu_backend();
  TensorBuffer params = host_empty(Shape{3}, DType::f32), grads = host_empty(Shape{3}, DType::f32);
  TensorBuffer m = host_empty(Shape{3}, DType::f32), v = host_empty(Shape{3}, DType::f32);
  TensorBuffer lowp = host_empty(Shape{3}, DType::f16);
  const float p0[3] = {1.0f, -2.0f, 0.5f}, g0[3] = {0.5f, 0.25f, -4.0f};
  for (int i = 0; i < 3; ++i) {
    params.ptr<float>()[i] = p0[i];
    grads.ptr<float>()[i] = g0[i];
    m.ptr<float>()[i] = v.ptr<float>()[i] = 0.0f;
  }
  ops::AdamWStep h;
  h.lr = 0.1f;
  h.weight_decay = 0.1f;
  h.eps = 0.0f;
  h.decay_end = 2;  // the third element is not decayed
  ops::adamw_step(*be, params, grads, m, v, lowp, h);
  // Within one f32 rounding of the exact decimal results (half an ulp: 6e-8 relative).
  const std::vector<float> p = host_values(params);
  EXPECT_NEAR(p[0], 1.0 * 0.99 - 0.1, 1.2e-7 * 0.89);
  EXPECT_NEAR(p[1], -2.0 * 0.99 - 0.1, 1.2e-7 * 2.08);
  EXPECT_NEAR(p[2], 0.5 + 0.1, 1.2e-7 * 0.6);
  EXPECT_NEAR(m.ptr<float>()[2], -0.4, 1.2e-7 * 0.4);
  EXPECT_NEAR(v.ptr<float>()[2], 0.016, 1.2e-7 * 0.016);
  const std::vector<float> lp = host_values(lowp);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lp[i], f16_to_f32(f32_to_f16(p[i])));
}

TEST(LossOptimCpu, SgdMatchesDoubleReference) {
  auto be = make_cpu_backend();
  const int64_t N = 777;
  TensorBuffer params = random_host(Shape{N}, DType::f32, 21);
  TensorBuffer lowp = host_empty(Shape{N}, DType::bf16);
  std::vector<double> ref;
  for (float x : host_values(params)) ref.push_back(x);
  const float lr = 0.05f, wd = 0.01f, gs = 0.5f;
  const int64_t decay_end = 333;
  for (int step = 0; step < 3; ++step) {
    TensorBuffer grads = random_host(Shape{N}, DType::f32, 40 + static_cast<uint64_t>(step));
    std::vector<float> g = host_values(grads);
    ops::sgd_step(*be, params, grads, lowp, lr, wd, gs, decay_end);
    for (int64_t i = 0; i < N; ++i) {
      double gi = static_cast<double>(g[i]) * gs;
      if (i < decay_end) gi += static_cast<double>(wd) * ref[i];
      ref[i] -= static_cast<double>(lr) * gi;
    }
    expect_close(host_values(params), ref, 1e-6, 1e-8, "params");
    std::vector<float> p = host_values(params), lp = host_values(lowp);
    for (int64_t i = 0; i < N; ++i) ASSERT_EQ(lp[i], bf16_to_f32(f32_to_bf16(p[i]))) << i;
  }
  // Without a compute copy.
  ops::sgd_step(*be, params, params, Tensor{}, 0.5f, 0.0f, 1.0f, 0);  // p -= 0.5 p
  std::vector<float> p = host_values(params);
  for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(p[i], 0.5 * ref[i], 1e-6 * std::fabs(ref[i]) + 1e-8);
}

TEST(LossOptimCpu, SumSquares) {
  auto be = make_cpu_backend();
  TensorBuffer x = random_host(Shape{100003}, DType::f32, 8, 3.0f);
  double ref = 0.0;
  for (float e : host_values(x)) ref += static_cast<double>(e) * e;
  EXPECT_NEAR(ops::sum_squares(*be, x), ref, 1e-12 * ref);

  TensorBuffer small = host_empty(Shape{3}, DType::f32);
  small.ptr<float>()[0] = 3.0f;
  small.ptr<float>()[1] = -4.0f;
  small.ptr<float>()[2] = 1e20f;  // its square overflows f32 but not the f64 accumulator
  EXPECT_DOUBLE_EQ(ops::sum_squares(*be, small), 25.0 + static_cast<double>(1e20f) * static_cast<double>(1e20f));
  EXPECT_EQ(ops::sum_squares(*be, small.view().rows(0, 2)), 25.0);
  EXPECT_EQ(ops::sum_squares(*be, small.view().rows(0, 0)), 0.0);

  x.ptr<float>()[5000] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(std::isfinite(ops::sum_squares(*be, x)));
  x.ptr<float>()[5000] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(ops::sum_squares(*be, x)));
}

}  // namespace
}  // namespace kiln::test
