#include "rl/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/json_text.h"
#include "infer/remote_engine.h"
#include "model/model_text.h"
#include "rl/batches.h"
#include "rl/policy_step.h"
#include "rl/prompts.h"
#include "train/metrics.h"
#include "train/run_checkpoint.h"
#include "train/shuffle.h"

namespace kiln::rl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The sampling seed of one completion: a function of the run's seed and its place in the run only.
uint64_t completion_seed(uint64_t seed, int64_t prompt_serial, int32_t member) {
  uint64_t s = seed ^ 0x6b696c6e726c0000ull;
  splitmix64_next(s);
  s ^= static_cast<uint64_t>(prompt_serial) * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(member);
  return splitmix64_next(s);
}

// Keys of the recorded configuration a resumed run may change.
bool may_change_on_resume(const std::string& key) {
  static const char* const kKeys[] = {"output", "resume", "save_every", "keep_last", "steps", "device",
                                      "config", "dump_rollouts"};
  for (const char* k : kKeys)
    if (key == k) return true;
  return false;
}

// A group of completions of one prompt, on its way through the engine.
struct Group {
  int64_t serial = 0;  // the prompt's place in the run's prompt sequence
  const Prompt* prompt = nullptr;
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<Rollout> rollouts;
};

class Run {
 public:
  Run(const RlOptions& o, const RlEvents& e) : o_(o), events_(e) {}
  Result<RlSummary> run();

 private:
  void info(const std::string& s) const {
    if (events_.info) events_.info(s);
  }
  Status setup();
  Status resume_from(const std::string& checkpoint);
  const Prompt& prompt_at(int64_t serial);
  Result<Group> submit_group(int64_t serial);
  Status collect(Group& g);
  Status score(std::vector<Group>& groups, RlStepReport& rep);
  Status publish(RlStepReport& rep);
  Status save_checkpoint();
  Status write_metrics(const RlStepReport& rep);
  bool uses_engine() const { return o_.algorithm != "dpo"; }

  RlOptions o_;
  RlEvents events_;
  std::unique_ptr<Backend> train_be_, engine_be_;
  std::optional<ModelText> text_;
  std::unique_ptr<TrainModel> model_, reference_;
  std::optional<Trainer> trainer_;
  ModelWeights trainer_weights_;  // the trainer's compute copy as a weight table (the update's source)
  std::shared_ptr<const Transformer> engine_model_;
  std::vector<std::unique_ptr<EngineApi>> engines_;  // empty when the algorithm generates nothing
  std::unique_ptr<Reward> reward_;
  std::vector<Prompt> prompts_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  int64_t step_ = 0, next_serial_ = 0, submitted_samples_ = 0;
  std::deque<Group> in_flight_;  // async: groups submitted and not yet trained on
  std::ofstream dump_;
  RlSummary summary_;
};

