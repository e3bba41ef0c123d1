// CPU twins of the fused cross-entropy row op and the optimizer updates (kernels/train_ops.h).
//
// cross_entropy_forward_backward, per row r of logits [R, V] with target t = targets[r], c = logit_scale
// and z[v] = c * x[v] (exact in double: a product of two floats):
//   m = max_v z[v],  e[v] = exp(z[v] - m),  s = sum_v e[v]      (exp and sum in double)
//   lse = m + log(s);  logp[t] = z[t] - lse;  mean_v(-log p[v]) = lse - mean_v(z[v])
//   loss = (1 - ls) * (lse - z[t]) + ls * (lse - mean(z))      (the ls term only when ls != 0)
//   entropy = log(s) - sum_v e[v] (z[v] - m) / s               (only when asked; terms with e = 0 skipped)
//   grad[v] = k * (exp(z[v] - lse) - ls / V - (1 - ls) [v == t]),  k = grad_scale * row_scale * c
//             (double, then stored)
// With c = 1 and no row scale every double above equals the plain op's, so the results are the same
// bits. Rows with t < 0 are ignored: loss = logprob = entropy = 0 and a zero gradient row.
// losses / logprobs / entropies may be absent (data == nullptr) when the caller does not want them.
//
// adamw_step follows torch.optim.AdamW's single-tensor path (foreach=False) operation by operation,
// every element operation in f32 and the scalar factors computed in double, then rounded to f32 as
// torch rounds a Python scalar for an f32 tensor. The hyperparameters arrive as f32 (AdamWStep) but
// torch holds them as Python doubles: each is widened to the double nearest its shortest decimal
// form (0.999f -> 0.999, not 0.99900001287), so 1 - beta2 is torch's 0.001 and not 0.00099998713
// (a 1.3e-5 relative difference in exp_avg_sq otherwise). A value that is not a short decimal (a
// scheduled lr) moves by less than its own f32 rounding.
//   g = grad * grad_scale
//   p = p * f32(1 - lr * wd)                                  (i < decay_end only)
//   m = fma(f32(1 - beta1), g - m, m)                         (exp_avg.lerp_; ATen's CPU lerp is an fma)
//   v = v * f32(beta2);  v = v + (f32(1 - beta2) * g) * g     (mul_, addcmul_)
//   denom = sqrt(v) / f32(sqrt(1 - beta2^step)) + f32(eps)    (sqrt, div, add_)
//   p = p + (f32(-lr / (1 - beta1^step)) * m) / denom         (addcdiv_)
// Where torch's own CPU and CUDA kernels differ, this follows the CPU one (true division by the
// scalar bc2_sqrt, where torch's CUDA kernel multiplies by its reciprocal; addcdiv as (s * m) / denom).
// The CUDA twin performs the same f32 operations with explicitly rounded intrinsics, so the two
// agree bit for bit (and the bf16/f16 copy is then identical too).
//
// sgd_step (torch.optim.SGD, no momentum): g = grad * grad_scale; g = g + f32(wd) * p (i < decay_end);
// p = p + f32(-lr) * g.
// sum_squares: sum of x^2 with every square and sum in double.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "kernels/adamw_scalars.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_train_ops.h"

