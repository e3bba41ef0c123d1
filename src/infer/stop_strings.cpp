#include "infer/stop_strings.h"

#include <algorithm>

namespace kiln {

StopStringMatcher::StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer, /*skip_special_tokens=*/true), stops_(std::move(stops)) {}

StopStringMatcher::Update StopStringMatcher::push(int32_t id) {
  Result<std::string> piece = decoder_.push(id);
  if (piece.ok()) pending_ += *piece;
  Update u;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    u.text = pending_.substr(0, first);
    u.stopped = true;
    pending_.clear();
    return u;
  }
  // Hold back the longest tail of the text that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  u.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return u;
}

std::string StopStringMatcher::flush() {
  std::string rest = std::move(pending_) + decoder_.finish();
  pending_.clear();
  return rest;
}

}  // namespace kiln
