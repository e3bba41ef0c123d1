// TrainingData sources (see dataset.h).
#include "train/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/sha256.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kIgnore = -100;

class ShardData final : public TrainingData {
 public:
  int64_t rows() const override { return row_starts_.back(); }
  const std::string& format() const override { return format_; }
  bool has_target_mask() const override { return format_ == "chat"; }
  const std::string& fingerprint() const override { return fingerprint_; }
  int64_t tokens() const override { return tokens_; }
  int64_t longest_row() const override { return seq_len_; }

  TrainExample example(int64_t row, bool every_token) const override {
    const size_t s = static_cast<size_t>(std::upper_bound(row_starts_.begin(), row_starts_.end(), row) -
                                         row_starts_.begin()) - 1;
    const ShardRow r = shards_[s].row(row - row_starts_[s]);
    TrainExample ex;
    const size_t n = r.ids.size();
    ex.input_ids.assign(r.ids.begin(), r.ids.end());
    ex.labels.assign(n, kIgnore);
    ex.position_ids.assign(n, 0);
    ex.line = row + 1;
    size_t d = 0;
    int32_t pos = 0;
    for (size_t t = 0; t < n; ++t) {
      const bool starts = d < r.doc_starts.size() && r.doc_starts[d] == static_cast<int32_t>(t);
      if (starts) {
        ++d;
        pos = 0;
      }
      ex.position_ids[t] = pos++;
      if (!starts && (every_token || r.mask[t])) ex.labels[t] = ex.input_ids[t];
    }
    return ex;
  }

  static Result<std::unique_ptr<TrainingData>> open(const std::string& dir, const std::string& split,
                                                    const ModelConfig& config, const std::string& model_dir) {
    const fs::path meta_path = fs::path(dir) / "meta.json";
    std::ifstream in(meta_path, std::ios::binary);
    if (!in)
      return invalid_argument("'" + dir + "' has no meta.json: it is not a kiln preprocess output, or preprocessing " +
                              "was interrupted (run kiln preprocess again)");
    std::stringstream text;
    text << in.rdbuf();
    auto data = std::unique_ptr<ShardData>(new ShardData());
    data->fingerprint_ = sha256_hex(text.str());
    const std::string where = "'" + meta_path.string() + "'";
    try {
      const nlohmann::json meta = nlohmann::json::parse(text.str());
      if (meta.value("format", "") != "kiln-preprocessed" || meta.value("version", 0) != 1)
        return invalid_argument(where + " is not meta.json version 1 of kiln preprocess");
      data->format_ = meta.at("data_format").get<std::string>();
      const int64_t seq_len = meta.at("seq_len").get<int64_t>();
      data->seq_len_ = seq_len;
      if (seq_len > config.context_length())
        return invalid_argument("'" + dir + "' was packed into rows of " + std::to_string(seq_len) +
                                " tokens; the model takes at most " + std::to_string(config.context_length()) + " (" +
                                config.context_length_source() + "): preprocess again with a smaller --seq-len");
      const std::string tok_sha = meta.at("tokenizer").at("sha256").get<std::string>();
      Result<std::string> model_sha = sha256_file((fs::path(model_dir) / "tokenizer.json").string());
      if (model_sha.ok() && *model_sha != tok_sha)
        return invalid_argument("'" + dir + "' was tokenized with a different tokenizer than " + model_dir +
                                "'s tokenizer.json: preprocess again with --model " + model_dir);
      const auto& splits = meta.at("splits");
      if (!splits.contains(split))
        return invalid_argument("'" + dir + "' has no \"" + split + "\" split" +
                                (split == "val" ? " (preprocess with --val-fraction to make one)" : ""));
      data->row_starts_.push_back(0);
      for (const auto& sh : splits.at(split).at("shards")) {
        const std::string file = sh.at("file").get<std::string>();
        if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
          return invalid_argument(where + " names a shard outside its directory: '" + file + "'");
        KILN_ASSIGN_OR_RETURN(Shard shard, Shard::open((fs::path(dir) / file).string()));
        if (shard.rows() != sh.at("rows").get<int64_t>() || shard.tokens() != sh.at("tokens").get<int64_t>())
          return invalid_argument("the shard '" + shard.path() + "' does not match " + where +
                                  " (rows or tokens differ): run kiln preprocess again");
        data->tokens_ += shard.tokens();
        data->row_starts_.push_back(data->row_starts_.back() + shard.rows());
        data->shards_.push_back(std::move(shard));
      }
    } catch (const nlohmann::json::exception& e) {
      return invalid_argument(where + " is malformed: " + e.what());
    }
    if (data->rows() == 0) return invalid_argument("the \"" + split + "\" split of '" + dir + "' holds no rows");
    return std::unique_ptr<TrainingData>(std::move(data));
  }

 private:
  std::string format_, fingerprint_;
  std::vector<Shard> shards_;
  std::vector<int64_t> row_starts_;  // [shards + 1] first global row of each shard
  int64_t tokens_ = 0, seq_len_ = 0;
};

class JsonlData final : public TrainingData {
 public:
  int64_t rows() const override { return static_cast<int64_t>(examples_.size()); }
  const std::string& format() const override { return format_; }
  bool has_target_mask() const override { return has_labels_; }
  const std::string& fingerprint() const override { return fingerprint_; }
  int64_t tokens() const override { return tokens_; }
  int64_t longest_row() const override { return longest_; }

  TrainExample example(int64_t row, bool every_token) const override {
    TrainExample ex = examples_[static_cast<size_t>(row)];
    if (every_token) ex.labels.clear();  // next-token targets within documents
    return ex;
  }

  static Result<std::unique_ptr<TrainingData>> open(const std::string& path, const ModelConfig& config) {
    auto data = std::unique_ptr<JsonlData>(new JsonlData());
    KILN_ASSIGN_OR_RETURN(data->examples_, read_training_jsonl(path, config));
    KILN_ASSIGN_OR_RETURN(data->fingerprint_, sha256_file(path));
    for (const TrainExample& ex : data->examples_) {
      data->has_labels_ = data->has_labels_ || !ex.labels.empty();
      data->tokens_ += static_cast<int64_t>(ex.input_ids.size());
      data->longest_ = std::max(data->longest_, static_cast<int64_t>(ex.input_ids.size()));
    }
    return std::unique_ptr<TrainingData>(std::move(data));
  }

 private:
  std::vector<TrainExample> examples_;
  std::string format_ = "jsonl", fingerprint_;
  bool has_labels_ = false;
  int64_t tokens_ = 0, longest_ = 0;
};

}  // namespace

bool TrainingData::has_split(const std::string& path, const std::string& split) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  std::ifstream in(fs::path(path) / "meta.json");
  if (!in) return false;
  try {
    return nlohmann::json::parse(in).at("splits").contains(split);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

Result<std::unique_ptr<TrainingData>> TrainingData::open(const std::string& path, const std::string& split,
                                                         const ModelConfig& config, const std::string& model_dir) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return ShardData::open(path, split, config, model_dir);
  if (!fs::exists(path, ec)) return io_error("the training data '" + path + "' does not exist");
  return JsonlData::open(path, config);
}

}  // namespace kiln
