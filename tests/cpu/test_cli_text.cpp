// The text commands end to end through the kiln binary: tokenize / detokenize against the
// tokenizers golden cases, chat-template against the transformers golden renders (and the errors
// the reference raised), generate --prompt and chat with a model folder that has a tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
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

// Nesting as deep as the issue's reports (30,000 levels in --messages, 100,000 in --tools; transformers
// raises RecursionError on both) is a clear error with exit 1, not a stack overflow.
TEST(CliText, DeeplyNestedMessagesAndToolsAreErrors) {
  TempDir tmp;
  const std::string model = testdata_dir() + "/tiny-chat";
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  const std::string deep_messages = "[{\"role\": \"user\", \"content\": " + nested(30000) + "}]";
  RunResult m = run_kiln("chat-template --model " + model + " --messages " + tmp.file("m.json", deep_messages));
  EXPECT_EQ(m.exit_code, 1) << m.output;
  EXPECT_FALSE(m.crashed) << m.output;
  EXPECT_NE(m.output.find("nest deeper than"), std::string::npos) << m.output;
  const std::string ok_messages = "[{\"role\": \"user\", \"content\": \"hi\"}]";
  RunResult t = run_kiln("chat-template --model " + model + " --messages " + tmp.file("ok.json", ok_messages) +
                         " --tools " + tmp.file("t.json", nested(100000)));
  EXPECT_EQ(t.exit_code, 1) << t.output;
  EXPECT_FALSE(t.crashed) << t.output;
  EXPECT_NE(t.output.find("nest deeper than"), std::string::npos) << t.output;
  RunResult fine = run_kiln("chat-template --model " + model + " --messages " + tmp.file("ok2.json", ok_messages));
  EXPECT_EQ(fine.exit_code, 0) << fine.output;
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

// kiln score on text: --text, --file and --file - (stdin) score the tokenizer's encoding with special
// tokens (the ids tokenize --add-special gives), name each token by its tokenizer.json vocabulary
// entry, and total the log-probabilities: sum, mean and perplexity exp(-mean).
TEST(CliText, ScoreTextNamesTokensAndTotals) {
  ChatModel m;
  TempDir tmp;
  const std::string text = "Hello, world: scoring text\nover two lines";
  const std::string base = "score --model " + m.dir() + " --random-weights --weight-seed 9 ";
  RunResult r = run_kiln(base + "--text " + shell_quote(text));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.stdout_only);
  RunResult t = run_kiln("tokenize --model " + m.dir() + " --add-special --text " + shell_quote(text));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::vector<int32_t> ids = nlohmann::json::parse(t.stdout_only)["ids"];
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ids);
  // token strings from the tokenizer file itself
  const nlohmann::json tok = read_json_file(m.dir() + "/tokenizer.json");
  std::map<int32_t, std::string> vocab;
  for (const auto& [piece, id] : tok["model"]["vocab"].items()) vocab[id.get<int32_t>()] = piece;
  for (const auto& a : tok["added_tokens"]) vocab[a["id"].get<int32_t>()] = a["content"];
  ASSERT_EQ(j["tokens"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(j["tokens"][i], vocab.at(ids[i])) << i;
  // the totals over the scored positions
  const std::vector<double> lp = j["logprobs"];
  ASSERT_EQ(lp.size(), ids.size() - 1);
  double sum = 0;
  for (double x : lp) sum += x;
  EXPECT_NEAR(j["sum_logprob"].get<double>(), sum, 1e-9 * std::fabs(sum));
  EXPECT_NEAR(j["mean_logprob"].get<double>(), sum / lp.size(), 1e-9 * std::fabs(sum));
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(-sum / lp.size()), 1e-9 * std::exp(-sum / lp.size()));
  // the same from a file and from stdin; ids from stdin as from --ids
  RunResult f = run_kiln(base + "--file " + tmp.file("t.txt", text));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_EQ(f.stdout_only, r.stdout_only);
  RunResult in = run_kiln(base + "--file -", text);
  ASSERT_EQ(in.exit_code, 0) << in.output;
  EXPECT_EQ(in.stdout_only, r.stdout_only);
  RunResult by_ids = run_kiln(base + "--ids " + join_ids(ids));
  RunResult ids_in = run_kiln(base + "--ids -", join_ids(ids) + "\n");
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.output;
  EXPECT_EQ(ids_in.stdout_only, by_ids.stdout_only);
  EXPECT_EQ(nlohmann::json::parse(by_ids.stdout_only)["logprobs"], j["logprobs"]);
  // what to score: exactly one source, at least two tokens
  for (const std::string bad : {"", "--ids 1,2 --text x", "--text x --file y", "--ids 5"}) {
    RunResult e = run_kiln(base + bad);
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_FALSE(e.crashed) << bad;
  }
}

