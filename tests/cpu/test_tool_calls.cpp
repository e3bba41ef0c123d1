// Tests of serve/tool_calls.h: format names and detection (on the templates of
// testdata/chat_templates/more), each format's calls, malformed calls (content, never a crash),
// streaming against the one-shot parse for every split point and random splits, held-back markers,
// forced prefixes and tool-call ids. Expected values are written by hand from the format rules.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/json_scanner.h"
#include "serve/tool_calls.h"

namespace kiln::serve {
namespace {

using F = ToolCallFormat;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// What a streaming client sees, rebuilt from the deltas, checked against the parser's own record.
ParsedToolCalls stream(F f, const std::string& prefix, const std::vector<std::string>& pieces) {
  ToolCallParser p(f, prefix);
  ParsedToolCalls s;
  auto take = [&](const ToolCallParser::Output& o) {
    s.content += o.content;
    for (size_t i = 0; i < o.calls.size(); ++i) {
      const ToolCallDelta& d = o.calls[i];
      if (i > 0) {
        EXPECT_LT(o.calls[i - 1].index, d.index) << "one delta per call and output, in order";
      }
      if (d.index == static_cast<int32_t>(s.calls.size())) {
        EXPECT_FALSE(d.name.empty()) << "a call's first delta names it";
        s.calls.push_back({d.name, d.arguments, false});
      } else {
        EXPECT_EQ(d.index + 1, static_cast<int32_t>(s.calls.size())) << "deltas only for the newest call";
        EXPECT_TRUE(d.name.empty()) << "later deltas carry arguments only";
        if (!s.calls.empty()) s.calls.back().arguments += d.arguments;
      }
    }
  };
  for (const std::string& piece : pieces) take(p.feed(piece));
  take(p.finish());
  EXPECT_EQ(s.content, p.content());
  EXPECT_EQ(s.calls.size(), p.calls().size());
  for (size_t i = 0; i < s.calls.size() && i < p.calls().size(); ++i) {
    EXPECT_EQ(s.calls[i].name, p.calls()[i].name);
    EXPECT_EQ(s.calls[i].arguments, p.calls()[i].arguments);
    s.calls[i].complete = p.calls()[i].complete;
  }
  return s;
}

void expect_same(const ParsedToolCalls& want, const ParsedToolCalls& got, const std::string& what) {
  EXPECT_EQ(want.content, got.content) << what;
  ASSERT_EQ(want.calls.size(), got.calls.size()) << what;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(want.calls[i].name, got.calls[i].name) << what << " call " << i;
    EXPECT_EQ(want.calls[i].arguments, got.calls[i].arguments) << what << " call " << i;
    EXPECT_EQ(want.calls[i].complete, got.calls[i].complete) << what << " call " << i;
  }
}

struct Want {
  std::string content;
  std::vector<ToolCall> calls;
};

// The one-shot parse must give `want`; complete arguments must be JSON objects; and feeding the
// text in two pieces at every split point, byte by byte, or in random pieces must agree.
void check(F f, const std::string& text, const Want& want, const std::string& prefix = "") {
  const std::string what = std::string(tool_call_format_name(f)) + " text: " + text;
  ParsedToolCalls one = parse_tool_calls(f, text, prefix);
  expect_same({want.content, want.calls}, one, what);
  for (const ToolCall& c : one.calls)
    if (c.complete) {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(c.arguments, nullptr, false);
      EXPECT_TRUE(j.is_object()) << what << ": " << c.arguments;
    }
  for (size_t k = 0; k <= text.size(); ++k)
    expect_same(one, stream(f, prefix, {text.substr(0, k), text.substr(k)}), what + " split at " + std::to_string(k));
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(one, stream(f, prefix, bytes), what + " byte by byte");
  std::mt19937 rng(1234);
  for (int r = 0; r < 50; ++r) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t n = std::uniform_int_distribution<size_t>(0, 7)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    expect_same(one, stream(f, prefix, pieces), what + " random pieces " + std::to_string(r));
  }
}

TEST(ToolCallFormat, NamesRoundTrip) {
  for (F f : {F::none, F::hermes, F::llama3_json, F::mistral}) {
    Result<F> r = parse_tool_call_format(tool_call_format_name(f));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, f);
  }
  EXPECT_STREQ(tool_call_format_name(F::llama3_json), "llama3_json");
  EXPECT_FALSE(parse_tool_call_format("auto").ok());
  EXPECT_FALSE(parse_tool_call_format("Hermes").ok());
  EXPECT_EQ(parse_tool_call_format("qwen").status().code(), StatusCode::invalid_argument);
}

