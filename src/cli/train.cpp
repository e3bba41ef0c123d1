// kiln train: fine-tunes a Hugging Face checkpoint on pre-tokenized JSONL data and writes the
// result back as a Hugging Face checkpoint. AdamW or plain SGD under an LR schedule; the step loop
// is the training layer's Trainer (train/trainer.h), this file parses flags and reports.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "cli/common.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/train_model.h"
#include "train/trainer.h"

namespace kiln::cli {
namespace {

struct TrainFlags {
  std::string model_dir, data, output, device = "cpu";
  int64_t steps = 0;  // 0: one pass over the data
  int32_t batch_size = 1, grad_accum = 1;
  float lr = 1e-5f, eps = 1e-8f, weight_decay = 0.0f, clip_norm = 0.0f, label_smoothing = 0.0f;
  std::string betas = "0.9,0.999";
  std::string no_decay = kDefaultNoDecay;
  std::string optimizer = "adamw";
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0, decay_steps = 0;
  double min_lr_ratio = 0.0;
  std::string save_dtype;  // empty: the source checkpoint's dtype
  bool shuffle = false;
  std::string seed = "0";  // parsed (range-checked) by run_train
};

Result<std::pair<float, float>> parse_betas(const std::string& text) {
  const size_t comma = text.find(',');
  try {
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    size_t used1 = 0, used2 = 0;
    const std::string a = text.substr(0, comma), b = text.substr(comma + 1);
    const float b1 = std::stof(a, &used1), b2 = std::stof(b, &used2);
    if (used1 != a.size() || used2 != b.size()) throw std::invalid_argument("trailing text");
    return std::make_pair(b1, b2);
  } catch (const std::exception&) {
    return invalid_argument("--betas must be two numbers separated by a comma, e.g. 0.9,0.95 (got '" + text + "')");
  }
}

Result<DType> parse_save_dtype(const std::string& name, DType source) {
  if (name.empty()) return source;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "float16") return DType::f16;
  return invalid_argument("--save-dtype must be f32, bf16 or f16 (got '" + name + "')");
}

int run_train(const TrainFlags& f) {
  if (f.batch_size <= 0) return fail(invalid_argument("--batch-size must be positive"));
  if (f.grad_accum <= 0) return fail(invalid_argument("--grad-accum must be positive"));
  if (f.steps < 0) return fail(invalid_argument("--steps must be >= 0"));
  Result<uint64_t> seed = parse_u64(f.seed, "--seed");
  if (!seed.ok()) return fail(seed.status());
  if (!(f.label_smoothing >= 0.0f && f.label_smoothing <= 1.0f))
    return fail(invalid_argument("--label-smoothing must be in [0, 1]"));
  OptimizerOptions opt;
  if (f.optimizer == "adamw")
    opt.kind = OptimizerOptions::Kind::adamw;
  else if (f.optimizer == "sgd")
    opt.kind = OptimizerOptions::Kind::sgd;
  else
    return fail(invalid_argument("--optimizer must be adamw or sgd (got '" + f.optimizer + "')"));
  Result<std::pair<float, float>> betas = parse_betas(f.betas);
  if (!betas.ok()) return fail(betas.status());
  opt.lr = f.lr;
  opt.beta1 = betas->first;
  opt.beta2 = betas->second;
  opt.eps = f.eps;
  opt.weight_decay = f.weight_decay;
  opt.clip_norm = f.clip_norm;

  Result<Device> device = parse_device(f.device);
  if (!device.ok()) return fail(device.status());
  Result<std::unique_ptr<Backend>> backend = make_backend(*device);
  if (!backend.ok()) return fail(backend.status());
  Backend& be = **backend;

  TrainModelOptions model_options;
  model_options.no_decay = f.no_decay;
  model_options.label_smoothing = f.label_smoothing;
  Result<std::unique_ptr<TrainModel>> model = TrainModel::load(be, f.model_dir, model_options);
  if (!model.ok()) return fail(model.status());
  TrainModel& m = **model;
  Result<DType> save_dtype = parse_save_dtype(f.save_dtype, m.config().dtype);
  if (!save_dtype.ok()) return fail(save_dtype.status());
  Result<std::vector<TrainExample>> examples = read_training_jsonl(f.data, m.config());
  if (!examples.ok()) return fail(examples.status());
  if (Status s = prepare_output_dir(f.output); !s.ok()) return fail(s);
  const int64_t per_step = static_cast<int64_t>(f.batch_size) * f.grad_accum;
  const int64_t n_examples = static_cast<int64_t>(examples->size());
  const int64_t steps = f.steps > 0 ? f.steps : (n_examples + per_step - 1) / per_step;
  TrainerOptions trainer_options;
  trainer_options.optimizer = opt;
  Result<LrSchedule::Kind> kind = LrSchedule::parse_kind(f.lr_schedule);
  if (!kind.ok()) return fail(kind.status());
  trainer_options.schedule = {*kind, f.warmup_steps, steps, f.decay_steps, f.min_lr_ratio};
  Result<Trainer> trainer = Trainer::create(be, m, trainer_options);
  if (!trainer.ok()) return fail(trainer.status());
  Result<MetricsLog> metrics = MetricsLog::open(f.output);
  if (!metrics.ok()) return fail(metrics.status());
  std::fprintf(stderr,
               "kiln: training %s (%lld parameters, %s) on %lld examples: %lld steps of %d x %d sequences, "
               "%s lr %g (%s schedule), %zu tensors without weight decay\n",
               f.model_dir.c_str(), static_cast<long long>(m.params().parameter_count()), f.device.c_str(),
               static_cast<long long>(n_examples), static_cast<long long>(steps), f.grad_accum, f.batch_size,
               f.optimizer.c_str(), static_cast<double>(f.lr), f.lr_schedule.c_str(), m.params().no_decay_names().size());

  ExampleStream stream(*examples, f.shuffle, *seed);
  for (int64_t step = 1; step <= steps; ++step) {
    std::vector<HostBatch> micro;
    for (int32_t k = 0; k < f.grad_accum; ++k) micro.push_back(make_host_batch(stream.next(f.batch_size)));
    Result<StepReport> r = trainer->step(micro);
    if (!r.ok()) return fail(invalid_argument(r.status().message() + "; stopping without writing a checkpoint"));
    if (r->skipped) {
      std::fprintf(stderr, "kiln: warning: step %lld has no labelled token; no update\n", static_cast<long long>(step));
      continue;
    }
    std::printf("step %lld/%lld policy_version %llu loss %.6f grad_norm %.6f lr %g tokens %lld tok/s %.1f\n",
                static_cast<long long>(step), static_cast<long long>(steps),
                static_cast<unsigned long long>(r->policy_version), r->loss, r->grad_norm, r->lr,
                static_cast<long long>(r->tokens), r->tokens_per_s());
    std::fflush(stdout);
    if (Status s = metrics->write(step, *r); !s.ok()) return fail(s);
  }
  if (Status s = save_hf_checkpoint(be, m.params(), f.model_dir, f.output, *save_dtype); !s.ok()) return fail(s);
  std::fprintf(stderr, "kiln: saved the trained model to %s (%s)\n", f.output.c_str(), dtype_name(*save_dtype));
  return 0;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  CLI::App* t = app.add_subcommand("train", "fine-tune a Hugging Face checkpoint on pre-tokenized JSONL data");
  t->add_option("--model", f->model_dir, "model folder (config.json, safetensors, tokenizer files)")->required();
  t->add_option("--data", f->data,
                "JSONL file, one {\"input_ids\": [...], \"labels\": [...], \"position_ids\": [...]} per line "
                "(labels and position_ids optional)")
      ->required();
  t->add_option("--output", f->output, "run folder: the trained checkpoint and metrics.jsonl (one line per step)")->required();
  t->add_option("--device", f->device, "cpu or cuda[:N]")->capture_default_str();
  t->add_option("--steps", f->steps, "optimizer steps (default: one pass over the data)");
  t->add_option("--batch-size", f->batch_size, "sequences per micro-batch")->capture_default_str();
  t->add_option("--grad-accum", f->grad_accum, "micro-batches per optimizer step")->capture_default_str();
  t->add_option("--lr", f->lr, "base learning rate (the schedule scales it)")->capture_default_str();
  t->add_option("--lr-schedule", f->lr_schedule, "constant, linear, cosine or wsd (as transformers' schedules)")
      ->capture_default_str();
  t->add_option("--warmup-steps", f->warmup_steps, "linear warmup steps")->capture_default_str();
  t->add_option("--min-lr-ratio", f->min_lr_ratio, "cosine / wsd: the final lr as a fraction of --lr")
      ->capture_default_str();
  t->add_option("--decay-steps", f->decay_steps, "wsd: steps of the final decay");
  t->add_option("--betas", f->betas, "AdamW beta1,beta2")->capture_default_str();
  t->add_option("--eps", f->eps, "AdamW epsilon")->capture_default_str();
  t->add_option("--weight-decay", f->weight_decay, "decoupled weight decay (AdamW) / L2 (SGD)")->capture_default_str();
  t->add_option("--no-decay", f->no_decay,
                "regular expression over Hugging Face tensor names exempt from weight decay ('' = none)")
      ->capture_default_str();
  t->add_option("--clip-norm", f->clip_norm, "clip the global gradient norm to this value (default: off)");
  t->add_option("--label-smoothing", f->label_smoothing, "cross-entropy label smoothing")->capture_default_str();
  t->add_option("--optimizer", f->optimizer, "adamw or sgd (plain, no momentum)")->capture_default_str();
  t->add_flag("--shuffle", f->shuffle, "shuffle the examples each epoch (default: file order)");
  t->add_option("--seed", f->seed, "shuffle seed")->capture_default_str();
  t->add_option("--save-dtype", f->save_dtype, "f32, bf16 or f16 (default: the source checkpoint's dtype)");
  return [f] { return run_train(*f); };
}

}  // namespace kiln::cli
