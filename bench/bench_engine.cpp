// Engine benchmark (prints one JSON object): a model built with seeded random weights from a
// Hugging Face config.json, run through kiln's inference engine.
//   single:  one request at each of --single-contexts: prefill time (time to first token) and decode
//            ms per token (the B=1 latency figures), with the engine's counters of the run (steps,
//            where the engine thread's time went)
//   decode:  B requests of a 1K-token prompt decoding together; tokens/s of the decode phase
//            (from the moment every request has its first token to the first request's last), after
//            a warm-up batch of the same shape (other prompts) has captured the steps' graphs, as the
//            single-request runs measure their second repetition; the engine's counters in the
//            JSON are those of the measured batch (graph_device_s over every replay, including the
//            cheaper ones of a part-filled bucket as requests finish; full_bucket_graph_ms: the
//            device time of a replay with all B rows, the steady step)
//   online:  N requests with Poisson arrivals at --rate requests/s, prompt and output lengths from
//            a fixed-seed long-tailed (log-normal) distribution; throughput, TTFT and TPOT p50/p99
//   prefix:  64 requests sharing a 2K-token prefix (each with its own 32-token tail), after one
//            request has put the prefix in the cache; TTFT with the radix cache on and off, and
//            with the cache on when all arrive at once to an empty cache
// Usage: bench_engine --config bench/configs/astrai-1b-shape.config.json [--device cuda]
//        [--batches 1,8,32,64,128,256] [--context 1024] [--decode-tokens 128] [--online-requests 512]
//        [--rate 20] [--single-contexts 1024,8192,30000] [--skip single,decode,online,prefix] [--no-graphs]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "infer/engine.h"
#include "model/config.h"
#include "random_model.h"
#include "workload.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int fail(const Status& s) {
  std::fprintf(stderr, "bench_engine: error: %s\n", s.message().c_str());
  return 1;
}

using bench::random_ids;  // bench/workload.h: shared with bench_serve

// Per-request timing from its event stream.
struct Timing {
  Clock::time_point submitted, first, last;
  int32_t tokens = 0;
  std::vector<Clock::time_point> times;  // of every token
};

