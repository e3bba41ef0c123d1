// Causal grouped-query attention over a packed batch whose keys/values sit in a paged cache.
// q: [T, Hq, D], k_cache/v_cache: [S, Hkv, D], out: [T, Hq, D]; q_indptr: [B+1] i32; kv: the paged
// view (kernels/paged_kv.h). Request b owns query rows q_indptr[b] .. q_indptr[b+1] (q_len of them)
// and the kv_len >= q_len keys of its pages, key j at pool row paged_kv_slot(j). Its query i sits at position
// p = kv_len - q_len + i and attends to keys 0 .. p (inclusive). Query head h reads kv head
// h / (Hq / Hkv). For each (request, query row, head):
//   s_j = scale * dot(q, k_j) (f32),  m = max_j s_j,  w_j = exp(s_j - m),
//   out = (sum_j w_j v_j) / (sum_j w_j)  (f32 accumulation).
// Rows of q/out not covered by any request are left untouched. The bounds must hold every
// request's lengths (checked, as the CUDA twin relies on them). Work items are (request, kv head):
// each converts its keys/values to f32 once and serves the Hq/Hkv query heads that read them;
// items are spread over up to 16 std::threads when the call is large enough to pay for them.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

struct Geometry {
  int64_t Hq, Hkv, D, group;
};

// Attention for request b and kv head kvh (all query heads of its group).
// Keys of request b: pool rows paged_kv_slot(pages, first_page, page_size, j) for j < kv_len.
struct RequestKeys {
  const int32_t* pages;
  int32_t first_page, page_size, kv_len;
};

void attend(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, const Geometry& g, int64_t q_start, int64_t q_len,
            const RequestKeys& keys, int64_t kvh, float scale) {
  const int64_t D = g.D, kv_len = keys.kv_len;
  std::vector<float> kf(static_cast<size_t>(kv_len * D)), vf(static_cast<size_t>(kv_len * D));
  for (int32_t j = 0; j < kv_len; ++j) {
    const int64_t slot = paged_kv_slot(keys.pages, keys.first_page, keys.page_size, j);
    const int64_t offset = (slot * g.Hkv + kvh) * D;
    detail::load_f32(k_cache, offset, D, kf.data() + j * D);
    detail::load_f32(v_cache, offset, D, vf.data() + j * D);
  }
  std::vector<float> qrow(static_cast<size_t>(D)), acc(static_cast<size_t>(D)), s(static_cast<size_t>(kv_len));
  for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t row_offset = ((q_start + i) * g.Hq + h) * D;
      const int64_t n_keys = kv_len - q_len + i + 1;  // keys 0 .. position
      detail::load_f32(q, row_offset, D, qrow.data());
      float m = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* k = kf.data() + j * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qrow[d] * k[d];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float denom = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float w = std::exp(s[j] - m);
        denom += w;
        const float* v = vf.data() + j * D;
        for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
      }
      const float inv = 1.0f / denom;
      for (int64_t d = 0; d < D; ++d) acc[d] *= inv;
      detail::store_f32(out, row_offset, D, acc.data());
    }
  }
}

}  // namespace

void attention_forward(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr, const PagedKV& kv,
                       ops::AttentionBounds bounds, float scale) {
  detail::check_float(out);
  detail::check_float(q);
  detail::check_float(k_cache);
  detail::check_float(v_cache);
  detail::check_i32(q_indptr);
  detail::check_i32(kv.page_indptr);
  detail::check_i32(kv.page_indices);
  detail::check_i32(kv.last_page_len);
  KILN_ASSERT(q.ndim() == 3 && out.shape == q.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  const int64_t T = q.size(0), S = k_cache.size(0);
  Geometry g{q.size(1), k_cache.size(1), q.size(2), 0};
  KILN_ASSERT(k_cache.size(2) == g.D);
  KILN_ASSERT(g.Hkv > 0 && g.Hq % g.Hkv == 0);
  g.group = g.Hq / g.Hkv;

  const int64_t B = bounds.batch;
  KILN_ASSERT(B >= 0 && q_indptr.ndim() == 1 && q_indptr.size(0) == B + 1);
  KILN_ASSERT(kv.page_indptr.ndim() == 1 && kv.page_indptr.size(0) == B + 1);
  KILN_ASSERT(kv.last_page_len.ndim() == 1 && kv.last_page_len.size(0) >= B);
  const int32_t ps = kv.page_size;
  KILN_ASSERT(ps > 0);
  const int32_t* qi = q_indptr.ptr<const int32_t>();
  const int32_t* pi = kv.page_indptr.ptr<const int32_t>();
  const int32_t* pages = kv.page_indices.ptr<const int32_t>();
  const int32_t* last = kv.last_page_len.ptr<const int32_t>();
  KILN_ASSERT(qi[0] >= 0 && qi[B] <= T && pi[0] >= 0 && pi[B] <= kv.page_indices.numel());
  const int64_t n_pages = S / ps;
  for (int64_t p = pi[0]; p < pi[B]; ++p) KILN_ASSERT(pages[p] >= 0 && pages[p] < n_pages);
  auto kv_len_of = [&](int64_t b) { return paged_kv_len(pi, last, ps, static_cast<int32_t>(b)); };
  double flops = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = qi[b + 1] - qi[b], kv_len = kv_len_of(b);
    KILN_ASSERT(pi[b + 1] == pi[b] || (last[b] >= 1 && last[b] <= ps));
    KILN_ASSERT(q_len >= 0 && kv_len >= q_len);
    KILN_ASSERT(q_len <= bounds.max_q_len && kv_len <= bounds.max_kv_len);
    flops += static_cast<double>(q_len) * static_cast<double>(kv_len);
  }
  flops *= 4.0 * static_cast<double>(g.Hq * g.D);

  const int64_t items = B * g.Hkv;
  auto run_item = [&](int64_t item) {
    const int64_t b = item / g.Hkv, kvh = item % g.Hkv;
    const int64_t q_len = qi[b + 1] - qi[b];
    if (q_len == 0) return;
    const RequestKeys keys{pages, pi[b], ps, kv_len_of(b)};
    attend(out, q, k_cache, v_cache, g, qi[b], q_len, keys, kvh, scale);
  };

  detail::parallel_items(items, flops, run_item);
}

}  // namespace kiln::cpu
