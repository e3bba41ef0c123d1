// Python's str operations by code point (py_string.h).
#include "model/jinja/py_string.h"

#include <utf8proc.h>

namespace kiln::jinja {

bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
char32_t py_upper(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t py_lower(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }
bool cased_letter(char32_t c) { return py_upper(c) != c || py_lower(c) != c; }
std::string map_case(const std::string& s, bool upper) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = upper ? py_upper(c) : py_lower(c);
  return utf8_encode(u);
}
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars && chars->is_str() ? utf8_decode(chars->s) : U"";
  auto strip = [&](char32_t c) { return chars && chars->is_str() ? set.find(c) != std::u32string::npos : py_space(c); };
  size_t b = 0, e = u.size();
  if (left) while (b < e && strip(u[b])) ++b;
  if (right) while (e > b && strip(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit, size_t max_parts) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (out.size() <= max_parts) {
      while (k < u.size() && py_space(u[k])) ++k;
      if (k >= u.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > k && py_space(u[e - 1])) --e;
        out.push_back(utf8_encode(u.substr(k, e - k)));
        break;
      }
      size_t b = k;
      while (k < u.size() && !py_space(u[k])) ++k;
      out.push_back(utf8_encode(u.substr(b, k - b)));
    }
    return out;
  }
  size_t b = 0;
  while (out.size() <= max_parts) {
    size_t p = (maxsplit >= 0 && int64_t(out.size()) == maxsplit) ? std::string::npos : s.find(sep->s, b);
    if (p == std::string::npos) { out.push_back(s.substr(b)); break; }
    out.push_back(s.substr(b, p - b));
    b = p + sep->s.size();
  }
  return out;
}
std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  if (a.empty()) {  // Python inserts between every code point
    std::u32string u = utf8_decode(s);
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || n < count) { out += b; ++n; }
      if (k < u.size()) utf8_append(out, u[k]);
    }
    return out;
  }
  for (;;) {
    size_t p = (count >= 0 && n >= count) ? std::string::npos : s.find(a, pos);
    if (p == std::string::npos) { out += s.substr(pos); return out; }
    out += s.substr(pos, p - pos) + b;
    pos = p + a.size();
    ++n;
  }
}
std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}
Value markup_escape(const Value& v) { return v.is_str() && v.safe ? v : Value::markup(html_escape(to_str(v))); }
int64_t str_len(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

}  // namespace kiln::jinja
