#include "cli/stop_signal.h"

#include <unistd.h>

#include <csignal>

namespace kiln::cli {
namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void on_stop_signal(int sig) {
  if (g_stop_requested.exchange(true)) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  static const char msg[] = "\nkiln: stop requested: saving a checkpoint after this step (again to quit now)\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
}

}  // namespace

StopOnSignal::StopOnSignal() {
  g_stop_requested = false;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

StopOnSignal::~StopOnSignal() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

const std::atomic<bool>* StopOnSignal::flag() const { return &g_stop_requested; }

}  // namespace kiln::cli
