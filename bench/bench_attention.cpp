// Attention kernel benchmark (CUDA, bf16): decode (one query for each of --decode-batch requests of
// the same context, split-KV path) and causal prefill (tensor-core path) for Hq=24, Hkv=4, D=64 by
// default, with every compiled prefill variant (kernels/cuda/attention_internal.h). Each context
// lives in a paged cache (kernels/paged_kv.h) of --page-size rows per page (default 16), its pages
// in a fixed shuffled order of the pool; --page-size 0 puts each request's context in one page
// (contiguous rows, the single-request generator's layout). Prints JSON: decode microseconds per
// call and achieved GB/s (the K+V bytes of every request); per prefill case (q_len = kv_len = L,
// plus a chunked case of q_len queries over kv_len keys; one request) and variant, milliseconds,
// TFLOP/s (4 * D * Hq * causal (query, key) pairs) and the error against variant 0 (the original
// kernel) on the same inputs: max abs difference and relative L2 error; a variant whose relative
// error exceeds 1e-2 (or that leaves non-finite values: the output is poisoned with NaN first) is
// marked invalid.
// Timing: cudaEvents around `repeats` calls (chosen so that a sample takes >= ~1 ms) after
// warm-up, median over `samples` such measurements.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"kiln attention benchmark"};
  int hq = 24, hkv = 4, d = 64, samples = 11, page_size = 16, decode_batch = 1;
  double min_sample_ms = 1.0;
  std::vector<int> decode_lens = {1024, 8192, 30000};
  std::vector<int> prefill_lens = {1024, 8192, 30000};
  std::vector<int> chunked = {8192, 30000};
  std::vector<int> variants;
  app.add_option("--hq", hq, "query heads");
  app.add_option("--hkv", hkv, "key/value heads");
  app.add_option("--head-dim", d, "head dimension (64 or 128 use the fast paths)");
  app.add_option("--page-size", page_size, "KV cache rows per page (0: the whole pool as one page)");
  app.add_option("--decode", decode_lens, "decode context lengths");
  app.add_option("--decode-batch", decode_batch, "requests per decode call, each with its own pages");
  app.add_option("--prefill", prefill_lens, "prefill lengths (q_len = kv_len; 0: no prefill cases)");
  app.add_option("--chunked", chunked, "chunked prefill cases as q_len kv_len pairs (0: none)");
  app.add_option("--variants", variants, "prefill variants to run (default: all)");
  app.add_option("--samples", samples, "timed samples (median reported)");
  app.add_option("--min-sample-ms", min_sample_ms, "calls per sample are chosen to take at least this long");
  CLI11_PARSE(app, argc, argv);
  for (std::vector<int>* list : {&prefill_lens, &chunked})
    if (*list == std::vector<int>{0}) list->clear();

#ifndef KILN_WITH_CUDA
  std::printf("{\"error\": \"kiln was built without CUDA\"}\n");
  return 1;
