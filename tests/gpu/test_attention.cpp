// CUDA attention_forward against the CPU twin on random inputs: the decode (split-KV) path, the
// prefill (tensor-core) path, mixed batches, chunked prefill, loose bounds, MHA, f16, the generic
// path (other head sizes, f32), contexts on shuffled pages of many sizes (kernels/paged_kv.h), and
// replay of a captured CUDA graph for other lengths and page tables.
// Outputs are poisoned with NaN first and cache rows outside every request hold NaN, so a row
// left unwritten or a key read from the wrong row shows up as a non-finite error; q/out rows past
// the last request (extra_rows) must still hold NaN afterwards (rows of no request are untouched).
// Cases that reach the prefill path run once per compiled prefill variant (see
// kernels/cuda/attention_internal.h), each against the same CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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
  // Layout of the cache. page_size 0: the requests' slots are contiguous and consecutive
  // (contiguous_pages: page size 1), starting at kv_offset (leading unused slots) and followed by
  // pad_slots unused ones. page_size > 0: shuffled pages of that size (scattered_pages) from a
  // pool with spare_pages pages that no request uses.
  int kv_offset = 0;
  int pad_slots = 7;
  int page_size = 0;
  int spare_pages = 5;
  int extra_rows = 0;  // q/out rows after the last request's (no request's: must stay untouched)
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
  s += c.page_size > 0 ? " page_size=" + std::to_string(c.page_size) : std::string(" contiguous");
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
  TensorBuffer q, k, v, qi;
  PagedTables pages;
  ops::AttentionBounds bounds;
  float scale = 0;
  int64_t used_rows = 0;  // q/out rows of the requests (the rest are extra rows)
};

// The page tables of `pages` on be's device (the view keeps pointing at them).
struct DevicePages {
  TensorBuffer indptr, indices, last;
  int32_t page_size = 1;
  DevicePages(Backend& be, const PagedTables& p)
      : indptr(device_copy(be, p.indptr)),
        indices(device_copy(be, p.indices)),
        last(device_copy(be, p.last)),
        page_size(p.page_size) {}
  PagedKV view() const { return PagedKV{indptr, indices, last, page_size}; }
};

Inputs make_inputs(const AttnCase& c) {
  KILN_ASSERT(c.q_lens.size() == c.kv_lens.size());
  const int B = static_cast<int>(c.q_lens.size());
  std::vector<int32_t> qi(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    KILN_ASSERT(c.q_lens[b] <= c.kv_lens[b]);
    qi[b + 1] = qi[b] + c.q_lens[b];
  }
  Inputs in;
  int64_t S = 0;
  std::vector<char> used;  // pool rows holding some request's key
  if (c.page_size == 0) {
    std::vector<int32_t> kvi(B + 1, c.kv_offset);
    for (int b = 0; b < B; ++b) kvi[b + 1] = kvi[b] + c.kv_lens[b];
    S = kvi[B] + c.pad_slots;
    used.assign(static_cast<size_t>(S), 0);
    for (int32_t r = kvi[0]; r < kvi[B]; ++r) used[r] = 1;
    in.pages = contiguous_pages(kvi);
  } else {
    int32_t pool_pages = c.spare_pages;
    for (int32_t n : c.kv_lens) pool_pages += (n + c.page_size - 1) / c.page_size;
    std::vector<std::vector<int32_t>> slot_of;
    in.pages = scattered_pages(c.kv_lens, c.page_size, pool_pages, c.seed + 17, &slot_of);
    S = static_cast<int64_t>(pool_pages) * c.page_size;
    used.assign(static_cast<size_t>(S), 0);
    for (const auto& slots : slot_of)
      for (int32_t r : slots) used[r] = 1;
  }
  const int64_t T = qi[B] + c.extra_rows;
  in.q = random_host(Shape{T, c.Hq, c.D}, c.dtype, c.seed, c.q_std);
  in.k = random_host(Shape{S, c.Hkv, c.D}, c.dtype, c.seed + 1);
  in.v = random_host(Shape{S, c.Hkv, c.D}, c.dtype, c.seed + 2);
  const int64_t row = int64_t(c.Hkv) * c.D;
  for (const TensorBuffer* t : {&in.k, &in.v})
    for (int64_t r = 0; r < S; ++r)
      if (!used[r]) fill_nan(*t, r * row, (r + 1) * row);
  in.qi = host_ints(qi);
  in.used_rows = qi[B];
  in.bounds.batch = B;
  in.bounds.max_q_len = *std::max_element(c.q_lens.begin(), c.q_lens.end()) + c.extra_q_bound;
  in.bounds.max_kv_len = *std::max_element(c.kv_lens.begin(), c.kv_lens.end()) + c.extra_kv_bound;
  in.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  return in;
}

