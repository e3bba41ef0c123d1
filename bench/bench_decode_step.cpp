// bench_decode_step: one decode step of B requests at a context of C tokens on a model of a config
// with random weights (the transformer's forward, as the engine runs it), replayed from a CUDA graph,
// with programmatic dependent launch (CudaBackend::programmatic_launch) and with every kernel
// launched after the previous one has finished, in the same run. Per run: ms per step, the bytes a
// step must read (weights and KV), the bandwidth that makes, and the floor at 4.3 TB/s.
// By default B requests on 16-row pages with the context as the attention bound (the figures of
// docs/perf-notes.md); --page-size 128 --engine-bound runs the step as the engine's decode graph on
// CUDA does (its default page size; the bound its graph is captured for, infer/executor.h);
// --greedy also picks every row's greedy token in the graph, as the engine's greedy decode steps do
// (the head's own argmax where Transformer::head_takes_greedy says so, else the sampler's argmax).
// With KILN_DECODE_STEP_KERNEL=1 KILN_DECODE_STEP_TRACE=1 a one-request step's runs also give the
// decode-step kernel's timeline (decode_step_timeline).
// Usage: bench_decode_step --config CFG [--batches 1,8] [--contexts 1024,8192,30000] [--iters 200]
//        [--page-size 16] [--engine-bound] [--greedy]
// Prints one JSON object.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#ifdef KILN_WITH_CUDA
#include "backend/cuda_backend.h"
#endif
#include "infer/executor.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/transformer.h"

