// kiln plot: the PNG it writes is valid per the PNG specification (checked by the test's own chunk
// reader and CRC-32, itself checked against the standard check value, with zlib only for inflating),
// and the drawing is where the axes say: for a straight-line loss, the curve's colour lies on the
// pixels the axis mapping predicts and nowhere far from them. Bad input exits non-zero with a
// message naming the file and line.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/plot_chart.h"
#include "cli/plot_metrics.h"
#include "cli/png.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

using cli::Rgb;

// CRC-32 of ISO 3309 / ITU-T V.42 (the PNG chunk CRC), bit by bit: independent of zlib's.
uint32_t crc32_reference(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

uint32_t be32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A decoded PNG: every structural rule is an EXPECT, the pixels come back unfiltered.
struct Decoded {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return static_cast<uint8_t>(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

Decoded decode_png(const std::string& png) {
  Decoded d;
  EXPECT_GE(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "signature";
  std::string idat, first, last;
  bool idat_closed = false;
  size_t at = 8;
  int chunks = 0;
  while (at + 12 <= png.size()) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    EXPECT_LE(at + 12 + len, png.size()) << "chunk " << type << " runs past the end";
    if (at + 12 + len > png.size()) break;
    const std::string data = png.substr(at + 8, len);
    EXPECT_EQ(be32(png, at + 8 + len), crc32_reference(type + data)) << "CRC of chunk " << type;
    if (chunks++ == 0) first = type;
    last = type;
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      d.width = be32(data, 0);
      d.height = be32(data, 4);
      EXPECT_EQ(data[8], 8) << "bit depth";
      EXPECT_EQ(data[9], 2) << "colour type (RGB)";
      EXPECT_EQ(data[10], 0) << "compression method";
      EXPECT_EQ(data[11], 0) << "filter method";
      EXPECT_EQ(data[12], 0) << "interlace method";
    } else if (type == "IDAT") {
      EXPECT_FALSE(idat_closed) << "IDAT chunks must be consecutive";
      idat += data;
    } else if (!idat.empty()) {
      idat_closed = true;
    }
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size()) << "bytes after the last chunk";
  EXPECT_EQ(first, "IHDR");
  EXPECT_EQ(last, "IEND");
  const size_t stride = 1 + static_cast<size_t>(d.width) * 3;
  std::vector<uint8_t> raw(stride * d.height);
  uLongf raw_size = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()), Z_OK);
  EXPECT_EQ(raw_size, stride * d.height) << "inflated size = height * (1 + width * 3)";
  d.rgb.assign(static_cast<size_t>(d.width) * d.height * 3, 0);
  const size_t row = static_cast<size_t>(d.width) * 3;
  for (uint32_t y = 0; y < d.height && raw_size == raw.size(); ++y) {
    const uint8_t filter = raw[y * stride];
    EXPECT_LE(filter, 4) << "filter byte of row " << y;
    uint8_t* out = &d.rgb[y * row];
    const uint8_t* up = y > 0 ? &d.rgb[(y - 1) * row] : nullptr;
    for (size_t i = 0; i < row; ++i) {
      const int a = i >= 3 ? out[i - 3] : 0, b = up ? up[i] : 0, c = (up && i >= 3) ? up[i - 3] : 0;
      const uint8_t v = raw[y * stride + 1 + i];
      const int pred = filter == 1 ? a : filter == 2 ? b : filter == 3 ? (a + b) / 2 : filter == 4 ? paeth(a, b, c) : 0;
      out[i] = static_cast<uint8_t>(v + pred);
    }
  }
  return d;
}

// A straight-line loss (4 - 0.03 step), a constant lr and a rising grad norm over steps 1..100.
std::string straight_metrics(bool with_val) {
  std::string text;
  for (int s = 1; s <= 100; ++s) {
    text += "{\"step\": " + std::to_string(s) + ", \"policy_version\": " + std::to_string(s) +
            ", \"loss\": " + std::to_string(4.0 - 0.03 * s) + ", \"lr\": 0.0001, \"grad_norm\": " +
            std::to_string(1.0 + 0.01 * s) + ", \"tokens\": 64, \"tokens_per_s\": 1000.0}\n";
    if (with_val && s % 25 == 0) text += "{\"step\": " + std::to_string(s) + ", \"val_loss\": 3.5}\n";
  }
  return text;
}

bool near_colour(Rgb a, Rgb b, int tol) {
  return std::abs(a.r - b.r) <= tol && std::abs(a.g - b.g) <= tol && std::abs(a.b - b.b) <= tol;
}

TEST(Png, Crc32CheckValueOfTheTestsReference) { EXPECT_EQ(crc32_reference("123456789"), 0xCBF43926u); }

