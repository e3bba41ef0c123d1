// Fuzz target (fuzz_common.h): the input is an HTTP request as a client sends it to kiln serve.
// It goes through Beast's request parser (with the server's limits) and, for the completion routes,
// through the server's body parser and protocol parser (OpenAI chat and completions, Anthropic
// messages) on testdata/tiny-tools' tokenizer and chat template. A request may be refused; one that
// is accepted must be runnable: every prompt non-empty and in the vocabulary, prompt + max_tokens
// within the context, n within the server's bound.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <memory>

#include "fuzz_common.h"
#include "serve/anthropic_protocol.h"
#include "serve/chat_messages.h"
#include "serve/openai_protocol.h"

namespace kiln::fuzz {
namespace {

namespace http = boost::beast::http;

// The model's text side, loaded once per process (host data only).
const ModelText& tiny_tools_text() {
  static const std::unique_ptr<ModelText> text = [] {
    Result<ModelText> t = ModelText::load(std::string(KILN_TESTDATA) + "/tiny-tools");
    if (!t.ok()) invariant_failed("serve_request", "cannot load testdata/tiny-tools: " + t.status().message());
    return std::make_unique<ModelText>(std::move(t).value());
  }();
  return *text;
}

}  // namespace

int serve_request(const uint8_t* data, size_t size) {
  http::request_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  parser.header_limit(64 << 10);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (ec || !parser.is_done()) return 0;
  const auto& req = parser.get();
  const std::string target(req.target());
  serve::ServeContext ctx;
  ctx.text = &tiny_tools_text();
  ctx.model_name = "tiny-tools";
  ctx.tool_format = serve::ToolCallFormat::hermes;
  ctx.context_length = 4096;
  ctx.max_n = 4;
  Result<serve::Json> body = serve::parse_request_body(req.body());
  if (!body.ok()) return 0;
  Result<serve::CompletionJob> job = target == "/v1/chat/completions" ? serve::parse_openai_chat(*body, ctx)
                                     : target == "/v1/completions"    ? serve::parse_openai_completion(*body, ctx)
                                     : target == "/v1/messages"       ? serve::parse_anthropic_messages(*body, ctx)
                                                                      : Result<serve::CompletionJob>(not_found(target));
  if (!job.ok()) return 0;
  if (job->prompts.empty()) invariant_failed("serve_request", "an accepted request has no prompt");
  if (job->n < 1 || job->n > ctx.max_n) invariant_failed("serve_request", "n outside [1, max_n]");
  const int32_t vocab = ctx.text->tokenizer().vocab_size();
  for (const auto& p : job->prompts) {
    if (p.empty()) invariant_failed("serve_request", "an accepted prompt is empty");
    if (static_cast<int64_t>(p.size()) + job->request.max_tokens > ctx.context_length)
      invariant_failed("serve_request", "prompt + max_tokens exceeds the context");
    for (int32_t id : p)
      if (job->protocol != serve::Protocol::openai_completion && (id < 0 || id >= vocab))
        invariant_failed("serve_request", "a rendered prompt holds a token outside the vocabulary");
  }
  if (job->request.max_tokens < 0) invariant_failed("serve_request", "negative max_tokens");
  return 0;
}

}  // namespace kiln::fuzz

KILN_FUZZ_ENTRY(serve_request)
