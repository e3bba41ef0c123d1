// Matrix products through cuBLASLt, f32 accumulation (CUBLAS_COMPUTE_32F, f32 alpha/beta; f32
// inputs therefore run in true f32, never TF32).
//   linear_forward: y[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]).
//     x: [..., K] viewed as [M, K]; w: [N, K]; y: [..., N]. x and w share a dtype (bf16, f16 or f32);
//     y is that dtype or f32 (logits). The bias is fused through CUBLASLT_EPILOGUE_BIAS when it has
//     y's dtype and a 16-byte-aligned base (added in f32 before y is rounded, like the CPU twin);
//     otherwise bias_add_forward runs after the product. Batches of a few to 128 rows of bf16 run on
//     the streaming kernel instead where it is faster (linear_tma.cu, linear_tma_preferred).
//   gemm: C = alpha * op(A) @ op(B) + beta * C, row-major, op(X) = X^T when trans_X.
//     A: [M, K] (or [K, M]), B: [K, N] (or [N, K]), C: [M, N]; A and B share a dtype, C is that
//     dtype or f32. BLAS convention: with beta == 0, C is not read.
//
// Row-major to column-major: a row-major [R, S] matrix is a column-major S x R matrix, so the
// row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T, i.e. cuBLASLt's
// (m, n, k) = (N, M, K) with its A operand = our B and its B operand = our A. For linear, w [N, K]
// row-major is column-major K x N: transa = T; x is column-major K x M: transb = N.
//
// Plans (matmul descriptor, layouts, and the first algorithm of the heuristic, which is asked for
// several) are cached per backend in CudaBackend::gemm_cache(), keyed by shape, leading dimensions,
// transposes, dtypes, bias fusion and the pointer alignments (cuBLASLt assumes 256-byte-aligned
// operands unless told otherwise; views into larger buffers often are not). Repeated shapes do no
// host work beyond a map lookup and allocate nothing: the 32 MiB workspace is the backend's scratch,
// so the calls can be captured in a CUDA graph. Should the heuristic offer no algorithm for a shape
// (not expected), a warning is printed once per shape and a plain tiled SIMT kernel computes it.
#include <cublasLt.h>

#include <array>
#include <cstdlib>
#include <map>
#include <memory>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;
constexpr int kHeuristicAlgos = 8;

#define KILN_CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                                   \
    cublasStatus_t _kiln_st = (expr);                                                                    \
    if (_kiln_st != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "kiln: cuBLASLt error %s (%s) in %s at %s:%d\n", cublasLtGetStatusName(_kiln_st), \
                   cublasLtGetStatusString(_kiln_st), #expr, __FILE__, __LINE__);                        \
      std::abort();                                                                                      \
    }                                                                                                    \
  } while (0)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: KILN_ASSERT(false && "not a float dtype");
  }
  return CUDA_R_32F;
}

// Largest power of two (at most 256) dividing the address.
int64_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return std::min<int64_t>(256, static_cast<int64_t>(a & (~a + 1)));
}

// One product in cuBLASLt's column-major terms: D (m x n, ld ldd) = alpha op(A) op(B) + beta D,
// op(A): m x k, op(B): k x n.
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  DType ab_dt = DType::bf16;
  void* d = nullptr;
  int64_t ldd = 0;
  DType d_dt = DType::bf16;
  const void* bias = nullptr;  // length m, d's dtype; fused only
  float alpha = 1.0f, beta = 0.0f;
  // `batch` products at element strides stride_a / stride_b / stride_d (linear_k_split_forward).
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool fused_bias = false;
  bool fallback = false;  // no cuBLASLt algorithm: the SIMT kernel below
  // The heuristic's other usable algorithms, timed against `algo` on the first large call (then
  // cleared); see autotune().
  cublasLtMatmulAlgo_t candidates[kHeuristicAlgos] = {};
  int num_candidates = 0;
};

void destroy(Plan& p) {
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = Plan{};
}

using Key = std::array<int64_t, 19>;

struct GemmCache {
  std::map<Key, Plan> plans;
  GemmCache() = default;
  GemmCache(const GemmCache&) = delete;
  GemmCache& operator=(const GemmCache&) = delete;
  ~GemmCache() {
    for (auto& kv : plans) destroy(kv.second);
  }
};

