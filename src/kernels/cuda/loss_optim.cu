// CUDA twins of the fused cross-entropy row op and the optimizer updates (kernels/train_ops.h);
// the CPU twins in kernels/cpu/loss_optim.cpp state the math.
//
// cross_entropy_forward_backward: one block of kCeThreads threads per row of logits [R, V]
// (V up to ~256K; [4096, 128256] bf16 chunks in training, so it is bandwidth-bound: two reads and
// one write of the row).
//   Every quantity is of z = logit_scale * x: the kernel works in the base-2 domain with
//   logit_scale * log2(e) split in hi + lo parts (hi + lo = log2(e), the plain op's constants, when
//   logit_scale = 1, so that case is the plain op bit for bit).
//   Pass 1 (online softmax): each thread keeps a running maximum mlog of x * hi and
//     s = sum 2^y, y = x * (hi + lo) - mlog, rescaled when its maximum grows; y is formed by two
//     fmas, so it is exact to f32 rounding of the (small) result, and 2^y is one ex2.approx. It also
//     sums x (double per 8-element vector) for the label-smoothing term. With entropies (a second
//     instantiation, so the plain op's pass is unchanged) it also keeps a = sum 2^y * y in f32,
//     rescaled with s (a -> f * (a - d * s) when the maximum grows by d, f = 2^-d), and
//     entropy = ln s - ln 2 * a / s (double, clamped at 0). The block merges (mlog, s[, a], sum_x),
//     and thread 0 writes loss and logprob: lse = mlog * ln 2 + ln s (double).
//   Pass 2 (write_grad): grad = k * (2^(x * (hi + lo) - lse * log2(e)) - ls / V - (1 - ls) [v == t]),
//     k = f32(grad_scale * row_scale * logit_scale) (double product, rounded once), rounded to the
//     logits' dtype and written in place.
//   Rows are read as a scalar head up to the first 16-byte boundary, 16-byte vectors of 8 elements
//   (one uint4 for bf16/f16, two float4 for f32) and a scalar tail, so any V and any row alignment
//   gets the vector path. Ignored rows (t < 0) skip pass 1 and write zeros. A target >= V (a caller
//   bug; the CPU twin asserts) gives NaN loss and logprob and a gradient without the one-hot term.
//
// adamw_step / sgd_step: one grid-stride elementwise kernel over N (int64 indices, N up to ~1.3e9):
//   float4 loads/stores of params, grads, m, v when every pointer is 16-byte aligned (and the compute
//   copy 8-byte aligned), else the scalar kernel; a scalar tail for N % 4. Every f32 operation is an
//   explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, __fmaf_rn) in the
//   CPU twin's order, so no fma contraction changes the result: CUDA and CPU agree bit for bit.
//   The f32 scalars are computed on the host exactly as the CPU twin computes them.
//
// sum_squares: a fixed grid (a deterministic function of the GPU's SM count and N), each
//   thread accumulating x^2 in double (FP64 is cheap next to the memory traffic on Hopper, and it
//   matches the CPU twin's f64 squares: no f32 overflow for |x| > 1.8e19), a double per block, then a
//   one-block second pass, copied to the host (which synchronises the stream).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "kernels/adamw_scalars.h"
#include "kernels/cuda/cuda_train_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"  // fast_exp2 (results below 2^-126 flush to 0: negligible here)

namespace kiln::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Cross entropy

constexpr int kCeThreads = 512;
constexpr float kLog2eHi = 1.44269502162933349609375f;  // float(log2(e))
constexpr float kLog2eLo = 1.925963033500011e-08f;      // log2(e) - kLog2eHi (> 0)
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2e = 1.44269504088896340736;

// x * (logit_scale * log2(e)) - c, with the product carried to ~2^-48 relative inside the fmas:
// hi + lo is logit_scale * log2(e) split into two floats, hi below it and lo > 0 (see
// log2e_split). For x = -inf the result is -inf (lo > 0), so -inf logits add nothing.
__device__ __forceinline__ float log2_domain(float x, float hi, float lo, float c) {
  return __fmaf_rn(x, hi, __fmaf_rn(x, lo, -c));
}

// Running softmax state of one thread, in the base-2 domain y = z * log2(e) - mlog (z the scaled
// logit): s = sum 2^y; sum_x = sum x (unscaled); a = sum 2^y * y (only with kEntropy: the entropy
// is ln s - ln 2 * a / s).
struct CeState {
  float mlog;
  float s;
  float a;
  double sum_x;
};

