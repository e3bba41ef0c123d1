// Python's string formatting (format.h): the format-spec mini-language, printf-style `%`, str.format
// and round(), over one number formatter.
#include "model/jinja/format.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {
namespace {

// Widths and precisions past this are an error (Python would build the string; a template never needs it).
constexpr int64_t kMaxWidth = 100000;

struct Spec {
  std::string fill;      // one code point; empty: the default (' ', or '0' with `zero`)
  char align = 0;        // '<' '>' '^' '='; 0: the type's default
  char sign = '-';       // '-' '+' ' '
  bool alt = false;      // '#'
  bool zero = false;     // '0' before the width: sign-aware zero padding
  int64_t width = 0;
  char grouping = 0;     // ',' or '_'
  int64_t precision = -1;
  char type = 0;
};

Status bad(const std::string& m) { return invalid_argument(m); }

// [[fill]align][sign][z][#][0][width][grouping][.precision][type]
Result<Spec> parse_spec(const std::string& text) {
  Spec s;
  std::u32string u = utf8_decode(text);
  size_t k = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (u.size() >= 2 && is_align(u[1])) {
    s.fill = utf8_encode(u.substr(0, 1));
    s.align = char(u[1]);
    k = 2;
  } else if (!u.empty() && is_align(u[0])) {
    s.align = char(u[0]);
    k = 1;
  }
  if (k < u.size() && (u[k] == '+' || u[k] == '-' || u[k] == ' ')) s.sign = char(u[k++]);
  if (k < u.size() && u[k] == 'z') ++k;
  if (k < u.size() && u[k] == '#') { s.alt = true; ++k; }
  if (k < u.size() && u[k] == '0') { s.zero = true; ++k; }
  auto number = [&](int64_t& out) {
    bool any = false;
    out = 0;
    while (k < u.size() && u[k] >= '0' && u[k] <= '9') {
      if (out <= kMaxWidth) out = out * 10 + (u[k] - '0');
      ++k;
      any = true;
    }
    return any;
  };
  number(s.width);
  if (k < u.size() && (u[k] == ',' || u[k] == '_')) s.grouping = char(u[k++]);
  if (k < u.size() && u[k] == '.') {
    ++k;
    if (!number(s.precision)) return bad("Format specifier missing precision");
  }
  if (k < u.size()) s.type = u[k] < 128 ? char(u[k++]) : '?';
  if (k < u.size() || s.type == '?') return bad("Invalid format specifier '" + text + "'");
  if (s.width > kMaxWidth || s.precision > kMaxWidth)
    return bad("format width or precision of more than " + std::to_string(kMaxWidth));
  return s;
}

// `head` (sign, prefix) and `body` padded to the width: numbers align right by default, strings left;
// '=' (and a zero flag without an alignment) pads between the sign and the digits.
std::string pad(const std::string& head, const std::string& body, const Spec& s, bool numeric) {
  const int64_t len = str_len(head) + str_len(body);
  if (len >= s.width) return head + body;
  const size_t n = size_t(s.width - len);
  const char align = s.align ? s.align : numeric ? (s.zero ? '=' : '>') : '<';
  const std::string fill = !s.fill.empty() ? s.fill : s.zero ? "0" : " ";
  auto rep = [&fill](size_t count) {
    std::string o;
    for (size_t k = 0; k < count; ++k) o += fill;
    return o;
  };
  switch (align) {
    case '<': return head + body + rep(n);
    case '^': return rep(n / 2) + head + body + rep(n - n / 2);
    case '=': return head + rep(n) + body;
    default: return rep(n) + head + body;
  }
}

// Inserts `sep` every `every` digits from the right of the leading run of digits of `body`.
std::string group(const std::string& body, char sep, size_t every) {
  size_t end = 0;
  while (end < body.size() && body[end] >= '0' && body[end] <= '9') ++end;
  std::string out;
  for (size_t k = 0; k < end; ++k) {
    if (k > 0 && (end - k) % every == 0) out += sep;
    out += body[k];
  }
  return out + body.substr(end);
}

std::string sign_of(bool negative, char sign) { return negative ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : ""; }

std::string printf_double(const char* conv, bool alt, int64_t precision, double x) {
  std::string f = std::string("%") + (alt ? "#" : "") + ".*" + conv;
  int n = std::snprintf(nullptr, 0, f.c_str(), int(precision), x);
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), f.c_str(), int(precision), x);
  out.resize(size_t(n));
  return out;
}