Status Run::setup() {
  KILN_ASSIGN_OR_RETURN(Device device, parse_device(o_.device));
  KILN_ASSIGN_OR_RETURN(train_be_, make_backend(device));
  if (device.is_cpu()) {
    engine_be_ = make_cpu_backend(/*batch_invariant=*/true);
  } else {
    KILN_ASSIGN_OR_RETURN(engine_be_, make_backend(device));
  }
  if (!o_.model_dir.empty() && fs::exists(fs::path(o_.model_dir) / "tokenizer.json")) {
    KILN_ASSIGN_OR_RETURN(ModelText t, ModelText::load(o_.model_dir));
    text_ = std::move(t);
  }
  KILN_ASSIGN_OR_RETURN(prompts_, load_prompts(o_.prompts, text_ ? &*text_ : nullptr, o_.algorithm == "dpo"));
  info("prompts: " + std::to_string(prompts_.size()) + " from " + o_.prompts);
  TrainModelOptions tmo;
  std::optional<ModelConfig> random_config;
  if (!o_.random_config.empty()) {
    KILN_ASSIGN_OR_RETURN(ModelConfig c, load_model_config_file(o_.random_config));
    random_config = c;
    tmo.random_seed = o_.seed;
  }
  auto load_model = [&]() -> Result<std::unique_ptr<TrainModel>> {
    if (random_config) return TrainModel::random(*train_be_, *random_config, tmo);
    return TrainModel::load(*train_be_, o_.model_dir, tmo);
  };
  KILN_ASSIGN_OR_RETURN(model_, load_model());
  TrainerOptions to = o_.trainer;
  to.schedule.total_steps = o_.steps * (o_.algorithm == "grpo" ? o_.minibatches : 1);
  KILN_ASSIGN_OR_RETURN(Trainer trainer, Trainer::create(*train_be_, *model_, to));
  trainer_.emplace(std::move(trainer));
  const bool needs_reference = o_.algorithm != "grpo" || o_.grpo.kl_coef != 0.0;
  if (needs_reference) {
    KILN_ASSIGN_OR_RETURN(reference_, load_model());
  }
  if (o_.algorithm != "dpo") {
    KILN_ASSIGN_OR_RETURN(reward_, make_reward(o_.reward));
  }
  if (reward_) info("reward: " + reward_->describe());
  std::string checkpoint;
  if (!o_.resume.empty()) {
    const std::string where = o_.resume == "auto" ? o_.output : o_.resume;
    if (o_.resume != "auto" || !latest_checkpoint(where).empty()) {
      KILN_ASSIGN_OR_RETURN(checkpoint, resolve_checkpoint(where));
      KILN_RETURN_IF_ERROR(resume_from(checkpoint));
    }
  }
  trainer_weights_ = model_->params().compute_weights();
  if (uses_engine()) {
    const ModelConfig& config = model_->config();
    if (!o_.engine_ranks.empty()) {
      // remote: the engines build their own models
    } else if (o_.mode == "sync") {  // zero copy: the engine reads the trainer's compute weights
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> m, Transformer::borrow(*engine_be_, config, trainer_weights_));
      engine_model_ = std::move(m);
    } else {  // its own copy, replaced by each acknowledged update
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> m, Transformer::random(*engine_be_, config, 0));
      for (const auto& [name, shape] : model_tensor_layout(config).fused)
        engine_be_->copy(m->weights().get(name), trainer_weights_.get(name));
      KILN_RETURN_IF_ERROR(engine_be_->synchronize());
      engine_model_ = std::move(m);
    }
    EngineOptions eo = o_.engine;
    eo.prefix_cache = o_.prefix_cache;
    eo.policy_version = trainer_->policy_version();
    std::vector<int32_t> eos = config.eos_token_ids;
    if (text_)
      for (int32_t id : text_->stop_ids())
        if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    if (o_.engine_ranks.empty()) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::create(engine_model_, text_ ? &text_->tokenizer() : nullptr, eos, eo));
      engines_.push_back(std::move(e));
    } else {
      for (int32_t rank : o_.engine_ranks) {
        std::string transport;
        KILN_ASSIGN_OR_RETURN(std::unique_ptr<EngineApi> e,
                              connect_remote_engine(*o_.link, rank, config, trainer_weights_, *train_be_,
                                                    trainer_->policy_version(), eos, eo, o_.weight_transport,
                                                    &transport));
        engines_.push_back(std::move(e));
        info("engine on rank " + std::to_string(rank) + " ready at policy version " +
             std::to_string(trainer_->policy_version()) + " (weights over " + transport + ")");
      }
    }
  }
  std::error_code ec;
  fs::create_directories(o_.output, ec);
  if (ec) return invalid_argument("cannot create the output folder " + o_.output + ": " + ec.message());
  if (!o_.dump_rollouts.empty()) {
    dump_.open(o_.dump_rollouts, step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!dump_) return invalid_argument("cannot write the rollouts file " + o_.dump_rollouts);
  }
  if (step_ == 0) std::ofstream(fs::path(o_.output) / "metrics.jsonl", std::ios::trunc);
  return Status::Ok();
}

Status Run::resume_from(const std::string& checkpoint) {
  KILN_ASSIGN_OR_RETURN(TrainingState state, load_training_checkpoint(*train_be_, model_->params(),
                                                                      trainer_->optimizer(), checkpoint));
  for (const auto& [key, value] : o_.config.items()) {
    if (may_change_on_resume(key)) continue;
    const nlohmann::json recorded = state.config.contains(key) ? state.config[key] : nlohmann::json();
    if (recorded != value)
      return invalid_argument("--resume: " + key + " was " + json_brief(recorded) + " in " + checkpoint + ", now " +
                              json_brief(value) + "; a resumed run keeps its settings");
  }
  trainer_->restore_policy_version(state.policy_version);
  step_ = state.sampler.value("rl_step", int64_t{0});
  next_serial_ = step_ * o_.prompts_per_step;
  submitted_samples_ = next_serial_ * o_.group_size;
  info("resumed from " + checkpoint + " at step " + std::to_string(step_) + ", policy version " +
       std::to_string(state.policy_version));
  // Metrics after the checkpoint's step are dropped (they will be written again).
  const fs::path metrics = fs::path(o_.output) / "metrics.jsonl";
  std::ifstream in(metrics);
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t{0}) <= step_) kept += line + "\n";
  }
  in.close();
  std::ofstream(metrics, std::ios::trunc) << kept;
  return Status::Ok();
}