TEST(Png, EncoderOutputIsValidAndRoundTrips) {
  const int w = 37, h = 11;  // odd sizes
  std::vector<uint8_t> rgb(w * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7919) % 251);
  Result<std::string> png = cli::encode_png_rgb(rgb, w, h);
  ASSERT_TRUE(png.ok()) << png.status().message();
  const Decoded d = decode_png(*png);
  EXPECT_EQ(d.width, 37u);
  EXPECT_EQ(d.height, 11u);
  EXPECT_EQ(d.rgb, rgb);
  EXPECT_FALSE(cli::encode_png_rgb(rgb, w + 1, h).ok());
}

TEST(Plot, AxisTicksAreNiceAndLabelled) {
  cli::Axis a = cli::make_axis(-0.2, 5.3, 5, false);
  EXPECT_EQ(a.tick_step, 1.0);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0", "1", "2", "3", "4", "5"}));
  a = cli::make_axis(-5e-6, 1.05e-4, 5, false);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0", "2e-5", "4e-5", "6e-5", "8e-5", "1e-4"}));
  a = cli::make_axis(8.9e-4, 1.11e-3, 4, false);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"0.00090", "0.00095", "0.00100", "0.00105", "0.00110"}));
  a = cli::make_axis(0.9e6, 2.1e6, 3, false);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"1e6", "1.5e6", "2e6"}));
  a = cli::make_axis(1.9, 2.31, 4, false);
  EXPECT_EQ(a.labels, (std::vector<std::string>{"1.9", "2.0", "2.1", "2.2", "2.3"}));
  a = cli::make_axis(-1.0, 3.0, 10, true);  // steps: never fractional
  EXPECT_EQ(a.tick_step, 1.0);
  for (size_t i = 0; i < a.ticks.size(); ++i) EXPECT_DOUBLE_EQ(a.ticks[i], std::stod(a.labels[i]));
}

TEST(Plot, WritesAValidPngWithTheCurveWhereTheAxesSay) {
  TempDir tmp;
  const std::string metrics = tmp.file("metrics.jsonl", straight_metrics(/*with_val=*/true));
  const std::string out = (tmp.path / "chart.png").string();
  const int W = 1000, H = 900;
  RunResult r = run_kiln("plot " + tmp.path.string() + " --output " + out + " --width 1000 --height 900");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(out), std::string::npos) << r.output;
  const Decoded png = decode_png(slurp(out));
  ASSERT_EQ(png.width, static_cast<uint32_t>(W));
  ASSERT_EQ(png.height, static_cast<uint32_t>(H));

  // The layout kiln used: same panels, same size.
  Result<cli::RunMetrics> m = cli::read_run_metrics(metrics);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<cli::Panel> panels = cli::metrics_panels(*m);
  ASSERT_EQ(panels.size(), 3u);
  cli::ChartLayout layout;
  ASSERT_EQ(cli::layout_chart(panels, W, H, &layout), "");
  const cli::PanelLayout& p = layout.panels[0];
  // The axes hold the data and their ticks are inside the plot.
  EXPECT_LT(p.x.lo, 1.0);
  EXPECT_GT(p.x.hi, 100.0);
  EXPECT_LT(p.y.lo, 1.0);
  EXPECT_GT(p.y.hi, 3.97);
  ASSERT_GE(p.y.ticks.size(), 3u);
  for (size_t k = 0; k < p.y.ticks.size(); ++k) EXPECT_NEAR(std::stod(p.y.labels[k]), p.y.ticks[k], 1e-9);

  // The mapping, computed here: x.lo -> the plot's left edge, x.hi -> its right edge; y up.
  const cli::PixelRect& rect = p.plot;
  auto map_x = [&](double v) { return rect.x0 + (v - p.x.lo) / (p.x.hi - p.x.lo) * (rect.x1 - rect.x0); };
  auto map_y = [&](double v) { return rect.y1 - (v - p.y.lo) / (p.y.hi - p.y.lo) * (rect.y1 - rect.y0); };
  // Every point of the curve: the exact colour within a pixel of where the mapping puts it.
  for (int s = 1; s <= 100; ++s) {
    const int x = static_cast<int>(std::floor(map_x(s))), y = static_cast<int>(std::floor(map_y(4.0 - 0.03 * s)));
    bool found = false;
    for (int dy = -1; dy <= 1 && !found; ++dy)
      for (int dx = -1; dx <= 1 && !found; ++dx) found = png.at(x + dx, y + dy) == cli::kLossColor;
    EXPECT_TRUE(found) << "no loss colour near (" << x << ", " << y << ") for step " << s;
  }
  // And nothing of the curve's colour far from the line: every such pixel of the panel's plot area
  // lies within the line's half width (plus antialiasing) of the predicted line.
  const double ax = map_x(1), ay = map_y(3.97), bx = map_x(100), by = map_y(1.0);
  int curve_pixels = 0;
  for (int y = rect.y0; y < rect.y1; ++y)
    for (int x = rect.x0; x < rect.x1; ++x) {
      if (!near_colour(png.at(x, y), cli::kLossColor, 24)) continue;
      ++curve_pixels;
      const double px = x + 0.5, py = y + 0.5, dx = bx - ax, dy = by - ay;
      const double t = std::clamp(((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy), 0.0, 1.0);
      const double dist = std::hypot(px - (ax + t * dx), py - (ay + t * dy));
      EXPECT_LE(dist, 2.0) << "loss-coloured pixel (" << x << ", " << y << ") far from the line";
    }
  EXPECT_GT(curve_pixels, static_cast<int>(bx - ax)) << "the curve spans the plot";
  // The validation points: discs of their colour centred where the mapping says.
  for (int s = 25; s <= 100; s += 25) {
    const int x = static_cast<int>(std::floor(map_x(s))), y = static_cast<int>(std::floor(map_y(3.5)));
    EXPECT_EQ(png.at(x, y), cli::kValLossColor) << "val_loss marker at step " << s;
  }
  // The other panels' curves: lr is flat (one row), grad norm rises to the right.
  const cli::PanelLayout& lr = layout.panels[1];
  const int lr_y = static_cast<int>(std::floor(lr.py(1e-4)));
  EXPECT_EQ(png.at(static_cast<int>(lr.px(50)), lr_y), cli::kLrColor);
  const cli::PanelLayout& gn = layout.panels[2];
  EXPECT_EQ(png.at(static_cast<int>(gn.px(10)), static_cast<int>(gn.py(1.1))), cli::kGradNormColor);
  EXPECT_EQ(png.at(static_cast<int>(gn.px(90)), static_cast<int>(gn.py(1.9))), cli::kGradNormColor);
  // Tick labels: dark ink left of each plot (y labels) and below it (x labels).
  auto ink_in = [&](int x0, int y0, int x1, int y1) {
    int n = 0;
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) n += near_colour(png.at(x, y), Rgb{30, 30, 30}, 10);
    return n;
  };
  EXPECT_GT(ink_in(0, rect.y0, rect.x0, rect.y1), 100);
  EXPECT_GT(ink_in(rect.x0, rect.y1 + 1, rect.x1, rect.y1 + 30), 100);
}

