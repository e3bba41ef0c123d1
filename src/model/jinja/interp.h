// Internal to the chat-template interpreter (interp.cpp: evaluation, statements, globals and the
// public API; builtins.cpp: methods; filters.cpp: filters and tests): the scope frames, the
// interpreter's state and the lookups those files share. Not part of kiln's API.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/chat_template.h"
#include "model/jinja/parser.h"
#include "model/jinja/py_string.h"

namespace kiln::jinja {


struct Frame;
using FrameP = std::shared_ptr<Frame>;
struct Frame {
  FrameP parent;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find(const std::string& k) const {
    for (const Frame* f = this; f; f = f->parent.get())
      for (auto& [name, v] : f->vars)
        if (name == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    for (auto& [name, old] : vars)
      if (name == k) { old = std::move(v); return; }
    vars.emplace_back(k, std::move(v));
  }
};
inline FrameP child(const FrameP& parent) { auto f = std::make_shared<Frame>(); f->parent = parent; return f; }

enum class Flow { Normal, Break, Continue };


// Python's slice bounds for a sequence of `len` (a, b: None/undefined or ints; step != 0).
void slice_indices(int64_t len, const Value& a, const Value& b, int64_t step, int64_t& start, int64_t& stop);
// Python's three-way comparison of numbers, strings and lists (an error for other types).
Result<int> compare3(const Value& a, const Value& b);

struct Interp;
using FilterFn = Result<Value> (*)(Interp&, const Value&, Args&);
using TestFn = Result<bool> (*)(Interp&, const Value&, Args&);
const std::map<std::string, FilterFn>& filters();
// The sequence and text filters of filters_more.cpp (groupby, batch, slice, truncate, ...), part of filters().
const std::map<std::string, FilterFn>& more_filters();
// jinja2's attribute getter of filters (`a.b.0`: item lookups, all-digit parts as ints).
Result<Value> attr_path(Interp& in, const Value& v, const std::string& path);
// A sort key: lower case for a str unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive);
// The stable order of `keys` (ascending, or descending when reverse), compared as Python compares;
// keys Python cannot order are an error of the interpreter.
Result<std::vector<size_t>> sort_order(Interp& in, const std::vector<Value>& keys, bool reverse);
// The marker (Value::s) of groupby's (grouper, list) tuples, whose items are also those attributes.
inline const char* const kGroupTuple = "\x01groupby";
const std::map<std::string, TestFn>& tests();

struct Interp {
  const Program& prog;
  const TemplateLimits& limits;
  int line = 0;  // line of the expression being evaluated, for error messages
  int depth = 0;               // nested eval / exec calls now
  int64_t iterations = 0;      // for-loop iterations so far
  // Every namespace() and every scope frame of the render: the ways to a cycle of references (a
  // namespace holding itself; a macro, which keeps its defining frame alive, stored in that frame
  // or below it). Their contents are dropped when the render ends, so cycles cannot leak.
  std::vector<std::weak_ptr<Dict>> namespaces{};
  std::vector<std::weak_ptr<Frame>> frames{};
  // A tracked render (ChatTemplate::render_tracked): the render's output string, and the byte
  // ranges of it that {% generation %} blocks produced. Null otherwise.
  const std::string* top_out = nullptr;
  std::vector<std::pair<size_t, size_t>>* generation_spans = nullptr;
  // Blocks rendered into a macro, set or filter block (or another generation block): transformers
  // takes the output length so far as their start all the same; the render checks at its end that
  // their output is there, and fails where it is not.
  struct NestedGeneration {
    size_t span;  // index into generation_spans
    int line;
    std::string text;
  };
  std::vector<NestedGeneration> nested_generation{};

  // A new scope below `parent`, recorded in `frames`.
  FrameP child(const FrameP& parent) {
    FrameP f = jinja::child(parent);
    frames.push_back(f);
    return f;
  }
  // Drops what the render's namespaces and frames hold (at its end).
  void release() {
    for (const auto& w : namespaces)
      if (auto d = w.lock()) d->items.clear();
    for (const auto& w : frames)
      if (auto f = w.lock()) f->vars.clear(), f->parent.reset();
  }

