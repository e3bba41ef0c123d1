// The Muon optimizer (Optimizer with Kind::muon) on the CPU in f32, against torch.optim.Muon +
// torch.optim.AdamW (tests/reference/make_muon_fixture.py, testdata/muon/: two steps from stored
// weights and gradients, torch's Muon run with its bf16 cast made f32):
//   * every Hugging Face tensor after both steps (block matrices through Muon, one of them exempt
//     from weight decay; embeddings, norms and lm_head through AdamW), and the momentum buffers, for
//     adjust_lr original with clipping, match_rms_adamw, and momentum 0.9 without Nesterov;
//   * ParameterSet's layout (the block-matrix range, decay_end unchanged) and the state's sizes;
//   * a run resumed from state_tensors() / steps_taken() equal bit for bit to an unbroken one;
//   * invalid options refused with the flag named.
// Tolerance: 1e-4 relative per element (test_util's elem_error: |got - want| / (|want| + rms)) on
// the weights, and 1e-4 relative L2 on each tensor's update (weights after minus before), the
// stricter check since an update is small against its weights.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "muon_fixture.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace kiln::test {
namespace {

constexpr double kTolerance = 1e-4;

// A ParameterSet holding the fixture's initial weights.
ParameterSet make_params(Backend& be) {
  Result<ParameterSet> p = ParameterSet::create(be, muon_fixture().config, muon_fixture().no_decay, be.device().is_cuda());
  KILN_ASSERT(p.ok());
  set_hf_tensors(be, *p, p->master(), "init.");
  p->sync_compute(be);
  return std::move(*p);
}

void step_with(Backend& be, ParameterSet& p, Optimizer& opt, float lr, int k) {
  set_hf_tensors(be, p, p.grads(), "grad" + std::to_string(k) + ".");
  Result<OptimizerStepInfo> info = opt.step(lr);
  ASSERT_TRUE(info.ok()) << info.status().message();
}

// The worst per-element error of the weights and relative L2 error of the updates over every
// tensor of a case, checked against kTolerance.
void check_case(const std::string& name) {
  SCOPED_TRACE(name);
  auto be = make_cpu_backend();
  const nlohmann::json& c = muon_fixture().cases.at(name);
  ParameterSet p = make_params(*be);
  Result<Optimizer> opt = Optimizer::create(*be, p, muon_case_options(c));
  ASSERT_TRUE(opt.ok()) << opt.status().message();
  for (int k = 1; k <= 2; ++k) step_with(*be, p, *opt, c.at("lr").get<float>(), k);
  double worst_w = 0, worst_u = 0;
  std::string worst_name;
  for (const HfTensor& t : p.layout().hf) {
    const std::vector<float> got = to_f32(*be, p.hf_view(p.master(), t));
    const std::vector<float> want = muon_fixture().get(name + "." + t.name), init = muon_fixture().get("init." + t.name);
    std::vector<float> dgot(got.size()), dwant(got.size());
    for (size_t i = 0; i < got.size(); ++i) dgot[i] = got[i] - init[i], dwant[i] = want[i] - init[i];
    const double ew = elem_error(got, want), eu = rel_error(dgot, dwant);
    EXPECT_LE(ew, kTolerance) << t.name;
    EXPECT_LE(eu, kTolerance) << t.name << " (update)";
    if (eu > worst_u) worst_u = eu, worst_name = t.name;
    worst_w = std::max(worst_w, ew);
  }
  std::printf("[ muon %s ] worst weight error %.3g, worst update error %.3g (%s)\n", name.c_str(), worst_w, worst_u,
              worst_name.c_str());
  if (!muon_fixture().file.contains(name + ".momentum." + p.block_matrices().front().name)) return;
  Tensor momentum;
  for (const OptimizerState& st : opt->state_tensors())
    if (st.name == "muon.momentum_buffer") momentum = st.values;
  ASSERT_NE(momentum.data, nullptr);
  const std::vector<float> all = to_f32(*be, momentum);
  for (const ParameterMatrix& m : p.block_matrices()) {
    const int64_t at = m.offset - p.matrix_begin();
    const std::vector<float> got(all.begin() + at, all.begin() + at + m.rows * m.cols);
    EXPECT_LE(rel_error(got, muon_fixture().get(name + ".momentum." + m.name)), 1e-6) << m.name;
  }
}

TEST(Muon, AdjustLrOriginalWithClippingMatchesTorch) { check_case("original"); }
TEST(Muon, AdjustLrMatchRmsAdamWMatchesTorch) { check_case("match_rms_adamw"); }
TEST(Muon, PlainMomentumMatchesTorch) { check_case("plain_momentum"); }

// [other decayed][block matrices decayed][block matrices exempt][other exempt]; every Hugging
// Face matrix of the layers is one Muon matrix, inside the range.
TEST(Muon, ParameterLayout) {
  auto be = make_cpu_backend();
  ParameterSet p = make_params(*be);
  const ModelConfig& c = muon_fixture().config;
  ASSERT_EQ(p.block_matrices().size(), static_cast<size_t>(7 * c.num_hidden_layers));
  EXPECT_EQ(p.matrix_begin() % 128, 0);
  EXPECT_EQ(p.matrix_end() % 128, 0);
  EXPECT_LE(p.matrix_begin(), p.decay_end());
  EXPECT_LE(p.decay_end(), p.matrix_end());
  int64_t end = p.matrix_begin();
  for (const ParameterMatrix& m : p.block_matrices()) {
    EXPECT_GE(m.offset, end) << m.name;
    end = m.offset + m.rows * m.cols;
    EXPECT_LE(end, p.matrix_end()) << m.name;
    EXPECT_EQ(m.decayed, m.name != "model.layers.1.self_attn.o_proj.weight") << m.name;
    EXPECT_EQ(m.offset < p.decay_end(), m.decayed) << m.name;
  }
  EXPECT_EQ(p.block_matrices()[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p.block_matrices()[0].rows, c.num_attention_heads * c.head_dim);
  EXPECT_EQ(p.block_matrices()[1].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(p.block_matrices()[1].offset, p.block_matrices()[0].offset + p.block_matrices()[0].rows * c.hidden_size);
  for (const auto& [name, shape] : p.layout().fused) {
    const int64_t offset = static_cast<float*>(p.master(name).data) - p.master().ptr<float>();
    const bool matrix = name.rfind("layers.", 0) == 0 && shape.ndim == 2;
    EXPECT_EQ(offset >= p.matrix_begin() && offset < p.matrix_end(), matrix) << name;
  }
  Result<Optimizer> opt = Optimizer::create(*be, p, muon_case_options(muon_fixture().cases.at("original")));
  ASSERT_TRUE(opt.ok());
  const auto state = opt->state_tensors();
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[0].name, "adamw.exp_avg");
  EXPECT_EQ(state[0].values.numel(), p.size() - (p.matrix_end() - p.matrix_begin()));
  EXPECT_EQ(state[2].name, "muon.momentum_buffer");
  EXPECT_EQ(state[2].values.numel(), p.matrix_end() - p.matrix_begin());
}

// Two steps in one run equal one step, a save of the state, a fresh optimizer restored from it and
// a second step, bit for bit.
TEST(Muon, ResumeFromStateTensorsIsBitwiseEqual) {
  auto be = make_cpu_backend();
  const nlohmann::json& c = muon_fixture().cases.at("original");
  const float lr = c.at("lr").get<float>();
  ParameterSet a = make_params(*be);
  Result<Optimizer> oa = Optimizer::create(*be, a, muon_case_options(c));
  ASSERT_TRUE(oa.ok());
  step_with(*be, a, *oa, lr, 1);
  step_with(*be, a, *oa, lr, 2);

  ParameterSet b = make_params(*be);
  std::vector<std::pair<std::string, std::vector<float>>> saved;
  int64_t steps = 0;
  {
    Result<Optimizer> ob = Optimizer::create(*be, b, muon_case_options(c));
    ASSERT_TRUE(ob.ok());
    step_with(*be, b, *ob, lr, 1);
    for (const OptimizerState& st : ob->state_tensors()) saved.emplace_back(st.name, to_f32(*be, st.values));
    steps = ob->steps_taken();
  }
  Result<Optimizer> oc = Optimizer::create(*be, b, muon_case_options(c));
  ASSERT_TRUE(oc.ok());
  const auto state = oc->state_tensors();
  ASSERT_EQ(state.size(), saved.size());
  for (size_t i = 0; i < state.size(); ++i) {
    ASSERT_EQ(state[i].name, saved[i].first);
    Tensor host = state[i].values;
    host.data = saved[i].second.data();
    host.device = Device{};
    be->copy(state[i].values, host);
  }
  oc->restore_steps_taken(steps);
  step_with(*be, b, *oc, lr, 2);
  EXPECT_EQ(std::memcmp(to_f32(*be, a.master()).data(), to_f32(*be, b.master()).data(), a.size() * sizeof(float)), 0);
}

TEST(Muon, InvalidOptionsNameTheFlag) {
  auto be = make_cpu_backend();
  ParameterSet p = make_params(*be);
  auto refused = [&](OptimizerOptions o, const std::string& flag) {
    o.kind = OptimizerOptions::Kind::muon;
    Result<Optimizer> r = Optimizer::create(*be, p, o);
    ASSERT_FALSE(r.ok()) << flag;
    EXPECT_EQ(r.status().code(), StatusCode::invalid_argument) << flag;
    EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status().message();
  };
  OptimizerOptions o;
  for (float m : {-0.1f, 1.0f, 1.5f, NAN}) {
    o.muon_momentum = m;
    refused(o, "--muon-momentum");
  }
  o = OptimizerOptions{};
  o.muon_adjust_lr = static_cast<ops::MuonAdjustLr>(7);
  refused(o, "--muon-adjust-lr");
  for (int n : {-1, 100}) {
    o = OptimizerOptions{};
    o.muon_ns_steps = n;
    refused(o, "Newton-Schulz step count");
  }
  o = OptimizerOptions{};
  o.muon_eps = 0.0f;
  refused(o, "eps");
  o = OptimizerOptions{};
  o.muon_ns_b = INFINITY;
  refused(o, "coefficients");
  o = OptimizerOptions{};
  o.lr = -1.0f;
  refused(o, "--lr");
  o = OptimizerOptions{};
  o.beta2 = 1.0f;
  refused(o, "--betas");
  // The boundaries are accepted.
  o = OptimizerOptions{};
  o.kind = OptimizerOptions::Kind::muon;
  o.muon_momentum = 0.0f;
  o.muon_ns_steps = 0;
  EXPECT_TRUE(Optimizer::create(*be, p, o).ok());
}

}  // namespace
}  // namespace kiln::test
