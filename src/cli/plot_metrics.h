// What kiln plot reads: a run's metrics.jsonl (train/metrics.h writes it: one JSON object per
// optimizer step with step, loss, lr, grad_norm, ...; validation lines carry val_loss), turned into
// the chart's panels: loss (and val_loss), learning rate, grad norm.
// Thread safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include "cli/plot_chart.h"
#include "core/status.h"

namespace kiln::cli {

// The plotted keys' points, in file order; a key a line does not carry (or carries as null, which is
// how a non-finite number is written) adds no point.
struct RunMetrics {
  struct Points {
    std::vector<double> step, value;
  };
  Points loss, val_loss, lr, grad_norm;
  int64_t lines = 0;  // non-blank lines read
  int64_t first_step = 0, last_step = 0;  // the least and the greatest step of any line
  bool partial_last_line = false;  // a last line without its newline that did not parse (being written)
};

// Errors name FILE:LINE for a line that is not a JSON object, lacks an integer "step" or has a
// plotted key that is not a number; a missing file is an error that says what the folder should be.
// An unparsable last line without its newline (a running kiln train writing it) is left out.
Result<RunMetrics> read_run_metrics(const std::string& path);

// The panels with data, top to bottom: loss (with val_loss when present), learning rate, grad norm;
// each title carries the last value. Points are sorted by step (a resumed run appends).
std::vector<Panel> metrics_panels(const RunMetrics& m);

// The series colours (the tests look for them).
constexpr Rgb kLossColor{31, 119, 180}, kValLossColor{230, 110, 0}, kLrColor{40, 150, 40}, kGradNormColor{200, 30, 40};

}  // namespace kiln::cli
