// kiln eval --task generate (eval.h): completions scored by the RL rewards' verifiers, pass@k.
#include <algorithm>

#include "eval/eval.h"
#include "rl/prompts.h"
#include "rl/reward.h"

namespace kiln::eval {

Result<TaskOutput> generate(const EvalContext& ctx, const GenerateOptions& o) {
  if (!ctx.text) return invalid_argument("the generate task needs the model's tokenizer.json (completions are scored as text)");
  if (o.samples < 1) return invalid_argument("--samples must be at least 1");
  std::vector<int32_t> ks = o.pass_at;
  if (ks.empty()) {
    ks.push_back(1);
    if (o.samples > 1) ks.push_back(o.samples);
  }
  for (int32_t k : ks)
    if (k < 1 || k > o.samples)
      return invalid_argument("--pass-at " + std::to_string(k) + " must be within [1, --samples = " +
                              std::to_string(o.samples) + "]");
  // The verifier the RL rewards use: one implementation of answer extraction and matching.
  rl::RewardOptions ro;
  ro.kind = o.scorer;
  if (o.scorer == "answer") {
    ro.answer_field = o.answer_field;
  } else if (o.scorer == "regex") {
    ro.pattern = o.pattern;
  } else {
    return invalid_argument("--scorer must be 'answer' (numeric answer match) or 'regex', not '" + o.scorer + "'");
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<rl::Reward> reward, rl::make_reward(ro));
  KILN_ASSIGN_OR_RETURN(std::vector<rl::Prompt> prompts, rl::load_prompts(o.data, ctx.text, false, o.chat));
  const int64_t longest = ctx.engine->max_sequence_tokens();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const nlohmann::json& f = prompts[i].fields;
    if (o.scorer == "answer" && !f.contains(o.answer_field))
      return invalid_argument(o.data + ": prompt " + std::to_string(i + 1) + " has no \"" + o.answer_field +
                              "\" field to compare with");
    if (f.contains("stop") && !f["stop"].is_string() && !f["stop"].is_array())
      return invalid_argument(o.data + ": prompt " + std::to_string(i + 1) + ": \"stop\" must be a string or an array of strings");
    if (static_cast<int64_t>(prompts[i].ids.size()) + o.sampling.max_tokens > longest)
      return invalid_argument(o.data + ": prompt " + std::to_string(i + 1) + " (" + std::to_string(prompts[i].ids.size()) +
                              " tokens) plus --max-tokens " + std::to_string(o.sampling.max_tokens) +
                              " exceeds the engine's longest sequence of " + std::to_string(longest) + " tokens");
  }
  const int64_t n = o.samples;
  std::vector<rl::Rollout> group(static_cast<size_t>(n));
  TaskOutput out;
  std::vector<double> pass_sums(ks.size(), 0.0);
  int64_t correct_samples = 0, truncated = 0, done_prompts = 0;
  Status run = run_requests(
      ctx, static_cast<int64_t>(prompts.size()) * n,
      [&](int64_t i) -> Result<GenerationRequest> {
        const rl::Prompt& p = prompts[static_cast<size_t>(i / n)];
        GenerationRequest r = o.sampling;
        r.prompt = p.ids;
        r.seed = o.sampling.seed + static_cast<uint64_t>(i);  // each sample its own draws, reproducibly
        if (p.fields.contains("stop")) {
          const nlohmann::json& s = p.fields["stop"];
          for (const nlohmann::json& x : s.is_array() ? s : nlohmann::json::array({s})) {
            if (!x.is_string() || x.get<std::string>().empty())
              return invalid_argument(o.data + ": prompt " + std::to_string(i / n + 1) + ": a stop string must be a non-empty string");
            r.stop.push_back(x.get<std::string>());
          }
        }
        return r;
      },
      [&](int64_t i, Finished&& f) -> Status {
        const int64_t pi = i / n, j = i % n;
        rl::Rollout& r = group[static_cast<size_t>(j)];
        r = rl::Rollout{};
        r.prompt_ids = prompts[static_cast<size_t>(pi)].ids;
        r.completion_ids = std::move(f.ids);
        r.text = std::move(f.text);
        r.has_text = true;
        r.finish_reason = f.finish_reason;
        r.group = pi;
        r.fields = prompts[static_cast<size_t>(pi)].fields;
        if (j + 1 < n) return Status::Ok();
        KILN_ASSIGN_OR_RETURN(std::vector<rl::RewardResult> scored, reward->score(group));
        int64_t c = 0;
        nlohmann::ordered_json completions = nlohmann::ordered_json::array(), correct = nlohmann::ordered_json::array();
        for (size_t k = 0; k < group.size(); ++k) {
          const bool ok = scored[k].correct.value_or(scored[k].reward > 0.5);
          c += ok;
          truncated += group[k].finish_reason == "length";
          completions.push_back(group[k].text);
          correct.push_back(ok);
        }
        correct_samples += c;
        for (size_t k = 0; k < ks.size(); ++k) pass_sums[k] += pass_at_k(n, c, ks[k]);
        nlohmann::ordered_json item;
        item["prompt"] = pi + 1;
        if (group[0].fields.contains(o.answer_field)) item["reference"] = group[0].fields[o.answer_field];
        item["completions"] = std::move(completions);
        if (o.scorer == "answer") {
          nlohmann::ordered_json extracted = nlohmann::ordered_json::array();
          for (const rl::Rollout& g : group) {
            std::optional<std::string> a = rl::extract_answer(g.text);
            extracted.push_back(a ? nlohmann::ordered_json(*a) : nlohmann::ordered_json(nullptr));
          }
          item["extracted"] = std::move(extracted);
        }
        item["correct"] = std::move(correct);
        out.details.push_back(std::move(item));
        if (ctx.progress) ctx.progress(++done_prompts, static_cast<int64_t>(prompts.size()));
        return Status::Ok();
      });
  KILN_RETURN_IF_ERROR(run);
  const double np = static_cast<double>(prompts.size());
  out.items = static_cast<int64_t>(prompts.size());
  out.results["prompts"] = prompts.size();
  out.results["samples_per_prompt"] = n;
  out.results["accuracy"] = static_cast<double>(correct_samples) / (np * static_cast<double>(n));
  for (size_t k = 0; k < ks.size(); ++k) out.results["pass@" + std::to_string(ks[k])] = pass_sums[k] / np;
  out.results["truncated_samples"] = truncated;
  return out;
}

}  // namespace kiln::eval
