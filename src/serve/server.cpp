#include "serve/server.h"

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>

#include "serve/reasoning.h"
#include "serve/server_internal.h"

namespace kiln::serve {

namespace net = boost::asio;
using tcp = net::ip::tcp;

void ServerCore::start_worker() {
  worker = std::thread([this] {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(work_mu);
        work_cv.wait(lock, [&] { return work_stop || !work.empty(); });
        if (work.empty()) return;
        job = std::move(work.front());
        work.pop_front();
      }
      job();
    }
  });
}

void ServerCore::run_blocking(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(work_mu);
    work.push_back(std::move(job));
  }
  work_cv.notify_one();
}

void ServerCore::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(work_mu);
    work_stop = true;
  }
  work_cv.notify_one();
  if (worker.joinable()) worker.join();  // the queued updates finish first
}

struct Server::Impl {
  ServerCore core;
  tcp::acceptor acceptor{core.ioc};
  std::vector<std::thread> threads;
  uint16_t port = 0;
  bool loopback = true;
  bool stopped = false;
  std::mutex stop_mu;

  void accept() {
    acceptor.async_accept(net::make_strand(core.ioc), [this](boost::system::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) start_session(core, std::move(socket));
      accept();  // errors such as too many open files: keep serving the connections we have
    });
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { shutdown(std::chrono::milliseconds(0)); }

uint16_t Server::port() const { return impl_->port; }
bool Server::loopback_only() const { return impl_->loopback; }

std::string Server::url() const {
  const std::string& h = impl_->core.options.host;
  const bool v6 = h.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + h + "]" : h) + ":" + std::to_string(impl_->port);
}

Result<ServeContext> make_serve_context(const ServedModel& model, const ServerOptions& options) {
  ServeContext ctx;
  ctx.text = model.text;
  ctx.context_length = model.context_length > 0 ? model.context_length : model.engine->max_sequence_tokens();
  ctx.sampling_defaults = model.sampling_defaults;
  ctx.max_tokens_cap = options.max_tokens_cap;
  ctx.max_n = options.max_n;
  ctx.template_name = options.chat_template;
  ctx.model_name = options.served_model_name;
  if (ctx.model_name.empty()) {
    std::filesystem::path p(model.model_dir);
    while (!p.empty() && p.filename().empty()) p = p.parent_path();
    ctx.model_name = p.filename().string().empty() ? "kiln" : p.filename().string();
  }
  // The tool-call format: as asked, or what the chat template (the one rendered with tools) and the
  // vocabulary show.
  std::string source;
  if (model.text)
    if (Result<const ChatTemplate*> tmpl = model.text->chat_template(options.chat_template, /*with_tools=*/true); tmpl.ok())
      source = (*tmpl)->source();
  ctx.mistral_args_form = mistral_uses_args_form(source);
  // Reasoning: qwen3 and deepseek_r1 name the same <think> splitter (the prompt says whether the
  // block opens there); auto takes it when the vocabulary has both tags as tokens.
  if (options.reasoning_parser == "qwen3" || options.reasoning_parser == "deepseek_r1") {
    if (!model.text) return invalid_argument("--reasoning-parser needs the model's tokenizer, which is not loaded");
    ctx.reasoning = true;
  } else if (options.reasoning_parser == "auto") {
    ctx.reasoning = model.text && model.text->tokenizer().token_to_id(ReasoningSplitter::kOpen).has_value() &&
                    model.text->tokenizer().token_to_id(ReasoningSplitter::kClose).has_value();
  } else if (options.reasoning_parser != "none") {
    return invalid_argument("--reasoning-parser '" + options.reasoning_parser +
                            "' is unknown; use none, auto, qwen3 or deepseek_r1");
  }
  if (options.tool_call_format != "auto") {
    KILN_ASSIGN_OR_RETURN(ctx.tool_format, parse_tool_call_format(options.tool_call_format));
  } else if (model.text) {
    const Tokenizer& tok = model.text->tokenizer();
    ctx.tool_format = detect_tool_call_format(source, [&](std::string_view t) { return tok.token_to_id(t).has_value(); });
  }
  return ctx;
}

Result<std::unique_ptr<Server>> Server::start(const ServedModel& model, const ServerOptions& options) {
  if (!model.engine) return invalid_argument("the server needs an engine");
  if (options.threads < 1 || options.threads > 256) return invalid_argument("--threads must be within [1, 256]");
  if (options.max_body_bytes < 1024) return invalid_argument("--max-body-bytes must be at least 1024");
  if (options.max_queued < 1) return invalid_argument("--max-queued must be at least 1");
  if (!(options.idle_timeout_seconds > 0 && options.idle_timeout_seconds <= 86400))
    return invalid_argument("--idle-timeout must be a number of seconds within (0, 86400]");
  if (options.max_n < 1 || options.max_n > 1024) return invalid_argument("--max-n must be within [1, 1024]");
  if (options.max_tokens_cap < 0) return invalid_argument("--max-tokens-limit must not be negative (0: the context)");
  auto impl = std::make_unique<Impl>();
  ServerCore& core = impl->core;
  core.model = model;
  core.options = options;
  KILN_ASSIGN_OR_RETURN(core.ctx, make_serve_context(model, options));
  boost::system::error_code ec;
  net::ip::address address = net::ip::make_address(options.host, ec);
  if (ec) {  // a host name (localhost, or this machine's name): its first address
    tcp::resolver resolver(impl->core.ioc);
    const tcp::resolver::results_type found = resolver.resolve(options.host, "", ec);
    if (ec || found.empty())
      return invalid_argument("--host " + options.host + " is neither an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1) nor " +
                              "a name this machine resolves");
    address = found.begin()->endpoint().address();
  }
  impl->loopback = address.is_loopback();
  const tcp::endpoint endpoint(address, options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    return io_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " + ec.message() +
                    " (is another server using the port? choose one with --port)");
  impl->port = impl->acceptor.local_endpoint().port();
  core.start_worker();
  impl->accept();
  // A handler's exception leaves run() on its thread; the thread reports it and runs on (Asio allows
  // run() again without restart()), so no request can end the server (sessions guard their own).
  for (int32_t i = 0; i < options.threads; ++i)
    impl->threads.emplace_back([&core] {
      for (;;) {
        try {
          core.ioc.run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "kiln: a server thread caught: %s; serving on\n", e.what());
        }
      }
    });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::shutdown(std::chrono::milliseconds grace) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.stop_mu);
  if (im.stopped) return;
  im.stopped = true;
  ServerCore& core = im.core;
  core.draining = true;
  net::post(core.ioc, [&im] {
    boost::system::error_code ec;
    im.acceptor.close(ec);
  });
  // Let open requests finish, up to the grace period.
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (core.metrics.open_runs() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Then end the rest (their streams end with "abort") and close every connection.
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> l(core.sessions_mu);
    for (const auto& w : core.sessions)
      if (auto s = w.lock()) open.push_back(std::move(s));
  }
  for (const auto& s : open) close_session(s);
  open.clear();
  const auto close_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (core.metrics.open_runs() > 0 && std::chrono::steady_clock::now() < close_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  core.stop_worker();
  {
    std::unique_lock<std::shared_mutex> gate(core.gate->mu);
    core.gate->open = false;
  }
  core.ioc.stop();
  for (std::thread& t : im.threads) t.join();
  im.threads.clear();
}

}  // namespace kiln::serve