// The CPU twin's output (f32) on the requests' rows (the first used_rows rows of q).
std::vector<float> cpu_reference(Tensor q, Tensor k, Tensor v, Tensor qi, const PagedKV& pages,
                                 ops::AttentionBounds bounds, float scale, int64_t used_rows) {
  TensorBuffer ref = nan_host(q.shape, DType::f32);
  cpu::attention_forward(ref, q, k, v, qi, pages, bounds, scale);
  const int64_t n = used_rows * q.size(1) * q.size(2);
  return std::vector<float>(ref.ptr<float>(), ref.ptr<float>() + n);
}
std::vector<float> cpu_reference(const Inputs& in) {
  return cpu_reference(in.q, in.k, in.v, in.qi, in.pages.view(), in.bounds, in.scale, in.used_rows);
}

int64_t count_nonfinite(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
}

// Splits a device output into the requests' rows (returned) and checks that the extra rows after
// them still hold the NaN poison.
std::vector<float> request_rows(Backend& be, Tensor out, int64_t used_rows) {
  std::vector<float> all = to_f32(be, out);
  const size_t n = static_cast<size_t>(used_rows * out.size(1) * out.size(2));
  const int64_t touched = std::count_if(all.begin() + n, all.end(), [](float v) { return !std::isnan(v); });
  EXPECT_EQ(touched, 0) << "rows that belong to no request were written";
  all.resize(n);
  return all;
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
  TensorBuffer qi = device_copy(be, in.qi);
  const DevicePages pages(be, in.pages);
  for (int variant : prefill_variants(all_variants)) {
    SCOPED_TRACE("prefill variant " + std::to_string(variant));
    PrefillVariantScope scope(be, variant);
    TensorBuffer out = device_copy(be, nan_host(in.q.shape(), c.dtype));
    ops::attention_forward(be, out, q, k, v, qi, pages.view(), in.bounds, in.scale);
    Status st = be.synchronize();
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<float> got = request_rows(be, out, in.used_rows);
    EXPECT_EQ(count_nonfinite(got), 0) << "rows left unwritten or NaN read from unused cache rows";
    // The prefill kernels round P to the compute dtype before P V: an output element's error is up to
    // u * sum_k p_k |v_k|, which is V's scale, several times the output's own (an average over many
    // keys): sixteen units of rounding per element here; decode (P as hi + lo) keeps four.
    if (in.bounds.max_q_len > 1) {
      EXPECT_CLOSE_BOUND(got, want, tol, 4 * elem_bound(tol));
    } else {
      EXPECT_CLOSE(got, want, tol);
    }
  }
}

// Every prefill variant.
void check_prefill(Backend& be, const AttnCase& c, double tol) { check_case(be, c, tol, true); }

constexpr double kTolBf16 = 1e-2;
constexpr double kTolF32 = 1e-5;

// Page sizes of the paged cases: one row per page, odd, the engine's likely sizes (a multiple of
// the decode step, a whole prefill tile), and one that is neither a power of two nor a multiple of
// 16 (steps and tiles across page boundaries, the division path).
const std::vector<int> kPageSizes = {1, 3, 16, 64, 100};

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

// Prefill and decode requests (one with no query this step, one padding request: no query, no
// context) in one call, rows after the last request left alone.
TEST(AttentionGpu, MixedBatch) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 300, 0, 1, 0, 45, 1};
  c.kv_lens = {1000, 300, 10, 64, 0, 545, 2};
  c.kv_offset = 5;
  c.extra_rows = 3;
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

