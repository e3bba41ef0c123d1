#include "serve/tool_calls.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "kernels/rng.h"
#include "serve/json_scanner.h"

namespace kiln::serve {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-' || c == '.';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

constexpr const char* kFormatNames[] = {"none", "hermes", "llama3_json", "mistral"};  // in enum order

Result<ToolCallFormat> parse_tool_call_format(const std::string& s) {
  for (size_t i = 0; i < std::size(kFormatNames); ++i)
    if (s == kFormatNames[i]) return static_cast<ToolCallFormat>(i);
  return invalid_argument("unknown tool-call format '" + s + "': expected none, hermes, llama3_json or mistral");
}

const char* tool_call_format_name(ToolCallFormat f) {
  const auto i = static_cast<size_t>(f);
  return i < std::size(kFormatNames) ? kFormatNames[i] : "none";
}

ToolCallFormat detect_tool_call_format(const std::string& template_source,
                                       const std::function<bool(std::string_view)>& has_token) {
  auto in_template = [&](std::string_view s) { return template_source.find(s) != std::string::npos; };
  auto in_vocab = [&](std::string_view s) { return has_token && has_token(s); };
  if (in_template(kHermesOpen) || in_vocab(kHermesOpen)) return ToolCallFormat::hermes;
  if (in_template(kMistralCalls) || in_vocab(kMistralCalls)) return ToolCallFormat::mistral;
  if (in_template(kPythonTag) || in_template("<|eom_id|>") || (in_template("<|start_header_id|>") && in_template("tools")))
    return ToolCallFormat::llama3_json;
  return ToolCallFormat::none;
}

bool mistral_uses_args_form(const std::string& template_source) {
  return template_source.find(kMistralArgs) != std::string::npos;
}

std::string forced_tool_call_prefix(ToolCallFormat f, const std::string& name, bool mistral_args_form) {
  const std::string quoted = nlohmann::ordered_json(name).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  switch (f) {
    case ToolCallFormat::none: return "";
    case ToolCallFormat::hermes:
      return name.empty() ? std::string(kHermesOpen) : std::string(kHermesOpen) + "\n{\"name\": " + quoted + ", \"arguments\":";
    case ToolCallFormat::llama3_json:
      return name.empty() ? "{\"name\": \"" : "{\"name\": " + quoted + ", \"parameters\":";
    case ToolCallFormat::mistral:
      if (name.empty()) return std::string(kMistralCalls);
      if (mistral_args_form) return std::string(kMistralCalls) + name + std::string(kMistralArgs);
      return std::string(kMistralCalls) + " [{\"name\": " + quoted + ", \"arguments\":";
  }
  return "";
}

std::string make_tool_call_id(ToolCallFormat f, std::string_view protocol_prefix, uint64_t seed, int32_t index) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  const bool mistral = f == ToolCallFormat::mistral;
  std::string id = mistral ? std::string() : std::string(protocol_prefix);
  const int n = mistral ? 9 : 24;
  for (int j = 0; j < n; ++j) {
    const uint64_t counter = (static_cast<uint64_t>(static_cast<uint32_t>(index)) << 8) | static_cast<uint64_t>(j);
    id += kAlnum[static_cast<int>(rng::uniform(seed, counter) * 62.0)];
  }
  return id;
}

// ---- ToolCallParser ----------------------------------------------------------------------------
//
// The text not yet decided lives in `buf`, which starts at absolute offset `base`; `pos` is the
// next byte to look at. Every decision waits for the bytes it depends on, so the result does not
// depend on how the text was split. While a call is not yet announced (`in_region`) its text from
// `region` on is kept, to become content if the call fails.

struct ToolCallParser::Impl {
  enum class State : uint8_t {
    content,        // content: hermes and mistral look for their marker, the others take it all
    llama_start,    // llama3_json, at the start or after ';': a call (or else content)
    llama_between,  // llama3_json, after a call: ';', another call, or content
    llama_tag,      // llama3_json, matching <|python_tag|>
    object,         // inside a call object (or the bare arguments of name[ARGS]{...})
    hermes_close,   // after a hermes call object: an optional </tool_call>
    mistral_open,   // after [TOOL_CALLS]: '[' or a name
    mistral_first,  // after '[': the first call object or ']'
    mistral_next,   // after a call object of the list: ',' or ']'
    mistral_elem,   // after ',': the next call object
    mistral_name,   // the name of name[ARGS]{...}
    mistral_tag,    // matching [ARGS]
  };
  enum class Obj : uint8_t { open, key_or_close, key_start, key, colon, value_start, value, after };
  enum class Role : uint8_t { name, args, other };
  enum class Match : uint8_t { full, partial, none };
  using Step = JsonScanner::Step;

