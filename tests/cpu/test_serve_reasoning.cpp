// Reasoning models behind kiln serve, without HTTP: chat_template_kwargs reach the chat template
// (Qwen3's enable_thinking, testdata/chat_templates/more/qwen3.jinja, as transformers renders it:
// tests/cpu/test_chat_template.cpp), whether the rendered prompt leaves a <think> block open decides
// where the splitter starts, earlier reasoning goes back to the template, and Anthropic's thinking
// parameter is checked. The split itself: test_reasoning.cpp; end to end: tests/serve/test_serve_ops.py.
#include <gtest/gtest.h>

#include <filesystem>

#include "serve/anthropic_protocol.h"
#include "serve/openai_protocol.h"
#include "test_util.h"

namespace kiln::serve {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// tiny-tools' tokenizer with another chat template.
ModelText text_with_template(const TempDir& tmp, const std::string& template_text) {
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::testdata_dir() + "/tiny-tools/" + f, tmp.path / f);
  tmp.file("chat_template.jinja", template_text);
  Result<ModelText> t = ModelText::load(tmp.path.string());
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

std::string prompt_text(const ModelText& t, const CompletionJob& job) {
  Result<std::string> s = t.tokenizer().decode(job.prompts.at(0), false);
  EXPECT_TRUE(s.ok());
  return s.ok() ? *s : "";
}

ServeContext context(const ModelText& t) {
  ServeContext c;
  c.text = &t;
  c.model_name = "m";
  c.context_length = 4096;
  c.reasoning = true;
  return c;
}

TEST(ServeReasoning, TemplateKwargsReachTheTemplate) {
  TempDir tmp;
  const ModelText t = text_with_template(tmp, test::read_file(test::testdata_dir() + "/chat_templates/more/qwen3.jinja"));
  const ServeContext c = context(t);
  const std::string base = R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}])";
  Result<CompletionJob> thinking = parse_openai_chat(Json::parse(base + "}"), c);
  ASSERT_TRUE(thinking.ok()) << thinking.status().message();
  EXPECT_TRUE(thinking->reasoning);
  EXPECT_FALSE(thinking->reasoning_opened);  // Qwen3 writes <think> itself
  EXPECT_TRUE(prompt_text(t, *thinking).ends_with("<|im_start|>assistant\n")) << prompt_text(t, *thinking);
  Result<CompletionJob> off =
      parse_openai_chat(Json::parse(base + R"(, "chat_template_kwargs": {"enable_thinking": false}})"), c);
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_TRUE(prompt_text(t, *off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << prompt_text(t, *off);
  EXPECT_FALSE(off->reasoning_opened);
  for (const char* bad : {R"(, "chat_template_kwargs": [1]})", R"(, "chat_template_kwargs": {"messages": []}})",
                          R"(, "chat_template_kwargs": {"add_generation_prompt": false}})"}) {
    Result<CompletionJob> r = parse_openai_chat(Json::parse(base + bad), c);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("chat_template_kwargs"), std::string::npos) << r.status().message();
  }
  // Without the parser nothing is split.
  ServeContext plain = c;
  plain.reasoning = false;
  EXPECT_FALSE(parse_openai_chat(Json::parse(base + "}"), plain)->reasoning);
}

TEST(ServeReasoning, EarlierReasoningGoesToTheTemplate) {
  TempDir tmp;
  const ModelText t = text_with_template(tmp, test::read_file(test::testdata_dir() + "/chat_templates/more/qwen3.jinja"));
  const ServeContext c = context(t);
  // Qwen3 shows the reasoning of the turns after the last user query (a tool loop).
  const std::string openai = R"({"model": "m", "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "reasoning_content": "I should call it.",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})";
  Result<CompletionJob> job = parse_openai_chat(Json::parse(openai), c);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_NE(prompt_text(t, *job).find("<think>\nI should call it.\n</think>"), std::string::npos) << prompt_text(t, *job);
  const std::string anthropic = R"({"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "I should call it.", "signature": "x"},
        {"type": "redacted_thinking", "data": "abc"}, {"type": "tool_use", "id": "c1", "name": "w", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}]}]})";
  Result<CompletionJob> a = parse_anthropic_messages(Json::parse(anthropic), c);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_NE(prompt_text(t, *a).find("<think>\nI should call it.\n</think>"), std::string::npos) << prompt_text(t, *a);
}

TEST(ServeReasoning, PromptThatOpensTheBlock) {
  TempDir tmp;  // a template that starts the reply inside the block (DeepSeek-R1's way)
  const ModelText t = text_with_template(
      tmp, "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}");
  const ServeContext c = context(t);
  Result<CompletionJob> job = parse_openai_chat(Json::parse(R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})"), c);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_TRUE(job->reasoning_opened);
  Result<CompletionJob> a = parse_anthropic_messages(
      Json::parse(R"({"model": "m", "max_tokens": 2000, "messages": [{"role": "user", "content": "Hi"}],
                     "thinking": {"type": "enabled", "budget_tokens": 1024}})"), c);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->reasoning && a->reasoning_opened);
}

TEST(ServeReasoning, AnthropicThinkingParameter) {
  TempDir tmp;
  const ModelText t = text_with_template(tmp, test::read_file(test::testdata_dir() + "/chat_templates/more/qwen3.jinja"));
  ServeContext c = context(t);
  auto job = [&](const std::string& thinking, const ServeContext& ctx) {
    return parse_anthropic_messages(Json::parse(R"({"model": "m", "max_tokens": 4000, "messages": [{"role": "user",
        "content": "Hi"}], "thinking": )" + thinking + "}"), ctx);
  };
  // Qwen3's template has a thinking switch: it follows the request (off unless enabled).
  Result<CompletionJob> on = job(R"({"type": "enabled", "budget_tokens": 2048})", c);
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_TRUE(prompt_text(t, *on).ends_with("<|im_start|>assistant\n")) << prompt_text(t, *on);
  Result<CompletionJob> off = job(R"({"type": "disabled"})", c);
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_TRUE(prompt_text(t, *off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << prompt_text(t, *off);
  Result<CompletionJob> absent = parse_anthropic_messages(
      Json::parse(R"({"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}]})"), c);
  ASSERT_TRUE(absent.ok()) << absent.status().message();
  EXPECT_EQ(prompt_text(t, *absent), prompt_text(t, *off));
  for (const char* bad : {R"({"type": "enabled"})", R"({"type": "enabled", "budget_tokens": 100})",
                          R"({"type": "enabled", "budget_tokens": 4000})", R"({"type": "sometimes"})"}) {
    Result<CompletionJob> r = job(bad, c);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << r.status().message();
  }
  c.reasoning = false;
  Result<CompletionJob> r = job(R"({"type": "enabled", "budget_tokens": 2048})", c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--reasoning-parser"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kiln::serve
