// Server overhead benchmark (prints one JSON object): bench_engine's online workload (Poisson
// arrivals, long-tailed lengths: bench/workload.h) on a model with seeded random weights, run
//   direct: straight on the engine (submit + poll, as bench_engine's online run measures it), then
//   http:   through kiln's HTTP server on the same engine (POST /v1/completions, token-id prompts,
//           streamed, one connection per request: bench/serve_load.h),
// with throughput, TTFT, TPOT and end-to-end p50/p99 of each and their ratios (http / direct).
//
// Both runs see the same engine in the same state: a warm-up run of the workload (unmeasured;
// --no-warmup skips it) captures the CUDA graphs and tunes the GEMMs first, and the prefix cache
// is flushed before each run, so that neither reuses the prompts another run left in the cache.
// Both send the same sampling parameters (--temperature, --top-p; default greedy) and ignore EOS,
// so every request generates exactly its max_tokens; the "checks" object counts those that did not.
// Both runs use the same summary (serve_load's summarize): throughput is completion tokens over the
// time from the first request's start to the last one's end.
//
// Usage: bench_serve --config bench/configs/astrai-1b-shape.config.json [--device cuda]
//        [--requests 512] [--rate 20] [--no-graphs] [--threads 2] [--client-threads 2]
//        [--no-warmup] [--skip-http] [--temperature 0] [--top-p 1] [--access-log]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "infer/engine.h"
#include "model/config.h"
#include "serve/server.h"
#include "serve_load.h"
#include "random_model.h"
#include "workload.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "bench_serve: error: %s\n", s.message().c_str());
  return 1;
}

struct Sampling {
  float temperature = 0.0f;
  float top_p = 1.0f;
};

GenerationRequest engine_request(const bench::OnlineRequest& w, size_t i, const Sampling& s) {
  GenerationRequest r;
  r.prompt = w.prompt;
  r.max_tokens = w.max_tokens;
  r.ignore_eos = true;
  r.temperature = s.temperature;
  r.top_p = s.top_p;
  r.seed = static_cast<uint64_t>(i);
  return r;
}

bench::LoadRequest http_request(const bench::OnlineRequest& w, size_t i, const Sampling& s, const std::string& model) {
  bench::LoadRequest r;
  r.path = "/v1/completions";
  r.arrival_seconds = w.arrival_seconds;
  r.body = {{"model", model},
            {"prompt", w.prompt},
            {"max_tokens", w.max_tokens},
            {"ignore_eos", true},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"return_token_ids", true},
            {"temperature", s.temperature}};
  if (s.top_p != 1.0f) r.body["top_p"] = s.top_p;
  if (s.temperature > 0) r.body["seed"] = i;
  return r;
}

// The workload straight on the engine: a thread submits each request at its arrival time while
// this one polls every stream (as bench_engine's online run does), stamping each event. The
// records are serve_load's, so that both runs are summarised alike. A refused submission ends the
// program (the drain would wait for it forever).
std::vector<bench::RequestResult> run_direct(Engine& engine, const std::vector<bench::OnlineRequest>& work,
                                             const Sampling& sampling) {
  const size_t n = work.size();
  std::vector<std::shared_ptr<RequestStream>> streams(n);
  std::vector<Clock::time_point> submitted(n);
  std::vector<bench::RequestResult> out(n);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < n; ++i) reqs.push_back(engine_request(work[i], i, sampling));
  const Clock::time_point t0 = Clock::now();
  std::thread submitter([&] {
    for (size_t i = 0; i < n; ++i) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(work[i].arrival_seconds)));
      submitted[i] = Clock::now();
      Result<std::shared_ptr<RequestStream>> s = engine.submit(reqs[i]);
      if (!s.ok()) std::exit(fail(s.status()));
      std::atomic_store(&streams[i], *s);
    }
  });
  std::vector<bool> done(n, false);
  size_t left = n;
  while (left > 0) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      const std::shared_ptr<RequestStream> stream = std::atomic_load(&streams[i]);
      if (done[i] || !stream) continue;
      bench::RequestResult& r = out[i];
      while (std::optional<EngineEvent> e = stream->poll()) {
        any = true;
        const double at = secs(submitted[i], Clock::now());
        if (!e->tokens.empty()) {
          const int32_t k = static_cast<int32_t>(e->tokens.size());
          if (r.ttft_seconds < 0) r.ttft_seconds = at;
          r.chunks.push_back({at, k});
          r.counted_tokens += k;
        }
        if (e->finished) {
          r.stream = true;
          r.status = 200;
          r.done = true;
          r.error = e->error;
          r.finish_reason = e->finish_reason;
          r.usage = true;
          r.prompt_tokens = e->usage.prompt_tokens;
          r.completion_tokens = r.counted_tokens;
          r.scheduled_seconds = work[i].arrival_seconds;
          r.start_seconds = secs(t0, submitted[i]);
          r.latency_seconds = at;
          done[i] = true;
          --left;
          break;
        }
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  submitter.join();
  return out;
}