// generate --prompt-file (a file or - for stdin) is --prompt with the file's text; --prompt-ids -
// reads the ids from stdin.
TEST(CliText, GeneratePromptFromFileOrStdin) {
  ChatModel m;
  TempDir tmp;
  const std::string base = "generate --model " + m.dir() + " --random-weights --weight-seed 7 --max-tokens 6 --seed 3 --json ";
  const std::string text = "A prompt\nwith two lines";
  RunResult direct = run_kiln(base + "--prompt " + shell_quote(text));
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  auto same_tokens = [&](const RunResult& r) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json a = nlohmann::json::parse(r.stdout_only), b = nlohmann::json::parse(direct.stdout_only);
    EXPECT_EQ(a["prompt_ids"], b["prompt_ids"]);
    EXPECT_EQ(a["ids"], b["ids"]);
  };
  same_tokens(run_kiln(base + "--prompt-file " + tmp.file("p.txt", text)));
  same_tokens(run_kiln(base + "--prompt-file -", text));
  const std::string ids = join_ids(nlohmann::json::parse(direct.stdout_only)["prompt_ids"].get<std::vector<int32_t>>());
  RunResult listed = run_kiln("generate --model " + m.dir() + " --random-weights --weight-seed 7 --max-tokens 6 --seed 3 --prompt-ids " + ids);
  RunResult piped = run_kiln("generate --model " + m.dir() + " --random-weights --weight-seed 7 --max-tokens 6 --seed 3 --prompt-ids -", ids + "\n");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(nlohmann::json::parse(piped.stdout_only)["ids"], nlohmann::json::parse(listed.stdout_only)["ids"]);
  RunResult missing = run_kiln(base + "--prompt-file " + tmp.sub("none.txt"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("none.txt"), std::string::npos) << missing.output;
  RunResult both = run_kiln(base + "--prompt x --prompt-file " + tmp.file("q.txt", "y"));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_FALSE(both.crashed);
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
  // Turn 2 reuses turn 1's KV through the prefix cache (at least the first turn's full pages).
  EXPECT_EQ(turns[0]["cached_tokens"], 0);
  EXPECT_GT(turns[1]["cached_tokens"].get<int>(), 0);
  // streaming mode prints the same replies, one per line
  RunResult s = run_kiln(args.substr(0, args.find(" --json")) + " --system " + shell_quote("Be brief."),
                         "Hi there\nAnd again\n");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(s.stdout_only, turns[0]["reply"].get<std::string>() + "\n" + turns[1]["reply"].get<std::string>() + "\n");
}

// A message the model cannot take is reported and left out, and the conversation goes on: turn 3's
// prompt is that of the conversation without the bad messages (text that is not UTF-8, a message
// beyond the context); the exit status says a turn failed.
TEST(CliText, ChatLeavesOutAMessageItCannotTakeAndGoesOn) {
  ChatModel m;
  const std::string args = "chat --model " + m.dir() + " --random-weights --weight-seed 3 --max-tokens 8 --seed 1 --json";
  std::string too_long;  // well over the 4096-token context in any tokenization
  for (int i = 0; i < 20000; ++i) too_long += " 7";
  RunResult r = run_kiln(args, "Hi there\nbad \xff\xfe bytes\n" + too_long + "\nAnd again\n");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.crashed);
  std::vector<nlohmann::json> turns;
  std::istringstream lines(r.stdout_only);
  for (std::string line; std::getline(lines, line);) turns.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(turns.size(), 4u) << r.output;
  EXPECT_NE(turns[1].value("error", "").find("UTF-8"), std::string::npos) << turns[1];
  EXPECT_NE(turns[2].value("error", "").find("context"), std::string::npos) << turns[2];
  EXPECT_NE(r.output.find("the message is left out"), std::string::npos) << r.output;
  nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", "Hi there"}},
                                                   {{"role", "assistant"}, {"content", turns[0]["reply"]}},
                                                   {{"role", "user"}, {"content", "And again"}}});
  TempDir tmp;
  RunResult ct = run_kiln("chat-template --model " + m.dir() + " --add-generation-prompt --messages " +
                          tmp.file("m.json", messages.dump()));
  ASSERT_EQ(ct.exit_code, 0) << ct.output;
  EXPECT_EQ(turns[3]["prompt"], nlohmann::json::parse(ct.stdout_only)["prompt"]);
}