namespace kiln {
namespace {

#ifdef KILN_WITH_CUDA
std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

struct StepInputs {
  std::vector<TensorBuffer> buffers;
  ForwardBatch batch;
  TensorBuffer params, tokens;  // --greedy: B default (greedy) sampling rows and the picked tokens
};

// B requests of C tokens each on consecutive pages, the query at position C - 1.
Result<StepInputs> make_step(Backend& be, int32_t B, int32_t C, int32_t page_size, int32_t bound, int64_t vocab) {
  const int32_t pages = (C + page_size - 1) / page_size;
  std::vector<int32_t> ids, positions, slots, q_indptr = {0}, page_indptr = {0}, page_indices, last, rows;
  for (int32_t b = 0; b < B; ++b) {
    ids.push_back(static_cast<int32_t>((17 + 7919 * b) % vocab));
    positions.push_back(C - 1);
    slots.push_back((b * pages + (C - 1) / page_size) * page_size + (C - 1) % page_size);
    q_indptr.push_back(b + 1);
    for (int32_t p = 0; p < pages; ++p) page_indices.push_back(b * pages + p);
    page_indptr.push_back((b + 1) * pages);
    last.push_back(C - (pages - 1) * page_size);
    rows.push_back(b);
  }
  StepInputs s;
  for (const std::vector<int32_t>* v : {&ids, &positions, &slots, &q_indptr, &page_indptr, &page_indices, &last, &rows}) {
    TensorBuffer host = host_empty({static_cast<int64_t>(v->size())}, DType::i32);
    std::copy(v->begin(), v->end(), host.ptr<int32_t>());
    KILN_ASSIGN_OR_RETURN(TensorBuffer dev, to_device(be, host));
    s.buffers.push_back(std::move(dev));
  }
  ForwardBatch& f = s.batch;
  f.ids = s.buffers[0], f.positions = s.buffers[1], f.slots = s.buffers[2], f.q_indptr = s.buffers[3];
  f.kv = PagedKV{s.buffers[4], s.buffers[5], s.buffers[6], page_size};
  f.logit_rows = s.buffers[7];
  f.logits_of_every_row = true;  // as the engine's decode steps
  f.bounds = {B, 1, bound};
  TensorBuffer params = host_empty({B, ops::kSamplingRowWords}, DType::i32);
  for (int32_t b = 0; b < B; ++b) reinterpret_cast<ops::SamplingRow*>(params.ptr<int32_t>())[b] = ops::SamplingRow{};
  KILN_ASSIGN_OR_RETURN(s.params, to_device(be, params));
  KILN_ASSIGN_OR_RETURN(s.tokens, empty(be, {B}, DType::i32));
  return s;
}

// One decode step: the forward, and with `greedy` the rows' tokens picked as the engine's
// forward_and_sample does for greedy rows (infer/executor.cpp).
void step(Backend& be, const Transformer& model, StepInputs& s, KVCache& cache, ForwardWorkspace& ws, bool greedy) {
  ForwardBatch batch = s.batch;
  const int64_t rows = batch.logit_rows.numel();
  const bool head_samples = greedy && model.head_takes_greedy(batch.ids.numel(), rows);
  if (head_samples) batch.greedy_tokens = s.tokens.view();
  const Tensor logits = model.forward(batch, cache, ws);
  if (!greedy || head_samples) return;
  ops::SamplingBatch sb;
  sb.logits = logits.rows(0, rows);
  sb.params = s.params.view();
  sb.tokens = s.tokens.view();
  sb.full = false;
  ops::sample(be, sb);
}

// With the decode-step kernel traced (KILN_DECODE_STEP_KERNEL=1 KILN_DECODE_STEP_TRACE=1): one eager
// step's timeline, per step kind (q/k/v, attention, merge, o, gate/up, down; then the head) the
// microseconds a layer spends from the end of the step before (its last block) to the end of this
// one (its last block), and of that the slowest block's own work (from its wait's end), averaged
// over the layers; the whole step's span. Null where the step did not run on that kernel.
nlohmann::json decode_step_timeline(Backend& be, const Transformer& model, StepInputs& s, KVCache& cache,
                                    ForwardWorkspace& ws, int blocks) {
  if (!ws.decode_step_trace.allocated() || !model.uses_decode_step_kernel(s.batch)) return nullptr;
  const int L = model.config().num_hidden_layers, steps = 6 * L + 1;
  be.zero(ws.decode_step_trace);
  step(be, model, s, cache, ws, false);
  const TensorBuffer host = to_host(be, ws.decode_step_trace.view().rows(0, static_cast<int64_t>(blocks) * steps * 2));
  const int64_t* t = host.ptr<int64_t>();
  std::vector<int64_t> ready_max(steps, 0), done_max(steps, 0), work_max(steps, 0);
  int64_t t0 = INT64_MAX;
  for (int b = 0; b < blocks; ++b)
    for (int k = 0; k < steps; ++k) {
      const int64_t ready = t[(b * steps + k) * 2], done = t[(b * steps + k) * 2 + 1];
      t0 = std::min(t0, ready);
      ready_max[k] = std::max(ready_max[k], ready);
      done_max[k] = std::max(done_max[k], done);
      work_max[k] = std::max(work_max[k], done - ready);
    }
  const char* names[] = {"qkv", "attention", "merge", "o", "gate_up", "down"};
  nlohmann::json out = {{"step_us", (done_max[steps - 1] - t0) * 1e-3}};
  for (int kind = 0; kind < 6; ++kind) {
    double span = 0, work = 0;
    for (int l = 0; l < L; ++l) {
      const int k = l * 6 + kind;
      span += (done_max[k] - (k == 0 ? t0 : done_max[k - 1])) * 1e-3;
      work += work_max[k] * 1e-3;
    }
    out[names[kind]] = {{"span_us_per_layer", span / L}, {"slowest_block_work_us_per_layer", work / L}};
  }
  out["head"] = {{"span_us", (done_max[steps - 1] - done_max[steps - 2]) * 1e-3},
                 {"slowest_block_work_us", work_max[steps - 1] * 1e-3}};
  return out;
}

// Milliseconds per replay of a graph of one step (step() above).
Result<double> time_graph(Backend& be, Transformer& model, StepInputs& s, KVCache& cache, ForwardWorkspace& ws,
                          int iters, bool greedy) {
  step(be, model, s, cache, ws, greedy);  // eagerly first: op scratch is sized outside the capture
  KILN_RETURN_IF_ERROR(be.synchronize());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CapturedWork> graph, be.capture([&] { step(be, model, s, cache, ws, greedy); }));
  for (int i = 0; i < 5; ++i) graph->replay();
  std::unique_ptr<Event> start = be.create_event(), stop = be.create_event();
  start->record();
  for (int i = 0; i < iters; ++i) graph->replay();
  stop->record();
  KILN_RETURN_IF_ERROR(stop->wait());
  KILN_RETURN_IF_ERROR(be.synchronize());
  return static_cast<double>(stop->elapsed_ms(*start)) / iters;
}
#endif

int run(int argc, char** argv) {
  CLI::App app{"bench_decode_step: one graph-replayed decode step, with and without programmatic launch"};
  std::string config_path, batches = "1,8", contexts = "1024,8192,30000";
  int iters = 200;
  int32_t page_size = 16;
  bool engine_bound = false;
  bool greedy = false;
  app.add_option("--config", config_path, "model config.json (random weights)")->required();
  app.add_option("--batches", batches, "requests per step, comma separated");
  app.add_option("--contexts", contexts, "context lengths, comma separated");
  app.add_option("--iters", iters, "graph replays timed per run");
  app.add_option("--page-size", page_size, "KV page rows (the engine's default on CUDA: 128)")->check(CLI::Range(1, 4096));
  app.add_flag("--engine-bound", engine_bound,
               "attention bound as the engine's decode graphs: powers of two from 1024 (default: the context)");
  app.add_flag("--greedy", greedy, "pick each row's greedy token in the step, as the engine's greedy steps do");
  CLI11_PARSE(app, argc, argv);
#ifndef KILN_WITH_CUDA
  return std::fprintf(stderr, "bench_decode_step: kiln was built without CUDA\n"), 1;
#else
  Result<ModelConfig> config = load_model_config_file(config_path);
  if (!config.ok()) return std::fprintf(stderr, "bench_decode_step: %s\n", config.status().message().c_str()), 1;
  Result<std::unique_ptr<Backend>> be = make_backend(Device::cuda(0));
  if (!be.ok()) return std::fprintf(stderr, "bench_decode_step: %s\n", be.status().message().c_str()), 1;
  Result<std::unique_ptr<Transformer>> model = Transformer::random(**be, *config, 1234);
  if (!model.ok()) return std::fprintf(stderr, "bench_decode_step: %s\n", model.status().message().c_str()), 1;
  Transformer& m = **model;
  const ModelConfig& c = m.config();
  const std::vector<int32_t> bs = parse_list(batches), cs = parse_list(contexts);
  const int32_t max_b = *std::max_element(bs.begin(), bs.end()), max_c = *std::max_element(cs.begin(), cs.end());
  const int32_t pages = (max_c + page_size - 1) / page_size;
  Result<KVCache> cache = m.make_kv_cache(max_b * pages * page_size);
  Result<ForwardWorkspace> ws = m.make_workspace(max_b, max_b);
  if (!cache.ok() || !ws.ok()) return std::fprintf(stderr, "bench_decode_step: out of memory\n"), 1;
  for (size_t l = 0; l < cache->k.size(); ++l) {
    ops::fill_normal(**be, cache->k[l], 1.0f, 10 + l);
    ops::fill_normal(**be, cache->v[l], 1.0f, 20 + l);
  }
  // Bytes a step reads: every weight but the embedding table (B rows of it), and the KV.
  const int64_t streamed_params = m.parameter_count() - (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size);
  const double weight_gb = 2.0 * static_cast<double>(streamed_params) * 1e-9;
  nlohmann::json out = {{"config", config_path}, {"runs", nlohmann::json::array()}};
  for (int32_t C : cs)
    for (int32_t B : bs) {
      const int32_t bound = engine_bound ? decode_context_bucket(C, static_cast<int32_t>(c.max_position_embeddings)) : C;
      Result<StepInputs> step = make_step(**be, B, C, page_size, std::max(bound, C), c.vocab_size);
      if (!step.ok()) return std::fprintf(stderr, "bench_decode_step: %s\n", step.status().message().c_str()), 1;
      const double kv_gb = 4.0 * B * static_cast<double>(C) * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 1e-9;
      nlohmann::json r = {{"batch", B},         {"context", C},         {"page_size", page_size},
                          {"kv_bound", std::max(bound, C)}, {"weight_gb", weight_gb}, {"kv_gb", kv_gb},
                          {"greedy", greedy}};
      // Programmatic launch as configured (on unless KILN_PDL=0), then off.
      CudaBackend& cbe = static_cast<CudaBackend&>(**be);
      const bool programmatic = cbe.programmatic_launch();
      for (const char* variant : {"layers", "layers_serial"}) {
        cbe.set_programmatic_launch(variant == std::string("layers") && programmatic);
        Result<double> ms = time_graph(**be, m, *step, *cache, *ws, iters, greedy);
        cbe.set_programmatic_launch(programmatic);
        if (!ms.ok()) return std::fprintf(stderr, "bench_decode_step: %s\n", ms.status().message().c_str()), 1;
        r[std::string(variant) + "_ms"] = *ms;
        r[std::string(variant) + "_tb_per_s"] = (weight_gb + kv_gb) / *ms;
      }
      r["layers_over_serial"] = r["layers_ms"].get<double>() / r["layers_serial_ms"].get<double>();
      r["decode_step_timeline"] = decode_step_timeline(**be, m, *step, *cache, *ws, cbe.multiprocessor_count());
      r["floor_ms_at_4.3_tb_per_s"] = (weight_gb + kv_gb) / 4.3;
      out["runs"].push_back(r);
      std::fprintf(stderr, "%s\n", r.dump().c_str());
    }
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
#endif
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::run(argc, argv); }
