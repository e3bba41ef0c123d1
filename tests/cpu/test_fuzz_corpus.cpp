// Replays the committed fuzz corpora (fuzz/corpus/<target>/) through every fuzz target
// (fuzz/fuzz_common.h): inputs that once found bugs, and the seeds. A target aborts on a broken
// invariant, which fails the suite.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

void replay(const std::string& target, int (*fn)(const uint8_t*, size_t)) {
  const fs::path dir = fs::path(KILN_FUZZ_CORPUS) / target;
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  ASSERT_FALSE(files.empty()) << "no corpus for " << target;
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.string());
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
}

TEST(FuzzCorpus, TokenizerEncode) { replay("tokenizer_encode", fuzz::tokenizer_encode); }
TEST(FuzzCorpus, TokenizerJson) { replay("tokenizer_json", fuzz::tokenizer_json); }
TEST(FuzzCorpus, ConfigJson) { replay("config_json", fuzz::config_json); }
TEST(FuzzCorpus, SafetensorsHeader) { replay("safetensors_header", fuzz::safetensors_header); }
TEST(FuzzCorpus, ChatTemplate) { replay("chat_template", fuzz::chat_template); }
TEST(FuzzCorpus, TrainingJsonl) { replay("training_jsonl", fuzz::training_jsonl); }
TEST(FuzzCorpus, KilnShard) { replay("kiln_shard", fuzz::kiln_shard); }
TEST(FuzzCorpus, RegexPattern) { replay("regex_pattern", fuzz::regex_pattern); }
TEST(FuzzCorpus, ServeRequest) { replay("serve_request", fuzz::serve_request); }

}  // namespace
}  // namespace kiln::test
