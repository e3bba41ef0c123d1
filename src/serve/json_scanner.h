// JsonScanner: a strict, incremental JSON recognizer (one byte at a time, no recursion) that says
// where a value ends, for parsers of streamed model output (serve/tool_calls.cpp); and the
// character classes it uses.
// Thread safety: a JsonScanner is one parser's; the functions are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::serve {

inline bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
inline int hex_value(char c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

// A strict JSON (RFC 8259) recognizer fed one byte at a time: one value, its nesting on an explicit
// stack, strings checked for UTF-8 (RFC 3629) and paired surrogate escapes. It says when the value
// ends: `done` on its last byte, `done_before` when a number is ended by the byte after it (which
// the caller then reads again). A value nested deeper than kMaxNesting is an error: what it accepts
// (a model's tool-call arguments) is later parsed, copied and printed by code that recurses as deep
// as the value nests, and a model can write 100,000 brackets.
class JsonScanner {
 public:
  enum class Step : uint8_t { more, done, done_before, error };
  static constexpr size_t kMaxNesting = 512;

  void reset() {
    stack_.clear();
    s_ = S::value;
    need_low_ = false;
    utf8_left_ = 0;
  }

  Step push(char ch) {
    if (s_ <= S::after && is_ws(ch)) return Step::more;  // between tokens
    switch (s_) {
      case S::value: return begin_value(ch);
      case S::value_or_close: return ch == ']' ? close() : begin_value(ch);
      case S::key_or_close:
        if (ch == '}') return close();
        [[fallthrough]];
      case S::key:
        key_ = true;
        return ch == '"' ? go(S::string) : Step::error;
      case S::colon: return ch == ':' ? go(S::value) : Step::error;
      case S::after: {
        const bool object = stack_.back() == '{';
        if (ch == ',') return go(object ? S::key : S::value);
        return ch == (object ? '}' : ']') ? close() : Step::error;
      }
      case S::string: return string_byte(ch);
      case S::escape:
        if (ch == 'u') {
          hex_left_ = 4;
          code_ = 0;
          return go(S::hex);
        }
        if (need_low_ || std::string_view("\"\\/bfnrt").find(ch) == std::string_view::npos) return Step::error;
        return go(S::string);
      case S::hex: return hex_byte(ch);
      case S::number: return number_byte(ch);
      case S::literal:
        if (ch != *lit_) return Step::error;
        return *++lit_ == '\0' ? end_value() : Step::more;
      case S::finished: return Step::error;
    }
    return Step::error;
  }

 private:
  // The states up to `after` allow whitespace before their byte.
  enum class S : uint8_t { value, value_or_close, key_or_close, key, colon, after, string, escape, hex, number, literal, finished };
  enum class N : uint8_t { sign, zero, integer, dot, fraction, exp_mark, exp_sign, exponent };

  Step go(S s) { s_ = s; return Step::more; }
  Step go(N n) { n_ = n; return Step::more; }

  Step begin_value(char ch) {
    key_ = false;
    switch (ch) {
      case '{':
      case '[':
        if (stack_.size() >= kMaxNesting) return Step::error;
        stack_.push_back(ch);
        return go(ch == '{' ? S::key_or_close : S::value_or_close);
      case '"': return go(S::string);
      case 't': lit_ = "rue"; return go(S::literal);
      case 'f': lit_ = "alse"; return go(S::literal);
      case 'n': lit_ = "ull"; return go(S::literal);
      default: break;
    }
    if (ch != '-' && !is_digit(ch)) return Step::error;
    s_ = S::number;
    return go(ch == '-' ? N::sign : ch == '0' ? N::zero : N::integer);
  }

  Step string_byte(char ch) {
    const auto c = static_cast<unsigned char>(ch);
    if (utf8_left_ > 0) {  // a continuation byte, within [lo_, hi_]
      if (c < lo_ || c > hi_) return Step::error;
      lo_ = 0x80;
      hi_ = 0xBF;
      --utf8_left_;
      return Step::more;
    }
    if (need_low_ && ch != '\\') return Step::error;  // a high surrogate needs a low one next
    if (ch == '"') return key_ ? go(S::colon) : end_value();
    if (ch == '\\') return go(S::escape);
    if (c < 0x20) return Step::error;
    if (c < 0x80) return Step::more;
    lo_ = 0x80;
    hi_ = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) utf8_left_ = 1;
    else if (c == 0xE0) utf8_left_ = 2, lo_ = 0xA0;
    else if (c == 0xED) utf8_left_ = 2, hi_ = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) utf8_left_ = 2;
    else if (c == 0xF0) utf8_left_ = 3, lo_ = 0x90;
    else if (c == 0xF4) utf8_left_ = 3, hi_ = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) utf8_left_ = 3;
    else return Step::error;
    return Step::more;
  }

  Step hex_byte(char ch) {
    if (!is_hex(ch)) return Step::error;
    code_ = code_ * 16 + static_cast<uint32_t>(hex_value(ch));
    if (--hex_left_ > 0) return Step::more;
    const bool high = code_ >= 0xD800 && code_ <= 0xDBFF, low = code_ >= 0xDC00 && code_ <= 0xDFFF;
    if (need_low_ != low) return Step::error;
    need_low_ = high;
    return go(S::string);
  }

  Step number_byte(char ch) {
    const bool digit = is_digit(ch), exp = ch == 'e' || ch == 'E';
    switch (n_) {
      case N::sign: return !digit ? Step::error : go(ch == '0' ? N::zero : N::integer);
      case N::integer:
        if (digit) return Step::more;
        [[fallthrough]];
      case N::zero: return ch == '.' ? go(N::dot) : exp ? go(N::exp_mark) : end_number(ch);
      case N::dot: return digit ? go(N::fraction) : Step::error;
      case N::fraction: return digit ? Step::more : exp ? go(N::exp_mark) : end_number(ch);
      case N::exp_mark: return ch == '+' || ch == '-' ? go(N::exp_sign) : digit ? go(N::exponent) : Step::error;
      case N::exp_sign: return digit ? go(N::exponent) : Step::error;
      case N::exponent: return digit ? Step::more : end_number(ch);
    }
    return Step::error;
  }

  // A number ends at the first byte that cannot continue it; that byte belongs to what follows.
  Step end_number(char ch) {
    s_ = stack_.empty() ? S::finished : S::after;
    return stack_.empty() ? Step::done_before : push(ch);
  }

  Step close() { stack_.pop_back(); return end_value(); }
  Step end_value() {
    s_ = stack_.empty() ? S::finished : S::after;
    return stack_.empty() ? Step::done : Step::more;
  }

  std::vector<char> stack_;  // '{' or '[' per open container
  S s_ = S::value;
  N n_ = N::sign;
  bool key_ = false;       // the string being read is an object key
  bool need_low_ = false;  // after a \uD800-\uDBFF escape
  int hex_left_ = 0;
  uint32_t code_ = 0;
  int utf8_left_ = 0;
  unsigned char lo_ = 0x80, hi_ = 0xBF;
  const char* lit_ = "";
};

// The content of a complete JSON string token (quotes included), which JsonScanner accepted.
inline std::optional<std::string> decode_string(std::string_view token) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(token, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

inline bool is_json_object(std::string_view s) {
  if (s.empty() || s.front() != '{') return false;
  JsonScanner scan;
  for (size_t i = 0; i < s.size(); ++i) {
    JsonScanner::Step r = scan.push(s[i]);
    if (r == JsonScanner::Step::error) return false;
    if (r == JsonScanner::Step::done) return i + 1 == s.size();
  }
  return false;
}

}  // namespace kiln::serve
