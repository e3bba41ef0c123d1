// The chat-template interpreter's builtins: Python string helpers (by code point), the str / dict /
// list methods, and the filters and tests chat templates use (see interp.cpp for the evaluator).
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>

#include <utf8proc.h>

#include "model/chat_template.h"
#include "model/jinja/interp.h"

namespace kiln::jinja {
namespace {

// ---- string helpers (code points) ----
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
char32_t up(char32_t c) { return char32_t(utf8proc_toupper(utf8proc_int32_t(c))); }
char32_t low(char32_t c) { return char32_t(utf8proc_tolower(utf8proc_int32_t(c))); }
bool cased_letter(char32_t c) { return up(c) != c || low(c) != c; }
std::string map_case(const std::string& s, bool upper) {
  std::u32string u = utf8_decode(s);
  for (auto& c : u) c = upper ? up(c) : low(c);
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
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    std::u32string u = utf8_decode(s);
    size_t k = 0;
    while (true) {
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
  for (;;) {
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
int64_t str_len(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

// Python's slice index normalization.

}  // namespace

void slice_indices(int64_t len, const Value& a, const Value& b, int64_t step, int64_t& start, int64_t& stop) {
  auto norm = [&](const Value& v, int64_t def_pos, int64_t def_neg) -> int64_t {
    if (v.is_undef() || v.is_none()) return step > 0 ? def_pos : def_neg;
    int64_t x = v.as_int();
    if (x < 0) { x += len; if (x < 0) x = step > 0 ? 0 : -1; }
    else if (x >= len) x = step > 0 ? len : len - 1;
    return x;
  };
  start = norm(a, 0, len - 1);
  stop = norm(b, len, -1);
}

// Python ordering for sort/dictsort/min/max and < > comparisons.
Result<int> compare3(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_str() && b.is_str()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < std::min(a.l->size(), b.l->size()); ++k) {
      if (equals((*a.l)[k], (*b.l)[k])) continue;
      return compare3((*a.l)[k], (*b.l)[k]);
    }
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  return invalid_argument(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}


// ---- methods ----
Value Interp::method(const Value& obj, const std::string& name) {
  Interp* self = this;
  auto bind = [&](auto fn) { return Value::func([self, obj, fn](Args& a) -> Result<Value> { return fn(*self, obj, a); }); };
  auto arg_str = [](Interp& in, const Args& a, size_t k, const char* n) -> Result<std::string> {
    const Value* v = a.get(k, n);
    if (!v || !v->is_str()) return in.fail(std::string("expected a string argument '") + n + "'");
    return v->s;
  };
  if (obj.is_str()) {
    if (name == "startswith" || name == "endswith") {
      bool start = name == "startswith";
      return bind([start](Interp& in, const Value& s, Args& a) -> Result<Value> {
        const Value* p = a.get(0, "prefix");
        if (!p) return in.fail("startswith/endswith needs an argument");
        List cands = p->is_list() ? *p->l : List{*p};
        for (auto& c : cands) {
          if (!c.is_str()) return in.fail("startswith/endswith arg must be str or a tuple of str");
          if (c.s.size() <= s.s.size() && (start ? s.s.compare(0, c.s.size(), c.s) == 0 : s.s.compare(s.s.size() - c.s.size(), c.s.size(), c.s) == 0))
            return Value::boolean(true);
        }
        return Value::boolean(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return bind([l, r](Interp&, const Value& s, Args& a) -> Result<Value> { return Value::str(py_strip(s.s, a.get(0, "chars"), l, r)); });
    }
    if (name == "split" || name == "rsplit") {
      bool rs = name == "rsplit";
      return bind([rs](Interp& in, const Value& s, Args& a) -> Result<Value> {
        const Value* sep = a.get(0, "sep");
        const Value* mx = a.get(1, "maxsplit");
        int64_t maxsplit = mx ? mx->as_int() : -1;
        if (sep && !sep->is_none() && (!sep->is_str() || sep->s.empty())) return in.fail("empty separator");
        List out;
        if (rs && maxsplit >= 0) {  // split from the right: reverse, split, reverse
          std::u32string u = utf8_decode(s.s);
          std::reverse(u.begin(), u.end());
          Value rsep;
          if (sep && !sep->is_none()) { std::u32string x = utf8_decode(sep->s); std::reverse(x.begin(), x.end()); rsep = Value::str(utf8_encode(x)); }
          auto parts = py_split(utf8_encode(u), sep && !sep->is_none() ? &rsep : nullptr, maxsplit);
          std::reverse(parts.begin(), parts.end());
          for (auto& p : parts) { std::u32string x = utf8_decode(p); std::reverse(x.begin(), x.end()); out.push_back(Value::str(utf8_encode(x))); }
        } else {
          for (auto& p : py_split(s.s, sep, maxsplit)) out.push_back(Value::str(p));
        }
        return Value::list(std::move(out));
      });
    }
    if (name == "upper" || name == "lower")
      return bind([u = name == "upper"](Interp&, const Value& s, Args&) -> Result<Value> { return Value::str(map_case(s.s, u)); });
    if (name == "title" || name == "capitalize" || name == "swapcase")
      return bind([name](Interp&, const Value& s, Args&) -> Result<Value> {
        std::u32string u = utf8_decode(s.s);
        bool prev_cased = false;
        for (size_t k = 0; k < u.size(); ++k) {
          char32_t c = u[k];
          if (name == "title") { u[k] = prev_cased ? low(c) : up(c); prev_cased = cased_letter(c); }
          else if (name == "capitalize") u[k] = k == 0 ? up(c) : low(c);
          else u[k] = up(c) != c ? up(c) : low(c);
        }
        return Value::str(utf8_encode(u));
      });
    if (name == "replace")
      return bind([arg_str](Interp& in, const Value& s, Args& a) -> Result<Value> {
        KILN_ASSIGN_OR_RETURN(std::string x, arg_str(in, a, 0, "old"));
        KILN_ASSIGN_OR_RETURN(std::string y, arg_str(in, a, 1, "new"));
        const Value* c = a.get(2, "count");
        return Value::str(py_replace(s.s, x, y, c ? c->as_int() : -1));
      });
    if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex")
      return bind([name, arg_str](Interp& in, const Value& s, Args& a) -> Result<Value> {
        KILN_ASSIGN_OR_RETURN(std::string x, arg_str(in, a, 0, "sub"));
        if (name == "count") {
          if (x.empty()) return Value::integer(str_len(s.s) + 1);
          int64_t n = 0;
          for (size_t p = s.s.find(x); p != std::string::npos; p = s.s.find(x, p + x.size())) ++n;
          return Value::integer(n);
        }
        size_t p = name[0] == 'r' ? s.s.rfind(x) : s.s.find(x);
        if (p == std::string::npos) {
          if (name.find("index") != std::string::npos) return in.fail("substring not found");
          return Value::integer(-1);
        }
        return Value::integer(str_len(s.s.substr(0, p)));
      });
    if (name == "join")
      return bind([](Interp& in, const Value& s, Args& a) -> Result<Value> {
        if (a.pos.empty()) return in.fail("join() takes exactly one argument");
        KILN_ASSIGN_OR_RETURN(List items, in.iterate(a.pos[0]));
        std::string out;
        for (size_t k = 0; k < items.size(); ++k) {
          if (!items[k].is_str()) return in.fail("sequence item " + std::to_string(k) + ": expected str instance");
          out += (k ? s.s : "") + items[k].s;
        }
        return Value::str(out);
      });
    if (name == "splitlines")
      return bind([](Interp&, const Value& s, Args&) -> Result<Value> {
        List out;
        std::string cur;
        for (size_t k = 0; k < s.s.size(); ++k) {
          char c = s.s[k];
          if (c == '\n' || c == '\r') {
            out.push_back(Value::str(cur));
            cur.clear();
            if (c == '\r' && k + 1 < s.s.size() && s.s[k + 1] == '\n') ++k;
          } else cur += c;
        }
        if (!cur.empty()) out.push_back(Value::str(cur));
        return Value::list(std::move(out));
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" || name == "isupper")
      return bind([name](Interp&, const Value& s, Args&) -> Result<Value> {
        std::u32string u = utf8_decode(s.s);
        if (u.empty()) return Value::boolean(false);
        bool any_cased = false;
        for (char32_t c : u) {
          bool ok;
          if (name == "isdigit") ok = c >= '0' && c <= '9';
          else if (name == "isspace") ok = py_space(c);
          else if (name == "isalpha") ok = cased_letter(c) || (c > 127 && !py_space(c));
          else if (name == "isalnum") ok = cased_letter(c) || (c >= '0' && c <= '9');
          else if (name == "islower") { ok = !(up(c) == c && low(c) != c); any_cased |= cased_letter(c); }
          else { ok = !(low(c) == c && up(c) != c); any_cased |= cased_letter(c); }
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(name == "islower" || name == "isupper" ? any_cased : true);
      });
    if (name == "format")
      return bind([](Interp& in, const Value& s, Args& a) -> Result<Value> {
        std::string out;
        size_t auto_idx = 0;
        for (size_t k = 0; k < s.s.size(); ++k) {
          char c = s.s[k];
          if (c == '{' && k + 1 < s.s.size() && s.s[k + 1] == '{') { out += '{'; ++k; continue; }
          if (c == '}' && k + 1 < s.s.size() && s.s[k + 1] == '}') { out += '}'; ++k; continue; }
          if (c != '{') { out += c; continue; }
          size_t e = s.s.find('}', k);
          if (e == std::string::npos) return in.fail("Single '{' encountered in format string");
          std::string field = s.s.substr(k + 1, e - k - 1);
          const Value* v;
          if (field.empty()) v = auto_idx < a.pos.size() ? &a.pos[auto_idx++] : nullptr;
          else if (std::isdigit(static_cast<unsigned char>(field[0]))) { size_t i = std::stoul(field); v = i < a.pos.size() ? &a.pos[i] : nullptr; }
          else v = a.get(size_t(-1), field);
          if (!v) return in.fail("Replacement index out of range in format string");
          out += to_str(*v);
          k = e;
        }
        return Value::str(out);
      });
    return Value::undef();
  }
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values")
      return bind([name](Interp&, const Value& d, Args&) -> Result<Value> {
        List out;
        for (auto& [k, v] : d.d->items) {
          if (name == "items") out.push_back(Value::list({Value::str(k), v}, true));
          else out.push_back(name == "keys" ? Value::str(k) : v);
        }
        return Value::list(std::move(out));
      });
    if (name == "get")
      return bind([](Interp& in, const Value& d, Args& a) -> Result<Value> {
        if (a.pos.empty()) return in.fail("get expected at least 1 argument, got 0");
        const Value* v = a.pos[0].is_str() ? d.d->find(a.pos[0].s) : nullptr;
        if (v) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    return Value::undef();
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count")
      return bind([name](Interp& in, const Value& l, Args& a) -> Result<Value> {
        if (a.pos.empty()) return in.fail(name + "() takes exactly one argument");
        int64_t n = 0;
        for (size_t k = 0; k < l.l->size(); ++k) {
          if (!equals((*l.l)[k], a.pos[0])) continue;
          if (name == "index") return Value::integer(int64_t(k));
          ++n;
        }
        if (name == "index") return in.fail("value is not in list");
        return Value::integer(n);
      });
  }
  return Value::undef();
}


namespace {

// ---- filters ----
const Value* arg(const Args& a, size_t k, const char* name) { return a.get(k, name); }
bool arg_bool(const Args& a, size_t k, const char* name, bool def) { const Value* v = arg(a, k, name); return v ? v->truthy() : def; }

Result<Value> attr_path(Interp& in, const Value& v, const std::string& path) {
  Value cur = v;
  size_t b = 0;
  for (;;) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    // An all-digit part is an index when it fits in 64 bits (else a key, which no list has).
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool digits = !part.empty() && ec == std::errc() && end == part.data() + part.size() && part[0] != '-';
    if (cur.is_undef()) return cur;
    KILN_ASSIGN_OR_RETURN(cur, in.getitem(cur, digits ? Value::integer(index) : Value::str(part)));
    if (e == std::string::npos) return cur;
    b = e + 1;
  }
}

Result<Value> f_length(Interp& in, const Value& v, Args&) {
  if (v.is_str()) return Value::integer(str_len(v.s));
  if (v.is_list()) return Value::integer(int64_t(v.l->size()));
  if (v.is_dict()) return Value::integer(int64_t(v.d->items.size()));
  if (v.is_undef()) return Value::integer(0);
  return in.fail(std::string("object of type '") + type_name(v) + "' has no len()");
}
Result<Value> f_tojson(Interp& in, const Value& v, Args& a) {
  bool ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  const Value* ind = arg(a, 1, "indent");
  const Value* seps = arg(a, 2, "separators");
  bool sort_keys = arg_bool(a, 3, "sort_keys", false);
  int indent = ind && ind->is_int() ? int(ind->as_int()) : -1;
  std::string item_sep, key_sep;
  if (seps && seps->is_list() && seps->l->size() == 2) { item_sep = to_str((*seps->l)[0]); key_sep = to_str((*seps->l)[1]); }
  auto r = to_json(v, ensure_ascii, indent, item_sep, key_sep, sort_keys);
  if (!r.ok()) return in.fail(r.status().message());
  return Value::str(r.value());
}
Result<Value> f_trim(Interp&, const Value& v, Args& a) { return Value::str(py_strip(to_str(v), arg(a, 0, "chars"), true, true)); }
Result<Value> f_upper(Interp&, const Value& v, Args&) { return Value::str(map_case(to_str(v), true)); }
Result<Value> f_lower(Interp&, const Value& v, Args&) { return Value::str(map_case(to_str(v), false)); }
Result<Value> f_capitalize(Interp&, const Value& v, Args&) {
  std::u32string u = utf8_decode(to_str(v));
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? up(u[k]) : low(u[k]);
  return Value::str(utf8_encode(u));
}
Result<Value> f_title(Interp&, const Value& v, Args&) {
  // jinja: words split at runs of [-\s({\[<]; first char upper, rest lower.
  std::u32string u = utf8_decode(to_str(v));
  bool start = true;
  for (auto& c : u) {
    bool sep = c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) { start = true; continue; }
    c = start ? up(c) : low(c);
    start = false;
  }
  return Value::str(utf8_encode(u));
}
Result<Value> f_default(Interp&, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "default_value");
  bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undef() || (boolean && !v.truthy())) return d ? *d : Value::str("");
  return v;
}
Result<Value> f_join(Interp& in, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    Value x = items[k];
    if (attr) { KILN_ASSIGN_OR_RETURN(x, attr_path(in, x, to_str(*attr))); }
    out += (k && d ? to_str(*d) : "") + to_str(x);
  }
  return Value::str(out);
}
Result<Value> f_replace(Interp&, const Value& v, Args& a) {
  const Value* x = arg(a, 0, "old");
  const Value* y = arg(a, 1, "new");
  const Value* c = arg(a, 2, "count");
  return Value::str(py_replace(to_str(v), x ? to_str(*x) : "", y ? to_str(*y) : "", c && !c->is_none() ? c->as_int() : -1));
}
Result<Value> f_items(Interp& in, const Value& v, Args&) {
  if (v.is_undef()) return Value::list();
  if (!v.is_dict()) return in.fail("Can only get item pairs from a mapping.");
  List out;
  for (auto& [k, x] : v.d->items) out.push_back(Value::list({Value::str(k), x}, true));
  return Value::list(std::move(out));
}
Result<Value> f_list(Interp& in, const Value& v, Args&) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  return Value::list(std::move(items));
}
Result<Value> f_first(Interp& in, const Value& v, Args&) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  return items.empty() ? Value::undef("No first item, sequence was empty.") : items.front();
}
Result<Value> f_last(Interp& in, const Value& v, Args&) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  return items.empty() ? Value::undef("No last item, sequence was empty.") : items.back();
}
Result<Value> f_string(Interp&, const Value& v, Args&) { return Value::str(to_str(v)); }
Result<Value> f_safe(Interp&, const Value& v, Args&) { return v; }
Result<Value> f_escape(Interp&, const Value& v, Args&) { return Value::str(html_escape(to_str(v))); }
Result<Value> f_int(Interp&, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "default");
  Value def = d ? *d : Value::integer(0);
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.t == Value::T::Float) return std::isfinite(v.f) ? Value::integer(int64_t(v.f)) : def;
  if (v.is_str()) {
    std::string s = py_strip(v.s, nullptr, true, true);
    const Value* b = arg(a, 1, "base");
    int base = b ? int(b->as_int()) : 10;
    try {
      size_t used = 0;
      std::string digits;
      for (char c : s) if (c != '_') digits += c;
      long long x = std::stoll(digits, &used, base);
      if (used == digits.size() && !digits.empty()) return Value::integer(x);
    } catch (...) {}
    try {
      size_t used = 0;
      double x = std::stod(s, &used);
      if (used == s.size() && std::isfinite(x)) return Value::integer(int64_t(x));
    } catch (...) {}
  }
  return def;
}
Result<Value> f_float(Interp&, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "default");
  Value def = d ? *d : Value::number(0);
  if (v.is_num()) return Value::number(v.as_double());
  if (v.is_str()) {
    std::string s = py_strip(v.s, nullptr, true, true);
    try {
      size_t used = 0;
      double x = std::stod(s, &used);
      if (used == s.size()) return Value::number(x);
    } catch (...) {}
  }
  return def;
}
Result<Value> f_abs(Interp& in, const Value& v, Args&) {
  if (v.t == Value::T::Float) return Value::number(std::fabs(v.f));
  if (v.is_int()) return Value::integer(std::llabs(v.as_int()));
  return in.fail(std::string("bad operand type for abs(): '") + type_name(v) + "'");
}
Result<Value> f_round(Interp& in, const Value& v, Args& a) {
  const Value* p = arg(a, 0, "precision");
  const Value* m = arg(a, 1, "method");
  int64_t prec = p ? p->as_int() : 0;
  std::string method = m ? to_str(*m) : "common";
  if (!v.is_num()) return in.fail("round needs a number");
  double x = v.as_double(), scale = std::pow(10.0, double(prec)), r;
  if (method == "ceil") r = std::ceil(x * scale) / scale;
  else if (method == "floor") r = std::floor(x * scale) / scale;
  else if (method == "common") {
    if (v.is_int()) return Value::integer(v.as_int());
    r = std::nearbyint(x * scale) / scale;  // Python round(): half to even
  } else return in.fail("method must be 'common', 'ceil' or 'floor'");
  return Value::number(r);
}
Result<Value> f_reverse(Interp& in, const Value& v, Args&) {
  if (v.is_str()) { std::u32string u = utf8_decode(v.s); std::reverse(u.begin(), u.end()); return Value::str(utf8_encode(u)); }
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}
Value sort_key(const Value& v, bool case_sensitive) { return !case_sensitive && v.is_str() ? Value::str(map_case(v.s, false)) : v; }
Result<Value> sorted(Interp& in, List items, bool reverse, std::vector<Value> keys) {
  std::vector<size_t> idx(items.size());
  for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  Status st;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    auto c = compare3(keys[x], keys[y]);
    if (!c.ok()) { st = c.status(); return false; }
    return reverse ? c.value() > 0 : c.value() < 0;
  });
  if (!st.ok()) return in.fail(st.message());
  List out;
  for (size_t k : idx) out.push_back(items[k]);
  return Value::list(std::move(out));
}
Result<Value> f_sort(Interp& in, const Value& v, Args& a) {
  bool reverse = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attr = arg(a, 2, "attribute");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  std::vector<Value> keys;
  for (auto& x : items) {
    Value k = x;
    if (attr && !attr->is_none()) { KILN_ASSIGN_OR_RETURN(k, attr_path(in, x, to_str(*attr))); }
    keys.push_back(sort_key(k, cs));
  }
  return sorted(in, std::move(items), reverse, std::move(keys));
}
Result<Value> f_dictsort(Interp& in, const Value& v, Args& a) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  bool reverse = arg_bool(a, 2, "reverse", false);
  if (!v.is_dict()) return in.fail("You can only sort by either \"key\" or \"value\"");
  bool by_value = by && to_str(*by) == "value";
  List items;
  std::vector<Value> keys;
  for (auto& [k, x] : v.d->items) {
    items.push_back(Value::list({Value::str(k), x}, true));
    keys.push_back(sort_key(by_value ? x : Value::str(k), cs));
  }
  return sorted(in, std::move(items), reverse, std::move(keys));
}
Result<Value> f_unique(Interp& in, const Value& v, Args& a) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  List out, seen;
  for (auto& x : items) {
    Value k = x;
    if (attr && !attr->is_none()) { KILN_ASSIGN_OR_RETURN(k, attr_path(in, x, to_str(*attr))); }
    k = sort_key(k, cs);
    bool dup = false;
    for (auto& s : seen) dup = dup || equals(s, k);
    if (!dup) { seen.push_back(k); out.push_back(x); }
  }
  return Value::list(std::move(out));
}
Result<Value> f_map(Interp& in, const Value& v, Args& a) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  List out;
  const Value* attr = nullptr;
  for (auto& [k, x] : a.kw) if (k == "attribute") attr = &x;
  if (attr) {
    const Value* def = nullptr;
    for (auto& [k, x] : a.kw) if (k == "default") def = &x;
    for (auto& x : items) {
      KILN_ASSIGN_OR_RETURN(Value r, attr_path(in, x, to_str(*attr)));
      out.push_back(r.is_undef() && def ? *def : r);
    }
    return Value::list(std::move(out));
  }
  if (a.pos.empty()) return in.fail("map requires a filter argument");
  std::string name = to_str(a.pos[0]);
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (auto& x : items) {
    Args copy = rest;
    KILN_ASSIGN_OR_RETURN(Value r, in.apply_filter(name, x, copy));
    out.push_back(r);
  }
  return Value::list(std::move(out));
}
Result<Value> select_impl(Interp& in, const Value& v, Args& a, bool attr_mode, bool keep) {
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  size_t k = 0;
  std::string attr;
  if (attr_mode) {
    if (a.pos.empty()) return in.fail("Missing parameter for attribute name");
    attr = to_str(a.pos[k++]);
  }
  std::string test = k < a.pos.size() ? to_str(a.pos[k++]) : "";
  Args rest;
  rest.pos.assign(a.pos.begin() + long(std::min(k, a.pos.size())), a.pos.end());
  rest.kw = a.kw;
  List out;
  for (auto& x : items) {
    Value t = x;
    if (attr_mode) { KILN_ASSIGN_OR_RETURN(t, attr_path(in, x, attr)); }
    bool r;
    if (test.empty()) r = t.truthy();
    else {
      Args copy = rest;
      KILN_ASSIGN_OR_RETURN(r, in.apply_test(test, t, copy));
    }
    if (r == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}
Result<Value> f_select(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, false, true); }
Result<Value> f_reject(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Result<Value> f_selectattr(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, true, true); }
Result<Value> f_rejectattr(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, true, false); }
Result<Value> f_indent(Interp&, const Value& v, Args& a) {
  const Value* w = arg(a, 0, "width");
  bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  std::string ind = w && w->is_str() ? w->s : std::string(size_t(w ? w->as_int() : 4), ' ');
  std::string s = to_str(v) + "\n";
  std::vector<std::string> lines;
  std::string cur;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\n' || s[k] == '\r') {
      lines.push_back(cur);
      cur.clear();
      if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else cur += s[k];
  }
  if (!cur.empty()) lines.push_back(cur);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) { rv += '\n'; rv += ind; }
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += '\n';
      if (!lines[k].empty()) { rv += ind; rv += lines[k]; }
    }
  }
  return Value::str(first ? ind + rv : rv);
}
Result<Value> f_wordcount(Interp&, const Value& v, Args&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(to_str(v))) {
    bool w = c == '_' || (c >= '0' && c <= '9') || cased_letter(c) || (c > 127 && !py_space(c) && c != 0x2028);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}