Result<std::string> format_float(double x, const Spec& s) {
  const char t = s.type;
  if (t != 0 && !std::strchr("eEfFgGn%", t)) return bad(std::string("Unknown format code '") + t + "' for object of type 'float'");
  const bool negative = std::signbit(x) && !std::isnan(x);
  double a = std::fabs(x);
  std::string body;
  if (t == 0 && s.precision < 0) {
    body = float_repr(a);
  } else {
    const int64_t p = s.precision < 0 ? 6 : s.precision;
    const char* conv = t == 0 || t == 'n' ? "g" : t == '%' ? "f" : nullptr;
    char one[2] = {t, 0};
    if (t == '%') a *= 100;
    body = printf_double(conv ? conv : one, s.alt, p, a);
    // No type: 'g' that keeps one digit after the point when it writes no exponent.
    if (t == 0 && std::isfinite(a) && body.find_first_of(".e") == std::string::npos) body += ".0";
    if (t == '%') body += '%';
  }
  if (s.grouping) body = group(body, s.grouping, 3);
  return pad(sign_of(negative, s.sign), body, s, true);
}

// An int in base 2, 8, 10 or 16, at least `min_digits` digits (printf's %.3d).
Result<std::string> format_int(int64_t v, const Spec& s, int64_t min_digits = 0) {
  char t = s.type ? s.type : 'd';
  if (std::strchr("eEfFgG%", t)) return format_float(double(v), s);
  if (t == 'c') {
    if (v < 0 || v > 0x10ffff) return bad("%c arg not in range(0x110000)");
    std::string c;
    utf8_append(c, char32_t(v));
    return pad("", c, s, true);
  }
  if (t == 'n') t = 'd';
  if (!std::strchr("dboxX", t)) return bad(std::string("Unknown format code '") + t + "' for object of type 'int'");
  if (s.precision >= 0) return bad("Precision not allowed in integer format specifier");
  const unsigned base = t == 'b' ? 2 : t == 'o' ? 8 : t == 'd' ? 10 : 16;
  uint64_t mag = v < 0 ? 0 - uint64_t(v) : uint64_t(v);
  std::string digits;
  do {
    digits.insert(digits.begin(), (t == 'X' ? "0123456789ABCDEF" : "0123456789abcdef")[mag % base]);
    mag /= base;
  } while (mag > 0);
  if (int64_t(digits.size()) < min_digits) digits.insert(0, size_t(min_digits - int64_t(digits.size())), '0');
  if (s.grouping) {
    if (base != 10 && s.grouping == ',') return bad(std::string("Cannot specify ',' with '") + t + "'.");
    digits = group(digits, s.grouping, base == 10 ? 3 : 4);
  }
  std::string prefix = s.alt && base != 10 ? std::string("0") + (t == 'X' ? 'X' : t) : "";
  return pad(sign_of(v < 0, s.sign) + prefix, digits, s, true);
}

Result<std::string> format_str(const std::string& text, const Spec& s) {
  if (s.type != 0 && s.type != 's') return bad(std::string("Unknown format code '") + s.type + "' for object of type 'str'");
  if (s.sign != '-') return bad("Sign not allowed in string format specifier");
  if (s.align == '=') return bad("'=' alignment not allowed in string format specifier");
  std::string body = text;
  if (s.precision >= 0) {
    std::u32string u = utf8_decode(text);
    if (int64_t(u.size()) > s.precision) body = utf8_encode(u.substr(0, size_t(s.precision)));
  }
  return pad("", body, s, false);
}

