// kiln plot's raster canvas: an RGB image with the few primitives a chart needs, rectangles,
// antialiased lines and discs (coverage from the distance of each pixel centre to the shape,
// clipped to a rectangle), and text in the bitmap font of plot_font.h at an integer scale.
// Coordinates: pixel (x, y) covers [x, x + 1) x [y, y + 1), y down; its centre is (x + 0.5, y + 0.5).
// Ownership: owns its pixels. Thread safety: none.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::cli {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// Pixels [x0, x1) x [y0, y1).
struct PixelRect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }  // rows top first, 3 bytes a pixel
  Rgb at(int x, int y) const;

  // Mixes `c` into pixel (x, y) with weight alpha in [0, 1]; outside the canvas: nothing.
  void blend(int x, int y, Rgb c, double alpha);
  void fill_rect(PixelRect r, Rgb c);
  // A segment of the given width (pixels), round-capped.
  void line(double x0, double y0, double x1, double y1, double width, Rgb c, PixelRect clip);
  void disc(double cx, double cy, double radius, Rgb c, PixelRect clip);

  // Text with its top-left corner at (x, y): cap height 7 * scale, descenders to 9 * scale.
  void text(int x, int y, std::string_view s, int scale, Rgb c);
  static int text_width(std::string_view s, int scale);  // advance of 6 * scale a character, less the last gap

 private:
  void cover(PixelRect box, Rgb c, PixelRect clip, double (*coverage)(const double* shape, double px, double py),
             const double* shape);
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

}  // namespace kiln::cli
