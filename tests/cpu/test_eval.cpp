// kiln eval and kiln info. The perplexity and choice tasks against transformers on the same data
// (testdata/eval/reference.json, tests/reference/make_eval_reference.py: fp32 log-likelihoods within
// 1e-4 relative, predictions and accuracies identical), perplexity against kiln score's token-by-
// token figures, the generate task against the known replies of tiny-tools, pass@k against its
// closed form, bad input; kiln info on every fixture model against the checkpoint's own header.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/sha256.h"
#include "eval/eval.h"
#include "test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// The reference's second model: tiny-qwen2's weights with tiny-chat's text files.
std::string compose_qwen2(const TempDir& dir) {
  const fs::path d = dir.path / "tiny-qwen2-chat";
  fs::create_directories(d);
  for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(fs::path(testdata_dir()) / "tiny-qwen2" / f, d / f);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
    fs::copy_file(fs::path(testdata_dir()) / "tiny-chat" / f, d / f);
  return d.string();
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want))) << what;
}

class EvalReference : public ::testing::Test {
 protected:
  void SetUp() override {
    reference_ = read_json(testdata_dir() + "/eval/reference.json");
    models_ = {{"tiny-chat", testdata_dir() + "/tiny-chat"}, {"tiny-qwen2-chat", compose_qwen2(tmp_)}};
  }
  TempDir tmp_;
  json reference_;
  std::vector<std::pair<std::string, std::string>> models_;
};

TEST_F(EvalReference, ChoiceLogLikelihoodsAndAccuraciesEqualTransformers) {
  for (const auto& [name, dir] : models_) {
    const std::string details = tmp_.sub(name + "-choice.jsonl");
    RunResult r = run_kiln("eval --task choice --model " + dir + " --data " + testdata_dir() + "/eval/choice.jsonl --details " +
                           details + " --max-in-flight 3 --max-score-rows 7 --page-size 4");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json out = json::parse(r.stdout_only);
    const json& want = reference_["models"][name]["choice"];
    const std::vector<json> got = read_lines(details);
    ASSERT_EQ(got.size(), want["questions"].size()) << name;
    for (size_t q = 0; q < got.size(); ++q) {
      const json& w = want["questions"][q];
      ASSERT_EQ(got[q]["loglikelihoods"].size(), w["loglikelihoods"].size());
      for (size_t c = 0; c < w["loglikelihoods"].size(); ++c)
        expect_rel(got[q]["loglikelihoods"][c].get<double>(), w["loglikelihoods"][c].get<double>(), 1e-4,
                   name + " question " + std::to_string(q) + " choice " + std::to_string(c));
      EXPECT_EQ(got[q]["prediction"], w["prediction"]) << name << " question " << q;
      EXPECT_EQ(got[q]["prediction_norm"], w["prediction_norm"]) << name << " question " << q;
    }
    EXPECT_EQ(out["results"]["acc"].get<double>(), want["acc"].get<double>()) << name;
    EXPECT_EQ(out["results"]["acc_norm"].get<double>(), want["acc_norm"].get<double>()) << name;
    EXPECT_EQ(out["results"]["questions"], 10);
    // The choices of a question share their context's pages (the cache serves full pages before the
    // first scored position).
    EXPECT_GT(out["engine"]["cached_prompt_tokens"].get<int64_t>(), 0) << name;
  }
}

TEST_F(EvalReference, PerplexityEqualsTransformersSlidingWindows) {
  for (const auto& [name, dir] : models_) {
    for (const json& want : reference_["models"][name]["perplexity"]) {
      const std::string L = std::to_string(want["context"].get<int>()), S = std::to_string(want["stride"].get<int>());
      for (const char* file : {"perplexity.jsonl", "perplexity.txt"}) {  // JSON text lines and plain lines alike
        const std::string details = tmp_.sub(name + L + S + file);
        RunResult r = run_kiln("eval --task perplexity --model " + dir + " --data " + testdata_dir() + "/eval/" + file +
                               " --context " + L + " --stride " + S + " --details " + details);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const json res = json::parse(r.stdout_only)["results"];
        const std::string what = name + " context " + L + " stride " + S + " " + file;
        EXPECT_EQ(res["tokens"], want["tokens"]) << what;
        expect_rel(res["nll"].get<double>(), want["nll"].get<double>(), 1e-4, what);
        expect_rel(res["perplexity"].get<double>(), want["perplexity"].get<double>(), 1e-4, what);
        expect_rel(res["bits_per_byte"].get<double>(), want["bits_per_byte"].get<double>(), 1e-4, what);
        const std::vector<json> docs = read_lines(details);
        size_t k = 0;
        for (size_t d = 0; d < want["documents"].size(); ++d) {
          const json& w = want["documents"][d];
          if (w.is_null()) continue;  // too short to score: no record
          ASSERT_LT(k, docs.size());
          EXPECT_EQ(docs[k]["line"], d + 1) << what;
          EXPECT_EQ(docs[k]["tokens"], w["tokens"]) << what << " document " << d;
          expect_rel(docs[k]["nll"].get<double>(), w["nll"].get<double>(), 1e-4, what + " document " + std::to_string(d));
          ++k;
        }
        EXPECT_EQ(k, docs.size());
        EXPECT_EQ(res["skipped_documents"], 1);
      }
    }
  }
}

