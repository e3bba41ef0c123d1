// Training attention benchmark (CUDA, bf16, kernels/cuda/attention_train.cu): forward and backward
// of ops::attention_train_forward / _backward for dense [B, H, S, D] batches, causal by default.
// Default cases: (B=8, S=2048, Hq=32, Hkv=8, D=64) and (B=4, S=4096, Hq=32, Hkv=8, D=128).
// FLOPs as FlashAttention counts them: forward 4 * B * Hq * S * S * D (/ 2 when causal), backward
// 2.5x the forward. With --doc-len N the rows are packed documents of N tokens (segment ids), and
// the FLOPs are still counted as for the unpacked causal case (so TFLOP/s shows the skipping gain).
// Timing: cudaEvents around `iters` calls after `warmup` calls, median over `samples` such runs;
// the backward time includes its prep (delta, lse2, dQ accumulator zeroing) and dQ conversion.
// Each case runs once per tensor-core variant (--variants; KILN_ATTN_TRAIN_VARIANT: 3 = wgmma with the
// one-warpgroup D = 64 backward, the default; 1 = wgmma with the 2-warpgroup backward for every D (the
// same as 3 for D = 128); 0, 2 and 4 were removed; on a GPU without wgmma every variant runs the
// generic kernels), and the variants' outputs (out, dq, dk, dv) are compared with the first
// variant's (relative L2 error; outputs are poisoned with NaN first, so a non-finite result marks a
// variant invalid).
// Prints one JSON object: per case and variant ms and TFLOP/s for the forward, the backward and both.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/train_ops.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "backend/cuda_backend.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"kiln training attention benchmark"};
  std::vector<int> cases_flat = {8, 2048, 32, 8, 64, 4, 4096, 32, 8, 128};
  int warmup = 3, iters = 20, samples = 5, doc_len = 0;
  bool non_causal = false;
  std::vector<int> variants = {3, 1};
  app.add_option("--cases", cases_flat, "cases as B S Hq Hkv D tuples");
  app.add_option("--warmup", warmup, "untimed calls before timing");
  app.add_option("--iters", iters, "calls per timed sample");
  app.add_option("--samples", samples, "timed samples (median reported)");
  app.add_option("--doc-len", doc_len, "pack each row as documents of this many tokens (segment ids); 0: none");
  app.add_flag("--non-causal", non_causal, "full (bidirectional) attention");
  app.add_option("--variants", variants, "tensor-core variants to time (3 wgmma, one-warpgroup D=64 bwd; 1 wgmma)");
  CLI11_PARSE(app, argc, argv);
  for (int v : variants) {
    if (v != 1 && v != 3) {  // the library ignores other values (it would time the default)
      std::printf("{\"error\": \"--variants takes 1 or 3 (0, 2 and 4 were removed)\"}\n");
      return 1;
    }
  }

#ifndef KILN_WITH_CUDA
  std::printf("{\"error\": \"kiln was built without CUDA\"}\n");
  return 1;
