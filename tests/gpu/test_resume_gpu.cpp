// Resume on CUDA: a kiln train run stopped by SIGTERM and continued with --resume auto follows the
// uninterrupted run's loss curve within 1e-3 (bf16 compute; the restored state is exact, the
// kernels' reductions need not be bitwise reproducible across processes), ends at the same policy
// version, and its final weights agree to bf16 rounding.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

std::vector<nlohmann::json> step_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j);
  }
  return out;
}

TEST(ResumeGpu, SigtermThenResumeFollowsTheLossCurve) {
  std::string reason;
  if (!gpu_backend_or_null(&reason)) GTEST_SKIP() << reason;
  const fs::path tmp = fs::temp_directory_path() / ("kiln_resume_gpu_" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  std::string data;
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 32; ++t) ids.push_back(3 + (i * 37 + (1 + i % 3) * t) % 380);
    data += nlohmann::json({{"input_ids", ids}}).dump() + "\n";
  }
  std::ofstream((tmp / "d.jsonl").string()) << data;
  const std::string args = "train --model " + testdata_dir() + "/tiny-llama --data " + (tmp / "d.jsonl").string() +
                           " --device cuda --steps 30 --batch-size 4 --shuffle --lr 0.003 --lr-schedule cosine "
                           "--warmup-steps 3 --save-every 5 --output ";
  RunResult ref = run_kiln(args + (tmp / "ref").string());
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const int status = run_kiln_and_signal(args + (tmp / "cut").string(), 13, SIGTERM, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  RunResult resumed = run_kiln(args + (tmp / "cut").string() + " --resume auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<nlohmann::json> a = step_lines((tmp / "ref").string()), b = step_lines((tmp / "cut").string());
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["policy_version"], b[i]["policy_version"]);
    EXPECT_EQ(a[i]["lr"], b[i]["lr"]);
    worst = std::max(worst, std::abs(a[i]["loss"].get<double>() - b[i]["loss"].get<double>()));
  }
  EXPECT_LT(worst, 1e-3) << "largest loss difference " << worst;
  std::printf("resume on CUDA: largest loss difference over 30 steps %.3g\n", worst);
  Result<SafetensorsFile> wa = SafetensorsFile::open((tmp / "ref" / "model.safetensors").string());
  Result<SafetensorsFile> wb = SafetensorsFile::open((tmp / "cut" / "model.safetensors").string());
  ASSERT_TRUE(wa.ok() && wb.ok());
  for (const std::string& name : wa->names()) {
    Result<TensorInfo> x = wa->find(name), y = wb->find(name);
    ASSERT_TRUE(x.ok() && y.ok()) << name;
    const float* p = static_cast<const float*>(x->data);
    const float* q = static_cast<const float*>(y->data);
    double num = 0, den = 0;
    for (int64_t i = 0; i < x->shape.numel(); ++i) {
      num += (p[i] - q[i]) * (p[i] - q[i]);
      den += p[i] * p[i];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-2) << name;
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace kiln::test
