// The decode step's projections at small batch sizes, each implementation beside the others: cuBLASLt
// with the separate norm / SwiGLU / residual-add kernels, kiln's fused small-batch kernel (up to 32
// rows), and the streaming TMA kernel (Hopper, up to 128 rows), over every layer's own weights (as
// a decode step reads them: from HBM, not L2), captured in a CUDA graph and replayed like a decode
// step. Prints JSON: microseconds per layer (median of repeats, CUDA events) and the weight bytes'
// GB/s, per row count; optionally a sweep of the TMA kernel's K split. Entries suffixed _bare run the projection
// without the norm kernel before it (the step's q/k/v and gate/up read rows normed by the kernel
// before); down_ksplit is what the step runs at 9 to 128 rows (cuBLASLt's K quarters, then their sum
// into the residual with the next norm), down_tma_norm its counterpart on the TMA kernel.
// Usage: bench_linear --config bench/configs/astrai-1b-shape.config.json [--rows 1,8,32,128] [--splits]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>

#include "backend/backend.h"
#include "kernels/ops.h"
#include "model/config.h"
#ifdef KILN_WITH_CUDA
#include "backend/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#endif

using namespace kiln;

namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "bench_linear: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln small-batch projection benchmark"};
  std::string config_path;
  std::vector<int64_t> row_counts = {1, 8, 16, 32, 64, 128};
  int reps = 20;
  bool sweep_splits = false;
  std::vector<std::string> only;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--rows", row_counts, "batch rows (tokens of the step)")->delimiter(',');
  app.add_option("--reps", reps, "timed repeats (median)");
  app.add_flag("--splits", sweep_splits, "also time the TMA kernel at each K split (1, 2, 4, 8)");
  app.add_option("--only", only, "time only these entries (e.g. gate_up_tma; for profilers)")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
#ifndef KILN_WITH_CUDA
  (void)reps, (void)sweep_splits;
  return fail(unsupported("kiln was built without CUDA"));