TEST(ToolCallDetect, TemplateFiles) {
  const std::string dir = std::string(KILN_TESTDATA) + "/chat_templates/more/";
  auto none = [](std::string_view) { return false; };
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "qwen2.5-tools.jinja"), none), F::hermes);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "qwen3.jinja"), none), F::hermes);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "llama-3.1-tools.jinja"), none), F::llama3_json);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "mistral-v3-tools.jinja"), none), F::mistral);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "mistral-v7-tekken.jinja"), none), F::mistral);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "chatml.jinja"), none), F::none);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "gemma-3.jinja"), none), F::none);
  EXPECT_EQ(detect_tool_call_format(read_text(dir + "phi-4.jinja"), none), F::none);
  // Which Mistral form: v7-tekken renders name[ARGS]{...}, v3 a JSON list.
  EXPECT_TRUE(mistral_uses_args_form(read_text(dir + "mistral-v7-tekken.jinja")));
  EXPECT_FALSE(mistral_uses_args_form(read_text(dir + "mistral-v3-tools.jinja")));
}

TEST(ToolCallDetect, RulesAndVocabulary) {
  const std::string chatml = read_text(std::string(KILN_TESTDATA) + "/chat_templates/more/chatml.jinja");
  auto has = [](std::string want) { return [want](std::string_view t) { return t == want; }; };
  EXPECT_EQ(detect_tool_call_format(chatml, has("<tool_call>")), F::hermes);
  EXPECT_EQ(detect_tool_call_format(chatml, has("[TOOL_CALLS]")), F::mistral);
  EXPECT_EQ(detect_tool_call_format(chatml, has("<|python_tag|>")), F::none);  // Llama: the template decides
  EXPECT_EQ(detect_tool_call_format(chatml, nullptr), F::none);
  EXPECT_EQ(detect_tool_call_format("{{ '<|eom_id|>' }}", nullptr), F::llama3_json);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>{% if tools %}{% endif %}", nullptr), F::llama3_json);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>{{ messages }}", nullptr), F::none);
  EXPECT_EQ(detect_tool_call_format("[TOOL_CALLS] <tool_call>", nullptr), F::hermes);  // rule 1 first
}

