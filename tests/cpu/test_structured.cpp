// Structured outputs (src/infer/structured): the JSON-schema matcher against Python's json and
// jsonschema (testdata/structured/cases.json, tests/reference/make_structured_cases.py), schema
// compilation errors, token bytes against decode, and token masks against a brute-force check of
// every token.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "infer/structured/json_matcher.h"
#include "infer/structured/token_masks.h"
#include "model/tokenizer.h"
#include "test_util.h"

namespace kiln::structured {
namespace {

using nlohmann::json;

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

json load_cases() { return json::parse(test::read_file(test::testdata_dir() + "/structured/cases.json")); }

std::shared_ptr<const JsonSchema> compile_ok(const json& schema) {
  Result<std::shared_ptr<const JsonSchema>> s = JsonSchema::compile(schema);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : JsonSchema::any_object();
}

TEST(StructuredMatcher, AgreesWithJsonschemaOnEveryText) {
  const json cases = load_cases();
  int checked = 0;
  for (const json& c : cases["cases"]) {
    std::shared_ptr<const JsonSchema> schema = compile_ok(c["schema"]);
    for (const json& t : c["texts"]) {
      const std::string text = from_hex(t["hex"]);
      JsonMatcher m(schema);
      const bool accepted = m.advance(text) && m.can_end();
      EXPECT_EQ(accepted, t["valid"].get<bool>()) << "schema " << c["schema"].dump() << "\ntext: " << text;
      ++checked;
    }
  }
  EXPECT_GT(checked, 2000);
}

TEST(StructuredMatcher, ValidTextsAreTakenByteByByteAndFinishAfterTheirLastByte) {
  const json cases = load_cases();
  for (const json& c : cases["cases"]) {
    std::shared_ptr<const JsonSchema> schema = compile_ok(c["schema"]);
    for (const json& t : c["texts"]) {
      if (!t["valid"].get<bool>()) continue;
      const std::string text = from_hex(t["hex"]);
      JsonMatcher m(schema);
      for (size_t i = 0; i < text.size(); ++i) {
        ASSERT_FALSE(m.finished()) << text << " at " << i;
        ASSERT_TRUE(m.advance(text.substr(i, 1))) << text << " at " << i;
      }
      EXPECT_TRUE(m.can_end()) << text;
      // Nothing may follow a closed value; a number (or a literal ending in a digit) may go on.
      const char last = text.back();
      if (last == '}' || last == ']' || last == '"' || last == 'e' || last == 'l') {
        EXPECT_TRUE(m.finished()) << text;
      }
      EXPECT_FALSE(m.advance(" ")) << text;
    }
  }
}

TEST(StructuredMatcher, RejectedBytesLeaveTheStateAsItWas) {
  std::shared_ptr<const JsonSchema> schema = compile_ok(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
  JsonMatcher m(schema);
  ASSERT_TRUE(m.advance("{\"a\":1"));
  EXPECT_FALSE(m.advance("x"));
  EXPECT_FALSE(m.advance("2.5"));  // an integer takes no fraction
  EXPECT_TRUE(m.advance("2}"));
  EXPECT_TRUE(m.finished());
}

TEST(StructuredSchema, RefusesWhatItCannotEnforceAndNamesIt) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"type": "string", "pattern": "^a"})", "'pattern'"},
      {R"({"type": "integer", "minimum": 0})", "'minimum'"},
      {R"({"type": "object", "properties": {"x": {"type": "array", "uniqueItems": true}}})", "/properties/x"},
      {R"({"$ref": "#/$defs/missing"})", "points at nothing"},
      {R"({"$ref": "http://example.com/s.json"})", "only references into this schema"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b'"},
      {R"({"type": "strin"})", "unknown type 'strin'"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "'allOf' of more than one"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "'minItems' exceeds"},
      {R"(3)", "must be an object or a boolean"},
  };
  for (const auto& [text, fragment] : bad) {
    Result<std::shared_ptr<const JsonSchema>> s = JsonSchema::compile(json::parse(text));
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.status().message().find(fragment), std::string::npos) << text << " -> " << s.status().message();
  }
  // Annotations pass, and a recursive schema compiles to a finite graph.
  EXPECT_TRUE(JsonSchema::compile(json::parse(R"({"title": "t", "description": "d", "type": "string", "format": "date"})")).ok());
  EXPECT_TRUE(JsonSchema::compile(json::parse(R"({"$defs": {"l": {"type": "array", "items": {"$ref": "#/$defs/l"}}}, "$ref": "#/$defs/l"})")).ok());
}

// Schemas that would send the compiler or the matcher into unbounded recursion or work are refused
// or bounded (each of the first five ended the process: kiln serve died on a one-line request), and
// large enums stay one parse.
TEST(StructuredSchema, SelfReferenceDepthAndAmbiguityAreBounded) {
  // Referring to itself before any value begins: no JSON text follows it (Python's jsonschema
  // recurses until RecursionError on these).
  for (const char* text : {R"({"$ref": "#"})", R"({"allOf": [{"$ref": "#"}]})", R"({"anyOf": [{"$ref": "#"}, {"type": "integer"}]})",
                           R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
                           R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"oneOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})"}) {
    Result<std::shared_ptr<const JsonSchema>> r = JsonSchema::compile(json::parse(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find("refers to itself"), std::string::npos) << text << " -> " << r.status().message();
  }
  // Nesting, and a chain of 10,000 definitions each referring to the next.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(100000, '}');
  Result<std::shared_ptr<const JsonSchema>> r = JsonSchema::compile(json::parse(deep));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nests deeper than 128 levels"), std::string::npos) << r.status().message();
  json chain = {{"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 10000; ++i) chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d10000"] = {{"type", "integer"}};
  r = JsonSchema::compile(chain);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("go deeper than 128 levels"), std::string::npos) << r.status().message();
  // 60 levels of two alternatives that both refer to the next level: 2^60 paths to one array
  // schema, one stack.
  json dag = {{"$ref", "#/$defs/a0"}};
  for (int i = 0; i < 60; ++i) {
    const std::string next = "#/$defs/a" + std::to_string(i + 1);
    dag["$defs"]["a" + std::to_string(i)] = {{"anyOf", {{{"$ref", next}}, {{"$ref", next}}}}};
  }
  dag["$defs"]["a60"] = {{"type", "array"}, {"items", {{"type", "integer"}}}};
  JsonMatcher shared(compile_ok(dag));
  ASSERT_TRUE(shared.advance("[1, 2]"));
  EXPECT_TRUE(shared.finished());
  EXPECT_EQ(shared.stacks().size(), 1u);
  // Two identical alternatives of a recursive array double the parses at every '[': capped, and the
  // text still goes on and ends as the schema says.
  JsonMatcher ambiguous(compile_ok(json::parse(
      R"({"$defs": {"n": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/n"}}, {"type": "array", "items": {"$ref": "#/$defs/n"}}, {"type": "integer"}]}}, "$ref": "#/$defs/n"})")));
  ASSERT_TRUE(ambiguous.advance(std::string(40, '[')));
  EXPECT_LE(ambiguous.stacks().size(), kMaxStacks);
  EXPECT_FALSE(ambiguous.advance("\"s\""));
  ASSERT_TRUE(ambiguous.advance("7" + std::string(40, ']')));
  EXPECT_TRUE(ambiguous.can_end());
  // A key of 200,000 bytes in an object that allows other keys: its text is dropped once it names no
  // declared property (it was copied with the stack at every byte), and declared ones still count.
  JsonMatcher long_key(compile_ok(json::parse(
      R"({"type": "object", "properties": {"kk": {"type": "integer"}}, "required": ["kk"], "additionalProperties": {"type": "string"}})")));
  ASSERT_TRUE(long_key.advance("{\"" + std::string(200000, 'k') + "\": \"v\""));
  for (const Stack& st : long_key.stacks())
    for (const Frame& f : st) EXPECT_LT(f.key.size(), 3u);
  EXPECT_FALSE(long_key.advance("}"));  // "kk" is required
  ASSERT_TRUE(long_key.advance(", \"kk\": 5}"));
  EXPECT_TRUE(long_key.finished());
  // An enum of 2,000 strings (all begin with '"'; many share longer beginnings) and numbers that
  // extend each other: one stack for all the candidates, and every member, and nothing else, whole.
  json values = json::array();
  for (int i = 0; i < 2000; ++i) values.push_back("v" + std::to_string(i * 7919 % 100000));
  for (int v : {1, 12, 120, 3}) values.push_back(v);
  const auto big_enum = compile_ok(json{{"enum", values}});
  JsonMatcher opened(big_enum);
  ASSERT_TRUE(opened.advance("\"v1"));
  EXPECT_EQ(opened.stacks().size(), 1u);
  for (const json& v : values) {
    JsonMatcher m(big_enum);
    ASSERT_TRUE(m.advance(v.dump())) << v.dump();
    EXPECT_TRUE(m.can_end()) << v.dump();
  }
  for (const std::string bad : {"\"v\"", "\"v100000\"", "121", "2", "\"v1"}) {
    JsonMatcher m(big_enum);
    EXPECT_FALSE(m.advance(bad) && m.can_end()) << bad;
  }
  JsonMatcher repeated(compile_ok(json::parse(R"({"type": "object", "properties": {"kk": {"type": "integer"}}, "additionalProperties": {"type": "string"}})")));
  EXPECT_FALSE(repeated.advance(R"({"kk": 1, "kk": "x")"));  // a declared key at most once, not as another key
  EXPECT_TRUE(repeated.advance(R"({"kk": 1, "k": "x", "kkk": "y"})"));
}

