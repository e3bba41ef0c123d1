// The per-step scalars of AdamW, shared by the CPU and CUDA twins of ops::adamw_step so that the two
// compute bit-identical updates: each f32 hyper-parameter is taken as the double nearest its
// shortest decimal form (what Python holds for `lr=1e-4`), the factors are formed in double, as
// torch does, and rounded to f32. Host code only; no state.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

#include "kernels/train_ops.h"

namespace kiln::ops::detail {

// The double nearest the shortest decimal that reads back as x.
inline double widen_decimal(float x) {
  if (!std::isfinite(x)) return x;
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf) - 1, x);
  KILN_ASSERT(r.ec == std::errc());
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

struct AdamWScalars {
  float decay;          // 1 - lr * wd
  float one_minus_b1;   // lerp weight
  float beta2;
  float one_minus_b2;
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWStep& s) {
  KILN_ASSERT(s.step >= 1);
  const double lr = widen_decimal(s.lr), b1 = widen_decimal(s.beta1), b2 = widen_decimal(s.beta2);
  const double wd = widen_decimal(s.weight_decay), eps = widen_decimal(s.eps);
  const double step = static_cast<double>(s.step);
  AdamWScalars c;
  c.decay = static_cast<float>(1.0 - lr * wd);
  c.one_minus_b1 = static_cast<float>(1.0 - b1);
  c.beta2 = static_cast<float>(b2);
  c.one_minus_b2 = static_cast<float>(1.0 - b2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, step)));
  c.eps = static_cast<float>(eps);
  c.neg_step_size = static_cast<float>(-(lr / (1.0 - std::pow(b1, step))));
  c.grad_scale = s.grad_scale;
  return c;
}

}  // namespace kiln::ops::detail