// printf-style conversion of one value (`conv` is the conversion character).
Result<std::string> percent_one(const Value& v, char conv, const Spec& s, int64_t precision) {
  switch (conv) {
    case 's': case 'r': case 'a': {
      Spec t = s;
      t.align = s.align ? s.align : '>';  // printf right-aligns unless '-'
      t.precision = precision;
      t.zero = false;
      t.type = 0;
      t.sign = '-';
      return format_str(conv == 's' ? to_str(v) : repr(v), t);
    }
    case 'c': {
      if (v.is_str() && str_len(v.s) == 1) return pad("", v.s, s, true);
      if (!v.is_int()) return bad("%c requires an int or a unicode character, not " + std::string(type_name(v)));
      Spec t = s;
      t.type = 'c';
      return format_int(v.as_int(), t);
    }
    case 'd': case 'i': case 'u': {
      if (!v.is_num()) return bad(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
      int64_t n = v.as_int();
      if (v.t == Value::T::Float) {
        if (!std::isfinite(v.f)) return bad(std::string("cannot convert float ") + (std::isnan(v.f) ? "NaN" : "infinity") + " to integer");
        if (std::fabs(v.f) >= 9223372036854775808.0) return bad("an integer too large for kiln's 64-bit template integers");
        n = int64_t(v.f);
      }
      Spec t = s;
      t.type = 'd';
      return format_int(n, t, precision);
    }
    case 'o': case 'x': case 'X': {
      if (!v.is_int()) return bad(std::string("%") + conv + " format: an integer is required, not " + type_name(v));
      Spec t = s;
      t.type = conv;
      return format_int(v.as_int(), t, precision);
    }
    case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
      if (!v.is_num()) return bad(std::string("must be real number, not ") + type_name(v));
      Spec t = s;
      t.type = conv;
      t.precision = precision < 0 ? 6 : precision;
      return format_float(v.as_double(), t);
    }
    default: return bad(std::string("unsupported format character '") + conv + "'");
  }
}

}  // namespace

Result<std::string> format_value(const Value& v, const std::string& spec_text) {
  if (spec_text.empty()) return to_str(v);
  KILN_ASSIGN_OR_RETURN(Spec s, parse_spec(spec_text));
  switch (v.t) {
    case Value::T::Str: return format_str(v.s, s);
    case Value::T::Bool: case Value::T::Int: return format_int(v.as_int(), s);
    case Value::T::Float: return format_float(v.f, s);
    default: return bad(std::string("unsupported format string passed to ") + type_name(v) + ".__format__");
  }
}

Result<std::string> percent_format(const std::string& fmt, const Value& args) {
  List single;
  const List* pos = &single;
  if (args.is_list() && args.tuple) pos = args.l.get();
  else single.push_back(args);
  const Dict* mapping = args.is_dict() ? args.d.get() : nullptr;
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') { out += fmt[k]; continue; }
    if (++k >= fmt.size()) return bad("incomplete format");
    const Value* value = nullptr;
    if (fmt[k] == '(') {
      if (!mapping) return bad("format requires a mapping");
      int depth = 1;
      size_t b = ++k;
      for (; k < fmt.size() && depth > 0; ++k) depth += fmt[k] == '(' ? 1 : fmt[k] == ')' ? -1 : 0;
      if (depth > 0) return bad("incomplete format key");
      const std::string key = fmt.substr(b, k - 1 - b);
      value = mapping->find(key);
      if (!value) return bad("'" + key + "'");  // Python's KeyError
    }
    Spec s;
    for (; k < fmt.size() && fmt[k] != 0 && std::strchr("-+ #0", fmt[k]); ++k) {
      if (fmt[k] == '-') s.align = '<';
      else if (fmt[k] == '+') s.sign = '+';
      else if (fmt[k] == ' ' && s.sign != '+') s.sign = ' ';
      else if (fmt[k] == '#') s.alt = true;
      else if (fmt[k] == '0') s.zero = true;
    }
    auto star_or_number = [&](int64_t& out_n) -> Status {
      if (k < fmt.size() && fmt[k] == '*') {
        ++k;
        if (next >= pos->size() || !(*pos)[next].is_int()) return bad("* wants int");
        out_n = (*pos)[next++].as_int();
        return Status::Ok();
      }
      while (k < fmt.size() && fmt[k] >= '0' && fmt[k] <= '9') {
        if (out_n <= kMaxWidth) out_n = out_n * 10 + (fmt[k] - '0');
        ++k;
      }
      return Status::Ok();
    };
    KILN_RETURN_IF_ERROR(star_or_number(s.width));
    if (s.width < 0) { s.align = '<'; s.width = -s.width; }
    int64_t precision = -1;
    if (k < fmt.size() && fmt[k] == '.') {
      ++k;
      precision = 0;
      KILN_RETURN_IF_ERROR(star_or_number(precision));
    }
    if (s.width > kMaxWidth || precision > kMaxWidth) return bad("format width or precision of more than " + std::to_string(kMaxWidth));
    while (k < fmt.size() && (fmt[k] == 'h' || fmt[k] == 'l' || fmt[k] == 'L')) ++k;
    if (k >= fmt.size()) return bad("incomplete format");
    const char conv = fmt[k];
    if (conv == '%') { out += '%'; continue; }
    if (s.align == '<') s.zero = false;
    if (!value) {
      if (next >= pos->size()) return bad("not enough arguments for format string");
      value = &(*pos)[next++];
    }
    KILN_ASSIGN_OR_RETURN(std::string piece, percent_one(*value, conv, s, precision));
    out += piece;
  }
  if (!mapping && next < pos->size()) return bad("not all arguments converted during string formatting");
  return out;
}

