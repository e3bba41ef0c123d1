// Lexer and parser for the Jinja subset that chat templates use. The lexer follows jinja2's lexer
// (lexer.py) rule by rule: a trailing newline of the source is dropped, `{%-`/`-%}` strip all
// whitespace, lstrip_blocks removes spaces/tabs between a line start and `{%` or `{#` (not `{{`),
// trim_blocks removes one newline after `%}` or `#}`, and `+` disables either. The parser builds the
// tree in parser.h with Jinja's precedence:
//   cond (a if b else c) < or < and < not < compare/in < + - < ~ < * / // % < ** < unary - <
//   primary with postfix (.attr [item] (call)) and filters/tests (| f, is t).
#include "model/jinja/parser.h"

#include <charconv>
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

enum class TT { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Tok {
  TT type;
  std::string v;
  int line;
};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

struct Lexer {
  const std::string& src;
  const std::string& name;
  std::vector<Tok> toks;
  size_t pos = 0;
  int line = 1;

  Status err(int ln, const std::string& m) { return invalid_argument("chat template " + name + ", line " + std::to_string(ln) + ": " + m); }

  void advance_to(size_t p) {
    for (size_t k = pos; k < p; ++k) line += src[k] == '\n';
    pos = p;
  }
  void skip_ws() {
    size_t p = pos;
    while (p < src.size() && is_ws(src[p])) ++p;
    advance_to(p);
  }
  bool at(const char* s) const { return src.compare(pos, std::strlen(s), s) == 0; }

