// The filters and tests chat templates use (Jinja's builtins as transformers renders them); see
// interp.cpp for the evaluator and builtins.cpp for the methods.
#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>

#include <utf8proc.h>

#include "model/chat_template.h"
#include "model/jinja/format.h"
#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {

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

Value sort_key(const Value& v, bool case_sensitive) { return !case_sensitive && v.is_str() ? Value::str(map_case(v.s, false)) : v; }

Result<std::vector<size_t>> sort_order(Interp& in, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> idx(keys.size());
  for (size_t k = 0; k < idx.size(); ++k) idx[k] = k;
  Status st;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    auto c = compare3(keys[x], keys[y]);
    if (!c.ok()) { st = c.status(); return false; }
    return reverse ? c.value() > 0 : c.value() < 0;
  });
  if (!st.ok()) return in.fail(st.message());
  return idx;
}

namespace {

// ---- filters ----
const Value* arg(const Args& a, size_t k, const char* name) { return a.get(k, name); }
bool arg_bool(const Args& a, size_t k, const char* name, bool def) { const Value* v = arg(a, k, name); return v ? v->truthy() : def; }

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
  // json.dumps: an int indent is that many spaces, a str indent itself, None one line.
  std::optional<std::string> indent;
  if (ind && ind->is_int()) {
    if (ind->as_int() > 4096) return in.fail("tojson indent of more than 4096 spaces");
    indent = std::string(size_t(std::max<int64_t>(ind->as_int(), 0)), ' ');
  } else if (ind && ind->is_str()) {
    if (ind->s.size() > 4096) return in.fail("tojson indent of more than 4096 characters");
    indent = ind->s;
  } else if (ind && !ind->is_none()) {
    return in.fail(std::string("tojson indent must be an int, a str or None, not ") + type_name(*ind));
  }
  std::string item_sep, key_sep;
  if (seps && seps->is_list() && seps->l->size() == 2) { item_sep = to_str((*seps->l)[0]); key_sep = to_str((*seps->l)[1]); }
  auto r = to_json(v, ensure_ascii, indent, item_sep, key_sep, sort_keys);
  if (!r.ok()) return in.fail(r.status().message());
  return Value::str(r.value());
}
// A string result of a filter that calls a method of its input: a Markup stays one (jinja2's soft_str).
Value like(const Value& input, std::string s) { return input.is_str() && input.safe ? Value::markup(std::move(s)) : Value::str(std::move(s)); }
Result<Value> f_trim(Interp&, const Value& v, Args& a) {
  const Value* chars = arg(a, 0, "chars");
  Value escaped_chars = chars && v.safe && chars->is_str() ? markup_escape(*chars) : Value();  // Markup.strip escapes them
  return like(v, py_strip(to_str(v), escaped_chars.is_str() ? &escaped_chars : chars, true, true));
}
Result<Value> f_upper(Interp&, const Value& v, Args&) { return like(v, map_case(to_str(v), true)); }
Result<Value> f_lower(Interp&, const Value& v, Args&) { return like(v, map_case(to_str(v), false)); }
Result<Value> f_capitalize(Interp&, const Value& v, Args&) {
  std::u32string u = utf8_decode(to_str(v));
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? py_upper(u[k]) : py_lower(u[k]);
  return like(v, utf8_encode(u));
}
Result<Value> f_title(Interp&, const Value& v, Args&) {
  // jinja: words split at runs of [-\s({\[<]; first char upper, rest lower.
  std::u32string u = utf8_decode(to_str(v));
  bool start = true;
  for (auto& c : u) {
    bool sep = c == '-' || py_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) { start = true; continue; }
    c = start ? py_upper(c) : py_lower(c);
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
    KILN_RETURN_IF_ERROR(in.check_size(out.size()));
  }
  return Value::str(out);
}
Result<Value> f_replace(Interp& in, const Value& v, Args& a) {
  const Value* x = arg(a, 0, "old");
  const Value* y = arg(a, 1, "new");
  const Value* c = arg(a, 2, "count");
  const std::string s = to_str(v), old_s = x ? to_str(*x) : "", new_s = y ? to_str(*y) : "";
  const int64_t count = c && !c->is_none() ? c->as_int() : -1;
  KILN_RETURN_IF_ERROR(check_replace(in, s, old_s, new_s, count));
  return Value::str(py_replace(s, old_s, new_s, count));
}
Result<Value> f_items(Interp& in, const Value& v, Args&) {
  if (v.is_undef()) return Value::list();
  if (!v.is_dict()) return in.fail("Can only get item pairs from a mapping.");
  List out;
  for (auto& [k, x] : v.d->items) out.push_back(Value::list({k, x}, true));
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
// Markup (jinja2's safe strings, autoescape off): |safe marks a value safe, |escape escapes what is
// not safe yet, |forceescape escapes even a Markup; |string keeps a Markup one.
Result<Value> f_string(Interp&, const Value& v, Args&) { return v.is_str() ? v : Value::str(to_str(v)); }
Result<Value> f_safe(Interp&, const Value& v, Args&) { return Value::markup(to_str(v)); }
Result<Value> f_escape(Interp&, const Value& v, Args&) { return markup_escape(v); }
Result<Value> f_forceescape(Interp&, const Value& v, Args&) { return Value::markup(html_escape(to_str(v))); }
// jinja2's int: int(value) (a str in `base`), else int(float(value)), else the default.
Result<Value> f_int(Interp& in, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "default");
  const Value def = d ? *d : Value::integer(0);
  auto from_double = [&](double x) -> Result<Value> {
    if (!std::isfinite(x)) return def;
    if (std::fabs(x) >= 9223372036854775808.0) return in.fail("int(" + float_repr(x) + ") does not fit in kiln's 64-bit template integers");
    return Value::integer(int64_t(x));
  };
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.t == Value::T::Float) return from_double(v.f);
  if (!v.is_str()) return def;
  const Value* b = arg(a, 1, "base");
  auto parsed = py_parse_int(v.s, b && b->is_int() ? b->as_int() : 10);
  if (!parsed.ok()) return in.fail(parsed.status().message());
  if (parsed.value()) return Value::integer(*parsed.value());
  if (std::optional<double> x = py_parse_float(v.s)) return from_double(*x);
  return def;
}
Result<Value> f_float(Interp&, const Value& v, Args& a) {
  const Value* d = arg(a, 0, "default");
  if (v.is_num()) return Value::number(v.as_double());
  if (v.is_str())
    if (std::optional<double> x = py_parse_float(v.s)) return Value::number(*x);
  return d ? *d : Value::number(0);
}
Result<Value> f_abs(Interp& in, const Value& v, Args&) {
  if (v.t == Value::T::Float) return Value::number(std::fabs(v.f));
  if (v.is_int()) return Value::integer(std::llabs(v.as_int()));
  return in.fail(std::string("bad operand type for abs(): '") + type_name(v) + "'");
}
// jinja2's round: Python's round(value, precision) ('common'), else ceil / floor of value * 10**precision
// divided back.
Result<Value> f_round(Interp& in, const Value& v, Args& a) {
  const Value* p = arg(a, 0, "precision");
  const Value* m = arg(a, 1, "method");
  const std::string method = m ? to_str(*m) : "common";
  if (method != "common" && method != "ceil" && method != "floor") return in.fail("method must be common, ceil or floor");
  if (p && !p->is_int()) return in.fail(std::string("'") + type_name(*p) + "' object cannot be interpreted as an integer");
  if (!v.is_num()) return in.fail(std::string("type ") + type_name(v) + " doesn't define __round__ method");
  const int64_t prec = p ? p->as_int() : 0;
  if (method == "common") {
    if (!v.is_int()) return Value::number(py_round(v.f, prec));
    auto r = py_round_int(v.as_int(), prec);
    if (!r.ok()) return in.fail(r.status().message());
    return Value::integer(r.value());
  }
  const double scale = std::pow(10.0, double(prec)), x = v.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}
