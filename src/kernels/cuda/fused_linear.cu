// Small-batch linear layers with their neighbours fused (ops.h: norm_linear_forward,
// norm_linear_swiglu_forward, linear_residual_forward): the decode path, where a step's few rows make
// every projection a matrix-vector product bound by reading the weights once.
//
// y^T = W x^T on tensor cores: W [N, K] (row-major) is mma's A operand, 16 weight rows per tile; the
// batch rows of x [M, K] are its B operand, MT n8 tiles (M <= 8 MT). The k dimension is permuted
// identically on both sides so that every thread loads 16 contiguous bytes per row: within a 32-wide
// k chunk, thread (g = lane / 4, t = lane % 4) loads elements [8t, 8t + 8) of weight rows g and g + 8
// and of batch row g; words 0-1 feed the chunk's first k16 product and words 2-3 its second (mma's k
// slots {2t, 2t+1, 2t+8, 2t+9} of both operands then hold the same physical k).
//
// Block: kWarps warps over the same RG x 16 weight rows (RG = 2 for SwiGLU: 16 gate rows and the 16
// up rows of the same outputs), each warp a contiguous range of K; weight loads run a chunk group
// ahead in a register double buffer and bypass L1 (the batch rows, re-read by every block, stay in
// it). The warps' partial sums meet in shared memory and are added in a fixed order: no atomics, so
// results are deterministic and a replayed graph is bit-exact. Epilogue per output: times the
// batch row's 1 / rms when normed, plus bias, then stored, added to the f32 residual, or SwiGLU.
// Norm prologue: x is the f32 residual stream; each thread multiplies its x chunk by the norm weight
// and rounds it to the weight dtype, and sums x^2 of its chunks; the block adds those up at the end.
#include <type_traits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/mma_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

enum class Epilogue { store, add_residual, swiglu };

template <typename T, int MT, int RG, bool kNorm, Epilogue kEpi>
struct DecodeLinear {
  static constexpr int U = MT == 1 ? 2 : 1;  // k chunks per pipeline stage
  using XWord = std::conditional_t<kNorm, float4, uint4>;
  static constexpr int XW = kNorm ? 2 : 1;  // XWords per thread per chunk and batch tile

  struct Stage {
    uint4 w[U][RG][2];      // weight rows g and g + 8 of each row group
    XWord x[U][MT][XW];     // batch row tile*8 + g
    uint4 nw[kNorm ? U : 1];  // norm weights of the chunk (kNorm)
  };
};

template <typename T, int MT, int RG, bool kNorm, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads, 1)
    decode_linear_kernel(void* __restrict__ y, DType y_dt, const void* __restrict__ x, const T* __restrict__ w,
                         const T* __restrict__ norm_w, const void* __restrict__ bias, DType b_dt, int M, int N, int K,
                         float eps) {
  using L = DecodeLinear<T, MT, RG, kNorm, kEpi>;
  constexpr int U = L::U;
  constexpr int kRows = RG * 16;
  constexpr int kCols = MT * 8;
  __shared__ float red[kWarps][kRows][kCols + 1];
  __shared__ float red_ss[kWarps][kCols];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * 16;  // first output (row of W, or of the gate half for SwiGLU)
  const int out_rows = kEpi == Epilogue::swiglu ? N / 2 : N;

  // Weight row pointers of this thread (rows g, g + 8 of each group) and whether they exist.
  const T* wrow[RG][2];
  bool wok[RG][2];
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = n0 + g + 8 * h;
      wok[rg][h] = j < out_rows;
      const int row = (kEpi == Epilogue::swiglu ? rg * out_rows : 0) + (wok[rg][h] ? j : 0);
      wrow[rg][h] = w + static_cast<int64_t>(row) * K + t * 8;
    }
  bool xok[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xok[mt] = mt * 8 + g < M;
  const int64_t x_row_stride = K;

  const int chunks = K / 32;
  const int per_warp = (chunks + kWarps - 1) / kWarps;
  const int c_begin = min(chunks, warp * per_warp), c_end = min(chunks, c_begin + per_warp);

  float acc[RG][MT][4];
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[rg][mt][0] = acc[rg][mt][1] = acc[rg][mt][2] = acc[rg][mt][3] = 0.0f;
  float ss[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) ss[mt] = 0.0f;

  using Stage = typename L::Stage;
  auto load = [&](Stage& s, int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;  // warp-uniform
      const int k = c * 32;
#pragma unroll
      for (int rg = 0; rg < RG; ++rg)
#pragma unroll
        for (int h = 0; h < 2; ++h) s.w[u][rg][h] = wok[rg][h] ? ldg_stream(wrow[rg][h] + k) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int64_t off = static_cast<int64_t>(mt * 8 + g) * x_row_stride + k + t * 8;
        if constexpr (kNorm) {
          const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(x) + off);
          s.x[u][mt][0] = xok[mt] ? p[0] : make_float4(0, 0, 0, 0);
          s.x[u][mt][1] = xok[mt] ? p[1] : make_float4(0, 0, 0, 0);
        } else {
          s.x[u][mt][0] = xok[mt] ? *reinterpret_cast<const uint4*>(static_cast<const T*>(x) + off) : make_uint4(0, 0, 0, 0);
        }
      }
      if constexpr (kNorm) s.nw[u] = *reinterpret_cast<const uint4*>(norm_w + k + t * 8);
    }
  };

  auto compute = [&](const Stage& s, int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u >= c_end) break;  // warp-uniform
      uint32_t b[MT][4];  // words of batch row tile*8 + g at k [8t, 8t + 8)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kNorm) {
          const float xs[8] = {s.x[u][mt][0].x, s.x[u][mt][0].y, s.x[u][mt][0].z, s.x[u][mt][0].w,
                               s.x[u][mt][1].x, s.x[u][mt][1].y, s.x[u][mt][1].z, s.x[u][mt][1].w};
          const T* nv = reinterpret_cast<const T*>(&s.nw[u]);
