// Trainer (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "kernels/ops.h"

namespace kiln {

Result<Trainer> Trainer::create(Backend& be, TrainModel& model, const TrainerOptions& options) {
  KILN_RETURN_IF_ERROR(options.schedule.validate());
  if (options.zero < 0 || options.zero > 2) return invalid_argument("--zero must be 0, 1 or 2");
  const bool sharded = options.zero > 0 && options.collectives && options.collectives->size() > 1;
  ParameterSet& params = model.params();
  // ZeRO-2 keeps only this rank's shard of the accumulated gradients (with one rank too, when the
  // collectives are asked for: the path its tests and benchmarks measure).
  const bool shard_gradients =
      options.zero == 2 && options.collectives && std::string_view(options.collectives->transport()) != "none";
  if (params.gradients_sharded() && !shard_gradients)
    return invalid_argument("the model's gradients are sharded (ZeRO-2): train it with --zero 2 over the same ranks");
  if (shard_gradients && !params.gradients_sharded()) {
    if (params.shards() != options.collectives->size())
      return invalid_argument("--zero 2 needs the parameters laid out in " + std::to_string(options.collectives->size()) +
                              " shards (TrainModelOptions.parameter_shards), not " + std::to_string(params.shards()));
    const int64_t begin = params.shard_size() * options.collectives->rank();
    KILN_RETURN_IF_ERROR(params.shard_gradients(be, begin, begin + params.shard_size()));
  }
  if (sharded && params.mixed_precision() && !params.master_sharded() &&
      options.optimizer.kind != OptimizerOptions::Kind::muon && params.shards() == options.collectives->size()) {
    const int64_t begin = params.shard_size() * options.collectives->rank();  // the optimizer's shard
    KILN_RETURN_IF_ERROR(params.keep_master_range(be, begin, begin + params.shard_size()));
  }
  KILN_ASSIGN_OR_RETURN(Optimizer opt, Optimizer::create(be, model.params(), options.optimizer,
                                                         sharded ? options.collectives : nullptr));
  return Trainer(model, std::move(opt), options);
}

double Trainer::next_lr() const {
  return static_cast<double>(options_.optimizer.lr) * options_.schedule.multiplier(static_cast<int64_t>(version_));
}

Result<StepReport> Trainer::begin_step(const std::vector<HostBatch>& micro) const {
  StepReport r;
  r.policy_version = version_;
  for (const HostBatch& hb : micro) {
    r.labelled += hb.labelled();
    r.tokens += hb.tokens();
  }
  if (data_parallel()) {  // counts below 2^53 are exact in doubles
    double counts[2] = {static_cast<double>(r.labelled), static_cast<double>(r.tokens)};
    KILN_RETURN_IF_ERROR(options_.collectives->sum(counts, 2));
    r.labelled = static_cast<int64_t>(counts[0]);
    r.tokens = static_cast<int64_t>(counts[1]);
  }
  r.skipped = r.labelled == 0;
  return r;
}

// ZeRO-2 keeps one layer's reduction in flight: the backward of the layer below overlaps it, and
// the layer's scratch is free for the layer after that once its sum is in the owners' shards.
Status Trainer::reduce_layer(int64_t layer) {
  if (options_.zero == 2 && pending_layer_ != kNoLayer) {
    KILN_RETURN_IF_ERROR(options_.collectives->join(model_->backend()));
    collect(pending_layer_);
    pending_layer_ = kNoLayer;
  }
  for (const ParameterSet::GradientSpan& span : model_->params().gradient_spans(layer))
    KILN_RETURN_IF_ERROR(reduce_span(span));
  if (options_.zero == 2) pending_layer_ = layer;
  return Status::Ok();
}

Status Trainer::reduce_span(const ParameterSet::GradientSpan& span) {
  Collectives& coll = *options_.collectives;
  Backend& be = model_->backend();
  if (options_.zero == 0) return coll.all_reduce_sum_overlapped(be, span.scratch);
  const int64_t shard = model_->params().shard_size();  // rank r owns [r * shard, (r + 1) * shard)
  for (int64_t at = span.begin; at < span.end;) {
    const int64_t owner = at / shard, piece_end = std::min(span.end, (owner + 1) * shard);
    KILN_RETURN_IF_ERROR(coll.reduce_sum_overlapped(be, span.scratch.rows(at - span.begin, piece_end - span.begin),
                                                    static_cast<int32_t>(owner)));
    at = piece_end;
  }
  return Status::Ok();
}

// ZeRO-2, after the reduction of `layer`'s scratch (-1: the rest's) is complete: this rank's part
// of the sums into its shard, and the scratch cleared for the next backward that writes there.
void Trainer::collect(int64_t layer) {
  Backend& be = model_->backend();
  const ParameterSet& params = model_->params();
  const int64_t own_b = optimizer_.own_begin(), own_e = optimizer_.own_end();
  for (const ParameterSet::GradientSpan& span : params.gradient_spans(layer)) {
    const int64_t b = std::max(span.begin, own_b), e = std::min(span.end, own_e);
    if (b < e) ops::add_inplace(be, params.grad_rows(b, e), span.scratch.rows(b - span.begin, e - span.begin));
    be.zero(span.scratch);
  }
}

Status Trainer::finish_reduction(int64_t below) {
  for (int64_t l = below - 1; l >= 0; --l) KILN_RETURN_IF_ERROR(reduce_layer(l));
  for (const ParameterSet::GradientSpan& span : model_->params().gradient_spans(-1))
    KILN_RETURN_IF_ERROR(reduce_span(span));
  KILN_RETURN_IF_ERROR(options_.collectives->join(model_->backend()));
  if (options_.zero == 2) {
    if (pending_layer_ != kNoLayer) collect(pending_layer_);
    pending_layer_ = kNoLayer;
    collect(-1);
  }
  return Status::Ok();
}

Result<StepReport> Trainer::step(const std::vector<HostBatch>& micro) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(StepReport r, begin_step(micro));
  if (r.skipped) return r;
  double loss_sum = 0.0;
  for (size_t i = 0; i < micro.size(); ++i) {
    const HostBatch& hb = micro[i];
    const bool reducing = reduces_after(i, micro.size());
    int64_t below = model_->config().num_hidden_layers;  // the layers not reduced yet: [0, below)
    if (hb.batch > 0) {  // (a rank without rows in this micro-batch still joins its reduction)
      if (reducing)
        model_->set_layer_gradient_hook([&](int64_t l) {
          KILN_ASSERT(l == below - 1);
          below = l;
          return reduce_layer(l);
        });
      Result<double> sum = [&]() -> Result<double> {
        KILN_ASSIGN_OR_RETURN(DeviceBatch db, model_->upload(hb));
        return model_->forward_backward(db, 1.0f / static_cast<float>(r.labelled));
      }();
      model_->set_layer_gradient_hook({});
      KILN_RETURN_IF_ERROR(sum.status());
      loss_sum += *sum;
    }
    if (reducing) KILN_RETURN_IF_ERROR(finish_reduction(below));
  }
  if (data_parallel()) KILN_RETURN_IF_ERROR(options_.collectives->sum(&loss_sum, 1));
  r.loss = loss_sum / static_cast<double>(r.labelled);
  return commit(r, start);
}

