// Golden-model checks shared by the CPU and GPU test programs: a model from testdata/ is run on a
// backend and compared with the Hugging Face transformers outputs stored beside it
// (golden.safetensors; see testdata/FIXTURES.md).
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace kiln::test {

// A golden tensor as f32 (float tensors) or i32 (int tensors) values.
std::vector<float> golden_floats(const std::string& model, const std::string& name);
std::vector<int32_t> golden_ints(const std::string& model, const std::string& name);

// Runs the full-sequence and incremental-decode checks of testdata/<model> on `be` with the given
// relative-error tolerance for logits; greedy tokens must be identical.
void check_golden_model(Backend& be, const std::string& model, double logits_tolerance);

}  // namespace kiln::test
