// The external rewards of reward.h: reward.command (a shell command per batch, JSON lines in, one
// number per line out) and reward.url (an HTTP POST per batch, through Boost.Beast).
//
// The command is started with posix_spawn in a process group of its own, so that a timeout kills
// it with everything it started. Its stdin is written while its stdout and stderr are read (poll), so that neither side
// waits on a full pipe; SIGPIPE is blocked in the calling thread while it runs (a program that exits
// without reading its input is then an error, not the end of kiln).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/json_text.h"
#include "core/plural.h"
#include "rl/reward.h"
#include "rl/reward_text.h"

extern char** environ;

namespace kiln::rl {

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

// The reward program's view of a rollout (invalid UTF-8 in the text becomes U+FFFD).
std::string record_line(const Rollout& r) {
  return to_json(r, /*with_reward=*/false).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status check_timeout(double timeout_s, const char* kind) {
  if (!std::isfinite(timeout_s) || timeout_s <= 0)
    return invalid_argument("reward.timeout_s is " + seconds_text(timeout_s) + ": reward.kind = \"" + kind +
                            "\" needs a time limit > 0 for each batch");
  return Status::Ok();
}

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// ---------------------------------------------------------------- reward.command

constexpr size_t kStderrKept = 4096;       // the end of the program's stderr, for error messages
constexpr size_t kMaxStdout = 64u << 20;   // more than this is not one number per line
constexpr size_t kChunk = 64 * 1024;

// Blocks SIGPIPE in the calling thread for its lifetime; a SIGPIPE raised meanwhile (a write to a
// pipe whose reader has gone) is taken off the pending set before the old mask returns.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        sigtimedwait(&set_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

struct ProcessOutput {
  std::string out;
  std::string err_tail;    // the last kStderrKept bytes of stderr
  int wait_status = 0;
  size_t input_written = 0;  // less than the input where the program stopped reading
};

// The program's stderr as the end of an error message ("" when it printed none).
std::string stderr_note(const std::string& err) {
  size_t a = err.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  std::string_view s(err);
  s = s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
  std::string lead = "; its stderr";
  if (s.size() > 2000) {
    s = s.substr(s.size() - 2000);
    size_t nl = s.find('\n');
    if (nl != std::string_view::npos && nl + 1 < s.size()) s = s.substr(nl + 1);
    lead += " ends with";
  }
  return lead + ":\n" + std::string(s);
}

// Runs `command` through /bin/sh -c with `input` on its stdin; returns what it printed and how it
// ended. Errors: the pipes or the process could not be made, the time limit passed, or it printed
// more than kMaxStdout.
Result<ProcessOutput> run_shell(const std::string& command, const std::string& input, double timeout_s) {
  const std::string who = "reward.command `" + command + "`";
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int* p : {in, out, err}) close_fd(p[0]), close_fd(p[1]);
    return io_error(who + ": cannot create pipes: " + std::strerror(e));
  }
  SigpipeBlock no_sigpipe;
  // posix_spawn rather than fork: the trainer's address space is large, and nothing of it is copied.
  // The program gets a process group of its own, an empty signal mask and SIGPIPE's default action.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t mask, defaults;
  sigemptyset(&mask);
  posix_spawnattr_setsigmask(&attr, &mask);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  std::string arg0 = "sh", arg1 = "-c", arg2 = command;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) {
    for (int* p : {in, out, err}) close_fd(p[0]), close_fd(p[1]);
    return io_error(who + ": cannot start /bin/sh: " + std::strerror(spawned));
  }
  close_fd(in[0]);
  close_fd(out[1]);
  close_fd(err[1]);
  int fds[3] = {in[1], out[0], err[0]};  // stdin, stdout, stderr as the parent sees them
  for (int fd : fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  ProcessOutput po;
  auto kill_and_reap = [&] {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    for (int& fd : fds) close_fd(fd);
  };
  const Clock::time_point deadline = deadline_after(timeout_s);
  auto timed_out = [&] {
    kill_and_reap();
    return Status(StatusCode::io_error, who + " timed out after " + seconds_text(timeout_s) +
                                            " (reward.timeout_s): raise the limit or make the program faster" +
                                            stderr_note(po.err_tail));
  };
  if (input.empty()) close_fd(fds[0]);
  std::string buf(kChunk, '\0');
  while (fds[0] >= 0 || fds[1] >= 0 || fds[2] >= 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return timed_out();
    pollfd pfd[3];
    int which[3];
    nfds_t n = 0;
    for (int k = 0; k < 3; ++k)
      if (fds[k] >= 0) {
        pfd[n] = {fds[k], static_cast<short>(k == 0 ? POLLOUT : POLLIN), 0};
        which[n++] = k;
      }
    const int rc = poll(pfd, n, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      kill_and_reap();
      return io_error(who + ": poll failed: " + std::strerror(e));
    }
    for (nfds_t j = 0; j < n; ++j) {
      if (pfd[j].revents == 0) continue;
      const int k = which[j];
      if (k == 0) {
        const size_t len = std::min(kChunk, input.size() - po.input_written);
        const ssize_t w = write(fds[0], input.data() + po.input_written, len);
        if (w > 0) po.input_written += static_cast<size_t>(w);
        else if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (w <= 0 || po.input_written == input.size()) close_fd(fds[0]);  // done, or the reader has gone
        continue;
      }
      const ssize_t r = read(fds[k], buf.data(), buf.size());
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {
        close_fd(fds[k]);
        continue;
      }
      if (k == 1) {
        po.out.append(buf.data(), static_cast<size_t>(r));
        if (po.out.size() > kMaxStdout) {
          kill_and_reap();
          return invalid_argument(who + " printed more than " + std::to_string(kMaxStdout >> 20) +
                                  " MiB on stdout: it should print one number per line, one line per rollout");
        }
      } else {
        po.err_tail.append(buf.data(), static_cast<size_t>(r));
        if (po.err_tail.size() > 2 * kStderrKept) po.err_tail.erase(0, po.err_tail.size() - kStderrKept);
      }
    }
  }
  if (po.err_tail.size() > kStderrKept) po.err_tail.erase(0, po.err_tail.size() - kStderrKept);
  // Its output is closed; wait for it to end, still within the limit.
  for (;;) {
    const pid_t w = waitpid(pid, &po.wait_status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      const int e = errno;
      return io_error(who + ": waitpid failed: " + std::strerror(e));
    }
    if (Clock::now() >= deadline) return timed_out();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return po;
}

// A JSON number (RFC 8259 syntax) that is a finite double.
std::optional<double> parse_json_number(std::string_view s) {
  auto digit = [&](size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
  size_t i = 0;
  if (i < s.size() && s[i] == '-') ++i;
  if (!digit(i)) return std::nullopt;
  if (s[i] == '0') ++i;
  else
    while (digit(i)) ++i;
  if (i < s.size() && s[i] == '.') {
    if (!digit(++i)) return std::nullopt;
    while (digit(i)) ++i;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digit(i)) return std::nullopt;
    while (digit(i)) ++i;
  }
  if (i != s.size()) return std::nullopt;
  double v = 0.0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string_view trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

class CommandReward final : public Reward {
 public:
  CommandReward(std::string command, double timeout_s) : command_(std::move(command)), timeout_s_(timeout_s) {}

  Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) override {
    if (rollouts.empty()) return std::vector<RewardResult>{};
    const std::string who = "reward.command `" + command_ + "`";
    std::string input;
    for (const Rollout& r : rollouts) {
      input += record_line(r);
      input += '\n';
    }
    KILN_ASSIGN_OR_RETURN(ProcessOutput po, run_shell(command_, input, timeout_s_));
    const std::string note = stderr_note(po.err_tail);
    const std::string unread = po.input_written < input.size()
                                   ? " (it stopped reading its input after " + std::to_string(po.input_written) + " of " +
                                         std::to_string(input.size()) + " bytes)"
                                   : "";
    if (WIFSIGNALED(po.wait_status))
      return io_error(who + " was killed by signal " + std::to_string(WTERMSIG(po.wait_status)) + unread + note);
    if (!WIFEXITED(po.wait_status) || WEXITSTATUS(po.wait_status) != 0)
      return io_error(who + " exited with status " + std::to_string(WEXITSTATUS(po.wait_status)) + unread + note);

    std::vector<std::string_view> lines;
    std::string_view rest(po.out);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      lines.push_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
    std::vector<RewardResult> out(rollouts.size());
    for (size_t i = 0; i < lines.size() && i < rollouts.size(); ++i) {
      std::optional<double> v = parse_json_number(trim(lines[i]));
      if (!v)
        return invalid_argument(who + ": line " + std::to_string(i + 1) + " of its output, for " +
                                sample_name(i, rollouts[i]) + ", is not a finite number: " + quote(lines[i]) +
                                "; it should print one number per line, one line per rollout, in input order" + note);
      out[i].reward = *v;
    }
    if (lines.size() != rollouts.size())
      return invalid_argument(who + " printed " + count_of(static_cast<int64_t>(lines.size()), "line") + " for " +
                              count_of(static_cast<int64_t>(rollouts.size()), "rollout") +
                              ": it should print one number per line, one line per rollout, in input order" +
                              (lines.size() < rollouts.size()
                                   ? " (the first without a reward: " + sample_name(lines.size(), rollouts[lines.size()]) + ")"
                                   : std::string()) +
                              unread + note);
    return out;
  }

  std::string describe() const override { return "command `" + command_ + "` (timeout " + seconds_text(timeout_s_) + ")"; }

 private:
  std::string command_;
  double timeout_s_;
};

// ---------------------------------------------------------------- reward.url

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

constexpr size_t kMaxResponse = 64u << 20;

struct HttpUrl {
  std::string host, port, target, host_header;
};

Result<HttpUrl> parse_http_url(const std::string& url) {
  auto lower_prefix = [&](std::string_view p) {
    if (url.size() < p.size()) return false;
    for (size_t i = 0; i < p.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(url[i])) != p[i]) return false;
    return true;
  };
  if (lower_prefix("https://"))
    return invalid_argument("reward.url '" + url + "': https is not supported: use http:// or a local proxy");
  if (!lower_prefix("http://"))
    return invalid_argument("reward.url '" + url + "' is not an http:// URL (http://host[:port][/path])");
  std::string rest = url.substr(7);
  const size_t end = rest.find_first_of("/?#");
  std::string authority = rest.substr(0, end);
  std::string target = end == std::string::npos ? "/" : rest.substr(end);
  target = target.substr(0, target.find('#'));
  if (target.empty() || target[0] != '/') target = "/" + target;
  if (authority.find('@') != std::string::npos)
    return invalid_argument("reward.url '" + url + "': user names in URLs are not supported");
  HttpUrl u;
  std::string port;
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return invalid_argument("reward.url '" + url + "': unclosed '[' in the host");
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return invalid_argument("reward.url '" + url + "': expected ':port' after ']'");
      port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (u.host.empty()) return invalid_argument("reward.url '" + url + "' has no host");
  if (port.empty()) port = "80";
  int p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || ptr != port.data() + port.size() || p < 1 || p > 65535)
    return invalid_argument("reward.url '" + url + "': the port '" + port + "' is not a number in 1..65535");
  u.port = std::to_string(p);
  u.target = target;
  u.host_header = authority;
  return u;
}

