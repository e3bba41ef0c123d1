// A progress bar on stderr for long commands (preprocess, train): redrawn in place when stderr is a
// terminal, with rate and ETA; silent otherwise (the commands print plain lines then). clear()
// erases it before other output is written to the same terminal.
// Thread safety: none; one thread updates it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace kiln::cli {

class ProgressBar {
 public:
  // `total` units of work, `start` of them done before the bar starts (a resumed run); `unit_scale`
  // divides counts for display (e.g. 1e6 for MB).
  ProgressBar(std::string label, double total, double unit_scale, std::string unit, double start = 0.0);
  bool active() const { return active_; }
  // Redraws (at most ten times a second unless `force`) with `done` units and a trailing note.
  void update(double done, const std::string& note, bool force = false);
  void clear();
  // Units per second since the bar started (those done before it excluded).
  double rate(double done) const;
  // "1h02m", "4m05s", "12s".
  static std::string duration(double seconds);

 private:
  std::string label_, unit_;
  double total_, scale_, start_done_;
  bool active_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kiln::cli
