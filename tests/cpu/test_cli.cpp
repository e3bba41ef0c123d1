// The kiln binary end to end: generate and score against the golden fixtures, and every kind of bad
// input giving a clear message and a non-zero exit (never a crash).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "core/json_text.h"
#include "core/plural.h"
#include "golden.h"
#include "model/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// A scratch copy of a fixture model folder, removed at the end of the test.
class ModelCopy {
 public:
  explicit ModelCopy(const std::string& fixture) {
    dir_ = fs::temp_directory_path() / ("kiln_cli_model_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fs::path(testdata_dir()) / fixture / f, dir_ / f);
  }
  ~ModelCopy() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  nlohmann::json config() const { return nlohmann::json::parse(std::ifstream(path("config.json"))); }
  void write_config(const nlohmann::json& j) const { std::ofstream(path("config.json")) << j.dump(1); }
  void write_text(const std::string& f, const std::string& text) const { std::ofstream(path(f), std::ios::binary) << text; }
  std::string read_bytes(const std::string& f) const {
    std::ifstream in(path(f), std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
};

void expect_clean_failure(const RunResult& r, const std::string& must_mention) {
  EXPECT_FALSE(r.crashed) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(must_mention), std::string::npos) << "expected the message to name '" << must_mention
                                                            << "': " << r.output;
}

// Rewrites model.safetensors with tensor `name` replaced by `replacement` (or dropped if empty).
void rewrite_weights(const ModelCopy& m, const std::string& name, TensorBuffer* replacement) {
  Result<SafetensorsFile> f = SafetensorsFile::open(m.path("model.safetensors"));
  ASSERT_TRUE(f.ok());
  std::vector<TensorBuffer> keep;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : f->names()) {
    if (n == name) {
      if (replacement) tensors.emplace_back(n, replacement->view());
      continue;
    }
    TensorInfo info = *f->find(n);
    TensorBuffer t = host_empty(info.shape, info.dtype);
    std::memcpy(t.view().data, info.data, static_cast<size_t>(info.nbytes()));
    tensors.emplace_back(n, t.view());
    keep.push_back(std::move(t));
  }
  std::string out = m.path("model.safetensors.new");
  ASSERT_TRUE(write_safetensors(out, tensors, {}).ok());
  fs::rename(out, m.path("model.safetensors"));
}

}  // namespace

// The command line itself: help lists every command, --version names the build, typos and
// misplaced flags are usage errors (exit 2) that say what to do.
TEST(Cli, HelpVersionAndUnknownCommands) {
  const std::vector<std::string> commands = {"generate", "score",   "tokenize", "detokenize", "chat-template",
                                             "chat",     "preprocess", "train", "rl",         "demo",
                                             "serve",    "run-batch", "plot"};
  for (const std::string how : {"--help", "help"}) {
    RunResult h = run_kiln(how);
    ASSERT_EQ(h.exit_code, 0) << h.output;
    for (const std::string& c : commands) EXPECT_NE(h.stdout_only.find("  " + c + " "), std::string::npos) << how << ": " << c;
    EXPECT_NE(h.stdout_only.find("kiln help COMMAND"), std::string::npos) << h.stdout_only;
  }
  RunResult none = run_kiln("");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("  generate "), std::string::npos) << none.output;
  for (const std::string& c : commands) {
    RunResult h = run_kiln("help " + c);
    ASSERT_EQ(h.exit_code, 0) << h.output;
    EXPECT_NE(h.stdout_only.find("Usage: kiln " + c + " [OPTIONS]"), std::string::npos) << h.stdout_only;
    EXPECT_EQ(h.stdout_only, run_kiln(c + " --help").stdout_only) << c;
  }
  RunResult v = run_kiln("--version");
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_TRUE(std::regex_match(v.stdout_only, std::regex(R"(kiln \d+\.\d+\.\d+ \(git ([0-9a-f]{12}(-dirty)?|unknown), )"
                                                         R"(CUDA (on: sm_\w+( sm_\w+)*|off)\)\n)")))
      << v.stdout_only;
  struct Typo { const char* typed; const char* suggested; };
  for (const Typo& t : {Typo{"genrate", "generate"}, Typo{"trian", "train"}, Typo{"serv", "serve"},
                        Typo{"chat-templat", "chat-template"}, Typo{"bogus", nullptr}}) {
    for (const std::string how : {"", "help "}) {
      RunResult r = run_kiln(how + t.typed + " --model x");
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find(std::string("'") + t.typed + "' is not a kiln command"), std::string::npos) << r.output;
      if (t.suggested) {
        EXPECT_NE(r.output.find(std::string("did you mean '") + t.suggested + "'?"), std::string::npos) << r.output;
      } else {
        EXPECT_EQ(r.output.find("did you mean"), std::string::npos) << r.output;
      }
    }
  }
  RunResult flag = run_kiln("--model x generate");
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.output.find("flags follow the command"), std::string::npos) << flag.output;
}

