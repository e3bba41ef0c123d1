// Preprocessed training data on disk: binary shards that are memory-mapped, never loaded whole.
//
// A preprocessed directory (written by `kiln preprocess`) holds meta.json (see preprocess.h) and,
// per split ("train", "val"), files `<split>-00000.kshard`, `<split>-00001.kshard`, ... Each shard is
// little-endian:
//
//   header        64 bytes: magic "KILNSHD1", u32 version (1), u32 header size (64),
//                 i64 rows, i64 tokens, i64 documents, 24 reserved bytes (0)
//   row_offsets   i64 [rows + 1]   token index where each row starts (row_offsets[rows] = tokens)
//   doc_starts    i64 [documents]  token index where each document (or piece of a split document)
//                                  starts, increasing; every row start is one
//   tokens        i32 [tokens]     token ids
//   loss_mask     u8  [tokens]     1: the token is a training target (predicted from the one before)
//
// each section starting at a multiple of 64 bytes. A row is what a training sequence holds: one or
// several packed documents; rotary positions restart at every document start, attention does not
// cross documents, and the first token of a document is never a target.
//
// Ownership: a ShardWriter owns its open file; a Shard owns its mapping (move-only).
// Thread safety: a Shard is immutable and may be read from several threads.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace kiln {

// One document of tokens with its per-token target mask.
struct TokenDocument {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // same length; 1 = target
};

// A row as stored: its tokens, mask, and where its documents start (row-relative, [0] = 0).
struct ShardRow {
  std::span<const int32_t> ids;
  std::span<const uint8_t> mask;
  std::vector<int32_t> doc_starts;
};

// Writes one shard. Rows are appended as lists of documents; finish() writes the file.
class ShardWriter {
 public:
  explicit ShardWriter(std::string path) : path_(std::move(path)) {}
  // One row made of `docs` (each non-empty), concatenated in order.
  void add_row(const std::vector<const TokenDocument*>& docs);
  int64_t rows() const { return static_cast<int64_t>(row_offsets_.size()) - 1; }
  int64_t tokens() const { return static_cast<int64_t>(ids_.size()); }
  // Writes the file (under a temporary name, renamed when complete) and flushes it to disk.
  Status finish();

 private:
  std::string path_;
  std::vector<int64_t> row_offsets_{0};
  std::vector<int64_t> doc_starts_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> mask_;
};

class Shard {
 public:
  // Maps and validates the layout (sizes, increasing offsets, documents inside the data, every row
  // start a document start); a damaged file is an error naming it.
  static Result<Shard> open(const std::string& path);
  Shard(Shard&&) noexcept;
  Shard& operator=(Shard&&) noexcept;
  Shard(const Shard&) = delete;
  ~Shard();

  int64_t rows() const { return rows_; }
  int64_t tokens() const { return tokens_; }
  int64_t documents() const { return documents_; }
  ShardRow row(int64_t r) const;
  const std::string& path() const { return path_; }

 private:
  Shard() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  int64_t rows_ = 0, tokens_ = 0, documents_ = 0;
  const int64_t* row_offsets_ = nullptr;
  const int64_t* doc_starts_ = nullptr;
  const int32_t* ids_ = nullptr;
  const uint8_t* mask_ = nullptr;
};

}  // namespace kiln
