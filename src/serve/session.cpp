// One HTTP connection of kiln serve: reads requests (keep-alive, pipelining tolerated), checks the
// API key, routes, and writes responses; completions run on the engine, streamed as server-sent
// events in chunked encoding. While a completion runs, a read on the socket watches for the client
// going away, which cancels its choices at once.
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "serve/anthropic_protocol.h"
#include "serve/chat_messages.h"
#include "serve/openai_protocol.h"
#include "serve/request_fields.h"
#include "serve/server_internal.h"

namespace kiln::serve {

std::string_view chat_page_html();  // generated from chat_page.html (serve/embed_page.cmake)

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxPendingOutput = size_t(8) << 20;  // a client this far behind is dropped
constexpr int64_t kMaxHeaderBytes = 64 << 10;

const char* reason_phrase(int status) {
  return http::obsolete_reason(static_cast<http::status>(status)).data();
}

std::string chunk_frame(const std::string& data) {
  char head[24];
  std::snprintf(head, sizeof head, "%zx\r\n", data.size());
  return head + data + "\r\n";
}

}  // namespace

bool api_key_matches(const std::string& presented, const std::string& expected) {
  // Constant time in the presented key's content: every byte is compared, lengths included.
  unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  const size_t n = std::max(presented.size(), expected.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    const unsigned char b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0;
    diff |= static_cast<unsigned char>(a ^ b);
  }
  return diff == 0;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerCore& core, tcp::socket socket) : core_(core), stream_(std::move(socket)) {
    beast::error_code ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(ec);
    if (!ec) {
      remote_ = peer.address().to_string() + ":" + std::to_string(peer.port());
      loopback_ = peer.address().is_loopback();
    }
    core_.metrics.connection_opened();
  }
  ~Session() {
    if (run_) core_.metrics.run_ended();  // destroying the run cancels what still runs
    core_.metrics.connection_closed();
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }
  // From shutdown: cancel what runs and close.
  void close() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->run_) self->run_->cancel();
      self->closing_ = true;
      if (!self->run_) self->shutdown_socket();
    });
  }

 private:
  // ---- reading requests
  void read_request() {
    if (closing_ || core_.draining) return shutdown_socket();
    logged_ = false;
    error_.clear();
    status_ = 0;
    request_id_.clear();
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(core_.options.max_body_bytes));
    parser_->header_limit(static_cast<uint32_t>(kMaxHeaderBytes));
    stream_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(core_.options.idle_timeout_seconds * 1000)));
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      started_ = Clock::now();
      route_ = "other";
      return respond_error(413, "the request body is larger than " + std::to_string(core_.options.max_body_bytes) +
                                    " bytes (--max-body-bytes)", anthropic_route(std::string(parser_->get().target())));
    }
    if (ec == http::error::header_limit || ec == http::error::bad_target || ec == http::error::bad_method ||
        ec == http::error::bad_version || ec == http::error::bad_field || ec == http::error::bad_value ||
        ec == http::error::bad_line_ending || ec == http::error::bad_chunk || ec == http::error::bad_content_length ||
        ec == http::error::bad_transfer_encoding || ec == http::error::bad_obs_fold) {
      keep_alive_ = false;
      started_ = Clock::now();
      route_ = "other";
      return respond_error(400, "malformed HTTP request: " + ec.message(), false);
    }
    if (ec) return shutdown_socket();  // closed, timed out
    started_ = Clock::now();
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    stream_.expires_never();
    route_guarded();
  }

  // The error boundary of one request: whatever its handler throws (JSON of a type a parser did not
  // check, an allocation that fails) answers the request with an error, or ends a response already
  // under way, and the server goes on serving everyone else.
  void route_guarded() {
    try {
      route();
    } catch (const std::exception& e) {
      const bool json_error = dynamic_cast<const Json::exception*>(&e) != nullptr;
      std::fprintf(stderr, "kiln: %s %s failed: %s\n", std::string(request_.method_string()).c_str(), path_.c_str(),
                   e.what());
      if (status_ == 0 && !run_ && outbox_.empty() && !writing_) {
        const std::string what = e.what();
        return json_error ? respond_error(400, "invalid request: " + what, anthropic_)
                          : respond_error(500, "internal error: " + what, anthropic_);
      }
      client_gone();
    }
  }

  static bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

  // ---- routing
  void route() {
    std::string target(request_.target());
    path_ = target.substr(0, target.find('?'));
    anthropic_ = anthropic_route(path_);
    const http::verb method = request_.method();
    route_ = path_.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : path_;
    if (core_.draining) return respond_error(503, "the server is shutting down", anthropic_);
    if (method == http::verb::options) return preflight();  // before the key: browsers send none here
    if (core_.options.api_key.empty() && !core_.options.host_given && !loopback_)
      return respond_error(403, "without an API key only loopback clients are served", anthropic_);
    const bool api = path_.rfind("/v1/", 0) == 0 || path_ == "/metrics";
    const bool admin = path_.rfind("/v1/admin/", 0) == 0;
    if (admin) {
      if (core_.options.api_key.empty())
        return respond_error(403, "admin routes need an API key: start kiln serve with --api-key (or KILN_API_KEY)", false);
      if (!authorized()) return respond_error(401, "invalid or missing API key", false);
    } else if (api && !core_.options.api_key.empty() && !authorized()) {
      return respond_error(401, anthropic_ ? "invalid x-api-key" : "Incorrect API key provided", anthropic_);
    }
    auto is = [&](http::verb v, const char* p) { return method == v && path_ == p; };
    if (is(http::verb::get, "/") || is(http::verb::get, "/index.html"))
      return respond(200, "text/html; charset=utf-8", std::string(chat_page_html()));
    if (is(http::verb::get, "/health")) return respond_json(200, {{"status", "ok"}});
    if (is(http::verb::get, "/metrics"))
      return respond(200, "text/plain; version=0.0.4; charset=utf-8",
                     core_.metrics.render(core_.model.engine->stats(), core_.ctx.model_name));
    if (is(http::verb::get, "/v1/models"))
      return respond_json(200, openai_models(core_.ctx, core_.model.engine->policy_version(), core_.started_at));
    if (method == http::verb::get && route_ == "/v1/models/{id}") {
      if (path_.substr(11) != core_.ctx.model_name) return respond_error(404, "The model '" + path_.substr(11) + "' does not exist", false);
      return respond_json(200, openai_models(core_.ctx, core_.model.engine->policy_version(), core_.started_at)["data"][0]);
    }
    if (is(http::verb::post, "/v1/chat/completions")) return start_completion(Protocol::openai_chat);
    if (is(http::verb::post, "/v1/completions")) return start_completion(Protocol::openai_completion);
    if (is(http::verb::post, "/v1/messages")) return start_completion(Protocol::anthropic_messages);
    if (is(http::verb::post, "/v1/messages/count_tokens")) return count_tokens();
    if (is(http::verb::post, "/v1/admin/update_weights")) return update_weights();
    if (is(http::verb::post, "/v1/admin/flush_cache")) {
      core_.model.engine->flush_prefix_cache();
      return respond_json(200, {{"flushed", true}});
    }
    static constexpr const char* kRoutes[] = {"/", "/index.html", "/health", "/metrics", "/v1/models",
                                              "/v1/chat/completions", "/v1/completions", "/v1/messages",
                                              "/v1/messages/count_tokens", "/v1/admin/update_weights",
                                              "/v1/admin/flush_cache"};
    const bool known = route_ == "/v1/models/{id}" ||
                       std::find(std::begin(kRoutes), std::end(kRoutes), path_) != std::end(kRoutes);
    if (!known) route_ = "other";
    if (known) return respond_error(405, "method " + std::string(request_.method_string()) + " is not allowed on " + path_, anthropic_);
    return respond_error(404, "no route " + path_, anthropic_);
  }

  // CORS (--allow-origin): the header on every response, and the answer to a browser's preflight.
  std::string cors_headers() const {
    const std::string& origin = core_.options.allow_origin;
    if (origin.empty()) return "";
    return "Access-Control-Allow-Origin: " + origin + "\r\n" + (origin == "*" ? "" : "Vary: Origin\r\n");
  }
  void preflight() {
    if (core_.options.allow_origin.empty()) return respond_error(405, "CORS is off: start kiln serve with --allow-origin", anthropic_);
    respond(204, "text/plain", "",
            {{"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
             {"Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"},
             {"Access-Control-Max-Age", "600"}});
  }

  bool authorized() const {
    std::string presented;
    auto auth = request_.find(http::field::authorization);
    if (auth != request_.end()) {
      std::string v(auth->value());
      if (v.rfind("Bearer ", 0) == 0) presented = v.substr(7);
    }
    auto x = request_.find("x-api-key");
    if (presented.empty() && x != request_.end()) presented = std::string(x->value());
    return !presented.empty() && api_key_matches(presented, core_.options.api_key);
  }

  // ---- plain responses
  void respond(int status, const std::string& content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> headers = {}) {
    status_ = status;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    head += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    for (const auto& [k, v] : headers) head += k + ": " + v + "\r\n";
    head += cors_headers();
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    log_request();
    send(head + body, /*last=*/true);
  }
  void respond_json(int status, const Json& j, std::vector<std::pair<std::string, std::string>> headers = {}) {
    respond(status, "application/json", j.dump(-1, ' ', false, Json::error_handler_t::replace), std::move(headers));
  }
  void respond_error(int status, const std::string& message, bool anthropic,
                     std::vector<std::pair<std::string, std::string>> headers = {}) {
    ApiError e;
    e.status = status;
    e.message = message;
    e.type = openai_error_type(status);
    respond_error(e, anthropic, std::move(headers));
  }
  void respond_error(const ApiError& e, bool anthropic, std::vector<std::pair<std::string, std::string>> headers = {}) {
    error_ = e.message;
    respond_json(e.status, anthropic ? anthropic_error_body(e) : openai_error_body(e), std::move(headers));
  }

  // ---- writing: `outbox_` collects bytes while a write is in flight
  void send(std::string bytes, bool last) {
    outbox_ += bytes;
    if (last) response_done_ = true;
    if (outbox_.size() > kMaxPendingOutput) return client_gone();
    if (!writing_) write_next();
  }
  void write_next() {
    if (outbox_.empty()) {
      if (response_done_) after_response();
      return;
    }
    writing_ = true;
    inflight_.swap(outbox_);
    outbox_.clear();
    stream_.expires_after(std::chrono::seconds(60));
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      self->inflight_.clear();
      if (ec) return self->client_gone();
      self->stream_.expires_never();
      self->write_next();
    });
  }
  void after_response() {
    response_done_ = false;
    if (run_) finish_run_bookkeeping();
    if (!keep_alive_ || closing_) return shutdown_socket();
    if (watching_) {  // the watch read is still pending: it hands over to read_request when it completes
      resume_after_watch_ = true;
      stream_.socket().cancel();
      return;
    }
    read_request();
  }
  void shutdown_socket() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  // ---- completions
  void start_completion(Protocol protocol) {
    if (core_.metrics.open_runs() >= core_.options.max_queued) {
      return respond_error(429, "the server has " + std::to_string(core_.options.max_queued) +
                                    " requests in flight (--max-queued); retry shortly", anthropic_,
                           {{"Retry-After", std::to_string(core_.options.retry_after_seconds)}});
    }
    Result<Json> body = parse_request_body(request_.body());
    if (!body.ok()) return respond_error(api_error_from(body.status()), anthropic_);
    Result<CompletionJob> job = protocol == Protocol::anthropic_messages ? parse_anthropic_messages(*body, core_.ctx)
                                : protocol == Protocol::openai_chat      ? parse_openai_chat(*body, core_.ctx)
                                                                         : parse_openai_completion(*body, core_.ctx);
    if (!job.ok()) {
      ApiError e = api_error_from(job.status());
      if (e.status == 404) e.code = "model_not_found";
      if (job.status().message().find("maximum context length") != std::string::npos) e.code = "context_length_exceeded";
      return respond_error(e, anthropic_);
    }
    std::weak_ptr<Session> weak = weak_from_this();
    auto ex = stream_.get_executor();
    std::shared_ptr<EventGate> gate = core_.gate;
    auto news = news_pending_;
    Result<std::unique_ptr<CompletionRun>> run = CompletionRun::start(*core_.model.engine, *job, [gate, weak, ex, news] {
      if (news->exchange(true)) return;  // a poll is already on its way
      std::shared_lock<std::shared_mutex> lock(gate->mu);
      if (!gate->open) return;
      net::post(ex, [weak] {
        if (auto s = weak.lock()) s->on_news();
      });
    });
    if (!run.ok()) return respond_error(api_error_from(run.status()), anthropic_);
    run_ = std::move(run).value();
    core_.metrics.run_started();
    protocol_ = protocol;
    stream_mode_ = run_->job().stream;
    const std::string prefix = protocol == Protocol::anthropic_messages ? "msg_"
                               : protocol == Protocol::openai_chat      ? "chatcmpl-"
                                                                        : "cmpl-";
    request_id_ = prefix + random_id(24);
    created_ = unix_seconds();
    first_token_ = Clock::time_point{};
    if (stream_mode_) {
      status_ = 200;
      std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         "Transfer-Encoding: chunked\r\nX-Request-Id: " + request_id_ + "\r\n";
      head += cors_headers();
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      std::string first;
      if (protocol == Protocol::anthropic_messages) {
        anthropic_stream_.emplace(run_->job(), request_id_);
        first = anthropic_stream_->begin();
      } else {
        openai_stream_.emplace(run_->job(), core_.ctx, request_id_, created_);
        first = openai_stream_->begin();
      }
      send(head + (first.empty() ? "" : chunk_frame(first)), false);
    }
    watch_client();
    on_news();  // events that came before the listener was set
  }

  void on_news() {
    news_pending_->store(false);
    if (!run_ || run_done_) return;
    std::vector<ChoiceDelta> deltas = run_->poll();
    for (const ChoiceDelta& d : deltas) {
      if (!d.tokens.empty()) {
        if (first_token_ == Clock::time_point{}) first_token_ = Clock::now();
        last_token_ = Clock::now();
      }
    }
    if (stream_mode_) {
      std::string sse = anthropic_stream_ ? anthropic_stream_->deltas(deltas) : openai_stream_->deltas(deltas);
      if (!sse.empty()) send(chunk_frame(sse), false);
    }
    if (!run_ || !run_->finished()) return;  // (a client too slow to read was dropped by send)
    run_done_ = true;
    const ChoiceResult* failed = nullptr;
    for (const ChoiceResult& r : run_->results())
      if (!r.error.empty()) failed = &r;
    if (stream_mode_) {
      std::string tail;
      if (failed) {
        ApiError e{500, "server_error", failed->error, "", ""};
        tail = anthropic_stream_ ? AnthropicStream::error(e) : OpenAIStream::error(e);
        error_ = failed->error;
      }
      tail += anthropic_stream_ ? anthropic_stream_->end(*run_) : openai_stream_->end(*run_);
      log_request();
      send(chunk_frame(tail) + "0\r\n\r\n", true);
    } else if (failed) {
      respond_error(ApiError{500, "server_error", failed->error, "", ""}, anthropic_);
    } else {
      respond_json(200, protocol_ == Protocol::anthropic_messages ? anthropic_response(*run_, request_id_)
                                                                  : openai_response(*run_, core_.ctx, request_id_, created_));
    }
  }

  // Reads while a completion runs: end of file or an error means the client left (pipelined bytes
  // are kept for the next request).
  void watch_client() {
    if (watching_) return;
    watching_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (!ec) self->buffer_.commit(n);
      if (self->resume_after_watch_) {
        self->resume_after_watch_ = false;
        if (ec && ec != net::error::operation_aborted) return self->shutdown_socket();
        return self->read_request();
      }
      if (ec == net::error::operation_aborted) return;
      if (ec) return self->client_gone();
      if (self->buffer_.size() > static_cast<size_t>(kMaxHeaderBytes + self->core_.options.max_body_bytes))
        return self->client_gone();
      if (self->run_ && !self->run_done_) self->watch_client();
    });
  }

  void client_gone() {
    if (run_ && !run_done_) {
      core_.metrics.client_disconnected();
      error_ = "client disconnected";
      status_ = 499;
      log_request();
      core_.metrics.run_ended();
      run_.reset();  // cancels every choice still running: the engine frees their KV at its next step
      openai_stream_.reset();
      anthropic_stream_.reset();
    }
    keep_alive_ = false;
    closing_ = true;
    outbox_.clear();
    shutdown_socket();
  }

  void finish_run_bookkeeping() {
    if (!run_) return;
    if (!run_done_) return;  // still draining its cancelled choices
    const Usage u = run_->total_usage();
    const double e2e = std::chrono::duration<double>(Clock::now() - started_).count();
    const bool has_first = first_token_ != Clock::time_point{};
    const double ttft = has_first ? std::chrono::duration<double>(first_token_ - started_).count() : -1;
    const int64_t per_choice = run_->results().empty() ? 0 : u.completion_tokens / static_cast<int64_t>(run_->results().size());
    const double tpot = has_first && per_choice > 1
                            ? std::chrono::duration<double>(last_token_ - first_token_).count() / static_cast<double>(per_choice - 1)
                            : -1;
    core_.metrics.completion_done(ttft, tpot, e2e, u.prompt_tokens, u.completion_tokens);
    core_.metrics.run_ended();
    run_.reset();
    run_done_ = false;
    anthropic_stream_.reset();
    openai_stream_.reset();
  }

  // ---- other routes
  void count_tokens() {
    Result<Json> body = parse_request_body(request_.body());
    if (!body.ok()) return respond_error(api_error_from(body.status()), true);
    Json b = *body;
    if (!b.contains("max_tokens")) b["max_tokens"] = 1;
    b.erase("stream");
    Result<CompletionJob> job = parse_anthropic_messages(b, core_.ctx);
    if (!job.ok()) return respond_error(api_error_from(job.status()), true);
    respond_json(200, {{"input_tokens", static_cast<int64_t>(job->prompts.at(0).size())}});
  }

  void update_weights() {
    Result<Json> body = parse_request_body(request_.body());
    if (!body.ok()) return respond_error(api_error_from(body.status()), false);
    const Json& b = *body;
    for (const char* key : {"checkpoint_dir", "model_path", "mode"})
      if (b.contains(key) && !b[key].is_null() && !b[key].is_string())
        return respond_error(400, std::string("'") + key + "' must be a string", false);
    std::string dir = string_member(b, "checkpoint_dir");
    if (dir.empty()) dir = string_member(b, "model_path");
    if (dir.empty()) return respond_error(400, "'checkpoint_dir' is required: the folder of the new weights", false);
    if (!b.contains("version") || !b["version"].is_number_unsigned())
      return respond_error(400, "'version' is required: a non-negative integer above the version serving", false);
    const uint64_t version = b["version"].get<uint64_t>();
    const bool mode_given = b.contains("mode") && !b["mode"].is_null();  // a string, checked above
    Result<WeightUpdateMode> mode = parse_weight_update_mode(mode_given ? string_member(b, "mode") : "sync");
    if (!mode.ok()) return respond_error(api_error_from(mode.status()), false);
    for (auto it = b.begin(); it != b.end(); ++it)
      if (it.key() != "checkpoint_dir" && it.key() != "model_path" && it.key() != "version" && it.key() != "mode")
        return respond_error(400, "unknown parameter '" + it.key() + "' for /v1/admin/update_weights", false);
    // The update blocks until the engine acknowledges it: off the Asio threads.
    Engine* engine = core_.model.engine;
    auto self = shared_from_this();
    WeightUpdateMode m = *mode;
    core_.run_blocking([self, engine, dir, version, m] {
      Result<WeightUpdateAck> ack = engine->update_weights(WeightSource::checkpoint(dir), version, m);
      net::post(self->stream_.get_executor(), [self, ack = std::move(ack), m]() mutable {
        if (!ack.ok()) return self->respond_error(api_error_from(ack.status()), false);
        self->respond_json(200, {{"version", ack->version}, {"mode", weight_update_mode_name(m)},
                                 {"aborted", ack->aborted}, {"kept", ack->kept}, {"seconds", ack->seconds},
                                 {"drain_seconds", ack->drain_seconds}, {"copy_seconds", ack->copy_seconds}});
      });
    });
  }

  // ---- the access log: one JSON line per request
  void log_request() {
    if (logged_) return;
    logged_ = true;
    core_.metrics.request_done(route_, status_);
    if (core_.options.access_log) {
      Json line = {{"time", unix_seconds()}, {"remote", remote_}, {"method", std::string(request_.method_string())},
                   {"path", path_}, {"status", status_},
                   {"ms", std::chrono::duration<double, std::milli>(Clock::now() - started_).count()}};
      if (run_) {
        const Usage u = run_->total_usage();
        line["id"] = request_id_;
        line["stream"] = stream_mode_;
        line["prompt_tokens"] = u.prompt_tokens;
        line["cached_tokens"] = u.cached_tokens;
        line["completion_tokens"] = u.completion_tokens;
        if (first_token_ != Clock::time_point{})
          line["ttft_ms"] = std::chrono::duration<double, std::milli>(first_token_ - started_).count();
        if (!run_->results().empty()) line["finish_reason"] = run_->results()[0].finish_reason;
      }
      if (!error_.empty()) line["error"] = error_;
      const std::string s = line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
      std::fwrite(s.data(), 1, s.size(), stderr);
    }
  }

  ServerCore& core_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::string remote_, path_, route_, request_id_, error_;
  bool loopback_ = false, keep_alive_ = true, anthropic_ = false, closing_ = false;
  int status_ = 0;
  Clock::time_point started_, first_token_, last_token_;
  int64_t created_ = 0;
  // writing
  std::string outbox_, inflight_;
  bool writing_ = false, response_done_ = false;
  // the completion in progress
  std::unique_ptr<CompletionRun> run_;
  Protocol protocol_ = Protocol::openai_chat;
  bool stream_mode_ = false, run_done_ = false;
  bool watching_ = false, resume_after_watch_ = false;
  std::shared_ptr<std::atomic<bool>> news_pending_ = std::make_shared<std::atomic<bool>>(false);
  std::optional<OpenAIStream> openai_stream_;
  std::optional<AnthropicStream> anthropic_stream_;
  bool logged_ = false;
};

void start_session(ServerCore& core, tcp::socket socket) {
  auto s = std::make_shared<Session>(core, std::move(socket));
  {
    std::lock_guard<std::mutex> lock(core.sessions_mu);
    for (auto it = core.sessions.begin(); it != core.sessions.end();)  // forget closed ones
      it = it->expired() ? core.sessions.erase(it) : std::next(it);
    core.sessions.insert(s);
  }
  s->start();
}

void close_session(const std::shared_ptr<Session>& s) { s->close(); }

}  // namespace kiln::serve