// Messages count and name things in plain English: "1 step", "2 steps", "an array".
TEST(Cli, MessagesUseSingularsAndArticles) {
  EXPECT_EQ(count_of(1, "step"), "1 step");
  EXPECT_EQ(count_of(0, "step"), "0 steps");
  EXPECT_EQ(count_of(2, "query", "queries"), "2 queries");
  EXPECT_EQ(with_article("array"), "an array");
  EXPECT_EQ(with_article("object"), "an object");
  EXPECT_EQ(with_article("string"), "a string");
  // JSON values as messages quote them: short ones as they are, deep or large ones described, long
  // texts cut at a character boundary.
  EXPECT_EQ(json_brief(nlohmann::json::parse(R"({"a": [1, 2.5, "x"]})")), R"({"a":[1,2.5,"x"]})");
  EXPECT_EQ(json_brief(nlohmann::json::parse(std::string(9, '[') + std::string(9, ']'))),
            "an array of 1 value nested 9 levels deep");
  EXPECT_EQ(json_brief(nlohmann::json(std::vector<int>(65, 1))), "an array of 65 values");
  EXPECT_EQ(json_brief(nlohmann::json::object()), "{}");
  EXPECT_EQ(json_brief(nlohmann::json(std::string(100, 'y')), 10), "\"yyyyyyyyy...");
  EXPECT_EQ(json_brief(nlohmann::json("\u00e9\u00e9\u00e9"), 4), "\"\u00e9...");  // not inside the second é
  EXPECT_EQ(json_depth(nlohmann::json::parse(std::string(100000, '[') + std::string(100000, ']'))), 100000);
  ModelCopy m("tiny-llama");
  nlohmann::json c = m.config();
  c["hidden_size"] = nlohmann::json::array({64});
  m.write_config(c);
  RunResult r = run_kiln("generate --model " + m.dir());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("an array"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a array"), std::string::npos) << r.output;
}

TEST(Cli, GenerateGreedyMatchesGolden) {
  std::vector<int32_t> prompt = golden_ints("tiny-llama", "seq_b.input_ids");
  std::vector<int32_t> expected = golden_ints("tiny-llama", "greedy.new_tokens");
  RunResult r = run_kiln("generate --model " + testdata_dir() + "/tiny-llama --prompt-ids " +
                         join_ids(prompt) + " --max-tokens 16 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.stdout_only);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(j["finish_reason"], "length");
}

TEST(Cli, GenerateDefaultRuns) {
  // The default model is the tiny one shipped beside the binary (<bin>/../share/kiln/tiny-llama, as
  // the build and cmake --install lay it out), not a path of the machine that built kiln.
  RunResult r = run_kiln("generate");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.stdout_only);
  EXPECT_FALSE(j["ids"].empty());
  const std::string model = j["model"];
  EXPECT_EQ(model, (fs::path(kiln_binary()).parent_path().parent_path() / "share/kiln/tiny-llama").lexically_normal().string());
}

TEST(Cli, SamplingIsSeeded) {
  std::string args = "generate --model " + testdata_dir() +
                     "/tiny-qwen2 --prompt-ids 5,6,7 --max-tokens 12 --temperature 1.0 --top-k 50 --top-p 0.9 --ignore-eos";
  RunResult a = run_kiln(args + " --seed 11"), b = run_kiln(args + " --seed 11");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(nlohmann::json::parse(a.stdout_only)["ids"], nlohmann::json::parse(b.stdout_only)["ids"]);
}

TEST(Cli, ScoreMatchesGoldenLogSoftmax) {
  for (const char* model : {"tiny-llama", "tiny-qwen2"}) {
    std::vector<int32_t> ids = golden_ints(model, "seq_a.input_ids");
    std::vector<float> logits = golden_floats(model, "seq_a.logits");
    const int64_t vocab = static_cast<int64_t>(logits.size() / ids.size());
    RunResult r = run_kiln(std::string("score --model ") + testdata_dir() + "/" + model + " --ids " + join_ids(ids) +
                           " --top-logprobs 3");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    nlohmann::json j = nlohmann::json::parse(r.stdout_only);
    std::vector<float> got = j["logprobs"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), ids.size() - 1);
    ASSERT_EQ(j["top_logprobs"].size(), ids.size() - 1);
    for (size_t t = 1; t < ids.size(); ++t) {
      const float* row = logits.data() + (t - 1) * vocab;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
      double ref = row[ids[t]] - mx - std::log(sum);
      EXPECT_NEAR(got[t - 1], ref, 1e-4 * std::max(1.0, std::fabs(ref))) << model << " position " << t;
      // the top-1 alternative is the argmax of the reference logits
      int64_t best = 0;
      for (int64_t v = 1; v < vocab; ++v)
        if (row[v] > row[best]) best = v;
      EXPECT_EQ(j["top_logprobs"][t - 1][0]["id"].get<int64_t>(), best);
    }
  }
}

