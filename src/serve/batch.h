// OpenAI batch files through the server's protocol code: each input line
//   {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions" | "/v1/completions", "body": {...}}
// becomes one output line, in input order:
//   {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
//    "body": <the endpoint's response>}, "error": null}
// A request the endpoint refuses gets its status code and error body in "response"; a line that is
// no request at all (bad JSON, no custom_id, unknown url) gets "response": null and
// "error": {"code", "message"}. Streaming bodies are refused (a batch is not streamed).
// Thread safety: run_batch drives the engine from the calling thread only.
#pragma once

#include <functional>
#include <istream>
#include <ostream>

#include "serve/api.h"

namespace kiln::serve {

struct BatchSummary {
  int64_t requests = 0, succeeded = 0, failed = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// Runs every line with at most `max_in_flight` requests in the engine at once; `progress(done,
// total)` is called as lines finish.
Result<BatchSummary> run_batch(Engine& engine, const ServeContext& ctx, std::istream& in, std::ostream& out,
                               int32_t max_in_flight, const std::function<void(int64_t, int64_t)>& progress);

}  // namespace kiln::serve