// ---- Paged caches: contexts on shuffled pages (kernels/paged_kv.h)

// Decode batches of many requests with odd lengths on pages of every size, a padding request in
// the middle, lengths on and around page and step boundaries, rows after the last request.
TEST(AttentionGpu, DecodePaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : kPageSizes) {
    AttnCase c;
    c.q_lens = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1};
    c.kv_lens = {1, 17, 300, 2049, 0, 777, 15, 16, 65, 1000, 4099};
    c.page_size = page_size;
    c.extra_rows = 2;
    c.seed = 20 + page_size;
    check_case(*be, c, kTolBf16);
    c.Hq = 32;  // D = 128 fast path, G = 4
    c.Hkv = 8;
    c.D = 128;
    c.dtype = DType::f16;
    check_case(*be, c, kTolBf16);
  }
}

// Many decode requests (more blocks than one wave: one split each), odd lengths, padding
// requests scattered through the batch, 16-key pages.
TEST(AttentionGpu, DecodePagedManyRequests) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  uint64_t x = 12345;
  for (int b = 0; b < 67; ++b) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const bool pad = b % 11 == 5;
    c.q_lens.push_back(pad ? 0 : 1);
    c.kv_lens.push_back(pad ? 0 : 1 + static_cast<int32_t>((x >> 33) % 3000));
  }
  c.page_size = 16;
  c.extra_kv_bound = 500;
  c.extra_rows = 1;
  check_case(*be, c, kTolBf16);
}

// Several query rows per request on the decode path over paged contexts, GQA 8 and MHA.
TEST(AttentionGpu, DecodePagedShortQueries) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {3, 16, 64}) {
    AttnCase g8;
    g8.Hq = 32;
    g8.Hkv = 4;
    g8.q_lens = {8, 0, 5, 2};
    g8.kv_lens = {3000, 0, 5, 130};
    g8.page_size = page_size;
    check_case(*be, g8, kTolBf16);
    AttnCase mha;
    mha.Hq = mha.Hkv = 8;
    mha.D = 128;
    mha.q_lens = {16, 1, 9};
    mha.kv_lens = {16, 900, 2000};
    mha.page_size = page_size;
    mha.seed = 31;
    check_case(*be, mha, kTolBf16);
  }
}

// Prefill chunks after a cached prefix on shuffled pages (q 100 over kv 700, q 1 over kv 1000 in
// a prefill batch), a full prefill, a padding request in the middle, every variant, D 64 and 128,
// bf16 and f16.
TEST(AttentionGpu, PrefillPaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : kPageSizes) {
    AttnCase c;
    c.q_lens = {100, 1, 0, 257, 64, 130};
    c.kv_lens = {700, 1000, 0, 257, 200, 194};
    c.page_size = page_size;
    c.extra_rows = 2;
    c.seed = 40 + page_size;
    check_prefill(*be, c, kTolBf16);
    c.Hq = 32;
    c.Hkv = 8;
    c.D = 128;
    c.dtype = DType::f16;
    c.q_std = 2.0f;
    check_prefill(*be, c, kTolBf16);
  }
}

// Longer paged prefill: many tiles, so the pool rows of tile t + 2 are staged while tile t is
// computed; loose bounds, GQA 8, D 128 with a long cached prefix.
TEST(AttentionGpu, PrefillPagedLonger) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {16, 100}) {
    AttnCase c;
    c.q_lens = {1500, 333};
    c.kv_lens = {1500, 2011};
    c.extra_q_bound = 70;
    c.page_size = page_size;
    check_prefill(*be, c, kTolBf16);
    AttnCase g8 = prefill_case(517, 1203, 32, 4, 64);
    g8.q_std = 3.0f;
    g8.page_size = page_size;
    g8.seed = 5;
    check_prefill(*be, g8, kTolBf16);
    AttnCase d128 = prefill_case(700, 1900, 32, 8, 128);
    d128.page_size = page_size;
    d128.seed = 11;
    check_prefill(*be, d128, kTolBf16);
  }
}

