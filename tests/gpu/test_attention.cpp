// CUDA attention_forward against the CPU twin on random inputs: the decode (split-KV) path, the
// prefill (tensor-core) path, mixed batches, chunked prefill, loose bounds, MHA, f16, the generic
// path (other head sizes, f32), and replay of a captured CUDA graph for other lengths.
// Outputs are poisoned with NaN first and cache slots outside every request hold NaN, so a row
// left unwritten or a key read out of range shows up as a non-finite error.
// Cases that reach the prefill path run once per compiled prefill variant (see
// kernels/cuda/attention_internal.h), each against the same CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "test_util.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "kernels/cuda/attention_internal.h"
#endif

namespace kiln::test {
namespace {

struct AttnCase {
  int Hq = 24, Hkv = 4, D = 64;
  DType dtype = DType::bf16;
  std::vector<int32_t> q_lens, kv_lens;
  int extra_q_bound = 0, extra_kv_bound = 0;  // bounds beyond the true maxima
  int kv_offset = 0;                          // kv_indptr[0]: leading unused (NaN) slots
  int pad_slots = 7;                          // unused (NaN) slots after the last request
  float q_std = 1.0f;
  uint64_t seed = 1;
};

std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::string describe(const AttnCase& c) {
  std::string s = dtype_name(c.dtype);
  s += " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
  s += " q_lens=[" + join(c.q_lens) + "] kv_lens=[" + join(c.kv_lens) + "]";
  return s;
}

// Elements [begin, end) of a host float tensor set to NaN.
void fill_nan(const TensorBuffer& t, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    switch (t.view().dtype) {
      case DType::f32:
        t.ptr<float>()[i] = std::numeric_limits<float>::quiet_NaN();
        break;
      case DType::bf16:
        t.ptr<uint16_t>()[i] = 0x7fc0;
        break;
      case DType::f16:
        t.ptr<uint16_t>()[i] = 0x7e00;
        break;
      default:
        KILN_ASSERT(false);
    }
  }
}

TensorBuffer nan_host(Shape shape, DType dtype) {
  TensorBuffer t = host_empty(shape, dtype);
  fill_nan(t, 0, t.numel());
  return t;
}

TensorBuffer device_copy(Backend& be, Tensor t) {
  Result<TensorBuffer> r = to_device(be, t);
  KILN_ASSERT(r.ok());
  return std::move(r).value();
}

struct Inputs {
  TensorBuffer q, k, v, qi, kvi;
  ops::AttentionBounds bounds;
  float scale = 0;
};

Inputs make_inputs(const AttnCase& c) {
  KILN_ASSERT(c.q_lens.size() == c.kv_lens.size());
  const int B = static_cast<int>(c.q_lens.size());
  std::vector<int32_t> qi(B + 1, 0), kvi(B + 1, c.kv_offset);
  for (int b = 0; b < B; ++b) {
    KILN_ASSERT(c.q_lens[b] <= c.kv_lens[b]);
    qi[b + 1] = qi[b] + c.q_lens[b];
    kvi[b + 1] = kvi[b] + c.kv_lens[b];
  }
  const int64_t T = qi[B], S = kvi[B] + c.pad_slots;
  Inputs in;
  in.q = random_host(Shape{T, c.Hq, c.D}, c.dtype, c.seed, c.q_std);
  in.k = random_host(Shape{S, c.Hkv, c.D}, c.dtype, c.seed + 1);
  in.v = random_host(Shape{S, c.Hkv, c.D}, c.dtype, c.seed + 2);
  const int64_t slot = int64_t(c.Hkv) * c.D;
  for (const TensorBuffer* t : {&in.k, &in.v}) {
    fill_nan(*t, 0, c.kv_offset * slot);
    fill_nan(*t, kvi[B] * slot, S * slot);
  }
  in.qi = host_ints(qi);
  in.kvi = host_ints(kvi);
  in.bounds.batch = B;
  in.bounds.max_q_len = *std::max_element(c.q_lens.begin(), c.q_lens.end()) + c.extra_q_bound;
  in.bounds.max_kv_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end()) + c.extra_kv_bound;
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  return in;
}