// Drops the prefix cache and waits until the engine reports it empty and idle.
void flush_cache(Engine& engine) {
  engine.flush_prefix_cache();
  const Clock::time_point limit = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < limit) {
    const EngineStats st = engine.stats();
    if (st.kv_pages_cached == 0 && st.running == 0 && st.waiting == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "bench_serve: warning: the prefix cache did not empty within 30 s\n");
}

// Requests that did not generate exactly their max_tokens, or whose counted tokens disagree with
// the reported usage; the first few problems go to `samples`.
int32_t count_mismatches(const std::vector<bench::RequestResult>& results,
                         const std::vector<bench::OnlineRequest>& work, const char* run, nlohmann::json& samples) {
  int32_t bad = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const bench::RequestResult& r = results[i];
    std::string why;
    if (!r.ok())
      why = r.error.empty() ? "status " + std::to_string(r.status) + (r.done ? "" : ", no [DONE]") : r.error;
    else if (r.completion_tokens != work[i].max_tokens)
      why = std::to_string(r.completion_tokens) + " tokens, max_tokens " + std::to_string(work[i].max_tokens);
    else if (!r.usage)
      why = "no usage reported";
    else if (r.counted_tokens != r.completion_tokens)
      why = "counted " + std::to_string(r.counted_tokens) + " tokens, usage says " + std::to_string(r.completion_tokens);
    if (why.empty()) continue;
    ++bad;
    if (samples.size() < 8) samples.push_back({{"run", run}, {"request", i}, {"problem", why.substr(0, 300)}});
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln server overhead benchmark"};
  std::string config_path, device_name = "cuda";
  int32_t requests = 512, client_threads = 2;
  double rate = 20.0;
  bool no_graphs = false, no_warmup = false, skip_http = false, access_log = false;
  Sampling sampling;
  EngineOptions options;
  serve::ServerOptions server_options;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--device", device_name, "cpu or cuda");
  app.add_option("--requests", requests, "requests of the online workload")->check(CLI::PositiveNumber);
  app.add_option("--rate", rate, "arrival rate, requests per second (Poisson)")->check(CLI::PositiveNumber);
  app.add_option("--threads", server_options.threads, "server: Asio threads")->check(CLI::PositiveNumber);
  app.add_option("--client-threads", client_threads, "load client: Asio threads")->check(CLI::PositiveNumber);
  app.add_option("--temperature", sampling.temperature, "sampling temperature of every request (0: greedy)");
  app.add_option("--top-p", sampling.top_p, "nucleus sampling of every request");
  bench::add_engine_flags(app, options, &no_graphs);
  app.add_flag("--no-warmup", no_warmup, "measure without the warm-up run first");
  app.add_flag("--skip-http", skip_http, "the direct run only");
  app.add_flag("--access-log", access_log, "server: one JSON line per request on stderr");
  CLI11_PARSE(app, argc, argv);
  options.use_graphs = !no_graphs;

  Result<bench::RandomModel> built = bench::random_model(config_path, device_name);
  if (!built.ok()) return fail(built.status());
  std::unique_ptr<Backend>& backend = built->backend;
  std::shared_ptr<const Transformer> model = built->model;
  Result<std::unique_ptr<Engine>> created = Engine::create(model, nullptr, {}, options);
  if (!created.ok()) return fail(created.status());
  Engine& engine = **created;
  const std::vector<bench::OnlineRequest> work = bench::online_workload(requests, rate, model->config().vocab_size);

  nlohmann::json out = {{"config", config_path},
                        {"device", backend->device().str()},
                        {"requests", requests},
                        {"rate", rate},
                        {"cuda_graphs", options.use_graphs},
                        {"warmup", !no_warmup},
                        {"temperature", sampling.temperature},
                        {"top_p", sampling.top_p},
                        {"server_threads", server_options.threads},
                        {"client_threads", client_threads}};
  nlohmann::json samples = nlohmann::json::array();
  int32_t errors = 0;

  if (!no_warmup) {
    run_direct(engine, work, sampling);
    std::fprintf(stderr, "warm-up done\n");
  }
  flush_cache(engine);
  const EngineStats before_direct = engine.stats();
  const std::vector<bench::RequestResult> direct = run_direct(engine, work, sampling);
  const bench::LoadSummary ds = bench::summarize(direct);
  const EngineStats after_direct = engine.stats();
  out["direct"] = bench::to_json(ds);
  out["direct"]["preemptions"] = after_direct.preemptions - before_direct.preemptions;
  out["direct"]["prefix_hit_tokens"] = after_direct.prefix_hit_tokens - before_direct.prefix_hit_tokens;
  errors += count_mismatches(direct, work, "direct", samples);
  std::fprintf(stderr, "direct: %.0f tok/s, TTFT p50 %.1f ms, TPOT p50 %.2f ms\n", ds.output_tokens_per_s,
               ds.ttft_ms_p50, ds.tpot_ms_p50);

  if (!skip_http) {
    flush_cache(engine);
    const EngineStats before_http = engine.stats();
    server_options.port = 0;
    server_options.served_model_name = "random";
    server_options.access_log = access_log;
    server_options.max_queued = std::max(server_options.max_queued, requests);
    Result<std::unique_ptr<serve::Server>> server =
        serve::Server::start(serve::ServedModel{&engine, nullptr, "random", engine.max_sequence_tokens()}, server_options);
    if (!server.ok()) return fail(server.status());
    std::vector<bench::LoadRequest> load;
    load.reserve(work.size());
    for (size_t i = 0; i < work.size(); ++i) load.push_back(http_request(work[i], i, sampling, "random"));
    bench::LoadOptions lo;
    lo.url = (*server)->url();
    lo.threads = client_threads;
    const std::vector<bench::RequestResult> http = bench::run_load(load, lo);
    (*server)->shutdown(std::chrono::milliseconds(5000));
    const bench::LoadSummary hs = bench::summarize(http);
    out["http"] = bench::to_json(hs);
    const EngineStats after_http = engine.stats();
    out["http"]["preemptions"] = after_http.preemptions - before_http.preemptions;
    out["http"]["prefix_hit_tokens"] = after_http.prefix_hit_tokens - before_http.prefix_hit_tokens;
    errors += count_mismatches(http, work, "http", samples);
    auto ratio = [](double h, double d) { return d > 0 ? h / d : 0.0; };
    out["ratio"] = {{"throughput", ratio(hs.output_tokens_per_s, ds.output_tokens_per_s)},
                    {"ttft_p50", ratio(hs.ttft_ms_p50, ds.ttft_ms_p50)},
                    {"ttft_p99", ratio(hs.ttft_ms_p99, ds.ttft_ms_p99)},
                    {"tpot_p50", ratio(hs.tpot_ms_p50, ds.tpot_ms_p50)},
                    {"tpot_p99", ratio(hs.tpot_ms_p99, ds.tpot_ms_p99)},
                    {"e2e_p50", ratio(hs.e2e_ms_p50, ds.e2e_ms_p50)},
                    {"e2e_p99", ratio(hs.e2e_ms_p99, ds.e2e_ms_p99)}};
    std::fprintf(stderr, "http: %.0f tok/s, TTFT p50 %.1f ms, TPOT p50 %.2f ms\n", hs.output_tokens_per_s,
                 hs.ttft_ms_p50, hs.tpot_ms_p50);
  }
  out["errors"] = errors;
  if (!samples.empty()) out["error_samples"] = samples;
  std::cout << out.dump(2) << std::endl;
  return 0;
}
