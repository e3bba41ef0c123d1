#include "serve/reasoning.h"

#include <algorithm>

namespace kiln::serve {
namespace {

// The length of the longest suffix of `s` that is a proper prefix of `tag` (text that the next
// piece may complete into the tag).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool prompt_opens_block)
    : state_(prompt_opens_block ? State::reasoning : State::start) {}

ReasoningSplitter::Output ReasoningSplitter::feed(std::string_view text) {
  Output out;
  pending_.append(text);
  if (state_ == State::start) {
    if (pending_.size() < kOpen.size() && kOpen.substr(0, pending_.size()) == pending_) return out;  // undecided
    if (pending_.compare(0, kOpen.size(), kOpen) == 0) {
      pending_.erase(0, kOpen.size());
      state_ = State::reasoning;
    } else {
      state_ = State::content;
    }
  }
  if (state_ == State::reasoning) {
    const size_t close = pending_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = partial_tag_suffix(pending_, kClose);
      out.reasoning = pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.reasoning = pending_.substr(0, close);
    pending_.erase(0, close + kClose.size());
    state_ = State::content;
  }
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

ReasoningSplitter::Output ReasoningSplitter::finish() {
  Output out;
  (state_ == State::reasoning ? out.reasoning : out.content) = std::move(pending_);
  pending_.clear();
  return out;
}

bool prompt_opens_think(std::string_view prompt) {
  const size_t open = prompt.rfind(ReasoningSplitter::kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt.rfind(ReasoningSplitter::kClose);
  return close == std::string_view::npos || close < open;
}

}  // namespace kiln::serve