// Re-expresses the state relative to a maximum m >= st.mlog: every term 2^y becomes f * 2^y with
// f = 2^(st.mlog - m), and every y becomes y - (m - st.mlog), so a -> f * (a - (m - st.mlog) * s).
// Returns f; the caller rescales s. A state that has seen nothing finite (mlog = -inf) has a = 0.
template <bool kEntropy>
__device__ __forceinline__ float ce_rescale_a(float& a, float mlog, float s, float m) {
  const float f = fast_exp2(mlog - m);  // mlog = -inf: 2^-inf = 0
  if constexpr (kEntropy) {
    if (mlog != -INFINITY) a = f * (a - (m - mlog) * s);
  }
  return f;
}

// Adds n values (n <= 8) to the state.
template <bool kEntropy, int N>
__device__ __forceinline__ void ce_add(CeState& st, const float (&v)[N], int n, float hi, float lo) {
  float vmax = -INFINITY;
  float vsum = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) {
      vmax = fmaxf(vmax, v[k]);
      vsum += v[k];
    }
  }
  // NaN propagates through vsum / the exponent sums; fmaxf would drop it.
  const float vlog = vmax * hi;
  if (vlog > st.mlog) {
    st.s *= ce_rescale_a<kEntropy>(st.a, st.mlog, st.s, vlog);
    st.mlog = vlog;
  }
  if (st.mlog == -INFINITY) {
    // Nothing finite seen yet (all -inf so far): the terms are 0, but a NaN must still propagate.
    if (vsum != vsum) st.s = NAN;
  } else {
    float e = 0.0f, ey = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < n) {
        const float y = log2_domain(v[k], hi, lo, st.mlog);
        const float p = fast_exp2(y);
        e += p;
        if constexpr (kEntropy) ey += p > 0.0f ? p * y : 0.0f;  // p = 0 where y = -inf
      }
    }
    st.s += e;
    if constexpr (kEntropy) st.a += ey;
  }
  st.sum_x += static_cast<double>(vsum);
}

template <bool kEntropy>
__device__ __forceinline__ CeState ce_merge(CeState a, CeState b) {
  const float m = fmaxf(a.mlog, b.mlog);
  CeState r;
  r.mlog = m;
  r.a = 0.0f;
  if (m == -INFINITY) {  // neither side has seen a finite value
    r.s = a.s + b.s;     // 0, or NaN carried
  } else {
    const float fa = ce_rescale_a<kEntropy>(a.a, a.mlog, a.s, m);
    const float fb = ce_rescale_a<kEntropy>(b.a, b.mlog, b.s, m);
    r.s = a.s * fa + b.s * fb;
    if constexpr (kEntropy) r.a = a.a + b.a;
  }
  r.sum_x = a.sum_x + b.sum_x;
  return r;
}

template <bool kEntropy>
__device__ __forceinline__ CeState ce_warp_merge(CeState st) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    CeState other;
    other.mlog = __shfl_xor_sync(0xffffffffu, st.mlog, o);
    other.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    other.a = 0.0f;
    if constexpr (kEntropy) other.a = __shfl_xor_sync(0xffffffffu, st.a, o);
    other.sum_x = __shfl_xor_sync(0xffffffffu, st.sum_x, o);
    st = ce_merge<kEntropy>(st, other);
  }
  return st;
}

// Elements before the first 16-byte boundary of a row starting at `row` (element size `esize`,
// `row` aligned to esize), at most V.
__device__ __forceinline__ int64_t row_head(const void* row, int esize, int64_t V) {
  const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15u);
  const int64_t head = mis == 0 ? 0 : (16 - mis) / esize;
  return head < V ? head : V;
}

// Scalar arguments of one launch. log2e_hi + log2e_lo = logit_scale * log2(e) (log2e_split).
struct CeArgs {
  float label_smoothing;
  float grad_scale;
  float logit_scale;
  float log2e_hi, log2e_lo;
  bool write_grad;
};

