// The arithmetic of ops::sample() (kernels/sampling.h) shared by its CPU twin (kernels/cpu/sampling.cpp,
// whose header comment states the algorithm) and its CUDA twin (kernels/cuda/sampling.cu), so that
// both compute the same bits: penalised logits, order keys, the weight exponential, buckets and the
// fixed-point targets. Pure functions, no state.
//
// Every f32 operation here is one IEEE operation rounded to nearest: explicit _rn intrinsics on the
// device (nvcc never fuses them into FMAs) and plain operators on the host, where the CPU twin is
// compiled with -ffp-contract=off. The exponential is a polynomial of such operations rather than a
// libm call, so it gives the same bits on both devices.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/rng.h"  // KILN_HD
#include "kernels/sampling.h"

namespace kiln::sampling {

constexpr int kBins = 256;              // histogram bins (buckets, key digits)
constexpr int kZeroBucket = kBins - 1;  // the bucket of every weight-0 element
constexpr float kWeightFloor = -27.0f;  // d = z - max z below this: weight 0 (e^-27 < 2e-12)
constexpr float kWeightScale = 1099511627776.0f;  // 2^40: weights are floor(e^d * 2^40)
constexpr uint64_t kWeightOne = uint64_t(1) << 40;  // the weight of d = 0
constexpr float kBucketsPerNat = 8.0f;  // bucket = floor(-d * 8)
constexpr int64_t kMaxVocab = int64_t(1) << 23;  // V * 2^40 < 2^63: masses fit in uint64
constexpr int kBlockThreads = 1024;     // CUDA threads per row (bounds the top-N candidates)

// ---------------------------------------------------------------------------------------------
// IEEE f32 operations, rounded to nearest, never contracted.

KILN_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KILN_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
KILN_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
KILN_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KILN_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
KILN_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// ---------------------------------------------------------------------------------------------
// Values and order

// NaN counts as -inf.
KILN_HD float clean(float x) { return x != x ? -INFINITY : x; }

// The penalised logit of one token whose counts-table entry is `count` (ops::SamplingBatch::counts):
//   present (count != 0):      x = x > 0 ? x / repetition : x * repetition
//   o = count & ~kPromptBit:   x = (x - frequency * o) - presence   when o > 0
KILN_HD float penalise(float logit, int32_t count, float repetition, float frequency, float presence) {
  float x = clean(logit);
  if (count != 0) x = x > 0.0f ? fdiv(x, repetition) : fmul(x, repetition);
  const int32_t out = count & (ops::kPromptBit - 1);
  if (out > 0) x = fsub(fsub(x, fmul(frequency, static_cast<float>(out))), presence);
  return clean(x);
}

// z of a sampled row: the penalised logit over the temperature.
KILN_HD float scaled(float x, float temperature) { return clean(fdiv(x, temperature)); }

// Order-preserving bits: a > b as floats <=> key(a) > key(b); -0 and +0 share the key of +0.
KILN_HD uint32_t order_key(float z) {
  if (z == 0.0f) z = 0.0f;
  const uint32_t u = float_bits(z);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
KILN_HD float key_value(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// ---------------------------------------------------------------------------------------------
// Weights

// e^d for d <= 0 (0 below -86 and for NaN), within a few ulp: d = n ln2 + r with n = rint(d log2 e),
// r reduced in two steps (the high part of ln 2 has 15 significant bits, so n * high is exact), the
// degree-7 Taylor polynomial of e^r in Horner form (|r| <= 0.35: truncation < 0.1 ulp), times 2^n.
KILN_HD float exp_nonpos(float d) {
  if (!(d >= -86.0f)) return 0.0f;
  const float n = rintf(fmul(d, 1.44269504f));  // in [-124, 0]
  float r = fsub(d, fmul(n, 0.693145751953125f));
  r = fsub(r, fmul(n, 1.42860677e-6f));
  float p = static_cast<float>(1.0 / 5040.0);
  p = fadd(fmul(p, r), static_cast<float>(1.0 / 720.0));
  p = fadd(fmul(p, r), static_cast<float>(1.0 / 120.0));
  p = fadd(fmul(p, r), static_cast<float>(1.0 / 24.0));
  p = fadd(fmul(p, r), static_cast<float>(1.0 / 6.0));
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.0f);
  p = fadd(fmul(p, r), 1.0f);
  return fmul(p, bits_float(static_cast<uint32_t>(127 + static_cast<int>(n)) << 23));
}

// The fixed-point weight of an element at d = z - max z: floor(e^d * 2^40), 0 for d < -27.
KILN_HD uint64_t weight(float d) {
  if (!(d >= kWeightFloor)) return 0;
  return static_cast<uint64_t>(fmul(exp_nonpos(d), kWeightScale));
}

// Bucket of d = z - max z: floor(-d * 8) (0 .. 216) when the weight is positive, else kZeroBucket.
// Monotone: a larger z never has a larger bucket.
KILN_HD int bucket(float d) {
  if (!(d >= kWeightFloor)) return kZeroBucket;
  return static_cast<int>(fmul(-d, kBucketsPerNat));
}

// ---------------------------------------------------------------------------------------------
// Fixed-point targets (doubles rounded to nearest; mass < 2^63 converts exactly or to nearest)

// Top-p: the least mass a kept prefix must reach, max(1, ceil(top_p * mass)) capped at mass.
KILN_HD uint64_t top_p_target(float top_p, uint64_t mass) {
  const double t = ceil(dmul(static_cast<double>(top_p), static_cast<double>(mass)));
  uint64_t r = t <= 0.0 ? 0 : (t >= static_cast<double>(mass) ? mass : static_cast<uint64_t>(t));
  return r < 1 ? 1 : r;
}

// Min-p: the least weight kept, ceil(min_p * 2^40) (min_p capped at 2; 0 when min_p <= 0).
KILN_HD uint64_t min_p_floor(float min_p) {
  if (!(min_p > 0.0f)) return 0;
  const double c = ceil(dmul(static_cast<double>(min_p < 2.0f ? min_p : 2.0f), 1099511627776.0));
  return static_cast<uint64_t>(c);
}

// The draw: floor(u * mass) capped at mass - 1 (mass > 0, u in [0, 1)).
KILN_HD uint64_t draw_target(double u, uint64_t mass) {
  const uint64_t r = static_cast<uint64_t>(floor(dmul(u, static_cast<double>(mass))));
  return r < mass ? r : mass - 1;
}

// The behaviour log-probability (ops::kLogprobsSampled) of a token drawn with kept weight w out of
// the kept mass M: log w - log M, each log in double, rounded to f32. mass == 0 means there was no
// draw (greedy, no finite maximum, nothing kept): a point mass, 0.
KILN_HD float drawn_logprob(uint64_t w, uint64_t mass) {
  if (mass == 0) return 0.0f;
  return static_cast<float>(log(static_cast<double>(w)) - log(static_cast<double>(mass)));
}

KILN_HD uint64_t row_seed(const ops::SamplingRow& p) {
  return static_cast<uint64_t>(p.seed_lo) | (static_cast<uint64_t>(p.seed_hi) << 32);
}
KILN_HD double row_uniform(const ops::SamplingRow& p) {
  return rng::uniform(row_seed(p), static_cast<uint64_t>(static_cast<int64_t>(p.position)));
}

// ---------------------------------------------------------------------------------------------
// Workspace of one row (CUDA): the candidate list (keys, indices: V each) and the top-N candidates
// of the log-probabilities (kMaxTopLogprobs per thread at most: values, indices).

// A tensor argument that is given (not a default Tensor{} and not of zero elements).
inline bool present(const Tensor& t) { return t.data != nullptr && t.numel() > 0; }

constexpr int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }
constexpr int64_t top_candidates(int64_t vocab) {
  return ops::kMaxTopLogprobs * ((vocab + kBlockThreads - 1) / kBlockThreads);
}
constexpr int64_t row_workspace_bytes(int64_t vocab) {
  return 2 * align256(4 * vocab) + 2 * align256(4 * top_candidates(vocab));
}

}  // namespace kiln::sampling
