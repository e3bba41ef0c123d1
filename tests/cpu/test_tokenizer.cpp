// Tokenizer tests: every case of testdata/tokenizers/golden.json (from the Python tokenizers
// library) and testdata/tokenizers/more/cases.json (made by tests/reference/make_tokenizer_cases.py)
// must match exactly; round trips for byte-level BPE on random Unicode; the streaming decoder;
// errors that name what is wrong.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

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

std::string tok_dir() { return test::testdata_dir() + "/tokenizers"; }

std::unique_ptr<Tokenizer> load(const std::string& path) {
  auto r = Tokenizer::from_file(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

// Strict UTF-8 validation, written independently of the tokenizer's own helpers.
bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; }
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      unsigned char x = static_cast<unsigned char>(s[i + k]);
      if ((x & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (x & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// Checks every case of a cases file whose tokenizers live in `dir` as NAME.tokenizer.json.
void check_cases(const std::string& dir, const json& cases, int& checked) {
  std::map<std::string, std::unique_ptr<Tokenizer>> toks;
  for (const auto& c : cases) {
    std::string name = c["tokenizer"];
    if (!toks.count(name)) toks[name] = load(dir + "/" + name + ".tokenizer.json");
    const Tokenizer* tok = toks[name].get();
    ASSERT_NE(tok, nullptr) << name;
    std::string text = c["text"];
    auto plain = tok->encode(text, false);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    EXPECT_EQ(plain.value(), ids_of(c["ids"])) << name << ": " << text;
    auto special = tok->encode(text, true);
    ASSERT_TRUE(special.ok());
    EXPECT_EQ(special.value(), ids_of(c["ids_with_special"])) << name << ": " << text;
    auto decoded = tok->decode(ids_of(c["ids"]), false);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded.value(), c["decoded"].get<std::string>()) << name << ": " << text;
    if (c.contains("decoded_with_special")) {
      auto with = tok->decode(ids_of(c["ids_with_special"]), false);
      ASSERT_TRUE(with.ok());
      EXPECT_EQ(with.value(), c["decoded_with_special"].get<std::string>()) << name << ": " << text;
    }
    if (c.contains("decoded_skip_special")) {
      auto skipped = tok->decode(ids_of(c["ids_with_special"]), true);
      ASSERT_TRUE(skipped.ok());
      EXPECT_EQ(skipped.value(), c["decoded_skip_special"].get<std::string>()) << name << ": " << text;
    }
    ++checked;
  }
}

TEST(Tokenizer, GoldenCases) {
  json g = read_json(tok_dir() + "/golden.json");
  int checked = 0;
  check_cases(tok_dir(), g["cases"], checked);
  EXPECT_EQ(checked, static_cast<int>(g["cases"].size()));
}

TEST(Tokenizer, MoreCases) {
  json g = read_json(tok_dir() + "/more/cases.json");
  int checked = 0;
  check_cases(tok_dir() + "/more", g["cases"], checked);
  EXPECT_GT(checked, 100);
}

// The concatenated stream equals decode(), and every emitted piece is valid UTF-8.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  StreamingDecoder stream(tok, skip_special);
  std::string all;
  for (int32_t id : ids) {
    auto piece = stream.push(id);
    ASSERT_TRUE(piece.ok()) << piece.status().message();
    EXPECT_TRUE(is_valid_utf8(piece.value()));
    all += piece.value();
  }
  std::string rest = stream.finish();
  EXPECT_TRUE(is_valid_utf8(rest));
  all += rest;
  auto full = tok.decode(ids, skip_special);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(all, full.value());
}

TEST(Tokenizer, StreamingMatchesDecode) {
  json g = read_json(tok_dir() + "/golden.json");
  std::map<std::string, std::unique_ptr<Tokenizer>> toks;
  for (const auto& c : g["cases"]) {
    std::string name = c["tokenizer"];
    if (!toks.count(name)) toks[name] = load(tok_dir() + "/" + name + ".tokenizer.json");
    check_stream(*toks[name], ids_of(c["ids_with_special"]), false);
    check_stream(*toks[name], ids_of(c["ids_with_special"]), true);
  }
}

TEST(Tokenizer, StreamingHoldsBackSplitCharacters) {
  // sentencepiece-bpe has byte_fallback: an emoji it does not know becomes 4 <0xNN> tokens.
  auto tok = load(tok_dir() + "/sentencepiece-bpe.tokenizer.json");
  ASSERT_NE(tok, nullptr);
  auto ids = tok->encode("a \xF0\x9F\xA6\x96 b", false);  // U+1F996
  ASSERT_TRUE(ids.ok());
  StreamingDecoder stream(*tok, false);
  std::vector<std::string> pieces;
  for (int32_t id : ids.value()) pieces.push_back(stream.push(id).value());
  for (const auto& p : pieces) EXPECT_TRUE(is_valid_utf8(p)) << p;
  EXPECT_EQ(stream.finish(), "");
  std::string all;
  for (const auto& p : pieces) all += p;
  EXPECT_EQ(all, "a \xF0\x9F\xA6\x96 b");
}

// Random strings over a mix of scripts, emoji, combining marks, whitespace and ASCII.
std::string random_unicode(std::mt19937& rng, size_t max_chars) {
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x24F}, {0x300, 0x36F}, {0x370, 0x3FF}, {0x400, 0x4FF},
      {0x590, 0x6FF}, {0x900, 0x97F}, {0x3040, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},
      {0x1F300, 0x1F6FF}, {0x1F900, 0x1F9FF}, {0x200B, 0x200D}, {0xFE00, 0xFE0F}, {0x10000, 0x10FFFF}};
  std::uniform_int_distribution<size_t> len(0, max_chars), pick(0, std::size(kRanges) - 1);
  std::string s;
  size_t n = len(rng);
  for (size_t k = 0; k < n; ++k) {
    auto [lo, hi] = kRanges[pick(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) s.push_back(static_cast<char>(cp));
    else if (cp < 0x800) { s.push_back(static_cast<char>(0xC0 | (cp >> 6))); s.push_back(static_cast<char>(0x80 | (cp & 0x3F))); }
    else if (cp < 0x10000) {
      s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return s;
}

TEST(Tokenizer, ByteLevelRoundTripRandomUnicode) {
  std::vector<std::string> paths = {tok_dir() + "/bytelevel-bpe.tokenizer.json"};
  for (const char* more : {"llama3-ignore-merges"}) {
    std::string p = tok_dir() + "/more/" + more + ".tokenizer.json";
    if (std::ifstream(p).good()) paths.push_back(p);
  }
  std::mt19937 rng(1234);
  for (const auto& path : paths) {
    auto tok = load(path);
    ASSERT_NE(tok, nullptr);
    for (int k = 0; k < 400; ++k) {
      std::string s = random_unicode(rng, 40);
      auto ids = tok->encode(s, false);
      ASSERT_TRUE(ids.ok());
      auto back = tok->decode(ids.value(), false);
      ASSERT_TRUE(back.ok());
      ASSERT_EQ(back.value(), s) << path;
      check_stream(*tok, ids.value(), false);
    }
  }
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  auto tok = load(tok_dir() + "/bytelevel-bpe.tokenizer.json");
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int k = 0; k < 200; ++k) texts.push_back(random_unicode(rng, 60));
  std::vector<std::vector<int32_t>> expected;
  for (const auto& t : texts) expected.push_back(tok->encode(t, true).value());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&] {
      for (size_t k = 0; k < texts.size(); ++k)
        if (tok->encode(texts[k], true).value() != expected[k]) ++mismatches;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Tokenizer, Accessors) {
  auto tok = load(tok_dir() + "/bytelevel-bpe.tokenizer.json");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 3000);
  EXPECT_EQ(tok->token_to_id("<|begin_of_text|>"), 0);
  EXPECT_EQ(tok->id_to_token(0), "<|begin_of_text|>");
  EXPECT_TRUE(tok->is_special(0));
  EXPECT_FALSE(tok->is_special(100));
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
  EXPECT_FALSE(tok->id_to_token(-1).has_value());
  EXPECT_FALSE(tok->id_to_token(3000).has_value());
}

// ---- errors ----

json small_bpe() {
  json j = read_json(tok_dir() + "/bytelevel-bpe.tokenizer.json");
  return j;
}

void expect_load_error(const json& j, const std::string& needle) {
  auto r = Tokenizer::from_json_text(j.dump(), "my/tokenizer.json");
  ASSERT_FALSE(r.ok()) << "expected an error containing " << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("my/tokenizer.json"), std::string::npos) << r.status().message();
}

