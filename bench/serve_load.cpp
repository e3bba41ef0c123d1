// serve_load (see serve_load.h): one io_context per thread (no locks or strands between threads),
// the requests dealt round-robin among them, one Session per request. A session waits for its
// arrival time, connects, writes its request and reads the response with an HTTP parser whose
// string body it empties after every read: streamed bodies go through a line-based SSE parser
// (data / event fields, a blank line ends an event, LF or CRLF line ends), whole bodies are kept
// for the end. One timer per session serves first as its arrival, then as its deadline (closing
// the socket); socket operations carry no timers of their own. Each session writes only its own
// result.
#include "serve_load.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

namespace kiln::bench {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const std::string* string_field(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
}

const json* object_field(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_object() ? &*it : nullptr;
}

bool int_field(const json& o, const char* key, int32_t& out) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) return false;
  out = it->get<int32_t>();
  return true;
}

bool wants_stream(const LoadRequest& r) {
  const json parsed = r.raw_body.empty() ? json() : json::parse(r.raw_body, nullptr, false);
  const json& body = r.raw_body.empty() ? r.body : parsed;
  if (!body.is_object()) return false;
  auto it = body.find("stream");
  return it != body.end() && it->is_boolean() && it->get<bool>();
}

// http://host[:port][/prefix]; the prefix goes before every request's path.
struct Target {
  std::string host, port = "80", host_header, prefix;
};

bool parse_url(const std::string& url, Target& t, std::string& why) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    why = "serve_load: only http:// URLs are supported, not \"" + url + "\"";
    return false;
  }
  std::string rest = url.substr(scheme.size());
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    t.prefix = rest.substr(slash);
    while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
    rest.resize(slash);
  }
  t.host_header = rest;
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [v6 address]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) {
      why = "serve_load: unterminated IPv6 address in \"" + url + "\"";
      return false;
    }
    t.host = rest.substr(1, close - 1);
    const std::string after = rest.substr(close + 1);
    if (!after.empty() && after[0] != ':') {
      why = "serve_load: cannot read the port of \"" + url + "\"";
      return false;
    }
    if (!after.empty()) port = after.substr(1);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    t.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  } else {
    t.host = rest;
  }
  if (t.host.empty()) {
    why = "serve_load: no host in \"" + url + "\"";
    return false;
  }
  if (!port.empty()) t.port = port;
  return true;
}

// Room for every connection at once, on both ends when the server runs in this process.
void raise_open_file_limit(size_t connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t need = static_cast<rlim_t>(2 * connections + 256);
  if (rl.rlim_cur >= need || rl.rlim_cur == rl.rlim_max) return;
  rlimit raised = rl;
  raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : rl.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0 && raised.rlim_cur != need) {
    raised.rlim_cur = std::min(need, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &raised);
  }
}

