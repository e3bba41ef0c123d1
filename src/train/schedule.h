// Learning-rate schedules, as the multiplier of the base learning rate at an optimizer step, defined
// as transformers 5.17 defines them (the lambdas its LambdaLR schedules multiply the base lr by):
//   constant  get_constant_schedule_with_warmup
//   linear    get_linear_schedule_with_warmup: from 1 down to 0 at total_steps
//   cosine    get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate = min_lr_ratio), half a cycle;
//             with min_lr_ratio 0 it is get_cosine_schedule_with_warmup
//   wsd       get_wsd_schedule(num_decay_steps = decay_steps, num_training_steps = total_steps,
//             min_lr_ratio): linear warmup from min_lr_ratio, stable at 1, cosine decay over the last
//             decay_steps steps to min_lr_ratio
// Each warms up linearly over warmup_steps. The step is the policy version (train/trainer.h): the
// optimizer steps committed so far, so the next step runs at lr * multiplier(version).
// Plain value type; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

struct LrSchedule {
  enum class Kind { constant, linear, cosine, wsd };
  Kind kind = Kind::constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;   // linear, cosine, wsd: where the schedule ends
  int64_t decay_steps = 0;   // wsd only
  double min_lr_ratio = 0.0; // cosine and wsd

  // "constant", "linear", "cosine", "wsd" -> Kind; anything else is an error naming the choices.
  static Result<Kind> parse_kind(std::string_view name);
  static const char* kind_name(Kind kind);
  // Errors name the flag: --warmup-steps, --decay-steps, --min-lr-ratio, the step count.
  Status validate() const;
  double multiplier(int64_t step) const;
};

}  // namespace kiln
