// RL benchmark: (1) the in-process weight update, from a committed optimizer step to the engine's
// acknowledgement, for an engine with its own copy of the weights (a device-to-device copy of the
// compute weights) and for one that borrows the trainer's (zero copy); (2) a synchronous GRPO loop
// (rl/loop.h) on seeded random weights: prompts of random token ids, a reward command, and the
// split of each step's time between generation, training and the update, with rollout and training
// tokens per second. Prints one JSON object. --remote (under mpirun -np 2) runs the loop with its
// engine in the second process (infer/remote_engine.h: the weights travel at every update, GPU to
// GPU over NCCL between two GPUs, else as MPI messages), skipping (1); against a run without it,
// what moving the engine out of the trainer's process costs. With --device cuda the engine takes
// its rank's local GPU: its own on a two-GPU host; with one GPU, give --device cuda:0 to share it.
// Usage: bench_rl --config bench/configs/llama-1b-shape.config.json [--device cuda] [--steps 4]
//                 [--group-size 8] [--prompts-per-step 16] [--prompt-len 256] [--max-tokens 256]
//                 [--remote [--weight-transport auto|nccl|mpi]]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "backend/collectives.h"
#include "infer/engine.h"
#include "kernels/rng.h"
#include "model/config.h"
#include "rl/loop.h"
#include "train/trainer.h"

using namespace kiln;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "bench_rl: error: %s\n", s.message().c_str());
  return 1;
}