const Prompt& Run::prompt_at(int64_t serial) {
  const int64_t n = static_cast<int64_t>(prompts_.size());
  const int64_t epoch = serial / n;
  if (epoch != order_epoch_) {
    order_ = seeded_permutation(n, o_.seed, static_cast<uint64_t>(epoch));
    order_epoch_ = epoch;
  }
  return prompts_[static_cast<size_t>(order_[static_cast<size_t>(serial % n)])];
}

Result<Group> Run::submit_group(int64_t serial) {
  Group g;
  g.serial = serial;
  g.prompt = &prompt_at(serial);
  for (int32_t m = 0; m < o_.group_size; ++m) {
    GenerationRequest r;
    r.prompt = g.prompt->ids;
    r.max_tokens = o_.max_tokens;
    r.temperature = o_.temperature;
    r.top_p = o_.top_p;
    r.top_k = o_.top_k;
    r.seed = completion_seed(o_.seed, serial, m);
    r.behaviour_logprobs = true;
    EngineApi& engine = *engines_[static_cast<size_t>(serial % static_cast<int64_t>(engines_.size()))];
    Result<std::shared_ptr<RequestStream>> s = engine.submit(std::move(r));
    if (!s.ok()) return Status(s.status().code(), "prompt " + std::to_string(serial) + ": " + s.status().message());
    g.streams.push_back(*s);
  }
  submitted_samples_ += o_.group_size;
  return g;
}

Status Run::collect(Group& g) {
  for (size_t m = 0; m < g.streams.size(); ++m) {
    Rollout r;
    r.prompt_ids = g.prompt->ids;
    r.fields = g.prompt->fields;
    r.group = g.serial;
    while (std::optional<EngineEvent> e = g.streams[m]->next()) {
      for (const GeneratedToken& t : e->tokens) {
        r.completion_ids.push_back(t.id);
        r.logprobs.push_back(t.logprob);
        r.token_versions.push_back(t.policy_version);
      }
      if (e->finished) {
        if (!e->error.empty()) return Status(StatusCode::internal, "generation failed: " + e->error);
        r.finish_reason = e->finish_reason;
        r.admission_version = e->admission_version;
        r.finish_version = e->finish_version;
      }
    }
    if (text_) {
      KILN_ASSIGN_OR_RETURN(r.text, text_->tokenizer().decode(r.completion_ids, /*skip_special_tokens=*/true));
      r.has_text = true;
    }
    g.rollouts.push_back(std::move(r));
  }
  g.streams.clear();
  return Status::Ok();
}

Status Run::score(std::vector<Group>& groups, RlStepReport& rep) {
  std::vector<Rollout> all;
  for (const Group& g : groups)
    for (const Rollout& r : g.rollouts) all.push_back(r);
  KILN_ASSIGN_OR_RETURN(std::vector<RewardResult> results, reward_->score(all));
  std::vector<double> rewards;
  int64_t correct = 0, judged = 0;
  for (const RewardResult& x : results) {
    if (!std::isfinite(x.reward)) return invalid_argument("the reward returned a non-finite value");
    rewards.push_back(x.reward);
    if (x.correct) {
      ++judged;
      correct += *x.correct ? 1 : 0;
    }
  }
  const std::vector<double> adv = group_advantages(rewards, o_.group_size, o_.scale_rewards);
  size_t k = 0;
  double sum = 0, sq = 0;
  for (Group& g : groups)
    for (Rollout& r : g.rollouts) {
      r.reward = rewards[k];
      r.advantage = adv[k];
      sum += rewards[k];
      sq += rewards[k] * rewards[k];
      ++k;
    }
  const double n = static_cast<double>(std::max<size_t>(k, 1));
  rep.reward_mean = sum / n;
  rep.reward_std = std::sqrt(std::max(0.0, sq / n - rep.reward_mean * rep.reward_mean));
  rep.accuracy = judged > 0 ? static_cast<double>(correct) / static_cast<double>(judged) : -1.0;
  return Status::Ok();
}

