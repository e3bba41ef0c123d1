// kiln train: trains a Hugging Face checkpoint on preprocessed shards or pre-tokenized JSONL and
// writes the result back as a Hugging Face checkpoint. The run (data, objective, schedule,
// checkpoints, resume, evaluation) is the training layer's (train/run.h); this file parses flags,
// reports progress and turns SIGTERM / SIGINT into a checkpoint and a clean exit.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/collectives.h"
#include "cli/common.h"
#include "cli/optimizer_flags.h"
#include "cli/progress.h"
#include "cli/stop_signal.h"
#include "core/plural.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/run.h"
#include "train/schedule.h"
#include "train/train_model.h"
#include "train/trainer.h"

namespace kiln::cli {
namespace {

struct TrainFlags {
  std::string model_dir, data, output, device = "cpu";
  int64_t steps = 0;  // 0: one pass over the data
  int32_t batch_size = 1, grad_accum = 1;
  float label_smoothing = 0.0f;
  OptimizerFlags optim;
  std::string no_decay = kDefaultNoDecay;
  std::string save_dtype;  // empty: the source checkpoint's dtype
  bool shuffle = false;
  std::string seed = "0";  // parsed (range-checked) by run_train
  std::string val_data, objective, objective_kwargs, resume, tensorboard;
  int64_t eval_every = 0, eval_rows = 0, save_every = 0;
  int32_t keep_last = 0;
  double peak_tflops = 989.0;  // H100 / H200 dense bf16
  bool recompute = false;
  double collective_timeout = 600.0;
  int32_t zero = 0;
  std::string collectives = "auto";
};

Result<DType> parse_save_dtype(const std::string& name, DType source) {
  if (name.empty()) return source;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16") return DType::f16;
  return invalid_argument("--save-dtype must be f32, bf16 or f16 (got '" + name + "')");
}

// The flags as the run records them in checkpoints (keys: the long flag names with '_').
nlohmann::json resolved_config(const TrainFlags& f) {
  nlohmann::json c = {{"model", f.model_dir},         {"data", f.data},
          {"val_data", f.val_data},       {"output", f.output},
          {"device", f.device},           {"steps", f.steps},
          {"batch_size", f.batch_size},   {"grad_accum", f.grad_accum},
          {"no_decay", f.no_decay},
          {"label_smoothing", f.label_smoothing},
          {"shuffle", f.shuffle},         {"seed", f.seed},
          {"save_dtype", f.save_dtype},   {"objective", f.objective},
          {"objective_kwargs", f.objective_kwargs}, {"eval_every", f.eval_every},
          {"eval_rows", f.eval_rows},     {"save_every", f.save_every},
          {"keep_last", f.keep_last},     {"resume", f.resume},
          {"peak_tflops", f.peak_tflops}, {"tensorboard", f.tensorboard},
          {"recompute", f.recompute},     {"zero", f.zero}};
  f.optim.record(c);
  return c;
}

int train_ranks(const TrainFlags& f, std::unique_ptr<Collectives>& coll, const WorldInfo& world);

// Data parallel when a launcher started several processes (mpirun -np N): every rank trains on its
// part of each batch (train/run.h), on the GPU of its local rank with --device cuda.
int run_train(const TrainFlags& f) {
  Result<WorldInfo> world = world_from_environment();
  if (!world.ok()) return fail(world.status());
  if (!(f.collective_timeout > 0.0)) return fail(invalid_argument("--collective-timeout must be > 0 seconds"));
  Result<std::unique_ptr<Collectives>> coll = make_collectives(*world, f.collective_timeout);
  if (!coll.ok()) return fail(coll.status());
  if (f.collectives != "auto" && f.collectives != "mpi" && f.collectives != "nccl")
    return fail(invalid_argument("--collectives must be auto, mpi or nccl (got '" + f.collectives + "')"));
  const int code = train_ranks(f, *coll, *world);
  if (code != 0 && world->size > 1) (*coll)->abort_all(code);  // the others would wait for this rank
  return code;
}

int train_ranks(const TrainFlags& f, std::unique_ptr<Collectives>& collectives, const WorldInfo& world) {
  const bool writer = world.rank == 0;
  // Errors name the rank in a run of several.
  auto fail = [&](const Status& s) {
    return cli::fail(world.size > 1 ? Status(s.code(), "rank " + std::to_string(world.rank) + ": " + s.message()) : s);
  };
  Result<uint64_t> seed = parse_u64(f.seed, "--seed");
  if (!seed.ok()) return fail(seed.status());
  if (!(f.label_smoothing >= 0.0f && f.label_smoothing <= 1.0f))
    return fail(invalid_argument("--label-smoothing must be in [0, 1]"));
  if (f.keep_last < 0) return fail(invalid_argument("--keep-last must be >= 0"));
  if (f.zero < 0 || f.zero > 2) return fail(invalid_argument("--zero must be 0, 1 or 2"));
  Result<TrainerOptions> trainer = f.optim.resolve();
  if (!trainer.ok()) return fail(trainer.status());
  Result<Device> device = parse_device(f.device);
  if (!device.ok()) return fail(device.status());
  if (world.size > 1 && device->is_cuda() && f.device == "cuda") device->index = world.local_rank;  // one GPU per rank
  Result<std::unique_ptr<Backend>> backend = make_backend(*device);
  if (!backend.ok()) return fail(backend.status());
  Backend& be = **backend;
  // NCCL for device tensors: by default with several ranks on CUDA; asked for, also with one rank.
  const bool nccl = f.collectives == "nccl" || (f.collectives == "auto" && device->is_cuda() && world.size > 1);
  if (nccl) {
    Result<std::unique_ptr<Collectives>> c = make_nccl_collectives(be, collectives, f.collective_timeout);
    if (!c.ok()) return fail(c.status());
    collectives = std::move(*c);
  }
  Collectives& coll = *collectives;

  TrainModelOptions model_options;
  model_options.no_decay = f.no_decay;
  model_options.label_smoothing = f.label_smoothing;
  model_options.recompute = f.recompute;
  model_options.parameter_shards = f.zero > 0 ? world.size : 1;
  Result<std::unique_ptr<TrainModel>> model = TrainModel::load(be, f.model_dir, model_options);
  if (!model.ok()) return fail(model.status());
  TrainModel& m = **model;
  Result<DType> save_dtype = parse_save_dtype(f.save_dtype, m.config().dtype);
  if (!save_dtype.ok()) return fail(save_dtype.status());

  RunOptions ro;
  ro.model_dir = f.model_dir;
  ro.data = f.data;
  ro.val_data = f.val_data;
  ro.output = f.output;
  ro.steps = f.steps;
  ro.batch_size = f.batch_size;
  ro.grad_accum = f.grad_accum;
  ro.shuffle = f.shuffle;
  ro.seed = *seed;
  ro.objective = f.objective;
  ro.objective_kwargs = f.objective_kwargs;
  ro.trainer = *trainer;
  ro.trainer.collectives = &coll;
  ro.trainer.zero = f.zero;
  ro.eval_every = f.eval_every;
  ro.eval_rows = f.eval_rows;
  ro.save_every = f.save_every;
  ro.keep_last = f.keep_last;
  ro.resume = f.resume;
  ro.save_dtype = *save_dtype;
  ro.peak_flops = device->is_cuda() ? f.peak_tflops * 1e12 : 0.0;
  ro.tensorboard = f.tensorboard;
  ro.config = resolved_config(f);

  if (writer)
    std::fprintf(stderr, "kiln: training %s (%s, %s%s): %d x %s per step, %s lr %g (%s schedule), %s without weight decay\n",
                 f.model_dir.c_str(), count_of(m.params().parameter_count(), "parameter").c_str(), f.device.c_str(),
                 std::strcmp(coll.transport(), "none") != 0
                     ? (", data parallel over " + count_of(world.size, "rank") + " (" + coll.transport() + ")").c_str()
                     : "",
                 f.grad_accum, count_of(f.batch_size, "sequence").c_str(), f.optim.optimizer.c_str(),
                 static_cast<double>(f.optim.lr), f.optim.lr_schedule.c_str(),
                 count_of(static_cast<int64_t>(m.params().no_decay_names().size()), "tensor").c_str());
  std::unique_ptr<ProgressBar> bar;
  RunEvents ev;
  ev.info = [&](const std::string& msg) {
    if (bar) bar->clear();
    std::fprintf(stderr, "kiln: %s\n", msg.c_str());
  };
  ev.step = [&](int64_t step, int64_t steps, const StepReport& r) {
    if (!bar) bar = std::make_unique<ProgressBar>("train", static_cast<double>(steps), 1.0, "steps", step - 1.0);
    bar->clear();
    std::printf("step %lld/%lld policy_version %llu loss %.6f grad_norm %.6f lr %g tokens %lld tok/s %.1f",
                static_cast<long long>(step), static_cast<long long>(steps),
                static_cast<unsigned long long>(r.policy_version), r.loss, r.grad_norm, r.lr,
                static_cast<long long>(r.tokens), r.tokens_per_s());
    if (r.mfu > 0) std::printf(" mfu %.3f", r.mfu);
    if (r.memory_gib > 0) std::printf(" mem %.2fGiB", r.memory_gib);
    std::printf("\n");
    std::fflush(stdout);
    char note[64];
    std::snprintf(note, sizeof(note), "loss %.4f", r.loss);
    bar->update(static_cast<double>(step), note, /*force=*/true);
  };
  ev.eval = [&](int64_t step, double val_loss, int64_t tokens) {
    if (bar) bar->clear();
    std::printf("eval step %lld val_loss %.6f val_ppl %.4f val_tokens %lld\n", static_cast<long long>(step), val_loss,
                std::exp(val_loss), static_cast<long long>(tokens));
    std::fflush(stdout);
  };
  Result<RunResult> r = [&] {
    StopOnSignal stop;
    ev.stop = stop.flag();
    return run_training(be, m, ro, ev);
  }();
  if (bar) bar->clear();
  if (!r.ok()) return fail(r.status());
  if (!writer) return 0;
  if (r->stopped) {
    std::fprintf(stderr, "kiln: stopped at step %lld; continue with --resume auto (checkpoint %s)\n",
                 static_cast<long long>(r->steps_done), r->last_checkpoint.c_str());
    return 0;
  }
  std::fprintf(stderr, "kiln: saved the trained model to %s (%s)\n", f.output.c_str(), dtype_name(*save_dtype));
  return 0;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* t = app.add_subcommand("train", "train a Hugging Face checkpoint on kiln preprocess shards or pre-tokenized JSONL");
  t->add_option("--model", f->model_dir, "model folder (config.json, safetensors, tokenizer files)")->required();
  t->add_option("--data", f->data,
                "a kiln preprocess directory (its train split), or a JSONL file of {\"input_ids\": [...], "
                "\"labels\": [...], \"position_ids\": [...]} lines (labels and position_ids optional)")
      ->required();
  t->add_option("--val-data", f->val_data,
                "validation data (default: the --data directory's val split when it has one)");
  t->add_option("--output", f->output,
                "run folder: the trained model, metrics.jsonl and checkpoint-<step>/ folders")
      ->required();
  t->add_option("--objective", f->objective,
                "pretrain (every token) or sft (the tokens the data marks: assistant tokens, labels); default: "
                "sft when the data marks targets");
  t->add_option("--objective-kwargs", f->objective_kwargs, "objective options as a JSON object");
  t->add_option("--eval-every", f->eval_every, "validation loss every N steps (and at the end)");
  t->add_option("--eval-rows", f->eval_rows, "validation rows per evaluation (default: all)");
  t->add_option("--save-every", f->save_every, "write a resumable checkpoint-<step>/ every N steps");
  t->add_option("--keep-last", f->keep_last, "keep only the newest K checkpoints (default: all)");
  t->add_option("--resume", f->resume, "continue from a checkpoint or run folder, or 'auto': the newest in --output");
  t->add_option("--tensorboard", f->tensorboard, "also write TensorBoard event files into this folder");
  t->add_option("--peak-tflops", f->peak_tflops, "the device's peak TFLOP/s, for the MFU figure (CUDA)")
      ->capture_default_str();
  t->add_option("--device", f->device, "cpu or cuda[:N] (under mpirun, cuda is each rank's local GPU)")->capture_default_str();
  t->add_option("--collective-timeout", f->collective_timeout,
                "under mpirun: seconds a collective may wait for the other ranks before the run stops with an error")
      ->capture_default_str();
  t->add_option("--collectives", f->collectives,
                "auto (NCCL between GPUs, MPI between CPU ranks), mpi (also for GPUs, through host copies) or nccl "
                "(also for one rank)")
      ->capture_default_str();
  t->add_option("--zero", f->zero,
                "under mpirun: 0 replicates the optimizer state on every rank; 1 shards it (and the f32 master "
                "weights on CUDA) over the ranks; 2 also shards the accumulated gradients")
      ->capture_default_str();
  t->add_option("--steps", f->steps, "optimizer steps (default: one pass over the data)");
  t->add_option("--batch-size", f->batch_size, "sequences per micro-batch")->capture_default_str();
  t->add_option("--grad-accum", f->grad_accum, "micro-batches per optimizer step")->capture_default_str();
  f->optim.add(t);
  t->add_option("--no-decay", f->no_decay,
                "regular expression over Hugging Face tensor names exempt from weight decay ('' = none)")
      ->capture_default_str();
  t->add_option("--label-smoothing", f->label_smoothing, "cross-entropy label smoothing")->capture_default_str();
  t->add_flag("--recompute", f->recompute,
              "keep only each layer's input and recompute its activations in the backward pass (less memory, "
              "about one more forward)");
  t->add_flag("--shuffle", f->shuffle, "shuffle the examples each epoch (default: file order)");
  t->add_option("--seed", f->seed, "shuffle seed")->capture_default_str();
  t->add_option("--save-dtype", f->save_dtype, "f32, bf16 or f16 (default: the source checkpoint's dtype)");
  return [f] { return run_train(*f); };
}

}  // namespace kiln::cli