TEST(Cli, RandomWeightsNeedOnlyTheConfig) {
  ModelCopy m("tiny-qwen2");
  fs::remove(m.path("model.safetensors"));
  std::string args = "generate --model " + m.dir() + " --random-weights --weight-seed 3 --max-tokens 6 --ignore-eos";
  RunResult a = run_kiln(args), b = run_kiln(args);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  std::vector<int32_t> ids = nlohmann::json::parse(a.stdout_only)["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(ids, nlohmann::json::parse(b.stdout_only)["ids"].get<std::vector<int32_t>>());
  // without --random-weights the missing safetensors is an error naming the folder
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.safetensors");
}

TEST(CliErrors, MissingModelDirectory) {
  expect_clean_failure(run_kiln("generate --model /nonexistent/kiln-model"), "/nonexistent/kiln-model");
}

TEST(CliErrors, MalformedConfig) {
  ModelCopy m("tiny-llama");
  m.write_text("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,,}");
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "config.json");
}

TEST(CliErrors, UnknownArchitecture) {
  ModelCopy m("tiny-llama");
  nlohmann::json c = m.config();
  c["architectures"] = {"GPTNeoXForCausalLM"};
  m.write_config(c);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "GPTNeoXForCausalLM");
}

TEST(CliErrors, MissingConfigKey) {
  ModelCopy m("tiny-llama");
  nlohmann::json c = m.config();
  c.erase("hidden_size");
  m.write_config(c);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "hidden_size");
}

// Sizes kiln cannot run are refused before anything is sized from them (a billion layers used to
// abort in std::bad_alloc, ten million to exhaust the memory), and a config that asks for more
// layers than its checkpoint holds fails on the first missing tensor before any weight is allocated.
TEST(CliErrors, ConfigSizesAreBoundedAndCheckedAgainstTheCheckpoint) {
  ModelCopy m("tiny-llama");
  const nlohmann::json original = m.config();
  for (const auto& [key, value] : std::vector<std::pair<std::string, int64_t>>{
           {"num_hidden_layers", 1000000000}, {"num_hidden_layers", 10000000}, {"head_dim", 512},
           {"vocab_size", int64_t(1) << 40}, {"max_position_embeddings", int64_t(1) << 40}}) {
    nlohmann::json c = original;
    c[key] = value;
    m.write_config(c);
    expect_clean_failure(run_kiln("generate --model " + m.dir() + " --prompt-ids 1,2"), key);
    expect_clean_failure(run_kiln("generate --model " + m.dir() + " --random-weights --prompt-ids 1,2"), key);
  }
  nlohmann::json c = original;
  c["num_hidden_layers"] = 500;
  m.write_config(c);
  expect_clean_failure(run_kiln("generate --model " + m.dir() + " --prompt-ids 1,2"), "model.layers.2.");

  // Every size within kiln's bounds, but 3.3 trillion parameters: with --random-weights (no tensors
  // to check against) refused against the memory there is, before any weight is allocated.
  c = original;
  c["num_hidden_layers"] = 1024;
  c["hidden_size"] = 16384;
  c["intermediate_size"] = 65536;
  c["num_attention_heads"] = 128;
  c["num_key_value_heads"] = 8;
  c["head_dim"] = 128;
  m.write_config(c);
  expect_clean_failure(run_kiln("generate --model " + m.dir() + " --random-weights --prompt-ids 1,2"), "--random-weights");
}

