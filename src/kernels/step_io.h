// A step's inputs and outputs between pinned host memory (Backend::allocate_pinned: on CUDA the
// device reads and writes it directly) and the device, as ops of the step itself, so that a captured
// step carries its own transfers and nothing runs between two replays (infer/executor.h).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace kiln::ops {

// dst[0, n) = host[0, n) with n = host[0] (the packed inputs give their length in word 0), except
// that an id host[w] < 0 with ids_begin <= w < ids_begin + ids_count becomes prev_tokens[-1 - id]:
// the input token of a request continued from the step before, its sample on the device (an index
// past prev_tokens gives 0). dst: i32 on the device, at least host.numel() words; host: pinned i32,
// numel a multiple of 4, 16-byte aligned; prev_tokens: i32 on the device. expected_words: what n
// is expected to be at most (a captured step's bound), read before n is known so that the transfer
// costs one round trip; any n is still copied exactly.
void stage_step_inputs(Backend& be, Tensor dst, Tensor host, int64_t expected_words, int64_t ids_begin,
                       int64_t ids_count, Tensor prev_tokens);

// host = src, 4-byte words (i32 or f32); host pinned, src on the device.
void publish_step_outputs(Backend& be, Tensor host, Tensor src);

}  // namespace kiln::ops
