// The server's internals, shared by server.cpp (listening, threads, shutdown, the admin worker) and
// session.cpp (one HTTP connection: parsing, routing, responses, streaming).
// Thread safety: ServerCore's members are immutable after start, or atomic, or under their mutex;
// a Session runs on its strand.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include "serve/api.h"
#include "serve/metrics.h"
#include "serve/server.h"

namespace kiln::serve {

class Session;

// Lets engine-thread listeners post to the Asio threads only while the io_context lives: shutdown
// closes it (under the unique lock) before the io_context goes away.
struct EventGate {
  std::shared_mutex mu;
  bool open = true;
};

struct ServerCore {
  std::shared_ptr<EventGate> gate = std::make_shared<EventGate>();
  ServedModel model;
  ServerOptions options;
  ServeContext ctx;
  ServerMetrics metrics;
  boost::asio::io_context ioc;
  std::atomic<bool> draining{false};  // shutting down: no new requests
  int64_t started_at = unix_seconds();  // the "created" time of GET /v1/models

  // Open sessions, so that shutdown can cancel their requests and close them.
  std::mutex sessions_mu;
  std::set<std::weak_ptr<Session>, std::owner_less<std::weak_ptr<Session>>> sessions;

  // Blocking work (weight updates) runs on one worker thread, in order, off the Asio threads.
  void run_blocking(std::function<void()> work);
  void start_worker();
  void stop_worker();
  std::mutex work_mu;
  std::condition_variable work_cv;
  std::deque<std::function<void()>> work;
  bool work_stop = false;
  std::thread worker;
};

// Starts serving one accepted connection.
void start_session(ServerCore& core, boost::asio::ip::tcp::socket socket);
// Cancels a session's requests and closes it (shutdown).
void close_session(const std::shared_ptr<Session>& s);

// Constant-time comparison of a presented API key with the configured one.
bool api_key_matches(const std::string& presented, const std::string& expected);

}  // namespace kiln::serve
