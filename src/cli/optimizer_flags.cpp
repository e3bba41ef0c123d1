#include "cli/optimizer_flags.h"

#include <stdexcept>
#include <utility>

namespace kiln::cli {
namespace {

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

}  // namespace

void OptimizerFlags::add(CLI::App* t) {
  t->add_option("--lr", lr, "base learning rate (the schedule scales it)")->capture_default_str();
  t->add_option("--lr-schedule", lr_schedule, "constant, linear, cosine or wsd (as transformers' schedules)")
      ->capture_default_str();
  t->add_option("--warmup-steps", warmup_steps, "linear warmup steps")->capture_default_str();
  t->add_option("--min-lr-ratio", min_lr_ratio, "cosine / wsd: the final lr as a fraction of --lr")
      ->capture_default_str();
  t->add_option("--decay-steps", decay_steps, "wsd: steps of the final decay");
  t->add_option("--betas", betas, "AdamW beta1,beta2")->capture_default_str();
  t->add_option("--eps", eps, "AdamW epsilon")->capture_default_str();
  t->add_option("--weight-decay", weight_decay, "decoupled weight decay (AdamW) / L2 (SGD)")->capture_default_str();
  t->add_option("--clip-norm", clip_norm, "clip the global gradient norm to this value (default: off)");
  t->add_option("--optimizer", optimizer,
                "adamw, sgd (plain, no momentum) or muon (torch.optim.Muon on the layers' matrices, AdamW on the rest)")
      ->capture_default_str();
  t->add_option("--muon-momentum", muon_momentum, "Muon momentum (Nesterov)")->capture_default_str();
  t->add_option("--muon-adjust-lr", muon_adjust_lr,
                "Muon's per-matrix lr: original (sqrt(max(1, rows/cols))) or match_rms_adamw (0.2 sqrt(max(rows, cols)))")
      ->capture_default_str();
}

Result<TrainerOptions> OptimizerFlags::resolve() const {
  TrainerOptions t;
  OptimizerOptions& opt = t.optimizer;
  if (optimizer == "adamw")
    opt.kind = OptimizerOptions::Kind::adamw;
  else if (optimizer == "sgd")
    opt.kind = OptimizerOptions::Kind::sgd;
  else if (optimizer == "muon")
    opt.kind = OptimizerOptions::Kind::muon;
  else
    return invalid_argument("--optimizer must be adamw, sgd or muon (got '" + optimizer + "')");
  opt.muon_momentum = muon_momentum;
  if (muon_adjust_lr == "original")
    opt.muon_adjust_lr = ops::MuonAdjustLr::original;
  else if (muon_adjust_lr == "match_rms_adamw")
    opt.muon_adjust_lr = ops::MuonAdjustLr::match_rms_adamw;
  else
    return invalid_argument("--muon-adjust-lr must be original or match_rms_adamw (got '" + muon_adjust_lr + "')");
  KILN_ASSIGN_OR_RETURN(auto b, parse_betas(betas));
  opt.lr = lr;
  opt.beta1 = b.first;
  opt.beta2 = b.second;
  opt.eps = eps;
  opt.weight_decay = weight_decay;
  opt.clip_norm = clip_norm;
  KILN_ASSIGN_OR_RETURN(LrSchedule::Kind kind, LrSchedule::parse_kind(lr_schedule));
  t.schedule = {kind, warmup_steps, 0, decay_steps, min_lr_ratio};
  return t;
}

void OptimizerFlags::record(nlohmann::json& c) const {
  c["lr"] = lr;
  c["lr_schedule"] = lr_schedule;
  c["warmup_steps"] = warmup_steps;
  c["min_lr_ratio"] = min_lr_ratio;
  c["decay_steps"] = decay_steps;
  c["betas"] = betas;
  c["eps"] = eps;
  c["weight_decay"] = weight_decay;
  c["clip_norm"] = clip_norm;
  c["optimizer"] = optimizer;
  c["muon_momentum"] = muon_momentum;
  c["muon_adjust_lr"] = muon_adjust_lr;
}

}  // namespace kiln::cli
