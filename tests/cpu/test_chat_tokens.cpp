// tokenize_chat_for_training against transformers: every case of testdata/chat_masks/
// assistant_masks.json (made by tests/reference/make_assistant_masks.py) must give transformers'
// rendered text, generation spans, input_ids and assistant_masks exactly, by the generation-block
// method on the template with {% generation %} blocks, and by the prefix method on its twin without
// them; the {% generation %} tag itself (scope, tracking, nesting); transformers' span -> token
// rule at its edges; and the errors (no assistant message, bad messages, templates that are not
// prefix-consistent, blocks that cover nothing).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "model/chat_tokens.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::read_file;
using Json = nlohmann::ordered_json;
using Spans = std::vector<std::pair<size_t, size_t>>;

std::string data(const std::string& rel) { return test::testdata_dir() + "/" + rel; }

ChatTemplate parse_template(const std::string& rel) {
  auto t = ChatTemplate::parse(read_file(data(rel)), rel);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

ChatTemplate parse_text(const std::string& source) {
  auto t = ChatTemplate::parse(source, "test");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

const Tokenizer& tokenizer(const std::string& rel) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[rel];
  if (!t) {
    auto r = Tokenizer::from_file(data(rel));
    EXPECT_TRUE(r.ok()) << r.status().message();
    t = std::move(r).value();
  }
  return *t;
}

ChatTemplateInputs inputs_of(const Json& j) {
  ChatTemplateInputs in;
  in.messages = j["messages"];
  in.tools = j["tools"];
  in.add_generation_prompt = j["add_generation_prompt"];
  in.bos_token = j["bos_token"];
  in.eos_token = j["eos_token"];
  return in;
}

// Byte spans of `text` as the character spans Python gives.
Spans to_chars(const std::string& text, const Spans& bytes) {
  auto chars_before = [&](size_t b) {
    size_t n = 0;
    for (size_t i = 0; i < b; ++i) n += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
    return n;
  };
  Spans out;
  for (auto [a, b] : bytes) out.emplace_back(chars_before(a), chars_before(b));
  return out;
}

Json cases() { return Json::parse(read_file(data("chat_masks/assistant_masks.json")))["cases"]; }

TEST(ChatTokens, GenerationBlocksMatchTransformers) {
  int n = 0;
  for (const auto& c : cases()) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ChatTemplate tmpl = parse_template(c["template"]);
    ASSERT_TRUE(tmpl.has_generation_blocks());
    auto r = tokenize_chat_for_training(tokenizer(c["tokenizer"]), tmpl, inputs_of(c["inputs"]));
    ASSERT_TRUE(r.ok()) << r.status().message();
    const ChatTokens& t = r.value();
    EXPECT_EQ(t.method, AssistantMaskMethod::GenerationBlocks);
    EXPECT_EQ(t.text, c["text"].get<std::string>());
    EXPECT_EQ(to_chars(t.text, t.assistant_spans), c["generation_spans"].get<Spans>());
    EXPECT_EQ(t.ids, c["input_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(t.assistant_mask, c["assistant_masks"].get<std::vector<uint8_t>>());
    ++n;
  }
  EXPECT_EQ(n, 12);
}

TEST(ChatTokens, PrefixRendersOnThePlainTemplateGiveTheSameMasks) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const ChatTemplate plain = parse_template(c["plain_template"]);
    ASSERT_FALSE(plain.has_generation_blocks());
    auto r = tokenize_chat_for_training(tokenizer(c["tokenizer"]), plain, inputs_of(c["inputs"]));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r.value().method, AssistantMaskMethod::PrefixRenders);
    EXPECT_EQ(r.value().text, c["text"].get<std::string>());
    EXPECT_EQ(to_chars(r.value().text, r.value().assistant_spans), c["generation_spans"].get<Spans>());
    EXPECT_EQ(r.value().ids, c["input_ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(r.value().assistant_mask, c["assistant_masks"].get<std::vector<uint8_t>>());
    // The generation template is prefix-consistent too: both methods agree on it.
    auto g = tokenize_chat_for_training(tokenizer(c["tokenizer"]), parse_template(c["template"]), inputs_of(c["inputs"]),
                                        AssistantMaskMethod::PrefixRenders);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g.value().assistant_mask, c["assistant_masks"].get<std::vector<uint8_t>>());
  }
}