Result<Value> f_sum(Interp& in, const Value& v, Args& a) {
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  Value acc = start ? *start : Value::integer(0);
  for (auto& x : items) {
    Value t = x;
    if (attr && !attr->is_none()) { KILN_ASSIGN_OR_RETURN(t, attr_path(in, x, to_str(*attr))); }
    KILN_ASSIGN_OR_RETURN(acc, in.binary("+", acc, t));
  }
  return acc;
}
Result<Value> minmax(Interp& in, const Value& v, Args& a, bool want_max) {
  bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = arg(a, 1, "attribute");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  if (items.empty()) return Value::undef("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t k = 0; k < items.size(); ++k) {
    Value key = items[k];
    if (attr && !attr->is_none()) { KILN_ASSIGN_OR_RETURN(key, attr_path(in, items[k], to_str(*attr))); }
    key = sort_key(key, cs);
    if (k == 0) { best_key = key; continue; }
    auto c = compare3(key, best_key);
    if (!c.ok()) return in.fail(c.status().message());
    if (want_max ? c.value() > 0 : c.value() < 0) { best = k; best_key = key; }
  }
  return items[best];
}
Result<Value> f_min(Interp& in, const Value& v, Args& a) { return minmax(in, v, a, false); }
Result<Value> f_max(Interp& in, const Value& v, Args& a) { return minmax(in, v, a, true); }
Result<Value> f_attr(Interp& in, const Value& v, Args& a) {
  if (a.pos.empty()) return in.fail("attr needs a name");
  return in.getattr(v, to_str(a.pos[0]));
}
Result<Value> f_center(Interp&, const Value& v, Args& a) {
  const Value* w = arg(a, 0, "width");
  std::u32string u = utf8_decode(to_str(v));
  int64_t width = w ? w->as_int() : 80, n = int64_t(u.size());
  if (width <= n) return Value::str(to_str(v));
  int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value::str(std::string(size_t(left), ' ') + to_str(v) + std::string(size_t(pad - left), ' '));
}
Result<Value> f_format(Interp& in, const Value& v, Args& a) {
  std::string s = to_str(v), out;
  size_t idx = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '%') { out += s[k]; continue; }
    if (k + 1 >= s.size()) return in.fail("incomplete format");
    char c = s[++k];
    if (c == '%') { out += '%'; continue; }
    if (idx >= a.pos.size()) return in.fail("not enough arguments for format string");
    const Value& x = a.pos[idx++];
    if (c == 's') out += to_str(x);
    else if (c == 'r') out += repr(x);
    else if (c == 'd' || c == 'i') out += std::to_string(x.is_num() ? (x.t == Value::T::Float ? int64_t(x.f) : x.as_int()) : 0);
    else return in.fail(std::string("unsupported format character '") + c + "'");
  }
  return Value::str(out);
}


}  // namespace

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"length", f_length}, {"count", f_length}, {"tojson", f_tojson}, {"trim", f_trim}, {"upper", f_upper},
      {"lower", f_lower}, {"capitalize", f_capitalize}, {"title", f_title}, {"default", f_default}, {"d", f_default},
      {"join", f_join}, {"replace", f_replace}, {"items", f_items}, {"list", f_list}, {"first", f_first},
      {"last", f_last}, {"string", f_string}, {"safe", f_safe}, {"escape", f_escape}, {"e", f_escape},
      {"forceescape", f_escape}, {"int", f_int}, {"float", f_float}, {"abs", f_abs}, {"round", f_round},
      {"reverse", f_reverse}, {"sort", f_sort}, {"dictsort", f_dictsort}, {"unique", f_unique}, {"map", f_map},
      {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"indent", f_indent}, {"wordcount", f_wordcount}, {"sum", f_sum}, {"min", f_min}, {"max", f_max},
      {"attr", f_attr}, {"center", f_center}, {"format", f_format},
  };
  return m;
}


