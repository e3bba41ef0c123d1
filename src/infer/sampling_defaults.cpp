#include "infer/sampling_defaults.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_text.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// A number field within [lo, hi] (lo itself excluded when `open_low`); absent or null: unset.
Status read_number(const Json& j, const std::string& src, const char* key, double lo, double hi, bool open_low,
                   std::optional<float>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  const double v = it->is_number() ? it->get<double>() : NAN;
  if (!it->is_number() || !std::isfinite(v) || v < lo || v > hi || (open_low && v == lo))
    return invalid_argument(src + ": '" + key + "' must be a number within " + (open_low ? "(" : "[") + number(lo) +
                            ", " + number(hi) + "], but it is " + json_brief(*it) +
                            " (or run with --generation-config none)");
  *out = static_cast<float>(v);
  return Status::Ok();
}

Status read_count(const Json& j, const std::string& src, const char* key, int64_t lo, std::optional<int32_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > INT32_MAX)
    return invalid_argument(src + ": '" + key + "' must be an integer within [" + std::to_string(lo) +
                            ", 2147483647], but it is " + json_brief(*it) + " (or run with --generation-config none)");
  *out = static_cast<int32_t>(it->get<int64_t>());
  return Status::Ok();
}


}  // namespace

bool SamplingDefaults::empty() const {
  return !temperature && !top_k && !top_p && !min_p && !repetition_penalty && !max_tokens;
}

std::string SamplingDefaults::describe() const {
  std::string out;
  auto add = [&](const char* name, const std::string& v) { out += (out.empty() ? "" : ", ") + std::string(name) + " " + v; };
  if (temperature) add("temperature", number(*temperature));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (top_p) add("top_p", number(*top_p));
  if (min_p) add("min_p", number(*min_p));
  if (repetition_penalty) add("repetition_penalty", number(*repetition_penalty));
  if (max_tokens) add("max_tokens", std::to_string(*max_tokens));
  return out;
}

void SamplingDefaults::apply(GenerationRequest* r) const {
  if (temperature) r->temperature = *temperature;
  if (top_k) r->top_k = *top_k;
  if (top_p) r->top_p = *top_p;
  if (min_p) r->min_p = *min_p;
  if (repetition_penalty) r->repetition_penalty = *repetition_penalty;
}

Result<SamplingDefaults> load_sampling_defaults(const std::string& model_dir) {
  namespace fs = std::filesystem;
  SamplingDefaults d;
  const fs::path path = fs::path(model_dir) / "generation_config.json";
  std::error_code ec;
  if (model_dir.empty() || !fs::is_regular_file(path, ec)) return d;
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path.string() + " for reading (check its permissions)");
  std::stringstream text;
  text << in.rdbuf();
  const Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::string src = path.string();
  if (j.is_discarded() || !j.is_object()) return invalid_argument(src + " is not a JSON object");
  KILN_RETURN_IF_ERROR(read_number(j, src, "temperature", 0.0, 1e4, false, &d.temperature));
  KILN_RETURN_IF_ERROR(read_count(j, src, "top_k", 0, &d.top_k));
  KILN_RETURN_IF_ERROR(read_number(j, src, "top_p", 0.0, 1.0, true, &d.top_p));
  KILN_RETURN_IF_ERROR(read_number(j, src, "min_p", 0.0, 1.0, false, &d.min_p));
  KILN_RETURN_IF_ERROR(read_number(j, src, "repetition_penalty", 0.0, 1e4, true, &d.repetition_penalty));
  KILN_RETURN_IF_ERROR(read_count(j, src, "max_new_tokens", 1, &d.max_tokens));
  if (!d.empty()) d.source = src;
  return d;
}

}  // namespace kiln
