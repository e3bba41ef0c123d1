// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD, Lowercase, Strip, Prepend, Replace,
// StripAccents, BertNormalizer, ByteLevel, Sequence. Each is immutable after construction.
// normalize_aligned() follows tokenizers' NormalizedString alignments: a kept character keeps its
// range, a removed one disappears, the characters one character becomes all take its range, a
// prepended string takes the first character's, Replace's content takes the last matched
// character's. The Unicode normal forms are tracked where each character normalizes on its own
// (compatibility and canonical decompositions, one to one mappings); a composition or a reordering
// of combining marks is an error (normalize the input to that form first).
#include "model/tokenizer/components.h"

namespace kiln::tok {

void identity_alignment(std::string_view s, uint32_t base, Alignment& out) {
  out.clear();
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t a = i;
    next_cp(s, i);
    out.insert(out.end(), i - a, Align{base + static_cast<uint32_t>(a), base + static_cast<uint32_t>(i)});
  }
}

void prepend_aligned(std::string& s, Alignment& al, std::string_view p) {
  if (s.empty() || p.empty()) return;
  s.insert(0, p);
  al.insert(al.begin(), p.size(), al[0]);
}

namespace {

// Rewrites (s, al) character by character through f (see map_chars_aligned).
template <typename F>
void map_in_place(std::string& s, Alignment& al, F f) {
  std::string out;
  Alignment out_al;
  out.reserve(s.size());
  out_al.reserve(s.size());
  map_chars_aligned(s, al, out, out_al, f);
  s = std::move(out);
  al = std::move(out_al);
}

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(int form) : form_(form) {}
  void normalize(std::string& s) const override { s = normalize_form(s, form_); }
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    std::string whole = normalize_form(s, form_);
    if (whole == s) return Status::Ok();
    std::string out;
    Alignment out_al;
    map_chars_aligned(s, al, out, out_al, [&](char32_t, std::string_view ch, std::string& o) { o += normalize_form(ch, form_); });
    if (out != whole) {
      size_t k = 0;
      while (k < out.size() && k < whole.size() && out[k] == whole[k]) ++k;
      static const char* names[] = {"NFC", "NFD", "NFKC", "NFKD"};
      return invalid_argument(std::string("offsets: the tokenizer's ") + names[form_] +
                              " normalizer composes or reorders characters near byte " +
                              std::to_string(out_al[std::min(k, out_al.size() - 1)].begin) +
                              " of the text, which kiln cannot align to the input; normalize the text to " + names[form_] +
                              " before encoding it with offsets");
    }
    s = std::move(out);
    al = std::move(out_al);
    return Status::Ok();
  }
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
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    map_in_place(s, al, [](char32_t c, std::string_view, std::string& o) { append_lowercase(o, c); });
    return Status::Ok();
  }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    auto [a, b] = bounds(s);
    s = s.substr(a, b - a);
  }
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    auto [a, b] = bounds(s);
    s = s.substr(a, b - a);
    al = Alignment(al.begin() + static_cast<std::ptrdiff_t>(a), al.begin() + static_cast<std::ptrdiff_t>(b));
    return Status::Ok();
  }
 private:
  std::pair<size_t, size_t> bounds(const std::string& s) const {
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
    return {a, b};
  }
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    prepend_aligned(s, al, p_);
    return Status::Ok();
  }
 private:
  std::string p_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::string literal, std::unique_ptr<Regex> re, std::string content)
      : literal_(std::move(literal)), re_(std::move(re)), content_(std::move(content)) {}
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    std::vector<std::pair<size_t, size_t>> m;
    if (re_) {
      re_->find_all(s, m);
    } else if (!literal_.empty()) {
      for (size_t pos = s.find(literal_); pos != std::string::npos; pos = s.find(literal_, pos + literal_.size()))
        m.emplace_back(pos, pos + literal_.size());
    }
    if (m.empty()) return Status::Ok();
    std::string out;
    Alignment out_al;
    size_t prev = 0;
    for (auto [a, b] : m) {
      out.append(s, prev, a - prev);
      out_al.insert(out_al.end(), al.begin() + static_cast<std::ptrdiff_t>(prev), al.begin() + static_cast<std::ptrdiff_t>(a));
      out += content_;
      out_al.insert(out_al.end(), content_.size(), b > 0 ? al[b - 1] : Align{});  // as the last replaced character
      prev = b;
    }
    out.append(s, prev, std::string::npos);
    out_al.insert(out_al.end(), al.begin() + static_cast<std::ptrdiff_t>(prev), al.end());
    s = std::move(out);
    al = std::move(out_al);
    return Status::Ok();
  }
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
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    map_in_place(s, al, [](char32_t c, std::string_view ch, std::string& o) {
      if (!is_combining_mark(c)) o += ch;
    });
    return Status::Ok();
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
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    map_in_place(s, al, [&](char32_t c, std::string_view ch, std::string& o) { clean_and_space(c, ch, o); });
    if (strip_) {
      KILN_RETURN_IF_ERROR(UnicodeForm(1).normalize_aligned(s, al));
      map_in_place(s, al, [](char32_t c, std::string_view ch, std::string& o) {
        if (!is_nonspacing_mark(c)) o += ch;
      });
    }
    if (lower_) KILN_RETURN_IF_ERROR(Lowercase().normalize_aligned(s, al));
    return Status::Ok();
  }
  // clean_text and handle_chinese_chars for one character.
  void clean_and_space(char32_t c, std::string_view ch, std::string& out) const {
    if (clean_) {
      if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_other_category(c))) return;
      if (c == '\t' || c == '\n' || c == '\r' || is_whitespace(c)) { out.push_back(' '); return; }
    }
    if (chinese_ && is_chinese_char(c)) {
      out.push_back(' ');
      out += ch;
      out.push_back(' ');
      return;
    }
    out += ch;
  }
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
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    map_in_place(s, al, [](char32_t, std::string_view ch, std::string& o) {
      for (unsigned char b : ch) o += byte_to_unicode(b);
    });
    return Status::Ok();
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& s) const override {
    for (const auto& p : parts_) p->normalize(s);
  }
  Status normalize_aligned(std::string& s, Alignment& al) const override {
    for (const auto& p : parts_) KILN_RETURN_IF_ERROR(p->normalize_aligned(s, al));
    return Status::Ok();
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