namespace {

// ---- tests ----
Result<bool> t_defined(Interp&, const Value& v, Args&) { return !v.is_undef(); }
Result<bool> t_undefined(Interp&, const Value& v, Args&) { return v.is_undef(); }
Result<bool> t_none(Interp&, const Value& v, Args&) { return v.is_none(); }
Result<bool> t_string(Interp&, const Value& v, Args&) { return v.is_str(); }
Result<bool> t_number(Interp&, const Value& v, Args&) { return v.is_num(); }
Result<bool> t_integer(Interp&, const Value& v, Args&) { return v.t == Value::T::Int; }
Result<bool> t_float(Interp&, const Value& v, Args&) { return v.t == Value::T::Float; }
Result<bool> t_boolean(Interp&, const Value& v, Args&) { return v.t == Value::T::Bool; }
Result<bool> t_true(Interp&, const Value& v, Args&) { return v.t == Value::T::Bool && v.b; }
Result<bool> t_false(Interp&, const Value& v, Args&) { return v.t == Value::T::Bool && !v.b; }
Result<bool> t_mapping(Interp&, const Value& v, Args&) { return v.is_dict(); }
Result<bool> t_iterable(Interp&, const Value& v, Args&) { return v.is_str() || v.is_list() || v.is_dict() || v.is_undef(); }
Result<bool> t_sequence(Interp&, const Value& v, Args&) { return v.is_str() || v.is_list() || v.is_dict(); }
Result<bool> t_callable(Interp&, const Value& v, Args&) { return v.t == Value::T::Func; }
Result<bool> t_lower(Interp&, const Value& v, Args&) { return v.is_str() && map_case(v.s, false) == v.s; }
Result<bool> t_upper(Interp&, const Value& v, Args&) { return v.is_str() && map_case(v.s, true) == v.s; }
Result<bool> t_odd(Interp& in, const Value& v, Args&) {
  if (!v.is_int()) return in.fail("odd needs an integer");
  return (v.as_int() % 2) != 0;
}
Result<bool> t_even(Interp& in, const Value& v, Args&) {
  if (!v.is_int()) return in.fail("even needs an integer");
  return (v.as_int() % 2) == 0;
}
Result<bool> t_divisibleby(Interp& in, const Value& v, Args& a) {
  const Value* n = arg(a, 0, "num");
  if (!n || !n->is_num() || !v.is_num()) return in.fail("divisibleby needs numbers");
  KILN_ASSIGN_OR_RETURN(Value r, in.binary("%", v, *n));
  return !r.truthy();
}
Result<bool> t_eq(Interp& in, const Value& v, Args& a) {
  const Value* o = arg(a, 0, "other");
  if (!o) return in.fail("test needs an argument");
  return equals(v, *o);
}
Result<bool> t_ne(Interp& in, const Value& v, Args& a) { KILN_ASSIGN_OR_RETURN(bool r, t_eq(in, v, a)); return !r; }
template <int Want>
Result<bool> t_cmp(Interp& in, const Value& v, Args& a) {
  const Value* o = arg(a, 0, "other");
  if (!o) return in.fail("test needs an argument");
  auto c = compare3(v, *o);
  if (!c.ok()) return in.fail(c.status().message());
  int x = c.value();
  return Want == 0 ? x < 0 : Want == 1 ? x <= 0 : Want == 2 ? x > 0 : x >= 0;
}
Result<bool> t_in(Interp& in, const Value& v, Args& a) {
  const Value* o = arg(a, 0, "seq");
  if (!o) return in.fail("test needs an argument");
  return in.contains(*o, v);
}
Result<bool> t_sameas(Interp& in, const Value& v, Args& a) {
  const Value* o = arg(a, 0, "other");
  if (!o) return in.fail("test needs an argument");
  if (v.t != o->t) return false;
  if (v.is_list()) return v.l == o->l;
  if (v.is_dict()) return v.d == o->d;
  if (v.is_str()) return v.s == o->s;
  return equals(v, *o);
}
Result<bool> t_filter(Interp&, const Value& v, Args&) { return v.is_str() && filters().count(v.s) > 0; }
Result<bool> t_test(Interp&, const Value& v, Args&) { return v.is_str() && tests().count(v.s) > 0; }


}  // namespace

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
      {"number", t_number}, {"integer", t_integer}, {"float", t_float}, {"boolean", t_boolean}, {"true", t_true},
      {"false", t_false}, {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence},
      {"callable", t_callable}, {"lower", t_lower}, {"upper", t_upper}, {"odd", t_odd}, {"even", t_even},
      {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_cmp<0>}, {"lessthan", t_cmp<0>}, {"<", t_cmp<0>}, {"le", t_cmp<1>}, {"<=", t_cmp<1>},
      {"gt", t_cmp<2>}, {"greaterthan", t_cmp<2>}, {">", t_cmp<2>}, {"ge", t_cmp<3>}, {">=", t_cmp<3>},
      {"in", t_in}, {"sameas", t_sameas}, {"escaped", t_false}, {"filter", t_filter}, {"test", t_test},
  };
  return m;
}


}  // namespace kiln::jinja
