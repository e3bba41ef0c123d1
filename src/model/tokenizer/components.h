// Internal interfaces of the tokenizer pipeline (normalizer -> added tokens -> pre-tokenizer ->
// BPE model -> post-processor; decoder on the way back) and their factories from tokenizer.json.
// Each component is built once from JSON and is immutable afterwards. Thread safety: all methods
// are const and safe from several threads (the BPE word cache takes a lock).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
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

// One piece of text on its way through pre-tokenization. `at_start` is true when the piece begins at
// offset 0 of the original input (Metaspace's prepend_scheme "first" needs it).
struct Split {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Rewrites `splits` in place (splitting and transforming); empty pieces are dropped.
  virtual void pre_tokenize(std::vector<Split>& splits) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens around a single sequence (only called with add_special_tokens).
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
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
  const Vocab& vocab() const { return vocab_; }
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
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
  };
  // Splits `text` into added tokens and normalized text pieces (empty pieces dropped).
  void extract_and_normalize(std::string_view text, const Normalizer* normalizer, std::vector<Piece>& out) const;
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