// A sliding window smaller than max_position_embeddings bounds the context kiln runs exactly
// (attention over every earlier token equals sliding-window attention within the window).
TEST(CliErrors, SlidingWindowBoundsTheContext) {
  ModelCopy m("tiny-qwen2");
  nlohmann::json c = m.config();
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  m.write_config(c);
  RunResult ok = run_kiln("generate --model " + m.dir() + " --prompt-ids 1,2,3 --max-tokens 13");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  expect_clean_failure(run_kiln("generate --model " + m.dir() + " --prompt-ids 1,2,3 --max-tokens 14"), "16 tokens");
  std::string line = "{\"input_ids\": [";
  for (int i = 0; i < 17; ++i) line += (i ? ", " : "") + std::to_string(5 + i);
  line += "]}\n";
  m.write_text("d.jsonl", line);
  expect_clean_failure(run_kiln("train --model " + m.dir() + " --data " + m.path("d.jsonl") + " --output " + m.path("out")),
                       "sliding window");
  // kiln score likewise: 16 tokens are scored, 17 refused naming the window.
  std::string ids = "1";
  for (int i = 2; i <= 16; ++i) ids += "," + std::to_string(i);
  RunResult scored = run_kiln("score --model " + m.dir() + " --ids " + ids);
  EXPECT_EQ(scored.exit_code, 0) << scored.output;
  expect_clean_failure(run_kiln("score --model " + m.dir() + " --ids " + ids + ",17"), "sliding window");
}

// kiln score refuses a sequence beyond the model's context (positions past max_position_embeddings
// are not the model's), pointing at the sliding-window perplexity of kiln eval.
TEST(CliErrors, ScoreBeyondTheContext) {
  const std::string model = testdata_dir() + "/tiny-llama";  // max_position_embeddings 256
  std::string ids = "1";
  for (int i = 1; i < 257; ++i) ids += "," + std::to_string(1 + i % 300);
  expect_clean_failure(run_kiln("score --model " + model + " --ids " + ids), "kiln eval --task perplexity");
}

TEST(CliErrors, SeedOutOfRange) {
  for (const char* seed : {"18446744073709551616", "-1", "12x"})
    expect_clean_failure(run_kiln("generate --model " + testdata_dir() + "/tiny-llama --prompt-ids 1,2 --seed " + seed),
                         "--seed");
  RunResult ok = run_kiln("generate --model " + testdata_dir() + "/tiny-llama --prompt-ids 1,2 --max-tokens 1 --seed 18446744073709551615");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.stdout_only.find("\"seed\":18446744073709551615"), std::string::npos) << ok.stdout_only;
}