// One page per request, larger than any tile and not a multiple of 16 (the single-request
// generator uses the whole cache as one page): steps and tiles lie in the page except near its end.
TEST(AttentionGpu, OnePagePerRequest) {
  KILN_REQUIRE_GPU(be);
  AttnCase c;
  c.q_lens = {1, 1, 1};
  c.kv_lens = {4097, 1, 3000};
  c.page_size = 4100;
  c.spare_pages = 1;
  check_case(*be, c, kTolBf16);
  AttnCase p;
  p.q_lens = {300, 1};
  p.kv_lens = {1000, 999};
  p.page_size = 1000;
  p.spare_pages = 1;
  check_prefill(*be, p, kTolBf16);
}

// The generic kernel (head sizes without a fast path, f32) over paged contexts.
TEST(AttentionGpu, GenericPaged) {
  KILN_REQUIRE_GPU(be);
  for (int page_size : {1, 3, 16, 64}) {
    AttnCase c;
    c.dtype = DType::f32;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 96;
    c.q_lens = {1, 37, 0, 5};
    c.kv_lens = {300, 37, 0, 90};
    c.page_size = page_size;
    c.extra_rows = 1;
    check_case(*be, c, kTolF32);
    c.dtype = DType::bf16;
    c.D = 48;
    check_case(*be, c, kTolBf16);
  }
}

// ---- Per-backend state

#ifdef KILN_WITH_CUDA
// Kernel attributes, occupancy and wgmma support are kept per backend: a second backend on the
// same device starts with fresh state, and each device (on a multi-GPU host: up to two here) gets
// its own. Every prefill variant (shared-memory limits raised per backend) and the decode path.
TEST(AttentionGpu, StatePerBackend) {
  KILN_REQUIRE_GPU(be);
  AttnCase p;
  p.q_lens = {200, 1};
  p.kv_lens = {300, 500};
  p.page_size = 16;
  AttnCase d = decode_case(3000);
  d.page_size = 64;
  check_prefill(*be, p, kTolBf16);
  check_case(*be, d, kTolBf16);
  const int devices = std::min(cuda_device_count(), 2);
  for (int dev = 0; dev < devices; ++dev) {
    SCOPED_TRACE("fresh backend on cuda:" + std::to_string(dev));
    Result<std::unique_ptr<Backend>> other = make_backend(Device::cuda(dev));
    ASSERT_TRUE(other.ok()) << other.status().message();
    check_prefill(**other, p, kTolBf16);
    check_case(**other, d, kTolBf16);
  }
}
#endif

// ---- CUDA graph: capture the decode call once, replay it for other context lengths.

#ifdef KILN_WITH_CUDA
// Captures ops::attention_forward on `stream` into an executable graph.
cudaGraphExec_t capture_attention(CudaBackend& cbe, const std::function<void()>& call) {
  cudaStream_t stream = cbe.stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  call();
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  cudaGraphDestroy(graph);
  return exec;
}

