// Counter-based random numbers shared by the CPU and CUDA kernels, so that a seed gives the same
// stream on every device: splitmix64 hashing of (seed, counter). Pure functions, no state.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__ __forceinline__
#else
#define KILN_HD inline
#endif

namespace kiln::rng {

KILN_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform double in [0, 1) for (seed, counter).
KILN_HD double uniform(uint64_t seed, uint64_t counter) {
  uint64_t h = splitmix64(seed ^ splitmix64(counter + 0x632be59bd9b4e019ull));
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

// Uniform float in (0, 1] for (seed, counter), for Box-Muller.
KILN_HD float uniform_open(uint64_t seed, uint64_t counter) {
  uint64_t h = splitmix64(seed ^ splitmix64(counter + 0x632be59bd9b4e019ull));
  return (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
}

}  // namespace kiln::rng
