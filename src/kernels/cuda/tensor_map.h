// Tensor maps (TMA descriptors) of row-major bf16 matrices, for kiln's Hopper kernels: the one
// place that calls the driver's cuTensorMapEncodeTiled (through the runtime's entry point, so nothing
// links against libcuda). Host code; the maps are values (128 bytes) passed to kernels or copied to
// device memory.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace kiln::cuda {

// A map of `base` [rows, cols] (16-bit elements, row-major, consecutive rows `row_stride`
// elements apart; -1: cols) read in boxes of box_rows x box_cols elements; out-of-bounds elements
// read as zeros. The element type only names the 2-byte width here (f16 data is copied alike).
CUtensorMap bf16_tile_map(const void* base, int64_t rows, int64_t cols, int box_rows, int box_cols,
                          CUtensorMapSwizzle swizzle, int64_t row_stride = -1);

}  // namespace kiln::cuda
