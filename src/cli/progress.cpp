// ProgressBar (see progress.h).
#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kiln::cli {

ProgressBar::ProgressBar(std::string label, double total, double unit_scale, std::string unit, double start)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), scale_(unit_scale), start_done_(start) {
  active_ = ::isatty(STDERR_FILENO) == 1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

double ProgressBar::rate(double done) const {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return s > 0 ? (done - start_done_) / s : 0.0;
}

std::string ProgressBar::duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%llds", s);
  return buf;
}

void ProgressBar::update(double done, const std::string& note, bool force) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double frac = total_ > 0 ? std::clamp(done / total_, 0.0, 1.0) : 0.0;
  constexpr int kWidth = 28;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  const double r = rate(done);
  const std::string eta = r > 0 ? duration((total_ - done) / r) : "?";
  std::fprintf(stderr, "\r\033[K%s [%s] %.1f/%.1f %s %3.0f%% ETA %s %s", label_.c_str(), bar.c_str(), done / scale_,
               total_ / scale_, unit_.c_str(), 100.0 * frac, eta.c_str(), note.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!active_ || !drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace kiln::cli
