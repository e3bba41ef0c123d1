// Unicode helpers and the PCRE2 wrapper (see unicode.h). Character categories come from utf8proc.
// Thread safety: pure functions; Regex matching allocates its match data per call.
#include "model/tokenizer/unicode.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

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

static utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

bool is_alphanumeric(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool is_combining_mark(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}

bool is_nonspacing_mark(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool is_control_other(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
         k == UTF8PROC_CATEGORY_CO;
}

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
  } else if (c == 0x130) {  // the one unconditional multi-character lowercase mapping
    out += "i\xCC\x87";
  } else {
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
}

std::string normalize_form(std::string_view s, int form) {
  bool ascii = true;
  for (char ch : s) if (static_cast<unsigned char>(ch) >= 0x80) { ascii = false; break; }
  if (ascii) return std::string(s);  // ASCII is invariant under all four forms
  int options = UTF8PROC_STABLE;
  options |= (form == 0 || form == 2) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
  if (form >= 2) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* result = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &result,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(s);  // only on invalid input, which encode() rejects earlier
  std::string out(reinterpret_cast<char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
}

Result<std::unique_ptr<Regex>> Regex::compile(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("regex '" + pattern + "' does not compile (at offset " + std::to_string(off) +
                            "): " + reinterpret_cast<char*>(buf));
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
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  size_t last_end = SIZE_MAX;
  while (pos <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, 0, md, nullptr)
                  : pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
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

std::string regex_escape(std::string_view literal) {
  std::string out = "\\Q";
  size_t i = 0;
  while (i < literal.size()) {
    size_t e = literal.find("\\E", i);
    if (e == std::string_view::npos) { out.append(literal.substr(i)); break; }
    out.append(literal.substr(i, e - i));
    out += "\\E\\\\E\\Q";
    i = e + 2;
  }
  out += "\\E";
  return out;
}

}  // namespace kiln::tok