// logits: [R, V] (dt), in place; targets: [R] i32; losses, logprobs: [R] f32 or nullptr;
// row_scales: [R] f32 or nullptr; entropies: [R] f32 (kEntropy) or nullptr.
template <bool kEntropy>
__global__ void __launch_bounds__(kCeThreads, 2)
    cross_entropy_kernel(void* logits, DType dt, int64_t V, const int32_t* targets, float* losses, float* logprobs,
                         const float* row_scales, float* entropies, CeArgs args) {
  __shared__ float sm_mlog[kCeThreads / 32];
  __shared__ float sm_s[kCeThreads / 32];
  __shared__ float sm_a[kCeThreads / 32];
  __shared__ double sm_sum[kCeThreads / 32];
  __shared__ float sm_lse2;

  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x;
  const int esize = dt == DType::f32 ? 4 : 2;
  char* row = static_cast<char*>(logits) + r * V * esize;
  const int32_t t = targets[r];
  const float hi = args.log2e_hi, lo = args.log2e_lo;

  // Row layout: [0, head) scalar, [head, body_end) vectors of 8, [body_end, V) scalar.
  const int64_t head = row_head(row, esize, V);
  const int64_t nvec = (V - head) / 8;
  const int64_t body_end = head + nvec * 8;
  void* body = row + head * esize;

  if (t < 0) {  // ignored row
    if (tid == 0) {
      if (losses) losses[r] = 0.0f;
      if (logprobs) logprobs[r] = 0.0f;
      if (kEntropy) entropies[r] = 0.0f;
    }
    if (args.write_grad) {
      const float zeros[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      for (int64_t k = tid; k < nvec; k += kCeThreads) detail::store_vec<8>(body, k * 8, dt, zeros);
      for (int64_t j = tid; j < head; j += kCeThreads) detail::store1(row, j, dt, 0.0f);
      for (int64_t j = body_end + tid; j < V; j += kCeThreads) detail::store1(row, j, dt, 0.0f);
    }
    return;
  }
  const bool target_ok = t < V;

  // Pass 1: online max / sum of exponentials (and of 2^y * y for the entropy), and the sum of x.
  CeState st{-INFINITY, 0.0f, 0.0f, 0.0};
  float x_t = 0.0f;
  if (tid == 0 && target_ok) x_t = detail::load1(row, t, dt);
  {
    int64_t k = tid;
    // Two vectors in flight per iteration.
    for (; k + kCeThreads < nvec; k += 2 * kCeThreads) {
      float a[8], b[8];
      detail::load_vec<8>(body, k * 8, dt, a);
      detail::load_vec<8>(body, (k + kCeThreads) * 8, dt, b);
      ce_add<kEntropy, 8>(st, a, 8, hi, lo);
      ce_add<kEntropy, 8>(st, b, 8, hi, lo);
    }
    if (k < nvec) {
      float a[8];
      detail::load_vec<8>(body, k * 8, dt, a);
      ce_add<kEntropy, 8>(st, a, 8, hi, lo);
    }
  }
  for (int64_t j = tid; j < head; j += kCeThreads) {
    const float a[1] = {detail::load1(row, j, dt)};
    ce_add<kEntropy, 1>(st, a, 1, hi, lo);
  }
  for (int64_t j = body_end + tid; j < V; j += kCeThreads) {
    const float a[1] = {detail::load1(row, j, dt)};
    ce_add<kEntropy, 1>(st, a, 1, hi, lo);
  }

  // Block merge: warps by shuffles, then the warp leaders through shared memory.
  st = ce_warp_merge<kEntropy>(st);
  const int warp = tid / 32, lane = tid % 32;
  if (lane == 0) {
    sm_mlog[warp] = st.mlog;
    sm_s[warp] = st.s;
    if (kEntropy) sm_a[warp] = st.a;
    sm_sum[warp] = st.sum_x;
  }
  __syncthreads();
  if (warp == 0) {
    constexpr int kWarps = kCeThreads / 32;
    CeState w{-INFINITY, 0.0f, 0.0f, 0.0};
    if (lane < kWarps) w = CeState{sm_mlog[lane], sm_s[lane], kEntropy ? sm_a[lane] : 0.0f, sm_sum[lane]};
    w = ce_warp_merge<kEntropy>(w);
    if (lane == 0) {
      // lse, logp and the mean are of z = logit_scale * x (mlog is already in z's units).
      const double ls = args.label_smoothing;
      const double c = args.logit_scale;
      const double lse = static_cast<double>(w.mlog) * kLn2 + log(static_cast<double>(w.s));
      double logp_t = c * static_cast<double>(x_t) - lse;
      double loss = (1.0 - ls) * (-logp_t);
      if (ls != 0.0) loss += ls * (lse - c * w.sum_x / static_cast<double>(V));
      if (!target_ok) logp_t = loss = NAN;
      if (losses) losses[r] = static_cast<float>(loss);
      if (logprobs) logprobs[r] = static_cast<float>(logp_t);
      if constexpr (kEntropy) {
        // H = ln s - ln 2 * a / s; >= 0 mathematically (the f32 sums can leave -1e-7; NaN is kept).
        double h = log(static_cast<double>(w.s)) - kLn2 * static_cast<double>(w.a) / static_cast<double>(w.s);
        if (h < 0.0) h = 0.0;
        entropies[r] = static_cast<float>(h);
      }
      sm_lse2 = static_cast<float>(lse * kLog2e);
    }
  }
  if (!args.write_grad) return;
  __syncthreads();

  // Pass 2: the gradient, in place; each element is read and written by one thread. The vectors run
  // from the end of the row back, so the first reads find the most recently loaded part in L2.
  const float lse2 = sm_lse2;
  const float ls_f = args.label_smoothing;
  const float smooth = static_cast<float>(static_cast<double>(ls_f) / static_cast<double>(V));
  const float hot = 1.0f - ls_f;
  // The row's factor grad_scale * row_scale * logit_scale, rounded once (exactly grad_scale when the
  // other two are 1).
  const double rs = row_scales ? static_cast<double>(row_scales[r]) : 1.0;
  const float k_row = static_cast<float>(static_cast<double>(args.grad_scale) * rs * static_cast<double>(args.logit_scale));
  // grad = k_row * (p - smooth - hot [j == t]).
  auto grad_of = [&](float x, int64_t j) {
    const float p = fast_exp2(log2_domain(x, hi, lo, lse2));
    float q = p - smooth;
    if (j == t) q -= hot;
    return k_row * q;
  };
  {
    int64_t k = nvec - 1 - tid;
    // Two vectors in flight per iteration.
    for (; k - kCeThreads >= 0; k -= 2 * kCeThreads) {
      float a[8], b[8];
      detail::load_vec<8>(body, k * 8, dt, a);
      detail::load_vec<8>(body, (k - kCeThreads) * 8, dt, b);
      const int64_t ja = head + k * 8, jb = head + (k - kCeThreads) * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        a[e] = grad_of(a[e], ja + e);
        b[e] = grad_of(b[e], jb + e);
      }
      detail::store_vec<8>(body, k * 8, dt, a);
      detail::store_vec<8>(body, (k - kCeThreads) * 8, dt, b);
    }
    if (k >= 0) {
      float a[8];
      detail::load_vec<8>(body, k * 8, dt, a);
      const int64_t ja = head + k * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) a[e] = grad_of(a[e], ja + e);
      detail::store_vec<8>(body, k * 8, dt, a);
    }
  }
  for (int64_t j = tid; j < head; j += kCeThreads) detail::store1(row, j, dt, grad_of(detail::load1(row, j, dt), j));
  for (int64_t j = body_end + tid; j < V; j += kCeThreads)
    detail::store1(row, j, dt, grad_of(detail::load1(row, j, dt), j));
}