// The bytes of a sequence's tokens joined equal its decoded text (where that text is whole UTF-8).
TEST(StructuredTokens, TokenBytesJoinToTheDecodedText) {
  for (const char* name : {"bytelevel-bpe", "sentencepiece-bpe"}) {
    Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_file(test::testdata_dir() + "/tokenizers/" + name + ".tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    std::mt19937 rng(7);
    int compared = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids;
      std::string joined;
      for (int k = 0; k < 6; ++k) {
        const int32_t id = static_cast<int32_t>(rng() % (*tok)->vocab_size());
        if ((*tok)->is_special(id) || !(*tok)->token_bytes(id)) continue;
        ids.push_back(id);
        joined += *(*tok)->token_bytes(id);
      }
      Result<std::string> text = (*tok)->decode(ids, false);
      ASSERT_TRUE(text.ok());
      if (text->find("\xEF\xBF\xBD") != std::string::npos) continue;  // a character cut by the sample
      // sentencepiece-bpe's decoder strips one leading space of the whole text.
      if (std::string(name) == "sentencepiece-bpe" && !joined.empty() && joined[0] == ' ') joined.erase(0, 1);
      EXPECT_EQ(joined, *text);
      ++compared;
    }
    EXPECT_GT(compared, 100) << name;
  }
}

