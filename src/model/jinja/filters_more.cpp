// Jinja's less common filters, as jinja2 3.x has them (the common ones are in filters.cpp):
// groupby, batch, slice, truncate, striptags and pprint.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {
namespace {

Result<int64_t> count_arg(Interp& in, const Args& a, size_t index, const char* name, int64_t fallback) {
  const Value* v = a.get(index, name);
  if (!v) {
    if (fallback < 0) return in.fail(std::string("missing argument '") + name + "'");
    return fallback;
  }
  if (!v->is_int()) return in.fail(std::string("'") + type_name(*v) + "' object cannot be interpreted as an integer");
  return v->as_int();
}

// groupby(attribute, default=none, case_sensitive=false): the items sorted by the attribute, then
// (grouper, list) for each run of equal keys; without case_sensitive the keys compare lower-cased and
// the grouper is the first item's own value.
Result<Value> f_groupby(Interp& in, const Value& v, Args& a) {
  const Value* attr = a.get(0, "attribute");
  if (!attr) return in.fail("groupby needs an attribute");
  const Value* def = a.get(1, "default");
  const Value* cs = a.get(2, "case_sensitive");
  const bool case_sensitive = cs && cs->truthy();
  const std::string path = to_str(*attr);
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  std::vector<Value> keys, shown;
  for (const Value& x : items) {
    KILN_ASSIGN_OR_RETURN(Value k, attr_path(in, x, path));
    if (k.is_undef() && def && !def->is_none()) k = *def;
    shown.push_back(k);
    keys.push_back(sort_key(k, case_sensitive));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<size_t> order, sort_order(in, keys, false));
  List groups;
  for (size_t k = 0; k < order.size();) {
    List members;
    size_t e = k;
    while (e < order.size() && equals(keys[order[e]], keys[order[k]])) members.push_back(items[order[e++]]);
    Value g = Value::list({shown[order[k]], Value::list(std::move(members))}, true);
    g.s = kGroupTuple;
    groups.push_back(std::move(g));
    k = e;
  }
  return Value::list(std::move(groups));
}

// batch(count, fill_with=none): lists of `count` items; the last one filled up when fill_with is given.
Result<Value> f_batch(Interp& in, const Value& v, Args& a) {
  KILN_ASSIGN_OR_RETURN(int64_t count, count_arg(in, a, 0, "linecount", -1));
  if (count <= 0) return in.fail("batch needs a count above 0");
  const Value* fill = a.get(1, "fill_with");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  List out, cur;
  for (const Value& x : items) {
    cur.push_back(x);
    if (int64_t(cur.size()) == count) out.push_back(Value::list(std::move(cur))), cur.clear();
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none()) KILN_RETURN_IF_ERROR(in.check_items(size_t(count)));
    if (fill && !fill->is_none())
      while (int64_t(cur.size()) < count) cur.push_back(*fill);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

// slice(count, fill_with=none): `count` columns of nearly equal length, the first ones one longer.
Result<Value> f_slice(Interp& in, const Value& v, Args& a) {
  KILN_ASSIGN_OR_RETURN(int64_t slices, count_arg(in, a, 0, "slices", -1));
  if (slices <= 0) return in.fail("slice needs a count above 0");
  const Value* fill = a.get(1, "fill_with");
  KILN_ASSIGN_OR_RETURN(List items, in.iterate(v));
  KILN_RETURN_IF_ERROR(in.check_items(size_t(std::min<int64_t>(slices, INT64_MAX / 2))));
  const int64_t n = int64_t(items.size()), per = n / slices, extra = n % slices;
  List out;
  int64_t offset = 0;
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t start = offset + s * per;
    if (s < extra) ++offset;
    const int64_t end = offset + (s + 1) * per;
    List part(items.begin() + start, items.begin() + end);
    if (fill && !fill->is_none() && s >= extra) part.push_back(*fill);
    out.push_back(Value::list(std::move(part)));
  }
  return Value::list(std::move(out));
}

// truncate(length=255, killwords=false, end='...', leeway=5): a string longer than length + leeway cut
// to length (with `end`), at the last space unless killwords.
Result<Value> f_truncate(Interp& in, const Value& v, Args& a) {
  KILN_ASSIGN_OR_RETURN(int64_t length, count_arg(in, a, 0, "length", 255));
  const Value* kill = a.get(1, "killwords");
  const Value* end_arg = a.get(2, "end");
  KILN_ASSIGN_OR_RETURN(int64_t leeway, count_arg(in, a, 3, "leeway", 5));
  const std::u32string s = utf8_decode(to_str(v)), end = utf8_decode(end_arg ? to_str(*end_arg) : "...");
  if (length < int64_t(end.size())) return in.fail("expected length >= " + std::to_string(end.size()) + ", got " + std::to_string(length));
  if (leeway < 0) return in.fail("expected leeway >= 0, got " + std::to_string(leeway));
  if (int64_t(s.size()) <= length + leeway) return Value::str(to_str(v));
  std::u32string head = s.substr(0, size_t(length) - end.size());
  if (!(kill && kill->truthy())) {
    const size_t space = head.rfind(U' ');
    if (space != std::u32string::npos) head.resize(space);
  }
  return Value::str(utf8_encode(head + end));
}

// striptags: markupsafe's Markup.striptags: comments and tags removed, whitespace runs made one
// space, HTML entities unescaped.
Result<Value> f_striptags(Interp&, const Value& v, Args&) {
  const std::string s = to_str(v);
  std::string text;
  for (size_t k = 0; k < s.size();) {
    if (s.compare(k, 4, "<!--") == 0) {
      const size_t e = s.find("-->", k + 4);
      if (e != std::string::npos) { k = e + 3; continue; }
    }
    if (s[k] == '<') {
      const size_t e = s.find('>', k + 1);
      if (e != std::string::npos) { k = e + 1; continue; }
    }
    text += s[k++];
  }
  std::string joined;
  for (const std::string& w : py_split(text, nullptr, -1)) joined += (joined.empty() ? "" : " ") + w;
  std::string out;
  static const std::pair<const char*, const char*> kNamed[] = {{"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""},
                                                               {"apos", "'"}, {"nbsp", "\xc2\xa0"}};
  for (size_t k = 0; k < joined.size(); ++k) {
    const size_t semi = joined[k] == '&' ? joined.find(';', k) : std::string::npos;
    if (semi != std::string::npos && semi - k <= 10) {
      const std::string name = joined.substr(k + 1, semi - k - 1);
      std::string rep;
      if (name.size() > 1 && name[0] == '#') {
        const bool hex = name[1] == 'x' || name[1] == 'X';
        const std::string digits = name.substr(hex ? 2 : 1);
        char* stop = nullptr;
        const long cp = digits.empty() ? -1 : std::strtol(digits.c_str(), &stop, hex ? 16 : 10);
        if (cp > 0 && cp <= 0x10ffff && stop && *stop == 0) utf8_append(rep, char32_t(cp));
      } else {
        for (const auto& [n, r] : kNamed)
          if (name == n) rep = r;
      }
      if (!rep.empty()) { out += rep; k = semi; continue; }
    }
    out += joined[k];
  }
  return Value::str(out);
}

// pprint: pprint.pformat, which is repr for what fits in its 80 columns (wider values, which it
// breaks over lines, are an error here rather than a different text).
Result<Value> f_pprint(Interp& in, const Value& v, Args&) {
  std::string r = repr(v);
  if (str_len(r) > 80 && (v.is_list() || v.is_dict() || v.is_str()))
    return in.fail("pprint of a value wider than 80 columns (which Python breaks over lines) is not supported");
  return Value::str(std::move(r));
}

}  // namespace

const std::map<std::string, FilterFn>& more_filters() {
  static const std::map<std::string, FilterFn> m = {
      {"groupby", f_groupby}, {"batch", f_batch}, {"slice", f_slice}, {"truncate", f_truncate},
      {"striptags", f_striptags}, {"pprint", f_pprint},
  };
  return m;
}

}  // namespace kiln::jinja
