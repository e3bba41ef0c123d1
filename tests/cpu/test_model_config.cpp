// Tests of config.json parsing (both transformers layouts) and the RoPE tables, and that every bad
// config is a clear error naming the file and key. Bad inputs are written to a temporary folder
// that each test removes again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "model_loading_test.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// ---- config.json --------------------------------------------------------------------------

TEST(ModelConfig, TinyLlama) {
  Result<ModelConfig> r = load_model_config(kTinyLlama);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, Architecture::llama);
  EXPECT_EQ(c.architecture_class, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 384);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 160);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.hidden_act, "silu");
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  ASSERT_TRUE(c.pad_token_id.has_value());
  EXPECT_EQ(*c.pad_token_id, 0);
  EXPECT_EQ(c.dtype, DType::f32);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.factor, 8.0f);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 64);
  EXPECT_NE(c.source.find("tiny-llama/config.json"), std::string::npos);
}

TEST(ModelConfig, TinyQwen2) {
  Result<ModelConfig> r = load_model_config(kTinyQwen2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, Architecture::qwen2);
  EXPECT_EQ(c.vocab_size, 384);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);  // no "head_dim": hidden_size / num_attention_heads
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);  // q/k/v biases
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);  // "use_sliding_window": false
  EXPECT_EQ(c.rope.theta, 1e6f);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.architecture_class, b.architecture_class);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.o_proj_bias, b.o_proj_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
  EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
  EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
}

// Rewrites a transformers-5 config (rope_parameters, dtype) in the transformers-4 layout
// (top-level rope_theta, rope_scaling, torch_dtype); `legacy_type` uses "type" for "rope_type".
json to_transformers4(json j, bool legacy_type) {
  json params = j["rope_parameters"];
  j.erase("rope_parameters");
  j["rope_theta"] = params["rope_theta"];
  params.erase("rope_theta");
  std::string type = params["rope_type"];
  params.erase("rope_type");
  if (type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    params[legacy_type ? "type" : "rope_type"] = type;
    j["rope_scaling"] = params;
  }
  j["torch_dtype"] = j["dtype"];
  j.erase("dtype");
  j["transformers_version"] = "4.46.0";
  return j;
}

TEST(ModelConfig, Transformers4LayoutParsesIdentically) {
  for (const std::string& dir : {kTinyLlama, kTinyQwen2}) {
    for (bool legacy : {false, true}) {
      SCOPED_TRACE(dir + (legacy ? " (legacy 'type')" : " ('rope_type')"));
      Result<ModelConfig> v5 = load_model_config(dir);
      ASSERT_TRUE(v5.ok()) << v5.status().message();
      TempDir tmp;
      json j4 = to_transformers4(read_json(dir + "/config.json"), legacy);
      ASSERT_FALSE(j4.contains("rope_parameters"));
      write_json(tmp.sub("config.json"), j4);
      Result<ModelConfig> v4 = load_model_config(tmp.path.string());
      ASSERT_TRUE(v4.ok()) << v4.status().message();
      expect_same_config(*v4, *v5);
    }
  }
}