TEST(Plot, DefaultOutputIsTheRunFolder) {
  TempDir tmp;
  tmp.file("metrics.jsonl", straight_metrics(false));
  RunResult r = run_kiln("plot " + tmp.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Decoded png = decode_png(slurp(tmp.path / "metrics.png"));
  EXPECT_EQ(png.width, 1000u);
  EXPECT_EQ(png.height, 900u);
}

// A run in progress plots: the last line, still being written (no newline yet), is left out; a
// broken line that ends in a newline is still an error (BadInputExitsNonZeroWithTheReason).
TEST(Plot, ARunInProgressPlotsWithoutItsUnfinishedLine) {
  TempDir tmp;
  tmp.file("metrics.jsonl", straight_metrics(false) + "{\"step\": 99, \"lo");
  RunResult r = run_kiln("plot " + tmp.path.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("its unfinished last line left out"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(tmp.path / "metrics.png"));
}

TEST(Plot, BadInputExitsNonZeroWithTheReason) {
  TempDir tmp;
  struct Case {
    std::string args, message;
  };
  const std::string dir = tmp.path.string();
  fs::create_directories(tmp.path / "empty_run");
  fs::create_directories(tmp.path / "bad_json");
  std::ofstream(tmp.path / "bad_json" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n\n{\"step\": 2, \"loss\": \n";
  fs::create_directories(tmp.path / "bad_value");
  std::ofstream(tmp.path / "bad_value" / "metrics.jsonl") << "{\"step\": 1, \"loss\": \"high\"}\n";
  fs::create_directories(tmp.path / "no_step");
  std::ofstream(tmp.path / "no_step" / "metrics.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"loss\": 1}\n";
  fs::create_directories(tmp.path / "no_lines");
  std::ofstream(tmp.path / "no_lines" / "metrics.jsonl") << "";
  fs::create_directories(tmp.path / "ok");
  std::ofstream(tmp.path / "ok" / "metrics.jsonl") << straight_metrics(false);
  const std::vector<Case> cases = {
      {"plot " + dir + "/missing", "no such folder '" + dir + "/missing'"},
      {"plot " + dir + "/empty_run", "has no metrics.jsonl"},
      {"plot " + dir + "/bad_json", dir + "/bad_json/metrics.jsonl:3: not a JSON object"},
      {"plot " + dir + "/bad_value", "metrics.jsonl:1: \"loss\" must be a number"},
      {"plot " + dir + "/no_step", "metrics.jsonl:2: no integer \"step\""},
      {"plot " + dir + "/no_lines", "has no steps yet"},
      {"plot " + dir + "/ok --width 50", "--width and --height must be between"},
      {"plot " + dir + "/ok --height 210", "too small for 3 panels: use --height"},
      {"plot " + dir + "/ok --output " + dir + "/missing/x.png", "cannot create '" + dir + "/missing/x.png'"},
      {"plot", "run_dir is required"},
  };
  for (const Case& c : cases) {
    RunResult r = run_kiln(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_FALSE(r.crashed) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace kiln::test
