// Attention kernel benchmark (CUDA, bf16): decode (one query, B=1, split-KV path) and causal
// prefill (q_len = kv_len, tensor-core path) for Hq=24, Hkv=4, D=64 by default. Prints JSON:
// decode microseconds per call and achieved GB/s (K+V bytes read), prefill milliseconds and
// TFLOP/s (4 * D * Hq * causal (query, key) pairs). Timing: cudaEvents around `repeats` calls
// after warm-up, median over `samples` such measurements.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"kiln attention benchmark"};
  int hq = 24, hkv = 4, d = 64, samples = 7, repeats = 20;
  std::vector<int> decode_lens = {1024, 8192, 30000};
  std::vector<int> prefill_lens = {1024, 8192, 30000};
  app.add_option("--hq", hq, "query heads");
  app.add_option("--hkv", hkv, "key/value heads");
  app.add_option("--head-dim", d, "head dimension (64 or 128 use the fast paths)");
  app.add_option("--decode", decode_lens, "decode context lengths");
  app.add_option("--prefill", prefill_lens, "prefill lengths (q_len = kv_len)");
  app.add_option("--samples", samples, "timed samples (median reported)");
  app.add_option("--repeats", repeats, "calls per timed sample");
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

  int max_len = 1;
  for (int n : decode_lens) max_len = std::max(max_len, n);
  for (int n : prefill_lens) max_len = std::max(max_len, n);

  // Tensors sized for the longest run; filled with small pseudo-random bf16 values.
  auto alloc = [&](Shape s) {
    Result<TensorBuffer> r = empty(be, s, DType::bf16);
    KILN_ASSERT(r.ok());
    TensorBuffer t = std::move(r).value();
    std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
    uint64_t x = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(t.numel());
    for (auto& h : host) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const float f = (static_cast<float>((x >> 40) & 0xffff) / 65536.0f - 0.5f) * 2.0f;
      h = f32_to_bf16(f);
    }
    CUDA_CHECK(cudaMemcpy(t.view().data, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return t;
  };
  TensorBuffer q = alloc(Shape{max_len, hq, d});
  TensorBuffer out = alloc(Shape{max_len, hq, d});
  TensorBuffer k = alloc(Shape{max_len, hkv, d});
  TensorBuffer v = alloc(Shape{max_len, hkv, d});
  Result<TensorBuffer> qi_r = empty(be, Shape{2}, DType::i32);
  Result<TensorBuffer> kvi_r = empty(be, Shape{2}, DType::i32);
  KILN_ASSERT(qi_r.ok() && kvi_r.ok());
  TensorBuffer qi = std::move(qi_r).value(), kvi = std::move(kvi_r).value();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  // Median milliseconds per call of attention with q_len queries over kv_len keys.
  auto time_call = [&](int q_len, int kv_len) {
    const int32_t qh[2] = {0, q_len}, kh[2] = {0, kv_len};
    CUDA_CHECK(cudaMemcpy(qi.view().data, qh, sizeof(qh), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(kvi.view().data, kh, sizeof(kh), cudaMemcpyHostToDevice));
    Tensor qt = q.view().rows(0, q_len), ot = out.view().rows(0, q_len);
    Tensor kt = k.view().rows(0, kv_len), vt = v.view().rows(0, kv_len);
    const ops::AttentionBounds bounds{1, q_len, kv_len};
    auto call = [&] { cuda::attention_forward(be, ot, qt, kt, vt, qi, kvi, bounds, scale); };
    for (int i = 0; i < 3; ++i) call();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> ms;
    for (int s = 0; s < samples; ++s) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < repeats; ++r) call();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(t / static_cast<float>(repeats));
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };

  std::printf("{\n  \"hq\": %d, \"hkv\": %d, \"head_dim\": %d, \"dtype\": \"bf16\", \"sms\": %d,\n", hq, hkv, d,
              be.multiprocessor_count());
  std::printf("  \"decode\": [");
  for (size_t i = 0; i < decode_lens.size(); ++i) {
    const int n = decode_lens[i];
    const double ms = time_call(1, n);
    const double bytes = 2.0 * n * hkv * d * 2.0;  // K and V, bf16
    std::printf("%s\n    {\"kv_len\": %d, \"us\": %.2f, \"gb_per_s\": %.1f}", i ? "," : "", n, ms * 1e3,
                bytes / (ms * 1e-3) / 1e9);
  }
  std::printf("\n  ],\n  \"prefill\": [");
  for (size_t i = 0; i < prefill_lens.size(); ++i) {
    const int n = prefill_lens[i];
    const double ms = time_call(n, n);
    const double pairs = static_cast<double>(n) * (n + 1) / 2.0;  // causal (query, key) pairs
    const double flop = 4.0 * d * hq * pairs;
    std::printf("%s\n    {\"len\": %d, \"ms\": %.3f, \"tflop_per_s\": %.1f}", i ? "," : "", n, ms,
                flop / (ms * 1e-3) / 1e12);
  }
  std::printf("\n  ]\n}\n");
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return 0;
#endif
}
