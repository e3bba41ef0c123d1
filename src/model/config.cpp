// config.json parsing and validation, and the RoPE inverse-frequency table. See config.h.
#include "core/json_text.h"
#include "core/plural.h"
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace kiln {

using nlohmann::json;

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::llama: return "llama";
    case Architecture::mistral: return "mistral";
    case Architecture::qwen2: return "qwen2";
    case Architecture::qwen3: return "qwen3";
  }
  return "?";
}

namespace {

constexpr const char* kSupportedArchitectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

// One JSON value for an error message: its type and (shortened) text.
std::string describe(const json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return with_article(v.type_name()) + " (" + text + ")";
}

// The value of `key` in `obj`, or nullptr when the key is absent or null (transformers writes
// null for "use the default").
const json* find_key(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// Reads typed values. `where` is the file name, `prefix` names the enclosing object in messages
// ("rope_scaling." or ""). A key that is absent or null leaves *out untouched unless `required`.
class Reader {
 public:
  Reader(const json& obj, std::string where, std::string prefix)
      : obj_(obj), where_(std::move(where)), prefix_(std::move(prefix)) {}

  Status missing(const std::string& key) const {
    return invalid_argument(where_ + ": required key '" + prefix_ + key +
                            "' is missing; a config.json saved by Hugging Face transformers always has it "
                            "(is this the right model folder, and is the file complete?)");
  }
  Status wrong_type(const std::string& key, const char* expected, const json& v) const {
    return invalid_argument(where_ + ": key '" + prefix_ + key + "' must be " + expected + ", but it is " +
                            describe(v));
  }
  Status bad_value(const std::string& key, const std::string& why) const {
    return invalid_argument(where_ + ": key '" + prefix_ + key + "' " + why);
  }

  bool has(const std::string& key) const { return find_key(obj_, key) != nullptr; }

  Status get_int(const std::string& key, int64_t* out, bool required) const {
    const json* v = find_key(obj_, key);
    if (!v) return required ? missing(key) : Status::Ok();
    return to_int(key, *v, out);
  }
  Status get_float(const std::string& key, double* out, bool required) const {
    const json* v = find_key(obj_, key);
    if (!v) return required ? missing(key) : Status::Ok();
    if (!v->is_number()) return wrong_type(key, "a number", *v);
    *out = v->get<double>();
    if (!std::isfinite(*out)) return bad_value(key, "must be a finite number");
    return Status::Ok();
  }
  Status get_float(const std::string& key, float* out, bool required) const {
    double d = *out;
    KILN_RETURN_IF_ERROR(get_float(key, &d, required));
    *out = static_cast<float>(d);
    return Status::Ok();
  }
  Status get_bool(const std::string& key, bool* out, bool required) const {
    const json* v = find_key(obj_, key);
    if (!v) return required ? missing(key) : Status::Ok();
    if (!v->is_boolean()) return wrong_type(key, "true or false", *v);
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status get_string(const std::string& key, std::string* out, bool required) const {
    const json* v = find_key(obj_, key);
    if (!v) return required ? missing(key) : Status::Ok();
    if (!v->is_string()) return wrong_type(key, "a string", *v);
    *out = v->get<std::string>();
    return Status::Ok();
  }
  // A required integer that must be > 0.
  Status get_size(const std::string& key, int64_t* out) const {
    KILN_RETURN_IF_ERROR(get_int(key, out, /*required=*/true));
    if (*out <= 0) return bad_value(key, "must be positive, but it is " + std::to_string(*out));
    return Status::Ok();
  }
  // A token id (int32); absent or null leaves *out empty.
  Status get_token_id(const std::string& key, std::optional<int32_t>* out) const {
    const json* v = find_key(obj_, key);
    if (!v) return Status::Ok();
    int32_t id = 0;
    KILN_RETURN_IF_ERROR(to_token_id(key, *v, &id));
    *out = id;
    return Status::Ok();
  }
  Status to_token_id(const std::string& key, const json& v, int32_t* out) const {
    int64_t id = 0;
    KILN_RETURN_IF_ERROR(to_int(key, v, &id));
    if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max())
      return bad_value(key, "holds token id " + std::to_string(id) + ", which does not fit in 32 bits");
    *out = static_cast<int32_t>(id);
    return Status::Ok();
  }
  Status to_int(const std::string& key, const json& v, int64_t* out) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return bad_value(key, "is too large (" + std::to_string(u) + ")");
      *out = static_cast<int64_t>(u);
      return Status::Ok();
    }
    if (v.is_number_integer()) {
      *out = v.get<int64_t>();
      return Status::Ok();
    }
    return wrong_type(key, "an integer", v);
  }

