// Canvas (see plot_canvas.h).
#include "cli/plot_canvas.h"

#include <algorithm>
#include <cmath>

#include "cli/plot_font.h"

namespace kiln::cli {
namespace {

// Shape parameters: segment {x0, y0, x1, y1, half_width}, disc {cx, cy, radius}. Coverage of a pixel
// whose centre is at distance d from the shape's edge: 1 inside by half a pixel, 0 outside by half.
double segment_coverage(const double* s, double px, double py) {
  const double dx = s[2] - s[0], dy = s[3] - s[1];
  const double len2 = dx * dx + dy * dy;
  double t = len2 > 0 ? ((px - s[0]) * dx + (py - s[1]) * dy) / len2 : 0.0;
  t = std::clamp(t, 0.0, 1.0);
  const double d = std::hypot(px - (s[0] + t * dx), py - (s[1] + t * dy));
  return std::clamp(s[4] + 0.5 - d, 0.0, 1.0);
}

double disc_coverage(const double* s, double px, double py) {
  return std::clamp(s[2] + 0.5 - std::hypot(px - s[0], py - s[1]), 0.0, 1.0);
}

size_t utf8_length(unsigned char lead) { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height), rgb_(static_cast<size_t>(width) * height * 3) {
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
}

Rgb Canvas::at(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::blend(int x, int y, Rgb c, double alpha) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_ || alpha <= 0) return;
  alpha = std::min(alpha, 1.0);
  uint8_t* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  const uint8_t src[3] = {c.r, c.g, c.b};
  for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(std::lround(p[k] + (src[k] - p[k]) * alpha));
}

void Canvas::fill_rect(PixelRect r, Rgb c) {
  for (int y = std::max(r.y0, 0); y < std::min(r.y1, height_); ++y)
    for (int x = std::max(r.x0, 0); x < std::min(r.x1, width_); ++x) blend(x, y, c, 1.0);
}

void Canvas::cover(PixelRect box, Rgb c, PixelRect clip, double (*coverage)(const double*, double, double),
                   const double* shape) {
  const int x0 = std::max({box.x0, clip.x0, 0}), x1 = std::min({box.x1, clip.x1, width_});
  const int y0 = std::max({box.y0, clip.y0, 0}), y1 = std::min({box.y1, clip.y1, height_});
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) blend(x, y, c, coverage(shape, x + 0.5, y + 0.5));
}

void Canvas::line(double x0, double y0, double x1, double y1, double width, Rgb c, PixelRect clip) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
  const double hw = width / 2, pad = hw + 1;
  const double shape[5] = {x0, y0, x1, y1, hw};
  const PixelRect box{static_cast<int>(std::floor(std::min(x0, x1) - pad)), static_cast<int>(std::floor(std::min(y0, y1) - pad)),
                      static_cast<int>(std::ceil(std::max(x0, x1) + pad)), static_cast<int>(std::ceil(std::max(y0, y1) + pad))};
  cover(box, c, clip, segment_coverage, shape);
}

void Canvas::disc(double cx, double cy, double radius, Rgb c, PixelRect clip) {
  if (!std::isfinite(cx) || !std::isfinite(cy)) return;
  const double shape[3] = {cx, cy, radius}, pad = radius + 1;
  const PixelRect box{static_cast<int>(std::floor(cx - pad)), static_cast<int>(std::floor(cy - pad)),
                      static_cast<int>(std::ceil(cx + pad)), static_cast<int>(std::ceil(cy + pad))};
  cover(box, c, clip, disc_coverage, shape);
}

void Canvas::text(int x, int y, std::string_view s, int scale, Rgb c) {
  for (size_t i = 0; i < s.size(); i += utf8_length(static_cast<unsigned char>(s[i]))) {
    const char* const* rows = glyph_rows(s[i]);  // a multi-byte character is one '?'
    for (int r = 0; r < kGlyphRows; ++r)
      for (int k = 0; k < kGlyphWidth; ++k)
        if (rows[r][k] == '#') fill_rect({x + k * scale, y + r * scale, x + (k + 1) * scale, y + (r + 1) * scale}, c);
    x += (kGlyphWidth + 1) * scale;
  }
}

int Canvas::text_width(std::string_view s, int scale) {
  int n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_length(static_cast<unsigned char>(s[i]))) ++n;
  return n == 0 ? 0 : n * (kGlyphWidth + 1) * scale - scale;
}

}  // namespace kiln::cli
