// Token masks for constrained decoding: which tokens of the vocabulary may come next in a
// JsonMatcher's state, as a bitmask (bit t of word t / 32: token t allowed).
//
// TokenVocabulary holds every token's bytes (Tokenizer::token_bytes) in a trie; special tokens are
// left out (constrained text never holds them; end-of-text ids are added apart, when the matcher can
// end). A mask is the union over the matcher's stacks of each stack's mask. A stack's mask walks the
// trie depth first, advancing a copy of the stack by each byte and pruning a subtree at the first
// byte no stack takes; a stack inside a plain JSON string instead takes every "plain" token (no
// quote, backslash or control byte, well-formed UTF-8 so far) whole, within the string's room, and
// walks only the trie of the other tokens. Masks are cached per stack (JsonMatcher::stack_key), so a
// string being written or a repeated structure costs one walk.
// Ownership: TokenVocabulary is immutable and shared (thread-safe); a TokenMasker (with its cache) is
// used by one thread.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "infer/structured/json_matcher.h"
#include "model/tokenizer.h"

namespace kiln::structured {

class TokenVocabulary {
 public:
  // `vocab`: the model's vocabulary size (the logits' width); ids the tokenizer lacks are never allowed.
  static std::shared_ptr<const TokenVocabulary> build(const Tokenizer& tokenizer, int32_t vocab);

  int32_t vocab() const { return vocab_; }
  int32_t words() const { return (vocab_ + 31) / 32; }  // u32 words of a mask

 private:
  friend class TokenMasker;
  struct Trie {
    struct Node {
      int32_t first_child = -1, next_sibling = -1;
      int32_t first_token = -1;  // tokens whose bytes end here, chained through next_token_
      uint8_t byte = 0;
    };
    std::vector<Node> nodes{Node{}};  // node 0: the root
    void insert(const std::string& bytes, int32_t id, std::vector<int32_t>& next_token);
  };
  int32_t vocab_ = 0;
  Trie trie_;        // every non-special token
  Trie non_plain_;   // the tokens a plain string does not take whole
  std::vector<int32_t> next_token_;  // [vocab]: the next token with the same bytes in trie_ (-1: none)
  std::vector<int32_t> non_plain_links_;  // the same for non_plain_
  std::vector<uint32_t> plain_mask_;  // the plain tokens
  std::vector<std::pair<int32_t, int32_t>> plain_code_points_;  // (token, code points it begins)
};

class TokenMasker {
 public:
  explicit TokenMasker(std::shared_ptr<const TokenVocabulary> vocab, size_t max_cached = 1024)
      : vocab_(std::move(vocab)), max_cached_(max_cached) {}
  const TokenVocabulary& vocabulary() const { return *vocab_; }

  // mask (vocabulary().words() words) = the tokens that may follow `m`'s text, plus `end_ids` when
  // the text is a complete value. Nothing set: no token continues it (the caller ends the request).
  void allowed(const JsonMatcher& m, const std::vector<int32_t>& end_ids, uint32_t* mask);

  int64_t cache_hits() const { return hits_; }
  int64_t cache_misses() const { return misses_; }

 private:
  const std::vector<uint32_t>& stack_mask(const JsonMatcher& m, const Stack& s);
  void walk(const JsonMatcher& m, const TokenVocabulary::Trie& trie, int32_t node, const std::vector<Stack>& states,
            std::vector<uint32_t>& mask) const;

  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t max_cached_;
  // By schema (kept alive by the entry) and stack key; least recently used first in lru_.
  struct Entry {
    std::shared_ptr<const JsonSchema> schema;
    std::vector<uint32_t> mask;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, Entry> cache_;
  std::list<std::string> lru_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace kiln::structured