#else
  using namespace kiln;
  if (CudaBackend::device_count() == 0) {
    std::printf("{\"error\": \"no CUDA GPU\"}\n");
    return 1;
  }
  Result<std::unique_ptr<CudaBackend> > made = CudaBackend::create(0);
  if (!made.ok()) {
    std::printf("{\"error\": \"%s\"}\n", made.status().message().c_str());
    return 1;
  }
  CudaBackend& be = **made;
  cudaStream_t stream = be.stream();
  if (page_size < 0) {
    std::printf("{\"error\": \"--page-size must be >= 0\"}\n");
    return 1;
  }
  if (decode_batch < 1) {
    std::printf("{\"error\": \"--decode-batch must be >= 1\"}\n");
    return 1;
  }
  if (chunked.size() % 2 != 0) {
    std::printf("{\"error\": \"--chunked takes q_len kv_len pairs\"}\n");
    return 1;
  }
  if (variants.empty())
    for (int v = 0; v < cuda::kPrefillVariantCount; ++v) variants.push_back(v);
  for (int v : variants)
    if (v < 0 || v >= cuda::kPrefillVariantCount) {
      std::printf("{\"error\": \"no prefill variant %d\"}\n", v);
      return 1;
    }

  struct Case {
    int q_len, kv_len;
  };
  std::vector<Case> cases;
  for (int n : prefill_lens) cases.push_back({n, n});
  for (size_t i = 0; i < chunked.size(); i += 2) cases.push_back({chunked[i], chunked[i + 1]});

  int max_len = 1;
  for (int n : decode_lens) max_len = std::max(max_len, n);
  for (const Case& c : cases) max_len = std::max({max_len, c.q_len, c.kv_len});

  // Tensors sized for the longest run; filled with pseudo-random bf16 values in [-1, 1).
  auto alloc = [&](Shape s, uint64_t seed) {
    Result<TensorBuffer> r = empty(be, s, DType::bf16);
    KILN_ASSERT(r.ok());
    TensorBuffer t = std::move(r).value();
    std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (seed * 0xbf58476d1ce4e5b9ull);
    for (auto& h : host) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const float f = (static_cast<float>((x >> 40) & 0xffff) / 65536.0f - 0.5f) * 2.0f;
      h = f32_to_bf16(f);
    }
    CUDA_CHECK(cudaMemcpy(t.view().data, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return t;
  };
  // The pool: n_pages pages of `ps` rows (ps = max_len for --page-size 0: one page per request),
  // request_pages of them for each of the decode_batch requests.
  const int ps = page_size > 0 ? page_size : max_len;
  const int request_pages = (max_len + ps - 1) / ps;
  const int n_pages = request_pages * decode_batch;
  const int64_t pool_rows = static_cast<int64_t>(n_pages) * ps;
  const int q_rows = std::max(max_len, decode_batch);
  TensorBuffer q = alloc(Shape{q_rows, hq, d}, 1);
  TensorBuffer out = alloc(Shape{q_rows, hq, d}, 2);
  TensorBuffer k = alloc(Shape{pool_rows, hkv, d}, 3);
  TensorBuffer v = alloc(Shape{pool_rows, hkv, d}, 4);
  auto alloc_i32 = [&](int64_t n) {
    Result<TensorBuffer> r = empty(be, Shape{n}, DType::i32);
    KILN_ASSERT(r.ok());
    return std::move(r).value();
  };
  TensorBuffer qi = alloc_i32(decode_batch + 1), page_indptr = alloc_i32(decode_batch + 1),
               page_indices = alloc_i32(n_pages), last_page_len = alloc_i32(decode_batch);
  // The pool's pages in a fixed pseudo-random order (seeded Fisher-Yates); request b owns entries
  // b * request_pages.. of it.
  std::vector<int32_t> order(static_cast<size_t>(n_pages));
  for (int i = 0; i < n_pages; ++i) order[i] = i;
  {
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = n_pages - 1; i > 0; --i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(order[i], order[static_cast<int>((x >> 33) % static_cast<uint64_t>(i + 1))]);
    }
  }
  const PagedKV paged{page_indptr, page_indices, last_page_len, ps};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));

  // `batch` requests of q_len queries over kv_len keys each: the first ceil(kv_len / ps) of each
  // request's pages. Prefill cases run one request.
  int batch = 1;
  auto set_lengths = [&](int requests, int q_len, int kv_len) {
    batch = requests;
    const int pages = (kv_len + ps - 1) / ps;
    std::vector<int32_t> qh(requests + 1), ph(requests + 1), lh(requests, kv_len - (pages - 1) * ps), list;
    for (int b = 0; b <= requests; ++b) {
      qh[b] = b * q_len;
      ph[b] = b * pages;
      const auto first = order.begin() + static_cast<int64_t>(b) * request_pages;
      if (b < requests) list.insert(list.end(), first, first + pages);
    }
    CUDA_CHECK(cudaMemcpy(page_indices.view().data, list.data(), list.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(qi.view().data, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(page_indptr.view().data, ph.data(), ph.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(last_page_len.view().data, lh.data(), lh.size() * 4, cudaMemcpyHostToDevice));
  };
  auto call = [&](int q_len, int kv_len) {
    Tensor qt = q.view().rows(0, batch * q_len), ot = out.view().rows(0, batch * q_len);
    const ops::AttentionBounds bounds{batch, q_len, kv_len};
    cuda::attention_forward(be, ot, qt, k, v, qi, paged, bounds, scale);
  };
  auto elapsed_ms = [&](int reps, int q_len, int kv_len) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; ++r) call(q_len, kv_len);
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    return static_cast<double>(t);
  };
  // Median milliseconds per call (lengths already set).
  auto time_call = [&](int q_len, int kv_len) {
    for (int i = 0; i < 2; ++i) call(q_len, kv_len);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double est = std::max(elapsed_ms(1, q_len, kv_len), 1e-3);
    const int reps = std::clamp(static_cast<int>(std::ceil(min_sample_ms / est)), 1, 200);
    std::vector<double> ms;
    for (int s = 0; s < std::max(samples, 1); ++s) ms.push_back(elapsed_ms(reps, q_len, kv_len) / reps);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  // The first q_len rows of `out` as floats, after poisoning them with NaN and one call.
  auto run_once = [&](int q_len, int kv_len) {
    const size_t n = static_cast<size_t>(q_len) * hq * d;
    CUDA_CHECK(cudaMemsetAsync(out.view().data, 0xff, n * 2, stream));  // bf16 0xffff: NaN
    call(q_len, kv_len);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> raw(n);
    CUDA_CHECK(cudaMemcpy(raw.data(), out.view().data, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
      std::memcpy(&f[i], &bits, 4);
    }
    return f;
  };

  std::printf("{\n  \"hq\": %d, \"hkv\": %d, \"head_dim\": %d, \"dtype\": \"bf16\", \"sms\": %d, \"page_size\": %d,\n",
              hq, hkv, d, be.multiprocessor_count(), page_size);
  std::printf("  \"prefill_variant_override\": %d,\n  \"variants\": [", cuda::prefill_variant_override(be));
  for (size_t i = 0; i < variants.size(); ++i)
    std::printf("%s\n    {\"variant\": %d, \"name\": \"%s\"}", i ? "," : "", variants[i],
                cuda::prefill_variant_name(variants[i]));
  std::printf("\n  ],\n  \"decode\": [");
  for (size_t i = 0; i < decode_lens.size(); ++i) {
    const int n = decode_lens[i];
    set_lengths(decode_batch, 1, n);
    const double ms = time_call(1, n);
    const double bytes = 2.0 * n * hkv * d * 2.0 * decode_batch;  // K and V, bf16
    std::printf("%s\n    {\"batch\": %d, \"kv_len\": %d, \"us\": %.2f, \"gb_per_s\": %.1f}", i ? "," : "",
                decode_batch, n, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
  }
  std::fflush(stdout);
  std::printf("\n  ],\n  \"prefill\": [");
  std::vector<std::string> best;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case c = cases[ci];
    set_lengths(1, c.q_len, c.kv_len);
    // Causal (query, key) pairs: query i sits at position kv_len - q_len + i.
    const double pairs =
        static_cast<double>(c.q_len) * (c.kv_len - c.q_len) + static_cast<double>(c.q_len) * (c.q_len + 1) / 2.0;
    const double flop = 4.0 * d * hq * pairs;
    be.set_attention_prefill_variant(0);
    const std::vector<float> ref = run_once(c.q_len, c.kv_len);
    double ref_norm = 0;
    for (float x : ref) ref_norm += static_cast<double>(x) * x;
    ref_norm = std::sqrt(ref_norm);
    std::printf("%s\n    {\"q_len\": %d, \"kv_len\": %d, \"default_variant\": %d, \"results\": [", ci ? "," : "", c.q_len,
                c.kv_len, cuda::prefill_default_variant(be, d, ps, c.q_len, hq, 1));
    int best_v = -1;
    double best_ms = 0;
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const int var = variants[vi];
      be.set_attention_prefill_variant(var);
      const std::vector<float> got = run_once(c.q_len, c.kv_len);
      double max_abs = 0, diff2 = 0;
      int64_t nonfinite = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) {
          ++nonfinite;
          continue;
        }
        const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
        max_abs = std::max(max_abs, e);
        diff2 += e * e;
      }
      const double rel = ref_norm > 0 ? std::sqrt(diff2) / ref_norm : std::sqrt(diff2);
      const bool valid = nonfinite == 0 && rel <= 1e-2;
      const double ms = time_call(c.q_len, c.kv_len);
      if (valid && (best_v < 0 || ms < best_ms)) best_v = var, best_ms = ms;
      std::printf(
          "%s\n      {\"variant\": %d, \"ms\": %.4f, \"tflop_per_s\": %.1f, \"max_abs_err\": %.3g, "
          "\"rel_l2_err\": %.3g, \"nonfinite\": %lld, \"valid\": %s}",
          vi ? "," : "", var, ms, flop / (ms * 1e-3) / 1e12, max_abs, rel, static_cast<long long>(nonfinite),
          valid ? "true" : "false");
      std::fflush(stdout);
    }
    std::printf("\n    ], \"best_valid_variant\": %d}", best_v);
    char buf[96];
    std::snprintf(buf, sizeof(buf), "\"%d/%d\": %d", c.q_len, c.kv_len, best_v);
    best.push_back(buf);
  }
  be.set_attention_prefill_variant(-1);
  std::printf("\n  ],\n  \"best_valid_variant\": {");
  for (size_t i = 0; i < best.size(); ++i) std::printf("%s%s", i ? ", " : "", best[i].c_str());
  std::printf("}\n}\n");
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return 0;
#endif
}
