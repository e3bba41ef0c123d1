// Unicode helpers for the tokenizer: UTF-8 decoding/encoding/validation, Rust-compatible lossy
// conversion, and the character classes and normalization forms of the `tokenizers` library, each
// with the Unicode data of the library component it serves (unicode_data.h says which version and
// why). Thread safety: all functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

// Rust's std, as the normalizers and pre-tokenizers call it:
bool is_whitespace(char32_t c);    // char::is_whitespace (White_Space)
bool is_numeric(char32_t c);       // char::is_numeric (Nd, Nl, No)
// char::to_lowercase appended to out (the full mapping: U+0130 becomes two code points).
void append_lowercase(std::string& out, char32_t c);
// The unicode_categories crate, as BERT's normalizer and pre-tokenizer call it:
bool is_punctuation(char32_t c);      // P*
bool is_nonspacing_mark(char32_t c);  // Mn
bool is_other_category(char32_t c);   // Cc, Cf, Co (the crate's is_other)
// The unicode-normalization-alignments crate:
bool is_combining_mark(char32_t c);  // Mn, Mc, Me (StripAccents)
// Normalization form 0 NFC, 1 NFD, 2 NFKC, 3 NFKD of valid UTF-8.
std::string normalize_form(std::string_view s, int form);
// Rust's regex crate, as the added vocabulary's single_word check calls it: \w (Alphabetic, marks,
// Nd, Pc, Join_Control).
bool is_word_character(char32_t c);

}  // namespace kiln::tok
