// Golden-model checks shared by the CPU and GPU test programs: a model from testdata/ is run on a
// backend and compared with the Hugging Face transformers outputs stored beside it
// (golden.safetensors; see testdata/FIXTURES.md).
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/transformer.h"

namespace kiln::test {

// A golden tensor as f32 (float tensors) or i32 (int tensors) values, from
// testdata/<model>/golden.safetensors, or from testdata/<model> when `model` names a .safetensors file.
std::vector<float> golden_floats(const std::string& model, const std::string& name);
std::vector<int32_t> golden_ints(const std::string& model, const std::string& name);

// Logits [n, vocab] (f32, host) of one full forward over `ids` (row t predicts token t + 1).
std::vector<float> full_forward_logits(const Transformer& m, const std::vector<int32_t>& ids);

// How the greedy continuation is compared with the reference's.
enum class GreedyCheck {
  exact,             // every token identical
  until_near_tie,    // identical up to the first step where the reference's two best logits are
                     // closer than 1% of its largest |logit| (a tie that bf16 cannot resolve);
                     // from there on the continuations may legitimately differ
};

// Runs the full-sequence checks and greedy decoding through the engine (its top log-probabilities per
// step against the reference logits) of testdata/<model> on `be` with the given
// relative-error tolerance for logits, and compares greedy tokens as `greedy` says.
void check_golden_model(Backend& be, const std::string& model, double logits_tolerance,
                        GreedyCheck greedy = GreedyCheck::exact);
// Teacher-forced decode: the prompt of the greedy fixture, then its reference tokens fed one per
// step through the engine's scheduler and executor (decode steps, CUDA graphs when use_graphs),
// whatever the model would have picked; every step's logits against the reference's full forward
// within logits_tolerance (relative L2). Returns the worst step's error.
double check_teacher_forced_decode(Backend& be, const std::string& model, double logits_tolerance, bool use_graphs);

// Tolerances (relative L2 errors) of a training check.
struct TrainingTolerances {
  double loss = 0, grads = 0, params = 0;
};

// The training checks of a fixture: `golden` (a .safetensors under testdata/) holds a batch
// (<prefix>.input_ids [rows, n], <prefix>.labels, optionally <prefix>.position_ids), its loss
// <prefix>.loss, every parameter's gradient grad.<name> and, when present, the parameters after one
// torch.optim.AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) step (adamw_step1.<name>)
// and the loss after it (train.loss_after_step1). testdata/<model> is the checkpoint trained.
// Optional: <prefix>.lengths (rows shorter than the stored width: a padded batch),
// <prefix>.label_smoothing, gradients under grad.<prefix>.<name> (several cases in one file).
void check_training_golden(Backend& be, const std::string& model, const std::string& golden, const std::string& prefix,
                           const TrainingTolerances& tol);

}  // namespace kiln::test