GemmCache& cache_of(CudaBackend& be) {
  std::shared_ptr<void>& slot = be.gemm_cache();
  if (!slot) slot = std::shared_ptr<void>(new GemmCache, [](void* p) { delete static_cast<GemmCache*>(p); });
  return *static_cast<GemmCache*>(slot.get());
}

// Builds the descriptors and asks the heuristic; false (nothing leaked) when no algorithm fits.
bool make_plan(cublasLtHandle_t handle, const Problem& p, bool fuse_bias, Plan* out) {
  Plan plan;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (fuse_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    // The heuristic reads the pointer's alignment; each call sets the pointer again.
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  const cudaDataType_t ab = cuda_type(p.ab_dt), dt = cuda_type(p.d_dt);
  // Stored (pre-op) shapes, column-major.
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, ab, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, ab, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.d, dt, p.m, p.n, p.ldd));
  if (p.batch > 1) {
    const int32_t count = static_cast<int32_t>(p.batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{plan.a, p.stride_a}, {plan.b, p.stride_b}, {plan.d, p.stride_d}};
    for (const auto& [layout, stride] : strided) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = static_cast<uint64_t>(kWorkspaceBytes);
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t align_a = static_cast<uint32_t>(alignment(p.a)), align_b = static_cast<uint32_t>(alignment(p.b)),
                 align_d = static_cast<uint32_t>(alignment(p.d));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));

  cublasLtMatmulHeuristicResult_t results[kHeuristicAlgos] = {};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan.op, plan.a, plan.b, plan.d, plan.d, pref,
                                                           kHeuristicAlgos, results, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  int chosen = -1;
  if (st == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < returned; ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= static_cast<size_t>(kWorkspaceBytes)) {
        if (chosen < 0)
          chosen = i;
        else
          plan.candidates[plan.num_candidates++] = results[i].algo;
      }
    }
  }
  if (chosen < 0) {
    destroy(plan);
    return false;
  }
  plan.algo = results[chosen].algo;
  plan.fused_bias = fuse_bias;
  *out = plan;
  return true;
}

constexpr int kTile = 16;

// Plain shared-memory-tiled SIMT product in the same column-major terms, f32 accumulation, for the
// (unexpected) shapes cuBLASLt has no algorithm for. Thread (x, y) computes D(r, c) with
// r = blockIdx.x * 16 + x (consecutive threads write consecutive elements of D's columns).
__global__ void __launch_bounds__(kTile* kTile) fallback_gemm_kernel(Problem p) {
  __shared__ float a_tile[kTile][kTile + 1];  // [k][r]
  __shared__ float b_tile[kTile][kTile + 1];  // [c][k]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < p.k; k0 += kTile) {
    {  // op(A)(r0 + tx, k0 + ty)
      const int64_t r = r0 + tx, k = k0 + ty;
      a_tile[ty][tx] = (r < p.m && k < p.k)
                           ? detail::load1(p.a, p.trans_a ? k + r * p.lda : r + k * p.lda, p.ab_dt)
                           : 0.0f;
    }
    {  // op(B)(k0 + tx, c0 + ty)
      const int64_t k = k0 + tx, c = c0 + ty;
      b_tile[ty][tx] = (k < p.k && c < p.n)
                           ? detail::load1(p.b, p.trans_b ? c + k * p.ldb : k + c * p.ldb, p.ab_dt)
                           : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) acc += a_tile[kk][tx] * b_tile[ty][kk];
    __syncthreads();
  }
  const int64_t r = r0 + tx, c = c0 + ty;
  if (r < p.m && c < p.n) {
    const int64_t i = r + c * p.ldd;
    float v = p.alpha * acc;
    if (p.beta != 0.0f) v += p.beta * detail::load1(p.d, i, p.d_dt);
    if (p.bias) v += detail::load1(p.bias, r, p.d_dt);
    detail::store1(p.d, i, p.d_dt, v);
  }
}

// Products of at least this many FLOPs (~20 us on an H200) are worth timing the heuristic's
// candidates for: the first choice is often a few percent off the best on large training shapes.
constexpr double kAutotuneFlops = 1.6e10;

