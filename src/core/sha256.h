// SHA-256 (FIPS 180-4) of bytes or a file, as lowercase hex: fingerprints of tokenizers, datasets and
// checkpoints (meta.json of preprocessed data, the trainer's resume checks).
// Thread safety: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kiln {

// Incremental hashing: update() any number of times, then hex_digest() once.
class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex_digest();

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buffer_[64];
  uint64_t length_ = 0;  // bytes hashed so far
  size_t buffered_ = 0;
};

std::string sha256_hex(std::string_view bytes);
// The file's digest, read in 1 MiB pieces; an error names the path.
Result<std::string> sha256_file(const std::string& path);

}  // namespace kiln