// Lines that are not messages never reach the model: empty lines are skipped, /help answers on
// stderr, an unknown /command is reported; the turns (and their seeds) are those of the plain input.
// A line starting "//" sends its text from the second "/". The seed is printed.
TEST(CliText, ChatCommandsAndEmptyLinesAreNotSent) {
  ChatModel m;
  const std::string args = "chat --model " + m.dir() + " --random-weights --weight-seed 3 --max-tokens 8 --seed 5 --json";
  RunResult plain = run_kiln(args, "Hi there\nAnd again\n");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  RunResult noisy = run_kiln(args, "\nHi there\n   \n/help\n/bogus\n\nAnd again\n");
  ASSERT_EQ(noisy.exit_code, 0) << noisy.output;
  EXPECT_EQ(noisy.stdout_only, plain.stdout_only);
  EXPECT_NE(noisy.output.find("unknown command '/bogus'"), std::string::npos) << noisy.output;
  EXPECT_NE(noisy.output.find("/reset clears the conversation"), std::string::npos) << noisy.output;
  EXPECT_NE(plain.output.find("seed 5"), std::string::npos) << plain.output;
  RunResult slash = run_kiln(args, "//slash text\n");
  ASSERT_EQ(slash.exit_code, 0) << slash.output;
  const nlohmann::json turn = nlohmann::json::parse(slash.stdout_only);
  TempDir tmp;
  RunResult ct = run_kiln("chat-template --model " + m.dir() + " --add-generation-prompt --messages " +
                          tmp.file("m.json", R"([{"role": "user", "content": "/slash text"}])"));
  ASSERT_EQ(ct.exit_code, 0) << ct.output;
  EXPECT_EQ(turn["prompt"], nlohmann::json::parse(ct.stdout_only)["prompt"]);
  // Without --seed a random one is drawn and printed, so that the conversation can be repeated.
  RunResult drawn = run_kiln("chat --model " + m.dir() + " --random-weights --max-tokens 2", "");
  ASSERT_EQ(drawn.exit_code, 0) << drawn.output;
  EXPECT_NE(drawn.output.find("kiln chat: seed "), std::string::npos) << drawn.output;
}

