// Tokenizer::encode_with_offsets against the Python tokenizers library: every case of
// testdata/chat_masks/token_offsets.json (made by tests/reference/make_offset_cases.py over every
// fixture tokenizer) must give the same ids as encode() and Python, and the same offsets once kiln's
// UTF-8 byte offsets are turned into characters; the cases Python marks as beyond kiln's alignment
// tracking (a normal form composing characters) must fail with an error that says what to do.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "model/tokenizer.h"
#include "test_util.h"

namespace kiln {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// Character index of each byte offset 0..size of valid UTF-8 `s` (a byte inside a character maps to
// that character).
std::vector<size_t> char_index_of_bytes(const std::string& s) {
  std::vector<size_t> out(s.size() + 1, 0);
  size_t starts = 0;  // character starts seen so far
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++starts;
    out[i] = starts - 1;
  }
  out[s.size()] = starts;
  return out;
}

TEST(TokenOffsets, MatchPythonTokenizers) {
  const json doc = read_json(test::testdata_dir() + "/chat_masks/token_offsets.json");
  std::map<std::string, std::unique_ptr<Tokenizer>> toks;
  int checked = 0, refused = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["tokenizer"];
    auto& tok = toks[name];
    if (!tok) {
      auto r = Tokenizer::from_file(test::testdata_dir() + "/" + name);
      ASSERT_TRUE(r.ok()) << r.status().message();
      tok = std::move(r).value();
    }
    const std::string text = c["text"];
    const bool special = c["add_special_tokens"];
    SCOPED_TRACE(name + " special=" + std::to_string(special) + " text=" + json(text).dump());
    auto r = tok->encode_with_offsets(text, special);
    if (c["kiln_refuses"].get<bool>()) {
      ASSERT_FALSE(r.ok()) << "kiln tracked a composing normalization it should refuse";
      EXPECT_NE(r.status().message().find("normalize the text to"), std::string::npos) << r.status().message();
      ++refused;
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().message();
    const EncodingWithOffsets& e = r.value();
    EXPECT_EQ(e.ids, c["ids"].get<std::vector<int32_t>>());
    auto plain = tok->encode(text, special);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(e.ids, plain.value()) << "encode_with_offsets must give encode()'s ids";
    ASSERT_EQ(e.offsets.size(), e.ids.size());
    const std::vector<size_t> chars = char_index_of_bytes(text);
    std::vector<std::vector<size_t>> got;
    for (const auto& o : e.offsets) {
      ASSERT_LE(o.begin, o.end);
      ASSERT_LE(o.end, text.size());
      got.push_back({chars[o.begin], chars[o.end]});
    }
    EXPECT_EQ(got, c["offsets"].get<std::vector<std::vector<size_t>>>());
    ++checked;
  }
  EXPECT_GT(checked, 900);
  EXPECT_GT(refused, 10);
}

TEST(TokenOffsets, TokenAtByteIsTheFirstTokenContainingIt) {
  const std::vector<TokenOffset> offs = {{0, 0}, {0, 3}, {3, 7}, {3, 7}, {8, 9}};
  EXPECT_EQ(token_at_byte(offs, 0), 1u);
  EXPECT_EQ(token_at_byte(offs, 2), 1u);
  EXPECT_EQ(token_at_byte(offs, 3), 2u);  // two tokens of one character: the first
  EXPECT_EQ(token_at_byte(offs, 7), std::nullopt);  // a byte no token covers
  EXPECT_EQ(token_at_byte(offs, 8), 4u);
  EXPECT_EQ(token_at_byte(offs, 9), std::nullopt);
}

TEST(TokenOffsets, InvalidUtf8IsAnError) {
  auto tok = Tokenizer::from_file(test::testdata_dir() + "/tokenizers/bytelevel-bpe.tokenizer.json");
  ASSERT_TRUE(tok.ok());
  auto r = tok.value()->encode_with_offsets("ab\xff", false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid UTF-8"), std::string::npos);
}

}  // namespace
}  // namespace kiln
