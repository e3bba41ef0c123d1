// Chart layout and drawing (see plot_chart.h).
#include "cli/plot_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace kiln::cli {
namespace {

constexpr Rgb kBackground{255, 255, 255}, kInk{30, 30, 30}, kFrame{110, 110, 110}, kGrid{228, 228, 228};
constexpr double kXPad = 0.02, kYPad = 0.06;  // room around the data, as fractions of its range

// The data's range widened by `pad` of its span on both sides (a flat series gets a span of its own).
void padded_range(double lo, double hi, double pad, double* a, double* b) {
  if (!(hi - lo > 1e-12 * std::max(std::fabs(lo), std::fabs(hi)))) {
    const double d = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= d;
    hi += d;
  }
  *a = lo - pad * (hi - lo);
  *b = hi + pad * (hi - lo);
}

std::string scientific(double v, double step) {
  const int e_step = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const int e_v = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*e", std::max(0, e_v - e_step), v);
  std::string s(buf);
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') != std::string::npos) {  // "1.0" -> "1", "2.50" -> "2.5"
    mantissa.erase(mantissa.find_last_not_of('0') + 1);
    if (mantissa.back() == '.') mantissa.pop_back();
  }
  return mantissa + "e" + std::to_string(std::stoi(s.substr(e + 1)));  // "2e-05" -> "2e-5"
}

int max_label_width(const Axis& a, int scale) {
  int w = 0;
  for (const std::string& l : a.labels) w = std::max(w, Canvas::text_width(l, scale));
  return w;
}

// Clamps a continuous coordinate's pixel into [lo, hi).
int pixel_in(double p, int lo, int hi) { return std::clamp(static_cast<int>(std::floor(p)), lo, hi - 1); }

}  // namespace

Axis make_axis(double lo, double hi, int target, bool integer_step) {
  Axis a;
  a.lo = lo;
  a.hi = hi;
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  a.tick_step = (norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10) * mag;
  if (integer_step) a.tick_step = std::max(a.tick_step, 1.0);
  const double k0 = std::ceil(lo / a.tick_step - 1e-9), k1 = std::floor(hi / a.tick_step + 1e-9);
  double max_abs = 0;
  for (double k = k0; k <= k1; ++k) {
    double v = k * a.tick_step;
    if (std::fabs(v) < a.tick_step * 1e-9) v = 0;
    a.ticks.push_back(v);
    max_abs = std::max(max_abs, std::fabs(v));
  }
  // Fixed point unless the values are all tiny (learning rates) or huge, or would need many decimals.
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(a.tick_step) + 1e-9)));
  const bool sci = max_abs < 1e-3 || max_abs >= 1e6 || decimals > 5;
  for (double v : a.ticks) {
    char buf[48];
    if (v == 0)
      a.labels.push_back("0");
    else if (sci)
      a.labels.push_back(scientific(v, a.tick_step));
    else {
      std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
      a.labels.push_back(buf);
    }
  }
  return a;
}

std::string layout_chart(const std::vector<Panel>& panels, int width, int height, ChartLayout* out) {
  const int n = static_cast<int>(panels.size());
  if (n == 0) return "nothing to plot";
  const int s = std::clamp(std::min(width / 480, height / 400), 1, 4);
  ChartLayout L;
  L.scale = s;
  L.title_y = 6 * s;
  const int top = L.title_y + 9 * s + 10 * s;
  const int title_block = 9 * s + 6 * s, tick_block = 3 * s + 4 * s + 7 * s, gap = 12 * s, x_label_block = 9 * s + 8 * s;
  const int plot_h = (height - top - n * (title_block + tick_block) - (n - 1) * gap - x_label_block) / n;
  const int min_plot_h = 30 * s;
  if (plot_h < min_plot_h) {
    const int need = height + (min_plot_h - plot_h) * n;
    return "a height of " + std::to_string(height) + " pixels is too small for " + std::to_string(n) +
           " panels: use --height " + std::to_string(need) + " or more";
  }

  double x_lo = INFINITY, x_hi = -INFINITY;
  std::vector<PanelLayout> layouts(n);
  int y_label_w = 0;
  for (int i = 0; i < n; ++i) {
    double y_lo = INFINITY, y_hi = -INFINITY;
    for (const Series& ser : panels[i].series)
      for (size_t k = 0; k < ser.x.size(); ++k) {
        if (!std::isfinite(ser.y[k]) || !std::isfinite(ser.x[k])) continue;
        x_lo = std::min(x_lo, ser.x[k]);
        x_hi = std::max(x_hi, ser.x[k]);
        y_lo = std::min(y_lo, ser.y[k]);
        y_hi = std::max(y_hi, ser.y[k]);
      }
    if (!(y_lo <= y_hi)) return "the panel '" + panels[i].title + "' has no finite value";
    double a, b;
    padded_range(y_lo, y_hi, kYPad, &a, &b);
    layouts[i].y = make_axis(a, b, std::clamp(plot_h / (32 * s), 2, 8), false);
    y_label_w = std::max(y_label_w, max_label_width(layouts[i].y, s));
  }
  const int left = 8 * s + y_label_w + 4 * s + 3 * s;
  double xa, xb;
  padded_range(x_lo, x_hi, kXPad, &xa, &xb);
  Axis x = make_axis(xa, xb, 10, true);
  int right = width - (12 * s + max_label_width(x, s) / 2);
  const int plot_w = right - left;
  if (plot_w < 60 * s)
    return "a width of " + std::to_string(width) + " pixels is too small for the tick labels: use --width " +
           std::to_string(width + 60 * s - plot_w) + " or more";
  // As many x ticks as fit with their labels apart.
  for (int target = 10; target > 2; --target) {
    if (x.ticks.size() < 2 || plot_w / static_cast<int>(x.ticks.size()) > max_label_width(x, s) + 16 * s) break;
    x = make_axis(xa, xb, target - 1, true);
  }

  int y = top;
  for (int i = 0; i < n; ++i) {
    PanelLayout& p = layouts[i];
    p.title_y = y;
    p.plot = {left, y + title_block, right, y + title_block + plot_h};
    p.x = x;
    y = p.plot.y1 + tick_block + gap;
  }
  L.x_label_y = layouts.back().plot.y1 + tick_block + 2 * s;
  L.panels = std::move(layouts);
  *out = std::move(L);
  return "";
}