 private:
  const json& obj_;
  std::string where_;
  std::string prefix_;
};

Status parse_architecture(const json& j, const std::string& src, ModelConfig* c) {
  struct Known {
    const char* cls;
    const char* model_type;
    Architecture arch;
  };
  static constexpr Known kKnown[] = {{"LlamaForCausalLM", "llama", Architecture::llama},
                                     {"MistralForCausalLM", "mistral", Architecture::mistral},
                                     {"Qwen2ForCausalLM", "qwen2", Architecture::qwen2},
                                     {"Qwen3ForCausalLM", "qwen3", Architecture::qwen3}};
  Reader r(j, src, "");
  if (const json* archs = find_key(j, "architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
      return r.wrong_type("architectures", "a non-empty list of class names such as [\"LlamaForCausalLM\"]", *archs);
    std::string cls = (*archs)[0].get<std::string>();
    for (const Known& k : kKnown) {
      if (cls == k.cls) {
        c->architecture = k.arch;
        c->architecture_class = cls;
        return Status::Ok();
      }
    }
    return unsupported(src + ": architecture '" + cls + "' (key 'architectures') is not supported; kiln supports " +
                       kSupportedArchitectures);
  }
  // No "architectures": fall back on "model_type", which every transformers config has.
  std::string model_type;
  KILN_RETURN_IF_ERROR(r.get_string("model_type", &model_type, false));
  if (model_type.empty()) return r.missing("architectures");
  for (const Known& k : kKnown) {
    if (model_type == k.model_type) {
      c->architecture = k.arch;
      c->architecture_class = k.cls;
      return Status::Ok();
    }
  }
  return unsupported(src + ": model_type '" + model_type + "' (config.json has no 'architectures') is not supported; "
                     "kiln supports " + kSupportedArchitectures);
}

// YaRN's own keys (transformers' _compute_yarn_parameters): the attention factor given, or
// 0.1 ln(factor) + 1 (scaled by mscale / mscale_all_dim when both are set and non-zero); beta_fast
// and beta_slow (a zero or null value takes the default, as `or` does there); truncate.
Status parse_yarn(const Reader& r, double factor, RopeConfig* rope) {
  auto mscale_of = [&](double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  double mscale = 0.0, mscale_all_dim = 0.0;
  KILN_RETURN_IF_ERROR(r.get_float("mscale", &mscale, false));
  KILN_RETURN_IF_ERROR(r.get_float("mscale_all_dim", &mscale_all_dim, false));
  double attention = mscale != 0.0 && mscale_all_dim != 0.0 ? mscale_of(mscale) / mscale_of(mscale_all_dim) : mscale_of(1.0);
  KILN_RETURN_IF_ERROR(r.get_float("attention_factor", &attention, false));
  if (!(attention > 0.0) || attention > 1e6)
    return r.bad_value("attention_factor", "must be within (0, 1e6], but it is " + std::to_string(attention));
  rope->attention_factor = static_cast<float>(attention);

  double beta_fast = 0.0, beta_slow = 0.0;
  KILN_RETURN_IF_ERROR(r.get_float("beta_fast", &beta_fast, false));
  KILN_RETURN_IF_ERROR(r.get_float("beta_slow", &beta_slow, false));
  rope->beta_fast = beta_fast != 0.0 ? beta_fast : 32.0;
  rope->beta_slow = beta_slow != 0.0 ? beta_slow : 1.0;
  if (!(rope->beta_fast > 0.0) || !(rope->beta_slow > 0.0))
    return r.bad_value(rope->beta_fast > 0.0 ? "beta_slow" : "beta_fast", "must be positive");
  rope->truncate = true;
  return r.get_bool("truncate", &rope->truncate, false);
}

// RoPE from either layout:
//   transformers 5: "rope_parameters": {"rope_theta", "rope_type", "factor", ...}
//   transformers 4: top-level "rope_theta" and "rope_scaling": {"rope_type" or legacy "type", ...}
// Defaults as transformers' standardize_rope_params and _compute_*_parameters apply them.
Status parse_rope(const json& j, const std::string& src, int64_t max_position_embeddings, RopeConfig* rope) {
  Reader top(j, src, "");
  const json* params = find_key(j, "rope_parameters");
  const json* scaling = nullptr;
  std::string prefix;
  if (params) {
    if (!params->is_object()) return top.wrong_type("rope_parameters", "an object", *params);
    scaling = params;
    prefix = "rope_parameters.";
  } else if ((scaling = find_key(j, "rope_scaling"))) {
    if (!scaling->is_object()) return top.wrong_type("rope_scaling", "an object or null", *scaling);
    prefix = "rope_scaling.";
  }

  double theta = 10000.0;
  KILN_RETURN_IF_ERROR(top.get_float("rope_theta", &theta, false));
  if (params) KILN_RETURN_IF_ERROR(Reader(*params, src, prefix).get_float("rope_theta", &theta, false));
  if (!(theta > 0.0) || !std::isfinite(static_cast<float>(theta)))
    return invalid_argument(src + ": rope_theta must be positive (and within f32), but it is " + std::to_string(theta));
  rope->theta = theta;

  double partial = 1.0;
  KILN_RETURN_IF_ERROR(top.get_float("partial_rotary_factor", &partial, false));
  if (scaling) KILN_RETURN_IF_ERROR(Reader(*scaling, src, prefix).get_float("partial_rotary_factor", &partial, false));
  if (partial != 1.0)
    return unsupported(src + ": partial_rotary_factor " + std::to_string(partial) +
                       " is not supported; kiln rotates the whole head (partial_rotary_factor 1)");

  rope->type = "default";
  if (!scaling) return Status::Ok();
  Reader r(*scaling, src, prefix);
  std::string type_key = r.has("rope_type") ? "rope_type" : "type";
  KILN_RETURN_IF_ERROR(r.get_string(type_key, &rope->type, false));
  const std::string& type = rope->type;
  if (type == "default") return Status::Ok();
  if (type != "linear" && type != "llama3" && type != "yarn")
    return unsupported(src + ": RoPE type '" + type + "' (key '" + prefix + type_key +
                       "') is not supported; kiln supports default, linear, llama3 and yarn RoPE");

  // The pretraining context of llama3 and yarn: a top-level key wins (Phi-3's layout), then the
  // rope object's, else max_position_embeddings.
  int64_t& original = rope->original_max_position_embeddings;
  if (type != "linear") {
    original = max_position_embeddings;
    KILN_RETURN_IF_ERROR(r.get_int("original_max_position_embeddings", &original, false));
    KILN_RETURN_IF_ERROR(top.get_int("original_max_position_embeddings", &original, false));
    if (original <= 0 || original > (int64_t(1) << 24))
      return r.bad_value("original_max_position_embeddings",
                         "must be within [1, 16777216], but it is " + std::to_string(original));
  }

  // yarn takes a null or absent factor as max_position_embeddings / original (DeepSeek's layout).
  double factor = type == "yarn" ? static_cast<double>(max_position_embeddings) / static_cast<double>(original) : 0.0;
  KILN_RETURN_IF_ERROR(r.get_float("factor", &factor, type != "yarn"));
  if (!(factor > 0.0) || factor > 65536.0)
    return r.bad_value("factor", "must be within (0, 65536], but it is " + std::to_string(factor));
  rope->factor = static_cast<float>(factor);
  if (type == "linear") return Status::Ok();
  if (type == "yarn") {
    if (!(theta > 1.0)) return invalid_argument(src + ": YaRN needs rope_theta above 1, but it is " + std::to_string(theta));
    return parse_yarn(r, factor, rope);
  }

  KILN_RETURN_IF_ERROR(r.get_float("low_freq_factor", &rope->low_freq_factor, true));
  KILN_RETURN_IF_ERROR(r.get_float("high_freq_factor", &rope->high_freq_factor, true));
  if (!(rope->low_freq_factor > 0.0f))
    return r.bad_value("low_freq_factor", "must be positive, but it is " + std::to_string(rope->low_freq_factor));
  if (!(rope->high_freq_factor > rope->low_freq_factor))
    return r.bad_value("high_freq_factor", "must be larger than low_freq_factor (" +
                                               std::to_string(rope->low_freq_factor) + "), but it is " +
                                               std::to_string(rope->high_freq_factor));
  return Status::Ok();
}

Status parse_into(const json& j, const std::string& src, ModelConfig* c) {
  if (!j.is_object()) return invalid_argument(src + ": expected a JSON object at the top level, but it is " + describe(j));
  c->source = src;
  Reader r(j, src, "");
  KILN_RETURN_IF_ERROR(parse_architecture(j, src, c));
  const Architecture arch = c->architecture;
  // Quantized checkpoints (FP8, AWQ, GPTQ, bitsandbytes ...) store other tensors than the weights
  // kiln reads; say so before a missing-tensor error does.
  if (const json* q = find_key(j, "quantization_config")) {
    const json* method = q->is_object() ? find_key(*q, "quant_method") : nullptr;
    return unsupported(src + ": the checkpoint is quantized (quantization_config" +
                       (method && method->is_string() ? ", quant_method '" + method->get<std::string>() + "'" : "") +
                       "); kiln reads float32, bfloat16 and float16 weights: use the model's unquantized checkpoint");
  }

  KILN_RETURN_IF_ERROR(r.get_size("vocab_size", &c->vocab_size));
  KILN_RETURN_IF_ERROR(r.get_size("hidden_size", &c->hidden_size));
  KILN_RETURN_IF_ERROR(r.get_size("intermediate_size", &c->intermediate_size));
  KILN_RETURN_IF_ERROR(r.get_size("num_hidden_layers", &c->num_hidden_layers));
  KILN_RETURN_IF_ERROR(r.get_size("num_attention_heads", &c->num_attention_heads));
  KILN_RETURN_IF_ERROR(r.get_size("max_position_embeddings", &c->max_position_embeddings));

  c->num_key_value_heads = c->num_attention_heads;
  KILN_RETURN_IF_ERROR(r.get_int("num_key_value_heads", &c->num_key_value_heads, false));
  if (c->num_key_value_heads <= 0)
    return r.bad_value("num_key_value_heads", "must be positive, but it is " + std::to_string(c->num_key_value_heads));
  if (c->num_attention_heads % c->num_key_value_heads != 0)
    return invalid_argument(src + ": num_attention_heads (" + std::to_string(c->num_attention_heads) +
                            ") must be a multiple of num_key_value_heads (" + std::to_string(c->num_key_value_heads) +
                            ") for grouped-query attention");

  if (r.has("head_dim")) {
    KILN_RETURN_IF_ERROR(r.get_int("head_dim", &c->head_dim, true));
    if (c->head_dim <= 0) return r.bad_value("head_dim", "must be positive, but it is " + std::to_string(c->head_dim));
  } else if (arch == Architecture::qwen3) {
    c->head_dim = 128;  // transformers' Qwen3Config default (not hidden_size / heads)
  } else {
    if (c->hidden_size % c->num_attention_heads != 0)
      return invalid_argument(src + ": there is no 'head_dim' and hidden_size (" + std::to_string(c->hidden_size) +
                              ") is not a multiple of num_attention_heads (" +
                              std::to_string(c->num_attention_heads) + "); add the model's 'head_dim'");
    c->head_dim = c->hidden_size / c->num_attention_heads;
  }
  if (c->head_dim % 2 != 0)
    return invalid_argument(src + ": head_dim " + std::to_string(c->head_dim) +
                            " is odd; rotary embeddings need an even head_dim");
  // What kiln's kernels and int32 indexing can run, checked before anything is sized from these
  // numbers (a config.json with a billion layers must not allocate its tables).
  struct Bound {
    const char* key;
    int64_t value, max;
    const char* why;
  };
  for (const Bound& b : {Bound{"num_hidden_layers", c->num_hidden_layers, 1024, "kiln runs at most 1024 layers"},
                         Bound{"hidden_size", c->hidden_size, int64_t(1) << 18, "kiln runs hidden sizes up to 262144"},
                         Bound{"intermediate_size", c->intermediate_size, int64_t(1) << 20,
                               "kiln runs intermediate sizes up to 1048576"},
                         Bound{"num_attention_heads", c->num_attention_heads, 1024, "kiln runs at most 1024 heads"},
                         Bound{"head_dim", c->head_dim, 256, "kiln's attention kernels take head_dim up to 256"},
                         Bound{"vocab_size", c->vocab_size, int64_t(1) << 30, "token ids are int32"},
                         Bound{"max_position_embeddings", c->max_position_embeddings, int64_t(1) << 24,
                               "kiln runs contexts up to 16777216 tokens"}})
    if (b.value > b.max)
      return r.bad_value(b.key, "is " + std::to_string(b.value) + ", above " + std::to_string(b.max) + ": " + b.why);

  double eps = 1e-6;  // the default of LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config
  KILN_RETURN_IF_ERROR(r.get_float("rms_norm_eps", &eps, false));
  if (!(eps > 0.0)) return r.bad_value("rms_norm_eps", "must be positive, but it is " + std::to_string(eps));
  c->rms_norm_eps = static_cast<float>(eps);

  KILN_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c->tie_word_embeddings, false));

  // Biases and norms per architecture, as the transformers modeling code builds its layers.
  switch (arch) {
    case Architecture::llama:
      KILN_RETURN_IF_ERROR(r.get_bool("attention_bias", &c->attention_bias, false));
      c->o_proj_bias = c->attention_bias;
      KILN_RETURN_IF_ERROR(r.get_bool("mlp_bias", &c->mlp_bias, false));
      break;
    case Architecture::mistral:  // MistralAttention / MistralMLP have no biases at all
      break;
    case Architecture::qwen2:  // q/k/v always biased, o_proj and the MLP never
      c->attention_bias = true;
      break;
    case Architecture::qwen3:
      KILN_RETURN_IF_ERROR(r.get_bool("attention_bias", &c->attention_bias, false));
      c->o_proj_bias = c->attention_bias;
      c->qk_norm = true;
      break;
  }

  KILN_RETURN_IF_ERROR(r.get_string("hidden_act", &c->hidden_act, false));
  if (c->hidden_act != "silu")
    return unsupported(src + ": hidden_act '" + c->hidden_act + "' is not supported; kiln implements the SwiGLU MLP (silu)");

  KILN_RETURN_IF_ERROR(r.get_token_id("bos_token_id", &c->bos_token_id));
  KILN_RETURN_IF_ERROR(r.get_token_id("pad_token_id", &c->pad_token_id));
  if (const json* eos = find_key(j, "eos_token_id")) {
    const json one = json::array({*eos});
    for (const json& e : eos->is_array() ? *eos : one) {
      int32_t id = 0;
      KILN_RETURN_IF_ERROR(r.to_token_id("eos_token_id", e, &id));
      c->eos_token_ids.push_back(id);
    }
  }

  std::string dtype_key = r.has("dtype") ? "dtype" : "torch_dtype";  // transformers 5 / 4
  std::string dtype_name;
  KILN_RETURN_IF_ERROR(r.get_string(dtype_key, &dtype_name, false));
  if (!dtype_name.empty() && !parse_dtype(dtype_name, &c->dtype))
    return unsupported(src + ": " + dtype_key + " '" + dtype_name +
                       "' is not supported; kiln reads float32, bfloat16 and float16 checkpoints");

  // Sliding windows. Mistral: "sliding_window" (transformers' default 4096 when the key is absent,
  // none when it is null). Qwen2/Qwen3: only when "use_sliding_window" is true.
  int64_t window = 0;
  if (arch == Architecture::mistral) {
    if (!j.contains("sliding_window")) window = 4096;
    KILN_RETURN_IF_ERROR(r.get_int("sliding_window", &window, false));
  } else if (arch == Architecture::qwen2 || arch == Architecture::qwen3) {
    bool use = false;
    KILN_RETURN_IF_ERROR(r.get_bool("use_sliding_window", &use, false));
    if (use) KILN_RETURN_IF_ERROR(r.get_int("sliding_window", &window, false));
  }
  if (window < 0) return r.bad_value("sliding_window", "must not be negative, but it is " + std::to_string(window));

  KILN_RETURN_IF_ERROR(parse_rope(j, src, c->max_position_embeddings, &c->rope));
  if (c->context_length() > (int64_t(1) << 24))
    return invalid_argument(src + ": YaRN extends the context to " + std::to_string(c->context_length()) +
                            " tokens (original_max_position_embeddings x factor); kiln runs at most 16777216");
  c->sliding_window = window < c->context_length() ? window : 0;
  return Status::Ok();
}