TEST(ToolCallHermes, Calls) {
  check(F::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
  check(F::hermes, "Let me check.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        {"Let me check.", {{"f", "{}"}}});
  check(F::hermes,
        "<think>\nThe user wants two cities.\n</think>\n\n"
        "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"w\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
        {"<think>\nThe user wants two cities.\n</think>", {{"w", "{\"city\": \"Paris\"}"}, {"w", "{\"city\": \"Rome\"}"}}});
  // No whitespace at all, no closing tag, text after the calls.
  check(F::hermes, "<tool_call>{\"name\":\"a\",\"arguments\":{\"x\":1}}<tool_call>{\"name\":\"b\",\"arguments\":{}}",
        {"", {{"a", "{\"x\":1}"}, {"b", "{}"}}});
  check(F::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\nDone.", {"Done.", {{"a", "{}"}}});
  check(F::hermes, "No tools needed: 2 < 3 and {\"name\": \"x\"} is just text.",
        {"No tools needed: 2 < 3 and {\"name\": \"x\"} is just text.", {}});
}

TEST(ToolCallHermes, ArgumentText) {
  // Braces, quotes and escapes inside strings, nested containers, numbers, unicode raw and escaped.
  const std::string args = R"({"path": "a}b{c", "text": "say \"hi\" \\ {[", "n": {"list": [1, -2.5e3, 0.5E+2, true, false, null, {"k": "}"}]}, "u": "caf\u00e9 é ☃ \ud83d\ude00 😀"})";
  check(F::hermes, "<tool_call>\n{\"name\": \"write\", \"arguments\": " + args + "}\n</tool_call>", {"", {{"write", args}}});
  // Arguments before the name, an extra key, "parameters" for "arguments".
  check(F::hermes, R"(<tool_call>{"arguments": {"q": "}{"}, "name": "search"}</tool_call>)", {"", {{"search", R"({"q": "}{"})"}}});
  check(F::hermes, R"(<tool_call>{"type": "function", "name": "f", "id": 7, "parameters": {"a": [ ]}}</tool_call>)",
        {"", {{"f", R"({"a": [ ]})"}}});
  // Arguments as a string holding JSON: the string's content; no arguments: {}; multi-line JSON.
  check(F::hermes, R"(<tool_call>{"name": "f", "arguments": " {\"x\": \"y\"} "}</tool_call>)", {"", {{"f", R"({"x": "y"})"}}});
  check(F::hermes, R"(<tool_call>{"arguments": "{}", "name": "f"}</tool_call>)", {"", {{"f", "{}"}}});
  check(F::hermes, "<tool_call>{\"name\": \"now\"}</tool_call>", {"", {{"now", "{}"}}});
  check(F::hermes, "<tool_call>\n{\n  \"name\": \"f\",\n  \"arguments\": {\n    \"a\": 1\n  }\n}\n</tool_call>",
        {"", {{"f", "{\n    \"a\": 1\n  }"}}});
  // Content before in another script: released as it is.
  check(F::hermes, "Météo à Paris ☀\n<tool_call>{\"name\": \"f\", \"arguments\": {\"v\": \"é\"}}</tool_call>",
        {"Météo à Paris ☀", {{"f", "{\"v\": \"é\"}"}}});
}

TEST(ToolCallHermes, MalformedBecomesContent) {
  for (const std::string t : {
           "<tool_call>not json</tool_call>",
           "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
           "<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>",       // not an object
           "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",               // name not a string
           "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",            // empty name
           "<tool_call>{\"name\": \"f\", \"arguments\": \"[1]\"}</tool_call>",      // string, not an object
           "<tool_call>{\"name\": \"f\", \"arguments\": \"{\"}</tool_call>",        // string, not JSON
           "<tool_call>{\"arguments\": {\"s\": \"\\ud800\"}, \"name\": \"f\"}",     // lone surrogate
           "<tool_call>{'name': 'f', 'arguments': {}}</tool_call>",                 // Python, not JSON
           "Sure. <tool_call>{\"name\": \"f\", \"argu",                              // cut off before announced
           "Sure. <tool_call>",
       })
    check(F::hermes, t, {t, {}});
  // A complete call, then a stray brace: content.
  check(F::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}}", {"}", {{"f", "{}"}}});
  // A broken marker, then a real call: the first marker is content.
  check(F::hermes, "<tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        {"<tool_call>\n", {{"f", "{}"}}});
}

// Arguments may nest JsonScanner::kMaxNesting containers (their own object included); deeper, the
// call breaks there like other bad arguments (a model can write 100,000 brackets, which the
// Anthropic reply would parse, copy and print by recursion).
TEST(ToolCallHermes, ArgumentsNestedTooDeeplyBreakTheCall) {
  const size_t inner = JsonScanner::kMaxNesting - 1;
  const std::string at_limit = "{\"a\": " + std::string(inner, '[') + std::string(inner, ']') + "}";
  check(F::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": " + at_limit + "}</tool_call>", {"", {{"f", at_limit}}});
  const std::string head = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(inner, '[');
  const std::string tail = std::string(100000, '[') + std::string(100000 + inner, ']') + "}}</tool_call>";
  const ParsedToolCalls one = parse_tool_calls(F::hermes, head + tail, "");
  expect_same({tail, {{"f", "{\"a\": " + std::string(inner, '['), false}}}, one, "100,000 brackets");
  std::vector<std::string> pieces;
  for (size_t i = 0; i < head.size() + tail.size(); i += 4093) pieces.push_back((head + tail).substr(i, 4093));
  expect_same(one, stream(F::hermes, "", pieces), "100,000 brackets, streamed");
}

TEST(ToolCallHermes, BrokenAfterAnnouncement) {
  // Cut off inside the arguments (max_tokens): the call stays, incomplete, with what streamed.
  check(F::hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"b",
        {"", {{"f", "{\"a\": \"b", false}}});
  // Arguments that break: the call ends before the bad byte, the rest is parsed again as content.
  check(F::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1 x}}</tool_call> ok",
        {"x}}</tool_call> ok", {{"f", "{\"a\": 1 ", false}}});
  // A raw newline in a string is not JSON.
  check(F::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"l1\nl2\"}}</tool_call>",
        {"\nl2\"}}</tool_call>", {{"f", "{\"a\": \"l1", false}}});
  // The arguments complete, then the object is cut off: a complete call.
  check(F::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 2}, \"id\": \"x", {"", {{"f", "{\"a\": 2}"}}});
}