  ToolCallFormat format = ToolCallFormat::none;
  std::string buf;
  size_t base = 0, pos = 0, prefix_end = 0;
  bool finished = false;
  State state = State::content, after_object = State::content;

  bool after_call = false;  // content right after a call: its leading whitespace is dropped
  size_t scan_from = 0;     // the marker does not start before this
  size_t ws_until = 0;      // [pos, ws_until) is whitespace
  bool in_region = false;   // a call not yet announced: its text may become content
  size_t region = 0;

  // The call being read.
  Obj obj = Obj::open;
  Role role = Role::other;
  JsonScanner scan;
  std::string key, name, args_text;
  size_t raw_start = 0;  // the token being read (a key, the name, string arguments)
  size_t name_start = 0;
  bool bare = false;     // name[ARGS]{...}: the call ends with its arguments
  bool args_object = false, committed = false, have_name = false, have_args = false, args_done = false;

  std::vector<ToolCall> calls;
  std::string content;
  Output out;

  size_t end() const { return base + buf.size(); }
  char at(size_t i) const { return buf[i - base]; }
  std::string_view text(size_t a, size_t b) const { return std::string_view(buf).substr(a - base, b - a); }

  Match match(size_t p, std::string_view lit) const {
    const size_t n = std::min(lit.size(), end() - p);
    if (text(p, p + n) != lit.substr(0, n)) return Match::none;
    return n == lit.size() ? Match::full : Match::partial;
  }

  void emit(size_t a, size_t b) {
    a = std::max(a, prefix_end);  // the prefix is never content
    if (a >= b) return;
    out.content.append(text(a, b));
    content.append(text(a, b));
  }

  void begin_call(size_t region_start) {
    in_region = true;
    region = region_start;
    committed = have_name = have_args = args_done = false;
  }
  void enter_object(State next) {
    state = State::object;
    obj = Obj::open;
    after_object = next;
    bare = false;
  }
  void enter_content(bool after) {
    state = State::content;
    after_call = after;
    scan_from = ws_until = pos;
  }

  // The byte at `at` cannot continue the call: what was held for it becomes content and parsing
  // resumes at that byte. An announced call stays as it is. Returns true, for step().
  bool fail(size_t at) {
    if (in_region) emit(region, at);
    in_region = false;
    pos = at;
    enter_content(false);
    return true;
  }

  void commit(std::string_view args, bool complete) {
    calls.push_back({name, std::string(args), complete});
    out.calls.push_back({static_cast<int32_t>(calls.size() - 1), name, std::string(args)});
    committed = true;
    in_region = false;
  }

  void stream_args(std::string_view piece) {
    calls.back().arguments.append(piece);
    const auto index = static_cast<int32_t>(calls.size() - 1);
    if (out.calls.empty() || out.calls.back().index != index) out.calls.push_back({index, "", ""});
    out.calls.back().arguments.append(piece);
  }

  // ---- the call object --------------------------------------------------------------------------

  bool start_value(char c, size_t at) {
    role = Role::other;
    if (key == "name" && !have_name) {
      if (c != '"') return false;
      role = Role::name;
    } else if ((key == "arguments" || key == "parameters") && !have_args) {
      if (c != '{' && c != '"') return false;
      role = Role::args;
      have_args = true;
      args_object = c == '{';
      if (args_object && have_name) commit("{", false);
    }
    raw_start = at;
    scan.reset();
    obj = Obj::value;
    return scan.push(c) != Step::error;
  }

  // A value of the call object ended just before `stop`; false: the call is malformed.
  bool end_value(size_t stop) {
    if (role == Role::name) {
      std::optional<std::string> s = decode_string(text(raw_start, stop));
      if (!s || s->empty()) return false;
      name = std::move(*s);
      have_name = true;
      if (args_done) commit(args_text, true);
    } else if (role == Role::args && args_object) {
      args_done = true;
      if (committed) calls.back().complete = true;
      else args_text = std::string(text(raw_start, stop));
    } else if (role == Role::args) {
      std::optional<std::string> s = decode_string(text(raw_start, stop));
      if (!s || !is_json_object(trim(*s))) return false;
      args_text = std::string(trim(*s));
      args_done = true;
      if (have_name) commit(args_text, true);
    }
    if (bare) enter_content(true);  // name[ARGS]{...} ends with its arguments
    return true;
  }

