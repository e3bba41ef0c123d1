// Fuzz target (fuzz_common.h): the input is a tokenizer.json. Loading may fail with a Status; a
// tokenizer that loads must encode and decode a few texts (and the input's own bytes) without
// crashing, and decode what it encoded.
#include <string>

#include "fuzz_common.h"
#include "model/tokenizer.h"

int kiln::fuzz::tokenizer_json(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::from_json_text(text, "fuzz tokenizer.json");
  if (!t.ok()) return 0;
  const Tokenizer& tok = **t;
  for (const std::string& s : {std::string("Hello world, 123 <s> ü 你好 \n\t x"), text.substr(0, 256)}) {
    for (bool special : {false, true}) {
      Result<std::vector<int32_t>> ids = tok.encode(s, special);
      if (!ids.ok()) continue;
      for (int32_t id : *ids)
        if (id < 0 || id >= tok.vocab_size()) invariant_failed("tokenizer_json", "encode gave an id outside the vocabulary");
      if (!tok.decode(*ids, false).ok()) invariant_failed("tokenizer_json", "decode of encoded ids failed");
      (void)tok.decode(*ids, true);
    }
  }
  return 0;
}

KILN_FUZZ_ENTRY(tokenizer_json)
