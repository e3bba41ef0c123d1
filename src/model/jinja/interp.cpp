// The tree-walking evaluator of chat templates, with Jinja's runtime semantics as jinja2's
// ImmutableSandboxedEnvironment has them under transformers: scopes (a for-loop iteration and a macro
// call get their own; if/else does not), the loop object, undefined values, attribute-then-item lookup,
// Python operators, macros and {% call %} blocks, and the globals range, dict, namespace,
// raise_exception and strftime_now (the methods are in builtins.cpp and str_methods.cpp, the filters
// and tests in filters.cpp and filters_more.cpp, Python's formatting in format.cpp), and
// transformers' {% generation %} call block with its span tracking. Also ChatTemplate and apply_chat_template (the public API in
// model/chat_template.h).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>

#include "model/chat_template.h"
#include "model/jinja/format.h"
#include "model/jinja/interp.h"
#include "model/jinja/py_string.h"

namespace kiln {
namespace jinja {

Result<Value> Interp::eval(const Expr& e, const FrameP& f) {
  line = e.line;
  Nesting nest(depth);
  if (depth > limits.max_depth) return too_deep();
  switch (e.kind) {
    case EK::Const: return e.cval;
    case EK::Name: {
      const Value* v = f->find(e.name);
      return v ? *v : Value::undef(e.name);
    }
    case EK::List: case EK::Tuple: {
      List l;
      for (auto& c : e.ch) {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*c, f));
        l.push_back(std::move(v));
      }
      return Value::list(std::move(l), e.kind == EK::Tuple);
    }
    case EK::Dict: {
      Value d = Value::dict();
      for (size_t k = 0; k + 1 < e.ch.size(); k += 2) {
        KILN_ASSIGN_OR_RETURN(Value key, eval(*e.ch[k], f));
        KILN_ASSIGN_OR_RETURN(Value val, eval(*e.ch[k + 1], f));
        line = e.line;
        if (!is_hashable(key)) return fail(std::string("unhashable type: '") + type_name(key) + "'");
        d.d->set(std::move(key), std::move(val));
      }
      return d;
    }
    case EK::Attr: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.ch[0], f));
      line = e.line;
      return getattr(obj, e.name);
    }
    case EK::Item: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.ch[0], f));
      KILN_ASSIGN_OR_RETURN(Value key, eval(*e.ch[1], f));
      line = e.line;
      return getitem(obj, key);
    }
    case EK::Slice: {
      KILN_ASSIGN_OR_RETURN(Value obj, eval(*e.ch[0], f));
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.ch[size_t(k) + 1]) { KILN_ASSIGN_OR_RETURN(parts[k], eval(*e.ch[size_t(k) + 1], f)); }
      line = e.line;
      for (auto& p : parts)
        if (!p.is_undef() && !p.is_none() && !p.is_int()) return fail("slice indices must be integers or None");
      int64_t step = parts[2].is_int() ? parts[2].as_int() : 1;
      if (step == 0) return fail("slice step cannot be zero");
      if (obj.is_undef()) return fail("'" + obj.s + "' is undefined");
      std::u32string u;
      int64_t len;
      if (obj.is_str()) { u = utf8_decode(obj.s); len = int64_t(u.size()); }
      else if (obj.is_list()) len = int64_t(obj.l->size());
      else return fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
      int64_t start, stop;
      slice_indices(len, parts[0], parts[1], step, start, stop);
      List l;
      std::u32string s;
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
        if (obj.is_str()) s += u[size_t(k)];
        else l.push_back((*obj.l)[size_t(k)]);
      }
      if (obj.is_str()) return obj.safe ? Value::markup(utf8_encode(s)) : Value::str(utf8_encode(s));
      return Value::list(std::move(l), obj.tuple);
    }
    case EK::Call: {
      KILN_ASSIGN_OR_RETURN(Value fn, eval(*e.ch[0], f));
      KILN_ASSIGN_OR_RETURN(Args a, eval_args(e, f, 1));
      line = e.line;
      return call(fn, a);
    }
    case EK::Filter: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.ch[0], f));
      KILN_ASSIGN_OR_RETURN(Args a, eval_args(e, f, 1));
      line = e.line;
      return apply_filter(e.name, v, a);
    }
    case EK::Test: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.ch[0], f));
      KILN_ASSIGN_OR_RETURN(Args a, eval_args(e, f, 1));
      line = e.line;
      KILN_ASSIGN_OR_RETURN(bool r, apply_test(e.name, v, a));
      return Value::boolean(r != e.negate);
    }
    case EK::Neg: case EK::Pos: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.ch[0], f));
      line = e.line;
      if (!v.is_num()) return fail(std::string("bad operand type for unary ") + (e.kind == EK::Neg ? "-" : "+") + ": '" + type_name(v) + "'");
      if (e.kind == EK::Pos) return v.t == Value::T::Bool ? Value::integer(v.as_int()) : v;
      if (v.t == Value::T::Float) return Value::number(-v.f);
      if (v.as_int() == INT64_MIN) return fail("integer overflow in unary -");
      return Value::integer(-v.as_int());
    }
    case EK::Not: {
      KILN_ASSIGN_OR_RETURN(Value v, eval(*e.ch[0], f));
      return Value::boolean(!v.truthy());
    }
    case EK::And: case EK::Or: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.ch[0], f));
      if (a.truthy() == (e.kind == EK::Or)) return a;
      return eval(*e.ch[1], f);
    }
    case EK::Cond: {
      KILN_ASSIGN_OR_RETURN(Value c, eval(*e.ch[0], f));
      if (c.truthy()) return eval(*e.ch[1], f);
      if (!e.ch[2]) return Value::undef();
      return eval(*e.ch[2], f);
    }
    case EK::Binary: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.ch[0], f));
      KILN_ASSIGN_OR_RETURN(Value b, eval(*e.ch[1], f));
      line = e.line;
      return binary(e.name, a, b);
    }
    case EK::Compare: {
      KILN_ASSIGN_OR_RETURN(Value a, eval(*e.ch[0], f));
      for (size_t k = 0; k < e.ops.size(); ++k) {
        KILN_ASSIGN_OR_RETURN(Value b, eval(*e.ch[k + 1], f));
        line = e.line;
        const std::string& op = e.ops[k];
        bool r;
        if (op == "==") r = equals(a, b);
        else if (op == "!=") r = !equals(a, b);
        else if (op == "in" || op == "notin") {
          KILN_ASSIGN_OR_RETURN(bool c, contains(b, a));
          r = c == (op == "in");
        } else {
          auto c3 = compare3(a, b);
          if (!c3.ok()) return fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
          int c = c3.value();
          r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
        }
        if (!r) return Value::boolean(false);
        a = std::move(b);
      }
      return Value::boolean(true);
    }
  }
  return fail("unknown expression");
}

