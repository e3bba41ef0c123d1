// Data-parallel kiln train on CPU ranks under mpirun (backend/collectives.h, train/run.h): the same
// global batch gives the same per-step losses (AdamW and SGD) and final weights (SGD) on 1, 2 and 3
// ranks, with the optimizer state replicated or sharded (--zero 0, 1, 2), within 1e-6 relative:
// only the order of the gradient sums differs. (AdamW's weights are not
// compared at that bound: its first steps move each weight by about lr * sign(gradient), so a
// gradient within rounding of zero, summed in another order, moves its weight differently; single
// elements then differ by up to ~1e-6 absolute at lr 1e-3.) A checkpoint written by 2 ranks resumes
// on 1 and on 3 ranks and ends where the uninterrupted run does, also from and into sharded AdamW
// state (resharding: its moments are compared piece by piece); a rank that dies or stalls ends
// the run with an error instead of a hang. Skipped where mpirun is missing or kiln was built
// without MPI.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/collectives.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
    const Shell probe = shell(mpirun(2) + kiln_binary() + " train --model " + testdata_dir() +
                              "/tiny-llama --data /nonexistent.jsonl --output " + tmp_.sub("probe"));
    if (probe.output.find("built without MPI") != std::string::npos) GTEST_SKIP() << "kiln was built without MPI";
    std::mt19937 rng(5);
    std::string lines;
    for (int i = 0; i < 36; ++i) {
      const int n = 5 + static_cast<int>(rng() % 36);
      std::string ids;
      for (int t = 0; t < n; ++t) ids += (t ? ", " : "") + std::to_string(3 + rng() % 378);
      lines += "{\"input_ids\": [" + ids + "]}\n";
    }
    data_ = tmp_.file("data.jsonl", lines);
  }
  // `kiln train` on `ranks` processes (1: no mpirun) into `out`; AdamW unless `extra` says otherwise.
  Shell train(int ranks, const std::string& out, const std::string& extra = "") {
    const std::string cmd = kiln_binary() + " train --model " + testdata_dir() + "/tiny-llama --data " + data_ +
                            " --output " + out + " --batch-size 6 --grad-accum 2 --steps 4 --shuffle --seed 3 " +
                            "--clip-norm 1.0 " + extra;
    return shell(ranks == 1 ? "OPENBLAS_NUM_THREADS=1 " + cmd : mpirun(ranks) + cmd);
  }
  static std::vector<double> losses(const std::string& out) {
    std::vector<double> v;
    std::ifstream in(out + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) v.push_back(j["loss"].get<double>());
    }
    return v;
  }
  // Every tensor of two trained models within `tol` relative (L2 over the tensor).
  static void expect_same_weights(const std::string& a, const std::string& b, double tol) {
    Result<SafetensorsFile> fa = SafetensorsFile::open(a + "/model.safetensors");
    Result<SafetensorsFile> fb = SafetensorsFile::open(b + "/model.safetensors");
    ASSERT_TRUE(fa.ok() && fb.ok()) << a << " " << b;
    ASSERT_EQ(fa->names(), fb->names());
    for (const std::string& name : fa->names()) {
      const TensorInfo ta = *fa->find(name), tb = *fb->find(name);
      ASSERT_EQ(ta.dtype, DType::f32);
      std::vector<float> va(static_cast<size_t>(ta.shape.numel())), vb(va.size());
      std::memcpy(va.data(), ta.data, va.size() * 4);
      std::memcpy(vb.data(), tb.data, vb.size() * 4);
      EXPECT_LE(rel_error(va, vb), tol) << name << " of " << a << " against " << b;
    }
  }
  static nlohmann::json state_json(const std::string& checkpoint) {
    std::ifstream in(checkpoint + "/trainer_state.json");
    return nlohmann::json::parse(in);
  }
  // A checkpoint's optimizer state `name`, assembled from the pieces its manifest lists.
  static std::vector<float> optimizer_state(const std::string& checkpoint, const std::string& name) {
    const nlohmann::json j = state_json(checkpoint);
    std::vector<float> out;
    for (const nlohmann::json& p : j["optimizer_pieces"]) {
      if (p["state"] != name) continue;
      out.resize(static_cast<size_t>(p["space"].get<int64_t>()));
      Result<SafetensorsFile> f = SafetensorsFile::open(checkpoint + "/" + p["file"].get<std::string>());
      EXPECT_TRUE(f.ok()) << p.dump();
      if (!f.ok()) return {};
      const TensorInfo t = *f->find(name);
      EXPECT_EQ(t.shape.numel(), p["end"].get<int64_t>() - p["begin"].get<int64_t>());
      std::memcpy(out.data() + p["begin"].get<int64_t>(), t.data, static_cast<size_t>(t.shape.numel()) * 4);
    }
    return out;
  }
  // Starts a 2-rank run of `steps` steps into `out`, sends `signal` to one rank once the run has
  // written its first metrics, and waits for mpirun; also returns the seconds it took.
  Shell disturb_a_rank(const std::string& out, const char* signal, double timeout, double* seconds) {
    const std::string cmd = kiln_binary() + " train --model " + testdata_dir() + "/tiny-llama --data " + data_ +
                            " --output " + out + " --batch-size 2 --steps 3000 --collective-timeout " +
                            std::to_string(static_cast<int>(timeout));
    const auto t0 = std::chrono::steady_clock::now();
    Shell r = shell("(" + mpirun(2) + cmd + ") & pid=$!; "
                    "for i in $(seq 100); do [ -s " + out + "/metrics.jsonl ] && break; sleep 0.1; done; "
                    "kill -" + signal + " $(pgrep -f '^" + kiln_binary() + " train .*--output " + out + " ' | tail -1); wait $pid");
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    shell("pkill -9 -f -- '--output " + out + "'");  // whatever is left
    return r;
  }
  TempDir tmp_;
  std::string data_;
};