TEST(ModelConfig, DefaultsWhenOptionalKeysAreAbsent) {
  json j = read_json(kTinyLlama + "/config.json");
  for (const char* k : {"num_key_value_heads", "head_dim", "rope_parameters", "tie_word_embeddings", "attention_bias",
                        "mlp_bias", "rms_norm_eps", "hidden_act", "dtype", "eos_token_id", "bos_token_id"})
    j.erase(k);
  Result<ModelConfig> r = parse_model_config(j, "mem.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_key_value_heads, 4);
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->rope.theta, 10000.0f);
  EXPECT_EQ(r->rope.type, "default");
  EXPECT_FALSE(r->tie_word_embeddings);
  EXPECT_EQ(r->rms_norm_eps, 1e-6f);
  EXPECT_EQ(r->dtype, DType::f32);
  EXPECT_TRUE(r->eos_token_ids.empty());
  EXPECT_FALSE(r->bos_token_id.has_value());

  j["head_dim"] = nullptr;  // null means "derive it", as in transformers
  j["num_key_value_heads"] = nullptr;
  r = parse_model_config(j, "mem.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->num_key_value_heads, 4);
}

TEST(ModelConfig, OtherArchitecturesAndFields) {
  json base = read_json(kTinyLlama + "/config.json");
  base.erase("rope_parameters");

  json mistral = base;
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["attention_bias"] = true;  // MistralAttention has no biases whatever the config says
  mistral["sliding_window"] = 128;
  mistral["eos_token_id"] = {2, 7};
  mistral["dtype"] = "bfloat16";
  Result<ModelConfig> m = parse_model_config(mistral, "mistral.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->architecture, Architecture::mistral);
  EXPECT_FALSE(m->attention_bias);
  EXPECT_FALSE(m->o_proj_bias);
  EXPECT_EQ(m->sliding_window, 128);
  EXPECT_EQ(m->eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(m->dtype, DType::bf16);
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(parse_model_config(mistral, "m.json")->sliding_window, 0);
  mistral["sliding_window"] = 4096;  // not smaller than max_position_embeddings (256): no window
  EXPECT_EQ(parse_model_config(mistral, "m.json")->sliding_window, 0);

  json qwen3 = base;
  qwen3["architectures"] = {"Qwen3ForCausalLM"};
  qwen3["head_dim"] = 32;  // explicit and != hidden_size / heads
  qwen3["rope_theta"] = 1000000;
  qwen3["sliding_window"] = 64;  // ignored: use_sliding_window is absent (false)
  Result<ModelConfig> q = parse_model_config(qwen3, "qwen3.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->architecture, Architecture::qwen3);
  EXPECT_TRUE(q->qk_norm);
  EXPECT_FALSE(q->attention_bias);
  EXPECT_EQ(q->head_dim, 32);
  EXPECT_EQ(q->sliding_window, 0);
  EXPECT_EQ(q->rope.theta, 1e6f);
  qwen3["use_sliding_window"] = true;
  qwen3["attention_bias"] = true;
  q = parse_model_config(qwen3, "qwen3.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->sliding_window, 64);
  EXPECT_TRUE(q->attention_bias);
  EXPECT_TRUE(q->o_proj_bias);

  json linear = base;
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  Result<ModelConfig> l = parse_model_config(linear, "linear.json");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->rope.type, "linear");
  EXPECT_EQ(l->rope.factor, 2.0f);

  json no_arch = base;  // "model_type" stands in for a missing "architectures"
  no_arch.erase("architectures");
  Result<ModelConfig> n = parse_model_config(no_arch, "n.json");
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(n->architecture, Architecture::llama);
}

// ---- config errors ------------------------------------------------------------------------

TEST(ModelConfigErrors, MissingFolderAndFile) {
  const std::string missing = (fs::temp_directory_path() / "kiln_no_such_model_folder_xyz").string();
  expect_error(load_model_config(missing), {missing, "does not exist"}, StatusCode::not_found);
  TempDir tmp;
  expect_error(load_model_config(tmp.path.string()), {tmp.sub("config.json"), "does not exist"}, StatusCode::not_found);
  expect_error(load_model_config_file(tmp.sub("config.json")), {tmp.sub("config.json"), "does not exist"},
               StatusCode::not_found);
  expect_error(load_model_config_file(tmp.path.string()), {tmp.path.string(), "folder"}, StatusCode::invalid_argument);
}

TEST(ModelConfig, LoadByFilePath) {
  Result<ModelConfig> by_file = load_model_config_file(kTinyLlama + "/config.json");
  ASSERT_TRUE(by_file.ok()) << by_file.status().message();
  Result<ModelConfig> by_dir = load_model_config(kTinyLlama);
  ASSERT_TRUE(by_dir.ok());
  expect_same_config(*by_file, *by_dir);
}

TEST(ModelConfigErrors, MalformedJson) {
  TempDir tmp;
  write_bytes(tmp.sub("config.json"), "{\n  \"hidden_size\": 64,\n  \"vocab_size\": \n");
  expect_error(load_model_config(tmp.path.string()), {tmp.sub("config.json"), "not valid JSON", "line"},
               StatusCode::invalid_argument);
  write_bytes(tmp.sub("config.json"), "[1, 2]");
  expect_error(load_model_config(tmp.path.string()), {tmp.sub("config.json"), "object"}, StatusCode::invalid_argument);
  // Nested 100,000 levels deep: refused at load (writing it back after training recursed to a crash).
  std::string text = read_file(kTinyLlama + "/config.json");
  text = text.substr(0, text.rfind('}')) + ", \"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  write_bytes(tmp.sub("config.json"), text);
  expect_error(load_model_config(tmp.path.string()), {tmp.sub("config.json"), "nests deeper than 64 levels"},
               StatusCode::invalid_argument);
}

// Loads the tiny-llama config with `edit` applied, from a file, and expects an error naming the
// file and every string in `parts`.
template <typename Edit>
void expect_config_error(Edit edit, std::initializer_list<std::string> parts, StatusCode code) {
  TempDir tmp;
  json j = read_json(kTinyLlama + "/config.json");
  edit(j);
  write_json(tmp.sub("config.json"), j);
  Result<ModelConfig> r = load_model_config(tmp.path.string());
  expect_error(r, parts, code);
  if (!r.ok()) {
    EXPECT_NE(r.status().message().find(tmp.sub("config.json")), std::string::npos) << r.status().message();
  }
}

TEST(ModelConfigErrors, UnsupportedArchitecture) {
  expect_config_error([](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; },
                      {"GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                       "Qwen3ForCausalLM"},
                      StatusCode::unsupported);
  expect_config_error([](json& j) { j["architectures"] = "LlamaForCausalLM"; }, {"'architectures'"},
                      StatusCode::invalid_argument);
}

TEST(ModelConfigErrors, MissingRequiredKeys) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "max_position_embeddings"}) {
    SCOPED_TRACE(key);
    expect_config_error([&](json& j) { j.erase(key); }, {std::string("'") + key + "'", "missing"},
                        StatusCode::invalid_argument);
  }
  expect_config_error([](json& j) { j.erase("architectures"); j.erase("model_type"); }, {"'architectures'", "missing"},
                      StatusCode::invalid_argument);
}

TEST(ModelConfigErrors, WrongTypesAndValues) {
  expect_config_error([](json& j) { j["hidden_size"] = "64"; }, {"'hidden_size'", "integer", "string"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["hidden_size"] = 64.5; }, {"'hidden_size'", "integer"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["tie_word_embeddings"] = 1; }, {"'tie_word_embeddings'", "true or false"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["rms_norm_eps"] = "1e-5"; }, {"'rms_norm_eps'", "number"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["eos_token_id"] = {2, "x"}; }, {"'eos_token_id'", "integer"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["num_hidden_layers"] = 0; }, {"'num_hidden_layers'", "positive"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["vocab_size"] = -3; }, {"'vocab_size'", "positive"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["num_key_value_heads"] = 3; }, {"num_attention_heads", "num_key_value_heads"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["head_dim"] = 15; }, {"head_dim", "odd"}, StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu", "silu"},
                      StatusCode::unsupported);
  expect_config_error([](json& j) { j["dtype"] = "float64"; }, {"dtype", "float64"}, StatusCode::unsupported);
  expect_config_error([](json& j) { j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}}; },
                      {"quantized", "'fp8'", "unquantized"}, StatusCode::unsupported);
  expect_config_error([](json& j) { j["quantization_config"] = 3; }, {"quantized"}, StatusCode::unsupported);
}