// Rounds to f32 and keeps the compiler from fusing a multiply and an add into an FMA: torch runs
// every step of the rope computation as a separate f32 kernel.
inline float f32(float x) {
  volatile float v = x;
  return v;
}

// transformers' _compute_yarn_parameters, op by op: the correction range in double (Python
// floats), the ramp and the blend of interpolated and extrapolated frequencies in f32.
void yarn_inv_freq(const RopeConfig& rope, int64_t head_dim, const std::vector<float>& pos_freqs, RopeTables* out) {
  const double dim = static_cast<double>(head_dim), base = rope.theta;
  const double original = static_cast<double>(rope.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2.0 * 3.14159265358979323846))) / (2.0 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const float low_f = static_cast<float>(low), width = static_cast<float>(high - low);
  const float factor = rope.factor;
  for (size_t i = 0; i < pos_freqs.size(); ++i) {
    const float ramp = std::clamp(f32(f32(static_cast<float>(i) - low_f) / width), 0.0f, 1.0f);
    const float extrapolation_weight = f32(1.0f - ramp);
    const float extrapolated = out->inv_freq[i];
    const float interpolated = f32(1.0f / f32(factor * pos_freqs[i]));
    out->inv_freq[i] = f32(f32(interpolated * f32(1.0f - extrapolation_weight)) + f32(extrapolated * extrapolation_weight));
  }
  out->attention_scaling = rope.attention_factor;
}

}  // namespace

