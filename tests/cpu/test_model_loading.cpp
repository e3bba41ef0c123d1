// Tests of the model-folder loading layer: config.json parsing (both transformers layouts), the
// RoPE tables, safetensors reading/writing, checkpoint lookup, tensor loading, and that every bad
// input is a clear error naming the file, key or tensor. Bad inputs are written to a temporary
// folder that each test removes again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kTinyLlama = test::testdata_dir() + "/tiny-llama";
const std::string kTinyQwen2 = test::testdata_dir() + "/tiny-qwen2";

// A fresh folder under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("kiln_model_test_") + (info ? info->name() : "x") + "_" + std::to_string(::getpid());
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // A sub-folder (created).
  std::string sub(const std::string& name) const {
    fs::create_directories(path_ / name);
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

json read_json(const std::string& path) { return json::parse(read_bytes(path)); }

void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

// A safetensors file from a header text and a data section, byte for byte.
std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

uint64_t header_length(const std::string& file_bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file_bytes[i]);
  return n;
}

// Asserts a non-ok status whose message contains every one of `parts`.
template <typename S>
void expect_error(const S& st, std::initializer_list<std::string> parts, StatusCode code) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << *parts.begin();
  EXPECT_EQ(static_cast<int>(st.code()), static_cast<int>(code)) << st.message();
  for (const std::string& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in: " << st.message();
}
template <typename T>
void expect_error(const Result<T>& r, std::initializer_list<std::string> parts, StatusCode code) {
  expect_error(r.status(), parts, code);
  EXPECT_FALSE(r.ok());
}

// Units in the last place between two floats (same sign assumed).
int64_t ulp_diff(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

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
      write_json(tmp.file("config.json"), j4);
      Result<ModelConfig> v4 = load_model_config(tmp.str());
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
  expect_error(load_model_config(tmp.str()), {tmp.file("config.json"), "does not exist"}, StatusCode::not_found);
  expect_error(load_model_config_file(tmp.file("config.json")), {tmp.file("config.json"), "does not exist"},
               StatusCode::not_found);
  expect_error(load_model_config_file(tmp.str()), {tmp.str(), "folder"}, StatusCode::invalid_argument);
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
  write_bytes(tmp.file("config.json"), "{\n  \"hidden_size\": 64,\n  \"vocab_size\": \n");
  expect_error(load_model_config(tmp.str()), {tmp.file("config.json"), "not valid JSON", "line"},
               StatusCode::invalid_argument);
  write_bytes(tmp.file("config.json"), "[1, 2]");
  expect_error(load_model_config(tmp.str()), {tmp.file("config.json"), "object"}, StatusCode::invalid_argument);
}

// Loads the tiny-llama config with `edit` applied, from a file, and expects an error naming the
// file and every string in `parts`.
template <typename Edit>
void expect_config_error(Edit edit, std::initializer_list<std::string> parts, StatusCode code) {
  TempDir tmp;
  json j = read_json(kTinyLlama + "/config.json");
  edit(j);
  write_json(tmp.file("config.json"), j);
  Result<ModelConfig> r = load_model_config(tmp.str());
  expect_error(r, parts, code);
  if (!r.ok()) {
    EXPECT_NE(r.status().message().find(tmp.file("config.json")), std::string::npos) << r.status().message();
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
}

TEST(ModelConfigErrors, Rope) {
  expect_config_error([](json& j) { j["rope_parameters"]["rope_type"] = "yarn"; },
                      {"yarn", "rope_parameters.rope_type", "llama3"}, StatusCode::unsupported);
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
        j["rope_scaling"]["type"] = "yarn";
      },
      {"yarn", "rope_scaling.type"}, StatusCode::unsupported);
  expect_config_error(
      [](json& j) {
        j = to_transformers4(j, false);
        j["rope_scaling"].erase("original_max_position_embeddings");
      },
      {"'rope_scaling.original_max_position_embeddings'", "missing"}, StatusCode::invalid_argument);
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

