// CPU kernels of the attention block's cache side (kernels/cpu/): the KV-cache scatter and paged
// attention (causal GQA, prefill and decode mixed, cached prefixes, bf16) against naive
// double-precision loops written here. Split from test_cpu_kernels.cpp; helpers in cpu_kernel_test.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernel_test.h"
#include "kernels/ops.h"
#include "kernels/rng.h"
#include "test_util.h"

namespace kiln {
namespace {

// ---------------------------------------------------------------------------------------------
// kv cache

TEST_F(CpuKernels, KvCacheWriteScattersRows) {
  const int64_t S = 10, Hkv = 2, D = 6;
  const std::vector<int32_t> slot_values = {7, 0, 4};
  const int64_t T = 3;
  TensorBuffer slots = test::host_ints(slot_values);
  TensorBuffer k = test::random_host(Shape{T, Hkv, D}, DType::f32, 60);
  TensorBuffer v = test::random_host(Shape{T, Hkv, D}, DType::f32, 61);
  const std::vector<float> kv = read(k), vv = read(v);
  for (DType dt : {DType::f32, DType::bf16}) {
    TensorBuffer kc = filled(Shape{S, Hkv, D}, dt, -7.0f);
    TensorBuffer vc = filled(Shape{S, Hkv, D}, dt, -7.0f);
    ops::kv_cache_write(*be, kc, vc, k, v, slots);
    const std::vector<float> kcv = read(kc), vcv = read(vc);
    const int64_t row = Hkv * D;
    for (int64_t s = 0; s < S; ++s) {
      const auto it = std::find(slot_values.begin(), slot_values.end(), s);
      for (int64_t e = 0; e < row; ++e) {
        float want_k = -7.0f, want_v = -7.0f;
        if (it != slot_values.end()) {
          const int64_t t = it - slot_values.begin();
          want_k = kv[t * row + e];
          want_v = vv[t * row + e];
          if (dt == DType::bf16) {
            want_k = bf16_to_f32(f32_to_bf16(want_k));
            want_v = bf16_to_f32(f32_to_bf16(want_v));
          }
        }
        ASSERT_EQ(kcv[s * row + e], want_k) << "slot " << s;
        ASSERT_EQ(vcv[s * row + e], want_v) << "slot " << s;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// attention

struct Request {
  int32_t q_len, kv_len;
};

// Naive causal GQA in double; key j of request b is cache row slot_of[b][j].
std::vector<double> attention_ref(const std::vector<float>& q, const std::vector<float>& kc,
                                  const std::vector<float>& vc, const std::vector<Request>& reqs,
                                  const std::vector<std::vector<int32_t>>& slot_of, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t D, double scale) {
  std::vector<double> out(static_cast<size_t>(T * Hq * D), 0.0);
  int64_t q0 = 0;
  for (size_t b = 0; b < reqs.size(); ++b) {
    const Request& r = reqs[b];
    const std::vector<int32_t>& slot = slot_of[b];
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / (Hq / Hkv);
      for (int64_t i = 0; i < r.q_len; ++i) {
        const int64_t pos = r.kv_len - r.q_len + i;
        std::vector<double> s(static_cast<size_t>(pos + 1));
        double m = -INFINITY;
        for (int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += static_cast<double>(q[((q0 + i) * Hq + h) * D + d]) * kc[(slot[j] * Hkv + kvh) * D + d];
          s[j] = scale * dot;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= pos; ++j) z += std::exp(s[j] - m);
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= pos; ++j) acc += std::exp(s[j] - m) / z * vc[(slot[j] * Hkv + kvh) * D + d];
          out[((q0 + i) * Hq + h) * D + d] = acc;
        }
      }
    }
    q0 += r.q_len;
  }
  return out;
}

struct AttentionCase {
  int64_t Hq, Hkv, D;
  std::vector<Request> reqs;
  DType dtype = DType::f32;
  int64_t extra_rows = 0;  // rows of q/out after the last request (left untouched)
  int64_t extra_slots = 0;
  int32_t page_size = 0;   // > 0: contexts on shuffled pages of this size (else contiguous slots)
};

void run_attention_case(Backend& be, const AttentionCase& c, double rtol, double atol) {
  std::vector<int32_t> qi = {0}, ki = {0}, kv_lens;
  int32_t max_q = 0, max_kv = 0;
  for (const Request& r : c.reqs) {
    qi.push_back(qi.back() + r.q_len);
    ki.push_back(ki.back() + r.kv_len);
    kv_lens.push_back(r.kv_len);
    max_q = std::max(max_q, r.q_len);
    max_kv = std::max(max_kv, r.kv_len);
  }
  std::vector<std::vector<int32_t>> slot_of;
  test::PagedTables pages;
  int64_t S = ki.back() + c.extra_slots;
  if (c.page_size > 0) {
    const int32_t pool_pages = static_cast<int32_t>((ki.back() + c.extra_slots) / c.page_size + c.reqs.size() + 2);
    pages = test::scattered_pages(kv_lens, c.page_size, pool_pages, 5, &slot_of);
    S = static_cast<int64_t>(pool_pages) * c.page_size;
  } else {
    pages = test::contiguous_pages(ki);
    for (size_t b = 0; b < c.reqs.size(); ++b) {
      slot_of.emplace_back();
      for (int32_t j = 0; j < c.reqs[b].kv_len; ++j) slot_of.back().push_back(ki[b] + j);
    }
  }
  const int64_t T = qi.back() + c.extra_rows;
  TensorBuffer q = test::random_host(Shape{T, c.Hq, c.D}, c.dtype, 70);
  TensorBuffer kc = test::random_host(Shape{S, c.Hkv, c.D}, c.dtype, 71);
  TensorBuffer vc = test::random_host(Shape{S, c.Hkv, c.D}, c.dtype, 72);
  TensorBuffer out = filled(Shape{T, c.Hq, c.D}, c.dtype, 99.0f);
  TensorBuffer q_indptr = test::host_ints(qi);
  ops::AttentionBounds bounds{static_cast<int32_t>(c.reqs.size()), max_q, max_kv};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  ops::attention_forward(be, out, q, kc, vc, q_indptr, pages.view(), bounds, static_cast<float>(scale));

  const std::vector<float> qv = test::to_f32(be, q), kv = test::to_f32(be, kc), vv = test::to_f32(be, vc);
  std::vector<double> ref = attention_ref(qv, kv, vv, c.reqs, slot_of, T, c.Hq, c.Hkv, c.D, scale);
  for (int64_t i = qi.back() * c.Hq * c.D; i < T * c.Hq * c.D; ++i) ref[i] = 99.0;  // untouched rows
  expect_close(test::to_f32(be, out), ref, rtol, atol, "attention");
}

TEST_F(CpuKernels, AttentionGqaMixedPrefillAndDecode) {
  // Hq=6 over Hkv=2; a full prefill, decodes, a chunked prefill and a one-token request.
  AttentionCase c{6, 2, 64, {{5, 5}, {1, 9}, {3, 12}, {1, 1}, {7, 7}, {2, 30}}};
  c.extra_rows = 2;
  c.extra_slots = 3;
  run_attention_case(*be, c, 1e-5, 1e-5);
}

TEST_F(CpuKernels, AttentionPagedWithCachedPrefix) {
  // Contexts on shuffled pages (sizes 1, 3, 16): prefill chunks after a cached prefix, decodes, a
  // request whose context ends exactly on a page boundary, and a padding request (no queries, no pages).
  for (int32_t page_size : {1, 3, 16}) {
    AttentionCase c{6, 2, 64, {{4, 20}, {1, 33}, {16, 16}, {0, 0}, {1, 48}, {5, 5}}};
    c.page_size = page_size;
    c.extra_rows = 1;
    run_attention_case(*be, c, 1e-5, 1e-5);
  }
}

TEST_F(CpuKernels, AttentionMultiHeadNoGrouping) {
  AttentionCase c{4, 4, 128, {{1, 17}, {4, 4}, {1, 3}}};
  run_attention_case(*be, c, 1e-5, 1e-5);
}

TEST_F(CpuKernels, AttentionMultiQueryOddHeadDim) {
  AttentionCase c{8, 1, 40, {{3, 3}, {1, 6}}};
  run_attention_case(*be, c, 1e-5, 1e-5);
}

TEST_F(CpuKernels, AttentionLargeEnoughForThreads) {
  AttentionCase c{8, 2, 64, {{64, 64}, {32, 96}, {1, 200}, {17, 40}}};
  run_attention_case(*be, c, 1e-5, 1e-5);
}

TEST_F(CpuKernels, AttentionBf16) {
  AttentionCase c{6, 2, 64, {{5, 5}, {1, 9}, {2, 11}}};
  c.dtype = DType::bf16;
  run_attention_case(*be, c, 1.0 / 256, 1e-3);
}

TEST_F(CpuKernels, AttentionFirstPrefillQuerySeesOnlyTheFirstKey) {
  // Query 0 of a prefill attends to key 0 alone: its output is v[0] exactly. With identical keys
  // the weights are uniform, so query i's output is the mean of v[0..i].
  const int64_t Hq = 2, Hkv = 1, D = 4;
  constexpr int32_t L = 3;
  TensorBuffer q = test::random_host(Shape{L, Hq, D}, DType::f32, 73);
  TensorBuffer kc = make(Shape{L, Hkv, D}, DType::f32, std::vector<float>(L * D, 0.5f));
  TensorBuffer vc = make(Shape{L, Hkv, D}, DType::f32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  TensorBuffer out = filled(Shape{L, Hq, D}, DType::f32, 0.0f);
  TensorBuffer qi = test::host_ints({0, L});
  test::PagedTables pages = test::contiguous_pages({0, L});
  ops::attention_forward(*be, out, q, kc, vc, qi, pages.view(), {1, L, L}, 0.5f);
  const std::vector<float> o = read(out);
  for (int64_t h = 0; h < Hq; ++h)
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(o[(0 * Hq + h) * D + d], static_cast<float>(1 + d));
      EXPECT_NEAR(o[(1 * Hq + h) * D + d], 3.0 + d, 1e-6);
      EXPECT_NEAR(o[(2 * Hq + h) * D + d], 5.0 + d, 1e-6);
    }
}

}  // namespace
}  // namespace kiln