std::vector<float> cpu_reference(const Inputs& in) {
  TensorBuffer ref = nan_host(in.q.shape(), DType::f32);
  cpu::attention_forward(ref, in.q, in.k, in.v, in.qi, in.kvi, in.bounds, in.scale);
  return std::vector<float>(ref.ptr<float>(), ref.ptr<float>() + ref.numel());
}

int64_t count_nonfinite(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
}

// Prefill variants to run a case with: every compiled one (CUDA builds), else the default (-1).
std::vector<int> prefill_variants(bool all) {
#ifdef KILN_WITH_CUDA
  if (all) {
    std::vector<int> v;
    for (int i = 0; i < cuda::kPrefillVariantCount; ++i) v.push_back(i);
    return v;
  }
#endif
  (void)all;
  return {-1};
}

// Selects a prefill variant on the backend for the scope (-1: the default).
struct PrefillVariantScope {
  PrefillVariantScope(Backend& be, int v) : be_(be) { set(v); }
  ~PrefillVariantScope() { set(-1); }
  void set(int v) {
#ifdef KILN_WITH_CUDA
    if (be_.device().is_cuda()) static_cast<CudaBackend&>(be_).set_attention_prefill_variant(v);
#endif
    (void)v;
  }
  Backend& be_;
};

// Runs one case on the GPU and checks it against the CPU twin; with all_variants, once per
// prefill variant.
void check_case(Backend& be, const AttnCase& c, double tol, bool all_variants = false) {
  SCOPED_TRACE(describe(c));
  Inputs in = make_inputs(c);
  std::vector<float> want = cpu_reference(in);
  ASSERT_EQ(count_nonfinite(want), 0) << "CPU reference is not finite";

  TensorBuffer q = device_copy(be, in.q), k = device_copy(be, in.k), v = device_copy(be, in.v);
  TensorBuffer qi = device_copy(be, in.qi), kvi = device_copy(be, in.kvi);
  for (int variant : prefill_variants(all_variants)) {
    SCOPED_TRACE("prefill variant " + std::to_string(variant));
    PrefillVariantScope scope(be, variant);
    TensorBuffer out = device_copy(be, nan_host(in.q.shape(), c.dtype));
    ops::attention_forward(be, out, q, k, v, qi, kvi, in.bounds, in.scale);
    Status st = be.synchronize();
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<float> got = to_f32(be, out);
    EXPECT_EQ(count_nonfinite(got), 0) << "rows left unwritten or NaN read from unused cache slots";
    const double err = rel_error(got, want);
    EXPECT_LE(err, tol) << "max abs diff " << max_abs_diff(got, want);
  }
}

// Every prefill variant.
void check_prefill(Backend& be, const AttnCase& c, double tol) { check_case(be, c, tol, true); }

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-5;

AttnCase decode_case(int kv_len, int Hq = 24, int Hkv = 4, int D = 64) {
  AttnCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = D;
  c.q_lens = {1};
  c.kv_lens = {kv_len};
  return c;
}

AttnCase prefill_case(int q_len, int kv_len, int Hq = 24, int Hkv = 4, int D = 64) {
  AttnCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = D;
  c.q_lens = {q_len};
  c.kv_lens = {kv_len};
  return c;
}

// ---- Decode (split-KV path)

TEST(AttentionGpu, DecodeSingleRequest) {
  KILN_REQUIRE_GPU(be);
  for (int kv_len : {1, 7, 64, 65, 1000, 4097, 30000}) check_case(*be, decode_case(kv_len), kTolBf16);
}

TEST(AttentionGpu, DecodeHeadDim128) {
  KILN_REQUIRE_GPU(be);
  for (int kv_len : {1, 33, 1000, 5000}) check_case(*be, decode_case(kv_len, 32, 8, 128), kTolBf16);
}

TEST(AttentionGpu, DecodeBatched) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1, 1, 1};
  c.kv_lens = {1, 17, 300, 2048, 777};
  check_case(*be, c, kTolBf16);
  c.Hq = 32;
  c.Hkv = 8;
  c.D = 128;
  c.seed = 9;
  check_case(*be, c, kTolBf16);
}

TEST(AttentionGpu, DecodePeakedScores) {
  KILN_REQUIRE_GPU(be);
  AttnCase c = decode_case(4097);
  c.q_std = 4.0f;  // scores with std ~4: exercises the rescaling of the running max
  check_case(*be, c, kTolBf16);
}

