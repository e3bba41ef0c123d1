// Pre-tokenizers of tokenizer.json: Split (String/Regex, all behaviours, invert), ByteLevel,
// Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation, BertPreTokenizer, CharDelimiterSplit,
// Sequence; and the GPT-2 byte <-> character table. Splitting follows tokenizers'
// NormalizedString::split exactly; a split's alignment (offsets) is sliced and mapped with its text.
// Immutable after construction; thread-safe.
#include <algorithm>
#include <array>

#include "model/tokenizer/components.h"

namespace kiln::tok {

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 324> to_byte;  // code points 0..323 cover the table
  ByteTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_unicode[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;  // a constant table, built once
  return tables;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Result<Behavior> parse_behavior(const Json& j, const std::string& source) {
  std::string b = j.is_string() ? j.get<std::string>() : "Isolated";
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  return config_error(source, "unknown split behavior '" + b +
                                  "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
}

struct Range {
  size_t a, b;
  bool flag;  // is_match before the behaviour is applied, "remove" after
};

// Ranges covering `s` from the regex matches (tokenizers' Pattern::find_matches for a regex).
void ranges_from_regex(const Regex& re, std::string_view s, bool invert, std::vector<Range>& out) {
  out.clear();
  if (s.empty()) { out.push_back({0, 0, false}); return; }
  std::vector<std::pair<size_t, size_t>> m;
  re.find_all(s, m);
  size_t prev = 0;
  for (auto [a, b] : m) {
    if (prev != a) out.push_back({prev, a, invert});
    out.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), invert});
}

// Ranges from a character predicate: every matching character is its own match.
template <typename Pred>
void ranges_from_pred(std::string_view s, Pred pred, std::vector<Range>& out) {
  out.clear();
  if (s.empty()) { out.push_back({0, 0, false}); return; }
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    size_t a = i;
    char32_t c = next_cp(s, i);
    if (pred(c)) {
      if (last < a) out.push_back({last, a, false});
      out.push_back({a, i, true});
      last = i;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

// Applies the behaviour to the ranges of `in` and appends the resulting non-empty pieces.
void emit(const Split& in, std::vector<Range>& r, Behavior beh, std::vector<Split>& out) {
  std::vector<Range> res;
  res.reserve(r.size());
  switch (beh) {
    case Behavior::Isolated:
      for (auto x : r) res.push_back({x.a, x.b, false});
      break;
    case Behavior::Removed:
      res = r;
      break;
    case Behavior::Contiguous: {
      bool prev = false;
      for (auto x : r) {
        if (x.flag == prev && !res.empty()) res.back().b = x.b;
        else res.push_back({x.a, x.b, false});
        prev = x.flag;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev = false;
      for (auto x : r) {
        if (x.flag && !prev && !res.empty()) res.back().b = x.b;
        else res.push_back({x.a, x.b, false});
        prev = x.flag;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = r.size(); k-- > 0;) {
        auto x = r[k];
        if (x.flag && !prev && !res.empty()) res.back().a = x.a;
        else res.push_back({x.a, x.b, false});
        prev = x.flag;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (auto x : res) {
    if (x.flag || x.a == x.b) continue;
    out.push_back({in.text.substr(x.a, x.b - x.a), in.at_start && x.a == 0, {}});
    if (!in.align.empty())
      out.back().align.assign(in.align.begin() + static_cast<std::ptrdiff_t>(x.a), in.align.begin() + static_cast<std::ptrdiff_t>(x.b));
  }
}

class SplitPre final : public PreTokenizer {
 public:
  SplitPre(std::unique_ptr<Regex> re, Behavior beh, bool invert) : re_(std::move(re)), beh_(beh), invert_(invert) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    std::vector<Split> out;
    out.reserve(splits.size() * 4);
    std::vector<Range> r;
    for (const auto& s : splits) {
      ranges_from_regex(*re_, s.text, invert_, r);
      emit(s, r, beh_, out);
    }
    splits = std::move(out);
  }
 private:
  std::unique_ptr<Regex> re_;
  Behavior beh_;
  bool invert_;
};

template <typename Pred>
class PredSplit final : public PreTokenizer {
 public:
  PredSplit(Pred pred, Behavior beh) : pred_(pred), beh_(beh) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    std::vector<Split> out;
    out.reserve(splits.size() * 2);
    std::vector<Range> r;
    for (const auto& s : splits) {
      ranges_from_pred(s.text, pred_, r);
      emit(s, r, beh_, out);
    }
    splits = std::move(out);
  }
 private:
  Pred pred_;
  Behavior beh_;
};
template <typename Pred>
std::unique_ptr<PreTokenizer> pred_split(Pred pred, Behavior beh) {
  return std::make_unique<PredSplit<Pred>>(pred, beh);
}

bool is_bert_punc(char32_t c) {
  bool ascii = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return ascii || is_punctuation(c);
}

class ByteLevelPre final : public PreTokenizer {
 public:
  ByteLevelPre(bool add_prefix_space, std::unique_ptr<Regex> re) : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    const auto& table = byte_tables().to_unicode;
    std::vector<Split> out;
    out.reserve(splits.size() * (re_ ? 4 : 1));
    std::vector<Range> r;
    for (auto& s : splits) {
      if (add_prefix_space_ && (s.text.empty() || s.text[0] != ' ')) {
        if (!s.align.empty()) prepend_aligned(s.text, s.align, " ");
        else s.text = " " + s.text;
      }
      if (re_) {
        ranges_from_regex(*re_, s.text, false, r);
        emit(s, r, Behavior::Isolated, out);
      } else if (!s.text.empty()) {
        out.push_back(std::move(s));
      }
    }
    for (auto& s : out) {
      std::string mapped;
      mapped.reserve(s.text.size() * 2);
      if (s.align.empty()) {
        for (unsigned char c : s.text) mapped += table[c];
      } else {
        Alignment al;
        al.reserve(s.text.size() * 2);
        for (size_t k = 0; k < s.text.size(); ++k) {
          const std::string& m = table[static_cast<unsigned char>(s.text[k])];
          mapped += m;
          al.insert(al.end(), m.size(), s.align[k]);
        }
        s.align = std::move(al);
      }
      s.text = std::move(mapped);
    }
    splits = std::move(out);
  }
 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class MetaspacePre final : public PreTokenizer {
 public:
  MetaspacePre(std::string rep, int scheme, bool split) : rep_(std::move(rep)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    std::vector<Split> out;
    std::vector<Range> r;
    char32_t rep_cp = 0;
    { size_t i = 0; if (!rep_.empty()) rep_cp = next_cp(rep_, i); }
    for (auto& s : splits) {
      std::string t;
      t.reserve(s.text.size() + rep_.size());
      Alignment al;
      const bool aligned = !s.align.empty();
      if (aligned) al.reserve(s.text.size() + rep_.size());
      for (size_t k = 0; k < s.text.size(); ++k) {
        const char c = s.text[k];
        if (c == ' ') t += rep_;
        else t.push_back(c);
        if (aligned) al.insert(al.end(), c == ' ' ? rep_.size() : 1, s.align[k]);
      }
      bool starts = t.compare(0, rep_.size(), rep_) == 0 && !rep_.empty();
      if ((scheme_ == 0 && !starts) || (scheme_ == 1 && !starts && s.at_start)) {
        if (aligned) prepend_aligned(t, al, rep_);
        else t.insert(0, rep_);
      }
      Split ns{std::move(t), s.at_start, std::move(al)};
      if (split_) {
        ranges_from_pred(ns.text, [rep_cp](char32_t c) { return c == rep_cp; }, r);
        emit(ns, r, Behavior::MergedWithNext, out);
      } else if (!ns.text.empty()) {
        out.push_back(std::move(ns));
      }
    }
    splits = std::move(out);
  }
 private:
  std::string rep_;
  int scheme_;  // 0 always, 1 first, 2 never
  bool split_;
};

class SequencePre final : public PreTokenizer {
 public:
  explicit SequencePre(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Split>& splits) const override {
    for (const auto& p : parts_) p->pre_tokenize(splits);
  }
 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Rust regex's Unicode \w (Alphabetic, marks, decimal digits, connector punctuation, joiners).
constexpr const char* kWhitespacePattern =
    R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s]+)";

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_tables().to_unicode[b]; }
int unicode_to_byte(char32_t c) { return c < 324 ? byte_tables().to_byte[c] : -1; }

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return config_error(source, "a pre_tokenizer has no \"type\" string");
  const std::string type = j["type"];
  if (type == "Split") {
    const Json& p = j.value("pattern", Json::object());
    std::string pattern;
    if (p.contains("String")) pattern = regex_escape(p["String"].get<std::string>());
    else if (p.contains("Regex")) pattern = p["Regex"].get<std::string>();
    else return config_error(source, "pre_tokenizer Split needs a pattern {\"String\": ...} or {\"Regex\": ...}");
    KILN_ASSIGN_OR_RETURN(auto re, Regex::compile(pattern));
    KILN_ASSIGN_OR_RETURN(Behavior beh, parse_behavior(j.value("behavior", Json()), source));
    return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(re), beh, j.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> re;
    if (j.value("use_regex", true)) {
      KILN_ASSIGN_OR_RETURN(re, Regex::compile(kGpt2Pattern));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPre(j.value("add_prefix_space", true), std::move(re)));
  }
  if (type == "Metaspace") {
    std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    int scheme = 0;
    if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
      std::string s = j["prepend_scheme"];
      if (s == "always") scheme = 0;
      else if (s == "first") scheme = 1;
      else if (s == "never") scheme = 2;
      else return config_error(source, "unknown Metaspace prepend_scheme '" + s + "' (expected always, first, never)");
    } else {
      scheme = j.value("add_prefix_space", true) ? 0 : 2;
    }
    return std::unique_ptr<PreTokenizer>(new MetaspacePre(rep, scheme, j.value("split", true)));
  }
  if (type == "Whitespace") {
    KILN_ASSIGN_OR_RETURN(auto re, Regex::compile(kWhitespacePattern));
    return std::unique_ptr<PreTokenizer>(new SplitPre(std::move(re), Behavior::Removed, true));
  }
  if (type == "WhitespaceSplit") return pred_split([](char32_t c) { return is_whitespace(c); }, Behavior::Removed);
  if (type == "Digits") {
    Behavior beh = j.value("individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous;
    return pred_split([](char32_t c) { return is_numeric(c); }, beh);
  }
  if (type == "Punctuation") {
    KILN_ASSIGN_OR_RETURN(Behavior beh, parse_behavior(j.value("behavior", Json()), source));
    return pred_split([](char32_t c) { return is_bert_punc(c); }, beh);
  }
  if (type == "CharDelimiterSplit") {
    std::string d = j.value("delimiter", std::string(" "));
    size_t i = 0;
    char32_t cp = d.empty() ? U' ' : next_cp(d, i);
    return pred_split([cp](char32_t c) { return c == cp; }, Behavior::Removed);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(pred_split([](char32_t c) { return is_whitespace(c); }, Behavior::Removed));
    parts.push_back(pred_split([](char32_t c) { return is_bert_punc(c); }, Behavior::Isolated));
    return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(parts)));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& p : j.value("pretokenizers", Json::array())) {
      KILN_ASSIGN_OR_RETURN(auto part, make_pre_tokenizer(p, source));
      parts.push_back(std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePre(std::move(parts)));
  }
  return config_error(source, "unknown pre_tokenizer type '" + type +
                                  "' (kiln supports Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Digits, "
                                  "Punctuation, BertPreTokenizer, CharDelimiterSplit, Sequence)");
}

}  // namespace kiln::tok