TEST(CliErrors, BadOrConflictingFlags) {
  const std::string gen = "generate --model " + testdata_dir() + "/tiny-llama ";
  expect_clean_failure(run_kiln(gen + "--prompt x --prompt-ids 1,2"), "--prompt");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --json"), "--json requires --prompt");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --output /tmp/kiln-never-written"), "--output requires --requests");
  expect_clean_failure(run_kiln(gen + "--requests /tmp/kiln-none.jsonl --prompt-ids 1,2"), "--requests");
  for (const char* t : {"nan", "inf", "-1"}) expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --temperature " + t), "--temperature");
  for (const char* p : {"nan", "0", "1.5"}) expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --top-p " + p), "--top-p");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-tokens 2147483647"), "max_tokens");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-tokens 99999999999"), "--max-tokens");
  expect_clean_failure(run_kiln(gen + "--random-weights --weight-seed -3"), "--weight-seed");
  expect_clean_failure(run_kiln(gen + "--kv-memory 1e30"), "--kv-memory");
  for (const char* n : {"0", "65536"}) expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-running " + n), "--max-running");
  for (const char* n : {"0", "-5"})
    expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --mixed-step-tokens " + n), "--mixed-step-tokens");
  for (const char* n : {"-1", "2147483647"})
    expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-step-tokens " + n), "--max-step-tokens");
  for (const char* n : {"-1", "4097"}) expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --page-size " + n), "--page-size");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-running 8 --max-step-tokens 4"), "--max-step-tokens");
  for (const char* n : {"-1", "2147483647"})
    expect_clean_failure(run_kiln("eval --task perplexity --model " + testdata_dir() + "/tiny-llama --data " +
                                  testdata_dir() + "/eval/perplexity.jsonl --max-score-rows " + n),
                         "--max-score-rows");
  // Sizes that cannot be allocated: an out-of-memory status naming the flag to change.
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --max-step-tokens 1000000000"), "--max-step-tokens");
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --kv-tokens 2000000000"), "--kv-tokens");
  // 2^31 - 1 tokens round up to 2^31 slots, one more than an int32 row index reaches.
  expect_clean_failure(run_kiln(gen + "--prompt-ids 1,2 --kv-tokens 2147483647"), "KV pool is too large");
  // kiln serve's numbers: refused before anything listens.
  const std::string serve = "serve --model " + testdata_dir() + "/tiny-llama --port 0 ";
  for (const char* t : {"nan", "-1", "0", "1e300"}) expect_clean_failure(run_kiln(serve + "--idle-timeout " + t), "--idle-timeout");
  for (const char* t : {"nan", "-1", "inf"}) expect_clean_failure(run_kiln(serve + "--shutdown-grace " + t), "--shutdown-grace");
  for (const char* n : {"0", "-4", "100000"}) expect_clean_failure(run_kiln(serve + "--max-n " + n), "--max-n");
  expect_clean_failure(run_kiln(serve + "--max-tokens-limit -1"), "--max-tokens-limit");
}

TEST(CliErrors, TruncatedSafetensorsHeader) {
  ModelCopy m("tiny-llama");
  std::string bytes = m.read_bytes("model.safetensors");
  m.write_text("model.safetensors", bytes.substr(0, 100));
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.safetensors");
}

TEST(CliErrors, TruncatedSafetensorsData) {
  ModelCopy m("tiny-llama");
  std::string bytes = m.read_bytes("model.safetensors");
  m.write_text("model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.safetensors");
}

TEST(CliErrors, CorruptSafetensorsHeader) {
  ModelCopy m("tiny-llama");
  std::string bytes = m.read_bytes("model.safetensors");
  for (size_t i = 8; i < 40; ++i) bytes[i] = '#';
  m.write_text("model.safetensors", bytes);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.safetensors");
}

TEST(CliErrors, MissingTensor) {
  ModelCopy m("tiny-llama");
  rewrite_weights(m, "model.layers.1.mlp.up_proj.weight", nullptr);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.layers.1.mlp.up_proj.weight");
}

TEST(CliErrors, ShapeMismatch) {
  ModelCopy m("tiny-llama");
  TensorBuffer wrong = random_host({160, 63}, DType::f32, 1);
  rewrite_weights(m, "model.layers.0.mlp.gate_proj.weight", &wrong);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.layers.0.mlp.gate_proj.weight");
}

TEST(CliErrors, DtypeMismatch) {
  ModelCopy m("tiny-llama");
  TensorBuffer ints = random_ints({64}, 0, 5, 1);
  rewrite_weights(m, "model.norm.weight", &ints);
  expect_clean_failure(run_kiln("generate --model " + m.dir()), "model.norm.weight");
}

TEST(CliErrors, IdsOutOfVocabulary) {
  std::string model = testdata_dir() + "/tiny-llama";
  expect_clean_failure(run_kiln("generate --model " + model + " --prompt-ids 1,2,384"), "384");
  expect_clean_failure(run_kiln("generate --model " + model + " --prompt-ids 1,-3"), "-3");
  expect_clean_failure(run_kiln("score --model " + model + " --ids 1,2,99999"), "99999");
  expect_clean_failure(run_kiln("generate --model " + model + " --prompt-ids 1,x"), "x");
}

TEST(CliErrors, CudaWithoutGpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU; the no-GPU message cannot be checked here";
  expect_clean_failure(run_kiln("generate --device cuda"), "cuda");
}

}  // namespace kiln::test
