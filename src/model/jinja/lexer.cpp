// The Jinja lexer (see lexer.h).
#include "model/jinja/lexer.h"

#include <cstring>

#include "model/jinja/value.h"

namespace kiln::jinja {
namespace {

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

}  // namespace

Result<std::vector<Tok>> lex(const std::string& src, const std::string& name) {
  Lexer lx{src, name, {}};
  KILN_RETURN_IF_ERROR(lx.run());
  return std::move(lx.toks);
}

}  // namespace kiln::jinja