class UrlReward final : public Reward {
 public:
  UrlReward(std::string url, HttpUrl parsed, double timeout_s)
      : url_(std::move(url)), u_(std::move(parsed)), timeout_s_(timeout_s) {}

  Result<std::vector<RewardResult>> score(const std::vector<Rollout>& rollouts) override {
    if (rollouts.empty()) return std::vector<RewardResult>{};
    std::string body = "{\"rollouts\":[";
    for (size_t i = 0; i < rollouts.size(); ++i) {
      if (i) body += ',';
      body += record_line(rollouts[i]);
    }
    body += "]}";
    std::string response;
    KILN_RETURN_IF_ERROR(post(body, response));

    const std::string who = "reward.url " + url_;
    const std::string expect = "; it should answer {\"rewards\": [one number per rollout, in order]}";
    nlohmann::json j = nlohmann::json::parse(response, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument(who + ": the response is not JSON: " + quote(response) + expect);
    if (!j.is_object() || !j.contains("rewards") || !j["rewards"].is_array())
      return invalid_argument(who + ": the response has no \"rewards\" array: " + quote(response) + expect);
    const nlohmann::json& rewards = j["rewards"];
    if (rewards.size() != rollouts.size())
      return invalid_argument(who + " returned " + std::to_string(rewards.size()) + " rewards for " +
                              std::to_string(rollouts.size()) + " rollouts" + expect);
    std::vector<RewardResult> out(rollouts.size());
    for (size_t i = 0; i < rollouts.size(); ++i) {
      const nlohmann::json& v = rewards[i];
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        return invalid_argument(who + ": rewards[" + std::to_string(i) + "], for " + sample_name(i, rollouts[i]) +
                                ", is " + quote(json_brief(v)) + ", not a finite number");
      out[i].reward = v.get<double>();
    }
    return out;
  }

  std::string describe() const override { return "url " + url_ + " (timeout " + seconds_text(timeout_s_) + ")"; }

 private:
  // One POST of `body` under the time limit; `response` gets the body of a 200 answer.
  Status post(const std::string& body, std::string& response) const {
    using tcp = asio::ip::tcp;
    const std::string who = "reward.url " + url_;
    const Clock::time_point deadline = deadline_after(timeout_s_);
    asio::io_context ioc;
    beast::error_code ec;
    // Name resolution is the system's (synchronous, outside the limit); a numeric host skips it.
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints = resolver.resolve(u_.host, u_.port, ec);
    if (ec) return io_error(who + ": cannot resolve the host '" + u_.host + "': " + ec.message());

    beast::tcp_stream stream(ioc);
    stream.expires_at(deadline);  // one limit for connecting, sending and receiving
    auto run = [&] {
      ioc.restart();
      ioc.run();
    };
    auto failure = [&](const char* doing) {
      if (ec == beast::error::timeout)
        return io_error(who + " timed out after " + seconds_text(timeout_s_) + " (reward.timeout_s) " + doing +
                        ": raise the limit or make the server faster");
      if (ec == asio::error::connection_refused)
        return io_error(who + ": connection refused: is the reward server running and listening on " + u_.host + ":" +
                        u_.port + "?");
      return io_error(who + ": " + ec.message() + " " + doing);
    };
    stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) return failure("while connecting");

    http::request<http::string_body> req{http::verb::post, u_.target, 11};
    req.set(http::field::host, u_.host_header);
    req.set(http::field::user_agent, "kiln");
    req.set(http::field::content_type, "application/json");
    req.keep_alive(false);
    req.body() = body;
    req.prepare_payload();
    http::async_write(stream, req, [&](beast::error_code e, std::size_t) { ec = e; });
    run();
    if (ec) return failure("while sending the request");

    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponse);
    http::async_read(stream, buffer, parser, [&](beast::error_code e, std::size_t) { ec = e; });
    run();
    if (ec) return failure("while reading the response");
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);

    const http::response<http::string_body>& res = parser.get();
    if (res.result_int() != 200)
      return io_error(who + " answered HTTP " + std::to_string(res.result_int()) + ": " + quote(res.body()));
    response = res.body();
    return Status::Ok();
  }

  std::string url_;
  HttpUrl u_;
  double timeout_s_;
};

}  // namespace

Result<std::unique_ptr<Reward>> make_command_reward(const std::string& command, double timeout_s) {
  if (command.empty()) return invalid_argument("reward.kind = \"command\" needs reward.command (a shell command line)");
  KILN_RETURN_IF_ERROR(check_timeout(timeout_s, "command"));
  return std::unique_ptr<Reward>(std::make_unique<CommandReward>(command, timeout_s));
}

Result<std::unique_ptr<Reward>> make_url_reward(const std::string& url, double timeout_s) {
  if (url.empty()) return invalid_argument("reward.kind = \"url\" needs reward.url (http://host[:port][/path])");
  KILN_ASSIGN_OR_RETURN(HttpUrl parsed, parse_http_url(url));
  KILN_RETURN_IF_ERROR(check_timeout(timeout_s, "url"));
  return std::unique_ptr<Reward>(std::make_unique<UrlReward>(url, std::move(parsed), timeout_s));
}

}  // namespace kiln::rl
