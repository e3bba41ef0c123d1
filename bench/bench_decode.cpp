// B=1 generation benchmark: prefill time and greedy decode ms/token at several context lengths, for
// a model built with seeded random weights from a Hugging Face config.json. Prints one JSON object.
// Usage: bench_decode --config bench/configs/astrai-1b-shape.config.json [--contexts 1024,8192,30000]
//                     [--steps 64] [--device cuda] [--no-graphs]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "infer/generator.h"
#include "kernels/rng.h"
#include "model/config.h"
#include "model/transformer.h"

using namespace kiln;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "bench_decode: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln B=1 prefill/decode benchmark"};
  std::string config_path, contexts = "1024,8192,30000", device_name = "cuda";
  int steps = 64, prefill_reps = 3;
  bool no_graphs = false;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--contexts", contexts, "context lengths, comma separated");
  app.add_option("--steps", steps, "timed decode steps per context");
  app.add_option("--prefill-reps", prefill_reps, "timed prefills per context (median)");
  app.add_option("--device", device_name, "cpu or cuda");
  app.add_flag("--no-graphs", no_graphs, "decode eagerly, without CUDA graph replay");
  CLI11_PARSE(app, argc, argv);

  Result<ModelConfig> config = load_model_config_file(config_path);
  if (!config.ok()) return fail(config.status());
  Result<Device> device = parse_device(device_name);
  if (!device.ok()) return fail(device.status());
  Result<std::unique_ptr<Backend>> backend = make_backend(*device);
  if (!backend.ok()) return fail(backend.status());
  double t0 = now_s();
  Result<std::unique_ptr<Transformer>> model = Transformer::random(**backend, *config, 1234);
  if (!model.ok()) return fail(model.status());
  nlohmann::json out = {{"system", "kiln"},
                        {"config", config_path},
                        {"device", (*backend)->device().str()},
                        {"dtype", dtype_name((*model)->compute_dtype())},
                        {"params", (*model)->parameter_count()},
                        {"init_seconds", now_s() - t0},
                        {"cuda_graphs", !no_graphs}};
  std::vector<int> ctxs;
  {
    std::stringstream ss(contexts);
    std::string item;
    while (std::getline(ss, item, ',')) ctxs.push_back(std::stoi(item));
  }
  for (int ctx : ctxs) {
    std::vector<int32_t> prompt(ctx);
    for (int i = 0; i < ctx; ++i)
      prompt[i] = static_cast<int32_t>(rng::uniform(77, static_cast<uint64_t>(i)) * config->vocab_size);
    Result<std::unique_ptr<Generator>> gen = Generator::create(**model, ctx + steps + 16);
    if (!gen.ok()) return fail(gen.status());
    Generator& g = **gen;
    // Prefill: median of repeats (each starts from an empty cache; the first is a warm-up).
    std::vector<double> prefill_ms;
    for (int r = 0; r <= prefill_reps; ++r) {
      double a = now_s();
      Status st = g.prefill(prompt);
      if (!st.ok()) return fail(st);
      double ms = (now_s() - a) * 1e3;
      if (r > 0) prefill_ms.push_back(ms);
    }
    std::sort(prefill_ms.begin(), prefill_ms.end());
    // Decode: warm-up steps capture the graphs, then timed steps (each includes sampling and the
    // 4-byte copy of the token back to the host).
    for (int i = 0; i < 4; ++i) {
      Status st = g.decode_step();
      if (!st.ok()) return fail(st);
    }
    double a = now_s();
    for (int i = 0; i < steps; ++i) {
      Status st = g.decode_step();
      if (!st.ok()) return fail(st);
    }
    double decode_ms = (now_s() - a) * 1e3 / steps;
    out["prefill_ms"][std::to_string(ctx)] = prefill_ms[prefill_ms.size() / 2];
    out["decode_ms"][std::to_string(ctx)] = decode_ms;
    std::fprintf(stderr, "ctx %d: prefill %.2f ms, decode %.3f ms/token\n", ctx, prefill_ms[prefill_ms.size() / 2],
                 decode_ms);
  }
  std::cout << out.dump(1) << std::endl;
  return 0;
}
