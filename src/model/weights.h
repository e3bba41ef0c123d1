// Loading one checkpoint tensor onto a backend: shape check against what the config implies,
// dtype conversion on the host (f32 / bf16 / f16 in any direction), copy to the device.
// Ownership: the returned TensorBuffer owns its device memory. Thread safety: safe to call
// concurrently for different backends; one Backend is used by one thread at a time.
#pragma once

#include <string>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/safetensors.h"

namespace kiln {

// `name` from `ckpt` as a `target_dtype` tensor (f32, bf16 or f16) on be's device. Errors name the
// tensor and its file: not in the checkpoint, shape different from `expected_shape`, an integer or
// unsupported dtype in the file ("dtype mismatch"), out of device memory.
Result<TensorBuffer> load_tensor(Backend& be, const SafetensorsCheckpoint& ckpt, const std::string& name,
                                 Shape expected_shape, DType target_dtype);

// The same into existing memory: `dst` (on the host or on be's device, a float dtype, contiguous;
// a rows() slice of a larger tensor is fine) gives the expected shape and the target dtype.
Status load_tensor_into(Backend& be, const SafetensorsCheckpoint& ckpt, const std::string& name, Tensor dst);

// The checks of load_tensor alone (present, expected shape, a float dtype), allocating nothing: a
// loader runs them for every tensor before it allocates, so a config.json that does not match its
// checkpoint fails before it costs memory.
Status check_tensor(const SafetensorsCheckpoint& ckpt, const std::string& name, const Shape& expected_shape);

}  // namespace kiln
