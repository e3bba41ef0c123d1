// The server's protocol pieces without HTTP: request bodies into jobs (OpenAI, Anthropic), the
// conversations handed to chat templates, field checking, API-key comparison and the Prometheus text.
// Expected values are written from the protocols' documentation; the served behaviour end to end is
// tested with the official SDKs (tests/serve/).
#include <gtest/gtest.h>

#include "serve/anthropic_protocol.h"
#include "serve/chat_messages.h"
#include "serve/metrics.h"
#include "serve/openai_protocol.h"
#include "serve/server_internal.h"

namespace kiln::serve {
namespace {

class ServeProtocol : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<ModelText> t = ModelText::load(std::string(KILN_TESTDATA) + "/tiny-tools");
    ASSERT_TRUE(t.ok()) << t.status().message();
    text_ = new ModelText(std::move(t).value());
  }
  static void TearDownTestSuite() { delete text_; }
  ServeContext ctx() const {
    ServeContext c;
    c.text = text_;
    c.model_name = "tiny-tools";
    c.tool_format = ToolCallFormat::hermes;
    c.context_length = 4096;
    c.max_n = 4;
    return c;
  }
  static ModelText* text_;
};
ModelText* ServeProtocol::text_ = nullptr;

TEST_F(ServeProtocol, OpenAIMessagesForTheTemplate) {
  Json in = Json::parse(R"([
    {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"}])");
  Result<Json> out = template_messages_from_openai(in);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const Json want = Json::parse(R"([
    {"role": "system", "content": "a\nb"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"x": 1}}, "id": "c1"}]},
    {"role": "tool", "content": "42", "tool_call_id": "c1"}])");
  EXPECT_EQ(*out, want);
  EXPECT_FALSE(template_messages_from_openai(Json::parse(R"([{"role": "wizard", "content": "x"}])")).ok());
  EXPECT_FALSE(template_messages_from_openai(
      Json::parse(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])")).ok());
}

TEST_F(ServeProtocol, AnthropicMessagesForTheTemplate) {
  Json msgs = Json::parse(R"([
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": [{"type": "text", "text": "let me see"},
      {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
      {"type": "text", "text": "thanks"}]},
    {"role": "assistant", "content": "The answer"}])");
  Result<AnthropicConversation> c = template_messages_from_anthropic(Json("sys"), msgs);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const Json want = Json::parse(R"([
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "let me see", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"x": 1}}, "id": "t1"}]},
    {"role": "tool", "tool_call_id": "t1", "content": "42"},
    {"role": "user", "content": "thanks"}])");
  EXPECT_EQ(c->messages, want);
  EXPECT_EQ(c->prefill, "The answer");
}

TEST_F(ServeProtocol, OpenAIChatJob) {
  Result<CompletionJob> job = parse_openai_chat(Json::parse(R"({"model": "tiny-tools", "n": 2, "seed": 5,
      "messages": [{"role": "user", "content": "Hi!"}], "max_completion_tokens": 7, "temperature": 0.5,
      "top_k": -1, "stop": "x", "stream": true, "stream_options": {"include_usage": true}})"), ctx());
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->n, 2);
  EXPECT_EQ(job->request.max_tokens, 7);
  EXPECT_EQ(job->request.seed, 5u);
  EXPECT_EQ(job->request.top_k, 0);
  EXPECT_FLOAT_EQ(job->request.temperature, 0.5f);
  EXPECT_EQ(job->request.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(job->stream && job->include_usage);
  // The prompt is the template's render, encoded without added special tokens.
  Result<std::string> rendered = text_->render_chat(Json::parse(R"([{"role": "user", "content": "Hi!"}])"), Json(), true);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(job->prompts.at(0), *text_->tokenizer().encode(*rendered, false));
  // Without max_tokens: what the context leaves.
  job = parse_openai_chat(Json::parse(R"({"model": "tiny-tools", "messages": [{"role": "user", "content": "Hi!"}]})"), ctx());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.max_tokens + static_cast<int64_t>(job->prompts[0].size()), 4096);
}

