// Decoders of tokenizer.json, each a decode_chain over token strings as in tokenizers: ByteLevel,
// Metaspace, Replace, ByteFallback, Fuse, Strip, WordPiece, BPEDecoder, Sequence.
// Immutable after construction; thread-safe.
#include "model/tokenizer/components.h"

namespace kiln::tok {
namespace {

class ByteLevelDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t mark = bytes.size();
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        int b = unicode_to_byte(next_cp(t, i));
        if (b < 0) { all = false; break; }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all) { bytes.resize(mark); bytes += t; }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
  void token_bytes(std::string& token) const override {
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const int b = unicode_to_byte(next_cp(token, i));
      if (b < 0) return;  // not a byte-level token: its text as it is (decode_chain does the same)
      bytes.push_back(static_cast<char>(b));
    }
    token = std::move(bytes);
  }
};

class MetaspaceDec final : public Decoder {
 public:
  MetaspaceDec(char32_t rep, bool drop_first) : rep_(rep), drop_first_(drop_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      for (size_t i = 0; i < t.size();) {
        size_t a = i;
        char32_t c = next_cp(t, i);
        if (c == rep_) {
          if (!(k == 0 && drop_first_)) out.push_back(' ');
        } else {
          out.append(t, a, i - a);
        }
      }
      tokens[k] = std::move(out);
    }
  }
  void token_bytes(std::string& token) const override {
    std::vector<std::string> one = {"", token};  // not the first token: no prefix space dropped
    decode_chain(one);
    token = std::move(one[1]);
  }
 private:
  char32_t rep_;
  bool drop_first_;
};

class ReplaceDec final : public Decoder {
 public:
  ReplaceDec(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& t : tokens) {
      if (re_) {
        re_->find_all(t, m);
      } else {
        m.clear();
        if (literal_.empty()) continue;
        for (size_t p = t.find(literal_); p != std::string::npos; p = t.find(literal_, p + literal_.size()))
          m.emplace_back(p, p + literal_.size());
      }
      if (m.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [a, b] : m) {
        out.append(t, prev, a - prev);
        out += content_;
        prev = b;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }
  void token_bytes(std::string& token) const override {
    std::vector<std::string> one = {token};
    decode_chain(one);
    token = std::move(one[0]);
  }
 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

// "<0xNN>" -> the byte, like Rust's u8::from_str_radix(&token[3..5], 16) (a leading '+' allowed).
std::optional<uint8_t> byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (t[3] == '+' && lo >= 0) return static_cast<uint8_t>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

class ByteFallbackDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (valid_utf8(bytes)) out.push_back(bytes);
      else for (size_t k = 0; k < bytes.size(); ++k) out.push_back("\xEF\xBF\xBD");
      bytes.clear();
    };
    for (auto& t : tokens) {
      if (auto b = byte_token(t)) {
        bytes.push_back(static_cast<char>(*b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
  void token_bytes(std::string& token) const override {
    if (auto b = byte_token(token)) token.assign(1, static_cast<char>(*b));
  }
};

class FuseDec final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec final : public Decoder {
 public:
  StripDec(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      std::vector<char32_t> cps;
      for (size_t i = 0; i < t.size();) { starts.push_back(i); cps.push_back(next_cp(t, i)); }
      size_t n = cps.size();
      size_t a = 0;
      for (size_t k = 0; k < start_ && k < n; ++k) {
        if (cps[k] == content_) a = k + 1;
        else break;
      }
      size_t b = n;
      for (size_t k = 0; k < stop_ && k < n; ++k) {
        size_t idx = n - k - 1;
        if (cps[idx] == content_) b = idx;
        else break;
      }
      if (b < a) b = a;
      size_t ba = a < n ? starts[a] : t.size(), bb = b < n ? starts[b] : t.size();
      t = t.substr(ba, bb - ba);
    }
  }
 private:
  char32_t content_;
  size_t start_, stop_;
};

class WordPieceDec final : public Decoder {
 public:
  WordPieceDec(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  static void replace_all(std::string& s, const std::string& from, const std::string& to) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      if (k != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) t.erase(0, prefix_.size());
        else t = " " + t;
      }
      if (cleanup_) {
        static constexpr const char* kPairs[][2] = {{" .", "."},    {" ?", "?"},        {" !", "!"},
                                                    {" ,", ","},    {" ' ", "'"},       {" n't", "n't"},
                                                    {" 'm", "'m"},  {" do not", " don't"}, {" 's", "'s"},
                                                    {" 've", "'ve"}, {" 're", "'re"}};
        for (const auto& p : kPairs) replace_all(t, p[0], p[1]);
      }
    }
  }
 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeDec final : public Decoder {
 public:
  explicit BpeDec(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string rep = k + 1 == tokens.size() ? "" : " ";
      WordPieceDec::replace_all(tokens[k], suffix_, rep);
    }
  }
 private:
  std::string suffix_;
};

class SequenceDec final : public Decoder {
 public:
  explicit SequenceDec(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void token_bytes(std::string& token) const override {
    for (const auto& p : parts_) p->token_bytes(token);
  }
 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

char32_t first_cp(const std::string& s, char32_t fallback) {
  if (s.empty()) return fallback;
  size_t i = 0;
  return next_cp(s, i);
}

}  // namespace

Result<std::unique_ptr<Decoder>> make_decoder(const Json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return config_error(source, "a decoder has no \"type\" string");
  const std::string type = j["type"];
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDec());
  if (type == "Metaspace") {
    char32_t rep = first_cp(j.value("replacement", std::string("\xE2\x96\x81")), 0x2581);
    bool drop_first;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) drop_first = j["prepend_scheme"] != "never";
    else drop_first = j.value("add_prefix_space", true);
    return std::unique_ptr<Decoder>(new MetaspaceDec(rep, drop_first));
  }
  if (type == "Replace") {
    const Json& p = j.value("pattern", Json::object());
    std::string content = j.value("content", std::string());
    if (p.contains("String")) return std::unique_ptr<Decoder>(new ReplaceDec(p["String"], nullptr, content));
    if (p.contains("Regex")) {
      KILN_ASSIGN_OR_RETURN(auto re, Regex::compile(p["Regex"].get<std::string>()));
      return std::unique_ptr<Decoder>(new ReplaceDec("", std::move(re), content));
    }
    return config_error(source, "decoder Replace needs a pattern {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDec());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDec());
  if (type == "Strip") {
    return std::unique_ptr<Decoder>(new StripDec(first_cp(j.value("content", std::string(" ")), U' '),
                                                 j.value("start", size_t{0}), j.value("stop", size_t{0})));
  }
  if (type == "WordPiece")
    return std::unique_ptr<Decoder>(new WordPieceDec(j.value("prefix", std::string("##")), j.value("cleanup", true)));
  if (type == "BPEDecoder") return std::unique_ptr<Decoder>(new BpeDec(j.value("suffix", std::string("</w>"))));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& d : j.value("decoders", Json::array())) {
      KILN_ASSIGN_OR_RETURN(auto part, make_decoder(d, source));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDec(std::move(parts)));
  }
  return config_error(source, "unknown decoder type '" + type +
                                  "' (kiln supports ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, "
                                  "WordPiece, BPEDecoder, Sequence)");
}

}  // namespace kiln::tok