Result<Value> f_reverse(Interp& in, const Value& v, Args&) {
  if (v.is_str()) { std::u32string u = utf8_decode(v.s); std::reverse(u.begin(), u.end()); return Value::str(utf8_encode(u)); }
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Result<Value> sorted(Interp& in, List items, bool reverse, std::vector<Value> keys) {
  KILN_ASSIGN_OR_RETURN(std::vector<size_t> idx, sort_order(in, keys, reverse));
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
    items.push_back(Value::list({k, x}, true));
    keys.push_back(sort_key(by_value ? x : k, cs));
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
  if (!v.truthy()) return Value::list();  // jinja2 iterates only a true value: none|map(...) is empty
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
  if (!v.truthy()) return Value::list();  // as map: none|selectattr(...) is empty
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
Result<Value> f_indent(Interp& in, const Value& v, Args& a) {
  const Value* w = arg(a, 0, "width");
  bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  // jinja2: a str width is the indentation, an int n is n spaces (none for n <= 0).
  std::string ind = "    ";
  if (w && w->is_str()) {
    ind = w->s;
  } else if (w && w->is_int()) {
    KILN_RETURN_IF_ERROR(in.check_size(static_cast<size_t>(std::max<int64_t>(w->as_int(), 0))));
    ind.assign(static_cast<size_t>(std::max<int64_t>(w->as_int(), 0)), ' ');
  } else if (w && !w->is_undef()) {
    return in.fail(std::string("can't multiply sequence by non-int of type '") + type_name(*w) + "'");
  }
  std::string s = to_str(v) + "\n";
  // Every line may get the indentation: bounded before it is built.
  KILN_RETURN_IF_ERROR(in.check_size(s.size() + static_cast<size_t>(std::count(s.begin(), s.end(), '\n') +
                                                                    std::count(s.begin(), s.end(), '\r') + 1) *
                                                    ind.size()));
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
  return like(v, first ? ind + rv : rv);
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
// jinja2's attr: getattr only, so a dict's keys are not attributes (its methods and a namespace's are).
Result<Value> f_attr(Interp& in, const Value& v, Args& a) {
  if (a.pos.empty()) return in.fail("attr needs a name");
  const std::string name = to_str(a.pos[0]);
  if (v.is_dict() && !v.ns) return in.method(v, name);
  return in.getattr(v, name);
}
Result<Value> f_center(Interp&, const Value& v, Args& a) {
  const Value* w = arg(a, 0, "width");
  std::u32string u = utf8_decode(to_str(v));
  int64_t width = w ? w->as_int() : 80, n = int64_t(u.size());
  if (width <= n) return like(v, to_str(v));
  int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return like(v, std::string(size_t(left), ' ') + to_str(v) + std::string(size_t(pad - left), ' '));
}
// jinja2's format: value % args (a tuple), or value % kwargs (a dict); a Markup escapes what it formats.
Result<Value> f_format(Interp& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) return in.fail("can't handle positional and keyword arguments at the same time");
  Value args = Value::list(a.pos, true);
  if (!a.kw.empty()) {
    args = Value::dict();
    for (const auto& [k, x] : a.kw) args.d->set(k, x);
  }
  const bool safe = v.is_str() && v.safe;
  auto r = percent_format(to_str(v), safe ? escape_format_args(args) : args);
  if (!r.ok()) return in.fail(r.status().message());
  KILN_RETURN_IF_ERROR(in.check_size(r.value().size()));
  return like(v, std::move(r).value());
}


}  // namespace

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = [] {
    std::map<std::string, FilterFn> all = {
      {"length", f_length}, {"count", f_length}, {"tojson", f_tojson}, {"trim", f_trim}, {"upper", f_upper},
      {"lower", f_lower}, {"capitalize", f_capitalize}, {"title", f_title}, {"default", f_default}, {"d", f_default},
      {"join", f_join}, {"replace", f_replace}, {"items", f_items}, {"list", f_list}, {"first", f_first},
      {"last", f_last}, {"string", f_string}, {"safe", f_safe}, {"escape", f_escape}, {"e", f_escape},
      {"forceescape", f_forceescape}, {"int", f_int}, {"float", f_float}, {"abs", f_abs}, {"round", f_round},
      {"reverse", f_reverse}, {"sort", f_sort}, {"dictsort", f_dictsort}, {"unique", f_unique}, {"map", f_map},
      {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"indent", f_indent}, {"wordcount", f_wordcount}, {"sum", f_sum}, {"min", f_min}, {"max", f_max},
      {"attr", f_attr}, {"center", f_center}, {"format", f_format},
    };
    for (const auto& [name, fn] : more_filters()) all[name] = fn;
    return all;
  }();
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
Result<bool> t_escaped(Interp&, const Value& v, Args&) { return v.is_str() && v.safe; }
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
      {"in", t_in}, {"sameas", t_sameas}, {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return m;
}

}  // namespace kiln::jinja
