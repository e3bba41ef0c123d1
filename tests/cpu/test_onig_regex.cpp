// Oniguruma patterns through kiln's translation to PCRE2 (model/tokenizer/regex.h): each case's
// pieces are those of the Python `tokenizers` library (0.23.3), Split(Regex(pattern), "isolated"),
// covering Ruby's line anchors and (?m), case folding of brackets but not of properties, nested
// brackets and &&, POSIX brackets, Oniguruma's \h \v \u and {,n}; and the errors of bad patterns.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/tokenizer/components.h"

namespace kiln::tok {
namespace {

struct SplitCase {
  const char* pattern;
  const char* text;
  std::vector<std::string> pieces;
};

const SplitCase kCases[] = {
    {"(?i)\\p{Lu}+", "aBc d", {"a", "B", "c d"}},
    {"(?i)[\\p{Lu}]+", "aBc d", {"aBc", " ", "d"}},
    {"(?i)[^a]+", "aAbB", {"aA", "bB"}},
    {"(?i)[^\\p{Lu}]+", "aAbB", {"aAbB"}},
    {"(?i)\\P{Lu}+", "aAbB", {"a", "A", "b", "B"}},
    {"(?i)[a\\p{Lu}]+", "xaAbBx1", {"xaAbBx", "1"}},
    {"(?i)[^a-c\\d]+", "xAb1Cyz", {"x", "Ab1C", "yz"}},
    {"(?i)[[:upper:]]+", "aBc1", {"aBc", "1"}},
    {"(?i)\\p{Upper}+", "aBc", {"a", "B", "c"}},
    {"(?i)[x&&[a-z]]+", "XxAa", {"Xx", "Aa"}},
    {"(?i)\\p{Ll}+", "aBc", {"a", "B", "c"}},
    {"(?i:k)", "x\xe2""\x84""\xaa""x", {"x", "\xe2""\x84""\xaa""", "x"}},
    {"(?i)[a-c]+", "xABcx", {"x", "ABc", "x"}},
    {"^a|a$", "aba\x0a""ab\x0a""a\x0a""", {"a", "b", "a", "\x0a""", "a", "b\x0a""", "a", "\x0a"""}},
    {"$", "ab\x0a""cd\x0a""", {"ab", "\x0a""cd", "\x0a"""}},
    {"(?m).+", "ab\x0a""cd", {"ab\x0a""cd"}},
    {".+", "ab\x0a""cd\x0d""\x0a""x", {"ab", "\x0a""", "cd\x0d""", "\x0a""", "x"}},
    {"\\Z|\\z", "ab\x0a""", {"ab", "\x0a"""}},
    {"[a-c&&b-d]+", "abcde", {"a", "bc", "de"}},
    {"[\\w&&[^\\d]]+", "ab12cd", {"ab", "12", "cd"}},
    {"[[:^alpha:]]+", "ab12 cd", {"ab", "12 ", "cd"}},
    {"[]a]+", "x]a]x", {"x", "]a]", "x"}},
    {"[^]a]+", "]a]xy", {"]a]", "xy"}},
    {"[a-]+", "x-a-b", {"x", "-a-", "b"}},
    {"[\\-\\]\\\\]+", "a-]\\b", {"a", "-]\\", "b"}},
    {"[\\101-\\103]+", "xABCDx", {"x", "ABC", "Dx"}},
    {"[\\x{41}-\\x{43}]+", "xABCDx", {"x", "ABC", "Dx"}},
    {"\\u00e9+", "x\xc3""\xa9""\xc3""\xa9""x", {"x", "\xc3""\xa9""\xc3""\xa9""", "x"}},
    {"\\x{e9}+", "x\xc3""\xa9""\xc3""\xa9""x", {"x", "\xc3""\xa9""\xc3""\xa9""", "x"}},
    {"\\v", "a\x0b""b", {"a", "\x0b""", "b"}},
    {"\\h+", "cafe babe zz", {"cafe", " ", "babe", " zz"}},
    {"\\t\\n\\r\\f\\e\\a", "x\x09""\x0a""\x0d""\x0c""\x1b""\x07""y", {"x", "\x09""\x0a""\x0d""\x0c""\x1b""\x07""", "y"}},
    {"\\0101", "xAy", {"xAy"}},
    {"a{,2}", "aaaa", {"aa", "aa"}},
    {"\\d{1,3}", "1234567", {"123", "456", "7"}},
    {"\\p{^L}+", "ab12cd", {"ab", "12", "cd"}},
    {"\\P{L}+", "ab12cd", {"ab", "12", "cd"}},
    {"[\\p{Greek}\\d]+", "a\xce""\xb1""\xce""\xb2""12b", {"a", "\xce""\xb1""\xce""\xb2""12", "b"}},
    {"\\s+(?!\\S)|\\s+", "a   b  ", {"a", "  ", " ", "b", "  "}},
    {"'s|'t|\\p{L}+", "it's Bob's", {"it", "'s", " ", "Bob", "'s"}},
    {"\\bab\\b", "ab cab ab", {"ab", " cab ", "ab"}},
    {"(?x) a b # comment", "xaby", {"x", "ab", "y"}},
    {"\\.|\\?", "a.b?c", {"a", ".", "b", "?", "c"}},
    {"\\w+", "x\xc2""\xb2""\xc2""\xbd""\xe2""\x80""\x8d""y z", {"x\xc2""\xb2""\xc2""\xbd""", "\xe2""\x80""\x8d""", "y", " ", "z"}},
    {"[[:word:]]+", "x\xc2""\xb2""y", {"x", "\xc2""\xb2""", "y"}},
    {"[[:punct:]]+", "a+-b", {"a", "+-", "b"}},
    {"\\p{Punct}+", "a+-b", {"a+", "-", "b"}},
};

TEST(OnigRegex, SplitsAsTokenizersDoes) {
  for (const auto& c : kCases) {
    nlohmann::json j = {{"type", "Split"}, {"pattern", {{"Regex", c.pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
    auto pre = make_pre_tokenizer(j, "test");
    ASSERT_TRUE(pre.ok()) << c.pattern << ": " << pre.status().message();
    std::vector<Split> splits{{c.text, true}};
    (*pre)->pre_tokenize(splits);
    std::vector<std::string> got;
    for (const auto& s : splits) got.push_back(s.text);
    EXPECT_EQ(got, c.pieces) << "pattern " << c.pattern << " on '" << c.text << "'";
  }
}

TEST(OnigRegex, BadPatternsAreErrorsNamingThePattern) {
  for (const char* p : {"[abc", "\\u12", "[z-a]", "[\\p{NoSuchProperty}]", "(", "a\\", "\\p{L", "[a-\\w]", "\\x{110000}",
                        "\\C"}) {  // \C: one byte, a match could split a UTF-8 character (the fuzzer found it)
    auto r = Regex::compile(p);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
  }
  // A property kiln has no table for goes to PCRE2 as written.
  auto r = onig_to_pcre2("\\p{Emoji}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "\\p{Emoji}");
}

TEST(OnigRegex, EscapedLiteralsMatchVerbatim) {
  const std::string literal = "a.b*c\\d[e]f{1}(g)|h^$?+-&/#";
  auto re = Regex::compile(regex_escape(literal));
  ASSERT_TRUE(re.ok()) << re.status().message();
  std::vector<std::pair<size_t, size_t>> m;
  (*re)->find_all("xx" + literal + "yy", m);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], std::make_pair(size_t{2}, 2 + literal.size()));
}

}  // namespace
}  // namespace kiln::tok
