// The Trainer (train/trainer.h): the policy version counts committed optimizer steps only (not a
// step without labels, not a step refused for a non-finite loss, which leaves the weights as they
// were), and each update runs at the schedule's learning rate for the version it starts from
// (checked through SGD, whose update is exactly -lr * gradient).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"
#include "train/trainer.h"

namespace kiln {
namespace {

HostBatch batch(int32_t S, int32_t vocab, uint32_t seed, bool labelled = true) {
  HostBatch hb;
  hb.batch = 1;
  hb.seq_len = S;
  for (int32_t i = 0; i < S; ++i) {
    hb.ids.push_back(static_cast<int32_t>((seed * 2654435761u + static_cast<uint32_t>(i) * 40503u) % static_cast<uint32_t>(vocab)));
    hb.positions.push_back(i);
  }
  hb.targets.assign(static_cast<size_t>(S), -100);
  if (labelled)
    for (int32_t i = 0; i + 1 < S; ++i) hb.targets[static_cast<size_t>(i)] = hb.ids[static_cast<size_t>(i) + 1];
  return hb;
}

std::vector<float> master_copy(Backend& be, const TrainModel& m) {
  TensorBuffer h = to_host(be, m.params().master());
  return std::vector<float>(h.ptr<float>(), h.ptr<float>() + h.view().numel());
}

TEST(Trainer, PolicyVersionCountsCommittedStepsAtTheScheduledLr) {
  auto be = make_cpu_backend();
  auto model = TrainModel::load(*be, test::testdata_dir() + "/tiny-llama", {});
  ASSERT_TRUE(model.ok()) << model.status().message();
  TrainModel& m = **model;
  TrainerOptions o;
  o.optimizer.kind = OptimizerOptions::Kind::sgd;
  o.optimizer.lr = 0.5f;
  o.schedule = {LrSchedule::Kind::linear, 2, 6, 0, 0.0};
  auto trainer = Trainer::create(*be, m, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status().message();
  const int32_t vocab = m.config().vocab_size;
  EXPECT_EQ(trainer->policy_version(), 0u);

  // No labelled token: no update, no new version.
  auto skipped = trainer->step({batch(8, vocab, 1, /*labelled=*/false)});
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(trainer->policy_version(), 0u);

  for (uint64_t v = 0; v < 4; ++v) {
    const std::vector<float> before = master_copy(*be, m);
    // The gradient the step will apply: the same batch's, computed first and then cleared.
    const HostBatch hb = batch(8, vocab, 10 + static_cast<uint32_t>(v));
    auto db = m.upload(hb);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE(m.forward_backward(*db, 1.0f / static_cast<float>(hb.labelled())).ok());
    TensorBuffer g = to_host(*be, m.params().grads());
    be->zero(m.params().grads());
    auto r = trainer->step({hb});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_FALSE(r->skipped);
    EXPECT_EQ(r->policy_version, v + 1);
    EXPECT_EQ(trainer->policy_version(), v + 1);
    EXPECT_DOUBLE_EQ(r->lr, static_cast<double>(0.5f) * o.schedule.multiplier(static_cast<int64_t>(v)));
    const std::vector<float> after = master_copy(*be, m);
    const float lr = static_cast<float>(r->lr);
    double worst = 0.0, moved = 0.0;
    for (size_t i = 0; i < after.size(); ++i) {
      const double step = double(lr) * double(g.ptr<float>()[i]);
      const double want = double(before[i]) - step;
      // One f32 rounding of the result, relative to the operands' size (not the difference's).
      worst = std::max(worst, std::abs(after[i] - want) / (std::abs(double(before[i])) + std::abs(step) + 1e-30));
      moved += std::abs(double(after[i]) - before[i]);
    }
    EXPECT_LT(worst, 1e-6) << "SGD update is not -lr * gradient at version " << v;
    if (v == 0) EXPECT_EQ(moved, 0.0) << "warmup step 0 has lr 0";
    else EXPECT_GT(moved, 0.0);
  }

  // A non-finite loss: refused, the version and the weights stay.
  TensorBuffer w = to_host(*be, m.params().master());
  const std::vector<float> before = master_copy(*be, m);
  w.ptr<float>()[0] = std::numeric_limits<float>::quiet_NaN();  // the embedding row of some token
  be->copy(m.params().master(), w);
  m.params().sync_compute(*be);
  HostBatch poisoned = batch(8, vocab, 99);
  for (auto& id : poisoned.ids) id = 0;  // every token reads the NaN row
  auto bad = trainer->step({poisoned});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("step 5"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("not finite"), std::string::npos) << bad.status().message();
  EXPECT_EQ(trainer->policy_version(), 4u);
  const std::vector<float> after = master_copy(*be, m);
  for (size_t i = 1; i < after.size(); ++i) ASSERT_EQ(std::memcmp(&after[i], &before[i], 4), 0) << i;
}

}  // namespace
}  // namespace kiln