TEST_F(ServeProtocol, MaxTokensLimit) {
  // --max-tokens-limit 5: the default of a request that asks none is 5 at most; asking more is refused,
  // in both protocols (as OpenAI and Anthropic refuse max_tokens above a model's output limit).
  ServeContext c = ctx();
  c.max_tokens_cap = 5;
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi!"}])";
  auto chat = [&](const std::string& extra) {
    return parse_openai_chat(Json::parse(R"({"model": "tiny-tools", )" + msgs + extra + "}"), c);
  };
  for (const char* ok : {"", R"(, "max_tokens": 5)", R"(, "max_completion_tokens": 3)"}) {
    Result<CompletionJob> job = chat(ok);
    ASSERT_TRUE(job.ok()) << ok << ": " << job.status().message();
    EXPECT_EQ(job->request.max_tokens, std::string(ok).find('3') != std::string::npos ? 3 : 5) << ok;
  }
  for (const char* bad : {R"(, "max_tokens": 6)", R"(, "max_completion_tokens": 4096)"}) {
    Result<CompletionJob> job = chat(bad);
    ASSERT_FALSE(job.ok()) << bad;
    EXPECT_EQ(api_error_from(job.status()).status, 400);
    EXPECT_NE(job.status().message().find("--max-tokens-limit"), std::string::npos) << job.status().message();
  }
  Result<CompletionJob> job = parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": "Hi"})"), c);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.max_tokens, 5);  // OpenAI's default of 16, capped
  EXPECT_FALSE(parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": "Hi", "max_tokens": 16})"), c).ok());
  job = parse_anthropic_messages(Json::parse(R"({"model": "tiny-tools", "max_tokens": 5, )" + msgs + "}"), c);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.max_tokens, 5);
  job = parse_anthropic_messages(Json::parse(R"({"model": "tiny-tools", "max_tokens": 6, )" + msgs + "}"), c);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(api_error_from(job.status()).status, 400);
}

TEST_F(ServeProtocol, RefusesWhatItDoesNotSupport) {
  auto chat = [&](const char* extra) {
    return parse_openai_chat(Json::parse(std::string(R"({"model": "tiny-tools", "messages": [{"role": "user", "content": "x"}])") +
                                         extra + "}"), ctx());
  };
  for (const char* extra : {R"(, "response_format": {"type": "regex", "regex": "a+"})", R"(, "logit_bias": {"x": 5})",
                            R"(, "logit_bias": {"1": "5"})", R"(, "logit_bias": [1, 5])",
                            R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "p"}})",
                            R"(, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "a"}}})",
                            R"(, "functions": [])", R"(, "n": 5)", R"(, "top_logprobs": 2)", R"(, "temperature": -1)",
                            R"(, "max_tokens": 1, "max_completion_tokens": 2)", R"(, "whatever": 1)",
                            R"(, "stream_options": {"include_usage": true})", R"(, "tool_choice": "required")"}) {
    Result<CompletionJob> job = chat(extra);
    EXPECT_FALSE(job.ok()) << extra;
    EXPECT_EQ(api_error_from(job.status()).status, 400) << extra;
  }
  Result<CompletionJob> job = parse_openai_chat(Json::parse(R"({"model": "other", "messages": []})"), ctx());
  EXPECT_EQ(api_error_from(job.status()).status, 404);
  EXPECT_TRUE(chat(R"(, "response_format": {"type": "text"}, "user": "u", "store": false)").ok());
  // logit_bias: token id keys, in the order given.
  Result<CompletionJob> biased = chat(R"(, "logit_bias": {"7": -100, "3": 2.5})");
  ASSERT_TRUE(biased.ok()) << biased.status().message();
  EXPECT_EQ(biased->request.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {3, 2.5f}}));
}

TEST_F(ServeProtocol, ResponseFormatsBecomeSchemas) {
  auto chat = [&](const std::string& rf) {
    return parse_openai_chat(Json::parse(R"({"model": "tiny-tools", "messages": [{"role": "user", "content": "x"}], "response_format": )" +
                                         rf + "}"), ctx());
  };
  Result<CompletionJob> job = chat(R"({"type": "text"})");
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.json_schema, nullptr);
  job = chat(R"({"type": "json_object"})");
  ASSERT_TRUE(job.ok());
  ASSERT_NE(job->request.json_schema, nullptr);
  EXPECT_EQ(job->request.json_schema->source(), Json::parse(R"({"type": "object"})"));
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})";
  job = chat(R"({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": )" + schema + "}}");
  ASSERT_TRUE(job.ok()) << job.status().message();
  ASSERT_NE(job->request.json_schema, nullptr);
  EXPECT_EQ(job->request.json_schema->source(), Json::parse(schema));
  job = chat(R"({"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 0}}})");
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("'minimum'"), std::string::npos) << job.status().message();
}