TEST(ToolCallLlama3, Calls) {
  check(F::llama3_json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
  check(F::llama3_json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}", {"", {{"f", "{\"a\": 1}"}}});
  check(F::llama3_json, "\n\n  {\"name\": \"f\", \"arguments\": {\"s\": \"{;}\"}}\n", {"", {{"f", "{\"s\": \"{;}\"}"}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1, 2]}}",
        {"", {{"a", "{}"}, {"b", "{\"x\": [1, 2]}"}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}}\n{\"parameters\": {\"k\": null}, \"name\": \"b\"}",
        {"", {{"a", "{}"}, {"b", "{\"k\": null}"}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}};<|python_tag|>{\"name\": \"b\", \"parameters\": {}}",
        {"", {{"a", "{}"}, {"b", "{}"}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}} Hope this helps", {"Hope this helps", {{"a", "{}"}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}};", {";", {{"a", "{}"}}});
}

TEST(ToolCallLlama3, ContentAndMalformed) {
  // Not starting with '{' or the tag: all content, even a call later on.
  for (const std::string t : {
           "The weather is nice.",
           "Here: {\"name\": \"f\", \"parameters\": {}}",
           "  <|eom|> text",
           "{\"name\": \"f\", \"parameters\": 3}",
           "{not json}",
           "<|python_tag|>brave_search.call(query=\"kiln\")",
           "<|python_tag|",
           "  ",
       })
    check(F::llama3_json, t, {t, {}});
  check(F::llama3_json, "{\"name\": \"f\", \"parameters\": {\"a\": [1", {"", {{"f", "{\"a\": [1", false}}});
  check(F::llama3_json, "{\"name\": \"a\", \"parameters\": {}}; {oops", {"; {oops", {{"a", "{}"}}});
}

TEST(ToolCallMistral, JsonList) {
  check(F::mistral, "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123xyz\"}]",
        {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
  check(F::mistral,
        "Sure! [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": \"]\"}, \"id\": \"aaaaaaaaa\"}, "
        "{\"id\": \"bbbbbbbbb\", \"arguments\": {}, \"name\": \"b\"}]",
        {"Sure!", {{"a", "{\"x\": \"]\"}"}, {"b", "{}"}}});
  check(F::mistral, "[TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}]\nAnything else?", {"Anything else?", {{"a", "{}"}}});
  check(F::mistral, "[TOOL_CALLS] []", {"", {}});
}

TEST(ToolCallMistral, ArgsForm) {
  check(F::mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", {"", {{"get_weather", "{\"city\": \"Paris\"}"}}});
  check(F::mistral, "Checking.[TOOL_CALLS]a[ARGS]{\"x\": {\"y\": [\"[ARGS]\"]}}[TOOL_CALLS]b.c-d[ARGS] {}",
        {"Checking.", {{"a", "{\"x\": {\"y\": [\"[ARGS]\"]}}"}, {"b.c-d", "{}"}}});
}

TEST(ToolCallMistral, Malformed) {
  for (const std::string t : {
           "[TOOL_CALLS] oops",
           "[TOOL_CALLS] [{\"name\": \"a\"",
           "[TOOL_CALLS]get[ARGS]\"x\"",
           "[TOOL_CALLS]get[ARG]{}",
           "[TOOL_CALLS]get {}",
           "[TOOL_CALLS] {\"name\": \"a\", \"arguments\": {}}",
           "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": 1}]",
       })
    check(F::mistral, t, {t, {}});
  check(F::mistral, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, oops]", {", oops]", {{"a", "{}"}}});
  check(F::mistral, "[TOOL_CALLS]a[ARGS]{\"x\": tru", {"", {{"a", "{\"x\": tru", false}}});
}

TEST(ToolCallParser, NoneFormatIsContent) {
  const std::string t = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>[TOOL_CALLS]";
  check(F::none, t, {t, {}});
  ToolCallParser p(F::none);
  EXPECT_EQ(p.feed("<tool_c").content, "<tool_c");  // nothing is held back
}

