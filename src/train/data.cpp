#include "train/data.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace kiln {
namespace {

constexpr int32_t kIgnore = -100;

// An array of int32 under `key`; `required` decides whether absence is an error.
Status read_ints(const nlohmann::json& obj, const char* key, bool required, std::vector<int32_t>* out,
                 const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (required) return invalid_argument(where + ": missing \"" + key + "\"");
    return Status::Ok();
  }
  if (!it->is_array()) return invalid_argument(where + ": \"" + key + "\" must be an array of integers");
  out->reserve(it->size());
  for (const nlohmann::json& v : *it) {
    if (!v.is_number_integer())
      return invalid_argument(where + ": \"" + key + "\" must be an array of integers (found " + json_brief(v) + ")");
    const int64_t x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) return invalid_argument(where + ": \"" + key + "\" value " + json_brief(v) + " is out of range");
    out->push_back(static_cast<int32_t>(x));
  }
  return Status::Ok();
}

Status validate(const TrainExample& ex, const ModelConfig& c, const std::string& where) {
  const int64_t n = static_cast<int64_t>(ex.input_ids.size());
  if (n == 0) return invalid_argument(where + ": \"input_ids\" is empty");
  const int64_t context = c.exact_context();
  if (n > context)
    return invalid_argument(where + ": the sequence has " + std::to_string(n) + " tokens, more than the model's " +
                            std::to_string(context) + " (its " + c.exact_context_source() + ")");
  const std::string vocab = "[0, " + std::to_string(c.vocab_size) + ")";
  for (int64_t i = 0; i < n; ++i)
    if (ex.input_ids[i] < 0 || ex.input_ids[i] >= c.vocab_size)
      return invalid_argument(where + ": input_ids[" + std::to_string(i) + "] = " + std::to_string(ex.input_ids[i]) +
                              " is outside the vocabulary " + vocab);
  if (!ex.labels.empty()) {
    if (static_cast<int64_t>(ex.labels.size()) != n)
      return invalid_argument(where + ": \"labels\" has " + std::to_string(ex.labels.size()) +
                              " entries but \"input_ids\" has " + std::to_string(n) +
                              " (labels are not shifted: label t + 1 is predicted at position t)");
    for (int64_t i = 0; i < n; ++i)
      if (ex.labels[i] != kIgnore && (ex.labels[i] < 0 || ex.labels[i] >= c.vocab_size))
        return invalid_argument(where + ": labels[" + std::to_string(i) + "] = " + std::to_string(ex.labels[i]) +
                                " is outside the vocabulary " + vocab + " and is not -100");
  }
  if (!ex.position_ids.empty()) {
    if (static_cast<int64_t>(ex.position_ids.size()) != n)
      return invalid_argument(where + ": \"position_ids\" has " + std::to_string(ex.position_ids.size()) +
                              " entries but \"input_ids\" has " + std::to_string(n));
    for (int64_t i = 0; i < n; ++i)
      if (ex.position_ids[i] < 0 || ex.position_ids[i] >= context)
        return invalid_argument(where + ": position_ids[" + std::to_string(i) + "] = " +
                                std::to_string(ex.position_ids[i]) + " is outside [0, " + c.context_length_source() +
                                " = " + std::to_string(context) + ")");
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<TrainExample>> read_training_jsonl(const std::string& path, const ModelConfig& config) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open training data '" + path + "'");
  std::vector<TrainExample> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // syntax errors, and numbers out of range
      return invalid_argument(where + ": not valid JSON (" + e.what() + ")");
    }
    if (!obj.is_object()) return invalid_argument(where + ": each line must be a JSON object with \"input_ids\"");
    TrainExample ex;
    ex.line = line_no;
    KILN_RETURN_IF_ERROR(read_ints(obj, "input_ids", true, &ex.input_ids, where));
    KILN_RETURN_IF_ERROR(read_ints(obj, "labels", false, &ex.labels, where));
    KILN_RETURN_IF_ERROR(read_ints(obj, "position_ids", false, &ex.position_ids, where));
    KILN_RETURN_IF_ERROR(validate(ex, config, where));
    out.push_back(std::move(ex));
  }
  if (in.bad()) return io_error("error reading '" + path + "'");
  if (out.empty()) return invalid_argument("training data '" + path + "' holds no examples");
  return out;
}

HostBatch make_host_batch(const std::vector<const TrainExample*>& rows) {
  HostBatch b;
  b.batch = static_cast<int32_t>(rows.size());
  for (const TrainExample* ex : rows) b.seq_len = std::max<int32_t>(b.seq_len, static_cast<int32_t>(ex->input_ids.size()));
  const int64_t n = static_cast<int64_t>(b.batch) * b.seq_len;
  b.ids.assign(n, 0);
  b.positions.assign(n, 0);
  b.segments.assign(n, -1);
  b.targets.assign(n, kIgnore);
  bool plain = true;  // every row full length, one document: no segment mask needed
  for (int32_t r = 0; r < b.batch; ++r) {
    const TrainExample& ex = *rows[r];
    const int64_t len = static_cast<int64_t>(ex.input_ids.size()), base = static_cast<int64_t>(r) * b.seq_len;
    if (len != b.seq_len) plain = false;
    int32_t segment = 0;
    for (int64_t t = 0; t < len; ++t) {
      const int32_t pos = ex.position_ids.empty() ? static_cast<int32_t>(t) : ex.position_ids[t];
      if (t > 0 && pos == 0) {
        ++segment;
        plain = false;
      }
      b.ids[base + t] = ex.input_ids[t];
      b.positions[base + t] = pos;
      b.segments[base + t] = segment;
      if (t + 1 < len) {
        if (!ex.labels.empty())
          b.targets[base + t] = ex.labels[t + 1];
        else if (ex.position_ids.empty() || ex.position_ids[t + 1] != 0)
          b.targets[base + t] = ex.input_ids[t + 1];
      }
    }
  }
  if (plain) b.segments.clear();
  return b;
}

}  // namespace kiln
