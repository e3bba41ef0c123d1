// Server: kiln serve's HTTP front end (Boost.Beast/Asio): the OpenAI and Anthropic protocols, the
// web chat page, metrics, health and the admin routes, over one engine.
//
// Threads: `threads` Asio threads run every connection; engine events wake a connection through
// its strand (no thread blocks on a stream). A client that disconnects has its requests cancelled
// at once, so the engine frees their KV at its next step.
//
// Ownership: the Server borrows the engine and the model's text side (both outlive it) and owns its
// threads, sockets and metrics. Thread safety: start, port and shutdown may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "infer/engine.h"
#include "model/model_text.h"
#include "serve/api.h"

namespace kiln::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  bool host_given = false;           // --host given explicitly: clients from other hosts may connect without a key
  uint16_t port = 8000;              // 0: any free port (Server::port() says which)
  std::string api_key;               // empty: no key (then only loopback clients, unless host_given)
  std::string served_model_name;     // the model id clients name; empty: the model folder's name
  int64_t max_body_bytes = int64_t(16) << 20;  // larger request bodies: 413
  int32_t max_queued = 2048;         // requests in the engine (running + waiting) before 429
  int32_t retry_after_seconds = 1;   // the 429's Retry-After
  int32_t max_tokens_cap = 0;        // the most tokens one completion may ask for; 0: the context
  int32_t max_n = 16;                // choices per request at most
  int32_t threads = 2;               // Asio threads
  bool access_log = true;            // one JSON line per request on stderr
  std::string chat_template;         // template name; empty: the folder's default (tool_use with tools)
  std::string tool_call_format = "auto";  // auto|hermes|llama3_json|mistral|none
  std::string reasoning_parser = "none";  // none|auto|qwen3|deepseek_r1 (serve/reasoning.h)
  double idle_timeout_seconds = 120; // a connection idle (or sending a request) this long is closed
  std::string allow_origin;          // CORS: the origin browsers may call from ("*": any); empty: none
};

// What the server serves: one engine, the model's text side (null: token-id prompts only), and
// where its weights came from.
struct ServedModel {
  Engine* engine = nullptr;
  const ModelText* text = nullptr;
  std::string model_dir;   // shown in /v1/models; the default served name is its last component
  int64_t context_length = 0;  // the longest prompt + completion (Engine::max_sequence_tokens)
  SamplingDefaults sampling_defaults;  // for requests that leave sampling fields out
};

// The protocol parsers' view of the model (served name, tool-call format, limits); the server's
// own, also used by kiln run-batch. An error for an unknown --tool-call-parser.
Result<ServeContext> make_serve_context(const ServedModel& model, const ServerOptions& options);

class Server {
 public:
  // Binds, listens and starts the Asio threads; an error when the address cannot be bound or the
  // options are inconsistent.
  static Result<std::unique_ptr<Server>> start(const ServedModel& model, const ServerOptions& options);
  ~Server();  // shutdown(0) if still running

  uint16_t port() const;
  std::string url() const;  // http://host:port
  bool loopback_only() const;  // it listens on a loopback address: no other host can connect

  // Graceful stop: stops accepting, lets open requests finish for `grace`, then cancels the rest
  // (their streams end with finish reason "abort"), closes every connection and joins the threads.
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