TEST(ModelConfigErrors, Rope) {
  expect_config_error([](json& j) { j["rope_parameters"]["rope_type"] = "longrope"; },
                      {"longrope", "rope_parameters.rope_type", "llama3", "yarn"}, StatusCode::unsupported);
  expect_config_error([](json& j) { j["rope_parameters"]["rope_type"] = "dynamic"; }, {"dynamic"},
                      StatusCode::unsupported);
  expect_config_error([](json& j) { j["rope_parameters"].erase("low_freq_factor"); },
                      {"'rope_parameters.low_freq_factor'", "missing"}, StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["rope_parameters"]["factor"] = "8"; }, {"'rope_parameters.factor'", "number"},
                      StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["rope_parameters"] = 5; }, {"'rope_parameters'", "object"},
                      StatusCode::invalid_argument);
  expect_config_error(
      [](json& j) {
        j = to_transformers4(j, true);
        j["rope_scaling"]["type"] = "su";
      },
      {"su", "rope_scaling.type"}, StatusCode::unsupported);
  expect_config_error(
      [](json& j) {
        j = to_transformers4(j, false);
        j["rope_scaling"]["original_max_position_embeddings"] = -5;
      },
      {"'rope_scaling.original_max_position_embeddings'", "within"}, StatusCode::invalid_argument);
  expect_config_error([](json& j) { j["rope_parameters"]["rope_theta"] = -1.0; }, {"rope_theta", "positive"},
                      StatusCode::invalid_argument);
}