// logit_scale * log2(e) as hi + lo: hi the float just below it, lo > 0 the float nearest the rest
// (lo > 0 keeps -inf logits at -inf in log2_domain). For logit_scale = 1 these are kLog2eHi /
// kLog2eLo, the constants of the plain op.
void log2e_split(float logit_scale, float& hi, float& lo) {
  if (logit_scale == 1.0f) {
    hi = kLog2eHi;
    lo = kLog2eLo;
    return;
  }
  const double target = static_cast<double>(logit_scale) * kLog2e;
  hi = static_cast<float>(target);
  if (static_cast<double>(hi) >= target) hi = std::nextafter(hi, 0.0f);
  lo = static_cast<float>(target - static_cast<double>(hi));
  KILN_ASSERT(lo > 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Optimizers

// The scalars come from kernels/adamw_scalars.h, shared with the CPU twin (the GPU test checks the
// two agree bit for bit).
using ops::detail::AdamWScalars;
using ops::detail::adamw_scalars;

// One element of AdamW, the CPU twin's operations in its order, each rounded once.
__device__ __forceinline__ void adamw_element(float& p, float grad, float& m, float& v, bool decay,
                                              const AdamWScalars& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  if (decay) p = __fmul_rn(p, c.decay);
  m = __fmaf_rn(c.one_minus_b1, __fsub_rn(g, m), m);
  v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, m), denom));
}