Result<StepReport> Trainer::step_token_loss(const std::vector<HostBatch>& micro, const std::vector<TokenLoss>& losses,
                                            const TokenScoreOptions& options, std::vector<TokenScores>* scores) {
  KILN_ASSERT(micro.size() == losses.size());
  KILN_ASSERT(!data_parallel());  // RL's losses are normalised by the caller, over one process's rows
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(StepReport r, begin_step(micro));
  if (scores) scores->assign(micro.size(), TokenScores{});
  if (r.skipped) return r;
  for (size_t i = 0; i < micro.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(DeviceBatch db, model_->upload(micro[i]));
    Result<double> loss = model_->forward_backward_token_loss(db, losses[i], options, scores ? &(*scores)[i] : nullptr);
    if (!loss.ok()) {
      optimizer_.discard_gradients();
      return loss.status();
    }
    r.loss += *loss;
  }
  return commit(r, start);
}

Result<StepReport> Trainer::commit(StepReport r, std::chrono::steady_clock::time_point start) {
  const std::string at = "step " + std::to_string(version_ + 1);
  if (!std::isfinite(r.loss)) {
    optimizer_.discard_gradients();
    return invalid_argument(at + ": the loss is not finite (" + std::to_string(r.loss) + ")");
  }
  r.lr = next_lr();
  Result<OptimizerStepInfo> info = optimizer_.step(static_cast<float>(r.lr));
  if (!info.ok()) return invalid_argument(at + ": " + info.status().message());
  r.grad_norm = info->grad_norm;
  r.policy_version = ++version_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace kiln