Status Run::publish(RlStepReport& rep) {
  rep.version = trainer_->policy_version();
  // Nothing to publish when the step made no update (no sample had a completion, no pair formed).
  if (engines_.empty() || rep.version == engines_.front()->policy_version()) return Status::Ok();
  const auto t0 = Clock::now();
  const WeightUpdateMode mode = o_.mode == "sync" ? WeightUpdateMode::sync : o_.update_mode;
  rep.prefix_hit_tokens = 0;
  rep.cross_version_hits = 0;
  for (const std::unique_ptr<EngineApi>& engine : engines_) {  // each acknowledges before the next
    KILN_ASSIGN_OR_RETURN(WeightUpdateAck ack,
                          engine->update_weights(WeightSource::in_process(trainer_weights_, *train_be_), rep.version, mode));
    rep.ack_seconds = std::max(rep.ack_seconds, ack.seconds);
    if (ack.version != rep.version)
      return Status(StatusCode::internal, "the engine acknowledged version " + std::to_string(ack.version) +
                                              " for " + std::to_string(rep.version));
    const EngineStats st = engine->stats();
    rep.prefix_hit_tokens += st.prefix_hit_tokens;
    rep.cross_version_hits += st.cross_version_hits;
  }
  rep.update_seconds = seconds_since(t0);
  return Status::Ok();
}

Status Run::save_checkpoint() {
  TrainingState state;
  state.step = static_cast<int64_t>(trainer_->policy_version());  // the folder is named by version
  state.policy_version = trainer_->policy_version();
  state.optimizer_steps = trainer_->optimizer().steps_taken();
  state.sampler = {{"rl_step", step_}};
  state.config = o_.config;
  KILN_ASSIGN_OR_RETURN(summary_.last_checkpoint,
                        save_training_checkpoint(*train_be_, model_->params(), trainer_->optimizer(), state,
                                                 o_.model_dir, o_.output, o_.save_dtype, o_.keep_last));
  info("checkpoint: " + summary_.last_checkpoint);
  return Status::Ok();
}

Status Run::write_metrics(const RlStepReport& r) {
  nlohmann::json j = {{"step", r.step},
                      {"policy_version", r.version},
                      {"reward_mean", r.reward_mean},
                      {"reward_std", r.reward_std},
                      {"loss", r.loss},
                      {"grad_norm", r.grad_norm},
                      {"lr", r.lr},
                      {"kl", r.kl},
                      {"entropy", r.entropy},
                      {"clip_fraction", r.clip_fraction},
                      {"importance_weight", r.importance_weight},
                      {"response_length", r.response_length},
                      {"samples", r.samples},
                      {"dropped_stale", r.dropped_stale},
                      {"oldest_version", r.oldest_version},
                      {"newest_version", r.newest_version},
                      {"generate_seconds", r.generate_seconds},
                      {"train_seconds", r.train_seconds},
                      {"update_seconds", r.update_seconds},
                      {"ack_seconds", r.ack_seconds},
                      {"rollout_tokens_per_s", r.generate_seconds > 0 ? r.tokens_generated / r.generate_seconds : 0.0},
                      {"train_tokens_per_s", r.train_seconds > 0 ? r.tokens_trained / r.train_seconds : 0.0},
                      {"prefix_hit_tokens", r.prefix_hit_tokens},
                      {"cross_version_hits", r.cross_version_hits}};
  if (r.accuracy >= 0) j["accuracy"] = r.accuracy;
  if (r.dpo_accuracy >= 0) {
    j["dpo_accuracy"] = r.dpo_accuracy;
    j["dpo_margin"] = r.dpo_margin;
  }
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [lag, count] : r.staleness) hist[std::to_string(lag)] = count;
  j["staleness"] = hist;
  std::ofstream out(fs::path(o_.output) / "metrics.jsonl", std::ios::app);
  out << j.dump() << "\n";
  if (!out) return invalid_argument("cannot append to " + (fs::path(o_.output) / "metrics.jsonl").string());
  return Status::Ok();
}

