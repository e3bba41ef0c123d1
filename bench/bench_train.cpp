// Training throughput: forward + backward + AdamW steps of a model built with seeded random weights
// from a Hugging Face config.json, on a batch of random token ids (every next token labelled).
// Prints one JSON object with ms/step, tokens/s and MFU counted like reference/hf_bench.py
// (6 * params + 6 * layers * hidden * seq FLOPs per token, against 989 TFLOP/s dense bf16), plus the
// per-phase split of one profiled step (synchronised between phases), and the memory of kiln's
// caching allocator (CUDA): what the model and optimizer hold before the first step and the peak
// over the run, in bytes. --recompute keeps only each layer's input in the forward and recomputes
// the layer in the backward (TrainModelOptions::recompute); comparing runs with and without it gives
// its cost in tokens/s and its saving in peak memory. --collectives nccl runs the steps through the
// data-parallel path with NCCL over one rank (the gradients all-reduced, or with --zero 1|2
// reduce-scattered and the weights all-gathered): against a run without it, the cost of the
// collectives on one GPU. A step that runs out of memory still prints the JSON object, with "error"
// and the peak reached. Steps go through the Trainer, as kiln train's do. Under mpirun -np N (with
// --collectives nccl or mpi) every rank trains --batch of its own on the GPU of its local rank, the
// gradients reduced as kiln train reduces them; rank 0 prints, tok_s counting every rank's tokens.
// Usage: bench_train --config bench/configs/llama-1b-shape.config.json [--batch 8x2048] [--steps 5]
//                    [--warmup 3] [--device cuda] [--recompute] [--optimizer adamw|muon]
//                    [--collectives none|nccl] [--zero 0|1|2]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "kernels/rng.h"
#include "model/config.h"
#include "backend/collectives.h"
#include "train/train_model.h"
#include "train/trainer.h"