  // Finds the next `{{`, `{%` or `{#` from `from`; returns npos when none.
  size_t next_tag(size_t from) const {
    for (size_t p = src.find('{', from); p != std::string::npos; p = src.find('{', p + 1))
      if (p + 1 < src.size() && (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#')) return p;
    return std::string::npos;
  }

  // Emits the text before a tag with the tag's whitespace control applied.
  void emit_text(std::string text, int text_line, char kind, char sign, bool line_starting) {
    if (sign == '-') {
      size_t e = text.size();
      while (e > 0 && is_ws(text[e - 1])) --e;
      text.resize(e);
    } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks and comments only
      size_t lpos = text.rfind('\n');
      lpos = lpos == std::string::npos ? 0 : lpos + 1;
      if (lpos > 0 || line_starting) {
        bool all_ws = lpos < text.size();
        for (size_t k = lpos; k < text.size(); ++k) all_ws = all_ws && is_ws(text[k]);
        if (all_ws) text.resize(lpos);
      }
    }
    if (!text.empty()) toks.push_back({TT::Data, std::move(text), text_line});
  }

  // After `%}` or `#}`: `-` strips all following whitespace, `+` nothing, plain trims one newline.
  void after_block_end(char sign) {
    if (sign == '-') skip_ws();
    else if (sign != '+' && pos < src.size() && src[pos] == '\n') advance_to(pos + 1);
  }

  Status run() {
    while (pos < src.size()) {
      bool line_starting = pos == 0 || src[pos - 1] == '\n';
      size_t p = next_tag(pos);
      if (p == std::string::npos) {
        toks.push_back({TT::Data, src.substr(pos), line});
        advance_to(src.size());
        break;
      }
      char kind = src[p + 1];
      char sign = p + 2 < src.size() && (src[p + 2] == '-' || src[p + 2] == '+') ? src[p + 2] : 0;
      int text_line = line;
      std::string text = src.substr(pos, p - pos);
      advance_to(p);
      int tag_line = line;
      if (kind == '#') {
        emit_text(std::move(text), text_line, kind, sign, line_starting);
        // The comment ends at the first `+#}`, `-#}` or `#}`.
        size_t q = pos + 2 + (sign ? 1 : 0);
        for (;; ++q) {
          if (q + 1 >= src.size()) return err(tag_line, "Missing end of comment tag");
          if ((src[q] == '-' || src[q] == '+') && src.compare(q + 1, 2, "#}") == 0) {
            char s = src[q];
            advance_to(q + 3);
            after_block_end(s);
            break;
          }
          if (src.compare(q, 2, "#}") == 0) {
            advance_to(q + 2);
            after_block_end(0);
            break;
          }
        }
        continue;
      }
      if (kind == '%') {  // {% raw %} ... {% endraw %}
        size_t q = p + 2 + (sign ? 1 : 0);
        while (q < src.size() && is_ws(src[q])) ++q;
        if (src.compare(q, 3, "raw") == 0) {
          size_t r = q + 3;
          while (r < src.size() && is_ws(src[r])) ++r;
          bool dash = src.compare(r, 3, "-%}") == 0;
          if (dash || src.compare(r, 2, "%}") == 0) {
            emit_text(std::move(text), text_line, kind, sign, line_starting);
            advance_to(r + (dash ? 3 : 2));
            if (dash) skip_ws();
            KILN_RETURN_IF_ERROR(raw_body(tag_line));
            continue;
          }
        }
      }
      emit_text(std::move(text), text_line, kind, sign, line_starting);
      advance_to(p + 2 + (sign ? 1 : 0));
      toks.push_back({kind == '{' ? TT::VarBegin : TT::BlockBegin, "", tag_line});
      KILN_RETURN_IF_ERROR(tag(kind == '{', tag_line));
    }
    toks.push_back({TT::Eof, "", line});
    return Status::Ok();
  }

  Status raw_body(int start_line) {
    // Up to `{%[-+]? endraw [-+]?%}`.
    for (size_t q = src.find("{%", pos); q != std::string::npos; q = src.find("{%", q + 1)) {
      size_t r = q + 2;
      char sign = r < src.size() && (src[r] == '-' || src[r] == '+') ? src[r++] : 0;
      while (r < src.size() && is_ws(src[r])) ++r;
      if (src.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src.size() && is_ws(src[r])) ++r;
      char esign = r < src.size() && (src[r] == '-' || src[r] == '+') ? src[r++] : 0;
      if (src.compare(r, 2, "%}") != 0) continue;
      bool line_starting = pos == 0 || src[pos - 1] == '\n';
      int text_line = line;
      std::string text = src.substr(pos, q - pos);
      emit_text(std::move(text), text_line, '%', sign, line_starting);
      advance_to(r + 2);
      after_block_end(esign);
      return Status::Ok();
    }
    return err(start_line, "Missing end of raw directive");
  }

  // Tokens inside `{{ }}` or `{% %}` up to the end marker (outside brackets).
  Status tag(bool var, int tag_line) {
    std::vector<char> balance;
    for (;;) {
      skip_ws();
      if (pos >= src.size()) return err(tag_line, var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (balance.empty()) {
        if (var) {
          if (at("-}}")) { advance_to(pos + 3); skip_ws(); toks.push_back({TT::VarEnd, "", line}); return Status::Ok(); }
          if (at("}}")) { advance_to(pos + 2); toks.push_back({TT::VarEnd, "", line}); return Status::Ok(); }
        } else {
          for (const char* e : {"+%}", "-%}", "%}"}) {
            if (!at(e)) continue;
            int l = line;
            advance_to(pos + std::strlen(e));
            after_block_end(e[0] == '%' ? 0 : e[0]);
            toks.push_back({TT::BlockEnd, "", l});
            return Status::Ok();
          }
        }
      }
      char c = src[pos];
      int l = line;
      if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t p = pos;
        auto digits = [&] { while (p < src.size() && (std::isdigit(static_cast<unsigned char>(src[p])) || (src[p] == '_' && p + 1 < src.size() && std::isdigit(static_cast<unsigned char>(src[p + 1]))))) ++p; };
        digits();
        bool is_float = false;
        if (p + 1 < src.size() && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) { ++p; digits(); is_float = true; }
        if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
          size_t q = p + 1;
          if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
          if (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) { p = q; digits(); is_float = true; }
        }
        std::string num;
        for (size_t k = pos; k < p; ++k)
          if (src[k] != '_') num += src[k];
        toks.push_back({is_float ? TT::Float : TT::Int, num, l});
        advance_to(p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t p = pos;
        while (p < src.size() && (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
        toks.push_back({TT::Name, src.substr(pos, p - pos), l});
        advance_to(p);
      } else if (c == '\'' || c == '"') {
        std::string out;
        size_t p = pos + 1;
        for (;; ++p) {
          if (p >= src.size()) return err(l, "unexpected char '" + std::string(1, c) + "' at " + std::to_string(pos));
          if (src[p] == c) break;
          if (src[p] != '\\' || p + 1 >= src.size()) { out += src[p]; continue; }
          char e = src[++p];
          auto hex = [&](int n) -> bool {
            if (p + n >= src.size()) return false;
            char32_t cp = 0;
            for (int k = 1; k <= n; ++k) {
              char h = src[p + k];
              if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
              cp = cp * 16 + char32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
            }
            utf8_append(out, cp);
            p += n;
            return true;
          };
          switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '\n': break;
            case 'x': if (!hex(2)) return err(l, "invalid \\x escape in string"); break;
            case 'u': if (!hex(4)) return err(l, "invalid \\u escape in string"); break;
            case 'U': if (!hex(8)) return err(l, "invalid \\U escape in string"); break;
            default:
              if (e >= '0' && e <= '7') {
                int v = e - '0', n = 1;
                while (n < 3 && p + 1 < src.size() && src[p + 1] >= '0' && src[p + 1] <= '7') v = v * 8 + (src[++p] - '0'), ++n;
                utf8_append(out, char32_t(v));
              } else {
                out += '\\';
                out += e;
              }
          }
        }
        toks.push_back({TT::String, out, l});
        advance_to(p + 1);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")",
                                    "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* op = nullptr;
        for (const char* o : ops)
          if (at(o)) { op = o; break; }
        if (!op) return err(l, "unexpected char '" + std::string(1, c) + "'");
        std::string o = op;
        if (o == "(" || o == "[" || o == "{") balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
        if (o == ")" || o == "]" || o == "}") {
          if (balance.empty()) return err(l, "unexpected '" + o + "'");
          if (balance.back() != o[0]) return err(l, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        toks.push_back({TT::Op, o, l});
        advance_to(pos + o.size());
      }
    }
  }
};

struct Parser {
  std::vector<Tok> toks;
  const std::string& name;
  size_t k = 0;
  int nesting = 0;  // recursive parse calls in progress (kMaxParseNesting)
  bool saw_generation = false;

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
      else { e->kind = EK::Name; e->name = t.v; }
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
      try {
        e->cval = t.type == TT::Int ? Value::integer(std::stoll(t.v)) : Value::number(std::stod(t.v));
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
      KILN_RETURN_IF_ERROR(expect_op("("));
      while (!is_op(")")) {
        if (!n->targets.empty()) KILN_RETURN_IF_ERROR(expect_op(","));
        KILN_ASSIGN_OR_RETURN(std::string p, expect_name());
        n->targets.push_back(p);
        ExprP def;
        if (skip_op("=")) { KILN_ASSIGN_OR_RETURN(def, expression()); }
        else if (!n->defaults.empty() && n->defaults.back()) return err("non-default argument follows default argument");
        n->defaults.push_back(std::move(def));
      }
      ++k;
      KILN_RETURN_IF_ERROR(expect_block_end());
      KILN_RETURN_IF_ERROR(body(n->body, {"endmacro"}, &which, "macro", line));
      KILN_RETURN_IF_ERROR(expect_block_end());
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
  Lexer lx{src, name, {}};
  KILN_RETURN_IF_ERROR(lx.run());
  Parser p{std::move(lx.toks), name};
  auto prog = std::make_shared<Program>();
  prog->name = name;
  std::string which;
  KILN_RETURN_IF_ERROR(p.body(prog->body, {}, &which, "", 0));
  prog->has_generation = p.saw_generation;
  return prog;
}

}  // namespace kiln::jinja