struct SgdScalars {
  float neg_lr;
  float weight_decay;
  float grad_scale;
};

__device__ __forceinline__ void sgd_element(float& p, float grad, bool decay, const SgdScalars& c) {
  float g = __fmul_rn(grad, c.grad_scale);
  if (decay) g = __fadd_rn(g, __fmul_rn(c.weight_decay, p));
  p = __fadd_rn(p, __fmul_rn(c.neg_lr, g));
}

// Stores 4 consecutive compute-copy values at element i (i % 4 == 0, 8-byte-aligned base).
__device__ __forceinline__ void store_lowp4(void* lowp, DType dt, int64_t i, float a, float b, float c, float d) {
  uint2 u;
  if (dt == DType::bf16) {
    *reinterpret_cast<__nv_bfloat162*>(&u.x) = __floats2bfloat162_rn(a, b);
    *reinterpret_cast<__nv_bfloat162*>(&u.y) = __floats2bfloat162_rn(c, d);
  } else {
    *reinterpret_cast<__half2*>(&u.x) = __floats2half2_rn(a, b);
    *reinterpret_cast<__half2*>(&u.y) = __floats2half2_rn(c, d);
  }
  *reinterpret_cast<uint2*>(static_cast<char*>(lowp) + i * 2) = u;
}

// params, grads, m, v: [N] f32; lowp: [N] bf16/f16 or nullptr. kVec: float4 body (all pointers
// 16-byte aligned, lowp 8-byte aligned) + scalar tail; else scalar throughout.
template <bool kVec>
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v, void* lowp, DType lowp_dt,
                             int64_t N, int64_t decay_end, AdamWScalars c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    const int64_t nvec = N / 4;
    for (int64_t k = tid; k < nvec; k += stride) {
      const int64_t i = k * 4;
      float4 p = reinterpret_cast<const float4*>(params)[k];
      const float4 g = reinterpret_cast<const float4*>(grads)[k];
      float4 mm = reinterpret_cast<const float4*>(m)[k];
      float4 vv = reinterpret_cast<const float4*>(v)[k];
      adamw_element(p.x, g.x, mm.x, vv.x, i + 0 < decay_end, c);
      adamw_element(p.y, g.y, mm.y, vv.y, i + 1 < decay_end, c);
      adamw_element(p.z, g.z, mm.z, vv.z, i + 2 < decay_end, c);
      adamw_element(p.w, g.w, mm.w, vv.w, i + 3 < decay_end, c);
      reinterpret_cast<float4*>(params)[k] = p;
      reinterpret_cast<float4*>(m)[k] = mm;
      reinterpret_cast<float4*>(v)[k] = vv;
      if (lowp) store_lowp4(lowp, lowp_dt, i, p.x, p.y, p.z, p.w);
    }
    scalar_begin = nvec * 4;
  }
  for (int64_t i = scalar_begin + tid; i < N; i += stride) {
    float p = params[i], mm = m[i], vv = v[i];
    adamw_element(p, grads[i], mm, vv, i < decay_end, c);
    params[i] = p;
    m[i] = mm;
    v[i] = vv;
    if (lowp) detail::store1(lowp, i, lowp_dt, p);
  }
}

template <bool kVec>
__global__ void sgd_kernel(float* params, const float* grads, void* lowp, DType lowp_dt, int64_t N, int64_t decay_end,
                           SgdScalars c) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    const int64_t nvec = N / 4;
    for (int64_t k = tid; k < nvec; k += stride) {
      const int64_t i = k * 4;
      float4 p = reinterpret_cast<const float4*>(params)[k];
      const float4 g = reinterpret_cast<const float4*>(grads)[k];
      sgd_element(p.x, g.x, i + 0 < decay_end, c);
      sgd_element(p.y, g.y, i + 1 < decay_end, c);
      sgd_element(p.z, g.z, i + 2 < decay_end, c);
      sgd_element(p.w, g.w, i + 3 < decay_end, c);
      reinterpret_cast<float4*>(params)[k] = p;
      if (lowp) store_lowp4(lowp, lowp_dt, i, p.x, p.y, p.z, p.w);
    }
    scalar_begin = nvec * 4;
  }
  for (int64_t i = scalar_begin + tid; i < N; i += stride) {
    float p = params[i];
    sgd_element(p, grads[i], i < decay_end, c);
    params[i] = p;
    if (lowp) detail::store1(lowp, i, lowp_dt, p);
  }
}