// Every token's verdict by advancing a copy of the matcher over its bytes.
std::vector<uint32_t> brute_force_mask(const JsonMatcher& m, const Tokenizer& tok, int32_t vocab, const std::vector<int32_t>& end_ids) {
  std::vector<uint32_t> mask(static_cast<size_t>((vocab + 31) / 32), 0);
  for (int32_t t = 0; t < std::min(vocab, tok.vocab_size()); ++t) {
    if (tok.is_special(t)) continue;
    const std::optional<std::string> bytes = tok.token_bytes(t);
    if (!bytes || bytes->empty()) continue;
    JsonMatcher copy = m;
    if (copy.advance(*bytes)) mask[t >> 5] |= uint32_t(1) << (t & 31);
  }
  if (m.can_end())
    for (int32_t t : end_ids) mask[t >> 5] |= uint32_t(1) << (t & 31);
  return mask;
}

TEST(StructuredTokens, MasksEqualTheBruteForceVerdictOfEveryToken) {
  const json cases = load_cases();
  for (const char* name : {"bytelevel-bpe", "sentencepiece-bpe"}) {
    Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::from_file(test::testdata_dir() + "/tokenizers/" + name + ".tokenizer.json");
    ASSERT_TRUE(tok.ok());
    const int32_t vocab = (*tok)->vocab_size() + 5;  // a model vocabulary wider than the tokenizer's
    TokenMasker masker(TokenVocabulary::build(**tok, vocab), 64);  // a small cache: evictions too
    const std::vector<int32_t> end_ids = {1, vocab - 1};
    std::vector<uint32_t> mask(static_cast<size_t>(masker.vocabulary().words()));
    int states = 0;
    for (const json& c : cases["cases"]) {
      std::shared_ptr<const JsonSchema> schema = compile_ok(c["schema"]);
      int texts = 0;
      for (const json& t : c["texts"]) {
        if (!t["valid"].get<bool>() || ++texts > 3) continue;
        const std::string text = from_hex(t["hex"]);
        JsonMatcher m(schema);
        for (size_t i = 0; i <= text.size(); ++i) {
          masker.allowed(m, end_ids, mask.data());
          const std::vector<uint32_t> expected = brute_force_mask(m, **tok, vocab, end_ids);
          ASSERT_EQ(mask, expected) << name << " schema " << c["schema"].dump() << " after '" << text.substr(0, i) << "'";
          ++states;
          if (i < text.size()) {
            ASSERT_TRUE(m.advance(text.substr(i, 1)));
          }
        }
      }
    }
    EXPECT_GT(states, 500) << name;
    EXPECT_GT(masker.cache_hits(), 0) << name;
  }
}

}  // namespace
}  // namespace kiln::structured