TEST_F(DataParallel, RanksGiveTheLossesAndWeightsOfOneProcess) {
  for (const std::string optimizer : {"adamw", "sgd"}) {
    const std::string flags = "--optimizer " + optimizer + (optimizer == "sgd" ? " --lr 5e-2" : " --lr 1e-3");
    const std::string one = tmp_.sub("one-" + optimizer);
    Shell r1 = train(1, one, flags);
    ASSERT_EQ(r1.code, 0) << r1.output;
    const std::vector<double> want = losses(one);
    ASSERT_EQ(want.size(), 4u);
    for (int zero : {0, 1, 2}) {
      for (int ranks : {2, 3}) {
        const std::string what = optimizer + ", --zero " + std::to_string(zero) + ", " + std::to_string(ranks) + " ranks";
        const std::string out = tmp_.sub(optimizer + std::to_string(zero) + std::to_string(ranks));
        Shell r = train(ranks, out, flags + " --zero " + std::to_string(zero));
        ASSERT_EQ(r.code, 0) << what << "\n" << r.output;
        EXPECT_NE(r.output.find("data parallel over " + std::to_string(ranks) + " ranks (mpi)"), std::string::npos) << r.output;
        const std::vector<double> got = losses(out);
        ASSERT_EQ(got.size(), want.size()) << what;
        for (size_t s = 0; s < want.size(); ++s)
          EXPECT_NEAR(got[s], want[s], 1e-6 * std::fabs(want[s])) << what << ", step " << s + 1;
        if (optimizer == "sgd") expect_same_weights(out, one, 1e-6);
      }
    }
  }
}

TEST_F(DataParallel, ShardedAdamWStateResumesOnOtherRankCounts) {
  // 2 ranks, --zero 1: each rank saves its half of each moment, and the manifest says which.
  const std::string whole = tmp_.sub("sharded");
  const std::string flags = "--optimizer adamw --lr 1e-3 --save-every 2";
  Shell r = train(2, whole, flags + " --zero 1");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json manifest = state_json(whole + "/checkpoint-2");
  ASSERT_EQ(manifest["optimizer_pieces"].size(), 4u) << manifest.dump();  // 2 moments x 2 ranks
  const int64_t space = manifest["optimizer_pieces"][0]["space"].get<int64_t>();
  EXPECT_EQ(manifest["optimizer_pieces"][0]["end"].get<int64_t>(), space / 2);
  EXPECT_EQ(manifest["optimizer_pieces"][1]["begin"].get<int64_t>(), space / 2);
  EXPECT_TRUE(fs::exists(whole + "/checkpoint-2/optimizer/adamw.exp_avg.rank-1-of-2.safetensors"));
  // Resumed on 1 rank (state replicated), 3 ranks (sharded in thirds) and 3 ranks with --zero 2:
  // the same losses and, after the last step, the same moments as the uninterrupted run.
  for (const auto& [ranks, zero] : std::vector<std::pair<int, int>>{{1, 0}, {3, 1}, {3, 2}}) {
    const std::string what = std::to_string(ranks) + " ranks, --zero " + std::to_string(zero);
    const std::string out = tmp_.sub("resharded" + std::to_string(ranks) + std::to_string(zero));
    Shell resumed = train(ranks, out, flags + " --zero " + std::to_string(zero) + " --resume " + whole + "/checkpoint-2");
    ASSERT_EQ(resumed.code, 0) << what << "\n" << resumed.output;
    const std::vector<double> got = losses(out), want = losses(whole);
    ASSERT_EQ(got.size(), 2u) << what;
    for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(got[s], want[s + 2], 1e-6 * std::fabs(want[s + 2])) << what;
    for (const char* state : {"adamw.exp_avg", "adamw.exp_avg_sq"}) {
      const std::vector<float> a = optimizer_state(whole + "/checkpoint-4", state), b = optimizer_state(out + "/checkpoint-4", state);
      ASSERT_FALSE(a.empty());
      const size_t n = std::min(a.size(), b.size());  // past n: padding of the larger rank count
      EXPECT_LE(rel_error(std::vector<float>(a.begin(), a.begin() + n), std::vector<float>(b.begin(), b.begin() + n)), 1e-6)
          << state << ", " << what;
      for (size_t i = n; i < b.size(); ++i) ASSERT_EQ(b[i], 0.0f) << "padding of " << state;
    }
  }
  // Muon's whole-matrix update is not sharded: a clear error.
  Shell muon = train(2, tmp_.sub("muon"), "--optimizer muon --zero 1");
  EXPECT_NE(muon.code, 0);
  EXPECT_NE(muon.output.find("use --zero 0 with --optimizer muon"), std::string::npos) << muon.output;
}

