// Unicode helpers for the tokenizer: UTF-8 decoding/encoding/validation, Rust-compatible lossy
// conversion, the character classes the `tokenizers` library uses (Rust char predicates), and a
// PCRE2 regex wrapper (UTF + UCP, JIT when available).
// Ownership: Regex owns its compiled PCRE2 code. Thread safety: all functions are pure; a Regex is
// immutable after construction and may be matched from several threads (match data is per call).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln::tok {

// Decodes the code point at s[i] (s must be valid UTF-8); advances i.
char32_t next_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
inline size_t utf8_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}
// True when s is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool valid_utf8(std::string_view s);
// Length of the longest valid prefix.
size_t valid_utf8_prefix(std::string_view s);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Rust char predicates.
bool is_whitespace(char32_t c);    // char::is_whitespace (White_Space)
bool is_alphanumeric(char32_t c);  // char::is_alphanumeric (approximated by categories L* and N*)
bool is_numeric(char32_t c);       // char::is_numeric (Nd, Nl, No)
bool is_punctuation(char32_t c);   // Unicode P* categories
bool is_combining_mark(char32_t c);  // Mn, Mc, Me
bool is_nonspacing_mark(char32_t c);  // Mn
bool is_control_other(char32_t c);   // Cc, Cf, Cn, Co (BERT's is_control without \t\n\r)
// char::to_lowercase appended to out (full mapping: U+0130 becomes two code points).
void append_lowercase(std::string& out, char32_t c);
// Unicode normalization form: "NFC", "NFD", "NFKC", "NFKD".
std::string normalize_form(std::string_view s, int form);  // form: 0 NFC, 1 NFD, 2 NFKC, 3 NFKD

// A compiled PCRE2 pattern. find_all reports the non-overlapping matches (byte offsets) in
// `subject`, with empty matches handled like Rust's find_iter (an empty match right after the
// previous match is skipped).
class Regex {
 public:
  static Result<std::unique_ptr<Regex>> compile(const std::string& pattern);
  ~Regex();
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Escapes a literal so that PCRE2 matches it verbatim.
std::string regex_escape(std::string_view literal);

}  // namespace kiln::tok
