// Exact resume on the CPU: a run stopped by SIGTERM or SIGINT (Ctrl-C) at a random step, or killed
// with SIGKILL at a random moment, and continued with --resume auto ends bitwise equal to the run
// that was never interrupted — the final weights byte for byte, and every step's loss, grad norm and
// learning rate and every validation loss in metrics.jsonl — for each optimizer and LR schedule. A
// damaged or partial checkpoint, another model, a changed flag, or an old run in --output are clear
// errors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

// Rows of rule-following ids (learnable, so the losses move) for tiny-llama.
std::string training_jsonl(int rows, int length) {
  std::string s;
  for (int i = 0; i < rows; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < length; ++t) ids.push_back(3 + (i * 37 + (1 + i % 3) * t) % 380);
    s += nlohmann::json({{"input_ids", ids}}).dump() + "\n";
  }
  return s;
}

// metrics.jsonl without the wall-clock keys.
std::vector<nlohmann::json> metric_lines(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("tokens_per_s");
    j.erase("mfu");
    j.erase("memory_gib");
    out.push_back(j);
  }
  return out;
}

struct Fixture {
  TempDir tmp;
  std::string data, model;
  int steps = 12;
  Fixture() {
    data = tmp.file("train.jsonl", training_jsonl(21, 16));
    model = testdata_dir() + "/tiny-llama";
  }
  std::string args(const std::string& out, const std::string& extra) const {
    return "train --model " + model + " --data " + data + " --val-data " + data + " --output " + out +
           " --steps " + std::to_string(steps) +
           " --batch-size 2 --grad-accum 2 --shuffle --seed 9 --lr 0.003 --eval-every 4 --eval-rows 4 " + extra;
  }
};

void expect_same_run(const std::string& want, const std::string& got, const std::string& what) {
  EXPECT_EQ(read_file(want + "/model.safetensors"), read_file(got + "/model.safetensors")) << what << ": final weights differ";
  const std::vector<nlohmann::json> a = metric_lines(want), b = metric_lines(got);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << what << ": metrics line " << i;
}

