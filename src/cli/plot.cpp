// kiln plot RUN_DIR: draws a run's metrics.jsonl (loss with validation loss, learning rate, grad
// norm against the step) as a PNG, by kiln's own chart renderer (plot_chart.h) and PNG encoder
// (png.h). Safe to run while the run trains: it reads the lines written so far.
#include <filesystem>
#include <memory>
#include <string>

#include "cli/common.h"
#include "cli/plot_chart.h"
#include "cli/plot_metrics.h"
#include "cli/png.h"

namespace kiln::cli {
namespace {

struct PlotFlags {
  std::string run_dir, output;  // output empty: RUN_DIR/metrics.png
  int width = 1000, height = 900;
};

constexpr int kMinSide = 200, kMaxSide = 10000;

int run_plot(const PlotFlags& f) {
  namespace fs = std::filesystem;
  if (f.width < kMinSide || f.width > kMaxSide || f.height < kMinSide || f.height > kMaxSide)
    return fail(invalid_argument("--width and --height must be between " + std::to_string(kMinSide) + " and " +
                                 std::to_string(kMaxSide) + " pixels"));
  std::error_code ec;
  if (!fs::is_directory(f.run_dir, ec))
    return fail(not_found("no such folder '" + f.run_dir + "': give the --output folder of a kiln train run"));
  const std::string metrics_path = (fs::path(f.run_dir) / "metrics.jsonl").string();
  if (!fs::exists(metrics_path, ec))
    return fail(not_found("'" + f.run_dir + "' has no metrics.jsonl: is it the --output folder of a kiln train run?"));
  Result<RunMetrics> metrics = read_run_metrics(metrics_path);
  if (!metrics.ok()) return fail(metrics.status());
  const std::vector<Panel> panels = metrics_panels(*metrics);
  if (panels.empty())
    return fail(invalid_argument(metrics_path + " has no loss, val_loss, lr or grad_norm values to plot"));
  ChartLayout layout;
  if (std::string e = layout_chart(panels, f.width, f.height, &layout); !e.empty()) return fail(invalid_argument(e));
  const std::string title = "kiln run " + f.run_dir + ": steps " + std::to_string(metrics->first_step) + " to " +
                            std::to_string(metrics->last_step);
  const Canvas canvas = render_chart(title, panels, layout, f.width, f.height);
  const std::string output = f.output.empty() ? (fs::path(f.run_dir) / "metrics.png").string() : f.output;
  if (Status s = write_png_rgb(output, canvas.rgb(), canvas.width(), canvas.height()); !s.ok()) return fail(s);
  std::fprintf(stderr, "kiln: wrote %s (%dx%d, %zu panels, %lld lines of %s%s)\n", output.c_str(), f.width, f.height,
               panels.size(), static_cast<long long>(metrics->lines), metrics_path.c_str(),
               metrics->partial_last_line ? "; its unfinished last line left out" : "");
  return 0;
}

}  // namespace

Runner add_plot(CLI::App& app) {
  auto f = std::make_shared<PlotFlags>();
  CLI::App* p = app.add_subcommand("plot", "draw a training run's metrics.jsonl (loss, learning rate, grad norm) as a PNG");
  p->add_option("run_dir", f->run_dir, "the run folder (kiln train --output) holding metrics.jsonl")->required();
  p->add_option("--output", f->output, "the PNG to write (default: RUN_DIR/metrics.png)");
  p->add_option("--width", f->width, "image width in pixels")->capture_default_str();
  p->add_option("--height", f->height, "image height in pixels")->capture_default_str();
  return [f] { return run_plot(*f); };
}

}  // namespace kiln::cli
