// TensorBoardWriter and its encoders (see tensorboard.h).
//
// The protobuf wire format used here: a field is a key varint (field_number << 3 | wire_type)
// followed by its value; wire type 0 is a varint, 1 eight little-endian bytes, 2 a varint length and
// that many bytes, 5 four little-endian bytes. proto3 leaves out fields at their default value
// (step 0, wall time 0) except members of a oneof (simple_value, file_version, summary), and
// serializers emit fields in field-number order, which byte-identical output depends on.
#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace kiln {
namespace {

// Field numbers of tensorflow.Event, Summary and Summary.Value (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSourceMetadata = 10;
constexpr uint32_t kSourceMetadataWriter = 1;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// Event fields 1 and 2, each left out at its proto3 default (a negative step is a 10-byte varint,
// as int64 fields are encoded).
std::string event_header(double wall_time, int64_t step) {
  std::string out;
  if (wall_time != 0.0 || std::signbit(wall_time)) put_double(out, kEventWallTime, wall_time);
  if (step != 0) {
    put_key(out, kEventStep, kVarint);
    put_varint(out, static_cast<uint64_t>(step));
  }
  return out;
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string s(name);
  for (char& c : s)
    if (c == '/') c = '_';  // never a path separator inside the file name
  return s;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t tfrecord_masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, tfrecord_masked_crc(crc32c(out.data(), 8)), 4);
  out.append(data);
  put_le(out, tfrecord_masked_crc(crc32c(data.data(), data.size())), 4);
  return out;
}

std::string tensorboard_encode_file_version(double wall_time, std::string_view writer) {
  std::string out = event_header(wall_time, 0);
  put_bytes(out, kEventFileVersion, "brain.Event:2");
  if (!writer.empty()) {
    std::string source;
    put_bytes(source, kSourceMetadataWriter, writer);
    put_bytes(out, kEventSourceMetadata, source);
  }
  return out;
}

std::string tensorboard_encode_scalar(std::string_view tag, int64_t step, float value, double wall_time) {
  std::string v;
  put_bytes(v, kValueTag, tag);
  put_float(v, kValueSimpleValue, value);
  std::string summary;
  put_bytes(summary, kSummaryValue, v);
  std::string out = event_header(wall_time, step);
  put_bytes(out, kEventSummary, summary);
  return out;
}

double TensorBoardWriter::now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

Result<TensorBoardWriter> TensorBoardWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("cannot create the TensorBoard folder '" + dir + "': " + ec.message());
  const double wall_time = now();
  char stem[64];
  std::snprintf(stem, sizeof stem, "events.out.tfevents.%010lld.", static_cast<long long>(wall_time));
  const std::string base = (std::filesystem::path(dir) / (stem + hostname() + "." + std::to_string(::getpid()))).string();
  TensorBoardWriter w;
  for (int n = 0; !w.file_; ++n) {
    w.path_ = n == 0 ? base : base + "." + std::to_string(n);
    w.file_.reset(std::fopen(w.path_.c_str(), "wbx"));  // x: never append to another writer's file
    if (!w.file_ && (errno != EEXIST || n >= 1000))
      return io_error("cannot create the TensorBoard event file '" + w.path_ + "': " + std::strerror(errno) +
                      "; check that the folder is writable");
  }
  KILN_RETURN_IF_ERROR(w.write_record(tensorboard_encode_file_version(wall_time)));
  KILN_RETURN_IF_ERROR(w.flush());
  return w;
}

Status TensorBoardWriter::write_record(std::string_view data) {
  const std::string record = tfrecord_frame(data);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size())
    return io_error("cannot write to the TensorBoard event file '" + path_ + "' (disk full?)");
  return Status::Ok();
}

Status TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, double value, double wall_time) {
  return write_record(tensorboard_encode_scalar(tag, step, static_cast<float>(value), wall_time));
}

Status TensorBoardWriter::flush() {
  if (std::fflush(file_.get()) != 0)
    return io_error("cannot write to the TensorBoard event file '" + path_ + "' (disk full?)");
  return Status::Ok();
}

Status TensorBoardWriter::add_step(int64_t step, const StepReport& r, double wall_time) {
  KILN_RETURN_IF_ERROR(add_scalar("loss", step, r.loss, wall_time));
  KILN_RETURN_IF_ERROR(add_scalar("lr", step, r.lr, wall_time));
  KILN_RETURN_IF_ERROR(add_scalar("grad_norm", step, r.grad_norm, wall_time));
  KILN_RETURN_IF_ERROR(add_scalar("tokens_per_s", step, r.tokens_per_s(), wall_time));
  if (r.mfu > 0) KILN_RETURN_IF_ERROR(add_scalar("mfu", step, r.mfu, wall_time));
  if (r.memory_gib > 0) KILN_RETURN_IF_ERROR(add_scalar("memory_gib", step, r.memory_gib, wall_time));
  return flush();
}

}  // namespace kiln
