// Collectives on CUDA (backend/collectives.h): NCCL with one rank changes nothing (the trainer with
// the NCCL path, replicated or ZeRO-1, gives the losses and weights of the trainer without
// collectives, bit for bit: a sum over one rank is the identity and the update is the same
// kernel), and the collectives themselves work in place on device tensors. Under mpirun, two ranks
// sharing the GPU (--device cuda:0; MPI through host copies) with --zero 1, which shards the f32 master weights,
// give the losses and the final weights of --zero 0 within 1e-6, and the losses of one rank within
// bf16 rounding. A remote engine on the trainer's GPU gets its weights as MPI messages (NCCL
// cannot connect a GPU to itself). Skipped without a GPU, NCCL or mpirun (and the mpirun cases
// when kiln was built without MPI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/collectives.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "kernels/ops.h"
#include "train/trainer.h"

namespace kiln::test {
namespace {

HostBatch batch_of_ids(int32_t vocab, uint64_t seed) {
  HostBatch hb;
  hb.batch = 4;
  hb.seq_len = 32;
  for (int i = 0; i < hb.batch * hb.seq_len; ++i) {
    hb.ids.push_back(static_cast<int32_t>(3 + (seed * 7919 + static_cast<uint64_t>(i) * 104729) % (vocab - 3)));
    hb.positions.push_back(i % hb.seq_len);
  }
  hb.targets.assign(hb.ids.size(), -100);
  for (int i = 0; i + 1 < hb.batch * hb.seq_len; ++i)
    if (i % hb.seq_len != hb.seq_len - 1) hb.targets[i] = hb.ids[i + 1];
  return hb;
}

// Three AdamW steps of tiny-llama on CUDA; the losses, and the master weights after them.
struct Trained {
  std::vector<double> losses;
  std::vector<float> master;
};
Trained train_three_steps(Backend& be, Collectives* coll, int32_t zero) {
  Trained out;
  Result<std::unique_ptr<TrainModel>> m = TrainModel::load(be, testdata_dir() + "/tiny-llama", TrainModelOptions{});
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return out;
  TrainerOptions o;
  o.optimizer.lr = 1e-3f;
  o.optimizer.clip_norm = 1.0f;
  o.collectives = coll;
  o.zero = zero;
  Result<Trainer> t = Trainer::create(be, **m, o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return out;
  for (uint64_t s = 0; s < 3; ++s) {
    Result<StepReport> r = t->step({batch_of_ids((*m)->config().vocab_size, s)});
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return out;
    out.losses.push_back(r->loss);
  }
  out.master = to_f32(be, (*m)->params().master());
  return out;
}

TEST(CollectivesGpu, NcclWithOneRankChangesNothing) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Collectives> one = make_single_process_collectives();
  Result<std::unique_ptr<Collectives>> nccl = make_nccl_collectives(*be, one, 60.0);
  if (!nccl.ok()) GTEST_SKIP() << nccl.status().message();
  EXPECT_STREQ((*nccl)->transport(), "nccl");
  const Trained plain = train_three_steps(*be, nullptr, 0);
  for (int32_t zero : {0, 1, 2}) {
    const Trained with = train_three_steps(*be, nccl->get(), zero);
    ASSERT_EQ(with.losses.size(), 3u);
    for (size_t s = 0; s < 3; ++s) EXPECT_EQ(with.losses[s], plain.losses[s]) << "--zero " << zero << ", step " << s + 1;
    ASSERT_EQ(with.master.size(), plain.master.size());
    EXPECT_EQ(std::memcmp(with.master.data(), plain.master.data(), plain.master.size() * 4), 0) << "--zero " << zero;
  }
}

TEST(CollectivesGpu, NcclCollectivesInPlaceOnOneRank) {
  KILN_REQUIRE_GPU(be);
  std::unique_ptr<Collectives> one = make_single_process_collectives();
  Result<std::unique_ptr<Collectives>> nccl = make_nccl_collectives(*be, one, 60.0);
  if (!nccl.ok()) GTEST_SKIP() << nccl.status().message();
  Collectives& c = **nccl;
  const TensorBuffer host = random_host({1000}, DType::f32, 3);
  const float* hp = host.view().ptr<float>();
  const std::vector<float> want(hp, hp + 1000);
  Result<TensorBuffer> dev = empty(*be, {1000}, DType::f32);
  ASSERT_TRUE(dev.ok());
  be->copy(dev->view(), host.view());
  ASSERT_TRUE(c.all_reduce_sum(*be, dev->view()).ok());
  ASSERT_TRUE(c.reduce_scatter_sum(*be, dev->view(), dev->view()).ok());
  ASSERT_TRUE(c.broadcast(*be, dev->view(), 0).ok());
  Result<TensorBuffer> half = empty(*be, {1000}, DType::bf16);
  ASSERT_TRUE(half.ok());
  ops::cast(*be, half->view(), dev->view());
  ASSERT_TRUE(c.all_gather(*be, half->view(), half->view()).ok());
  EXPECT_EQ(to_f32(*be, dev->view()), want);
  const std::vector<float> h = to_f32(*be, half->view());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(h[i], want[i], std::fabs(want[i]) * 4e-3) << i;
  EXPECT_FALSE(c.broadcast(*be, dev->view(), 1).ok());  // no rank 1
  EXPECT_TRUE(c.barrier().ok());
}

std::vector<double> losses_of(const std::string& out) {
  std::vector<double> v;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) v.push_back(j["loss"].get<double>());
  }
  return v;
}

