// More of Python's str methods for the chat-template interpreter (the common ones are in
// builtins.cpp): partition / rpartition, zfill, center / ljust / rjust, casefold, removeprefix /
// removesuffix, expandtabs, istitle and splitlines, by code point as Python counts.
#include <cstdint>
#include <string>

#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {
namespace {

// Widths past this are an error rather than a string of that size.
constexpr int64_t kMaxPad = 1 << 20;

bool line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

Result<int64_t> width_arg(Interp& in, const Args& a, const char* name) {
  const Value* w = a.get(0, name);
  if (!w || !w->is_int()) return in.fail(std::string("the ") + name + " argument must be an integer");
  if (w->as_int() > kMaxPad) return in.fail("a width of more than " + std::to_string(kMaxPad));
  return w->as_int();
}

Result<std::u32string> fill_arg(Interp& in, const Args& a) {
  const Value* f = a.get(1, "fillchar");
  if (!f) return std::u32string(U" ");
  if (!f->is_str() || str_len(f->s) != 1) return in.fail("The fill character must be exactly one character long");
  return utf8_decode(f->s);
}

}  // namespace

Value Interp::str_method(const Value& obj, const std::string& name) {
  Interp* self = this;
  auto bind = [&](auto fn) { return Value::func([self, obj, fn](Args& a) -> Result<Value> { return self->bounded(fn(*self, obj.s, a)); }); };
  if (name == "partition" || name == "rpartition") {
    const bool right = name[0] == 'r';
    return bind([right](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      const Value* sep = a.get(0, "sep");
      if (!sep || !sep->is_str()) return in.fail("must be str");
      if (sep->s.empty()) return in.fail("empty separator");
      const size_t p = right ? s.rfind(sep->s) : s.find(sep->s);
      List parts;
      if (p == std::string::npos) parts = right ? List{Value::str(""), Value::str(""), Value::str(s)} : List{Value::str(s), Value::str(""), Value::str("")};
      else parts = {Value::str(s.substr(0, p)), Value::str(sep->s), Value::str(s.substr(p + sep->s.size()))};
      return Value::list(std::move(parts), true);
    });
  }
  if (name == "zfill")
    return bind([](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      KILN_ASSIGN_OR_RETURN(int64_t width, width_arg(in, a, "width"));
      const int64_t n = str_len(s);
      if (width <= n) return Value::str(s);
      const size_t at = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;  // zeros go after a sign
      return Value::str(s.substr(0, at) + std::string(size_t(width - n), '0') + s.substr(at));
    });
  if (name == "center" || name == "ljust" || name == "rjust")
    return bind([name](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      KILN_ASSIGN_OR_RETURN(int64_t width, width_arg(in, a, "width"));
      KILN_ASSIGN_OR_RETURN(std::u32string fill, fill_arg(in, a));
      const int64_t n = str_len(s);
      if (width <= n) return Value::str(s);
      const int64_t pad = width - n;
      // Python's center puts the odd space on the left when the width is odd.
      const int64_t left = name == "ljust" ? 0 : name == "rjust" ? pad : pad / 2 + (pad & width & 1);
      std::string l, r;
      for (int64_t k = 0; k < left; ++k) l += utf8_encode(fill);
      for (int64_t k = left; k < pad; ++k) r += utf8_encode(fill);
      return Value::str(l + s + r);
    });
  if (name == "casefold")  // lower case (Python's full case folding differs only for a few letters, e.g. ß)
    return bind([](Interp&, const std::string& s, Args&) -> Result<Value> { return Value::str(map_case(s, false)); });
  if (name == "removeprefix" || name == "removesuffix") {
    const bool prefix = name == "removeprefix";
    return bind([prefix](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      const Value* x = a.get(0, prefix ? "prefix" : "suffix");
      if (!x || !x->is_str()) return in.fail(std::string(prefix ? "removeprefix" : "removesuffix") + "() argument must be str");
      const std::string& t = x->s;
      if (t.size() > s.size()) return Value::str(s);
      if (prefix && s.compare(0, t.size(), t) == 0) return Value::str(s.substr(t.size()));
      if (!prefix && s.compare(s.size() - t.size(), t.size(), t) == 0) return Value::str(s.substr(0, s.size() - t.size()));
      return Value::str(s);
    });
  }
  if (name == "expandtabs")
    return bind([](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      const Value* t = a.get(0, "tabsize");
      if (t && !t->is_int()) return in.fail("the tabsize argument must be an integer");
      const int64_t tab = t ? t->as_int() : 8;
      if (tab > kMaxPad) return in.fail("a tab size of more than " + std::to_string(kMaxPad));
      std::string out;
      int64_t column = 0;
      for (char32_t c : utf8_decode(s)) {
        if (c == '\t') {
          if (tab > 0) {
            const int64_t spaces = tab - column % tab;
            out.append(size_t(spaces), ' ');
            column += spaces;
          }
          KILN_RETURN_IF_ERROR(in.check_size(out.size()));
          continue;
        }
        utf8_append(out, c);
        column = c == '\n' || c == '\r' ? 0 : column + 1;
      }
      return Value::str(out);
    });
  if (name == "istitle")
    return bind([](Interp&, const std::string& s, Args&) -> Result<Value> {
      bool cased = false, previous_cased = false;
      for (char32_t c : utf8_decode(s)) {
        const bool upper = py_lower(c) != c, lower = py_upper(c) != c;
        if (upper) {
          if (previous_cased) return Value::boolean(false);
          previous_cased = cased = true;
        } else if (lower) {
          if (!previous_cased) return Value::boolean(false);
          previous_cased = cased = true;
        } else {
          previous_cased = false;
        }
      }
      return Value::boolean(cased);
    });
  if (name == "splitlines")
    return bind([](Interp& in, const std::string& s, Args& a) -> Result<Value> {
      const Value* keep = a.get(0, "keepends");
      const bool keepends = keep && keep->truthy();
      const std::u32string u = utf8_decode(s);
      List out;
      size_t start = 0;
      for (size_t k = 0; k < u.size(); ++k) {
        if (!line_break(u[k])) continue;
        size_t end = k + 1;
        if (u[k] == '\r' && end < u.size() && u[end] == '\n') ++end;
        out.push_back(Value::str(utf8_encode(u.substr(start, (keepends ? end : k) - start))));
        KILN_RETURN_IF_ERROR(in.check_items(out.size()));
        start = end;
        k = end - 1;
      }
      if (start < u.size()) out.push_back(Value::str(utf8_encode(u.substr(start))));
      return Value::list(std::move(out));
    });
  return Value::undef();
}

}  // namespace kiln::jinja
