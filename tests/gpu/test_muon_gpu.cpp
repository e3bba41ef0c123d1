// The Muon optimizer on CUDA (bf16 Newton-Schulz, f32 master weights and momentum) against
// torch.optim.Muon's own bf16 arithmetic (testdata/muon/, case original_bf16: tests/reference/
// make_muon_fixture.py) and against kiln's CPU twin (f32), two steps each:
//   * the AdamW tensors (embeddings, norms, lm_head) and the Muon momentum buffers run the same f32
//     operations as the CPU twin: equal bit for bit;
//   * the block matrices' updates (weights after minus before) within 4e-2 relative L2 and 0.12
//     per element (test_util's elem_error: |got - want| / (|want| + rms(want))) of torch's bf16 run
//     and of the f32 CPU twin. Why so wide: bf16 keeps 8 bits, every Newton-Schulz product is
//     rounded to it and five iterations carry the error on; the fixture measured torch's own bf16
//     update 1.1-1.6e-2 (relative L2) away from its f32 one, and two independent bf16 runs
//     (cuBLASLt's summation order against oneDNN's) can differ by as much. Measured on an H200
//     (2025-12): 7.7e-3 / 2.5e-2 against torch's bf16 run, 1.6e-2 / 5.1e-2 against the CPU twin
//     (L2 / element), so the bounds leave a factor of 2.5 or more;
//   * the bf16 compute copy is the rounded f32 master.
// Skips with the reason where no GPU is present.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "muon_fixture.h"
#include "test_util.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace kiln::test {
namespace {

constexpr double kUpdateTolerance = 4e-2;      // relative L2 of a block matrix's update (see above)
constexpr double kUpdateElemTolerance = 0.12;  // per element of an update (elem_error; see above)

// A run of the fixture's two steps of `case_name` on `be`.
struct MuonRun {
  std::unique_ptr<ParameterSet> params;
  std::unique_ptr<Optimizer> opt;
};

MuonRun run_case(Backend& be, const std::string& case_name) {
  const nlohmann::json& c = muon_fixture().cases.at(case_name);
  Result<ParameterSet> p = ParameterSet::create(be, muon_fixture().config, muon_fixture().no_decay, be.device().is_cuda());
  KILN_ASSERT(p.ok());
  MuonRun r;
  r.params = std::make_unique<ParameterSet>(std::move(*p));
  set_hf_tensors(be, *r.params, r.params->master(), "init.");
  r.params->sync_compute(be);
  Result<Optimizer> opt = Optimizer::create(be, *r.params, muon_case_options(c));
  KILN_ASSERT(opt.ok());
  r.opt = std::make_unique<Optimizer>(std::move(*opt));
  for (int k = 1; k <= 2; ++k) {
    set_hf_tensors(be, *r.params, r.params->grads(), "grad" + std::to_string(k) + ".");
    Result<OptimizerStepInfo> info = r.opt->step(c.at("lr").get<float>());
    KILN_ASSERT(info.ok());
  }
  return r;
}

bool is_block_matrix(const ParameterSet& p, const std::string& hf_name) {
  for (const ParameterMatrix& m : p.block_matrices())
    if (m.name == hf_name) return true;
  return false;
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

TEST(MuonGpu, MatchesTorchBf16AndTheCpuTwin) {
  std::string reason;
  std::unique_ptr<Backend> gpu = gpu_backend_or_null(&reason);
  if (!gpu) GTEST_SKIP() << reason;
  auto cpu = make_cpu_backend();
  const MuonRun g = run_case(*gpu, "original_bf16");
  const MuonRun c = run_case(*cpu, "original_bf16");  // the CPU twin: f32 Newton-Schulz
  const ParameterSet& gp = *g.params;
  double worst_torch = 0, worst_cpu = 0, worst_el_torch = 0, worst_el_cpu = 0;
  for (const HfTensor& t : gp.layout().hf) {
    SCOPED_TRACE(t.name);
    const std::vector<float> got = to_f32(*gpu, gp.hf_view(gp.master(), t));
    const std::vector<float> cpu_got = to_f32(*cpu, c.params->hf_view(c.params->master(), t));
    const std::vector<float> want = muon_fixture().get("original_bf16." + t.name), init = muon_fixture().get("init." + t.name);
    if (!is_block_matrix(gp, t.name)) {
      EXPECT_EQ(std::memcmp(got.data(), cpu_got.data(), got.size() * sizeof(float)), 0) << "AdamW tensor";
      EXPECT_LE(elem_error(got, want), 1e-4);
      continue;
    }
    const double e_torch = rel_error(minus(got, init), minus(want, init));
    const double e_cpu = rel_error(minus(got, init), minus(cpu_got, init));
    EXPECT_LE(e_torch, kUpdateTolerance) << "update against torch's bf16 Muon";
    EXPECT_LE(e_cpu, kUpdateTolerance) << "update against the f32 CPU twin";
    const double el_torch = elem_error(minus(got, init), minus(want, init));
    const double el_cpu = elem_error(minus(got, init), minus(cpu_got, init));
    EXPECT_LE(el_torch, kUpdateElemTolerance) << "update elements against torch's bf16 Muon";
    EXPECT_LE(el_cpu, kUpdateElemTolerance) << "update elements against the f32 CPU twin";
    worst_torch = std::max(worst_torch, e_torch);
    worst_cpu = std::max(worst_cpu, e_cpu);
    worst_el_torch = std::max(worst_el_torch, el_torch);
    worst_el_cpu = std::max(worst_el_cpu, el_cpu);
  }
  std::printf("[ muon gpu ] worst block-matrix update error, relative L2: %.3g against torch bf16, %.3g against the "
              "CPU twin; per element: %.3g and %.3g\n",
              worst_torch, worst_cpu, worst_el_torch, worst_el_cpu);

  // The momentum buffers: the same f32 operations on both twins.
  Tensor gm, cm;
  for (const OptimizerState& st : g.opt->state_tensors())
    if (st.name == "muon.momentum_buffer") gm = st.values;
  for (const OptimizerState& st : c.opt->state_tensors())
    if (st.name == "muon.momentum_buffer") cm = st.values;
  ASSERT_NE(gm.data, nullptr);
  const std::vector<float> gmv = to_f32(*gpu, gm), cmv = to_f32(*cpu, cm);
  EXPECT_EQ(std::memcmp(gmv.data(), cmv.data(), gmv.size() * sizeof(float)), 0) << "momentum buffers";

  // The compute copy is the master rounded to bf16.
  const std::vector<float> master = to_f32(*gpu, gp.master()), compute = to_f32(*gpu, gp.compute());
  for (size_t i = 0; i < master.size(); ++i)
    if (bf16_to_f32(f32_to_bf16(master[i])) != compute[i]) {
      ADD_FAILURE() << "compute copy element " << i << ": " << compute[i] << " for master " << master[i];
      break;
    }
}

}  // namespace
}  // namespace kiln::test
