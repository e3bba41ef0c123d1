#include "infer/stop_strings.h"

#include <algorithm>
#include <limits>

namespace kiln {

StopStrings::StopStrings(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    Stop st;
    st.text = std::move(s);
    st.border.assign(st.text.size(), 0);
    for (size_t i = 1, k = 0; i < st.text.size(); ++i) {
      while (k > 0 && st.text[i] != st.text[k]) k = static_cast<size_t>(st.border[k - 1]);
      if (st.text[i] == st.text[k]) ++k;
      st.border[i] = static_cast<int32_t>(k);
    }
    stops_.push_back(std::move(st));
  }
}

StopStrings::Update StopStrings::push(std::string_view piece) {
  const size_t base = pending_.size();  // piece byte j is pending_[base + j]
  pending_.append(piece);
  // Every string's first completion within the piece (none completed before it): the earliest
  // start wins, the first listed on a tie.
  size_t first = std::numeric_limits<size_t>::max();
  const Stop* matched = nullptr;
  for (Stop& s : stops_) {
    int32_t q = s.state;
    for (size_t j = 0; j < piece.size(); ++j) {
      const char c = piece[j];
      while (q > 0 && s.text[q] != c) q = s.border[q - 1];
      if (s.text[q] == c) ++q;
      if (q == static_cast<int32_t>(s.text.size())) {
        const size_t start = base + j + 1 - s.text.size();  // within pending_: it holds the longest state
        if (start < first) first = start, matched = &s;
        break;
      }
    }
    s.state = q;
  }
  Update u;
  if (matched) {
    u.text = pending_.substr(0, first);
    u.stopped = true;
    u.matched = matched->text;
    pending_.clear();
    return u;
  }
  // Hold back the longest tail of the text that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const Stop& s : stops_) hold = std::max(hold, static_cast<size_t>(s.state));
  u.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return u;
}

std::string StopStrings::flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

StopStringMatcher::StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops,
                                     bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens), stops_(std::move(stops)) {}

StopStringMatcher::Update StopStringMatcher::push(int32_t id) {
  Result<std::string> piece = decoder_.push(id);
  return stops_.push(piece.ok() ? std::string_view(*piece) : std::string_view());
}

std::string StopStringMatcher::flush() {
  std::string rest = stops_.flush();
  return rest + decoder_.finish();
}

}  // namespace kiln
