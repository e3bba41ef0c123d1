// The training run (see run.h).
#include "train/run.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>

#include "core/json_text.h"
#include "train/data.h"
#include "train/dataset.h"
#include "train/metrics.h"
#include "train/objective.h"
#include "train/run_checkpoint.h"
#include "train/sampler.h"
#include "train/tensorboard.h"
#include "train/checkpoint.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Configuration keys a resumed run may change: they decide where and how often things are written.
bool may_change_on_resume(const std::string& key) {
  static constexpr const char* kFree[] = {"output", "resume", "save_every", "keep_last", "eval_every",
                                          "eval_rows", "tensorboard", "device", "config", "peak_tflops",
                                          "recompute", "zero"};
  for (const char* k : kFree)
    if (key == k) return true;
  return false;
}

Status check_resumable(const nlohmann::json& saved, const nlohmann::json& now, const std::string& checkpoint) {
  for (const auto& [key, value] : now.items()) {
    if (may_change_on_resume(key)) continue;
    const nlohmann::json before = saved.contains(key) ? saved.at(key) : nlohmann::json();
    if (key == "data_fingerprint" && before != value)
      return invalid_argument("cannot resume from '" + checkpoint + "': the training data changed since it was made " +
                              "(its content hash differs); resume with the data the run started with");
    std::string flag = key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (before != value)
      return invalid_argument("cannot resume from '" + checkpoint + "': --" + flag + " was " + json_brief(before) +
                              " and is now " + json_brief(value) + " (resume with the run's settings, or start a new run " +
                              "with --model " + checkpoint + ")");
  }
  return Status::Ok();
}

// A micro-batch is --batch-size rows padded to the data's longest: its tokens must fit the kernels'
// int32 token indexes, and its host copies (the examples and the padded batch: at most 28 bytes a
// token) this machine's memory. Checked before the first batch is built: an oversized std::vector is
// granted by overcommitted memory and the process killed when it touches the pages.
Status check_micro_batch(int32_t batch_size, const TrainingData& data, const std::string& which) {
  const int64_t longest = std::max<int64_t>(data.longest_row(), 1);
  const int64_t tokens = static_cast<int64_t>(batch_size) * longest;
  const std::string what = "--batch-size " + std::to_string(batch_size) + " rows padded to the " + which +
                           " data's longest row (" + std::to_string(longest) + " tokens) make " + std::to_string(tokens) +
                           " tokens per micro-batch";
  if (tokens > INT32_MAX)
    return invalid_argument(what + ", beyond the 2147483647 a step can index; lower --batch-size (raising "
                            "--grad-accum keeps the step's examples)");
  const int64_t limit = host_memory_limit(), bytes = tokens * 28;
  if (limit > 0 && bytes > limit)
    return out_of_memory(what + ": their host copies alone (" + std::to_string(bytes) + " bytes) exceed this " +
                         "machine's " + std::to_string(limit) + " bytes of memory; lower --batch-size (raising "
                         "--grad-accum keeps the step's examples)");
  return Status::Ok();
}

// A step holds its --grad-accum micro-batches on the host together (Trainer::step normalises by the
// step's labelled tokens before the first backward): at most 16 bytes a padded token (ids,
// positions, segments, targets) and a few vectors each, checked like one micro-batch above.
Status check_step_batches(int32_t batch_size, int32_t grad_accum, const TrainingData& data) {
  const int64_t longest = std::max<int64_t>(data.longest_row(), 1);
  const double bytes = static_cast<double>(grad_accum) * (static_cast<double>(batch_size) * longest * 16.0 + 256.0);
  const int64_t limit = host_memory_limit();
  if (limit > 0 && bytes > static_cast<double>(limit))
    return out_of_memory("--grad-accum " + std::to_string(grad_accum) + " micro-batches of " +
                         std::to_string(batch_size) + " rows padded to " + std::to_string(longest) +
                         " tokens, held together for a step, take about " +
                         std::to_string(static_cast<int64_t>(bytes / (1 << 30))) + " GiB of host memory, more than " +
                         "this machine's " + std::to_string(limit >> 30) + " GiB; lower --grad-accum");
  return Status::Ok();
}

// The micro-batch of `rows` of `data`, targets by the objective.
HostBatch batch_of(const TrainingData& data, const std::vector<int64_t>& rows, const Objective& objective) {
  std::vector<TrainExample> examples;
  for (int64_t r : rows) examples.push_back(data.example(r, objective.every_token()));
  std::vector<const TrainExample*> ptrs;
  for (const TrainExample& e : examples) ptrs.push_back(&e);
  return make_host_batch(ptrs);
}

