// TrainingData: the rows a Sampler indexes, from either source `kiln train --data` takes:
//   - a preprocessed directory (preprocess.h): one split ("train" or "val") of its shards, memory-
//     mapped; rows become examples on demand;
//   - a JSONL file of pre-tokenized examples (data.h), read whole.
//
// Targets: `every_token` (the pretraining objective) makes every token a target except the first
// of each document; otherwise the data's own mask is used (a preprocessed chat split's assistant
// mask, a JSONL's labels).
//
// Ownership: owns its shards / examples. Thread safety: immutable after open; example() may run on
// several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"
#include "train/data.h"
#include "train/shards.h"

namespace kiln {

class TrainingData {
 public:
  // `path`: a preprocessed directory (its `split`) or a JSONL file. `model_dir`'s tokenizer.json
  // must be the one a directory was preprocessed with.
  static Result<std::unique_ptr<TrainingData>> open(const std::string& path, const std::string& split,
                                                    const ModelConfig& config, const std::string& model_dir);
  // Whether `path` is a preprocessed directory holding `split` (false for a JSONL file).
  static bool has_split(const std::string& path, const std::string& split);

  virtual ~TrainingData() = default;
  virtual int64_t rows() const = 0;
  virtual TrainExample example(int64_t row, bool every_token) const = 0;
  // "text" or "chat" for preprocessed data, "jsonl" for pre-tokenized examples.
  virtual const std::string& format() const = 0;
  // Whether the data marks its own targets (chat assistant masks, JSONL labels).
  virtual bool has_target_mask() const = 0;
  // Identifies the content, for resume checks (the sha256 of meta.json or of the JSONL file).
  virtual const std::string& fingerprint() const = 0;
  virtual int64_t tokens() const = 0;
  // Tokens of the longest row, or a bound on it (a preprocessed split's packed row length).
  virtual int64_t longest_row() const = 0;
};

}  // namespace kiln