int64_t ModelConfig::context_length() const {
  if (rope.type != "yarn") return max_position_embeddings;
  const double extended = static_cast<double>(rope.original_max_position_embeddings) * static_cast<double>(rope.factor);
  return extended > static_cast<double>(max_position_embeddings) ? static_cast<int64_t>(extended) : max_position_embeddings;
}

const char* ModelConfig::context_length_source() const {
  return context_length() > max_position_embeddings ? "YaRN's original_max_position_embeddings x factor"
                                                      : "max_position_embeddings";
}

int64_t ModelConfig::exact_context() const {
  return sliding_window > 0 && sliding_window < context_length() ? sliding_window : context_length();
}

std::string ModelConfig::exact_context_source() const {
  return exact_context() < context_length() ? "sliding window; sliding-window attention beyond it is not implemented"
                                            : context_length_source();
}

Result<ModelConfig> parse_model_config(const json& j, const std::string& source_name) {
  ModelConfig c;
  KILN_RETURN_IF_ERROR(parse_into(j, source_name, &c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(model_dir, ec))
    return not_found("model folder '" + model_dir + "' does not exist; pass the folder that holds config.json and "
                     "model.safetensors");
  if (!fs::is_directory(model_dir, ec))
    return invalid_argument("'" + model_dir + "' is not a folder; pass the model folder that holds config.json");
  const std::string path = (fs::path(model_dir) / "config.json").string();
  if (!fs::exists(path, ec))
    return not_found(path + " does not exist; a model folder needs the config.json written by transformers' "
                     "save_pretrained");
  return load_model_config_file(path);
}

Result<ModelConfig> load_model_config_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path + " does not exist; pass the path of a model's config.json");
  if (fs::is_directory(path, ec))
    return invalid_argument(path + " is a folder; pass the path of its config.json (or load the folder as a model)");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path + " for reading (check its permissions)");
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return io_error("reading " + path + " failed");

  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {  // syntax errors, and numbers out of range
    return invalid_argument(path + " is not valid JSON: " + e.what());
  }
  // A trained model's config.json is this one written back, and printing a value recurses as deep
  // as it nests: a hostile file must fail here, not at the end of a training run.
  constexpr int64_t kMaxNesting = 64;  // transformers' configs nest a few levels
  if (json_depth(j) > kMaxNesting)
    return invalid_argument(path + " nests deeper than " + std::to_string(kMaxNesting) +
                            " levels; a transformers config.json is a few levels deep");
  return parse_model_config(j, path);
}

