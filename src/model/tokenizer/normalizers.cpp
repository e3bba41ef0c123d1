// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD, Lowercase, Strip, Prepend, Replace,
// StripAccents, BertNormalizer, ByteLevel, Sequence. Each is immutable after construction.
#include "model/tokenizer/components.h"

namespace kiln::tok {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(int form) : form_(form) {}
  void normalize(std::string& s) const override { s = normalize_form(s, form_); }
 private:
  int form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) append_lowercase(out, next_cp(s, i));
    s = std::move(out);
  }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t a = 0, b = s.size();
    if (left_) {
      while (a < b) {
        size_t j = a;
        if (!is_whitespace(next_cp(s, j))) break;
        a = j;
      }
    }
    if (right_) {
      while (b > a) {
        size_t k = b - 1;
        while (k > a && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_whitespace(next_cp(s, j))) break;
        b = k;
      }
    }
    s = s.substr(a, b - a);
  }
 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }
 private:
  std::string p_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& s) const override {
    if (re_) {
      std::vector<std::pair<size_t, size_t>> m;
      re_->find_all(s, m);
      if (m.empty()) return;
      std::string out;
      size_t prev = 0;
      for (auto [a, b] : m) {
        out.append(s, prev, a - prev);
        out += content_;
        prev = b;
      }
      out.append(s, prev, std::string::npos);
      s = std::move(out);
      return;
    }
    if (literal_.empty() || s.find(literal_) == std::string::npos) return;
    std::string out;
    size_t prev = 0, pos;
    while ((pos = s.find(literal_, prev)) != std::string::npos) {
      out.append(s, prev, pos - prev);
      out += content_;
      prev = pos + literal_.size();
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }
 private:
  std::string literal_;
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t a = i;
      char32_t c = next_cp(s, i);
      if (!is_combining_mark(c)) out.append(s, a, i - a);
    }
    s = std::move(out);
  }
};

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean, bool chinese, bool strip_accents, bool lowercase)
      : clean_(clean), chinese_(chinese), strip_(strip_accents), lower_(lowercase) {}
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t a = i;
      char32_t c = next_cp(s, i);
      if (clean_) {
        if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_other_category(c))) continue;
        if (c == '\t' || c == '\n' || c == '\r' || is_whitespace(c)) { out.push_back(' '); continue; }
      }
      if (chinese_ && is_chinese_char(c)) {
        out.push_back(' ');
        out.append(s, a, i - a);
        out.push_back(' ');
        continue;
      }
      out.append(s, a, i - a);
    }
    if (strip_) {  // BERT strips nonspacing marks (Mn) only, after NFD
      out = normalize_form(out, 1);
      std::string kept;
      for (size_t i = 0; i < out.size();) {
        size_t a = i;
        if (!is_nonspacing_mark(next_cp(out, i))) kept.append(out, a, i - a);
      }
      out = std::move(kept);
    }
    if (lower_) Lowercase().normalize(out);
    s = std::move(out);
  }
 private:
  bool clean_, chinese_, strip_, lower_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char c : s) out += byte_to_unicode(c);
    s = std::move(out);
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }
 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

Result<std::unique_ptr<Normalizer>> make_normalizer(const Json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return config_error(source, "a normalizer has no \"type\" string");
  const std::string type = j["type"];
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeForm(0));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeForm(1));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeForm(2));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeForm(3));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new Lowercase());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccents());
  if (type == "ByteLevel") return std::unique_ptr<Normalizer>(new ByteLevelNormalizer());
  if (type == "Strip")
    return std::unique_ptr<Normalizer>(new Strip(j.value("strip_left", true), j.value("strip_right", true)));
  if (type == "Prepend") return std::unique_ptr<Normalizer>(new Prepend(j.value("prepend", std::string())));
  if (type == "Replace") {
    const Json& p = j.value("pattern", Json::object());
    std::string content = j.value("content", std::string());
    if (p.contains("String")) return std::unique_ptr<Normalizer>(new Replace(p["String"], nullptr, content));
    if (p.contains("Regex")) {
      KILN_ASSIGN_OR_RETURN(auto re, Regex::compile(p["Regex"].get<std::string>()));
      return std::unique_ptr<Normalizer>(new Replace("", std::move(re), content));
    }
    return config_error(source, "normalizer Replace needs a pattern {\"String\": ...} or {\"Regex\": ...}");
  }
  if (type == "BertNormalizer") {
    bool lower = j.value("lowercase", true);
    bool strip = lower;
    if (j.contains("strip_accents") && j["strip_accents"].is_boolean()) strip = j["strip_accents"];
    return std::unique_ptr<Normalizer>(
        new BertNormalizer(j.value("clean_text", true), j.value("handle_chinese_chars", true), strip, lower));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& n : j.value("normalizers", Json::array())) {
      KILN_ASSIGN_OR_RETURN(auto part, make_normalizer(n, source));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return config_error(source, "unknown normalizer type '" + type +
                                  "' (kiln supports NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Prepend, "
                                  "Replace, BertNormalizer, ByteLevel, Sequence)");
}

}  // namespace kiln::tok
