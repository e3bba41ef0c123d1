// Seeded permutations, the same on every platform and compiler (std::shuffle's algorithm is
// implementation-defined): Fisher-Yates driven by splitmix64. `stream` separates independent uses
// of one seed (an epoch number, a split). Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace kiln {

inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
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
