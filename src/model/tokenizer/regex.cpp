// The PCRE2 side of Regex (see regex.h): compile a translated pattern, iterate matches like Rust's
// find_iter. Thread safety: matching allocates its match data per call.
#include "model/tokenizer/regex.h"

#include <pcre2.h>

#include <new>

#include "model/tokenizer/unicode.h"

namespace kiln::tok {

namespace {

// One match attempt from byte `pos` (the subject is valid UTF-8: checked by the callers).
int match_at(pcre2_code* code, bool jit, std::string_view s, size_t pos, pcre2_match_data* md) {
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  return jit ? pcre2_jit_match(code, subject, s.size(), pos, 0, md, nullptr)
             : pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
}

// The code point at byte `off` of the string of every code point in order (surrogates left out).
char32_t code_point_at(size_t off) {
  if (off < 0x80) return static_cast<char32_t>(off);
  off -= 0x80;
  if (off < 2 * 0x780) return static_cast<char32_t>(0x80 + off / 2);
  off -= 2 * 0x780;
  if (off < 3 * (0xD800 - 0x800)) return static_cast<char32_t>(0x800 + off / 3);
  off -= 3 * (0xD800 - 0x800);
  if (off < 3 * (0x10000 - 0xE000)) return static_cast<char32_t>(0xE000 + off / 3);
  off -= 3 * (0x10000 - 0xE000);
  return static_cast<char32_t>(0x10000 + off / 4);
}

NativeCategories discover_native_categories() {
  std::string all;
  all.reserve(4500000);
  for (char32_t c = 0; c <= 0x10FFFF; ++c)
    if (c < 0xD800 || c > 0xDFFF) append_utf8(all, c);
  // One alternative per category, unassigned first so that its long runs go in one step.
  std::vector<int> order = {ucd::kCategoryUnassigned};
  std::string pattern = "(\\p{Cn}+)";
  for (int k = 0; k < 30; ++k) {
    if (k == ucd::kCategoryUnassigned || k == 27) continue;  // 27: Cs, absent from UTF-8
    order.push_back(k);
    pattern += std::string("|(\\p{") + ucd::kCategoryNames[k] + "}+)";
  }
  NativeCategories out;
  int err = 0;
  PCRE2_SIZE erroff = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &err,
                                   &erroff, nullptr);
  if (!code) return out;  // no native sets: the translation writes explicit ranges
  bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) throw std::bad_alloc();
  size_t pos = 0;
  while (pos < all.size()) {
    int rc = match_at(code, jit, all, pos, md);
    if (rc < 2) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    int k = order[static_cast<size_t>(rc - 2)];  // the last group that took part is the one that matched
    char32_t lo = code_point_at(ov[0]), hi = code_point_at(ov[1] - 1);
    auto& r = out.ranges[static_cast<size_t>(k)];
    if (!r.empty() && r.back().hi + 1 == lo) r.back().hi = hi;
    else if (!r.empty() && r.back().hi == 0xD7FF && lo == 0xE000) r.back().hi = hi;
    else r.push_back({lo, hi});
    pos = ov[1];
  }
  pcre2_match_data_free(md);
  pcre2_code_free(code);
  return out;
}

}  // namespace

const NativeCategories& pcre2_native_categories() {
  static const NativeCategories native = discover_native_categories();  // a constant table, built once
  return native;
}

Result<std::unique_ptr<Regex>> Regex::compile(const std::string& pattern) {
  KILN_ASSIGN_OR_RETURN(std::string translated, onig_to_pcre2(pattern, &pcre2_native_categories()));
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_compile_context* ctx = pcre2_compile_context_create(nullptr);
  if (!ctx) return out_of_memory("out of memory compiling regex '" + pattern + "'");
  pcre2_set_newline(ctx, PCRE2_NEWLINE_LF);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C, &err, &off, ctx);
  // (\C matches one byte: a match could end inside a UTF-8 character, so it is refused.)
  pcre2_compile_context_free(ctx);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("regex '" + pattern + "' does not compile: " + reinterpret_cast<char*>(buf));
  }
  std::unique_ptr<Regex> re(new Regex());
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (!md) throw std::bad_alloc();
  size_t pos = 0;
  size_t last_end = SIZE_MAX;
  while (pos <= s.size()) {
    int rc = match_at(code, jit_, s, pos, md);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t a = ov[0], b = ov[1];
    if (a == b) {
      if (a != last_end) out.emplace_back(a, b);
      last_end = a;
      if (a >= s.size()) break;
      pos = a + utf8_len(static_cast<unsigned char>(s[a]));  // step over one character
      continue;
    }
    out.emplace_back(a, b);
    last_end = b;
    pos = b;
  }
  pcre2_match_data_free(md);
}

}  // namespace kiln::tok