namespace kiln::cpu {
namespace {

// The f32 scalars of one AdamW step (shared arithmetic with the CUDA twin, see the header comment).
using ops::detail::AdamWScalars;
using ops::detail::adamw_scalars;

void check_f32_vector(const Tensor& t, int64_t n) {
  detail::check_float(t);
  KILN_ASSERT(t.dtype == DType::f32 && t.numel() == n);
}

// params_lowp: absent, or [N] bf16/f16 on the host.
bool check_lowp(const Tensor& lowp, int64_t n) {
  if (lowp.data == nullptr) return false;
  detail::check_float(lowp);
  KILN_ASSERT(lowp.dtype != DType::f32 && lowp.numel() == n);
  return true;
}

}  // namespace

void cross_entropy_forward_backward(Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const ops::CrossEntropyOptions& o) {
  detail::check_float(logits);
  detail::check_i32(targets);
  KILN_ASSERT(logits.ndim() >= 1);
  const int64_t V = logits.size(-1);
  KILN_ASSERT(V > 0);
  const int64_t R = logits.numel() / V;
  KILN_ASSERT(targets.numel() == R);
  KILN_ASSERT(std::isfinite(o.logit_scale) && o.logit_scale > 0.0f);
  const bool want_loss = losses.data != nullptr, want_logp = logprobs.data != nullptr;
  const bool want_ent = o.entropies.data != nullptr, have_rs = o.row_scales.data != nullptr;
  if (want_loss) KILN_ASSERT(losses.device.is_cpu() && losses.dtype == DType::f32 && losses.numel() == R);
  if (want_logp) KILN_ASSERT(logprobs.device.is_cpu() && logprobs.dtype == DType::f32 && logprobs.numel() == R);
  if (want_ent)
    KILN_ASSERT(o.entropies.device.is_cpu() && o.entropies.dtype == DType::f32 && o.entropies.numel() == R);
  if (have_rs)
    KILN_ASSERT(o.row_scales.device.is_cpu() && o.row_scales.dtype == DType::f32 && o.row_scales.numel() == R);
  const double ls = o.label_smoothing;
  const double c = o.logit_scale;
  const bool write_grad = o.write_grad;
  const int32_t* tgt = targets.ptr<const int32_t>();

  std::vector<float> row(static_cast<size_t>(V));
  for (int64_t r = 0; r < R; ++r) {
    const int32_t t = tgt[r];
    KILN_ASSERT(t < V);
    if (t < 0) {  // ignored row
      if (want_loss) losses.ptr<float>()[r] = 0.0f;
      if (want_logp) logprobs.ptr<float>()[r] = 0.0f;
      if (want_ent) o.entropies.ptr<float>()[r] = 0.0f;
      if (write_grad) {
        std::fill(row.begin(), row.end(), 0.0f);
        detail::store_f32(logits, r * V, V, row.data());
      }
      continue;
    }
    detail::load_f32(logits, r * V, V, row.data());
    // c > 0, so the maximum of z is c times the maximum of x.
    double m = row[0];
    for (int64_t v = 1; v < V; ++v) m = std::fmax(m, static_cast<double>(row[v]));
    m *= c;
    double s = 0.0, sum_z = 0.0, sum_ez = 0.0;  // sum e, sum z, sum e (z - m)
    for (int64_t v = 0; v < V; ++v) {
      const double z = c * static_cast<double>(row[v]);
      const double e = std::exp(z - m);
      s += e;
      sum_z += z;
      if (want_ent && e > 0.0) sum_ez += e * (z - m);  // e = 0 for z = -inf, where (z - m) is -inf
    }
    const double lse = m + std::log(s);
    const double logp_t = c * static_cast<double>(row[t]) - lse;
    double loss = (1.0 - ls) * (-logp_t);
    if (ls != 0.0) loss += ls * (lse - sum_z / static_cast<double>(V));
    if (want_loss) losses.ptr<float>()[r] = static_cast<float>(loss);
    if (want_logp) logprobs.ptr<float>()[r] = static_cast<float>(logp_t);
    if (want_ent) o.entropies.ptr<float>()[r] = static_cast<float>(std::log(s) - sum_ez / s);
    if (write_grad) {
      const double rs = have_rs ? static_cast<double>(o.row_scales.ptr<const float>()[r]) : 1.0;
      const double k = static_cast<double>(o.grad_scale) * rs * c;
      const double smooth = ls / static_cast<double>(V);
      for (int64_t v = 0; v < V; ++v) {
        double g = std::exp(c * static_cast<double>(row[v]) - lse) - smooth;
        if (v == t) g -= 1.0 - ls;
        row[v] = static_cast<float>(k * g);
      }
      detail::store_f32(logits, r * V, V, row.data());
    }
  }
}

void adamw_step(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const ops::AdamWStep& s) {
  const int64_t N = params.numel();
  check_f32_vector(params, N);
  check_f32_vector(grads, N);
  check_f32_vector(m, N);
  check_f32_vector(v, N);
  const bool lowp = check_lowp(params_lowp, N);
  const AdamWScalars c = adamw_scalars(s);
  const float gs = s.grad_scale;
  const int64_t decay_end = std::min<int64_t>(std::max<int64_t>(s.decay_end, 0), N);

  float* p = params.ptr<float>();
  const float* gr = grads.ptr<const float>();
  float* mp = m.ptr<float>();
  float* vp = v.ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    const float g = gr[i] * gs;
    float pi = p[i];
    if (i < decay_end) pi = pi * c.decay;
    const float mi = std::fma(c.one_minus_b1, g - mp[i], mp[i]);
    float vi = vp[i] * c.beta2;
    vi = vi + (c.one_minus_b2 * g) * g;
    const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
    pi = pi + (c.neg_step_size * mi) / denom;
    p[i] = pi;
    mp[i] = mi;
    vp[i] = vi;
  }
  if (lowp) detail::store_f32(params_lowp, 0, N, p);
}

void sgd_step(Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay, float grad_scale,
              int64_t decay_end) {
  const int64_t N = params.numel();
  check_f32_vector(params, N);
  check_f32_vector(grads, N);
  const bool lowp = check_lowp(params_lowp, N);
  const float neg_lr = -lr;
  decay_end = std::min<int64_t>(std::max<int64_t>(decay_end, 0), N);

  float* p = params.ptr<float>();
  const float* gr = grads.ptr<const float>();
  for (int64_t i = 0; i < N; ++i) {
    float g = gr[i] * grad_scale;
    if (i < decay_end) g = g + weight_decay * p[i];
    p[i] = p[i] + neg_lr * g;
  }
  if (lowp) detail::store_f32(params_lowp, 0, N, p);
}

double sum_squares(Tensor x) {
  detail::check_float(x);
  KILN_ASSERT(x.dtype == DType::f32);
  const float* p = x.ptr<const float>();
  double s = 0.0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  return s;
}

}  // namespace kiln::cpu
