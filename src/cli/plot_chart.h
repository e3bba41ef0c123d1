// kiln plot's charts: panels stacked top to bottom that share the x axis (the training step), each
// with a title, a legend, a frame, grid lines at "nice" ticks (1, 2 or 5 times a power of ten) and
// tick labels, drawing its series as antialiased lines (and discs for sparse series).
// layout_chart() fixes where everything goes and how data maps to pixels; render_chart() draws by
// it, and the tests predict pixels from it.
// Thread safety: plain functions over caller-owned values.
#pragma once

#include <string>
#include <vector>

#include "cli/plot_canvas.h"

namespace kiln::cli {

struct Series {
  std::string name;
  Rgb color;
  std::vector<double> x, y;  // points, x ascending; non-finite y values are left out (a gap)
  bool markers = false;      // a disc at every point (sparse series: validation loss)
};

struct Panel {
  std::string title;
  std::vector<Series> series;
};

struct Axis {
  double lo = 0, hi = 1;        // the range the plot area spans
  double tick_step = 1;
  std::vector<double> ticks;    // multiples of tick_step within [lo, hi]
  std::vector<std::string> labels;
};

struct PanelLayout {
  PixelRect plot;  // the plot area (frame included): [lo, hi] of each axis spans it edge to edge
  Axis x, y;
  int title_y = 0;
  // Data to continuous pixel coordinates (pixel i spans [i, i + 1)).
  double px(double v) const { return plot.x0 + (v - x.lo) / (x.hi - x.lo) * (plot.x1 - plot.x0); }
  double py(double v) const { return plot.y1 - (v - y.lo) / (y.hi - y.lo) * (plot.y1 - plot.y0); }
};

struct ChartLayout {
  int scale = 1;  // font scale; line widths and gaps follow it
  int title_y = 0, x_label_y = 0;
  std::vector<PanelLayout> panels;
};

// Ticks of about `target` intervals over [lo, hi] and their labels (fixed point, or d.de-N where
// the values are tiny or huge); integer_step: never a step below 1 (training steps).
Axis make_axis(double lo, double hi, int target, bool integer_step);

// An error message when the size cannot hold the panels legibly, else the layout. Every panel
// needs a point; x ranges over all panels' points, each y over its own panel's.
std::string layout_chart(const std::vector<Panel>& panels, int width, int height, ChartLayout* out);
// The chart, titled `title`, with "step" under the last panel; layout as layout_chart's.
Canvas render_chart(const std::string& title, const std::vector<Panel>& panels, const ChartLayout& layout,
                    int width, int height);

}  // namespace kiln::cli
