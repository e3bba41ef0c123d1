// kiln preprocess and kiln train end to end on the CPU: text documents preprocessed for a fixture
// model with a tokenizer (testdata/tiny-chat), pretraining until the validation loss falls well
// below its start, then generation from the result; the flags' errors are clear.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/dataset.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

std::string model() { return testdata_dir() + "/tiny-chat"; }

// Sentences from a small grammar: learnable structure, so the loss can fall far.
std::string text_jsonl(int docs, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> subj = {"the cat", "a dog", "the bird", "a fish"}, verb = {"sits", "runs", "sings", "swims"},
                                 place = {"on the hill", "in the river", "under the tree", "over the house"};
  std::string s;
  for (int d = 0; d < docs; ++d) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      const size_t k = rng() % 4;
      text += (i ? " " : "") + subj[k] + " " + verb[k] + " " + place[(k + rng() % 2) % 4] + ".";
    }
    s += nlohmann::json({{"text", text}}).dump() + "\n";
  }
  return s;
}

std::vector<double> val_losses(const std::string& output) {
  std::vector<double> out;
  std::regex re("eval step \\d+ val_loss ([0-9.]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

TEST(CliPreprocess, TextPretrainingLowersValidationLossThenGenerates) {
  TempDir tmp;
  const std::string data = tmp.sub("data");
  RunResult p = run_kiln("preprocess --model " + model() + " --input " + tmp.file("a.jsonl", text_jsonl(300, 1)) +
                         " --input " + tmp.file("b.jsonl", text_jsonl(100, 2)) + " --output " + data +
                         " --seq-len 96 --val-fraction 0.1 --seed 5");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(data + "/meta.json"));
  EXPECT_EQ(meta["documents"], 400);
  EXPECT_EQ(meta["splits"]["val"]["documents"], 40);
  EXPECT_EQ(meta["inputs"].size(), 2u);
  EXPECT_GT(meta["splits"]["train"]["packing_efficiency"].get<double>(), 0.9);
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 384);

  RunResult t = run_kiln("train --model " + model() + " --data " + data + " --output " + tmp.sub("run") +
                         " --steps 150 --batch-size 4 --lr 0.01 --lr-schedule cosine --warmup-steps 10 --eval-every 50 --shuffle");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::vector<double> val = val_losses(t.output);
  ASSERT_EQ(val.size(), 4u) << t.output;  // steps 0, 50, 100, 150
  EXPECT_LT(val.back(), 0.4 * val.front()) << t.output;
  std::ifstream metrics(tmp.sub("run") + "/metrics.jsonl");
  int val_lines = 0;
  for (std::string line; std::getline(metrics, line);) val_lines += nlohmann::json::parse(line).contains("val_loss");
  EXPECT_EQ(val_lines, 4);

  RunResult g = run_kiln("generate --model " + tmp.sub("run") + " --prompt 'the cat' --max-tokens 8");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.stdout_only.find("the cat"), std::string::npos) << g.output;
}

// The shards of a chat preprocess hold transformers' ids, with targets exactly where its
// return_assistant_tokens_mask marks assistant tokens (the first token of a row excepted: nothing
// precedes it). Reference: tests/reference/make_tiny_chat_masks.py.
TEST(CliPreprocess, ChatTargetsAreTransformersAssistantMask) {
  TempDir tmp;
  const nlohmann::json ref =
      nlohmann::json::parse(std::ifstream(testdata_dir() + "/chat_masks/tiny_chat_preprocess.json"));
  std::string lines;
  for (const auto& c : ref["cases"]) lines += c["line"].dump() + "\n";
  RunResult p = run_kiln("preprocess --model " + model() + " --format chat --no-pack --seq-len 256 --input " +
                         tmp.file("chat.jsonl", lines) + " --output " + tmp.sub("data"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  Result<ModelConfig> config = load_model_config(model());
  ASSERT_TRUE(config.ok());
  Result<std::unique_ptr<TrainingData>> data = TrainingData::open(tmp.sub("data"), "train", *config, model());
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->format(), "chat");
  ASSERT_EQ((*data)->rows(), static_cast<int64_t>(ref["cases"].size()));
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const auto& c = ref["cases"][i];
    const TrainExample ex = (*data)->example(static_cast<int64_t>(i), /*every_token=*/false);
    EXPECT_EQ(ex.input_ids, c["input_ids"].get<std::vector<int32_t>>()) << "conversation " << i;
    const std::vector<int32_t> mask = c["assistant_masks"].get<std::vector<int32_t>>();
    ASSERT_EQ(ex.labels.size(), mask.size());
    for (size_t t = 0; t < mask.size(); ++t)
      EXPECT_EQ(ex.labels[t] != -100, t > 0 && mask[t] == 1) << "conversation " << i << " token " << t;
  }
  // A line without messages, and a conversation without an assistant turn, name their line.
  RunResult bad = run_kiln("preprocess --model " + model() + " --format chat --seq-len 256 --input " +
                           tmp.file("bad.jsonl", lines + "{\"text\": \"x\"}\n") + " --output " + tmp.sub("bad"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("bad.jsonl:5: no \"messages\" key"), std::string::npos) << bad.output;
  RunResult none = run_kiln("preprocess --model " + model() + " --format chat --seq-len 256 --input " +
                            tmp.file("none.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n") +
                            " --output " + tmp.sub("none"));
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.output.find("none.jsonl:1:"), std::string::npos) << none.output;
}