// What every session of one run shares (read-only once the sessions start).
struct Run {
  std::vector<std::unique_ptr<asio::io_context>> contexts;  // one per thread
  tcp::resolver::results_type endpoints;
  Target target;
  LoadOptions options;
  Clock::time_point t0;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Run& run, asio::io_context& ioc, const LoadRequest& req, RequestResult& out)
      : run_(run), req_(req), out_(out), timer_(ioc.get_executor()), socket_(ioc.get_executor()) {}

  // Builds the request (an error fails it at its arrival); called before the run's clock starts.
  void prepare() {
    const http::verb verb = http::string_to_verb(req_.method);
    if (verb == http::verb::unknown) {
      build_error_ = "serve_load: unknown HTTP method \"" + req_.method + "\"";
      return;
    }
    request_.method(verb);
    request_.target(run_.target.prefix + req_.path);
    request_.version(11);
    request_.keep_alive(false);
    request_.set(http::field::host, run_.target.host_header);
    request_.set(http::field::user_agent, "kiln-serve-load");
    if (out_.stream) request_.set(http::field::accept, "text/event-stream");
    const std::string& key = req_.api_key.empty() ? run_.options.api_key : req_.api_key;
    if (!key.empty()) request_.set(http::field::authorization, "Bearer " + key);
    std::string body = !req_.raw_body.empty() ? req_.raw_body : req_.body.is_null() ? "" : dump(req_.body);
    if (!body.empty()) request_.set(http::field::content_type, req_.content_type);
    for (const auto& [name, value] : req_.headers) request_.set(name, value);
    request_.body() = std::move(body);
    request_.prepare_payload();
  }

  void start() {
    timer_.expires_at(run_.t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(std::max(0.0, req_.arrival_seconds))));
    timer_.async_wait(beast::bind_front_handler(&Session::on_arrival, shared_from_this()));
  }

 private:
  double since_start() const { return secs(start_, Clock::now()); }

  void on_arrival(beast::error_code) {
    start_ = Clock::now();
    out_.start_seconds = secs(run_.t0, start_);
    if (!build_error_.empty()) return fail(build_error_);
    const double limit = run_.options.timeout_seconds;
    if (std::isfinite(limit) && limit > 0) {
      timer_.expires_at(start_ + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::min(limit, 1e7))));
      timer_.async_wait(beast::bind_front_handler(&Session::on_deadline, shared_from_this()));
    }
    asio::async_connect(socket_, run_.endpoints, beast::bind_front_handler(&Session::on_connect, shared_from_this()));
  }

  void on_deadline(beast::error_code ec) {
    if (ec == asio::error::operation_aborted || finished_) return;
    timed_out_ = true;  // the operation in flight ends with operation_aborted
    beast::error_code ignored;
    socket_.close(ignored);
  }

  void on_connect(beast::error_code ec, const tcp::endpoint&) {
    if (ec) return fail("connect", ec);
    http::async_write(socket_, request_, beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  // A server may answer before it has read the whole request (413 for a body too large) and close:
  // after a failed write the answer is still read, and the write's error reported only without one.
  void on_write(beast::error_code ec, size_t) {
    if (ec && (timed_out_ || ec == asio::error::operation_aborted)) return fail("write", ec);
    if (ec) write_error_ = "write: " + ec.message();
    parser_.emplace();
    // Streams are emptied as they go; whole bodies may be large. (Not boost::none: Beast 1.74
    // compares a content length with an empty limit as exceeding it.)
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    read();
  }

  void read() {
    http::async_read_some(socket_, buffer_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (!head_seen_ && parser_->is_header_done()) on_head();
    std::string& body = parser_->get().body();
    if (sse_ && !body.empty()) {
      feed(body);
      body.clear();
    }
    if (stop_) {
      out_.disconnected = true;
      return finish();
    }
    if (parser_->is_done()) return finish();
    if (ec && !head_seen_ && !write_error_.empty()) return fail(write_error_);
    if (ec == http::error::end_of_stream && !head_seen_)
      return fail("serve_load: the server closed the connection before it answered");
    if (ec) return fail(head_seen_ ? "read (body)" : "read (head)", ec);
    read();
  }

  void on_head() {
    head_seen_ = true;
    const auto& h = parser_->get();
    out_.status = static_cast<int>(h.result_int());
    for (const auto& f : h) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      out_.headers[name] = std::string(f.value());
    }
    if (out_.stream && out_.status / 100 == 2) {
      const auto ct = h[http::field::content_type];
      sse_ = ct.find("text/event-stream") != std::string_view::npos;
      if (!sse_) set_error("serve_load: a stream was asked for, the response's content type is \"" + std::string(ct) + "\"");
    }
  }

  void set_error(const std::string& e) {
    if (out_.error.empty()) out_.error = e;
  }

  void fail(const std::string& what, beast::error_code ec = {}) {
    if (timed_out_)
      set_error(what + ": timed out after " + std::to_string(run_.options.timeout_seconds) + " s");
    else
      set_error(ec ? what + ": " + ec.message() : what);
    finish();
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    out_.latency_seconds = since_start();
    timer_.cancel();
    if (parser_ && head_seen_ && !sse_) {
      out_.raw_body = std::move(parser_->get().body());
      if (out_.status / 100 == 2) on_whole_body();
    }
    if (sse_) out_.completion_tokens = out_.usage ? reported_completion_ : out_.counted_tokens;
    if (head_seen_ && out_.status / 100 != 2)
      set_error(out_.raw_body.empty() ? "HTTP " + std::to_string(out_.status) : out_.raw_body);
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // SSE: complete lines of `bytes` (with what is left of earlier reads) are handled; a partial
  // line waits for the next read.
  void feed(const std::string& bytes) {
    pending_ += bytes;
    size_t pos = 0;
    while (!stop_) {
      const size_t nl = pending_.find('\n', pos);
      if (nl == std::string::npos) break;
      std::string_view line(pending_.data() + pos, nl - pos);
      pos = nl + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      on_line(line);
    }
    pending_.erase(0, pos);
  }

  void on_line(std::string_view line) {
    if (line.empty()) {  // the end of an event
      if (has_data_) on_event(data_);
      data_.clear();
      event_.clear();
      has_data_ = false;
      return;
    }
    if (line[0] == ':') return;  // a comment (keep-alive)
    const size_t colon = line.find(':');
    const std::string_view field = line.substr(0, colon);
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_.append(value);
      has_data_ = true;
    } else if (field == "event") {
      event_.assign(value);
    }
  }

  void on_event(const std::string& data) {
    if (data == "[DONE]") {
      out_.done = true;
      return;
    }
    json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      if (out_.malformed_events++ == 0) set_error("serve_load: malformed SSE data: " + data.substr(0, 200));
      return;
    }
    on_chunk(j);
    if (run_.options.keep_events) out_.events.push_back(std::move(j));
  }

  void on_usage(const json& u) {
    int32_t n = 0;
    if (int_field(u, "completion_tokens", n) || int_field(u, "output_tokens", n)) {
      out_.usage = true;
      reported_completion_ = n;
    }
    if (int_field(u, "prompt_tokens", n) || int_field(u, "input_tokens", n)) out_.prompt_tokens = n;
  }

  // One data event's JSON: OpenAI chunks (choices, usage, error) and Anthropic events (type).
  void on_chunk(const json& j) {
    if (!j.is_object()) return;
    const double now = since_start();
    int32_t tokens = 0;
    if (auto it = j.find("error"); it != j.end() && !it->is_null()) set_error(dump(*it));
    if (auto it = j.find("choices"); it != j.end() && it->is_array()) {
      for (const json& c : *it) {
        if (!c.is_object()) continue;
        int32_t index = 0;
        int_field(c, "index", index);
        std::string_view piece;
        bool content = false;
        if (const std::string* t = string_field(c, "text")) {
          piece = *t;
        } else if (const json* d = object_field(c, "delta")) {
          if (const std::string* t = string_field(*d, "content")) piece = *t;
          if (const std::string* r = string_field(*d, "reasoning_content")) content = !r->empty();
          if (auto tc = d->find("tool_calls"); tc != d->end() && tc->is_array() && !tc->empty()) content = true;
        }
        content = content || !piece.empty();
        int32_t ids = 0;
        if (auto ti = c.find("token_ids"); ti != c.end() && ti->is_array()) ids = static_cast<int32_t>(ti->size());
        tokens += ids > 0 ? ids : content ? 1 : 0;
        if (index == 0) {
          out_.text.append(piece);
          if (const std::string* f = string_field(c, "finish_reason")) out_.finish_reason = *f;
        }
      }
    }
    if (const json* u = object_field(j, "usage")) on_usage(*u);
    if (const std::string* type = string_field(j, "type")) {  // Anthropic messages
      if (*type == "content_block_delta") {
        if (const json* d = object_field(j, "delta")) {
          const std::string* text = string_field(*d, "text");
          if (text) out_.text += *text;
          bool content = text && !text->empty();
          for (const char* key : {"thinking", "partial_json"})  // tokens, not text
            if (const std::string* t = string_field(*d, key)) content = content || !t->empty();
          tokens += content ? 1 : 0;
        }
      } else if (*type == "message_start") {
        if (const json* m = object_field(j, "message"))
          if (const json* u = object_field(*m, "usage")) on_usage(*u);
      } else if (*type == "message_delta") {
        if (const json* d = object_field(j, "delta"))
          if (const std::string* r = string_field(*d, "stop_reason")) out_.finish_reason = *r;
      } else if (*type == "message_stop") {
        out_.done = true;
      }
    }
    if (tokens > 0) {
      out_.chunks.push_back({now, tokens});
      out_.counted_tokens += tokens;
      if (out_.ttft_seconds < 0) out_.ttft_seconds = now;
      ++content_chunks_;
      if (req_.disconnect_after_chunks > 0 && content_chunks_ >= req_.disconnect_after_chunks) stop_ = true;
    }
  }

  // A whole 2xx body: OpenAI (choices[0].text / message.content) or Anthropic (content[].text).
  void on_whole_body() {
    out_.body = json::parse(out_.raw_body, nullptr, false);
    if (out_.body.is_discarded()) {
      out_.body = json();
      return;
    }
    if (!out_.body.is_object()) return;
    const json& b = out_.body;
    if (auto it = b.find("choices"); it != b.end() && it->is_array() && !it->empty() && (*it)[0].is_object()) {
      const json& c = (*it)[0];
      if (const std::string* t = string_field(c, "text")) out_.text = *t;
      if (const json* m = object_field(c, "message"))
        if (const std::string* t = string_field(*m, "content")) out_.text = *t;
      if (const std::string* f = string_field(c, "finish_reason")) out_.finish_reason = *f;
    }
    if (auto it = b.find("content"); it != b.end() && it->is_array()) {
      for (const json& block : *it)
        if (block.is_object())
          if (const std::string* t = string_field(block, "text")) out_.text += *t;
      if (const std::string* r = string_field(b, "stop_reason")) out_.finish_reason = *r;
    }
    if (const json* u = object_field(b, "usage")) on_usage(*u);
    out_.completion_tokens = reported_completion_;
  }

  Run& run_;
  const LoadRequest& req_;
  RequestResult& out_;
  asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, asio::io_context::executor_type> timer_;
  asio::basic_stream_socket<tcp, asio::io_context::executor_type> socket_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::optional<http::response_parser<http::string_body>> parser_;
  std::string build_error_, write_error_;
  Clock::time_point start_;
  bool head_seen_ = false, sse_ = false, stop_ = false, finished_ = false, timed_out_ = false;
  std::string pending_, data_, event_;  // SSE: unparsed bytes, the event being read
  bool has_data_ = false;
  int32_t content_chunks_ = 0, reported_completion_ = 0;
};

}  // namespace

