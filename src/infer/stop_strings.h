// StopStringMatcher: the text of a request's generated tokens, streamed, with stop strings matched
// across token boundaries. Text that could still turn out to begin a stop string is held back until
// the next tokens decide; when a stop string completes, the text before it is released and the
// rest (the stop string and anything after it) is dropped. Decoding skips special tokens (unless
// asked not to) and only releases complete UTF-8 (model/tokenizer.h StreamingDecoder).
// The matching (StopStrings) keeps one Knuth-Morris-Pratt state per stop string, so each decoded
// byte costs one automaton step per string, however long the strings and however the text repeats
// their beginnings.
// Thread safety: none; one per request, used by the engine thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer.h"

namespace kiln {

// Stop strings matched over text arriving in pieces.
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);  // each non-empty

  struct Update {
    std::string text;      // text that can be shown now
    bool stopped = false;  // a stop string completed: `text` ends right before it
    std::string matched;   // ... this one (the earliest in the text; the first listed on a tie)
  };
  Update push(std::string_view piece);
  // The text still held back (after the last push, when no string has stopped the text).
  std::string flush();

 private:
  struct Stop {
    std::string text;
    std::vector<int32_t> border;  // border[k]: the longest proper border of text[0, k + 1)
    int32_t state = 0;            // the longest prefix of text that the text so far ends with
  };
  std::vector<Stop> stops_;
  std::string pending_;  // not yet released: the longest state's bytes, at most
};

class StopStringMatcher {
 public:
  StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops, bool skip_special_tokens = true);

  using Update = StopStrings::Update;
  Update push(int32_t id);
  // The text still held back, at the end of a request that did not stop on a string.
  std::string flush();

 private:
  StreamingDecoder decoder_;
  StopStrings stops_;
};

}  // namespace kiln
