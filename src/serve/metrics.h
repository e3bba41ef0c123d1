// ServerMetrics: the counters and histograms GET /metrics reports in Prometheus' text format,
// together with the engine's own figures (running, waiting, KV pages, prefix-cache hits, policy
// version) read at scrape time.
// Thread safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "infer/engine.h"

namespace kiln::serve {

// A cumulative histogram over fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Prometheus lines for `name` (with _bucket, _sum and _count).
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void request_done(const std::string& route, int status);
  // A finished completion: time to first token (negative: none), per output token, end to end.
  void completion_done(double ttft, double tpot, double e2e, int64_t prompt_tokens, int64_t completion_tokens);
  void client_disconnected();
  void connection_opened();
  void connection_closed();
  void run_started();
  void run_ended();
  int64_t open_runs() const;
  std::string render(const EngineStats& engine, const std::string& model_name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status) -> count
  Histogram ttft_, tpot_, e2e_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, disconnects_ = 0;
  int64_t connections_ = 0, runs_ = 0;
};

}  // namespace kiln::serve