// The steps of the checkpoint-<step>/ folders in a run folder, ascending.
std::vector<int> checkpoint_steps(const std::string& run_dir) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator(run_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) out.push_back(std::stoi(name.substr(11)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// SIGTERM (what schedulers send) and SIGINT (Ctrl-C) both stop a run between steps: one checkpoint
// of the step reached, no final model, exit 0.
class ResumeAfterSignal : public testing::TestWithParam<int> {};

TEST_P(ResumeAfterSignal, StopAtARandomStepThenResumeIsBitwiseEqual) {
  const int sig = GetParam();
  Fixture fx;
  // Steps well past the latest stop (10): a run must still be going when the signal arrives, even
  // on a loaded machine where the test reads its progress late.
  fx.steps = 30;
  std::mt19937 rng(sig == SIGTERM ? 20261201 : 20261202);
  const std::vector<std::string> optimizers = {"adamw --weight-decay 0.1 --clip-norm 1", "sgd --weight-decay 0.01",
                                               "muon --weight-decay 0.1 --muon-adjust-lr match_rms_adamw"};
  const std::vector<std::string> schedules = {"constant", "linear --warmup-steps 3", "cosine --warmup-steps 2 --min-lr-ratio 0.1",
                                              "wsd --warmup-steps 2 --decay-steps 4"};
  for (const std::string& opt : optimizers) {
    for (const std::string& sched : schedules) {
      const std::string extra = "--optimizer " + opt + " --lr-schedule " + sched;
      const std::string tag = std::to_string(&opt - optimizers.data()) + std::to_string(&sched - schedules.data());
      const std::string ref = fx.tmp.sub("ref" + tag), cut = fx.tmp.sub("cut" + tag);
      RunResult r = run_kiln(fx.args(ref, extra));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const int stop_at = 1 + static_cast<int>(rng() % 10);
      const std::string what = extra + ", " + strsignal(sig) + " after step " + std::to_string(stop_at);
      const int status = run_kiln_and_signal(fx.args(cut, extra), stop_at, sig, 0);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << what << ": status " << status;
      EXPECT_FALSE(fs::exists(cut + "/model.safetensors")) << what << ": a stopped run writes only its checkpoint";
      const std::vector<int> saved = checkpoint_steps(cut);
      ASSERT_EQ(saved.size(), 1u) << what;
      EXPECT_GE(saved[0], stop_at) << what;  // the signal came after that step's line
      EXPECT_LT(saved[0], fx.steps) << what;
      RunResult resumed = run_kiln(fx.args(cut, extra + " --resume auto"));
      ASSERT_EQ(resumed.exit_code, 0) << what << "\n" << resumed.output;
      EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
      expect_same_run(ref, cut, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Resume, ResumeAfterSignal, testing::Values(SIGTERM, SIGINT),
                         [](const testing::TestParamInfo<int>& info) { return info.param == SIGTERM ? "Sigterm" : "Sigint"; });

TEST(Resume, KillNineAtARandomMomentThenResumeIsBitwiseEqual) {
  Fixture fx;
  std::mt19937 rng(77);
  for (const std::string extra : {"--optimizer adamw --lr-schedule cosine --warmup-steps 2 --save-every 2 --keep-last 2",
                                   "--optimizer sgd --lr-schedule wsd --warmup-steps 1 --decay-steps 5 --save-every 3",
                                   "--optimizer muon --muon-momentum 0.9 --lr-schedule linear --save-every 2",
                                   "--optimizer adamw --clip-norm 1 --lr-schedule constant --warmup-steps 3 --save-every 3"}) {
    const std::string tag = std::to_string(rng() % 100000);
    const std::string ref = fx.tmp.sub("ref" + tag), cut = fx.tmp.sub("cut" + tag);
    RunResult r = run_kiln(fx.args(ref, extra));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const int after = 3 + static_cast<int>(rng() % 7);
    const int delay = static_cast<int>(rng() % 20000);
    const std::string what = std::string(extra) + ", SIGKILL " + std::to_string(delay) + " us after step " + std::to_string(after);
    const int status = run_kiln_and_signal(fx.args(cut, extra), after, SIGKILL, delay);
    ASSERT_TRUE(WIFSIGNALED(status) || WIFEXITED(status)) << what;
    RunResult resumed = run_kiln(fx.args(cut, std::string(extra) + " --resume auto"));
    ASSERT_EQ(resumed.exit_code, 0) << what << "\n" << resumed.output;
    expect_same_run(ref, cut, what);
    int checkpoints = 0;
    for (const auto& e : fs::directory_iterator(cut)) {
      EXPECT_EQ(e.path().filename().string().rfind(".checkpoint-", 0), std::string::npos) << "leftover " << e.path();
      checkpoints += e.path().filename().string().rfind("checkpoint-", 0) == 0;
    }
    if (std::string(extra).find("--keep-last 2") != std::string::npos) {
      EXPECT_EQ(checkpoints, 2);
    }
  }
}

// --recompute changes memory, not results: the same run with it is bitwise equal on the CPU, and a
// run may be resumed with it switched on.
TEST(Resume, RecomputeGivesTheSameRun) {
  Fixture fx;
  const std::string ref = fx.tmp.sub("ref"), rc = fx.tmp.sub("rc"), mixed = fx.tmp.sub("mixed");
  ASSERT_EQ(run_kiln(fx.args(ref, "")).exit_code, 0);
  RunResult r = run_kiln(fx.args(rc, "--recompute"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_run(ref, rc, "--recompute");
  const int status = run_kiln_and_signal(fx.args(mixed, ""), 5, SIGTERM, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(run_kiln(fx.args(mixed, "--recompute --resume auto")).exit_code, 0);
  expect_same_run(ref, mixed, "resumed with --recompute");
}

TEST(Resume, BadCheckpointsAndChangedRunsAreClearErrors) {
  Fixture fx;
  const std::string run = fx.tmp.sub("run"), extra = "--save-every 4";
  ASSERT_EQ(run_kiln(fx.args(run, extra)).exit_code, 0);
  ASSERT_TRUE(fs::exists(run + "/checkpoint-8/trainer_state.json"));
  auto expect_error = [&](const RunResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_FALSE(r.crashed);
    EXPECT_NE(r.output.find(needle), std::string::npos) << "wanted '" << needle << "' in:\n" << r.output;
  };
  // A fresh run into a directory holding checkpoints.
  expect_error(run_kiln(fx.args(run, extra)), "--resume auto");
  // Resuming a complete run changes nothing: no step, no new metrics line.
  const std::string metrics_before = read_file(run + "/metrics.jsonl");
  RunResult again = run_kiln(fx.args(run, extra + " --resume auto"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("already complete"), std::string::npos) << again.output;
  EXPECT_EQ(read_file(run + "/metrics.jsonl"), metrics_before);
  // A changed flag.
  std::string changed = fx.args(run, extra + " --resume " + run + "/checkpoint-8");
  changed.replace(changed.find("--batch-size 2"), 14, "--batch-size 3");
  expect_error(run_kiln(changed), "--batch-size was 2 and is now 3");
  // The same path with other content.
  {
    const std::string saved = read_file(fx.data);
    std::ofstream(fx.data, std::ios::binary) << training_jsonl(21, 17);
    expect_error(run_kiln(fx.args(run, extra + " --resume " + run + "/checkpoint-8")), "the training data changed");
    std::ofstream(fx.data, std::ios::binary) << saved;
  }
  // Another model.
  RunResult other = run_kiln("train --model " + testdata_dir() + "/tiny-qwen2 --data " + fx.data + " --output " +
                             fx.tmp.sub("o") + " --resume " + run + "/checkpoint-8");
  expect_error(other, "different model");
  // A flipped byte in an optimizer state, then a missing file.
  const std::string state = run + "/checkpoint-8/optimizer/adamw.exp_avg.safetensors";
  std::string bytes = read_file(state);
  bytes[bytes.size() - 5] ^= 0x40;
  std::ofstream(state, std::ios::binary) << bytes;
  expect_error(run_kiln(fx.args(run, extra + " --resume " + run + "/checkpoint-8")), "fails its CRC-32 check");
  fs::remove(state);
  expect_error(run_kiln(fx.args(run, extra + " --resume " + run + "/checkpoint-8")), "is incomplete");
  expect_error(run_kiln(fx.args(run, extra + " --resume " + fx.tmp.sub("nowhere"))), "not a directory");
  // A checkpoint is a Hugging Face model folder too.
  RunResult gen = run_kiln("generate --model " + run + "/checkpoint-4 --prompt-ids 5,6,7 --max-tokens 3");
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
}

}  // namespace
}  // namespace kiln::test