  // Counts one level of nesting for the scope of an eval or exec call.
  struct Nesting {
    int& depth;
    explicit Nesting(int& d) : depth(d) { ++depth; }
    ~Nesting() { --depth; }
  };
  Status too_deep() const {
    return fail("the template nests deeper than " + std::to_string(limits.max_depth) +
                " levels (a recursive macro?); TemplateLimits::max_depth bounds it");
  }
  Status check_size(size_t bytes) const {
    if (limits.max_output_bytes >= 0 && bytes <= static_cast<uint64_t>(limits.max_output_bytes)) return Status::Ok();
    return fail("a string of more than " + std::to_string(limits.max_output_bytes) +
                " bytes; TemplateLimits::max_output_bytes bounds the output and every string built");
  }
  // A value a filter or a method built, within the limits on strings and lists (each checks what it
  // could multiply before building it; this catches the rest, whose growth is bounded).
  Result<Value> bounded(Result<Value> r) const {
    if (r.ok() && r.value().is_str()) KILN_RETURN_IF_ERROR(check_size(r.value().s.size()));
    if (r.ok() && r.value().is_list()) KILN_RETURN_IF_ERROR(check_items(r.value().l->size()));
    return r;
  }
  // The most items a list may have (for builders that stop early).
  size_t max_items() const { return limits.max_list_items >= 0 ? static_cast<size_t>(limits.max_list_items) : SIZE_MAX; }
  Status check_items(size_t n) const {
    if (limits.max_list_items >= 0 && n <= static_cast<uint64_t>(limits.max_list_items)) return Status::Ok();
    return fail("a list of more than " + std::to_string(limits.max_list_items) + " items; TemplateLimits::max_list_items bounds it");
  }

  Status fail(const std::string& m) const {
    return invalid_argument("chat template " + prog.name + ", line " + std::to_string(line) + ": " + m);
  }