Result<RlSummary> Run::run() {
  KILN_RETURN_IF_ERROR(setup());
  const int64_t batch_samples = static_cast<int64_t>(o_.prompts_per_step) * o_.group_size;
  while (step_ < o_.steps) {
    if (events_.stop && events_.stop->load()) {
      summary_.stopped = true;
      break;
    }
    RlStepReport rep;
    rep.step = step_ + 1;
    rep.steps = o_.steps;
    const auto t_gen = Clock::now();
    std::vector<Group> groups;
    if (o_.algorithm == "dpo") {
      for (int32_t i = 0; i < o_.prompts_per_step; ++i) {
        Group g;
        g.serial = next_serial_;
        g.prompt = &prompt_at(next_serial_++);
        groups.push_back(std::move(g));
      }
    } else if (o_.mode == "sync") {
      for (int32_t i = 0; i < o_.prompts_per_step; ++i) {
        KILN_ASSIGN_OR_RETURN(Group g, submit_group(next_serial_++));
        groups.push_back(std::move(g));
      }
      for (Group& g : groups) KILN_RETURN_IF_ERROR(collect(g));
    } else {
      // Async: keep the engine busy up to AReaL's bound, then take the oldest groups. The bound
      // counts RL steps (batches): a step advances the version by its optimizer steps (GRPO's
      // minibatches), so max_staleness versions allow max_staleness / versions_per_step steps of lag.
      const int64_t versions_per_step = o_.algorithm == "grpo" ? o_.minibatches : 1;
      const int64_t lag_steps = o_.max_staleness / versions_per_step;
      while (submitted_samples_ + o_.group_size <= (lag_steps + step_ + 1) * batch_samples) {
        KILN_ASSIGN_OR_RETURN(Group g, submit_group(next_serial_++));
        in_flight_.push_back(std::move(g));
      }
      for (int32_t i = 0; i < o_.prompts_per_step && !in_flight_.empty(); ++i) {
        Group g = std::move(in_flight_.front());
        in_flight_.pop_front();
        KILN_RETURN_IF_ERROR(collect(g));
        groups.push_back(std::move(g));
      }
    }
    rep.generate_seconds = seconds_since(t_gen);
    const auto t_train = Clock::now();
    if (o_.algorithm == "dpo") {
      std::vector<std::pair<SequenceRef, SequenceRef>> pairs;
      for (const Group& g : groups)
        pairs.push_back({{&g.prompt->ids, &g.prompt->chosen}, {&g.prompt->ids, &g.prompt->rejected}});
      KILN_RETURN_IF_ERROR(train_dpo_step(*trainer_, *reference_, o_, pairs, rep));
    } else {
      KILN_RETURN_IF_ERROR(score(groups, rep));
      const uint64_t now = trainer_->policy_version();
      std::vector<Rollout*> samples;
      for (Group& g : groups)
        for (Rollout& r : g.rollouts) {
          rep.tokens_generated += static_cast<int64_t>(r.completion_ids.size());
          const int64_t lag = static_cast<int64_t>(now - std::min(now, r.oldest_version()));
          if (lag > o_.max_staleness && o_.mode == "async") {
            ++rep.dropped_stale;
            continue;
          }
          ++rep.staleness[lag];
          samples.push_back(&r);
          if (dump_.is_open()) dump_ << to_json(r).dump() << "\n";
        }
      if (dump_.is_open()) dump_.flush();
      if (o_.algorithm == "online-dpo") {
        std::vector<std::pair<SequenceRef, SequenceRef>> pairs;
        for (const Group& g : groups) {
          auto best = std::max_element(g.rollouts.begin(), g.rollouts.end(),
                                       [](const Rollout& a, const Rollout& b) { return a.reward < b.reward; });
          auto worst = std::min_element(g.rollouts.begin(), g.rollouts.end(),
                                        [](const Rollout& a, const Rollout& b) { return a.reward < b.reward; });
          if (best->reward > worst->reward && !best->completion_ids.empty() && !worst->completion_ids.empty())
            pairs.push_back({{&best->prompt_ids, &best->completion_ids}, {&worst->prompt_ids, &worst->completion_ids}});
        }
        if (pairs.empty())  // no optimizer step: the policy version stays
          info("warning: step " + std::to_string(step_ + 1) + " has no preference pair (every group's rewards tie, or " +
               "a reply is empty); nothing is trained");
        KILN_RETURN_IF_ERROR(train_dpo_step(*trainer_, *reference_, o_, pairs, rep));
      } else {
        KILN_RETURN_IF_ERROR(train_grpo_step(*trainer_, *model_, reference_.get(), o_, samples, rep));
        summary_.tokens_attributed += rep.tokens_attributed;
      }
    }
    rep.train_seconds = seconds_since(t_train);
    KILN_RETURN_IF_ERROR(publish(rep));
    ++step_;
    summary_.steps_done = step_;
    KILN_RETURN_IF_ERROR(write_metrics(rep));
    if (events_.step) events_.step(rep);
    if (o_.save_every > 0 && step_ % o_.save_every == 0 && step_ < o_.steps) KILN_RETURN_IF_ERROR(save_checkpoint());
  }
  if (o_.final_checkpoint) KILN_RETURN_IF_ERROR(save_checkpoint());
  summary_.version = trainer_->policy_version();
  for (const std::unique_ptr<EngineApi>& engine : engines_) summary_.cross_version_hits += engine->stats().cross_version_hits;
  return summary_;
}

}  // namespace

