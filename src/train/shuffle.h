// Seeded permutations, the same on every platform and compiler (std::shuffle's algorithm is
// implementation-defined): Fisher-Yates driven by splitmix64. `stream` separates independent uses
// of one seed (an epoch number, a split). Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "kernels/rng.h"

namespace kiln {

// The splitmix64 sequence of `state` (kernels/rng.h's mix of state, then the state advanced).
inline uint64_t splitmix64_next(uint64_t& state) {
  const uint64_t z = rng::splitmix64(state);
  state += 0x9E3779B97F4A7C15ull;
  return z;
}

// Shuffles `v` in place.
template <typename T>
void seeded_shuffle(std::vector<T>& v, uint64_t seed, uint64_t stream) {
  uint64_t state = seed * 0x2545F4914F6CDD1Dull + stream;
  for (size_t i = v.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(splitmix64_next(state) % i);
    std::swap(v[i - 1], v[j]);
  }
}

// 0 .. n-1 in a seeded order.
inline std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  seeded_shuffle(order, seed, stream);
  return order;
}

}  // namespace kiln
