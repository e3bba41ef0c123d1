#include "infer/stop_strings.h"

#include <algorithm>

namespace kiln {

StopStringMatcher::StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops,
                                     bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens), stops_(std::move(stops)) {}

StopStringMatcher::Update StopStringMatcher::push(int32_t id) {
  Result<std::string> piece = decoder_.push(id);
  if (piece.ok()) pending_ += *piece;
  Update u;
  size_t first = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) first = at, matched = &s;
  }
  if (matched) {
    u.text = pending_.substr(0, first);
    u.stopped = true;
    u.matched = *matched;
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