// Drains every stream on one thread, stamping first / last token times as events arrive. A stream
// still empty (a request not yet submitted by another thread) is waited for.
void drain_all(std::vector<std::shared_ptr<RequestStream>>& streams, std::vector<Timing>& t) {
  std::vector<bool> done(streams.size(), false);
  size_t left = streams.size();
  while (left > 0) {
    bool any = false;
    for (size_t i = 0; i < streams.size(); ++i) {
      const std::shared_ptr<RequestStream> stream = std::atomic_load(&streams[i]);
      if (done[i] || !stream) continue;
      while (std::optional<EngineEvent> e = stream->poll()) {
        any = true;
        const auto now = Clock::now();
        if (!e->tokens.empty()) {
          if (t[i].tokens == 0) t[i].first = now;
          t[i].last = now;
          t[i].tokens += static_cast<int32_t>(e->tokens.size());
          t[i].times.insert(t[i].times.end(), e->tokens.size(), now);
        }
        if (e->finished) {
          done[i] = true;
          --left;
          break;
        }
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The engine's counters accumulated between two snapshots, as JSON: steps, where the engine
// thread's time went (EngineStats), graph replays and their device time.
nlohmann::json counters_since(const EngineStats& now, const EngineStats& before) {
  return {{"steps", now.steps - before.steps},
          {"graph_replays", now.graph_replays - before.graph_replays},
          {"lookahead_steps", now.lookahead_steps - before.lookahead_steps},
          {"engine_step_s", now.step_seconds - before.step_seconds},
          {"executor_s", now.executor_seconds - before.executor_seconds},
          {"device_wait_s", now.device_wait_seconds - before.device_wait_seconds},
          {"pack_s", now.pack_seconds - before.pack_seconds},
          {"issue_s", now.issue_seconds - before.issue_seconds},
          {"schedule_s", now.schedule_seconds - before.schedule_seconds},
          {"deliver_s", now.deliver_seconds - before.deliver_seconds},
          {"graph_launch_s", now.graph_launch_seconds - before.graph_launch_seconds},
          {"graph_device_s", now.graph_device_seconds - before.graph_device_seconds},
          {"graph_gap_s", now.graph_gap_seconds - before.graph_gap_seconds},
          {"graph_gaps", now.graph_gaps - before.graph_gaps}};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double k = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(k)), hi = static_cast<size_t>(std::ceil(k));
  return v[lo] + (v[hi] - v[lo]) * (k - static_cast<double>(lo));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln engine benchmark"};
  std::string config_path, device_name = "cuda", batches = "1,8,32,64,128,256", skip, single = "1024,8192,30000";
  int32_t context = 1024, decode_tokens = 128, online_requests = 512, prefix_len = 2048, prefix_requests = 64;
  double rate = 20.0;
  bool no_graphs = false;
  EngineOptions options;
  app.add_option("--config", config_path, "Hugging Face config.json")->required();
  app.add_option("--device", device_name, "cpu or cuda");
  app.add_option("--batches", batches, "decode batch sizes, comma separated");
  app.add_option("--context", context, "prompt tokens of the decode runs");
  app.add_option("--decode-tokens", decode_tokens, "tokens each request generates in the decode runs");
  app.add_option("--online-requests", online_requests, "requests of the online run");
  app.add_option("--rate", rate, "online arrival rate, requests per second (Poisson)");
  app.add_option("--prefix-len", prefix_len, "shared prefix tokens of the prefix run");
  app.add_option("--prefix-requests", prefix_requests, "requests of the prefix run");
  app.add_option("--single-contexts", single, "prompt lengths of the single-request runs");
  app.add_option("--skip", skip, "parts to skip: single, decode, online, prefix (comma separated)");
  bench::add_engine_flags(app, options, &no_graphs);
  CLI11_PARSE(app, argc, argv);
  options.use_graphs = !no_graphs;

  Result<bench::RandomModel> built = bench::random_model(config_path, device_name);
  if (!built.ok()) return fail(built.status());
  std::unique_ptr<Backend>& backend = built->backend;
  std::shared_ptr<const Transformer> model = built->model;
  const int64_t vocab = model->config().vocab_size;
  nlohmann::json out;
  // Every engine of the run; the first one's step budgets and page size (automatic values resolved)
  // go in the JSON.
  auto make_engine = [&](const EngineOptions& o) {
    Result<std::unique_ptr<Engine>> e = Engine::create(model, nullptr, {}, o);
    if (e.ok() && !out.contains("max_step_tokens")) {
      out["max_step_tokens"] = (*e)->options().max_step_tokens;
      out["mixed_step_tokens"] = (*e)->options().mixed_step_tokens;
      out["page_size"] = (*e)->options().page_size;
    }
    return e;
  };

  out.update({{"system", "kiln"},
              {"config", config_path},
              {"device", backend->device().str()},
              {"params", model->parameter_count()},
              {"cuda_graphs", options.use_graphs},
              {"lookahead", options.lookahead}});

  if (skip.find("single") == std::string::npos) {
    Result<std::unique_ptr<Engine>> engine = make_engine(options);
    if (!engine.ok()) return fail(engine.status());
    std::stringstream ss(single);
    for (std::string item; std::getline(ss, item, ',');) {
      const int32_t n = std::stoi(item);
      for (int rep = 0; rep < 2; ++rep) {  // the first run captures graphs and tunes GEMMs
        GenerationRequest r;
        r.prompt = random_ids(n, vocab, 7 + static_cast<uint64_t>(n) + static_cast<uint64_t>(rep) * 1000);
        r.max_tokens = decode_tokens;
        r.ignore_eos = true;
        std::vector<std::shared_ptr<RequestStream>> streams;
        std::vector<Timing> t(1);
        const EngineStats before = (*engine)->stats();
        t[0].submitted = Clock::now();
        Result<std::shared_ptr<RequestStream>> s = (*engine)->submit(r);
        if (!s.ok()) return fail(s.status());
        streams.push_back(*s);
        drain_all(streams, t);
        if (rep == 0) continue;
        const double decode_ms = secs(t[0].first, t[0].last) * 1e3 / std::max(1, t[0].tokens - 1);
        out["single"].push_back({{"context", n},
                                 {"prefill_ms", secs(t[0].submitted, t[0].first) * 1e3},
                                 {"decode_ms_per_token", decode_ms},
                                 {"counters", counters_since((*engine)->stats(), before)}});
        std::fprintf(stderr, "single %d: prefill %.2f ms, decode %.3f ms/token\n", n,
                     secs(t[0].submitted, t[0].first) * 1e3, decode_ms);
      }
    }
  }

  if (skip.find("decode") == std::string::npos) {
    std::stringstream ss(batches);
    for (std::string item; std::getline(ss, item, ',');) {
      const int32_t B = std::stoi(item);
      EngineOptions o = options;
      o.max_running = std::max(o.max_running, B);
      if (o.max_step_tokens > 0) o.max_step_tokens = std::max(o.max_step_tokens, o.max_running);
      Result<std::unique_ptr<Engine>> engine = make_engine(o);
      if (!engine.ok()) return fail(engine.status());
      std::vector<std::shared_ptr<RequestStream>> streams;
      std::vector<Timing> t(static_cast<size_t>(B));
      // The warm-up batch (other prompts; as many tokens, so that all B decode together after the
      // last prefill as they will in the measured batch), then the measured one.
      EngineStats warm;
      for (const bool warm_up : {true, false}) {
        streams.clear();
        t.assign(static_cast<size_t>(B), Timing{});
        for (int32_t b = 0; b < B; ++b) {
          GenerationRequest r;
          r.prompt = random_ids(context, vocab, (warm_up ? 1000000 : 100) + static_cast<uint64_t>(b));
          r.max_tokens = decode_tokens;
          r.ignore_eos = true;
          t[b].submitted = Clock::now();
          Result<std::shared_ptr<RequestStream>> s = (*engine)->submit(r);
          if (!s.ok()) return fail(s.status());
          streams.push_back(*s);
        }
        drain_all(streams, t);
        if (warm_up) warm = (*engine)->stats();
      }
      // Steady state: from the moment every request has its first token to the moment the first
      // one finishes, all B decode every step. The window is measured in whole steps on the request
      // that started last (one token a step): from its first token to its last one before the first
      // request finishes. (Counting every request's tokens between those two moments counts one step
      // fewer than the window spans, the window ending as the first request's last step is being
      // delivered: the former estimate, kept as tokens_per_s_counted.)
      size_t last_in = 0;
      Clock::time_point stop = t[0].last, end = t[0].last;
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i].first > t[last_in].first) last_in = i;
        stop = std::min(stop, t[i].last), end = std::max(end, t[i].last);
      }
      const Clock::time_point start = t[last_in].first;
      Clock::time_point stop_step = start;
      int64_t steps = 0;
      for (const Clock::time_point& when : t[last_in].times)
        if (when > start && when <= stop) ++steps, stop_step = std::max(stop_step, when);
      int64_t counted = 0, all_tokens = 0;
      for (const Timing& x : t) {
        for (const Clock::time_point& when : x.times) counted += when > start && when <= stop;
        all_tokens += x.tokens;
      }
      const double dt = secs(start, stop_step);
      const double tokens = static_cast<double>(steps) * B;
      const Clock::time_point t_submit = t[0].submitted;
      // The measured batch's share of the counters.
      const EngineStats st = (*engine)->stats();
      const int64_t full_replays = st.full_bucket_replays - warm.full_bucket_replays;
      const double full_seconds = st.full_bucket_seconds - warm.full_bucket_seconds;
      nlohmann::json entry = {{"batch", B},
                              {"context", context},
                              {"tokens_per_s", dt > 0 ? tokens / dt : 0.0},
                              {"ms_per_step", steps > 0 ? dt * 1e3 / static_cast<double>(steps) : 0.0},
                              {"steady_seconds", dt},
                              {"steady_steps", steps},
                              {"tokens_per_s_counted", secs(start, stop) > 0 ? counted / secs(start, stop) : 0.0},
                              {"all_tokens_per_s", static_cast<double>(all_tokens) / secs(t_submit, end)},
                              {"full_bucket_replays", full_replays},
                              {"full_bucket_graph_ms", full_replays > 0 ? 1e3 * full_seconds / full_replays : 0.0},
                              {"kv_capacity_tokens", (*engine)->kv_capacity_tokens()}};
      entry.update(counters_since(st, warm));
      out["decode"].push_back(std::move(entry));
      std::fprintf(stderr, "decode B=%d: %.0f tok/s\n", B, dt > 0 ? tokens / dt : 0.0);
    }
  }

  if (skip.find("online") == std::string::npos) {
    Result<std::unique_ptr<Engine>> engine = make_engine(options);
    if (!engine.ok()) return fail(engine.status());
    const int32_t N = online_requests;
    std::vector<std::shared_ptr<RequestStream>> streams(static_cast<size_t>(N));
    std::vector<Timing> t(static_cast<size_t>(N));
    std::vector<GenerationRequest> reqs(static_cast<size_t>(N));
    std::vector<double> arrival(static_cast<size_t>(N));
    std::vector<bench::OnlineRequest> workload = bench::online_workload(N, rate, vocab);
    for (int32_t i = 0; i < N; ++i) {
      reqs[i].prompt = std::move(workload[i].prompt);
      reqs[i].max_tokens = workload[i].max_tokens;
      reqs[i].ignore_eos = true;
      reqs[i].temperature = 0.8f;
      reqs[i].top_p = 0.95f;
      reqs[i].seed = static_cast<uint64_t>(i);
      arrival[i] = workload[i].arrival_seconds;
    }
    const Clock::time_point t0 = Clock::now();
    std::thread submitter([&] {
      for (int32_t i = 0; i < N; ++i) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
        t[i].submitted = Clock::now();
        Result<std::shared_ptr<RequestStream>> s = (*engine)->submit(reqs[i]);
        if (!s.ok()) std::exit(fail(s.status()));  // the drain would wait for it forever
        std::atomic_store(&streams[i], *s);
      }
    });
    drain_all(streams, t);
    submitter.join();
    std::vector<double> ttft, tpot;
    int64_t tokens = 0;
    Clock::time_point end = t0;
    for (const Timing& x : t) {
      ttft.push_back(secs(x.submitted, x.first) * 1e3);
      if (x.tokens > 1) tpot.push_back(secs(x.first, x.last) * 1e3 / (x.tokens - 1));
      tokens += x.tokens;
      end = std::max(end, x.last);
    }
    const double dt = secs(t0, end);
    out["online"] = {{"requests", N},
                     {"rate", rate},
                     {"seconds", dt},
                     {"output_tokens_per_s", tokens / dt},
                     {"requests_per_s", N / dt},
                     {"ttft_ms_p50", percentile(ttft, 50)},
                     {"ttft_ms_p99", percentile(ttft, 99)},
                     {"tpot_ms_p50", percentile(tpot, 50)},
                     {"tpot_ms_p99", percentile(tpot, 99)},
                     {"preemptions", (*engine)->stats().preemptions}};
    std::fprintf(stderr, "online: %.0f tok/s\n", tokens / dt);
  }

  if (skip.find("prefix") == std::string::npos) {
    // cache_on / cache_off: after one request has put the prefix in the cache (when there is one);
    // cache_on_cold: all requests arrive at once to an empty cache (the first computes the prefix,
    // the others wait for its pages).
    struct Variant { const char* name; bool cache, warm; };
    for (const Variant& v : {Variant{"cache_on", true, true}, Variant{"cache_off", false, true},
                             Variant{"cache_on_cold", true, false}}) {
      const bool cache = v.cache;
      EngineOptions o = options;
      o.prefix_cache = cache;
      Result<std::unique_ptr<Engine>> engine = make_engine(o);
      if (!engine.ok()) return fail(engine.status());
      const std::vector<int32_t> prefix = random_ids(prefix_len, vocab, 31337);
      auto request = [&](int32_t i) {
        GenerationRequest r;
        r.prompt = prefix;
        const std::vector<int32_t> tail = random_ids(32, vocab, 900 + static_cast<uint64_t>(i));
        r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
        r.max_tokens = 8;
        r.ignore_eos = true;
        return r;
      };
      if (v.warm) {  // the first request puts the prefix in the cache (when there is one)
        Result<std::shared_ptr<RequestStream>> w = (*engine)->submit(request(-1));
        if (!w.ok()) return fail(w.status());
        std::vector<std::shared_ptr<RequestStream>> warm = {*w};
        std::vector<Timing> tw(1);
        drain_all(warm, tw);
      }
      std::vector<std::shared_ptr<RequestStream>> streams;
      std::vector<Timing> t(static_cast<size_t>(prefix_requests));
      for (int32_t i = 0; i < prefix_requests; ++i) {
        t[i].submitted = Clock::now();
        Result<std::shared_ptr<RequestStream>> r = (*engine)->submit(request(i));
        if (!r.ok()) return fail(r.status());
        streams.push_back(*r);
      }
      drain_all(streams, t);
      std::vector<double> ttft;
      for (const Timing& x : t) ttft.push_back(secs(x.submitted, x.first) * 1e3);
      double mean = 0;
      for (double ms : ttft) mean += ms / static_cast<double>(ttft.size());
      out["prefix"][v.name] = {{"requests", prefix_requests},
                               {"prefix_tokens", prefix_len},
                               {"ttft_ms_mean", mean},
                               {"ttft_ms_p50", percentile(ttft, 50)},
                               {"ttft_ms_p99", percentile(ttft, 99)},
                               {"prefix_hit_tokens", (*engine)->stats().prefix_hit_tokens}};
    }
    const double on = out["prefix"]["cache_on"]["ttft_ms_mean"], off = out["prefix"]["cache_off"]["ttft_ms_mean"];
    out["prefix"]["ttft_ratio_off_over_on"] = on > 0 ? off / on : 0.0;
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}