  bool close_object() {
    if (!have_name) return false;
    if (!have_args) commit("{}", true);
    state = after_object;
    return true;
  }

  // One byte of a call object; false: the call is malformed at this byte.
  bool object_byte(char c, size_t at) {
    if (is_ws(c) && obj != Obj::key && obj != Obj::value) return true;
    switch (obj) {
      case Obj::open:
        obj = Obj::key_or_close;
        return c == '{';
      case Obj::key_or_close:
        if (c == '}') return close_object();
        [[fallthrough]];
      case Obj::key_start:
        raw_start = at;
        scan.reset();
        obj = Obj::key;
        return c == '"' && scan.push(c) == Step::more;
      case Obj::key: {
        const Step s = scan.push(c);
        if (s != Step::done) return s == Step::more;
        std::optional<std::string> k = decode_string(text(raw_start, at + 1));
        key = k ? std::move(*k) : std::string();
        obj = Obj::colon;
        return k.has_value();
      }
      case Obj::colon:
        obj = Obj::value_start;
        return c == ':';
      case Obj::value_start: return start_value(c, at);
      case Obj::value: {
        const Step s = scan.push(c);
        if (s == Step::error) return false;
        if (s == Step::done_before) {  // a number ended before this byte, which comes next
          obj = Obj::after;
          return end_value(at) && object_byte(c, at);
        }
        if (role == Role::args && args_object && committed) stream_args(std::string_view(&c, 1));
        obj = s == Step::done ? Obj::after : Obj::value;
        return s == Step::more || end_value(at + 1);
      }
      case Obj::after:
        if (c == '}') return close_object();
        obj = Obj::key_start;
        return c == ',';
    }
    return false;
  }

  // ---- the states ---------------------------------------------------------------------------------

  // Skips whitespace; false when the text ends first.
  bool next_byte(char* c) {
    while (pos < end() && is_ws(at(pos))) ++pos;
    if (pos == end()) return false;
    *c = at(pos);
    return true;
  }

  // Content: releases all that cannot be part of a marker or of the whitespace right before one.
  bool content_step(bool final) {
    char c;
    if (after_call) {
      if (!next_byte(&c)) return false;
      after_call = false;
      scan_from = ws_until = pos;
    }
    if (pos == end()) return false;
    if (format != ToolCallFormat::hermes && format != ToolCallFormat::mistral) {  // no marker: all content
      emit(pos, end());
      pos = end();
      return false;
    }
    const std::string_view marker = format == ToolCallFormat::hermes ? kHermesOpen : kMistralCalls;
    ws_until = std::max(ws_until, pos);
    auto trim_back = [&](size_t r) {  // the start of the whitespace run that ends at r
      const size_t floor = std::min(ws_until, r);
      size_t q = r;
      while (q > floor && is_ws(at(q - 1))) --q;
      return q == floor && floor == ws_until ? pos : q;
    };
    const size_t found = buf.find(marker, std::max(pos, scan_from) - base);
    if (found != std::string::npos) {
      const size_t p = base + found, q = trim_back(p);
      emit(pos, q);
      begin_call(q);
      pos = p + marker.size();
      if (format == ToolCallFormat::hermes) enter_object(State::hermes_close);
      else state = State::mistral_open;
      return true;
    }
    size_t hold = 0;  // the longest tail that is a proper prefix of the marker
    for (size_t k = std::min(marker.size() - 1, end() - pos); k > 0 && hold == 0 && !final; --k)
      if (match(end() - k, marker) == Match::partial) hold = k;
    const size_t r = end() - hold, q = final ? end() : trim_back(r);
    emit(pos, q);
    pos = q;
    ws_until = r;
    scan_from = std::max(pos, end() + 1 - std::min(end() + 1, marker.size()));
    return false;
  }

  // A literal at `pos`: `then` once it is all there, a failed call when it is not.
  template <typename Then>
  bool literal_step(std::string_view lit, bool final, Then then) {
    if (pos == end()) return false;
    const Match m = match(pos, lit);
    if (m == Match::partial && !final) return false;
    if (m != Match::full) return fail(pos);
    pos += lit.size();
    then();
    return true;
  }