constexpr int kOptThreads = 256;

void check_f32_vector(const CudaBackend& be, const Tensor& t, int64_t n) {
  detail::check_float(be, t);
  KILN_ASSERT(t.dtype == DType::f32 && t.numel() == n);
}

// params_lowp: absent (data == nullptr) or [N] bf16/f16 on the device.
void* checked_lowp(const CudaBackend& be, const Tensor& lowp, int64_t n) {
  if (lowp.data == nullptr) return nullptr;
  detail::check_float(be, lowp);
  KILN_ASSERT(lowp.dtype != DType::f32 && lowp.numel() == n);
  return lowp.data;
}

bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

// ---------------------------------------------------------------------------------------------
// sum_squares

constexpr int kSsThreads = 256;

__device__ __forceinline__ double block_sum(double v, double* smem) {
  return detail::block_reduce<kSsThreads>(v, detail::SumOp{}, 0.0, smem);
}

// partial[blockIdx.x] = sum over this block's grid-stride share of x^2 (double).
template <bool kVec>
__global__ void __launch_bounds__(kSsThreads) sum_squares_kernel(const float* x, int64_t N, double* partial) {
  __shared__ double smem[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kSsThreads;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kSsThreads + threadIdx.x;
  double acc = 0.0;
  int64_t scalar_begin = 0;
  if constexpr (kVec) {
    const int64_t nvec = N / 4;
    for (int64_t k = tid; k < nvec; k += stride) {
      const float4 a = reinterpret_cast<const float4*>(x)[k];
      const double a0 = a.x, a1 = a.y, a2 = a.z, a3 = a.w;
      acc += (a0 * a0 + a1 * a1) + (a2 * a2 + a3 * a3);
    }
    scalar_begin = nvec * 4;
  }
  for (int64_t i = scalar_begin + tid; i < N; i += stride) {
    const double a = x[i];
    acc += a * a;
  }
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = sum of partial[0..n) (one block).
__global__ void __launch_bounds__(kSsThreads) sum_partials_kernel(const double* partial, int n, double* out) {
  __shared__ double smem[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += kSsThreads) acc += partial[i];
  acc = block_sum(acc, smem);
  if (threadIdx.x == 0) out[0] = acc;
}

}  // namespace

void cross_entropy_forward_backward(CudaBackend& be, Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const ops::CrossEntropyOptions& o) {
  detail::check_float(be, logits);
  detail::check_i32(be, targets);
  KILN_ASSERT(logits.ndim() >= 1);
  const int64_t V = logits.size(-1);
  KILN_ASSERT(V > 0 && V < (int64_t(1) << 31));
  const int64_t R = logits.numel() / V;
  KILN_ASSERT(targets.numel() == R);
  KILN_ASSERT(std::isfinite(o.logit_scale) && o.logit_scale > 0.0f);
  // An optional [R] f32 tensor on the device: its pointer, or nullptr when absent.
  auto optional_rows = [&](const Tensor& x) -> float* {
    if (x.data == nullptr) return nullptr;
    detail::check_float(be, x);
    KILN_ASSERT(x.dtype == DType::f32 && x.numel() == R);
    return x.ptr<float>();
  };
  float* loss_ptr = optional_rows(losses);
  float* logp_ptr = optional_rows(logprobs);
  const float* rs_ptr = optional_rows(o.row_scales);
  float* ent_ptr = optional_rows(o.entropies);
  if (R == 0) return;
  KILN_ASSERT(R < (int64_t(1) << 31));
  CeArgs args;
  args.label_smoothing = o.label_smoothing;
  args.grad_scale = o.grad_scale;
  args.logit_scale = o.logit_scale;
  log2e_split(o.logit_scale, args.log2e_hi, args.log2e_lo);
  args.write_grad = o.write_grad;
  const unsigned grid = static_cast<unsigned>(R);
  if (ent_ptr != nullptr) {
    cross_entropy_kernel<true><<<grid, kCeThreads, 0, detail::stream_of(be)>>>(
        logits.data, logits.dtype, V, targets.ptr<const int32_t>(), loss_ptr, logp_ptr, rs_ptr, ent_ptr, args);
  } else {
    cross_entropy_kernel<false><<<grid, kCeThreads, 0, detail::stream_of(be)>>>(
        logits.data, logits.dtype, V, targets.ptr<const int32_t>(), loss_ptr, logp_ptr, rs_ptr, nullptr, args);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

void adamw_step(CudaBackend& be, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp,
                const ops::AdamWStep& s) {
  const int64_t N = params.numel();
  check_f32_vector(be, params, N);
  check_f32_vector(be, grads, N);
  check_f32_vector(be, m, N);
  check_f32_vector(be, v, N);
  void* lowp = checked_lowp(be, params_lowp, N);
  const AdamWScalars c = adamw_scalars(s);
  const int64_t decay_end = std::min<int64_t>(std::max<int64_t>(s.decay_end, 0), N);
  if (N == 0) return;
  const bool vec = detail::aligned16(params.data) && detail::aligned16(grads.data) && detail::aligned16(m.data) &&
                   detail::aligned16(v.data) && (lowp == nullptr || aligned8(lowp));
  cudaStream_t stream = detail::stream_of(be);
  const unsigned grid = detail::grid_for(be, vec ? detail::ceil_div(N, 4) : N, kOptThreads);
  if (vec)
    adamw_kernel<true><<<grid, kOptThreads, 0, stream>>>(params.ptr<float>(), grads.ptr<const float>(), m.ptr<float>(),
                                                          v.ptr<float>(), lowp, params_lowp.dtype, N, decay_end, c);
  else
    adamw_kernel<false><<<grid, kOptThreads, 0, stream>>>(params.ptr<float>(), grads.ptr<const float>(),
                                                           m.ptr<float>(), v.ptr<float>(), lowp, params_lowp.dtype, N,
                                                           decay_end, c);
  KILN_CUDA_CHECK_LAUNCH();
}

void sgd_step(CudaBackend& be, Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay,
              float grad_scale, int64_t decay_end) {
  const int64_t N = params.numel();
  check_f32_vector(be, params, N);
  check_f32_vector(be, grads, N);
  void* lowp = checked_lowp(be, params_lowp, N);
  decay_end = std::min<int64_t>(std::max<int64_t>(decay_end, 0), N);
  if (N == 0) return;
  const SgdScalars c{-lr, weight_decay, grad_scale};
  const bool vec = detail::aligned16(params.data) && detail::aligned16(grads.data) && (lowp == nullptr || aligned8(lowp));
  cudaStream_t stream = detail::stream_of(be);
  const unsigned grid = detail::grid_for(be, vec ? detail::ceil_div(N, 4) : N, kOptThreads);
  if (vec)
    sgd_kernel<true><<<grid, kOptThreads, 0, stream>>>(params.ptr<float>(), grads.ptr<const float>(), lowp,
                                                        params_lowp.dtype, N, decay_end, c);
  else
    sgd_kernel<false><<<grid, kOptThreads, 0, stream>>>(params.ptr<float>(), grads.ptr<const float>(), lowp,
                                                         params_lowp.dtype, N, decay_end, c);
  KILN_CUDA_CHECK_LAUNCH();
}

double sum_squares(CudaBackend& be, Tensor x) {
  detail::check_float(be, x);
  KILN_ASSERT(x.dtype == DType::f32);
  const int64_t N = x.numel();
  if (N == 0) return 0.0;
  // A fixed grid for a given GPU (deterministic summation order), capped by the work.
  const bool vec = detail::aligned16(x.data);
  const int blocks = static_cast<int>(detail::grid_for(be, vec ? detail::ceil_div(N, 4) : N, kSsThreads));
  // Scratch: blocks partial sums + the total, as 8-byte elements (there is no f64 dtype).
  TensorBuffer scratch = kiln::empty_for_op(be, Shape{blocks + 1}, DType::i64);
  double* partial = scratch.ptr<double>();
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    sum_squares_kernel<true><<<blocks, kSsThreads, 0, stream>>>(x.ptr<const float>(), N, partial);
  else
    sum_squares_kernel<false><<<blocks, kSsThreads, 0, stream>>>(x.ptr<const float>(), N, partial);
  KILN_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kSsThreads, 0, stream>>>(partial, blocks, partial + blocks);
  KILN_CUDA_CHECK_LAUNCH();
  TensorBuffer host = kiln::host_empty(Shape{1}, DType::i64);
  be.copy(host, scratch.view().rows(blocks, blocks + 1));  // synchronises: complete on return
  return *host.ptr<const double>();
}

}  // namespace kiln::cuda
