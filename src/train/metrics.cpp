// MetricsLog (see metrics.h).
#include "train/metrics.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace kiln {

Result<MetricsLog> MetricsLog::open(const std::string& dir, int64_t keep_through_step) {
  MetricsLog log;
  log.path_ = (std::filesystem::path(dir) / "metrics.jsonl").string();
  std::string kept;
  if (keep_through_step >= 0) {
    std::ifstream in(log.path_, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      try {
        const nlohmann::json j = nlohmann::json::parse(line);
        if (j.at("step").get<int64_t>() <= keep_through_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // a line torn by a crash: dropped
      }
    }
  }
  log.file_.reset(std::fopen(log.path_.c_str(), "w"));
  if (log.file_ && !kept.empty() && std::fwrite(kept.data(), 1, kept.size(), log.file_.get()) != kept.size())
    return io_error("cannot rewrite the metrics file '" + log.path_ + "' (disk full?)");
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
  if (r.mfu > 0) j["mfu"] = r.mfu;
  if (r.memory_gib > 0) j["memory_gib"] = r.memory_gib;
  return append(j);
}

Status MetricsLog::write_eval(int64_t step, uint64_t policy_version, double val_loss, int64_t val_tokens) {
  return append({{"step", step},
                 {"policy_version", policy_version},
                 {"val_loss", val_loss},
                 {"val_ppl", std::exp(val_loss)},
                 {"val_tokens", val_tokens}});
}

Status MetricsLog::append(const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() || std::fflush(file_.get()) != 0)
    return io_error("cannot append to the metrics file '" + path_ + "' (disk full?)");
  return Status::Ok();
}

}  // namespace kiln