#else
  using namespace kiln;
  if (cases_flat.size() % 5 != 0) {
    std::printf("{\"error\": \"--cases takes B S Hq Hkv D tuples\"}\n");
    return 1;
  }
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
  const bool causal = !non_causal;
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));

  // Device tensor of pseudo-random bf16 values in [-1, 1) (a cheap LCG; the values do not matter).
  auto random_bf16 = [&](Shape s, uint64_t seed) {
    Result<TensorBuffer> r = empty(be, s, DType::bf16);
    KILN_ASSERT(r.ok());
    TensorBuffer t = std::move(r).value();
    std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (seed * 0xbf58476d1ce4e5b9ull);
    for (auto& h : host) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      h = f32_to_bf16((static_cast<float>((x >> 40) & 0xffff) / 65536.0f - 0.5f) * 2.0f);
    }
    CUDA_CHECK(cudaMemcpy(t.view().data, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    return t;
  };
  auto zeros = [&](Shape s, DType dt) {
    Result<TensorBuffer> r = empty(be, s, dt);
    KILN_ASSERT(r.ok());
    TensorBuffer t = std::move(r).value();
    be.zero(t);
    return t;
  };
  // Median milliseconds per call of fn.
  auto time_ms = [&](auto&& fn) {
    for (int i = 0; i < warmup; ++i) fn();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> ms;
    for (int s = 0; s < std::max(samples, 1); ++s) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < iters; ++i) fn();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms.push_back(static_cast<double>(t) / std::max(iters, 1));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };

  std::printf("{\n  \"bench\": \"attention_train\",\n  \"dtype\": \"bf16\",\n  \"causal\": %s,\n  \"doc_len\": %d,\n",
              causal ? "true" : "false", doc_len);
  std::printf("  \"device\": \"%s\",\n  \"cases\": [\n", be.device().str().c_str());
  for (size_t ci = 0; ci < cases_flat.size(); ci += 5) {
    const int B = cases_flat[ci], S = cases_flat[ci + 1], Hq = cases_flat[ci + 2], Hkv = cases_flat[ci + 3],
              D = cases_flat[ci + 4];
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    TensorBuffer q = random_bf16(Shape{B, Hq, S, D}, 1), k = random_bf16(Shape{B, Hkv, S, D}, 2),
                 v = random_bf16(Shape{B, Hkv, S, D}, 3), dout = random_bf16(Shape{B, S, Hq, D}, 4);
    TensorBuffer out = zeros(Shape{B, S, Hq, D}, DType::bf16), lse = zeros(Shape{B, Hq, S}, DType::f32);
    TensorBuffer dq = zeros(Shape{B, Hq, S, D}, DType::bf16), dk = zeros(Shape{B, Hkv, S, D}, DType::bf16),
                 dv = zeros(Shape{B, Hkv, S, D}, DType::bf16);
    TensorBuffer seg;
    Tensor seg_view;
    if (doc_len > 0) {
      std::vector<int32_t> ids(static_cast<size_t>(B) * S);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i % S) / doc_len);
      Result<TensorBuffer> r = empty(be, Shape{B, S}, DType::i32);
      KILN_ASSERT(r.ok());
      seg = std::move(r).value();
      CUDA_CHECK(cudaMemcpy(seg.view().data, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
      seg_view = seg.view();
    }
    auto fwd = [&] { ops::attention_train_forward(be, out, lse, q, k, v, seg_view, causal, scale); };
    auto bwd = [&] {
      ops::attention_train_backward(be, dq, dk, dv, dout, q, k, v, out, lse, seg_view, causal, scale);
    };
    // Outputs of one forward + backward (after NaN poisoning) as floats.
    auto outputs = [&] {
      std::vector<std::vector<float>> res;
      for (Tensor t : {out.view(), dq.view(), dk.view(), dv.view()}) {
        CUDA_CHECK(cudaMemsetAsync(t.data, 0xff, static_cast<size_t>(t.nbytes()), stream));  // bf16 NaN
      }
      fwd();
      bwd();
      CUDA_CHECK(cudaStreamSynchronize(stream));
      for (Tensor t : {out.view(), dq.view(), dk.view(), dv.view()}) {
        std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
        CUDA_CHECK(cudaMemcpy(h.data(), t.data, h.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> f(h.size());
        for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
        res.push_back(std::move(f));
      }
      return res;
    };
    auto rel_err = [](const std::vector<float>& a, const std::vector<float>& b) -> double {
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
        num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        den += static_cast<double>(b[i]) * b[i];
      }
      return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    };
    const double fwd_flops =
        4.0 * B * Hq * static_cast<double>(S) * static_cast<double>(S) * D / (causal ? 2.0 : 1.0);
    const double bwd_flops = 2.5 * fwd_flops;
    auto tflops = [](double flops, double ms) { return flops / (ms * 1e-3) / 1e12; };
    std::vector<std::vector<float>> first;
    std::printf("    {\"B\": %d, \"S\": %d, \"Hq\": %d, \"Hkv\": %d, \"D\": %d, \"variants\": [\n", B, S, Hq, Hkv, D);
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      setenv("KILN_ATTN_TRAIN_VARIANT", std::to_string(variants[vi]).c_str(), 1);
      std::vector<std::vector<float>> res = outputs();
      double err = 0.0;
      if (first.empty()) {
        first = res;
        for (const auto& r : res) err = std::max(err, rel_err(r, r));
      } else {
        for (size_t i = 0; i < res.size(); ++i) err = std::max(err, rel_err(res[i], first[i]));
      }
      const double fwd_ms = time_ms(fwd);
      const double bwd_ms = time_ms(bwd);
      Status st = be.synchronize();
      KILN_ASSERT(st.ok());
      std::printf(
          "      {\"variant\": %d, \"fwd_ms\": %.4f, \"fwd_tflops\": %.1f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.1f, "
          "\"fwd_bwd_ms\": %.4f, \"fwd_bwd_tflops\": %.1f, \"max_rel_err_vs_first\": %.2e, \"valid\": %s}%s\n",
          variants[vi], fwd_ms, tflops(fwd_flops, fwd_ms), bwd_ms, tflops(bwd_flops, bwd_ms), fwd_ms + bwd_ms,
          tflops(fwd_flops + bwd_flops, fwd_ms + bwd_ms), err, err <= 1e-2 ? "true" : "false",
          vi + 1 < variants.size() ? "," : "");
      std::fflush(stdout);
    }
    unsetenv("KILN_ATTN_TRAIN_VARIANT");
    std::printf("    ]}%s\n", ci + 5 < cases_flat.size() ? "," : "");
    std::fflush(stdout);
  }
  std::printf("  ]\n}\n");
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return 0;
#endif
}