  // ---- lookup ----
  Result<Value> getattr(const Value& obj, const std::string& name) {
    if (obj.is_undef()) return fail(obj.s.empty() ? "undefined value has no attribute '" + name + "'" : "'" + obj.s + "' is undefined");
    if (obj.is_dict()) {
      if (!obj.ns) {
        Value m = method(obj, name);
        if (!m.is_undef()) return m;
      }
      const Value* v = obj.d->find(name);
      return v ? *v : Value::undef("'dict object' has no attribute '" + name + "'");
    }
    if (obj.t == Value::T::Func && name == "name" && !obj.s.empty()) return Value::str(obj.s);  // a macro's name
    if (obj.is_list() && obj.s == kGroupTuple && (name == "grouper" || name == "list")) return (*obj.l)[name == "grouper" ? 0 : 1];
    Value m = method(obj, name);
    if (!m.is_undef()) return m;
    return Value::undef(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'");
  }
  Result<Value> getitem(const Value& obj, const Value& key) {
    if (obj.is_undef()) return fail(obj.s.empty() ? "undefined value has no item" : "'" + obj.s + "' is undefined");
    if (obj.is_dict()) {  // obj[key], then (a str key) the attribute
      if (is_hashable(key))
        if (const Value* v = obj.d->find(key)) return *v;
      if (key.is_str()) return getattr(obj, key.s);
      return Value::undef("'dict object' has no attribute '" + to_str(key) + "'");
    }
    if ((obj.is_list() || obj.is_str()) && key.is_int()) {
      if (obj.is_list()) {
        int64_t n = int64_t(obj.l->size()), k = key.as_int();
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undef(std::string("'") + type_name(obj) + " object' has no element " + std::to_string(key.as_int()));
        return (*obj.l)[size_t(k)];
      }
      std::u32string u = utf8_decode(obj.s);
      int64_t n = int64_t(u.size()), k = key.as_int();
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undef("'str object' has no element " + std::to_string(key.as_int()));
      Value c = Value::str(utf8_encode(u.substr(size_t(k), 1)));
      c.safe = obj.safe;  // an item of a Markup is a Markup
      return c;
    }
    if (key.is_str()) return getattr(obj, key.s);
    return Value::undef(std::string("'") + type_name(obj) + " object' has no element " + to_str(key));
  }

  // Bound methods of str, dict and list (the sandbox's safe ones); undefined when none.
  Value method(const Value& obj, const std::string& name);
  Value markup_method(const Value& obj, const std::string& name);
  // The str methods of str_methods.cpp (partition, zfill, ljust, splitlines, ...); undefined when none.
  Value str_method(const Value& obj, const std::string& name);

  // ---- expressions ----
  Result<Value> eval(const Expr& e, const FrameP& f);
  Result<Args> eval_args(const Expr& e, const FrameP& f, size_t first) {
    Args a;
    for (size_t k = first; k < e.ch.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.ch[k], f));
      a.pos.push_back(std::move(v));
    }
    for (auto& [k, x] : e.kwargs) {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*x, f));
      a.kw.emplace_back(k, std::move(v));
    }
    return a;
  }
  Result<Value> call(const Value& fn, Args& a) {
    if (fn.t != Value::T::Func) {
      if (fn.is_undef()) return fail(fn.s.empty() ? "undefined value is not callable" : "'" + fn.s + "' is undefined");
      return fail(std::string("'") + type_name(fn) + "' object is not callable");
    }
    return (*fn.fn)(a);
  }
  Result<Value> apply_filter(const std::string& name, const Value& v, Args& a) {
    auto it = filters().find(name);
    if (it == filters().end()) return fail("No filter named '" + name + "'.");
    return bounded(it->second(*this, v, a));
  }
  Result<bool> apply_test(const std::string& name, const Value& v, Args& a) {
    auto it = tests().find(name);
    if (it == tests().end()) return fail("No test named '" + name + "'.");
    return it->second(*this, v, a);
  }
  Result<Value> binary(const std::string& op, const Value& a, const Value& b);
  Result<bool> contains(const Value& container, const Value& item) {
    if (container.is_str() && item.is_str()) return container.s.find(item.s) != std::string::npos;
    if (container.is_list()) {
      for (auto& x : *container.l)
        if (equals(x, item)) return true;
      return false;
    }
    if (container.is_dict()) {
      if (!is_hashable(item)) return fail(std::string("unhashable type: '") + type_name(item) + "'");
      return container.d->find(item) != nullptr;
    }
    if (container.is_undef()) return false;  // jinja2's Undefined iterates as empty: `x in undefined` is False
    return fail(std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
  // Items of an iterable value (dict: keys, str: characters).
  Result<List> iterate(const Value& v) {
    if (v.is_list()) return *v.l;
    if (v.is_dict()) {
      List out;
      for (auto& kv : v.d->items) out.push_back(kv.first);
      return out;
    }
    if (v.is_str()) {
      List out;
      for (char32_t c : utf8_decode(v.s)) out.push_back(Value::str(utf8_encode(std::u32string(1, c))));
      return out;
    }
    if (v.is_undef()) return List{};
    return fail(std::string("'") + type_name(v) + "' object is not iterable");
  }

  // ---- statements ----
  Status exec(const Body& body, const FrameP& f, std::string& out, Flow& flow);
  Status exec_for(const Node& n, const FrameP& f, std::string& out);
  Status assign(const std::vector<std::string>& targets, const Value& v, Frame& f) {
    if (targets.size() == 1) { f.set(targets[0], v); return Status::Ok(); }
    KILN_ASSIGN_OR_RETURN(List items, iterate(v));
    if (items.size() != targets.size())
      return fail((items.size() > targets.size() ? "too many values to unpack (expected " : "not enough values to unpack (expected ") +
                  std::to_string(targets.size()) + ")");
    for (size_t k = 0; k < targets.size(); ++k) f.set(targets[k], items[k]);
    return Status::Ok();
  }
  Value make_macro(const Node& n, const FrameP& f);
};


// str.replace's result size, checked before it is built: a long `new` multiplies the string.
inline Status check_replace(const Interp& in, const std::string& s, const std::string& old_s, const std::string& new_s,
                            int64_t count) {
  if (new_s.size() <= old_s.size()) return Status::Ok();
  uint64_t n = 0;
  if (old_s.empty()) {
    n = static_cast<uint64_t>(str_len(s)) + 1;  // before every character and at the end
  } else {
    for (size_t p = s.find(old_s); p != std::string::npos; p = s.find(old_s, p + old_s.size())) ++n;
  }
  if (count >= 0) n = std::min<uint64_t>(n, static_cast<uint64_t>(count));
  return in.check_size(s.size() + n * (new_s.size() - old_s.size()));
}

}  // namespace kiln::jinja