TEST(CliEval, PerplexityOfPreprocessedShardsEqualsTheTextItCameFrom) {
  // The same documents tokenized by kiln preprocess (no EOS added) and read back from the shards:
  // the same tokens and targets, so the same totals (documents in another order).
  TempDir tmp;
  const std::string model = testdata_dir() + "/tiny-chat", data = testdata_dir() + "/eval/perplexity.jsonl";
  RunResult p = run_kiln("preprocess --model " + model + " --input " + data + " --output " + tmp.sub("pre") +
                         " --seq-len 256 --no-eos");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  RunResult shards = run_kiln("eval --task perplexity --model " + model + " --data " + tmp.sub("pre") + " --split train");
  RunResult text = run_kiln("eval --task perplexity --model " + model + " --data " + data);
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  ASSERT_EQ(text.exit_code, 0) << text.output;
  const json a = json::parse(shards.stdout_only)["results"], b = json::parse(text.stdout_only)["results"];
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["documents"], b["documents"]);
  expect_rel(a["nll"].get<double>(), b["nll"].get<double>(), 1e-5, "nll");
  EXPECT_TRUE(a["bits_per_byte"].is_null());  // pre-tokenized: the text's bytes are unknown
  RunResult val = run_kiln("eval --task perplexity --model " + model + " --data " + tmp.sub("pre"));
  EXPECT_EQ(val.exit_code, 1);
  EXPECT_NE(val.output.find("has no \"val\" split"), std::string::npos) << val.output;
}

TEST(CliEval, PerplexityEqualsScoreTokenByToken) {
  // One window per document: its negative log-likelihood is minus kiln score's sum over the same text.
  TempDir tmp;
  const std::string details = tmp.sub("d.jsonl");
  const std::string data = testdata_dir() + "/eval/perplexity.jsonl";
  RunResult r = run_kiln("eval --task perplexity --model " + testdata_dir() + "/tiny-chat --data " + data + " --details " + details);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<json> docs = read_lines(details);
  const std::vector<json> lines = read_lines(data);
  ASSERT_FALSE(docs.empty());
  for (const json& d : docs) {
    const std::string text = lines[d["line"].get<size_t>() - 1]["text"];
    RunResult s = run_kiln("score --model " + testdata_dir() + "/tiny-chat --file -", text);
    ASSERT_EQ(s.exit_code, 0) << s.output;
    const json score = json::parse(s.stdout_only);
    EXPECT_EQ(d["tokens"].get<size_t>(), score["logprobs"].size());
    expect_rel(d["nll"].get<double>(), -score["sum_logprob"].get<double>(), 1e-5, "line " + d["line"].dump());
  }
}

