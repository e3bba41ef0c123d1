// ModelConfig: the architecture hyper-parameters of a Hugging Face model folder, read from its
// config.json (transformers 4 and transformers 5 layouts), validated, with Hugging Face's defaults
// applied where a key is absent. Also the RoPE inverse-frequency table, computed in f32 exactly as
// transformers computes it.
// Ownership: plain values. Thread safety: no shared state; every function is safe to call
// concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "core/status.h"

namespace kiln {

enum class Architecture { llama, mistral, qwen2, qwen3 };

// "llama", "mistral", "qwen2", "qwen3".
const char* architecture_name(Architecture a);

// Rotary position embedding parameters. `type` is "default", "linear", "llama3" or "yarn" (others
// are rejected by the parser). factor is used by linear, llama3 and yarn; low_freq_factor and
// high_freq_factor by llama3; original_max_position_embeddings by llama3 and yarn; the rest by yarn
// only, with transformers' defaults applied by the parser.
struct RopeConfig {
  double theta = 10000.0;  // as written; the inverse frequencies use it rounded to f32, like torch
  std::string type = "default";
  float factor = 1.0f;
  float low_freq_factor = 0.0f;
  float high_freq_factor = 0.0f;
  int64_t original_max_position_embeddings = 0;
  float attention_factor = 1.0f;  // yarn: cos/sin scale, given or derived from factor, mscale, mscale_all_dim
  double beta_fast = 32.0;        // yarn: the correction range's rotation counts
  double beta_slow = 1.0;
  bool truncate = true;  // yarn: the correction range rounded outward to whole dimensions

  bool operator==(const RopeConfig&) const = default;
};

// What the rope kernel needs: inv_freq[head_dim / 2] (already scaled for the rope type) and the
// factor cos/sin are multiplied by (yarn's attention factor; 1.0 for the other types).
struct RopeTables {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};

struct ModelConfig {
  Architecture architecture = Architecture::llama;
  std::string architecture_class;  // as written in config.json, e.g. "LlamaForCausalLM"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // == num_attention_heads when config.json has none
  int64_t head_dim = 0;             // explicit "head_dim", else hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  // The longest sequence kiln runs the model on: max_position_embeddings, or with YaRN
  // original_max_position_embeddings x factor where that is longer (Qwen's long-context configs
  // keep max_position_embeddings at the pretraining length and add the scaling; vLLM derives the
  // same length).
  int64_t context_length() const;
  // Where context_length() comes from, for messages: "max_position_embeddings" or YaRN's product.
  const char* context_length_source() const;
  // The longest sequence kiln runs exactly as the model: context_length(), or a sliding window below
  // it (kiln attends to every earlier token, which equals sliding-window attention within the
  // window; beyond it, sliding-window attention is not implemented). Generation, scoring and
  // training stay within it.
  int64_t exact_context() const;
  // Where exact_context() comes from, for messages.
  std::string exact_context_source() const;
  float rms_norm_eps = 1e-6f;  // f32, as torch adds it to an f32 variance

  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  bool attention_bias = false;       // q_proj, k_proj, v_proj have biases
  bool o_proj_bias = false;          // o_proj has a bias
  bool qk_norm = false;              // per-head RMSNorm on q and k before RoPE (qwen3)
  bool mlp_bias = false;             // gate_proj, up_proj, down_proj have biases

  std::string hidden_act = "silu";  // always "silu": anything else is rejected
  // Token ids are int32 like every id array in kiln.
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // "eos_token_id" may be one id or a list; empty when absent
  std::optional<int32_t> pad_token_id;

  DType dtype = DType::f32;  // the checkpoint's dtype ("dtype" / "torch_dtype"); f32 when absent

  // Sliding-window attention size, 0 when the model attends to the full context. Not implemented:
  // the engine's context and training sequences stay within the window, where attending to every
  // earlier token is exactly sliding-window attention; longer requests are refused with the reason.
  int64_t sliding_window = 0;

  RopeConfig rope;

  std::string source;  // the file this was read from, for messages
};

// Reads and validates <model_dir>/config.json. not_found naming the path when the folder or the
// file is missing; invalid_argument / unsupported naming the file and the key otherwise.
Result<ModelConfig> load_model_config(const std::string& model_dir);

// Reads and validates one config.json file given by its path (e.g. a config without weights, for
// benchmarks with random weights). not_found naming the path when it does not exist.
Result<ModelConfig> load_model_config_file(const std::string& config_path);

// Validates an already-parsed config.json; `source_name` is used in messages (normally the path).
Result<ModelConfig> parse_model_config(const nlohmann::json& j, const std::string& source_name);

// inv_freq[i] = 1 / theta^(2i / head_dim) in f32, then scaled per rope.type like transformers'
// _compute_default_rope_parameters / linear / _compute_llama3_parameters (f32 arithmetic, op by
// op, so the table matches torch's bit for bit up to the last ulp of pow). head_dim must be even
// and positive and rope.type one the parser accepts (anything else is a bug: it aborts).
RopeTables compute_rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

}  // namespace kiln
