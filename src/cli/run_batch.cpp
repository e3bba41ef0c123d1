// kiln run-batch: an OpenAI batch-API input file through the engine, written as the batch API's
// output file (serve/batch.h), with the server's protocol code.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "core/plural.h"
#include "cli/common.h"
#include "cli/engine_flags.h"
#include "cli/serve_flags.h"
#include "serve/batch.h"

namespace kiln::cli {

Runner add_run_batch(CLI::App& app) {
  struct Flags {
    ModelFlags model;
    EngineFlags engine;
    ServeFlags serve;
    std::string input, output;
    int32_t max_in_flight = 1024;
  };
  auto f = std::make_shared<Flags>();
  CLI::App* c = app.add_subcommand("run-batch", "run an OpenAI batch file (chat and completions lines) through the engine");
  f->model.add(c, "");
  c->get_option("--model")->required();
  f->engine.add(c);
  f->engine.add_generation_config(c);
  f->serve.add(c);
  c->add_option("-i,--input", f->input, "batch input JSONL (custom_id, method, url, body); - for stdin")->required();
  c->add_option("-o,--output", f->output, "batch output JSONL; - for stdout")->required();
  c->add_option("--max-in-flight", f->max_in_flight, "requests in the engine at once at most")->capture_default_str();
  return [f]() -> int {
    if (f->max_in_flight < 1) return fail(invalid_argument("--max-in-flight must be at least 1"));
    std::ifstream in_file;
    if (f->input != "-") {
      in_file.open(f->input);
      if (!in_file) return fail(not_found("cannot read --input " + f->input));
    }
    std::ofstream out_file;
    if (f->output != "-") {
      out_file.open(f->output, std::ios::trunc);
      if (!out_file) return fail(io_error("cannot write --output " + f->output));
    }
    Result<std::unique_ptr<EngineSession>> started = start_engine(f->model, f->engine, /*need_text=*/false);
    if (!started.ok()) return fail(started.status());
    EngineSession& s = **started;
    serve::ServedModel served{s.engine.get(), s.text ? &*s.text : nullptr, f->model.model_dir, s.engine->max_sequence_tokens(),
                              s.sampling_defaults};
    Result<serve::ServeContext> ctx = serve::make_serve_context(served, f->serve.options);
    if (!ctx.ok()) return fail(ctx.status());
    const bool tty = isatty(STDERR_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    Result<serve::BatchSummary> sum = serve::run_batch(
        *s.engine, *ctx, f->input == "-" ? std::cin : in_file, f->output == "-" ? std::cout : out_file, f->max_in_flight,
        [&](int64_t done, int64_t total) {
          if (tty) std::fprintf(stderr, "\r[%lld/%lld] requests ", static_cast<long long>(done), static_cast<long long>(total));
        });
    if (tty) std::fputc('\n', stderr);
    if (!sum.ok()) return fail(sum.status());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "kiln: %s (%lld succeeded, %lld failed), %lld prompt + %lld completion tokens in %.2f s\n",
                 count_of(sum->requests, "request").c_str(), static_cast<long long>(sum->succeeded),
                 static_cast<long long>(sum->failed), static_cast<long long>(sum->prompt_tokens),
                 static_cast<long long>(sum->completion_tokens), secs);
    return sum->failed > 0 ? 1 : 0;
  };
}

}  // namespace kiln::cli
