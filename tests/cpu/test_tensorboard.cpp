// TensorBoard event files (train/tensorboard.h) against independent references: CRC-32C check
// values of RFC 3720 (B.4) and the common "123456789" check, and an event file written by the Python
// `tensorboard` package (tests/reference/make_tensorboard_reference.py -> testdata/tensorboard/):
// kiln's records for the same events must be byte-identical, framing included.
// `kiln train --tensorboard DIR` end to end: the event file's scalars, decoded by the test's own
// protobuf reader, are the run's metrics.jsonl figures (tag, step and value).
// With KILN_TENSORBOARD_OUT=DIR the test also leaves a training-like kiln event file in DIR, for the
// script's --read (tensorboard's EventAccumulator) to show that TensorBoard reads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/tensorboard.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

// Seconds since the epoch on the clock the writer stamps its events with.
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t read_le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

// The test's own TFRecord reader: checks both masked CRCs of every record, returns the data.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_LE(at + 12, file.size()) << "truncated record header at byte " << at;
    if (at + 12 > file.size()) break;
    const uint64_t len = read_le(file, at, 8);
    EXPECT_EQ(read_le(file, at + 8, 4), tfrecord_masked_crc(crc32c(file.data() + at, 8))) << "at byte " << at;
    EXPECT_LE(at + 16 + len, file.size()) << "truncated record at byte " << at;
    if (at + 16 + len > file.size()) break;
    out.push_back(file.substr(at + 12, len));
    EXPECT_EQ(read_le(file, at + 12 + len, 4), tfrecord_masked_crc(crc32c(out.back().data(), len))) << "at byte " << at;
    at += 16 + len;
  }
  return out;
}

// The test's own protobuf decoding of the events kiln writes (tensorflow/core/util/event.proto and
// framework/summary.proto): Event {1: wall_time double, 2: step int64, 3: file_version string,
// 5: summary Summary}, Summary {1: repeated value Value}, Value {1: tag string, 2: simple_value
// float}. Fields it does not need are skipped by wire type.
struct ProtoField {
  uint32_t number = 0, wire = 0;
  uint64_t bits = 0;  // wire 0: the varint; wire 1 and 5: the 64 or 32 little-endian bits
  std::string bytes;  // wire 2
};

// The fields of one message, or nullopt when it does not parse.
std::optional<std::vector<ProtoField>> proto_fields(const std::string& msg) {
  std::vector<ProtoField> out;
  size_t at = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && at < msg.size(); shift += 7) {
      const auto b = static_cast<unsigned char>(msg[at++]);
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (at < msg.size()) {
    uint64_t key;
    if (!varint(&key)) return std::nullopt;
    ProtoField f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) {
      if (!varint(&f.bits)) return std::nullopt;
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      if (at + n > msg.size()) return std::nullopt;
      f.bits = read_le(msg, at, n);
      at += n;
    } else if (f.wire == 2) {
      uint64_t len;
      if (!varint(&len) || len > msg.size() - at) return std::nullopt;
      f.bytes = msg.substr(at, len);
      at += len;
    } else {
      return std::nullopt;
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;  // summary values: tag, simple_value
};

std::optional<DecodedEvent> decode_event(const std::string& record) {
  auto fields = proto_fields(record);
  if (!fields) return std::nullopt;
  DecodedEvent e;
  for (const ProtoField& f : *fields) {
    if (f.number == 1 && f.wire == 1) std::memcpy(&e.wall_time, &f.bits, 8);
    if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.bits);
    if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    if (f.number != 5 || f.wire != 2) continue;
    auto summary = proto_fields(f.bytes);
    if (!summary) return std::nullopt;
    for (const ProtoField& v : *summary) {
      if (v.number != 1 || v.wire != 2) continue;
      auto value = proto_fields(v.bytes);
      if (!value) return std::nullopt;
      std::pair<std::string, float> scalar{"", std::numeric_limits<float>::quiet_NaN()};
      for (const ProtoField& x : *value) {
        if (x.number == 1 && x.wire == 2) scalar.first = x.bytes;
        if (x.number == 2 && x.wire == 5) {
          const auto bits = static_cast<uint32_t>(x.bits);
          std::memcpy(&scalar.second, &bits, 4);
        }
      }
      e.scalars.push_back(scalar);
    }
  }
  return e;
}

