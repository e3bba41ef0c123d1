// Causal grouped-query attention over a packed batch whose keys/values sit in a cache of slots.
// q: [T, Hq, D], k_cache/v_cache: [S, Hkv, D], out: [T, Hq, D]; q_indptr, kv_indptr: [B+1] i32.
// Request b owns query rows q_indptr[b] .. q_indptr[b+1] (q_len of them) and cache slots
// kv_indptr[b] .. kv_indptr[b+1] (kv_len of them, q_len <= kv_len). Its query i sits at position
// p = kv_len - q_len + i and attends to keys 0 .. p (inclusive). Query head h reads kv head
// h / (Hq / Hkv). For each (request, query row, head):
//   s_j = scale * dot(q, k_j) (f32),  m = max_j s_j,  w_j = exp(s_j - m),
//   out = (sum_j w_j v_j) / (sum_j w_j)  (f32 accumulation).
// Rows of q/out not covered by any request are left untouched. The bounds must hold every
// request's lengths (checked, as the CUDA twin relies on them). Work items are (request, kv head):
// each converts its keys/values to f32 once and serves the Hq/Hkv query heads that read them;
// items are spread over up to 16 std::threads when the call is large enough to pay for them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

struct Geometry {
  int64_t Hq, Hkv, D, group;
};

// Attention for request b and kv head kvh (all query heads of its group).
void attend(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, const Geometry& g, int64_t q_start, int64_t q_len,
            int64_t kv_start, int64_t kv_len, int64_t kvh, float scale) {
  const int64_t D = g.D;
  std::vector<float> kf(static_cast<size_t>(kv_len * D)), vf(static_cast<size_t>(kv_len * D));
  for (int64_t j = 0; j < kv_len; ++j) {
    const int64_t offset = ((kv_start + j) * g.Hkv + kvh) * D;
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

void attention_forward(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr, Tensor kv_indptr,
                       ops::AttentionBounds bounds, float scale) {
  detail::check_float(out);
  detail::check_float(q);
  detail::check_float(k_cache);
  detail::check_float(v_cache);
  detail::check_i32(q_indptr);
  detail::check_i32(kv_indptr);
  KILN_ASSERT(q.ndim() == 3 && out.shape == q.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  const int64_t T = q.size(0), S = k_cache.size(0);
  Geometry g{q.size(1), k_cache.size(1), q.size(2), 0};
  KILN_ASSERT(k_cache.size(2) == g.D);
  KILN_ASSERT(g.Hkv > 0 && g.Hq % g.Hkv == 0);
  g.group = g.Hq / g.Hkv;

  const int64_t B = bounds.batch;
  KILN_ASSERT(B >= 0 && q_indptr.ndim() == 1 && q_indptr.size(0) == B + 1);
  KILN_ASSERT(kv_indptr.ndim() == 1 && kv_indptr.size(0) == B + 1);
  const int32_t* qi = q_indptr.ptr<const int32_t>();
  const int32_t* ki = kv_indptr.ptr<const int32_t>();
  KILN_ASSERT(qi[0] >= 0 && qi[B] <= T && ki[0] >= 0 && ki[B] <= S);
  double flops = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q_len = qi[b + 1] - qi[b], kv_len = ki[b + 1] - ki[b];
    KILN_ASSERT(q_len >= 0 && kv_len >= q_len);
    KILN_ASSERT(q_len <= bounds.max_q_len && kv_len <= bounds.max_kv_len);
    flops += static_cast<double>(q_len) * static_cast<double>(kv_len);
  }
  flops *= 4.0 * static_cast<double>(g.Hq * g.D);

  const int64_t items = B * g.Hkv;
  auto run_item = [&](int64_t item) {
    const int64_t b = item / g.Hkv, kvh = item % g.Hkv;
    const int64_t q_len = qi[b + 1] - qi[b], kv_len = ki[b + 1] - ki[b];
    if (q_len == 0) return;
    attend(out, q, k_cache, v_cache, g, qi[b], q_len, ki[b], kv_len, kvh, scale);
  };

  // Threads only pay off beyond a few MFLOP; below that (decode steps of small tests) stay inline.
  const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t n_threads = flops < 4e6 ? 1 : std::min<int64_t>({hw, 16, items});
  if (n_threads <= 1) {
    for (int64_t item = 0; item < items; ++item) run_item(item);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) run_item(item);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n_threads - 1));
  for (int64_t i = 0; i + 1 < n_threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace kiln::cpu