// Contiguous single-request context (page size 1), the captured form with bounds for kMaxKv.
TEST(AttentionGpu, DecodeGraphReplay) {
  KILN_REQUIRE_GPU(be);
  CudaBackend& cbe = static_cast<CudaBackend&>(*be);
  constexpr int kMaxKv = 6000;
  AttnCase c = decode_case(kMaxKv);
  c.pad_slots = 0;
  Inputs in = make_inputs(c);
  TensorBuffer q = device_copy(*be, in.q), k = device_copy(*be, in.k), v = device_copy(*be, in.v);
  TensorBuffer qi = device_copy(*be, in.qi);
  const DevicePages pages(*be, in.pages);  // indptr {0, kv_len}, pages 0 .. kMaxKv - 1, last {1}
  TensorBuffer out = device_copy(*be, nan_host(in.q.shape(), c.dtype));
  const ops::AttentionBounds bounds{1, 1, kMaxKv};

  // An eager call first sizes the scratch (it cannot grow during capture).
  ops::attention_forward(*be, out, q, k, v, qi, pages.view(), bounds, in.scale);
  ASSERT_TRUE(be->synchronize().ok());
  std::vector<float> eager = to_f32(*be, out);

  cudaGraphExec_t exec =
      capture_attention(cbe, [&] { ops::attention_forward(*be, out, q, k, v, qi, pages.view(), bounds, in.scale); });
  ASSERT_NE(exec, nullptr);

  for (int kv_len : {kMaxKv, 1, 33, 64, 65, 1234, 5999}) {
    SCOPED_TRACE("kv_len " + std::to_string(kv_len));
    be->copy(pages.indptr, host_ints({0, kv_len}));
    be->copy(out, nan_host(in.q.shape(), c.dtype));
    ASSERT_EQ(cudaGraphLaunch(exec, cbe.stream()), cudaSuccess);
    ASSERT_TRUE(be->synchronize().ok());
    std::vector<float> got = to_f32(*be, out);

    Inputs ref_in = make_inputs(c);  // same seed: same values
    ref_in.pages.indptr = host_ints({0, kv_len});
    ref_in.bounds = ops::AttentionBounds{1, 1, kv_len};
    std::vector<float> want = cpu_reference(ref_in);
    EXPECT_EQ(count_nonfinite(got), 0);
    EXPECT_CLOSE(got, want, kTolBf16);
    if (kv_len == kMaxKv) {
      EXPECT_EQ(got, eager) << "graph replay differs from the eager call";
    } else {
      // The eager call with tight bounds must give bit-identical output (same key partition).
      TensorBuffer out2 = device_copy(*be, nan_host(in.q.shape(), c.dtype));
      ops::attention_forward(*be, out2, q, k, v, qi, pages.view(), ref_in.bounds, in.scale);
      EXPECT_EQ(to_f32(*be, out2), got) << "tight-bounds eager call differs from the graph replay";
    }
  }
  cudaGraphExecDestroy(exec);
}

// A batch of decode requests on shuffled 16-key pages, captured once with the bounds of the first
// round's lengths (0: a padding request), replayed after rewriting the page tables for the other
// rounds' lengths and other pages of the pool: each replay must match the CPU twin and be
// bit-identical to an eager call with tight bounds on the same tables.
// heads: the case's Hq, Hkv and D.
void check_decode_graph_replay_paged(Backend& be, const std::vector<std::vector<int32_t>>& lengths,
                                     const AttnCase& heads = AttnCase{}) {
  CudaBackend& cbe = static_cast<CudaBackend&>(be);
  constexpr int kPage = 16;
  const int batch = static_cast<int>(lengths[0].size());
  const int max_kv = *std::max_element(lengths[0].begin(), lengths[0].end());
  AttnCase c;
  c.Hq = heads.Hq;
  c.Hkv = heads.Hkv;
  c.D = heads.D;
  for (int32_t len : lengths[0]) c.q_lens.push_back(len > 0 ? 1 : 0);
  c.kv_lens = lengths[0];
  c.page_size = kPage;
  c.spare_pages = 200;
  Inputs in = make_inputs(c);
  // Every pool row finite: the later layouts use pages that the first one leaves unused.
  in.k = random_host(in.k.shape(), c.dtype, 77);
  in.v = random_host(in.v.shape(), c.dtype, 78);
  const int32_t pool_pages = static_cast<int32_t>(in.k.shape().dims[0] / kPage);
  TensorBuffer q = device_copy(be, in.q), k = device_copy(be, in.k), v = device_copy(be, in.v);
  TensorBuffer qi = device_copy(be, in.qi);
  // Device tables of fixed size (the graph keeps their addresses), room for every page of the pool.
  TensorBuffer indptr = device_copy(be, in.pages.indptr), last = device_copy(be, in.pages.last);
  TensorBuffer indices = device_copy(be, host_ints(std::vector<int32_t>(pool_pages, 0)));
  be.copy(indices.view().rows(0, in.pages.indices.numel()), in.pages.indices);
  const PagedKV view{indptr, indices, last, kPage};
  TensorBuffer out = device_copy(be, nan_host(in.q.shape(), c.dtype));
  const ops::AttentionBounds bounds{batch, 1, max_kv};

  ops::attention_forward(be, out, q, k, v, qi, view, bounds, in.scale);  // sizes the scratch
  ASSERT_TRUE(be.synchronize().ok());
  const std::vector<float> eager = to_f32(be, out);
  cudaGraphExec_t exec =
      capture_attention(cbe, [&] { ops::attention_forward(be, out, q, k, v, qi, view, bounds, in.scale); });
  ASSERT_NE(exec, nullptr);

  for (size_t round = 0; round < lengths.size(); ++round) {
    const std::vector<int32_t>& lens = lengths[round];
    ASSERT_EQ(static_cast<int>(lens.size()), batch);
    SCOPED_TRACE("kv_lens [" + join(lens) + "]");
    std::vector<std::vector<int32_t>> slot_of;
    const PagedTables t = round == 0 ? std::move(in.pages)
                                     : scattered_pages(lens, kPage, pool_pages, 100 + round, &slot_of);
    be.copy(indptr, t.indptr);
    be.copy(last, t.last);
    be.copy(indices.view().rows(0, t.indices.numel()), t.indices);
    be.copy(out, nan_host(in.q.shape(), c.dtype));
    ASSERT_EQ(cudaGraphLaunch(exec, cbe.stream()), cudaSuccess);
    ASSERT_TRUE(be.synchronize().ok());
    const std::vector<float> got = to_f32(be, out);
    if (round == 0) {
      EXPECT_EQ(got, eager) << "graph replay differs from the eager call";
    }

    const ops::AttentionBounds tight{batch, 1, *std::max_element(lens.begin(), lens.end())};
    const std::vector<float> want = cpu_reference(in.q, in.k, in.v, in.qi, t.view(), tight, in.scale, in.used_rows);
    EXPECT_EQ(count_nonfinite(got), 0);
    EXPECT_CLOSE(got, want, kTolBf16);
    TensorBuffer out2 = device_copy(be, nan_host(in.q.shape(), c.dtype));
    ops::attention_forward(be, out2, q, k, v, qi, view, tight, in.scale);
    EXPECT_EQ(to_f32(be, out2), got) << "tight-bounds eager call differs from the graph replay";
  }
  cudaGraphExecDestroy(exec);
}

