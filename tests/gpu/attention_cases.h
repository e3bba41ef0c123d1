// Attention test cases for the CUDA attention tests (test_attention.cpp, test_attention_graph.cpp):
// a case's shape and cache layout, its random inputs with NaN-poisoned unused rows, the CPU twin's
// output, and check_case (the GPU against the CPU twin, every prefill variant on request).
#pragma once

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

inline std::string join(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

inline std::string describe(const AttnCase& c) {
  std::string s = dtype_name(c.dtype);
  s += " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
  s += " q_lens=[" + join(c.q_lens) + "] kv_lens=[" + join(c.kv_lens) + "]";
  s += c.page_size > 0 ? " page_size=" + std::to_string(c.page_size) : std::string(" contiguous");
  return s;
}

// Elements [begin, end) of a host float tensor set to NaN.
inline void fill_nan(const TensorBuffer& t, int64_t begin, int64_t end) {
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

inline TensorBuffer nan_host(Shape shape, DType dtype) {
  TensorBuffer t = host_empty(shape, dtype);
  fill_nan(t, 0, t.numel());
  return t;
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
      : indptr(upload(be, p.indptr)),
        indices(upload(be, p.indices)),
        last(upload(be, p.last)),
        page_size(p.page_size) {}
  PagedKV view() const { return PagedKV{indptr, indices, last, page_size}; }
};

inline Inputs make_inputs(const AttnCase& c) {
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
inline std::vector<float> cpu_reference(Tensor q, Tensor k, Tensor v, Tensor qi, const PagedKV& pages,
                                 ops::AttentionBounds bounds, float scale, int64_t used_rows) {
  TensorBuffer ref = nan_host(q.shape, DType::f32);
  cpu::attention_forward(ref, q, k, v, qi, pages, bounds, scale);
  const int64_t n = used_rows * q.size(1) * q.size(2);
  return std::vector<float>(ref.ptr<float>(), ref.ptr<float>() + n);
}
inline std::vector<float> cpu_reference(const Inputs& in) {
  return cpu_reference(in.q, in.k, in.v, in.qi, in.pages.view(), in.bounds, in.scale, in.used_rows);
}

inline int64_t count_nonfinite(const std::vector<float>& x) {
  return std::count_if(x.begin(), x.end(), [](float v) { return !std::isfinite(v); });
}

// Splits a device output into the requests' rows (returned) and checks that the extra rows after
// them still hold the NaN poison.
inline std::vector<float> request_rows(Backend& be, Tensor out, int64_t used_rows) {
  std::vector<float> all = to_f32(be, out);
  const size_t n = static_cast<size_t>(used_rows * out.size(1) * out.size(2));
  const int64_t touched = std::count_if(all.begin() + n, all.end(), [](float v) { return !std::isnan(v); });
  EXPECT_EQ(touched, 0) << "rows that belong to no request were written";
  all.resize(n);
  return all;
}

// Prefill variants to run a case with: every compiled one (CUDA builds), else the default (-1).
inline std::vector<int> prefill_variants(bool all) {
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
inline void check_case(Backend& be, const AttnCase& c, double tol, bool all_variants = false) {
  SCOPED_TRACE(describe(c));
  Inputs in = make_inputs(c);
  std::vector<float> want = cpu_reference(in);
  ASSERT_EQ(count_nonfinite(want), 0) << "CPU reference is not finite";

  TensorBuffer q = upload(be, in.q), k = upload(be, in.k), v = upload(be, in.v);
  TensorBuffer qi = upload(be, in.qi);
  const DevicePages pages(be, in.pages);
  for (int variant : prefill_variants(all_variants)) {
    SCOPED_TRACE("prefill variant " + std::to_string(variant));
    PrefillVariantScope scope(be, variant);
    TensorBuffer out = upload(be, nan_host(in.q.shape(), c.dtype));
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
inline void check_prefill(Backend& be, const AttnCase& c, double tol) { check_case(be, c, tol, true); }

inline constexpr double kTolBf16 = 1e-2;
inline constexpr double kTolF32 = 1e-5;

// Page sizes of the paged cases: one row per page, odd, the engine's likely sizes (a multiple of
// the decode step, a whole prefill tile), and one that is neither a power of two nor a multiple of
// 16 (steps and tiles across page boundaries, the division path).
inline const std::vector<int> kPageSizes = {1, 3, 16, 64, 100};

inline AttnCase decode_case(int kv_len, int Hq = 24, int Hkv = 4, int D = 64) {
  AttnCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = D;
  c.q_lens = {1};
  c.kv_lens = {kv_len};
  return c;
}

inline AttnCase prefill_case(int q_len, int kv_len, int Hq = 24, int Hkv = 4, int D = 64) {
  AttnCase c;
  c.Hq = Hq;
  c.Hkv = Hkv;
  c.D = D;
  c.q_lens = {q_len};
  c.kv_lens = {kv_len};
  return c;
}


}  // namespace kiln::test