TEST(ToolCallParser, HeldBackMarkers) {
  ToolCallParser p(F::hermes);
  EXPECT_EQ(p.feed("Hello <tool_c").content, "Hello");
  EXPECT_EQ(p.feed("ar> is not a tag").content, " <tool_car> is not a tag");
  EXPECT_EQ(p.feed("\n<").content, "");
  ToolCallParser::Output end = p.finish();
  EXPECT_EQ(end.content, "\n<");
  EXPECT_TRUE(end.calls.empty());
  EXPECT_EQ(p.content(), "Hello <tool_car> is not a tag\n<");
  EXPECT_TRUE(p.feed("more").content.empty());  // finished

  ToolCallParser m(F::mistral);
  EXPECT_EQ(m.feed("Sure [TOOL_").content, "Sure");
  EXPECT_EQ(m.feed("CALLS]").content, "");
  ToolCallParser::Output o = m.feed("[{\"name\": \"f\"");
  EXPECT_TRUE(o.content.empty());
  EXPECT_TRUE(o.calls.empty());  // announced only with the arguments' '{'
  o = m.feed(", \"arguments\": {");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].index, 0);
  EXPECT_EQ(o.calls[0].name, "f");
  EXPECT_EQ(o.calls[0].arguments, "{");
  o = m.feed("\"a\": 1}}]");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "");
  EXPECT_EQ(o.calls[0].arguments, "\"a\": 1}");
  EXPECT_TRUE(m.finish().calls.empty());
  ASSERT_EQ(m.calls().size(), 1u);
  EXPECT_EQ(m.calls()[0].arguments, "{\"a\": 1}");
  EXPECT_TRUE(m.calls()[0].complete);

  ToolCallParser l(F::llama3_json);
  EXPECT_EQ(l.feed("  <|python").content, "");
  EXPECT_EQ(l.feed("_tags|> hi").content, "  <|python_tags|> hi");
}

TEST(ToolCallParser, ArgumentsStreamAsTheyArrive) {
  ToolCallParser p(F::hermes);
  EXPECT_TRUE(p.feed("<tool_call>\n{\"name\": \"f\", ").calls.empty());
  ToolCallParser::Output o = p.feed("\"arguments\": {\"q\": \"a");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "f");
  EXPECT_EQ(o.calls[0].arguments, "{\"q\": \"a");
  ASSERT_EQ(p.calls().size(), 1u);
  EXPECT_FALSE(p.calls()[0].complete);
  o = p.feed("b\"}}\n</tool_call>\n<tool_call>{\"arguments\": {\"z\": 0}, \"name\": \"g\"}");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].index, 0);
  EXPECT_EQ(o.calls[0].arguments, "b\"}");
  EXPECT_EQ(o.calls[1].index, 1);
  EXPECT_EQ(o.calls[1].name, "g");
  EXPECT_EQ(o.calls[1].arguments, "{\"z\": 0}");  // arguments first: all at once with the name
  EXPECT_TRUE(p.calls()[0].complete);
  EXPECT_TRUE(p.calls()[1].complete);
}

TEST(ToolCallForced, Prefixes) {
  EXPECT_EQ(forced_tool_call_prefix(F::hermes, ""), "<tool_call>");
  EXPECT_EQ(forced_tool_call_prefix(F::hermes, "get_weather"), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\":");
  EXPECT_EQ(forced_tool_call_prefix(F::llama3_json, ""), "{\"name\": \"");
  EXPECT_EQ(forced_tool_call_prefix(F::llama3_json, "get_weather"), "{\"name\": \"get_weather\", \"parameters\":");
  EXPECT_EQ(forced_tool_call_prefix(F::mistral, ""), "[TOOL_CALLS]");
  EXPECT_EQ(forced_tool_call_prefix(F::mistral, "f"), "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\":");
  EXPECT_EQ(forced_tool_call_prefix(F::mistral, "f", true), "[TOOL_CALLS]f[ARGS]");
  EXPECT_EQ(forced_tool_call_prefix(F::none, "f"), "");
  EXPECT_EQ(forced_tool_call_prefix(F::hermes, "a\"b"), "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\":");
}

