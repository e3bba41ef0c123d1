// YaRN RoPE against transformers: the inverse frequencies and attention factor of every case in
// testdata/rope/cases.json (made by tests/reference/make_rope_fixtures.py from transformers'
// ROPE_INIT_FUNCTIONS), the context YaRN extends, and clear errors for bad YaRN keys.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model_loading_test.h"

namespace kiln::test {
namespace {

using nlohmann::json;

json load_cases() {
  std::ifstream in(testdata_dir() + "/rope/cases.json");
  EXPECT_TRUE(in.good()) << "testdata/rope/cases.json is missing";
  return json::parse(in);
}

TEST(RopeScaling, MatchesTransformersOnEveryCase) {
  const json cases = load_cases()["cases"];
  ASSERT_GE(cases.size(), 10u);
  for (const json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Result<ModelConfig> m = parse_model_config(c["config"], "cases.json");
    ASSERT_TRUE(m.ok()) << m.status().message();
    RopeTables t = compute_rope_inv_freq(m->rope, m->head_dim);
    const std::vector<double> want = c["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(t.inv_freq.size(), want.size());
    // Bit for bit but for pow: powf and torch's vectorised pow may differ by an ulp, and the
    // interpolated frequency divides by a product of it.
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LE(ulp_diff(t.inv_freq[i], static_cast<float>(want[i])), 1)
          << "inv_freq[" << i << "] = " << t.inv_freq[i] << ", want " << want[i];
    EXPECT_EQ(t.attention_scaling, static_cast<float>(c["attention_factor"].get<double>()));
  }
}

// The cases span the correction range's edges: extrapolated (ramp 0), interpolated (ramp 1) and
// blended dimensions must all occur, or the comparison above proves less than it seems.
TEST(RopeScaling, CasesCoverEveryBand) {
  int extrapolated = 0, interpolated = 0, blended = 0;
  const json cases = load_cases()["cases"];
  for (const json& c : cases) {
    Result<ModelConfig> m = parse_model_config(c["config"], "cases.json");
    ASSERT_TRUE(m.ok()) << m.status().message();
    if (m->rope.type != "yarn") continue;
    RopeConfig plain;
    plain.theta = m->rope.theta;
    const RopeTables base = compute_rope_inv_freq(plain, m->head_dim);
    const RopeTables yarn = compute_rope_inv_freq(m->rope, m->head_dim);
    for (size_t i = 0; i < base.inv_freq.size(); ++i) {
      const double ratio = static_cast<double>(yarn.inv_freq[i]) / base.inv_freq[i];
      if (ratio == 1.0) ++extrapolated;
      else if (std::fabs(ratio * m->rope.factor - 1.0) < 1e-6) ++interpolated;
      else ++blended;
    }
  }
  EXPECT_GT(extrapolated, 0);
  EXPECT_GT(interpolated, 0);
  EXPECT_GT(blended, 0);
}

json qwen3_yarn() {
  const json cases = load_cases()["cases"];
  for (const json& c : cases)
    if (c["name"].get<std::string>().rfind("qwen3 recommended", 0) == 0) return c["config"];
  ADD_FAILURE() << "no qwen3 case";
  return json::object();
}

TEST(RopeScaling, YarnExtendsTheContext) {
  // Qwen's recommended long-context setting: max_position_embeddings 40960, yarn over 32768 x 4.
  Result<ModelConfig> q = parse_model_config(qwen3_yarn(), "config.json");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->max_position_embeddings, 40960);
  EXPECT_EQ(q->context_length(), 131072);
  EXPECT_NE(std::string(q->context_length_source()).find("YaRN"), std::string::npos);

  json longer = qwen3_yarn();  // max_position_embeddings already past the product: it stands
  longer["max_position_embeddings"] = 262144;
  Result<ModelConfig> l = parse_model_config(longer, "config.json");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->context_length(), 262144);
  EXPECT_EQ(std::string(l->context_length_source()), "max_position_embeddings");

  Result<ModelConfig> tiny = load_model_config(testdata_dir() + "/tiny-qwen3-yarn");
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  EXPECT_EQ(tiny->context_length(), 256);

  // Other rope types keep max_position_embeddings.
  Result<ModelConfig> llama = load_model_config(kTinyLlama);
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->context_length(), llama->max_position_embeddings);
}

TEST(RopeScaling, BadYarnKeysAreErrors) {
  struct Case {
    const char* key;
    json value;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"factor", "4", {"'rope_scaling.factor'", "number"}},
      {"factor", -2.0, {"'rope_scaling.factor'", "within"}},
      {"attention_factor", 0.0, {"'rope_scaling.attention_factor'", "within"}},
      {"beta_fast", -1.0, {"beta_fast", "positive"}},
      {"beta_slow", "1", {"'rope_scaling.beta_slow'", "number"}},
      {"truncate", 1, {"'rope_scaling.truncate'", "true or false"}},
      {"mscale", "x", {"'rope_scaling.mscale'", "number"}},
      {"original_max_position_embeddings", 0, {"original_max_position_embeddings", "within"}},
      {"original_max_position_embeddings", 1e3, {"original_max_position_embeddings", "integer"}},
  };
  for (const Case& c : cases) {
    json j = qwen3_yarn();
    j["rope_scaling"][c.key] = c.value;
    SCOPED_TRACE(j["rope_scaling"].dump());
    Result<ModelConfig> r = parse_model_config(j, "config.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << r.status().message();
    for (const std::string& p : c.parts)
      EXPECT_NE(r.status().message().find(p), std::string::npos) << "'" << p << "' not in: " << r.status().message();
  }

  json low_theta = qwen3_yarn();
  low_theta["rope_theta"] = 1.0;
  expect_error(parse_model_config(low_theta, "config.json"), {"YaRN", "rope_theta"}, StatusCode::invalid_argument);

  json huge = qwen3_yarn();  // 32768 x 1024 tokens is past what kiln runs
  huge["rope_scaling"]["factor"] = 1024.0;
  expect_error(parse_model_config(huge, "config.json"), {"YaRN", "16777216"}, StatusCode::invalid_argument);

  json dynamic = qwen3_yarn();
  dynamic["rope_scaling"]["type"] = "dynamic";
  expect_error(parse_model_config(dynamic, "config.json"), {"dynamic", "yarn"}, StatusCode::unsupported);
}

}  // namespace
}  // namespace kiln::test