// Anthropic's structured outputs: output_config.format (GA) or output_format (beta).
TEST_F(ServeProtocol, AnthropicOutputFormatsBecomeSchemas) {
  const std::string head = R"({"model": "tiny-tools", "max_tokens": 20, "messages": [{"role": "user", "content": "x"}])";
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "boolean"}}})";
  for (const std::string& field : {R"("output_config": {"format": {"type": "json_schema", "schema": )" + schema + "}}",
                                   R"("output_format": {"type": "json_schema", "schema": )" + schema + "}"}) {
    Result<CompletionJob> job = parse_anthropic_messages(Json::parse(head + ", " + field + "}"), ctx());
    ASSERT_TRUE(job.ok()) << field << ": " << job.status().message();
    ASSERT_NE(job->request.json_schema, nullptr) << field;
    EXPECT_EQ(job->request.json_schema->source(), Json::parse(schema));
  }
  Result<CompletionJob> job = parse_anthropic_messages(Json::parse(head + "}"), ctx());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.json_schema, nullptr);
  for (const std::string& bad : {std::string(R"("output_format": {"type": "json_schema", "schema": {"pattern": "x", "type": "string"}})"),
                                 std::string(R"("output_format": {"type": "text"})"),
                                 std::string(R"("output_config": {"effort": "high"})")}) {
    job = parse_anthropic_messages(Json::parse(head + ", " + bad + "}"), ctx());
    EXPECT_FALSE(job.ok()) << bad;
  }
}

TEST_F(ServeProtocol, CompletionPrompts) {
  Result<CompletionJob> job = parse_openai_completion(
      Json::parse(R"({"model": "tiny-tools", "prompt": [[5, 6], [7]], "n": 2, "max_tokens": 3})"), ctx());
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->prompts, (std::vector<std::vector<int32_t>>{{5, 6}, {7}}));
  EXPECT_EQ(job->choices(), 4);
  job = parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": "Hello"})"), ctx());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->request.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(job->prompts[0], (std::vector<int32_t>{269}));  // "Hello" is one token of tiny-tools
  EXPECT_FALSE(parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": []})"), ctx()).ok());
  EXPECT_FALSE(parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": [-1]})"), ctx()).ok());
}

// Stop token ids are token ids: 2^32 + 2 does not wrap onto id 2, and the error names the value.
TEST_F(ServeProtocol, StopTokenIdsOutsideInt32AreRefused) {
  auto job = [&](const std::string& ids) {
    return parse_openai_completion(
        Json::parse(R"({"model": "tiny-tools", "prompt": "Hi", "stop_token_ids": )" + ids + "}"), ctx());
  };
  Result<CompletionJob> ok = job("[2, 2147483647]");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->request.stop_token_ids, (std::vector<int32_t>{2, 2147483647}));
  for (const std::string bad : {"[4294967298]", "[2147483648]", "[-1]", "[18446744073709551615]", "[1.5]"}) {
    Result<CompletionJob> r = job(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("stop_token_ids"), std::string::npos) << r.status().message();
  }
  EXPECT_NE(job("[4294967298]").status().message().find("4294967298"), std::string::npos);
}