// ---- checkpoints --------------------------------------------------------------------------

// The tensors a config implies, named as transformers names them.
std::map<std::string, Shape> expected_tensors(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  std::map<std::string, Shape> out;
  out["model.embed_tokens.weight"] = {V, H};
  out["model.norm.weight"] = {H};
  if (!c.tie_word_embeddings) out["lm_head.weight"] = {V, H};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "input_layernorm.weight"] = {H};
    out[p + "post_attention_layernorm.weight"] = {H};
    out[p + "self_attn.q_proj.weight"] = {q, H};
    out[p + "self_attn.k_proj.weight"] = {kv, H};
    out[p + "self_attn.v_proj.weight"] = {kv, H};
    out[p + "self_attn.o_proj.weight"] = {H, q};
    if (c.attention_bias) {
      out[p + "self_attn.q_proj.bias"] = {q};
      out[p + "self_attn.k_proj.bias"] = {kv};
      out[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.o_proj_bias) out[p + "self_attn.o_proj.bias"] = {H};
    if (c.qk_norm) {
      out[p + "self_attn.q_norm.weight"] = {c.head_dim};
      out[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
    out[p + "mlp.gate_proj.weight"] = {I, H};
    out[p + "mlp.up_proj.weight"] = {I, H};
    out[p + "mlp.down_proj.weight"] = {H, I};
  }
  return out;
}

TEST(Checkpoint, FixturesHoldEveryTensorWithTheExpectedShape) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  for (const std::string& dir : {kTinyLlama, kTinyQwen2}) {
    SCOPED_TRACE(dir);
    Result<ModelConfig> c = load_model_config(dir);
    ASSERT_TRUE(c.ok()) << c.status().message();
    Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
    std::map<std::string, Shape> want = expected_tensors(*c);
    std::vector<std::string> names = ckpt->names();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), want.size());
    for (const std::string& n : names) EXPECT_TRUE(want.count(n)) << "unexpected tensor " << n;
    for (const auto& [name, shape] : want) {
      Result<TensorInfo> info = ckpt->find(name);
      ASSERT_TRUE(info.ok()) << info.status().message();
      EXPECT_EQ(info->shape, shape) << name;
      EXPECT_EQ(info->dtype, DType::f32) << name;
      EXPECT_NE(info->file.find("model.safetensors"), std::string::npos);

      Result<TensorBuffer> w = load_tensor(*be, *ckpt, name, shape, DType::f32);
      ASSERT_TRUE(w.ok()) << w.status().message();
      EXPECT_EQ(w->shape(), shape);
      EXPECT_EQ(std::memcmp(w->view().data, info->data, static_cast<size_t>(info->nbytes())), 0) << name;
    }
  }
}

TEST(Checkpoint, LoadConvertsDtypes) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  Result<TensorInfo> info = ckpt->find(name);
  ASSERT_TRUE(info.ok());
  std::vector<float> src(static_cast<size_t>(info->shape.numel()));
  std::memcpy(src.data(), info->data, src.size() * 4);

  Result<TensorBuffer> b = load_tensor(*be, *ckpt, name, {64, 64}, DType::bf16);
  ASSERT_TRUE(b.ok()) << b.status().message();
  Result<TensorBuffer> h = load_tensor(*be, *ckpt, name, {64, 64}, DType::f16);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(b->view().dtype, DType::bf16);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(b->ptr<uint16_t>()[i], f32_to_bf16(src[i])) << i;
    ASSERT_EQ(h->ptr<uint16_t>()[i], f32_to_f16(src[i])) << i;
  }

  // bf16 / f16 files load back to f32 exactly and convert across 16-bit formats.
  TempDir tmp;
  ASSERT_TRUE(write_safetensors(tmp.file("model.safetensors"), {{"b", b->view()}, {"h", h->view()}}, {}).ok());
  Result<SafetensorsCheckpoint> c16 = SafetensorsCheckpoint::open(tmp.str());
  ASSERT_TRUE(c16.ok()) << c16.status().message();
  Result<TensorBuffer> b32 = load_tensor(*be, *c16, "b", {64, 64}, DType::f32);
  Result<TensorBuffer> h2b = load_tensor(*be, *c16, "h", {64, 64}, DType::bf16);
  ASSERT_TRUE(b32.ok() && h2b.ok());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(b32->ptr<float>()[i], bf16_to_f32(f32_to_bf16(src[i]))) << i;
    ASSERT_EQ(h2b->ptr<uint16_t>()[i], f32_to_bf16(f16_to_f32(f32_to_f16(src[i])))) << i;
  }
}

