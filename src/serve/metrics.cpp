#include "serve/metrics.h"

#include <cstdio>

namespace kiln::serve {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out;
}

void metric(std::string& out, const std::string& name, const char* type, const std::string& help, double value,
            const std::string& labels = "") {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + num(value) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  size_t b = 0;
  while (b < bounds_.size() && v > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += v;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  int64_t cumulative = 0;
  for (size_t b = 0; b < bounds_.size(); ++b) {
    cumulative += counts_[b];
    out += name + "_bucket{le=\"" + num(bounds_[b]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      tpot_({0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240}) {}

void ServerMetrics::request_done(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

void ServerMetrics::completion_done(double ttft, double tpot, double e2e, int64_t prompt_tokens, int64_t completion_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ttft >= 0) ttft_.observe(ttft);
  if (tpot >= 0) tpot_.observe(tpot);
  e2e_.observe(e2e);
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
}

void ServerMetrics::client_disconnected() { std::lock_guard<std::mutex> lock(mu_); ++disconnects_; }
void ServerMetrics::connection_opened() { std::lock_guard<std::mutex> lock(mu_); ++connections_; }
void ServerMetrics::connection_closed() { std::lock_guard<std::mutex> lock(mu_); --connections_; }
void ServerMetrics::run_started() { std::lock_guard<std::mutex> lock(mu_); ++runs_; }
void ServerMetrics::run_ended() { std::lock_guard<std::mutex> lock(mu_); --runs_; }
int64_t ServerMetrics::open_runs() const { std::lock_guard<std::mutex> lock(mu_); return runs_; }

std::string ServerMetrics::render(const EngineStats& s, const std::string& model_name) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  const std::string model = "model=\"" + escape_label(model_name) + "\"";
  out += "# HELP kiln_requests_total HTTP requests answered, by route and status code\n"
         "# TYPE kiln_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "kiln_requests_total{route=\"" + escape_label(key.first) + "\",status=\"" + std::to_string(key.second) +
           "\"} " + std::to_string(n) + "\n";
  metric(out, "kiln_requests_running", "gauge", "engine requests being decoded", s.running, model);
  metric(out, "kiln_requests_waiting", "gauge", "engine requests waiting for admission", s.waiting, model);
  metric(out, "kiln_completions_open", "gauge", "API requests with choices still running", static_cast<double>(runs_));
  metric(out, "kiln_http_connections", "gauge", "open HTTP connections", static_cast<double>(connections_));
  metric(out, "kiln_client_disconnects_total", "counter", "requests cancelled because their client went away",
         static_cast<double>(disconnects_));
  const double pages = static_cast<double>(s.kv_pages_used + s.kv_pages_free);
  metric(out, "kiln_kv_pages_used", "gauge", "KV-cache pages held by running requests and the prefix cache",
         s.kv_pages_used, model);
  metric(out, "kiln_kv_pages_free", "gauge", "KV-cache pages free", s.kv_pages_free, model);
  metric(out, "kiln_kv_pages_cached", "gauge", "KV-cache pages held only by the prefix cache", s.kv_pages_cached, model);
  metric(out, "kiln_kv_usage_ratio", "gauge", "fraction of KV-cache pages in use",
         pages > 0 ? s.kv_pages_used / pages : 0.0, model);
  metric(out, "kiln_prompt_tokens_total", "counter", "prompt tokens the engine admitted", static_cast<double>(s.prompt_tokens), model);
  metric(out, "kiln_prefix_cache_hit_tokens_total", "counter", "prompt tokens served by the prefix cache",
         static_cast<double>(s.prefix_hit_tokens), model);
  metric(out, "kiln_prefix_cache_hit_rate", "gauge", "prefix-cache hit tokens / prompt tokens",
         s.prompt_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) / static_cast<double>(s.prompt_tokens) : 0.0, model);
  metric(out, "kiln_generation_tokens_total", "counter", "tokens generated by the engine",
         static_cast<double>(s.generated_tokens), model);
  metric(out, "kiln_request_prompt_tokens_total", "counter", "prompt tokens of finished API requests",
         static_cast<double>(prompt_tokens_), model);
  metric(out, "kiln_request_completion_tokens_total", "counter", "completion tokens of finished API requests",
         static_cast<double>(completion_tokens_), model);
  metric(out, "kiln_tokens_per_second", "gauge", "generated tokens per second, recent", s.tokens_per_second, model);
  metric(out, "kiln_preemptions_total", "counter", "requests preempted for KV space", static_cast<double>(s.preemptions), model);
  metric(out, "kiln_policy_version", "gauge", "the policy version of the weights serving", static_cast<double>(s.policy_version), model);
  metric(out, "kiln_weight_updates_total", "counter", "acknowledged weight updates", static_cast<double>(s.weight_updates), model);
  out += ttft_.render("kiln_time_to_first_token_seconds", "time from a request's arrival to its first token");
  out += tpot_.render("kiln_time_per_output_token_seconds", "mean time between a request's tokens after the first");
  out += e2e_.render("kiln_e2e_request_latency_seconds", "time from a request's arrival to its last token");
  return out;
}

}  // namespace kiln::serve
