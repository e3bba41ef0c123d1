// Oniguruma (Ruby syntax) to PCRE2 pattern translation (see regex.h). Character sets are built as
// sorted code point ranges from unicode_data.h and written back as PCRE2 classes of \x{..} ranges.
// Oniguruma's definitions, as `tokenizers` 0.23 runs it (checked on every code point by
// tests/cpu/test_unicode_scan.cpp): \w is Alphabetic, marks, Nd, Pc and U+00B2 U+00B3 U+00B9
// U+00BC..U+00BE; [[:word:]] the same without those six; \s White_Space; \d Nd; \h hex digits;
// [[:punct:]] P and S, but \p{Punct} only P; [[:lower:]]/[[:upper:]] the Lowercase/Uppercase
// properties; [[:graph:]] neither White_Space nor Cc, Cs, Cn; [[:print:]] graph or Zs.
// Under (?i) a bracket expression is case-folded as a whole (then negated), a property or class
// escape outside brackets is not. A property kiln has no table for is passed to PCRE2 as written
// (PCRE2's own Unicode data); Oniguruma's multi-character folds ((?i)ß matching "ss") are not kept.
// Thread safety: pure functions.
#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <optional>

#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_data.h"

namespace kiln::tok {
namespace {

using ucd::Range;
using Set = std::vector<Range>;
constexpr char32_t kMaxCp = 0x10FFFF;

constexpr auto by_start = [](const Range& a, const Range& b) { return a.lo < b.lo; };
Set normalized(Set s) {
  if (!std::is_sorted(s.begin(), s.end(), by_start)) std::sort(s.begin(), s.end(), by_start);
  Set out;
  for (const Range& r : s) {
    if (!out.empty() && r.lo <= out.back().hi + 1) out.back().hi = std::max(out.back().hi, r.hi);
    else out.push_back(r);
  }
  return out;
}
Set unite(const Set& a, const Set& b) {  // both sorted
  Set merged(a.size() + b.size());
  std::merge(a.begin(), a.end(), b.begin(), b.end(), merged.begin(), by_start);
  return normalized(std::move(merged));
}
Set complement(const Set& a) {
  Set out;
  char32_t next = 0;
  for (const Range& r : a) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}
Set intersect(const Set& a, const Set& b) {
  Set out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    char32_t lo = std::max(a[i].lo, b[j].lo), hi = std::min(a[i].hi, b[j].hi);
    if (lo <= hi) out.push_back({lo, hi});
    (a[i].hi < b[j].hi) ? ++i : ++j;
  }
  return out;
}
Set of_table(std::span<const Range> t) { return Set(t.begin(), t.end()); }
Set of_chars(std::string_view chars) {
  Set s;
  for (char c : chars) s.push_back({static_cast<char32_t>(c), static_cast<char32_t>(c)});
  return normalized(std::move(s));
}
// kiln's (Oniguruma's) general categories as sets, index as ucd::kCategoryNames.
const std::array<Set, 30>& category_sets() {
  static const std::array<Set, 30> sets = [] {  // a constant table, built once
    std::array<Set, 30> out;
    Set assigned;
    for (const auto& r : ucd::kRegexCategory) {
      out[r.value].push_back({r.lo, r.hi});
      assigned.push_back({r.lo, r.hi});
    }
    for (Set& c : out) c = normalized(std::move(c));
    out[ucd::kCategoryUnassigned] = complement(normalized(std::move(assigned)));
    return out;
  }();
  return sets;
}
// The code points whose general category index is in `mask` (bit i: kCategoryNames[i]).
Set of_categories(uint32_t mask) {
  Set s;
  for (uint32_t k = 0; k < 30; ++k)
    if (mask & (1u << k)) s = unite(s, category_sets()[k]);
  return s;
}
// a is a subset of b.
bool subset(const Set& a, const Set& b) {
  size_t j = 0;
  for (const Range& r : a) {
    while (j < b.size() && b[j].hi < r.lo) ++j;
    if (j == b.size() || b[j].lo > r.lo || b[j].hi < r.hi) return false;
  }
  return true;
}
uint32_t category_bits(std::string_view names) {  // "Lu Ll" -> mask
  uint32_t m = 0;
  for (size_t i = 0; i + 1 < names.size(); i += 3)
    for (uint32_t k = 0; k < 30; ++k)
      if (names.substr(i, 2) == ucd::kCategoryNames[k]) m |= 1u << k;
  return m;
}
Set of_script(uint16_t index) {
  Set s;
  for (const auto& r : ucd::kRegexScript)
    if (r.value == index) s.push_back({r.lo, r.hi});
  return s;
}

Set hex_digits() { return of_chars("0123456789abcdefABCDEF"); }
Set posix_word() { return unite(of_table(ucd::kRegexAlphabetic), of_categories(category_bits("Mn Mc Me Nd Pc"))); }
Set onig_word() { return unite(posix_word(), {{0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}}); }
Set graph() {
  return complement(unite(of_table(ucd::kRegexWhiteSpace), of_categories(category_bits("Cc Cs Cn"))));
}

std::string squash(std::string_view name) {  // Oniguruma ignores case, spaces, '-' and '_'
  std::string out;
  for (char c : name)
    if (c != ' ' && c != '-' && c != '_') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

// \p{name}; nullopt when kiln has no table for it.
std::optional<Set> property(std::string_view raw) {
  const std::string n = squash(raw);
  struct Named { const char* name; const char* categories; };
  static constexpr Named kCategories[] = {
      {"l", "Lu Ll Lt Lm Lo"}, {"letter", "Lu Ll Lt Lm Lo"}, {"lc", "Lu Ll Lt"}, {"l&", "Lu Ll Lt"},
      {"casedletter", "Lu Ll Lt"}, {"lu", "Lu"}, {"uppercaseletter", "Lu"}, {"ll", "Ll"}, {"lowercaseletter", "Ll"},
      {"lt", "Lt"}, {"titlecaseletter", "Lt"}, {"lm", "Lm"}, {"modifierletter", "Lm"}, {"lo", "Lo"},
      {"otherletter", "Lo"}, {"m", "Mn Mc Me"}, {"mark", "Mn Mc Me"}, {"combiningmark", "Mn Mc Me"},
      {"mn", "Mn"}, {"nonspacingmark", "Mn"}, {"mc", "Mc"}, {"spacingmark", "Mc"}, {"me", "Me"},
      {"enclosingmark", "Me"}, {"n", "Nd Nl No"}, {"number", "Nd Nl No"}, {"nd", "Nd"}, {"decimalnumber", "Nd"},
      {"digit", "Nd"}, {"nl", "Nl"}, {"letternumber", "Nl"}, {"no", "No"}, {"othernumber", "No"},
      {"p", "Pc Pd Ps Pe Pi Pf Po"}, {"punctuation", "Pc Pd Ps Pe Pi Pf Po"}, {"punct", "Pc Pd Ps Pe Pi Pf Po"},
      {"pc", "Pc"}, {"connectorpunctuation", "Pc"}, {"pd", "Pd"}, {"dashpunctuation", "Pd"}, {"ps", "Ps"},
      {"openpunctuation", "Ps"}, {"pe", "Pe"}, {"closepunctuation", "Pe"}, {"pi", "Pi"},
      {"initialpunctuation", "Pi"}, {"pf", "Pf"}, {"finalpunctuation", "Pf"}, {"po", "Po"},
      {"otherpunctuation", "Po"}, {"s", "Sm Sc Sk So"}, {"symbol", "Sm Sc Sk So"}, {"sm", "Sm"},
      {"mathsymbol", "Sm"}, {"sc", "Sc"}, {"currencysymbol", "Sc"}, {"sk", "Sk"}, {"modifiersymbol", "Sk"},
      {"so", "So"}, {"othersymbol", "So"}, {"z", "Zs Zl Zp"}, {"separator", "Zs Zl Zp"}, {"zs", "Zs"},
      {"spaceseparator", "Zs"}, {"zl", "Zl"}, {"lineseparator", "Zl"}, {"zp", "Zp"},
      {"paragraphseparator", "Zp"}, {"c", "Cc Cf Cs Co Cn"}, {"other", "Cc Cf Cs Co Cn"}, {"cc", "Cc"},
      {"control", "Cc"}, {"cntrl", "Cc"}, {"cf", "Cf"}, {"format", "Cf"}, {"cs", "Cs"}, {"surrogate", "Cs"},
      {"co", "Co"}, {"privateuse", "Co"}, {"cn", "Cn"}, {"unassigned", "Cn"}};
  for (const auto& c : kCategories)
    if (n == c.name) return of_categories(category_bits(c.categories));
  if (n == "any") return Set{{0, kMaxCp}};
  if (n == "assigned") return complement(of_categories(category_bits("Cn")));
  if (n == "ascii") return Set{{0, 0x7F}};
  if (n == "alphabetic" || n == "alpha") return of_table(ucd::kRegexAlphabetic);
  if (n == "whitespace" || n == "wspace" || n == "space") return of_table(ucd::kRegexWhiteSpace);
  if (n == "lowercase" || n == "lower") return of_table(ucd::kRegexLowercase);
  if (n == "uppercase" || n == "upper") return of_table(ucd::kRegexUppercase);
  if (n == "word") return onig_word();
  if (n == "alnum") return unite(of_table(ucd::kRegexAlphabetic), of_categories(category_bits("Nd")));
  if (n == "graph") return graph();
  if (n == "print") return unite(graph(), of_categories(category_bits("Zs")));
  if (n == "xdigit") return hex_digits();
  if (n == "blank") return unite(of_categories(category_bits("Zs")), {{'\t', '\t'}});
  for (size_t k = 0; k < ucd::kRegexScriptNames.size(); ++k) {
    const auto& s = ucd::kRegexScriptNames[k];
    if (n == squash(s.name) || n == squash(s.short_name)) {
      if (std::string_view(s.name) != "Unknown") return of_script(static_cast<uint16_t>(k));
      Set all;
      for (const auto& r : ucd::kRegexScript) all.push_back({r.lo, r.hi});
      return complement(normalized(std::move(all)));
    }
  }
  return std::nullopt;
}

// [:name:] inside a bracket expression.
std::optional<Set> posix_class(std::string_view n) {
  if (n == "alnum") return property("alnum");
  if (n == "alpha") return property("alpha");
  if (n == "ascii") return property("ascii");
  if (n == "blank") return property("blank");
  if (n == "cntrl") return property("cntrl");
  if (n == "digit") return property("digit");
  if (n == "graph") return property("graph");
  if (n == "lower") return property("lower");
  if (n == "print") return property("print");
  if (n == "punct") return of_categories(category_bits("Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So"));
  if (n == "space") return property("space");
  if (n == "upper") return property("upper");
  if (n == "xdigit") return hex_digits();
  if (n == "word") return posix_word();
  return std::nullopt;
}

void append_hex(std::string& out, char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", static_cast<unsigned>(c));
  out += buf;
}

Set without_surrogates(const Set& s) { return intersect(s, {{0, 0xD7FF}, {0xE000, kMaxCp}}); }
Set minus(const Set& a, const Set& b) { return intersect(a, complement(b)); }

std::string ranges_text(const Set& parts) {
  std::string out;
  for (const Range& r : parts) {
    append_hex(out, r.lo);
    if (r.hi != r.lo) {
      out += '-';
      append_hex(out, r.hi);
    }
  }
  return out;
}

// `s` as PCRE2's \p{..} of whole general categories plus corrections: s = (items - removed) + added.
struct NativeForm {
  std::string items;  // "\p{Lu}\p{Ll}..."
  Set added, removed;
  size_t cost() const { return added.size() + removed.size() + items.size() / 16; }
};
NativeForm native_form(const Set& s, const NativeCategories& native) {
  NativeForm f;
  Set covered;
  for (uint32_t k = 0; k < 30; ++k) {
    if (k == ucd::kCategoryUnassigned || k == 27 || native.ranges[k].empty()) continue;  // never Cn or Cs
    const Set& ours = category_sets()[k];
    if (ours.empty() || !subset(ours, s)) continue;  // only categories wholly inside s
    f.items += std::string("\\p{") + ucd::kCategoryNames[k] + "}";
    covered = unite(covered, native.ranges[k]);
  }
  covered = without_surrogates(covered);
  f.added = minus(s, covered);
  f.removed = minus(covered, s);
  return f;
}

// A PCRE2 class of exactly `s`, or of its complement when `negated`, with PCRE2's own category
// items where they are cheaper than explicit ranges. Under (?i) PCRE2 folds the members of a
// bracket before negating it, as Oniguruma does.
std::string class_of(const Set& set, bool negated, const NativeCategories* native) {
  const Set s = without_surrogates(set);
  if (s.empty()) return negated ? "[\\x{0}-\\x{10FFFF}]" : "[^\\x{0}-\\x{10FFFF}]";
  if (native) {
    const Set inverse = without_surrogates(complement(s));
    NativeForm direct = native_form(s, *native), inverted = native_form(inverse, *native);
    bool invert = inverted.cost() < direct.cost();
    const NativeForm& f = invert ? inverted : direct;
    if (!f.items.empty() && f.cost() < s.size()) {
      // f describes the set to match positively (s, or its complement when negated != invert).
      bool positive = negated == invert;
      std::string body = f.items + ranges_text(f.added);
      std::string removed = f.removed.empty() ? "" : "[" + ranges_text(f.removed) + "]";
      std::string native_part;
      if (positive) native_part = removed.empty() ? "[" + body + "]" : "(?!" + removed + ")[" + body + "]";
      else native_part = removed.empty() ? "[^" + body + "]" : "(?:" + removed + "|[^" + body + "])";
      // ASCII by the bitmap of an explicit class; PCRE2 checks property items even below 256.
      Set ascii = intersect(negated ? complement(s) : s, {{0, 0x7F}});
      std::string ascii_part = ascii.empty() ? "" : "[" + ranges_text(ascii) + "]|";
      return "(?:" + ascii_part + "(?![\\x{0}-\\x{7F}])" + native_part + ")";
    }
  }
  return std::string(negated ? "[^" : "[") + ranges_text(s) + "]";
}

class Translator {
 public:
  Translator(std::string_view p, const NativeCategories* native) : p_(p), native_(native) {}

  Result<std::string> run() {
    std::string out;
    while (i_ < p_.size()) {
      char c = p_[i_];
      if (c == '\\') {
        KILN_RETURN_IF_ERROR(escape_outside(out));
      } else if (c == '[') {
        KILN_ASSIGN_OR_RETURN(Bracket b, bracket());
        // Under (?i) PCRE2 must fold the bracket's members, which it does for ranges only.
        out += class_of(b.set, b.negated, caseless_.back() ? nullptr : native_);
      } else if (c == '(' && p_.compare(i_, 2, "(?") == 0) {
        out += options();
      } else if (c == '(') {
        caseless_.push_back(caseless_.back());
        out += c;
        ++i_;
      } else if (c == ')') {
        if (caseless_.size() > 1) caseless_.pop_back();
        out += c;
        ++i_;
      } else if (c == '{' && p_.compare(i_, 2, "{,") == 0) {  // Ruby's {,n} is {0,n}
        out += "{0,";
        i_ += 2;
      } else {
        out += c;
        ++i_;
      }
    }
    return out;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("regex '" + std::string(p_) + "': " + what + " at offset " + std::to_string(i_));
  }

  // "(?imx-imx:" or "(?imx)": Ruby's m (dot matches newline) is PCRE2's s. Tracks where (?i) holds.
  std::string options() {
    size_t j = i_ + 2;
    while (j < p_.size() && (p_[j] == 'i' || p_[j] == 'm' || p_[j] == 'x' || p_[j] == '-')) ++j;
    if (j == i_ + 2 || j >= p_.size() || (p_[j] != ':' && p_[j] != ')')) {
      caseless_.push_back(caseless_.back());  // another group kind: (?: (?= (?<name> ...
      i_ += 2;
      return "(?";
    }
    std::string out = "(?";
    bool on = true, caseless = caseless_.back();
    for (size_t k = i_ + 2; k < j; ++k) {
      if (p_[k] == '-') on = false;
      if (p_[k] == 'i') caseless = on;
      out += p_[k] == 'm' ? 's' : p_[k];
    }
    if (p_[j] == ':') caseless_.push_back(caseless);  // (?i:...) until its ')'
    else caseless_.back() = caseless;                  // (?i) to the end of the enclosing group
    out += p_[j];
    i_ = j + 1;
    return out;
  }

  // \p{..}, \P{..}, \p{^..}: the set, or nullopt with `raw` the escape to pass through.
  Result<std::optional<Set>> property_escape(std::string& raw) {
    bool neg = p_[i_ + 1] == 'P';
    size_t open = i_ + 2;
    if (open >= p_.size() || p_[open] != '{') return error("\\p needs a {name}");
    size_t close = p_.find('}', open);
    if (close == std::string_view::npos) return error("unterminated \\p{");
    std::string_view name = p_.substr(open + 1, close - open - 1);
    raw = std::string(p_.substr(i_, close + 1 - i_));
    i_ = close + 1;
    if (!name.empty() && name[0] == '^') {
      neg = !neg;
      name.remove_prefix(1);
    }
    std::optional<Set> s = property(name);
    if (!s) return std::optional<Set>();
    return std::optional<Set>(neg ? complement(*s) : std::move(*s));
  }

  // The set of a class escape (\w \W \s \S \d \D \h \H) at i_, or nullopt.
  std::optional<Set> class_escape() {
    char e = p_[i_ + 1];
    std::optional<Set> s;
    switch (std::tolower(static_cast<unsigned char>(e))) {
      case 'w': s = onig_word(); break;
      case 's': s = of_table(ucd::kRegexWhiteSpace); break;
      case 'd': s = of_categories(category_bits("Nd")); break;
      case 'h': s = hex_digits(); break;
      default: return std::nullopt;
    }
    i_ += 2;
    return std::isupper(static_cast<unsigned char>(e)) ? complement(*s) : *s;
  }

  // A code point written as an escape at i_ (\t \n \r \f \v \a \e \xHH \x{H..} \uHHHH \0oo), or nullopt.
  Result<std::optional<char32_t>> char_escape(bool in_class) {
    char e = p_[i_ + 1];
    auto hex = [&](size_t from, size_t max_digits, size_t& end) -> std::optional<char32_t> {
      char32_t v = 0;
      size_t k = from;
      while (k < p_.size() && k - from < max_digits && std::isxdigit(static_cast<unsigned char>(p_[k]))) {
        char d = static_cast<char>(std::tolower(static_cast<unsigned char>(p_[k])));
        v = v * 16 + static_cast<char32_t>(d <= '9' ? d - '0' : d - 'a' + 10);
        ++k;
      }
      end = k;
      if (k == from || v > kMaxCp) return std::nullopt;
      return v;
    };
    const char* simple = "t\tn\nr\rf\fv\va\ae\x1b";
    for (const char* s = simple; *s; s += 2) {
      if (e == s[0]) {
        i_ += 2;
        return std::optional<char32_t>(static_cast<char32_t>(s[1]));
      }
    }
    if (in_class && e == 'b') {
      i_ += 2;
      return std::optional<char32_t>(U'\b');
    }
    size_t end = 0;
    if (e == 'x' && i_ + 2 < p_.size() && p_[i_ + 2] == '{') {
      auto v = hex(i_ + 3, 8, end);
      if (!v || end >= p_.size() || p_[end] != '}') return error("bad \\x{...}");
      i_ = end + 1;
      return std::optional<char32_t>(*v);
    }
    if (e == 'x') {
      auto v = hex(i_ + 2, 2, end);
      if (!v) return error("bad \\x");
      i_ = end;
      return std::optional<char32_t>(*v);
    }
    if (e == 'u') {
      auto v = hex(i_ + 2, 4, end);
      if (!v || end != i_ + 6) return error("\\u needs four hex digits");
      i_ = end;
      return std::optional<char32_t>(*v);
    }
    if (e == '0' || (in_class && e >= '1' && e <= '7')) {
      char32_t v = 0;
      size_t k = i_ + 1;
      while (k < p_.size() && k < i_ + 4 && p_[k] >= '0' && p_[k] <= '7') v = v * 8 + static_cast<char32_t>(p_[k++] - '0');
      i_ = k;
      return std::optional<char32_t>(v);
    }
    return std::optional<char32_t>();
  }

  // Outside brackets Oniguruma does not case-fold a property or class escape under (?i).
  std::string unfolded(const Set& s) const { return "(?-i:" + class_of(s, false, native_) + ")"; }

  Status escape_outside(std::string& out) {
    if (i_ + 1 >= p_.size()) return error("trailing backslash");
    char e = p_[i_ + 1];
    if (e == 'p' || e == 'P') {
      std::string raw;
      KILN_ASSIGN_OR_RETURN(std::optional<Set> s, property_escape(raw));
      out += s ? unfolded(*s) : raw;
      return Status();
    }
    if (auto s = class_escape()) {
      out += unfolded(*s);
      return Status();
    }
    KILN_ASSIGN_OR_RETURN(std::optional<char32_t> cp, char_escape(false));
    if (cp) {
      append_hex(out, *cp);
      return Status();
    }
    // Anything else (\b \B \A \z \Z \G \K \R \X \1 \k<..>, escaped punctuation) means the same in PCRE2.
    size_t n = utf8_len(static_cast<unsigned char>(e));
    out.append(p_.substr(i_, 1 + n));
    i_ += 1 + n;
    return Status();
  }

  // One member of a bracket expression at i_: a set (escape, nested class, POSIX bracket) or a
  // single code point (for ranges).
  struct Member {
    Set set;
    std::optional<char32_t> cp;
  };
  Result<Member> member() {
    char c = p_[i_];
    if (c == '[' && p_.compare(i_, 2, "[:") == 0) {
      size_t close = p_.find(":]", i_ + 2);
      if (close != std::string_view::npos) {
        std::string_view name = p_.substr(i_ + 2, close - i_ - 2);
        bool neg = !name.empty() && name[0] == '^';
        if (neg) name.remove_prefix(1);
        if (auto s = posix_class(name)) {
          i_ = close + 2;
          return Member{neg ? complement(*s) : *s, std::nullopt};
        }
      }
    }
    if (c == '[') {
      KILN_ASSIGN_OR_RETURN(Bracket b, bracket());
      return Member{b.negated ? complement(b.set) : std::move(b.set), std::nullopt};
    }
    if (c == '\\') {
      if (i_ + 1 >= p_.size()) return error("trailing backslash");
      char e = p_[i_ + 1];
      if (e == 'p' || e == 'P') {
        std::string raw;
        KILN_ASSIGN_OR_RETURN(std::optional<Set> s, property_escape(raw));
        if (!s) return error("unknown property " + raw + " in a bracket expression");
        return Member{std::move(*s), std::nullopt};
      }
      if (auto s = class_escape()) return Member{std::move(*s), std::nullopt};
      KILN_ASSIGN_OR_RETURN(std::optional<char32_t> cp, char_escape(true));
      if (cp) return Member{{}, cp};
      if (std::isalnum(static_cast<unsigned char>(e))) return error(std::string("unsupported escape \\") + e + " in a bracket expression");
      size_t j = i_ + 1;
      char32_t lit = next_cp(p_, j);
      i_ = j;
      return Member{{}, lit};
    }
    size_t j = i_;
    char32_t lit = next_cp(p_, j);
    i_ = j;
    return Member{{}, lit};
  }

  // A bracket expression starting at '[': members, ranges a-b, nesting, && intersection; its set
  // before the negation of a leading ^.
  struct Bracket {
    Set set;
    bool negated;
  };
  Result<Bracket> bracket() {
    ++i_;  // '['
    bool neg = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      neg = true;
      ++i_;
    }
    Set acc;                 // the union being built
    std::optional<Set> and_left;  // the left side of a pending &&
    bool first = true;
    while (true) {
      if (i_ >= p_.size()) return error("unterminated bracket expression");
      if (p_[i_] == ']' && !first) {
        ++i_;
        break;
      }
      if (p_.compare(i_, 2, "&&") == 0) {
        and_left = and_left ? intersect(*and_left, normalized(acc)) : normalized(acc);
        acc.clear();
        i_ += 2;
        first = false;
        continue;
      }
      first = false;
      KILN_ASSIGN_OR_RETURN(Member m, member());
      if (m.cp && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        KILN_ASSIGN_OR_RETURN(Member hi, member());
        if (!hi.cp || *hi.cp < *m.cp) return error("bad range in a bracket expression");
        acc.push_back({*m.cp, *hi.cp});
      } else if (m.cp) {
        acc.push_back({*m.cp, *m.cp});
      } else {
        acc.insert(acc.end(), m.set.begin(), m.set.end());
      }
    }
    Set s = normalized(std::move(acc));
    if (and_left) s = intersect(*and_left, s);
    return Bracket{std::move(s), neg};
  }

  std::string_view p_;
  const NativeCategories* native_;
  size_t i_ = 0;
  std::vector<bool> caseless_{false};  // whether (?i) holds, per open group
};

}  // namespace

Result<std::string> onig_to_pcre2(std::string_view pattern, const NativeCategories* native) {
  if (!valid_utf8(pattern)) return invalid_argument("regex pattern is not valid UTF-8");
  return Translator(pattern, native).run();
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-&/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace kiln::tok