// ---- RoPE tables --------------------------------------------------------------------------

// Independent double-precision references of transformers' formulas.
std::vector<double> ref_default(double theta, int dim) {
  std::vector<double> out;
  for (int i = 0; i < dim; i += 2) out.push_back(1.0 / std::pow(theta, static_cast<double>(i) / dim));
  return out;
}

std::vector<double> ref_llama3(double theta, int dim, double factor, double low, double high, double old_ctx) {
  std::vector<double> out;
  const double pi = 3.14159265358979323846;
  for (double f : ref_default(theta, dim)) {
    double wavelen = 2 * pi / f;
    if (wavelen < old_ctx / high) {
      out.push_back(f);
    } else if (wavelen > old_ctx / low) {
      out.push_back(f / factor);
    } else {
      double smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back((1 - smooth) * f / factor + smooth * f);
    }
  }
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << "inv_freq[" << i << "]";
}

// At most one ulp from a reference computed in f32 the way torch does (powf itself may differ by an
// ulp between libm implementations; torch's vectorised pow is a 1-ulp Sleef routine).
void expect_f32_match(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(ulp_diff(got[i], want[i]), 1) << "inv_freq[" << i << "] = " << got[i] << ", want " << want[i];
}

// f32 references made with numpy 2.4 (NEP 50 scalar rules match torch's here), step by step as
// transformers runs them:
//   import math, numpy as np
//   f32 = np.float32
//   def default_inv_freq(theta, dim):
//       exps = np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)
//       return f32(1.0) / (f32(theta) ** exps)
//   def llama3(inv, factor, low, high, old):
//       low_wl, high_wl = old / low, old / high           # python doubles, as in transformers
//       wavelen = (f32(1) / inv) * f32(2 * math.pi)       # torch: scalar / t == t.reciprocal() * scalar
//       llama = np.where(wavelen > f32(low_wl), inv / f32(factor), inv)
//       smooth = ((f32(1) / wavelen) * f32(old) - f32(low)) / f32(high - low)
//       smoothed = (f32(1) - smooth) * llama / f32(factor) + smooth * llama
//       medium = ~(wavelen < f32(high_wl)) & ~(wavelen > f32(low_wl))
//       return np.where(medium, smoothed, llama)
//   for v in (default_inv_freq(1e6, 16),
//             llama3(default_inv_freq(500000.0, 16), 8.0, 1.0, 4.0, 64),
//             default_inv_freq(10000.0, 128)):
//       print(", ".join("%.9gf" % x for x in v))
const std::vector<float> kNumpyQwen2 = {1.f,         0.177827939f,    0.0316227786f,   0.00562341325f,
                                        0.00100000005f, 0.00017782794f, 3.16227743e-05f, 5.62341347e-06f};
