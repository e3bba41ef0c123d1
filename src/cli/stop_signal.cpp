#include "cli/stop_signal.h"

#include <unistd.h>

#include <csignal>

namespace kiln::cli {
namespace {

std::atomic<bool> g_stop_requested{false};
std::atomic<const char*> g_stop_message{""};

extern "C" void on_stop_signal(int sig) {
  if (g_stop_requested.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  const char* msg = g_stop_message.load();
  size_t len = 0;
  while (msg[len]) ++len;
  [[maybe_unused]] ssize_t a = ::write(STDERR_FILENO, "\nkiln: ", 7);
  [[maybe_unused]] ssize_t b = ::write(STDERR_FILENO, msg, len);
  [[maybe_unused]] ssize_t c = ::write(STDERR_FILENO, "\n", 1);
}

}  // namespace

StopOnSignal::StopOnSignal(const char* message) {
  g_stop_requested = false;
  g_stop_message = message;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

StopOnSignal::~StopOnSignal() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

const std::atomic<bool>* StopOnSignal::flag() const { return &g_stop_requested; }

}  // namespace kiln::cli
