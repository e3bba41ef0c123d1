// MetricsLog (see metrics.h).
#include "train/metrics.h"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace kiln {

Result<MetricsLog> MetricsLog::open(const std::string& dir) {
  MetricsLog log;
  log.path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
  log.file_.reset(std::fopen(log.path_.c_str(), "a"));
  if (!log.file_) return io_error("cannot open the metrics file '" + log.path_ + "' for appending");
  return log;
}

Status MetricsLog::write(int64_t step, const StepReport& r) {
  nlohmann::json j = {{"step", step},
                      {"policy_version", r.policy_version},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens", r.tokens},
                      {"tokens_per_s", r.tokens_per_s()}};
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() || std::fflush(file_.get()) != 0)
    return io_error("cannot append to the metrics file '" + path_ + "' (disk full?)");
  return Status::Ok();
}

}  // namespace kiln
