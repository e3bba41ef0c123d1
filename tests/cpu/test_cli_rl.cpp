// kiln rl and kiln demo end to end on the CPU: the demo reaches its accuracy; a synchronous GRPO
// run on the chat-templated fixture model (tiny-chat) with a reward program is bitwise
// reproducible from its seed and identical with the prefix cache on and off; its rollout records
// carry what attribution needs; resume continues exactly; an asynchronous run never trains on a
// sample staler than max_staleness; offline DPO learns its preferences; bad configuration and bad
// rewards fail cleanly. With the engines in other processes (mpirun, --engines: the weights go to
// them as messages at every update), a sync run gives the in-process run's rollouts and weights bit
// for bit, with one engine or two, and an async run keeps the staleness bound and the attribution
// of every token.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace kiln::test {
namespace {

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

void expect_clean_failure(const RunResult& r, const std::string& must_mention) {
  EXPECT_FALSE(r.crashed) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(must_mention), std::string::npos) << "expected '" << must_mention << "' in: " << r.output;
}

// Chat prompts for tiny-chat, with the expected answer as a field the reward program reads.
std::string chat_prompts() {
  std::string s;
  for (int i = 0; i < 8; ++i)
    s += nlohmann::json({{"messages", {{{"role", "user"}, {"content", "What is " + std::to_string(i) + "+1?"}}}},
                         {"answer", i + 1}})
             .dump() +
         "\n";
  return s;
}

// A reward program: one number per record, the record's completion length (awk counts the ids),
// failing when the prompt's "answer" field did not reach it.
const char* kRewardScript =
    "awk '{ if (index($0, \"\\\"answer\\\":\") == 0) exit 3;\n"
    "  if (!match($0, /\"completion_ids\":\\[[^]]*\\]/)) exit 4;\n"
    "  s = substr($0, RSTART, RLENGTH); print gsub(/,/, \",\", s) + 1 }'\n";

// A reward of the first completion token's id: rewards that differ within a group.
const char* kFirstTokenReward =
    "awk '{ match($0, /\"completion_ids\":\\[[0-9]+/); print substr($0, RSTART + 18, RLENGTH - 18) }'\n";

std::string rl_args(const TempDir& tmp, const std::string& out, const std::string& extra, int steps = 4,
                    int max_tokens = 12, int group_size = 4, const char* lr = "1e-3") {
  return "rl --model " + testdata_dir() + "/tiny-chat --prompts " + tmp.sub("prompts.jsonl") + " --output " +
         tmp.sub(out) + " --steps " + std::to_string(steps) +
         " --group-size " + std::to_string(group_size) + " --prompts-per-step 2 --max-tokens " + std::to_string(max_tokens) +
         " --lr " + lr + " --seed 11 --micro-batch 4 "
         "--reward.command \"sh " + tmp.sub("reward.sh") + "\" --dump-rollouts " + tmp.sub(out + ".rollouts.jsonl") +
         " " + extra;
}

void write_inputs(const TempDir& tmp) {
  tmp.file("prompts.jsonl", chat_prompts());
  tmp.file("reward.sh", kRewardScript);
}