bool RequestResult::ok() const { return status / 100 == 2 && error.empty() && (!stream || done || disconnected); }

std::vector<RequestResult> run_load(const std::vector<LoadRequest>& requests, const LoadOptions& options) {
  std::vector<RequestResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    results[i].stream = wants_stream(requests[i]);
    results[i].scheduled_seconds = requests[i].arrival_seconds;
  }
  if (requests.empty()) return results;
  auto fail_all = [&](const std::string& why) {
    for (RequestResult& r : results) r.error = why;
    return results;
  };
  Run run;
  run.options = options;
  std::string why;
  if (!parse_url(options.url, run.target, why)) return fail_all(why);
  {
    asio::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    run.endpoints = resolver.resolve(run.target.host, run.target.port, ec);
    if (ec) return fail_all("serve_load: cannot resolve " + run.target.host + ":" + run.target.port + ": " + ec.message());
  }
  raise_open_file_limit(requests.size());

  const size_t threads = static_cast<size_t>(std::max(1, options.threads));
  for (size_t k = 0; k < threads; ++k) run.contexts.push_back(std::make_unique<asio::io_context>(1));
  std::vector<std::shared_ptr<Session>> sessions;
  sessions.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    sessions.push_back(std::make_shared<Session>(run, *run.contexts[i % threads], requests[i], results[i]));
    sessions.back()->prepare();
  }
  run.t0 = Clock::now();
  for (const std::shared_ptr<Session>& s : sessions) s->start();
  sessions.clear();  // the pending handlers own them now: each is freed when it ends

  std::vector<std::thread> others;
  for (size_t k = 1; k < threads; ++k) others.emplace_back([&run, k] { run.contexts[k]->run(); });
  run.contexts[0]->run();
  for (std::thread& t : others) t.join();
  return results;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double k = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(k)), hi = static_cast<size_t>(std::ceil(k));
  return v[lo] + (v[hi] - v[lo]) * (k - static_cast<double>(lo));
}