// Chat SFT end to end: preprocess conversations, train with the default objective (sft, from the
// chat data), the validation loss falls well below its start, and the model answers like the data.
TEST(CliPreprocess, ChatSftLowersValidationLossThenAnswers) {
  TempDir tmp;
  const std::vector<std::pair<std::string, std::string>> facts = {
      {"sky", "blue"}, {"grass", "green"}, {"sea", "blue"}, {"tree", "green"}, {"fish", "red"}, {"bird", "small"}};
  std::mt19937 rng(11);
  std::string lines;
  for (int i = 0; i < 300; ++i) {
    nlohmann::json msgs = nlohmann::json::array();
    const int turns = 1 + static_cast<int>(rng() % 2);
    for (int k = 0; k < turns; ++k) {
      const auto& f = facts[rng() % facts.size()];
      msgs.push_back({{"role", "user"}, {"content", "what is the colour of the " + f.first}});
      msgs.push_back({{"role", "assistant"}, {"content", "the " + f.first + " is " + f.second}});
    }
    lines += nlohmann::json({{"messages", msgs}}).dump() + "\n";
  }
  RunResult p = run_kiln("preprocess --model " + model() + " --format chat --seq-len 128 --val-fraction 0.1 --input " +
                         tmp.file("chat.jsonl", lines) + " --output " + tmp.sub("data"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  RunResult t = run_kiln("train --model " + model() + " --data " + tmp.sub("data") + " --output " + tmp.sub("run") +
                         " --steps 200 --batch-size 4 --lr 0.01 --lr-schedule cosine --warmup-steps 10 --eval-every 100 --shuffle");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::vector<double> val = val_losses(t.output);
  ASSERT_EQ(val.size(), 3u) << t.output;
  EXPECT_LT(val.back(), 0.3 * val.front()) << t.output;
  RunResult g = run_kiln("generate --model " + tmp.sub("run") +
                         " --prompt '<|im_start|>user\nwhat is the colour of the grass<|im_end|>\n<|im_start|>assistant\n'"
                         " --max-tokens 12");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.stdout_only.find("the grass is green"), std::string::npos) << g.output;
}

TEST(CliPreprocess, BadFlagsAreClearErrors) {
  TempDir tmp;
  const std::string in = tmp.file("a.jsonl", text_jsonl(10, 3));
  auto expect_error = [](const RunResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_FALSE(r.crashed);
    EXPECT_NE(r.output.find(needle), std::string::npos) << "wanted '" << needle << "' in:\n" << r.output;
  };
  const std::string base = "preprocess --model " + model() + " --output " + tmp.sub("o");
  expect_error(run_kiln(base + " --input " + tmp.sub("missing.jsonl") + " --seq-len 64"), "missing.jsonl");
  expect_error(run_kiln(base + " --input " + in + " --seq-len 1"), "--seq-len");
  expect_error(run_kiln(base + " --input " + in + " --seq-len 64 --format csv"), "--format must be text or chat");
  expect_error(run_kiln(base + " --input " + in + " --seq-len 64 --val-fraction 1.5"), "--val-fraction");
  expect_error(run_kiln(base + " --input " + in + " --seq-len 64 --seed -1"), "--seed");
  for (const char* n : {"-1", "2147483647"})
    expect_error(run_kiln(base + " --input " + in + " --seq-len 64 --threads " + n), "--threads");
  expect_error(run_kiln(base + " --input " + tmp.file("bad.jsonl", "{\"txt\": \"x\"}\n") + " --seq-len 64"),
               "bad.jsonl:1: no \"text\" key");
  ASSERT_EQ(run_kiln(base + " --input " + in + " --seq-len 64").exit_code, 0);
  expect_error(run_kiln(base + " --input " + in + " --seq-len 64"), "--overwrite");
  EXPECT_EQ(run_kiln(base + " --input " + in + " --seq-len 64 --overwrite").exit_code, 0);
  // Training: rows longer than the model's context; data from another tokenizer; sft without masks.
  RunResult long_rows = run_kiln("preprocess --model " + model() + " --output " + tmp.sub("long") + " --input " + in +
                                 " --seq-len 512");
  ASSERT_EQ(long_rows.exit_code, 0) << long_rows.output;
  expect_error(run_kiln("train --model " + model() + " --data " + tmp.sub("long") + " --output " + tmp.sub("r1")),
               "max_position_embeddings");
  fs::create_directories(tmp.sub("other"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"})
    fs::copy_file(model() + "/" + f, tmp.sub("other") + "/" + f);
  std::ofstream(tmp.sub("other") + "/tokenizer.json") << std::ifstream(model() + "/tokenizer.json").rdbuf() << " ";
  expect_error(run_kiln("train --model " + tmp.sub("other") + " --data " + tmp.sub("o") + " --output " + tmp.sub("r2")),
               "different tokenizer");
  expect_error(run_kiln("train --model " + model() + " --data " + tmp.sub("o") + " --output " + tmp.sub("r3") +
                        " --objective sft"),
               "marks none");
  expect_error(run_kiln("train --model " + model() + " --data " + tmp.sub("o") + " --output " + tmp.sub("r4") +
                        " --eval-every 2"),
               "--val-fraction");
}

}  // namespace
}  // namespace kiln::test