// Mean negative log-likelihood over (at most `max_rows` of) the data's rows; with several ranks each
// takes every size-th batch and the sums are added.
Result<std::pair<double, int64_t>> evaluate(TrainModel& model, const TrainingData& data, const Objective& objective,
                                            int32_t batch_size, int64_t max_rows, Collectives* collectives) {
  const int64_t rows = max_rows > 0 ? std::min(max_rows, data.rows()) : data.rows();
  const int32_t rank = collectives ? collectives->rank() : 0, ranks = collectives ? collectives->size() : 1;
  double nll = 0.0;
  int64_t count = 0;
  for (int64_t begin = static_cast<int64_t>(rank) * batch_size; begin < rows; begin += static_cast<int64_t>(ranks) * batch_size) {
    std::vector<int64_t> batch;
    for (int64_t r = begin; r < std::min(rows, begin + batch_size); ++r) batch.push_back(r);
    const HostBatch hb = batch_of(data, batch, objective);
    if (hb.labelled() == 0) continue;
    KILN_ASSIGN_OR_RETURN(DeviceBatch db, model.upload(hb));
    KILN_ASSIGN_OR_RETURN(std::vector<float> lp, model.target_logprobs(db));
    for (float v : lp) nll -= static_cast<double>(v);
    count += static_cast<int64_t>(lp.size());
  }
  if (ranks > 1) {
    double sums[2] = {nll, static_cast<double>(count)};
    KILN_RETURN_IF_ERROR(collectives->sum(sums, 2));
    nll = sums[0];
    count = static_cast<int64_t>(sums[1]);
  }
  if (count == 0) return invalid_argument("the validation data has no target tokens");
  return std::make_pair(nll / static_cast<double>(count), count);
}

}  // namespace

double training_flops(const ModelConfig& c, const std::vector<HostBatch>& micro) {
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double h = static_cast<double>(c.hidden_size), inter = static_cast<double>(c.intermediate_size);
  const double per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter;
  const double linear = per_layer * static_cast<double>(c.num_hidden_layers) + h * static_cast<double>(c.vocab_size);
  double tokens = 0, attention_pairs = 0;  // query-key pairs under the causal mask, per layer and head dim
  for (const HostBatch& b : micro) {
    tokens += static_cast<double>(b.tokens());
    for (int32_t r = 0; r < b.batch; ++r) {
      double len = 0;
      for (int32_t t = 0; t < b.seq_len; ++t)
        if (b.segments.empty() || b.segments[static_cast<size_t>(r) * b.seq_len + t] >= 0) ++len;
      attention_pairs += len * (len + 1) / 2;
    }
  }
  // Forward: 2 FLOPs per multiply-add; backward twice the forward.
  return 6.0 * linear * tokens + 6.0 * 2.0 * q * attention_pairs * static_cast<double>(c.num_hidden_layers);
}