#pragma unroll
          for (int e = 0; e < 8; e += 2) {
            ss[mt] += xs[e] * xs[e] + xs[e + 1] * xs[e + 1];
            b[mt][e / 2] = Mma<T>::pack(xs[e] * static_cast<float>(nv[e]), xs[e + 1] * static_cast<float>(nv[e + 1]));
          }
        } else {
#pragma unroll
          for (int e = 0; e < 4; ++e) b[mt][e] = word(s.x[u][mt][0], e);
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) {
          const uint32_t a[4] = {word(s.w[u][rg][0], 2 * half), word(s.w[u][rg][1], 2 * half),
                                 word(s.w[u][rg][0], 2 * half + 1), word(s.w[u][rg][1], 2 * half + 1)};
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) Mma<T>::mma(acc[rg][mt], a, b[mt][2 * half], b[mt][2 * half + 1]);
        }
    }
  };

  Stage s0, s1;
  load(s0, c_begin);
  for (int c = c_begin; c < c_end; c += 2 * U) {
    load(s1, c + U);
    compute(s0, c);
    load(s0, c + 2 * U);
    compute(s1, c + U);
  }

  // Partial sums to shared memory: acc[rg][mt] = rows rg*16 + g (+8), columns mt*8 + 2t (+1).
#pragma unroll
  for (int rg = 0; rg < RG; ++rg)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      red[warp][rg * 16 + g][mt * 8 + 2 * t] = acc[rg][mt][0];
      red[warp][rg * 16 + g][mt * 8 + 2 * t + 1] = acc[rg][mt][1];
      red[warp][rg * 16 + g + 8][mt * 8 + 2 * t] = acc[rg][mt][2];
      red[warp][rg * 16 + g + 8][mt * 8 + 2 * t + 1] = acc[rg][mt][3];
    }
  if constexpr (kNorm) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float v = ss[mt];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) red_ss[warp][mt * 8 + g] = v;
    }
  }
  __syncthreads();

  // One thread per (batch row m, output j of the block): outputs j fastest for contiguous stores.
  for (int idx = threadIdx.x; idx < kCols * 16; idx += kThreads) {
    const int m = idx / 16, jl = idx % 16, j = n0 + jl;
    if (m >= M || j >= out_rows) continue;
    float scale = 1.0f;
    if constexpr (kNorm) {
      float total = 0.0f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) total += red_ss[wi][m];
      scale = 1.0f / sqrtf(total / static_cast<float>(K) + eps);
    }
    float v[RG];
