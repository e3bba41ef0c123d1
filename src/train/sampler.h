// Sampler: the order in which training rows are visited, epoch after epoch — file order, or a
// seeded shuffle per epoch (the same on every platform). Its position (epoch, cursor) is part of a
// training checkpoint, so a resumed run reads exactly the rows the interrupted one would have.
// Thread safety: none; plain value.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kiln {

class Sampler {
 public:
  Sampler(int64_t rows, bool shuffle, uint64_t seed);
  // The next `count` row indices, wrapping into the next epoch when needed.
  std::vector<int64_t> next(int32_t count);
  int64_t epoch() const { return epoch_; }
  int64_t rows() const { return rows_; }

  // {"rows", "shuffle", "seed", "epoch", "cursor"}.
  nlohmann::json state() const;
  // Continues from a saved state; the rows, shuffle and seed must be those of this sampler.
  Status restore(const nlohmann::json& state);

 private:
  void start_epoch(int64_t epoch);

  int64_t rows_;
  bool shuffle_;
  uint64_t seed_;
  std::vector<int64_t> order_;
  int64_t cursor_ = 0, epoch_ = 0;
};

}  // namespace kiln