TEST(CliEval, GenerateScoresKnownRepliesWithTheRewardVerifiers) {
  // tiny-tools' greedy replies are known: a tool response in the context makes "The weather in
  // Paris is sunny.", otherwise "Hello! How can I help you today?".
  TempDir tmp;
  const std::string data = tmp.file("gen.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"answer\": \"3\"}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"tool\", \"content\": \"sun\"}], \"answer\": \"3\"}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"tool\", \"content\": \"sun\"}], \"stop\": [\" is\"], \"answer\": \"5\"}\n"
      "{\"prompt\": \"Hi\", \"answer\": \"7\"}\n");
  const std::string details = tmp.sub("d.jsonl");
  RunResult r = run_kiln("eval --task generate --model " + testdata_dir() + "/tiny-tools --data " + data +
                         " --chat --scorer regex --pattern 'sunny\\.$' --samples 3 --pass-at 1,2 --max-tokens 40 --details " + details);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<json> got = read_lines(details);
  ASSERT_EQ(got.size(), 4u);
  const std::string hello = "Hello! How can I help you today?", weather = "The weather in Paris is sunny.";
  const std::vector<std::string> expected = {hello, weather, "The weather in Paris", hello};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(got[i]["completions"].size(), 3u);
    for (const json& c : got[i]["completions"]) EXPECT_EQ(c.get<std::string>(), expected[i]) << "prompt " << i;
    for (const json& c : got[i]["correct"]) EXPECT_EQ(c.get<bool>(), i == 1) << "prompt " << i;
  }
  const json res = json::parse(r.stdout_only)["results"];
  EXPECT_DOUBLE_EQ(res["accuracy"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(res["pass@1"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(res["pass@2"].get<double>(), 0.25);
  // The numeric answer verifier: no reply holds a number, so nothing matches.
  RunResult a = run_kiln("eval --task generate --model " + testdata_dir() + "/tiny-tools --data " + data + " --chat");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(json::parse(a.stdout_only)["results"]["accuracy"].get<double>(), 0.0);
}

TEST(CliEval, ResultsRecordModelDataSettingsAndVersion) {
  const std::string data = testdata_dir() + "/eval/choice.jsonl";
  RunResult r = run_kiln("eval --task choice --model " + testdata_dir() + "/tiny-chat --data " + data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.stdout_only);
  RunResult v = run_kiln("--version");
  EXPECT_EQ(j["kiln"].get<std::string>() + "\n", v.stdout_only);
  EXPECT_EQ(j["data"]["sha256"], *sha256_file(data));
  EXPECT_EQ(j["model"]["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(j["task"], "choice");
  EXPECT_TRUE(j["settings"].is_object());
  EXPECT_GT(j["items_per_second"].get<double>(), 0.0);
  EXPECT_NE(r.output.find("acc_norm"), std::string::npos) << "the table on stderr";
}

TEST(CliEval, BadInputIsAClearError) {
  TempDir tmp;
  const std::string model = " --model " + testdata_dir() + "/tiny-chat";
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"--task bogus --data x", "--task must be perplexity, choice or generate"},
      {"--task choice --data " + tmp.sub("missing.jsonl"), "cannot read"},
      {"--task choice --data " + tmp.file("a.jsonl", "{\"context\": \"a\", \"choices\": [\"b\", \"c\"], \"answer\": 2}\n"),
       "a.jsonl:1: \"answer\" must be the index"},
      {"--task choice --data " + tmp.file("b.jsonl", "\n{\"context\": \"a\", \"choices\": [\"b\"], \"answer\": 0}\n"),
       "b.jsonl:2: a choice line needs \"choices\""},
      {"--task choice --data " + tmp.file("c.jsonl", "not json\n"), "c.jsonl:1: not valid JSON"},
      {"--task perplexity --data " + tmp.file("d.jsonl", "{\"txt\": 1}\n"), "d.jsonl:1: a perplexity line needs \"text\""},
      {"--task perplexity --data " + testdata_dir() + "/eval/perplexity.txt --context 16 --stride 17", "--stride (17)"},
      {"--task perplexity --data " + testdata_dir() + "/eval/perplexity.txt --context 100000", "--context must be within"},
      {"--task generate --data " + tmp.file("e.jsonl", "{\"prompt\": \"a\"}\n"), "no \"answer\" field"},
      {"--task generate --scorer regex --data " + tmp.file("f.jsonl", "{\"prompt\": \"a\"}\n"), "pattern"},
      {"--task generate --samples 2 --pass-at 3 --data " + tmp.file("g.jsonl", "{\"prompt\": \"a\", \"answer\": 1}\n"),
       "--pass-at 3 must be within [1, --samples = 2]"},
      {"--task generate --data " + tmp.file("h.jsonl", "{\"prompt\": \"a\", \"answer\": " + std::string(100000, '[') +
                                                           std::string(100000, ']') + "}\n"),
       "h.jsonl:1: the line nests deeper than 999 levels"},
  };
  for (const Case& c : cases) {
    RunResult r = run_kiln("eval" + model + " " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_FALSE(r.crashed) << c.args;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(EvalMath, PassAtKIsTheUnbiasedEstimator) {
  // 1 - C(n - c, k) / C(n, k), by hand.
  EXPECT_DOUBLE_EQ(eval::pass_at_k(5, 2, 1), 0.4);
  EXPECT_NEAR(eval::pass_at_k(5, 2, 3), 1.0 - 1.0 / 10.0, 1e-12);  // C(3,3) / C(5,3)
  EXPECT_NEAR(eval::pass_at_k(10, 3, 5), 1.0 - 21.0 / 252.0, 1e-12);  // C(7,5) / C(10,5)
  EXPECT_EQ(eval::pass_at_k(4, 0, 2), 0.0);
  EXPECT_EQ(eval::pass_at_k(4, 4, 1), 1.0);
  EXPECT_EQ(eval::pass_at_k(4, 3, 2), 1.0);  // fewer than k wrong: every k-subset holds a right one
}

// The checkpoint's parameters (and data bytes), from its safetensors headers alone: model.safetensors
// or the shards model-*.safetensors.
int64_t checkpoint_parameters(const std::string& dir, int64_t* data_bytes = nullptr) {
  int64_t total = 0, bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) != 0 || entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    in.read(header.data(), static_cast<std::streamsize>(n));
    bytes += static_cast<int64_t>(fs::file_size(entry.path())) - 8 - static_cast<int64_t>(n);
    const json parsed = json::parse(header);
    for (const auto& [key, t] : parsed.items()) {
      if (key == "__metadata__") continue;
      int64_t e = 1;
      for (const json& d : t["shape"]) e *= d.get<int64_t>();
      total += e;
    }
  }
  if (data_bytes) *data_bytes = bytes;
  return total;
}

TEST(CliInfo, EveryFixtureModelAgreesWithItsFiles) {
  for (const char* m : {"tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-llama-biased", "tiny-qwen2-bf16",
                        "tiny-chat", "tiny-tools"}) {
    const std::string dir = testdata_dir() + "/" + m;
    RunResult r = run_kiln("info --json --model " + dir);
    ASSERT_EQ(r.exit_code, 0) << m << r.output;
    const json j = json::parse(r.stdout_only);
    const json config = read_json(dir + "/config.json");
    EXPECT_EQ(j["parameters"].get<int64_t>(), checkpoint_parameters(dir)) << m;
    EXPECT_EQ(j["architecture"], config["architectures"][0]) << m;
    EXPECT_EQ(j["shape"]["layers"], config["num_hidden_layers"]) << m;
    EXPECT_EQ(j["shape"]["vocab_size"], config["vocab_size"]) << m;
    EXPECT_EQ(j["context"]["max_position_embeddings"], config["max_position_embeddings"]) << m;
    EXPECT_TRUE(j["checkpoint"]["matches_config"].get<bool>()) << m;
    int64_t data_bytes = 0;
    checkpoint_parameters(dir, &data_bytes);
    EXPECT_EQ(j["checkpoint"]["bytes"].get<int64_t>(), data_bytes) << m;
    // transformers' defaults: key/value heads = attention heads, head_dim = hidden / heads.
    const int64_t heads = config["num_attention_heads"].get<int64_t>();
    const int64_t kv_heads = config.value("num_key_value_heads", heads);
    const int64_t head_dim = config.value("head_dim", config["hidden_size"].get<int64_t>() / heads);
    const int64_t kv = 2 * config["num_hidden_layers"].get<int64_t>() * kv_heads * head_dim;
    EXPECT_EQ(j["memory"]["cuda"]["kv_bytes_per_token"].get<int64_t>(), kv * 2) << m;
    EXPECT_EQ(j["memory"]["cpu"]["weights_bytes"].get<int64_t>(), 4 * checkpoint_parameters(dir)) << m;
    const bool has_tokenizer = fs::exists(dir + "/tokenizer.json");
    EXPECT_EQ(j["text"].contains("vocab_size"), has_tokenizer) << m;
    RunResult t = run_kiln("info --model " + dir);  // the text form
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_NE(t.stdout_only.find(config["architectures"][0].get<std::string>()), std::string::npos) << t.stdout_only;
    EXPECT_NE(t.stdout_only.find("parameters"), std::string::npos);
  }
  const json tools = json::parse(run_kiln("info --json --model " + testdata_dir() + "/tiny-tools").stdout_only);
  EXPECT_TRUE(tools["text"]["chat_template"]["tools"].get<bool>());
  EXPECT_EQ(tools["text"]["special_tokens"]["eos"], "<|im_end|>");
  EXPECT_EQ(tools["text"]["vocab_size"], 288);
  const json chat = json::parse(run_kiln("info --json --model " + testdata_dir() + "/tiny-chat").stdout_only);
  EXPECT_TRUE(chat["text"]["chat_template"]["present"].get<bool>());
  EXPECT_FALSE(chat["text"]["chat_template"]["tools"].get<bool>());
  RunResult missing = run_kiln("info --model /nonexistent/model");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.output.find("/nonexistent/model"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace kiln::test
