// Parser for the Jinja subset that chat templates use, over lexer.h's tokens. It builds the tree in
// parser.h with Jinja's precedence:
//   cond (a if b else c) < or < and < not < compare/in < + - < ~ < * / // % < ** < unary - <
//   primary with postfix (.attr [item] (call)) and filters/tests (| f, is t).
#include "model/jinja/parser.h"

#include "model/jinja/lexer.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <set>

namespace kiln::jinja {
Expr::~Expr() {
  std::vector<ExprP> pending;
  auto take = [&](Expr& e) {
    for (ExprP& c : e.ch)
      if (c) pending.push_back(std::move(c));
    for (auto& kv : e.kwargs)
      if (kv.second) pending.push_back(std::move(kv.second));
  };
  take(*this);
  while (!pending.empty()) {
    ExprP e = std::move(pending.back());
    pending.pop_back();
    take(*e);  // e's own destructor then finds no children
  }
}

namespace {

struct Parser {
  std::vector<Tok> toks;
  const std::string& name;
  size_t k = 0;
  int nesting = 0;  // recursive parse calls in progress (kMaxParseNesting)
  bool saw_generation = false;
  // For each macro / call block being parsed: whether its body names varargs / kwargs (jinja2 accepts
  // extra arguments only then).
  struct MacroRefs { bool varargs = false, kwargs = false; };
  std::vector<MacroRefs> macro_refs;

  struct Nest {
    int& n;
    explicit Nest(int& x) : n(x) { ++n; }
    ~Nest() { --n; }
  };
  Status too_deep() const {
    return err("expressions or blocks nest deeper than " + std::to_string(kMaxParseNesting) + " levels");
  }

  const Tok& cur() const { return toks[k]; }
  const Tok& peek(size_t n = 1) const { return toks[std::min(k + n, toks.size() - 1)]; }
  Status err(const std::string& m, int line = -1) const {
    return invalid_argument("chat template " + name + ", line " + std::to_string(line < 0 ? cur().line : line) + ": " + m);
  }
  bool is_op(const char* o) const { return cur().type == TT::Op && cur().v == o; }
  bool is_name(const char* n) const { return cur().type == TT::Name && cur().v == n; }
  bool skip_op(const char* o) { if (is_op(o)) { ++k; return true; } return false; }
  bool skip_name(const char* n) { if (is_name(n)) { ++k; return true; } return false; }
  std::string describe(const Tok& t) const {
    switch (t.type) {
      case TT::Eof: return "end of template";
      case TT::BlockEnd: return "end of statement block";
      case TT::VarEnd: return "end of print statement";
      case TT::Name: return "'" + t.v + "'";
      case TT::Op: return "'" + t.v + "'";
      case TT::String: return "string";
      default: return "token";
    }
  }
  Status expect_op(const char* o) {
    if (skip_op(o)) return Status::Ok();
    return err(std::string("expected token '") + o + "', got " + describe(cur()));
  }
  Status expect_block_end() {
    if (cur().type == TT::BlockEnd) { ++k; return Status::Ok(); }
    return err("expected token 'end of statement block', got " + describe(cur()));
  }
  Result<std::string> expect_name() {
    if (cur().type != TT::Name) return err("expected token 'name', got " + describe(cur()));
    return toks[k++].v;
  }

  static ExprP make(EK kind, int line) { auto e = std::make_unique<Expr>(); e->kind = kind; e->line = line; return e; }