Result<Value> Interp::binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string x = to_str(a), y = to_str(b);
    KILN_RETURN_IF_ERROR(check_size(x.size() + y.size()));
    return Value::str(x + y);
  }
  auto bad = [&] {
    if (a.is_undef() || b.is_undef()) {
      const Value& u = a.is_undef() ? a : b;
      return fail(u.s.empty() ? "undefined value in '" + op + "'" : "'" + u.s + "' is undefined");
    }
    return fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  // kiln's integers are 64-bit where Python's are unbounded: a result that does not fit is an error.
  auto overflow = [&] { return fail("integer overflow in '" + op + "' (kiln's template integers are 64-bit)"); };
  if (a.is_num() && b.is_num()) {
    bool ints = a.is_int() && b.is_int();
    int64_t x = a.as_int(), y = b.as_int();
    double p = a.as_double(), q = b.as_double();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value::number(p + q);
      if (__builtin_add_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (op == "-") {
      if (!ints) return Value::number(p - q);
      if (__builtin_sub_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (op == "*") {
      if (!ints) return Value::number(p * q);
      if (__builtin_mul_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (op == "/") {
      if (q == 0) return fail("division by zero");
      return Value::number(p / q);
    }
    if (op == "//" || op == "%") {
      if (q == 0) return fail(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) {
          if (op == "%") return Value::integer(0);
          return overflow();
        }
        int64_t d = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { d -= 1; m += y; }
        return Value::integer(op == "//" ? d : m);
      }
      double m = std::fmod(p, q);
      if (m != 0 && ((m < 0) != (q < 0))) m += q;
      return op == "//" ? Value::number(std::floor(p / q)) : Value::number(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {  // by squaring: y may be large when x is 0 or +-1
        int64_t result = 1, base = x;
        for (int64_t e = y; e > 0; e >>= 1) {
          if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return overflow();
          // base^2 is needed by a higher bit, so its overflow is the result's
          if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
        }
        return Value::integer(result);
      }
      return Value::number(std::pow(p, q));
    }
  }
  if (op == "+" && a.is_str() && b.is_str()) {
    if (a.safe || b.safe) {  // Markup + str escapes the str (markupsafe's __add__ / __radd__)
      std::string x = markup_escape(a).s, y = markup_escape(b).s;
      KILN_RETURN_IF_ERROR(check_size(x.size() + y.size()));
      return Value::markup(x + y);
    }
    KILN_RETURN_IF_ERROR(check_size(a.s.size() + b.s.size()));
    return Value::str(a.s + b.s);
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    KILN_RETURN_IF_ERROR(check_items(a.l->size() + b.l->size()));
    List l = *a.l;
    l.insert(l.end(), b.l->begin(), b.l->end());
    return Value::list(std::move(l), a.tuple);
  }
  if (op == "*" && ((a.is_str() || a.is_list()) && b.is_int())) {
    const int64_t n = std::max<int64_t>(b.as_int(), 0);
    const size_t unit = a.is_str() ? a.s.size() : a.l->size();
    // The size is checked before anything is built: n * unit may not even fit in 64 bits.
    if (unit > 0 && n > 0) {
      const bool too_big = static_cast<uint64_t>(n) > static_cast<uint64_t>(INT64_MAX) / unit;
      const size_t total = too_big ? SIZE_MAX : static_cast<size_t>(n) * unit;
      KILN_RETURN_IF_ERROR(a.is_str() ? check_size(total) : check_items(total));
    }
    if (a.is_str()) {
      std::string s;
      s.reserve(static_cast<size_t>(n) * unit);
      for (int64_t k = 0; k < n; ++k) s += a.s;
      return a.safe ? Value::markup(s) : Value::str(s);
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), a.l->begin(), a.l->end());
    return Value::list(std::move(l), a.tuple);
  }
  if (op == "*" && a.is_int() && (b.is_str() || b.is_list())) return binary(op, b, a);
  if (op == "%" && a.is_str()) {  // printf-style formatting; a Markup escapes what it formats
    auto r = percent_format(a.s, a.safe ? escape_format_args(b) : b);
    if (!r.ok()) return fail(r.status().message());
    KILN_RETURN_IF_ERROR(check_size(r.value().size()));
    return a.safe ? Value::markup(std::move(r).value()) : Value::str(std::move(r).value());
  }
  return bad();
}

// A macro (or a call block's caller): parameters by position or name, then defaults; extra positional
// arguments are `varargs`, extra keyword arguments `kwargs` (accepted only where the body uses those
// names, as jinja2 does), and a `caller` keyword is the call block's body.
Value Interp::make_macro(const Node& n, const FrameP& defining) {
  const Node* node = &n;
  Interp* self = this;
  Value macro = Value::func([self, node, defining](Args& a) -> Result<Value> {
    FrameP f = self->child(defining);
    if (a.pos.size() > node->targets.size() && !node->catch_varargs)
      return self->fail("macro '" + node->text + "' takes not more than " + std::to_string(node->targets.size()) + " argument(s)");
    List varargs;
    for (size_t k = node->targets.size(); k < a.pos.size(); ++k) varargs.push_back(a.pos[k]);
    Value kwargs = Value::dict();
    for (auto& [k, v] : a.kw) {
      if (std::find(node->targets.begin(), node->targets.end(), k) != node->targets.end()) continue;
      if (k == "caller") f->set("caller", v);
      else if (node->catch_kwargs) kwargs.d->set(k, v);
      else return self->fail("macro '" + node->text + "' takes no keyword argument '" + k + "'");
    }
    f->set("varargs", Value::list(std::move(varargs), true));
    f->set("kwargs", kwargs);
    for (size_t k = 0; k < node->targets.size(); ++k) {
      const Value* v = a.get(k, node->targets[k]);
      if (v) { f->set(node->targets[k], *v); continue; }
      if (node->defaults[k]) {
        KILN_ASSIGN_OR_RETURN(Value d, self->eval(*node->defaults[k], f));
        f->set(node->targets[k], d);
      } else {
        f->set(node->targets[k], Value::undef(node->targets[k]));
      }
    }
    std::string out;
    Flow flow = Flow::Normal;
    KILN_RETURN_IF_ERROR(self->exec(node->body, f, out, flow));
    return Value::str(out);
  });
  macro.s = n.text;  // its name (macro.name)
  return macro;
}

Status Interp::exec_for(const Node& n, const FrameP& f, std::string& out) {
  KILN_ASSIGN_OR_RETURN(Value seq, eval(*n.expr, f));
  line = n.line;
  if (seq.is_none()) return fail("'NoneType' object is not iterable");
  KILN_ASSIGN_OR_RETURN(List items, iterate(seq));
  if (n.cond) {
    List kept;
    for (auto& it : items) {
      FrameP tf = child(f);
      KILN_RETURN_IF_ERROR(assign(n.targets, it, *tf));
      KILN_ASSIGN_OR_RETURN(Value c, eval(*n.cond, tf));
      if (c.truthy()) kept.push_back(it);
    }
    items = std::move(kept);
  }
  int64_t len = int64_t(items.size());
  // loop.changed(*values): whether the values differ from the last call's. The values are dropped when
  // the loop ends (they may hold the loop object, whose changed() holds them).
  auto last_changed = std::make_shared<std::optional<Value>>();
  struct Drop {
    std::shared_ptr<std::optional<Value>> p;
    ~Drop() { p->reset(); }
  } drop{last_changed};
  for (int64_t k = 0; k < len; ++k) {
    if (++iterations > limits.max_loop_iterations)
      return fail("more than " + std::to_string(limits.max_loop_iterations) +
                  " loop iterations; TemplateLimits::max_loop_iterations bounds them");
    FrameP it = child(f);
    Value loop = Value::dict();
    Dict& d = *loop.d;
    d.set("index", Value::integer(k + 1));
    d.set("index0", Value::integer(k));
    d.set("revindex", Value::integer(len - k));
    d.set("revindex0", Value::integer(len - k - 1));
    d.set("first", Value::boolean(k == 0));
    d.set("last", Value::boolean(k == len - 1));
    d.set("length", Value::integer(len));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undef("there is no previous item"));
    d.set("nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undef("there is no next item"));
    Interp* self = this;
    d.set("cycle", Value::func([self, k](Args& a) -> Result<Value> {
      if (a.pos.empty()) return self->fail("no items for cycling given");
      return a.pos[size_t(k) % a.pos.size()];
    }));
    d.set("changed", Value::func([last_changed](Args& a) -> Result<Value> {
      Value now = Value::list(a.pos, true);
      if (*last_changed && equals(**last_changed, now)) return Value::boolean(false);
      *last_changed = std::move(now);
      return Value::boolean(true);
    }));
    it->set("loop", loop);
    KILN_RETURN_IF_ERROR(assign(n.targets, items[size_t(k)], *it));
    Flow flow = Flow::Normal;
    KILN_RETURN_IF_ERROR(exec(n.body, it, out, flow));
    if (flow == Flow::Break) break;
  }
  if (len == 0) {
    Flow flow = Flow::Normal;
    KILN_RETURN_IF_ERROR(exec(n.else_body, child(f), out, flow));
  }
  return Status::Ok();
}

Status Interp::exec(const Body& body, const FrameP& f, std::string& out, Flow& flow) {
  Nesting nest(depth);
  if (depth > limits.max_depth) return too_deep();
  for (auto& np : body) {
    const Node& n = *np;
    line = n.line;
    switch (n.kind) {
      case NK::Text:
        out += n.text;
        KILN_RETURN_IF_ERROR(check_size(out.size()));
        break;
      case NK::Output: {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*n.expr, f));
        out += to_str(v);
        KILN_RETURN_IF_ERROR(check_size(out.size()));
        break;
      }
      case NK::If: {
        KILN_ASSIGN_OR_RETURN(Value c, eval(*n.expr, f));
        KILN_RETURN_IF_ERROR(exec(c.truthy() ? n.body : n.else_body, f, out, flow));
        if (flow != Flow::Normal) return Status::Ok();
        break;
      }
      case NK::For: KILN_RETURN_IF_ERROR(exec_for(n, f, out)); break;
      case NK::Set: {
        KILN_ASSIGN_OR_RETURN(Value v, eval(*n.expr, f));
        line = n.line;
        if (!n.text.empty()) {
          const Value* ns = f->find(n.targets[0]);
          if (!ns || !ns->is_dict() || !ns->ns) return fail("cannot assign attribute on non-namespace object");
          ns->d->set(n.text, std::move(v));
        } else {
          KILN_RETURN_IF_ERROR(assign(n.targets, v, *f));
        }
        break;
      }
      case NK::SetBlock: case NK::FilterBlock: {
        std::string inner;
        Flow inner_flow = Flow::Normal;
        KILN_RETURN_IF_ERROR(exec(n.body, n.kind == NK::SetBlock ? f : child(f), inner, inner_flow));
        Value v = Value::str(inner);
        if (n.expr) {
          FrameP tf = child(f);
          tf->set("\x01body", v);
          KILN_ASSIGN_OR_RETURN(v, eval(*n.expr, tf));
        }
        if (n.kind == NK::SetBlock) f->set(n.targets[0], v);
        else out += to_str(v);
        break;
      }
      case NK::Macro: f->set(n.text, make_macro(n, f)); break;
      case NK::CallBlock: {
        const Expr& c = *n.expr;
        KILN_ASSIGN_OR_RETURN(Value fn, eval(*c.ch[0], f));
        KILN_ASSIGN_OR_RETURN(Args a, eval_args(c, f, 1));
        a.kw.emplace_back("caller", make_macro(n, f));
        line = n.line;
        KILN_ASSIGN_OR_RETURN(Value r, call(fn, a));
        out += to_str(r);
        KILN_RETURN_IF_ERROR(check_size(out.size()));
        break;
      }
      case NK::Break: flow = Flow::Break; return Status::Ok();
      case NK::Continue: flow = Flow::Continue; return Status::Ok();
      case NK::Scope: {
        KILN_RETURN_IF_ERROR(exec(n.body, f, out, flow));
        if (flow != Flow::Normal) return Status::Ok();
        break;
      }
      case NK::Generation: {
        // jinja2 renders the body of this call block (its own scope) before placing it, and
        // transformers records the output length so far of the whole render as its start (also
        // where the block renders into a macro or a set block: checked at the end of the render).
        std::string inner;
        KILN_RETURN_IF_ERROR(exec(n.body, child(f), inner, flow));
        if (generation_spans) {
          const size_t start = top_out->size();
          if (&out != top_out) nested_generation.push_back({generation_spans->size(), n.line, inner});
          generation_spans->emplace_back(start, start + inner.size());
        }
        out += inner;
        KILN_RETURN_IF_ERROR(check_size(out.size()));
        if (flow != Flow::Normal) return Status::Ok();
        break;
      }
      case NK::With: {
        FrameP w = child(f);
        for (size_t k = 0; k < n.targets.size(); ++k) {
          KILN_ASSIGN_OR_RETURN(Value v, eval(*n.defaults[k], f));
          w->set(n.targets[k], v);
        }
        KILN_RETURN_IF_ERROR(exec(n.body, w, out, flow));
        if (flow != Flow::Normal) return Status::Ok();
        break;
      }
    }
  }
  return Status::Ok();
}


namespace {

// ---- globals ----
// Marks an error as raise_exception's, whose message must reach the caller unprefixed.
constexpr StatusCode kRaised = StatusCode::invalid_argument;

void add_globals(Interp& in, Frame& g) {
  Interp* self = &in;
  g.set("raise_exception", Value::func([](Args& a) -> Result<Value> {
    return Status(kRaised, a.pos.empty() ? std::string() : to_str(a.pos[0]));
  }));
  g.set("range", Value::func([self](Args& a) -> Result<Value> {
    for (auto& v : a.pos)
      if (!v.is_int()) return self->fail(std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) stop = a.pos[0].as_int();
    else if (a.pos.size() >= 2) { start = a.pos[0].as_int(); stop = a.pos[1].as_int(); }
    if (a.pos.size() >= 3) step = a.pos[2].as_int();
    if (a.pos.empty() || step == 0) return self->fail("range() arguments are invalid");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.push_back(Value::integer(k));
      if (out.size() > 100000) return self->fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    return Value::list(std::move(out));
  }));
  g.set("dict", Value::func([](Args& a) -> Result<Value> {
    Value d = Value::dict();
    if (!a.pos.empty() && a.pos[0].is_dict()) d.d->items = a.pos[0].d->items;
    for (auto& [k, v] : a.kw) d.d->set(k, v);
    return d;
  }));
  g.set("namespace", Value::func([self](Args& a) -> Result<Value> {
    Value d = Value::dict();
    d.ns = true;
    self->namespaces.push_back(d.d);
    if (!a.pos.empty() && a.pos[0].is_dict()) d.d->items = a.pos[0].d->items;
    for (auto& [k, v] : a.kw) d.d->set(k, v);
    return d;
  }));
  g.set("strftime_now", Value::func([self](Args& a) -> Result<Value> {
    if (a.pos.empty() || !a.pos[0].is_str()) return self->fail("strftime_now needs a format string");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    return Value::str(std::string(buf, n));
  }));
}

}  // namespace
}  // namespace jinja

Result<ChatTemplate> ChatTemplate::parse(const std::string& source, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(auto prog, jinja::parse_program(source, name));
  ChatTemplate t;
  t.program_ = std::move(prog);
  return t;
}

const std::string& ChatTemplate::name() const { return program_->name; }
const std::string& ChatTemplate::source() const { return program_->source; }

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context, const TemplateLimits& limits) const {
  return render_impl(context, limits, nullptr);
}