struct RefScalar {
  std::string tag;
  int64_t step;
  double value, wall_time;
};
struct Reference {
  double file_version_wall_time;
  std::string writer;
  std::vector<RefScalar> scalars;
  std::string file;
};

Reference load_reference() {
  const fs::path dir = fs::path(testdata_dir()) / "tensorboard";
  nlohmann::json j = nlohmann::json::parse(slurp(dir / "reference_events.json"));
  Reference r;
  r.file_version_wall_time = j["file_version_wall_time"];
  r.writer = j["writer"];
  for (const auto& s : j["scalars"]) {
    double v;
    if (s["value"].is_string())
      v = std::strtod(s["value"].get<std::string>().c_str(), nullptr);  // "inf", "nan"
    else
      v = s["value"];
    r.scalars.push_back({s["tag"], s["step"], v, s["wall_time"]});
  }
  r.file = slurp(dir / "events.out.tfevents.1700000000.reference");
  return r;
}

TEST(TensorBoard, Crc32cCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  // RFC 3720, B.4 (the CRC bytes it lists are the little-endian form of these values).
  unsigned char buf[32];
  std::memset(buf, 0, 32);
  EXPECT_EQ(crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, 32);
  EXPECT_EQ(crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(buf, 32), 0x113FDB5Cu);
  const unsigned char iscsi_read[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                        0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(crc32c(iscsi_read, 48), 0xD9963A56u);
  // Continuing a CRC over a second piece equals the CRC of the whole.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(TensorBoard, RecordsMatchTheTensorboardPackageByteForByte) {
  const Reference ref = load_reference();
  ASSERT_FALSE(ref.file.empty()) << "missing testdata/tensorboard reference: run tests/reference/make_tensorboard_reference.py";
  const std::vector<std::string> records = read_records(ref.file);
  ASSERT_EQ(records.size(), 1 + ref.scalars.size());
  EXPECT_EQ(records[0], tensorboard_encode_file_version(ref.file_version_wall_time, ref.writer));
  std::string whole = tfrecord_frame(tensorboard_encode_file_version(ref.file_version_wall_time, ref.writer));
  for (size_t i = 0; i < ref.scalars.size(); ++i) {
    const RefScalar& s = ref.scalars[i];
    const std::string mine = tensorboard_encode_scalar(s.tag, s.step, static_cast<float>(s.value), s.wall_time);
    EXPECT_EQ(records[1 + i], mine) << "event " << i << " (" << s.tag.substr(0, 20) << ", step " << s.step << ")";
    whole += tfrecord_frame(mine);
  }
  EXPECT_EQ(whole, ref.file) << "the framed file differs";
}

TEST(TensorBoard, WriterNamesTheFileAsTensorboardAndWritesTheSameRecords) {
  const Reference ref = load_reference();
  TempDir tmp;
  // The writer's clock (system_clock); std::time may read a coarser clock that lags it by a tick.
  const double before = wall_now();
  Result<TensorBoardWriter> w = TensorBoardWriter::open((tmp.path / "tb").string());  // creates the folder
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const RefScalar& s : ref.scalars) ASSERT_TRUE(w->add_scalar(s.tag, s.step, s.value, s.wall_time).ok());
  ASSERT_TRUE(w->flush().ok());
  const double after = wall_now();

  const fs::path path(w->path());
  EXPECT_EQ(path.parent_path(), tmp.path / "tb");
  std::smatch m;
  const std::string name = path.filename().string();
  ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+))"))) << name;
  EXPECT_GE(std::stoll(m[1]), static_cast<long long>(before));  // whole seconds of the wall time
  EXPECT_LE(std::stoll(m[1]), static_cast<long long>(after));
  EXPECT_EQ(std::stoll(m[3]), static_cast<long long>(::getpid()));

  const std::vector<std::string> records = read_records(slurp(path));
  ASSERT_EQ(records.size(), 1 + ref.scalars.size());
  // The first record: this run's wall time (field 1, a double at bytes 1..8), then as encoded.
  ASSERT_GE(records[0].size(), 9u);
  ASSERT_EQ(records[0][0], '\x09');
  double wall;
  const uint64_t bits = read_le(records[0], 1, 8);
  std::memcpy(&wall, &bits, 8);
  EXPECT_GE(wall, before);
  EXPECT_LE(wall, after);
  EXPECT_EQ(records[0], tensorboard_encode_file_version(wall, "kiln"));
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  const std::vector<std::string> reference_records = read_records(ref.file);
  for (size_t i = 1; i < records.size(); ++i) EXPECT_EQ(records[i], reference_records[i]) << "event " << i;

  // A second writer in the same folder gets its own file.
  Result<TensorBoardWriter> w2 = TensorBoardWriter::open((tmp.path / "tb").string());
  ASSERT_TRUE(w2.ok()) << w2.status().message();
  EXPECT_NE(w2->path(), w->path());
  EXPECT_EQ(read_records(slurp(w->path())).size(), 1 + ref.scalars.size());
}