// Times plan.algo and each candidate on this problem (one warm-up and two timed runs each, CUDA
// events on the backend's stream) and keeps the fastest. Runs once per plan, only outside CUDA-graph
// capture; with beta != 0 the timed runs write a scratch output so C is not accumulated into.
// KILN_GEMM_AUTOTUNE=0 keeps the heuristic's first choice (bitwise reproducible across runs: the
// timing decides between algorithms that round differently).
// Milliseconds of two runs of `algo` after a warm-up run, or -1 when cuBLASLt refuses it.
float time_algo(cublasLtHandle_t handle, const Problem& p, const Plan& plan, const cublasLtMatmulAlgo_t& algo, void* out,
                void* workspace, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  for (int i = 0; i < 3; ++i) {
    if (i == 1) CUDA_CHECK(cudaEventRecord(start, stream));
    const cublasStatus_t st = cublasLtMatmul(handle, plan.op, &p.alpha, p.a, plan.a, p.b, plan.b, &p.beta, out, plan.d,
                                             out, plan.d, &algo, workspace, static_cast<size_t>(kWorkspaceBytes), stream);
    if (st != CUBLAS_STATUS_SUCCESS) return -1.0f;
  }
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms;
}

void autotune(CudaBackend& be, cublasLtHandle_t handle, const Problem& p, Plan& plan) {
  const int num_candidates = plan.num_candidates;
  plan.num_candidates = 0;  // tuned once
  const char* env = std::getenv("KILN_GEMM_AUTOTUNE");
  if (num_candidates == 0 || (env != nullptr && env[0] == '0')) return;
  if (2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) < kAutotuneFlops) return;
  cudaStream_t stream = detail::stream_of(be);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return;
  void* out = p.d;
  TensorBuffer scratch_out;
  if (p.beta != 0.0f) {
    Result<TensorBuffer> r = empty(be, Shape{p.ldd * p.n}, p.d_dt);
    if (!r.ok()) return;  // no memory to spare: keep the first choice
    scratch_out = std::move(r).value();
    out = scratch_out.view().data;
  }
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  void* workspace = be.scratch(kWorkspaceBytes);
  float best = time_algo(handle, p, plan, plan.algo, out, workspace, stream, start, stop);
  for (int i = 0; i < num_candidates; ++i) {
    const float ms = time_algo(handle, p, plan, plan.candidates[i], out, workspace, stream, start, stop);
    if (ms > 0.0f && (best < 0.0f || ms < best)) {
      best = ms;
      plan.algo = plan.candidates[i];
    }
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}

// Runs the product; returns whether the bias (if any) was added by the epilogue.
bool run_matmul(CudaBackend& be, const Problem& p) {
  const bool want_bias = p.bias != nullptr;
  const Key key{p.m, p.n, p.k, p.trans_a, p.trans_b, p.lda, p.ldb, p.ldd, static_cast<int64_t>(p.ab_dt),
                static_cast<int64_t>(p.d_dt), want_bias, alignment(p.a), alignment(p.b), alignment(p.d),
                want_bias ? alignment(p.bias) : 0, p.batch, p.stride_a, p.stride_b, p.stride_d};
  GemmCache& cache = cache_of(be);
  cublasLtHandle_t handle = static_cast<cublasLtHandle_t>(be.blaslt());
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    Plan plan;
    // KILN_GEMM_FALLBACK=1 forces the fallback kernel (read when a plan is made; for its tests).
    const char* force = std::getenv("KILN_GEMM_FALLBACK");
    const bool forced = force != nullptr && force[0] == '1';
    bool ok = !forced && make_plan(handle, p, want_bias, &plan);
    if (!ok && !forced && want_bias) ok = make_plan(handle, p, false, &plan);  // bias added by a separate kernel
    if (!ok) {
      if (!forced) {
        std::fprintf(stderr,
                     "kiln: warning: cuBLASLt has no algorithm for the matmul m=%lld n=%lld k=%lld (trans %d%d, lda %lld, "
                     "ldb %lld, ldd %lld, %s inputs, %s output); using a slow fallback kernel\n",
                     static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k), p.trans_a,
                     p.trans_b, static_cast<long long>(p.lda), static_cast<long long>(p.ldb),
                     static_cast<long long>(p.ldd), dtype_name(p.ab_dt), dtype_name(p.d_dt));
      }
      plan = Plan{};
      plan.fallback = true;
      plan.fused_bias = want_bias;
    }
    it = cache.plans.emplace(key, plan).first;
  }
  Plan& plan = it->second;
  if (plan.fallback) {
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(p.m, kTile)), static_cast<unsigned>(detail::ceil_div(p.n, kTile)));
    KILN_ASSERT(grid.y <= 65535u);
    for (int64_t z = 0; z < p.batch; ++z) {  // one launch per batch entry
      Problem entry = p;
      entry.a = static_cast<const char*>(p.a) + z * p.stride_a * dtype_size(p.ab_dt);
      entry.b = static_cast<const char*>(p.b) + z * p.stride_b * dtype_size(p.ab_dt);
      entry.d = static_cast<char*>(p.d) + z * p.stride_d * dtype_size(p.d_dt);
      fallback_gemm_kernel<<<grid, dim3(kTile, kTile), 0, detail::stream_of(be)>>>(entry);
      KILN_CUDA_CHECK_LAUNCH();
    }
    return plan.fused_bias;
  }
  if (plan.fused_bias)
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  if (plan.num_candidates > 0) autotune(be, handle, p, plan);
  void* workspace = be.scratch(kWorkspaceBytes);
  KILN_CUBLAS_CHECK(cublasLtMatmul(handle, plan.op, &p.alpha, p.a, plan.a, p.b, plan.b, &p.beta, p.d, plan.d, p.d,
                                   plan.d, &plan.algo, workspace, static_cast<size_t>(kWorkspaceBytes),
                                   detail::stream_of(be)));
  return plan.fused_bias;
}