// Update latency: `updates` optimizer steps, each followed by update_weights; seconds from the
// step's return (committed) to the acknowledgement.
Result<nlohmann::json> update_latency(const ModelConfig& config, Device device, int updates) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> train_be, make_backend(device));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> engine_be, make_backend(device));
  TrainModelOptions tmo;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TrainModel> model, TrainModel::random(*train_be, config, tmo));
  TrainerOptions to;
  to.optimizer.lr = 1e-6f;
  KILN_ASSIGN_OR_RETURN(Trainer trainer, Trainer::create(*train_be, *model, to));
  const ModelWeights source = model->params().compute_weights();
  HostBatch hb;
  hb.batch = 1;
  hb.seq_len = 128;
  for (int i = 0; i < hb.seq_len; ++i) {
    hb.ids.push_back(static_cast<int32_t>(rng::uniform(7, i) * (config.vocab_size - 1)));
    hb.positions.push_back(i);
  }
  hb.targets.assign(hb.ids.begin() + 1, hb.ids.end());
  hb.targets.push_back(-100);
  nlohmann::json out;
  for (const bool zero_copy : {false, true}) {
    std::shared_ptr<const Transformer> served;
    if (zero_copy) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> m, Transformer::borrow(*engine_be, config, source));
      served = std::move(m);
    } else {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> m, Transformer::random(*engine_be, config, 1));
      served = std::move(m);
    }
    EngineOptions eo;
    eo.kv_tokens = 4096;
    eo.max_running = 8;
    eo.max_step_tokens = 512;
    eo.policy_version = trainer.policy_version();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(served, nullptr, {}, eo));
    std::vector<double> acks, copies;
    for (int u = 0; u < updates; ++u) {
      KILN_ASSIGN_OR_RETURN(StepReport r, trainer.step({hb}));
      const auto t0 = Clock::now();
      KILN_ASSIGN_OR_RETURN(WeightUpdateAck ack, engine->update_weights(WeightSource::in_process(source, *train_be),
                                                                         r.policy_version, WeightUpdateMode::sync));
      acks.push_back(since(t0));
      copies.push_back(ack.copy_seconds);
      if (ack.zero_copy != zero_copy) return Status(StatusCode::internal, "unexpected zero-copy mode");
    }
    std::sort(acks.begin(), acks.end());
    std::sort(copies.begin(), copies.end());
    out[zero_copy ? "zero_copy" : "copy"] = {{"ack_ms_median", 1e3 * acks[acks.size() / 2]},
                                             {"ack_ms_max", 1e3 * acks.back()},
                                             {"copy_ms_median", 1e3 * copies[copies.size() / 2]},
                                             {"updates", updates}};
  }
  out["weight_bytes"] = model->params().parameter_count() * (device.is_cuda() ? 2 : 4);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln RL benchmark: weight-update latency and a sync GRPO loop's time split"};
  std::string config_path, device_name = "cuda", work = "/tmp/kiln-bench-rl";
  int steps = 4, group_size = 8, prompts_per_step = 16, prompt_len = 256, max_tokens = 256, updates = 7;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--device", device_name, "cpu or cuda");
  app.add_option("--steps", steps, "GRPO steps (the first is a warm-up, left out of the averages)");
  app.add_option("--group-size", group_size, "completions per prompt");
  app.add_option("--prompts-per-step", prompts_per_step, "prompts per step");
  app.add_option("--prompt-len", prompt_len, "prompt tokens");
  app.add_option("--max-tokens", max_tokens, "completion tokens at most (random weights seldom stop earlier)");
  app.add_option("--updates", updates, "weight updates timed per mode");
  app.add_option("--work", work, "scratch folder");
  bool remote = false;
  app.add_flag("--remote", remote, "the engine in a second process (mpirun -np 2; rank 1 serves it)");
  std::string weight_transport = "auto";
  app.add_option("--weight-transport", weight_transport, "with --remote: auto, nccl or mpi");
  CLI11_PARSE(app, argc, argv);
  std::unique_ptr<Collectives> link;
  if (remote) {
    Result<WorldInfo> world = world_from_environment();
    if (!world.ok()) return fail(world.status());
    if (world->size != 2) return fail(invalid_argument("--remote runs under mpirun -np 2"));
    Result<std::unique_ptr<Collectives>> c = make_collectives(*world, 600.0);
    if (!c.ok()) return fail(c.status());
    link = std::move(*c);
    if (link->rank() == 1) {  // the engine's process: what serve_rl_engine reads of the run's options
      rl::RlOptions engine_side;
      engine_side.random_config = config_path;
      // its own GPU where there are several (local rank 1), else the trainer's
      engine_side.device = device_name == "cuda" ? "cuda:" + std::to_string(world->local_rank) : device_name;
      Status served = rl::serve_rl_engine(engine_side, *link);
      return served.ok() ? 0 : fail(served);
    }
  }
  Result<ModelConfig> config = load_model_config_file(config_path);
  if (!config.ok()) return fail(config.status());
  Result<Device> device = parse_device(device_name);
  if (!device.ok()) return fail(device.status());
  nlohmann::json report = {{"bench", "rl"}, {"config", config_path}, {"device", device_name}, {"remote_engine", remote}};
  if (!remote) {
    Result<nlohmann::json> latency = update_latency(*config, *device, updates);
    if (!latency.ok()) return fail(latency.status());
    report["update"] = *latency;
  }

  std::filesystem::create_directories(work);
  const std::string prompts = work + "/prompts.jsonl";
  {
    std::ofstream out(prompts);
    for (int p = 0; p < prompts_per_step * steps; ++p) {
      std::vector<int32_t> ids;
      for (int i = 0; i < prompt_len; ++i)
        ids.push_back(3 + static_cast<int32_t>(rng::uniform(1000 + p, i) * (config->vocab_size - 4)));
      out << nlohmann::json({{"prompt_ids", ids}}).dump() << "\n";
    }
  }
  rl::RlOptions o;
  o.random_config = config_path;
  o.prompts = prompts;
  o.output = work + "/run";
  o.device = device_name;
  o.steps = steps;
  o.group_size = group_size;
  o.prompts_per_step = prompts_per_step;
  o.max_tokens = max_tokens;
  o.micro_batch = 8;
  o.final_checkpoint = false;
  o.trainer.optimizer.lr = 1e-6f;
  o.reward.kind = "command";
  o.reward.command = "awk '{print NR % 2}'";
  o.engine.max_running = group_size * prompts_per_step;
  o.engine.kv_memory_fraction = 0.3;
  if (remote) {
    o.engine_ranks = {1};
    o.link = link.get();
    o.weight_transport = weight_transport;
  }
  std::vector<rl::RlStepReport> reports;
  rl::RlEvents ev;
  ev.step = [&](const rl::RlStepReport& r) { reports.push_back(r); };
  // The run's notes (with --remote: which transport the weights take) on stderr.
  ev.info = [](const std::string& msg) { std::fprintf(stderr, "bench_rl: %s\n", msg.c_str()); };
  Result<rl::RlSummary> s = rl::run_rl(o, ev);
  if (!s.ok()) return fail(s.status());
  double gen = 0, train = 0, update = 0, ack = 0, gen_tokens = 0, train_tokens = 0;
  int n = 0;
  for (size_t i = 1; i < reports.size(); ++i, ++n) {
    gen += reports[i].generate_seconds;
    train += reports[i].train_seconds;
    update += reports[i].update_seconds;
    ack += reports[i].ack_seconds;
    gen_tokens += static_cast<double>(reports[i].tokens_generated);
    train_tokens += static_cast<double>(reports[i].tokens_trained);
  }
  if (n == 0) return fail(invalid_argument("--steps must be at least 2"));
  const double total = gen + train + update;
  report["grpo"] = {{"steps_timed", n},
                    {"samples_per_step", group_size * prompts_per_step},
                    {"prompt_len", prompt_len},
                    {"max_tokens", max_tokens},
                    {"step_seconds", total / n},
                    {"generate_seconds", gen / n},
                    {"train_seconds", train / n},
                    {"update_seconds", update / n},
                    {"engine_ack_seconds", ack / n},
                    {"generate_fraction", gen / total},
                    {"train_fraction", train / total},
                    {"update_fraction", update / total},
                    {"rollout_tokens_per_s", gen_tokens / gen},
                    {"train_tokens_per_s", train_tokens / train},
                    {"cross_version_hits", s->cross_version_hits}};
  std::cout << report.dump(2) << std::endl;
  return 0;
}