TEST(AttentionGpu, DecodeGraphReplayPaged) {
  KILN_REQUIRE_GPU(be);
  check_decode_graph_replay_paged(
      *be, {{6000, 2500, 0, 4097}, {1, 33, 0, 64}, {65, 5999, 0, 17}, {1234, 1, 0, 3001}});
}

// Batches of the engine's larger buckets on the astrai-1b heads (24 / 4, D 64), each on another
// decode launch (attention_decode.cu): 32 requests in two splits merged inside the kernel through
// a cluster, 64 likewise on the 4-blocks-per-SM kernel, 128 in one split on that kernel; and 16
// requests of 32 / 8 heads at D 128 in two merged splits. Requests too short to use every split
// and a padding request in each round.
std::vector<std::vector<int32_t>> decode_rounds(int batch, uint64_t seed) {
  std::vector<std::vector<int32_t>> rounds(4, std::vector<int32_t>(batch));
  uint64_t x = seed;
  for (size_t r = 0; r < rounds.size(); ++r)
    for (int b = 0; b < batch; ++b) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int32_t cap = r == 1 ? 100 : 3000;  // round 1: short requests, some in one split only
      rounds[r][b] = b == 9 ? 0 : 1 + static_cast<int32_t>((x >> 33) % cap);
    }
  rounds[0][0] = 3000;  // the capture's bound
  return rounds;
}

TEST(AttentionGpu, DecodeGraphReplayPagedLargeBatches) {
  KILN_REQUIRE_GPU(be);
  for (int batch : {32, 64, 128}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    check_decode_graph_replay_paged(*be, decode_rounds(batch, 777 + batch));
  }
  AttnCase d128;
  d128.Hq = 32;
  d128.Hkv = 8;
  d128.D = 128;
  SCOPED_TRACE("batch 16, D 128");
  check_decode_graph_replay_paged(*be, decode_rounds(16, 801), d128);
}
#endif

}  // namespace
}  // namespace kiln::test
