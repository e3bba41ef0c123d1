// kiln serve: the OpenAI- and Anthropic-compatible HTTP server (serve/server.h) on one engine.
// kiln run-batch lives in cli/run_batch.cpp.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "cli/engine_flags.h"
#include "cli/serve_flags.h"
#include "cli/stop_signal.h"
#include "serve/server.h"

namespace kiln::cli {

void ServeFlags::add(CLI::App* c) {
  c->add_option("--served-model-name", options.served_model_name,
                "the model id clients name (default: the model folder's name)");
  c->add_option("--chat-template", options.chat_template, "a named chat template of the folder (default: its default)");
  c->add_option("--tool-call-parser", options.tool_call_format,
                "how the model writes tool calls: auto (from the chat template), hermes, llama3_json, mistral, none")
      ->capture_default_str();
  c->add_option("--reasoning-parser", options.reasoning_parser,
                "split <think> blocks from chat replies into reasoning_content (Anthropic: thinking blocks): qwen3 "
                "or deepseek_r1 (one splitter), auto (when the vocabulary has <think> and </think>), none")
      ->capture_default_str();
  c->add_option("--max-tokens-limit", options.max_tokens_cap, "the most tokens a request may ask for per completion (more is refused; also the default "
                "when it asks none; 0: the context)")
      ->capture_default_str();
  c->add_option("--max-n", options.max_n, "choices per request at most")->capture_default_str();
}

namespace {

struct Flags {
  ModelFlags model;
  EngineFlags engine;
  ServeFlags serve;
  double shutdown_grace = 30.0;
  bool no_access_log = false;
};

int run_serve(const Flags& f, const CLI::App& cmd) {
  if (!(f.shutdown_grace >= 0 && f.shutdown_grace <= 86400))
    return fail(invalid_argument("--shutdown-grace must be a number of seconds within [0, 86400]"));
  serve::ServerOptions o = f.serve.options;
  o.host_given = cmd.count("--host") > 0;
  if (o.api_key.empty())
    if (const char* env = std::getenv("KILN_API_KEY")) o.api_key = env;
  Result<std::unique_ptr<EngineSession>> started = start_engine(f.model, f.engine, /*need_text=*/false);
  if (!started.ok()) return fail(started.status());
  EngineSession& s = **started;
  serve::ServedModel served{s.engine.get(), s.text ? &*s.text : nullptr, f.model.model_dir, s.engine->max_sequence_tokens(),
                              s.sampling_defaults};
  StopOnSignal stop("stopping: finishing open requests (again to quit now)");
  Result<std::unique_ptr<serve::Server>> server = serve::Server::start(served, o);
  if (!server.ok()) return fail(server.status());
  Result<serve::ServeContext> ctx = serve::make_serve_context(served, o);
  std::fprintf(stderr, "kiln: serving %s on %s (context %lld tokens, tool calls: %s%s%s)\n", ctx->model_name.c_str(),
               (*server)->url().c_str(), static_cast<long long>(ctx->context_length),
               serve::tool_call_format_name(ctx->tool_format), ctx->reasoning ? ", reasoning split" : "",
               o.api_key.empty() ? ", no API key" : "");
  std::fprintf(stderr, "kiln: web chat at %s/  OpenAI API at %s/v1  metrics at %s/metrics\n", (*server)->url().c_str(),
               (*server)->url().c_str(), (*server)->url().c_str());
  if (o.api_key.empty() && !(*server)->loopback_only())
    std::fprintf(stderr, "kiln: warning: no API key: any client that reaches %s may use the model (set --api-key)\n",
                 o.host.c_str());
  std::fflush(stderr);
  while (!stop.flag()->load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  (*server)->shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_grace * 1000)));
  std::fprintf(stderr, "kiln: stopped\n");
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server (streaming, tools, metrics, web chat)");
  f->model.add(c, "");
  c->get_option("--model")->required();
  f->engine.add(c);
  f->engine.add_generation_config(c);
  f->serve.add(c);
  serve::ServerOptions& o = f->serve.options;
  c->add_option("--host", o.host, "address to listen on (given explicitly, clients of other hosts may connect without a key)")
      ->capture_default_str();
  c->add_option("--port", o.port, "port to listen on (0: any free port; the line 'serving ... on URL' says which)")
      ->capture_default_str();
  c->add_option("--api-key", o.api_key, "clients must send it (Authorization: Bearer, or x-api-key); also KILN_API_KEY; "
                                        "admin routes need it");
  c->add_option("--max-body-bytes", o.max_body_bytes, "largest request body (413 above)")->capture_default_str();
  c->add_option("--max-queued", o.max_queued, "API requests in flight at most; more are answered 429 with Retry-After")
      ->capture_default_str();
  c->add_option("--threads", o.threads, "HTTP threads")->capture_default_str();
  c->add_option("--allow-origin", o.allow_origin, "CORS: the origin web pages may call the API from (* for any)");
  c->add_option("--idle-timeout", o.idle_timeout_seconds, "seconds a connection may stay idle or take to send a request")
      ->capture_default_str();
  c->add_option("--shutdown-grace", f->shutdown_grace, "on SIGTERM, seconds open requests may take to finish before they are aborted")
      ->capture_default_str();
  c->add_flag("--no-access-log", f->no_access_log, "no JSON line per request on stderr");
  return [f, c]() {
    f->serve.options.access_log = !f->no_access_log;
    return run_serve(*f, *c);
  };
}

}  // namespace kiln::cli
