// Preprocessing: JSONL documents -> tokenized, packed shards (shards.h) and meta.json, the input of
// `kiln train --data DIR`.
//
// Each input line is one JSON object that a DocumentMaker turns into tokens and a target mask (text:
// every token a target; chat: the assistant tokens). Lines are read in pieces of a few MB and made
// into documents on all cores; the order of the output depends only on the input and the seed. A
// seeded --val-fraction of the documents forms the "val" split; each split is packed separately
// (packing.h) and written as shards of at most `shard_tokens` tokens.
//
// meta.json: {"format": "kiln-preprocessed", "version": 1, "data_format", "seq_len", "packed",
// "seed", "val_fraction", "tokenizer": {"sha256", "vocab_size"}, "inputs": [{"path", "bytes",
// "lines"}], "documents", "bad_lines", "splits": {"train"|"val": {"rows", "tokens", "targets",
// "documents", "split_documents", "packing_efficiency", "shards": [{"file", "rows", "tokens"}]}}}.
// It is written last, so a directory without it is an interrupted run.
//
// Thread safety: preprocess() runs its own worker threads; the maker must be callable from several
// threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/shards.h"

namespace kiln {

// Turns one parsed line into a document; an error (its message names what is wrong, not where:
// the caller adds file and line).
using DocumentMaker = std::function<Result<TokenDocument>(const nlohmann::ordered_json& line)>;

struct PreprocessOptions {
  std::vector<std::string> inputs;
  std::string output;
  std::string data_format = "text";  // recorded in meta.json
  int32_t seq_len = 0;
  bool pack = true;
  double val_fraction = 0.0;
  uint64_t seed = 0;
  bool skip_bad_lines = false;  // false: the first bad line is fatal
  bool overwrite = false;       // replace an existing preprocessed directory
  int32_t threads = 0;          // 0: all cores
  int64_t shard_tokens = int64_t(1) << 26;
  nlohmann::ordered_json tokenizer_info;  // {"sha256", "vocab_size"}, recorded in meta.json
};

struct PreprocessProgress {
  int64_t bytes_done = 0, bytes_total = 0, documents = 0;
  bool finished_reading = false;
};

struct PreprocessReport {
  nlohmann::ordered_json meta;  // what meta.json holds
  int64_t bytes = 0, documents = 0, bad_lines = 0;
  double seconds = 0.0;
};

// `warn` receives one message per skipped line; `progress` is called every few MB.
Result<PreprocessReport> preprocess(const PreprocessOptions& options, const DocumentMaker& make,
                                    const std::function<void(const std::string&)>& warn,
                                    const std::function<void(const PreprocessProgress&)>& progress);

}  // namespace kiln