TEST(ToolCallForced, OutputContinuesThePrefix) {
  const std::string hermes_any = forced_tool_call_prefix(F::hermes, "");
  check(F::hermes, "\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>", {"", {{"f", "{\"x\": 1}"}}}, hermes_any);
  check(F::hermes, "I can't.", {"I can't.", {}}, hermes_any);  // the prefix is never content
  const std::string hermes_f = forced_tool_call_prefix(F::hermes, "f");
  check(F::hermes, " {\"x\": 1}}\n</tool_call>", {"", {{"f", "{\"x\": 1}"}}}, hermes_f);
  check(F::hermes, " nope", {" nope", {}}, hermes_f);
  check(F::llama3_json, "f\", \"parameters\": {}}", {"", {{"f", "{}"}}}, forced_tool_call_prefix(F::llama3_json, ""));
  check(F::llama3_json, "oops", {"oops", {}}, forced_tool_call_prefix(F::llama3_json, ""));
  check(F::llama3_json, " {\"city\": \"Paris\"}}", {"", {{"w", "{\"city\": \"Paris\"}"}}},
        forced_tool_call_prefix(F::llama3_json, "w"));
  check(F::mistral, " {\"x\": 1}}]", {"", {{"f", "{\"x\": 1}"}}}, forced_tool_call_prefix(F::mistral, "f"));
  check(F::mistral, "{\"x\": 1}", {"", {{"f", "{\"x\": 1}"}}}, forced_tool_call_prefix(F::mistral, "f", true));
  check(F::mistral, "get[ARGS]{}", {"", {{"get", "{}"}}}, forced_tool_call_prefix(F::mistral, ""));

  // The first feed announces the named call as soon as the arguments open.
  ToolCallParser p(F::hermes, hermes_f);
  ToolCallParser::Output o = p.feed(" {");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].name, "f");
  EXPECT_EQ(o.calls[0].arguments, "{");
  EXPECT_EQ(o.content, "");
}

// Mutations of valid texts (bytes dropped, duplicated, replaced): never a crash, and streaming
// always agrees with the one-shot parse.
TEST(ToolCallParser, MutatedTextsAgree) {
  const std::vector<std::pair<F, std::string>> seeds = {
      {F::hermes, "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"x\\\"}\"]}}\n</tool_call>\n<tool_call>{\"arguments\": \"{}\", \"name\": \"g\"}</tool_call>"},
      {F::llama3_json, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": -1.5e2}}; {\"name\": \"g\", \"parameters\": {}}"},
      {F::mistral, "ok [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}, \"id\": \"abcdefghi\"}][TOOL_CALLS]g[ARGS]{\"u\": \"\\u00e9\"}"},
  };
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\":,\\ u<>/|_\n0aeT";
  for (const auto& [f, text] : seeds)
    for (int r = 0; r < 300; ++r) {
      std::string t = text;
      for (int e = 0; e < 3; ++e) {
        size_t i = std::uniform_int_distribution<size_t>(0, t.size() - 1)(rng);
        int kind = std::uniform_int_distribution<int>(0, 2)(rng);
        if (kind == 0) t.erase(i, 1);
        else if (kind == 1) t.insert(i, 1, t[i]);
        else t[i] = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      }
      ParsedToolCalls one = parse_tool_calls(f, t);
      std::vector<std::string> pieces;
      for (size_t i = 0; i < t.size();) {
        size_t n = std::uniform_int_distribution<size_t>(1, 5)(rng);
        pieces.push_back(t.substr(i, n));
        i += n;
      }
      expect_same(one, stream(f, "", pieces), std::string(tool_call_format_name(f)) + " mutated: " + t);
      for (const ToolCall& c : one.calls)
        if (c.complete) {
          EXPECT_TRUE(nlohmann::ordered_json::parse(c.arguments, nullptr, false).is_object()) << t;
        }
    }
}

TEST(ToolCallId, Shapes) {
  auto alnum = [](std::string_view s) {
    for (char c : s)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
    return true;
  };
  const std::string openai = make_tool_call_id(F::hermes, "call_", 42, 0);
  ASSERT_EQ(openai.size(), 5u + 24u);
  EXPECT_EQ(openai.substr(0, 5), "call_");
  EXPECT_TRUE(alnum(openai.substr(5)));
  const std::string anthropic = make_tool_call_id(F::llama3_json, "toolu_", 42, 0);
  ASSERT_EQ(anthropic.size(), 6u + 24u);
  EXPECT_EQ(anthropic.substr(0, 6), "toolu_");
  EXPECT_TRUE(alnum(anthropic.substr(6)));
  const std::string mistral = make_tool_call_id(F::mistral, "call_", 42, 0);
  EXPECT_EQ(mistral.size(), 9u);
  EXPECT_TRUE(alnum(mistral));
  EXPECT_EQ(make_tool_call_id(F::hermes, "call_", 42, 0), openai);  // deterministic
  EXPECT_NE(make_tool_call_id(F::hermes, "call_", 42, 1), openai);
  EXPECT_NE(make_tool_call_id(F::hermes, "call_", 43, 0), openai);
  EXPECT_EQ(anthropic.substr(6), openai.substr(5));  // the same draws whatever the protocol
}

}  // namespace
}  // namespace kiln::serve