// y[M, N] = x[M, k] @ w[N, k]^T with x's and w's rows ld elements apart, in the column-major terms
// above: y^T (N x M) = w x^T, cuBLASLt's A = w (transposed), B = x.
Problem linear_problem(const void* w, const void* x, DType ab_dt, void* y, DType y_dt, int64_t M, int64_t N, int64_t k,
                       int64_t ld) {
  Problem p;
  p.m = N;
  p.n = M;
  p.k = k;
  p.trans_a = true;
  p.a = w;
  p.lda = ld;
  p.trans_b = false;
  p.b = x;
  p.ldb = ld;
  p.ab_dt = ab_dt;
  p.d = y;
  p.ldd = N;
  p.d_dt = y_dt;
  return p;
}

constexpr int kThreads = 256;

// t *= s (t = 0 when s == 0, so NaN/garbage is not read), for the K == 0 products.
__global__ void __launch_bounds__(kThreads) scale_kernel(void* t, DType dt, int64_t n, float s) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    detail::store1(t, i, dt, s == 0.0f ? 0.0f : detail::load1(t, i, dt) * s);
}

void check_types(DType ab, DType d) {
  KILN_ASSERT(dtype_is_float(ab) && dtype_is_float(d));
  KILN_ASSERT(d == ab || d == DType::f32);  // cuBLASLt: C/D in the input type or f32
}

}  // namespace

void linear_forward(CudaBackend& be, Tensor y, Tensor x, Tensor w, Tensor bias) {
  detail::check_float(be, y);
  detail::check_float(be, x);
  detail::check_float(be, w);
  KILN_ASSERT(x.ndim() >= 1 && w.ndim() == 2 && y.ndim() == x.ndim());
  const int64_t K = x.size(-1), N = w.size(0);
  KILN_ASSERT(w.size(1) == K && y.size(-1) == N);
  for (int d = 0; d + 1 < x.ndim(); ++d) KILN_ASSERT(y.size(d) == x.size(d));
  KILN_ASSERT(x.dtype == w.dtype);
  check_types(x.dtype, y.dtype);
  const int64_t M = K == 0 ? y.numel() / std::max<int64_t>(N, 1) : x.numel() / K;
  const bool has_bias = bias.data != nullptr;
  if (has_bias) {
    detail::check_float(be, bias);
    KILN_ASSERT(bias.numel() == N);
  }
  if (M == 0 || N == 0) return;
  if (linear_tma_preferred(be, TmaEpilogue::store, M, N, K, x.dtype) && detail::aligned16(x.data) &&
      detail::aligned16(w.data))
    return linear_tma_forward(be, TmaEpilogue::store, y, x, w, bias);
  if (K == 0) {
    fill_constant(be, y, 0.0f);
    if (has_bias) bias_add_forward(be, y, bias.view(Shape{N}));
    return;
  }

  Problem p = linear_problem(w.data, x.data, x.dtype, y.data, y.dtype, M, N, K, K);
  const bool fusable = has_bias && bias.dtype == y.dtype && detail::aligned16(bias.data);
  p.bias = fusable ? bias.data : nullptr;
  const bool fused = run_matmul(be, p);
  if (has_bias && !fused) bias_add_forward(be, y, bias.view(Shape{N}));
}