TEST(ChatTemplateGeneration, RendersItsBodyInItsOwnScopeAndTracksSpans) {
  // As jinja2's call block under transformers: a set inside does not leak out.
  const ChatTemplate t = parse_text("{% set x = 1 %}{% generation %}{% set x = 2 %}[{{ x }}]{% endgeneration %}{{ x }}"
                                    "{% for m in messages %}<{% generation %}{{ m }}{% endgeneration %}>{% endfor %}");
  const Json ctx = {{"messages", {"a", "bé"}}};
  auto plain = t.render(ctx);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain.value(), "[2]1<a><bé>");
  auto tracked = t.render_tracked(ctx);
  ASSERT_TRUE(tracked.ok()) << tracked.status().message();
  EXPECT_EQ(tracked.value().text, plain.value());
  EXPECT_EQ(tracked.value().generation_spans, (Spans{{0, 3}, {5, 6}, {8, 11}}));
  // A template without the tag: no spans, same text.
  const ChatTemplate none = parse_text("{% for m in messages %}{{ m }}{% endfor %}");
  EXPECT_FALSE(none.has_generation_blocks());
  auto n = none.render_tracked(ctx);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value().text, "abé");
  EXPECT_TRUE(n.value().generation_spans.empty());
}

TEST(ChatTemplateGeneration, NestedBlocksAreKeptOnlyWhereTheyLandWhereTransformersSaysTheyDo) {
  // A macro whose output starts with the block, called on its own: transformers' start is right.
  const ChatTemplate ok = parse_text("{% macro m(x) %}{% generation %}{{ x }}{% endgeneration %}!{% endmacro %}<{{ m('ab') }}>");
  auto r = ok.render_tracked(Json::object());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value().text, "<ab!>");
  EXPECT_EQ(r.value().generation_spans, (Spans{{1, 3}}));
  // A set block that renders text before the block: the recorded start would be wrong.
  const ChatTemplate bad = parse_text("{% set s %}xyz{% generation %}ab{% endgeneration %}{% endset %}<{{ s }}>");
  auto b = bad.render_tracked(Json::object());
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("line 1"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("top level"), std::string::npos) << b.status().message();
  auto plain = bad.render(Json::object());  // an untracked render just renders
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain.value(), "<xyzab>");
}