TEST(TensorBoard, AddStepWritesTheMetricsScalarsAndFlushes) {
  TempDir tmp;
  Result<TensorBoardWriter> w = TensorBoardWriter::open(tmp.path.string());
  ASSERT_TRUE(w.ok()) << w.status().message();
  StepReport r;
  r.loss = 2.25;
  r.lr = 3e-4;
  r.grad_norm = 0.5;
  r.tokens = 1000;
  r.seconds = 0.5;
  ASSERT_TRUE(w->add_step(7, r, 1700000100.5).ok());
  // No close: add_step flushed, so the file already holds everything.
  const std::vector<std::string> records = read_records(slurp(w->path()));
  ASSERT_EQ(records.size(), 5u);
  EXPECT_EQ(records[1], tensorboard_encode_scalar("loss", 7, 2.25f, 1700000100.5));
  EXPECT_EQ(records[2], tensorboard_encode_scalar("lr", 7, 3e-4f, 1700000100.5));
  EXPECT_EQ(records[3], tensorboard_encode_scalar("grad_norm", 7, 0.5f, 1700000100.5));
  EXPECT_EQ(records[4], tensorboard_encode_scalar("tokens_per_s", 7, 2000.0f, 1700000100.5));
}

TEST(TensorBoard, UnwritableFolderIsAnErrorNamingThePath) {
  TempDir tmp;
  fs::create_directories(tmp.path);
  std::ofstream(tmp.path / "file") << "not a folder";
  const std::string dir = (tmp.path / "file" / "tb").string();
  Result<TensorBoardWriter> w = TensorBoardWriter::open(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find(dir), std::string::npos) << w.status().message();
}

// The test's decoder reads the tensorboard package's file as the reference's JSON describes it.
TEST(TensorBoard, TestDecoderReadsTheTensorboardPackageFile) {
  const Reference ref = load_reference();
  const std::vector<std::string> records = read_records(ref.file);
  ASSERT_EQ(records.size(), 1 + ref.scalars.size());
  std::optional<DecodedEvent> first = decode_event(records[0]);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->file_version, "brain.Event:2");
  EXPECT_EQ(first->wall_time, ref.file_version_wall_time);
  for (size_t i = 0; i < ref.scalars.size(); ++i) {
    const RefScalar& s = ref.scalars[i];
    std::optional<DecodedEvent> e = decode_event(records[1 + i]);
    ASSERT_TRUE(e.has_value()) << "event " << i;
    EXPECT_EQ(e->step, s.step) << "event " << i;
    EXPECT_EQ(e->wall_time, s.wall_time) << "event " << i;
    ASSERT_EQ(e->scalars.size(), 1u) << "event " << i;
    EXPECT_EQ(e->scalars[0].first, s.tag) << "event " << i;
    const float want = static_cast<float>(s.value);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(e->scalars[0].second)) << "event " << i;
    else
      EXPECT_EQ(e->scalars[0].second, want) << "event " << i;
  }
}

