// TensorBoard event files (train/tensorboard.h) against independent references: CRC-32C check
// values of RFC 3720 (B.4) and the common "123456789" check, and an event file written by the Python
// `tensorboard` package (tests/reference/make_tensorboard_reference.py -> testdata/tensorboard/):
// kiln's records for the same events must be byte-identical, framing included.
// With KILN_TENSORBOARD_OUT=DIR the test also leaves a training-like kiln event file in DIR, for the
// script's --read (tensorboard's EventAccumulator) to show that TensorBoard reads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/tensorboard.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

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
  const auto before = static_cast<long long>(std::time(nullptr));
  Result<TensorBoardWriter> w = TensorBoardWriter::open((tmp.path / "tb").string());  // creates the folder
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const RefScalar& s : ref.scalars) ASSERT_TRUE(w->add_scalar(s.tag, s.step, s.value, s.wall_time).ok());
  ASSERT_TRUE(w->flush().ok());
  const auto after = static_cast<long long>(std::time(nullptr));

  const fs::path path(w->path());
  EXPECT_EQ(path.parent_path(), tmp.path / "tb");
  std::smatch m;
  const std::string name = path.filename().string();
  ASSERT_TRUE(std::regex_match(name, m, std::regex(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+))"))) << name;
  EXPECT_GE(std::stoll(m[1]), before);
  EXPECT_LE(std::stoll(m[1]), after);
  EXPECT_EQ(std::stoll(m[3]), static_cast<long long>(::getpid()));

  const std::vector<std::string> records = read_records(slurp(path));
  ASSERT_EQ(records.size(), 1 + ref.scalars.size());
  // The first record: this run's wall time (field 1, a double at bytes 1..8), then as encoded.
  ASSERT_GE(records[0].size(), 9u);
  ASSERT_EQ(records[0][0], '\x09');
  double wall;
  const uint64_t bits = read_le(records[0], 1, 8);
  std::memcpy(&wall, &bits, 8);
  EXPECT_GE(wall, static_cast<double>(before));
  EXPECT_LE(wall, static_cast<double>(after + 1));
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