namespace {
// The numbering of str.format's fields, shared with the fields nested in a spec.
struct FieldNumbering {
  size_t next = 0;
  bool manual = false, automatic = false;
};

Result<std::string> format_fields(Interp& in, const std::string& fmt, const Args& a, FieldNumbering& numbering, int depth) {
  if (depth > 2) return bad("Max string recursion exceeded");
  size_t& auto_index = numbering.next;
  bool& manual = numbering.manual;
  bool& automatic = numbering.automatic;
  std::string out;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') { out += '}'; ++k; continue; }
      return bad("Single '}' encountered in format string");
    }
    if (c != '{') { out += c; continue; }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') { out += '{'; ++k; continue; }
    // The field up to its matching '}' (the spec may hold {} fields); brackets in the name hide ':' and '!'.
    const size_t start = k + 1;
    size_t e = start, name_end = std::string::npos;
    int depth = 1;
    bool in_bracket = false;
    for (; e < fmt.size(); ++e) {
      const char x = fmt[e];
      if (name_end == std::string::npos) {
        if (x == '[') in_bracket = true;
        else if (x == ']') in_bracket = false;
        else if (!in_bracket && (x == ':' || x == '!')) name_end = e;
      }
      if (in_bracket) continue;
      if (x == '{') ++depth;
      else if (x == '}' && --depth == 0) break;
    }
    if (e >= fmt.size()) return bad("expected '}' before end of string");
    const std::string field = fmt.substr(start, e - start);
    k = e;
    const size_t split = name_end == std::string::npos ? field.size() : name_end - start;
    const std::string name = field.substr(0, split);
    char conversion = 0;
    std::string spec;
    size_t rest = split;
    if (rest < field.size() && field[rest] == '!') {
      if (rest + 1 >= field.size()) return bad("end of string while looking for conversion specifier");
      conversion = field[rest + 1];
      rest += 2;
      if (rest < field.size() && field[rest] != ':') return bad("expected ':' after conversion specifier");
    }
    if (rest < field.size()) spec = field.substr(rest + 1);
    // The argument: the first part of the name, then .attr and [key] steps.
    size_t p = 0;
    while (p < name.size() && name[p] != '.' && name[p] != '[') ++p;
    const std::string first = name.substr(0, p);
    Value v;
    if (first.empty() || std::isdigit(static_cast<unsigned char>(first[0]))) {
      size_t index = 0;
      if (first.empty()) {
        if (manual) return bad("cannot switch from manual field specification to automatic field numbering");
        automatic = true;
        index = auto_index++;
      } else {
        if (automatic) return bad("cannot switch from automatic field numbering to manual field specification");
        manual = true;
        for (char d : first) {
          if (!std::isdigit(static_cast<unsigned char>(d))) return bad("invalid field name '" + first + "'");
          index = index * 10 + size_t(d - '0');
          if (index > a.pos.size()) break;
        }
      }
      if (index >= a.pos.size()) return bad("Replacement index " + std::to_string(index) + " out of range for positional args tuple");
      v = a.pos[index];
    } else {
      const Value* kw = nullptr;
      for (const auto& [key, x] : a.kw)
        if (key == first) kw = &x;
      if (!kw) return bad("'" + first + "'");  // Python's KeyError
      v = *kw;
    }
    while (p < name.size()) {
      if (name[p] == '.') {
        size_t q = p + 1;
        while (q < name.size() && name[q] != '.' && name[q] != '[') ++q;
        KILN_ASSIGN_OR_RETURN(v, in.getattr(v, name.substr(p + 1, q - p - 1)));
        p = q;
      } else {
        const size_t q = name.find(']', p);
        if (q == std::string::npos) return bad("Missing ']' in format string");
        const std::string key = name.substr(p + 1, q - p - 1);
        const bool digits = !key.empty() && key.find_first_not_of("0123456789") == std::string::npos && key.size() < 18;
        KILN_ASSIGN_OR_RETURN(v, in.getitem(v, digits ? Value::integer(std::stoll(key)) : Value::str(key)));
        p = q + 1;
      }
    }
    if (conversion == 's') v = Value::str(to_str(v));
    else if (conversion == 'r' || conversion == 'a') v = Value::str(repr(v));
    else if (conversion != 0) return bad(std::string("Unknown conversion specifier ") + conversion);
    if (spec.find('{') != std::string::npos) {  // fields nested in the spec, numbered on from this one's
      KILN_ASSIGN_OR_RETURN(spec, format_fields(in, spec, a, numbering, depth + 1));
    }
    KILN_ASSIGN_OR_RETURN(std::string piece, format_value(v, spec));
    out += piece;
  }
  return out;
}
}  // namespace

