// The chat-template interpreter's str / dict / list methods, Python's slice indices and ordering
// (see interp.cpp for the evaluator, filters.cpp for the filters and tests, py_string.h for the
// string operations).
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>
#include <set>

#include <utf8proc.h>

#include "model/chat_template.h"
#include "model/jinja/format.h"
#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {

// Python's slice index normalization.
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
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {  // a list and a tuple do not compare
    for (size_t k = 0; k < std::min(a.l->size(), b.l->size()); ++k) {
      if (equals((*a.l)[k], (*b.l)[k])) continue;
      return compare3((*a.l)[k], (*b.l)[k]);
    }
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  return invalid_argument(std::string("'<' not supported between instances of '") + type_name(a) + "' and '" + type_name(b) + "'");
}


// ---- methods ----
namespace {
// A Markup's result of one of the wrapped methods: strings in it are Markup too.
Value as_markup(Value v) {
  if (v.is_str()) v.safe = true;
  if (v.is_list()) {
    List l = *v.l;
    for (Value& e : l)
      if (e.is_str()) e.safe = true;
    v = Value::list(std::move(l), v.tuple);
  }
  return v;
}
}  // namespace

// markupsafe's Markup methods: those that build strings escape their str arguments (join: the items
// it joins) and return Markup; the rest are str's.
Value Interp::markup_method(const Value& obj, const std::string& name) {
  static const std::set<std::string> wrapped = {
      "capitalize", "title", "lower", "upper", "replace", "ljust", "rjust", "lstrip", "rstrip", "center", "strip",
      "expandtabs", "swapcase", "zfill", "casefold", "removeprefix", "removesuffix", "split", "rsplit",
      "splitlines", "partition", "rpartition", "format", "join"};
  Value plain = obj;
  plain.safe = false;
  Value m = method(plain, name);
  if (m.is_undef() || !wrapped.count(name)) return m;
  Interp* self = this;
  return Value::func([self, m, name](Args& a) -> Result<Value> {
    Args escaped = a;
    if (name == "join" && !escaped.pos.empty()) {
      KILN_ASSIGN_OR_RETURN(List items, self->iterate(escaped.pos[0]));
      for (Value& x : items) x = markup_escape(x);
      escaped.pos[0] = Value::list(std::move(items));
    } else {
      for (Value& x : escaped.pos)
        if (x.is_str()) x = markup_escape(x);
      for (auto& kv : escaped.kw)
        if (kv.second.is_str()) kv.second = markup_escape(kv.second);
    }
    KILN_ASSIGN_OR_RETURN(Value r, self->call(m, escaped));
    return as_markup(std::move(r));
  });
}

Value Interp::method(const Value& obj, const std::string& name) {
  if (obj.is_str() && obj.safe) return markup_method(obj, name);
  Interp* self = this;
  auto bind = [&](auto fn) { return Value::func([self, obj, fn](Args& a) -> Result<Value> { return self->bounded(fn(*self, obj, a)); }); };
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
          auto parts = py_split(utf8_encode(u), sep && !sep->is_none() ? &rsep : nullptr, maxsplit, in.max_items());
          std::reverse(parts.begin(), parts.end());
          for (auto& p : parts) { std::u32string x = utf8_decode(p); std::reverse(x.begin(), x.end()); out.push_back(Value::str(utf8_encode(x))); }
        } else {
          for (auto& p : py_split(s.s, sep, maxsplit, in.max_items())) out.push_back(Value::str(p));
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
          if (name == "title") { u[k] = prev_cased ? py_lower(c) : py_upper(c); prev_cased = cased_letter(c); }
          else if (name == "capitalize") u[k] = k == 0 ? py_upper(c) : py_lower(c);
          else u[k] = py_upper(c) != c ? py_upper(c) : py_lower(c);
        }
        return Value::str(utf8_encode(u));
      });
    if (name == "replace")
      return bind([arg_str](Interp& in, const Value& s, Args& a) -> Result<Value> {
        KILN_ASSIGN_OR_RETURN(std::string x, arg_str(in, a, 0, "old"));
        KILN_ASSIGN_OR_RETURN(std::string y, arg_str(in, a, 1, "new"));
        const Value* c = a.get(2, "count");
        KILN_RETURN_IF_ERROR(check_replace(in, s.s, x, y, c ? c->as_int() : -1));
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
          KILN_RETURN_IF_ERROR(in.check_size(out.size()));
        }
        return Value::str(out);
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
          else if (name == "islower") { ok = !(py_upper(c) == c && py_lower(c) != c); any_cased |= cased_letter(c); }
          else { ok = !(py_lower(c) == c && py_upper(c) != c); any_cased |= cased_letter(c); }
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(name == "islower" || name == "isupper" ? any_cased : true);
      });
    if (name == "format")
      return bind([](Interp& in, const Value& s, Args& a) -> Result<Value> {
        auto r = brace_format(in, s.s, a);
        if (!r.ok()) return in.fail(r.status().message());
        KILN_RETURN_IF_ERROR(in.check_size(r.value().size()));
        return Value::str(std::move(r).value());
      });
    return str_method(obj, name);
  }
  if (obj.is_dict()) {
    if (name == "items" || name == "keys" || name == "values")
      return bind([name](Interp&, const Value& d, Args&) -> Result<Value> {
        List out;
        for (auto& [k, v] : d.d->items) {
          if (name == "items") out.push_back(Value::list({k, v}, true));
          else out.push_back(name == "keys" ? k : v);
        }
        return Value::list(std::move(out));
      });
    if (name == "get")
      return bind([](Interp& in, const Value& d, Args& a) -> Result<Value> {
        if (a.pos.empty()) return in.fail("get expected at least 1 argument, got 0");
        if (!is_hashable(a.pos[0])) return in.fail(std::string("unhashable type: '") + type_name(a.pos[0]) + "'");
        const Value* v = d.d->find(a.pos[0]);
        if (v) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    if (name == "copy")
      return bind([](Interp&, const Value& d, Args&) -> Result<Value> {
        Value c = Value::dict();
        c.d->items = d.d->items;
        return c;
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

}  // namespace kiln::jinja
