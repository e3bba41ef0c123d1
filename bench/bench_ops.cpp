// Per-op timing of one transformer layer's ops at a given token count (prefill chunk or decode),
// for a model shape from a Hugging Face config.json, bf16 on CUDA. Prints JSON: each op's
// microseconds (median of repeats, CUDA events) with its achieved TFLOP/s or GB/s, so the time of
// a whole forward can be attributed.
// Usage: bench_ops --config bench/configs/astrai-1b-shape.config.json [--tokens 8192] [--context 30000]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>

#include "backend/backend.h"
#include "kernels/ops.h"
#include "model/config.h"

using namespace kiln;

namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "bench_ops: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln per-op benchmark"};
  std::string config_path;
  int64_t T = 8192, context = 0;
  int reps = 20;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--tokens", T, "tokens in the step (rows of every activation)");
  app.add_option("--context", context, "context length the step's queries attend to (default: tokens)");
  app.add_option("--reps", reps, "timed repeats per op (median)");
  CLI11_PARSE(app, argc, argv);
  if (context < T) context = T;

  Result<ModelConfig> cr = load_model_config_file(config_path);
  if (!cr.ok()) return fail(cr.status());
  const ModelConfig c = *cr;
  Result<std::unique_ptr<Backend>> br = make_backend(Device::cuda(0));
  if (!br.ok()) return fail(br.status());
  Backend& be = **br;
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim, Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads;
  auto buf = [&](Shape s, DType t) {
    Result<TensorBuffer> r = empty(be, s, t);
    KILN_ASSERT(r.ok());
    ops::fill_normal(be, *r, 0.5f, static_cast<uint64_t>(s.numel()));
    return std::move(r).value();
  };
  const DType bf = DType::bf16;
  TensorBuffer x = buf({T, H}, bf), resid = buf({T, H}, DType::f32), normed = buf({T, H}, bf), w_norm = buf({H}, bf);
  TensorBuffer wq = buf({Hq * D, H}, bf), wk = buf({Hkv * D, H}, bf), wo = buf({H, Hq * D}, bf);
  TensorBuffer wgu = buf({2 * I, H}, bf), wd = buf({H, I}, bf);
  TensorBuffer q = buf({T, Hq, D}, bf), k = buf({T, Hkv, D}, bf), v = buf({T, Hkv, D}, bf), attn = buf({T, Hq, D}, bf);
  TensorBuffer gu = buf({T, 2 * I}, bf), act = buf({T, I}, bf), out = buf({T, H}, bf);
  TensorBuffer kc = buf({context, Hkv, D}, bf), vc = buf({context, Hkv, D}, bf);
  TensorBuffer inv_freq = buf({D / 2}, DType::f32);
  TensorBuffer host_i = host_empty({T + 6}, DType::i32);
  for (int64_t i = 0; i < T; ++i) host_i.ptr<int32_t>()[i] = static_cast<int32_t>(context - T + i);
  host_i.ptr<int32_t>()[T] = 0;
  host_i.ptr<int32_t>()[T + 1] = static_cast<int32_t>(T);
  host_i.ptr<int32_t>()[T + 2] = 0;  // page_indptr: one page of the whole context
  host_i.ptr<int32_t>()[T + 3] = 1;
  host_i.ptr<int32_t>()[T + 4] = 0;  // page id
  host_i.ptr<int32_t>()[T + 5] = static_cast<int32_t>(context);  // last page length
  Result<TensorBuffer> dev_i = to_device(be, host_i);
  KILN_ASSERT(dev_i.ok());
  Tensor positions = dev_i->view().rows(0, T), q_indptr = dev_i->view().rows(T, T + 2),
         page_indptr = dev_i->view().rows(T + 2, T + 4);
  const PagedKV paged{page_indptr, dev_i->view().rows(T + 4, T + 5), dev_i->view().rows(T + 5, T + 6),
                      static_cast<int32_t>(context)};

  nlohmann::json res = {{"tokens", T}, {"context", context}, {"config", config_path}};
  double total_us = 0;
  auto time_op = [&](const char* name, double flops, double bytes, const std::function<void()>& fn) {
    fn();
    std::vector<float> ms;
    auto a = be.create_event(), b = be.create_event();
    for (int r = 0; r < reps; ++r) {
      a->record();
      fn();
      b->record();
      KILN_ASSERT(b->wait().ok());
      ms.push_back(b->elapsed_ms(*a));
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1e3;
    total_us += us;
    nlohmann::json e = {{"us", us}};
    if (flops > 0) e["tflop_per_s"] = flops / us / 1e6;
    if (bytes > 0) e["gb_per_s"] = bytes / us / 1e3;
    res["ops"][name] = e;
  };
  const double e2 = 2.0;  // bytes per bf16
  time_op("add_rmsnorm", 0, T * H * (4.0 * 2 + e2 * 2), [&] { ops::add_rmsnorm_forward(be, normed, resid, x, w_norm, 1e-5f); });
  time_op("q_proj", 2.0 * T * H * Hq * D, 0, [&] { ops::linear_forward(be, q.view().view({T, Hq * D}), normed, wq); });
  time_op("k_proj", 2.0 * T * H * Hkv * D, 0, [&] { ops::linear_forward(be, k.view().view({T, Hkv * D}), normed, wk); });
  time_op("v_proj", 2.0 * T * H * Hkv * D, 0, [&] { ops::linear_forward(be, v.view().view({T, Hkv * D}), normed, wk); });
  time_op("rope_q", 0, 2 * e2 * T * Hq * D, [&] { ops::rope_forward(be, q, positions, inv_freq, 1.0f); });
  time_op("rope_k", 0, 2 * e2 * T * Hkv * D, [&] { ops::rope_forward(be, k, positions, inv_freq, 1.0f); });
  time_op("kv_cache_write", 0, 4 * e2 * T * Hkv * D,
          [&] { ops::kv_cache_write(be, kc, vc, k, v, positions); });
  const double attn_flops = 4.0 * D * Hq * (static_cast<double>(T) * (context - T) + 0.5 * T * T);
  time_op("attention", attn_flops, 0, [&] {
    ops::attention_forward(be, attn, q, kc, vc, q_indptr, paged, {1, static_cast<int32_t>(T), static_cast<int32_t>(context)},
                           0.125f);
  });
  time_op("o_proj", 2.0 * T * H * Hq * D, 0, [&] { ops::linear_forward(be, out, attn.view().view({T, Hq * D}), wo); });
  time_op("add_rmsnorm_2", 0, T * H * (4.0 * 2 + e2 * 2), [&] { ops::add_rmsnorm_forward(be, normed, resid, out, w_norm, 1e-5f); });
  time_op("gate_up_proj", 2.0 * T * H * 2 * I, 0, [&] { ops::linear_forward(be, gu, normed, wgu); });
  time_op("swiglu", 0, e2 * T * 3 * I, [&] { ops::swiglu_forward(be, act, gu); });
  time_op("down_proj", 2.0 * T * I * H, 0, [&] { ops::linear_forward(be, out, act, wd); });
  res["layer_us"] = total_us;
  res["layers"] = c.num_hidden_layers;
  res["model_ms_excluding_embedding_and_head"] = total_us * c.num_hidden_layers / 1e3;
  std::cout << res.dump(1) << std::endl;
  return 0;
}