// Writes tiny-llama's tensors as two shards plus an index into `dir`; returns the weight map.
json write_sharded(const std::string& dir) {
  Result<SafetensorsFile> f = SafetensorsFile::open(kTinyLlama + "/model.safetensors");
  KILN_ASSERT(f.ok());
  std::vector<std::pair<std::string, Tensor>> shard[2];
  json weight_map = json::object();
  int i = 0;
  for (const std::string& name : f->names()) {
    TensorInfo info = f->find(name).value();
    Tensor t;
    t.data = const_cast<void*>(info.data);
    t.dtype = info.dtype;
    t.shape = info.shape;
    int s = (i++ % 2);
    shard[s].push_back({name, t});
    weight_map[name] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  for (int s = 0; s < 2; ++s) {
    Status st = write_safetensors(dir + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors", shard[s],
                                  {{"format", "pt"}});
    KILN_ASSERT(st.ok());
  }
  json index = {{"metadata", {{"total_size", 541952}}}, {"weight_map", weight_map}};
  write_json(dir + "/model.safetensors.index.json", index);
  return index;
}

TEST(Checkpoint, ShardedIndex) {
  TempDir tmp;
  write_sharded(tmp.str());
  Result<SafetensorsCheckpoint> sharded = SafetensorsCheckpoint::open(tmp.str());
  ASSERT_TRUE(sharded.ok()) << sharded.status().message();
  Result<SafetensorsCheckpoint> single = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(sharded->names(), single->names());
  std::set<std::string> files;
  for (const std::string& name : single->names()) {
    TensorInfo a = sharded->find(name).value();
    TensorInfo b = single->find(name).value();
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(b.nbytes())), 0) << name;
    files.insert(a.file);
  }
  EXPECT_EQ(files.size(), 2u);
}

