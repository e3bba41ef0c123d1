// serve_load: an asynchronous load client for OpenAI-protocol HTTP servers (kiln serve, or any
// other): bench_serve drives the server with it, and the server tests use it as their client.
//
// run_load sends a list of requests, each on its own TCP connection (HTTP/1.1, "Connection:
// close"), each started at its arrival time, thousands in flight at once on a few threads (one
// Asio io_context each, the requests dealt among them round-robin).
// Streaming requests ("stream": true in the body) have their server-sent events parsed as they
// arrive (chunked or not; events may split anywhere across reads), and every event that carries
// tokens is time-stamped. OpenAI completions and chat completions are understood (choices[].text,
// choices[].delta.content, choices[].token_ids, usage), and the Anthropic messages stream's
// content_block_delta / message_delta / message_stop events.
//
// Times: a request starts when its connection is opened (at its arrival time, or later when the
// client falls behind: start_seconds - scheduled_seconds says by how much). TTFT, chunk times and
// latency are measured from that start.
//
// Ownership and thread safety: run_load owns its io_contexts, threads and sockets for the call and
// returns when every request has ended (finished, failed, disconnected or timed out); calls are
// independent of each other and may run concurrently from several threads. It raises the
// process's soft open-file limit to the hard limit when the requests need more descriptors.
// summarize and percentile are pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::bench {

struct LoadRequest {
  std::string method = "POST";          // any HTTP verb (GET /v1/models, /health, ...)
  std::string path = "/v1/completions";
  nlohmann::json body;                  // sent as JSON (null: no body); "stream": true reads SSE
  std::string raw_body;                 // non-empty: sent instead of `body`, byte for byte (malformed bodies)
  std::string content_type = "application/json";
  double arrival_seconds = 0.0;         // when to start it, seconds from the start of the run
  int32_t disconnect_after_chunks = 0;  // > 0: close the connection after this many content chunks
  std::string api_key;                  // non-empty: this request's bearer key (else LoadOptions::api_key)
  std::map<std::string, std::string> headers;  // more request headers
};

struct LoadOptions {
  std::string url = "http://127.0.0.1:8000";  // http://host:port (an IPv6 host in brackets)
  std::string api_key;                 // non-empty: "Authorization: Bearer <key>" on every request
  int32_t threads = 2;                 // client threads (each runs its own io_context)
  double timeout_seconds = 600.0;      // a request still running this long after its start fails
  bool keep_events = false;            // keep every SSE event's JSON in RequestResult::events
};

// A server-sent event that carried tokens.
struct TokenChunk {
  double seconds = 0.0;  // from the request's start
  int32_t tokens = 0;    // its choices' token_ids when given, else one per choice with text
};

struct RequestResult {
  bool stream = false;                 // the request body asked for a stream
  int status = 0;                      // HTTP status; 0: no response head arrived
  std::map<std::string, std::string> headers;  // response headers, names in lower case
  std::string error;                   // a transport error, a non-2xx body, an SSE error event (else empty)
  double scheduled_seconds = 0.0;      // its arrival_seconds
  double start_seconds = 0.0;          // when it really started, from the start of the run
  double ttft_seconds = -1.0;          // from the start to the first content chunk; -1: none came
  double latency_seconds = 0.0;        // from the start to the end of the response (or of the failure)
  std::vector<TokenChunk> chunks;      // every content chunk, in order
  int32_t completion_tokens = 0;       // the usage's completion (output) tokens when reported, else counted
  int32_t counted_tokens = 0;          // the tokens of `chunks` (streams)
  int32_t prompt_tokens = 0;           // the usage's prompt (input) tokens when reported
  bool usage = false;                  // a usage object was reported
  std::string text;                    // choice 0's text, concatenated over the chunks
  std::string finish_reason;           // choice 0's (Anthropic: stop_reason)
  bool done = false;                   // the stream ended with data: [DONE] (Anthropic: message_stop)
  bool disconnected = false;           // closed by the client after disconnect_after_chunks chunks
  int32_t malformed_events = 0;        // SSE data that was not JSON (the first one is in `error`)
  nlohmann::json body;                 // non-streaming: the response body (null when not JSON)
  std::string raw_body;                // non-streaming or not 2xx: the body's text
  std::vector<nlohmann::json> events;  // keep_events: every SSE data event's JSON, in order

  // A 2xx response, no error, and (for a stream) [DONE] or the client's own disconnect.
  bool ok() const;
};

// Runs `requests` against options.url; result i belongs to request i. A URL that cannot be parsed
// or resolved fails every request (status 0, `error` says why).
std::vector<RequestResult> run_load(const std::vector<LoadRequest>& requests, const LoadOptions& options);

struct LoadSummary {
  int32_t requests = 0, ok = 0, errors = 0;  // errors: requests that are not ok()
  int64_t completion_tokens = 0;             // over every request
  double seconds = 0.0;                      // from the first start to the last end
  double output_tokens_per_s = 0.0;          // completion_tokens / seconds
  double requests_per_s = 0.0;               // ok / seconds
  double ttft_ms_p50 = 0, ttft_ms_p99 = 0;   // requests with a first token
  double tpot_ms_p50 = 0, tpot_ms_p99 = 0;   // (last chunk - first chunk) / (tokens - 1), tokens > 1
  double e2e_ms_p50 = 0, e2e_ms_p99 = 0;     // latency of the ok requests
  double max_start_lag_ms = 0;               // the most a request started after its arrival time
};

LoadSummary summarize(const std::vector<RequestResult>& results);
nlohmann::json to_json(const LoadSummary& s);
// The p-th percentile (0..100), linear between the closest ranks; 0 for no values.
double percentile(std::vector<double> values, double p);

}  // namespace kiln::bench