void linear_k_split_forward(CudaBackend& be, Tensor partials, Tensor x, Tensor w) {
  detail::check_float(be, partials);
  detail::check_float(be, x);
  detail::check_float(be, w);
  KILN_ASSERT(x.ndim() == 2 && w.ndim() == 2 && partials.ndim() == 3 && x.dtype == w.dtype && partials.dtype == DType::f32);
  const int64_t S = partials.size(0), M = x.size(0), K = x.size(1), N = w.size(0);
  KILN_ASSERT(S >= 1 && K % S == 0 && w.size(1) == K && partials.size(1) == M && partials.size(2) == N);
  if (M == 0 || N == 0) return;
  const int64_t part = K / S;
  if (part == 0) return fill_constant(be, partials, 0.0f);
  // partials[s] = x[:, s part : (s + 1) part] @ w[:, same]^T: S products at strides of part columns.
  Problem p = linear_problem(w.data, x.data, x.dtype, partials.data, DType::f32, M, N, part, K);
  p.batch = S;
  p.stride_a = part;
  p.stride_b = part;
  p.stride_d = M * N;
  run_matmul(be, p);
}

int32_t linear_k_split_parts(int64_t M, int64_t N, int64_t K, DType w_dtype) {
  // Four parts for the MLP's down projection (K at least 4 N) at up to 128 rows, where cuBLASLt
  // split K itself and reduced in a kernel of its own before the norm kernel. Measured in the
  // decode step (bench_decode_step, graph-replayed forward at 1K context, H200, one call): astrai-1b
  // B = 16 / 32 / 64 / 128 1.339 / 1.515 / 1.686 / 2.149 ms against 1.350 / 1.541 / 1.715 / 2.187
  // unsplit; llama-1b 1.206 / 1.356 / 1.643 / 2.238 against 1.222 / 1.387 / 1.660 / 2.280.
  constexpr int32_t kParts = 4;
  const bool long_k = K >= 4 * N && K % (kParts * 8) == 0;
  return w_dtype == DType::bf16 && long_k && M >= 1 && M <= ops::kFusedLinearMaxRows ? kParts : 0;
}

void gemm(CudaBackend& be, Tensor c, Tensor a, bool trans_a, Tensor b, bool trans_b, float alpha, float beta) {
  detail::check_float(be, c);
  detail::check_float(be, a);
  detail::check_float(be, b);
  KILN_ASSERT(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2);
  const int64_t M = c.size(0), N = c.size(1);
  const int64_t K = trans_a ? a.size(0) : a.size(1);
  KILN_ASSERT((trans_a ? a.size(1) : a.size(0)) == M);
  KILN_ASSERT((trans_b ? b.size(1) : b.size(0)) == K);
  KILN_ASSERT((trans_b ? b.size(0) : b.size(1)) == N);
  KILN_ASSERT(a.dtype == b.dtype);
  check_types(a.dtype, c.dtype);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    scale_kernel<<<detail::grid_for(be, M * N, kThreads), kThreads, 0, detail::stream_of(be)>>>(c.data, c.dtype, M * N,
                                                                                               beta);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }

  // Column-major C^T (N x M) = op(B)^T (N x K) op(A)^T (K x M): cuBLASLt's A is our B and vice versa.
  Problem p;
  p.m = N;
  p.n = M;
  p.k = K;
  p.trans_a = trans_b;
  p.a = b.data;
  p.lda = b.size(1);
  p.trans_b = trans_a;
  p.b = a.data;
  p.ldb = a.size(1);
  p.ab_dt = a.dtype;
  p.d = c.data;
  p.ldd = N;
  p.d_dt = c.dtype;
  p.alpha = alpha;
  p.beta = beta;
  run_matmul(be, p);
}

}  // namespace kiln::cuda
