// Safetensors files: a read-only memory map of one file (SafetensorsFile), a model folder's
// checkpoint as one file or a sharded set (SafetensorsCheckpoint), and a writer for host tensors.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the data section.
//
// Ownership: a SafetensorsFile owns its mapping (unmapped on destruction; move-only); TensorInfo
// pointers stay valid while the file (or the checkpoint holding it) lives. TensorInfo::data may be
// unaligned (the format does not align tensors): read it with memcpy or copy it.
// Thread safety: after open() everything is read-only, so concurrent find()/names() calls are safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

struct TensorInfo {
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;  // inside the memory map; may be unaligned
  std::string file;            // the file that holds the tensor, for messages
  int64_t nbytes() const { return shape.numel() * dtype_size(dtype); }
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header and every entry's offsets against the file size. Tensors
  // whose dtype kiln does not read (F64, I8, U8, BOOL, F8_*, ...) or that have more than kMaxDims
  // dimensions are recorded; find() on them is an error, other tensors stay usable.
  static Result<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names in sorted order (including unusable ones).
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // not_found naming the tensor and the file; unsupported for a dtype kiln does not read.
  Result<TensorInfo> find(const std::string& name) const;
  // The header's "__metadata__" string values (empty when there is none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::string dtype_name;   // as written in the header
    std::string unsupported;  // non-empty: why find() refuses this tensor
    DType dtype = DType::f32;
    Shape shape;
    int64_t begin = 0;  // offsets into the data section
    int64_t end = 0;
  };
  SafetensorsFile() = default;
  void unmap();

  std::string path_;
  void* map_ = nullptr;
  int64_t map_bytes_ = 0;
  int64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A model folder's weights: <dir>/model.safetensors, or else <dir>/model.safetensors.index.json
// whose "weight_map" maps tensor names to shard files in the same folder.
class SafetensorsCheckpoint {
 public:
  // Opens every file up front (and checks that each tensor the index names is in its shard), so a
  // broken checkpoint fails here rather than half-way through loading.
  static Result<SafetensorsCheckpoint> open(const std::string& model_dir);

  const std::string& dir() const { return dir_; }
  // not_found naming the tensor and the folder when no file holds it.
  Result<TensorInfo> find(const std::string& name) const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes host tensors (in the given order) and string metadata to `path`. The header is padded
// with spaces to a multiple of 8 bytes. Writes to "<path>.partial" and renames it into place, so
// an interrupted save never leaves a truncated file under `path`. Errors: non-host tensors,
// duplicate or empty names, the reserved name "__metadata__", I/O failures.
Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata);

}  // namespace kiln