// kiln train --tensorboard: one event file whose scalars are metrics.jsonl's, step for step: loss,
// lr, grad_norm and tokens_per_s of every step line and val_loss of every validation line (the run
// evaluates at steps 0, 2 and 4), each value the line's rounded to a 32-bit float as simple_value is.
TEST(TensorBoard, TrainFlagWritesTheMetricsOfTheRun) {
  TempDir tmp;
  std::string data;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 12; ++t) ids.push_back(3 + (i * 37 + (1 + i % 3) * t) % 380);
    data += nlohmann::json({{"input_ids", ids}}).dump() + "\n";
  }
  const std::string jsonl = tmp.file("d.jsonl", data), run = tmp.sub("run"), tb = tmp.sub("tb");
  const double before = wall_now();
  RunResult r = run_kiln("train --model " + testdata_dir() + "/tiny-llama --data " + jsonl + " --val-data " + jsonl +
                         " --output " + run + " --tensorboard " + tb +
                         " --steps 4 --batch-size 2 --lr 0.01 --lr-schedule linear --eval-every 2 --clip-norm 0.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double after = wall_now();

  // What metrics.jsonl says, keyed by (tag, step).
  std::map<std::pair<std::string, int64_t>, float> want;
  std::ifstream metrics(run + "/metrics.jsonl");
  int step_lines = 0, eval_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t step = j.at("step");
    const bool eval = j.contains("val_loss");
    (eval ? eval_lines : step_lines) += 1;
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu", "memory_gib", "val_loss"})
      if (j.contains(key)) want[{key, step}] = static_cast<float>(j[key].get<double>());
  }
  ASSERT_EQ(step_lines, 4);
  ASSERT_EQ(eval_lines, 3);
  ASSERT_EQ(want.size(), 4u * 4u + 3u);

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(tb)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];
  const std::vector<std::string> records = read_records(slurp(files[0]));
  ASSERT_FALSE(records.empty());
  std::optional<DecodedEvent> first = decode_event(records[0]);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->file_version, "brain.Event:2");
  std::map<std::pair<std::string, int64_t>, float> got;
  for (size_t i = 1; i < records.size(); ++i) {
    std::optional<DecodedEvent> e = decode_event(records[i]);
    ASSERT_TRUE(e.has_value()) << "record " << i << " is not a protobuf Event";
    ASSERT_EQ(e->scalars.size(), 1u) << "record " << i;
    EXPECT_GE(e->wall_time, before) << "record " << i;
    EXPECT_LE(e->wall_time, after) << "record " << i;
    const auto key = std::make_pair(e->scalars[0].first, e->step);
    EXPECT_EQ(got.count(key), 0u) << "twice: " << key.first << " at step " << key.second;
    got[key] = e->scalars[0].second;
  }
  EXPECT_EQ(got.size(), records.size() - 1);
  for (const auto& [key, value] : want) {
    auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << "no " << key.first << " at step " << key.second << " in the event file";
      continue;
    }
    EXPECT_EQ(it->second, value) << key.first << " at step " << key.second;
  }
  for (const auto& [key, value] : got)
    EXPECT_EQ(want.count(key), 1u) << "the event file has " << key.first << " at step " << key.second
                                   << ", metrics.jsonl does not";
}

// Not a check: a training-like file for tensorboard's EventAccumulator to read (see the header).
TEST(TensorBoard, LeavesAKilnFileForTheTensorboardPackage) {
  const char* out = std::getenv("KILN_TENSORBOARD_OUT");
  if (out == nullptr || *out == '\0') GTEST_SKIP() << "set KILN_TENSORBOARD_OUT=DIR to keep a kiln event file";
  Result<TensorBoardWriter> w = TensorBoardWriter::open(out);
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (int step = 1; step <= 50; ++step) {
    StepReport r;
    r.loss = 4.0 * std::exp(-step / 20.0) + 0.5;
    r.lr = 1e-4 * std::min(1.0, step / 10.0);
    r.grad_norm = 1.0 + 0.5 * std::sin(step);
    r.tokens = 4096;
    r.seconds = 0.25;
    const double t = 1700000000.0 + step;
    ASSERT_TRUE(w->add_step(step, r, t).ok());
    if (step % 10 == 0) {
      ASSERT_TRUE(w->add_scalar("val_loss", step, r.loss + 0.1, t).ok());
      ASSERT_TRUE(w->flush().ok());
    }
  }
  std::printf("kiln event file: %s\n", w->path().c_str());
}

}  // namespace
}  // namespace kiln::test