#pragma unroll
    for (int rg = 0; rg < RG; ++rg) {
      float sum = 0.0f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) sum += red[wi][rg * 16 + jl][m];
      v[rg] = sum * scale;
      if (bias) v[rg] += detail::load1(bias, (kEpi == Epilogue::swiglu ? rg * out_rows : 0) + j, b_dt);
    }
    const int64_t o = static_cast<int64_t>(m) * out_rows + j;
    if constexpr (kEpi == Epilogue::store) {
      detail::store1(y, o, y_dt, v[0]);
    } else if constexpr (kEpi == Epilogue::add_residual) {
      float* r = static_cast<float*>(y) + o;
      *r = *r + v[0];
    } else {
      const float gate = v[0];
      detail::store1(y, o, y_dt, gate / (1.0f + expf(-gate)) * v[RG - 1]);
    }
  }
}

template <typename T, int RG, bool kNorm, Epilogue kEpi>
void launch_for_rows(CudaBackend& be, void* y, DType y_dt, const void* x, const void* w, const void* norm_w,
                     const void* bias, DType b_dt, int M, int N, int K, float eps) {
  const int out_rows = kEpi == Epilogue::swiglu ? N / 2 : N;
  const dim3 grid(static_cast<unsigned>((out_rows + 15) / 16));
  cudaStream_t stream = detail::stream_of(be);
  const T* wt = static_cast<const T*>(w);
  const T* nt = static_cast<const T*>(norm_w);
#define KILN_DECODE_LINEAR(MT)                                                                                 \
  decode_linear_kernel<T, MT, RG, kNorm, kEpi><<<grid, kThreads, 0, stream>>>(y, y_dt, x, wt, nt, bias, b_dt, M, \
                                                                              N, K, eps)
  if (M <= 8) KILN_DECODE_LINEAR(1);
  else if (M <= 16) KILN_DECODE_LINEAR(2);
  else KILN_DECODE_LINEAR(4);
#undef KILN_DECODE_LINEAR
  KILN_CUDA_CHECK_LAUNCH();
}

template <int RG, bool kNorm, Epilogue kEpi>
void launch(CudaBackend& be, Tensor y, Tensor x, Tensor w, Tensor norm_w, Tensor bias, float eps) {
  KILN_ASSERT(fused_linear_supported(x.numel() / std::max<int64_t>(x.size(-1), 1), x.size(-1), w.dtype));
  detail::check_float(be, y);
  detail::check_float(be, x);
  detail::check_float(be, w);
  const int64_t K = x.size(-1), M = x.numel() / K, N = w.size(0);
  KILN_ASSERT(w.ndim() == 2 && w.size(1) == K);
  KILN_ASSERT(x.dtype == (kNorm ? DType::f32 : w.dtype));
  KILN_ASSERT(y.numel() == M * (kEpi == Epilogue::swiglu ? N / 2 : N));
  if (kEpi == Epilogue::swiglu) KILN_ASSERT(N % 2 == 0);
  if (kEpi == Epilogue::add_residual) KILN_ASSERT(y.dtype == DType::f32);
  if (kNorm) KILN_ASSERT(norm_w.dtype == w.dtype && norm_w.numel() == K);
  if (bias.data) KILN_ASSERT(bias.numel() == N);
  KILN_ASSERT(detail::aligned16(x.data) && detail::aligned16(w.data) && (!kNorm || detail::aligned16(norm_w.data)));
  if (M == 0 || N == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    launch_for_rows<T, RG, kNorm, kEpi>(be, y.data, y.dtype, x.data, w.data, norm_w.data, bias.data, bias.dtype,
                                        static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), eps);
  };
  if (w.dtype == DType::bf16) run(__nv_bfloat16{});
  else run(__half{});
}

}  // namespace

bool fused_linear_supported(int64_t M, int64_t K, DType w_dtype) {
  return M >= 1 && M <= ops::kFusedLinearMaxRows && K % 32 == 0 && K > 0 && K < (int64_t(1) << 30) &&
         (w_dtype == DType::bf16 || w_dtype == DType::f16);
}

void norm_linear_forward(CudaBackend& be, Tensor y, Tensor x, Tensor norm_w, float eps, Tensor w, Tensor bias) {
  launch<1, true, Epilogue::store>(be, y, x, w, norm_w, bias, eps);
}

void norm_linear_swiglu_forward(CudaBackend& be, Tensor out, Tensor x, Tensor norm_w, float eps, Tensor w,
                                Tensor bias) {
  launch<2, true, Epilogue::swiglu>(be, out, x, w, norm_w, bias, eps);
}

void linear_residual_forward(CudaBackend& be, Tensor residual, Tensor x, Tensor w, Tensor bias) {
  launch<1, false, Epilogue::add_residual>(be, residual, x, w, Tensor{}, bias, 0.0f);
}

}  // namespace kiln::cuda