Result<std::string> brace_format(Interp& in, const std::string& fmt, const Args& a) {
  FieldNumbering numbering;
  return format_fields(in, fmt, a, numbering, 1);
}

Result<std::optional<int64_t>> py_parse_int(const std::string& text, int64_t base) {
  const std::optional<int64_t> none;
  if (base != 0 && (base < 2 || base > 36)) return bad("int() base must be >= 2 and <= 36, or 0");
  std::u32string u = utf8_decode(text);
  size_t b = 0, e = u.size();
  while (b < e && py_space(u[b])) ++b;
  while (e > b && py_space(u[e - 1])) --e;
  bool negative = false;
  if (b < e && (u[b] == '+' || u[b] == '-')) negative = u[b++] == '-';
  auto lower = [](char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; };
  bool prefixed = false;
  if (e - b >= 2 && u[b] == '0') {
    const char32_t p = lower(u[b + 1]);
    const int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb != 0 && (base == 0 || base == pb)) { base = pb; b += 2; prefixed = true; }
  }
  if (base == 0) {  // no prefix: decimal, where a leading zero is only allowed in zero itself
    base = 10;
    if (b < e && u[b] == '0')
      for (size_t k = b; k < e; ++k)
        if (u[k] != '0' && u[k] != '_') return none;
  }
  uint64_t mag = 0;
  bool any = false, overflow = false, last_underscore = !prefixed;
  for (size_t k = b; k < e; ++k) {
    const char32_t c = lower(u[k]);
    if (c == '_') {
      if (last_underscore) return none;
      last_underscore = true;
      continue;
    }
    const int64_t d = c >= '0' && c <= '9' ? int64_t(c - '0') : c >= 'a' && c <= 'z' ? int64_t(c - 'a' + 10) : 99;
    if (d >= base) return none;
    last_underscore = false;
    any = true;
    if (mag > (UINT64_MAX - uint64_t(d)) / uint64_t(base)) overflow = true;
    else mag = mag * uint64_t(base) + uint64_t(d);
  }
  if (!any || last_underscore) return none;
  if (overflow || mag > (negative ? uint64_t(INT64_MAX) + 1 : uint64_t(INT64_MAX)))
    return bad("int('" + text + "') does not fit in kiln's 64-bit template integers");
  return std::optional<int64_t>(negative ? int64_t(0 - mag) : int64_t(mag));
}

