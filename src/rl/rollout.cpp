#include "rl/rollout.h"

#include <algorithm>

namespace kiln::rl {

uint64_t Rollout::oldest_version() const {
  if (token_versions.empty()) return admission_version;
  return *std::min_element(token_versions.begin(), token_versions.end());
}

nlohmann::json version_runs(const std::vector<uint64_t>& versions) {
  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < versions.size(); ++i)
    if (i == 0 || versions[i] != versions[i - 1]) runs.push_back({static_cast<int64_t>(i), versions[i]});
  return runs;
}

nlohmann::json to_json(const Rollout& r, bool with_reward) {
  nlohmann::json j = r.fields.is_object() ? r.fields : nlohmann::json::object();
  j["prompt_ids"] = r.prompt_ids;
  j["completion_ids"] = r.completion_ids;
  j["versions"] = version_runs(r.token_versions);
  j["logprobs"] = r.logprobs;
  j["admission_version"] = r.admission_version;
  j["finish_version"] = r.finish_version;
  j["finish_reason"] = r.finish_reason;
  j["group"] = r.group;
  if (with_reward) {
    j["reward"] = r.reward;
    j["advantage"] = r.advantage;
  }
  if (r.has_text) j["text"] = r.text;
  return j;
}

}  // namespace kiln::rl
