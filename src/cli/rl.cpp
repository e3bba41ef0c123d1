// kiln rl: reinforcement learning with the trainer and its own engine in one process (rl/loop.h),
// or, under mpirun with --engines, with the trainer on rank 0 and engines on the ranks listed
// (infer/remote_engine.h; on CUDA each rank takes the GPU of its local rank).
// Every key of the config file (--config rl.toml) is a flag; the [reward] table's keys are the
// dotted flags --reward.kind, --reward.command, ...; unknown keys are errors. SIGTERM / SIGINT save a
// checkpoint after the current step and exit 0 (a second signal ends the process at once).
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "backend/collectives.h"
#include "core/plural.h"
#include "cli/common.h"
#include "cli/optimizer_flags.h"
#include "cli/progress.h"
#include "cli/stop_signal.h"
#include "rl/loop.h"

namespace kiln::cli {
namespace {

struct RlFlags {
  rl::RlOptions o;
  OptimizerFlags optim;
  std::string seed = "0", update_mode = "sync", loss_agg = "token-mean", save_dtype, prefix_cache = "true",
              scale_rewards = "true";
};

Result<bool> parse_bool(const std::string& s, const char* flag) {
  if (s == "true" || s == "1" || s == "yes") return true;
  if (s == "false" || s == "0" || s == "no") return false;
  return invalid_argument(std::string(flag) + " must be true or false (got '" + s + "')");
}

Status resolve(RlFlags& f) {
  rl::RlOptions& o = f.o;
  KILN_ASSIGN_OR_RETURN(o.seed, parse_u64(f.seed, "--seed"));
  KILN_ASSIGN_OR_RETURN(o.update_mode, parse_weight_update_mode(f.update_mode));
  KILN_ASSIGN_OR_RETURN(o.aggregation, rl::parse_loss_aggregation(f.loss_agg));
  KILN_ASSIGN_OR_RETURN(o.prefix_cache, parse_bool(f.prefix_cache, "--prefix-cache"));
  KILN_ASSIGN_OR_RETURN(o.scale_rewards, parse_bool(f.scale_rewards, "--scale-rewards"));
  KILN_ASSIGN_OR_RETURN(o.trainer, f.optim.resolve());
  if (f.save_dtype.empty() || f.save_dtype == "f32")
    o.save_dtype = DType::f32;
  else if (f.save_dtype == "bf16")
    o.save_dtype = DType::bf16;
  else
    return invalid_argument("--save-dtype must be f32 or bf16");
  rl::RewardOptions& r = o.reward;
  if (r.kind.empty()) r.kind = !r.command.empty() ? "command" : !r.url.empty() ? "url" : !r.pattern.empty() ? "regex" : "answer";
  nlohmann::json& c = o.config;
  c = {{"model", o.model_dir}, {"prompts", o.prompts}, {"output", o.output}, {"algorithm", o.algorithm},
       {"mode", o.mode}, {"update_mode", f.update_mode}, {"group_size", o.group_size},
       {"prompts_per_step", o.prompts_per_step}, {"steps", o.steps}, {"max_tokens", o.max_tokens},
       {"temperature", o.temperature}, {"top_p", o.top_p}, {"top_k", o.top_k}, {"micro_batch", o.micro_batch},
       {"minibatches", o.minibatches}, {"max_staleness", o.max_staleness}, {"prefix_cache", o.prefix_cache},
       {"scale_rewards", o.scale_rewards}, {"seed", f.seed}, {"loss_agg", f.loss_agg},
       {"clip_low", o.grpo.clip_low}, {"clip_high", o.grpo.clip_high}, {"tis_cap", o.grpo.tis_cap},
       {"kl_coef", o.grpo.kl_coef}, {"beta", o.dpo_beta}, {"device", o.device}, {"save_every", o.save_every},
       {"keep_last", o.keep_last}, {"dump_rollouts", o.dump_rollouts}, {"save_dtype", f.save_dtype},
       {"reward.kind", r.kind}, {"reward.answer_field", r.answer_field}, {"reward.pattern", r.pattern},
       {"reward.command", r.command}, {"reward.url", r.url}, {"reward.length_penalty", r.length_penalty},
       {"reward.length_target", r.length_target}, {"reward.format_penalty", r.format_penalty},
       {"reward.format_pattern", r.format_pattern}, {"reward.truncation_penalty", r.truncation_penalty}};
  f.optim.record(c);
  return Status::Ok();
}

int rl_on_rank(RlFlags& f, const WorldInfo& world, Collectives* link);

int run_rl_command(RlFlags& f) {
  if (Status st = resolve(f); !st.ok()) return fail(st);
  Result<WorldInfo> world = world_from_environment();
  if (!world.ok()) return fail(world.status());
  std::vector<int32_t>& engines = f.o.engine_ranks;
  if (world->size == 1) {
    if (!engines.empty())
      return fail(invalid_argument("--engines places engines on other ranks: start kiln rl with mpirun -np N "
                                   "(rank 0 trains, the ranks listed generate)"));
    return rl_on_rank(f, *world, nullptr);
  }
  std::sort(engines.begin(), engines.end());
  for (int32_t r = 1; r < world->size; ++r)
    if (!std::binary_search(engines.begin(), engines.end(), r))
      return fail(invalid_argument("rank " + std::to_string(r) + " of " + std::to_string(world->size) +
                                   " has no role: list every rank but 0 in --engines (they serve the engines)"));
  if (engines.front() < 1 || engines.back() >= world->size ||
      std::adjacent_find(engines.begin(), engines.end()) != engines.end())
    return fail(invalid_argument("--engines must list ranks 1 .. " + std::to_string(world->size - 1) + " once each"));
  Result<std::unique_ptr<Collectives>> link = make_collectives(*world, 600.0);
  if (!link.ok()) return fail(link.status());
  if (f.o.device == "cuda") f.o.device = "cuda:" + std::to_string(world->local_rank);  // one GPU per rank
  const int code = rl_on_rank(f, *world, link->get());
  if (code != 0) (*link)->abort_all(code);  // the others would wait for this rank
  return code;
}

int rl_on_rank(RlFlags& f, const WorldInfo& world, Collectives* link) {
  if (world.rank > 0) {  // an engine rank: serves until the trainer's run ends
    // mpirun passes a stop request (SIGTERM, SIGINT) to every rank: rank 0 finishes its step, saves
    // and then stops the engines, which must still be there for that.
    std::signal(SIGTERM, SIG_IGN);
    std::signal(SIGINT, SIG_IGN);
    Status served = rl::serve_rl_engine(f.o, *link);
    if (!served.ok()) return fail(Status(served.code(), "rank " + std::to_string(world.rank) + ": " + served.message()));
    return 0;
  }
  f.o.link = link;
  std::unique_ptr<ProgressBar> bar;
  rl::RlEvents ev;
  ev.info = [&](const std::string& msg) {
    if (bar) bar->clear();
    std::fprintf(stderr, "kiln: %s\n", msg.c_str());
  };
  ev.step = [&](const rl::RlStepReport& r) {
    if (!bar) bar = std::make_unique<ProgressBar>("rl", static_cast<double>(r.steps), 1.0, "steps", r.step - 1.0);
    bar->clear();
    std::printf("step %lld/%lld policy_version %llu reward %.4f std %.4f", static_cast<long long>(r.step),
                static_cast<long long>(r.steps), static_cast<unsigned long long>(r.version), r.reward_mean,
                r.reward_std);
    if (r.accuracy >= 0) std::printf(" accuracy %.3f", r.accuracy);
    if (r.dpo_accuracy >= 0) std::printf(" pref_accuracy %.3f margin %.4f", r.dpo_accuracy, r.dpo_margin);
    std::string staleness;  // samples per lag (trainer version - oldest token version)
    for (const auto& [lag, count] : r.staleness)
      staleness += (staleness.empty() ? "" : ",") + std::to_string(lag) + ":" + std::to_string(count);
    std::printf(" loss %.5f kl %.5f entropy %.4f clip %.3f len %.1f versions %llu..%llu staleness {%s} stale_dropped %lld "
                "time gen %.2fs train %.2fs update %.4fs tok/s rollout %.0f train %.0f\n",
                r.loss, r.kl, r.entropy, r.clip_fraction, r.response_length,
                static_cast<unsigned long long>(r.oldest_version), static_cast<unsigned long long>(r.newest_version),
                staleness.c_str(), static_cast<long long>(r.dropped_stale), r.generate_seconds, r.train_seconds,
                r.update_seconds, r.generate_seconds > 0 ? r.tokens_generated / r.generate_seconds : 0.0,
                r.train_seconds > 0 ? r.tokens_trained / r.train_seconds : 0.0);
    std::fflush(stdout);
    char note[64];
    std::snprintf(note, sizeof(note), "reward %.3f", r.reward_mean);
    bar->update(static_cast<double>(r.step), note, /*force=*/true);
  };
  Result<rl::RlSummary> s = [&] {
    StopOnSignal stop;
    ev.stop = stop.flag();
    return rl::run_rl(f.o, ev);
  }();
  if (bar) bar->clear();
  if (!s.ok()) return fail(s.status());
  std::fprintf(stderr,
               "kiln: %s after %s at policy version %llu; %s trained, each attributed to "
               "its version; cross-version prefix hits: %lld; checkpoint %s\n",
               s->stopped ? "stopped" : "done", count_of(s->steps_done, "step").c_str(),
               static_cast<unsigned long long>(s->version), count_of(s->tokens_attributed, "completion token").c_str(),
               static_cast<long long>(s->cross_version_hits), s->last_checkpoint.c_str());
  return 0;
}

}  // namespace

Runner add_rl(CLI::App& app) {
  auto f = std::make_shared<RlFlags>();
  rl::RlOptions& o = f->o;
  CLI::App* c = app.add_subcommand("rl", "reinforcement learning (GRPO, DPO) with kiln's own engine generating rollouts");
  c->add_option("--model", o.model_dir, "model folder (config.json, safetensors, tokenizer files)")->required();
  c->add_option("--prompts", o.prompts,
                "JSONL of prompts: \"prompt\" (text), \"messages\" (chat) or \"prompt_ids\", plus the fields the "
                "reward reads (e.g. \"answer\"); dpo: \"chosen\" and \"rejected\" too")
      ->required();
  c->add_option("--output", o.output, "run folder: metrics.jsonl and checkpoint-<version>/ folders")->required();
  c->add_option("--algorithm", o.algorithm, "grpo, dpo (offline, preference lines) or online-dpo")
      ->capture_default_str();
  c->add_option("--mode", o.mode, "sync (generate, train, update in turn) or async (generation goes on while training)")
      ->capture_default_str();
  c->add_option("--update-mode", f->update_mode,
                "async: what a weight update does to requests in flight: sync (they finish first), abort, keep")
      ->capture_default_str();
  c->add_option("--max-staleness", o.max_staleness, "async: samples more versions behind than this are dropped")
      ->capture_default_str();
  c->add_option("--group-size", o.group_size, "completions per prompt")->capture_default_str();
  c->add_option("--prompts-per-step", o.prompts_per_step, "prompts per step")->capture_default_str();
  c->add_option("--steps", o.steps, "RL steps")->capture_default_str();
  c->add_option("--max-tokens", o.max_tokens, "completion tokens at most")->capture_default_str();
  c->add_option("--temperature", o.temperature, "sampling temperature (also the trainer's)")->capture_default_str();
  c->add_option("--top-p", o.top_p, "nucleus sampling")->capture_default_str();
  c->add_option("--top-k", o.top_k, "top-k sampling (0: off)")->capture_default_str();
  c->add_option("--micro-batch", o.micro_batch, "sequences per forward/backward")->capture_default_str();
  c->add_option("--minibatches", o.minibatches, "GRPO: optimizer steps per batch of rollouts")->capture_default_str();
  c->add_option("--loss-agg", f->loss_agg, "GRPO loss aggregation: token-mean or seq-mean")->capture_default_str();
  c->add_option("--clip-low", o.grpo.clip_low, "GRPO: lower clip of the ratio (1 - clip_low)")->capture_default_str();
  c->add_option("--clip-high", o.grpo.clip_high, "GRPO: upper clip of the ratio (1 + clip_high)")->capture_default_str();
  c->add_option("--tis-cap", o.grpo.tis_cap, "GRPO: cap of the behaviour importance weight (0: off)")
      ->capture_default_str();
  c->add_option("--kl-coef", o.grpo.kl_coef, "GRPO: coefficient of the k3 KL to the initial model")
      ->capture_default_str();
  c->add_option("--scale-rewards", f->scale_rewards, "GRPO: divide advantages by the group's std (true/false)")
      ->capture_default_str();
  c->add_option("--beta", o.dpo_beta, "DPO: beta")->capture_default_str();
  c->add_option("--prefix-cache", f->prefix_cache, "reuse prompt KV across requests (true/false)")->capture_default_str();
  c->add_option("--seed", f->seed, "the run's seed (prompt order, sampling)")->capture_default_str();
  c->add_option("--device", o.device, "cpu or cuda[:N] (under mpirun, cuda is each rank's local GPU)")->capture_default_str();
  c->add_option("--engines", o.engine_ranks,
                "under mpirun: the ranks that run engines (every rank but 0, which trains), e.g. --engines 1 2 "
                "or engines = [1, 2] in the config file");
  c->add_option("--weight-transport", o.weight_transport,
                "how the weights reach engines on other ranks: nccl (GPU to GPU), mpi (through host memory) or "
                "auto (nccl between different GPUs)")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}))
      ->capture_default_str();
  c->add_option("--save-every", o.save_every, "checkpoint every N steps (and at the end)");
  c->add_option("--keep-last", o.keep_last, "keep only the newest K checkpoints (default: all)");
  c->add_option("--resume", o.resume, "continue from a checkpoint or run folder, or 'auto'");
  c->add_option("--save-dtype", f->save_dtype, "f32 or bf16 for the model in checkpoints")->capture_default_str();
  c->add_option("--dump-rollouts", o.dump_rollouts, "append every rollout record (JSONL) to this file");
  c->add_option("--max-running", o.engine.max_running, "engine: requests decoded together at most")
      ->capture_default_str();
  c->add_option("--max-step-tokens", o.engine.max_step_tokens,
                "engine: tokens per step (0: " + std::to_string(kAutoStepTokensCuda) + " on CUDA, " +
                    std::to_string(kAutoStepTokensCpu) + " on the CPU)")
      ->capture_default_str();
  c->add_option("--mixed-step-tokens", o.engine.mixed_step_tokens, "engine: tokens per step while requests decode")
      ->capture_default_str();
  c->add_option("--kv-tokens", o.engine.kv_tokens, "engine: KV pool capacity in tokens");
  c->add_option("--kv-memory-fraction", o.engine.kv_memory_fraction,
                "engine (CUDA): fraction of the free memory for the KV pool")
      ->capture_default_str();
  c->add_option("--page-size", o.engine.page_size,
                "engine: KV page size (0: " + std::to_string(kAutoPageSizeCuda) + " on CUDA, " +
                    std::to_string(kAutoPageSizeCpu) + " on the CPU)")
      ->capture_default_str();
  f->optim.add(c);
  rl::RewardOptions& r = o.reward;
  c->add_option("--reward.kind", r.kind, "answer, regex, command or url (default: from the keys given)");
  c->add_option("--reward.answer-field", r.answer_field, "answer: the prompt field with the expected answer")
      ->capture_default_str();
  c->add_option("--reward.pattern", r.pattern, "regex: PCRE2 pattern the completion must match");
  c->add_option("--reward.command", r.command, "a program reading rollout records (JSONL) and printing one reward per line");
  c->add_option("--reward.url", r.url, "http:// endpoint answering {\"rewards\": [...]} to {\"rollouts\": [...]}");
  c->add_option("--reward.timeout", r.timeout_s, "command / url: seconds per batch")->capture_default_str();
  c->add_option("--reward.length-penalty", r.length_penalty, "subtracted per completion token beyond length-target");
  c->add_option("--reward.length-target", r.length_target, "tokens before the length penalty applies");
  c->add_option("--reward.format-penalty", r.format_penalty, "subtracted when the text does not match format-pattern");
  c->add_option("--reward.format-pattern", r.format_pattern, "the expected format (PCRE2)");
  c->add_option("--reward.truncation-penalty", r.truncation_penalty, "subtracted when a completion hits max-tokens");
  return [f] { return run_rl_command(*f); };
}

}  // namespace kiln::cli