Result<RenderedChat> ChatTemplate::render_tracked(const nlohmann::ordered_json& context, const TemplateLimits& limits) const {
  RenderedChat r;
  KILN_ASSIGN_OR_RETURN(r.text, render_impl(context, limits, &r.generation_spans));
  return r;
}

bool ChatTemplate::has_generation_blocks() const { return program_->has_generation; }

Result<std::string> ChatTemplate::render_impl(const nlohmann::ordered_json& context, const TemplateLimits& limits,
                                              std::vector<std::pair<size_t, size_t>>* spans) const {
  KILN_ASSERT(program_ != nullptr);
  if (!context.is_object()) return invalid_argument("chat template " + program_->name + ": the context must be a JSON object");
  if (json_depth(context) > limits.max_context_depth)
    return invalid_argument("chat template " + program_->name + ": the messages / tools nest deeper than " +
                            std::to_string(limits.max_context_depth) + " levels");
  jinja::Interp in{*program_, limits};
  auto globals = std::make_shared<jinja::Frame>();
  in.frames.push_back(globals);
  jinja::add_globals(in, *globals);
  for (auto& [k, v] : context.items()) globals->set(k, jinja::Value::from_json(v));
  auto top = in.child(globals);
  std::string out;
  in.top_out = &out;
  in.generation_spans = spans;
  jinja::Flow flow = jinja::Flow::Normal;
  const Status st = in.exec(program_->body, top, out, flow);
  in.release();
  KILN_RETURN_IF_ERROR(st);
  for (const auto& g : in.nested_generation) {
    const auto [a, b] = (*spans)[g.span];
    if (b <= out.size() && out.compare(a, b - a, g.text) == 0) continue;
    in.line = g.line;
    return in.fail("the {% generation %} block of this line renders inside a macro, a {% set %} or {% filter %} block "
                   "or another generation block, and its output does not land where transformers would record it "
                   "(the output length when the block ran); move the block to the template's top level");
  }
  return out;
}

