// Training objectives of `kiln train --objective`: which tokens of a row are trained on.
//   pretrain  every token but the first of each document (next-token prediction everywhere)
//   sft       only the tokens the data marks: a preprocessed chat split's assistant mask, or a
//             JSONL's labels
// Objective-specific options arrive as one JSON object (`--objective-kwargs`, or a TOML table of
// that name in --config), the way DPO and GRPO will take theirs; unknown keys are an error naming
// them. pretrain and sft take none yet.
// Thread safety: plain value.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/dataset.h"

namespace kiln {

struct Objective {
  enum class Kind { pretrain, sft };
  Kind kind = Kind::pretrain;
  nlohmann::json kwargs = nlohmann::json::object();

  // `name` empty: sft for data that marks its targets (chat, JSONL labels), pretrain otherwise.
  // `kwargs_text` is a JSON object ("" = none).
  static Result<Objective> create(const std::string& name, const std::string& kwargs_text, const TrainingData& data);
  bool every_token() const { return kind == Kind::pretrain; }
  const char* name() const { return kind == Kind::pretrain ? "pretrain" : "sft"; }
};

}  // namespace kiln
