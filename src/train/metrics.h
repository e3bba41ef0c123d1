// The run's metrics file, DIR/metrics.jsonl: one JSON object per optimizer step, appended and
// flushed as the step ends, so a run can be watched (tail -f) or plotted while it trains and what it
// logged survives a crash. Keys: step, policy_version, loss, lr, grad_norm, tokens, tokens_per_s.
// Ownership: owns the file. Thread safety: none.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "core/status.h"
#include "train/trainer.h"

namespace kiln {

class MetricsLog {
 public:
  // Opens DIR/metrics.jsonl for appending (created if absent).
  static Result<MetricsLog> open(const std::string& dir);
  Status write(int64_t step, const StepReport& r);
  const std::string& path() const { return path_; }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> file_;
  std::string path_;
};

}  // namespace kiln