// The model's recommended sampling (generation_config.json) where a request gives none; what a
// request gives wins; max_new_tokens bounds chat completions that give no max_tokens (completions
// keep OpenAI's 16).
TEST_F(ServeProtocol, ModelSamplingDefaultsFillWhatRequestsLeaveOut) {
  ServeContext c = ctx();
  c.sampling_defaults.temperature = 0.6f;
  c.sampling_defaults.top_k = 20;
  c.sampling_defaults.top_p = 0.95f;
  c.sampling_defaults.min_p = 0.05f;
  c.sampling_defaults.repetition_penalty = 1.1f;
  c.sampling_defaults.max_tokens = 7;
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi"}])";
  Result<CompletionJob> plain = parse_openai_chat(Json::parse(R"({"model": "tiny-tools", )" + msgs + "}"), c);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->request.temperature, 0.6f);
  EXPECT_EQ(plain->request.top_k, 20);
  EXPECT_EQ(plain->request.top_p, 0.95f);
  EXPECT_EQ(plain->request.min_p, 0.05f);
  EXPECT_EQ(plain->request.repetition_penalty, 1.1f);
  EXPECT_EQ(plain->request.max_tokens, 7);
  Result<CompletionJob> own = parse_openai_chat(
      Json::parse(R"({"model": "tiny-tools", "temperature": 0.2, "top_k": 0, "top_p": 1, "min_p": 0,
                      "repetition_penalty": 1, "max_tokens": 30, )" + msgs + "}"), c);
  ASSERT_TRUE(own.ok()) << own.status().message();
  EXPECT_EQ(own->request.temperature, 0.2f);
  EXPECT_EQ(own->request.top_k, 0);
  EXPECT_EQ(own->request.top_p, 1.0f);
  EXPECT_EQ(own->request.min_p, 0.0f);
  EXPECT_EQ(own->request.repetition_penalty, 1.0f);
  EXPECT_EQ(own->request.max_tokens, 30);
  Result<CompletionJob> completion = parse_openai_completion(Json::parse(R"({"model": "tiny-tools", "prompt": "Hi"})"), c);
  ASSERT_TRUE(completion.ok()) << completion.status().message();
  EXPECT_EQ(completion->request.temperature, 0.6f);
  EXPECT_EQ(completion->request.max_tokens, 16);
  Result<CompletionJob> anthropic =
      parse_anthropic_messages(Json::parse(R"({"model": "tiny-tools", "max_tokens": 9, )" + msgs + "}"), c);
  ASSERT_TRUE(anthropic.ok()) << anthropic.status().message();
  EXPECT_EQ(anthropic->request.temperature, 0.6f);
  EXPECT_EQ(anthropic->request.top_k, 20);
  EXPECT_EQ(anthropic->request.max_tokens, 9);
  // Without defaults: the protocols' own (temperature 1).
  Result<CompletionJob> none = parse_openai_chat(Json::parse(R"({"model": "tiny-tools", )" + msgs + "}"), ctx());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->request.temperature, 1.0f);
  EXPECT_EQ(none->request.top_k, 0);
  EXPECT_EQ(none->request.top_p, 1.0f);
}

TEST_F(ServeProtocol, AnthropicJob) {
  Result<CompletionJob> job = parse_anthropic_messages(Json::parse(R"({"model": "tiny-tools", "max_tokens": 9,
      "messages": [{"role": "user", "content": "Hi!"}], "stop_sequences": ["a", "b"], "top_k": 4,
      "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "get_weather"}})"),
                                                   ctx());
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->request.max_tokens, 9);
  EXPECT_EQ(job->request.top_k, 4);
  EXPECT_EQ(job->request.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(job->tools.enabled);
  EXPECT_EQ(job->tools.forced_prefix, forced_tool_call_prefix(ToolCallFormat::hermes, "get_weather"));
  for (const char* bad : {R"({"model": "tiny-tools", "messages": [{"role": "user", "content": "x"}]})",
                          R"({"model": "tiny-tools", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})",
                          R"({"model": "tiny-tools", "max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]})",
                          R"({"model": "tiny-tools", "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": 10}, "messages": [{"role": "user", "content": "x"}]})"})
    EXPECT_FALSE(parse_anthropic_messages(Json::parse(bad), ctx()).ok()) << bad;
}

TEST(ServeBody, ParseLimits) {
  EXPECT_TRUE(parse_request_body(R"({"a": [[["\"[[[[" ]]]})").ok());
  std::string deep(kMaxRequestNesting + 1, '[');
  EXPECT_FALSE(parse_request_body("{\"a\":" + deep + std::string(kMaxRequestNesting + 1, ']') + "}").ok());
  EXPECT_FALSE(parse_request_body("[1]").ok());
  EXPECT_FALSE(parse_request_body("{").ok());
}

TEST(ServeAuth, ApiKeyComparison) {
  EXPECT_TRUE(api_key_matches("sk-abc", "sk-abc"));
  EXPECT_FALSE(api_key_matches("sk-abd", "sk-abc"));
  EXPECT_FALSE(api_key_matches("sk-ab", "sk-abc"));
  EXPECT_FALSE(api_key_matches("sk-abcd", "sk-abc"));
  EXPECT_FALSE(api_key_matches("", "sk-abc"));
}

TEST(ServeMetrics, PrometheusText) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(3.0);
  EXPECT_EQ(h.render("x", "help"),
            "# HELP x help\n# TYPE x histogram\nx_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 3\n"
            "x_sum 3.55\nx_count 3\n");
  ServerMetrics m;
  m.request_done("/v1/messages", 200);
  m.request_done("/v1/messages", 200);
  EngineStats s;
  s.policy_version = 7;
  const std::string text = m.render(s, "m");
  EXPECT_NE(text.find("kiln_requests_total{route=\"/v1/messages\",status=\"200\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kiln_policy_version{model=\"m\"} 7\n"), std::string::npos);
}

}  // namespace
}  // namespace kiln::serve
