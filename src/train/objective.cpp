// Objectives (see objective.h).
#include "train/objective.h"

namespace kiln {

Result<Objective> Objective::create(const std::string& name, const std::string& kwargs_text, const TrainingData& data) {
  Objective o;
  if (name.empty())
    o.kind = data.has_target_mask() ? Kind::sft : Kind::pretrain;
  else if (name == "pretrain")
    o.kind = Kind::pretrain;
  else if (name == "sft")
    o.kind = Kind::sft;
  else
    return invalid_argument("--objective must be pretrain or sft (got '" + name + "')");
  if (o.kind == Kind::sft && !data.has_target_mask())
    return invalid_argument(
        "--objective sft trains on the tokens the data marks, and this data marks none: preprocess chat data "
        "with kiln preprocess --format chat (assistant tokens), give labels in the JSONL, or use --objective pretrain");
  if (!kwargs_text.empty()) {
    try {
      o.kwargs = nlohmann::json::parse(kwargs_text);
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(std::string("--objective-kwargs is not valid JSON: ") + e.what());
    }
    if (!o.kwargs.is_object()) return invalid_argument("--objective-kwargs must be a JSON object");
  }
  for (const auto& [key, value] : o.kwargs.items())
    return invalid_argument("--objective-kwargs: the " + std::string(o.name()) + " objective has no option '" + key +
                            "' (it takes none)");
  return o;
}

}  // namespace kiln