LoadSummary summarize(const std::vector<RequestResult>& results) {
  LoadSummary s;
  s.requests = static_cast<int32_t>(results.size());
  if (results.empty()) return s;
  std::vector<double> ttft, tpot, e2e;
  double first = results[0].start_seconds, last = first;
  for (const RequestResult& r : results) {
    const bool ok = r.ok();
    s.ok += ok;
    s.completion_tokens += r.completion_tokens;
    first = std::min(first, r.start_seconds);
    last = std::max(last, r.start_seconds + r.latency_seconds);
    s.max_start_lag_ms = std::max(s.max_start_lag_ms, (r.start_seconds - r.scheduled_seconds) * 1e3);
    if (r.ttft_seconds >= 0) ttft.push_back(r.ttft_seconds * 1e3);
    if (r.completion_tokens > 1 && !r.chunks.empty())
      tpot.push_back((r.chunks.back().seconds - r.chunks.front().seconds) * 1e3 / (r.completion_tokens - 1));
    if (ok) e2e.push_back(r.latency_seconds * 1e3);
  }
  s.errors = s.requests - s.ok;
  s.seconds = last - first;
  if (s.seconds > 0) {
    s.output_tokens_per_s = static_cast<double>(s.completion_tokens) / s.seconds;
    s.requests_per_s = s.ok / s.seconds;
  }
  s.ttft_ms_p50 = percentile(ttft, 50), s.ttft_ms_p99 = percentile(ttft, 99);
  s.tpot_ms_p50 = percentile(tpot, 50), s.tpot_ms_p99 = percentile(tpot, 99);
  s.e2e_ms_p50 = percentile(e2e, 50), s.e2e_ms_p99 = percentile(e2e, 99);
  return s;
}

json to_json(const LoadSummary& s) {
  return {{"requests", s.requests},
          {"ok", s.ok},
          {"errors", s.errors},
          {"completion_tokens", s.completion_tokens},
          {"seconds", s.seconds},
          {"output_tokens_per_s", s.output_tokens_per_s},
          {"requests_per_s", s.requests_per_s},
          {"ttft_ms_p50", s.ttft_ms_p50},
          {"ttft_ms_p99", s.ttft_ms_p99},
          {"tpot_ms_p50", s.tpot_ms_p50},
          {"tpot_ms_p99", s.tpot_ms_p99},
          {"e2e_ms_p50", s.e2e_ms_p50},
          {"e2e_ms_p99", s.e2e_ms_p99},
          {"max_start_lag_ms", s.max_start_lag_ms}};
}

}  // namespace kiln::bench