const std::vector<float> kNumpyLlama3 = {1.f,            0.079403013f,    0.00470075384f,  0.000911583134f,
                                         0.000176776681f, 3.42810235e-05f, 6.64786967e-06f, 1.28917316e-06f};
const std::vector<float> kNumpyTheta1e4Dim128 = {
    1.f,           0.865964353f,   0.749894202f,   0.649381638f,   0.562341332f,   0.486967534f,   0.421696514f,
    0.365174145f,  0.316227764f,   0.273841977f,   0.237137362f,   0.2053525f,     0.177827939f,   0.153992653f,
    0.133352146f,  0.115478203f,   0.100000001f,   0.0865964293f,  0.0749894157f,  0.0649381652f,  0.0562341288f,
    0.0486967526f, 0.0421696492f,  0.0365174115f,  0.0316227786f,  0.0273841955f,  0.0237137359f,  0.0205352511f,
    0.0177827943f, 0.0153992651f,  0.0133352149f,  0.0115478197f,  0.00999999978f, 0.00865964312f, 0.00749894232f,
    0.00649381662f, 0.00562341325f, 0.00486967526f, 0.00421696482f, 0.00365174143f, 0.00316227786f, 0.00273841969f,
    0.00237137382f, 0.00205352507f, 0.00177827943f, 0.00153992651f, 0.00133352145f, 0.00115478202f, 0.00100000005f,
    0.000865964335f, 0.000749894185f, 0.000649381662f, 0.000562341302f, 0.000486967503f, 0.000421696488f,
    0.000365174114f, 0.000316227786f, 0.000273841957f, 0.000237137385f, 0.000205352495f, 0.00017782794f,
    0.000153992645f, 0.00013335215f, 0.000115478193f};

TEST(Rope, DefaultInvFreq) {
  Result<ModelConfig> c = load_model_config(kTinyQwen2);
  ASSERT_TRUE(c.ok()) << c.status().message();
  RopeTables t = compute_rope_inv_freq(c->rope, c->head_dim);
  EXPECT_EQ(t.attention_scaling, 1.0f);
  expect_close(t.inv_freq, ref_default(1e6, 16), 1e-6);
  expect_f32_match(t.inv_freq, kNumpyQwen2);

  RopeConfig plain;  // theta 10000, Llama 2 / Mistral style
  RopeTables t128 = compute_rope_inv_freq(plain, 128);
  expect_close(t128.inv_freq, ref_default(10000.0, 128), 1e-6);
  expect_f32_match(t128.inv_freq, kNumpyTheta1e4Dim128);
}

TEST(Rope, Llama3InvFreq) {
  Result<ModelConfig> c = load_model_config(kTinyLlama);
  ASSERT_TRUE(c.ok()) << c.status().message();
  RopeTables t = compute_rope_inv_freq(c->rope, c->head_dim);
  EXPECT_EQ(t.attention_scaling, 1.0f);
  // head_dim 16 covers all three bands: pair 0 high-frequency (kept), pair 1 smoothed, 2.. scaled.
  expect_close(t.inv_freq, ref_llama3(500000.0, 16, 8.0, 1.0, 4.0, 64.0), 1e-6);
  expect_f32_match(t.inv_freq, kNumpyLlama3);

  RopeConfig llama31;  // Llama 3.1 8B's parameters
  llama31.theta = 500000.0f;
  llama31.type = "llama3";
  llama31.factor = 8.0f;
  llama31.low_freq_factor = 1.0f;
  llama31.high_freq_factor = 4.0f;
  llama31.original_max_position_embeddings = 8192;
  expect_close(compute_rope_inv_freq(llama31, 128).inv_freq, ref_llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192.0), 1e-6);
}

TEST(Rope, LinearInvFreq) {
  RopeConfig r;
  r.type = "linear";
  r.factor = 4.0f;
  std::vector<double> want = ref_default(10000.0, 64);
  for (double& w : want) w /= 4.0;
  expect_close(compute_rope_inv_freq(r, 64).inv_freq, want, 1e-6);
}

}  // namespace
}  // namespace kiln::test
