// The Trainer (train/trainer.h): the policy version counts committed optimizer steps only (not a
// step without labels, not a step refused for a non-finite loss or gradient norm, which leaves the
// weights and the optimizer state as they were), and each update runs at the schedule's learning
// rate for the version it starts from (checked through SGD, whose update is exactly -lr * gradient).
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

std::vector<float> host_floats(Backend& be, Tensor t) {
  TensorBuffer h = to_host(be, t);
  return std::vector<float>(h.ptr<float>(), h.ptr<float>() + h.view().numel());
}

std::vector<float> master_copy(Backend& be, const TrainModel& m) { return host_floats(be, m.params().master()); }

// Bitwise equality of two f32 vectors (NaN and -0 included), naming the first difference.
testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0)
      return testing::AssertionFailure() << "element " << i << ": " << a[i] << " and " << b[i];
  return testing::AssertionSuccess();
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

// A step whose loss is finite but whose gradient norm is not (an infinite d loss / d logprob from
// an RL loss; an infinite or NaN value in the accumulated gradients) is refused by the optimizer:
// an error naming the step, no new policy version, the weights, the AdamW moments and the step count
// (its bias correction) untouched, the gradients cleared. The next step is then bitwise the step a
// twin trainer that never saw the refused ones takes.
TEST(Trainer, NonFiniteGradientNormIsRefusedWithoutANewVersion) {
  auto be = make_cpu_backend();
  auto model = TrainModel::load(*be, test::testdata_dir() + "/tiny-llama", {});
  auto twin_model = TrainModel::load(*be, test::testdata_dir() + "/tiny-llama", {});
  ASSERT_TRUE(model.ok() && twin_model.ok()) << model.status().message();
  TrainModel& m = **model;
  TrainerOptions o;
  o.optimizer.kind = OptimizerOptions::Kind::adamw;
  o.optimizer.lr = 1e-2f;
  o.optimizer.weight_decay = 0.1f;
  auto trainer = Trainer::create(*be, m, o);
  auto twin = Trainer::create(*be, **twin_model, o);
  ASSERT_TRUE(trainer.ok() && twin.ok());
  const int32_t vocab = m.config().vocab_size;

  // One committed step each, so that the moments and the step count are not zero.
  ASSERT_TRUE(trainer->step({batch(8, vocab, 1)}).ok());
  ASSERT_TRUE(twin->step({batch(8, vocab, 1)}).ok());
  ASSERT_EQ(trainer->policy_version(), 1u);

  const std::vector<float> weights = master_copy(*be, m);
  std::vector<std::vector<float>> moments;
  for (const OptimizerState& st : trainer->optimizer().state_tensors()) moments.push_back(host_floats(*be, st.values));
  ASSERT_EQ(moments.size(), 2u);  // AdamW: exp_avg, exp_avg_sq
  const int64_t steps_taken = trainer->optimizer().steps_taken();
  auto expect_refused = [&](const Result<StepReport>& r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what << ": the step was committed";
    EXPECT_NE(r.status().message().find("step 2: the gradient norm is not finite"), std::string::npos)
        << what << ": " << r.status().message();
    EXPECT_EQ(trainer->policy_version(), 1u) << what;
    EXPECT_EQ(trainer->optimizer().steps_taken(), steps_taken) << what;
    EXPECT_TRUE(same_bits(master_copy(*be, m), weights)) << what << ": the weights moved";
    const auto state = trainer->optimizer().state_tensors();
    for (size_t i = 0; i < state.size(); ++i)
      EXPECT_TRUE(same_bits(host_floats(*be, state[i].values), moments[i])) << what << ": " << state[i].name << " moved";
    const std::vector<float> grads = host_floats(*be, m.params().grads());
    EXPECT_TRUE(same_bits(grads, std::vector<float>(grads.size(), 0.0f))) << what << ": the gradients were kept";
  };

  // An RL-style token loss: a finite value with an infinite derivative for one token.
  const TokenLoss infinite_slope = [](const std::vector<float>& logprobs, const std::vector<float>&) -> Result<TokenLossValue> {
    TokenLossValue v;
    v.loss = 0.25;
    v.dloss_dlogprob.assign(logprobs.size(), 0.01f);
    v.dloss_dlogprob[1] = std::numeric_limits<float>::infinity();
    return v;
  };
  auto rl = trainer->step_token_loss({batch(8, vocab, 2)}, {infinite_slope}, {});
  expect_refused(rl, "infinite d loss / d logprob");

  // The SFT path: a finite loss on top of gradients holding an infinity, then a NaN.
  for (const float poison : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    TensorBuffer g = host_empty({m.params().size()}, DType::f32);
    std::memset(g.ptr<float>(), 0, static_cast<size_t>(g.view().nbytes()));
    g.ptr<float>()[m.params().size() / 2] = poison;
    be->copy(m.params().grads(), g);
    auto sft = trainer->step({batch(8, vocab, 3)});
    expect_refused(sft, std::isnan(poison) ? "a NaN gradient" : "an infinite gradient");
  }

  // The next step starts from version 1 as if nothing had happened.
  auto next = trainer->step({batch(8, vocab, 4)});
  auto twin_next = twin->step({batch(8, vocab, 4)});
  ASSERT_TRUE(next.ok() && twin_next.ok()) << next.status().message();
  EXPECT_EQ(next->policy_version, 2u);
  EXPECT_EQ(next->loss, twin_next->loss);
  EXPECT_EQ(next->grad_norm, twin_next->grad_norm);
  EXPECT_TRUE(same_bits(master_copy(*be, m), master_copy(*be, **twin_model))) << "weights after the next step";
}

}  // namespace
}  // namespace kiln