// Several query rows per request on the decode path (speculative / short chunks): causal inside
// the 16-row tiles of packed (query, head) rows, up to 4 tiles.
TEST(AttentionGpu, DecodeShortQueries) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {3, 2};
  c.kv_lens = {500, 40};
  check_case(*be, c, kTolBf16);
  AttnCase g8;  // G = 8: 8 queries x 8 heads = 64 rows, the largest decode-path shape
  g8.Hq = 32;
  g8.Hkv = 4;
  g8.q_lens = {8, 5};
  g8.kv_lens = {3000, 5};
  check_case(*be, g8, kTolBf16);
  AttnCase mha;  // G = 1: 16 query rows of one head per tile
  mha.Hq = mha.Hkv = 8;
  mha.q_lens = {16, 1, 9};
  mha.kv_lens = {16, 900, 2000};
  check_case(*be, mha, kTolBf16);
}

TEST(AttentionGpu, DecodeLooseBounds) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1};
  c.kv_lens = {5, 1000, 129};
  c.extra_q_bound = 2;
  c.extra_kv_bound = 20000;
  c.kv_offset = 3;
  check_case(*be, c, kTolBf16);
}

// ---- Prefill (tensor-core path)

TEST(AttentionGpu, PrefillSingleRequest) {
  KILN_REQUIRE_GPU(be);
  for (int n : {1, 17, 64, 127, 128, 129, 300, 1030}) check_prefill(*be, prefill_case(n, n), kTolBf16);
}

TEST(AttentionGpu, PrefillHeadDim128) {
  KILN_REQUIRE_GPU(be);
  for (int n : {17, 64, 65, 128, 129, 300, 1030}) check_prefill(*be, prefill_case(n, n, 8, 2, 128), kTolBf16);
  // Llama/Qwen-8B-like heads (G = 4), peaked scores, a cached prefix, two requests.
  AttnCase c;
  c.Hq = 32;
  c.Hkv = 8;
  c.D = 128;
  c.q_lens = {700, 129};
  c.kv_lens = {1900, 129};
  c.q_std = 3.0f;
  c.kv_offset = 5;
  c.seed = 11;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, PrefillPeakedScores) {
  KILN_REQUIRE_GPU(be);
  AttnCase c = prefill_case(300, 300);
  c.q_std = 4.0f;
  check_prefill(*be, c, kTolBf16);
}

// Longer runs: many 64/128-key tiles, the diagonal at every offset inside a tile, two requests of
// different lengths, bounds past the true lengths, GQA group 8, peaked scores.
TEST(AttentionGpu, PrefillLongerRuns) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1500, 333};
  c.kv_lens = {1500, 2011};
  c.extra_q_bound = 70;
  c.kv_offset = 9;
  check_prefill(*be, c, kTolBf16);
  AttnCase g8 = prefill_case(517, 1203, 32, 4, 64);
  g8.q_std = 3.0f;
  g8.seed = 5;
  check_prefill(*be, g8, kTolBf16);
}

// Chunked prefill: queries continue a cached prefix (q_len < kv_len).
TEST(AttentionGpu, PrefillWithCachedPrefix) {
  KILN_REQUIRE_GPU(be);
  check_prefill(*be, prefill_case(200, 1500), kTolBf16);
  check_prefill(*be, prefill_case(130, 194), kTolBf16);
  check_prefill(*be, prefill_case(70, 1000, 8, 2, 128), kTolBf16);
}

// Prefill and decode requests (and one with no query this step) in one call.
TEST(AttentionGpu, MixedBatch) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 300, 0, 1, 45, 1};
  c.kv_lens = {1000, 300, 10, 64, 545, 2};
  c.kv_offset = 5;
  check_prefill(*be, c, kTolBf16);
  c.Hq = 16;
  c.Hkv = 4;
  c.D = 128;
  c.seed = 3;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, PrefillLooseBounds) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {100, 1, 33};
  c.kv_lens = {100, 70, 400};
  c.extra_q_bound = 300;  // whole query tiles past every request
  c.extra_kv_bound = 1000;
  check_prefill(*be, c, kTolBf16);
}

