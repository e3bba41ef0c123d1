// Trainer (see trainer.h).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <string>

namespace kiln {

Result<Trainer> Trainer::create(Backend& be, TrainModel& model, const TrainerOptions& options) {
  KILN_RETURN_IF_ERROR(options.schedule.validate());
  if (options.zero < 0 || options.zero > 2) return invalid_argument("--zero must be 0, 1 or 2");
  const bool sharded = options.zero > 0 && options.collectives && options.collectives->size() > 1;
  ParameterSet& params = model.params();
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

// The reduce-scatter leaves in this rank's shard the sum over the ranks of everyone's gradients
// there; with ZeRO-2 the rest of the buffer is then cleared, so that the next micro-batch adds to
// the shard only this rank's new gradients besides the sum so far, and to the other shards only
// the new ones: the next reduce-scatter then sums exactly the step's gradients so far.
Status Trainer::reduce_micro_batch() {
  if (!data_parallel() || options_.zero != 2) return Status::Ok();
  Backend& be = model_->backend();
  const Tensor g = model_->params().grads();
  const int64_t b = optimizer_.own_begin(), e = optimizer_.own_end();
  KILN_RETURN_IF_ERROR(options_.collectives->reduce_scatter_sum(be, g, g.rows(b, e)));
  if (b > 0) be.zero(g.rows(0, b));
  if (e < g.numel()) be.zero(g.rows(e, g.numel()));
  return Status::Ok();
}

// The reduction of layers [0, below) (ZeRO-0: those the backward has not started), the rest of the
// parameters, the loss; with ZeRO-0 each range's all-reduce overlaps what follows it on the stream.
Status Trainer::reduce(double* loss, int64_t below) {
  if (!data_parallel()) return Status::Ok();
  Backend& be = model_->backend();
  Collectives& coll = *options_.collectives;
  const ParameterSet& params = model_->params();
  const Tensor g = params.grads();
  if (options_.zero == 0) {
    for (int64_t l = below - 1; l >= 0; --l) KILN_RETURN_IF_ERROR(reduce_layer(l));
    for (const auto& [b, e] : params.non_layer_ranges())
      KILN_RETURN_IF_ERROR(coll.all_reduce_sum_overlapped(be, g.rows(b, e)));
    KILN_RETURN_IF_ERROR(coll.join(be));
  } else if (options_.zero == 1) {
    KILN_RETURN_IF_ERROR(coll.reduce_scatter_sum(be, g, g.rows(optimizer_.own_begin(), optimizer_.own_end())));
  }  // ZeRO-2: reduced micro-batch by micro-batch
  return coll.sum(loss, 1);
}

Status Trainer::reduce_layer(int64_t layer) {
  const Tensor g = model_->params().grads();
  for (const auto& [b, e] : model_->params().layer_ranges(layer))
    KILN_RETURN_IF_ERROR(options_.collectives->all_reduce_sum_overlapped(model_->backend(), g.rows(b, e)));
  return Status::Ok();
}

Result<StepReport> Trainer::step(const std::vector<HostBatch>& micro) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(StepReport r, begin_step(micro));
  if (r.skipped) return r;
  // ZeRO-0: the last micro-batch's backward starts each layer's all-reduce once the layer is done.
  const bool overlap = data_parallel() && options_.zero == 0;
  int64_t below = model_->config().num_hidden_layers;  // the layers not reduced yet: [0, below)
  double loss_sum = 0.0;
  for (size_t i = 0; i < micro.size(); ++i) {
    const HostBatch& hb = micro[i];
    if (hb.batch > 0) {  // (a rank without rows in this micro-batch still joins its reduction)
      if (overlap && i + 1 == micro.size())
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
    KILN_RETURN_IF_ERROR(reduce_micro_batch());
  }
  KILN_RETURN_IF_ERROR(reduce(&loss_sum, below));
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
