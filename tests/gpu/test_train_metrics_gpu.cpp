// kiln train --device cuda reports MFU and memory: every step line of metrics.jsonl carries `mfu`
// (the model FLOPs of the step over its time and --peak-tflops, against the same count made here
// from the checkpoint's tensors: 6 FLOPs per weight of the layers' matrices and the head per token,
// plus the causal attention products) and `memory_gib` (the caching allocator's peak: at least the
// parameters, gradients, bf16 copy and AdamW moments, below the device's memory, never falling), and
// the progress line on stdout shows both. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "test_util.h"

namespace kiln::test {
namespace {

TEST(TrainMetricsGpu, EveryStepLogsMfuAndMemoryWithinTheDevice) {
  KILN_REQUIRE_GPU(be);
  Result<std::pair<int64_t, int64_t>> device_memory = be->memory_info();
  ASSERT_TRUE(device_memory.ok()) << device_memory.status().message();
  const double device_bytes = static_cast<double>(device_memory->second);

  constexpr int kRows = 16, kLen = 32, kBatch = 4, kSteps = 4;
  constexpr double kPeakTflops = 989.0;
  TempDir tmp;
  std::string data;
  for (int i = 0; i < kRows; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < kLen; ++t) ids.push_back(3 + (i * 37 + (1 + i % 3) * t) % 380);
    data += nlohmann::json({{"input_ids", ids}}).dump() + "\n";
  }
  const std::string model = testdata_dir() + "/tiny-llama", run = tmp.sub("run");
  RunResult r = run_kiln("train --model " + model + " --data " + tmp.file("d.jsonl", data) + " --output " + run +
                         " --device cuda --steps " + std::to_string(kSteps) + " --batch-size " + std::to_string(kBatch) +
                         " --lr 0.003 --peak-tflops " + std::to_string(kPeakTflops));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The model's size from its files: parameters, and the weights multiplied per token.
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(model + "/config.json"));
  Result<SafetensorsFile> weights = SafetensorsFile::open(model + "/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  double parameters = 0, layer_matrices = 0;
  for (const std::string& name : weights->names()) {
    Result<TensorInfo> t = weights->find(name);
    ASSERT_TRUE(t.ok()) << name;
    parameters += static_cast<double>(t->shape.numel());
    if (name.rfind("model.layers.", 0) == 0 && t->shape.ndim == 2) layer_matrices += static_cast<double>(t->shape.numel());
  }
  const double hidden = config["hidden_size"], vocab = config["vocab_size"], layers = config["num_hidden_layers"];
  const double q_width = config["num_attention_heads"].get<double>() * config["head_dim"].get<double>();
  // One step: kBatch rows of kLen tokens, each token attending to itself and those before it.
  const double tokens = kBatch * kLen;
  const double step_flops = 6.0 * (layer_matrices + hidden * vocab) * tokens +
                            6.0 * 2.0 * q_width * layers * kBatch * (kLen * (kLen + 1) / 2.0);
  // Master weights, gradients and both AdamW moments in f32, the compute copy in bf16.
  const double least_bytes = parameters * (4 + 4 + 4 + 4 + 2);

  std::ifstream metrics(run + "/metrics.jsonl");
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(metrics, line);) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  double previous_memory = 0;
  for (const nlohmann::json& j : steps) {
    const std::string row = j.dump();
    ASSERT_TRUE(j.contains("mfu") && j["mfu"].is_number()) << row;
    ASSERT_TRUE(j.contains("memory_gib") && j["memory_gib"].is_number()) << row;
    EXPECT_EQ(j["tokens"].get<double>(), tokens) << row;
    const double mfu = j["mfu"], memory = j["memory_gib"].get<double>() * 1024.0 * 1024.0 * 1024.0;
    EXPECT_GT(mfu, 0.0) << row;
    EXPECT_LT(mfu, 1.0) << row;
    // tokens_per_s is tokens over the same step time the MFU divides by.
    const double want_mfu = step_flops * j["tokens_per_s"].get<double>() / tokens / (kPeakTflops * 1e12);
    EXPECT_NEAR(mfu, want_mfu, 1e-6 * want_mfu) << row;
    EXPECT_GE(memory, least_bytes) << row;
    EXPECT_LT(memory, device_bytes) << row;
    EXPECT_GE(memory, previous_memory) << "a peak never falls: " << row;
    previous_memory = memory;
  }

  // The progress lines show the same figures, rounded.
  std::regex line(R"(step (\d+)/\d+ .* mfu ([0-9.]+) mem ([0-9.]+)GiB)");
  int shown = 0;
  for (std::sregex_iterator it(r.stdout_only.begin(), r.stdout_only.end(), line), end; it != end; ++it, ++shown) {
    const int step = std::stoi((*it)[1]);
    ASSERT_TRUE(step >= 1 && step <= kSteps) << (*it)[0];
    char want[32];
    std::snprintf(want, sizeof want, "%.3f", steps[static_cast<size_t>(step - 1)]["mfu"].get<double>());
    EXPECT_EQ((*it)[2].str(), want) << (*it)[0];
    std::snprintf(want, sizeof want, "%.2f", steps[static_cast<size_t>(step - 1)]["memory_gib"].get<double>());
    EXPECT_EQ((*it)[3].str(), want) << (*it)[0];
  }
  EXPECT_EQ(shown, kSteps) << r.stdout_only;
}

}  // namespace
}  // namespace kiln::test
