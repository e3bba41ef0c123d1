// Internal interfaces of the tokenizer pipeline (normalizer -> added tokens -> pre-tokenizer ->
// BPE model -> post-processor; decoder on the way back) and their factories from tokenizer.json.
// Each component is built once from JSON and is immutable afterwards. Thread safety: all methods
// are const and safe from several threads (the BPE word cache takes a lock).
// Offsets (Tokenizer::encode_with_offsets): every text on its way through the pipeline may carry an
// Alignment, the original byte range of each of its bytes, kept like tokenizers' NormalizedString
// alignments (all bytes of one character share one range; a character a component inserts takes the
// range of the character it stands for). The plain encode path carries none.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

namespace kiln::tok {

using Json = nlohmann::json;

// Token ids above this are refused at load (tables are indexed by id; real vocabularies stay far
// below it: 262,144 is among the largest).
inline constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;

// Error for a malformed or unsupported part of a tokenizer.json.
inline Status config_error(const std::string& source, const std::string& what) {
  return invalid_argument("tokenizer file '" + source + "': " + what);
}

// The original bytes [begin, end) one byte of a transformed text comes from ({0, 0}: none).
struct Align {
  uint32_t begin = 0, end = 0;
};
using Alignment = std::vector<Align>;  // one entry per byte of the text it describes

// The identity alignment of `s`, which starts at byte `base` of the original: each byte maps to the
// whole character it belongs to (s must be valid UTF-8).
void identity_alignment(std::string_view s, uint32_t base, Alignment& out);
// Appends to `out` (and `out_al`) the result of `f(c, out)` for each character c of (s, al), every
// byte it appends aligned like c.
template <typename F>
void map_chars_aligned(const std::string& s, const Alignment& al, std::string& out, Alignment& out_al, F f) {
  for (size_t i = 0; i < s.size();) {
    const size_t a = i;
    const char32_t c = next_cp(s, i);
    const size_t before = out.size();
    f(c, std::string_view(s).substr(a, i - a), out);
    out_al.insert(out_al.end(), out.size() - before, al[a]);
  }
}
// Inserts `p` before (s, al), aligned with its first character; nothing when s is empty.
void prepend_aligned(std::string& s, Alignment& al, std::string_view p);

// One piece of text on its way through pre-tokenization. `at_start` is true when the piece begins at
// offset 0 of the original input (Metaspace's prepend_scheme "first" needs it). `align` is empty
// unless offsets are tracked; then it has one entry per byte of `text`.
struct Split {
  std::string text;
  bool at_start = false;
  Alignment align;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
  // normalize() that keeps `al` (one Align per byte of s) in step with s. An error where kiln cannot
  // track the change (a Unicode normal form that composes or reorders characters).
  virtual Status normalize_aligned(std::string& s, Alignment& al) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `splits` in place (splitting and transforming); empty pieces are dropped. Each split's
  // alignment, when it has one, is carried along.
  virtual void pre_tokenize(std::vector<Split>& splits) const = 0;
};

// What a post-processor needs to trim offsets: a token's string (tokenizers' Token.value: the vocab
// string, or for an added token the text it matched, lstrip/rstrip spaces included) from its id and
// offsets, and the encoded input (trimming moves offsets by characters of it).
struct OffsetContext {
  std::function<std::string_view(int32_t id, Align offsets)> token;
  std::string_view input;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens around a single sequence (only called with add_special_tokens).
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // The same with offsets (added tokens get {0, 0}), always called: ByteLevel and Roberta trim
  // whitespace from offsets (trim_offsets) whether or not special tokens are added.
  virtual void process_offsets(std::vector<int32_t>& ids, std::vector<Align>& offsets, bool add_special_tokens,
                               const OffsetContext& ctx) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // One token's text -> the bytes it adds to a decoded text in mid-sequence, before any UTF-8
  // repair (byte-level tokens may hold part of a character). Default: the text itself.
  virtual void token_bytes(std::string& token) const { (void)token; }
};

Result<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, const std::string& source);
Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, const std::string& source);
Result<std::unique_ptr<PostProcessor>> make_post_processor(const Json& j, const std::string& source);
Result<std::unique_ptr<Decoder>> make_decoder(const Json& j, const std::string& source);

// The byte <-> printable-character table of GPT-2's byte-level BPE.
const std::string& byte_to_unicode(uint8_t b);  // UTF-8 of the character for byte b
int unicode_to_byte(char32_t c);                // -1 when c is not in the table

struct TransparentHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, TransparentHash, std::equal_to<>>;

// The BPE model, with a bounded word cache.
class BpeModel {
 public:
  static Result<std::unique_ptr<BpeModel>> from_json(const Json& j, const std::string& source);
  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // The same, also appending each token's length in bytes of `word` (consecutive: the tokens cover
  // the word in order). Bypasses the word cache.
  void tokenize_with_lengths(std::string_view word, std::vector<int32_t>& out, std::vector<uint32_t>& lengths) const;
  const Vocab& vocab() const { return vocab_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }

 private:
  template <bool kLengths>
  void merge_word(std::string_view word, std::vector<int32_t>& out, std::vector<uint32_t>* lengths) const;
  std::optional<int32_t> find(std::string_view s) const {
    auto it = vocab_.find(s);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }

  Vocab vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids the vocab does not use
  struct MergeValue { int32_t rank; int32_t new_id; };
  std::unordered_map<uint64_t, MergeValue> merges_;  // key: (left id << 32) | right id
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  bool has_prefix_ = false, has_suffix_ = false;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xNN> ids, -1 when absent

  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWord = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, TransparentHash, std::equal_to<>> cache_;
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  std::string decoded;  // what id_to_token/decode give: the normalized content when `normalized`
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Added tokens, matched before the model runs like tokenizers' AddedVocabulary: non-normalized
// tokens on the raw text, then normalized ones on each normalized piece; leftmost-longest.
class AddedVocabulary {
 public:
  void init(std::vector<AddedToken> tokens, const Normalizer* normalizer);
  struct Piece {
    int32_t token = -1;  // >= 0: an added token's id; else `text` still needs the model
    std::string text;
    bool at_start = false;
    Alignment align;  // extract_and_normalize_aligned: one entry per byte of `text`
    Align span;       // extract_and_normalize_aligned: an added token's bytes in the input
  };
  // Splits `text` into added tokens and normalized text pieces (empty pieces dropped).
  void extract_and_normalize(std::string_view text, const Normalizer* normalizer, std::vector<Piece>& out) const;
  // The same, with each piece's alignment to `text` and each added token's span in it.
  Status extract_and_normalize_aligned(std::string_view text, const Normalizer* normalizer, std::vector<Piece>& out) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Trie {
    struct Node { std::vector<std::pair<unsigned char, int32_t>> next; int32_t token = -1; };  // token: index
    std::vector<Node> nodes{1};
    bool first_byte[256] = {};
    void add(std::string_view s, int32_t index);
    bool empty() const { return nodes.size() == 1; }
  };
  struct Match { int32_t token; size_t start, stop; };
  void find_matches(std::string_view s, const Trie& trie, std::vector<Match>& out) const;

  std::vector<AddedToken> tokens_;
  Trie raw_trie_, normalized_trie_;
};

}  // namespace kiln::tok