Canvas render_chart(const std::string& title, const std::vector<Panel>& panels, const ChartLayout& L, int width,
                    int height) {
  const int s = L.scale;
  Canvas c(width, height, kBackground);
  std::string head = title;
  const int room = width - 16 * s;
  while (head.size() > 4 && Canvas::text_width(head, s) > room) head = "..." + head.substr(4);  // keep the end
  c.text(8 * s, L.title_y, head, s, kInk);

  for (size_t i = 0; i < panels.size() && i < L.panels.size(); ++i) {
    const Panel& panel = panels[i];
    const PanelLayout& p = L.panels[i];
    const PixelRect& r = p.plot;
    // Grid, frame, data, then ticks and labels.
    for (double t : p.y.ticks) {
      const int py = pixel_in(p.py(t), r.y0, r.y1);
      c.fill_rect({r.x0, py, r.x1, py + 1}, kGrid);
    }
    for (double t : p.x.ticks) {
      const int px = pixel_in(p.px(t), r.x0, r.x1);
      c.fill_rect({px, r.y0, px + 1, r.y1}, kGrid);
    }
    c.fill_rect({r.x0, r.y0, r.x1, r.y0 + 1}, kFrame);
    c.fill_rect({r.x0, r.y1 - 1, r.x1, r.y1}, kFrame);
    c.fill_rect({r.x0, r.y0, r.x0 + 1, r.y1}, kFrame);
    c.fill_rect({r.x1 - 1, r.y0, r.x1, r.y1}, kFrame);
    const PixelRect clip{r.x0 + 1, r.y0 + 1, r.x1 - 1, r.y1 - 1};
    const double line_width = 1.5 * s, marker_radius = 2.0 * s + 0.5;
    for (const Series& ser : panel.series) {
      for (size_t k = 0; k + 1 < ser.x.size(); ++k)
        if (std::isfinite(ser.y[k]) && std::isfinite(ser.y[k + 1]))
          c.line(p.px(ser.x[k]), p.py(ser.y[k]), p.px(ser.x[k + 1]), p.py(ser.y[k + 1]), line_width, ser.color, clip);
      if (ser.x.size() == 1 || ser.markers)
        for (size_t k = 0; k < ser.x.size(); ++k)
          if (std::isfinite(ser.y[k])) c.disc(p.px(ser.x[k]), p.py(ser.y[k]), marker_radius, ser.color, clip);
    }
    for (size_t k = 0; k < p.y.ticks.size(); ++k) {
      const int py = pixel_in(p.py(p.y.ticks[k]), r.y0, r.y1);
      c.fill_rect({r.x0 - 3 * s, py, r.x0, py + 1}, kFrame);
      const std::string& label = p.y.labels[k];
      c.text(r.x0 - 3 * s - 4 * s - Canvas::text_width(label, s), py - (7 * s) / 2, label, s, kInk);
    }
    for (size_t k = 0; k < p.x.ticks.size(); ++k) {
      const int px = pixel_in(p.px(p.x.ticks[k]), r.x0, r.x1);
      c.fill_rect({px, r.y1, px + 1, r.y1 + 3 * s}, kFrame);
      const std::string& label = p.x.labels[k];
      c.text(px - Canvas::text_width(label, s) / 2, r.y1 + 3 * s + 4 * s, label, s, kInk);
    }
    c.text(r.x0, p.title_y, panel.title, s, kInk);
    // Legend, right-aligned on the title row: a stroke of each series' colour and its name.
    if (panel.series.size() < 2) continue;
    const int stroke = 16 * s;
    int legend_w = 0;
    for (const Series& ser : panel.series) legend_w += stroke + 4 * s + Canvas::text_width(ser.name, s) + 12 * s;
    int x = r.x1 - legend_w + 12 * s;
    const double mid = p.title_y + 3.5 * s;
    for (const Series& ser : panel.series) {
      const PixelRect all{0, 0, width, height};
      c.line(x, mid, x + stroke, mid, line_width, ser.color, all);
      if (ser.markers) c.disc(x + stroke / 2.0, mid, marker_radius, ser.color, all);
      c.text(x + stroke + 4 * s, p.title_y, ser.name, s, kInk);
      x += stroke + 4 * s + Canvas::text_width(ser.name, s) + 12 * s;
    }
  }
  if (!L.panels.empty()) {
    const PixelRect& r = L.panels.back().plot;
    c.text((r.x0 + r.x1 - Canvas::text_width("step", s)) / 2, L.x_label_y, "step", s, kInk);
  }
  return c;
}

}  // namespace kiln::cli
