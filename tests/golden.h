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

// How the greedy continuation is compared with the reference's.
enum class GreedyCheck {
  exact,             // every token identical
  until_near_tie,    // identical up to the first step where the reference's two best logits are
                     // closer than 1% of its largest |logit| (a tie that bf16 cannot resolve);
                     // from there on the continuations may legitimately differ
};

// Runs the full-sequence and incremental-decode checks of testdata/<model> on `be` with the given
// relative-error tolerance for logits, and compares greedy tokens as `greedy` says.
void check_golden_model(Backend& be, const std::string& model, double logits_tolerance,
                        GreedyCheck greedy = GreedyCheck::exact);

}  // namespace kiln::test