  // One state's work on the text there is; false when it needs more text.
  bool step(bool final) {
    char c;
    switch (state) {
      case State::content: return content_step(final);
      case State::llama_between:
        if (!next_byte(&c)) return false;
        if (c != ';' && c != '{' && c != '<') {
          enter_content(false);
        } else {
          begin_call(pos);
          pos += c == ';';
          state = State::llama_start;
        }
        return true;
      case State::llama_start:
        if (!next_byte(&c)) return false;
        if (c == '{') enter_object(State::llama_between);
        else if (c == '<') state = State::llama_tag;
        else fail(pos);
        return true;
      case State::llama_tag: return literal_step(kPythonTag, final, [&] { enter_object(State::llama_between); });
      case State::object:
        while (pos < end()) {
          if (!object_byte(at(pos), pos)) return fail(pos);
          ++pos;
          if (state != State::object) return true;
        }
        return false;
      case State::hermes_close: {
        if (!next_byte(&c)) return false;
        const Match m = match(pos, kHermesClose);
        if (m == Match::partial) {
          if (final) pos = end();  // a closing tag cut off by the end: dropped
          return false;
        }
        if (m == Match::full) pos += kHermesClose.size();
        enter_content(m == Match::full);
        return true;
      }
      case State::mistral_open:
        if (!next_byte(&c)) return false;
        if (c == '[') {
          ++pos;
          state = State::mistral_first;
        } else if (is_name_char(c)) {
          name_start = pos;
          state = State::mistral_name;
        } else {
          fail(pos);
        }
        return true;
      case State::mistral_first:
      case State::mistral_elem:
      case State::mistral_next:
        if (!next_byte(&c)) return false;
        if (state == State::mistral_next && c == ',') {
          begin_call(pos++);
          state = State::mistral_elem;
        } else if (state != State::mistral_elem && c == ']') {
          ++pos;
          in_region = false;  // the end of the list (or an empty one): not content
          enter_content(true);
        } else if (state != State::mistral_next && c == '{') {
          enter_object(State::mistral_next);
        } else {
          fail(pos);
        }
        return true;
      case State::mistral_name:
        while (pos < end() && is_name_char(at(pos))) ++pos;
        if (pos == end()) return false;
        if (at(pos) != '[') return fail(pos);
        name = std::string(text(name_start, pos));
        state = State::mistral_tag;
        return true;
      case State::mistral_tag:
        return literal_step(kMistralArgs, final, [&] {
          enter_object(State::content);
          obj = Obj::value_start;  // straight to the arguments
          key = "arguments";
          have_name = bare = true;
        });
    }
    return false;
  }

  void run(bool final) {
    while (step(final)) {
    }
    if (final) {
      if (in_region) emit(region, end());
      in_region = false;
      pos = end();
    }
    // Keep what a later decision may need: the held call's text, the key being read.
    size_t keep = pos;
    if (in_region) keep = std::min(keep, region);
    if (state == State::object && obj == Obj::key) keep = std::min(keep, raw_start);
    if (keep > base) {
      buf.erase(0, keep - base);
      base = keep;
    }
  }
};

ToolCallParser::ToolCallParser(ToolCallFormat format, std::string prefix) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.format = format;
  m.prefix_end = prefix.size();
  m.buf = std::move(prefix);
  if (format == ToolCallFormat::llama3_json) {
    m.state = Impl::State::llama_start;
    m.begin_call(0);  // leading whitespace is content unless a call follows
  }
  m.run(false);
}

ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

ToolCallParser::Output ToolCallParser::feed(std::string_view text) {
  if (impl_->finished) return {};
  impl_->buf.append(text);
  impl_->run(false);
  return std::exchange(impl_->out, {});
}

ToolCallParser::Output ToolCallParser::finish() {
  if (impl_->finished) return {};
  impl_->run(true);
  impl_->finished = true;
  return std::exchange(impl_->out, {});
}

const std::vector<ToolCall>& ToolCallParser::calls() const { return impl_->calls; }
const std::string& ToolCallParser::content() const { return impl_->content; }

ParsedToolCalls parse_tool_calls(ToolCallFormat f, std::string_view text, const std::string& prefix) {
  ToolCallParser p(f, prefix);
  p.feed(text);
  p.finish();
  return {p.content(), p.calls()};
}

}  // namespace kiln::serve