TEST(ChatTokens, SpanToTokenRuleAtTheEdges) {
  const std::vector<TokenOffset> offs = {{0, 2}, {2, 5}, {5, 5}, {6, 9}, {9, 12}};
  EXPECT_EQ(assistant_mask_from_spans(offs, {{2, 5}}), (std::vector<uint8_t>{0, 1, 0, 0, 0}));
  EXPECT_EQ(assistant_mask_from_spans(offs, {{3, 7}}), (std::vector<uint8_t>{0, 1, 1, 1, 0}));  // partial tokens count
  // The end falls where no token is (byte 5): to the end of the sequence, as transformers does.
  EXPECT_EQ(assistant_mask_from_spans(offs, {{2, 6}}), (std::vector<uint8_t>{0, 1, 1, 1, 1}));
  // A start in no token stops this span and every later one.
  EXPECT_EQ(assistant_mask_from_spans(offs, {{2, 3}, {5, 7}, {9, 12}}), (std::vector<uint8_t>{0, 1, 0, 0, 0}));
  // An empty span marks nothing unless one token holds both sides of it.
  EXPECT_EQ(assistant_mask_from_spans(offs, {{9, 9}}), (std::vector<uint8_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(assistant_mask_from_spans(offs, {{10, 10}}), (std::vector<uint8_t>{0, 0, 0, 0, 1}));
  // An end in token 0 reads as "no end" (Python's `if end_token`): to the end, also for an empty
  // span just after token 0.
  EXPECT_EQ(assistant_mask_from_spans(offs, {{0, 2}}), (std::vector<uint8_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(assistant_mask_from_spans(offs, {{2, 2}}), (std::vector<uint8_t>{0, 1, 1, 1, 1}));
}

TEST(ChatTokens, ErrorsSayWhatIsWrong) {
  const Tokenizer& tok = tokenizer("chat_templates/models/qwen2.5-instruct/tokenizer.json");
  const ChatTemplate gen = parse_template("chat_templates/qwen2.5-tools-generation.jinja");
  const ChatTemplate plain = parse_template("chat_templates/more/qwen2.5-tools.jinja");
  auto expect_error = [&](const ChatTemplate& t, const ChatTemplateInputs& in, const std::string& want,
                          AssistantMaskMethod m = AssistantMaskMethod::Auto) {
    auto r = tokenize_chat_for_training(tok, t, in, m);
    ASSERT_FALSE(r.ok()) << "expected an error containing '" << want << "'";
    SCOPED_TRACE(want);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  ChatTemplateInputs in;
  in.messages = Json::parse(R"([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])");
  expect_error(gen, in, "no assistant message");
  expect_error(plain, in, "no assistant message");
  in.messages = Json::array();
  expect_error(gen, in, "non-empty list");
  in.messages = Json::parse(R"([{"role": "user", "content": "hi"}, {"content": "no role"}])");
  expect_error(gen, in, "messages[1] is not an object with a string \"role\"");
  in.messages = Json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])");
  in.tools = "get_weather";
  expect_error(gen, in, "\"tools\" must be a list");
  in.tools = nullptr;
  expect_error(plain, in, "has no {% generation %} blocks", AssistantMaskMethod::GenerationBlocks);
  // Template errors name the render they came from.
  const ChatTemplate raises = parse_text(
      "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}{{ raise_exception('ends with assistant') }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  expect_error(raises, in, "rendering the conversation failed: ends with assistant");
  const ChatTemplate no_prompt = parse_text(
      "{% if add_generation_prompt %}{{ raise_exception('no prompts here') }}{% endif %}"
      "{% for m in messages %}{{ m.content }}{% endfor %}");
  expect_error(no_prompt, in, "rendering messages[0..1) with a generation prompt for the prefix method failed: no prompts here");
  // Generation blocks that cover nothing of this conversation, and an all-empty assistant output.
  const ChatTemplate only_tools = parse_text(
      "{% for m in messages %}{% if m.role == 'tool' %}{% generation %}{{ m.content }}{% endgeneration %}"
      "{% else %}{{ m.content }}{% endif %}{% endfor %}");
  expect_error(only_tools, in, "produced nothing for this conversation");
  in.messages = Json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}])");
  const ChatTemplate bare = parse_text("{% for m in messages %}{{ m.content }}{% endfor %}");
  expect_error(bare, in, "no token falls in the assistant output");
}

TEST(ChatTokens, Qwen3IsNotPrefixConsistent) {
  // Qwen3's template drops the reasoning of assistant turns before the last user message.
  const Tokenizer& tok = tokenizer("chat_templates/models/qwen2.5-instruct/tokenizer.json");
  const ChatTemplate qwen3 = parse_template("chat_templates/more/qwen3.jinja");
  ChatTemplateInputs in;
  in.messages = Json::parse(R"([
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Adding two and two."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "6", "reasoning_content": "Adding three and three."}])");
  auto r = tokenize_chat_for_training(tok, qwen3, in);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not prefix-consistent at messages[1] (assistant)"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("{% generation %}"), std::string::npos) << r.status().message();
  // One exchange is consistent: the mask covers the reasoning block, the answer and <|im_end|>\n.
  in.messages.erase(2);
  in.messages.erase(2);
  auto one = tokenize_chat_for_training(tok, qwen3, in);
  ASSERT_TRUE(one.ok()) << one.status().message();
  const auto [a, b] = one.value().assistant_spans.at(0);
  EXPECT_EQ(one.value().text.substr(a, b - a), "<think>\nAdding two and two.\n</think>\n\n4<|im_end|>\n");
}

}  // namespace
}  // namespace kiln