// kiln generate --requests: every line through the engine at once, results in input order; a
// malformed line gets an error naming it and the others still run.
std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(CliText, RequestsFileRunsEveryLineInOrder) {
  ChatModel m;
  TempDir tmp;
  const std::string model = " --model " + m.dir() + " --random-weights --weight-seed 5";
  const std::string file = tmp.file("requests.jsonl",
      "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 12, \"ignore_eos\": true, \"logprobs\": true, \"top_logprobs\": 2}\n"
      "{\"prompt\": \"Hello there\", \"max_tokens\": 10, \"ignore_eos\": true, \"temperature\": 0.9, \"seed\": 3}\n"
      "this is not json\n"
      "\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 6, \"ignore_eos\": true}\n"
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 4, \"bogus\": 1}\n"
      "{\"prompt_ids\": [5, 6, 7, 8], \"max_tokens\": 12, \"ignore_eos\": true}\n");
  RunResult r = run_kiln("generate" + model + " --max-running 3 --max-step-tokens 16 --page-size 2 --requests " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // two bad lines
  EXPECT_FALSE(r.crashed) << r.output;
  EXPECT_NE(r.output.find("line 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("line 6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bogus"), std::string::npos) << r.output;
  std::vector<nlohmann::json> out = json_lines(r.stdout_only);
  ASSERT_EQ(out.size(), 6u);
  const std::vector<int> index = {0, 1, 2, 4, 5, 6};
  for (size_t k = 0; k < out.size(); ++k) EXPECT_EQ(out[k]["index"], index[k]);
  EXPECT_TRUE(out[2].contains("error"));
  EXPECT_TRUE(out[4].contains("error"));
  // Line 0: greedy, the same ids as kiln generate with that prompt alone, and the same as line 6.
  RunResult alone = run_kiln("generate" + model + " --prompt-ids 5,6,7,8 --max-tokens 12 --ignore-eos");
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_EQ(out[0]["ids"], nlohmann::json::parse(alone.stdout_only)["ids"]);
  EXPECT_EQ(out[0]["ids"], out[5]["ids"]);
  EXPECT_EQ(out[0]["logprobs"].size(), 12u);
  EXPECT_EQ(out[0]["top_logprobs"].size(), 12u);
  EXPECT_EQ(out[0]["top_logprobs"][0].size(), 2u);
  EXPECT_FALSE(out[5].contains("logprobs"));
  EXPECT_EQ(out[0]["versions"], nlohmann::json::parse("[[0, 0]]"));
  EXPECT_EQ(out[0]["finish_reason"], "length");
  EXPECT_EQ(out[0]["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(out[0]["usage"]["completion_tokens"], 12);
  // Text lines: the text is the decoded ids; the chat line's prompt is the template's render.
  for (size_t k : {1u, 3u}) {
    RunResult d = run_kiln("detokenize --model " + m.dir() + " --skip-special --ids " +
                           join_ids(out[k]["ids"].get<std::vector<int32_t>>()));
    EXPECT_EQ(out[k]["text"], nlohmann::json::parse(d.stdout_only)["text"]);
  }
  RunResult ct = run_kiln("chat-template --model " + m.dir() + " --add-generation-prompt --messages " +
                          tmp.file("m.json", "[{\"role\": \"user\", \"content\": \"Hi\"}]"));
  RunResult ids = run_kiln("tokenize --model " + m.dir() + " --text " +
                           shell_quote(nlohmann::json::parse(ct.stdout_only)["prompt"].get<std::string>()));
  EXPECT_EQ(out[3]["usage"]["prompt_tokens"], nlohmann::json::parse(ids.stdout_only)["ids"].size());
  // Line 6 waits for a running place (--max-running 3), by then line 0's prompt pages are cached:
  // of its 4 tokens, the one full page of 2 before the last token comes from the radix cache.
  EXPECT_EQ(out[0]["usage"]["cached_tokens"], 0);
  EXPECT_EQ(out[5]["usage"]["cached_tokens"], 2);
  // --output writes the same lines to a file.
  const std::string results = (tmp.path / "out.jsonl").string();
  RunResult o = run_kiln("generate" + model + " --max-running 3 --requests " + file + " --output " + results);
  EXPECT_EQ(o.exit_code, 1);
  std::ifstream in(results);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(json_lines(ss.str()).size(), 6u);
  EXPECT_EQ(json_lines(ss.str())[0]["ids"], out[0]["ids"]);
}

// Numbers a request line's fields cannot hold are errors naming the field and the value, never
// wrapped or cast out of range: a 64-bit max_tokens is not -1, 1e300 is not an infinite
// temperature, 2^32 + 5 is not token 5; a seed takes the whole unsigned 64-bit range.
TEST(CliText, RequestsFileNumbersOutOfRangeAreErrors) {
  TempDir tmp;
  const std::string model = " --model " + testdata_dir() + "/tiny-llama";
  const std::string file = tmp.file("requests.jsonl",
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 18446744073709551615}\n"
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 2, \"temperature\": 1e300}\n"
      "{\"prompt_ids\": [5, 4294967301], \"max_tokens\": 2}\n"
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 2, \"top_k\": 4294967296}\n"
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 2, \"seed\": -3}\n"
      "{\"prompt_ids\": [5, 6], \"max_tokens\": 3, \"temperature\": 0.8, \"seed\": 18446744073709551615}\n");
  RunResult r = run_kiln("generate" + model + " --requests " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.crashed) << r.output;
  std::vector<nlohmann::json> out = json_lines(r.stdout_only);
  ASSERT_EQ(out.size(), 6u) << r.output;
  const std::vector<std::pair<std::string, std::string>> errors = {
      {"'max_tokens'", "18446744073709551615"}, {"'temperature'", "1e+300"}, {"'prompt_ids'", "4294967301"},
      {"'top_k'", "4294967296"}, {"'seed'", "-3"}};
  for (size_t k = 0; k < errors.size(); ++k) {
    ASSERT_TRUE(out[k].contains("error")) << out[k].dump();
    const std::string e = out[k]["error"];
    EXPECT_NE(e.find("line " + std::to_string(k + 1)), std::string::npos) << e;
    EXPECT_NE(e.find(errors[k].first), std::string::npos) << e;
    EXPECT_NE(e.find(errors[k].second), std::string::npos) << e;
  }
  EXPECT_FALSE(out[5].contains("error")) << out[5].dump();
  EXPECT_EQ(out[5]["ids"].size(), 3u);
}

// A request line's response_format (OpenAI's): the text is a JSON value of the schema; a schema
// kiln cannot enforce is that line's error, naming the keyword.
TEST(CliText, RequestsFileResponseFormat) {
  TempDir tmp;
  const std::string model = " --model " + testdata_dir() + "/tiny-tools";
  const std::string schema = R"({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}}, "required": ["answer", "n"]})";
  const std::string file = tmp.file("requests.jsonl",
      "{\"prompt\": \"Is it?\", \"max_tokens\": 300, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": " +
          schema + "}}}\n"
      "{\"prompt\": \"Is it?\", \"max_tokens\": 300, \"temperature\": 1, \"seed\": 3, \"response_format\": {\"type\": \"json_object\"}}\n"
      "{\"prompt\": \"Is it?\", \"max_tokens\": 5, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"type\": \"string\", \"pattern\": \"x\"}}}}\n");
  RunResult r = run_kiln("generate" + model + " --requests " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;  // the third line's error
  std::vector<nlohmann::json> out = json_lines(r.stdout_only);
  ASSERT_EQ(out.size(), 3u) << r.output;
  ASSERT_EQ(out[0]["finish_reason"], "stop") << out[0].dump();
  const nlohmann::json v = nlohmann::json::parse(out[0]["text"].get<std::string>());
  ASSERT_TRUE(v.is_object()) << out[0].dump();
  EXPECT_EQ(v.size(), 2u) << v.dump();
  EXPECT_TRUE(v["answer"] == "yes" || v["answer"] == "no") << v.dump();
  EXPECT_TRUE(v["n"].is_number_integer()) << v.dump();
  if (out[1]["finish_reason"] == "stop") {
    EXPECT_TRUE(nlohmann::json::parse(out[1]["text"].get<std::string>()).is_object()) << out[1].dump();
  }
  ASSERT_TRUE(out[2].contains("error")) << out[2].dump();
  EXPECT_NE(out[2]["error"].get<std::string>().find("'pattern'"), std::string::npos) << out[2].dump();
}

// A requests line holding a value nested 100,000 levels deep gets an error naming its line (copying
// or printing the value recursed to a crash), and the other lines still run.
TEST(CliText, RequestsLineNestedDeeplyIsItsOwnError) {
  TempDir tmp;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string file = tmp.file("requests.jsonl", "{\"prompt_ids\": [5, " + deep + "]}\n" +
                                                          "{\"prompt_ids\": [5, 6], \"max_tokens\": 2}\n");
  RunResult r = run_kiln("generate --model " + testdata_dir() + "/tiny-llama --requests " + file);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(r.crashed) << r.output;
  std::vector<nlohmann::json> out = json_lines(r.stdout_only);
  ASSERT_EQ(out.size(), 2u) << r.output;
  EXPECT_NE(out[0].value("error", "").find("line 1"), std::string::npos) << out[0].dump();
  EXPECT_NE(out[0].value("error", "").find("nests deeper than 999 levels"), std::string::npos) << out[0].dump();
  EXPECT_EQ(out[1]["ids"].size(), 2u) << out[1].dump();
}

// kiln generate --json-schema FILE: one prompt's reply is a JSON value of the schema, with prompt
// ids too (the tokenizer is loaded for the masks); a schema kiln cannot enforce is a clear error.
TEST(CliText, GenerateJsonSchema) {
  TempDir tmp;
  const std::string model = " --model " + testdata_dir() + "/tiny-tools";
  const std::string schema = tmp.file("schema.json", R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})");
  for (const std::string& prompt : {std::string(" --prompt 'Is it?' --json"), std::string(" --prompt-ids 5,6,7")}) {
    RunResult r = run_kiln("generate" + model + prompt + " --max-tokens 200 --json-schema " + schema);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json out = nlohmann::json::parse(r.stdout_only);
    EXPECT_EQ(out["finish_reason"], "stop") << r.output;
    const nlohmann::json v = nlohmann::json::parse(out["text"].get<std::string>());
    EXPECT_TRUE(v.is_object() && v.size() == 1 && v["ok"].is_boolean()) << out.dump();
  }
  RunResult bad = run_kiln("generate" + model + " --prompt x --json-schema " +
                           tmp.file("bad.json", R"({"type": "string", "pattern": "a"})"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_FALSE(bad.crashed);
  EXPECT_NE(bad.output.find("'pattern'"), std::string::npos) << bad.output;
  RunResult missing = run_kiln("generate" + model + " --prompt x --json-schema " + tmp.sub("none.json"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("none.json"), std::string::npos) << missing.output;
}

TEST(CliText, StopStringsEndTheTextAcrossTokenBoundaries) {
  ChatModel m;
  TempDir tmp;
  const std::string model = " --model " + m.dir() + " --random-weights --weight-seed 9";
  const std::string line = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"ignore_eos\": true";
  RunResult free = run_kiln("generate" + model + " --requests " + tmp.file("a.jsonl", line + "}\n"));
  ASSERT_EQ(free.exit_code, 0) << free.output;
  const std::string text = json_lines(free.stdout_only)[0]["text"];
  ASSERT_GT(text.size(), 12u) << text;
  // A stop string taken from the middle of the free-running text: generation ends where it first
  // appears, and the text is trimmed right before it.
  std::string stop = text.substr(text.size() / 2, 3);
  while (stop.size() < 6 && (static_cast<unsigned char>(stop.back()) & 0xC0) == 0x80) stop = text.substr(text.size() / 2, stop.size() + 1);
  if ((static_cast<unsigned char>(stop[0]) & 0xC0) == 0x80) GTEST_SKIP() << "the middle of the text is inside a character";
  nlohmann::json with_stop = nlohmann::json::parse(line + "}");
  with_stop["stop"] = {stop, "never-appears-xyz"};
  // Beside a request that runs on: the engine finds the stop string while the next step (which
  // includes the stopped request) runs, so that step's token for it must be dropped.
  RunResult r = run_kiln("generate" + model + " --requests " +
                         tmp.file("b.jsonl", with_stop.dump() + "\n" + line + "}\n"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json o = json_lines(r.stdout_only)[0];
  EXPECT_EQ(o["finish_reason"], "stop");
  EXPECT_EQ(o["text"], text.substr(0, text.find(stop))) << "stop '" << stop << "'";
  const nlohmann::json free_ids = json_lines(free.stdout_only)[0]["ids"];
  ASSERT_LT(o["ids"].size(), free_ids.size());
  for (size_t i = 0; i < o["ids"].size(); ++i) EXPECT_EQ(o["ids"][i], free_ids[i]) << i;
  EXPECT_EQ(o["usage"]["completion_tokens"], o["ids"].size());
  EXPECT_EQ(json_lines(r.stdout_only)[1]["ids"], free_ids);  // the other request is unaffected
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

// tokenizer_config.json's special tokens and add_*_token flags of the wrong type are errors naming the
// file, the key and what it holds (null stays allowed: no token, no flag); the command exits 1.
TEST(CliText, TokenizerConfigWrongTypesAreErrors) {
  ChatModel m;
  const std::string cfg_path = m.dir() + "/tokenizer_config.json";
  const nlohmann::ordered_json original = read_json_file(cfg_path);
  const std::string messages = m.file("m.json", R"([{"role": "user", "content": "Hi"}])");
  auto render = [&](const nlohmann::ordered_json& cfg) {
    std::ofstream(cfg_path) << cfg.dump();
    return run_kiln("chat-template --model " + m.dir() + " --messages " + messages);
  };
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::ordered_json>>{
           {"eos_token", 5}, {"bos_token", {{"content", 7}}}, {"pad_token", true}, {"unk_token", {1, 2}},
           {"add_bos_token", "yes"}, {"add_eos_token", 1}}) {
    nlohmann::ordered_json cfg = original;
    cfg[key] = value;
    RunResult r = render(cfg);
    EXPECT_EQ(r.exit_code, 1) << key << ": " << r.output;
    EXPECT_NE(r.output.find("tokenizer_config.json: " + key + " must be"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(value.dump()), std::string::npos) << r.output;
  }
  nlohmann::ordered_json cfg = original;
  cfg["pad_token"] = nullptr;
  cfg["add_bos_token"] = nullptr;
  RunResult ok = render(cfg);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

}  // namespace kiln::test
