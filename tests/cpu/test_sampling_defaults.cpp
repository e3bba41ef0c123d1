// The model's recommended sampling from generation_config.json (infer/sampling_defaults.h): what
// the loader reads and refuses, and that kiln generate (one prompt and --requests) samples with it
// where the command line or the request line gives nothing, unless --generation-config none.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "infer/sampling_defaults.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

TEST(SamplingDefaults, ReadsTheRecommendedFields) {
  TempDir tmp;
  Result<SamplingDefaults> none = load_sampling_defaults(tmp.path.string());  // no file
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_TRUE(none->empty());

  tmp.file("generation_config.json",
           R"({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": null,
               "repetition_penalty": 1.05, "max_new_tokens": 2048, "eos_token_id": [1, 2]})");
  Result<SamplingDefaults> d = load_sampling_defaults(tmp.path.string());
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->temperature, 0.6f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_EQ(d->top_p, 0.95f);
  EXPECT_FALSE(d->min_p.has_value());
  EXPECT_EQ(d->repetition_penalty, 1.05f);
  EXPECT_EQ(d->max_tokens, 2048);
  EXPECT_NE(d->source.find("generation_config.json"), std::string::npos);
  EXPECT_EQ(d->describe(), "temperature 0.6, top_k 20, top_p 0.95, repetition_penalty 1.05, max_tokens 2048");
  GenerationRequest r;
  r.max_tokens = 5;
  d->apply(&r);
  EXPECT_EQ(r.temperature, 0.6f);
  EXPECT_EQ(r.top_k, 20);
  EXPECT_EQ(r.top_p, 0.95f);
  EXPECT_EQ(r.min_p, 0.0f);
  EXPECT_EQ(r.repetition_penalty, 1.05f);
  EXPECT_EQ(r.max_tokens, 5);  // each caller bounds its own length

  tmp.file("generation_config.json", R"({"eos_token_id": 2, "pad_token_id": 0})");
  Result<SamplingDefaults> ids_only = load_sampling_defaults(tmp.path.string());
  ASSERT_TRUE(ids_only.ok());
  EXPECT_TRUE(ids_only->empty());
  EXPECT_TRUE(ids_only->source.empty());
}

TEST(SamplingDefaults, BadValuesAreErrorsNamingTheField) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"temperature": "hot"})", "'temperature'"},  {R"({"temperature": -1})", "'temperature'"},
      {R"({"top_p": 0})", "'top_p'"},                   {R"({"top_p": 1.5})", "'top_p'"},
      {R"({"top_k": -1})", "'top_k'"},                  {R"({"top_k": 2.5})", "'top_k'"},
      {R"({"min_p": 2})", "'min_p'"},                   {R"({"repetition_penalty": 0})", "'repetition_penalty'"},
      {R"({"max_new_tokens": 0})", "'max_new_tokens'"}, {R"({"max_new_tokens": 4294967296})", "'max_new_tokens'"},
      {R"([1, 2])", "JSON object"},                     {"{not json", "JSON object"}};
  for (const auto& [text, part] : cases) {
    tmp.file("generation_config.json", text);
    Result<SamplingDefaults> d = load_sampling_defaults(tmp.path.string());
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_NE(d.status().message().find(part), std::string::npos) << d.status().message();
    EXPECT_NE(d.status().message().find("generation_config.json"), std::string::npos) << d.status().message();
  }
}

// tiny-llama with a generation_config.json that recommends a strong repetition penalty: greedy
// decoding then avoids the tokens it has seen, which changes the continuation.
class SamplingDefaultsCli : public testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(model_);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(testdata_dir() + "/tiny-llama/" + f, model_ / f);
  }
  std::string write_config(const std::string& text) const {
    return tmp_.file("m/generation_config.json", text);
  }
  std::vector<int32_t> generate(const std::string& extra) const {
    RunResult r = run_kiln("generate --model " + model_.string() + " --prompt-ids 5,6,7,8 --max-tokens 12 --ignore-eos" + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    if (r.exit_code != 0) return {};
    return nlohmann::json::parse(r.stdout_only)["ids"].get<std::vector<int32_t>>();
  }
  TempDir tmp_;
  fs::path model_ = tmp_.path / "m";
};

TEST_F(SamplingDefaultsCli, GenerateUsesTheModelsRecommendation) {
  const std::vector<int32_t> plain = generate("");
  write_config(R"({"repetition_penalty": 50.0, "temperature": 0.0, "eos_token_id": 2})");
  const std::vector<int32_t> penalised = generate("");
  ASSERT_EQ(plain.size(), 12u);
  ASSERT_EQ(penalised.size(), 12u);
  EXPECT_NE(penalised, plain) << "the penalty should change this greedy continuation";
  EXPECT_EQ(generate(" --generation-config none"), plain);
  RunResult info = run_kiln("info --json --model " + model_.string());
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_EQ(nlohmann::json::parse(info.stdout_only)["sampling_defaults"],
            nlohmann::json::parse(R"({"temperature": 0.0, "repetition_penalty": 50.0})"));

  // --requests: a line without the field takes the model's; a line with it keeps its own.
  const std::string file = tmp_.file("requests.jsonl",
      "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 12, \"ignore_eos\": true}\n"
      "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 12, \"ignore_eos\": true, \"repetition_penalty\": 1.0}\n");
  RunResult r = run_kiln("generate --model " + model_.string() + " --requests " + file);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sampling defaults from"), std::string::npos) << r.output;
  std::vector<nlohmann::json> lines;
  for (size_t at = 0, end; (end = r.stdout_only.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(nlohmann::json::parse(r.stdout_only.substr(at, end - at)));
  ASSERT_EQ(lines.size(), 2u) << r.stdout_only;
  EXPECT_EQ(lines[0]["ids"].get<std::vector<int32_t>>(), penalised);
  EXPECT_EQ(lines[1]["ids"].get<std::vector<int32_t>>(), plain);
}

TEST_F(SamplingDefaultsCli, BadFileIsAClearErrorUnlessTurnedOff) {
  write_config(R"({"temperature": "hot"})");
  RunResult r = run_kiln("generate --model " + model_.string() + " --prompt-ids 5,6 --max-tokens 2");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.crashed);
  EXPECT_NE(r.output.find("'temperature'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--generation-config none"), std::string::npos) << r.output;
  EXPECT_EQ(generate(" --generation-config none").size(), 12u);
  RunResult info = run_kiln("info --model " + model_.string());  // kiln info reports it and runs on
  EXPECT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("'temperature'"), std::string::npos) << info.output;
}

}  // namespace
}  // namespace kiln::test