TEST(Safetensors, WriteRoundTrip) {
  TempDir tmp;
  TensorBuffer a = host_empty({3, 5}, DType::f32);
  for (int i = 0; i < 15; ++i) a.ptr<float>()[i] = 0.25f * i - 1.0f;
  TensorBuffer b = host_empty({7}, DType::bf16);  // 14 bytes: the next tensor starts unaligned
  for (int i = 0; i < 7; ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i));
  TensorBuffer c = host_empty({2, 2}, DType::i64);
  for (int i = 0; i < 4; ++i) c.ptr<int64_t>()[i] = -5 + (int64_t{1} << 40) * i;
  TensorBuffer d = host_empty({3}, DType::i32);
  for (int i = 0; i < 3; ++i) d.ptr<int32_t>()[i] = 100 * i - 7;
  TensorBuffer e = host_empty({2, 0}, DType::f16);
  TensorBuffer f = host_empty({}, DType::f32);  // a scalar
  f.ptr<float>()[0] = 3.5f;
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"z.first", a}, {"b", b}, {"c", c}, {"d", d}, {"empty", e}, {"scalar", f}};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "42"}};
  const std::string path = tmp.file("out.safetensors");
  Status st = write_safetensors(path, tensors, meta);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(fs::exists(path + ".partial"));

  std::string bytes = read_bytes(path);
  uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  // Data in the given order, contiguous.
  json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["z.first"]["data_offsets"], json({0, 60}));
  EXPECT_EQ(header["b"]["data_offsets"], json({60, 74}));
  EXPECT_EQ(header["c"]["dtype"], "I64");
  EXPECT_EQ(bytes.size(), 8 + n + 60 + 14 + 32 + 12 + 0 + 4);

  Result<SafetensorsFile> r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->metadata(), meta);
  EXPECT_EQ(r->names().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    Result<TensorInfo> info = r->find(name);
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_EQ(info->dtype, t.dtype) << name;
    EXPECT_EQ(info->shape, t.shape) << name;
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(info->data, t.data, static_cast<size_t>(t.nbytes())), 0) << name;
    }
  }

  // The fixture rewritten tensor by tensor gives back the same tensors.
  Result<SafetensorsFile> fixture = SafetensorsFile::open(kTinyQwen2 + "/model.safetensors");
  ASSERT_TRUE(fixture.ok());
  std::vector<std::pair<std::string, Tensor>> all;
  for (const std::string& name : fixture->names()) {
    TensorInfo info = fixture->find(name).value();
    Tensor t;
    t.data = const_cast<void*>(info.data);
    t.dtype = info.dtype;
    t.shape = info.shape;
    all.push_back({name, t});
  }
  ASSERT_TRUE(write_safetensors(tmp.file("copy.safetensors"), all, fixture->metadata()).ok());
  Result<SafetensorsFile> copy = SafetensorsFile::open(tmp.file("copy.safetensors"));
  ASSERT_TRUE(copy.ok()) << copy.status().message();
  EXPECT_EQ(copy->metadata().at("format"), "pt");
  for (const auto& [name, t] : all) {
    TensorInfo info = copy->find(name).value();
    EXPECT_EQ(info.shape, t.shape);
    EXPECT_EQ(std::memcmp(info.data, t.data, static_cast<size_t>(t.nbytes())), 0) << name;
  }
}

TEST(Safetensors, WriteErrors) {
  TempDir tmp;
  TensorBuffer a = host_empty({2}, DType::f32);
  a.ptr<float>()[0] = a.ptr<float>()[1] = 0;
  expect_error(write_safetensors(tmp.file("x.safetensors"), {{"a", a}, {"a", a}}, {}), {"'a'", "twice"},
               StatusCode::invalid_argument);
  expect_error(write_safetensors(tmp.file("x.safetensors"), {{"__metadata__", a}}, {}), {"__metadata__"},
               StatusCode::invalid_argument);
  Tensor dev = a.view();
  dev.device = Device::cuda(0);
  expect_error(write_safetensors(tmp.file("x.safetensors"), {{"g", dev}}, {}), {"'g'", "cuda:0", "host"},
               StatusCode::invalid_argument);
  const std::string bad = tmp.file("no/such/folder/x.safetensors");
  expect_error(write_safetensors(bad, {{"a", a}}, {}), {bad}, StatusCode::io_error);
}

// ---- safetensors / checkpoint errors ------------------------------------------------------

TEST(SafetensorsErrors, MissingFolderAndFiles) {
  const std::string missing = (fs::temp_directory_path() / "kiln_no_such_model_folder_xyz").string();
  expect_error(SafetensorsCheckpoint::open(missing), {missing}, StatusCode::not_found);
  TempDir tmp;
  expect_error(SafetensorsCheckpoint::open(tmp.str()),
               {tmp.file("model.safetensors"), tmp.file("model.safetensors.index.json")}, StatusCode::not_found);
  expect_error(SafetensorsFile::open(tmp.file("nope.safetensors")), {tmp.file("nope.safetensors")},
               StatusCode::not_found);
}

