// PNG encoding of 8-bit RGB images (what kiln plot writes): signature, IHDR, a tEXt "Software"
// chunk, the pixel rows (filter type 0 each) deflated by zlib into IDAT chunks, IEND.
// Ownership: plain functions over caller-owned pixels. Thread safety: none needed (no state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln::cli {

// `rgb` holds height rows of width pixels, 3 bytes (r, g, b) each, top row first.
Result<std::string> encode_png_rgb(const std::vector<uint8_t>& rgb, int width, int height);
// encode_png_rgb, then the bytes written to `path` (replaced if present); errors name the path.
Status write_png_rgb(const std::string& path, const std::vector<uint8_t>& rgb, int width, int height);

}  // namespace kiln::cli