#else
  Result<ModelConfig> cr = load_model_config_file(config_path);
  if (!cr.ok()) return fail(cr.status());
  const ModelConfig c = *cr;
  Result<std::unique_ptr<Backend>> br = make_backend(Device::cuda(0));
  if (!br.ok()) return fail(br.status());
  Backend& be = **br;
  auto& cbe = static_cast<CudaBackend&>(be);
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.num_attention_heads * c.head_dim;
  const int64_t QKV = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, L = c.num_hidden_layers;
  const int64_t T = *std::max_element(row_counts.begin(), row_counts.end());
  auto buf = [&](Shape s, DType t) {
    Result<TensorBuffer> r = empty(be, s, t);
    KILN_ASSERT(r.ok());
    ops::fill_normal(be, *r, 0.5f, static_cast<uint64_t>(s.numel()));
    return std::move(r).value();
  };
  const DType bf = DType::bf16;
  std::vector<TensorBuffer> lw;
  for (int64_t l = 0; l < L; ++l) {
    lw.push_back(buf({QKV, H}, bf));
    lw.push_back(buf({H, Q}, bf));
    lw.push_back(buf({2 * I, H}, bf));
    lw.push_back(buf({H, I}, bf));
  }
  TensorBuffer head = buf({c.vocab_size, H}, bf), w_norm = buf({H}, bf);
  TensorBuffer resid_b = buf({T, H}, DType::f32), normed_b = buf({T, H}, bf), attn_b = buf({T, Q}, bf);
  TensorBuffer qkv_b = buf({T, QKV}, bf), gu_b = buf({T, 2 * I}, bf), act_b = buf({T, I}, bf);
  TensorBuffer logits_b = buf({T, c.vocab_size}, DType::f32);
  const int32_t down_parts = std::max<int32_t>(1, ops::linear_k_split_parts(be, T, H, I, bf));
  TensorBuffer partials_b = buf({down_parts * T * H}, DType::f32);

  nlohmann::json res = {{"config", config_path}, {"layers", L}};
  // Median time of one replay of fn captured as a CUDA graph (as the engine's decode steps run).
  auto time = [&](const std::function<void()>& fn) {
    fn();  // plans cuBLASLt's shapes and raises kernel limits outside the capture
    Result<std::unique_ptr<CapturedWork>> graph = be.capture(fn);
    KILN_ASSERT(graph.ok());
    (*graph)->replay();
    std::vector<float> ms;
    auto a = be.create_event(), b = be.create_event();
    for (int r = 0; r < reps; ++r) {
      a->record();
      (*graph)->replay();
      b->record();
      KILN_ASSERT(b->wait().ok());
      ms.push_back(b->elapsed_ms(*a));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1e3;
  };
  using cuda::TmaEpilogue;
  for (const int64_t M : row_counts) {
    Tensor resid = resid_b.view().rows(0, M), normed = normed_b.view().rows(0, M), attn = attn_b.view().rows(0, M);
    Tensor qkv = qkv_b.view().rows(0, M), gu = gu_b.view().rows(0, M), act = act_b.view().rows(0, M);
    Tensor logits = logits_b.view().rows(0, M);
    nlohmann::json row;
    // One projection over the layers' weights (w_index < 0: the head, once), per layer.
    auto entry = [&](const std::string& name, int w_index, double bytes, const std::function<void(Tensor)>& fn) {
      if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) return;
      const int64_t n = w_index < 0 ? 1 : L;
      const double us = time([&] {
        for (int64_t l = 0; l < n; ++l) fn(w_index < 0 ? head.view() : lw[4 * l + w_index].view());
      }) / static_cast<double>(n);
      row[name] = {{"us", us}, {"gb_per_s", bytes / us / 1e3}};
    };
    const bool kernel_rows = M <= ops::kNormLinearMaxRows, tma = cuda::linear_tma_valid(cbe, M, H, bf);
    const double e2 = 2.0;
    entry("qkv_cublas", 0, e2 * QKV * H, [&](Tensor w) {
      ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
      ops::gemm(be, qkv, normed, false, w, true, 1.0f, 0.0f);
    });
    entry("o_cublas", 1, e2 * H * Q, [&](Tensor w) { ops::gemm(be, resid, attn, false, w, true, 1.0f, 1.0f); });
    entry("gate_up_cublas", 2, e2 * 2 * I * H, [&](Tensor w) {
      ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
      ops::gemm(be, gu, normed, false, w, true, 1.0f, 0.0f);
      ops::swiglu_forward(be, act, gu);
    });
    entry("down_cublas", 3, e2 * H * I, [&](Tensor w) { ops::gemm(be, resid, act, false, w, true, 1.0f, 1.0f); });
    entry("qkv_cublas_bare", 0, e2 * QKV * H, [&](Tensor w) { ops::gemm(be, qkv, normed, false, w, true, 1.0f, 0.0f); });
    entry("gate_up_cublas_bare", 2, e2 * 2 * I * H, [&](Tensor w) {
      ops::gemm(be, gu, normed, false, w, true, 1.0f, 0.0f);
      ops::swiglu_forward(be, act, gu);
    });
    if (const int32_t parts = ops::linear_k_split_parts(be, M, H, I, bf); parts > 0) {
      Tensor partials = partials_b.view().rows(0, parts * M * H).view({parts, M, H});
      entry("down_ksplit", 3, e2 * H * I, [&](Tensor w) {
        ops::linear_k_split_forward(be, partials, act, w);
        ops::add_rmsnorm_forward(be, normed, resid, partials, w_norm, 1e-5f);
      });
    }
    entry("head_cublas", -1, e2 * c.vocab_size * H, [&](Tensor w) {
      ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
      ops::gemm(be, logits, normed, false, w, true, 1.0f, 0.0f);
    });
    if (kernel_rows) {
      using ops::FusedLinear;
      entry("qkv_fused", 0, e2 * QKV * H, [&](Tensor w) {
        cuda::fused_linear_kernel_forward(cbe, FusedLinear::norm, qkv, resid, w_norm, 1e-5f, w, Tensor{});
      });
      entry("o_fused", 1, e2 * H * Q, [&](Tensor w) {
        cuda::fused_linear_kernel_forward(cbe, FusedLinear::residual, resid, attn, Tensor{}, 0.0f, w, Tensor{});
      });
      entry("gate_up_fused", 2, e2 * 2 * I * H, [&](Tensor w) {
        cuda::fused_linear_kernel_forward(cbe, FusedLinear::norm_swiglu, act, resid, w_norm, 1e-5f, w, Tensor{});
      });
      entry("down_fused", 3, e2 * H * I, [&](Tensor w) {
        cuda::fused_linear_kernel_forward(cbe, FusedLinear::residual, resid, act, Tensor{}, 0.0f, w, Tensor{});
      });
      entry("head_fused", -1, e2 * c.vocab_size * H, [&](Tensor w) {
        cuda::fused_linear_kernel_forward(cbe, FusedLinear::norm, logits, resid, w_norm, 1e-5f, w, Tensor{});
      });
    }
    if (tma) {
      auto tma_entries = [&](int splits, const std::string& suffix) {
        entry("qkv_tma" + suffix, 0, e2 * QKV * H, [&](Tensor w) {
          ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
          cuda::linear_tma_forward(cbe, TmaEpilogue::store, qkv, normed, w, Tensor{}, splits);
        });
        entry("o_tma" + suffix, 1, e2 * H * Q, [&](Tensor w) {
          cuda::linear_tma_forward(cbe, TmaEpilogue::add_residual, resid, attn, w, Tensor{}, splits);
        });
        entry("gate_up_tma" + suffix, 2, e2 * 2 * I * H, [&](Tensor w) {
          ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
          cuda::linear_tma_forward(cbe, TmaEpilogue::swiglu, act, normed, w, Tensor{}, splits);
        });
        entry("down_tma" + suffix, 3, e2 * H * I, [&](Tensor w) {
          cuda::linear_tma_forward(cbe, TmaEpilogue::add_residual, resid, act, w, Tensor{}, splits);
        });
        entry("down_tma_norm" + suffix, 3, e2 * H * I, [&](Tensor w) {
          cuda::linear_tma_forward(cbe, TmaEpilogue::add_residual, resid, act, w, Tensor{}, splits);
          ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
        });
        if (splits == 0)
          entry("head_tma" + suffix, -1, e2 * c.vocab_size * H, [&](Tensor w) {
            ops::rmsnorm_forward(be, normed, resid, w_norm, 1e-5f);
            cuda::linear_tma_forward(cbe, TmaEpilogue::store, logits, normed, w, Tensor{}, 0);
          });
        // The projections alone, without the norm kernels between (what the step runs where the
        // kernel before writes the normed rows).
        if (splits == 0) {
          entry("qkv_tma_bare" + suffix, 0, e2 * QKV * H,
                [&](Tensor w) { cuda::linear_tma_forward(cbe, TmaEpilogue::store, qkv, normed, w, Tensor{}, 0); });
          entry("gate_up_tma_bare" + suffix, 2, e2 * 2 * I * H,
                [&](Tensor w) { cuda::linear_tma_forward(cbe, TmaEpilogue::swiglu, act, normed, w, Tensor{}, 0); });
        }
      };
      tma_entries(0, "");
      if (sweep_splits)
        for (int s : {1, 2, 4, 8}) tma_entries(s, "_ks" + std::to_string(s));
    }
    res["rows"][std::to_string(M)] = row;
  }
  std::cout << res.dump(1) << std::endl;
  return 0;
#endif
}