TEST(SafetensorsErrors, Truncated) {
  TempDir tmp;
  const std::string fixture = read_bytes(kTinyLlama + "/model.safetensors");
  const uint64_t n = header_length(fixture);
  const std::string path = tmp.file("model.safetensors");

  write_bytes(path, fixture.substr(0, 5));
  expect_error(SafetensorsFile::open(path), {path, "too short"}, StatusCode::invalid_argument);

  write_bytes(path, fixture.substr(0, 8 + n / 2));  // cut in the middle of the header
  expect_error(SafetensorsFile::open(path), {path, "header length", "truncated"}, StatusCode::invalid_argument);

  // Cut in the middle of the data: the first tensor (in name order) past the cut is reported.
  const size_t data_bytes = fixture.size() - 8 - n;
  write_bytes(path, fixture.substr(0, 8 + n + data_bytes / 2));
  Result<SafetensorsFile> r = SafetensorsFile::open(path);
  expect_error(r, {path, "tensor '", "data_offsets", "truncated"}, StatusCode::invalid_argument);
  // ... and through the checkpoint too.
  expect_error(SafetensorsCheckpoint::open(tmp.str()), {path, "data_offsets"}, StatusCode::invalid_argument);
}

TEST(SafetensorsErrors, CorruptHeader) {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  std::string fixture = read_bytes(kTinyLlama + "/model.safetensors");

  std::string corrupt = fixture;
  const size_t colon = corrupt.find("\"dtype\":") + 7;
  ASSERT_LT(colon, 8 + header_length(fixture));
  corrupt[colon] = ' ';  // "dtype" "F32": no longer JSON
  write_bytes(path, corrupt);
  expect_error(SafetensorsFile::open(path), {path, "not valid JSON"}, StatusCode::invalid_argument);

  std::string huge = fixture;
  uint64_t len = fixture.size() * 2;
  for (int i = 0; i < 8; ++i) huge[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  write_bytes(path, huge);
  expect_error(SafetensorsFile::open(path), {path, "header length", std::to_string(len)}, StatusCode::invalid_argument);

  std::string all_ones = fixture;
  for (int i = 0; i < 8; ++i) all_ones[i] = static_cast<char>(0xff);
  write_bytes(path, all_ones);
  expect_error(SafetensorsFile::open(path), {path, "header length"}, StatusCode::invalid_argument);

  write_bytes(path, raw_safetensors("[1, 2, 3]", ""));
  expect_error(SafetensorsFile::open(path), {path, "object"}, StatusCode::invalid_argument);
}

TEST(SafetensorsErrors, BadEntries) {
  TempDir tmp;
  const std::string path = tmp.file("bad.safetensors");
  const std::string data(16, '\0');
  struct Case {
    const char* header;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"w": {"shape": [2], "data_offsets": [0, 8]}})", "dtype"},
      {R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", "shape"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", "data_offsets"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", "data_offsets"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 24]}})", "data section"},     // out of range
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 4]}})", "begin <= end"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", "non-negative"},
      {R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}})", "needs 4 x 4 bytes"},  // size mismatch
      {R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 8]}})", "non-negative"},
      {R"({"w": [1, 2]})", "dtype, shape and data_offsets"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    write_bytes(path, raw_safetensors(c.header, data));
    expect_error(SafetensorsFile::open(path), {path, "tensor 'w'", c.expect}, StatusCode::invalid_argument);
  }
  // Overlapping tensors are allowed; metadata is skipped.
  write_bytes(path, raw_safetensors(R"({"__metadata__": {"k": "v"}, "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
      "b": {"dtype": "I32", "shape": [2], "data_offsets": [8, 16]}})",
                                    data));
  Result<SafetensorsFile> ok = SafetensorsFile::open(path);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ok->metadata().at("k"), "v");
}

TEST(SafetensorsErrors, UnsupportedDtypeOnlyWhenRequested) {
  TempDir tmp;
  const std::string path = tmp.file("model.safetensors");
  write_bytes(path, raw_safetensors(R"({"d": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]},
      "q": {"dtype": "Q4_K", "shape": [3], "data_offsets": [8, 10]},
      "u": {"dtype": "U8", "shape": [2, 3], "data_offsets": [10, 16]},
      "f": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                                    std::string(16, '\0')));
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->find("f").ok());
  expect_error(f->find("d"), {"tensor 'd'", path, "F64"}, StatusCode::unsupported);
  expect_error(f->find("q"), {"tensor 'q'", path, "Q4_K"}, StatusCode::unsupported);
  expect_error(f->find("u"), {"tensor 'u'", path, "U8"}, StatusCode::unsupported);

  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(tmp.str());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  std::unique_ptr<Backend> be = make_cpu_backend();
  expect_error(load_tensor(*be, *ckpt, "d", {1}, DType::f32), {"tensor 'd'", path, "F64"}, StatusCode::unsupported);
}