  // ---- expressions ----
  Result<ExprP> expression() {  // condexpr
    Nest nest(nesting);
    if (nesting > kMaxParseNesting) return too_deep();
    KILN_ASSIGN_OR_RETURN(ExprP e, or_expr());
    while (is_name("if")) {
      int line = cur().line;
      ++k;
      auto c = make(EK::Cond, line);
      KILN_ASSIGN_OR_RETURN(ExprP test, or_expr());
      ExprP other;
      if (skip_name("else")) { KILN_ASSIGN_OR_RETURN(other, expression()); }
      c->ch.push_back(std::move(test));
      c->ch.push_back(std::move(e));
      c->ch.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }
  Result<ExprP> or_expr() {
    KILN_ASSIGN_OR_RETURN(ExprP e, and_expr());
    while (is_name("or")) {
      auto n = make(EK::Or, cur().line); ++k;
      KILN_ASSIGN_OR_RETURN(ExprP r, and_expr());
      n->ch.push_back(std::move(e)); n->ch.push_back(std::move(r)); e = std::move(n);
    }
    return e;
  }
  Result<ExprP> and_expr() {
    KILN_ASSIGN_OR_RETURN(ExprP e, not_expr());
    while (is_name("and")) {
      auto n = make(EK::And, cur().line); ++k;
      KILN_ASSIGN_OR_RETURN(ExprP r, not_expr());
      n->ch.push_back(std::move(e)); n->ch.push_back(std::move(r)); e = std::move(n);
    }
    return e;
  }
  Result<ExprP> not_expr() {
    Nest nest(nesting);
    if (nesting > kMaxParseNesting) return too_deep();
    if (is_name("not")) {
      auto n = make(EK::Not, cur().line); ++k;
      KILN_ASSIGN_OR_RETURN(ExprP r, not_expr());
      n->ch.push_back(std::move(r));
      return n;
    }
    return compare();
  }
  Result<ExprP> compare() {
    int line = cur().line;
    KILN_ASSIGN_OR_RETURN(ExprP e, math1());
    ExprP cmp;
    for (;;) {
      std::string op;
      if (cur().type == TT::Op && (cur().v == "==" || cur().v == "!=" || cur().v == "<" || cur().v == ">" || cur().v == "<=" || cur().v == ">=")) { op = cur().v; ++k; }
      else if (is_name("in")) { op = "in"; ++k; }
      else if (is_name("not") && peek().type == TT::Name && peek().v == "in") { op = "notin"; k += 2; }
      else break;
      if (!cmp) { cmp = make(EK::Compare, line); cmp->ch.push_back(std::move(e)); }
      KILN_ASSIGN_OR_RETURN(ExprP r, math1());
      cmp->ops.push_back(op);
      cmp->ch.push_back(std::move(r));
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  Result<ExprP> binary_chain(Result<ExprP> (Parser::*next)(), std::initializer_list<const char*> ops) {
    KILN_ASSIGN_OR_RETURN(ExprP e, (this->*next)());
    for (;;) {
      const char* found = nullptr;
      for (const char* o : ops) if (is_op(o)) found = o;
      if (!found) return e;
      auto n = make(EK::Binary, cur().line); n->name = found; ++k;
      KILN_ASSIGN_OR_RETURN(ExprP r, (this->*next)());
      n->ch.push_back(std::move(e)); n->ch.push_back(std::move(r)); e = std::move(n);
    }
  }
  Result<ExprP> math1() { return binary_chain(&Parser::concat, {"+", "-"}); }
  Result<ExprP> concat() { return binary_chain(&Parser::math2, {"~"}); }
  Result<ExprP> math2() { return binary_chain(&Parser::pow, {"*", "/", "//", "%"}); }
  Result<ExprP> pow() { return binary_chain(&Parser::unary_f, {"**"}); }
  Result<ExprP> unary_f() { return unary(true); }
  Result<ExprP> unary(bool with_filter) {
    Nest nest(nesting);
    if (nesting > kMaxParseNesting) return too_deep();
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? EK::Neg : EK::Pos, cur().line); ++k;
      KILN_ASSIGN_OR_RETURN(ExprP r, unary(false));
      e->ch.push_back(std::move(r));
    } else {
      KILN_ASSIGN_OR_RETURN(e, primary());
    }
    KILN_ASSIGN_OR_RETURN(e, postfix(std::move(e)));
    if (with_filter) { KILN_ASSIGN_OR_RETURN(e, filter_expr(std::move(e))); }
    return e;
  }
  Result<ExprP> primary() {
    const Tok& t = cur();
    int line = t.line;
    if (t.type == TT::Name) {
      ++k;
      auto e = make(EK::Const, line);
      if (t.v == "true" || t.v == "True") e->cval = Value::boolean(true);
      else if (t.v == "false" || t.v == "False") e->cval = Value::boolean(false);
      else if (t.v == "none" || t.v == "None") e->cval = Value::none();
      else {
        e->kind = EK::Name;
        e->name = t.v;
        for (MacroRefs& r : macro_refs) {
          r.varargs = r.varargs || t.v == "varargs";
          r.kwargs = r.kwargs || t.v == "kwargs";
        }
      }
      return e;
    }
    if (t.type == TT::String) {
      std::string s;
      while (cur().type == TT::String) s += toks[k++].v;  // adjacent literals concatenate
      auto e = make(EK::Const, line);
      e->cval = Value::str(s);
      return e;
    }
    if (t.type == TT::Int || t.type == TT::Float) {
      ++k;
      auto e = make(EK::Const, line);
      if (t.type == TT::Float) {
        e->cval = Value::number(std::strtod(t.v.c_str(), nullptr));  // as Python: 5e-324 is subnormal, 1e400 inf
        return e;
      }
      try {
        e->cval = Value::integer(std::stoll(t.v));
      } catch (...) {
        return err("number out of range: " + t.v, line);
      }
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(EK::Tuple, line);
      KILN_ASSIGN_OR_RETURN(ExprP e, expression());
      if (is_op(",")) {
        auto tup = make(EK::Tuple, line);
        tup->ch.push_back(std::move(e));
        while (skip_op(",")) {
          if (is_op(")")) break;
          KILN_ASSIGN_OR_RETURN(ExprP n, expression());
          tup->ch.push_back(std::move(n));
        }
        e = std::move(tup);
      }
      KILN_RETURN_IF_ERROR(expect_op(")"));
      return e;
    }
    if (skip_op("[")) {
      auto e = make(EK::List, line);
      while (!is_op("]")) {
        if (!e->ch.empty()) KILN_RETURN_IF_ERROR(expect_op(","));
        if (is_op("]")) break;
        KILN_ASSIGN_OR_RETURN(ExprP n, expression());
        e->ch.push_back(std::move(n));
      }
      ++k;
      return e;
    }
    if (skip_op("{")) {
      auto e = make(EK::Dict, line);
      while (!is_op("}")) {
        if (!e->ch.empty()) KILN_RETURN_IF_ERROR(expect_op(","));
        if (is_op("}")) break;
        KILN_ASSIGN_OR_RETURN(ExprP key, expression());
        KILN_RETURN_IF_ERROR(expect_op(":"));
        KILN_ASSIGN_OR_RETURN(ExprP val, expression());
        e->ch.push_back(std::move(key));
        e->ch.push_back(std::move(val));
      }
      ++k;
      return e;
    }
    return err("unexpected " + describe(t));
  }
  Status call_args(Expr& e) {
    KILN_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    while (!is_op(")")) {
      if (!first) KILN_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (cur().type == TT::Name && peek().type == TT::Op && peek().v == "=") {
        std::string key = cur().v;
        k += 2;
        KILN_ASSIGN_OR_RETURN(ExprP v, expression());
        e.kwargs.emplace_back(key, std::move(v));
      } else {
        if (!e.kwargs.empty()) return err("positional argument after keyword argument");
        KILN_ASSIGN_OR_RETURN(ExprP v, expression());
        e.ch.push_back(std::move(v));
      }
    }
    ++k;
    return Status::Ok();
  }
  Result<ExprP> postfix(ExprP e) {
    for (;;) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == TT::Int) {
          auto n = make(EK::Item, line);
          auto idx = make(EK::Const, line);
          const std::string& digits = toks[k++].v;
          int64_t index = 0;
          const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
          if (ec != std::errc() || end != digits.data() + digits.size()) return err("number out of range: " + digits, line);
          idx->cval = Value::integer(index);
          n->ch.push_back(std::move(e)); n->ch.push_back(std::move(idx)); e = std::move(n);
          continue;
        }
        KILN_ASSIGN_OR_RETURN(std::string attr, expect_name());
        auto n = make(EK::Attr, line);
        n->name = attr;
        n->ch.push_back(std::move(e)); e = std::move(n);
      } else if (skip_op("[")) {
        ExprP parts[3];
        bool slice = false;
        if (!is_op(":")) { KILN_ASSIGN_OR_RETURN(parts[0], expression()); }
        if (skip_op(":")) {
          slice = true;
          if (!is_op("]") && !is_op(":")) { KILN_ASSIGN_OR_RETURN(parts[1], expression()); }
          if (skip_op(":") && !is_op("]")) { KILN_ASSIGN_OR_RETURN(parts[2], expression()); }
        }
        KILN_RETURN_IF_ERROR(expect_op("]"));
        auto n = make(slice ? EK::Slice : EK::Item, line);
        n->ch.push_back(std::move(e));
        if (slice) for (auto& p : parts) n->ch.push_back(std::move(p));
        else n->ch.push_back(std::move(parts[0]));
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(EK::Call, line);
        n->ch.push_back(std::move(e));
        KILN_RETURN_IF_ERROR(call_args(*n));
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  Result<ExprP> filter_expr(ExprP e) {
    for (;;) {
      int line = cur().line;
      if (skip_op("|")) {
        KILN_ASSIGN_OR_RETURN(e, filter_call(std::move(e), line));
      } else if (skip_name("is")) {
        auto n = make(EK::Test, line);
        n->negate = skip_name("not");
        KILN_ASSIGN_OR_RETURN(n->name, expect_name());
        while (is_op(".")) { ++k; KILN_ASSIGN_OR_RETURN(std::string more, expect_name()); n->name += "." + more; }
        n->ch.push_back(std::move(e));
        if (is_op("(")) {
          KILN_RETURN_IF_ERROR(call_args(*n));
        } else if ((cur().type == TT::Name || cur().type == TT::String || cur().type == TT::Int || cur().type == TT::Float ||
                    is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) return err("You cannot chain multiple tests with is");
          KILN_ASSIGN_OR_RETURN(ExprP arg, primary());
          KILN_ASSIGN_OR_RETURN(arg, postfix(std::move(arg)));
          n->ch.push_back(std::move(arg));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(EK::Call, line);
        n->ch.push_back(std::move(e));
        KILN_RETURN_IF_ERROR(call_args(*n));
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  Result<ExprP> filter_call(ExprP e, int line) {
    auto n = make(EK::Filter, line);
    KILN_ASSIGN_OR_RETURN(n->name, expect_name());
    while (is_op(".")) { ++k; KILN_ASSIGN_OR_RETURN(std::string more, expect_name()); n->name += "." + more; }
    n->ch.push_back(std::move(e));
    if (is_op("(")) KILN_RETURN_IF_ERROR(call_args(*n));
    return n;
  }
  // An expression or an unparenthesized tuple `a, b`.
  Result<ExprP> tuple_expr(bool full) {
    int line = cur().line;
    KILN_ASSIGN_OR_RETURN(ExprP e, full ? expression() : or_expr());
    if (!is_op(",")) return e;
    auto tup = make(EK::Tuple, line);
    tup->ch.push_back(std::move(e));
    while (skip_op(",")) {
      if (cur().type == TT::BlockEnd || cur().type == TT::VarEnd || is_op("=") || is_name("in") || is_op(")")) break;
      KILN_ASSIGN_OR_RETURN(ExprP n, full ? expression() : or_expr());
      tup->ch.push_back(std::move(n));
    }
    return tup;
  }
  // Assignment targets: `name`, `a, b` or `(a, b)`.
  Result<std::vector<std::string>> targets() {
    std::vector<std::string> out;
    bool paren = skip_op("(");
    do {
      if (is_op(")") || is_name("in") || is_op("=")) break;
      KILN_ASSIGN_OR_RETURN(std::string n, expect_name());
      out.push_back(n);
    } while (skip_op(","));
    if (paren) KILN_RETURN_IF_ERROR(expect_op(")"));
    if (out.empty()) return err("expected an assignment target");
    return out;
  }

  // ---- statements ----
  // A macro's or call block's body up to `end`, noting whether it reads varargs / kwargs (which
  // makes the callable take extra arguments, as in jinja2), then the closing tag's end.
  Status callable_body(Node& n, const char* end, std::string* which, const std::string& opener, int line) {
    macro_refs.emplace_back();
    KILN_RETURN_IF_ERROR(body(n.body, {end}, which, opener, line));
    n.catch_varargs = macro_refs.back().varargs;
    n.catch_kwargs = macro_refs.back().kwargs;
    macro_refs.pop_back();
    return expect_block_end();
  }

  // Parses nodes until a block tag named in `ends`; leaves the parser after that tag's name.
  Status body(Body& out, const std::set<std::string>& ends, std::string* which, const std::string& opener, int open_line) {
    Nest nest(nesting);
    if (nesting > kMaxParseNesting) return too_deep();
    for (;;) {
      const Tok& t = cur();
      if (t.type == TT::Eof) {
        if (ends.empty()) return Status::Ok();
        std::string want;
        for (auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
        return err("Unexpected end of template. Jinja was looking for the following tags: " + want +
                   ". The innermost block that needs to be closed is '" + opener + "' (opened on line " + std::to_string(open_line) + ").");
      }
      if (t.type == TT::Data) {
        auto n = std::make_unique<Node>();
        n->kind = NK::Text; n->line = t.line; n->text = t.v;
        out.push_back(std::move(n));
        ++k;
      } else if (t.type == TT::VarBegin) {
        ++k;
        auto n = std::make_unique<Node>();
        n->kind = NK::Output; n->line = t.line;
        KILN_ASSIGN_OR_RETURN(n->expr, tuple_expr(true));
        if (cur().type != TT::VarEnd) return err("expected token 'end of print statement', got " + describe(cur()));
        ++k;
        out.push_back(std::move(n));
      } else if (t.type == TT::BlockBegin) {
        ++k;
        if (cur().type != TT::Name) return err("tag name expected");
        if (ends.count(cur().v)) { *which = toks[k++].v; return Status::Ok(); }
        KILN_ASSIGN_OR_RETURN(NodeP n, statement());
        if (n) out.push_back(std::move(n));
      } else {
        return err("unexpected " + describe(t));
      }
    }
  }

  Result<NodeP> statement() {
    const Tok& t = cur();
    int line = t.line;
    std::string tag = t.v;
    ++k;
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string which;
    if (tag == "if") {
      n->kind = NK::If;
      KILN_ASSIGN_OR_RETURN(n->expr, tuple_expr(false));
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"elif", "else", "endif"}, &which, "if", line));
      Node* tail = n.get();
      while (which == "elif") {
        auto e = std::make_unique<Node>();
        e->kind = NK::If; e->line = cur().line;
        KILN_ASSIGN_OR_RETURN(e->expr, tuple_expr(false));
        KILN_RETURN_IF_ERROR(expect_block_end());
        KILN_RETURN_IF_ERROR(body(e->body, {"elif", "else", "endif"}, &which, "if", line));
        Node* next = e.get();
        tail->else_body.push_back(std::move(e));
        tail = next;
      }
      if (which == "else") {
        KILN_RETURN_IF_ERROR(expect_block_end());
        KILN_RETURN_IF_ERROR(body(tail->else_body, {"endif"}, &which, "if", line));
      }
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "for") {
      n->kind = NK::For;
      KILN_ASSIGN_OR_RETURN(n->targets, targets());
      if (!skip_name("in")) return err("expected token 'in', got " + describe(cur()));
      KILN_ASSIGN_OR_RETURN(n->expr, tuple_expr(false));
      if (skip_name("if")) { KILN_ASSIGN_OR_RETURN(n->cond, expression()); }
      if (is_name("recursive")) return err("recursive for loops are not supported");
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"endfor", "else"}, &which, "for", line));
      if (which == "else") {
        KILN_RETURN_IF_ERROR(expect_block_end());
        KILN_RETURN_IF_ERROR(body(n->else_body, {"endfor"}, &which, "for", line));
      }
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "set") {
      KILN_ASSIGN_OR_RETURN(std::string first, expect_name());
      n->targets.push_back(first);
      if (skip_op(".")) { KILN_ASSIGN_OR_RETURN(n->text, expect_name()); }
      else while (skip_op(",")) { KILN_ASSIGN_OR_RETURN(std::string more, expect_name()); n->targets.push_back(more); }
      if (skip_op("=")) {
        n->kind = NK::Set;
        KILN_ASSIGN_OR_RETURN(n->expr, tuple_expr(true));
        KILN_RETURN_IF_ERROR(expect_block_end());
        return n;
      }
      n->kind = NK::SetBlock;
      if (!n->text.empty() || n->targets.size() != 1) return err("expected token '=', got " + describe(cur()));
      if (is_op("|")) { KILN_ASSIGN_OR_RETURN(n->expr, filter_chain()); }
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"endset"}, &which, "set", line));
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "macro") {
      n->kind = NK::Macro;
      KILN_ASSIGN_OR_RETURN(n->text, expect_name());
      KILN_RETURN_IF_ERROR(parameters(*n));
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(callable_body(*n, "endmacro", &which, "macro", line));
      return n;
    }
    if (tag == "call") {
      n->kind = NK::CallBlock;
      n->text = "caller";
      if (is_op("(")) KILN_RETURN_IF_ERROR(parameters(*n));
      KILN_ASSIGN_OR_RETURN(n->expr, expression());
      if (n->expr->kind != EK::Call) return err("expected call", line);
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(callable_body(*n, "endcall", &which, "call", line));
      return n;
    }
    if (tag == "filter") {
      n->kind = NK::FilterBlock;
      k -= 1;  // reuse filter_chain, which expects to sit on `|`-less names: emulate one `|`
      toks[k] = {TT::Op, "|", line};
      KILN_ASSIGN_OR_RETURN(n->expr, filter_chain());
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"endfilter"}, &which, "filter", line));
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "with") {
      n->kind = NK::With;
      while (cur().type != TT::BlockEnd) {
        if (!n->targets.empty()) KILN_RETURN_IF_ERROR(expect_op(","));
        KILN_ASSIGN_OR_RETURN(std::string v, expect_name());
        KILN_RETURN_IF_ERROR(expect_op("="));
        KILN_ASSIGN_OR_RETURN(ExprP e, expression());
        n->targets.push_back(v);
        n->defaults.push_back(std::move(e));
      }
      ++k;
      KILN_RETURN_IF_ERROR(body(n->body, {"endwith"}, &which, "with", line));
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "generation") {  // transformers' extension (a call block around its body)
      n->kind = NK::Generation;
      saw_generation = true;
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"endgeneration"}, &which, "generation", line));
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    if (tag == "break" || tag == "continue") {
      n->kind = tag == "break" ? NK::Break : NK::Continue;
      KILN_RETURN_IF_ERROR(expect_block_end());
      return n;
    }
    k -= 1;
    return err("Encountered unknown tag '" + tag + "'.");
  }
  // A macro's or call block's `(a, b=default, ...)`.
  Status parameters(Node& n) {
    KILN_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!n.targets.empty()) KILN_RETURN_IF_ERROR(expect_op(","));
      KILN_ASSIGN_OR_RETURN(std::string p, expect_name());
      n.targets.push_back(p);
      ExprP def;
      if (skip_op("=")) { KILN_ASSIGN_OR_RETURN(def, expression()); }
      else if (!n.defaults.empty() && n.defaults.back()) return err("non-default argument follows default argument");
      n.defaults.push_back(std::move(def));
    }
    ++k;
    return Status::Ok();
  }
  // `| f(args) | g` applied to a placeholder name holding the block's rendered body.
  Result<ExprP> filter_chain() {
    auto e = make(EK::Name, cur().line);
    e->name = "\x01body";
    while (skip_op("|")) { KILN_ASSIGN_OR_RETURN(e, filter_call(std::move(e), cur().line)); }
    return e;
  }
};

}  // namespace

Result<std::shared_ptr<Program>> parse_program(const std::string& source, const std::string& name) {
  // Newlines normalize to \n and one trailing newline is dropped (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  KILN_ASSIGN_OR_RETURN(std::vector<Tok> toks, lex(src, name));
  Parser p{std::move(toks), name};
  auto prog = std::make_shared<Program>();
  prog->name = name;
  prog->source = source;
  std::string which;
  KILN_RETURN_IF_ERROR(p.body(prog->body, {}, &which, "", 0));
  prog->has_generation = p.saw_generation;
  return prog;
}

}  // namespace kiln::jinja