std::vector<float> weights_of(const std::string& out) {
  std::vector<float> all;
  Result<SafetensorsFile> f = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_TRUE(f.ok()) << out;
  if (!f.ok()) return all;
  for (const std::string& name : f->names()) {
    const TensorInfo t = *f->find(name);
    EXPECT_EQ(t.dtype, DType::f32);
    const float* p = static_cast<const float*>(t.data);
    all.insert(all.end(), p, p + t.shape.numel());
  }
  return all;
}

TEST(CollectivesGpu, TwoRanksOnTheGpuWithShardedMasterWeights) {
  KILN_REQUIRE_GPU(be);
  if (shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  std::string lines;
  for (int i = 0; i < 24; ++i) {
    std::string ids;
    for (int t = 0; t < 24 + i % 9; ++t) ids += (t ? ", " : "") + std::to_string(3 + (i * 37 + (1 + i % 3) * t) % 380);
    lines += "{\"input_ids\": [" + ids + "]}\n";
  }
  const std::string data = tmp.file("d.jsonl", lines);
  auto train = [&](int ranks, const std::string& out, const std::string& extra) {
    const std::string cmd = kiln_binary() + " train --model " + testdata_dir() + "/tiny-llama --data " + data +
                            " --device cuda:0 --collectives mpi --batch-size 4 --grad-accum 2 --steps 3 --lr 1e-3 "
                            "--clip-norm 1.0 --output " + out + " " + extra;
    return shell(ranks == 1 ? cmd : mpirun(ranks) + cmd);
  };
  const std::string one = tmp.sub("one"), zero0 = tmp.sub("zero0"), zero1 = tmp.sub("zero1");
  Shell r1 = train(1, one, "");
  ASSERT_EQ(r1.code, 0) << r1.output;
  Shell r0 = train(2, zero0, "--zero 0");
  if (r0.output.find("built without MPI") != std::string::npos) GTEST_SKIP() << "kiln was built without MPI";
  ASSERT_EQ(r0.code, 0) << r0.output;
  Shell rz = train(2, zero1, "--zero 1");
  ASSERT_EQ(rz.code, 0) << rz.output;
  const std::vector<double> a = losses_of(one), b = losses_of(zero0), c = losses_of(zero1);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_NEAR(c[s], b[s], 1e-6 * std::fabs(b[s])) << "step " << s + 1 << ": --zero 1 against --zero 0";
    EXPECT_NEAR(b[s], a[s], 2e-3 * std::fabs(a[s])) << "step " << s + 1 << ": 2 ranks against 1 (bf16 sums)";
  }
  const std::vector<float> w0 = weights_of(zero0), w1 = weights_of(zero1);
  ASSERT_EQ(w0.size(), w1.size());
  EXPECT_LE(rel_error(w1, w0), 1e-6) << "final weights, --zero 1 (gathered master) against --zero 0";
}

// kiln rl with its engine in a second process on the same GPU: the weights cannot go over NCCL
// (it cannot connect a GPU to itself), so asking for it is a clear error and "auto" takes MPI
// messages; the run then completes with the engine's tokens at the trainer's versions.
TEST(CollectivesGpu, RemoteEngineOnTheTrainersGpu) {
  KILN_REQUIRE_GPU(be);
  if (shell("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  std::string prompts;
  for (int i = 0; i < 4; ++i)
    prompts += "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " + std::to_string(i) +
               "+1?\"}], \"answer\": " + std::to_string(i + 1) + "}\n";
  const std::string file = tmp.file("prompts.jsonl", prompts);
  auto rl = [&](const std::string& out, const std::string& transport) {
    return shell(mpirun(2) + kiln_binary() + " rl --model " + testdata_dir() + "/tiny-chat --prompts " + file +
                 " --output " + tmp.sub(out) + " --device cuda:0 --engines 1 --steps 2 --group-size 2 "
                 "--prompts-per-step 2 --max-tokens 6 --reward.kind regex --reward.pattern . --weight-transport " +
                 transport);
  };
  Shell nccl = rl("nccl", "nccl");
  if (nccl.output.find("built without MPI") != std::string::npos) GTEST_SKIP() << "kiln was built without MPI";
  EXPECT_NE(nccl.code, 0);
  EXPECT_NE(nccl.output.find("the trainer and this engine share one GPU"), std::string::npos) << nccl.output;
  Shell fallback = rl("auto", "auto");
  ASSERT_EQ(fallback.code, 0) << fallback.output;
  EXPECT_NE(fallback.output.find("(weights over mpi)"), std::string::npos) << fallback.output;
  EXPECT_NE(fallback.output.find("step 2/2 policy_version 2"), std::string::npos) << fallback.output;
}

}  // namespace
}  // namespace kiln::test
