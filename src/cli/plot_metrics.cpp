// metrics.jsonl reading and the panels of kiln plot (see plot_metrics.h).
#include "cli/plot_metrics.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "core/json_text.h"

namespace kiln::cli {
namespace {

std::string at_line(const std::string& path, int64_t line) { return path + ":" + std::to_string(line) + ": "; }

Status take(const nlohmann::json& j, const char* key, double step, RunMetrics::Points* out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number())
    return invalid_argument(where + "\"" + key + "\" must be a number (got " + json_brief(*it) + ")");
  out->step.push_back(step);
  out->value.push_back(it->get<double>());
  return Status::Ok();
}

Series series_of(const RunMetrics::Points& p, const std::string& name, Rgb color, bool markers) {
  std::vector<size_t> order(p.step.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.step[a] < p.step[b]; });
  Series s{name, color, {}, {}, markers};
  for (size_t i : order) {
    s.x.push_back(p.step[i]);
    s.y.push_back(p.value[i]);
  }
  return s;
}

// "loss  2.3456 at step 100": the value of the last step.
std::string with_last(const std::string& title, const RunMetrics::Points& p) {
  size_t last = 0;
  for (size_t i = 1; i < p.step.size(); ++i)
    if (p.step[i] >= p.step[last]) last = i;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s  (%.4g at step %.0f)", title.c_str(), p.value[last], p.step[last]);
  return buf;
}

}  // namespace

Result<RunMetrics> read_run_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return not_found("cannot read '" + path +
                     "': give the folder a kiln train run writes (its --output), which holds metrics.jsonl");
  RunMetrics m;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = at_line(path, line);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    // A last line without its newline that does not parse is the line a running kiln train is
    // writing: left out, so that a run in progress plots.
    if (j.is_discarded() && in.eof()) {
      m.partial_last_line = true;
      break;
    }
    if (j.is_discarded() || !j.is_object())
      return invalid_argument(where + "not a JSON object (each line of metrics.jsonl is one {\"step\": ..., ...})");
    auto step = j.find("step");
    if (step == j.end() || !(step->is_number_integer() || step->is_number_unsigned()))
      return invalid_argument(where + "no integer \"step\" (each line of metrics.jsonl names its step)");
    const double s = step->get<double>();
    const int64_t si = step->get<int64_t>();
    m.first_step = m.lines == 0 ? si : std::min(m.first_step, si);
    m.last_step = m.lines == 0 ? si : std::max(m.last_step, si);
    KILN_RETURN_IF_ERROR(take(j, "loss", s, &m.loss, where));
    KILN_RETURN_IF_ERROR(take(j, "val_loss", s, &m.val_loss, where));
    KILN_RETURN_IF_ERROR(take(j, "lr", s, &m.lr, where));
    KILN_RETURN_IF_ERROR(take(j, "grad_norm", s, &m.grad_norm, where));
    ++m.lines;
  }
  if (in.bad()) return io_error("cannot read '" + path + "'");
  if (m.lines == 0) return invalid_argument(path + " has no steps yet: plot it after the first step is logged");
  return m;
}

std::vector<Panel> metrics_panels(const RunMetrics& m) {
  std::vector<Panel> panels;
  if (!m.loss.step.empty() || !m.val_loss.step.empty()) {
    Panel p{m.loss.step.empty() ? with_last("validation loss", m.val_loss) : with_last("loss", m.loss), {}};
    if (!m.loss.step.empty()) p.series.push_back(series_of(m.loss, "train", kLossColor, false));
    if (!m.val_loss.step.empty()) p.series.push_back(series_of(m.val_loss, "val", kValLossColor, true));
    panels.push_back(std::move(p));
  }
  if (!m.lr.step.empty())
    panels.push_back({with_last("learning rate", m.lr), {series_of(m.lr, "lr", kLrColor, false)}});
  if (!m.grad_norm.step.empty())
    panels.push_back({with_last("grad norm", m.grad_norm), {series_of(m.grad_norm, "grad norm", kGradNormColor, false)}});
  return panels;
}

}  // namespace kiln::cli
