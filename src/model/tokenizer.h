// Hugging Face tokenizer.json, natively: encode and decode exactly like the Python `tokenizers`
// library (0.23), optionally with each token's offsets in the input (Encoding.offsets), plus an
// incremental decoder for streaming output.
// Ownership: a Tokenizer owns its components; a StreamingDecoder borrows a Tokenizer, which must
// outlive it. Thread safety: a Tokenizer is immutable after loading (its word cache is guarded by
// a mutex), so encode/decode may run from several threads at once. A StreamingDecoder is one
// stream's state: use it from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kiln {

namespace tok {
struct TokenizerImpl;
}

// Where one token of an encoding comes from: bytes [begin, end) of the encoded text. The Python
// library's Encoding.offsets, in UTF-8 bytes where Python counts characters. Special tokens the
// post-processor adds have {0, 0}; several tokens of one character (byte fallback, a byte-level split
// of a multi-byte character) each have the whole character; ByteLevel's trim_offsets leaves a token's
// leading or trailing spaces out.
struct TokenOffset {
  size_t begin = 0, end = 0;
  bool operator==(const TokenOffset&) const = default;
};

struct EncodingWithOffsets {
  std::vector<int32_t> ids;
  std::vector<TokenOffset> offsets;  // one per id
};

// tokenizers' Encoding.char_to_token, on bytes: the first token whose offsets contain byte `pos`.
std::optional<size_t> token_at_byte(const std::vector<TokenOffset>& offsets, size_t pos);

class Tokenizer {
 public:
  // Parses a tokenizer.json; unknown component types (normalizer/pre_tokenizer/model/post_processor/
  // decoder "type") fail with a message naming the type and the file.
  static Result<std::unique_ptr<Tokenizer>> from_file(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> from_json_text(const std::string& text, const std::string& source_name);
  ~Tokenizer();

  // Invalid UTF-8 input -> error (the Python library only takes str).
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special_tokens) const;
  // encode() plus each token's offsets in `text` (the same ids). Slower than encode (no word cache,
  // alignments carried through every component). Every normalizer is tracked except where a
  // Unicode normal form composes or reorders characters of this text: that is an error telling the
  // caller to normalize the text first.
  Result<EncodingWithOffsets> encode_with_offsets(std::string_view text, bool add_special_tokens) const;
  // An id outside [0, vocab_size()) -> error naming it.
  Result<std::string> decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  int32_t vocab_size() const;  // model vocab + added tokens (max id + 1)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;  // added token with special=true
  // The bytes token `id` adds to a decoded text in mid-sequence (byte-level and byte-fallback
  // tokens may hold part of a UTF-8 character): what constrained decoding matches. nullopt for an id
  // the vocabulary does not use.
  std::optional<std::string> token_bytes(int32_t id) const;

 private:
  explicit Tokenizer(std::unique_ptr<tok::TokenizerImpl> impl);
  // from_json_text without its error boundary (JSON type errors escape as exceptions).
  static Result<std::unique_ptr<Tokenizer>> from_json_unchecked(const std::string& text, const std::string& source);
  std::unique_ptr<tok::TokenizerImpl> impl_;
};

// Incremental detokenization for streaming (like HF's DecodeStream): push ids one at a time; push
// returns only text that is complete UTF-8 and will not change with later tokens. The concatenation
// of all push() results plus finish() equals tokenizer.decode(all ids).
class StreamingDecoder {
 public:
  StreamingDecoder(const Tokenizer& tok, bool skip_special_tokens);
  Result<std::string> push(int32_t id);
  // The text still held back (an unfinished character at the end shows as U+FFFD, as in decode).
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the sliding window: ids_[0, prefix_index_) is context already emitted
  size_t prefix_index_ = 0;
  std::string prefix_;        // decode(ids_[0, prefix_index_ ... ]) as of the last emission
};

}  // namespace kiln
