// The Jinja interpreter's runtime values, with Python semantics: undefined, None, bool, int, float,
// str (UTF-8, indexed by code point; a str may be a markupsafe Markup, jinja2's "safe" string),
// list/tuple and dict (insertion ordered, keys of any hashable type matched as Python matches them,
// shared by reference like Python objects), callables (builtins, bound methods, macros). Printing
// follows Python's str()/repr(), tojson follows json.dumps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;

// Arguments of a call: positional and keyword.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at `index` or named `name`, or nullptr (kwargs win over positions past the count).
  const Value* get(size_t index, const std::string& name) const;
};
using Func = std::function<Result<Value>(Args&)>;

struct Value {
  enum class T { Undefined, None, Bool, Int, Float, Str, List, Dict, Func };
  T t = T::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str; for Undefined, the name that was missing (for error messages); a macro's
                  // name; kGroupTuple on groupby's tuples
  bool safe = false;       // Str that is a Markup (|safe, |escape): + escapes the other operand
  std::shared_ptr<List> l;
  bool tuple = false;      // List printed as a tuple
  std::shared_ptr<Dict> d;
  bool ns = false;         // Dict that is a namespace() (attribute assignment allowed)
  std::shared_ptr<Func> fn;

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Frees nested lists and dicts without recursion (a template can build a chain of namespaces as
  // long as its loops allow).
  ~Value();
  static Value undef(std::string what = "") { Value v; v.s = std::move(what); return v; }
  static Value none() { Value v; v.t = T::None; return v; }
  static Value boolean(bool x) { Value v; v.t = T::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = T::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.t = T::Float; v.f = x; return v; }
  static Value str(std::string x) { Value v; v.t = T::Str; v.s = std::move(x); return v; }
  static Value markup(std::string x) { Value v = str(std::move(x)); v.safe = true; return v; }
  static Value list(List x = {}, bool tuple = false);
  static Value dict();
  static Value func(Func f) { Value v; v.t = T::Func; v.fn = std::make_shared<Func>(std::move(f)); return v; }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undef() const { return t == T::Undefined; }
  bool is_none() const { return t == T::None; }
  bool is_str() const { return t == T::Str; }
  bool is_list() const { return t == T::List; }
  bool is_dict() const { return t == T::Dict; }
  bool is_num() const { return t == T::Int || t == T::Float || t == T::Bool; }
  bool is_int() const { return t == T::Int || t == T::Bool; }
  double as_double() const { return t == T::Float ? f : t == T::Bool ? (b ? 1 : 0) : double(i); }
  int64_t as_int() const { return t == T::Bool ? (b ? 1 : 0) : i; }
  bool truthy() const;
};

// A Python dict: keys keep their type ({1: 'a'} and {'1': 'a'} differ) and match by Python
// equality (1, 1.0 and True are one key). Keys are hashable values (is_hashable).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& k) const;
  const Value* find(const std::string& k) const;  // the str key k
  void set(Value k, Value v);
  void set(const std::string& k, Value v) { set(Value::str(k), std::move(v)); }
};

// Whether Python can hash `v` (a dict key): not a list or dict, nor a tuple holding one.
bool is_hashable(const Value& v);

// Nesting the value functions below follow: repr prints deeper parts as "...", tojson fails, ==
// compares them unequal (a namespace can be made to hold itself; Python's guards differ only there).
constexpr int kMaxValueNesting = 1000;

// Python str(): strings as they are, everything else as repr (undefined prints empty).
std::string to_str(const Value& v);
// Python repr().
std::string repr(const Value& v);
// Python repr of a float ("1.0", "1e+16", "0.1").
std::string float_repr(double x);
// json.dumps(v, ensure_ascii, indent (the string each level adds; none: one line), separators
// (empty: Python's default), sort_keys).
Result<std::string> to_json(const Value& v, bool ensure_ascii, const std::optional<std::string>& indent, const std::string& item_sep,
                            const std::string& key_sep, bool sort_keys);
// Python ==.
bool equals(const Value& a, const Value& b);
const char* type_name(const Value& v);

// UTF-8 helpers: code points of a string and back.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t c);

}  // namespace kiln::jinja