using namespace kiln;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "bench_train: error: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln training throughput benchmark"};
  std::string config_path, batch_shape = "8x2048", device_name = "cuda";
  int steps = 5, warmup = 3;
  bool recompute = false;
  std::string optimizer_name = "adamw", collectives_name = "none";
  int zero = 0;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--batch", batch_shape, "B x S tokens per step");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--device", device_name, "cpu or cuda");
  app.add_flag("--recompute", recompute, "recompute each layer's activations in the backward");
  app.add_option("--optimizer", optimizer_name, "adamw or muon");
  app.add_option("--collectives", collectives_name, "none, or nccl (one rank: the data-parallel path's cost)");
  app.add_option("--zero", zero, "ZeRO stage with --collectives nccl");
  CLI11_PARSE(app, argc, argv);
  int B = 0, S = 0;
  if (std::sscanf(batch_shape.c_str(), "%dx%d", &B, &S) != 2 || B <= 0 || S <= 0)
    return fail(invalid_argument("--batch must look like 8x2048"));

  Result<ModelConfig> config = load_model_config_file(config_path);
  if (!config.ok()) return fail(config.status());
  Result<Device> device = parse_device(device_name);
  if (!device.ok()) return fail(device.status());
  Result<WorldInfo> world = world_from_environment();
  if (!world.ok()) return fail(world.status());
  if (world->size > 1 && collectives_name == "none")
    return fail(invalid_argument("under mpirun, give --collectives nccl or mpi"));
  if (world->size > 1 && device->is_cuda() && device_name == "cuda") device->index = world->local_rank;
  Result<std::unique_ptr<Backend>> backend = make_backend(*device);
  if (!backend.ok()) return fail(backend.status());
  Backend& be = **backend;
  TrainModelOptions options;
  options.random_seed = 1234;
  options.recompute = recompute;
  options.parameter_shards = zero > 0 ? world->size : 1;
  const double t0 = now_s();
  Result<std::unique_ptr<TrainModel>> model = TrainModel::random(be, *config, options);
  if (!model.ok()) return fail(model.status());
  TrainModel& m = **model;
  OptimizerOptions opt;
  opt.lr = 1e-4f;
  if (optimizer_name == "muon")
    opt.kind = OptimizerOptions::Kind::muon;
  else if (optimizer_name != "adamw")
    return fail(invalid_argument("--optimizer must be adamw or muon"));
  std::unique_ptr<Collectives> collectives;
  if (collectives_name == "nccl" || collectives_name == "mpi") {
    Result<std::unique_ptr<Collectives>> c = make_collectives(*world, 600.0);
    if (!c.ok()) return fail(c.status());
    collectives = std::move(*c);
    if (collectives_name == "nccl") {
      Result<std::unique_ptr<Collectives>> nccl = make_nccl_collectives(be, collectives, 600.0);
      if (!nccl.ok()) return fail(nccl.status());
      collectives = std::move(*nccl);
    }
  } else if (collectives_name != "none") {
    return fail(invalid_argument("--collectives must be none, nccl or mpi"));
  }
  TrainerOptions topt;
  topt.optimizer = opt;
  topt.collectives = collectives.get();
  topt.zero = zero;
  Result<Trainer> trainer = Trainer::create(be, m, topt);
  if (!trainer.ok()) return fail(trainer.status());
  const double init_s = now_s() - t0;
  if (Status s = be.synchronize(); !s.ok()) return fail(s);
  const int64_t resident_bytes = be.allocator_bytes().first;  // parameters, gradients, optimizer state

  auto run_step = [&](uint64_t seed, bool profile, PhaseTimes* phases, double* opt_ms) -> Status {
    HostBatch hb;
    hb.batch = B;
    hb.seq_len = S;
    for (int64_t i = 0; i < int64_t(B) * S; ++i) {
      hb.ids.push_back(static_cast<int32_t>(
          rng::splitmix64((seed + 1000 * static_cast<uint64_t>(world->rank)) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i)) %
          config->vocab_size));
      hb.positions.push_back(static_cast<int32_t>(i % S));
    }
    hb.targets.assign(hb.ids.size(), -100);
    for (int64_t i = 0; i < int64_t(B) * S; ++i)
      if (i % S != S - 1) hb.targets[i] = hb.ids[i + 1];
    KILN_ASSIGN_OR_RETURN(StepReport r, trainer->step({hb}));
    if (profile) {  // the rest of the step: the upload, the reduction and the optimizer update
      *phases = m.last_phase_times();
      *opt_ms = r.seconds * 1e3 - phases->forward_ms - phases->head_ms - phases->backward_ms;
    }
    return Status::Ok();
  };
  PhaseTimes phases;
  double opt_ms = 0;
  nlohmann::json out = {{"system", "kiln"},
                        {"config", config_path},
                        {"device", be.device().str()},
                        {"params", m.params().parameter_count()},
                        {"init_seconds", init_s}};
  // Device memory held by kiln's caching allocator (CUDA; zeros on the CPU): at its peak over the
  // whole run, and before the first step.
  auto memory = [&](nlohmann::json& train) {
    const int64_t peak = be.allocator_bytes().second;
    train["peak_mem_bytes"] = peak;
    train["peak_mem_gb"] = static_cast<double>(peak) / 1e9;
    train["resident_bytes_before_steps"] = resident_bytes;
  };
  auto steps_failed = [&](const Status& s) {
    nlohmann::json train = {{"batch", batch_shape}, {"recompute", recompute}, {"error", s.message()}};
    memory(train);
    out["train"] = train;
    std::cout << out.dump(1) << std::endl;
    return fail(s);
  };
  for (int i = 0; i < warmup; ++i)
    if (Status s = run_step(100 + i, false, nullptr, nullptr); !s.ok()) return steps_failed(s);
  if (Status s = be.synchronize(); !s.ok()) return fail(s);
  const double start = now_s();
  for (int i = 0; i < steps; ++i)
    if (Status s = run_step(200 + i, false, nullptr, nullptr); !s.ok()) return steps_failed(s);
  if (Status s = be.synchronize(); !s.ok()) return fail(s);
  const double ms = (now_s() - start) * 1e3 / steps;
  // One more step with the phases synchronised and timed.
  m.set_profile_phases(true);
  if (Status s = run_step(300, true, &phases, &opt_ms); !s.ok()) return steps_failed(s);
  const double params = static_cast<double>(m.params().parameter_count());
  const double flops_per_token = 6 * params + 6.0 * config->num_hidden_layers * config->hidden_size * S;
  const double tok_s = double(B) * S * world->size * 1000.0 / ms;
  nlohmann::json train = {{"batch", batch_shape},
                          {"ranks", world->size},
                          {"recompute", recompute},
                          {"optimizer", optimizer_name},
                          {"collectives", collectives_name},
                          {"zero", zero},
                          {"ms_per_step", ms},
                          {"tok_s", tok_s},
                          {"mfu_vs_989", tok_s / world->size * flops_per_token / 989e12},
                          {"phases_ms",
                           {{"forward", phases.forward_ms},
                            {"head_loss", phases.head_ms},
                            {"backward", phases.backward_ms},
                            {"upload_reduce_optimizer", opt_ms}}}};
  memory(train);
  out["train"] = train;
  if (world->rank == 0) std::cout << out.dump(1) << std::endl;
  return 0;
}