TEST(AttentionGpu, MultiHeadAttention) {
  KILN_REQUIRE_GPU(be);
  check_case(*be, decode_case(3000, 8, 8, 64), kTolBf16);
  check_prefill(*be, prefill_case(257, 257, 8, 8, 64), kTolBf16);
  check_prefill(*be, prefill_case(100, 150, 4, 4, 128), kTolBf16);
}

TEST(AttentionGpu, Float16) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.dtype = DType::f16;
  c.q_lens = {1, 200, 1};
  c.kv_lens = {2000, 200, 33};
  check_prefill(*be, c, kTolBf16);
  AttnCase d = decode_case(5000);
  d.dtype = DType::f16;
  check_case(*be, d, kTolBf16);
}

// ---- Generic path (head sizes without a fast kernel, f32)

TEST(AttentionGpu, GenericF32) {
  KILN_REQUIRE_GPU(be);
  for (int D : {48, 96, 64}) {
    AttnCase c;
    c.dtype = DType::f32;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = D;
    c.q_lens = {1, 37, 5};
    c.kv_lens = {300, 37, 90};
    c.kv_offset = 2;
    check_case(*be, c, kTolF32);
  }
}

TEST(AttentionGpu, GenericOtherHeadDims) {
  KILN_REQUIRE_GPU(be);
  for (int D : {2, 96, 256}) {
    AttnCase c;
    c.Hq = 4;
    c.Hkv = 2;
    c.D = D;
    c.q_lens = {1, 20};
    c.kv_lens = {500, 30};
    check_case(*be, c, kTolBf16);
  }
}

// ---- CUDA graph: capture the decode call once, replay it for other context lengths.

#ifdef KILN_WITH_CUDA
TEST(AttentionGpu, DecodeGraphReplay) {
  KILN_REQUIRE_GPU(be);
  CudaBackend& cbe = static_cast<CudaBackend&>(*be);
  constexpr int kMaxKv = 6000;
  AttnCase c = decode_case(kMaxKv);
  c.pad_slots = 0;
  Inputs in = make_inputs(c);
  TensorBuffer q = device_copy(*be, in.q), k = device_copy(*be, in.k), v = device_copy(*be, in.v);
  TensorBuffer qi = device_copy(*be, in.qi), kvi = device_copy(*be, in.kvi);
  TensorBuffer out = device_copy(*be, nan_host(in.q.shape(), c.dtype));
  const ops::AttentionBounds bounds{1, 1, kMaxKv};

  // An eager call first sizes the scratch (it cannot grow during capture).
  ops::attention_forward(*be, out, q, k, v, qi, kvi, bounds, in.scale);
  ASSERT_TRUE(be->synchronize().ok());
  std::vector<float> eager = to_f32(*be, out);

  cudaStream_t stream = cbe.stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ops::attention_forward(*be, out, q, k, v, qi, kvi, bounds, in.scale);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (int kv_len : {kMaxKv, 1, 33, 64, 65, 1234, 5999}) {
    SCOPED_TRACE("kv_len " + std::to_string(kv_len));
    TensorBuffer kvi_host = host_ints({0, kv_len});
    be->copy(kvi, kvi_host);
    be->copy(out, nan_host(in.q.shape(), c.dtype));
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_TRUE(be->synchronize().ok());
    std::vector<float> got = to_f32(*be, out);

    Inputs ref_in = make_inputs(c);  // same seed: same values
    ref_in.kvi = host_ints({0, kv_len});
    ref_in.bounds = ops::AttentionBounds{1, 1, kv_len};
    std::vector<float> want = cpu_reference(ref_in);
    EXPECT_EQ(count_nonfinite(got), 0);
    EXPECT_LE(rel_error(got, want), kTolBf16);
    if (kv_len == kMaxKv) {
      EXPECT_EQ(got, eager) << "graph replay differs from the eager call";
    } else {
      // The eager call with tight bounds must give bit-identical output (same key partition).
      TensorBuffer kvi2 = device_copy(*be, ref_in.kvi);
      TensorBuffer out2 = device_copy(*be, nan_host(in.q.shape(), c.dtype));
      ops::attention_forward(*be, out2, q, k, v, qi, kvi2, ref_in.bounds, in.scale);
      EXPECT_EQ(to_f32(*be, out2), got) << "tight-bounds eager call differs from the graph replay";
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}
#endif

}  // namespace
}  // namespace kiln::test
