// The text commands end to end through the kiln binary: tokenize / detokenize against the
// tokenizers golden cases, chat-template against the transformers golden renders (and the errors
// the reference raised), generate --prompt and chat with a model folder that has a tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

// Ordered: messages and tools must reach the template with their keys in file order.
nlohmann::ordered_json read_json_file(const std::string& path) { return nlohmann::ordered_json::parse(std::ifstream(path)); }

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

// A scratch folder, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("kiln_text_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

// A model folder whose weights are random (from a tiny Llama config with the tokenizer's vocab) and
// whose text side is the ChatML fixture folder's: enough to run generate --prompt and chat.
struct ChatModel : TempDir {
  ChatModel() {
    const fs::path src = fs::path(testdata_dir()) / "chat_templates" / "models" / "chatml";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) fs::copy_file(src / f, path / f);
    nlohmann::ordered_json cfg = read_json_file(testdata_dir() + "/tiny-llama/config.json");
    nlohmann::ordered_json tok = read_json_file((src / "tokenizer.json").string());
    int64_t vocab = static_cast<int64_t>(tok["model"]["vocab"].size());
    for (const auto& t : tok["added_tokens"]) vocab = std::max<int64_t>(vocab, t["id"].get<int64_t>() + 1);
    cfg["vocab_size"] = vocab;
    cfg["max_position_embeddings"] = 4096;
    std::ofstream(path / "config.json") << cfg.dump(1);
  }
  std::string dir() const { return path.string(); }
};

}  // namespace

TEST(CliText, TokenizeAndDetokenizeMatchTokenizers) {
  nlohmann::ordered_json golden = read_json_file(testdata_dir() + "/tokenizers/golden.json");
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string tok = testdata_dir() + "/tokenizers/" + c["tokenizer"].get<std::string>() + ".tokenizer.json";
    const std::string text = c["text"];
    if (checked % 3 == 0) {  // both input paths: --text and stdin
      RunResult r = run_kiln("tokenize --tokenizer " + tok + " --text " + shell_quote(text));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(nlohmann::json::parse(r.stdout_only)["ids"], c["ids"]) << text;
    }
    RunResult r = run_kiln("tokenize --tokenizer " + tok + " --add-special", text);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.stdout_only)["ids"], c["ids_with_special"]) << text;
    RunResult d = run_kiln("detokenize --tokenizer " + tok + " --ids " + shell_quote(join_ids(c["ids"].get<std::vector<int32_t>>())));
    ASSERT_EQ(d.exit_code, 0) << d.output;
    EXPECT_EQ(nlohmann::json::parse(d.stdout_only)["text"], c["decoded"]) << text;
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST(CliText, ChatTemplateMatchesTransformers) {
  nlohmann::ordered_json golden = read_json_file(testdata_dir() + "/chat_templates/golden.json");
  TempDir tmp;
  int rendered = 0, raised = 0;
  for (const auto& c : golden["cases"]) {
    const std::string model = testdata_dir() + "/chat_templates/models/" + c["template"].get<std::string>();
    std::string args = "chat-template --model " + model + " --messages " + tmp.file("m.json", c["messages"].dump());
    if (!c["tools"].is_null()) args += " --tools " + tmp.file("t.json", c["tools"].dump());
    if (c["add_generation_prompt"].get<bool>()) args += " --add-generation-prompt";
    RunResult r = run_kiln(args);
    SCOPED_TRACE(c["template"].get<std::string>() + "/" + c["case"].get<std::string>());
    if (c.contains("error")) {
      // The reference raised (e.g. raise_exception on roles that do not alternate): so must kiln,
      // with the template's own message.
      EXPECT_NE(r.exit_code, 0) << r.output;
      EXPECT_FALSE(r.crashed) << r.output;
      std::string msg = c["error"];
      msg = msg.substr(msg.find(": ") + 2);
      EXPECT_NE(r.output.find(msg.substr(0, 40)), std::string::npos) << r.output << "\nexpected: " << msg;
      ++raised;
    } else {
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(nlohmann::json::parse(r.stdout_only)["prompt"], c["rendered"]);
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 30);
  EXPECT_GT(raised, 0);
}

TEST(CliText, GeneratePromptStreamsTheDecodedReply) {
  ChatModel m;
  const std::string base = "generate --model " + m.dir() + " --random-weights --weight-seed 7 --max-tokens 24 --ignore-eos " +
                           "--prompt " + shell_quote("Hello, how are you? Привет 👋");
  RunResult j = run_kiln(base + " --json");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  nlohmann::json out = nlohmann::json::parse(j.stdout_only);
  // the prompt ids are the tokenizer's encoding with special tokens
  RunResult t = run_kiln("tokenize --model " + m.dir() + " --add-special --text " + shell_quote("Hello, how are you? Привет 👋"));
  EXPECT_EQ(out["prompt_ids"], nlohmann::json::parse(t.stdout_only)["ids"]);
  // the text is the decoded ids, and the streamed text is the same text
  RunResult d = run_kiln("detokenize --model " + m.dir() + " --skip-special --ids " +
                         join_ids(out["ids"].get<std::vector<int32_t>>()));
  EXPECT_EQ(out["text"], nlohmann::json::parse(d.stdout_only)["text"]);
  RunResult s = run_kiln(base);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.stdout_only, out["text"].get<std::string>() + "\n");
}

