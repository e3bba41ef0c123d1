// Workloads shared by the benchmarks, so that bench_engine (the engine alone) and bench_serve (the
// engine behind the HTTP server) run the very same requests: random token-id prompts and the
// online workload (Poisson arrivals, long-tailed prompt and output lengths).
//
// Everything here is a pure function of its arguments (counter-based RNG of kernels/rng.h with
// fixed seeds): the same arguments give the same workload on every run and machine. Header-only;
// no state, so any thread may call it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/rng.h"

namespace kiln::bench {

// n token ids in [3, vocab) from `seed` (0..2 are left out: they are often special tokens).
inline std::vector<int32_t> random_ids(int32_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[i] = 3 + static_cast<int32_t>(rng::uniform(seed, i) * static_cast<double>(vocab - 3));
  return v;
}

// One request of the online workload.
struct OnlineRequest {
  std::vector<int32_t> prompt;  // token ids
  int32_t max_tokens = 0;       // tokens to generate (the benchmarks set ignore_eos: exactly this many)
  double arrival_seconds = 0;   // from the start of the run; increasing with the index
};

// `requests` requests arriving as a Poisson process of `rate` requests per second (> 0); prompt
// lengths log-normal around 256 tokens (sigma 1, clamped to [4, 4096]), output lengths log-normal
// around 128 tokens (sigma 0.8, clamped to [4, 1024]); prompt i's ids are random_ids(.., 5000 + i).
inline std::vector<OnlineRequest> online_workload(int32_t requests, double rate, int64_t vocab) {
  std::vector<OnlineRequest> out(static_cast<size_t>(std::max(0, requests)));
  double at = 0;
  for (int32_t i = 0; i < requests; ++i) {
    auto gauss = [&](uint64_t k) {  // Box-Muller over two fixed-seed uniforms
      const double u1 = std::max(1e-12, rng::uniform(77, 4 * static_cast<uint64_t>(i) + k)),
                   u2 = rng::uniform(77, 4 * static_cast<uint64_t>(i) + k + 1);
      return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    };
    const int32_t prompt = std::clamp(static_cast<int32_t>(std::exp(std::log(256.0) + 1.0 * gauss(0))), 4, 4096);
    const int32_t output = std::clamp(static_cast<int32_t>(std::exp(std::log(128.0) + 0.8 * gauss(2))), 4, 1024);
    out[i].prompt = random_ids(prompt, vocab, 5000 + static_cast<uint64_t>(i));
    out[i].max_tokens = output;
    at += -std::log(1.0 - rng::uniform(91, static_cast<uint64_t>(i))) / rate;
    out[i].arrival_seconds = at;
  }
  return out;
}

}  // namespace kiln::bench
