// Fuzz target (fuzz_common.h) for the tokenizer: random bytes go to encode/decode of both golden tokenizers
// (testdata/tokenizers). No input may crash; for valid UTF-8 input, the byte-level BPE tokenizer
// must round-trip (decode(encode(s)) == s), and streaming must give decode()'s text. Each input is
// used as raw bytes and as random Unicode (3 bytes per code point). The input is
// also read as little-endian int32 ids for decode (ids outside the vocabulary must be errors).
// encode_with_offsets must give encode's ids and offsets inside the text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "model/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace {

struct Tokenizers {
  std::unique_ptr<kiln::Tokenizer> bytelevel, sentencepiece;
};

const Tokenizers& tokenizers() {
  static const Tokenizers t = [] {
    const char* env = std::getenv("KILN_TESTDATA");
    std::string dir = std::string(env ? env : KILN_TESTDATA) + "/tokenizers/";
    Tokenizers r;
    auto a = kiln::Tokenizer::from_file(dir + "bytelevel-bpe.tokenizer.json");
    auto b = kiln::Tokenizer::from_file(dir + "sentencepiece-bpe.tokenizer.json");
    if (!a.ok() || !b.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: cannot load the golden tokenizers from %s\n", dir.c_str());
      std::abort();
    }
    r.bytelevel = std::move(a).value();
    r.sentencepiece = std::move(b).value();
    return r;
  }();
  return t;
}

// Random Unicode: every 3 input bytes name a code point (surrogates folded away), as UTF-8.
std::string as_unicode(const uint8_t* data, size_t size) {
  std::string u;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    uint32_t cp = (uint32_t{data[i]} | uint32_t{data[i + 1]} << 8 | uint32_t{data[i + 2]} << 16) % 0x110000;
    if (data[i + 2] & 0x80) cp %= 0x3000;  // favour the common planes
    if (cp >= 0xD800 && cp <= 0xDFFF) cp -= 0x800;
    kiln::tok::append_utf8(u, static_cast<char32_t>(cp));
  }
  return u;
}

}  // namespace

int kiln::fuzz::tokenizer_encode(const uint8_t* data, size_t size) {
  const Tokenizers& t = tokenizers();
  std::string raw_text(reinterpret_cast<const char*>(data), size);
  std::string unicode_text = as_unicode(data, size);
  for (const kiln::Tokenizer* tok : {t.bytelevel.get(), t.sentencepiece.get()}) {
    for (int variant = 0; variant < 4; ++variant) {
      const std::string& s = variant < 2 ? raw_text : unicode_text;
      bool special = variant % 2 == 1;
      auto ids = tok->encode(s, special);
      if (!ids.ok()) continue;  // invalid UTF-8
      auto text = tok->decode(ids.value(), false);
      if (!text.ok()) kiln::fuzz::invariant_failed("tokenizer_encode", "decode of encoded ids failed");
      // Round trip, unless the text spells a special token (encode then maps it to one id, and its
      // decode is that token's text too, so equality still holds; it is checked all the same).
      if (tok == t.bytelevel.get() && !special && text.value() != s) {
        kiln::fuzz::invariant_failed("tokenizer_encode", "byte-level round trip differs");
      }
      kiln::StreamingDecoder stream(*tok, false);
      std::string all;
      for (int32_t id : ids.value()) all += stream.push(id).value();
      all += stream.finish();
      if (all != text.value()) {
        kiln::fuzz::invariant_failed("tokenizer_encode", "stream differs from decode");
      }
      // With offsets: the same ids (or a clear refusal, for a normal form that reorders characters),
      // one offset per id, each a non-decreasing range inside the text.
      auto enc = tok->encode_with_offsets(s, special);
      if (enc.ok()) {
        if (enc->ids != ids.value()) kiln::fuzz::invariant_failed("tokenizer_encode", "ids with offsets differ from encode");
        if (enc->offsets.size() != enc->ids.size()) kiln::fuzz::invariant_failed("tokenizer_encode", "offsets per id");
        for (const kiln::TokenOffset& o : enc->offsets)
          if (o.begin > o.end || o.end > s.size()) kiln::fuzz::invariant_failed("tokenizer_encode", "offset outside the text");
      }
    }
    // The bytes as ids.
    std::vector<int32_t> raw(size / 4);
    if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
    bool in_range = true;
    for (int32_t id : raw) in_range = in_range && id >= 0 && id < tok->vocab_size();
    auto d = tok->decode(raw, true);
    if (d.ok() != in_range) kiln::fuzz::invariant_failed("tokenizer_encode", "decode accepted an id outside the vocabulary, or refused one inside");
    for (int32_t& id : raw) id = static_cast<int32_t>(static_cast<uint32_t>(id) % static_cast<uint32_t>(tok->vocab_size()));
    if (!tok->decode(raw, false).ok()) kiln::fuzz::invariant_failed("tokenizer_encode", "decode of in-range ids failed");
  }
  return 0;
}

KILN_FUZZ_ENTRY(tokenizer_encode)