TEST(CliRl, SyncRunIsReproducibleAndCacheInvariant) {
  TempDir tmp;
  write_inputs(tmp);
  RunResult a = run_kiln(rl_args(tmp, "a", ""));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  RunResult b = run_kiln(rl_args(tmp, "b", ""));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  RunResult c = run_kiln(rl_args(tmp, "c", "--prefix-cache false"));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(a.output.find("cross-version prefix hits: 0"), std::string::npos) << a.output;
  // The progress line: the step's 8 samples all of the trainer's version, and the throughputs.
  EXPECT_NE(a.output.find("step 1/4 policy_version 1 reward"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("staleness {0:8}"), std::string::npos) << a.output;
  EXPECT_NE(a.output.find("tok/s rollout"), std::string::npos) << a.output;

  const std::string ra = read_file(tmp.sub("a.rollouts.jsonl"));
  ASSERT_FALSE(ra.empty());
  EXPECT_EQ(ra, read_file(tmp.sub("b.rollouts.jsonl"))) << "two runs of one seed differ";
  EXPECT_EQ(ra, read_file(tmp.sub("c.rollouts.jsonl"))) << "the prefix cache changed the rollouts";
  const std::string wa = read_file(tmp.sub("a/checkpoint-4/model.safetensors"));
  ASSERT_FALSE(wa.empty());
  EXPECT_EQ(wa, read_file(tmp.sub("b/checkpoint-4/model.safetensors"))) << "two runs of one seed differ";
  EXPECT_EQ(wa, read_file(tmp.sub("c/checkpoint-4/model.safetensors"))) << "the prefix cache changed the weights";

  // The cache did its work in run a and none in run c.
  const std::vector<nlohmann::json> ma = read_jsonl(tmp.sub("a/metrics.jsonl")), mc = read_jsonl(tmp.sub("c/metrics.jsonl"));
  ASSERT_EQ(ma.size(), 4u);
  EXPECT_GT(ma.back()["prefix_hit_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(mc.back()["prefix_hit_tokens"].get<int64_t>(), 0);

  // Records: group_size per prompt, each token with the version that generated it (sync: the
  // version before the step's update), behaviour log-probabilities, the prompt's fields, the text.
  const std::vector<nlohmann::json> records = read_jsonl(tmp.sub("a.rollouts.jsonl"));
  ASSERT_EQ(records.size(), 4u * 2 * 4);
  for (size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& r = records[i];
    const uint64_t step_version = i / 8;  // 8 samples per step
    const size_t n = r["completion_ids"].size();
    ASSERT_GT(n, 0u);
    EXPECT_EQ(r["logprobs"].size(), n);
    for (const auto& lp : r["logprobs"]) EXPECT_LE(lp.get<double>(), 0.0);
    ASSERT_EQ(r["versions"].size(), 1u) << r.dump();
    EXPECT_EQ(r["versions"][0][0].get<int64_t>(), 0);
    EXPECT_EQ(r["versions"][0][1].get<uint64_t>(), step_version);
    EXPECT_EQ(r["admission_version"].get<uint64_t>(), step_version);
    EXPECT_EQ(r["finish_version"].get<uint64_t>(), step_version);
    EXPECT_TRUE(r.contains("answer") && r.contains("messages") && r.contains("text")) << r.dump();
    EXPECT_EQ(r["group"].get<int64_t>(), static_cast<int64_t>(i / 4));
    EXPECT_EQ(r["reward"].get<double>(), static_cast<double>(n));  // the reward program's number
  }
}

TEST(CliRl, ResumeContinuesExactly) {
  TempDir tmp;
  write_inputs(tmp);
  ASSERT_EQ(run_kiln(rl_args(tmp, "full", "")).exit_code, 0);
  RunResult first = run_kiln(rl_args(tmp, "part", "", 2));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  RunResult rest = run_kiln(rl_args(tmp, "part", "--resume auto"));
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_NE(rest.output.find("resumed from"), std::string::npos) << rest.output;
  EXPECT_EQ(read_file(tmp.sub("full/checkpoint-4/model.safetensors")),
            read_file(tmp.sub("part/checkpoint-4/model.safetensors")));
  const std::vector<nlohmann::json> full = read_jsonl(tmp.sub("full/metrics.jsonl")),
                                    part = read_jsonl(tmp.sub("part/metrics.jsonl"));
  ASSERT_EQ(part.size(), 4u);
  ASSERT_EQ(full.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* key : {"step", "policy_version", "oldest_version", "newest_version", "reward_mean", "loss"})
      EXPECT_EQ(full[i][key], part[i][key]) << key << " at step " << i + 1;
  // The resumed engine starts at the checkpoint's version: the rollouts after the resume (tokens,
  // behaviour log-probabilities, per-token versions) are the uninterrupted run's, record for record.
  const std::string rollouts = read_file(tmp.sub("full.rollouts.jsonl"));
  ASSERT_FALSE(rollouts.empty());
  EXPECT_EQ(rollouts, read_file(tmp.sub("part.rollouts.jsonl")));
}

TEST(CliRl, AsyncRunNeverTrainsOnStaleSamples) {
  TempDir tmp;
  write_inputs(tmp);
  for (const char* update : {"keep", "abort", "sync"}) {
    const std::string out = std::string("async_") + update;
    RunResult r = run_kiln(rl_args(tmp, out, std::string("--mode async --max-staleness 1 --update-mode ") + update, 6));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<nlohmann::json> metrics = read_jsonl(tmp.sub(out + "/metrics.jsonl"));
    ASSERT_EQ(metrics.size(), 6u);
    for (const nlohmann::json& m : metrics) {
      for (const auto& [lag, count] : m["staleness"].items()) EXPECT_LE(std::stoll(lag), 1) << m.dump();
      EXPECT_EQ(m["cross_version_hits"].get<int64_t>(), 0);
      // The admission throttle keeps every sample within the bound: none is generated only to be dropped.
      EXPECT_EQ(m["dropped_stale"].get<int64_t>(), 0) << m.dump();
    }
    // Generation ran ahead of training: some step trained on samples of an older version.
    int64_t stale = 0;
    for (const nlohmann::json& m : metrics) stale += m["staleness"].value("1", int64_t{0});
    EXPECT_GT(stale, 0) << update;
  }
}

// With two minibatches a step advances the version by 2: --max-staleness 2 lets generation run one
// step ahead (samples two versions old, none older, none dropped); --max-staleness 1 allows no step
// of lag (every sample of the current version).
TEST(CliRl, AsyncStalenessCountsVersionsWithMinibatches) {
  TempDir tmp;
  write_inputs(tmp);
  for (int max_staleness : {2, 1}) {
    const std::string out = "async_mb_" + std::to_string(max_staleness);
    RunResult r = run_kiln(rl_args(tmp, out, "--mode async --update-mode keep --minibatches 2 --max-staleness " +
                                                  std::to_string(max_staleness), 5));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<nlohmann::json> metrics = read_jsonl(tmp.sub(out + "/metrics.jsonl"));
    ASSERT_EQ(metrics.size(), 5u);
    std::map<int64_t, int64_t> lags;
    for (const nlohmann::json& m : metrics) {
      EXPECT_EQ(m["dropped_stale"].get<int64_t>(), 0) << m.dump();
      for (const auto& [lag, count] : m["staleness"].items()) lags[std::stoll(lag)] += count.get<int64_t>();
    }
    EXPECT_EQ(metrics.back()["policy_version"].get<int64_t>(), 10);  // two optimizer steps per RL step
    for (const auto& [lag, count] : lags) EXPECT_TRUE(lag == 0 || lag == 2) << lag;  // whole steps behind
    if (max_staleness == 2) EXPECT_GT(lags[2], 0);
    else EXPECT_EQ(lags.size(), 1u);
  }
}

// GRPO end to end with a KL term and two minibatches: two versions per step; the second minibatch
// runs a policy that moved, so the KL to the frozen reference is positive, and with tight clip
// bounds some ratios clip (rewards differ within groups); without --kl-coef no reference is loaded
// and the KL is not measured.
TEST(CliRl, KlAndMinibatchesEndToEnd) {
  TempDir tmp;
  write_inputs(tmp);
  // Rewards that differ within a group, so advantages are not zero.
  tmp.file("reward.sh", kFirstTokenReward);
  RunResult r = run_kiln(rl_args(tmp, "kl", "--kl-coef 0.1 --minibatches 2 --clip-low 0.001 --clip-high 0.001", 3,
                                 12, 4, "3e-3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> m = read_jsonl(tmp.sub("kl/metrics.jsonl"));
  ASSERT_EQ(m.size(), 3u);
  double clipped = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i]["policy_version"].get<int64_t>(), 2 * static_cast<int64_t>(i + 1));
    EXPECT_GT(m[i]["kl"].get<double>(), 0.0) << m[i].dump();
    clipped += m[i]["clip_fraction"].get<double>();
  }
  EXPECT_GT(clipped, 0.0);
  RunResult plain = run_kiln(rl_args(tmp, "plain", "--minibatches 2", 1));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(read_jsonl(tmp.sub("plain/metrics.jsonl")).front()["kl"].get<double>(), 0.0);
}

TEST(CliRl, OfflineDpoLearnsThePreferences) {
  TempDir tmp;
  std::string lines;
  for (int i = 0; i < 4; ++i)
    lines += nlohmann::json({{"prompt", "Question " + std::to_string(i)},
                             {"chosen", " yes " + std::to_string(i)},
                             {"rejected", " no no " + std::to_string(i)}})
                 .dump() +
             "\n";
  tmp.file("prefs.jsonl", lines);
  RunResult r = run_kiln("rl --algorithm dpo --model " + testdata_dir() + "/tiny-chat --prompts " +
                         tmp.sub("prefs.jsonl") + " --output " + tmp.sub("dpo") +
                         " --steps 12 --prompts-per-step 4 --lr 3e-3 --beta 0.5 --micro-batch 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> m = read_jsonl(tmp.sub("dpo/metrics.jsonl"));
  ASSERT_EQ(m.size(), 12u);
  EXPECT_LT(m.back()["loss"].get<double>(), m.front()["loss"].get<double>());
  EXPECT_NEAR(m.front()["loss"].get<double>(), std::log(2.0), 1e-6);  // the policy starts as the reference
  EXPECT_EQ(m.back()["dpo_accuracy"].get<double>(), 1.0);
}

// Online DPO: pairs are the best and worst completion of each group by reward (one-token
// completions, rewarded by their id: higher is better); the reward grows.
TEST(CliRl, OnlineDpoPairsGroupsByReward) {
  TempDir tmp;
  write_inputs(tmp);
  tmp.file("reward.sh", kFirstTokenReward);
  RunResult r = run_kiln(rl_args(tmp, "odpo", "--algorithm online-dpo --beta 0.5", 12, 1, 8, "1e-2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<nlohmann::json> m = read_jsonl(tmp.sub("odpo/metrics.jsonl"));
  ASSERT_EQ(m.size(), 12u);
  for (const nlohmann::json& x : m) {
    EXPECT_GT(x["samples"].get<int64_t>(), 0) << x.dump();  // pairs formed
    EXPECT_TRUE(x.contains("dpo_accuracy"));
  }
  EXPECT_NEAR(m.front()["loss"].get<double>(), std::log(2.0), 1e-6);
  double first = 0, last = 0;  // mean reward of the first and the last four steps
  for (int i = 0; i < 4; ++i) first += m[i]["reward_mean"].get<double>() / 4, last += m[8 + i]["reward_mean"].get<double>() / 4;
  EXPECT_GT(last, first + 20);
  // Rewards that all tie form no pair: each step says so, and no optimizer step is taken.
  tmp.file("tie.sh", "#!/bin/sh\nawk '{print 1}'\n");
  RunResult tie = run_kiln("rl --model " + testdata_dir() + "/tiny-chat --prompts " + tmp.sub("prompts.jsonl") +
                           " --output " + tmp.sub("tie") + " --steps 2 --group-size 2 --prompts-per-step 2 --max-tokens 4 " +
                           "--algorithm online-dpo --reward.command \"sh " + tmp.sub("tie.sh") + "\"");
  ASSERT_EQ(tie.exit_code, 0) << tie.output;
  EXPECT_NE(tie.output.find("step 2 has no preference pair"), std::string::npos) << tie.output;
  EXPECT_NE(tie.output.find("at policy version 0"), std::string::npos) << tie.output;
}

TEST(CliRl, BadConfigurationAndRewardsFailCleanly) {
  TempDir tmp;
  write_inputs(tmp);
  const std::string base = "rl --model " + testdata_dir() + "/tiny-chat --prompts " + tmp.sub("prompts.jsonl") +
                           " --output " + tmp.sub("bad") + " --steps 1 --group-size 2 --prompts-per-step 2 --max-tokens 4";
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("a.toml", "[reward]\ncomand = \"cat\"\n")),
                       "reward.comand' is not a flag of kiln rl");
  expect_clean_failure(run_kiln(base + " --config " + tmp.file("b.toml", "bogus = 1\n")), "bogus");
  expect_clean_failure(run_kiln(base + " --reward.command \"echo oops\""), "sample 0");
  expect_clean_failure(run_kiln(base + " --reward.command \"exit 2\""), "reward");
  expect_clean_failure(run_kiln(base + " --mode sometimes"), "--mode");
  expect_clean_failure(run_kiln(base + " --temperature 0"), "--temperature");
  // Loss coefficients out of range are refused before any rollout (a NaN --kl-coef used to fail only
  // at the first optimizer step, a negative one and a NaN --tis-cap ran).
  for (const char* flag : {"--kl-coef", "--tis-cap", "--clip-high"})
    for (const char* v : {"-1", "nan", "inf"}) expect_clean_failure(run_kiln(base + " " + flag + " " + v), flag);
  for (const char* v : {"nan", "inf"}) expect_clean_failure(run_kiln(base + " --beta " + v), "--beta");
  expect_clean_failure(run_kiln(base + " --keep-last -1"), "--keep-last");
  tmp.file("broken.jsonl", "{\"prompt\": \"hi\"}\n{nope\n");
  expect_clean_failure(run_kiln("rl --model " + testdata_dir() + "/tiny-chat --prompts " + tmp.sub("broken.jsonl") +
                                " --output " + tmp.sub("bad2")),
                       "broken.jsonl:2");
  // A field nested 100,000 levels deep (the reward's "answer", kept with the prompt): an error
  // naming the line, not a crash where the line is copied or printed.
  tmp.file("deep.jsonl", "{\"prompt\": \"hi\", \"answer\": " + std::string(100000, '[') + std::string(100000, ']') + "}\n");
  expect_clean_failure(run_kiln("rl --model " + testdata_dir() + "/tiny-chat --prompts " + tmp.sub("deep.jsonl") +
                                " --output " + tmp.sub("bad3")),
                       "deep.jsonl:1: the line nests deeper than 999 levels");
  // The TOML form of a good run: a [reward] table and top-level keys.
  RunResult ok = run_kiln("rl --config " +
                          tmp.file("good.toml", "model = \"" + testdata_dir() + "/tiny-chat\"\nprompts = \"" +
                                                    tmp.sub("prompts.jsonl") + "\"\noutput = \"" + tmp.sub("good") +
                                                    "\"\nsteps = 1\ngroup_size = 2\nprompts_per_step = 2\n"
                                                    "max_tokens = 4\n[reward]\ncommand = \"awk '{print 1}'\"\n"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

TEST(CliDemo, GrpoRaisesAccuracyToTheTarget) {
  TempDir tmp;
  RunResult r = run_kiln("demo --output " + tmp.sub("demo"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("after GRPO (target 0.90)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cross-version prefix hits: 0"), std::string::npos) << r.output;
  // The SFT level is below the target: GRPO did the rest.
  const size_t at = r.output.find("after SFT, greedy accuracy ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(r.output.substr(at + 27, 4)), 0.9) << r.output;
}

// kiln rl under mpirun with engines on other ranks; skipped where mpirun is missing or kiln was
// built without MPI.
class CliRlRemoteEngines : public ::testing::Test {
 protected:
  void SetUp() override {
    if (shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed (Debian: openmpi-bin)";
    write_inputs(tmp_);
    // No steps: an MPI build starts its engine rank and ends at once; one without MPI says so. (With
    // --steps given twice the probe failed on the flag in every build and never skipped.)
    const Shell probe = shell(mpirun(2) + kiln_binary() + " " + rl_args(tmp_, "probe", "--engines 1", 0));
    if (probe.output.find("built without MPI") != std::string::npos) GTEST_SKIP() << "kiln was built without MPI";
  }
  Shell remote(int ranks, const std::string& out, const std::string& extra, int steps = 4) {
    std::string engines;
    for (int r = 1; r < ranks; ++r) engines += " " + std::to_string(r);
    return shell(mpirun(ranks) + kiln_binary() + " " + rl_args(tmp_, out, extra + " --engines" + engines, steps));
  }
  TempDir tmp_;
};

TEST_F(CliRlRemoteEngines, SyncRunEqualsTheInProcessRun) {
  // One BLAS thread, as mpirun() gives the ranks: with more, OpenBLAS may sum in another order (it
  // did on the 2-core CPU machine), and the runs are compared bit for bit.
  const Shell local = shell("OPENBLAS_NUM_THREADS=1 " + kiln_binary() + " " + rl_args(tmp_, "local", ""));
  ASSERT_EQ(local.code, 0) << local.output;
  const std::string rollouts = read_file(tmp_.sub("local.rollouts.jsonl"));
  const std::string weights = read_file(tmp_.sub("local/checkpoint-4/model.safetensors"));
  ASSERT_FALSE(rollouts.empty());
  ASSERT_FALSE(weights.empty());
  for (int ranks : {2, 3}) {  // one engine; two, the groups dealt between them
    const std::string out = "remote" + std::to_string(ranks);
    Shell r = remote(ranks, out, "");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("engine on rank 1 ready at policy version 0 (weights over mpi)"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("cross-version prefix hits: 0"), std::string::npos) << r.output;
    EXPECT_EQ(read_file(tmp_.sub(out + ".rollouts.jsonl")), rollouts) << ranks - 1 << " remote engines";
    EXPECT_EQ(read_file(tmp_.sub(out + "/checkpoint-4/model.safetensors")), weights) << ranks - 1 << " remote engines";
    const std::vector<nlohmann::json> m = read_jsonl(tmp_.sub(out + "/metrics.jsonl"));
    ASSERT_EQ(m.size(), 4u);
    EXPECT_GT(m.back()["prefix_hit_tokens"].get<int64_t>(), 0);  // the remote engines' caches at work
  }
}

TEST_F(CliRlRemoteEngines, AsyncRunKeepsTheBoundAndTheAttribution) {
  for (const char* update : {"keep", "abort"}) {
    const std::string out = std::string("async_") + update;
    Shell r = remote(2, out, std::string("--mode async --max-staleness 1 --update-mode ") + update, 6);
    ASSERT_EQ(r.code, 0) << r.output;
    const std::vector<nlohmann::json> metrics = read_jsonl(tmp_.sub(out + "/metrics.jsonl"));
    ASSERT_EQ(metrics.size(), 6u);
    int64_t stale = 0;
    for (const nlohmann::json& m : metrics) {
      for (const auto& [lag, count] : m["staleness"].items()) EXPECT_LE(std::stoll(lag), 1) << m.dump();
      EXPECT_EQ(m["dropped_stale"].get<int64_t>(), 0) << m.dump();
      EXPECT_EQ(m["cross_version_hits"].get<int64_t>(), 0);
      stale += m["staleness"].value("1", int64_t{0});
    }
    EXPECT_GT(stale, 0) << update << ": generation never ran ahead of training";
    // Every token carries a version the trainer published, in order within its record.
    for (const nlohmann::json& rec : read_jsonl(tmp_.sub(out + ".rollouts.jsonl"))) {
      uint64_t last = 0;
      for (const auto& span : rec["versions"]) {
        const uint64_t v = span[1].get<uint64_t>();
        EXPECT_GE(v, last) << rec.dump();
        EXPECT_LE(v, 6u) << rec.dump();
        last = v;
      }
      EXPECT_LE(rec["admission_version"].get<uint64_t>(), rec["finish_version"].get<uint64_t>()) << rec.dump();
    }
  }
}

TEST_F(CliRlRemoteEngines, NcclWeightsNeedTwoGpus) {
  // On the CPU the weights can only travel as MPI messages: asking for NCCL is a clear error on
  // both ranks' side, not a hang.
  Shell r = remote(2, "nccl", "--weight-transport nccl");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--weight-transport nccl: NCCL moves weights between GPUs, and the trainer is on the CPU"),
            std::string::npos)
      << r.output;
  Shell bad = remote(2, "bogus", "--weight-transport pigeon");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--weight-transport"), std::string::npos) << bad.output;
}

TEST_F(CliRlRemoteEngines, RolesMustBeClear) {
  Shell r = shell(mpirun(3) + kiln_binary() + " " + rl_args(tmp_, "roles", "--engines 1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("rank 2 of 3 has no role"), std::string::npos) << r.output;
  RunResult single = run_kiln(rl_args(tmp_, "single", "--engines 1"));
  EXPECT_NE(single.exit_code, 0);
  EXPECT_FALSE(single.crashed);
  EXPECT_NE(single.output.find("start kiln rl with mpirun"), std::string::npos) << single.output;
}

}  // namespace
}  // namespace kiln::test
