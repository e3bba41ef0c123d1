// TensorBoard event files: scalars of a run written as TensorBoard (and anything reading its format)
// reads them, without TensorFlow or a protobuf library.
//
// The file, DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>, is a sequence of TFRecords
// (u64 little-endian length, masked CRC-32C of those 8 bytes, the data, masked CRC-32C of the
// data); each record's data is a serialized tensorflow.Event protobuf. The first event carries
// file_version "brain.Event:2" and source_metadata.writer "kiln", the others one scalar each
// (summary.value[0] = {tag, simple_value}).
// The protobuf fields are encoded by hand (tensorboard_encode_* below, exposed for the tests).
//
// Ownership: TensorBoardWriter owns its file (closed on destruction). Thread safety: none; one
// writer per thread (the training loop).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "train/trainer.h"

namespace kiln {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as iSCSI and TFRecord use), optionally
// continuing from a previous value: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's mask of a CRC (stored CRCs are masked so that a CRC of data holding CRCs stays strong).
uint32_t tfrecord_masked_crc(uint32_t crc);
// One TFRecord around `data`.
std::string tfrecord_frame(std::string_view data);
// The serialized Event protobufs this writer emits (not framed).
// The first event; `writer` names the program in source_metadata (empty: the field left out).
std::string tensorboard_encode_file_version(double wall_time, std::string_view writer = "kiln");
std::string tensorboard_encode_scalar(std::string_view tag, int64_t step, float value, double wall_time);

class TensorBoardWriter {
 public:
  // Creates DIR (if absent) and a new event file in it, and writes the file_version event. A second
  // writer in the same second and process gets a ".1", ".2", ... suffix rather than sharing a file.
  static Result<TensorBoardWriter> open(const std::string& dir);
  // The current time as TensorBoard records it: seconds since the Unix epoch, with fractions.
  static double now();

  // Appends one scalar event (value stored as a 32-bit float, as TensorBoard's simple_value is).
  // Buffered: call flush() after the step's scalars.
  Status add_scalar(std::string_view tag, int64_t step, double value, double wall_time);
  // Writes what is buffered to the file.
  Status flush();
  // One training step's scalars under the metrics.jsonl names (loss, lr, grad_norm, tokens_per_s),
  // all with the same wall time, then flush().
  Status add_step(int64_t step, const StepReport& r, double wall_time);

  const std::string& path() const { return path_; }

 private:
  Status write_record(std::string_view data);
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Close> file_;
  std::string path_;
};

}  // namespace kiln
