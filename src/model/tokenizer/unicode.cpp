// Unicode helpers (see unicode.h) and the lookups of unicode_data.h. Thread safety: pure functions.
#include "model/tokenizer/unicode.h"

#include <algorithm>
#include <iterator>

#include "model/tokenizer/unicode_data.h"

namespace kiln::tok {

char32_t next_cp(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) { ++i; return c; }
  size_t n = utf8_len(c);
  char32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Length of the valid UTF-8 sequence at s[i], or 0 with `bad` = the length of the maximal invalid
// prefix to replace (Unicode "maximal subpart" rule, as Rust and WHATWG use).
static size_t sequence_at(std::string_view s, size_t i, size_t& bad) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  unsigned char c = b(0);
  bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) { n = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) n = 3;
  else if (c == 0xED) { n = 3; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) n = 3;
  else if (c == 0xF0) { n = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) { n = 4; hi = 0x8F; }
  else return 0;
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) { bad = k; return 0; }
    unsigned char x = b(k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (x < l || x > h) { bad = k; return 0; }
  }
  return n;
}

bool valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0, bad;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    size_t n = sequence_at(s, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return i;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0, bad;
  while (i < s.size()) {
    size_t n = sequence_at(s, i, bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return ucd::contains(ucd::kRustNumeric, c);
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  const ucd::Mapping* m = ucd::mapping_of(ucd::kRustLowercase, c);
  if (!m) {
    append_utf8(out, c);
    return;
  }
  for (uint32_t k = 0; k < m->length; ++k) append_utf8(out, ucd::kRustLowercasePool[m->offset + k]);
}

bool is_punctuation(char32_t c) { return ucd::contains(ucd::kCategoriesPunctuation, c); }
bool is_nonspacing_mark(char32_t c) { return ucd::contains(ucd::kCategoriesNonspacingMark, c); }
bool is_other_category(char32_t c) { return ucd::contains(ucd::kCategoriesOther, c); }
bool is_combining_mark(char32_t c) { return ucd::contains(ucd::kNormMark, c); }

bool is_word_character(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  if (ucd::contains(ucd::kRegexAlphabetic, c)) return true;
  uint16_t k = ucd::value_of(ucd::kRegexCategory, c, ucd::kCategoryUnassigned);
  return (k >= 5 && k <= 7) || k == 8 || k == 11;  // Mn Mc Me, Nd, Pc
}

namespace ucd {

bool contains(std::span<const Range> table, char32_t c) {
  auto it = std::upper_bound(table.begin(), table.end(), c, [](char32_t x, const Range& r) { return x < r.lo; });
  return it != table.begin() && c <= std::prev(it)->hi;
}

uint16_t value_of(std::span<const ValueRange> table, char32_t c, uint16_t absent) {
  auto it = std::upper_bound(table.begin(), table.end(), c, [](char32_t x, const ValueRange& r) { return x < r.lo; });
  if (it == table.begin() || c > std::prev(it)->hi) return absent;
  return std::prev(it)->value;
}

const Mapping* mapping_of(std::span<const Mapping> table, char32_t c) {
  auto it = std::lower_bound(table.begin(), table.end(), c, [](const Mapping& m, char32_t x) { return m.cp < x; });
  return it != table.end() && it->cp == c ? &*it : nullptr;
}

}  // namespace ucd
}  // namespace kiln::tok