std::optional<double> py_parse_float(const std::string& text) {
  std::u32string u = utf8_decode(text);
  size_t b = 0, e = u.size();
  while (b < e && py_space(u[b])) ++b;
  while (e > b && py_space(u[e - 1])) --e;
  std::string s;
  for (size_t k = b; k < e; ++k) {
    const char32_t c = u[k];
    if (c == '_') {  // only between two digits
      const bool digits_around = k > b && k + 1 < e && u[k - 1] >= '0' && u[k - 1] <= '9' && u[k + 1] >= '0' && u[k + 1] <= '9';
      if (!digits_around) return std::nullopt;
      continue;
    }
    if (c > 127 || c == 'x' || c == 'X' || c == '(') return std::nullopt;  // strtod's hex and nan(...) forms
    s += char(c);
  }
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return x;
}

Value escape_format_args(const Value& args) {
  auto esc = [](const Value& x) { return x.is_num() ? x : markup_escape(x); };
  if (args.is_list() && args.tuple) {
    List l;
    for (const Value& x : *args.l) l.push_back(esc(x));
    return Value::list(std::move(l), true);
  }
  if (args.is_dict()) {
    Value d = Value::dict();
    for (const auto& [k, x] : args.d->items) d.d->set(k, esc(x));
    return d;
  }
  return esc(args);
}

double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x) || x == 0) return x;
  if (ndigits > 323) return x;
  if (ndigits < -308) return std::copysign(0.0, x);
  if (ndigits >= 0) return std::strtod(printf_double("f", false, ndigits, x).c_str(), nullptr);
  // Rounding to 10^k: the exact integer part's digits decide, the fraction only breaks a tie upwards.
  const size_t k = size_t(-ndigits);
  const double whole = std::trunc(std::fabs(x));
  const bool fraction = std::fabs(x) != whole;
  std::string digits = printf_double("f", false, 0, whole);  // exact: whole is an integer
  if (digits.size() < k) digits.insert(0, k - digits.size(), '0');
  std::string head = digits.substr(0, digits.size() - k), tail = digits.substr(digits.size() - k);
  const std::string half = "5" + std::string(k - 1, '0');
  const int c = tail.compare(half);
  const bool odd = !head.empty() && (head.back() - '0') % 2 == 1;
  bool up = c > 0 || (c == 0 && (fraction || odd));
  if (up) {  // head + 1
    int i = int(head.size()) - 1;
    for (; i >= 0 && head[size_t(i)] == '9'; --i) head[size_t(i)] = '0';
    if (i < 0) head.insert(0, "1");
    else ++head[size_t(i)];
  }
  const double r = std::strtod((head.empty() ? "0" : head + std::string(k, '0')).c_str(), nullptr);
  return std::copysign(r, x);
}

Result<int64_t> py_round_int(int64_t x, int64_t ndigits) {
  if (ndigits >= 0) return x;
  if (ndigits < -18) {  // |x| < 10^19: it rounds to 0 unless past 5 * 10^18 (then to +-10^19)
    if (x > 5000000000000000000 || x < -5000000000000000000) return bad("integer overflow in round (kiln's template integers are 64-bit)");
    return int64_t(0);
  }
  int64_t unit = 1;
  for (int64_t k = 0; k < -ndigits; ++k) unit *= 10;
  int64_t q = x / unit, r = x % unit;
  if (r < 0) { r += unit; --q; }  // floor division
  const int64_t twice = r * 2;    // r < 10^18: no overflow
  if (twice > unit || (twice == unit && (q % 2 != 0))) ++q;
  int64_t out = 0;
  if (__builtin_mul_overflow(q, unit, &out)) return bad("integer overflow in round (kiln's template integers are 64-bit)");
  return out;
}

}  // namespace kiln::jinja
