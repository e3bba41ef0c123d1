// Rollout records: one generated sample with everything RL's losses and a reader need to attribute
// it to the behaviour policy that produced it (rl/rollout.cpp writes and reads them as JSON lines).
//
//   prompt_ids, completion_ids   the tokens
//   versions                     per-token policy versions, run-length: [[first completion index, version], ...]
//   logprobs                     the engine's behaviour log-probability of each completion token, under
//                                the distribution it was sampled from
//   admission_version, finish_version
//   group                        the prompt's group (GRPO: the group_size samples of one prompt)
//   reward, advantage
//   fields                       the prompt line's own fields (e.g. "answer"), copied as given
//   text                         the completion's text where the model has a tokenizer
// Thread safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::rl {

struct Rollout {
  std::vector<int32_t> prompt_ids, completion_ids;
  std::vector<uint64_t> token_versions;  // one per completion token
  std::vector<float> logprobs;           // one per completion token
  uint64_t admission_version = 0, finish_version = 0;
  int64_t group = 0;
  double reward = 0.0, advantage = 0.0;
  std::string finish_reason;
  std::string text;        // completion text (special tokens skipped)
  bool has_text = false;   // text was decoded (the model has a tokenizer); it may still be empty
  nlohmann::json fields;   // the prompt line's fields (an object)

  // The oldest version among the completion's tokens (admission_version when there are none).
  uint64_t oldest_version() const;
};

// Run-length form of per-token versions: [[first index, version], ...], a new run wherever it changes.
nlohmann::json version_runs(const std::vector<uint64_t>& versions);

// The record as one JSON object (with_reward false: without "reward" and "advantage", what a reward
// program reads).
nlohmann::json to_json(const Rollout& r, bool with_reward = true);

}  // namespace kiln::rl
