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

Status Trainer::reduce_layer(int64_t layer) {
  for (const auto& [b, e] : model_->params().layer_ranges(layer)) KILN_RETURN_IF_ERROR(reduce_range(b, e));
  return Status::Ok();
}

Status Trainer::reduce_range(int64_t begin, int64_t end) {
  Collectives& coll = *options_.collectives;
  Backend& be = model_->backend();
  const ParameterSet& params = model_->params();
  const Tensor g = params.grads();
  if (options_.zero == 0) return coll.all_reduce_sum_overlapped(be, g.rows(begin, end));
  const int64_t shard = params.shard_size();  // rank r owns [r * shard, (r + 1) * shard)
  for (int64_t at = begin; at < end;) {
    const int64_t owner = at / shard, piece_end = std::min(end, (owner + 1) * shard);
    KILN_RETURN_IF_ERROR(coll.reduce_sum_overlapped(be, g.rows(at, piece_end), static_cast<int32_t>(owner)));
    at = piece_end;
  }
  return Status::Ok();
}

// With ZeRO-2 the reduce leaves in this rank's shard the sum over the ranks of everyone's
// gradients there; clearing the rest of the buffer makes the next micro-batch add to the shard only
// this rank's new gradients besides the sum so far, and to the other shards only the new ones: the
// next reduction then sums exactly the step's gradients so far. (The padding at the end of the
// last shard holds no gradient and is never reduced.)
Status Trainer::finish_reduction(int64_t below) {
  Backend& be = model_->backend();
  Collectives& coll = *options_.collectives;
  const ParameterSet& params = model_->params();
  for (int64_t l = below - 1; l >= 0; --l) KILN_RETURN_IF_ERROR(reduce_layer(l));
  for (const auto& [b, e] : params.non_layer_ranges()) KILN_RETURN_IF_ERROR(reduce_range(b, e));
  KILN_RETURN_IF_ERROR(coll.join(be));
  if (options_.zero == 2) {
    const Tensor g = params.grads();
    const int64_t b = optimizer_.own_begin(), e = optimizer_.own_end();
    if (b > 0) be.zero(g.rows(0, b));
    if (e < g.numel()) be.zero(g.rows(e, g.numel()));
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
