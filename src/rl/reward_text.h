// Message helpers shared by the rewards (reward.cpp, reward_external.cpp): how an error names a
// sample and quotes what was wrong.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "rl/rollout.h"

namespace kiln::rl {

// "sample 3 (group 1)": the rollout's index in the scored batch and its group.
inline std::string sample_name(size_t i, const Rollout& r) {
  return "sample " + std::to_string(i) + " (group " + std::to_string(r.group) + ")";
}

// At most 200 bytes of `s`, quoted, for an error message.
inline std::string quote(std::string_view s) {
  std::string q = "'";
  q.append(s.substr(0, 200));
  q += s.size() <= 200 ? "'" : "...' (" + std::to_string(s.size()) + " bytes)";
  return q;
}

}  // namespace kiln::rl