Result<RunResult> run_training(Backend& be, TrainModel& model, const RunOptions& o, const RunEvents& ev_in) {
  Collectives* const coll = o.trainer.collectives;
  const int32_t rank = coll ? coll->rank() : 0, ranks = coll ? coll->size() : 1;
  const bool writer = rank == 0;  // the rank that writes files and reports
  const RunEvents ev = writer ? ev_in : RunEvents{{}, {}, {}, ev_in.stop};
  auto info = [&](const std::string& m) {
    if (ev.info) ev.info(m);
  };
  if (o.batch_size <= 0) return invalid_argument("--batch-size must be positive");
  if (o.grad_accum <= 0) return invalid_argument("--grad-accum must be positive");
  if (o.steps < 0 || o.eval_every < 0 || o.save_every < 0 || o.keep_last < 0 || o.eval_rows < 0)
    return invalid_argument("--steps, --eval-every, --eval-rows, --save-every and --keep-last must be >= 0");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> data,
                        TrainingData::open(o.data, "train", model.config(), o.model_dir));
  KILN_ASSIGN_OR_RETURN(Objective objective, Objective::create(o.objective, o.objective_kwargs, *data));
  std::unique_ptr<TrainingData> val;
  if (!o.val_data.empty()) {
    const std::string split = TrainingData::has_split(o.val_data, "val") ? "val" : "train";
    KILN_ASSIGN_OR_RETURN(val, TrainingData::open(o.val_data, split, model.config(), o.model_dir));
  } else if (TrainingData::has_split(o.data, "val")) {
    KILN_ASSIGN_OR_RETURN(val, TrainingData::open(o.data, "val", model.config(), o.model_dir));
  }
  if (o.eval_every > 0 && !val)
    return invalid_argument("--eval-every needs validation data: preprocess with --val-fraction, or pass --val-data");
  if (be.device().is_cuda() && o.batch_size > 65535)  // rows index a grid dimension of the attention kernels
    return invalid_argument("--batch-size must be at most 65535 on CUDA; raise --grad-accum for more rows per step");
  if (o.batch_size % ranks != 0)
    return invalid_argument("--batch-size (" + std::to_string(o.batch_size) + ") is the global batch and must be a " +
                            "multiple of the " + std::to_string(ranks) + " ranks, so that each reads an equal part");
  KILN_RETURN_IF_ERROR(check_micro_batch(o.batch_size, *data, "training"));
  if (val) KILN_RETURN_IF_ERROR(check_micro_batch(o.batch_size, *val, "validation"));
  KILN_RETURN_IF_ERROR(check_step_batches(o.batch_size, o.grad_accum, *data));

  const int64_t per_step = static_cast<int64_t>(o.batch_size) * o.grad_accum;
  const int64_t steps = o.steps > 0 ? o.steps : (data->rows() + per_step - 1) / per_step;
  TrainerOptions topt = o.trainer;
  topt.schedule.total_steps = steps;
  KILN_ASSIGN_OR_RETURN(Trainer trainer, Trainer::create(be, model, topt));
  Status prepared = Status::Ok();
  if (writer) {
    prepared = prepare_output_dir(o.output);
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(o.output, ec))  // leftovers of a crash mid-save
      if (e.path().filename().string().rfind(".checkpoint-", 0) == 0) fs::remove_all(e.path(), ec);
  }
  if (ranks > 1) {  // every rank learns whether rank 0 could prepare the output, after it did
    double failed = prepared.ok() ? 0.0 : 1.0;
    KILN_RETURN_IF_ERROR(coll->sum(&failed, 1));
    if (failed > 0 && prepared.ok()) return invalid_argument("rank 0 could not prepare the output directory " + o.output);
  }
  KILN_RETURN_IF_ERROR(prepared);

  nlohmann::json config = o.config;  // what checkpoints record: the flags and the data's content hash
  config["data_fingerprint"] = data->fingerprint();
  Sampler sampler(data->rows(), o.shuffle, o.seed);
  RunResult result;
  int64_t step = 0;
  std::string from;
  if (o.resume == "auto") {
    from = latest_checkpoint(o.output);
    if (from.empty()) info("no checkpoint in " + o.output + " yet: starting from the beginning");
  } else if (!o.resume.empty()) {
    KILN_ASSIGN_OR_RETURN(from, resolve_checkpoint(o.resume));
  } else if (!latest_checkpoint(o.output).empty()) {
    return invalid_argument("'" + o.output + "' holds checkpoints of an earlier run: pass --resume auto to continue it, " +
                            "or choose another --output");
  }
  if (!from.empty()) {
    KILN_ASSIGN_OR_RETURN(TrainingState st,
                          load_training_checkpoint(be, model.params(), trainer.optimizer(), from));
    KILN_RETURN_IF_ERROR(check_resumable(st.config, config, from));
    KILN_RETURN_IF_ERROR(sampler.restore(st.sampler));
    trainer.restore_policy_version(st.policy_version);
    step = st.step;
    result.last_checkpoint = from;
    info("resumed from " + from + " at step " + std::to_string(step) + ", policy version " +
         std::to_string(st.policy_version));
  }
  const int64_t result_start_step = step;
  std::optional<MetricsLog> metrics;
  if (writer) {
    KILN_ASSIGN_OR_RETURN(MetricsLog m, MetricsLog::open(o.output, from.empty() ? -1 : step));
    metrics.emplace(std::move(m));
  }
  std::unique_ptr<TensorBoardWriter> tb;
  if (writer && !o.tensorboard.empty()) {
    KILN_ASSIGN_OR_RETURN(TensorBoardWriter w, TensorBoardWriter::open(o.tensorboard));
    tb = std::make_unique<TensorBoardWriter>(std::move(w));
  }

  auto save = [&]() -> Status {  // every rank takes part (each writes its optimizer shard)
    TrainingState st;
    st.step = step;
    st.policy_version = trainer.policy_version();
    st.optimizer_steps = trainer.optimizer().steps_taken();
    st.sampler = sampler.state();
    st.config = config;
    KILN_ASSIGN_OR_RETURN(result.last_checkpoint,
                          save_training_checkpoint(be, model.params(), trainer.optimizer(), st, o.model_dir, o.output,
                                                   o.save_dtype, o.keep_last, coll));
    info("saved " + result.last_checkpoint);
    return Status::Ok();
  };
  int64_t evaluated_at = -1;
  auto run_eval = [&]() -> Status {
    KILN_ASSIGN_OR_RETURN(auto loss, evaluate(model, *val, objective, o.batch_size, o.eval_rows, coll));
    evaluated_at = step;
    if (ev.eval) ev.eval(step, loss.first, loss.second);
    if (tb) {
      KILN_RETURN_IF_ERROR(tb->add_scalar("val_loss", step, loss.first, TensorBoardWriter::now()));
      KILN_RETURN_IF_ERROR(tb->flush());
    }
    return metrics ? metrics->write_eval(step, trainer.policy_version(), loss.first, loss.second) : Status::Ok();
  };
  // A stop request on any rank stops every rank before the same step.
  auto stop_requested = [&]() -> Result<bool> {
    double stop = ev.stop && ev.stop->load() ? 1.0 : 0.0;
    if (ranks > 1) KILN_RETURN_IF_ERROR(coll->sum(&stop, 1));
    return stop > 0;
  };

  if (val && step == 0 && o.eval_every > 0) KILN_RETURN_IF_ERROR(run_eval());
  while (step < steps) {
    KILN_ASSIGN_OR_RETURN(bool stop, stop_requested());
    if (stop) break;
    std::vector<HostBatch> micro;
    for (int32_t k = 0; k < o.grad_accum; ++k) {
      std::vector<int64_t> rows = sampler.next(o.batch_size);  // the global micro-batch: this rank's part
      const int32_t share = o.batch_size / ranks;
      rows = std::vector<int64_t>(rows.begin() + static_cast<int64_t>(rank) * share,
                                  rows.begin() + static_cast<int64_t>(rank + 1) * share);
      micro.push_back(batch_of(*data, rows, objective));
    }
    Result<StepReport> r = trainer.step(micro);
    if (!r.ok()) return invalid_argument(r.status().message() + "; stopping (the last checkpoint is kept)");
    ++step;
    if (r->skipped) {
      info("warning: step " + std::to_string(step) + " has no target token; no update");
    } else {
      if (o.peak_flops > 0 && r->seconds > 0) r->mfu = training_flops(model.config(), micro) / r->seconds / o.peak_flops;
      r->memory_gib = static_cast<double>(be.allocator_bytes().second) / (1024.0 * 1024.0 * 1024.0);
      if (ev.step) ev.step(step, steps, *r);
      if (metrics) KILN_RETURN_IF_ERROR(metrics->write(step, *r));
      if (tb) KILN_RETURN_IF_ERROR(tb->add_step(step, *r, TensorBoardWriter::now()));
    }
    if (val && o.eval_every > 0 && step % o.eval_every == 0) KILN_RETURN_IF_ERROR(run_eval());
    if (o.save_every > 0 && step % o.save_every == 0 && step < steps) KILN_RETURN_IF_ERROR(save());
  }
  result.steps_done = step;
  if (step < steps) {  // asked to stop
    result.stopped = true;
    if (!(o.save_every > 0 && step % o.save_every == 0 && step > 0)) KILN_RETURN_IF_ERROR(save());
    return result;
  }
  const bool finished_before = !from.empty() && step == result_start_step;
  if (finished_before) {
    info("the run was already complete at step " + std::to_string(step) + ": writing its final model again");
  } else {
    if (val && evaluated_at != step) KILN_RETURN_IF_ERROR(run_eval());
    if (o.save_every > 0) KILN_RETURN_IF_ERROR(save());
  }
  TensorBuffer gathered;
  KILN_ASSIGN_OR_RETURN(Tensor master, whole_master(be, model.params(), coll, gathered));
  if (writer) KILN_RETURN_IF_ERROR(save_hf_checkpoint(be, model.params(), o.model_dir, o.output, o.save_dtype, master));
  if (ranks > 1) KILN_RETURN_IF_ERROR(coll->barrier());  // the run ends when its files are complete
  return result;
}

}  // namespace kiln