Status validate_rl_options(const RlOptions& o) {
  if (o.model_dir.empty() && o.random_config.empty()) return invalid_argument("--model is required");
  if (o.prompts.empty()) return invalid_argument("--prompts is required (a JSONL file)");
  if (o.output.empty()) return invalid_argument("--output is required");
  if (o.algorithm != "grpo" && o.algorithm != "dpo" && o.algorithm != "online-dpo")
    return invalid_argument("--algorithm must be grpo, dpo or online-dpo");
  if (o.mode != "sync" && o.mode != "async") return invalid_argument("--mode must be sync or async");
  if (o.group_size < 1) return invalid_argument("--group-size must be at least 1");
  if (o.algorithm == "online-dpo" && o.group_size < 2) return invalid_argument("online-dpo needs --group-size >= 2");
  if (o.prompts_per_step < 1) return invalid_argument("--prompts-per-step must be at least 1");
  if (o.steps < 0) return invalid_argument("--steps must not be negative");
  if (o.max_tokens < 1) return invalid_argument("--max-tokens must be at least 1");
  if (o.micro_batch < 2) return invalid_argument("--micro-batch must be at least 2 (rows per forward)");
  if (o.minibatches < 1) return invalid_argument("--minibatches must be at least 1");
  if (o.max_staleness < 0) return invalid_argument("--max-staleness must not be negative");
  if (!(o.temperature > 0.0f && std::isfinite(o.temperature)))
    return invalid_argument("--temperature must be > 0 (RL samples; the trainer's log-probabilities use it)");
  if (!(o.grpo.clip_low >= 0 && o.grpo.clip_low < 1 && o.grpo.clip_high >= 0 && std::isfinite(o.grpo.clip_high)))
    return invalid_argument("--clip-low must be within [0, 1) and --clip-high a finite value >= 0");
  if (!(o.grpo.tis_cap >= 0 && std::isfinite(o.grpo.tis_cap)))
    return invalid_argument("--tis-cap must be a finite value >= 0 (0: no importance weight)");
  if (!(o.grpo.kl_coef >= 0 && std::isfinite(o.grpo.kl_coef)))
    return invalid_argument("--kl-coef must be a finite value >= 0");
  if (!(o.dpo_beta > 0 && std::isfinite(o.dpo_beta))) return invalid_argument("--beta must be a finite value > 0");
  if (o.save_every < 0) return invalid_argument("--save-every must not be negative");
  if (o.keep_last < 0) return invalid_argument("--keep-last must not be negative (0: keep every checkpoint)");
  return Status::Ok();
}

Result<RlSummary> run_rl(const RlOptions& options, const RlEvents& events) {
  KILN_RETURN_IF_ERROR(validate_rl_options(options));
  Run run(options, events);
  return run.run();
}

Status serve_rl_engine(const RlOptions& o, Collectives& link) {
  KILN_ASSIGN_OR_RETURN(Device device, parse_device(o.device));
  std::unique_ptr<Backend> be;
  if (device.is_cpu()) {
    be = make_cpu_backend(/*batch_invariant=*/true);  // as the in-process engine's
  } else {
    KILN_ASSIGN_OR_RETURN(be, make_backend(device));
  }
  Result<ModelConfig> config =
      o.random_config.empty() ? load_model_config(o.model_dir) : load_model_config_file(o.random_config);
  KILN_RETURN_IF_ERROR(config.status());
  return serve_remote_engine(link, *be, *config, nullptr);
}

}  // namespace kiln::rl
