// LR schedule multipliers (see schedule.h), written as transformers' lambdas are, in double.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln {

Result<LrSchedule::Kind> LrSchedule::parse_kind(std::string_view name) {
  if (name == "constant") return Kind::constant;
  if (name == "linear") return Kind::linear;
  if (name == "cosine") return Kind::cosine;
  if (name == "wsd") return Kind::wsd;
  return invalid_argument("--lr-schedule must be constant, linear, cosine or wsd (got '" + std::string(name) + "')");
}

const char* LrSchedule::kind_name(Kind kind) {
  switch (kind) {
    case Kind::constant: return "constant";
    case Kind::linear: return "linear";
    case Kind::cosine: return "cosine";
    case Kind::wsd: return "wsd";
  }
  return "?";
}

Status LrSchedule::validate() const {
  if (warmup_steps < 0) return invalid_argument("--warmup-steps must be >= 0");
  if (total_steps < 0) return invalid_argument("the number of training steps must be >= 0");
  if (!(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0)) return invalid_argument("--min-lr-ratio must be in [0, 1]");
  if (kind == Kind::wsd) {
    if (decay_steps <= 0) return invalid_argument("--lr-schedule wsd needs --decay-steps > 0");
    if (warmup_steps + decay_steps > total_steps)
      return invalid_argument("--warmup-steps (" + std::to_string(warmup_steps) + ") plus --decay-steps (" +
                              std::to_string(decay_steps) + ") exceed the " + std::to_string(total_steps) +
                              " training steps");
  } else if (decay_steps != 0) {
    return invalid_argument("--decay-steps applies to --lr-schedule wsd only");
  }
  if (kind == Kind::linear || kind == Kind::constant) {
    if (min_lr_ratio != 0.0) return invalid_argument("--min-lr-ratio applies to --lr-schedule cosine and wsd only");
  }
  return Status::Ok();
}

double LrSchedule::multiplier(int64_t step) const {
  const double s = static_cast<double>(step), w = static_cast<double>(warmup_steps);
  const double t = static_cast<double>(total_steps);
  const double pi = std::numbers::pi;
  switch (kind) {
    case Kind::constant:
      return step < warmup_steps ? s / std::max(1.0, w) : 1.0;
    case Kind::linear:
      if (step < warmup_steps) return s / std::max(1.0, w);
      return std::max(0.0, (t - s) / std::max(1.0, t - w));
    case Kind::cosine: {
      if (step < warmup_steps) return s / std::max(1.0, w);
      const double progress = (s - w) / std::max(1.0, t - w);
      double factor = 0.5 * (1.0 + std::cos(pi * 0.5 * 2.0 * progress));
      factor = factor * (1 - min_lr_ratio) + min_lr_ratio;
      return std::max(0.0, factor);
    }
    case Kind::wsd: {
      const int64_t stable = total_steps - warmup_steps - decay_steps;
      if (step < warmup_steps) {
        const double factor = (s / std::max(1.0, w)) * (1.0 - min_lr_ratio) + min_lr_ratio;
        return std::max(0.0, factor);
      }
      if (step < warmup_steps + stable) return 1.0;
      if (step < warmup_steps + stable + decay_steps) {
        const double progress = (s - w - static_cast<double>(stable)) / std::max(1.0, static_cast<double>(decay_steps));
        double factor = 0.5 * (1.0 + std::cos(pi * 0.5 * 2.0 * progress));
        factor = factor * (1.0 - min_lr_ratio) + min_lr_ratio;
        return std::max(0.0, factor);
      }
      return min_lr_ratio;
    }
  }
  return 1.0;
}

}  // namespace kiln