TEST_F(DataParallel, ACheckpointOfTwoRanksResumesOnOneAndThree) {
  const std::string whole = tmp_.sub("whole");
  Shell r = train(2, whole, "--optimizer sgd --lr 5e-2 --save-every 2");
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(fs::exists(whole + "/checkpoint-2")) << r.output;
  for (int ranks : {1, 3}) {
    const std::string out = tmp_.sub("resumed" + std::to_string(ranks));
    Shell resumed = train(ranks, out, "--optimizer sgd --lr 5e-2 --save-every 2 --resume " + whole + "/checkpoint-2");
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
    const std::vector<double> got = losses(out), want = losses(whole);
    ASSERT_EQ(got.size(), 2u);  // steps 3 and 4
    for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(got[s], want[s + 2], 1e-6 * std::fabs(want[s + 2])) << ranks << " ranks";
    expect_same_weights(out, whole, 1e-6);
  }
}

TEST_F(DataParallel, BatchMustSplitEvenlyAndErrorsNameTheRank) {
  Shell r = shell(mpirun(2) + kiln_binary() + " train --model " + testdata_dir() + "/tiny-llama --data " + data_ +
                  " --output " + tmp_.sub("odd") + " --batch-size 3 --steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("must be a multiple of the 2 ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank "), std::string::npos) << r.output;
}

TEST_F(DataParallel, AStalledRankEndsTheRunWithinTheTimeout) {
  // Rank 1 is stopped (SIGSTOP) once training runs: rank 0 waits in its next collective, gives up
  // after --collective-timeout and ends the run with a message naming itself and the collective.
  const std::string out = tmp_.sub("stalled");
  double seconds = 0;
  Shell r = disturb_a_rank(out, "STOP", 3, &seconds);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("did not complete within 3 s"), std::string::npos) << r.output;
}

TEST_F(DataParallel, AKilledRankEndsTheRun) {
  const std::string out = tmp_.sub("killed");
  double seconds = 0;
  Shell r = disturb_a_rank(out, "9", 5, &seconds);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(seconds, 60.0) << r.output;
  EXPECT_FALSE(fs::exists(out + "/model.safetensors")) << "a run that lost a rank must not write a final model";
}

TEST(World, FromTheLaunchersEnvironment) {
  auto with_env = [](std::vector<std::pair<const char*, const char*>> vars) {
    for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "RANK", "WORLD_SIZE",
                          "LOCAL_RANK"})
      unsetenv(k);
    for (const auto& [k, v] : vars) setenv(k, v, 1);
    Result<WorldInfo> w = world_from_environment();
    for (const auto& [k, v] : vars) unsetenv(k);
    return w;
  };
  Result<WorldInfo> none = with_env({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->size, 1);
  EXPECT_EQ(none->launcher, "none");
  Result<WorldInfo> ompi = with_env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                     {"RANK", "9"}, {"WORLD_SIZE", "10"}});
  ASSERT_TRUE(ompi.ok());
  EXPECT_EQ(ompi->rank, 2);  // OpenMPI's variables win
  EXPECT_EQ(ompi->size, 4);
  EXPECT_EQ(ompi->launcher, "openmpi");
  Result<WorldInfo> env = with_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->launcher, "env");
  for (auto bad : {std::vector<std::pair<const char*, const char*>>{{"RANK", "2"}, {"WORLD_SIZE", "2"}},
                   {{"RANK", "x"}, {"WORLD_SIZE", "2"}}, {{"RANK", "0"}}, {{"WORLD_SIZE", "-1"}, {"RANK", "0"}}}) {
    Result<WorldInfo> w = with_env(bad);
    EXPECT_FALSE(w.ok()) << bad[0].first << "=" << bad[0].second;
  }
  std::unique_ptr<Collectives> one = make_single_process_collectives();
  double v[2] = {1.5, 2.5};
  EXPECT_TRUE(one->sum(v, 2).ok());
  EXPECT_EQ(v[0], 1.5);  // one process: the identity
}

}  // namespace
}  // namespace kiln::test
