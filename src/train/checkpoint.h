// Writing a trained model back as a Hugging Face checkpoint: config.json (the source's, with its
// dtype entry updated when the saved dtype differs), model.safetensors with Hugging Face tensor
// names (tied heads written once, as transformers does), and the source's tokenizer, chat-template
// and generation files copied unchanged.
//
// Files are written under temporary names and renamed into place, so an interrupted save leaves no
// truncated file behind. Thread safety: no shared state.
#pragma once

#include <string>

#include "backend/backend.h"
#include "backend/collectives.h"
#include "core/status.h"
#include "train/parameters.h"

namespace kiln {

// Creates `dir` (and parents) if needed and checks that files can be written there; call before
// training so that a bad --output fails in seconds, not after the run.
Status prepare_output_dir(const std::string& dir);

// Writes `text` to `path` through "<path>.partial", flushed to disk and renamed into place, so that
// `path` is either the old file or the whole new one.
Status write_file_atomic(const std::string& path, const std::string& text);

// Saves the master weights of `params` in `dtype` (f32, bf16 or f16): `master` ([N] f32, the whole
// master weights; empty: params.master(), which must then be whole).
Status save_hf_checkpoint(Backend& be, const ParameterSet& params, const std::string& source_dir,
                          const std::string& output_dir, DType dtype, Tensor master = {});

// The whole f32 master weights: params.master() itself, or, when they are sharded over the ranks of
// `collectives`, gathered from every rank into `storage` (a collective: every rank calls it).
Result<Tensor> whole_master(Backend& be, const ParameterSet& params, Collectives* collectives, TensorBuffer& storage);

}  // namespace kiln