TEST(CliText, ChatKeepsTheConversation) {
  ChatModel m;
  const std::string args = "chat --model " + m.dir() + " --random-weights --weight-seed 3 --max-tokens 8 --seed 1 --json "
                           "--system " + shell_quote("Be brief.");
  RunResult r = run_kiln(args, "Hi there\nAnd again\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> turns;
  std::istringstream lines(r.stdout_only);
  for (std::string line; std::getline(lines, line);) turns.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(turns.size(), 2u);
  // turn 2's prompt is the template's render of system, user, assistant (turn 1's reply), user
  nlohmann::json messages = nlohmann::json::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there"}},
       {{"role", "assistant"}, {"content", turns[0]["reply"]}}, {{"role", "user"}, {"content", "And again"}}});
  TempDir tmp;
  RunResult ct = run_kiln("chat-template --model " + m.dir() + " --add-generation-prompt --messages " +
                          tmp.file("m.json", messages.dump()));
  ASSERT_EQ(ct.exit_code, 0) << ct.output;
  EXPECT_EQ(turns[1]["prompt"], nlohmann::json::parse(ct.stdout_only)["prompt"]);
  // streaming mode prints the same replies, one per line
  RunResult s = run_kiln(args.substr(0, args.find(" --json")) + " --system " + shell_quote("Be brief."),
                         "Hi there\nAnd again\n");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.stdout_only, turns[0]["reply"].get<std::string>() + "\n" + turns[1]["reply"].get<std::string>() + "\n");
}

TEST(CliTextErrors, BadInputsFailCleanly) {
  TempDir tmp;
  const std::string chatml = testdata_dir() + "/chat_templates/models/chatml";
  auto expect_failure = [](const RunResult& r, const std::string& mention) {
    EXPECT_FALSE(r.crashed) << r.output;
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(mention), std::string::npos) << r.output;
  };
  expect_failure(run_kiln("tokenize --tokenizer /nonexistent/tokenizer.json --text hi"), "/nonexistent/tokenizer.json");
  expect_failure(run_kiln("tokenize --tokenizer " + tmp.file("bad.json", "{not json") + " --text hi"), "bad.json");
  expect_failure(run_kiln("detokenize --model " + chatml + " --ids 1,99999999"), "99999999");
  expect_failure(run_kiln("chat-template --model " + chatml + " --messages " + tmp.file("m.json", "{\"role\": 1}")),
                 "--messages");
  expect_failure(run_kiln("tokenize --model " + testdata_dir() + "/tiny-llama --text hi"), "tokenizer.json");
}

}  // namespace kiln::test