RopeTables compute_rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  KILN_ASSERT(head_dim > 0 && head_dim % 2 == 0);
  const int64_t half = head_dim / 2;
  RopeTables out;
  out.inv_freq.resize(static_cast<size_t>(half));

  // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all in f32; the scalar
  // base is rounded to f32 and powf is emulated by a double pow rounded once to f32.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  const double base_f32 = static_cast<double>(static_cast<float>(rope.theta));
  for (int64_t i = 0; i < half; ++i) {
    float exponent = f32(static_cast<float>(2 * i) / static_cast<float>(head_dim));
    pos_freqs[static_cast<size_t>(i)] = static_cast<float>(std::pow(base_f32, static_cast<double>(exponent)));
    out.inv_freq[static_cast<size_t>(i)] = f32(1.0f / pos_freqs[static_cast<size_t>(i)]);
  }

  if (rope.type == "default") return out;
  if (rope.type == "yarn") {
    yarn_inv_freq(rope, head_dim, pos_freqs, &out);
    return out;
  }
  if (rope.type == "linear") {
    for (float& f : out.inv_freq) f = f32(f / rope.factor);
    return out;
  }
  KILN_ASSERT(rope.type == "llama3");
  // transformers' _compute_llama3_parameters, op by op. Python scalars meet f32 tensors as f32;
  // `scalar / tensor` is torch's reciprocal(tensor) * scalar.
  const float factor = rope.factor;
  const float low = rope.low_freq_factor;
  const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(old_ctx / static_cast<double>(rope.low_freq_factor));
  const float high_freq_wavelen = static_cast<float>(old_ctx / static_cast<double>(rope.high_freq_factor));
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  const float old_ctx_f = static_cast<float>(old_ctx);
  const float high_minus_low =
      static_cast<float>(static_cast<double>(rope.high_freq_factor) - static_cast<double>(rope.low_freq_factor));
  for (float& f : out.inv_freq) {
    const float inv_freq = f;
    const float wavelen = f32(f32(1.0f / inv_freq) * two_pi);
    const float llama = wavelen > low_freq_wavelen ? f32(inv_freq / factor) : inv_freq;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (!medium) {
      f = llama;
      continue;
    }
    const float ratio = f32(f32(1.0f / wavelen) * old_ctx_f);
    const float smooth = f32(f32(ratio - low) / high_minus_low);
    const float a = f32(f32(f32(1.0f - smooth) * llama) / factor);
    const float b = f32(smooth * llama);
    f = f32(a + b);
  }
  return out;
}

}  // namespace kiln