TEST(CheckpointErrors, MissingTensorShapeAndDtypeMismatch) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(kTinyLlama);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  expect_error(ckpt->find("model.layers.7.mlp.up_proj.weight"), {"'model.layers.7.mlp.up_proj.weight'", kTinyLlama},
               StatusCode::not_found);
  expect_error(load_tensor(*be, *ckpt, "lm_head.bias", {384}, DType::f32), {"'lm_head.bias'", kTinyLlama},
               StatusCode::not_found);

  const std::string file = kTinyLlama + "/model.safetensors";
  Result<TensorBuffer> r = load_tensor(*be, *ckpt, "model.layers.0.self_attn.k_proj.weight", {64, 64}, DType::f32);
  expect_error(r,
               {"tensor 'model.layers.0.self_attn.k_proj.weight' in " + file +
                " has shape [32, 64] but the config implies [64, 64]"},
               StatusCode::invalid_argument);
  expect_error(load_tensor(*be, *ckpt, "model.norm.weight", {64, 1}, DType::f32), {"[64]", "[64, 1]"},
               StatusCode::invalid_argument);
  expect_error(load_tensor(*be, *ckpt, "model.norm.weight", {64}, DType::i32), {"'model.norm.weight'", "i32"},
               StatusCode::invalid_argument);

  TempDir tmp;
  TensorBuffer ids = host_empty({4}, DType::i64);
  for (int i = 0; i < 4; ++i) ids.ptr<int64_t>()[i] = i;
  ASSERT_TRUE(write_safetensors(tmp.file("model.safetensors"), {{"ids", ids}}, {}).ok());
  Result<SafetensorsCheckpoint> ints = SafetensorsCheckpoint::open(tmp.str());
  ASSERT_TRUE(ints.ok()) << ints.status().message();
  expect_error(load_tensor(*be, *ints, "ids", {4}, DType::f32),
               {"dtype mismatch", "'ids'", tmp.file("model.safetensors"), "i64"}, StatusCode::invalid_argument);
}

TEST(CheckpointErrors, ShardedIndexProblems) {
  TempDir tmp;
  json index = write_sharded(tmp.str());
  const std::string index_path = tmp.file("model.safetensors.index.json");

  fs::remove(tmp.file("model-00002-of-00002.safetensors"));
  expect_error(SafetensorsCheckpoint::open(tmp.str()),
               {index_path, "model-00002-of-00002.safetensors", tmp.file("model-00002-of-00002.safetensors"),
                "does not exist"},
               StatusCode::not_found);

  json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  wrong["weight_map"]["not.in.any.shard"] = "model-00001-of-00002.safetensors";
  for (auto& [k, v] : wrong["weight_map"].items()) v = "model-00001-of-00002.safetensors";
  write_json(index_path, wrong);
  expect_error(SafetensorsCheckpoint::open(tmp.str()), {index_path, "has no such tensor"},
               StatusCode::invalid_argument);

  write_bytes(index_path, "{\"weight_map\": {\"a\": ");
  expect_error(SafetensorsCheckpoint::open(tmp.str()), {index_path, "not valid JSON"}, StatusCode::invalid_argument);
  write_json(index_path, json{{"metadata", json::object()}});
  expect_error(SafetensorsCheckpoint::open(tmp.str()), {index_path, "weight_map"}, StatusCode::invalid_argument);
  write_json(index_path, json{{"weight_map", {{"a", 3}}}});
  expect_error(SafetensorsCheckpoint::open(tmp.str()), {index_path, "'a'"}, StatusCode::invalid_argument);
}

}  // namespace
}  // namespace kiln
