// The Unicode Character Database tables of kiln's tokenizer, generated into unicode_data.cpp by
// scripts/make_unicode_tables.py. Each group comes from the Unicode version of the component of
// the Python `tokenizers` library (0.23) it reproduces, because matching that library code point
// for code point (tests/cpu/test_unicode_scan.cpp) means matching its data, not the newest data:
//   kRust*        Rust's std (char::is_numeric, char::to_lowercase): Unicode 17.0.0
//   kCategories*  the unicode_categories crate (BERT's punctuation, controls, Mn): Unicode 8.0.0
//   kNorm*        the unicode-normalization-alignments crate (NFC/NFD/NFKC/NFKD, StripAccents'
//                 combining marks): Unicode 9.0.0
//   kRegex*       Oniguruma (the regexes of Split, Replace and ByteLevel) and Rust's regex crate
//                 (the Whitespace pre-tokenizer, added tokens' single_word): Unicode 16.0.0
// All tables are sorted by code point; ranges are inclusive and do not overlap. Immutable, so safe
// from any thread.
#pragma once

#include <cstdint>
#include <span>

namespace kiln::tok::ucd {

struct Range {
  char32_t lo, hi;
};
struct ValueRange {
  char32_t lo, hi;
  uint16_t value;
};
// cp maps to pool[offset, offset + length).
struct Mapping {
  char32_t cp;
  uint32_t offset, length;
};
struct Composition {
  char32_t first, second, composite;
};
struct ScriptName {
  const char* name;        // long name, e.g. "Greek"
  const char* short_name;  // e.g. "Grek"
};

// General categories in the order of ValueRange::value in kRegexCategory.
inline constexpr const char* kCategoryNames[] = {
    "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
    "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
inline constexpr uint16_t kCategoryUnassigned = 29;

extern const std::span<const Range> kRustNumeric;
extern const std::span<const char32_t> kRustLowercasePool;
extern const std::span<const Mapping> kRustLowercase;

extern const std::span<const Range> kCategoriesPunctuation, kCategoriesNonspacingMark, kCategoriesOther;

extern const std::span<const ValueRange> kNormCombiningClass;
extern const std::span<const char32_t> kNormDecompositionPool;
extern const std::span<const Mapping> kNormCanonical, kNormCompatibility;
extern const std::span<const Composition> kNormComposition;
extern const std::span<const Range> kNormMark;

extern const std::span<const ValueRange> kRegexCategory, kRegexScript;
extern const std::span<const ScriptName> kRegexScriptNames;
extern const std::span<const Range> kRegexAlphabetic, kRegexWhiteSpace, kRegexLowercase, kRegexUppercase;

// Lookups (binary search).
bool contains(std::span<const Range> table, char32_t c);
// The value of the range holding c, or `absent`.
uint16_t value_of(std::span<const ValueRange> table, char32_t c, uint16_t absent);
// The mapping of c, or nullptr.
const Mapping* mapping_of(std::span<const Mapping> table, char32_t c);

}  // namespace kiln::tok::ucd