namespace {

// The context transformers' apply_chat_template passes (see chat_template.h).
Result<nlohmann::ordered_json> chat_context(const ChatTemplate& tmpl, const ChatTemplateInputs& in) {
  // Checked before the inputs are copied: copying JSON recurses as deep as it nests.
  const int64_t limit = TemplateLimits{}.max_context_depth - 1;
  for (const auto* j : {&in.messages, &in.tools, &in.extra})
    if (json_depth(*j) > limit)
      return invalid_argument("chat template " + tmpl.name() + ": the messages / tools nest deeper than " +
                              std::to_string(limit) + " levels");
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (in.bos_token) ctx["bos_token"] = *in.bos_token;
  if (in.eos_token) ctx["eos_token"] = *in.eos_token;
  for (auto& [k, v] : in.extra.items()) ctx[k] = v;  // extra kwargs override the special tokens
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  // documents is a parameter of apply_chat_template: a `documents` kwarg is it, else None.
  if (!ctx.contains("documents")) ctx["documents"] = nullptr;
  const nlohmann::ordered_json& docs = ctx["documents"];
  bool docs_ok = docs.is_null() || docs.is_array();
  if (docs.is_array())
    for (const auto& d : docs) docs_ok = docs_ok && d.is_object();
  if (!docs_ok)
    return invalid_argument("chat template " + tmpl.name() + ": documents must be a list of objects (with 'title' and 'text')");
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  return ctx;
}

}  // namespace

Result<std::string> apply_chat_template(const ChatTemplate& tmpl, const ChatTemplateInputs& in) {
  KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json ctx, chat_context(tmpl, in));
  return tmpl.render(ctx);
}

Result<RenderedChat> apply_chat_template_tracked(const ChatTemplate& tmpl, const ChatTemplateInputs& in) {
  KILN_ASSIGN_OR_RETURN(nlohmann::ordered_json ctx, chat_context(tmpl, in));
  return tmpl.render_tracked(ctx);
}

}  // namespace kiln

