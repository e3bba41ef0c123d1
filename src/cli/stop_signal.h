// SIGTERM / SIGINT for the long-running commands (train, rl, serve): while a StopOnSignal lives, the
// first signal sets the flag it exposes (a run saves a checkpoint after its current step and exits 0;
// the server stops gracefully) and prints `message` (a string that outlives it); a second one ends
// the process at once. Its destructor restores the default handlers. The flag is the process's one
// signal-handler state (a handler cannot take arguments).
// Thread safety: one at a time per process.
#pragma once

#include <atomic>

namespace kiln::cli {

class StopOnSignal {
 public:
  explicit StopOnSignal(
      const char* message = "stop requested: saving a checkpoint after this step (again to quit now)");
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  const std::atomic<bool>* flag() const;
};

}  // namespace kiln::cli
