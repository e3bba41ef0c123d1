// Sampler (see sampler.h).
#include "train/sampler.h"

#include <numeric>

#include "core/plural.h"
#include "train/shuffle.h"

namespace kiln {

Sampler::Sampler(int64_t rows, bool shuffle, uint64_t seed) : rows_(rows), shuffle_(shuffle), seed_(seed) {
  start_epoch(0);
}

void Sampler::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  if (shuffle_) {
    order_ = seeded_permutation(rows_, seed_, static_cast<uint64_t>(epoch));
  } else if (static_cast<int64_t>(order_.size()) != rows_) {
    order_.resize(static_cast<size_t>(rows_));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
}

std::vector<int64_t> Sampler::next(int32_t count) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count && rows_ > 0; ++i) {
    if (cursor_ == rows_) start_epoch(epoch_ + 1);
    out.push_back(order_[static_cast<size_t>(cursor_++)]);
  }
  return out;
}

nlohmann::json Sampler::state() const {
  return {{"rows", rows_}, {"shuffle", shuffle_}, {"seed", seed_}, {"epoch", epoch_}, {"cursor", cursor_}};
}

Status Sampler::restore(const nlohmann::json& s) {
  try {
    const int64_t rows = s.at("rows").get<int64_t>();
    const bool shuffle = s.at("shuffle").get<bool>();
    const uint64_t seed = s.at("seed").get<uint64_t>();
    const int64_t epoch = s.at("epoch").get<int64_t>(), cursor = s.at("cursor").get<int64_t>();
    if (rows != rows_)
      return invalid_argument("the checkpoint's data has " + count_of(rows, "row") + ", this data " +
                              count_of(rows_, "row") + ": resume with the data the run started with");
    if (shuffle != shuffle_ || seed != seed_)
      return invalid_argument("the checkpoint was made with --shuffle " + std::string(shuffle ? "on" : "off") +
                              " and --seed " + std::to_string(seed) + "; resume with the same");
    if (epoch < 0 || cursor < 0 || cursor > rows) return invalid_argument("the checkpoint's data position is invalid");
    start_epoch(epoch);
    cursor_ = cursor;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("the checkpoint's sampler state is malformed: ") + e.what());
  }
  return Status::Ok();
}

}  // namespace kiln
