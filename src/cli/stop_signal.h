// SIGTERM / SIGINT for the long-running commands (train, rl): while a StopOnSignal lives, the first
// signal sets the flag it exposes (the run saves a checkpoint after its current step and exits 0)
// and prints a line; a second one ends the process at once. Its destructor restores the default
// handlers. The flag is the process's one signal-handler state (a handler cannot take arguments).
// Thread safety: one at a time per process.
#pragma once

#include <atomic>

namespace kiln::cli {

class StopOnSignal {
 public:
  StopOnSignal();
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
  const std::atomic<bool>* flag() const;
};

}  // namespace kiln::cli
