// The Muon fixture (testdata/muon/, made by tests/reference/make_muon_fixture.py): torch's inputs
// and results for Muon + AdamW steps, shared by the CPU and GPU Muon tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace kiln::test {

struct MuonFixture {
  SafetensorsFile file;
  ModelConfig config;
  nlohmann::json cases;
  std::string no_decay;

  // The f32 tensor `name` of the fixture (asserts that it exists).
  std::vector<float> get(const std::string& name) const;
};

// Loaded once per process.
const MuonFixture& muon_fixture();
// The optimizer options of one of the fixture's cases.
OptimizerOptions muon_case_options(const nlohmann::json& c);
// Copies the fixture's tensors `prefix + <Hugging Face name>` into the [N] buffer `flat` of `p`.
void set_hf_tensors(Backend& be, const ParameterSet& p, Tensor flat, const std::string& prefix);

}  // namespace kiln::test