TEST(TokenizerErrors, UnknownComponentTypesAreNamed) {
  json j = small_bpe();
  j["normalizer"] = {{"type", "FancyNorm"}};
  expect_load_error(j, "FancyNorm");
  j = small_bpe();
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "MyPre"}}})}};
  expect_load_error(j, "MyPre");
  j = small_bpe();
  j["model"]["type"] = "Unigram";
  expect_load_error(j, "Unigram");
  j = small_bpe();
  j["decoder"] = {{"type", "CTCx"}};
  expect_load_error(j, "CTCx");
  j = small_bpe();
  j["post_processor"] = {{"type", "WeirdProcessing"}};
  expect_load_error(j, "WeirdProcessing");
}

TEST(TokenizerErrors, MalformedJsonAndMissingModel) {
  auto r = Tokenizer::from_json_text("{ not json", "bad/tokenizer.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad/tokenizer.json"), std::string::npos);
  json j = small_bpe();
  j.erase("model");
  expect_load_error(j, "model");
  // Normalizers nested 50,000 Sequences deep (the components are built by recursion, which ended
  // the process): an error naming the file. The text is built as text (json would recurse too).
  std::string text = small_bpe().dump();
  std::string deep = "{\"type\": \"Lowercase\"}";
  std::string open, close;
  for (int i = 0; i < 50000; ++i) open += "{\"type\": \"Sequence\", \"normalizers\": [", close += "]}";
  text = text.substr(0, text.rfind('}')) + ", \"normalizer\": " + open + deep + close + "}";
  auto deep_r = Tokenizer::from_json_text(text, "deep/tokenizer.json");
  ASSERT_FALSE(deep_r.ok());
  EXPECT_NE(deep_r.status().message().find("deep/tokenizer.json"), std::string::npos) << deep_r.status().message();
  EXPECT_NE(deep_r.status().message().find("nests deeper than 64 levels"), std::string::npos) << deep_r.status().message();
  auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(TokenizerErrors, DecodeOutOfRangeAndInvalidUtf8) {
  auto tok = load(tok_dir() + "/bytelevel-bpe.tokenizer.json");
  ASSERT_NE(tok, nullptr);
  auto d = tok->decode({5, 3000}, false);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("3000"), std::string::npos);
  auto neg = tok->decode({-2}, false);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("-2"), std::string::npos);
  for (std::string bad : {std::string("abc\xFF"), std::string("\xC3"), std::string("\xED\xA0\x80"),
                          std::string("\xC0\xAF")}) {
    auto e = tok->encode(bad, false);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("UTF-8"), std::string::npos);
  }
  StreamingDecoder stream(*tok, false);
  EXPECT_FALSE(stream.push(99999).ok());
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Values of the wrong type anywhere in tokenizer.json are an error naming the file and the key's
// path, never an escaping exception (an added token's "special": "yes", a post-processor's ids).
TEST(Tokenizer, WrongTypesAreErrorsNamingTheKey) {
  std::ifstream in(test::testdata_dir() + "/chat_templates/models/chatml/tokenizer.json");
  const nlohmann::json original = nlohmann::json::parse(in);
  auto expect_error = [](const nlohmann::json& j, const std::string& mention) {
    auto t = Tokenizer::from_json_text(j.dump(), "bad/tokenizer.json");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("bad/tokenizer.json"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(mention), std::string::npos) << t.status().message();
  };
  nlohmann::json j = original;
  j["added_tokens"][0]["special"] = "yes";
  expect_error(j, "/added_tokens/0/special");
  j = original;
  auto& specials = j["post_processor"]["special_tokens"];
  specials[specials.begin().key()]["ids"] = {"x"};
  expect_error(j, "type must be number");
  j = original;
  j["model"]["vocab"] = 5;
  expect_error(j, "");
  // Ids index tables: an absurd one is refused, not allocated (the fuzzer found 666666666666190).
  j = original;
  j["added_tokens"][0]["id"] = 666666666666190LL;
  expect_error(j, "ids go from 0 to 16777215");
  j = original;
  j["model"]["vocab"][j["model"]["vocab"].begin().key()] = 2000000000;
  expect_error(j, "has no valid id (0 to 16777215)");
}

}  // namespace
}  // namespace kiln
