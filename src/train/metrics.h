// The run's metrics file, DIR/metrics.jsonl: one JSON object per optimizer step, appended and
// flushed as the step ends, so a run can be watched (tail -f) or plotted while it trains and what it
// logged survives a crash. Keys: step, policy_version, loss, lr, grad_norm, tokens, tokens_per_s
// (and mfu, memory_gib on CUDA); validation lines: step, policy_version, val_loss, val_ppl,
// val_tokens.
// Ownership: owns the file. Thread safety: none.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/trainer.h"

namespace kiln {

class MetricsLog {
 public:
  // Opens DIR/metrics.jsonl for appending (created if absent). A resumed run keeps the lines up to
  // the checkpoint's step (`keep_through_step`) and drops later ones, which the interrupted run
  // logged after it; a new run (keep_through_step < 0) starts the file empty.
  static Result<MetricsLog> open(const std::string& dir, int64_t keep_through_step);
  Status write(int64_t step, const StepReport& r);
  Status write_eval(int64_t step, uint64_t policy_version, double val_loss, int64_t val_tokens);
  const std::string& path() const { return path_; }

 private:
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  Status append(const nlohmann::json& line);
  std::unique_ptr<std::FILE, Close> file_;
  std::string path_;
};

}  // namespace kiln
