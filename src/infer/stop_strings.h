// StopStringMatcher: the text of a request's generated tokens, streamed, with stop strings matched
// across token boundaries. Text that could still turn out to begin a stop string is held back until
// the next tokens decide; when a stop string completes, the text before it is released and the
// rest (the stop string and anything after it) is dropped. Decoding skips special tokens (unless
// asked not to) and only releases complete UTF-8 (model/tokenizer.h StreamingDecoder).
// Thread safety: none; one per request, used by the engine thread.
#pragma once

#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kiln {

class StopStringMatcher {
 public:
  StopStringMatcher(const Tokenizer& tokenizer, std::vector<std::string> stops, bool skip_special_tokens = true);

  struct Update {
    std::string text;      // text that can be shown now
    bool stopped = false;  // a stop string completed: `text` ends right before it
    std::string matched;   // ... this one (the earliest in the text; the first listed on a tie)
  };
  Update push(int32_t id);
  // The text still held back, at the end of a request that did not stop on a string.
  std::string flush();

 private:
  StreamingDecoder decoder_;
  std::vector<std::string> stops_;
  std::string pending_;  // decoded, not yet released
};

}  // namespace kiln
