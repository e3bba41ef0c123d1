// Attention kernel benchmark (CUDA, bf16): decode (one query, B=1, split-KV path) and causal
// prefill (tensor-core path) for Hq=24, Hkv=4, D=64 by default, with every compiled prefill
// variant (kernels/cuda/attention_internal.h). Prints JSON: decode microseconds per call and
// achieved GB/s (K+V bytes read); per prefill case (q_len = kv_len = L, plus a chunked case of
// q_len queries over kv_len keys) and variant, milliseconds, TFLOP/s (4 * D * Hq * causal (query,
// key) pairs) and the error against variant 0 (the original kernel) on the same inputs: max abs
// difference and relative L2 error; a variant whose relative error exceeds 1e-2 (or that leaves
// non-finite values: the output is poisoned with NaN first) is marked invalid.
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
  int hq = 24, hkv = 4, d = 64, samples = 11;
  double min_sample_ms = 1.0;
  std::vector<int> decode_lens = {1024, 8192, 30000};
  std::vector<int> prefill_lens = {1024, 8192, 30000};
  std::vector<int> chunked = {8192, 30000};
  std::vector<int> variants;
  app.add_option("--hq", hq, "query heads");
  app.add_option("--hkv", hkv, "key/value heads");
  app.add_option("--head-dim", d, "head dimension (64 or 128 use the fast paths)");
  app.add_option("--decode", decode_lens, "decode context lengths");
  app.add_option("--prefill", prefill_lens, "prefill lengths (q_len = kv_len)");
  app.add_option("--chunked", chunked, "chunked prefill cases as q_len kv_len pairs (empty: none)");
  app.add_option("--variants", variants, "prefill variants to run (default: all)");
  app.add_option("--samples", samples, "timed samples (median reported)");
  app.add_option("--min-sample-ms", min_sample_ms, "calls per sample are chosen to take at least this long");
  CLI11_PARSE(app, argc, argv);

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
  TensorBuffer q = alloc(Shape{max_len, hq, d}, 1);
  TensorBuffer out = alloc(Shape{max_len, hq, d}, 2);
  TensorBuffer k = alloc(Shape{max_len, hkv, d}, 3);
  TensorBuffer v = alloc(Shape{max_len, hkv, d}, 4);
  Result<TensorBuffer> qi_r = empty(be, Shape{2}, DType::i32);
  Result<TensorBuffer> kvi_r = empty(be, Shape{2}, DType::i32);
  KILN_ASSERT(qi_r.ok() && kvi_r.ok());
  TensorBuffer qi = std::move(qi_r).value(), kvi = std::move(kvi_r).value();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));

  // One request of q_len queries over kv_len keys.
  auto set_lengths = [&](int q_len, int kv_len) {
    const int32_t qh[2] = {0, q_len}, kh[2] = {0, kv_len};
    CUDA_CHECK(cudaMemcpy(qi.view().data, qh, sizeof(qh), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(kvi.view().data, kh, sizeof(kh), cudaMemcpyHostToDevice));
  };
  auto call = [&](int q_len, int kv_len) {
    Tensor qt = q.view().rows(0, q_len), ot = out.view().rows(0, q_len);
    Tensor kt = k.view().rows(0, kv_len), vt = v.view().rows(0, kv_len);
    const ops::AttentionBounds bounds{1, q_len, kv_len};
    cuda::attention_forward(be, ot, qt, kt, vt, qi, kvi, bounds, scale);
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

  std::printf("{\n  \"hq\": %d, \"hkv\": %d, \"head_dim\": %d, \"dtype\": \"bf16\", \"sms\": %d,\n", hq, hkv, d,
              be.multiprocessor_count());
  std::printf("  \"default_prefill_variant\": %d,\n  \"variants\": [", cuda::prefill_variant_for_head_dim(be, d));
  for (size_t i = 0; i < variants.size(); ++i)
    std::printf("%s\n    {\"variant\": %d, \"name\": \"%s\"}", i ? "," : "", variants[i],
                cuda::prefill_variant_name(variants[i]));
  std::printf("\n  ],\n  \"decode\": [");
  for (size_t i = 0; i < decode_lens.size(); ++i) {
    const int n = decode_lens[i];
    set_lengths(1, n);
    const double ms = time_call(1, n);
    const double bytes = 2.0 * n * hkv * d * 2.0;  // K and V, bf16
    std::printf("%s\n    {\"kv_len\": %d, \"us\": %.2f, \"gb_per_s\": %.1f}", i ? "," : "", n, ms * 1e3,
                bytes / (ms * 1e-3) / 1e9);
  }
  std::fflush(stdout);
  std::printf("\n  ],\n  \"prefill\": [");
  std::vector<std::string> best;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case c = cases[ci];
    set_lengths(c.q_len, c.kv_len);
    // Causal (query, key) pairs: query i sits at position kv_len - q_len + i.
    const double pairs =
        static_cast<double>(c.q_len) * (c.kv_len - c.q_len) + static_cast<double>(c.q_len) * (c.q_len + 1) / 2.0;
    const double flop = 4.0 * d * hq * pairs;
    be.set_attention_prefill_variant(0);
    const std::vector<float> ref = run_once(c.q_len, c.kv_len);
    double ref_norm = 0;
    for (float x : ref) ref_norm += static_cast<double>(x) * x;
    ref_norm = std::sqrt(ref_norm);
    std::printf("%s\n    {\"q_len\": %d, \"kv_len\": %d, \"results\": [", ci ? "," : "", c.q_len, c.kv_len);
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
